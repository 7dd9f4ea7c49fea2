"""Prefill's K/V loads through TMA descriptors (AttentionLaunch.prefill_kv_tma, issue 33).

An AttentionLaunch record with ``prefill_kv_tma`` (h200's at head_dims 64 and 128) has prefill read K and V
through Triton ``TensorDescriptor``s over [total_k, num_kv_heads * head_dim] wherever a call
allows it: 16-bit, unpaged K/V, a power-of-two head_dim, heads packed in a token's row, 16-byte
aligned base and rows.  Every other call takes the pointer loads of the same kernel.  A descriptor
reads past a sequence's last key into the next sequence's rows (not zeros, as a masked pointer
load gives): those keys are masked and their V rows zeroed, so a non-finite value there changes
nothing.  Runs in the interpreter (fp16): Triton's interpreter executes descriptor loads.
"""

from __future__ import annotations

import math

import pytest
import torch

from generated import attention as at
from generated import dispatch
from kernel_cases import DEVICE, seeded  # noqa: F401  (autouse fixture: a fixed seed per test)
from policy_runtime import call_cache, direct
from policy_runtime.attention import ops as rt
from test_attention_features import check, i32, offsets, prefill_ref, rnd, slopes

ATT = at._ATTENTION
TARGET = "h200"
H, HKV = 4, 2


@pytest.fixture
def descriptors(monkeypatch):
    """The descriptors prefill makes, as (tensor, block_n) pairs, in order."""
    made = []
    real = rt._kv_descriptor

    def spy(t, block_n):
        made.append((t, block_n))
        return real(t, block_n)

    monkeypatch.setattr(rt, "_kv_descriptor", spy)
    return made


def run(q, k, v, lq, lk, *, kv_tma=None, kernel=None, **kw):
    return ATT.prefill(q, k, v, i32(offsets(lq)), i32(offsets(lk)), max(lq), max(lk), hw=TARGET, kernel=kernel,
                       kv_tma=kv_tma, **kw)  # fmt: skip


FEATURES = {
    "causal": dict(causal=True),
    "full": dict(causal=False),
    "window_causal": dict(causal=True, window_size=(20, -1)),
    "window_both": dict(causal=False, window_size=(9, 5)),
    "softcap": dict(causal=True, softcap=2.0),
    "alibi": dict(causal=False, alibi_slopes="slopes"),
    "sinks": dict(causal=True, sinks="sinks"),
}


@pytest.mark.parametrize("name", sorted(FEATURES))
def test_tma_loads_give_the_reference_and_the_pointer_loads_result(name, descriptors):
    """Ragged lengths that are not multiples of 16 (an empty one, queries shorter than keys),
    every feature: the descriptor path against float64 and against the same kernel's pointer
    loads; the descriptors were made (two a call, over K and V, with the tile's block_n)."""
    feat = dict(FEATURES[name])
    if feat.get("alibi_slopes"):
        feat["alibi_slopes"] = slopes()
    if feat.get("sinks"):
        feat["sinks"] = rnd(H, scale=2.0)
    D, lq, lk = 64, [5, 0, 70, 33], [9, 0, 150, 33]
    q, k, v = rnd(sum(lq), H, D, dtype=torch.float16), rnd(sum(lk), HKV, D, dtype=torch.float16), rnd(
        sum(lk), HKV, D, dtype=torch.float16)  # fmt: skip
    kernel = ATT.select(torch.float16, D, TARGET).prefill
    got = run(q, k, v, lq, lk, kv_tma=True, kernel=kernel, **feat)
    assert [(t is k or t is v, b) for t, b in descriptors] == [(True, kernel.block_n)] * 2
    plain = run(q, k, v, lq, lk, kv_tma=False, kernel=kernel, **feat)
    assert len(descriptors) == 2
    fref = {"window": feat.get("window_size", (-1, -1)), "softcap": feat.get("softcap", 0.0),
            "alibi": feat.get("alibi_slopes"), "sinks": feat.get("sinks")}  # fmt: skip
    ref = prefill_ref(q, k, v, lq, lk, causal=feat["causal"], scale=1 / math.sqrt(D), **fref)
    check(got, ref, torch.float16)
    assert torch.equal(got, plain)


@pytest.mark.parametrize("poison", [float("inf"), float("nan")])
def test_the_next_sequences_rows_never_reach_a_sequence(poison, descriptors):
    """A descriptor tile past a sequence's end reads the next sequence's K and V rows: filled with
    inf or NaN there, the other sequences' outputs still match their references."""
    D, lens = 32, [21, 40, 19]
    q, k, v = (rnd(sum(lens), h, D, dtype=torch.float16) for h in (H, HKV, HKV))
    clean = prefill_ref(q, k, v, lens, lens, causal=False, scale=1 / math.sqrt(D))
    k[21:61] = poison
    v[21:61] = poison
    got = run(q, k, v, lens, lens, kv_tma=True, causal=False)
    assert len(descriptors) == 2
    for a, b in ((0, 21), (61, 80)):
        check(got[a:b], clean[a:b], torch.float16)


@pytest.mark.parametrize("kv_tma", [True, False])
def test_causal_diagonal_tiles_inside_the_keys_read_no_row_past_them(kv_tma):
    """Causal diagonal tiles inside the keys and the one that crosses a sequence's end, whose rows
    past the end are the next sequence's: the middle sequence's K and V rows hold NaN, and the
    sequences around it (key lengths of several 64-key tiles, queries shorter than keys: a
    diagonal that is not a tile's) still match their references, with TMA descriptors and with
    pointer loads."""
    D, lq, lk = 64, [150, 97, 200], [150, 161, 230]
    q, k, v = rnd(sum(lq), H, D, dtype=torch.float16), rnd(sum(lk), HKV, D, dtype=torch.float16), rnd(
        sum(lk), HKV, D, dtype=torch.float16)  # fmt: skip
    clean = prefill_ref(q, k, v, lq, lk, causal=True, scale=1 / math.sqrt(D))
    k[150:311] = float("nan")
    v[150:311] = float("nan")
    kernel = ATT.select(torch.float16, D, TARGET).prefill
    assert kernel.block_n == 64
    got = run(q, k, v, lq, lk, kv_tma=kv_tma, kernel=kernel, causal=True)
    for a, b in ((0, 150), (247, 447)):
        check(got[a:b], clean[a:b], torch.float16)


def _strided_heads(T, D):
    return rnd(T, HKV, 2 * D, dtype=torch.float16)[..., :D]  # head stride 2 * D


def _misaligned(T, D):
    buf = rnd(T * HKV * D + 1, dtype=torch.float16)
    return buf[1:].view(T, HKV, D)  # data 2 bytes past a 16-byte boundary


@pytest.mark.parametrize(
    "layout, D, dtype",
    [
        ("padded head_dim", 80, torch.float16),
        ("head stride != head_dim", 64, torch.float16),
        ("misaligned base", 64, torch.float16),
        ("fp32", 64, torch.float32),
        ("rows overlap (broadcast keys)", 64, torch.float16),
    ],
)
def test_calls_tma_cannot_serve_take_the_pointer_loads(layout, D, dtype, descriptors):
    lens = [30, 17]
    T = sum(lens)
    q = rnd(T, H, D, dtype=dtype)
    if layout == "head stride != head_dim":
        k, v = _strided_heads(T, D), _strided_heads(T, D)
    elif layout == "misaligned base":
        k, v = _misaligned(T, D), _misaligned(T, D)
        assert k.data_ptr() % 16 != 0
    elif layout == "rows overlap (broadcast keys)":
        # Row stride 0 is 16-byte aligned, but a TMA tensor map's row stride must span a row.
        k, v = rnd(1, HKV, D, dtype=dtype).expand(T, HKV, D), rnd(1, HKV, D, dtype=dtype).expand(T, HKV, D)
    else:
        k, v = rnd(T, HKV, D, dtype=dtype), rnd(T, HKV, D, dtype=dtype)
    got = run(q, k, v, lens, lens, kv_tma=True, causal=True)
    assert descriptors == []
    check(got, prefill_ref(q, k, v, lens, lens, causal=True, scale=1 / math.sqrt(D)), dtype)


def test_paged_and_fp8_keys_take_the_pointer_loads(descriptors):
    D, bs, n = 64, 16, 40
    q = rnd(n, H, D, dtype=torch.float16)
    kc, vc = rnd(4, bs, HKV, D, dtype=torch.float16), rnd(4, bs, HKV, D, dtype=torch.float16)
    table = i32([[2, 0, 3]])
    run(q, kc, vc, [n], [n], kv_tma=True, causal=True, block_table=table)
    k8, v8 = rnd(n, HKV, D).to(torch.float8_e4m3fn), rnd(n, HKV, D).to(torch.float8_e4m3fn)
    run(q, k8, v8, [n], [n], kv_tma=True, causal=True, k_scale=1.0, v_scale=1.0)
    assert descriptors == []


@pytest.mark.parametrize("target, D", [("h200", 128), ("h200", 64), ("h200", 256), ("h100", 128), ("a100", 64)])
def test_the_record_decides_where_public_calls_use_tma(target, D, descriptors):
    """prefill_attention reads K and V through descriptors exactly where the target's
    AttentionLaunch record for the head_dim's tile says prefill_kv_tma (h200 up to 128)."""
    rec = ATT.select(torch.float16, D, target).launch
    assert rec.prefill_kv_tma == (target == "h200" and D <= 128)
    lens = [19]
    q, k, v = rnd(19, H, D, dtype=torch.float16), rnd(19, HKV, D, dtype=torch.float16), rnd(
        19, HKV, D, dtype=torch.float16)  # fmt: skip
    got = at.prefill_attention(q, k, v, i32([0, 19]), i32([0, 19]), 19, 19, hw=target)
    assert len(descriptors) == (2 if rec.prefill_kv_tma else 0)
    check(got, prefill_ref(q, k, v, lens, lens, causal=True, scale=1 / math.sqrt(D)), torch.float16)


def test_tma_needs_a_part_with_tma():
    """Every record with prefill_kv_tma is on a part whose hardware spec has TMA (the config's
    check 'TMA loads need a part with TMA' refuses any other at build time)."""
    seen = 0
    for target, hw in dispatch.HARDWARE.items():
        for D in (64, 128, 256):
            if ATT.select(torch.float16, D, target).launch.prefill_kv_tma:
                assert hw.tma, target
                seen += 1
    assert seen > 0


def test_a_replayed_call_makes_descriptors_over_its_own_tensors(descriptors, monkeypatch):
    """The call cache's plan of a TMA call makes the descriptors again (call_cache.step) over the
    new call's K and V: a plan holding the first call's descriptors would read the first call's
    keys."""
    call_cache.clear_all()
    hits = []
    real_hit = rt._prefill_hit
    monkeypatch.setattr(rt, "_prefill_hit", lambda *a: hits.append(1) or real_hit(*a))
    D, lens = 64, [25, 40]
    cu = i32(offsets(lens))
    outs = []
    for _ in range(3):
        q, k, v = (rnd(sum(lens), h, D, dtype=torch.float16) for h in (H, HKV, HKV))
        got = at.prefill_attention(q, k, v, cu, cu, 40, 40, hw=TARGET)
        check(got, prefill_ref(q, k, v, lens, lens, causal=True, scale=1 / math.sqrt(D)), torch.float16)
        outs.append(got)
    assert call_cache.sizes()["prefill_attention"] == 1 and len(hits) == 2  # the 2nd and 3rd calls replayed
    assert len(descriptors) == 6 and all(t.shape[0] == sum(lens) for t, _ in descriptors)
    assert len({id(t) for t, _ in descriptors}) == 6  # each call's own K and V


def test_a_descriptor_argument_has_a_launch_class():
    """direct.py keys a descriptor by what Triton specializes on (dtype, block shape): two
    descriptors over different tensors of one class share it; another block shape does not."""
    a = rnd(32, HKV, 64, dtype=torch.float16)
    b = rnd(48, HKV, 64, dtype=torch.float16)
    kern = at.KERNELS[ATT.select(torch.float16, 64, TARGET).prefill.name].kernel
    one = direct.launch_class(kern, (rt._kv_descriptor(a, 64),), {})
    two = direct.launch_class(kern, (rt._kv_descriptor(b, 64),), {})
    other = direct.launch_class(kern, (rt._kv_descriptor(b, 32),), {})
    assert one == two != other
    hash(one)
