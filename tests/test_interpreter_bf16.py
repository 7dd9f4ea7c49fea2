"""bfloat16 under Triton's interpreter, where these kernels run on the CPU.

The interpreter keeps bfloat16 as uint16 and its ``tl.dot`` multiplies those raw bits
(triton-lang/triton#11584): a bf16 prefill, decode, grouped MoE or Triton matmul returned values
near 1e10, silently.  The entry points whose kernels take bf16 dots now refuse such calls with a
ValueError that says what to do; the others run them (elementwise work, fp8 dots, the simt MoE
kernels, decode over an fp8 cache, whose tiles become fp16); ``matmul`` serves them by torch, as
it serves any call its Triton kernels cannot; warm-up still plans bf16 kernels on the CPU (its
compile-only scope runs nothing: tests/test_feature_records.py).
"""

from __future__ import annotations

import math

import pytest
import torch
import triton
import triton.language as tl

from generated import attention as A
from generated import matmul as MM
from generated import moe as M
from generated import scaled_mm as SM
from generated import transform as T
from kernel_cases import GPU
from test_attention_features import decode_ref, paged

pytestmark = pytest.mark.skipif(GPU, reason="the interpreter's bfloat16; on a GPU bf16 is tested by the GPU files")

BF16, FP8 = torch.bfloat16, torch.float8_e4m3fn
REFUSED = "bfloat16, whose dots Triton's interpreter \\(TRITON_INTERPRET=1\\) computes from the raw bits"


@triton.jit
def _dot(a_ptr, b_ptr, c_ptr, N: tl.constexpr):
    r = tl.arange(0, N)
    a = tl.load(a_ptr + r[:, None] * N + r[None, :])
    b = tl.load(b_ptr + r[:, None] * N + r[None, :])
    tl.store(c_ptr + r[:, None] * N + r[None, :], tl.dot(a, b))


def test_the_interpreters_bf16_dot_is_still_wrong():
    """Why the refusals exist.  When an interpreter gets this right, this fails: the refusals
    (policy_runtime/launch.py's interpreted_bf16_dots) can then go."""
    a, b = torch.randint(-2, 3, (16, 16)).to(BF16), torch.randint(-2, 3, (16, 16)).to(BF16)
    c = torch.zeros(16, 16)
    _dot[(1,)](a, b, c, N=16)
    assert (c - a.float() @ b.float()).abs().max().item() > 1e6


def _moe(T_, E=4, H=64, I=32):
    x = torch.randn(T_, H, dtype=BF16) / 4
    w1, w2 = torch.randn(E, 2 * I, H, dtype=BF16) / 8, torch.randn(E, H, I, dtype=BF16) / 8
    return x, w1, w2, torch.rand(T_, 2), torch.randint(0, E, (T_, 2), dtype=torch.int32)


def _prefill(kv_dtype):
    q = torch.randn(5, 2, 64, dtype=BF16)
    k, v = torch.randn(9, 2, 64).to(kv_dtype), torch.randn(9, 2, 64).to(kv_dtype)
    cu_q, cu_k = torch.tensor([0, 5], dtype=torch.int32), torch.tensor([0, 9], dtype=torch.int32)
    scales = {"k_scale": 1.0, "v_scale": 1.0} if kv_dtype == FP8 else {}
    return lambda: A.prefill_attention(q, k, v, cu_q, cu_k, 5, 9, hw="h200", **scales)


def _decode():
    kc, vc, table = paged([20, 40], 16, 2, 64, BF16)
    q = torch.randn(2, 4, 64, dtype=BF16)
    return lambda: A.decode_attention(q, kc, vc, table, torch.tensor([20, 40], dtype=torch.int32), hw="h200")


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: MM.matmul_triton(torch.randn(33, 64, dtype=BF16), torch.randn(64, 17, dtype=BF16), hw="h200"),
         f"matmul_triton: a and b are {REFUSED}"),
        (lambda: _prefill(BF16)(), f"prefill_attention: q is {REFUSED}"),
        (lambda: _prefill(FP8)(), f"prefill_attention: q is {REFUSED}"),  # fp8 tiles become q's bf16
        (lambda: _decode()(), f"decode_attention: query is {REFUSED}"),
        (lambda: M.fused_moe(*_moe(40), hw="h200"), f"fused_moe: hidden_states are {REFUSED}.*grouped kernels"),
    ],
    ids=["matmul_triton", "prefill", "prefill over fp8", "decode", "fused_moe grouped"],
)  # fmt: skip
def test_calls_whose_kernels_take_bf16_dots_are_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_calls_without_bf16_dots_run_and_are_right():
    # matmul: torch serves what its Triton kernels cannot (bi_v100's policy calls Triton here).
    a, b = torch.randn(64, 64, dtype=BF16), torch.randn(64, 64, dtype=BF16)
    assert not MM.select(64, 64, 64, dtype=BF16, hw="bi_v100").library
    torch.testing.assert_close(MM.matmul(a, b, hw="bi_v100").float(), a.float() @ b.float(), rtol=2e-2, atol=2e-2)
    # Elementwise.
    x = torch.randn(4, 64, dtype=BF16)
    want = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(T.rms_norm(x, torch.ones(64), 1e-6, hw="h200").double(), want, rtol=2e-2, atol=2e-2)
    # One token: the simt MoE kernels (products and sums, no dot).
    x, w1, w2, weights, ids = _moe(1)
    h = w1[ids[0]].double() @ x[0].double()  # [2, 2I]
    act = torch.nn.functional.silu(h[:, :32]) * h[:, 32:]
    want = (weights[0].double()[:, None] * (w2[ids[0]].double() @ act[:, :, None])[..., 0]).sum(0)
    got = M.fused_moe(x, w1, w2, weights, ids, hw="h200")[0].double()
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-3)
    # bf16 queries over an fp8 cache: the tiles become fp16 (FP8_VIA_F16).
    kc, vc, table = paged([20, 40], 16, 2, 64, torch.float32)
    kc, vc = kc.to(FP8), vc.to(FP8)
    q = torch.randn(2, 4, 64, dtype=BF16)
    got = A.decode_attention(q, kc, vc, table, torch.tensor([20, 40], dtype=torch.int32), hw="h200", k_scale=1.0,
                             v_scale=1.0)  # fmt: skip
    want = decode_ref(q.float(), kc.float(), vc.float(), table, [20, 40], scale=1 / math.sqrt(64))
    torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2)
    # FP8 dots, a bf16 result.
    a8, b8 = torch.randn(33, 128).to(FP8), torch.randn(17, 128).to(FP8).t()
    got = SM.scaled_mm(a8, b8, torch.ones(()), torch.ones(()), out_dtype=BF16, hw="h200").double()
    torch.testing.assert_close(got, a8.double() @ b8.double(), rtol=1e-2, atol=1e-1)


def test_the_matmul_tuner_says_why_a_bf16_candidate_fails():
    """codegen tune times its candidates through the family's harness, which launches the kernel
    itself: it reported 'relative error 5.87e+09 > tolerance' for every bf16 candidate."""
    from policy_runtime.matmul import tune

    problem = tune.HARNESS.problem({"m": 32, "n": 32, "k": 32}, BF16, "cpu", {"target": "bi_v100"})
    with pytest.raises(ValueError, match=f"a and b are {REFUSED}.*--dtype float16"):
        problem.kernel({})  # refused before any record is read
