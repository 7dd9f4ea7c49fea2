"""policy_runtime/call_cache.py's plans of the MoE entry points on the CPU (Triton's interpreter):
topk_softmax and grouped_topk (softmax, sigmoid, bias, groups, scaling: one cache, the router's
name in the key), moe_align_block_size (with an expert map), fused_moe (every kernel kind, the
expert map, the activations) and fused_moe_fp8 (per-tensor static and dynamic, 128-block scales),
whose plans replay the torch ops between their launches too.  A hit gives bitwise the output of
the uncached path; another stride, alignment, dtype or option misses and is right against a
float64 reference; bad input raises the same error with the cache on.  Tiny shapes."""

import functools

import pytest
import torch

from generated import moe as MOE
from policy_runtime import call_cache, direct
from test_call_cache import fresh, recorded  # noqa: F401  (fixtures)
from test_moe import align_reference
from test_moe import reference as moe_reference
from test_moe_features import reference as ep_reference
from test_moe_fp8 import dequant_weights, quant_weights
from test_moe_fp8 import reference as fp8_reference
from test_moe_routing import reference as route_ref
from test_moe_routing import spread_logits

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU paths; the GPU test is test_direct_launch_gpu")


def uncached(fn, *args, **kw):
    with direct.enabled(False):
        return fn(*args, **kw)


def called(fn, args, kw, recorded, name, miss):
    before = len(recorded)
    got = fn(*args, **kw)
    assert len(recorded) - before == int(miss) and (not miss or recorded[-1] == name), (recorded, miss)
    want = uncached(fn, *args, **kw)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)
    return got


def route_case(T=1, E=8, seed=0, offset=0):
    torch.manual_seed(seed)
    x = spread_logits(T, E)
    if offset:
        x = torch.cat([torch.zeros(offset), x.flatten()])[offset:].view(T, E)
    return x


def route(fn, kw, cases, recorded):
    ref_kw = {"scoring": kw.get("scoring_func", "softmax"), "bias": kw.get("e_score_correction_bias"),
              "groups": kw.get("num_expert_group", 1), "topk_group": kw.get("topk_group", 1),
              "scale": kw.get("routed_scaling_factor", 1.0)}  # fmt: skip
    for x, miss in cases:
        w, ids = called(fn, (x, 2, True), kw, recorded, "topk_softmax", miss)
        want_w, want_ids = route_ref(x, 2, True, **ref_kw)
        assert ids.tolist() == want_ids.tolist()
        torch.testing.assert_close(w.double(), want_w, rtol=2e-6, atol=1e-7)


def test_topk_softmax_hits_and_misses(recorded):
    route(MOE.topk_softmax, {}, ((route_case(), True), (route_case(seed=1), False), (route_case(offset=1), True)),
          recorded)  # fmt: skip
    assert call_cache.sizes()["topk_softmax"] == 2


def test_grouped_topk_with_bias_groups_and_scaling_hits_and_misses(recorded):
    bias = torch.linspace(-0.2, 0.2, 16)[::2]  # strided: copied on a hit as on a miss
    kw = {"scoring_func": "sigmoid", "e_score_correction_bias": bias, "num_expert_group": 2, "topk_group": 1,
          "routed_scaling_factor": 2.5}  # fmt: skip
    route(MOE.grouped_topk, kw, ((route_case(), True), (route_case(seed=1), False)), recorded)
    route(MOE.topk_softmax, {}, ((route_case(seed=2), True),), recorded)  # another router: its own plan


def test_router_bad_calls_raise_as_without_the_cache():
    x = route_case()
    MOE.topk_softmax(x, 2, True)
    for args in ((x, 9, True), (x, 2, 1), (x.int(), 2, True)):
        errors = []
        for on in (True, False):
            with direct.enabled(on), pytest.raises(ValueError) as e:
                MOE.topk_softmax(*args)
            errors.append(str(e.value))
        assert errors[0] == errors[1]


def test_moe_align_block_size_hits_and_misses(recorded):
    E, block = 2, 4
    emap = torch.tensor([1, -1], dtype=torch.int32)

    def make(seed, dtype=torch.int32):
        return torch.randint(0, E, (3, 2), generator=torch.Generator().manual_seed(seed), dtype=dtype)

    for ids, kw, miss in (
        (make(0), {}, True),
        (make(1), {}, False),
        (make(2, torch.int64).t(), {}, True),  # strided int64 ids: another class
        (make(3), {"expert_map": emap}, True),
        (make(4), {"expert_map": emap}, False),
    ):
        sorted_ids, expert_ids, post_pad = called(
            MOE.moe_align_block_size, (ids, block, E), kw, recorded, "moe_align_block_size", miss
        )
        want_sorted, want_experts, total = align_reference(ids, block, E)
        if "expert_map" in kw:
            want_experts = emap[torch.tensor(want_experts).long()].tolist()
        assert sorted_ids.tolist() == want_sorted and expert_ids.tolist() == want_experts
        assert post_pad.tolist() == [total]
    with pytest.raises(ValueError, match="expert_map must have num_experts"):
        MOE.moe_align_block_size(make(0), block, E, expert_map=emap[:1])


# ---------------------------------------------------------------------------------------------
# fused_moe and fused_moe_fp8: a hit replays the whole call (alignment, allocations, launches)


def moe_layer(T=1, E=4, k=2, dtype=torch.float16, seed=0, H=16, I=8, offset=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T * H + offset, generator=g).to(dtype)[offset:].view(T, H)
    w1 = (torch.randn(E, 2 * I, H, generator=g) / H**0.5).to(dtype)
    w2 = (torch.randn(E, H, I, generator=g) / I**0.5).to(dtype)
    weights = torch.rand(T, k, generator=g)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]).to(torch.int32)
    return x, w1, w2, weights, ids


def moe_ref(x, w1, w2, weights, ids, activation="silu", expert_map=None):
    if activation == "gelu":
        return moe_reference(x, w1, w2, weights, ids, "gelu")
    return ep_reference(x, w1, w2, weights, ids, activation, expert_map)


def fused(layer, miss, recorded, *, out=True, fn=None, ref=moe_ref, tol=None, **kw):
    """One fused_moe call (``fn``: another way to make it) into a NaN-filled out (or a new one):
    a miss or a hit as said, close to the float64 reference; a hit bitwise the uncached path's."""
    fn = fn or (lambda *a, **k: MOE.fused_moe(*a, **k))
    x = layer[0]
    before = len(recorded)
    given = torch.full(x.shape, float("nan"), dtype=x.dtype) if out else None
    got = fn(*layer, out=given, **kw)
    assert len(recorded) - before == int(miss), (recorded, miss)
    assert got is given or not out
    if not miss:
        want = uncached(fn, *layer, out=torch.full(x.shape, 7.0, dtype=x.dtype) if out else None, **kw)
        assert torch.equal(got, want)
    r = ref(*layer, **{k: v for k, v in kw.items() if k in ("activation", "expert_map")})
    err = ((got.double() - r).norm() / r.norm()).item()
    assert err < (tol or (3e-3 if x.dtype == torch.float16 else 2e-5)), err
    return got


def test_fused_moe_hits_and_misses(recorded):
    # a100 at one token: gemv (the cheapest in the interpreter; the kinds: the next test).
    fused(moe_layer(), True, recorded, hw="a100")
    fused(moe_layer(seed=1), False, recorded, hw="a100")  # other contents and routing: a hit
    for layer_kw, kw in (({}, {"out": False}), ({"offset": 1}, {})):  # out made by the call; misaligned
        fused(moe_layer(**layer_kw, seed=2), True, recorded, hw="a100", **kw)
        fused(moe_layer(**layer_kw, seed=3), False, recorded, hw="a100", **kw)
    x, w1, w2, weights, ids = moe_layer(seed=4)
    for layer, kw in (
        (moe_layer(dtype=torch.float32), {}),  # dtype
        ((x, w1, w2, weights, ids), {"activation": "gelu"}),  # activation
        ((x, w1, w2, weights, ids.long()), {}),  # int64 ids
        ((x, w1.transpose(1, 2).contiguous().transpose(1, 2), w2, weights, ids), {}),  # w1's strides
    ):
        fused(layer, True, recorded, hw="a100", **kw)
    assert recorded == ["fused_moe"] * 7 and call_cache.sizes()["fused_moe"] == 7


def _kind(kind, fuse_sum, fp32=False):
    # The pair of that kind with the smallest tiles (the interpreter's time goes with them).
    pairs = [(v.block_m * v.block_n * v.block_k, n) for n, v in MOE.VARIANTS.items()
             if v.kind == kind and v.fuse_sum == fuse_sum and ("_fp32_" in n) == fp32]  # fmt: skip
    return MOE.VARIANTS[min(pairs)[1]]


@pytest.mark.parametrize(
    "variant, T, k, dtype",
    [
        (("grouped", True, True), 2, 2, torch.float32),  # fused sum into out itself (zeroed in place)
        (("grouped", True, False), 2, 2, torch.float16),  # fused sum into fp32 zeros, copied to out
        (("grouped", False, False), 2, 2, torch.float16),  # weighted rows, then sum_rows
        (("grouped", False, False), 2, 1, torch.float16),  # one expert a token: rows are out
        (("simt", True, False), 1, 2, torch.float16),  # simt (chained where the device can)
    ],
    ids=["grouped-sum-fp32", "grouped-sum-fp16", "grouped-rows", "grouped-k1", "simt"],
)
def test_fused_moe_every_kind_replays_its_whole_call(variant, T, k, dtype, recorded):
    v = _kind(*variant)
    fn = lambda *a, out=None, **kw: MOE._MOE.fused_moe(*a, "silu", out, None, variant=v, **kw)  # noqa: E731
    fused(moe_layer(T=T, k=k, E=2, dtype=dtype), True, recorded, fn=fn)
    fused(moe_layer(T=T, k=k, E=2, dtype=dtype, seed=1), False, recorded, fn=fn)
    plan = next(iter(call_cache.named("fused_moe").plans.values()))
    assert plan is not call_cache.NO_PLAN


@pytest.mark.parametrize("kind", [("grouped", False), ("gemv", True)])
@pytest.mark.parametrize("k", [1, 2])
def test_fused_moe_expert_map_hits_and_misses(kind, k, recorded):
    v = _kind(*kind)
    fn = lambda *a, out=None, **kw: MOE._MOE.fused_moe(*a, "silu", out, None, variant=v, **kw)  # noqa: E731
    T, global_e = 3, 6
    emap = torch.tensor([-1, 0, -1, 1, 2, -1], dtype=torch.int32)
    x, w1, w2, weights, _ = moe_layer(T=T, k=k, E=3)
    ids = torch.tensor([[0, 2], [1, 3], [4, 0]], dtype=torch.int32)[:, :k].contiguous()  # token 0: none here
    fused((x, w1, w2, weights, ids % 3), True, recorded, fn=fn)  # no map (local ids): another class
    got = fused((x, w1, w2, weights, ids), True, recorded, fn=fn, expert_map=emap)
    assert got[0].abs().sum() == 0  # token 0: zeros
    other = torch.tensor([0, -1, 1, -1, -1, 2], dtype=torch.int32)  # another map of its class: a hit
    got = fused((x, w1, w2, weights, ids), False, recorded, fn=fn, expert_map=other)
    assert got[1].abs().sum() == 0  # now token 1 has none here


def test_fused_moe_bad_calls_raise_as_without_the_cache():
    x, w1, w2, weights, ids = moe_layer()
    MOE.fused_moe(x, w1, w2, weights, ids, hw="a100")
    for args, kw in (
        ((x, w1, w2, weights, ids), {"activation": "gelu_tanh"}),
        ((x, w1, w2[:, :, :4], weights, ids), {}),
        ((x, w1, w2, weights, ids), {"out": torch.empty(1, 16, dtype=torch.float32)}),
        ((x, w1, w2, weights, ids.float()), {}),
        ((x, w1, w2, weights, ids), {"expert_map": torch.zeros(4)}),
    ):
        errors = []
        for on in (True, False):
            with direct.enabled(on), pytest.raises(ValueError) as e:
                MOE.fused_moe(*args, hw="a100", **kw)
            errors.append(str(e.value))
        assert errors[0] == errors[1]
    grad = x.clone().requires_grad_()
    for _ in range(2):
        with pytest.raises(ValueError, match="requires grad"):
            MOE.fused_moe(grad, w1, w2, weights, ids, hw="a100")
        with torch.no_grad():  # runs, never planned (grad mode is not in the key)
            MOE.fused_moe(grad, w1, w2, weights, ids, hw="a100")
    assert call_cache.sizes()["fused_moe"] == 1


def test_fused_moe_out_passed_as_hidden_states_makes_no_plan(recorded):
    x, w1, w2, weights, ids = moe_layer()
    want = uncached(MOE.fused_moe, x.clone(), w1, w2, weights, ids, hw="a100")
    for _ in range(2):
        xi = x.clone()
        assert MOE.fused_moe(xi, w1, w2, weights, ids, out=xi, hw="a100") is xi
        assert torch.equal(xi, want)
    assert recorded == ["fused_moe", "fused_moe"] and call_cache.sizes()["fused_moe"] == 0


@functools.lru_cache(maxsize=None)
def fp8_weights(E, H, I, block):
    """e4m3 weights, their scales and their dequantized float64 values (made once per shape)."""
    g = torch.Generator().manual_seed(7)
    w1q, w1s = quant_weights(torch.randn(E, 2 * I, H, generator=g) / H**0.5, block)
    w2q, w2s = quant_weights(torch.randn(E, H, I, generator=g) / I**0.5, block)
    return w1q, w1s, w2q, w2s, dequant_weights(w1q, w1s), dequant_weights(w2q, w2s)


@pytest.mark.parametrize(
    "T, H, I, block, static, emap",
    [
        (1, 32, 16, False, False, False),  # simt, dynamic per-tensor scales
        (1, 32, 16, False, True, False),  # simt, static scales of shapes () and (1, 1)
        (2, 32, 16, False, False, True),  # grouped, dynamic, expert map
        (2, 128, 128, True, False, False),  # grouped, 128-block scales
    ],
    ids=["simt-dynamic", "simt-static", "grouped-ep", "grouped-block"],
)
def test_fused_moe_fp8_hits_and_misses(T, H, I, block, static, emap, recorded):
    E, k = 2, 2
    emap = torch.tensor([1, -1, 0, -1], dtype=torch.int32) if emap else None
    w1q, w1s, w2q, w2s, w1d, w2d = fp8_weights(E, H, I, block)
    kw = {"w1_scale": w1s, "w2_scale": w2s, "block_shape": [128, 128] if block else None, "expert_map": emap}
    if static:
        kw.update(a1_scale=torch.tensor(0.02), a2_scale=torch.tensor([[0.01]]))
    grouped = min((v.block_m, n) for n, v in MOE.VARIANTS_FP8.items() if v.kind == "grouped")[1]
    variant = MOE.VARIANTS_FP8[grouped] if T > 1 else None  # else h200's decode bucket: simt

    def fn(*layer, out=None, **kw):
        return MOE._MOE_FP8.fused_moe_fp8(*layer, out=out, hw="h200", variant=variant, **kw)

    def ref(x, w1, w2, weights, ids, expert_map=None):
        a1, a2 = kw.get("a1_scale"), kw.get("a2_scale")
        return fp8_reference(x, w1d, w2d, weights, ids, block=block, a1=a1, a2=a2, expert_map=expert_map)

    for seed, miss in ((0, True), (1, False)):
        g = torch.Generator().manual_seed(seed)
        x, weights = torch.randn(T, H, generator=g).half(), torch.rand(T, k, generator=g)
        ids = torch.stack([torch.randperm(4 if emap is not None else E, generator=g)[:k] for _ in range(T)]).int()
        fused((x, w1q, w2q, weights, ids), miss, recorded, fn=fn, ref=ref, tol=2e-3, **kw)
    assert [p is not call_cache.NO_PLAN for p in call_cache.named("fused_moe_fp8").plans.values()] == [True]
