"""generated/attention.py's attention features against float64 references of their published semantics.

The features of ``prefill_attention`` and ``decode_attention`` (issue 36): flash-attn's
``window_size=(left, right)`` (-1 unbounded, right 0 under a causal mask), ``softcap``
(``softcap * tanh(scale * q.k / softcap)`` before mask and bias), ``alibi_slopes`` (flash-attn's
``-slope * |i + k_len - q_len - j|``; vLLM's paged decode ``slope * (j - seq_len + 1)``, the same
up to a per-row constant) and ``sinks`` (gpt-oss, vLLM: a per-head logit in the softmax
denominator with no value), and every head_dim that is a multiple of 8 up to 256 (the tile padded).

The references below are written from those definitions (flash-attn's tests/test_flash_attn.py
``attention_ref``, ``construct_local_mask`` and ``attn_bias_from_alibi_slopes``; vLLM's
``sink_attention_ref``-style softmax over [scores, sink]), one masked dense softmax in float64,
nothing of the kernels'.  Cheap: one target's kernels (h200's), tiny shapes, fp32 and fp16 in
the interpreter.
"""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch

from generated import attention as at
from kernel_cases import DEVICE, GPU, seeded  # noqa: F401  (autouse fixture: a fixed seed per test)
from policy_runtime.attention import ops as rt

ATT = at._ATTENTION
TARGET = "h200"
TOL = {torch.float16: 4e-3, torch.float32: 2e-4}


def rnd(*shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, dtype=torch.float32) * scale).to(dtype).to(DEVICE)


def i32(values):
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


def offsets(lengths):
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out


# ---------------------------------------------------------------------------------------
# float64 reference: one query row block against its keys, the features by their definitions.


def attend_ref(q, k, v, *, causal, scale, window=(-1, -1), softcap=0.0, alibi=None, sinks=None):
    """q [nq, H, D], k/v [nk, Hkv, D] (one sequence) -> [nq, H, D] float64.  Query row i sits at
    position i + nk - nq (bottom-right aligned, as flash-attn)."""
    nq, H, D = q.shape
    nk, Hkv = k.shape[0], k.shape[1]
    g = H // Hkv
    qq = q.double().cpu()
    kk = k.double().cpu().repeat_interleave(g, 1)
    vv = v.double().cpu().repeat_interleave(g, 1)
    s = torch.einsum("qhd,khd->hqk", qq, kk) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    row = torch.arange(nq)[:, None] + nk - nq
    col = torch.arange(nk)[None, :]
    if alibi is not None:
        s = s - alibi.double().cpu()[:, None, None] * (row - col).abs()[None]
    left, right = window
    if causal:
        right = 0
    seen = torch.ones(nq, nk, dtype=torch.bool)
    if right >= 0:
        seen &= col <= row + right
    if left >= 0:
        seen &= col >= row - left
    s = s.masked_fill(~seen[None], -math.inf)
    if sinks is not None:
        sink = sinks.double().cpu()[:, None, None].expand(H, nq, 1)
        p = torch.softmax(torch.cat([s, sink], -1), -1)[..., :-1]
    else:
        m = s.amax(-1, keepdim=True)
        e = torch.exp(s - torch.where(m.isinf(), 0.0, m))
        d = e.sum(-1, keepdim=True)
        p = e / torch.where(d == 0, 1.0, d)  # a row that sees no key gives zeros
    return torch.einsum("hqk,khd->qhd", p, vv)


def prefill_ref(q, k, v, lq, lk, **kw):
    out = torch.zeros(q.shape, dtype=torch.float64)
    cq, ck = offsets(lq), offsets(lk)
    for b in range(len(lq)):
        if lq[b] == 0 or lk[b] == 0:
            continue  # no rows, or rows that see no key: zeros
        out[cq[b] : cq[b + 1]] = attend_ref(q[cq[b] : cq[b + 1]], k[ck[b] : ck[b + 1]], v[ck[b] : ck[b + 1]], **kw)
    return out


def check(got, ref, dtype):
    err = (got.double().cpu() - ref).abs().max().item()
    assert err <= TOL[dtype] * max(1.0, ref.abs().max().item()), err


def prefill_case(D, dtype, lq, lk, H=4, Hkv=2, causal=True, kernel=None, q_scale=1.0, **feat):
    q = rnd(sum(lq), H, D, dtype=dtype, scale=q_scale)
    k = rnd(sum(lk), Hkv, D, dtype=dtype)
    v = rnd(sum(lk), Hkv, D, dtype=dtype)
    scale = 1 / math.sqrt(D)
    got = ATT.prefill(q, k, v, i32(offsets(lq)), i32(offsets(lk)), max(lq), max(lk), causal=causal, hw=TARGET,
                      kernel=kernel, **feat)  # fmt: skip
    fref = {"window": feat.get("window_size", (-1, -1)), "softcap": feat.get("softcap", 0.0),
            "alibi": feat.get("alibi_slopes"), "sinks": feat.get("sinks")}  # fmt: skip
    check(got, prefill_ref(q, k, v, lq, lk, causal=causal, scale=scale, **fref), dtype)


# ---------------------------------------------------------------------------------------
# Paged decode


def paged(lens, bs, Hkv, D, dtype):
    nblocks = [-(-n // bs) for n in lens]
    total = sum(nblocks) + 1
    kc, vc = rnd(total, bs, Hkv, D, dtype=dtype), rnd(total, bs, Hkv, D, dtype=dtype)
    perm = torch.randperm(total).tolist()
    width = max(max(nblocks), 1)
    table = torch.zeros(len(lens), width, dtype=torch.int32)
    used = 0
    for s, n in enumerate(nblocks):
        table[s, :n] = torch.tensor(perm[used : used + n], dtype=torch.int32)
        used += n
    return kc, vc, table.to(DEVICE)


def decode_ref(query, kc, vc, table, lens, **kw):
    S, H, D = query.shape
    bs = kc.shape[1]
    out = torch.zeros(S, H, D, dtype=torch.float64)
    for s, n in enumerate(lens):
        if n == 0:
            continue
        ids = table[s, : -(-n // bs)].long().cpu()
        k = kc.cpu()[ids].reshape(-1, kc.shape[2], D)[:n]
        v = vc.cpu()[ids].reshape(-1, vc.shape[2], D)[:n]
        out[s] = attend_ref(query[s : s + 1].cpu(), k, v, causal=True, **kw)[0]
    return out


def decode_case(D, dtype, lens, H=4, Hkv=2, bs=16, config=None, launch=None, **feat):
    kc, vc, table = paged(lens, bs, Hkv, D, dtype)
    query = rnd(len(lens), H, D, dtype=dtype)
    got = ATT.decode(query, kc, vc, table, i32(lens), hw=TARGET, config=config, launch=launch, **feat)
    fref = {"window": feat.get("window_size", (-1, -1)), "softcap": feat.get("softcap", 0.0),
            "alibi": feat.get("alibi_slopes"), "sinks": feat.get("sinks")}  # fmt: skip
    check(got, decode_ref(query, kc, vc, table, lens, scale=1 / math.sqrt(D), **fref), dtype)
    return got


def small_config(**over):
    """h200's fp16 record with thresholds small enough that short sequences take V2 partitions and
    the PyTorch path: 32-token partitions, V2 past 48 tokens, PyTorch past 100."""
    cfg = ATT.select(torch.float16, 64, hw=TARGET).config
    base = {"partition_size": 32, "v1_v2_threshold": 48, "pytorch_decode_threshold": 100, "pytorch_max_tile_blocks": 2}
    return dataclasses.replace(cfg, **{**base, **over})


def small_launch(D=64, dtype=torch.float32):
    lch = ATT.select(dtype, D, hw=TARGET).launch
    return dataclasses.replace(lch, v1_min_programs=0, v2_min_programs=0, v2_max_partition=0)


# ---------------------------------------------------------------------------------------
# Prefill: each feature alone (fp32), all together (fp16), bottom-right aligned ragged batches.

H = 4


def slopes():
    # ALiBi's geometric slopes for 4 heads (2^-2, 2^-4, ...), as BLOOM's get_slopes gives.
    return torch.tensor([2.0 ** (-2 * (h + 1)) for h in range(H)], dtype=torch.float32, device=DEVICE)


FEATURES = {
    "window_left_causal": dict(causal=True, window_size=(6, -1)),
    "window_both_full": dict(causal=False, window_size=(5, 3)),
    "window_right_only_full": dict(causal=False, window_size=(-1, 2)),
    "softcap": dict(causal=True, softcap=2.0),
    "alibi_causal": dict(causal=True, alibi=True),
    "alibi_full": dict(causal=False, alibi=True),
    "sinks_causal": dict(causal=True, sinks=True),
}


def materialize(feat):
    out = {k: v for k, v in feat.items() if k not in ("alibi", "sinks")}
    if feat.get("alibi"):
        out["alibi_slopes"] = slopes()
    if feat.get("sinks"):
        out["sinks"] = rnd(H, scale=2.0)
    return out


@pytest.mark.parametrize("name", sorted(FEATURES))
def test_prefill_feature_against_its_reference(name):
    # Queries shorter and longer than their keys (bottom-right alignment) and one empty sequence;
    # the longer sequence spans two key tiles (64-row fp32 tiles of h200's head_dim-64 record).
    prefill_case(64, torch.float32, [5, 0, 40], [9, 0, 100], H=H, **materialize(FEATURES[name]))


def test_prefill_every_feature_at_once_in_fp16_at_head_dim_80():
    feat = materialize(dict(causal=True, window_size=(10, -1), softcap=3.0, alibi=True, sinks=True))
    prefill_case(80, torch.float16, [7, 33], [20, 33], H=H, **feat)


@pytest.mark.parametrize("head_dim", [8, 40, 96, 192])
def test_prefill_serves_head_dims_between_the_tiles(head_dim):
    # Not powers of two: the 64-, 128- and 256-wide tiles run with their columns past head_dim
    # masked; q, k, v keep their own width (and a stride that is not a multiple of the tile).  8:
    # narrower than the least tile (16, a tensor-core step), a power of two whose 16-byte fp16
    # rows a TMA descriptor could take, but whose padded tile it cannot fill (h200 reads K and V
    # through descriptors: a shape mismatch in the dot, found by a fuzzer).
    prefill_case(head_dim, torch.float16, [3, 17], [3, 24], H=2, Hkv=1, causal=True)


# Windows several key tiles wide on small tiles (32 query rows, 16 or 32 keys): a row block's
# key tiles run masked across the window's left edge, whole (unmasked) inside it, masked across
# its right edge and the end of the keys; queries shorter and longer than their keys.
WIDE_WINDOWS = {
    "causal_left": dict(causal=True, window_size=(40, -1)),
    "causal_left_tile_multiple": dict(causal=True, window_size=(63, 0)),
    "full_both": dict(causal=False, window_size=(37, 21)),
    "full_right_only": dict(causal=False, window_size=(-1, 25)),
    "full_left_only": dict(causal=False, window_size=(50, -1)),
}


@pytest.mark.parametrize("name", sorted(WIDE_WINDOWS))
def test_prefill_wide_windows_mask_only_their_edge_tiles(name):
    kernel = at.KERNELS["_prefill_fp32_32x16_w4_s1"]
    prefill_case(64, torch.float32, [70, 130, 9], [130, 130, 100], H=2, Hkv=1, kernel=kernel,
                 **WIDE_WINDOWS[name])  # fmt: skip


def test_prefill_wide_window_with_every_feature_in_fp16():
    kernel = at.KERNELS["_prefill_16bit_32x32_w4_s1"]
    feat = materialize(dict(causal=True, window_size=(70, 0), softcap=3.0, alibi=True, sinks=True))
    prefill_case(64, torch.float16, [100, 33], [160, 33], H=H, kernel=kernel, **feat)


def test_prefill_softcap_saturates_without_overflow():
    # Scores far past the cap (|scale q.k / softcap| up to ~1e3): tanh is +-1 there, never NaN.
    prefill_case(64, torch.float32, [40], [70], H=2, Hkv=1, causal=False, softcap=0.5, q_scale=30.0)


def test_a_window_skips_the_key_tiles_outside_it():
    """Keys no row's window reaches are never read: NaN there leaves the output exact."""
    D, lq, lk, left = 64, 8, 300, 20
    q, k, v = rnd(lq, 2, D), rnd(lk, 1, D), rnd(lk, 1, D)
    # Rows see keys [292 - 20, 299]; the tiles of 64 keys that hold them start at 256.
    ref = attend_ref(q, k, v, causal=True, scale=D**-0.5, window=(left, 0))
    k[:256], v[:256] = float("nan"), float("nan")
    cu_q, cu_k = i32([0, lq]), i32([0, lk])
    kern = ATT.select(torch.float32, D, hw=TARGET).prefill
    assert kern.block_n <= 64 and 256 % kern.block_n == 0
    got = at.prefill_attention(q, k, v, cu_q, cu_k, lq, lk, causal=True, window_size=(left, -1), hw=TARGET)
    check(got, ref, torch.float32)


# ---------------------------------------------------------------------------------------
# Decode: V1, V2 partitions and the PyTorch path, each with the features.


def test_decode_every_feature_on_v1_sequences_in_fp16_at_head_dim_80():
    feat = materialize(dict(window_size=(24, 0), softcap=4.0, alibi=True, sinks=True))
    decode_case(80, torch.float16, [5, 40, 0, 17], H=H, **feat)


@pytest.mark.parametrize("head_dim", [8, 40, 192])
def test_decode_serves_head_dims_between_the_tiles(head_dim):
    decode_case(head_dim, torch.float32, [9, 33], H=2, Hkv=1)


def test_decode_window_on_v2_partitions_and_the_merge(monkeypatch):
    """Spans past v1_v2_threshold (48) run V2 in 32-token partitions from the window's start, and
    the merge reads each sequence's span (its length clamped to the window); sinks join partition 0."""
    merges = []
    merge = rt._merge

    class Merge:
        def __getitem__(self, grid):
            merges.append(grid)
            return merge[grid]

    monkeypatch.setattr(rt, "_merge", Merge())
    feat = materialize(dict(window_size=(79, 0), alibi=True, sinks=True))
    decode_case(64, torch.float32, [130, 70, 20], H=H, config=small_config(), launch=small_launch(), **feat)
    assert len(merges) == 1


def test_decode_window_and_features_on_the_pytorch_path(monkeypatch):
    """Spans past pytorch_decode_threshold (100) take the PyTorch path, with the same features;
    a longer sequence whose window is short stays on the kernels."""
    rows = []
    torch_decode = rt._torch_decode

    def spy(out, query, kc, vc, bt, lens, r, *rest):
        rows.append(list(r))
        return torch_decode(out, query, kc, vc, bt, lens, r, *rest)

    monkeypatch.setattr(rt, "_torch_decode", spy)
    feat = materialize(dict(window_size=(119, 0), softcap=3.0, alibi=True, sinks=True))
    decode_case(64, torch.float32, [150, 110, 30], H=H, config=small_config(), launch=small_launch(), **feat)
    assert rows == [[0, 1]]
    rows.clear()
    feat = materialize(dict(window_size=(39, 0), sinks=True))
    decode_case(64, torch.float32, [150, 30], H=H, config=small_config(), launch=small_launch(), **feat)
    assert rows == []


def test_decode_reads_only_the_windows_tokens():
    """Cache slots before a sequence's window hold NaN: the output is still exact."""
    D, bs, lens, left = 64, 16, [90, 33], 20
    kc, vc, table = paged(lens, bs, 1, D, torch.float32)
    query = rnd(len(lens), 2, D)
    ref = decode_ref(query, kc, vc, table, lens, scale=D**-0.5, window=(left, 0))
    for s, n in enumerate(lens):
        for t in range(n - left - 1):
            b = int(table[s, t // bs])
            kc[b, t % bs], vc[b, t % bs] = float("nan"), float("nan")
    got = at.decode_attention(query, kc, vc, table, i32(lens), window_size=(left, 0), hw=TARGET)
    check(got, ref, torch.float32)


# ---------------------------------------------------------------------------------------
# Costs nothing when unused; argument checks.


def launches(monkeypatch, fn):
    got = []
    monkeypatch.setattr(rt._launch, "launch_kernel", lambda kernel, grid, *a, **kw: got.append((kernel, a, kw)))
    fn()
    return got


def flags(kernel, args):
    names = kernel.arg_names
    return tuple(args[names.index(f)] for f in ("HEAD_PAD", "WINDOW", "SOFTCAP", "ALIBI", "SINKS"))


def test_calls_without_features_launch_the_plain_specialization(monkeypatch):
    """Default arguments and explicit 'off' values (window (-1, -1), softcap 0) launch the same
    kernel with every feature flag off and the tile as wide as head_dim; a feature turns on its flag only."""
    from policy_runtime.warmup import launch_key

    q, k = rnd(4, 2, 64, dtype=torch.float16), rnd(4, 1, 64, dtype=torch.float16)
    cu = i32([0, 4])

    def run(**kw):
        (call,) = launches(monkeypatch, lambda: at.prefill_attention(q, k, k, cu, cu, 4, 4, hw=TARGET, **kw))
        return call

    plain = run()
    off = run(window_size=(-1, -1), softcap=0.0)
    assert launch_key(plain[0], plain[1], plain[2]) == launch_key(off[0], off[1], off[2])
    assert flags(plain[0], plain[1]) == (64, False, False, False, False)
    assert flags(*run(softcap=1.0)[:2]) == (64, False, True, False, False)
    assert flags(*run(window_size=(3, -1))[:2]) == (64, True, False, False, False)
    # Under a causal mask a right side alone is no window (right is 0 there).
    assert flags(*run(window_size=(-1, 5))[:2]) == (64, False, False, False, False)
    assert flags(*run(causal=False, window_size=(-1, 5))[:2]) == (64, True, False, False, False)
    kc = rnd(2, 16, 1, 64, dtype=torch.float16)
    table, lens = i32([[0, 1]]), i32([20])
    (dec,) = launches(monkeypatch, lambda: at.decode_attention(q[:1], kc, kc, table, lens, hw=TARGET))
    assert flags(dec[0], dec[1]) == (64, False, False, False, False)
    (dec,) = launches(monkeypatch, lambda: at.decode_attention(q[:1, :, :40].contiguous(), kc[..., :40].contiguous(),
                                                                kc[..., :40].contiguous(), table, lens, hw=TARGET,
                                                                sinks=rnd(2)))  # fmt: skip
    assert flags(dec[0], dec[1]) == (64, False, False, False, True)


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(window_size=(3,)), "window_size must be (left, right), ints >= -1"),
        (dict(window_size=(-2, 0)), "window_size must be (left, right), ints >= -1"),
        (dict(softcap=-1.0), "softcap must be a finite float >= 0"),
        (dict(softcap=float("inf")), "softcap must be a finite float >= 0"),
        (
            dict(alibi_slopes=torch.zeros(3)),
            "alibi_slopes must be a float32 tensor [num_heads=2], got torch.float32 (3,)",
        ),
        (dict(sinks=torch.zeros(2, dtype=torch.float16)), "sinks must be a float32 tensor [num_heads=2]"),
    ],
)
def test_feature_arguments_are_checked(kw, message):
    q = rnd(4, 2, 64, dtype=torch.float16)
    cu = i32([0, 4])
    with pytest.raises(ValueError, match=re.escape(message)):
        at.prefill_attention(q, q[:, :1], q[:, :1], cu, cu, 4, 4, hw=TARGET, **kw)
    kc = rnd(1, 16, 1, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match=re.escape(message)):
        at.decode_attention(q[:1], kc, kc, i32([[0]]), i32([4]), hw=TARGET, **kw)


@pytest.mark.parametrize("head_dim", [4, 100, 264])
def test_head_dims_that_are_not_multiples_of_8_or_past_256_are_refused(head_dim):
    q = rnd(2, 1, head_dim, dtype=torch.float16)
    with pytest.raises(ValueError, match=f"q has head_dim {head_dim}; the kernels serve multiples of 8 up to 256"):
        at.prefill_attention(q, q, q, i32([0, 2]), i32([0, 2]), 2, 2, hw=TARGET)


# ---------------------------------------------------------------------------------------
# Model specs: the features a model uses, in its dispatch record and its warm-up.


def test_each_models_dispatch_record_carries_exactly_the_features_it_uses():
    from generated import dispatch

    features = {
        "sliding_window", "logit_softcap", "attention_sinks", "alibi", "moe_scoring", "moe_score_bias",
        "moe_num_expert_group", "moe_topk_group", "moe_routed_scaling_factor", "moe_activation",
    }  # fmt: skip
    used = {m: {k: v for k, v in d.items() if k in features} for m, d in dispatch.MODEL_DIMS.items()}
    assert used == {
        "deepseek_v3": {
            "moe_scoring": "sigmoid",
            "moe_score_bias": True,
            "moe_num_expert_group": 8,
            "moe_topk_group": 4,
            "moe_routed_scaling_factor": 2.5,
        },
        "gemma2_9b": {"sliding_window": 4096, "logit_softcap": 50.0},
        "gpt_oss_20b": {"sliding_window": 128, "attention_sinks": True, "moe_activation": "swigluoai"},
        "llama31_8b": {},
        "qwen36": {},
    }


def specializations(plan) -> dict[str, set]:
    """model -> {(op, (WINDOW, SOFTCAP, ALIBI, SINKS))} over a warm-up plan's attention kernels."""
    seen: dict[str, set] = {}
    for call, per_call in zip(plan.calls, plan.launches):
        for name, key in per_call:
            if name in at.KERNELS:
                kernel = at.KERNELS[name].kernel
                # The launch key's arguments in signature order (a defaulted constant it did not
                # pass, such as PDL off the GPU, is not in it).
                consts = dict(zip(kernel.arg_names, key[1]))
                flags = tuple(consts[f] == ("constexpr", "True") for f in ("WINDOW", "SOFTCAP", "ALIBI", "SINKS"))
                seen.setdefault(call.covers[1], set()).add((call.covers[0], flags))
    return seen


def test_warm_up_compiles_the_specializations_each_models_features_select():
    """A windowed model warms its global layers' kernels and its local layers' windowed ones; a
    model without features only the plain ones (every flag off)."""
    from policy_runtime.warmup import engine as W

    seen = specializations(W.plan(["generated.attention"], TARGET, dtypes=["float16"]))
    # Each feature set also over a 16-bit paged cache, and over an fp8 KV cache where the target has e4m3fn.
    ops = ("prefill", "prefill paged", "decode") + (("prefill fp8 KV", "decode fp8 KV") if TARGET not in at.FP8_UNSERVED else ())
    both = lambda *sets: {(op, s) for op in ops for s in sets}  # noqa: E731
    off = (False, False, False, False)
    assert seen == {
        "deepseek_v3": both(off),
        "gemma2_9b": both((False, True, False, False), (True, True, False, False)),
        "gpt_oss_20b": both((False, False, False, True), (True, False, False, True)),
        "llama31_8b": both(off),
        "qwen36": both(off),
    }


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"moe_scoring": "sigmoid"}, "routing fields need num_experts and top_k"),
        (
            {"num_experts": 8, "top_k": 2, "moe_num_expert_group": 4},
            "moe_num_expert_group and moe_topk_group go together",
        ),
        ({"num_experts": 8, "top_k": 2, "moe_num_expert_group": 3, "moe_topk_group": 1}, "must be a multiple of"),
        (
            {"num_experts": 8, "top_k": 2, "moe_num_expert_group": 2, "moe_topk_group": 4},
            "moe_topk_group (4) must be <=",
        ),
        ({"logit_softcap": 0.0}, "greater than 0"),
        ({"sliding_window": 0}, "greater than 0"),
        ({"moe_scoring": "tanh", "num_experts": 8, "top_k": 2}, "'softmax' or 'sigmoid'"),
    ],
)
def test_model_feature_fields_are_checked(extra, message):
    ValidationError = pytest.importorskip("pydantic", reason="the spec models need pydantic (the compiler's dependency)").ValidationError

    from codegen.models import ModelSpec

    core = dict(display_name="m", head_dim=64, num_heads=4, num_kv_heads=2, hidden_size=256, intermediate_size=512,
                max_seq_len=1024)  # fmt: skip
    ModelSpec.model_validate(core)  # the defaults: no feature
    with pytest.raises(ValidationError, match=re.escape(message)):
        ModelSpec.model_validate({**core, **extra})
