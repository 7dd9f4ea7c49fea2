"""codegen tune on the CPU: planning, checks, sharding, workers, merge, resume and write-back.

Most tests time with tests/tune_fakes.py's harness (a fake clock: every run measures the same
numbers, so decisions compare exactly); one runs the real matmul harness in Triton's interpreter.
"""

from __future__ import annotations

import difflib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, run_cli

from codegen import load, resolve
from codegen.tune import results as results_mod
from codegen.tune.decide import decide
from codegen.tune.measure import Shard
from codegen.tune.plan import plan
from codegen.tune.results import ResultsError, ResultsFile

MATMUL = "specs/kernels/matmul.toml"
# The spec names no harness (its family's, policy_runtime.matmul.FAMILY, runs): the fake takes the
# comment's line, so every later line keeps its number.
REAL = "# The harness: the matmul family's tune (policy_runtime/matmul/tune.py), found by the module's name."
FAKE = 'harness = "tests.tune_fakes:HARNESS"'


@pytest.fixture
def fake(project: Path, monkeypatch) -> Path:
    """The project copy, its matmul family timed by the fake harness, which needs no device: as
    in Triton's interpreter (so a GPU of another part, on a GPU host, does not refuse the tune)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    spec = project / MATMUL
    text = spec.read_text()
    assert REAL in text
    spec.write_text(text.replace(REAL, FAKE))
    return project


def _smem(record: dict, dtype_bytes: int) -> int:
    # The spec's smem_bytes rule, restated: ring of A and B tiles (+ the TMA kernel's epilogue).
    ring = record["num_stages"] * (record["block_m"] + record["block_n"]) * record["block_k"] * dtype_bytes
    if record["kernel"] == "tma_persistent":
        ring += record["block_m"] * (record["block_n"] // record["epilogue_subtile"]) * dtype_bytes
        ring += 8 * record["num_stages"]
    return ring


def _header(p, i: int = 0, n: int = 1, fingerprint: str | None = None) -> dict:
    """A results file's header as tune writes it, for plan ``p``'s shard i/n."""
    from codegen.tune.cli import _header as header

    h = header(p, i, n, "test", {k: None for k in ("shapes", "space", "buckets", "rounds", "chunk", "model", "dtype")})
    return dict(h, fingerprint=fingerprint or p.fingerprint)


def _only_inserted(before: str, after: str) -> list[str]:
    """The lines ``after`` adds to ``before``; fails if any line of ``before`` changed or went."""
    sm = difflib.SequenceMatcher(a=before.splitlines(True), b=after.splitlines(True), autojunk=False)
    added = []
    for op, i1, i2, j1, j2 in sm.get_opcodes():
        assert op in ("equal", "insert"), (op, before.splitlines()[i1:i2], after.splitlines()[j1:j2])
        if op == "insert":
            added += after.splitlines()[j1:j2]
    return added


# -- planning --------------------------------------------------------------------------------


def test_plan_launches_only_candidates_that_pass_every_check_in_every_variant():
    tree = load.load(REPO)
    p = plan(tree, "matmul", "h200")
    optin = next(h for h in tree.hardware if h.name == "h200").spec.max_shared_memory_per_block_optin
    assert {b.name for b in p.buckets} == {"decode_wide", "decode", "small", "huge", "wide", "deep", "large"}
    for b in p.buckets:
        keys = [c.key for c in b.candidates]
        assert len(keys) == len(set(keys))
        records = [c.records for c in b.candidates]
        assert len(records) == len(set(records)) and b.incumbent.records not in records
        for c in b.candidates:
            assert _smem(dict(c.records["matmul_16bit"]), 2) <= optin
            assert _smem(dict(c.records["matmul_fp32"]), 4) <= optin
        for label, why in b.rejected:
            assert "fails check" in why, (label, why)
    # A 64x256x64 grouped tile 6 stages deep needs 245,760 B (> 232,448): rejected, never planned.
    small = p.bucket("small")
    assert any(
        "block_n=256" in label and "num_stages=6" in label and "shared memory" in why for label, why in small.rejected
    )
    assert not any(
        (c.record["block_m"], c.record["block_n"], c.record["block_k"], c.record["num_stages"]) == (64, 256, 64, 6)
        for c in small.candidates
    )


def test_plan_is_deterministic_and_its_fingerprint_follows_the_specs(project):
    tree = load.load(project)
    a, b = plan(tree, "matmul", "h200"), plan(load.load(project), "matmul", "h200")
    assert a == b and a.fingerprint == b.fingerprint
    spec = project / MATMUL
    spec.write_text(spec.read_text().replace("num_stages = 12", "num_stages = 10", 1))
    c = plan(load.load(project), "matmul", "h200")
    assert c.fingerprint != a.fingerprint


def test_shards_partition_the_chunks_and_interleave_buckets():
    p = plan(load.load(REPO), "matmul", "h200", chunk=4)
    shards = [p.shard(i, 3) for i in range(3)]
    indexes = [c.index for s in shards for c in s]
    assert sorted(indexes) == list(range(len(p.chunks)))
    assert len({c.bucket for c in p.chunks[: len(p.buckets)]}) == len(p.buckets)  # one chunk of each first


# -- measuring, deciding, writing ------------------------------------------------------------


def test_tune_writes_the_fastest_correct_candidate_for_the_measured_part_only(fake):
    # a100 shares nvidia>=80 with a10 and l40s: its winner goes into a policy of its own.
    before = (fake / MATMUL).read_text()
    r = run_cli(
        "--root", str(fake), "tune", "matmul", "--hw", "a100", "--shapes", "512x512x512", "--quiet", "--no-build"
    )
    assert r.code == 0, r.err + r.out
    after = (fake / MATMUL).read_text()
    added = _only_inserted(before, after)  # nothing of the file changed but what was added
    assert 'targets = ["a100"]' in added and 'bucket = "any"' in added
    # The fastest by the fake clock among the planned candidates, computed here from the plan.
    from tests.tune_fakes import fake_ms

    p = plan(load.load(REPO), "matmul", "a100", shapes=[(512, 512, 512)])
    best = min(fake_ms(dict(c.record)) for c in p.bucket("any").candidates)

    def any_bucket(root: Path, target: str):
        res = resolve.resolve(load.load(root))
        (v16,) = [v for v in res.for_config("matmul") if v.variant == "matmul_16bit"]
        return next(b.record for b in v16.resolved[target].buckets if b.name == "any")

    assert fake_ms(dict(any_bucket(fake, "a100"))) == best < fake_ms(dict(any_bucket(REPO, "a100")))
    for other in ("a10", "l40s"):  # they share the arch's policy and keep what they had
        assert any_bucket(fake, other) == any_bucket(REPO, other)
    prov = [line for line in added if line.startswith("device = ")]
    assert prov == ['device = "cpu (Triton interpreter)"']


def test_a_policy_another_chains_from_is_not_changed_in_place(fake):
    # nvidia>=90 now serves only h100, but h200's policy amends it: h100 gets a policy of its own.
    before = (fake / MATMUL).read_text()
    r = run_cli(
        "--root", str(fake), "tune", "matmul", "--hw", "h100", "--shapes", "128x4096x4096", "--quiet", "--no-build"
    )
    assert r.code == 0, r.err + r.out
    assert 'targets = ["h100"]' in _only_inserted(before, (fake / MATMUL).read_text())


def test_a_value_changed_in_place_leaves_every_other_byte(fake):
    # bi_v100's policy serves only bi_v100: its own bucket is edited where it stands.
    before = (fake / MATMUL).read_text()
    r = run_cli(
        "--root", str(fake), "tune", "matmul", "--hw", "bi_v100", "--shapes", "512x512x512",
        "--space", "block_m=64,128", "--buckets", "any", "--quiet", "--no-build",
    )  # fmt: skip
    assert r.code == 0, r.err + r.out
    after = (fake / MATMUL).read_text()
    sm = difflib.SequenceMatcher(a=before.splitlines(), b=after.splitlines(), autojunk=False)
    changed = [
        (before.splitlines()[i1:i2], after.splitlines()[j1:j2])
        for op, i1, i2, j1, j2 in sm.get_opcodes()
        if op != "equal"
    ]
    replaced = [pair for pair in changed if pair[0]]
    assert replaced == [(["block_m = 64"], ["block_m = 128"])], changed
    inserted = [line for old, new in changed if not old for line in new]
    assert inserted[0].startswith('note = "codegen tune') and "[matmul.policy.bucket.provenance]" in inserted
    assert "previous = {block_m = 64}" in inserted


def test_a_disqualified_candidate_is_never_written(fake):
    before = (fake / MATMUL).read_text()
    r = run_cli(
        "--root", str(fake), "tune", "matmul", "--hw", "h200", "--shapes", "128x4096x4096",
        "--space", "block_n=32,128", "num_stages=4", "--buckets", "small", "--quiet", "--no-build",
    )  # fmt: skip
    assert r.code == 0, r.err + r.out
    assert "disqualified in small: block_n=32 num_stages=4: relative error nan" in r.out
    added = _only_inserted(before, (fake / MATMUL).read_text())
    assert "block_n = 128" in added and not any("block_n = 32" in line for line in added)


def test_incumbents_hold_within_the_spread(fake):
    r = run_cli(
        "--root", str(fake), "tune", "matmul", "--hw", "h200", "--shapes", "128x4096x4096",
        "--space", "block_k=expr:128//dtype_bytes,expr:64//dtype_bytes", "--buckets", "small", "--quiet", "--dry-run",
    )  # fmt: skip
    # block_k does not change the fake clock: equal times are not a win.
    assert r.code == 0 and "no spec changes: the incumbents held" in r.out, r.out + r.err


def test_resume_after_a_kill_measures_only_what_is_left(fake, tmp_path):
    from tests import tune_fakes

    p = plan(load.load(fake), "matmul", "h200", shapes=[(128, 4096, 4096), (1, 4096, 4096)], chunk=16)
    path = tmp_path / "r.jsonl"
    header = _header(p)
    shard = Shard(p, 0, 1, ResultsFile.open(path, header), budget_s=1e9)

    class Killed(Exception):
        pass

    def kill(chunk, line):
        raise Killed

    with pytest.raises(Killed):
        shard.run(progress=kill)
    with open(path, "a") as f:
        f.write('{"kind": "chunk", "index": 3, "bu')  # the line a kill cut short
    first = results_mod.read(path)
    assert len(first.chunks) == 1
    tune_fakes.CALLS.clear()
    again = Shard(p, 0, 1, ResultsFile.open(path, header), budget_s=1e9)
    assert len(again.pending()) == len(p.chunks) - 1
    again.run()
    done = results_mod.read(path)
    assert sorted(done.chunks) == list(range(len(p.chunks)))
    measured = [k for kind, k in tune_fakes.CALLS if kind == "kernel"]
    # Each chunk left: its candidates and the incumbent, once each (one shape per bucket here).
    assert len(measured) == sum(len(c.keys) + 1 for c in p.chunks if c.index not in first.chunks)


def test_results_of_another_plan_are_refused(fake, tmp_path):
    p = plan(load.load(fake), "matmul", "h200", shapes=[(128, 4096, 4096)])
    path = tmp_path / "r.jsonl"
    ResultsFile.open(path, _header(p, fingerprint="000000000000"))
    with pytest.raises(ResultsError, match="another plan"):
        ResultsFile.open(path, _header(p))
    r = run_cli("--root", str(fake), "tune", "merge", str(path))
    assert r.code == 2 and f"{path}: the specs changed since these results were measured" in r.err, r.err


def test_two_workers_and_two_shards_merge_to_the_same_specs(fake, tmp_path):
    import shutil

    other = tmp_path / "other"  # the same tree, for the shards and their merge
    shutil.copytree(fake, other)
    shutil.copytree(fake / "specs", tmp_path / "pristine" / "specs")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    base = [sys.executable, "-m", "codegen", "--root", str(fake), "tune", "matmul", "--hw", "h200", "--quiet"]
    plan_args = ["--shapes", "128x4096x4096", "1x4096x4096", "--chunk", "16"]
    results = tmp_path / "results"
    two = subprocess.run(
        base + plan_args + ["--devices", "7,9", "--no-build", "--results", str(results)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    assert two.returncode == 0, two.stderr + two.stdout
    folders = list(results.iterdir())
    assert len(folders) == 1 and not (fake / ".codegen-tune").exists()
    files = sorted(folders[0].glob("shard-*-of-2.jsonl"))
    got = [results_mod.read(f) for f in files]
    # One worker per device, pinned with CUDA_VISIBLE_DEVICES, on disjoint chunks covering the plan.
    assert [{line["device_env"] for line in r.chunks.values()} for r in got] == [{"7"}, {"9"}]
    assert not set(got[0].chunks) & set(got[1].chunks)
    p = plan(load.load(other), "matmul", "h200", shapes=[(128, 4096, 4096), (1, 4096, 4096)], chunk=16)
    assert set(got[0].chunks) | set(got[1].chunks) == {c.index for c in p.chunks}
    # The same tune as two shards in separate runs, merged.
    shard_files = []
    for i in range(2):
        out = tmp_path / f"s{i}.jsonl"
        r = run_cli(
            "--root", str(other), "tune", "matmul", "--hw", "h200", *plan_args, "--shard", f"{i}/2",
            "--results", str(out), "--quiet",
        )  # fmt: skip
        assert r.code == 0, r.err
        shard_files.append(str(out))
    merged = run_cli("--root", str(other), "tune", "merge", *shard_files, "--no-build", "--quiet")
    assert merged.code == 0, merged.err

    def spec(root: Path) -> list[str]:
        return [line for line in (root / MATMUL).read_text().splitlines() if not line.startswith("command = ")]

    assert spec(fake) != spec(tmp_path / "pristine") and spec(fake) == spec(other)


def test_decide_flips_the_backend_only_past_the_spread_and_keeps_what_it_is_told(fake):
    p = plan(load.load(fake), "matmul", "h200", shapes=[(128, 4096, 4096), (16, 11008, 2048)], chunk=1000)
    small, wide = p.bucket("small"), p.bucket("decode_wide")
    assert small.incumbent.record["backend"] == "library" and wide.incumbent.record["backend"] == "triton_in_graphs"

    def line(bucket, ratio_lib, ms=1.0):
        s = p.shape_text(bucket.shapes[0])
        entry = {
            "incumbent_ms": ms,
            "spread": 0.02,
            "library_ms": ratio_lib,
            "library_vs_incumbent": ratio_lib,
            "candidates": {},
        }
        for c in bucket.candidates:
            entry["candidates"][c.key] = {"ms": 1.0, "vs_incumbent": 1.0, "vs_library": ratio_lib}
        return {
            "kind": "chunk",
            "index": 0 if bucket is small else 1,
            "bucket": bucket.name,
            "keys": [c.key for c in bucket.candidates],
            "shapes": {s: entry},
        }

    # 1.01 is inside the 2% spread; a 50 us kernel is below the spec's min_kernel_us (100).
    for ratio, ms, expect in ((1.10, 1.0, "triton"), (1.01, 1.0, None), (1.10, 0.05, None)):
        merged = results_mod.Merged(
            p.fingerprint, "matmul", "h200", ({"env": {}},), {0: line(small, ratio, ms), 1: line(wide, ratio, ms)}
        )
        v = {x.bucket: x for x in decide(p, merged)}
        assert v["small"].winner is None and v["small"].backend == expect, (ratio, ms)
        assert v["decode_wide"].backend is None  # triton_in_graphs is kept


def test_bad_tune_requests_exit_2_with_a_message(fake):
    cases = [
        (["tune", "nosuch", "--hw", "h200"], "no kernel config 'nosuch'"),
        (["tune", "transform", "--hw", "h200"], "declares no [transform.tune] table"),
        (["tune", "matmul", "--hw", "nosuch"], "no hardware spec 'nosuch'"),
        (["tune", "matmul", "--hw", "h200", "--shard", "3/2"], "I must be in 0..N-1"),
        (["tune", "matmul", "--hw", "h200", "--space", "blockm=64"], "not a field of MatmulConfig"),
        (["tune", "matmul", "--hw", "h200", "--space", "block_k=expr:1+"], "invalid rule"),
        (["tune", "matmul", "--hw", "h200", "--space", "block_k=expr:hw.nosuch"], "'hw.nosuch' is not a hardware"),
        (["tune", "matmul", "--hw", "h200", "--space", "Block_m=64"], "--space: axes.Block_m"),
        (["tune", "matmul", "--hw", "h200", "--shapes", "12x0x4"], "has a dimension <= 0"),
        (["tune", "merge"], "give the results files"),
    ]
    import torch

    if not torch.cuda.is_available():
        cases.append((["tune", "matmul"], "--hw auto: no GPU is visible here; pass --hw NAME"))
    for argv, message in cases:
        r = run_cli("--root", str(fake), *argv)
        assert r.code == 2 and message in r.err, (argv, r.err)
        assert "Traceback" not in r.err


def test_amend_mistakes_are_spec_errors(project):
    spec = project / MATMUL
    text = spec.read_text()
    index = text.count("[[matmul.policy]]")
    bad = (
        text
        + '\n[[matmul.policy]]\nvendor = "nvidia"\nmin_arch = 90\ntargets = ["h100"]\n\n[[matmul.policy.amend]]\nbucket = "nosuch"\nblock_m = 128\n'
    )
    spec.write_text(bad)
    r = run_cli("--root", str(project), "check")
    assert r.code == 2
    line = len(bad.splitlines()) - 1
    assert f"specs/kernels/matmul.toml:{line}: matmul.policy[{index}].amend[0].bucket: no such bucket" in r.err, r.err
    assert "buckets: decode_wide, decode, small" in r.err


def test_the_real_harness_tunes_in_the_interpreter_and_the_result_builds_and_validates(project):
    # The matmul harness on the generated kernels' bodies, fp16 in the interpreter: two candidates.
    jsonschema = pytest.importorskip("jsonschema")
    r = run_cli(
        "--root", str(project), "tune", "matmul", "--hw", "h200", "--shapes", "33x72x48", "--dtype", "float16",
        "--space", "block_m=32,64", "block_n=32", "num_stages=2", "split_k=1", "--buckets", "small", "--quiet",
        "--scope", "policy",
    )  # fmt: skip
    assert r.code == 0, r.err + r.out
    assert "incumbent failed" not in r.out and "2/2" in r.out  # both measured: correct and timed
    import tomllib

    schema = json.loads((project / "schemas/kernels/matmul.schema.json").read_text())
    jsonschema.validate(tomllib.loads((project / MATMUL).read_text()), schema)
    assert run_cli("--root", str(project), "check").code == 0  # generated/ was rebuilt


def test_moe_launch_is_tuned_through_its_declaration_with_the_models_sizes():
    p = plan(load.load(REPO), "moe_launch", "h200")
    qwen = load.load(REPO).models["qwen36"].spec
    assert dict(p.params) == {"num_experts": qwen.num_experts, "hidden_size": qwen.hidden_size, "top_k": qwen.top_k}
    # A shape is (T, I): the spec's shapes are at qwen36's expert intermediate size.
    assert {b.name: [tuple(s) for s in b.shapes] for b in p.buckets} == {
        "decode_one": [(1, qwen.moe_intermediate_size)],
        "decode": [(4, qwen.moe_intermediate_size)],
        "small": [(16, qwen.moe_intermediate_size)],
    }
    # The decode bucket's two spaces: the tensor-core gemv and the CUDA-core simt kernels.  Of
    # simt's 3 x 2 x 2 up slabs and warps x 3 x 2 x 2 down chunks and warps (144), the incumbent
    # (8 x 256 up on 2 warps, 4 x 128 down on 4, chained) is not a candidate, and the spec's checks
    # reject the 12 with 16 x 512 up slabs on 2 warps (256 accumulator registers a thread) and the
    # 12 with 8 x 256 down chunks on 4 warps (16 weights a thread per expert), one of them both
    # (reported by the first check it fails, the slabs'): 144 - 1 - 23.
    decode = p.bucket("decode")
    kinds = [c.record["kernel"] for c in decode.candidates]
    assert set(kinds) == {"gemv", "simt"} and kinds.count("simt") == 120
    rejected = [r for r in decode.rejected if "kernel=simt" in r[0]]
    assert len(rejected) == 23
    slabs = "block_size_n=16 block_size_k={1024 // dtype_bytes} num_warps=2"
    chunks = "down_block_size_n=8 down_block_size_k={512 // dtype_bytes} down_num_warps=4"
    assert all(slabs in label or chunks in label for label, _ in rejected)
    assert sum(slabs in label for label, _ in rejected) == sum(chunks in label for label, _ in rejected) == 12
    for label, why in rejected:
        if slabs in label:
            assert "fp32 accumulators take 256 registers" in why
        else:
            assert "takes 16 weights a thread at 4 warps" in why


def test_the_moe_harness_runs_records_correctly_in_the_interpreter():
    import torch

    from policy_runtime.moe.tune import HARNESS

    params = dict(num_experts=8, hidden_size=64, top_k=2)
    gemv = dict(kernel="gemv", block_size_m=1, block_size_n=16, block_size_k=32, group_size_m=1)
    grouped = dict(kernel="grouped", block_size_m=16, block_size_n=32, block_size_k=32, group_size_m=8)
    for T in (1, 3):  # one token, and several (the interpreter's time goes with the rows)
        problem = HARNESS.problem({"t": T, "i": 32}, torch.float16, "cpu", params)
        simt = dict(gemv, kernel="simt", block_size_n=8, block_size_k=64, fuse_sum=True, num_stages=1)
        simt_down = dict(down_block_size_n=4, down_block_size_k=16, down_num_warps=2, down_num_stages=1, chained=True)
        # simt with its loops staged (the up GEMM 3 deep, the down GEMM 2 deep: their tl.range path).
        staged = dict(simt, num_stages=3)
        for record in (
            dict(gemv, fuse_sum=True),
            dict(grouped, fuse_sum=True),
            dict(grouped, fuse_sum=False),
            simt,
            staged,
        ):
            down = dict(chained=False)
            if record["kernel"] == "simt":
                down = dict(simt_down, down_num_stages=2 if record is staged else 1)
            down = {"down_block_size_n": record["block_size_n"], "down_block_size_k": record["block_size_k"], **down}
            stages = record.get("num_stages", 2)
            out = problem.kernel(
                {"num_stages": 2, "down_num_stages": stages, **record, "num_warps": 4, "down_num_warps": 4, **down}
            )()
            assert problem.error(out) < 2e-3, (T, record)


def test_a_config_that_is_not_bucketed_is_tuned_as_one_and_written_at_policy_level(project):
    # attention: one record per target and model; the winner goes into the policy of h200's own (the
    # specs have one, for its prefill tiles: the tuned field is added to it).
    p = plan(load.load(project), "attention", "h200", shapes=[(8, 8192)])
    (b,) = p.buckets
    assert b.name == "policy" and len(b.candidates) == 3 and dict(p.params)["head_dim"] == 256
    win = next(c for c in b.candidates if "1024" in c.label)
    s = p.shape_text(b.shapes[0])
    entry = {"incumbent_ms": 1.0, "spread": 0.01, "candidates": {}}
    for c in b.candidates:
        entry["candidates"][c.key] = {"ms": 1.0, "vs_incumbent": 1.2 if c is win else 0.9}
    line = {
        "kind": "chunk",
        "index": 0,
        "bucket": "policy",
        "keys": [c.key for c in b.candidates],
        "shapes": {s: entry},
    }
    merged = results_mod.Merged(p.fingerprint, "attention", "h200", ({"env": {}},), {0: line})
    (verdict,) = decide(p, merged)
    assert verdict.winner is win
    from codegen.tune.writeback import edits

    (edit,) = edits(load.load(project), p, (verdict,), env={"device": "test"}, date="2026-12-01", command="test")
    added = _only_inserted(edit.before, edit.after)
    assert 'partition_size = {expr = "1024 if model.head_dim == 256 else 512"}' in added
    assert not any(line.startswith(("[[attention.policy]]", "targets")) for line in added)  # no second h200 policy
    assert not any("amend" in line for line in added)
    (project / edit.path).write_text(edit.after)
    res = resolve.resolve(load.load(project))
    (bf16,) = [v for v in res.for_config("attention") if v.variant == "attention_bf16" and v.model == "qwen36"]
    part = {t: dict(bf16.resolved[t].record)["partition_size"] for t in ("h100", "h200")}
    assert part == {"h100": 512, "h200": 1024}
    (llama,) = [v for v in res.for_config("attention") if v.variant == "attention_bf16" and v.model == "llama31_8b"]
    assert dict(llama.resolved["h200"].record)["partition_size"] == 512


def test_the_attention_harness_runs_decode_records_in_the_interpreter():
    import dataclasses

    import torch

    from generated.dispatch import dispatch_kernel_config
    from policy_runtime.attention.tune import HARNESS

    params = dict(num_heads=4, num_kv_heads=2, head_dim=256, target="h200")
    problem = HARNESS.problem({"batch": 2, "context": 100}, torch.float16, "cpu", params)
    record = dataclasses.asdict(dispatch_kernel_config("attention_fp16", "h200", "qwen36"))
    for ps in (32, 64):  # V2 partitions of 32 and 64 tokens past a 64-token V1 limit
        out = problem.kernel(dict(record, partition_size=ps, v1_v2_threshold=64))()
        assert problem.error(out) < 2e-3


def _wrapper_call(kernel) -> tuple[str, dict]:
    """The body a generated wrapper calls and the constants it passes (its keyword arguments whose
    values are literals; passed-through ones such as ``PDL=PDL`` are not), read from its source."""
    import ast
    import inspect
    import textwrap

    (func,) = ast.parse(textwrap.dedent(inspect.getsource(kernel.fn))).body
    (stmt,) = func.body
    call = stmt.value
    return call.func.id, {
        kw.arg: ast.literal_eval(kw.value) for kw in call.keywords if isinstance(kw.value, ast.Constant)
    }


def test_the_tune_harnesses_launch_the_body_and_constants_the_generated_wrappers_pass():
    # The tuner must time the kernel the build would generate: for every kernel of generated/moe.py
    # and generated/matmul.py, the harness's variant of its record calls the same body with the
    # same constants as the wrapper (a TMA kernel's fallback too).
    import generated.matmul as GM
    import generated.moe as GE
    from policy_runtime.matmul import ops as mm_runtime
    from policy_runtime.matmul import tune as matmul_tune
    from policy_runtime.moe import tune as moe_tune
    from policy_runtime.moe import ops as moe_runtime

    for name, v in GE.VARIANTS.items():
        dtype_bytes = 4 if name.startswith("_moe_fp32_") else 2
        record = dict(
            kernel=v.kind, block_size_m=v.block_m, block_size_n=v.block_n, block_size_k=v.block_k,
            group_size_m=v.group_m, num_warps=v.num_warps, num_stages=v.num_stages, fuse_sum=v.fuse_sum,
            down_block_size_n=v.down_block_n, down_block_size_k=v.down_block_k, down_num_warps=v.down_num_warps,
            down_num_stages=v.down_num_stages, chained=v.chained,
        )  # fmt: skip
        tuned = moe_tune.variant(record, dtype_bytes)
        for part in ("up", "down"):
            body, constants = _wrapper_call(getattr(v, part))
            assert getattr(tuned, part).body is getattr(moe_runtime, body), (name, part)
            assert getattr(tuned, part).consts == constants, (name, part)
    assert len(GE.VARIANTS) >= 20

    kinds = set()
    for name, v in GM.VARIANTS.items():
        dtype_bytes = 4 if name.startswith("_mm_fp32_") else 2
        body, constants = _wrapper_call(v.kernel)
        record = dict(
            kernel=v.kind, block_m=v.block_m, block_n=v.block_n, block_k=v.block_k, group_m=v.group_m,
            split_k=v.split_k, num_warps=v.num_warps, num_stages=v.num_stages, num_programs=v.num_programs,
            flatten=constants.get("FLATTEN", False), epilogue_subtile=constants.get("EPILOGUE_SUBTILE", 1),
        )  # fmt: skip
        tuned = matmul_tune.variant(record, dtype_bytes)
        assert tuned.kernel.body is getattr(mm_runtime, body) and tuned.kernel.consts == constants, name
        assert (tuned.fallback is None) == (v.fallback is None), name
        if v.fallback is not None:
            fb_body, fb_constants = _wrapper_call(v.fallback.kernel)
            assert tuned.fallback.kernel.body is getattr(mm_runtime, fb_body), name
            assert tuned.fallback.kernel.consts == fb_constants, name
            fields = ("kind", "block_m", "block_n", "block_k", "group_m", "split_k", "num_programs")
            assert [getattr(tuned.fallback, f) for f in fields] == [getattr(v.fallback, f) for f in fields], name
        kinds.add(v.kind)
    assert kinds == {"grouped", "small_m", "tma_persistent"}


def test_a_space_too_large_to_plan_is_refused_before_any_candidate_is_resolved(fake, monkeypatch):
    from codegen.tune import plan as plan_mod

    resolved = []
    monkeypatch.setattr(plan_mod, "resolve_target", lambda *a, **k: resolved.append(a) or (None, []))
    ten = ",".join(str(1 << i) for i in range(10))
    r = run_cli(
        "--root", str(fake), "tune", "matmul", "--hw", "h200", "--shapes", "128x4096x4096",
        "--space", f"block_m={ten}", f"block_n={ten}", f"block_k={ten}", f"num_stages={ten}", f"num_warps={ten}",
        f"group_m={ten}", "--dry-run",
    )  # fmt: skip
    assert r.code == 2 and "Traceback" not in r.err, r.err
    assert "--space: the search space is too large to plan: 1,000,000 candidates" in r.err
    assert "block_m 10 x block_n 10 x block_k 10 x num_stages 10 x num_warps 10 x group_m 10" in r.err
    assert "over the cap of 2,000" in r.err and not resolved
    assert not (fake / ".codegen-tune").exists()
    # A spec's own space past the cap is refused naming the space and its line (the cap lowered
    # here: the shipped spaces are under it; 128x4096x4096 falls in h200's small bucket, pointer's).
    monkeypatch.setattr(plan_mod, "MAX_RECORDS", 100)
    r = run_cli("--root", str(fake), "tune", "matmul", "--hw", "h200", "--shapes", "128x4096x4096", "--dry-run")
    assert r.code == 2 and not resolved, r.err
    line = (fake / MATMUL).read_text().splitlines().index('name = "pointer"')  # the table's header line
    assert (
        f"matmul.tune: the search space is too large to plan: 192 candidates (space pointer ({MATMUL}:{line})" in r.err
    )
    assert "= 192 in each of 1 bucket(s) (small)) x 2 variant(s) = 384 records" in r.err


def test_codegen_has_no_import_cycle():
    # Every import in codegen/ (function-level ones too), as a graph of its modules: no cycle.
    # (tune/cli.py imported cli.py's exit codes and main while cli.py imports tune.)
    import ast

    pkg = REPO / "codegen"
    names = {
        ".".join(("codegen",) + p.relative_to(pkg).with_suffix("").parts).removesuffix(".__init__"): p
        for p in pkg.rglob("*.py")
    }
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps = graph.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name in names)
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")
                base = base[: len(base) - node.level + 1] if node.level else []
                module = ".".join(base + ([node.module] if node.module else []))
                for a in node.names:
                    deps.add(f"{module}.{a.name}" if f"{module}.{a.name}" in names else module)
        deps &= set(names)
        deps.discard(name)
    assert len(graph) > 20 and "codegen.tune.cli" in graph["codegen.cli"]

    def cycle_from(start: str, at: str, path: list[str]) -> list[str] | None:
        for dep in sorted(graph[at]):
            if dep == start:
                return path + [dep]
            if dep not in path:
                found = cycle_from(start, dep, path + [dep])
                if found:
                    return found
        return None

    cycles = [c for c in (cycle_from(n, n, [n]) for n in sorted(graph)) if c]
    assert cycles == [], cycles


# -- what a user can give the tuner: each class of bad input exits 2, names it, writes nothing --


def _results_file(fake: Path, tmp_path: Path) -> tuple[Path, object]:
    """A real one-shard results file of a small fake-timed tune, and its plan."""
    out = tmp_path / "r.jsonl"
    r = run_cli(
        "--root", str(fake), "tune", "matmul", "--hw", "h200", "--shapes", "128x4096x4096", "--space",
        "block_n=32,128", "num_stages=4", "--buckets", "small", "--shard", "0/1", "--results", str(out), "--quiet",
    )  # fmt: skip
    assert r.code == 0, r.err
    from codegen.tune.cli import make_plan

    h = results_mod.read(out).header
    return out, make_plan(load.load(fake), "matmul", "h200", h["plan_args"], None)


def test_merge_refuses_a_file_tune_did_not_write_by_name_and_line(fake, tmp_path):
    good, p = _results_file(fake, tmp_path)
    lines = good.read_text().splitlines()
    assert len(lines) == 2  # the header and the one chunk
    header, chunk = json.loads(lines[0]), json.loads(lines[1])

    def bad(name: str, text: str | bytes) -> Path:
        path = tmp_path / name
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        return path

    def dumps(*objs) -> str:
        return "".join(json.dumps(o) + "\n" for o in objs)

    shape = next(iter(chunk["shapes"]))
    no_bucket = {k: v for k, v in chunk.items() if k != "bucket"}
    nan_time = json.loads(json.dumps(chunk))
    nan_time["shapes"][shape]["incumbent_ms"] = float("nan")
    cases = [
        (bad("binary", bytes(range(256)) * 4), ":1: not a codegen tune results file"),
        (bad("empty", b""), ": empty: not a codegen tune results file"),
        (bad("toml", (fake / MATMUL).read_text()), ":1: not a codegen tune results file"),
        (
            bad("bare_header", dumps({"kind": "header", "fingerprint": p.fingerprint})),
            ":1: header: config: Field required",
        ),
        (bad("no_bucket", dumps(header, no_bucket)), ":2: chunk: bucket: Field required"),
        (
            bad("nan", dumps(header, nan_time)),
            f":2: chunk: shapes.{shape}.incumbent_ms: Input should be a finite number",
        ),
        (bad("twice", dumps(header, chunk, chunk)), ":3: chunk 0 again (line 2 has it)"),
        (bad("garbled", dumps(header)[:-1] + "\n{not json\n"), ":2: not a JSON line"),
        (bad("deep", dumps(header) + "[" * 100_000 + "]" * 100_000 + "\n"), ":2: not a JSON line"),
        (bad("second_header", dumps(header, header)), ":2: not a chunk line (a second header)"),
        (bad("other_index", dumps(header, dict(chunk, index=7))), ":2: chunk 7: the plan has 1 chunks"),
        (bad("other_keys", dumps(header, dict(chunk, keys=["0" * 12]))), ":2: chunk 0: its bucket and candidates"),
        (bad("other_plan", dumps(dict(header, fingerprint="0" * 12), chunk)), ": the specs changed since these"),
        (
            bad("unknown_target", dumps(dict(header, target="nosuch"), chunk)),
            ":1: its header's tune (matmul on nosuch)",
        ),
    ]
    spec = (fake / MATMUL).read_bytes()
    for path, message in cases:
        r = run_cli("--root", str(fake), "tune", "merge", str(path), "--no-build")
        assert r.code == 2 and f"{path}{message}" in r.err and "Traceback" not in r.err, (path.name, r.err)
    assert (fake / MATMUL).read_bytes() == spec
    # Resuming a damaged file is refused the same way, before anything is measured.
    damaged = bad("damaged.jsonl", dumps(header, no_bucket))
    r = run_cli(
        "--root", str(fake), "tune", "matmul", "--hw", "h200", "--shapes", "128x4096x4096", "--space",
        "block_n=32,128", "num_stages=4", "--buckets", "small", "--shard", "0/1", "--results", str(damaged), "--quiet",
    )  # fmt: skip
    assert r.code == 2 and f"{damaged}:2: chunk: bucket: Field required" in r.err and "--fresh" in r.err, r.err
    # The good file merges, and a line a kill cut short after it is ignored.
    cut = bad("cut", good.read_text() + lines[1][:40])
    r = run_cli("--root", str(fake), "tune", "merge", str(cut), "--dry-run")
    assert r.code == 0, r.err


def test_a_tune_whose_device_is_not_here_refuses_at_once_and_writes_nothing(fake, monkeypatch):
    import torch

    from codegen.tune import cli as tune_cli

    before = (fake / "specs").exists() and snapshot_tree(fake)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    r = run_cli("--root", str(fake), "tune", "attention", "--hw", "h200", "--dry-run")
    assert r.code == 2 and "--hw h200: no GPU is visible here" in r.err and "Traceback" not in r.err, r.err
    assert "--plan" in r.err and "TRITON_INTERPRET=1" in r.err
    # --plan plans without a device, and writes nothing either.
    r = run_cli("--root", str(fake), "tune", "attention", "--hw", "h200", "--plan")
    assert r.code == 0 and "tune attention on h200" in r.out and "candidates" in r.out, r.err
    # A GPU of another part (detection faked: no GPU here).
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(tune_cli, "_detect", lambda root, i: ["h200", "h100"][i])
    r = run_cli("--root", str(fake), "tune", "attention", "--hw", "h200")
    assert r.code == 2 and "--hw h200: GPU 1 is h100, not h200" in r.err, r.err
    assert snapshot_tree(fake) == before


def snapshot_tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_dry_run_writes_nothing_and_resumes_from_earlier_results(fake, tmp_path):
    from tests import tune_fakes

    before = snapshot_tree(fake)
    argv = ["--root", str(fake), "tune", "matmul", "--hw", "a100", "--shapes", "512x512x512", "--quiet"]
    r = run_cli(*argv, "--dry-run")
    assert r.code == 0 and "+[[matmul.policy.amend]]" in r.out, r.err + r.out
    assert snapshot_tree(fake) == before  # no .codegen-tune/, no spec, no generated/
    # Results a shard left in .codegen-tune/ are resumed (read, not written) by a dry run.
    assert run_cli(*argv, "--shard", "0/1").code == 0
    before = snapshot_tree(fake)
    assert any(".codegen-tune/" in name for name in before)
    tune_fakes.CALLS.clear()
    again = run_cli(*argv, "--dry-run")
    assert again.code == 0 and "chunk(s) already measured" in again.err, again.err
    assert not [c for c in tune_fakes.CALLS if c[0] == "kernel"] and again.out.count("+") == r.out.count("+")
    assert snapshot_tree(fake) == before


def test_results_whose_incumbent_failed_everywhere_are_measured_again(fake, tmp_path):
    p = plan(load.load(fake), "matmul", "h200", shapes=[(128, 4096, 4096)], chunk=16)
    path = tmp_path / "r.jsonl"
    rf = ResultsFile.open(path, _header(p))
    shape = p.shape_text(p.buckets[0].shapes[0])
    for c in p.chunks[:2]:
        rf.append(
            {"kind": "chunk", "index": c.index, "bucket": c.bucket, "keys": list(c.keys), "seconds": 0.1, "pid": 1,
             "device_env": "", "shapes": {shape: {"candidates": {}, "incumbent_failed": "set TRITON_INTERPRET=1"}}}
        )  # fmt: skip
    again = ResultsFile.open(path, _header(p))
    assert again.chunks == {} and [i for i, _ in again.dropped] == [0, 1]
    assert len(path.read_text().splitlines()) == 1  # only the header is left
    assert len(Shard(p, 0, 1, again, budget_s=1e9).pending()) == len(p.chunks)
    # A header a kill cut short (no complete line): the file starts over.
    path.write_text(json.dumps(_header(p))[:30])
    rf = ResultsFile.open(path, _header(p))
    assert results_mod.read(path).header == rf.header and rf.chunks == {}


def test_options_that_name_or_size_something_are_checked(fake, tmp_path):
    good = tmp_path / "r.jsonl"
    good.write_text("")
    cases = [
        (["--chunk", "0"], "--chunk 0: must be at least 1"),
        (["--rounds", "-1"], "--rounds -1: must be at least 1"),
        (["--budget", "nan"], "--budget nan: must be a positive number of seconds"),
        (["--budget", "0"], "--budget 0: must be a positive number of seconds"),
        (["--devices", ","], "--devices ',': give distinct GPU ids"),
        (["--devices", "0,0"], "--devices '0,0': give distinct GPU ids"),
        (["--model", "nosuch"], "--model nosuch: no such model spec (known: deepseek_v3, gemma2_9b, gpt_oss_20b, llama31_8b, qwen36)"),
        (["--shard", "0/2", "--dry-run"], "--shard writes only its results file"),
        (["--shapes", "1x2"], "shape 1x2: give one value per dimension (m, n, k)"),
        (["--buckets", "small"], "--buckets goes with --space"),
        (["--space", "block_m=64", "--buckets", "nosuch"], "no policy has a bucket of this name"),
        (["--plan", "--dry-run"], "--plan measures and writes nothing"),
        (["--results", str(fake / MATMUL)], "cannot create the results folder"),
    ]
    before = snapshot_tree(fake)
    for extra, message in cases:
        r = run_cli("--root", str(fake), "tune", "matmul", "--hw", "h200", "--shapes", "128x4096x4096", *extra)
        assert r.code == 2 and message in r.err and "Traceback" not in r.err, (extra, r.err)
    r = run_cli("--root", str(fake), "tune", "merge", str(good), "--space", "block_m=64", "--hw", "h200")
    assert r.code == 2 and "merge: --space, --hw do not apply" in r.err, r.err
    assert snapshot_tree(fake) == before


def test_the_write_back_holds_the_build_lock_and_refuses_specs_changed_meanwhile(fake, tmp_path, monkeypatch):
    from codegen import write
    from codegen.tune import cli as tune_cli

    argv = ["--root", str(fake), "tune", "matmul", "--hw", "a100", "--shapes", "512x512x512", "--quiet", "--no-build"]
    before = snapshot_tree(fake / "specs")
    with write.build_lock(fake / "generated"):
        r = run_cli(*argv)
    assert r.code == 2 and "another codegen build of this tree is running" in r.err, r.err
    assert snapshot_tree(fake / "specs") == before
    # The spec edited by hand while tune measured: tune's edit would lose it, so nothing is written.
    real = tune_cli.write_back

    def edited_meanwhile(root, found, outs):
        (root / MATMUL).write_text((root / MATMUL).read_text() + "# a hand edit\n")
        return real(root, found, outs)

    monkeypatch.setattr(tune_cli, "write_back", edited_meanwhile)
    r = run_cli(*argv)
    assert r.code == 2 and f"{MATMUL} changed while tune ran; nothing written" in r.err, r.err
    text = (fake / MATMUL).read_text()
    assert text.endswith("# a hand edit\n") and 'targets = ["a100"]' not in text  # the hand edit stays


_KILL = r"""
import os, sys
root, k = sys.argv[1], int(sys.argv[2])
real, count = os.replace, [0]

def replace(src, dst):  # the write-back's renames into the project; killed before the k-th
    if str(dst).startswith(root):
        if count[0] == k:
            os._exit(137)
        count[0] += 1
    real(src, dst)

os.replace = replace
from codegen.cli import main
code = main(sys.argv[3:])
print("renames", count[0])
sys.exit(code)
"""


def test_a_tune_killed_at_any_step_of_its_write_back_leaves_specs_and_generated_consistent(fake, tmp_path):
    import shutil

    results = tmp_path / "r.jsonl"
    argv = ["tune", "matmul", "--hw", "a100", "--shapes", "512x512x512", "--space", "block_n=64,128,256", "--quiet"]
    assert run_cli("--root", str(fake), *argv, "--shard", "0/1", "--results", str(results)).code == 0
    env = dict(os.environ, PYTHONPATH=str(REPO))

    def merge(k: int) -> tuple[Path, subprocess.CompletedProcess]:
        root = tmp_path / f"k{k}"
        shutil.copytree(fake, root)
        cmd = [sys.executable, "-c", _KILL, str(root), str(k), "--root", str(root), "tune", "merge", str(results)]
        return root, subprocess.run(cmd + ["--quiet"], cwd=REPO, env=env, capture_output=True, text=True)

    # No kill (in this process): the write-back's renames into the project, and the state it ends in.
    done = tmp_path / "done"
    shutil.copytree(fake, done)
    real, renamed = os.replace, []

    def replace(src, dst):
        renamed.extend([str(dst)] if str(dst).startswith(str(done)) else [])
        real(src, dst)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "replace", replace)
        full = run_cli("--root", str(done), "tune", "merge", str(results), "--quiet")
    assert full.code == 0, full.err
    assert run_cli("--root", str(done), "check").code == 0
    renames = len(renamed)  # the spec, then generated/matmul.py (a100 gets instantiations of its own)
    assert [Path(r).relative_to(done).as_posix() for r in renamed] == [MATMUL, "generated/matmul.py"]
    old, new = snapshot_tree(fake), snapshot_tree(done)
    assert old[MATMUL] != new[MATMUL] and old["generated/matmul.py"] != new["generated/matmul.py"]
    # Killed before the first rename (every temporary file written), and with the spec renamed
    # but not generated/matmul.py; the run above is the kill after the last.
    for k in range(renames):
        root, killed = merge(k)
        assert killed.returncode == 137, killed.stderr
        spec = (root / MATMUL).read_bytes()
        assert spec in (old[MATMUL], new[MATMUL]), k  # never half a spec
        # Either nothing changed, or the spec is in and the next build brings generated/ to it
        # (the state the whole write-back leaves, which check passes).
        assert run_cli("--root", str(root), "build").code == 0
        expect = old if spec == old[MATMUL] else new
        ours = ("specs/", "generated/", "schemas/")
        after = {n: b for n, b in snapshot_tree(root).items() if n.startswith(ours)}
        # A temporary spec file the kill left (a dot-file: the loader skips it) is all that differs.
        temps = sorted(n for n in after if n.startswith("specs/") and "/." in n)
        assert all(n.startswith("specs/kernels/.matmul.toml.") and n.endswith(".tmp") for n in temps), temps
        assert {n: b for n, b in after.items() if n not in temps} == {
            n: b for n, b in expect.items() if n.startswith(ours)
        }, k
        assert (spec == new[MATMUL]) == (k >= 1), k  # the spec is renamed first
        if temps:  # the next write-back removes them
            assert run_cli("--root", str(root), "tune", "merge", str(results), "--no-build", "--quiet").code == 0
            assert not [n for n in snapshot_tree(root) if n.startswith("specs/") and "/." in n]
