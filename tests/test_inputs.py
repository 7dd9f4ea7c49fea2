"""No input hangs, crashes or is skipped silently: every one is an exit-2 report or a result."""

import os
import signal
import subprocess
import sys

import pytest

from conftest import REPO, hw_toml, make_tree, run_cli, snapshot

TILE = """
[tile]
record = "TileConfig"
doc = "a test config"

[tile.fields]
block = {{ type = "int", doc = "rows" }}

[[tile.checks]]
name = "fits"
rule = "block <= hw.max_threads_per_block"
message = "{message}"

[tile.base]
block = {block}
"""


def _tree(tmp_path, block="64", message="block {block} is too large", **hw):
    return make_tree(tmp_path, {"h": hw_toml("nvidia", 90, **hw)}, {"tile": TILE.format(block=block, message=message)})


@pytest.mark.parametrize(
    "value, shown",
    [
        ("2 ** 70", None),
        (str(2**70), "1,180,591,620,717,411,303,424"),
        ("1" + "0" * 5000, "an integer of 5,001 digits"),
        ("0x" + "f" * 5000, "an integer of 20,000 bits"),
    ],
    ids=["rule past 64 bits", "literal past 64 bits", "literal of 5,001 digits", "hex literal of 20,000 bits"],
)
def test_integers_past_64_bits_are_spec_errors(tmp_path, value, shown):
    block = f'{{ expr = "{value}" }}' if "**" in value else value
    root = _tree(tmp_path, block=block)
    result = run_cli("--root", str(root), "build")
    assert result.code == 2 and "Traceback" not in result.err, result
    if shown is None:
        assert "rule for 'block' gave an integer outside 64 bits" in result.err
    else:
        # named by file, line and key, its value by its size: Python will not print (or read) it
        line = TILE.splitlines().index("block = {block}") + 1
        assert f"specs/kernels/tile.toml:{line}: tile.base.block: integers are 64-bit in TOML" in result.err
        assert f"(got {shown})" in result.err and result.err.count("\n") == 2, result.err
    assert not (root / "generated").exists()


@pytest.mark.parametrize(
    "rule, fragment",
    [
        ("0x" + "f" * 5000, "invalid rule: a constant of 20,000 bits (more than 512 bits)"),
        ("'" + "x" * 3000 + "'", "invalid rule: a string constant of 3,000 characters (more than 1,000)"),
    ],
    ids=["hex constant of 20,000 bits", "string constant of 3,000 characters"],
)
def test_a_huge_constant_in_a_rule_is_refused_and_printed_bounded(tmp_path, rule, fragment):
    root = _tree(tmp_path, block=f'{{ expr = "{rule}" }}')
    result = run_cli("--root", str(root), "build")
    assert result.code == 2 and "Traceback" not in result.err, result
    (line,) = result.err.splitlines()[1:]
    assert "tile.base.block.expr: " + fragment in line
    assert line.endswith(f"... ({len(rule) + 2 - 77:,} more characters))") and len(line) < 300, line


def test_a_rule_whose_values_grow_without_bound_is_a_rule_error(tmp_path):
    root = _tree(tmp_path, block='{ expr = "(2 ** 200) * (2 ** 200) * (2 ** 200) // (2 ** 590)" }')
    result = run_cli("--root", str(root), "build")
    assert result.code == 2, result
    assert "gives an integer of more than 512 bits" in result.err


def test_a_message_asking_for_a_huge_width_is_not_formatted(tmp_path):
    root = _tree(tmp_path, block="4096", message="block {block:>999999999} is too large")
    result = run_cli("--root", str(root), "build")
    assert result.code == 2, result
    assert "message not formatted: the format spec '>999999999' asks for more than 200 characters" in result.err
    assert len(result.err) < 2000


@pytest.mark.parametrize("kind", ["directory", "fifo", "link to a directory", "link to nothing"])
def test_a_spec_entry_that_is_not_a_regular_file_is_reported_not_skipped(project, kind):
    path = project / "specs/kernels/odd.toml"
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)  # reading it would block the build
    elif kind == "link to a directory":
        (project / "somewhere").mkdir()
        path.symlink_to(project / "somewhere")
    else:
        path.symlink_to(project / "nothing.toml")
    before = snapshot(project / "generated")
    result = run_cli("--root", str(project), "build")
    assert result.code == 2 and "Traceback" not in result.err, result
    (line,) = [l for l in result.err.splitlines() if "odd.toml" in l]
    expected = {
        "directory": "a directory;",
        "fifo": "a FIFO;",
        "link to a directory": "a link to a directory;",
        "link to nothing": "a link to nothing",
    }[kind]
    assert "specs/kernels/odd.toml: <top level>: " in line and expected in line
    assert snapshot(project / "generated") == before


def test_thousands_of_problems_in_one_file_scan_it_once(tmp_path):
    from codegen import source

    bad = "\n".join(f"bogus_{i} = {i}" for i in range(3000))
    text = TILE.format(block="64", message="m").replace('doc = "a test config"', 'doc = "a test config"\n' + bad)
    root = make_tree(tmp_path, {"h": hw_toml("nvidia", 90)}, {"tile": text})
    source.key_lines.cache_clear()
    result = run_cli("--root", str(root), "check")
    assert result.code == 2 and result.err.count("unknown key") == 3000
    # Every problem is located through one scan of the file (key_lines), not one scan each.
    assert source.key_lines.cache_info().misses == 1


def test_a_second_build_of_one_tree_waits_for_nobody_and_says_so(project):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from codegen import write\n"
            "with write.build_lock(Path(sys.argv[1])):\n"
            "    print('held', flush=True); time.sleep(60)",
            str(project / "generated"),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        before = snapshot(project / "generated")
        result = run_cli("--root", str(project), "build")
        assert result.code == 2 and "another codegen build of this tree is running" in result.err, result
        assert snapshot(project / "generated") == before
        # A killed build's lock does not block the next: the OS releases it with the process.
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
        assert run_cli("--root", str(project), "build").code == 0
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(timeout=10)


def test_help_is_plain_text_with_the_exit_codes():
    proc = subprocess.run([sys.executable, "-m", "codegen", "--help"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0
    assert "exit codes:" in proc.stdout and "  3  internal error" in proc.stdout
    assert "``" not in proc.stdout


def test_commands_without_root_say_which_root_they_used(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "codegen", "check"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert f"codegen: root {REPO} (the current directory holds specs/)" in proc.stderr
    elsewhere = subprocess.run(
        [sys.executable, "-m", "codegen", "check"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    assert f"codegen: root {REPO} (codegen's own checkout" in elsewhere.stderr


@pytest.mark.parametrize(
    "field, value, fragment",
    [
        ("warp_size", 4096, "warp_size: Input should be less than or equal to 1024"),
        ("sm_count", 2**40, "sm_count: Input should be less than or equal to 1048576"),
    ],
)
def test_hardware_figures_have_physical_ranges(tmp_path, field, value, fragment):
    root = _tree(tmp_path, **{field: value})
    result = run_cli("--root", str(root), "build")
    assert result.code == 2 and fragment in result.err, result


VENDOR = 'display_name = "v"\narch_from = "capability"\n'


@pytest.mark.parametrize(
    "vendors, fragment",
    [
        (
            {
                "nvidia": VENDOR + 'name_words = ["NVIDIA"]\ndefault = true\n',
                "other": VENDOR + 'name_words = ["nvidia"]\n',
            },
            "specs/vendors/other.toml:3: name_words[0]: "
            "name word is also specs/vendors/nvidia.toml's (case is ignored)",
        ),
        (
            {"nvidia": VENDOR + 'name_words = ["NVIDIA"]\ndefault = true\n', "other": VENDOR},
            "specs/vendors/other.toml: name_words: this vendor can never be detected: it lists no name_words",
        ),
        (
            {"nvidia": VENDOR + "default = true\n", "a": VENDOR + "hip = true\n", "b": VENDOR + "hip = true\n"},
            "specs/vendors/a.toml: name_words: this vendor can never be detected",
        ),
    ],
    ids=["name word of two vendors", "no way to detect", "two HIP vendors without words"],
)
def test_detection_can_tell_every_vendor_apart(tmp_path, vendors, fragment):
    root = make_tree(
        tmp_path, {"h": hw_toml("nvidia", 90)}, {"tile": TILE.format(block=64, message="m")}, vendors=vendors
    )
    result = run_cli("--root", str(root), "check")
    assert result.code == 2 and fragment in result.err, result


def test_a_vendor_without_name_words_is_detected_as_the_default_or_the_only_hip_vendor(tmp_path):
    vendors = {"nvidia": VENDOR + "default = true\n", "amd": VENDOR + "hip = true\n"}
    root = make_tree(
        tmp_path, {"h": hw_toml("nvidia", 90)}, {"tile": TILE.format(block=64, message="m")}, vendors=vendors
    )
    from codegen import load

    assert sorted(load.load(root).vendors) == ["amd", "nvidia"]


def test_printable_text_has_no_character_that_docs_reject_or_comments_escape():
    """text_problem and comment_text skip their per-character checks for printable text: no
    printable code point is a line break or a control character."""
    from codegen.models import is_control, is_line_break

    chars = (chr(i) for i in range(sys.maxunicode + 1))
    assert [c for c in chars if c.isprintable() and (is_line_break(c) or is_control(c))] == []
