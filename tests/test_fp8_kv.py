"""FP8 KV cache (issue 35 item 4): reshape_and_cache(kv_cache_dtype="fp8") against a reference
quantization (exact bytes), decode_attention and the paged prefill_attention over the fp8 cache
against float64 on the dequantized cache (tight) and against the 16-bit cache on the original data
(e4m3's quantization error, bounded below), the tables and the errors.

Accuracy over the original data (random normal K and V, head_dim 64, fp16 queries): e4m3 keeps 3
mantissa bits (a relative rounding error up to 2^-4, about 2.5% rms), which costs the attention
output 2-5% in relative Frobenius norm against the fp16 cache (measured 3.4-4.6% here); the bound
tested is 8%.  On the CPU the kernels run in Triton's interpreter in fp16 and fp32; the GPU test
(tests/test_fp8_kv_gpu.py) adds bf16 and the compiled kernels.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from generated import attention as at
from generated import cache as C
from generated.dispatch import HARDWARE
from kernel_cases import (
    DEVICE,
    GPU,
    seeded,  # noqa: F401  (autouse fixture: a fixed seed per test)
)
from policy_runtime.attention.ops import PrefillKernel

ATT = at._ATTENTION
FP8 = torch.float8_e4m3fn
QDTYPES = [torch.float16, torch.float32] + ([torch.bfloat16] if GPU else [])
# Against float64 on the dequantized cache: the output's rounding (fp16: 2^-11 relative) and the
# 16-bit probabilities in the P @ V product.
TIGHT = {torch.float16: 2e-3, torch.float32: 1e-4, torch.bfloat16: 2e-2}
# Against the 16-bit cache on the original data: e4m3's rounding (see the module docstring).
QUANT_BOUND = 0.08
UNSERVED = sorted(t for t in HARDWARE if not HARDWARE[t].fp8_e4m3fn)
SERVED = sorted(t for t in HARDWARE if HARDWARE[t].fp8_e4m3fn)


def quantize_ref(x, scale):
    """vLLM's fp8 cache value: saturate(x / scale) rounded to nearest even, as e4m3fn."""
    return (x.double() / float(scale)).clamp(-448.0, 448.0).float().to(FP8)


def byte_mismatches(got, want, src, scale):
    """'' when ``got`` and ``want`` (e4m3fn) hold the same bytes; else how many differ and the
    first eight as (source value, source / scale in fp32, got, want), so a failure shows its values."""
    g, w = got.view(torch.uint8).flatten(), want.view(torch.uint8).flatten()
    bad = (g != w).nonzero().flatten()
    if bad.numel() == 0:
        return ""
    x = src.flatten().double().cpu()
    q = (x / float(scale)).float()
    shown = [(x[i].item(), q[i].item(), got.flatten()[i].item(), want.flatten()[i].item()) for i in bad[:8].tolist()]
    return f"{bad.numel()} of {g.numel()} bytes differ; (x, x/scale, got, want): {shown}"


def rnd(*shape, dtype, std=1.0):
    return (torch.randn(*shape) * std).to(dtype).to(DEVICE)


class Paged:
    """Sequences of ``lens`` tokens written by reshape_and_cache into shuffled blocks of one fp8
    cache (and the same K/V into a 16-bit cache), with their block table."""

    def __init__(self, lens, Hkv, D, dtype, bs=16, ks=0.05, vs=0.02):
        self.lens, self.bs, self.ks, self.vs = lens, bs, ks, vs
        need = [-(-n // bs) for n in lens]
        nb = sum(need) + 1
        self.max_blocks = max(need + [1]) + 1
        self.k = [rnd(n, Hkv, D, dtype=dtype, std=2.0) for n in lens]
        self.v = [rnd(n, Hkv, D, dtype=dtype) for n in lens]
        self.kc = torch.zeros(nb, bs, Hkv, D, dtype=FP8, device=DEVICE)
        self.vc = torch.zeros_like(self.kc)
        self.kc16 = torch.zeros(nb, bs, Hkv, D, dtype=dtype, device=DEVICE)
        self.vc16 = torch.zeros_like(self.kc16)
        perm = torch.randperm(nb).tolist()
        self.table = torch.zeros(len(lens), self.max_blocks, dtype=torch.int32)
        for i, n in enumerate(need):
            self.table[i, :n] = torch.tensor(perm[:n], dtype=torch.int32)
            perm = perm[n:]
        self.table = self.table.to(DEVICE)
        for i in range(len(lens)):
            slots = self.slots(i)
            C.reshape_and_cache(self.k[i], self.v[i], self.kc, self.vc, slots, "fp8", ks, vs, hw="h200")
            C.reshape_and_cache(self.k[i], self.v[i], self.kc16, self.vc16, slots, hw="h200")
        self.seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)

    def slots(self, i):
        t = torch.arange(self.lens[i], device=DEVICE)
        return self.table[i].long()[t // self.bs] * self.bs + t % self.bs

    def dequantized(self, i):
        """Sequence i's keys and values as the cache holds them, in float64: fp8 * scale."""
        s = self.slots(i)
        Hkv, D = self.kc.shape[2:]
        k = self.kc.view(-1, Hkv, D)[s].double().cpu() * self.ks
        v = self.vc.view(-1, Hkv, D)[s].double().cpu() * self.vs
        return k, v


def attention_ref(q, k, v, causal):
    """float64 softmax attention of q [nq, H, D] over k, v [n, Hkv, D], bottom-right causal."""
    H, Hkv, D = q.shape[1], k.shape[1], q.shape[2]
    k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
    s = torch.einsum("qhd,khd->hqk", q.double().cpu(), k) / math.sqrt(D)
    nq, n = q.shape[0], k.shape[0]
    if causal:
        seen = torch.arange(n)[None, :] <= torch.arange(nq)[:, None] + n - nq
        s = s.masked_fill(~seen, -math.inf)
    p = torch.nan_to_num(s.softmax(-1))  # a length of 0: zeros
    return torch.einsum("hqk,khd->qhd", p, v)


def rel(a, b):
    return ((a.double().cpu() - b.double().cpu()).norm() / b.double().cpu().norm()).item()


# ---------------------------------------------------------------------------------------
# The cache write


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_fp8_write_gives_the_reference_bytes(dtype):
    """Odd token count, a skipped slot, int32 slots, a float and a tensor scale; values that
    saturate, round across a binade (127.9 / 0.5 -> 256), round to e4m3's subnormals, tie, or
    round to zero keeping their sign (-0.0 is its own byte, 0x80)."""
    T, Hkv, D, bs, nb = 37, 2, 64, 16, 5
    key, value = rnd(T, Hkv, D, dtype=dtype, std=3.0), rnd(T, Hkv, D, dtype=dtype)
    edge = torch.tensor([1e4, -1e4, 127.9, -63.97, 1e-3, -3e-3, 2.25, 0.0, -1e-4, -9e-4, 1e-4], dtype=dtype)
    key[0, 0, : edge.numel()] = edge.to(DEVICE) * 0.5
    kc = torch.zeros(nb, bs, Hkv, D, dtype=FP8, device=DEVICE)
    vc = torch.zeros_like(kc)
    slots = torch.randperm(nb * bs)[:T]
    slots[5] = -1
    slots = slots.to(torch.int32).to(DEVICE)
    v_scale = torch.tensor([0.03], device=DEVICE)
    C.reshape_and_cache(key, value, kc, vc, slots, "fp8", 0.5, v_scale, hw="h200")
    ok = slots.long() >= 0
    got_k = kc.view(-1, Hkv, D)[slots.long()[ok]]
    got_v = vc.view(-1, Hkv, D)[slots.long()[ok]]
    bad = byte_mismatches(got_k, quantize_ref(key[ok], 0.5), key[ok], 0.5)
    assert not bad, bad
    bad = byte_mismatches(got_v, quantize_ref(value[ok], 0.03), value[ok], 0.03)
    assert not bad, bad
    assert kc.float()[0].abs().max() <= 448.0
    # The skipped token's row and the unwritten slots stay zero.
    written = torch.zeros(nb * bs, dtype=torch.bool)
    written[slots.long()[ok].cpu()] = True
    assert (kc.view(nb * bs, -1)[~written.to(DEVICE)].view(torch.uint8) == 0).all()


def test_fp8_write_on_every_served_target_and_none_elsewhere():
    key = rnd(3, 1, 16, dtype=torch.float16)
    kc = torch.zeros(1, 4, 1, 16, dtype=FP8, device=DEVICE)
    for target in SERVED:
        kc.zero_()
        C.reshape_and_cache(key, key, kc, kc.clone(), torch.arange(3, device=DEVICE), "fp8", 1.0, 1.0, hw=target)
        assert torch.equal(kc[0, :3].view(torch.uint8), quantize_ref(key, 1.0).view(torch.uint8))
    assert sorted(C.FP8_UNSERVED) == UNSERVED == sorted(at.FP8_UNSERVED)
    for target in UNSERVED:
        with pytest.raises(ValueError, match=f"needs fp8_e4m3fn, which target '{target}' lacks"):
            C.reshape_and_cache(key, key, kc, kc, torch.arange(3, device=DEVICE), "fp8", 1.0, 1.0, hw=target)


# ---------------------------------------------------------------------------------------
# Decode


def small_config(**over):
    return dataclasses.replace(at.select(torch.float16, 64, "h200").config, **over)


@pytest.mark.parametrize("qdtype", QDTYPES)
def test_decode_over_the_fp8_cache(qdtype):
    """Odd batch (lengths 0, 1, 37, 70), GQA 4, the V1 path (public function), then V2
    partitions and the PyTorch path (small thresholds), against float64 on the dequantized cache;
    then against the 16-bit cache on the original data (the quantization error)."""
    H, Hkv, D = 8, 2, 64
    cache_dtype = qdtype if qdtype != torch.float32 else torch.float16
    p = Paged([37, 0, 1, 70], Hkv, D, cache_dtype)
    q = rnd(4, H, D, dtype=qdtype)
    refs = [attention_ref(q[i : i + 1], *p.dequantized(i), causal=False)[0] for i in range(4)]
    ref = torch.stack(refs)
    v_scale = torch.tensor(p.vs, device=DEVICE)  # a 0-d tensor scale
    out = at.decode_attention(q, p.kc, p.vc, p.table, p.seq_lens, k_scale=p.ks, v_scale=v_scale, hw="h200")
    assert (out.double().cpu() - ref).abs().max().item() < TIGHT[qdtype]
    # V2 (partitions of 16 tokens, merged) and, past 64 tokens, the PyTorch path.
    cfg = small_config(v1_v2_threshold=16, partition_size=16, pytorch_decode_threshold=64)
    out2 = ATT.decode(q, p.kc, p.vc, p.table, p.seq_lens, k_scale=p.ks, v_scale=p.vs, hw="h200", config=cfg)
    assert (out2.double().cpu() - ref).abs().max().item() < TIGHT[qdtype]
    if qdtype != torch.float32:
        q16 = q
        base = at.decode_attention(q16, p.kc16, p.vc16, p.table, p.seq_lens, hw="h200")
        live = [0, 2, 3]  # the empty sequence gives zeros in both
        assert rel(out[live], base[live]) < QUANT_BOUND


def test_decode_reads_v_as_16_bit_pairs_where_its_rows_allow_and_as_bytes_elsewhere(monkeypatch):
    """decode_body reads an fp8 value cache as 16-bit words, its even and odd head_dim columns in
    two dots (V_PAIRS), where every V row is 2-byte aligned, and byte by byte where not: a cache
    one byte past 16-byte alignment, or with an odd head stride.  Each path against float64 on the
    dequantized cache, with every feature (window, soft-cap, ALiBi, sinks), V2 partitions and the
    merge, at head_dim 40: a padded tile (40 columns of 64, 20 pairs of 32).  The full-width tile
    reads pairs in every other fp8 decode test (their caches are aligned)."""
    from policy_runtime.attention import ops
    from test_attention_features import decode_ref

    H, Hkv, D = 4, 2, 40
    p = Paged([37, 0, 70, 5], Hkv, D, torch.float16)
    q = rnd(4, H, D, dtype=torch.float16)
    slopes = torch.tensor([2.0 ** (-2 * (h + 1)) for h in range(H)], device=DEVICE)
    sinks = rnd(H, dtype=torch.float32, std=2.0)
    feat = dict(window_size=(50, 0), softcap=4.0, alibi_slopes=slopes, sinks=sinks)
    ref = decode_ref(q, p.kc.float() * p.ks, p.vc.float() * p.vs, p.table, p.lens, scale=1 / math.sqrt(D),
                     window=(50, 0), softcap=4.0, alibi=slopes, sinks=sinks)  # fmt: skip
    flat = torch.zeros(p.vc.numel() + 1, dtype=FP8, device=DEVICE)
    off = flat[1:].view(p.vc.shape)  # one byte past the allocation's alignment
    off.copy_(p.vc)
    wide = torch.zeros(*p.vc.shape[:3], D + 1, dtype=FP8, device=DEVICE)
    odd = wide[..., :D]  # head stride D + 1
    odd.copy_(p.vc)
    pairs = []
    launch = ops._launch.launch_kernel

    def spy(kernel, grid, *args, **kw):
        if getattr(kernel, "__name__", "").startswith("_decode"):
            pairs.append(kw.get("V_PAIRS", False))
        return launch(kernel, grid, *args, **kw)

    monkeypatch.setattr(ops._launch, "launch_kernel", spy)
    # V2 partitions of 16 tokens past 16 (a window of 51 tokens: 4 partitions), merged.
    cfg = small_config(v1_v2_threshold=16, partition_size=16, pytorch_decode_threshold=200)
    for vc, want in ((p.vc, True), (off, False), (odd, False)):
        assert ops._fp8_pairs_aligned(vc) is want
        out = ATT.decode(q, p.kc, vc, p.table, p.seq_lens, k_scale=p.ks, v_scale=p.vs, hw="h200", config=cfg, **feat)
        err = (out.double().cpu() - ref).abs().max().item()
        assert err < TIGHT[torch.float16], (want, err)
    assert pairs == [True, False, False]


def test_decode_tables_and_tiles():
    """Every served target has fp8 decode tiles (AttentionLaunchFp8) per head_dim and query class,
    whose one-byte K/V staging fits the part; unserved targets raise naming target and feature."""
    for cls in ("16bit", "fp32"):
        for hd in at.HEAD_DIMS:
            table = ATT.decode_fp8_tables[cls][hd]
            assert sorted(table) == SERVED
            for target, dec in table.items():
                assert type(dec.launch).__name__ == "AttentionLaunchFp8"
                assert dec.kernel.dtype_class == cls and dec.kernel.block_n == dec.launch.block_n
                smem = dec.launch.block_n * hd * 2 * dec.launch.num_stages + 16 * hd * 4
                assert smem <= HARDWARE[target].max_shared_memory_per_block_optin
    sel = at.select(torch.bfloat16, 128, "h200", kv_fp8=True)
    assert sel.launch.block_n == 128 and sel.decode.block_n == 128  # twice the 16-bit tile's tokens
    for target in UNSERVED:
        with pytest.raises(ValueError, match=f"needs fp8_e4m3fn, which target '{target}' lacks"):
            at.select(torch.float16, 128, target, kv_fp8=True)


# ---------------------------------------------------------------------------------------
# Prefill over the paged fp8 cache


def smallest(dtype_class):
    return min(
        (k for k in at.KERNELS.values() if isinstance(k, PrefillKernel) and k.dtype_class == dtype_class),
        key=lambda k: (k.block_m * k.block_n, k.num_stages),
    )


@pytest.mark.parametrize("qdtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("causal", [True, False])
def test_paged_prefill_over_the_fp8_cache(qdtype, causal):
    """A chunk of new tokens per sequence (3, 1, 17) over its whole context in the fp8 cache
    (37, 1, 40 tokens, reshape_and_cache wrote them), GQA 2, bottom-right causal; the smallest
    prefill tile (the interpreter is slow), then the target's through the public function."""
    H, Hkv, D = 4, 2, 64
    p = Paged([37, 1, 40], Hkv, D, torch.float16)
    lq = [3, 1, 17]
    cu_q = torch.tensor([0, 3, 4, 21], dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0, 37, 38, 78], dtype=torch.int32, device=DEVICE)
    q = rnd(21, H, D, dtype=qdtype)
    kernel = smallest("fp32" if qdtype == torch.float32 else "16bit")
    out = ATT.prefill(q, p.kc, p.vc, cu_q, cu_k, 17, 40, causal=causal, block_table=p.table, k_scale=p.ks,
                      v_scale=p.vs, hw="h200", kernel=kernel)  # fmt: skip
    c = cu_q.tolist()
    for i in range(3):
        ref = attention_ref(q[c[i] : c[i + 1]], *p.dequantized(i), causal=causal)
        assert (out[c[i] : c[i + 1]].double().cpu() - ref).abs().max().item() < TIGHT[qdtype], i
    if qdtype == torch.float16:
        # The 16-bit cache through the same paged path, and the quantization error against it.
        base = ATT.prefill(q, p.kc16, p.vc16, cu_q, cu_k, 17, 40, causal=causal, block_table=p.table, hw="h200",
                           kernel=kernel)  # fmt: skip
        for i in range(3):
            k16 = torch.cat([p.k[i]]).double().cpu()
            ref16 = attention_ref(q[c[i] : c[i + 1]], k16, p.v[i].double().cpu(), causal=causal)
            assert (base[c[i] : c[i + 1]].double().cpu() - ref16).abs().max().item() < TIGHT[qdtype]
        assert rel(out, base) < QUANT_BOUND
    assert lq == [b - a for a, b in zip(c, c[1:])]


def test_paged_prefill_through_the_public_function():
    H, Hkv, D = 2, 1, 64
    p = Paged([5], Hkv, D, torch.float16)
    q = rnd(5, H, D, dtype=torch.float16)
    cu = torch.tensor([0, 5], dtype=torch.int32, device=DEVICE)
    out = at.prefill_attention(q, p.kc, p.vc, cu, cu, 5, 5, block_table=p.table, k_scale=p.ks, v_scale=p.vs,
                               hw="h200")  # fmt: skip
    ref = attention_ref(q, *p.dequantized(0), causal=True)
    assert (out.double().cpu() - ref).abs().max().item() < TIGHT[torch.float16]


# ---------------------------------------------------------------------------------------
# Errors


def decode_args(**over):
    kc = torch.zeros(2, 16, 1, 64, dtype=FP8, device=DEVICE)
    args = dict(query=rnd(1, 2, 64, dtype=torch.float16), key_cache=kc, value_cache=kc.clone(),
                block_tables=torch.zeros(1, 2, dtype=torch.int32, device=DEVICE),
                seq_lens=torch.ones(1, dtype=torch.int32, device=DEVICE), k_scale=1.0, v_scale=1.0, hw="h200")  # fmt: skip
    args.update(over)
    return args


@pytest.mark.parametrize(
    "over, fragment",
    [
        ({"k_scale": None}, "k_scale is required with an fp8 KV cache"),
        ({"v_scale": None}, "v_scale is required"),
        ({"k_scale": 0.0}, "k_scale must be positive and finite, got 0.0"),
        ({"v_scale": -1.0}, "v_scale must be positive and finite"),
        ({"k_scale": math.inf}, "k_scale must be positive and finite"),
        ({"k_scale": "1"}, "k_scale must be a float or a float32 tensor of one element, got str"),
        ({"k_scale": torch.ones(2)}, r"k_scale must be a float32 tensor of one element .* \(2,\)"),
        ({"v_scale": torch.ones(1, dtype=torch.float16)}, "v_scale must be a float32 tensor of one element"),
        ({"value_cache": torch.zeros(2, 16, 1, 64, dtype=torch.float16)}, "an fp8 cache needs both float8_e4m3fn"),
        ({"hw": "a100"}, "needs fp8_e4m3fn, which target 'a100' lacks"),
    ],
)
def test_decode_fp8_errors_name_the_argument(over, fragment):
    with pytest.raises(ValueError, match=fragment):
        at.decode_attention(**decode_args(**over))


@pytest.mark.skipif(GPU, reason="a tensor scale's value is read on the host for CPU tensors only")
def test_a_cpu_tensor_scale_is_checked():
    with pytest.raises(ValueError, match="v_scale must be positive and finite, got -0.5"):
        at.decode_attention(**decode_args(v_scale=torch.tensor([-0.5])))


def test_scales_without_an_fp8_cache_and_bad_cache_dtypes():
    kc = torch.zeros(2, 16, 1, 64, dtype=torch.float16, device=DEVICE)
    with pytest.raises(ValueError, match="k_scale / v_scale apply only to an fp8"):
        at.decode_attention(**decode_args(key_cache=kc, value_cache=kc))
    key = rnd(2, 1, 64, dtype=torch.float16)
    slots = torch.arange(2, device=DEVICE)
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of 'auto', 'fp8', 'fp8_e4m3'.*e5m2"):
        C.reshape_and_cache(key, key, kc, kc, slots, "fp8_e5m2", 1.0, 1.0, hw="h200")
    with pytest.raises(TypeError, match=r"must equal torch.float8_e4m3fn .*view\(torch.float8_e4m3fn\)"):
        C.reshape_and_cache(key, key, kc, kc, slots, "fp8", 1.0, 1.0, hw="h200")
    with pytest.raises(ValueError, match="k_scale / v_scale apply only to kv_cache_dtype='fp8'"):
        C.reshape_and_cache(key, key, kc, kc, slots, "auto", 1.0, None, hw="h200")
    kc8 = kc.to(FP8)
    with pytest.raises(ValueError, match="k_scale must be positive and finite"):
        C.reshape_and_cache(key, key, kc8, kc8, slots, "fp8", -2.0, 1.0, hw="h200")
    with pytest.raises(ValueError, match="v_scale is required"):
        C.reshape_and_cache(key, key, kc8, kc8, slots, "fp8", 1.0, hw="h200")
    q = rnd(2, 2, 64, dtype=torch.float16)
    cu = torch.tensor([0, 2], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="k_scale is required"):
        at.prefill_attention(q, kc8, kc8, cu, cu, 2, 2, block_table=torch.zeros(1, 2, dtype=torch.int32,
                             device=DEVICE), hw="h200")  # fmt: skip
    with pytest.raises(ValueError, match=r"block_table must be \[batch=1, max_blocks\]"):
        at.prefill_attention(q, kc8, kc8, cu, cu, 2, 2, block_table=torch.zeros(2, 2, dtype=torch.int32,
                             device=DEVICE), k_scale=1.0, v_scale=1.0, hw="h200")  # fmt: skip
    with pytest.raises(ValueError, match="needs fp8_e4m3fn, which target 'a10' lacks"):
        at.prefill_attention(q, kc8, kc8, cu, cu, 2, 2, block_table=torch.zeros(1, 2, dtype=torch.int32,
                             device=DEVICE), k_scale=1.0, v_scale=1.0, hw="a10")  # fmt: skip


# ---------------------------------------------------------------------------------------
# Warm-up


@pytest.mark.skipif(GPU, reason="the plan runs in the interpreter's compile-only scope here")
def test_warmup_plans_the_fp8_calls_on_served_targets_only():
    from policy_runtime.warmup import plan

    mods = ["generated.attention", "generated.cache"]
    kw = dict(dtypes=["float16"], models=["llama31_8b"], max_tokens=4)
    h200 = plan(mods, "h200", **kw)
    ops = {c.op for c in h200.calls}
    assert {"decode_fp8", "prefill_fp8", "reshape_and_cache_fp8"} <= ops
    assert not h200.failed
    kernels = {name for launches in h200.launches for name, _ in launches}
    assert any(name.startswith("_decode_16bit_n128") for name in kernels)  # the fp8 tile (head_dim 128)
    a100 = plan(mods, "a100", **kw)
    assert not {"decode_fp8", "prefill_fp8", "reshape_and_cache_fp8"} & {c.op for c in a100.calls}
