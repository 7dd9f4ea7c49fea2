"""Warm-up covers every argument class a matmul call can take (issue 33): for each bucket, the
plan has a call per class of (N, K) that reaches it (Triton's binder tells sizes of 1, multiples
of 16 and the rest apart; the launcher's TMA test also multiples of 8 and 4), and calls of odd
shapes, the issue's among them, launch only kernels whose specialization key (Triton's own
binder's, computed on the CPU) the plan compiles.  tests/test_warmup_gpu.py counts compilations
on a GPU."""

import os
import random

import pytest
import torch

from policy_runtime.warmup import engine as W
from policy_runtime.matmul.warmup import MatmulDriver
from generated import matmul as mm

# The plans run each call on CPU tensors in Triton's interpreter, which conftest.py turns on only where
# no GPU is visible (Triton reads TRITON_INTERPRET when the kernels are defined): on a GPU machine
# tests/test_warmup_gpu.py counts the real compilations instead.
pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="plans on CPU tensors in the interpreter (TRITON_INTERPRET=1)"
)


_PLANS: dict = {}


def planned(target):
    if target not in _PLANS:
        _PLANS[target] = W.plan(["generated.matmul"], target, dtypes=["bfloat16", "float16"])
    return _PLANS[target]


def launched(plan, call):
    return {name for name, _ in plan.launches[plan.calls.index(call)]}


def odd_shapes():
    rng = random.Random(33)
    shapes = [(300, 12345, 777), (7, 5000, 3000), (1, 4096, 4096), (16, 11008, 2048), (5120, 512, 2048)]
    shapes += [(1, 1, 1), (3, 1, 4097), (4097, 8200, 1), (8192, 24, 40)]
    shapes += [(rng.randint(1, 5000), rng.randint(1, 20000), rng.randint(1, 20000)) for _ in range(12)]
    shapes += [(rng.randint(1, 64), 8 * rng.randint(1, 2500), 8 * rng.randint(1, 2500)) for _ in range(8)]
    return shapes


@pytest.mark.parametrize("target", ("h200", "a100"))
def test_odd_shapes_launch_only_planned_kernels(target):
    plan = planned(target)
    assert not plan.failed
    keys = plan.keys()
    missing = []
    for dtype in ("bfloat16", "float16"):
        for M, N, K in odd_shapes():
            for layout in MatmulDriver.LAYOUTS:
                call = W.Call("generated.matmul", "matmul", (target, dtype, M, N, K, layout), ("odd",))
                launches = W._run_call(call, torch.device("cpu")).launches
                assert launches, (M, N, K)
                missing += [(dtype, M, N, K, layout, name) for name, key in launches if key not in keys]
    assert missing == []


def test_a_dtype_not_asked_for_is_not_covered():
    # The check above has teeth: float32 was not warmed, so its launch is a new key.
    call = W.Call("generated.matmul", "matmul", ("h200", "float32", 300, 12345, 777, "b row-major"), ("odd",))
    ((_, key),) = W._run_call(call, torch.device("cpu")).launches
    assert key not in planned("h200").keys()


def test_each_bucket_is_planned_in_every_size_class_that_reaches_it():
    plan = planned("h200")
    D = MatmulDriver
    for dtype, torch_dtype in (("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        for bucket in mm.buckets("h200", torch_dtype):
            described = {c.covers[5] for c in plan.calls if c.covers[2:5] == (bucket.name, dtype, "b row-major")}
            # Every bucket here serves some N and K of each class: multiples of 16 (with K a
            # multiple of block_k and not), and sizes that are not (odd ones).
            n_classes = {d.split(",")[0] for d in described}
            k_classes = {d.split(",")[1].strip() for d in described}
            assert {"N 16n", "N odd"} <= n_classes, (bucket.name, described)
            assert {"K 16n", "K odd"} <= k_classes, (bucket.name, described)
            if bucket.triton.kind == "grouped":  # its EVEN_K constant: K a multiple of block_k, and not
                assert any("even K" in d for d in described) and any("even K" not in d for d in described)
            if bucket.triton.kind == "tma_persistent":  # odd sizes: the pointer kernel it falls back to
                assert {name for c in plan.calls if c.covers[2:4] == (bucket.name, dtype)
                        for name in launched(plan, c)} == {bucket.triton.name, bucket.triton.fallback.name}  # fmt: skip
            for c in plan.calls:
                if c.covers[2:4] == (bucket.name, dtype):
                    _, _, M, N, K, _ = c.args
                    assert mm.select(M, N, K, dtype=torch_dtype, hw="h200") is bucket
                    assert c.covers[5] == D.describe_class(D.arg_class(M, N, K, bucket.triton))


def test_size_classes():
    D = MatmulDriver
    assert [D.size_class(v) for v in (1, 2, 3, 4, 8, 12, 16, 24, 48, 777)] == [
        "1", "odd", "odd", "4n", "8n", "4n", "16n", "8n", "16n", "odd"
    ]  # fmt: skip
