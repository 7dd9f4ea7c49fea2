"""What the kernel-module tests share: devices, dtypes, targets, case lists and small tensor helpers."""

import pytest
import torch

from generated.dispatch import HARDWARE

NAN = float("nan")
GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
# The interpreter cannot do bf16 arithmetic: bf16 only where there is a GPU.
DTYPES = [torch.float16, torch.float32] + ([torch.bfloat16] if GPU else [])
DTYPE_IDS = ["fp16", "fp32", "bf16"][: len(DTYPES)]
TARGETS = sorted(HARDWARE)
# Targets whose records differ most (tile_bytes 4-16 KiB, min_programs 64-1056): every case.
BROAD = ("h200", "gb10", "bi_v100")


def cases(representative, everything):
    """(target, case) params: the representative cases on every target, all cases on BROAD."""
    pairs = [(t, c) for t in TARGETS for c in representative]
    pairs += [(t, c) for t in BROAD for c in everything if c not in representative]
    return [pytest.param(t, c, id=f"{t}-{'-'.join(map(str, c))}") for t, c in pairs]


def ones(*shape, dtype=torch.float32):
    return torch.ones(*shape, dtype=dtype, device=DEVICE)


def zeros(*shape, dtype=torch.int64):
    return torch.zeros(*shape, dtype=dtype, device=DEVICE)


@pytest.fixture(autouse=True)
def seeded():
    """Fresh random inputs per test, the same on every run."""
    torch.manual_seed(1234)


def routing(T, E, k):
    """Random MoE routing as topk_softmax(logits, k, True) gives it (float32 weights summing to 1,
    int32 ids of k distinct experts), computed by torch on the CPU: kernel tests pay no router
    launch in the interpreter (tests/test_moe.py tests the router itself against torch)."""
    weights, ids = torch.softmax(torch.randn(T, E, dtype=torch.float64), dim=-1).topk(k, dim=-1)
    return (weights / weights.sum(-1, keepdim=True)).float(), ids.to(torch.int32)
