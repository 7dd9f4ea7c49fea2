"""The compiler is open: a kernel family is a module spec plus a template (and, if it needs one,
a context file beside it), with no edit to codegen/; a project brings its own templates; a root
builds exactly the modules it declares."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import REPO, hw_toml, make_tree, run_cli

PLAIN = """
[tile]
record = "TileConfig"
doc = "A toy config."
variants = { tile_fp16 = { dtype_bytes = 2 }, tile_fp32 = { dtype_bytes = 4 } }

[tile.fields]
block = { type = "int", doc = "rows per program" }

[tile.base]
note = "every target"
block = { largest = [256, 128, 64], where = "block * dtype_bytes * 64 <= hw.max_shared_memory_per_block_optin" }
"""

TOY_MODULE = """
doc = "a toy family: the tile each target uses"
template = "toy.py.j2"
context = "toy_context.py"

[reads.tile]
variants = ["tile_fp16", "tile_fp32"]
fields = ["block"]
params = ["dtype_bytes"]
"""

TOY_TEMPLATE = """{{ header }}
\"\"\"{{ module.doc }}.\"\"\"

from .dispatch import target_name

# (variant, target) -> block, from {{ configs.tile.files | join(", ") }}.
_BLOCKS = {
{% for key, block in blocks %}
    {{ key | py }}: {{ block }},
{% endfor %}
}


def block_for(variant: str, hw: str) -> int:
    return _BLOCKS[(variant, target_name(hw))]
"""

TOY_CONTEXT = """
def context(ctx):
    blocks = []
    for variant in ctx["configs"]["tile"]["variants"].values():
        for inst in variant["instantiations"]:
            for target in inst["target_names"]:
                blocks.append(((variant["name"], target), inst["record"]["block"]))
    return {"blocks": sorted(blocks)}
"""


def _toy_root(tmp_path: Path, **extra_modules: str) -> Path:
    root = tmp_path / "toy"
    hardware = {"big": hw_toml("nvidia", 90, optin=232448), "small": hw_toml("nvidia", 80, optin=49152)}
    make_tree(root, hardware, {"tile": PLAIN}, modules={"toy": TOY_MODULE, **extra_modules})
    (root / "templates").mkdir()
    (root / "templates" / "toy.py.j2").write_text(TOY_TEMPLATE)
    (root / "templates" / "toy_context.py").write_text(textwrap.dedent(TOY_CONTEXT))
    return root


def _run_in(root: Path, code: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=root, capture_output=True, text=True, env=_env()
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def _env():
    import os

    # The generated package of the temporary root, not this repository's: run from its folder only.
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO)  # for policy_runtime
    return env


def test_a_new_family_is_a_spec_and_a_template(tmp_path):
    root = _toy_root(tmp_path)
    result = run_cli("--root", str(root), "build")
    assert result.code == 0, result.err
    built = sorted(p.name for p in (root / "generated").glob("*.py"))
    assert built == ["__init__.py", "dispatch.py", "toy.py"]
    out = _run_in(
        root,
        """
        import sys; sys.path.insert(0, ".")
        from generated.toy import block_for
        print(block_for("tile_fp16", "big"), block_for("tile_fp32", "big"), block_for("tile_fp16", "small"))
        """,
    )
    # 256 * 2 * 64 = 32 KiB fits 48 KiB; 256 * 4 * 64 = 64 KiB does not (128 does).
    assert out == "256 256 256" or out.split() == ["256", "256", "256"]
    assert run_cli("--root", str(root), "check").code == 0
    text = (root / "generated" / "toy.py").read_text()
    assert "specs/modules/toy.toml" in text.splitlines()[0]
    assert "a toy family" in (root / "generated" / "__init__.py").read_text()


def test_the_toy_family_reads_its_records_per_target(tmp_path):
    root = _toy_root(tmp_path)
    assert run_cli("--root", str(root), "build").code == 0
    out = _run_in(
        root,
        """
        import sys; sys.path.insert(0, ".")
        from generated.toy import block_for
        print(block_for("tile_fp32", "small"))
        """,
    )
    assert out == "128"  # 256 * 4 * 64 = 65,536 > 49,152; 128 * 4 * 64 = 32,768 fits


def test_codegen_names_no_family_and_no_vendor():
    from codegen.models import MODEL_DIMENSIONS, MODEL_FEATURES

    words = ("matmul", "rms_norm", "transform", "cache_launch", "attention", "nvidia", "iluvatar", "amd", "moe")
    # A model's dimensions and features are the model spec's schema (a MoE model's expert sizes, its
    # attention sinks), not a family.
    allowed = set(MODEL_DIMENSIONS) | set(MODEL_FEATURES)
    for path in sorted((REPO / "codegen").rglob("*.py")):
        import ast

        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            text = None
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                text = node.value
            elif isinstance(node, ast.Name):
                text = node.id
            elif isinstance(node, ast.Attribute):
                text = node.attr
            if text is not None and text not in allowed:
                for word in words:
                    assert word not in text.lower(), (path.name, text)


def test_a_root_without_module_specs_builds_only_the_dispatch_module(tmp_path):
    root = make_tree(tmp_path / "plain", {"p90": hw_toml("nvidia", 90, optin=232448)}, {"tile": PLAIN})
    result = run_cli("--root", str(root), "build")
    assert result.code == 0, result.err
    assert sorted(p.name for p in (root / "generated").iterdir()) == ["__init__.py", "dispatch.py"]
    out = _run_in(
        root,
        """
        import sys; sys.path.insert(0, ".")
        from generated.dispatch import dispatch_kernel_config
        print(dispatch_kernel_config("tile_fp32", "p90").block)
        """,
    )
    assert out == "256"


def test_a_project_template_overrides_the_packaged_one(tmp_path):
    root = make_tree(tmp_path / "own", {"p90": hw_toml("nvidia", 90, optin=232448)}, {"tile": PLAIN})
    (root / "templates").mkdir()
    (root / "templates" / "init.py.j2").write_text('{{ header }}\n"""Our own package index."""\n')
    assert run_cli("--root", str(root), "build").code == 0
    assert '"""Our own package index."""' in (root / "generated" / "__init__.py").read_text()
    # The dispatch template still comes from the packaged templates.
    assert "def dispatch_kernel_config" in (root / "generated" / "dispatch.py").read_text()


def test_a_missing_template_or_context_file_is_a_spec_error(tmp_path):
    root = _toy_root(tmp_path)
    (root / "templates" / "toy_context.py").unlink()
    (root / "specs" / "modules" / "toy.toml").write_text(TOY_MODULE.replace('"toy.py.j2"', '"toy2.py.j2"'))
    result = run_cli("--root", str(root), "build")
    assert result.code == 2 and "Traceback" not in result.err, result
    assert "specs/modules/toy.toml:3: template: no such file in" in result.err and "(got 'toy2.py.j2')" in result.err
    assert "specs/modules/toy.toml:4: context: no such file in" in result.err
    assert not (root / "generated").exists()


def test_a_module_that_reads_a_missing_field_is_a_spec_error(tmp_path):
    root = _toy_root(tmp_path)
    (root / "specs" / "modules" / "toy.toml").write_text(TOY_MODULE.replace('fields = ["block"]', 'fields = ["rows"]'))
    result = run_cli("--root", str(root), "build")
    assert result.code == 2, result
    assert "field 'rows' is missing from TileConfig: generated/toy.py reads it" in result.err


def test_a_module_spec_may_not_take_a_built_in_name(tmp_path):
    root = _toy_root(tmp_path, dispatch=TOY_MODULE)
    result = run_cli("--root", str(root), "build")
    assert result.code == 2, result
    assert "specs/modules/dispatch.toml: <top level>: generated/dispatch.py is built in" in result.err


@pytest.mark.parametrize(
    "name, fragment",
    [
        ("class", "module name 'class' is a Python keyword: no import statement can name generated/class.py"),
        ("warmup", "module name 'warmup' is taken: generated/__init__.py defines warmup, which generated/warmup.py"),
    ],
)
def test_a_module_spec_may_not_take_a_name_its_import_cannot_reach(tmp_path, name, fragment):
    root = _toy_root(tmp_path, **{name: TOY_MODULE})
    result = run_cli("--root", str(root), "build")
    assert result.code == 2 and "Traceback" not in result.err, result
    (line,) = result.err.splitlines()[1:]
    assert line.startswith(f"  specs/modules/{name}.toml: <top level>: {fragment}"), result.err
    assert not (root / "generated").exists()


def test_the_shipped_families_declare_every_record_field_their_context_files_read():
    """matmul's, moe's and scaled_mm's context files make every field of their config's records
    (``[<config>.fields]``, the one list) a kernel constant: their module specs must declare them
    all, else a spec tree lacking one would fail with a KeyError in the middle of a build, not with
    a spec error (exit 2, the file and the field) before anything is rendered."""
    import tomllib

    for family, config in (("matmul", "matmul"), ("moe", "moe_launch"), ("scaled_mm", "scaled_mm")):
        spec = tomllib.loads((REPO / "specs" / "modules" / f"{family}.toml").read_text())
        fields = tomllib.loads((REPO / "specs" / "kernels" / f"{family}.toml").read_text())[config]["fields"]
        declared = set(spec["reads"][config]["fields"])
        assert set(fields) <= declared, (family, set(fields) - declared)
        context = (REPO / "templates" / family / "context.py").read_text()
        assert f'ctx["configs"]["{config}"]' in context and "KERNEL_FIELDS" not in context, family
