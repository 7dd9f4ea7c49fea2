"""Random calls of the generated modules' entry points, as a user's odd inputs make them.

Two properties, over cases drawn with fixed seeds (the same cases on every run):

- every call returns, or raises ValueError, TypeError or KeyError (the errors that name an
  argument): never another exception, never a crash.  An index past a tensor killed the
  interpreter's process (copy_blocks: free(): invalid pointer), and Triton's own errors are ours
  (prefill at head_dim 8 on a TMA target: a dot of unequal reduction dimensions).  Indices and
  shapes are drawn valid and, now and then, one past a bound.
- attention over random head dims (multiples of 8), GQA ratios, lengths, windows, soft-caps,
  ALiBi, sinks and targets agrees with test_attention_features' float64 reference.

CPU only: the interpreter runs the kernels, and CPU indices are checked on the host (on a GPU
that would take a device sync, so an index out of range is not checked there).
"""

from __future__ import annotations

import math
import random
from typing import Any, Callable

import pytest
import torch

from generated import attention as A
from generated import cache as C
from generated import matmul as MM
from generated import moe as M
from generated import scaled_mm as SM
from generated import transform as T
from generated.dispatch import HARDWARE
from kernel_cases import GPU
from test_attention_features import check, decode_ref, offsets, paged, prefill_ref

pytestmark = pytest.mark.skipif(GPU, reason="CPU tensors in the interpreter; the GPU runs are the kernel test files'")

F16, F32, FP8 = torch.float16, torch.float32, torch.float8_e4m3fn
TARGETS = sorted(HARDWARE)
FP8_TARGETS = sorted(set(TARGETS) - set(SM.UNSERVED))
NAMED_ERRORS = (ValueError, TypeError, KeyError)


class Draw:
    """The random choices of one case, from a seeded ``random.Random`` (torch's tensors from the
    seed the test sets)."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.turns: dict[str, int] = {}

    def target(self, who: str, targets: list[str] = TARGETS) -> str:
        """The next of ``targets`` for ``who`` (an entry point): each one's calls go round every
        target in turn, so no target's tiles are left to chance."""
        turn = self.turns[who] = self.turns.get(who, -1) + 1
        return targets[turn % len(targets)]

    def int(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def pick(self, *options: Any) -> Any:
        return self.rng.choice(options)

    def rarely(self, p: float = 0.15) -> bool:
        return self.rng.random() < p

    def past(self, bound: int, by: int = 2) -> int:
        """``bound``, or now and then a little past it (an index range's end, exclusive)."""
        return bound + (self.int(1, by) if self.rarely() else 0)


def _decode(d: Draw) -> Callable[[], Any]:
    seqs, kvh, group, hd, bs, nb, mb = (
        d.int(1, 3),
        d.int(1, 2),
        d.int(1, 4),
        d.pick(8, 16, 40, 64),
        16,
        d.int(1, 6),
        d.int(1, 4),
    )
    fp8 = d.rarely(0.25)
    q = torch.randn(seqs, kvh * group, hd, dtype=F16)
    kc, vc = (torch.randn(nb, bs, kvh, hd).to(FP8 if fp8 else F16) for _ in range(2))
    table = torch.randint(-1 if d.rarely() else 0, d.past(nb), (seqs, mb), dtype=torch.int32)
    lens = torch.randint(-1 if d.rarely(0.05) else 0, d.past(mb * bs + 1, 5), (seqs,), dtype=torch.int32)
    kw: dict[str, Any] = {"hw": d.target("decode_fp8", FP8_TARGETS) if fp8 else d.target("decode")}
    if fp8:
        kw.update(k_scale=d.pick(0.5, 1.0, -1.0), v_scale=1.0)
    if d.rarely(0.3):
        kw["window_size"] = (d.int(-1, 20), d.pick(-1, 0))
    if d.rarely(0.2):
        kw["max_seq_len"] = d.int(0, mb * bs + 3)
    return lambda: A.decode_attention(q, kc, vc, table, lens, **kw)


def _prefill(d: Draw) -> Callable[[], Any]:
    batch, kvh, group, hd = d.int(1, 3), d.int(1, 2), d.int(1, 3), d.pick(8, 24, 64, 96)
    lq = [d.int(0, 20) for _ in range(batch)]
    lk = [n + d.int(0, 10) for n in lq]
    cu_q, cu_k = (torch.tensor(offsets(lens), dtype=torch.int32) for lens in (lq, lk))
    q = torch.randn(sum(lq) + d.int(0, 2), kvh * group, hd, dtype=F16)
    max_q = max(lq) + (d.int(-2, 2) if d.rarely() else 0)
    kw: dict[str, Any] = {"causal": d.rarely(0.5), "hw": d.target("prefill")}
    if d.rarely(0.3):
        kw["window_size"] = (d.int(-1, 10), d.int(-1, 3))
    if d.rarely(0.4):  # over a paged cache
        nb, mb = d.int(1, 8), d.int(1, 5)
        kc = torch.randn(nb, 8, kvh, hd, dtype=F16)
        table = torch.randint(0, d.past(nb, 3), (batch, mb), dtype=torch.int32)
        return lambda: A.prefill_attention(q, kc, kc.clone(), cu_q, cu_k, max_q, max(lk), block_table=table, **kw)
    k = torch.randn(sum(lk) + d.int(0, 2), kvh, hd, dtype=F16)
    return lambda: A.prefill_attention(q, k, k.clone(), cu_q, cu_k, max_q, max(lk), **kw)


def _reshape_and_cache(d: Draw) -> Callable[[], Any]:
    tokens, kvh, hd, nb, bs = d.int(0, 6), d.int(1, 2), d.pick(8, 16, 40), d.int(1, 4), d.pick(4, 8)
    key = torch.randn(tokens + d.int(0, 2), kvh, hd, dtype=F16)
    kc, vc = torch.zeros(nb, bs, kvh, hd, dtype=F16), torch.zeros(nb, bs, kvh, hd, dtype=F16)
    slots = torch.randint(-2, d.past(nb * bs, 4), (tokens,))
    hw = d.target("reshape_and_cache")
    return lambda: C.reshape_and_cache(key, key.clone(), kc, vc, slots, hw=hw)


def _copy_blocks(d: Draw) -> Callable[[], Any]:
    nb = d.int(1, 5)
    cache = torch.randn(nb, 4, 8, dtype=F16)
    mapping = torch.randint(-1 if d.rarely() else 0, d.past(nb), (d.int(0, 3), 2))
    if d.rarely(0.3):
        dst = torch.zeros(d.int(1, 5), 4, 8, dtype=F16)
        return lambda: C.swap_blocks(cache, dst, mapping)
    hw = d.target("copy_blocks")
    return lambda: C.copy_blocks([cache], [cache.clone()], mapping, hw=hw)


def _rotary(d: Draw) -> Callable[[], Any]:
    tokens, heads, hd, max_pos = d.int(0, 5), d.int(1, 3), d.pick(8, 16, 64), d.int(1, 10)
    query = torch.randn(tokens, heads * hd, dtype=d.pick(F16, F32))
    cos_sin = torch.randn(max_pos, d.pick(hd, hd // 2))
    positions = torch.randint(-1 if d.rarely() else 0, d.past(max_pos), (tokens,))
    neox, hw = d.rarely(0.5), d.target("rotary_embedding")
    return lambda: T.rotary_embedding(positions, query, None, cos_sin, hd, neox, hw=hw)


def _elementwise(d: Draw) -> Callable[[], Any]:
    x = torch.randn(d.int(0, 5), 2 * d.int(1, 40) + (1 if d.rarely(0.1) else 0), dtype=d.pick(F16, F32))
    if d.rarely(0.2):
        x = torch.cat([x, x], dim=-1)[:, ::2]  # a strided view
    hw = d.target("elementwise")
    op = d.pick("rms_norm", "silu_and_mul", "gelu_tanh_and_mul", "swigluoai_and_mul", "mul_and_silu")
    if op == "rms_norm":
        weight = torch.randn(x.shape[-1] + (1 if d.rarely(0.1) else 0))
        residual = x.clone() if d.rarely(0.4) else None
        return lambda: T.rms_norm(x, weight, 1e-6, residual=residual, hw=hw)
    return lambda: getattr(T, op)(x, hw=hw)


def _fused_moe(d: Draw) -> Callable[[], Any]:
    tokens, hidden, inter, experts, k = d.int(0, 9), d.pick(16, 32, 40), d.pick(8, 16, 24), d.int(1, 6), d.int(1, 3)
    x = torch.randn(tokens, hidden, dtype=F16) / 4
    w1, w2 = torch.randn(experts, 2 * inter, hidden, dtype=F16) / 8, torch.randn(experts, hidden, inter, dtype=F16) / 8
    kw: dict[str, Any] = {"hw": d.target("fused_moe")}
    globals_ = experts
    if d.rarely(0.3):  # expert parallelism: this rank's experts of a larger set
        globals_ = experts + d.int(0, 3)
        emap = torch.full((globals_,), -1, dtype=torch.int32)
        for g, local in zip(d.rng.sample(range(globals_), experts), range(experts)):
            emap[g] = local if not d.rarely(0.05) else experts
        kw["expert_map"] = emap
    ids = torch.randint(-1 if d.rarely(0.05) else 0, d.past(globals_), (tokens, k), dtype=torch.int32)
    return lambda: M.fused_moe(x, w1, w2, torch.rand(tokens, k), ids, **kw)


def _fused_moe_fp8(d: Draw) -> Callable[[], Any]:
    tokens, experts, k, hidden, inter = d.int(0, 9), d.int(1, 4), d.int(1, 2), d.pick(128, 256), d.pick(64, 128)
    x = torch.randn(tokens, hidden, dtype=F16) / 4
    w1, w2 = (torch.randn(experts, 2 * inter, hidden) / 8).to(FP8), (torch.randn(experts, hidden, inter) / 8).to(FP8)
    ids = torch.randint(0, d.past(experts, 1), (tokens, k), dtype=torch.int32)
    if d.rarely(0.5):
        kw: dict[str, Any] = {"w1_scale": torch.ones(experts), "w2_scale": torch.ones(experts)}
        if d.rarely(0.3):
            kw["a1_scale"] = torch.ones(1)
    else:
        kw = {"w1_scale": torch.ones(experts, -(-2 * inter // 128), hidden // 128),
              "w2_scale": torch.ones(experts, hidden // 128, -(-inter // 128)), "block_shape": [128, 128]}  # fmt: skip
    hw = d.target("fused_moe_fp8")
    return lambda: M.fused_moe_fp8(x, w1, w2, torch.rand(tokens, k), ids, hw=hw, **kw)


def _routing(d: Draw) -> Callable[[], Any]:
    experts = d.pick(4, 8, 12, 16)
    logits = torch.randn(d.int(0, 5), experts)
    if logits.numel() and d.rarely(0.3):
        logits[0, d.int(0, experts - 1)] = d.pick(float("nan"), float("inf"), -float("inf"))
    k = d.int(1, 4)
    if d.rarely(0.3):
        ids = torch.randint(-2, experts + 3, (d.int(0, 7), d.int(1, 3)), dtype=torch.int32)
        block = d.pick(4, 16)
        return lambda: M.moe_align_block_size(ids, block, experts)
    renormalize = d.rarely(0.5)
    if d.rarely(0.5):
        groups = d.pick(1, 2, 3, 4)
        bias = torch.randn(experts) if d.rarely(0.5) else None
        kw = {"scoring_func": d.pick("softmax", "sigmoid"), "e_score_correction_bias": bias,
              "num_expert_group": groups, "topk_group": d.int(1, groups)}  # fmt: skip
        return lambda: M.grouped_topk(logits, k, renormalize, **kw)
    return lambda: M.topk_softmax(logits, k, renormalize)


def _matmuls(d: Draw) -> Callable[[], Any]:
    if d.rarely(0.5):
        dtype = d.pick(F16, F32)
        a = torch.randn(d.int(0, 40), d.int(0, 40), dtype=dtype)
        b = torch.randn(a.shape[1] + (1 if d.rarely(0.1) else 0), d.int(0, 40), dtype=dtype)
        if d.rarely(0.3):
            a = a.t().contiguous().t()
        hw = d.target("matmul")
        return lambda: MM.matmul_triton(a, b, hw=hw)
    m, k, n = d.int(1, 40), d.pick(16, 32, 48, 128, 256), d.int(1, 40)
    a8, b8 = torch.randn(m, k).to(FP8), torch.randn(n, k).to(FP8).t()
    scaling = d.pick("tensor", "row", "block", "bad")
    if scaling == "tensor":
        sa, sb = torch.ones(()), torch.ones(())
    elif scaling == "row":
        sa, sb = torch.ones(m, 1), torch.ones(1, n)
    elif scaling == "block":
        sa, sb = torch.ones(m, -(-k // 128)), torch.ones(-(-k // 128), -(-n // 128))
    else:
        sa, sb = torch.ones(d.int(1, 3)), torch.ones(2, 2)
    out_dtype, hw = d.pick(F16, torch.bfloat16, F32), d.target("scaled_mm")
    return lambda: SM.scaled_mm(a8, b8, sa, sb, out_dtype=out_dtype, hw=hw)


CALLS = [_decode, _prefill, _reshape_and_cache, _copy_blocks, _rotary, _elementwise, _fused_moe, _fused_moe_fp8,
         _routing, _matmuls]  # fmt: skip


@pytest.mark.parametrize("seed", [1, 2])
def test_random_calls_return_or_raise_an_error_naming_the_argument(seed):
    torch.manual_seed(seed)
    d = Draw(random.Random(seed))
    unexpected = []
    for i in range(120):
        make = CALLS[i % len(CALLS)]
        call = make(d)
        try:
            call()
        except NAMED_ERRORS:
            pass
        except Exception as exc:  # noqa: BLE001  (what the property forbids)
            unexpected.append(f"case {i} ({make.__name__[1:]}): {type(exc).__name__}: {str(exc)[:300]}")
    assert unexpected == [], "\n".join(unexpected)


@pytest.mark.parametrize("seed", [1, 2])
def test_random_attention_matches_the_reference(seed):
    """Valid calls only: each agrees with the float64 reference (prefill: packed sequences; decode:
    a shuffled paged cache), whatever the target's tiles."""
    torch.manual_seed(seed)
    d = Draw(random.Random(seed))
    for _ in range(30):
        hw, dtype = d.target("attention"), d.pick(F16, F32)
        # The least and widest head dims, a power of two and one between tiles, each as likely.
        hd, kvh = d.pick(8, 16, 256, 8 * d.int(3, 31)), d.int(1, 2)
        heads = kvh * d.pick(1, 2, 3, 4, 8)
        causal = d.rarely(0.6)
        feat: dict[str, Any] = {}
        if d.rarely(0.3):
            feat["window_size"] = (d.int(-1, 12), d.int(-1, 4))
        if d.rarely(0.3):
            feat["softcap"] = 3.0
        if d.rarely(0.2):
            feat["alibi_slopes"] = torch.rand(heads)
        if d.rarely(0.2):
            feat["sinks"] = torch.randn(heads)
        ref_feat = {"window": feat.get("window_size", (-1, -1)), "softcap": feat.get("softcap", 0.0),
                    "alibi": feat.get("alibi_slopes"), "sinks": feat.get("sinks")}  # fmt: skip
        scale = 1 / math.sqrt(hd)
        where = f"{hw} {dtype} head_dim {hd}, {heads}/{kvh} heads, causal {causal}, {sorted(feat)}"
        if d.rarely(0.4):
            lens = [d.int(0, 70) for _ in range(d.int(1, 3))]
            kc, vc, table = paged(lens, d.pick(8, 16, 32), kvh, hd, dtype)
            q = torch.randn(len(lens), heads, hd, dtype=dtype)
            got = A.decode_attention(q, kc, vc, table, torch.tensor(lens, dtype=torch.int32), hw=hw, **feat)
            want = decode_ref(q, kc, vc, table, lens, scale=scale, **ref_feat)
        else:
            lq = [d.int(0, 40) for _ in range(d.int(1, 3))]
            lk = [n + d.int(0, 30) for n in lq]
            q = torch.randn(sum(lq), heads, hd, dtype=dtype)
            k, v = torch.randn(sum(lk), kvh, hd, dtype=dtype), torch.randn(sum(lk), kvh, hd, dtype=dtype)
            cu_q, cu_k = (torch.tensor(offsets(x), dtype=torch.int32) for x in (lq, lk))
            got = A.prefill_attention(q, k, v, cu_q, cu_k, max(lq), max(lk), causal=causal, hw=hw, **feat)
            want = prefill_ref(q, k, v, lq, lk, causal=causal, scale=scale, **ref_feat)
        assert got.shape == want.shape, where
        try:
            if want.numel():  # every sequence empty: nothing to compare but the shape
                check(got, want, dtype)
        except AssertionError as exc:
            raise AssertionError(f"{where}: error {exc}") from None
