"""generated/moe.py's fused_moe with gpt-oss's swigluoai activation and with expert parallelism
(``expert_map``), and moe_align_block_size with an expert map, against float64 references written
from vLLM's published semantics (not from our kernels):

- swigluoai (vLLM's swigluoai_and_mul, gpt-oss): gate and up interleaved in w1's rows (gate =
  rows 0, 2, 4, ..., up = rows 1, 3, 5, ...); gate clamped above at 7, up to [-7, 7];
  ``gate * sigmoid(1.702 * gate) * (up + 1)``.
- expert_map: global expert id -> this rank's expert, -1 for another rank's; slots routed to
  another rank add nothing.  moe_align_block_size maps each block's expert through it.

One kernel pair of each structure (grouped with and without the fused sum, gemv, simt unstaged
and staged): the bodies are shared by every instantiation.  Tiny shapes, fp16 and fp32 in the
interpreter.
"""

from __future__ import annotations

import pytest
import torch

from generated import moe as M
from kernel_cases import DEVICE, seeded  # noqa: F401  (autouse fixture: a fixed seed per test)

TOL = {torch.float16: 3e-3, torch.float32: 2e-5, torch.bfloat16: 2e-2}
H, I = 32, 24


def _pick():
    """The first kernel pair of each structure (sorted names), 16-bit, and a staged fp32 simt one."""
    picks = {}
    for name, v in sorted(M.VARIANTS.items()):
        cls = (v.kind, v.fuse_sum, "_fp32_" in name, v.kind == "simt" and v.num_stages > 1)
        wanted = [
            ("grouped", True, False, False),
            ("grouped", False, False, False),
            ("gemv", True, False, False),
            ("simt", True, False, False),
            ("simt", True, True, True),
        ]
        if cls in wanted:
            picks.setdefault(cls, name)
    return sorted(picks.values())


PAIRS = _pick()


def dtype_of(name):
    return torch.float32 if "_fp32_" in name else torch.float16


def reference(x, w1, w2, weights, ids, activation="silu", expert_map=None):
    """float64, token by token and slot by slot; the activation's product rounded to x's dtype
    (vLLM's intermediate cache)."""
    x64, w1, w2, weights = x.cpu().double(), w1.cpu().double(), w2.cpu().double(), weights.cpu().double()
    ids = ids.cpu()
    T, k = ids.shape
    out = torch.zeros(T, x.shape[1], dtype=torch.float64)
    for t in range(T):
        for j in range(k):
            e = int(ids[t, j])
            if expert_map is not None:
                e = int(expert_map.cpu()[e])
                if e < 0:
                    continue  # another rank's expert
            gu = w1[e] @ x64[t]
            if activation == "swigluoai":
                gate, up = gu[0::2].clamp(max=7.0), gu[1::2].clamp(-7.0, 7.0)
                h = gate * torch.sigmoid(1.702 * gate) * (up + 1.0)
            else:
                inter = gu.shape[0] // 2
                gate, up = gu[:inter], gu[inter:]
                h = gate * torch.sigmoid(gate) * up
            h = h.to(x.dtype).double()
            out[t] += weights[t, j] * (w2[e] @ h)
    return out


def run(name, x, w1, w2, weights, ids, activation="silu", expert_map=None):
    out = torch.full(x.shape, float("nan"), dtype=x.dtype, device=DEVICE)
    got = M._MOE.fused_moe(
        x, w1, w2, weights, ids, activation, out, None, variant=M.VARIANTS[name], expert_map=expert_map
    )
    assert got is out
    return out


def check(out, ref, dtype, what):
    got = out.double().cpu()
    assert not torch.isnan(got).any(), f"{what}: unwritten output elements"
    err = ((got - ref).norm() / ref.norm()).item()
    assert err < TOL[dtype], f"{what}: relative error {err:.2e}"


@pytest.mark.parametrize("name", PAIRS)
def test_swigluoai_matches_gpt_oss(name):
    dtype = dtype_of(name)
    T, k, E = 5, 2, 4
    x = torch.randn(T, H).to(dtype).to(DEVICE)
    # Large enough weights that gates pass the limit 7 and ups both limits.
    w1 = (torch.randn(E, 2 * I, H) * 3.0 / H**0.5).to(dtype).to(DEVICE)
    w2 = (torch.randn(E, H, I) / I**0.5).to(dtype).to(DEVICE)
    weights = torch.rand(T, k, device=DEVICE)
    ids = torch.stack([torch.randperm(E)[:k] for _ in range(T)]).to(torch.int32).to(DEVICE)
    gu = torch.einsum("th,eoh->teo", x.double().cpu(), w1.double().cpu())
    assert (gu[..., 0::2] > 7).any() and (gu[..., 1::2].abs() > 7).any()  # the clamps are exercised
    out = run(name, x, w1, w2, weights, ids, "swigluoai")
    ref = reference(x, w1, w2, weights, ids, "swigluoai")
    check(out, ref, dtype, f"{name} swigluoai")
    # The halves layout would give something else: the interleaving is what is tested.
    halves = reference(x, torch.cat([w1[:, 0::2], w1[:, 1::2]], dim=1), w2, weights, ids, "silu")
    assert ((halves - ref).norm() / ref.norm()).item() > 0.1


@pytest.mark.parametrize("name", PAIRS)
def test_expert_map_skips_other_ranks_experts(name):
    dtype = dtype_of(name)
    T, k, global_e = 4, 3, 8
    here = [5, 1, 6, 3]  # this rank's experts, in its local order
    expert_map = torch.full((global_e,), -1, dtype=torch.int32)
    for local, g in enumerate(here):
        expert_map[g] = local
    x = torch.randn(T, H).to(dtype).to(DEVICE)
    w1 = (torch.randn(len(here), 2 * I, H) / H**0.5).to(dtype).to(DEVICE)
    w2 = (torch.randn(len(here), H, I) / I**0.5).to(dtype).to(DEVICE)
    weights = torch.rand(T, k, device=DEVICE)
    ids = torch.stack([torch.randperm(global_e)[:k] for _ in range(T)])
    ids[0] = torch.tensor([0, 2, 7])  # a token with no expert here: zeros
    ids[1] = torch.tensor([5, 1, 6])  # one with all of them here
    ids = ids.to(torch.int64).to(DEVICE)
    out = run(name, x, w1, w2, weights, ids, expert_map=expert_map.to(DEVICE))
    ref = reference(x, w1, w2, weights, ids, expert_map=expert_map)
    check(out, ref, dtype, f"{name} expert_map")
    assert out[0].abs().sum().item() == 0.0


def align_reference(ids, block, num_experts, expert_map):
    """vLLM's moe_align_block_size over the global ids, then each block's expert mapped."""
    flat = ids.flatten().tolist()
    numel = len(flat)
    sorted_ids, experts = [], []
    for e in range(num_experts):
        rows = [i for i, v in enumerate(flat) if v == e]
        padded = -(-len(rows) // block) * block
        sorted_ids += rows + [numel] * (padded - len(rows))
        experts += [e] * (padded // block)
    total = len(sorted_ids)
    max_blocks = -(-(numel + num_experts * (block - 1)) // block)
    experts += [0] * (max_blocks - len(experts))
    return sorted_ids, [int(expert_map[e]) for e in experts], total


def test_moe_align_block_size_with_an_expert_map():
    ids = torch.randint(0, 8, (9, 2), dtype=torch.int32)
    expert_map = torch.tensor([-1, 0, -1, 1, 2, -1, 3, -1], dtype=torch.int32)
    sorted_ids, expert_ids, post_pad = M.moe_align_block_size(ids.to(DEVICE), 4, 8, expert_map=expert_map.to(DEVICE))
    want_sorted, want_experts, total = align_reference(ids, 4, 8, expert_map)
    assert expert_ids.dtype == torch.int32
    assert post_pad.item() == total
    assert sorted_ids.cpu().tolist()[:total] == want_sorted
    assert expert_ids.cpu().tolist() == want_experts
    assert -1 in want_experts[: total // 4]


def test_bad_expert_maps():
    x = torch.zeros(2, H, device=DEVICE)
    w1, w2 = torch.zeros(4, 2 * I, H, device=DEVICE), torch.zeros(4, H, I, device=DEVICE)
    weights, ids = torch.ones(2, 1, device=DEVICE), torch.zeros(2, 1, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="fused_moe: expert_map must be int32 or int64"):
        M.fused_moe(x, w1, w2, weights, ids, expert_map=torch.zeros(8, device=DEVICE))
    with pytest.raises(ValueError, match="fused_moe: expert_map has 2 global experts, fewer than the 4"):
        M.fused_moe(x, w1, w2, weights, ids, expert_map=torch.zeros(2, dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="moe_align_block_size: expert_map must have num_experts = 8 entries"):
        M.moe_align_block_size(ids, 4, 8, expert_map=torch.zeros(4, dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="fused_moe: activation must be one of"):
        M.fused_moe(x, w1, w2, weights, ids, activation="gelu_tanh")


def test_expert_map_with_one_expert_a_token():
    """k = 1 through a grouped pair without the fused sum: its weighted rows are the output itself,
    and the rows of other ranks' experts must come out as zeros."""
    (name,) = [n for n in PAIRS if M.VARIANTS[n].kind == "grouped" and not M.VARIANTS[n].fuse_sum]
    T, global_e = 5, 6
    expert_map = torch.tensor([-1, 0, -1, 1, -1, -1], dtype=torch.int64)
    x = torch.randn(T, H).half().to(DEVICE)
    w1 = (torch.randn(2, 2 * I, H) / H**0.5).half().to(DEVICE)
    w2 = (torch.randn(2, H, I) / I**0.5).half().to(DEVICE)
    weights = torch.rand(T, 1, device=DEVICE)
    ids = torch.tensor([[1], [0], [3], [5], [3]], dtype=torch.int32).to(DEVICE)
    out = run(name, x, w1, w2, weights, ids, expert_map=expert_map.to(DEVICE))
    check(out, reference(x, w1, w2, weights, ids, expert_map=expert_map), torch.float16, f"{name} k=1")
    assert out[1].abs().sum().item() == 0.0 and out[3].abs().sum().item() == 0.0


@pytest.mark.skipif(DEVICE != "cpu", reason="ids are range-checked only where they are on the host")
@pytest.mark.parametrize("fp8", [False, True], ids=["fused_moe", "fused_moe_fp8"])
def test_routing_on_the_host_is_range_checked(fp8):
    """CPU routing is checked before any launch, on the call cache's replay as on the first call:
    an id past w1's experts, a negative one, an id past expert_map's global experts and a map
    entry past the local experts (the kernels would read out of bounds, or skip the row)."""
    E = 4
    x = torch.randn(3, H).half()
    w1, w2 = torch.randn(E, 2 * I, H).half(), torch.randn(E, H, I).half()
    kw = {}
    call = M.fused_moe
    if fp8:
        call = M.fused_moe_fp8
        w1, w2 = w1.to(torch.float8_e4m3fn), w2.to(torch.float8_e4m3fn)
        kw = dict(w1_scale=torch.ones(E), w2_scale=torch.ones(E))
    weights = torch.ones(3, 2)
    good = torch.tensor([[0, 1], [2, 3], [3, 0]], dtype=torch.int32)
    op = "fused_moe_fp8" if fp8 else "fused_moe"
    for _ in range(2):  # the second round replays the first good call's plan
        call(x, w1, w2, weights, good, hw="h200", **kw)
        for ids, where in (
            ([[0, 1], [2, 7], [3, 0]], "topk_ids\\[1, 1\\] = 7"),
            ([[0, -1], [2, 3], [3, 0]], "topk_ids\\[0, 1\\] = -1"),
        ):
            with pytest.raises(ValueError, match=f"{op}: {where} is not one of the experts of w1 and w2 \\(0 to 3\\)"):
                call(x, w1, w2, weights, torch.tensor(ids, dtype=torch.int32), hw="h200", **kw)
    emap = torch.tensor([-1, 0, 1, -1, 2, 3], dtype=torch.int64)
    call(x, w1, w2, weights, good + 2, hw="h200", expert_map=emap, **kw)
    with pytest.raises(
        ValueError, match=f"{op}: topk_ids\\[0, 0\\] = 6 is not one of expert_map's global experts \\(0 to 5\\)"
    ):
        call(x, w1, w2, weights, good + 6, hw="h200", expert_map=emap, **kw)
    bad_map = emap.clone()
    bad_map[4] = 4
    with pytest.raises(
        ValueError, match=f"{op}: expert_map\\[4\\] = 4 is neither an expert of w1 and w2 \\(0 to 3\\) nor -1"
    ):
        call(x, w1, w2, weights, good, hw="h200", expert_map=bad_map, **kw)
