"""policy_runtime/call_cache.py's plans of prefill_attention and decode_attention on the CPU
(Triton's interpreter): a hit gives bitwise the output of the uncached path; a call that differs in
a stride, a view's alignment, a dtype, an option, max_seq_len / max_seqlen_* or a feature misses
and is right against a float64 reference; lengths the full path reads on the host (CPU tensors)
are read and checked by a hit too, and lengths that give another launch plan (V1 / V2) record
afresh; bad input raises the same error with the cache on.  Tiny shapes: each call ~15 ms."""

import dataclasses
import math

import pytest
import torch

from generated import attention as at
from policy_runtime import call_cache, direct
from test_attention_features import attend_ref
from test_call_cache import fresh, recorded  # noqa: F401  (fixtures)

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU paths; the GPU test is test_direct_launch_gpu")

ATT = at._ATTENTION
H, KH, D, BS = 2, 1, 16, 16


def rnd(*shape, dtype=torch.float32, seed=0, offset=0):
    g = torch.Generator().manual_seed(seed)
    n = math.prod(shape)
    return torch.randn(n + offset, generator=g).to(dtype)[offset:].view(*shape)


def i32(values):
    return torch.tensor(values, dtype=torch.int32)


def uncached(fn, *args, **kw):
    with direct.enabled(False):
        return fn(*args, **kw)


def close(got, ref, dtype):
    tol = 2e-4 if dtype == torch.float32 else 4e-3
    torch.testing.assert_close(got.double(), ref, rtol=tol, atol=tol)


# ---------------------------------------------------------------------------------------------
# decode_attention


def decode_ref(query, kc, vc, table, lens, scale=None, window=(-1, -1), softcap=0.0, alibi=None, sinks=None):
    S = query.shape[0]
    scale = scale if scale is not None else 1 / math.sqrt(query.shape[-1])
    out = torch.zeros(query.shape, dtype=torch.float64)
    for s in range(S):
        n = int(lens[s])
        t = torch.arange(n)
        blocks = table[s].long()[t // BS]
        k, v = kc[blocks, t % BS].float(), vc[blocks, t % BS].float()
        out[s] = attend_ref(query[s : s + 1], k, v, causal=True, scale=scale, window=window, softcap=softcap,
                            alibi=alibi, sinks=sinks)[0]  # fmt: skip
    return out


def decode_case(dtype=torch.float32, lens=(20, 9), seed=0, nb=6, width=2):
    kc, vc = rnd(nb, BS, KH, D, dtype=dtype, seed=seed), rnd(nb, BS, KH, D, dtype=dtype, seed=seed + 1)
    table = i32([[(2 * s + j + seed) % nb for j in range(width)] for s in range(len(lens))])
    return rnd(len(lens), H, D, dtype=dtype, seed=seed + 2), kc, vc, table, i32(list(lens))


def run_decode(args, recorded, *, miss, **kw):
    """One decode call: a miss (recorded) or a hit as said, bitwise the uncached output, close to
    the reference."""
    before = len(recorded)
    got = at.decode_attention(*args, hw="h200", **kw)
    assert (len(recorded) - before) == int(miss), (recorded, miss)
    assert torch.equal(got, uncached(at.decode_attention, *args, hw="h200", **kw))
    ref_kw = {k: kw[k] for k in ("scale", "softcap") if k in kw}
    ref_kw.update(window=kw.get("window_size", (-1, -1)), alibi=kw.get("alibi_slopes"), sinks=kw.get("sinks"))
    close(got, decode_ref(*args, **ref_kw), args[0].dtype)
    return got


def test_decode_hits_and_misses(recorded):
    run_decode(decode_case(), recorded, miss=True)
    # Other contents (lengths, blocks, values) of one class: a hit; its CPU lengths are read and
    # give the same (V1) plan.
    run_decode(decode_case(lens=(5, 31), seed=3), recorded, miss=False)
    q, kc, vc, table, lens = decode_case()
    for args, kw in (
        ((rnd(2, H, D, offset=1), kc, vc, table, lens), {}),  # a misaligned query
        ((rnd(2, H, 2 * D)[:, :, :D], kc, vc, table, lens), {}),  # strided heads
        (decode_case(dtype=torch.float16), {}),  # dtype
        ((q, kc, vc, table, lens), {"max_seq_len": 24}),  # max_seq_len
    ):
        run_decode(args, recorded, miss=True, **kw)
        run_decode(args, recorded, miss=False, **kw)
    assert call_cache.sizes()["decode_attention"] == 5


def test_decode_features_have_their_own_plans(recorded):
    q, kc, vc, table, lens = decode_case()
    slopes = rnd(2 * H, seed=7)[::2].abs().contiguous()  # fp32 [H]
    for kw in ({"window_size": (7, 0)}, {"softcap": 5.0}, {"alibi_slopes": slopes},
               {"sinks": rnd(2 * H, seed=8)[::2]}):  # fmt: skip  (strided sinks: copied on a hit as on a miss)
        run_decode((q, kc, vc, table, lens), recorded, miss=True, **kw)
        run_decode((q, kc, vc, table, lens), recorded, miss=False, **kw)


def small_config(monkeypatch, **over):
    # The h200 records with thresholds the interpreter reaches: V1 up to 24 tokens, V2 partitions
    # of 16 above (every call's 1 x 1 programs are too few for V1 past one partition).
    select = ATT.select

    def small(*args, **kw):
        sel = select(*args, **kw)
        cfg = dataclasses.replace(sel.config, partition_size=16, v1_v2_threshold=24, **over)
        return dataclasses.replace(sel, config=cfg, launch=dataclasses.replace(sel.launch, v2_min_partition=16))

    monkeypatch.setattr(ATT, "select", small)


def test_decode_v2_replays_the_decode_and_merge_launches(recorded, monkeypatch):
    small_config(monkeypatch)
    launches = []
    real = call_cache.Plan.launch
    monkeypatch.setattr(call_cache.Plan, "launch", lambda self, t: (launches.append(len(self.steps)), real(self, t)))
    args = decode_case(lens=(40,), width=3)
    run_decode(args, recorded, miss=True)
    run_decode(decode_case(lens=(37,), width=3, seed=2), recorded, miss=False)  # 3 partitions again
    assert launches == [2]  # the hit: decode and merge
    # 12 tokens: V1 (one partition), another plan: recorded afresh under the same key.
    run_decode(decode_case(lens=(12,), width=3, seed=4), recorded, miss=True)
    run_decode(decode_case(lens=(9,), width=3, seed=5), recorded, miss=False)
    assert launches == [2, 1]
    # A window: the merge reads the lengths clamped to it (a copy made on a hit as on a miss).
    run_decode(args, recorded, miss=True, window_size=(33, 0))
    run_decode(decode_case(lens=(44,), width=3, seed=6), recorded, miss=False, window_size=(33, 0))
    assert launches == [2, 1, 2]


def test_decode_lengths_past_the_pytorch_threshold_are_never_replayed(recorded, monkeypatch):
    small_config(monkeypatch, pytorch_decode_threshold=30)
    run_decode(decode_case(lens=(20,), width=3), recorded, miss=True)
    # 40 tokens: the PyTorch path; recorded each time, and no plan is made of it (20 tokens keep theirs).
    run_decode(decode_case(lens=(40,), width=3, seed=1), recorded, miss=True)
    run_decode(decode_case(lens=(40,), width=3, seed=2), recorded, miss=True)
    run_decode(decode_case(lens=(20,), width=3, seed=3), recorded, miss=False)


def test_decode_fp8_cache_with_float_and_tensor_scales(recorded):
    q, kc, vc, table, lens = decode_case()
    k8, v8 = (kc / 0.5).to(torch.float8_e4m3fn), (vc / 0.25).to(torch.float8_e4m3fn)
    ref = decode_ref(q, k8.float() * 0.5, v8.float() * 0.25, table, lens)
    ks, vs = torch.tensor([0.5]), torch.tensor([0.25])
    for kw in ({"k_scale": 0.5, "v_scale": 0.25}, {"k_scale": ks, "v_scale": vs}):
        for miss in (True, False):
            before = len(recorded)
            got = at.decode_attention(q, k8, v8, table, lens, hw="h200", **kw)
            assert len(recorded) - before == int(miss)
            assert torch.equal(got, uncached(at.decode_attention, q, k8, v8, table, lens, hw="h200", **kw))
            close(got, ref, torch.float32)
    # One scale for both (one tensor object on a hit): a class of its own, right.
    got = at.decode_attention(q, k8, v8, table, lens, hw="h200", k_scale=0.5, v_scale=0.5)
    got2 = at.decode_attention(q, k8, v8, table, lens, hw="h200", k_scale=ks, v_scale=vs)
    close(got, decode_ref(q, k8.float() * 0.5, v8.float() * 0.5, table, lens), torch.float32)
    close(got2, ref, torch.float32)


def test_decode_bad_calls_raise_as_without_the_cache():
    q, kc, vc, table, lens = decode_case()
    at.decode_attention(q, kc, vc, table, lens, hw="h200")
    assert call_cache.sizes()["decode_attention"] == 1
    for bad_lens, bad_table, kw in (
        (i32([20, 33]), table, {}),  # longer than the table holds (a hit's key: contents only)
        (lens, table, {"max_seq_len": 19}),  # longer than max_seq_len
        (lens, i32([[0, 60], [2, 3]]), {}),  # a block id past the cache
        (lens, table, {"scale": float("nan")}),
    ):
        errors = []
        for on in (True, False):
            with direct.enabled(on), pytest.raises(ValueError) as e:
                at.decode_attention(q, kc, vc, bad_table, bad_lens, hw="h200", **kw)
            errors.append(str(e.value))
        assert errors[0] == errors[1]
    with pytest.raises(ValueError, match="float32 tensor of one element"):
        at.decode_attention(q, kc.to(torch.float8_e4m3fn), vc.to(torch.float8_e4m3fn), table, lens, hw="h200",
                            k_scale=torch.tensor([1.0, 2.0]), v_scale=1.0)  # fmt: skip


def test_a_registered_vendor_kernel_ends_the_plans_of_triton_launches(monkeypatch):
    small_config(monkeypatch, use_native_v1=True)
    q, kc, vc, table, lens = decode_case()
    want = at.decode_attention(q, kc, vc, table, lens, hw="h200")
    assert torch.equal(at.decode_attention(q, kc, vc, table, lens, hw="h200"), want)  # a hit
    calls = []
    old = at.register_native_decode(1, lambda **kw: (calls.append(1), kw["out"].fill_(3.0)))
    try:
        got = at.decode_attention(q, kc, vc, table, lens, hw="h200")
        assert calls == [1] and torch.equal(got, torch.full_like(got, 3.0))
    finally:
        at.register_native_decode(1, old)
    assert torch.equal(at.decode_attention(q, kc, vc, table, lens, hw="h200"), want)


# ---------------------------------------------------------------------------------------------
# prefill_attention


def prefill_ref(q, k, v, lq, lk, causal=True, **kw):
    out = torch.zeros(q.shape, dtype=torch.float64)
    cq, ck = [0], [0]
    for a, b in zip(lq, lk):
        cq.append(cq[-1] + a)
        ck.append(ck[-1] + b)
    for b in range(len(lq)):
        if lq[b] and lk[b]:
            out[cq[b] : cq[b + 1]] = attend_ref(q[cq[b] : cq[b + 1]], k[ck[b] : ck[b + 1]], v[ck[b] : ck[b + 1]],
                                                causal=causal, scale=1 / math.sqrt(q.shape[-1]), **kw)  # fmt: skip
    return out


def prefill_case(lq=(5, 3), lk=None, dtype=torch.float32, seed=0, offset=0):
    lk = lk or lq
    q = rnd(sum(lq), H, D, dtype=dtype, seed=seed, offset=offset)
    k, v = rnd(sum(lk), KH, D, dtype=dtype, seed=seed + 1), rnd(sum(lk), KH, D, dtype=dtype, seed=seed + 2)
    cq = i32([0, *torch.tensor(lq).cumsum(0).tolist()])
    ck = cq if tuple(lk) == tuple(lq) else i32([0, *torch.tensor(lk).cumsum(0).tolist()])
    return (q, k, v, cq, ck, max(lq), max(lk)), (lq, lk)


def run_prefill(case, recorded, *, miss, **kw):
    args, (lq, lk) = case
    before = len(recorded)
    got = at.prefill_attention(*args, hw="h200", **kw)
    assert (len(recorded) - before) == int(miss), (recorded, miss)
    assert torch.equal(got, uncached(at.prefill_attention, *args, hw="h200", **kw))
    fkw = {"window": kw.get("window_size", (-1, -1)), "softcap": kw.get("softcap", 0.0)}
    close(got, prefill_ref(*args[:3], lq, lk, causal=kw.get("causal", True), **fkw), args[0].dtype)


def test_prefill_hits_and_misses(recorded):
    run_prefill(prefill_case(), recorded, miss=True)
    run_prefill(prefill_case(lq=(3, 5), seed=3), recorded, miss=False)  # other lengths, one class
    for case, kw in (
        (prefill_case(offset=1), {}),  # a misaligned q
        (prefill_case(dtype=torch.float16), {}),  # dtype
        (prefill_case(lq=(5, 3), lk=(6, 2)), {}),  # cu_seqlens_k not cu_seqlens_q: another class
        (prefill_case(lq=(4, 8)), {}),  # max_seqlen: another grid
        (prefill_case(), {"window_size": (2, 0)}),
    ):
        run_prefill(case, recorded, miss=True, **kw)
        run_prefill(case, recorded, miss=False, **kw)
    assert call_cache.sizes()["prefill_attention"] == 6


def test_prefill_bad_calls_raise_as_without_the_cache():
    (q, k, v, cq, _, mq, mk), _ = prefill_case()
    at.prefill_attention(q, k, v, cq, cq, mq, mk, hw="h200")
    for bad_cu, bad_max in ((i32([0, 6, 8]), mq), (i32([0, 5, 9]), mq), (cq, 4)):
        errors = []
        for on in (True, False):
            with direct.enabled(on), pytest.raises(ValueError) as e:
                at.prefill_attention(q, k, v, bad_cu, bad_cu, bad_max, bad_max, hw="h200")
            errors.append(str(e.value))
        assert errors[0] == errors[1]
