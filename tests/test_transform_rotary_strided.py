"""generated/transform.py's rotary_embedding on strided heads (a 3-D query or key view whose head
stride differs from the head size: slices of a fused projection, head-major layouts) against a
float64 reference written from vLLM's published semantics (rotary_embedding: the first rot_dim
dims of each head, NeoX halves or GPT-J pairs, cos and sin from cos_sin_cache[position]).
Elements outside the views must be left as they were.  Tiny shapes, fp16 and fp32 in the
interpreter.
"""

from __future__ import annotations

import pytest
import torch

from generated import transform as TR
from kernel_cases import DEVICE, seeded  # noqa: F401  (autouse fixture: a fixed seed per test)

TOL = {torch.float16: 2e-3, torch.float32: 1e-6}


def rotate(x, positions, cos_sin, rot, neox):
    """float64 [T, H, hs] rotated per vLLM's rotary_embedding."""
    x = x.double().clone()
    half = rot // 2
    cos = cos_sin.double()[positions][:, None, :half]
    sin = cos_sin.double()[positions][:, None, half:]
    if neox:
        x1, x2 = x[..., :half].clone(), x[..., half:rot].clone()
        x[..., :half], x[..., half:rot] = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    else:
        x1, x2 = x[..., 0:rot:2].clone(), x[..., 1:rot:2].clone()
        x[..., 0:rot:2], x[..., 1:rot:2] = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    return x


@pytest.mark.parametrize(
    "dtype, neox, rot",
    [(torch.float16, True, 16), (torch.float32, False, 16), (torch.float32, True, 8)],  # 8: partial rotary
)
def test_heads_sliced_from_a_wider_projection(dtype, neox, rot):
    T, nq, nk, hs = 5, 4, 2, 16
    positions = torch.randint(0, 32, (T,))
    cos_sin = torch.randn(32, rot)
    # query: each head is the first hs of a 3 * hs slab (head stride 48); key: packed heads in a
    # wider row (a fused qkv's k part viewed as [T, nk, hs] after the q part).
    qbuf = torch.randn(T, nq, 3 * hs).to(dtype)
    kbuf = torch.randn(T, nq * hs + nk * hs + 8).to(dtype)
    want_q, want_k = qbuf.double().clone(), kbuf.double().clone()
    q = qbuf.clone().to(DEVICE)[:, :, :hs]  # copies: the call rotates in place
    k = kbuf.clone().to(DEVICE)[:, nq * hs : nq * hs + nk * hs].view(T, nk, hs)
    assert q.stride(1) == 3 * hs != hs
    TR.rotary_embedding(positions.to(DEVICE), q, k, cos_sin.to(DEVICE), hs, neox, hw="h200")
    want_q[:, :, :hs] = rotate(qbuf[:, :, :hs], positions, cos_sin, rot, neox)
    want_k[:, nq * hs : nq * hs + nk * hs] = rotate(
        kbuf[:, nq * hs : nq * hs + nk * hs].view(T, nk, hs), positions, cos_sin, rot, neox
    ).reshape(T, nk * hs)
    # The whole buffers: the rotated views, and everything around them untouched.
    torch.testing.assert_close(q._base.cpu().double(), want_q, rtol=TOL[dtype], atol=TOL[dtype])
    torch.testing.assert_close(k._base.cpu().double(), want_k, rtol=TOL[dtype], atol=TOL[dtype])


def test_head_major_layout():
    """[H, T, hs] storage seen as [T, H, hs]: rows hs apart, heads T * hs apart."""
    T, nh, hs, rot = 3, 4, 8, 8
    positions = torch.tensor([2, 0, 5])
    cos_sin = torch.randn(8, rot)
    store = torch.randn(nh, T, hs)
    q = store.clone().to(DEVICE).transpose(0, 1)
    assert q.stride() == (hs, T * hs, 1)
    want = rotate(store.transpose(0, 1), positions, cos_sin, rot, True)
    TR.rotary_embedding(positions.to(DEVICE), q, None, cos_sin.to(DEVICE), hs, True, hw="bi_v100")
    torch.testing.assert_close(q.cpu().double(), want, rtol=1e-6, atol=1e-6)


def test_overlapping_strided_heads_are_rejected():
    T, nh, hs = 2, 3, 8
    base = torch.zeros(64, device=DEVICE)
    q = base.as_strided((T, nh, hs), (nh * 4, 4, 1))  # heads 4 apart, 8 long: they overlap
    with pytest.raises(ValueError, match="has overlapping heads or tokens"):
        TR.rotary_embedding(
            torch.zeros(T, dtype=torch.int64, device=DEVICE),
            q,
            None,
            torch.ones(4, 8, device=DEVICE),
            hs,
            True,
            hw="h200",
        )
