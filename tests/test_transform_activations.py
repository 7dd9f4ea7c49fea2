"""generated/transform.py's other gated activations against float64 references written from vLLM's
published semantics (vllm/model_executor/layers/activation.py):

- gelu_tanh_and_mul (Gemma): ``gelu(x[..., :d], approximate="tanh") * x[..., d:]``;
- swigluoai_and_mul (gpt-oss): interleaved pairs ``gate = x[..., 0::2]``, ``up = x[..., 1::2]``,
  ``gate.clamp(max=limit)``, ``up.clamp(-limit, limit)``, ``gate * sigmoid(alpha * gate) * (up + 1)``
  (alpha 1.702, limit 7.0 by default);
- mul_and_silu: ``x[..., :d] * silu(x[..., d:])``.

Tiny shapes, fp16 and fp32 in the interpreter.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from generated import transform as TR
from kernel_cases import DEVICE, seeded  # noqa: F401  (autouse fixture: a fixed seed per test)

TOL = {torch.float16: 2e-3, torch.float32: 2e-6}


def ref_gelu_tanh(x):
    d = x.shape[-1] // 2
    return F.gelu(x[..., :d], approximate="tanh") * x[..., d:]


def ref_swigluoai(x, alpha=1.702, limit=7.0):
    gate, up = x[..., 0::2].clamp(max=limit), x[..., 1::2].clamp(-limit, limit)
    return gate * torch.sigmoid(alpha * gate) * (up + 1)


def ref_mul_and_silu(x):
    d = x.shape[-1] // 2
    return x[..., :d] * F.silu(x[..., d:])


CASES = {
    "gelu_tanh_and_mul": (TR.gelu_tanh_and_mul, ref_gelu_tanh),
    "swigluoai_and_mul": (TR.swigluoai_and_mul, ref_swigluoai),
    "mul_and_silu": (TR.mul_and_silu, ref_mul_and_silu),
}


def check(got, x, ref, dtype):
    want = ref(x.cpu().double())
    assert got.dtype == dtype and got.shape == want.shape and got.is_contiguous()
    torch.testing.assert_close(got.cpu().double(), want, rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("op", sorted(CASES))
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_matches_the_published_semantics(op, dtype):
    fn, ref = CASES[op]
    # Values to +-12: past swigluoai's limit 7 on both sides, and gelu's tanh near +-1.
    x = (torch.rand(5, 2 * 40) * 24 - 12).to(dtype)
    check(fn(x.to(DEVICE), hw="h200"), x, ref, dtype)


@pytest.mark.parametrize("op", sorted(CASES))
def test_strided_rows_and_higher_ranks(op):
    fn, ref = CASES[op]
    wide = (torch.randn(4, 2 * 24 + 8) * 4).to(torch.float16)
    x = wide[:, : 2 * 24]  # row stride 56, not 48
    check(fn(x.to(DEVICE), hw="bi_v100"), x, ref, torch.float16)
    x3 = (torch.randn(2, 3, 2 * 8) * 4).float()
    check(fn(x3.to(DEVICE), hw="a100"), x3, ref, torch.float32)


def test_swigluoai_alpha_and_limit():
    x = (torch.rand(3, 2 * 16) * 10 - 5).float()
    got = TR.swigluoai_and_mul(x.to(DEVICE), alpha=1.0, limit=2.5, hw="h200")
    check(got, x, lambda t: ref_swigluoai(t, 1.0, 2.5), torch.float32)
    # Not the default alpha and limit: the arguments reach the kernel.
    assert not torch.allclose(got.cpu().double(), ref_swigluoai(x.double()))


def test_bad_arguments():
    with pytest.raises(ValueError, match="gelu_tanh_and_mul: last dim of x"):
        TR.gelu_tanh_and_mul(torch.zeros(2, 5, device=DEVICE))
    with pytest.raises(TypeError, match="mul_and_silu: x has dtype torch.int32"):
        TR.mul_and_silu(torch.zeros(2, 4, dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="swigluoai_and_mul: limit must be a finite number"):
        TR.swigluoai_and_mul(torch.zeros(2, 4, device=DEVICE), limit=float("inf"))
