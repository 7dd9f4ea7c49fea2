"""Invalid input: one message per problem with file, key path, line, value and rule; exit 2;
no traceback; generated/ untouched."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, run_cli, snapshot


def edit(path: Path, old: str, new: str, *, after: str = "") -> None:
    """Replace the first ``old`` in ``path`` (the first after ``after``, when given)."""
    text = path.read_text()
    start = text.find(after)
    at = text.find(old, start) if start >= 0 else -1
    assert at >= 0, f"{old!r} not in {path}" + (f" after {after!r}" if after else "")
    path.write_text(text[:at] + new + text[at + len(old) :])


def line_of(path: Path, needle: str) -> int:
    for i, line in enumerate(path.read_text().splitlines(), start=1):
        if needle in line:
            return i
    raise AssertionError(needle)


# (name, file, old text, new text, fragments every message must contain, line needle or None)
CASES = [
    (
        "malformed toml",
        "specs/kernels/moe.toml",
        "block_size_n = 64\n",
        "block_size_n = = 64\n",
        ["specs/kernels/moe.toml:", "malformed TOML"],
        "block_size_n = = 64",
    ),
    (
        "unknown key",
        "specs/hardware/h200.toml",
        "warp_size = 32",
        "warp_sise = 32",
        ["specs/hardware/h200.toml:", "warp_sise: unknown key", "(got 32)"],
        "warp_sise",
    ),
    (
        "wrong type",
        "specs/hardware/h200.toml",
        "sm_count = 132 ",
        'sm_count = "132" ',
        ["specs/hardware/h200.toml:", "sm_count: Input should be a valid integer", "(got '132')"],
        "sm_count",
    ),
    (
        "missing field",
        "specs/hardware/a10.toml",
        "sm_count = 72 ",
        "# sm_count removed ",
        ["specs/hardware/a10.toml", "sm_count: required key is missing"],
        None,
    ),
    (
        "unknown vendor (hardware)",
        "specs/hardware/gb10.toml",
        'vendor = "nvidia"',
        'vendor = "nvidea"',
        [
            "specs/hardware/gb10.toml:",
            "vendor: unknown vendor; add specs/vendors/nvidea.toml or use one of amd, iluvatar, nvidia",
            "(got 'nvidea')",
        ],
        'vendor = "nvidea"',
    ),
    (
        "unknown vendor (policy)",
        "specs/kernels/attention.toml",
        'vendor = "nvidia"',
        'vendor = "intel"',
        [
            "specs/kernels/attention.toml:",
            "attention.policy[1].vendor: unknown vendor; known: amd, iluvatar, nvidia",
            "(got 'intel')",
        ],
        'vendor = "intel"',
    ),
    (
        "duplicate threshold",
        "specs/kernels/attention.toml",
        'vendor = "nvidia"\nmin_arch = 80',
        'vendor = "iluvatar"\nmin_arch = 100',
        [
            "specs/kernels/attention.toml:",
            "attention.policy[1].min_arch: duplicate threshold iluvatar>=100",
            "(got 100)",
        ],
        None,
    ),
    (
        "rule no candidate satisfies",
        "specs/kernels/attention.toml",
        "triton_block_n = { largest = [128, 64, 32, 16]",
        "triton_block_n = { largest = [128, 64]",
        [
            "specs/kernels/attention.toml:",
            "attention.base.triton_block_n",
            # The BI-V100 has its own pick (the seed's); the 99 KB NVIDIA parts take the base's.
            "a10 (nvidia 86",
            "no candidate for 'triton_block_n' in [128, 64]",
            "131,072 > hw.max_shared_memory_per_block_optin = 101,376",
        ],
        "largest = [128, 64]",
    ),
    (
        "policy over a target's limits",
        "specs/kernels/moe.toml",
        'block_size_k = { expr = "64 if',
        'block_size_k = { expr = "4096 if',
        [
            "specs/kernels/moe.toml:",
            "moe.base",
            "policy base on 9 targets",
            "specs/hardware/a10.toml",
            "fails check 'A and B tiles fit shared memory'",
            "A+B tiles need 393,216 B; a10 allows 101,376 B",
            "tile_smem_bytes = 393,216 > hw.max_shared_memory_per_block_optin = 101,376",
        ],
        None,
    ),
    (
        "invalid rule syntax",
        "specs/kernels/transform.toml",
        'bytes_in_flight = { expr = "hw.bytes_in_flight" }',
        'bytes_in_flight = { expr = "hw.bytes_in_flight +" }',
        [
            "specs/kernels/transform.toml:",
            "transform.base.bytes_in_flight.expr: invalid rule",
            "(got 'hw.bytes_in_flight +')",
        ],
        "hw.bytes_in_flight +",
    ),
    (
        "rule reads an unknown attribute",
        "specs/kernels/transform.toml",
        'bytes_in_flight = { expr = "hw.bytes_in_flight" }',
        'bytes_in_flight = { expr = "hw.bytes_inflight" }',
        ["transform.base.bytes_in_flight.expr", "'hw.bytes_inflight' is not a hardware attribute"],
        "hw.bytes_inflight",
    ),
    (
        "extends an unknown config",
        "specs/kernels/cache.toml",
        'extends = "transform_launch"',
        'extends = "transfrom_launch"',
        ["specs/kernels/cache.toml:", "cache_launch.extends: no such config to extend", "(got 'transfrom_launch')"],
        'extends = "transfrom_launch"',
    ),
    (
        "extends is not a name",
        "specs/kernels/cache.toml",
        'extends = "transform_launch"',
        'extends = ["transform_launch"]',
        ["cache_launch.extends: must be a string naming a config", "(got ['transform_launch'])"],
        'extends = ["transform_launch"]',
    ),
    (
        # cache_launch inherits transform_launch's policies, whose tile rule reads tile_divisor:
        # the message points at the rule in transform.toml and names the config that inherited it.
        "inherited rule reads a parameter the child lacks",
        "specs/kernels/cache.toml",
        "variants = { reshape_and_cache = { tile_divisor = 2 }, copy_blocks = { tile_divisor = 2 } }",
        "variants = { reshape_and_cache = {}, copy_blocks = {} }",
        [
            "specs/kernels/transform.toml:",
            "transform_launch.policy[0].tile_bytes.expr: rule reads unknown name(s) tile_divisor",
            "(inherited by cache_launch)",
        ],
        None,
    ),
    (
        # Docs and notes are one line: generated comments and docstrings carry them.
        "field doc with a line break (code after it would run at import)",
        "specs/kernels/transform.toml",
        'doc = "Threads per warp." }',
        'doc = "Threads per warp.\\n    INJECTED = print(1)" }',
        [
            "transform_launch.fields.warp_size.doc: must be one line (it has a line break)",
            "(got 'Threads per warp.\\n    INJECTED = print(1)')",
        ],
        "INJECTED",
    ),
    (
        "record doc with a control character",
        "specs/kernels/cache.toml",
        'doc = "Config for KV cache operations',
        'doc = "Config \\u0007 for KV cache operations',
        ["specs/kernels/cache.toml:", "cache.doc: must not contain control characters (it has '\\x07')"],
        'doc = "Config \\u0007',
    ),
    (
        "bucket note with a line break",
        "specs/kernels/matmul.toml",
        "[[matmul.policy.bucket]]\n",
        '[[matmul.policy.bucket]]\nnote = "fast\\n_X = print(1)"\n',
        ["specs/kernels/matmul.toml:", "matmul.policy[0].bucket[0].note: must be one line (it has a line break)"],
        "_X = print(1)",
    ),
    (
        "record named None",
        "specs/kernels/cache.toml",
        'record = "CacheConfig"',
        'record = "None"',
        ["cache.record: 'None' is a Python keyword", "(got 'None')"],
        'record = "None"',
    ),
    (
        "field named a keyword",
        "specs/kernels/cache.toml",
        "copy_block_size = { type",
        "class = { type",
        ["specs/kernels/cache.toml:", "cache.fields.class: 'class' is a Python keyword", "(got 'class')"],
        "class = { type",
    ),
    (
        "record named like a class of the dispatch module",
        "specs/kernels/cache.toml",
        'record = "CacheConfig"',
        'record = "HardwareCapability"',
        [
            "cache.record: record name is a name generated/dispatch.py defines or uses itself",
            "(got 'HardwareCapability')",
        ],
        'record = "HardwareCapability"',
    ),
    (
        "nan literal",
        "specs/kernels/cache.toml",
        "copy_blocks = { tile_divisor = 2 }",
        "copy_blocks = { tile_divisor = nan }",
        ["cache_launch.variants.copy_blocks.tile_divisor: nan and inf are not allowed", "(got nan)"],
        "tile_divisor = nan",
    ),
    (
        # Rules see the same hw attributes at load and at resolve: the display name is not one.
        "rule reads hw.display_name",
        "specs/kernels/transform.toml",
        'bytes_in_flight = { expr = "hw.bytes_in_flight" }',
        'bytes_in_flight = { expr = "hw.display_name" }',
        ["transform.base.bytes_in_flight.expr: 'hw.display_name' is not a hardware attribute"],
        "hw.display_name",
    ),
    (
        "rule nested too deeply",
        "specs/kernels/transform.toml",
        'bytes_in_flight = { expr = "hw.bytes_in_flight" }',
        'bytes_in_flight = { expr = "' + "-" * 5000 + 'hw.bytes_in_flight" }',
        ["transform.base.bytes_in_flight.expr: invalid rule: expression too deeply nested"],
        "-----",
    ),
    (
        "rule whose power would hang the build",
        "specs/kernels/transform.toml",
        'bytes_in_flight = { expr = "hw.bytes_in_flight" }',
        'bytes_in_flight = { expr = "hw.bytes_in_flight + 2 ** 10 ** 10" }',
        ["transform.base.bytes_in_flight", "2 ** 10,000,000,000 is too large (more than 256 bits)"],
        "10 ** 10",
    ),
    (
        # generated/cache.py looks copy_blocks up at run time.
        "variant a generated module needs is missing",
        "specs/kernels/cache.toml",
        "copy_blocks = { tile_divisor = 2 }",
        "copy_blockz = { tile_divisor = 2 }",
        [
            "specs/kernels/cache.toml:",
            "cache_launch.variants: variant 'copy_blocks' is missing: generated/cache.py looks it up",
        ],
        "copy_blockz",
    ),
    (
        "vendor in capitals",
        "specs/hardware/h200.toml",
        'vendor = "nvidia"',
        'vendor = "NVIDIA"',
        [
            "specs/hardware/h200.toml:",
            "vendor: unknown vendor; use one of amd, iluvatar, nvidia; did you mean 'nvidia'? (got 'NVIDIA')",
        ],
        'vendor = "NVIDIA"',
    ),
    (
        "misspelt required key",
        "specs/hardware/h200.toml",
        "warp_size = 32",
        "warp_sise = 32",
        [
            "warp_sise: unknown key (not part of this spec's schema); "
            "did you mean 'warp_size' (a required key, missing)?"
        ],
        "warp_sise",
    ),
    (
        "misspelt field in a policy",
        "specs/kernels/moe.toml",
        "block_size_k = 32\ngroup_size_m = 8",
        "block_size_k = 32\ngroup_sise_m = 8",
        [
            "moe.policy[0].group_sise_m: not a field of MoEConfig (fields: block_size_m, block_size_n, "
            "block_size_k, group_size_m); did you mean 'group_size_m'? (got 8)"
        ],
        "group_sise_m",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_invalid_specs_exit_2_with_located_message(project, case):
    _name, rel, old, new, fragments, needle = case
    edit(project / rel, old, new)
    before = snapshot(project / "generated")
    for command in ("build", "check"):
        result = run_cli("--root", str(project), command)
        assert result.code == 2, result
        assert result.out == ""
        assert "Traceback" not in result.err
        for fragment in fragments:
            assert fragment in result.err, (fragment, result.err)
        if needle is not None:
            assert f"{rel}:{line_of(project / rel, needle)}:" in result.err, result.err
    assert snapshot(project / "generated") == before


def test_overflow_message_gives_bytes(project):
    """The shared-memory check's message carries both figures, formatted."""
    edit(project / "specs/kernels/moe.toml", 'block_size_n = { expr = "32 if', 'block_size_n = { expr = "1536 if')
    result = run_cli("--root", str(project), "build")
    assert result.code == 2
    # (16 + 1536) x 64 x 2 B = 198,656 B > 101,376 B on the 99 KB parts (and 166,912 B on the A100).
    assert "A+B tiles need 198,656 B; a10 allows 101,376 B" in result.err
    assert "A+B tiles need 198,656 B; a100 allows 166,912 B" in result.err
    assert "h100" not in result.err  # 232,448 B: fits


def test_every_problem_is_reported_at_once(project):
    edit(project / "specs/hardware/h200.toml", "warp_size = 32", "warp_sise = 32")
    edit(project / "specs/hardware/a10.toml", 'vendor = "nvidia"', 'vendor = "nvidea"')
    result = run_cli("--root", str(project), "build")
    assert result.code == 2
    assert "2 problems" in result.err  # the renamed key is one problem, naming the key it misses
    assert "h200.toml" in result.err and "a10.toml" in result.err


def test_real_process_has_no_traceback_and_exit_2(project):
    edit(project / "specs/hardware/h200.toml", "warp_size = 32", "warp_size = true")
    before = snapshot(project / "generated")
    proc = subprocess.run(
        [sys.executable, "-m", "codegen", "--root", str(project), "build"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert re.search(r"specs/hardware/h200\.toml:\d+: warp_size: Input should be a valid integer", proc.stderr)
    assert snapshot(project / "generated") == before


def test_seed_matmul_config_does_not_fit_gb10(project):
    """The seed's first autotune config (128x256x64, 3 stages) placed on gb10 fails the build."""
    edit(project / "specs/kernels/matmul.toml", "num_stages = 2", "num_stages = 3", after='name = "mlp_up"')
    before = snapshot(project / "generated")
    result = run_cli("--root", str(project), "build")
    assert result.code == 2
    assert "Traceback" not in result.err
    # One line for both 99 KB targets of the policy (per variant), with what would fit.
    line = next(l for l in result.err.splitlines() if "gb10 (nvidia 121" in l and "matmul_16bit" in l)
    assert "specs/kernels/matmul.toml:" in line and "matmul.policy[5].bucket[0]" in line
    assert (
        "policy nvidia>=120 on 2 targets rtx5090 (nvidia 120, specs/hardware/rtx5090.toml), "
        "gb10 (nvidia 121, specs/hardware/gb10.toml), bucket mlp_up"
    ) in line
    assert "3 stages of 128x64 A and 64x256 B tiles need 147,456 B of shared memory per block" in line
    assert "rtx5090 allows 101,376 B" in line and "(likewise on gb10)" in line
    assert "fails check 'tiles fit shared memory'" in line
    assert "block_n = 128, or block_k = 32, or num_stages = 2 would pass" in line
    # Hopper parts are untouched by this policy.
    assert "h200" not in result.err and result.err.count("\n  ") == 2
    assert snapshot(project / "generated") == before


def test_a_split_k_bucket_fills_one_wave_of_each_part_by_the_fields_default(project):
    """num_programs is a rule stated once (the field's default), not a literal per bucket checked
    afterwards: split-K and persistent kernels get the part's SM count, the rest 0."""
    from codegen import pipeline

    res = pipeline.run(project, until="tree_to_resolution")
    (vr,) = [v for v in res.variants if v.variant == "matmul_16bit"]
    for target, sms in (("h200", 132), ("b200", 148), ("a100", 108), ("bi_v100", 16)):
        for bucket in vr.resolved[target].buckets:
            record = dict(bucket.record)
            wave = record["kernel"] == "tma_persistent" or record["split_k"] > 1
            assert record["num_programs"] == (sms if wave else 0), (target, bucket.name)
    text = (project / "specs/kernels/matmul.toml").read_text()
    assert text.count("hw.sm_count") == 1


def test_inherited_problem_gives_the_parent_file_line(project):
    """Problems in an inherited key, at load and at resolve time, are located in the file and
    line that define it and name the config that inherited it."""
    transform = project / "specs/kernels/transform.toml"
    line = line_of(transform, "// tile_divisor, min_tile, max_tile")
    cache = project / "specs/kernels/cache.toml"
    text = cache.read_text()
    # One variant without the parameter: the rule fails per target when resolved.
    edit(cache, "copy_blocks = { tile_divisor = 2 }", "copy_blocks = { tile_divider = 2 }")
    result = run_cli("--root", str(project), "build")
    assert result.code == 2
    where = (
        f"specs/kernels/transform.toml:{line}: transform_launch.policy[0].tile_bytes: policy nvidia>=90 on target h200"
    )
    assert where in result.err
    assert "'tile_divisor' is not defined (inherited by cache_launch) [variant copy_blocks]" in result.err
    # No variant has it: the rule is rejected when loaded.
    cache.write_text(text.replace("{ tile_divisor = 2 }", "{}"))
    result = run_cli("--root", str(project), "build")
    assert result.code == 2
    assert f"specs/kernels/transform.toml:{line}: transform_launch.policy[0].tile_bytes.expr: rule reads" in result.err


def test_extends_cycle_is_an_error(project):
    edit(
        project / "specs/kernels/transform.toml",
        'record = "TransformLaunch"',
        'record = "TransformLaunch"\nextends = "cache_launch"',
    )
    result = run_cli("--root", str(project), "build")
    assert result.code == 2
    assert "Traceback" not in result.err
    assert "cache_launch.extends: extends forms a cycle: transform_launch -> cache_launch -> transform_launch" in (
        result.err
    )


def test_a_parents_problem_is_reported_once(project):
    """A broken rule in transform_launch is found for it and again for cache_launch, which
    inherits it: one report, the parent's own."""
    edit(project / "specs/kernels/transform.toml", 'rule = "min_programs >= hw.sm_count"', 'rule = "min_programs >="')
    result = run_cli("--root", str(project), "build")
    assert result.code == 2
    assert result.err.count("transform_launch.checks[2].rule: invalid rule") == 1, result.err
    assert "inherited by" not in result.err


def test_a_second_definition_of_a_config_is_reported_and_not_used(project):
    """A config name defined twice is reported at the second definition (files are read in name
    order: aa.toml first) even when the first is invalid; the first's own problem is reported
    once, although cache_launch inherits it too."""
    (project / "specs/kernels/aa.toml").write_text(
        '[transform_launch]\nrecord = "Other"\ndoc = "a second transform_launch"\nfields = "oops"\n'
    )
    result = run_cli("--root", str(project), "build")
    assert result.code == 2
    assert "2 problems" in result.err, result.err
    assert re.search(
        r"specs/kernels/transform\.toml:\d+: transform_launch: config is already defined by specs/kernels/aa\.toml",
        result.err,
    )
    assert "specs/kernels/aa.toml:4: transform_launch.fields: Input should be a valid dictionary" in result.err


def test_a_missing_config_is_an_error_naming_the_file_that_should_define_it(project):
    """The generated kernel modules look their launch records up by name: a spec tree without
    them fails the build instead of building modules that raise KeyError when called."""
    cache = project / "specs/kernels/cache.toml"
    text = cache.read_text()
    cache.write_text(text[: text.index("[cache_launch]")])
    before = snapshot(project / "generated")
    for command in ("build", "check"):
        result = run_cli("--root", str(project), command)
        assert result.code == 2 and "Traceback" not in result.err, result
        # The cut also drops [cache_launch_fp8], defined after it: one problem each.
        assert "2 problems" in result.err
        assert (
            "specs/modules/cache.toml:7: reads.cache_launch: config is missing: generated/cache.py reads it "
            "(variants reshape_and_cache, copy_blocks); define [cache_launch] in a file under specs/kernels/"
        ) in result.err
        assert (
            "reads.cache_launch_fp8: config is missing: generated/cache.py reads it "
            "(variants reshape_and_cache_fp8); define [cache_launch_fp8] in a file under specs/kernels/"
        ) in result.err
    for path in (project / "specs/kernels").glob("*.toml"):
        path.unlink()
    result = run_cli("--root", str(project), "build")
    import tomllib

    reads = sum(len(tomllib.loads(m.read_text())["reads"]) for m in (project / "specs/modules").glob("*.toml"))
    assert result.code == 2 and f"{reads} problems" in result.err, result
    for config, file in (
        ("transform_launch", "transform"),
        ("cache_launch", "cache"),
        ("matmul", "matmul"),
    ):
        assert f"reads.{config}: config is missing: generated/{file}.py reads it" in result.err
        assert f"specs/modules/{file}.toml:" in result.err
    assert snapshot(project / "generated") == before


@pytest.mark.parametrize("record", ["HARDWARE", "KeyError", "Optional", "VENDORS"])
def test_a_record_may_not_take_a_name_the_dispatch_module_uses(project, record):
    """A class of that name in generated/dispatch.py would replace the module's own (or a
    builtin it raises), and the module would break when used."""
    edit(project / "specs/kernels/cache.toml", 'record = "CacheConfig"', f'record = "{record}"')
    result = run_cli("--root", str(project), "build")
    assert result.code == 2, result
    assert "cache.record: record name is a name generated/dispatch.py defines or uses itself" in result.err
    assert f"(got '{record}')" in result.err


@pytest.mark.parametrize(
    "case, data, fragment",
    [
        ("bom", b"\xef\xbb\xbf", "specs/kernels/moe.toml:1: <top level>: the file starts with a UTF-8 byte-order mark"),
        (
            "latin-1",
            "# caf\u00e9\n".encode("latin-1"),
            "specs/kernels/moe.toml:1: <top level>: not UTF-8 text: byte 0xe9",
        ),
    ],
    ids=["byte-order mark", "latin-1"],
)
def test_a_spec_file_that_is_not_utf8_is_reported(project, case, data, fragment):
    moe = project / "specs/kernels/moe.toml"
    moe.write_bytes(data + moe.read_bytes())
    before = snapshot(project / "generated")
    result = run_cli("--root", str(project), "build")
    assert result.code == 2 and "Traceback" not in result.err, result
    assert fragment in result.err
    assert snapshot(project / "generated") == before


def test_a_spec_file_or_folder_that_cannot_be_read_is_reported(project, monkeypatch):
    (project / "specs/kernels/zz.toml").symlink_to(project / "nowhere.toml")
    result = run_cli("--root", str(project), "build")
    assert result.code == 2 and "Traceback" not in result.err, result
    assert "specs/kernels/zz.toml: <top level>: a link to nothing (its target does not exist)" in result.err

    (project / "specs/kernels/zz.toml").unlink()
    real = Path.iterdir

    def iterdir(self):
        if self.name == "models":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "iterdir", iterdir)
    result = run_cli("--root", str(project), "check")
    assert result.code == 2 and "Traceback" not in result.err, result
    assert "specs/models: <top level>: cannot list the directory: Permission denied" in result.err


# Every character str.splitlines() breaks on, and control characters other than tab.
LINE_BREAKS = ["\n", "\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]


@pytest.mark.parametrize("brk", LINE_BREAKS, ids=[repr(b) for b in LINE_BREAKS])
@pytest.mark.parametrize("where", ["start", "middle", "end"])
def test_a_doc_may_not_break_a_line_anywhere(brk, where):
    from codegen.models import text_problem

    text = {"start": brk + "doc", "middle": "do" + brk + "c", "end": "doc" + brk}[where]
    assert text_problem(text) == "must be one line (it has a line break)"


def test_a_doc_is_any_other_line_of_text():
    from codegen.models import text_problem

    for text in ['say """hi"""', "C:\\path\\n", "tab\there", "5\u00a0\u00b5s \u00d7 2", "# x", "{{ x }}", ""]:
        assert text_problem(text) is None, text
    assert text_problem("bell\x07") == "must not contain control characters (it has '\\x07')"


def test_a_file_that_cannot_be_parsed_is_the_only_problem_reported(project):
    """Other files' references to what it would define (targets = ["h200"]) are not reported as
    false 'no such hardware spec' problems."""
    edit(project / "specs/hardware/h200.toml", "warp_size = 32", "warp_size = = 32")
    result = run_cli("--root", str(project), "build")
    assert result.code == 2, result
    line = line_of(project / "specs/hardware/h200.toml", "warp_size = = 32")
    assert result.err.splitlines()[1:] == [result.err.splitlines()[1]], result.err
    assert f"specs/hardware/h200.toml:{line}: <top level>: malformed TOML" in result.err


def test_a_failed_check_points_at_the_key_it_reads(project):
    """The seed's 3 stages in matmul's mlp_up bucket: the line of the first key the hint names
    (block_n = 128 would pass), not the bucket's header."""
    path = project / "specs/kernels/matmul.toml"
    edit(path, "num_stages = 2", "num_stages = 3", after='name = "mlp_up"')
    result = run_cli("--root", str(project), "build")
    assert result.code == 2
    text = path.read_text()
    at = text.index("block_n = 256", text.index('name = "mlp_up"'))
    line = text[:at].count("\n") + 1
    assert line > line_of(path, 'name = "mlp_up"')
    failures = [l for l in result.err.splitlines() if "fails check 'tiles fit shared memory'" in l]
    assert failures and all(f"specs/kernels/matmul.toml:{line}: matmul" in l for l in failures), result.err
    assert all(".bucket[0].block_n: policy nvidia>=120" in l for l in failures), result.err
    assert all("block_n = 128, or " in l for l in failures), result.err


def test_a_spec_that_does_not_validate_is_not_also_reported_as_missing(project):
    """Its own problem is reported; the files naming it (mi300x's vendor, the project's default
    target and model, moe's models) are not told that it does not exist."""
    edit(project / "specs/vendors/amd.toml", "hip = true", 'hip = "yes"')
    edit(project / "specs/models/qwen36.toml", "head_dim = ", 'head_dim = "x" #')
    edit(project / "specs/hardware/bi_v100.toml", "sm_count = 16 ", 'sm_count = "16" ')
    result = run_cli("--root", str(project), "check")
    assert result.code == 2, result
    lines = result.err.splitlines()[1:]
    assert [l.split(":")[0].strip() for l in lines] == [
        "specs/vendors/amd.toml",
        "specs/hardware/bi_v100.toml",
        "specs/models/qwen36.toml",
    ], result.err
