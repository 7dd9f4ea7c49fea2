"""policy_runtime/call_cache.py's plans of the MoE entry points on the CPU (Triton's interpreter):
topk_softmax and grouped_topk (softmax, sigmoid, bias, groups, scaling: one cache, the router's
name in the key), moe_align_block_size (with an expert map) and fused_moe.  A hit gives bitwise
the output of the uncached path; another stride, alignment, dtype or option misses and is right
against a reference; bad input raises the same error with the cache on.  Tiny shapes."""

import pytest
import torch

from generated import moe as MOE
from policy_runtime import call_cache, direct
from test_call_cache import fresh, recorded  # noqa: F401  (fixtures)
from test_moe import align_reference
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
