"""On a GPU with e4m3fn (skipped without CUDA, or on a part the fp8 KV configs do not serve): the
FP8 KV cache at serving sizes, compiled.  reshape_and_cache writes bf16 K/V of 8 sequences of about
8k tokens (GQA 4, head_dim 128 and 256) into an fp8 cache (exact bytes against torch's e4m3fn
cast); decode_attention (V2 at these lengths) and the paged causal prefill of a 300-token chunk
read it, against fp32 on the dequantized cache (tight) and against the bf16 cache on the same data
(e4m3's quantization error, bounded as in tests/test_fp8_kv.py); decode reads V as 16-bit pairs, and
byte by byte from a value cache off 16-byte alignment, with the same output."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from test_fp8_kv import byte_mismatches

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (compiles and runs kernels)")

FP8 = torch.float8_e4m3fn
BS = 16


def served():
    from generated import attention as at
    from generated.dispatch import target_name

    target = target_name(None, torch.device("cuda"))
    if target in at.FP8_UNSERVED:
        pytest.skip(f"{target} has no {at.FP8_UNSERVED[target]}")
    return target


def setup(lens, Hkv, D, seed=0):
    from generated import cache

    g = torch.Generator(device="cuda").manual_seed(seed)
    per = [-(-n // BS) for n in lens]
    nb = sum(per) + 3
    perm = torch.randperm(nb, device="cuda", generator=g)
    table = torch.zeros(len(lens), max(per), dtype=torch.int32, device="cuda")
    o = 0
    for i, n in enumerate(per):
        table[i, :n] = perm[o : o + n].int()
        o += n
    kc = torch.zeros(nb, BS, Hkv, D, dtype=FP8, device="cuda")
    vc = torch.zeros_like(kc)
    kc16 = torch.zeros(nb, BS, Hkv, D, dtype=torch.bfloat16, device="cuda")
    vc16 = torch.zeros_like(kc16)
    ks, vs = torch.tensor([0.02], device="cuda"), torch.tensor([0.01], device="cuda")
    for i, n in enumerate(lens):
        k = (torch.randn(n, Hkv, D, device="cuda", generator=g) * 2).bfloat16()
        v = torch.randn(n, Hkv, D, device="cuda", generator=g).bfloat16()
        t = torch.arange(n, device="cuda")
        slots = table[i].long()[t // BS] * BS + t % BS
        cache.reshape_and_cache(k, v, kc, vc, slots, "fp8", ks, vs)
        cache.reshape_and_cache(k, v, kc16, vc16, slots)
        want = (k.float() / ks).clamp(-448, 448).to(FP8)
        bad = byte_mismatches(kc.view(-1, Hkv, D)[slots], want, k, 0.02)
        assert not bad, bad
    return table, kc, vc, kc16, vc16, ks, vs


def gathered(cache, table, i, n, scale):
    blocks = table[i, : -(-n // BS)].long()
    Hkv, D = cache.shape[2:]
    return (cache[blocks].float() * scale).reshape(-1, Hkv, D)[:n].transpose(0, 1)[None]  # [1, Hkv, n, D]


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("head_dim, H, Hkv", [(128, 32, 8), (256, 16, 4)])
def test_fp8_decode_and_paged_prefill_at_serving_sizes(head_dim, H, Hkv):
    from generated import attention as at

    served()
    lens = [8200, 8192, 5001, 8211, 1, 7777, 8000, 3333]
    table, kc, vc, kc16, vc16, ks, vs = setup(lens, Hkv, head_dim)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    q = torch.randn(len(lens), H, head_dim, device="cuda").bfloat16()
    out = at.decode_attention(q, kc, vc, table, seq_lens, k_scale=ks, v_scale=vs)
    base = at.decode_attention(q, kc16, vc16, table, seq_lens)
    for i, n in enumerate(lens):
        k, v = gathered(kc, table, i, n, ks), gathered(vc, table, i, n, vs)
        ref = F.scaled_dot_product_attention(q[i : i + 1, :, None].float(), k, v, enable_gqa=True)[0, :, 0]
        assert rel(out[i], ref) < 1e-2, i  # bf16 output and probabilities
    assert rel(out, base) < 0.08
    # V read byte by byte (a value cache one byte past 16-byte alignment: no V_PAIRS): the same output.
    off = torch.empty(vc.numel() + 1, dtype=FP8, device="cuda")[1:].view(vc.shape)
    off.copy_(vc)
    assert rel(at.decode_attention(q, kc, off, table, seq_lens, k_scale=ks, v_scale=vs), out) < 1e-2
    # The paged causal prefill of the last 300 tokens of sequences 0 and 3 (and 1 token of 4).
    chunk = [300, 300, 1]
    ctx = [lens[0], lens[3], lens[4]]
    rows = [0, 3, 4]
    cu_q = torch.tensor([0, 300, 600, 601], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, ctx[0], ctx[0] + ctx[1], sum(ctx)], dtype=torch.int32, device="cuda")
    qp = torch.randn(601, H, head_dim, device="cuda").bfloat16()
    got = at.prefill_attention(qp, kc, vc, cu_q, cu_k, 300, max(ctx), block_table=table[rows].contiguous(),
                               k_scale=ks, v_scale=vs)  # fmt: skip
    c = cu_q.tolist()
    for j, (i, n, m) in enumerate(zip(rows, ctx, chunk)):
        k, v = gathered(kc, table, i, n, ks), gathered(vc, table, i, n, vs)
        qq = qp[c[j] : c[j + 1]].transpose(0, 1)[None].float()
        mask = torch.arange(n, device="cuda")[None, :] <= torch.arange(m, device="cuda")[:, None] + n - m
        ref = F.scaled_dot_product_attention(qq, k, v, attn_mask=mask, enable_gqa=True)[0].transpose(0, 1)
        assert rel(got[c[j] : c[j + 1]], ref) < 1e-2, j
        assert math.isfinite(rel(got[c[j] : c[j + 1]], ref))


def test_fp8_decode_bf16_queries_past_the_fp16_range():
    """bf16 queries over an fp8 cache run fp16 dots (FP8_VIA_F16): a query past fp16's range
    (|q| ~ 1e5 > 65504) is divided by a power of two before its conversion and the scale takes
    it back, so the output stays finite and matches fp32 on the dequantized cache; tiny and
    ordinary queries too."""
    from generated import attention as at

    served()
    lens = [3000, 17, 1000]
    table, kc, vc, _, _, ks, vs = setup(lens, 2, 128, seed=1)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    q = torch.randn(len(lens), 8, 128, device="cuda")
    q[0] *= 2e4
    q[0, 0, 0] = 1.0e5  # past fp16's largest finite value whatever the draw
    q[1] *= 1e-6
    q = q.bfloat16()
    assert q[0].float().abs().max() > 65504
    out = at.decode_attention(q, kc, vc, table, seq_lens, k_scale=ks, v_scale=vs)
    for i, n in enumerate(lens):
        k, v = gathered(kc, table, i, n, ks), gathered(vc, table, i, n, vs)
        ref = F.scaled_dot_product_attention(q[i : i + 1, :, None].float(), k, v, enable_gqa=True)[0, :, 0]
        assert torch.isfinite(out[i]).all(), i
        assert rel(out[i], ref) < 1e-2, i
