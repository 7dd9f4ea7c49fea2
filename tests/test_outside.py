"""What a user outside this repository meets: no traceback for anything they can do.

A closed pipe ends a command's output quietly; warm-up planning without a GPU says what it needs
in one line; a project's template or context file that fails is reported (exit 2) by its file
and line, with what was wrong, while a failure in a packaged template stays a bug (exit 3)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import codegen.render as render
from conftest import REPO, run_cli
from test_families import TOY_TEMPLATE, _toy_root


def _to_closed_pipe(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``argv`` with stdout a pipe whose reader has already gone (as `| head` leaves it)."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(argv, stdout=write, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env)
    finally:
        os.close(write)


@pytest.mark.parametrize(
    "argv",
    [
        ["-m", "codegen", "--root", str(REPO), "show"],
        ["-m", "codegen", "--root", str(REPO), "show", "--json"],
        ["-m", "generated.dispatch"],
    ],
    ids=["show", "show-json", "dispatch"],
)
def test_a_closed_pipe_ends_the_output_quietly(argv):
    proc = _to_closed_pipe([sys.executable, *argv], env=dict(os.environ, KERNEL_POLICY_TARGET=""))
    assert proc.returncode == 141, proc.stderr  # 128 + SIGPIPE, as a shell reports `yes | head`
    assert proc.stderr == "", proc.stderr


def test_ctrl_c_ends_codegen_in_one_line(monkeypatch, capsys):
    import codegen.cli as cli

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "main", interrupted)
    assert cli.run() == 130
    assert capsys.readouterr().err == "codegen: interrupted\n"


def test_a_closed_pipe_ends_the_warmup_plan_quietly():
    pytest.importorskip("torch")
    argv = [sys.executable, "-m", "policy_runtime.warmup", "--hw", "h200", "--modules", "cache", "--plan"]
    proc = _to_closed_pipe(argv, env=dict(os.environ, TRITON_INTERPRET="1"))
    assert proc.returncode == 141 and proc.stderr == "", proc.stderr


def test_warmup_planning_without_a_gpu_says_what_it_needs_in_one_line(monkeypatch, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    import policy_runtime.launch as launch
    from policy_runtime.warmup import cli as W

    monkeypatch.setattr(launch, "INTERPRET", False)  # as without TRITON_INTERPRET=1
    assert W.main(["--hw", "h200", "--plan"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        "python -m policy_runtime.warmup: there is no GPU here (torch sees no CUDA device): warm-up and its plan "
        "run the calls on one; TRITON_INTERPRET=1 plans them on the CPU"
    ]


# ---------------------------------------------------------------------------
# A project's template and context file


def _line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def _fails(root: Path) -> str:
    """Build and check both exit 2 with one problem, writing nothing; the problem's line."""
    for command in ("build", "check"):
        result = run_cli("--root", str(root), command)
        assert result.code == 2, (command, result.err)
        assert "Traceback" not in result.err and "internal error" not in result.err, result.err
        lines = result.err.splitlines()
        assert lines[0] == "codegen: 1 problem in the specs; generated/ was not changed:", result.err
        assert len(lines) == 2, result.err
    assert not (root / "generated").exists()
    return lines[1].strip()


TEMPLATE_MISTAKES = {
    # name: (the line replacing the table's, what the message says)
    "a dict's method": (
        "    {{ configs.tile.variants.tile_fp16.instantiations[0].values }}: 0,",
        "rendering generated/toy.py: TypeError: prints the function or method 'values', not data "
        '(a dict\'s key "values" is read as x["values"]: x.values is the dict\'s method)',
    ),
    "an undefined name": (
        "    {{ no_such_name }}: 0,",
        "rendering generated/toy.py: UndefinedError: 'no_such_name' is undefined",
    ),
    "iterating a method": (
        "{% for a, b in configs.tile.variants.tile_fp16.instantiations[0].values %}{% endfor %}",
        "rendering generated/toy.py: TypeError: 'builtin_function_or_method' object is not iterable "
        '(a dict\'s key named like one of its methods is read as x["values"], not x.values)',
    ),
    "a syntax error": (
        "{% for key in %}",
        "rendering generated/toy.py: TemplateSyntaxError: Expected an expression, got 'end of statement block'",
    ),
}


@pytest.mark.parametrize("mistake", sorted(TEMPLATE_MISTAKES))
def test_a_template_mistake_names_the_template_and_its_line(tmp_path, mistake):
    replacement, message = TEMPLATE_MISTAKES[mistake]
    root = _toy_root(tmp_path)
    marker = "    {{ key | py }}: {{ block }},"
    text = TOY_TEMPLATE.replace(marker, replacement)
    (root / "templates" / "toy.py.j2").write_text(text)
    line = _line_of(text, replacement)
    assert _fails(root) == f"templates/toy.py.j2:{line}: {message}"


def test_template_output_that_is_not_python_names_the_template(tmp_path):
    root = _toy_root(tmp_path)
    (root / "templates" / "toy.py.j2").write_text(TOY_TEMPLATE + "\nX = = 1\n")
    problem = _fails(root)
    assert problem.startswith("templates/toy.py.j2: renders generated/toy.py, which is not valid Python: ")
    assert "X = = 1" in problem


CONTEXT_MISTAKES = {
    "no function": (
        "def contexts(ctx):\n    return {}\n",
        None,
        "the context of generated/toy.py: defines no context(ctx) function",
    ),
    "not a dict": (
        "def context(ctx):\n    return [('blocks', [])]\n",
        None,
        "context(ctx) must return a dict for generated/toy.py, not list",
    ),
    "a failing line": (
        "def context(ctx):\n    tile = ctx['configs']['tile']\n    return {'blocks': tile['no_such_key']}\n",
        3,
        "the context of generated/toy.py: KeyError: 'no_such_key'",
    ),
    "a syntax error": ("def context(ctx)\n    return {}\n", 1, "the context of generated/toy.py: SyntaxError: "),
}


@pytest.mark.parametrize("mistake", sorted(CONTEXT_MISTAKES))
def test_a_context_file_mistake_names_the_file(tmp_path, mistake):
    source, line, message = CONTEXT_MISTAKES[mistake]
    root = _toy_root(tmp_path)
    (root / "templates" / "toy_context.py").write_text(source)
    problem = _fails(root)
    where = "templates/toy_context.py" + (f":{line}" if line else "")
    assert problem.startswith(f"{where}: "), problem
    assert message in problem, problem


def test_a_failing_packaged_template_is_still_a_bug(tmp_path, monkeypatch):
    # The toy family's template shipped with codegen (not in the project's templates/): exit 3.
    root = _toy_root(tmp_path)
    packaged = tmp_path / "packaged"
    shutil.copytree(REPO / "templates", packaged)
    (packaged / "toy.py.j2").write_text(TOY_TEMPLATE.replace("{{ block }}", "{{ no_such_name }}"))
    shutil.move(root / "templates" / "toy_context.py", packaged / "toy_context.py")
    (root / "templates" / "toy.py.j2").unlink()
    monkeypatch.setattr(render, "packaged_templates", lambda: packaged)
    result = run_cli("--root", str(root), "build")
    assert result.code == 3 and "internal error (please report)" in result.err, result.err
    assert "no_such_name" in result.err


def test_a_context_file_gets_the_project_templates_line_in_a_chain(tmp_path):
    """A context file that calls a helper module of its own: the innermost line in it is named."""
    root = _toy_root(tmp_path)
    (root / "templates" / "toy_context.py").write_text(textwrap.dedent("""
            def _blocks(ctx):
                return [v["missing"] for v in ctx["configs"]["tile"]["variants"].values()]


            def context(ctx):
                return {"blocks": _blocks(ctx)}
            """))
    assert _fails(root).startswith("templates/toy_context.py:3: the context of generated/toy.py: KeyError")
