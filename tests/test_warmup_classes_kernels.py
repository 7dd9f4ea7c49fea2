"""Warm-up covers every argument class of attention, transform and cache calls (issue 33 item 4):
calls of odd shapes (token counts not multiples of 16, 1, odd block-table widths and batches,
V1 and V2 decode, q/k/v sliced from a fused qkv, strided rotary heads, caches in one tensor)
launch only kernels whose specialization key (Triton's own binder's, computed on the CPU by
``engine.launch_key``) the plan compiles.  A model whose dims give the layouts different classes
(head_dim 72, six query heads, one KV head) checks that the drivers plan each class.
tests/test_warmup_gpu.py counts compilations on a GPU."""

import os

import pytest
import torch

from generated import attention as A
from generated import cache as C
from generated import dispatch
from generated import transform as TR
from policy_runtime import launch as L
from policy_runtime.attention.warmup import _attention_kwargs, attention_feature_sets
from policy_runtime.transform import ops as rt_transform
from policy_runtime.warmup import engine as W
from policy_runtime.warmup.calls import Options, int_class

# The plans run each call on CPU tensors in Triton's interpreter, which conftest.py turns on only where
# no GPU is visible (Triton reads TRITON_INTERPRET when the kernels are defined): on a GPU machine
# tests/test_warmup_gpu.py counts the real compilations instead.
pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="plans on CPU tensors in the interpreter (TRITON_INTERPRET=1)"
)


MODULES = ["generated.attention", "generated.transform", "generated.cache"]
CPU = torch.device("cpu")
_PLANS: dict = {}


def planned(target):
    if target not in _PLANS:
        _PLANS[target] = W.plan(MODULES, target, dtypes=["bfloat16", "float16"])
    return _PLANS[target]


def launches(fn):
    """(kernel name, key) of every launch ``fn`` makes, run in warm-up's compile-only scope."""
    handler = W._Handler()
    with L.compile_only(handler):
        fn()
    return handler.launches


def E(*shape, dtype=torch.float16):
    return torch.empty(shape, dtype=dtype)


def qkv_views(T, nq, nk, hd, dtype):
    q, k, v = E(T, (nq + 2 * nk) * hd, dtype=dtype).split([nq * hd, nk * hd, nk * hd], dim=-1)
    return q, k, v


def odd_calls(target, model, dims, dtype):
    """(what, thunk), each to be called before the next is drawn: odd-shaped calls of every entry
    point for one model in its feature sets and the layouts a serving stack passes, token counts
    and batches that are not multiples of 16."""
    hd, nq, nk = dims["head_dim"], dims["num_heads"], dims["num_kv_heads"]
    hidden, inter = dims["hidden_size"], dims["intermediate_size"]
    fp8 = target not in A.FP8_UNSERVED
    rec = A._ATTENTION.features.get(model, {}).get(target)
    if rec is not None:
        dims = {"sliding_window": rec.sliding_window, "logit_softcap": rec.softcap, "alibi": rec.alibi,
                "attention_sinks": rec.sinks}  # fmt: skip
    device = torch.get_default_device()  # the GPU test runs these calls on CUDA tensors
    sets = [_attention_kwargs(tuple(sorted(f.items())), nq, device) for _, f in attention_feature_sets(dims)]
    scale = torch.ones(1, dtype=torch.float32)
    for T in (1, 7, 33, 301):
        q2, k2, v2 = qkv_views(T, nq, nk, hd, dtype)
        q, k, v = q2.view(T, nq, hd), k2.view(T, nk, hd), v2.view(T, nk, hd)
        packed = (E(T, nq, hd, dtype=dtype), E(T, nk, hd, dtype=dtype), E(T, nk, hd, dtype=dtype))
        cu = torch.tensor([0, T], dtype=torch.int32)
        cu2 = torch.tensor([0, T // 2, T], dtype=torch.int32)  # two sequences
        for kw in sets:
            for causal in (True, False):
                yield ((f"prefill qkv view T={T}", lambda kw=kw, c=causal: A.prefill_attention(
                    q, k, v, cu, cu, T, T, causal=c, hw=target, **kw)))  # fmt: skip
                yield ((f"prefill packed T={T}", lambda kw=kw, c=causal: A.prefill_attention(
                    *packed, cu2, cu2, T - T // 2, T - T // 2, causal=c, hw=target, **kw)))  # fmt: skip
            # Paged prefill over a cache (16-bit, and fp8 where served): block tables of odd width.
            width = T // 16 + 3
            for cdt in (dtype, torch.float8_e4m3fn) if fp8 else (dtype,):
                kc = E(width, 16, nk, hd, dtype=cdt)
                table = torch.zeros((1, width), dtype=torch.int32)
                extra = {"k_scale": scale, "v_scale": scale} if cdt != dtype else {}
                yield ((f"paged prefill {cdt} T={T}", lambda kw=kw, kc=kc, table=table, extra=extra:
                            A.prefill_attention(q, kc, kc, cu, cu, T, T, causal=True, hw=target, block_table=table,
                                                **kw, **extra)))  # fmt: skip
        # rotary: packed, the qkv projection's views (vLLM's call), strided heads.
        pos = torch.zeros(T, dtype=torch.int64)
        cs = E(64, hd, dtype=dtype)
        strided_q = E(T, nq, 3 * hd, dtype=dtype)[:, :, :hd]
        strided_k = E(T, nk, 3 * hd, dtype=dtype)[:, :, :hd]
        for neox in (True, False):
            for name, qq, kk in (
                ("packed", E(T, nq * hd, dtype=dtype), E(T, nk * hd, dtype=dtype)),
                ("qkv view", q2, k2),
                ("qkv view 3-D", q, k),
                ("strided heads", strided_q, strided_k),
            ):
                yield ((f"rotary {name} T={T}", lambda qq=qq, kk=kk, n=neox: TR.rotary_embedding(
                    pos, qq, kk, cs, hd, n, hw=target)))  # fmt: skip
        yield ((f"rms_norm T={T}", lambda: TR.rms_norm(E(T, hidden, dtype=dtype), E(hidden, dtype=dtype), 1e-6,
                                                           hw=target)))  # fmt: skip
        yield (
            (
                f"rms_norm residual T={T}",
                lambda: TR.rms_norm(
                    E(T, hidden, dtype=dtype),
                    E(hidden, dtype=dtype),
                    1e-6,
                    residual=E(T, hidden, dtype=dtype),
                    hw=target,
                ),
            )
        )
        yield ((f"silu_and_mul T={T}", lambda: TR.silu_and_mul(E(T, 2 * inter, dtype=dtype), hw=target)))
        for op in rt_transform.ACTS:
            yield ((f"{op} T={T}", lambda op=op: getattr(TR, op)(E(T, 2 * inter, dtype=dtype), hw=target)))
        # reshape_and_cache: slot_mapping shorter than the (padded) key, both layouts of each.
        n = max(1, T - 2)
        slots = torch.arange(n, dtype=torch.int64) * 3
        nb = 3 * n // 16 + 1
        for cdt in (dtype, torch.float8_e4m3fn) if fp8 else (dtype,):
            sep = (E(nb, 16, nk, hd, dtype=cdt), E(nb, 16, nk, hd, dtype=cdt))
            pairs = E(nb, 2, 16, nk, hd, dtype=cdt).unbind(1)
            extra = ("fp8", scale, scale) if cdt != dtype else ()
            for kvname, kk, vv in (("qkv view", k, v), ("packed", *packed[1:])):
                for cname, (kc, vc) in (("separate", sep), ("kv pairs", pairs)):
                    yield ((f"reshape_and_cache {cdt} {kvname} {cname} T={T}", lambda kk=kk, vv=vv, kc=kc, vc=vc,
                                extra=extra: C.reshape_and_cache(kk, vv, kc, vc, slots, *extra, hw=target)))  # fmt: skip
    # Decode: batches of 1, 3 and 5, odd block-table widths, V1 and V2 lengths, the query packed
    # or a view of the qkv projection.
    for S, width in ((1, 3), (3, 5), (5, 4097 // 16 + 2)):
        kc = E(S * width, 16, nk, hd, dtype=dtype)
        kc8 = E(S * width, 16, nk, hd, dtype=torch.float8_e4m3fn)
        table = torch.zeros((S, width), dtype=torch.int32)
        for length in sorted({5, min(301, 16 * width), 16 * width - 3}):
            lens = torch.full((S,), length, dtype=torch.int32)
            lens[0] = max(1, length // 2)  # ragged
            for name, query in (("qkv view", qkv_views(S, nq, nk, hd, dtype)[0].view(S, nq, hd)),
                                ("packed", E(S, nq, hd, dtype=dtype))):  # fmt: skip
                for kw in sets:
                    yield ((f"decode {name} S={S} width={width} len={length}", lambda query=query, lens=lens,
                                kw=kw: A.decode_attention(query, kc, kc, table, lens, hw=target, **kw)))  # fmt: skip
                    if fp8:
                        yield ((f"decode fp8 {name} S={S} width={width} len={length}", lambda query=query,
                                    lens=lens, kw=kw: A.decode_attention(query, kc8, kc8, table, lens, hw=target,
                                    k_scale=scale, v_scale=scale, **kw)))  # fmt: skip
    for pairs_n in (1, 3, 17):
        kc = E(2 * pairs_n, 16, nk, hd, dtype=dtype)
        mapping = torch.stack([torch.arange(pairs_n), torch.arange(pairs_n) + pairs_n], dim=1)
        yield ((f"copy_blocks {pairs_n}", lambda kc=kc, m=mapping: C.copy_blocks([kc], [kc.clone()], m, hw=target)))


@pytest.mark.parametrize("target", ("h200", "a100"))
def test_odd_calls_launch_only_planned_kernels(target):
    plan = planned(target)
    assert not plan.failed and not plan.notes
    keys = plan.keys()
    missing, count = [], 0
    for model, dims in dispatch.MODEL_DIMS.items():
        for dtype in (torch.bfloat16, torch.float16):
            for what, call in odd_calls(target, model, dims, dtype):
                got = launches(call)
                assert got, (model, what)
                count += len(got)
                missing += [(model, dtype, what, name) for name, key in got if key not in keys]
    assert count > 1000
    assert missing == []


def test_each_call_is_described_by_the_class_it_launches():
    # The listing names each call's layout class; calls of one op and plan differ in their keys.
    plan = planned("h200")
    for i, call in enumerate(plan.calls):
        assert ":" in call.covers[-1] or call.covers[-2].startswith(("rows", "blocks", "packed", "qkv", "strided"))
    rope = [c for c in plan.calls if c.op == "rotary_embedding" and c.covers[1:4] == ("llama31_8b", "bfloat16", "neox")]
    layouts = {c.args[-1] for c in rope}
    # llama31_8b: head_dim 128, so the qkv projection's views have the packed layout's class; strided
    # heads are the kernel's STRIDED specialization.
    assert layouts == {"packed", "strided heads"}
    names = {c.covers[-1].split(" w")[0] for c in rope}
    assert any(n.endswith(", True]") for n in names) and any(n.endswith(", True, True]") for n in names)


def test_a_dtype_or_index_type_not_planned_is_not_covered():
    # The check has teeth: float32 and an int32 slot_mapping were not warmed: new keys.
    keys = planned("h200").keys()
    T, nk, hd = 7, 8, 128
    k = E(T, nk, hd, dtype=torch.float32)
    kc = E(4, 16, nk, hd, dtype=torch.float32)
    ((_, key),) = launches(lambda: C.reshape_and_cache(k, k, kc, kc, torch.arange(T), hw="h200"))
    assert key not in keys
    k, kc = k.half(), kc.half()
    ((_, key),) = launches(lambda: C.reshape_and_cache(k, k, kc, kc, torch.arange(T, dtype=torch.int32), hw="h200"))
    assert key not in keys
    ((_, key),) = launches(lambda: C.reshape_and_cache(k, k, kc, kc, torch.arange(T), hw="h200"))
    assert key in keys


# A model whose dims make the layouts' classes differ: head_dim 72 (a multiple of 8, not of 16),
# six query heads (6 * 72 = 432 is a multiple of 16; with the KV head's, 8 * 72 = 576 too) and one
# KV head (72: not a multiple of 16); hidden and intermediate sizes that are not multiples of 16.
ODD_MODEL = {"head_dim": 72, "num_heads": 6, "num_kv_heads": 1, "hidden_size": 1000, "intermediate_size": 1001}


def odd_model_plan(target):
    opts = Options(target, ("float16",), {"odd72": ODD_MODEL})
    calls = []
    for module in MODULES:
        more, notes = W.driver(module).calls(opts)
        assert notes == []
        calls += more
    keys = {key for call in calls for _, key in W._run_call(call, CPU).launches}
    return calls, keys


def test_a_model_whose_layouts_differ_in_class_gets_a_call_per_class():
    calls, keys = odd_model_plan("h200")
    prefill = [c for c in calls if c.op == "prefill" and c.args[6]]
    # packed: k/v rows 72 (n); the qkv view: 576 (16n); q rows 432 (16n) in both.
    assert [c.args[-1] for c in prefill] == ["packed", "qkv view"]
    assert prefill[0].covers[-1] == "packed: q rows 16n, k/v rows n"
    assert prefill[1].covers[-1] == "qkv view: q rows 16n, k/v rows 16n"
    decode = [c for c in calls if c.op == "decode"]
    assert [c.args[-1] for c in decode] == ["packed"]  # the query's rows: 432 and 576, both 16n
    caches = {c.args[-2:] for c in calls if c.op == "reshape_and_cache"}
    assert caches == {("packed", "separate"), ("qkv view", "separate")}  # blocks 16 * 72, 2 * 16 * 72: 16n
    rope = {c.args[-1] for c in calls if c.op == "rotary_embedding"}
    assert rope == {"packed", "qkv view", "strided heads"}  # key rows 72 (n), 576 (16n); strided
    rms = [c for c in calls if c.op == "rms_norm"]
    assert rms and all("rows n" in c.covers for c in rms)
    # Its odd calls launch only what its plan compiles ...
    missing = [
        (what, name)
        for what, call in odd_calls("h200", "odd72", ODD_MODEL, torch.float16)
        for name, key in launches(call)
        if key not in keys
    ]
    assert missing == []
    # ... and without the qkv view's prefill calls, a prefill of q/k/v sliced from the projection
    # would compile: a new key.
    without = {key for c in calls if not (c.op == "prefill" and c.args[-1] == "qkv view")
               for _, key in W._run_call(c, CPU).launches}  # fmt: skip
    q, k, v = (x.view(7, -1, 72) for x in qkv_views(7, 6, 1, 72, torch.float16))
    cu = torch.tensor([0, 7], dtype=torch.int32)
    ((_, key),) = launches(lambda: A.prefill_attention(q, k, v, cu, cu, 7, 7, hw="h200"))
    assert key in keys and key not in without


def test_decode_workspaces_are_aligned_whatever_the_batch():
    # 6 heads, one sequence, 3 partitions: S * H * parts = 18 floats of part_m; part_l still starts
    # 16-byte aligned, so the V2 launch's key is the one of a batch of 4.
    dims = ODD_MODEL
    got = {}
    for S in (1, 4):
        query = E(S, 6, 72)
        kc = E(S * 40, 16, 1, 72)
        table = torch.arange(S * 40, dtype=torch.int32).view(S, 40)
        lens = torch.full((S,), 40 * 16, dtype=torch.int32)
        got[S] = launches(lambda: A.decode_attention(query, kc, kc, table, lens, hw="h200"))
        assert [name for name, _ in got[S]][1] == "_merge"
    assert got[1] == got[4]
    assert int_class(dims["num_heads"] * 3) == "n"
