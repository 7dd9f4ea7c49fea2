"""Generated modules read like hand-written code: no line past black's length (100).  The first
line, the "Code generated ... DO NOT EDIT." marker, stays one line: tools find generated files by
it."""

import pytest

from codegen import context as ctx
from codegen.render import format_python, wrap_prose
from conftest import REPO

GENERATED = sorted((REPO / "generated").glob("*.py"))


@pytest.mark.parametrize("path", GENERATED, ids=lambda p: p.name)
def test_every_generated_line_fits_the_line_length(path):
    lines = path.read_text(encoding="utf-8").splitlines()[1:]
    long = [(i + 2, len(line)) for i, line in enumerate(lines) if len(line) > ctx.LINE_LENGTH]
    assert long == [], f"{path.name}: lines (number, length) past {ctx.LINE_LENGTH}: {long[:10]}"


def test_long_comments_and_docstrings_are_wrapped_and_code_is_not():
    note = " ".join(f"word{i}" for i in range(40))
    source = (
        "# marker line " + "x" * 120 + "\n"
        f'"""Module {note}."""\n\n\n'
        "def f():\n"
        '    """Summary.\n\n'
        f"    - item {note}\n"
        '    """\n'
        f"    # {note}\n"
        f"    return '{note}'  # fmt: skip\n"
    )
    out = wrap_prose(source).split("\n")
    assert out[0] == source.split("\n")[0]  # the marker stays whole
    code = [line for line in out if line.startswith("    return")]
    assert code == [f"    return '{note}'  # fmt: skip"]
    assert all(len(line) <= ctx.LINE_LENGTH for line in out[1:] if line not in code)
    assert sum(line.startswith("    # word") for line in out) >= 2  # the comment, on several lines
    assert any(line.startswith("      word") for line in out)  # an item's continuation under its text
    # The words are the same, and it is valid Python that black leaves as it is.
    assert " ".join("\n".join(out).split()).replace("# ", "") == " ".join(source.split()).replace("# ", "")
    assert format_python("\n".join(out), "t.py") == "\n".join(out)


def test_every_public_function_of_a_generated_module_is_annotated():
    """Each function a generated module exports names the type of every parameter and of its
    result, and the names resolve (``typing.get_type_hints``, as an IDE or a checker reads them)."""
    import importlib
    import inspect
    import typing

    import generated

    missing = []
    for name in generated.KERNEL_MODULES:
        module = importlib.import_module(f"generated.{name}")
        for export in module.__all__:
            fn = getattr(module, export)
            if not inspect.isfunction(fn):
                continue
            hints = typing.get_type_hints(fn)
            params = [p for p in inspect.signature(fn).parameters if p not in hints]
            if params or "return" not in hints:
                missing.append(f"{name}.{export}: {params}{'' if 'return' in hints else ' and the result'}")
    assert missing == [], "not annotated: " + "; ".join(missing)
