"""``codegen check``'s result cache (codegen/check_cache.py): a passing check is remembered, and
any change to what it read (a spec value, a template, a context file or a module it imports, a
generated or schema file, codegen's own source, an installed distribution's file) runs the full
check again, which then reports what is stale."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import REPO, run_cli
from test_families import _toy_root

from codegen import pipeline
from codegen.cli import main


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("CODEGEN_CACHE_DIR", str(folder))
    return folder


@pytest.fixture
def check(monkeypatch):
    """``codegen check`` of a root as the command runs it: (exit code, output, whether the
    compiler ran, i.e. the result did not come from the cache)."""
    runs: list[Path] = []
    real = pipeline.run

    def counted(root, until=None):
        runs.append(root)
        return real(root, until)

    monkeypatch.setattr(pipeline, "run", counted)

    def run(root: Path) -> tuple[int, str, bool]:
        before = len(runs)
        out, err = io.StringIO(), io.StringIO()
        code = main(["--root", str(root), "check"], out=out, err=err, result_cache=True)
        return code, out.getvalue(), len(runs) > before

    return run


FULL, CACHED = True, False


def _built(tmp_path: Path) -> Path:
    root = _toy_root(tmp_path)
    assert run_cli("--root", str(root), "build").code == 0
    return root


def _entry(cache: Path) -> Path:
    (entry,) = (cache / "check").glob("*.json")
    return entry


def test_a_passing_check_is_remembered(tmp_path, cache, check):
    root = _built(tmp_path)
    code, out, ran = check(root)
    assert code == 0 and out == "generated/ is up to date (3 files)\nschemas/ is up to date (7 files)\n" and ran
    assert check(root) == (0, out, CACHED)
    # Installed distributions the check loaded are recorded (their versions' files among them).
    deps = json.loads(_entry(cache).read_text())["deps"]
    for name in ("jinja2/__init__.py", "pydantic/version.py", "_black_version.py"):
        assert any(path.endswith(name) and sig.startswith("stat ") for path, sig in deps.items()), name
    assert any(path.endswith("codegen/render.py") and sig.startswith("sha256 ") for path, sig in deps.items())


def test_a_build_remembers_the_check_of_what_it_wrote(tmp_path, cache, check):
    """The pre-commit hook's check follows a build: the build's own check of its output (from the
    stamps) is the entry, and says what a full check says."""
    root = _toy_root(tmp_path)
    out, err = io.StringIO(), io.StringIO()
    assert main(["--root", str(root), "build"], out=out, err=err, result_cache=True) == 0, err.getvalue()
    code, remembered, ran = check(root)
    assert (code, ran) == (0, CACHED)
    _entry(cache).unlink()
    assert check(root) == (0, remembered, FULL)
    # A spec edited after the build is no longer what it wrote: the full check says so.
    _spec_value(root)
    assert check(root)[::2] == (1, FULL)


def _spec_value(root):
    path = root / "specs" / "hardware" / "small.toml"
    text = path.read_text()
    assert "sm_count = 100" in text
    path.write_text(text.replace("sm_count = 100", "sm_count = 132"))
    return "+        sm_count=132,"


def _template(root):
    path = root / "templates" / "toy.py.j2"
    path.write_text(path.read_text() + "\n# one more line\n")
    return "+# one more line"


def _context_file(root):
    path = root / "templates" / "toy_context.py"
    path.write_text(path.read_text().replace("sorted(blocks)", "sorted(blocks, reverse=True)"))
    return "stale: generated/toy.py"


def _generated_file(root):
    path = root / "generated" / "toy.py"
    path.write_text(path.read_text().replace("_BLOCKS = {", "_BLOCKS = {  # edited", 1))
    return "-_BLOCKS = {  # edited"


def _generated_orphan(root):
    marker = (root / "generated" / "toy.py").read_text().split("\n", 1)[0]
    (root / "generated" / "old.py").write_text(marker + "\n")
    return "extra (orphan, carries the marker): generated/old.py"


def _generated_missing(root):
    (root / "generated" / "toy.py").unlink()
    return "missing: generated/toy.py"


def _schema_file(root):
    path = root / "schemas" / "hardware.schema.json"
    path.write_text(path.read_text().replace('"type": "integer"', '"type": "number"', 1))
    return "stale: schemas/hardware.schema.json"


EDITS = [_spec_value, _template, _context_file, _generated_file, _generated_orphan, _generated_missing, _schema_file]


@pytest.mark.parametrize("edit", EDITS, ids=[e.__name__.strip("_") for e in EDITS])
def test_a_changed_input_runs_the_full_check(tmp_path, cache, check, edit):
    root = _built(tmp_path)
    assert check(root)[::2] == (0, FULL) and check(root)[::2] == (0, CACHED)
    expected = edit(root)
    code, out, ran = check(root)
    assert code == 1 and expected in out and ran, out


def test_a_stale_result_is_never_remembered(tmp_path, cache, check):
    root = _built(tmp_path)
    assert check(root)[::2] == (0, FULL)
    restore = (root / "generated" / "toy.py").read_bytes()
    _generated_file(root)
    assert check(root)[::2] == (1, FULL) and check(root)[::2] == (1, FULL)
    (root / "generated" / "toy.py").write_bytes(restore)  # the bytes the entry recorded: current
    assert check(root)[::2] == (0, CACHED)


def test_a_file_that_is_not_regular_runs_the_full_check(tmp_path, cache, check):
    root = _built(tmp_path)
    (root / "generated" / "notes.txt").symlink_to(root / "specs" / "models" / "m.toml")  # not ours: no marker
    assert check(root)[::2] == (0, FULL) and check(root)[::2] == (0, FULL)
    assert not (cache / "check").exists()


def test_a_changed_loaded_file_runs_the_full_check(tmp_path, cache, check, monkeypatch):
    """Modules the check loaded are inputs too: one a context file imports, and an installed
    distribution's file (its recorded size and time differ, as after an upgrade)."""
    helpers = tmp_path / "helpers"
    helpers.mkdir()
    (helpers / "s31_toy_helper.py").write_text("OFFSET = 0\n")
    monkeypatch.syspath_prepend(str(helpers))
    root = _toy_root(tmp_path)
    context = root / "templates" / "toy_context.py"
    context.write_text("import s31_toy_helper\n" + context.read_text())
    assert run_cli("--root", str(root), "build").code == 0
    # Current again (the entry answers where the build put back the bytes it recorded).
    assert check(root)[0] == 0 and check(root)[::2] == (0, CACHED)
    (helpers / "s31_toy_helper.py").write_text("OFFSET = 1\n")
    assert check(root)[::2] == (0, FULL)  # (in this process the module stays loaded: still current)
    assert check(root)[::2] == (0, CACHED)
    entry = json.loads(_entry(cache).read_text())
    (jinja,) = [path for path in entry["deps"] if path.endswith("jinja2/__init__.py")]
    entry["deps"][jinja] = "stat 0 0"
    _entry(cache).write_text(json.dumps(entry))
    assert check(root)[::2] == (0, FULL)


def test_no_cache_directory_no_result_cache(tmp_path, monkeypatch, check):
    monkeypatch.setenv("CODEGEN_CACHE_DIR", "")
    root = _built(tmp_path)
    assert check(root)[::2] == (0, FULL) and check(root)[::2] == (0, FULL)


RUN_CHECK = """
import sys
from codegen import cli
sys.argv = ["codegen", "--root", sys.argv[1], sys.argv[2]]
code = cli.run()
print("compiler imported:", "codegen.pipeline" in sys.modules, "pydantic" in sys.modules)
sys.exit(code)
"""


def test_the_command_answers_without_the_compiler_until_its_source_changes(tmp_path):
    """The ``codegen`` command end to end, from a copy of codegen's package: a remembered check
    imports neither the compiler nor Pydantic; an edit to a module a context file imports, then
    to codegen's own source, is reported stale by the full check that follows."""
    pkg = tmp_path / "pkg"
    shutil.copytree(REPO / "codegen", pkg / "codegen", ignore=shutil.ignore_patterns("__pycache__"))
    (pkg / "s31_toy_helper.py").write_text("OFFSET = 0\n")
    root = _toy_root(tmp_path)
    context = root / "templates" / "toy_context.py"
    text = context.read_text().replace("inst[\"record\"][\"block\"]", "inst[\"record\"][\"block\"] + OFFSET")
    assert "+ OFFSET" in text
    context.write_text("from s31_toy_helper import OFFSET\n" + text)
    env = dict(os.environ, PYTHONPATH=str(pkg), CODEGEN_CACHE_DIR=str(tmp_path / "cache"))

    def run(command: str) -> tuple[int, str]:
        proc = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(RUN_CHECK), str(root), command],
            cwd=tmp_path, env=env, capture_output=True, text=True,
        )  # fmt: skip
        assert f"{pkg / 'codegen'}" not in proc.stderr, proc.stderr  # no traceback
        return proc.returncode, proc.stdout

    assert run("build")[0] == 0  # remembers the check of what it wrote
    assert run("check") == (0, "generated/ is up to date (3 files)\nschemas/ is up to date (7 files)\n"
                            "compiler imported: False False\n")  # fmt: skip
    (pkg / "s31_toy_helper.py").write_text("OFFSET = 1\n")
    code, out = run("check")
    assert code == 1 and "stale: generated/toy.py" in out and "compiler imported: True True" in out, out
    assert run("build")[0] == 0
    render = pkg / "codegen" / "render.py"
    render.write_text(render.read_text().replace('MARKER_END = ". DO NOT EDIT."', 'MARKER_END = ". DO NOT EDIT!"'))
    code, out = run("check")
    assert code == 1 and "stale: generated/toy.py" in out and "compiler imported: True True" in out, out
