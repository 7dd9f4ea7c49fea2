"""On a GPU (skipped without CUDA): warm a target's matmul in one process into an empty Triton
cache, then in a fresh process call matmul_triton on odd shapes (issue 33's 300x12345x777 and
7x5000x3000 among them, both B layouts) and count compilations: new entries in the cache
directory and, where this Triton has a compilation listener, its cache misses.  Expected: none.
The same for attention, transform and cache: warmed for two models (llama31_8b; gpt_oss_20b, with
its window and sinks), then every entry point's odd calls of tests/test_warmup_classes_kernels.py
(odd token counts and batches, 1, odd block-table widths, q/k/v sliced from a fused qkv, strided
rotary heads, fp8 caches where served) on the GPU."""

import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import REPO

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (compiles and runs kernels)")

ODD_SHAPES = [(300, 12345, 777), (7, 5000, 3000), (1, 4097, 4095), (33, 70, 48), (129, 1000, 1000), (4097, 2056, 8200)]

# Counts a fresh process's compilations: new cache entries, and Triton's cache misses where it has
# a compilation listener.
COUNT = r"""
import json, os, sys, torch, triton
cache = os.environ["TRITON_CACHE_DIR"]
before = set(os.listdir(cache))
misses = None
compilation = getattr(triton.knobs, "compilation", None)
if compilation is not None and hasattr(compilation, "listener"):
    misses = []
    def listener(*, src=None, metadata=None, cache_hit=True, **kwargs):
        if not cache_hit:
            misses.append(str((metadata or {}).get("name", src)))
    compilation.listener = listener
"""

CHILD = COUNT + r"""
from generated import matmul as mm
shapes = json.loads(sys.argv[1])
errors = []
for M, N, K in shapes:
    for layout in ("b row-major", "b = w.t()"):
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16) if layout == "b row-major" else torch.randn(N, K, device="cuda", dtype=torch.bfloat16).t()
        got = mm.matmul_triton(a, b)
        want = a.float() @ b.float()
        err = ((got.float() - want).norm() / want.norm()).item()
        if not err < 2e-2:
            errors.append([M, N, K, layout, err])
torch.cuda.synchronize()
new = sorted(set(os.listdir(cache)) - before)
print(json.dumps({"new_cache_entries": new, "listener_misses": misses, "errors": errors}))
"""


def test_odd_shapes_compile_nothing_after_warm_up(tmp_path):
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("TRITON_INTERPRET", None)
    warm = subprocess.run(
        [sys.executable, "-m", "policy_runtime.warmup", "--modules", "matmul", "--dtypes", "bfloat16"],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=1800,
    )  # fmt: skip
    assert warm.returncode == 0, warm.stdout[-3000:] + warm.stderr[-3000:]
    child = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(ODD_SHAPES)],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=600,
    )  # fmt: skip
    assert child.returncode == 0, child.stdout[-3000:] + child.stderr[-3000:]
    result = json.loads(child.stdout.strip().splitlines()[-1])
    assert result["errors"] == []
    assert result["new_cache_entries"] == [], result
    assert not result["listener_misses"], result


MODELS = ["llama31_8b", "gpt_oss_20b"]

CHILD_KERNELS = COUNT + r"""
sys.path.insert(0, "tests")
import test_warmup_classes_kernels as K
from generated import dispatch
torch.set_default_device("cuda")  # the CPU test's calls, their tensors on the GPU
target = dispatch.target_name(None, torch.device("cuda"))
calls = 0
for model in json.loads(sys.argv[1]):
    for what, call in K.odd_calls(target, model, dispatch.MODEL_DIMS[model], torch.bfloat16):
        call()
        calls += 1
torch.cuda.synchronize()
new = sorted(set(os.listdir(cache)) - before)
print(json.dumps({"calls": calls, "new_cache_entries": new, "listener_misses": misses}))
"""


def test_odd_attention_transform_cache_calls_compile_nothing_after_warm_up(tmp_path):
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("TRITON_INTERPRET", None)
    warm = subprocess.run(
        [sys.executable, "-m", "policy_runtime.warmup", "--modules", "attention", "transform", "cache",
         "--dtypes", "bfloat16", "--models", *MODELS],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=600,
    )  # fmt: skip
    assert warm.returncode == 0, warm.stdout[-3000:] + warm.stderr[-3000:]
    child = subprocess.run(
        [sys.executable, "-c", CHILD_KERNELS, json.dumps(MODELS)],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=600,
    )  # fmt: skip
    assert child.returncode == 0, child.stdout[-3000:] + child.stderr[-3000:]
    result = json.loads(child.stdout.strip().splitlines()[-1])
    assert result["calls"] > 300
    assert result["new_cache_entries"] == [], result
    assert not result["listener_misses"], result
