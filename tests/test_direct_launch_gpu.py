"""On a GPU (skipped without CUDA): every public entry point gives the same output with the
direct-launch cache (policy_runtime/direct.py) on and off, on odd shapes and misaligned views
(storage offset of one element), each call made twice with the cache on (the second a hit on a
compiled entry) and once with it off; and a misaligned call after an aligned one of the same
shape makes an entry of its own.  (fp8 entry points: scaled_mm and fused_moe_fp8, by per-tensor
scales.)"""

import pytest
import torch

from generated import attention as AT
from generated import cache as C
from generated import matmul as MM
from generated import moe as MOE
from generated import scaled_mm as SMM
from generated import transform as TR
from policy_runtime import call_cache, direct

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (compiled kernels)")

DEV = "cuda"
DT = torch.float16


def rnd(*shape, dtype=DT, offset=0):
    """A random tensor; with ``offset``, a view that starts ``offset`` elements into its storage."""
    n = 1
    for s in shape:
        n *= s
    flat = torch.randn(n + offset, device=DEV).to(dtype)
    return flat[offset:].view(*shape)


def same_on_and_off(fn, exact=True):
    """fn() twice with the cache on, once off: equal outputs; the second call made no entry."""
    direct.clear()
    call_cache.clear_all()
    with direct.enabled(True):
        first = fn()
        made = direct.size()
        second = fn()
        assert direct.size() == made, "the second call of the same class made another entry"
    with direct.enabled(False):
        off = fn()
    torch.cuda.synchronize()
    for got in (first, second):
        g_all, o_all = flat(got), flat(off)
        assert len(g_all) == len(o_all)
        for g, o in zip(g_all, o_all):
            if exact:
                assert torch.equal(g, o)
            else:
                torch.testing.assert_close(g.float(), o.float(), rtol=2e-3, atol=2e-3)
    return made


def flat(out):
    """An entry's output as a list of tensors (tuples nested as rms_norm's residual form returns)."""
    if isinstance(out, (tuple, list)):
        return [t for part in out for t in flat(part)]
    return [out]


CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


@case
def matmul_triton(off):
    a, b = rnd(7, 3001, offset=off), rnd(3001, 501)
    return lambda: MM.matmul_triton(a, b)


@case
def matmul_triton_weight_t(off):
    a, w = rnd(33, 4095, offset=off), rnd(1000, 4095)
    return lambda: MM.matmul_triton(a, w.t())


@case
def scaled_mm(off):
    a = rnd(17, 512, offset=off).to(torch.float8_e4m3fn)
    b = rnd(384, 512).to(torch.float8_e4m3fn).t()
    sa, sb = torch.tensor(0.5, device=DEV), torch.tensor(0.25, device=DEV)
    return lambda: SMM.scaled_mm(a, b, sa, sb, out_dtype=torch.float16)


@case
def rms_norm(off):
    x, w = rnd(5, 1027, offset=off), rnd(1027)
    return lambda: TR.rms_norm(x, w, 1e-6)


@case
def rms_norm_residual(off):
    x, w, r0 = rnd(5, 1027, offset=off), rnd(1027), rnd(5, 1027)

    def call():
        r = r0.clone()
        return TR.rms_norm(x, w, 1e-6, residual=r), r

    return call


@case
def silu_and_mul(off):
    x = rnd(9, 2 * 1001, offset=off)
    return lambda: TR.silu_and_mul(x)


@case
def rotary_embedding(off):
    H, KH, hs, T = 5, 1, 64, 7
    pos = torch.randint(0, 32, (T,), device=DEV)
    q0, k0 = rnd(T, H * hs, offset=off), rnd(T, KH * hs)
    cs = rnd(32, hs, dtype=torch.float32)

    def call():
        q, k = q0.clone(), k0.clone()
        TR.rotary_embedding(pos, q, k, cs, hs, True)
        return q, k

    return call


@case
def reshape_and_cache(off):
    nb, bs, KH, hs = 9, 16, 3, 64
    key, value = rnd(5, KH, hs, offset=off), rnd(5, KH, hs)
    slots = torch.randperm(nb * bs, device=DEV)[:5]

    def call():
        kc, vc = torch.zeros(nb, bs, KH, hs, device=DEV, dtype=DT), torch.zeros(nb, bs, KH, hs, device=DEV, dtype=DT)
        C.reshape_and_cache(key, value, kc, vc, slots)
        return kc, vc

    return call


@case
def copy_blocks(off):
    kcs0 = [rnd(6, 16, 3, 64) for _ in range(2)]
    vcs0 = [rnd(6, 16, 3, 64) for _ in range(2)]
    mapping = torch.tensor([[0, 4], [1, 5], [2, 3]], device=DEV, dtype=torch.int64)

    def call():
        kcs, vcs = [c.clone() for c in kcs0], [c.clone() for c in vcs0]
        C.copy_blocks(kcs, vcs, mapping)
        return tuple(kcs + vcs)

    return call


@case
def copy_blocks_same_caches(off):
    # The caches of a server: the same tensors every call (their data pointers are in the key),
    # reset before each copy; with ``off``, views one element in (offsets in elements).
    made = [rnd(6, 16, 3, 64, offset=off) for _ in range(4)]
    start = [c.clone() for c in made]
    mapping = torch.tensor([[0, 4], [1, 5], [2, 3]], device=DEV, dtype=torch.int64)

    def call():
        for c, s in zip(made, start):
            c.copy_(s)
        C.copy_blocks(made[:2], made[2:], mapping)
        return tuple(c.clone() for c in made)

    return call


@case
def prefill_attention(off):
    n, H, KH, hs = 37, 4, 2, 64
    q, k, v = rnd(n, H, hs, offset=off), rnd(n, KH, hs), rnd(n, KH, hs)
    cu = torch.tensor([0, 20, n], device=DEV, dtype=torch.int32)
    return lambda: AT.prefill_attention(q, k, v, cu, cu, 20, 20)


@case
def decode_attention(off):
    nb, bs, KH, H, hs = 16, 16, 2, 4, 64
    kc, vc = rnd(nb, bs, KH, hs), rnd(nb, bs, KH, hs)
    q = rnd(3, H, hs, offset=off)
    table = torch.randperm(nb, device=DEV, dtype=torch.int32)[:15].view(3, 5)
    lens = torch.tensor([70, 1, 33], device=DEV, dtype=torch.int32)
    return lambda: AT.decode_attention(q, kc, vc, table, lens)


@case
def topk_softmax(off):
    logits = rnd(13, 64, dtype=torch.float32, offset=off)
    return lambda: MOE.topk_softmax(logits, 6, True)


@case
def moe_align_block_size(off):
    ids = torch.randint(0, 60, (37, 6), device=DEV, dtype=torch.int32)
    return lambda: MOE.moe_align_block_size(ids, 16, 60)


def _fused_moe(off, T):
    # A 16-bit layer of T tokens through the target's bucket for T.
    E, H, inter, k = 8, 192, 96, 2
    x = rnd(T, H, offset=off)
    w1, w2 = rnd(E, 2 * inter, H) / 8, rnd(E, H, inter) / 8
    wts, ids = MOE.topk_softmax(torch.randn(T, E, device=DEV), k, True)
    return lambda: MOE.fused_moe(x, w1, w2, wts, ids)


def _fused_moe_fp8(off, T):
    # An FP8 layer of T tokens (per-tensor scales) through the target's bucket for T.
    E, H, inter, k = 8, 256, 128, 2
    x = rnd(T, H, offset=off)
    w1 = (rnd(E, 2 * inter, H) / 8).to(torch.float8_e4m3fn)
    w2 = (rnd(E, H, inter) / 8).to(torch.float8_e4m3fn)
    s1, s2 = torch.full((E,), 0.5, device=DEV), torch.full((E,), 0.5, device=DEV)
    wts, ids = MOE.topk_softmax(torch.randn(T, E, device=DEV), k, True)
    return lambda: MOE.fused_moe_fp8(x, w1, w2, wts, ids, w1_scale=s1, w2_scale=s2)


@case
def fused_moe(off):
    return _fused_moe(off, 13)


@case
def fused_moe_fp8(off):
    return _fused_moe_fp8(off, 13)


@case
def fused_moe_prefill(off):
    # The prefill bucket: on Hopper its weights through TMA descriptors (weights_tma).
    return _fused_moe(off, 700)


@case
def fused_moe_fp8_prefill_large(off):
    # FP8 prefill_large: on Hopper its weights through TMA descriptors (weights_tma).
    return _fused_moe_fp8(off, 3500)


@case
def fused_moe_decode(off):
    # One token: the target's decode bucket (simt, chained on Hopper and later; gemv elsewhere).
    return _fused_moe(off, 1)


@case
def fused_moe_expert_map_gelu(off):
    # Expert parallelism (a gather before the launches) and another activation, into out.
    E, H, inter, k, T = 6, 192, 96, 3, 21
    x = rnd(T, H, offset=off)
    w1, w2 = rnd(E, 2 * inter, H) / 8, rnd(E, H, inter) / 8
    wts, ids = MOE.topk_softmax(torch.randn(T, 12, device=DEV), k, True)
    emap = torch.tensor([3, -1, 0, -1, 5, 1, -1, -1, 2, -1, 4, -1], device=DEV, dtype=torch.int32)
    out = torch.empty(T, H, device=DEV, dtype=DT)
    return lambda: MOE.fused_moe(x, w1, w2, wts, ids, activation="gelu", out=out, expert_map=emap).clone()


@case
def fused_moe_fp8_block(off):
    E, H, inter, k, T = 4, 256, 128, 2, 9
    x = rnd(T, H, offset=off)
    w1 = (rnd(E, 2 * inter, H) / 8).to(torch.float8_e4m3fn)
    w2 = (rnd(E, H, inter) / 8).to(torch.float8_e4m3fn)
    s1, s2 = torch.rand(E, 2, 2, device=DEV) + 0.1, torch.rand(E, 2, 1, device=DEV) + 0.1
    wts, ids = MOE.topk_softmax(torch.randn(T, E, device=DEV), k, True)
    return lambda: MOE.fused_moe_fp8(x, w1, w2, wts, ids, w1_scale=s1, w2_scale=s2, block_shape=[128, 128])


@case
def fused_moe_fp8_static_decode(off):
    E, H, inter, k = 8, 256, 128, 2
    x = rnd(1, H, offset=off)
    w1 = (rnd(E, 2 * inter, H) / 8).to(torch.float8_e4m3fn)
    w2 = (rnd(E, H, inter) / 8).to(torch.float8_e4m3fn)
    s1, s2 = torch.full((E,), 0.5, device=DEV), torch.full((E,), 0.5, device=DEV)
    a1, a2 = torch.tensor(0.05, device=DEV), torch.tensor([[0.02]], device=DEV)
    wts, ids = MOE.topk_softmax(torch.randn(1, E, device=DEV), k, True)
    return lambda: MOE.fused_moe_fp8(x, w1, w2, wts, ids, w1_scale=s1, w2_scale=s2, a1_scale=a1, a2_scale=a2)


@case
def decode_attention_v2(off):
    # 1,500 tokens past one 512-token partition: V2, the decode and merge launches replayed.
    nb, bs, KH, H, hs = 200, 16, 2, 4, 64
    kc, vc = rnd(nb, bs, KH, hs), rnd(nb, bs, KH, hs)
    q = rnd(2, H, hs, offset=off)
    table = torch.randperm(nb, device=DEV, dtype=torch.int32)[:196].view(2, 98)
    lens = torch.tensor([1500, 37], device=DEV, dtype=torch.int32)
    return lambda: AT.decode_attention(q, kc, vc, table, lens)


@case
def decode_attention_window_v2(off):
    nb, bs, KH, H, hs = 200, 16, 2, 4, 64
    kc, vc = rnd(nb, bs, KH, hs), rnd(nb, bs, KH, hs)
    q = rnd(2, H, hs, offset=off)
    table = torch.randperm(nb, device=DEV, dtype=torch.int32)[:196].view(2, 98)
    lens = torch.tensor([1500, 900], device=DEV, dtype=torch.int32)
    return lambda: AT.decode_attention(q, kc, vc, table, lens, window_size=(1023, 0), softcap=30.0)


@case
def decode_attention_fp8(off):
    nb, bs, KH, H, hs = 16, 16, 2, 4, 64
    kc, vc = rnd(nb, bs, KH, hs).to(torch.float8_e4m3fn), rnd(nb, bs, KH, hs).to(torch.float8_e4m3fn)
    q = rnd(3, H, hs, offset=off)
    table = torch.randperm(nb, device=DEV, dtype=torch.int32)[:15].view(3, 5)
    lens = torch.tensor([70, 1, 33], device=DEV, dtype=torch.int32)
    return lambda: AT.decode_attention(q, kc, vc, table, lens, k_scale=0.5, v_scale=0.5)


@case
def decode_attention_alibi_sinks(off):
    nb, bs, KH, H, hs = 16, 16, 2, 4, 64
    kc, vc = rnd(nb, bs, KH, hs), rnd(nb, bs, KH, hs)
    q = rnd(3, H, hs, offset=off)
    table = torch.randperm(nb, device=DEV, dtype=torch.int32)[:15].view(3, 5)
    lens = torch.tensor([70, 1, 33], device=DEV, dtype=torch.int32)
    slopes, sinks = torch.rand(H, device=DEV), torch.randn(H, device=DEV)
    return lambda: AT.decode_attention(q, kc, vc, table, lens, alibi_slopes=slopes, sinks=sinks)


@case
def prefill_attention_features(off):
    n, H, KH, hs = 37, 4, 2, 64
    q, k, v = rnd(n, H, hs, offset=off), rnd(n, KH, hs), rnd(n, KH, hs)
    cq = torch.tensor([0, 20, n], device=DEV, dtype=torch.int32)
    ck = cq.clone()  # not the same tensor: another class
    return lambda: AT.prefill_attention(q, k, v, cq, ck, 20, 20, window_size=(8, 0), softcap=20.0)


@case
def grouped_topk(off):
    logits = rnd(13, 64, dtype=torch.float32, offset=off)
    bias = torch.randn(64, device=DEV) / 10
    return lambda: MOE.grouped_topk(logits, 6, True, scoring_func="sigmoid", e_score_correction_bias=bias,
                                    num_expert_group=8, topk_group=3, routed_scaling_factor=2.5)  # fmt: skip


@case
def moe_align_block_size_expert_map(off):
    ids = torch.randint(0, 60, (37, 6), device=DEV, dtype=torch.int32)
    emap = torch.where(torch.arange(60, device=DEV) % 3 == 0, -1, torch.arange(60, device=DEV) // 2).int()
    return lambda: MOE.moe_align_block_size(ids, 16, 60, expert_map=emap)


# MoE sums over experts may use atomics (order-dependent in the last bits): compared closely.
NOT_BITWISE = {n for n in CASES if n.startswith("fused_moe")}


@pytest.mark.parametrize("name", sorted(CASES))
def test_same_output_with_the_cache_on_and_off(name):
    torch.manual_seed(0)
    for off in (0, 1):  # aligned, then a view one element into its storage
        fn = CASES[name](off)
        same_on_and_off(fn, exact=name not in NOT_BITWISE)


def test_a_misaligned_call_after_an_aligned_one_makes_its_own_entry():
    torch.manual_seed(1)
    b = rnd(3001, 501)
    a = rnd(7, 3001)
    a_mis = rnd(7, 3001, offset=1)
    direct.clear()
    with direct.enabled(True):
        MM.matmul_triton(a, b)
        made = direct.size()
        got = MM.matmul_triton(a_mis, b)
        assert direct.size() > made
    want = a_mis.double() @ b.double()
    torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-1)
    with direct.enabled(False):
        assert torch.equal(got, MM.matmul_triton(a_mis, b))


# Entry points with a call cache (policy_runtime/call_cache.py) -> their cache's name: on the GPU
# the second call above replays a plan through the compiled launchers; here each must have made one.
CACHED = {
    "matmul_triton": "matmul",
    "matmul_triton_weight_t": "matmul",
    "rms_norm": "rms_norm",
    "rms_norm_residual": "rms_norm",
    "silu_and_mul": "silu_and_mul",
    "rotary_embedding": "rotary_embedding",
    "reshape_and_cache": "reshape_and_cache",
    "copy_blocks": "copy_blocks",
    "copy_blocks_same_caches": "copy_blocks",
    "prefill_attention": "prefill_attention",
    "prefill_attention_features": "prefill_attention",
    "decode_attention": "decode_attention",
    "decode_attention_v2": "decode_attention",
    "decode_attention_window_v2": "decode_attention",
    "decode_attention_fp8": "decode_attention",
    "decode_attention_alibi_sinks": "decode_attention",
    "topk_softmax": "topk_softmax",
    "grouped_topk": "topk_softmax",
    "moe_align_block_size": "moe_align_block_size",
    "moe_align_block_size_expert_map": "moe_align_block_size",
    "fused_moe": "fused_moe",
    "fused_moe_decode": "fused_moe",
    "fused_moe_prefill": "fused_moe",
    "fused_moe_expert_map_gelu": "fused_moe",
    "fused_moe_fp8": "fused_moe_fp8",
    "fused_moe_fp8_block": "fused_moe_fp8",
    "fused_moe_fp8_prefill_large": "fused_moe_fp8",
    "fused_moe_fp8_static_decode": "fused_moe_fp8",
}


@pytest.mark.parametrize("name", sorted(CACHED))
def test_cached_entries_replay_a_plan_with_the_same_output(name):
    torch.manual_seed(2)
    for off in (0, 1):
        same_on_and_off(CASES[name](off), exact=name not in NOT_BITWISE)
        plans = call_cache.named(CACHED[name]).plans
        assert any(p is not call_cache.NO_PLAN for p in plans.values()), f"{name}: no plan made"
