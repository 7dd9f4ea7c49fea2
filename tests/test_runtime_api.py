"""The runtime's API is public names: no module of policy_runtime/ or generated/ imports a name
with a leading underscore from another module (``from x import _y``, ``x._y`` on an imported
module), so each module's underscore names are its own and can change without a search.  And a
build never imports the shared GPU timing (policy_runtime/timing.py: bench/ and the tuner's)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _sources() -> list[Path]:
    return sorted([*(REPO / "policy_runtime").rglob("*.py"), *(REPO / "generated").glob("*.py")])


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def cross_module_privates(path: Path) -> list[str]:
    """``file:line: name`` for each underscore name the module takes from another module."""
    tree = ast.parse(path.read_text(), str(path))
    found, modules = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if _private(alias.name):
                    where = "." * node.level + (node.module or "")
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}: from {where} import {alias.name}")
                else:
                    modules.add(alias.asname or alias.name)  # may be a module (from . import launch)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                modules.add(alias.asname or alias.name.partition(".")[0])
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and isinstance(node.value, ast.Name):
            if node.value.id in modules and node.value.id not in ("torch", "triton", "tl", "os", "sys"):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_no_module_of_the_runtime_or_the_generated_code_imports_another_modules_underscore_names():
    found = [line for path in _sources() for line in cross_module_privates(path)]
    assert not found, "\n".join(found)


def test_the_check_finds_a_cross_module_underscore_import(tmp_path):
    # The check itself: each form it must catch, and what it must let pass.
    bad = tmp_path / "bad.py"
    bad.write_text("from . import launch as _launch\nfrom .ops import _plan\nx = _launch._cdiv(1, 2)\n")
    good = tmp_path / "good.py"
    good.write_text("from . import launch\nimport torch\ny = launch.cdiv(1, 2)\nz = torch._C\n_own = 1\n")
    global REPO
    saved, REPO = REPO, tmp_path
    try:
        assert [line.split(": ", 1)[1] for line in cross_module_privates(bad)] == [
            "from .ops import _plan",
            "_launch._cdiv",
        ]
        assert cross_module_privates(good) == []
    finally:
        REPO = saved


def test_a_build_never_imports_the_shared_timing_module():
    code = (
        "import sys\n"
        "from codegen import cli\n"
        "code = cli.main(['check'])\n"
        "print(code, 'policy_runtime.timing' in sys.modules, 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.split()[-3:] == ["0", "False", "False"], out.stdout + out.stderr
