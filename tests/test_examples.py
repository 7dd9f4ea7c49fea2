"""examples/: a complete kernel family in a project of its own (kernel spec, module spec, template,
context file, runtime package), built from its root as a user would and run in the interpreter."""

from __future__ import annotations

import ast
import re
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO, run_cli

EXAMPLE = REPO / "examples" / "axpy"


@pytest.fixture(scope="module")
def axpy_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("example") / "axpy"
    shutil.copytree(EXAMPLE, root, ignore=shutil.ignore_patterns("generated", "schemas", "__pycache__"))
    result = run_cli("--root", str(root), "build")
    assert result.code == 0, result.err
    return root


def test_the_example_builds_exactly_its_modules_and_checks(axpy_root):
    assert sorted(p.name for p in (axpy_root / "generated").glob("*.py")) == ["__init__.py", "axpy.py", "dispatch.py"]
    assert run_cli("--root", str(axpy_root), "check").code == 0
    # The generated module imports only what generated code may: the stdlib, torch, triton,
    # policy_runtime, and the project's own runtime package.
    tree = ast.parse((axpy_root / "generated" / "axpy.py").read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported == {"__future__", "triton", "axpy_runtime"}  # and, relatively, its dispatch module


def test_the_example_runs_each_targets_kernel_in_the_interpreter(axpy_root):
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    code = textwrap.dedent("""
        import torch
        import generated.axpy as g

        print(g.__file__)
        # Block sizes from the hardware specs: CCCL's bytes in flight (A100 16 KiB, H200 48 KiB)
        # over 4-byte elements, rounded down to a power of two; warps: 4, and 8 from sm_90.
        print({hw: g._KERNELS[hw][1:] for hw in ("a100", "h200")})
        torch.manual_seed(0)
        for hw in ("a100", "h200", None):
            for dtype, tol in ((torch.float32, 1e-6), (torch.float16, 2e-3)):
                x = torch.randn(10001, dtype=dtype)  # not a multiple of any block: a masked tail
                y = torch.randn(10001, dtype=dtype)
                out = g.axpy(-1.5, x, y, hw=hw)
                ref = -1.5 * x.double() + y.double()
                err = ((out.double() - ref).abs() / (1 + ref.abs())).max().item()
                assert out.dtype == dtype and out.shape == x.shape and err <= tol, (hw, dtype, err)
        print("ok")
        """)
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(REPO))  # policy_runtime, for dispatch
    proc = subprocess.run([sys.executable, "-c", code], cwd=axpy_root, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    where, blocks, ok = proc.stdout.splitlines()
    assert where == str(axpy_root / "generated" / "axpy.py")
    assert blocks == "{'a100': (4096, 4), 'h200': (8192, 8)}"
    assert ok == "ok"


def _documented(heading: str) -> set[str]:
    """The keys docs/templates.md lists in the table under ``heading``."""
    text = (REPO / "docs" / "templates.md").read_text()
    section = text.split("\n" + heading + "\n", 1)[1].split("\n#", 1)[0]
    keys = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            keys.update(re.findall(r"`([^`]+)`", line.split(" | ")[0]))
    return keys


def test_the_template_guide_lists_every_key_of_the_context(axpy_root):
    import dataclasses

    from codegen import pipeline, render

    res = pipeline.run(axpy_root, until="tree_to_resolution")
    modules = render.module_list(res)
    (axpy,) = [dataclasses.replace(m, context_file=None) for m in modules if m.name == "axpy"]
    context = render.module_context(res, axpy, modules)
    assert _documented("## The context") == set(context)
    config = context["configs"]["axpy"]
    assert _documented('### A config (`configs["axpy"]`)') == set(config)
    # The default variant: a config without `variants` has one, named after it, without parameters.
    assert list(config["variants"]) == ["axpy"] and config["variants"]["axpy"]["params"] == {}
    variant = config["variants"]["axpy"]
    assert _documented('### A variant (`configs["axpy"]["variants"]["axpy"]`)') == set(variant)
    # Instantiations and buckets of a bucketed config: this repository's matmul.
    repo = pipeline.run(REPO, until="tree_to_resolution")
    matmul = render.module_context(repo, next(m for m in render.module_list(repo) if m.name == "matmul"), ())
    bucketed = next(iter(matmul["configs"]["matmul"]["variants"].values()))["instantiations"][0]
    assert _documented("### An instantiation") == set(variant["instantiations"][0]) | set(bucketed)
    assert _documented("### A bucket (bucketed configs)") == set(bucketed["buckets"][0])
