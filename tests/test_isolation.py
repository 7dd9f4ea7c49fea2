"""Generated modules stand alone: no codegen, jinja2, pydantic or black at import or call time.

They import the standard library, torch, triton, each other and the hand-written
``policy_runtime``, which itself imports only the standard library, torch, triton and itself."""

import ast
import subprocess
import sys

from conftest import REPO

BLOCKER = """
import sys
BLOCKED = {"codegen", "codegen_templates", "jinja2", "pydantic", "pydantic_core", "black"}
class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is blocked in this test")
        return None
sys.meta_path.insert(0, Blocker())
for mod in list(sys.modules):
    if mod.split(".")[0] in BLOCKED:
        del sys.modules[mod]
"""

ALLOWED_THIRD_PARTY = {"torch", "triton"}
RUNTIME = "policy_runtime"


def test_dispatch_imports_and_works_without_compiler_dependencies():
    script = BLOCKER + """
import generated.dispatch as d
cfg = d.dispatch_kernel_config("attention", "bi_v100")
assert cfg.triton_block_n == 32, cfg
assert d.detect_hardware("nvidia", (9, 0), "NVIDIA H200") == "h200"
for name in ("codegen", "jinja2", "pydantic", "black"):
    assert name not in sys.modules, name
try:
    import jinja2
except ImportError:
    pass
else:
    raise AssertionError("blocker did not block")
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def _imports(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:  # relative: the same package
            yield node.module or ""


def _allowed(name: str, extra: set[str]) -> bool:
    top = name.split(".")[0]
    return top in sys.stdlib_module_names or top in ALLOWED_THIRD_PARTY | extra or top == "__future__"


def test_generated_modules_import_only_stdlib_torch_triton_runtime_and_each_other():
    paths = sorted((REPO / "generated").glob("*.py"))
    assert paths
    for path in paths:
        for name in _imports(path):
            assert _allowed(name, {RUNTIME}), (path, name)


def test_the_runtime_imports_only_stdlib_torch_triton_and_itself():
    paths = sorted((REPO / RUNTIME).glob("*.py"))
    assert len(paths) > 1
    for path in paths:
        for name in _imports(path):
            assert _allowed(name, {RUNTIME}), (path, name)
