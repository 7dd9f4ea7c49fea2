"""generated/moe.py: fused_moe on every kernel pair and every target's distinct policy, against a
float64 per-expert reference; moe_align_block_size and topk_softmax against plain references;
bucket selection; argument errors.

The kernel bodies and the host side are policy_runtime/moe/ops.py's (``rt``).  Without a GPU the
kernels run in Triton's interpreter (tests/conftest.py), in fp16 and fp32 (its bf16 arithmetic is
wrong); on a GPU every 16-bit case runs in bf16 too.  Sizes are small (H 64, I 48, E 8-16) so the
interpreter runs the file in well under a minute; T is ragged (1 to 300) and never a multiple of
a tile.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from generated import moe as M
from generated.dispatch import HARDWARE, dispatch_kernel_config
from kernel_cases import DEVICE, GPU, routing, seeded  # noqa: F401  (autouse fixture: a fixed seed per test)
from policy_runtime.moe import ops as rt

TOL = {torch.float16: 3e-3, torch.float32: 2e-5, torch.bfloat16: 2e-2}
H, I = 64, 48  # hidden, expert intermediate: ragged against every tile
# An expert intermediate size past 512 (h200's wide decode bucket), ragged against every tile.
WIDE_I = 520
# Past 4096 (Hopper's medium bucket stops there for wider experts, e.g. Mixtral's 14336): the
# medium_wide bucket's 16-bit kernel pairs run at this size.
VERY_WIDE_I = 4104


def dtypes_of(name):
    """fp32 kernels in fp32; 16-bit kernels in fp16, and in bf16 where a GPU does the math."""
    if "_fp32_" in name:
        return [torch.float32]
    return [torch.float16] + ([torch.bfloat16] if GPU else [])


def layer(T, k, E, dtype, *, ids=None, h=H, i=I):
    """Inputs of one MoE call: random activations and weights, random routing (``routing``)
    unless ``ids`` is given (then random weights)."""
    x = torch.randn(T, h).to(dtype).to(DEVICE)
    w1 = (torch.randn(E, 2 * i, h) / h**0.5).to(dtype).to(DEVICE)
    w2 = (torch.randn(E, h, i) / i**0.5).to(dtype).to(DEVICE)
    if ids is None:
        weights, ids = (t.to(DEVICE) for t in routing(T, E, k))
    else:
        ids = ids.to(DEVICE)
        weights = torch.rand(T, k, device=DEVICE)
    return x, w1, w2, weights, ids


def reference(x, w1, w2, weights, ids, activation="silu"):
    """float64, expert by expert: the rows routed to e through e's two GEMMs, weighted, summed."""
    x, w1, w2, weights, ids = (t.cpu() for t in (x, w1, w2, weights, ids))
    x, w1, w2, weights = x.double(), w1.double(), w2.double(), weights.double()
    inter = w2.shape[2]
    out = torch.zeros(x.shape, dtype=torch.float64)
    for e in ids.unique().tolist():
        t, j = (ids == e).nonzero(as_tuple=True)
        gu = x[t] @ w1[e].T
        g, u = gu[:, :inter], gu[:, inter:]
        act = g * torch.sigmoid(g) if activation == "silu" else torch.nn.functional.gelu(g)
        out.index_add_(0, t, weights[t, j, None] * ((act * u) @ w2[e].T))
    return out


def check(out, ref, dtype, what=""):
    assert out.dtype == dtype and out.shape == ref.shape
    got = out.double().cpu()
    assert not torch.isnan(got).any(), f"{what}: unwritten output elements"
    err = ((got - ref).norm() / ref.norm()).item()
    assert err < TOL[dtype], f"{what} {dtype}: relative error {err:.2e}"


def run_checked(inputs, *, variant=None, hw=None, activation="silu", what=""):
    """fused_moe into a NaN-filled out (every element must be written), against the reference."""
    x = inputs[0]
    out = torch.full(x.shape, float("nan"), dtype=x.dtype, device=DEVICE)
    if variant is None:
        got = M.fused_moe(*inputs, activation=activation, out=out, hw=hw)
    else:
        got = M._MOE.fused_moe(*inputs, activation, out, None, variant=variant)
    assert got is out
    check(out, reference(*inputs, activation=activation), x.dtype, what)
    return out


# ---------------------------------------------------------------------------------------
# Every kernel pair, whatever bucket it serves.


@pytest.mark.parametrize("name", sorted(M.VARIANTS))
def test_every_kernel_pair(name):
    """Each specialized pair once.  Its first bucket (FIRST_RUNS, below) must select it at that
    bucket's T and expert intermediate size; where that shape is small, the pair runs there
    through fused_moe(hw=target) (the policy's host path).  A last bucket's (past 512 tokens) or a
    wide one's (WIDE_I, VERY_WIDE_I) pair runs by ``variant`` at edge_shape's smaller shape with
    the same edges: the interpreter's time goes with the programs and K steps, which the bucket's
    own size multiplies without adding a mask.  The policy test checks the routing of every other
    bucket and target."""
    v = M.VARIANTS[name]
    variant, target, bucket_name, T, inter = FIRST_RUNS[name]
    for dtype in dtypes_of(name):
        bucket = M.select(T, inter, dtype=dtype, hw=target)
        assert (bucket.name, bucket.variant) == (bucket_name, v), (name, target, T, inter)
        what = f"{name}: {target} {bucket_name} T={T} I={inter}"
        if T <= 64 and inter == I:
            run_checked(layer(T, 2, 4, dtype, i=inter), hw=target, what=what)
            continue
        T_edge, inter_edge, ids = edge_shape(v, T, inter)
        what += f", run at T={T_edge} I={inter_edge}"
        run_checked(layer(T_edge, 2, 4, dtype, ids=ids, i=inter_edge), variant=v, what=what)


def edge_shape(v, T, inter):
    """A small (T, I, ids) with a large bucket's edges for pair ``v`` (top-2 of 4 experts).
    Grouped kernels: past 64 tokens, block_m + 5 tokens whose first slot is expert 0 (a full row
    block and a partial one), the second expert 1 for 7 tokens and expert 3 for the rest (partial
    blocks), expert 2 none (empty).  Past I: I = down_block_k + 8, so the down GEMM takes two K
    steps, the last partial (I mod down_block_k is 8 at WIDE_I and VERY_WIDE_I too: the same EVEN_K
    specialization), and the up GEMM several column tiles, the last partial."""
    inter_edge = v.down_block_k + 8 if inter > I else inter
    assert inter_edge % v.down_block_k == inter % v.down_block_k
    assert inter == inter_edge or inter_edge > v.block_n
    if v.kind != "grouped" or T <= 64:
        return T, inter_edge, None
    T_edge = v.block_m + 5
    ids = torch.stack([torch.zeros(T_edge, dtype=torch.int64), torch.where(torch.arange(T_edge) < 7, 1, 3)], 1)
    return T_edge, inter_edge, ids


@pytest.mark.parametrize("T, hw", [(2, "h200"), (9, "bi_v100")])
def test_results_repeat_bit_for_bit(T, hw):
    """The gemv and simt down kernels and the reduce sum a token's experts in a fixed order: two
    calls give the same bits (the atomics of a fused grouped bucket would not promise that)."""
    v = M.select(T, I, dtype=torch.float16, hw=hw).variant
    assert v.kind in ("gemv", "simt") or not v.fuse_sum
    inputs = layer(T, 3, 8, torch.float16)
    assert torch.equal(run_checked(inputs, hw=hw), run_checked(inputs, hw=hw))


def test_every_kernel_pair_serves_some_bucket_and_every_bucket_names_one():
    seen = set()
    for variant in M._POLICIES.values():
        for policy, _ in variant.values():
            for bucket in policy:
                assert M.VARIANTS[bucket.variant.name] is bucket.variant
                seen.add(bucket.variant.name)
    assert seen == set(M.VARIANTS)


# Body constant -> the Variant field the launcher reads it from (grids, alignment), per GEMM.
RECORD_FIELD_OF = {
    "up": {"BLOCK_M": "block_m", "BLOCK_N": "block_n", "BLOCK_K": "block_k", "GROUP_M": "group_m"},
    "down": {
        "BLOCK_M": "block_m",
        "BLOCK_N": "down_block_n",
        "BLOCK_K": "down_block_k",
        "GROUP_M": "group_m",
        "FUSE_SUM": "fuse_sum",
    },
}


def test_each_record_holds_the_constants_its_kernels_bake_in():
    for name, v in M.VARIANTS.items():
        for part, kernel in (("up", v.up), ("down", v.down)):
            body = f"{v.kind}_{part}_body"
            tree = ast.parse(inspect.getsource(kernel.fn))
            (call,) = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == body]
            # Baked-in constants (literals); PDL and KB are passed through from the launch.
            consts = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords if isinstance(kw.value, ast.Constant)}
            fields = RECORD_FIELD_OF[part]
            assert {"BLOCK_N", "BLOCK_K"} <= set(consts), name
            assert {c: consts[c] for c in consts if c in fields} == {
                c: getattr(v, fields[c]) for c in consts if c in fields
            }, (name, part)
            if "DOT_PREC" in consts:
                assert consts["DOT_PREC"] == ("ieee" if "_fp32_" in name else "tf32"), name
        assert v.name == name and v.up.fn.__module__ == M.__name__


def test_no_argument_that_varies_with_T_is_specialized_on():
    """The grouped kernels take T only through numel and the row-block bound, the alignment
    kernels through numel and the buffer sizes; gemv kernels take it only through the grid."""
    for v in M.VARIANTS.values():
        for kernel in (v.up, v.down):
            params = inspect.signature(kernel.fn).parameters
            if v.kind == "grouped":
                assert set(_do_not_specialize(kernel)) == {"numel", "num_m_blocks"} <= set(params)
            else:
                assert not {"T", "numel", "num_m_blocks"} & set(params)
    assert set(_do_not_specialize(rt._align_count)) == {"numel", "sort"}
    assert set(_do_not_specialize(rt._align_offsets)) == {"segments", "sort"}
    assert set(_do_not_specialize(rt._align_scatter)) == {"numel", "max_padded", "max_blocks", "segments", "sort"}
    assert set(_do_not_specialize(rt._topk_softmax_kernel)) == {"T"}


def _do_not_specialize(kernel):
    names = getattr(kernel, "kwargs", {}).get("do_not_specialize")  # the interpreter's function
    if names is None:
        names = kernel.do_not_specialize
    return [kernel.arg_names[n] if isinstance(n, int) else n for n in names or ()]


@pytest.mark.skipif(not GPU, reason="compiled kernels only on a GPU")
def test_a_new_T_in_a_compiled_bucket_compiles_nothing():
    for T_first, T_next in [(2, 3), (20, 29), (100, 300), (600, 1000)]:
        bucket = M.select(T_first, I, dtype=torch.bfloat16, hw="h200")
        assert M.select(T_next, I, dtype=torch.bfloat16, hw="h200") is bucket
        M.fused_moe(*layer(T_first, 8, 16, torch.bfloat16), hw="h200")
        kernels = [
            bucket.variant.up, bucket.variant.down, rt._align_count, rt._align_offsets, rt._align_scatter, rt.sum_rows
        ]
        before = [sum(len(c[0]) for c in k.device_caches.values()) for k in kernels]
        M.fused_moe(*layer(T_next, 8, 16, torch.bfloat16), hw="h200")
        assert [sum(len(c[0]) for c in k.device_caches.values()) for k in kernels] == before, bucket.name


# ---------------------------------------------------------------------------------------
# Chained launches (programmatic dependent launch, Hopper and later).


def _launches(T, hw, dtype=torch.float16):
    """(kernel name, constexpr PDL, launch_pdl) of each launch of topk_softmax + fused_moe, captured
    by warm-up's compile-only scope (nothing runs)."""
    from policy_runtime import launch

    seen = []
    inputs = layer(T, 4, 8, dtype, ids=torch.randint(0, 8, (T, 4), dtype=torch.int32))
    logits = torch.randn(T, 8, device=DEVICE)
    with launch.compile_only(lambda kernel, grid, args, kwargs: seen.append((kernel, kwargs))):
        M.topk_softmax(logits, 4, True)
        M.fused_moe(*inputs, hw=hw)
    return [(k.__name__, kw.get("PDL", kw.get("TRIGGER")), kw.get("launch_pdl", False)) for k, kw in seen]


def test_chained_buckets_launch_dependently_only_where_the_device_can(monkeypatch):
    """h200's decode bucket is chained: on a device with programmatic dependent launch the router
    lets its dependants start, and the up and down GEMMs are launched as dependants that wait on
    the device; where it has none (the interpreter, ROCm, before 9.0) the same kernels launch
    plainly.  An unchained bucket's GEMMs (the BI-V100's grouped ones) are never dependants."""
    from policy_runtime import launch

    v = M.select(1, I, dtype=torch.float16, hw="h200").variant
    assert v.kind == "simt" and v.chained
    up, down = v.up.__name__, v.down.__name__
    monkeypatch.setattr(launch, "programmatic", lambda t: False)
    assert _launches(1, "h200") == [("_topk_softmax_kernel", False, False), (up, False, False), (down, False, False)]
    monkeypatch.setattr(launch, "programmatic", lambda t: True)
    assert _launches(1, "h200") == [("_topk_softmax_kernel", True, False), (up, True, True), (down, True, True)]
    assert all(not pdl for name, _, pdl in _launches(1, "bi_v100") if name.startswith("_moe_"))


@pytest.mark.parametrize("hw", ["h200", "bi_v100"])
def test_grouped_calls_chain_the_alignment_and_the_reduce(hw, monkeypatch):
    """A grouped bucket's call on a device with programmatic dependent launch: the alignment's
    three launches and the reduce are links of one chain (the first dependent on the router), the GEMMs
    plain launches that release the next one early (as fused_moe_fp8's); without it every launch
    is plain, PDL off.  The alignment entry point chains its three launches the same way."""
    from policy_runtime import launch

    T = 33
    assert M.select(T, I, dtype=torch.float16, hw=hw).variant.kind == "grouped"
    monkeypatch.setattr(launch, "programmatic", lambda t: True)
    links = _launches(T, hw)[1:]  # after the router
    names = [name for name, _, _ in links]
    assert names[:3] == ["_align_count", "_align_offsets", "_align_scatter"] and names[-1] == "sum_rows"
    assert [name.startswith("_moe_") for name in names] == [False] * 3 + [True] * 2 + [False], names
    expect = [(True, True), (True, True), (True, True), (True, False), (True, False), (True, True)]
    assert [link[1:] for link in links] == expect
    seen = []
    with launch.compile_only(lambda kernel, grid, args, kwargs: seen.append(kwargs)):
        M.moe_align_block_size(torch.randint(0, 8, (T, 4), dtype=torch.int32, device=DEVICE), 16, 8)
    assert [(kw["PDL"], kw.get("launch_pdl", False)) for kw in seen] == expect[:3]
    monkeypatch.setattr(launch, "programmatic", lambda t: False)
    assert all(link[1:] == (False, False) for link in _launches(T, hw))


def test_programmatic_launch_is_asked_only_of_nvidia_devices_from_9_0(monkeypatch):
    """launch.programmatic: a CPU tensor never; a device tensor where the device says 9.0 or later,
    not under the interpreter, and not on ROCm (whose torch reports a gfx number as the capability)."""
    from types import SimpleNamespace

    from policy_runtime import launch

    assert not launch.programmatic(torch.zeros(1))
    device = SimpleNamespace(is_cuda=True, get_device=lambda: 0)
    monkeypatch.setattr(launch, "INTERPRET", False)
    monkeypatch.setattr(torch.version, "hip", None)
    try:
        for capability, expected in (((8, 9), False), ((9, 0), True), ((12, 1), True)):
            monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index, c=capability: c)
            launch._pdl_device.cache_clear()
            assert launch.programmatic(device) is expected, capability
        monkeypatch.setattr(torch.version, "hip", "6.4")
        assert not launch.programmatic(device)
        monkeypatch.setattr(torch.version, "hip", None)
        monkeypatch.setattr(launch, "INTERPRET", True)
        assert not launch.programmatic(device)
    finally:
        launch._pdl_device.cache_clear()  # the real device's answer, asked again on its next use


@pytest.mark.skipif(not GPU, reason="programmatic dependent launch and CUDA graphs only on a GPU")
def test_chained_decode_replays_from_a_cuda_graph():
    """The chained decode layer (router included) captured once, replayed on new inputs: each
    replay recomputes the right output (the dependencies captured as programmatic edges)."""
    from policy_runtime.timing import captured

    x, w1, w2, _, _ = layer(3, 8, 16, torch.bfloat16)
    logits = torch.randn(3, 16, device=DEVICE)
    out = torch.empty_like(x)

    def step():
        weights, ids = M.topk_softmax(logits, 8, True)
        return M.fused_moe(x, w1, w2, weights, ids, out=out, hw="h200")

    graph, _ = captured(step)
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        logits.copy_(torch.randn_like(logits))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        weights, ids = M.topk_softmax(logits, 8, True)
        check(out, reference(x, w1, w2, weights, ids), torch.bfloat16, "graph replay")


@pytest.mark.skipif(not GPU, reason="programmatic dependent launch and CUDA graphs only on a GPU")
def test_grouped_chain_gives_plain_launches_results_eagerly_and_in_a_graph(monkeypatch):
    """The grouped buckets' calls with the alignment and the reduce chained (Hopper and later)
    against plain launches: the same output, eager and replayed from a CUDA graph on new
    routing, three calls back to back (bit for bit where the down GEMM writes rows; within a
    rounding where its sum is fp32 atomics, whose order varies).  moe_align_block_size the same."""
    from policy_runtime import call_cache
    from policy_runtime import launch
    from policy_runtime.timing import captured

    if not launch.programmatic(torch.zeros(1, device=DEVICE)):
        pytest.skip("the device has no programmatic dependent launch (NVIDIA 9.0 and later)")
    real = launch.programmatic
    for T in (3, 33, 300, 2048):
        bucket = M.select(T, I, dtype=torch.bfloat16, hw="h200")
        if bucket.variant.kind != "grouped":
            continue
        x, w1, w2, _, _ = layer(T, 4, 16, torch.bfloat16)
        routes = [routing(T, 16, 4) for _ in range(3)]
        routes = [(w.to(DEVICE), i.to(DEVICE)) for w, i in routes]
        outs = {}
        for mode in ("plain", "chain"):
            monkeypatch.setattr(launch, "programmatic", real if mode == "chain" else (lambda t: False))
            call_cache.clear_all()
            got = [M.fused_moe(x, w1, w2, w, i, hw="h200") for w, i in routes]
            got += [M.moe_align_block_size(i, 16, 16)[0] for _, i in routes]
            weights, ids = routes[0][0].clone(), routes[0][1].clone()
            graph, out = captured(lambda: M.fused_moe(x, w1, w2, weights, ids, hw="h200"))
            for w, i in routes[1:]:
                weights.copy_(w)
                ids.copy_(i)
                graph.replay()
                got.append(out.clone())
            torch.cuda.synchronize()
            outs[mode] = got
        same = torch.equal if not bucket.variant.fuse_sum else (
            lambda a, b: torch.allclose(a.float(), b.float(), rtol=1e-2, atol=1e-3))
        for n, (a, b) in enumerate(zip(outs["plain"], outs["chain"])):
            assert (torch.equal if 3 <= n < 6 else same)(a, b), (T, bucket.name, n)
        for n in (1, 2):  # each replay is the eager call on its routing
            assert same(outs["chain"][n], outs["chain"][n + 5]), (T, bucket.name, n)
    monkeypatch.setattr(launch, "programmatic", real)
    call_cache.clear_all()


# ---------------------------------------------------------------------------------------
# Every target's distinct policy (targets with equal policies share one; each runs once).


def distinct_policies():
    """(variant, targets, policy) per distinct instantiation."""
    out = []
    for variant, table in sorted(M._POLICIES.items()):
        groups: dict[int, list[str]] = {}
        for target, (policy, _) in sorted(table.items()):
            groups.setdefault(id(policy), []).append(target)
        for targets in groups.values():
            out.append(pytest.param(variant, targets, id=f"{variant}-{'+'.join(targets)}"))
    return out


def bucket_shapes(policy, select):
    """One (T, I) inside each bucket: I the first of I, WIDE_I and VERY_WIDE_I at which some T up
    to 600 reaches the bucket, T the smallest such (plus 2 where that stays inside the bucket, so
    it is ragged)."""
    out = []
    for bucket in policy:
        for inter in (I, WIDE_I, VERY_WIDE_I):
            ts = [t for t in range(1, 601) if select(t, inter) is bucket]
            if ts:
                out.append((ts[0] + 2 if ts[0] + 2 in ts else ts[0], inter))
                break
        else:
            raise AssertionError(f"no shape reaches bucket {bucket.name}")
    return out


DISTINCT_POLICIES = distinct_policies()


def first_runs() -> dict[str, tuple[str, str, str, int, int]]:
    """Kernel pair -> (variant, first target, bucket, T, I) of the first bucket, in the order of
    DISTINCT_POLICIES, that serves it: test_every_kernel_pair runs each pair there, once."""
    out: dict[str, tuple[str, str, str, int, int]] = {}
    for param in DISTINCT_POLICIES:
        variant, targets = param.values
        policy, select = M._POLICIES[variant][targets[0]]
        for (T, inter), bucket in zip(bucket_shapes(policy, select), policy):
            out.setdefault(bucket.variant.name, (variant, targets[0], bucket.name, T, inter))
    return out


FIRST_RUNS = first_runs()


@pytest.mark.parametrize("variant, targets", DISTINCT_POLICIES)
def test_every_distinct_policy_through_fused_moe(variant, targets):
    """Each bucket's shape routes to it on every target of the group (one policy for all), and its
    kernel pair runs through fused_moe(hw=target) at such a shape (test_every_kernel_pair, each
    pair once: a last bucket's past 512 tokens, a wide bucket's at an intermediate size past 512)."""
    table = M._POLICIES[variant]
    policy, select = table[targets[0]]
    assert all(table[t][0] is policy for t in targets)
    dtype = torch.float32 if variant.endswith("fp32") else torch.float16
    for (T, inter), bucket in zip(bucket_shapes(policy, select), policy):
        for target in targets:
            assert M.select(T, inter, dtype=dtype, hw=target) is bucket, (target, bucket.name, T, inter)
        assert bucket.variant.name in FIRST_RUNS


def test_bucket_selection_on_the_h200():
    Ts = (1, 2, 4, 5, 32, 33, 512, 513, 16384)
    names = [M.select(T, 512, dtype=torch.bfloat16, hw="h200").name for T in Ts]
    assert names == ["decode_one", "decode", "decode", "small", "small", "medium", "medium", "prefill", "prefill"]
    # The expert's shape: past 512 intermediate columns one token takes the wide decode bucket;
    # every other bucket is the same at both sizes.
    wide = [M.select(T, 768, dtype=torch.bfloat16, hw="h200").name for T in Ts]
    assert wide == ["decode_one_wide"] + names[1:]
    assert M.select(1, 513, hw="h200").name == "decode_one_wide"
    # Experts past 4096 columns (Mixtral's 14336) take vLLM's H200 tiles for 8 x 14336 at 128
    # tokens up to 128 (16-bit; fp32 keeps medium's), then the prefill tiles.
    mixtral = [M.select(T, 14336, dtype=torch.bfloat16, hw="h200") for T in (33, 128, 129, 512, 513)]
    assert [b.name for b in mixtral] == ["medium_wide", "medium_wide", "prefill", "prefill", "prefill"]
    wide = mixtral[0].variant
    assert (wide.block_m, wide.block_n, wide.block_k, wide.num_warps) == (64, 64, 128, 8)
    fp32_wide = M.select(33, 14336, dtype=torch.float32, hw="h200").variant
    assert fp32_wide is M.select(33, 512, dtype=torch.float32, hw="h200").variant
    assert M.select(512, 4096, dtype=torch.bfloat16, hw="h200").name == "medium"
    one, one_wide, few = (M.select(T, i, hw="h200").variant for T, i in ((1, 512), (1, 768), (4, 768)))
    assert len({one.name, one_wide.name, few.name}) == 3
    assert (one_wide.block_k, one_wide.down_block_k, one_wide.down_num_warps) == (256, 256, 8)
    assert (few.num_warps, few.block_k) == (2, 256)
    assert all(v.kind == "simt" and v.chained for v in (one, one_wide, few))
    assert M.select(1, I, hw="a100").variant.kind == "gemv"
    # nvidia>=90's small bucket sums by atomics; h200's own policy (codegen tune's amend of the
    # small bucket, specs/kernels/moe.toml) took a reduce there, and kept the rest.
    assert (M.select(16, I, hw="h100").variant.kind, M.select(16, I, hw="h100").variant.fuse_sum) == ("grouped", True)
    small = M.select(16, I, hw="h200").variant
    assert (small.kind, small.fuse_sum, small.block_n) == ("grouped", False, 32)
    assert not M.select(4096, I, hw="h200").variant.fuse_sum
    for T, inter in ((1, 512), (1, 768), (3, 768), (64, I), (4096, I)):
        assert M.select(T, inter, hw="h100").variant is M.select(T, inter, hw="h200").variant


def test_bi_v100_keeps_the_seed_tiles():
    """The seed's MoEConfig on the BI-V100 (32-row tiles while top_k x tokens < 64 at top-8, 64
    after; 64x32 B tiles in groups of 8) is what its kernels use, one stage (no async copy)."""
    seed = dispatch_kernel_config("moe", "bi_v100")
    assert (seed.block_size_m, seed.block_size_n, seed.block_size_k, seed.group_size_m) == (32, 64, 32, 8)
    for dtype in (torch.float16, torch.float32):
        decode, rest = (
            M.select(7, I, dtype=dtype, hw="bi_v100").variant,
            M.select(8, I, dtype=dtype, hw="bi_v100").variant,
        )
        assert decode.block_m == seed.block_size_m and rest.block_m == 64
        for v in (decode, rest):
            assert (v.kind, v.block_n, v.block_k, v.group_m, v.num_stages) == ("grouped", 64, 32, 8, 1)


# ---------------------------------------------------------------------------------------
# Routings: ragged T, k, experts without tokens, all tokens on one expert.


# One T in each of the h200 policy's buckets (decode_one, decode, small), and the medium bucket's
# kernel at its first T and at several tiles an expert (140 x top-8 of 16 experts: about 70 rows
# each, two full 32-row tiles and a partial one).
@pytest.mark.parametrize("T", [1, 2, 7, 33, 140])
def test_ragged_token_counts_on_the_h200_policy(T):
    for dtype in [torch.float16] + ([torch.bfloat16] if GPU else []):
        run_checked(layer(T, 8, 16, dtype), hw="h200", what=f"T={T}")


@pytest.mark.parametrize("k", [1, 2, 8])
def test_top_k(k):
    for hw, T in (("h200", 3), ("h200", 45)) + ((("bi_v100", 20),) if k == 8 else ()):
        run_checked(layer(T, k, 8, torch.float16), hw=hw, what=f"{hw} k={k} T={T}")


@pytest.mark.parametrize("hw, T", [("h200", 3), ("h200", 20), ("h200", 100), ("h200", 520), ("mi300x", 40)])
def test_experts_without_tokens(hw, T):
    """16 experts, tokens routed to 3 of them: the others get no block and no work, and
    their weights are never read (NaN there would show)."""
    E, used = 16, torch.tensor([3, 11, 12])
    ids = used[torch.randint(0, 3, (T, 2))]
    x, w1, w2, weights, ids = layer(T, 2, E, torch.float16, ids=ids)
    unused = torch.ones(E, dtype=torch.bool)
    unused[used] = False
    w1[unused.to(DEVICE)] = float("nan")
    w2[unused.to(DEVICE)] = float("nan")
    run_checked((x, w1, w2, weights, ids), hw=hw, what=f"{hw} T={T}")
    for block in (16, 128):
        _, expert_ids, post_pad = M.moe_align_block_size(ids, block, E)
        counts = torch.bincount(ids.flatten().cpu(), minlength=E)
        assert post_pad.item() == sum(-(-c // block) * block for c in counts.tolist())
        blocks = post_pad.item() // block
        assert set(expert_ids[:blocks].tolist()) == {3, 11, 12} & set(ids.flatten().tolist())


@pytest.mark.parametrize("hw, T", [("h200", 4), ("h200", 30), ("h200", 250), ("h200", 520), ("bi_v100", 70)])
def test_all_tokens_on_one_expert(hw, T):
    ids = torch.full((T, 1), 5)
    run_checked(layer(T, 1, 8, torch.float16, ids=ids), hw=hw, what=f"{hw} T={T} k=1")
    if T in (30, 70):
        ids = torch.stack([torch.full((T,), 5), torch.randint(0, 8, (T,))], 1)  # slot 0 always expert 5
        run_checked(layer(T, 2, 8, torch.float16, ids=ids), hw=hw, what=f"{hw} T={T} k=2")


@pytest.mark.parametrize("hw, T", [("h200", 2), ("h200", 21), ("a10", 77)])
def test_gelu(hw, T):
    run_checked(layer(T, 2, 8, torch.float32), hw=hw, activation="gelu", what=f"{hw} gelu T={T}")


def test_strided_inputs_int64_ids_and_any_float_weights():
    """Views are used as they are: hidden_states with a row stride, w1 stored column-major per
    expert; int64 ids and bf16 routing weights are read as they come."""
    T, k, E = 19, 2, 8
    x, w1, w2, weights, ids = layer(T, k, E, torch.float32)
    wide = torch.randn(T, H + 7, device=DEVICE)[:, 3 : 3 + H]
    wide.copy_(x)
    w1_t = w1.transpose(1, 2).contiguous().transpose(1, 2)  # same values, other strides
    weights = weights.to(torch.bfloat16)
    for hw, T_ in (("h200", 3), ("h200", T), ("bi_v100", T)):
        args = (wide[:T_], w1_t, w2, weights[:T_], ids[:T_].long())
        run_checked(args, hw=hw, what=f"{hw} strided T={T_}")


def test_out_is_written_in_place_and_T_zero_is_empty():
    x, w1, w2, weights, ids = layer(5, 2, 8, torch.float16)
    out = torch.empty(9, H, dtype=torch.float16, device=DEVICE)[2:7]
    assert M.fused_moe(x, w1, w2, weights, ids, out=out, hw="h200") is out
    check(out, reference(x, w1, w2, weights, ids), torch.float16)
    empty = M.fused_moe(x[:0], w1, w2, weights[:0], ids[:0], hw="h200")
    assert empty.shape == (0, H)


# ---------------------------------------------------------------------------------------
# moe_align_block_size and topk_softmax against plain references.


def align_reference(ids, block, E):
    flat = ids.flatten().long().cpu()
    numel = flat.numel()
    rows = torch.sort(flat, stable=True).indices.tolist()  # by expert, in order within one
    counts = torch.bincount(flat, minlength=E).tolist()
    sorted_ids, expert_ids, at = [], [], 0
    for e in range(E):
        padded = -(-counts[e] // block) * block
        sorted_ids += rows[at : at + counts[e]] + [numel] * (padded - counts[e])
        expert_ids += [e] * (padded // block)
        at += counts[e]
    total = len(sorted_ids)
    max_padded = numel + E * (block - 1)
    sorted_ids += [numel] * (max_padded - total)
    expert_ids += [0] * (-(-max_padded // block) - len(expert_ids))
    return sorted_ids, expert_ids, total


@pytest.mark.parametrize(
    "T, k, E, block, dtype",
    [
        (1, 1, 8, 16, torch.int32),
        (3, 2, 5, 1, torch.int64),  # block 1: no padding; 5 experts: not a power of two
        (37, 8, 64, 16, torch.int32),  # most experts empty
        (300, 8, 8, 64, torch.int64),  # 2400 ids: three segments, the last partial
        (13, 2, 40, 7, torch.int32),  # odd block, more experts than rows
        (50, 1, 4, 128, torch.int32),  # block larger than any expert's rows
    ],
)
@pytest.mark.parametrize("how", ["scan", "sort"])
def test_moe_align_block_size_matches_the_reference(monkeypatch, T, k, E, block, dtype, how):
    _align_by(monkeypatch, how)
    ids = torch.randint(0, E, (T, k), dtype=dtype)
    if E >= 8:
        ids[ids == 3] = 4  # expert 3 never routed to
    sorted_ids, expert_ids, post_pad = M.moe_align_block_size(ids.to(DEVICE), block, E)
    want_sorted, want_experts, total = align_reference(ids, block, E)
    assert sorted_ids.dtype == expert_ids.dtype == post_pad.dtype == torch.int32
    assert sorted_ids.cpu().tolist() == want_sorted
    assert expert_ids.cpu().tolist() == want_experts
    assert post_pad.cpu().tolist() == [total]


@pytest.mark.parametrize(
    "T, k, E, block",
    [
        (40, 8, 8, 16),  # 320 ids: 5 segments of 64, prefix tiles of 2 segments (the last partial)
        (33, 6, 20, 7),  # 198 ids: 4 segments, a tile each; an odd block
        (5, 1, 3, 4),  # one segment, fewer ids than a block
    ],
)
@pytest.mark.parametrize("how", ["scan", "sort"])
def test_moe_align_block_size_over_many_segments(monkeypatch, T, k, E, block, how):
    """Short segments and prefix tiles (the constants are the kernels' constexprs), so that the
    ids of one expert span many segments and the prefix sums loop: segment s's rows of an expert
    follow those of the segments before it."""
    _align_by(monkeypatch, how)
    monkeypatch.setattr(rt, "_ALIGN_BLOCK", 64)
    monkeypatch.setattr(rt, "_ALIGN_TILE", 16)
    ids = torch.randint(0, E, (T, k), dtype=torch.int32)
    sorted_ids, expert_ids, post_pad = M.moe_align_block_size(ids.to(DEVICE), block, E)
    want_sorted, want_experts, total = align_reference(ids, block, E)
    assert sorted_ids.cpu().tolist() == want_sorted
    assert expert_ids.cpu().tolist() == want_experts
    assert post_pad.cpu().tolist() == [total]


def _align_by(monkeypatch, how):
    # Both ways of aligning (rt._ALIGN_SORT_FROM: ids x experts from which a segment is sorted).
    monkeypatch.setattr(rt, "_ALIGN_SORT_FROM", 0 if how == "sort" else 2**62)


def test_moe_align_block_size_sorts_segments_from_the_crossover():
    """The scan's grid is (experts, segments), the sort's one program a segment (then one an
    expert, padding); the sort from rt._ALIGN_SORT_FROM ids x experts."""
    from policy_runtime import launch

    grids = {}
    for T in (rt._ALIGN_SORT_FROM // (8 * 64) - 1, rt._ALIGN_SORT_FROM // (8 * 64)):
        seen = []
        with launch.compile_only(lambda kernel, grid, args, kwargs: seen.append((kernel.__name__, tuple(grid)))):
            M.moe_align_block_size(torch.zeros(T, 8, dtype=torch.int32, device=DEVICE), 16, 64)
        grids[T] = seen
    (small, small_grids), (large, large_grids) = grids.items()
    seg = [-(-small * 8 // rt._ALIGN_BLOCK), -(-large * 8 // rt._ALIGN_BLOCK)]
    assert small_grids == [("_align_count", (64, seg[0])), ("_align_offsets", (1,)), ("_align_scatter", (64, seg[0]))]
    assert large_grids == [("_align_count", (seg[1],)), ("_align_offsets", (1,)), ("_align_scatter", (seg[1] + 64,))]


_COMPILE_FOR_HOPPER = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from policy_runtime.moe import ops as rt

constexprs = {"BLOCK": rt._ALIGN_BLOCK, "BINS": 256, "E_BLOCK": 128, "S_BLOCK": 32, "PDL": True}
for kernel in (rt._align_count, rt._align_offsets, rt._align_scatter):
    sig = {n: "constexpr" if n in constexprs else "*i32" if n.endswith("_ptr") else "i32" for n in kernel.arg_names}
    consts = {n: v for n, v in constexprs.items() if n in kernel.arg_names}
    compiled = triton.compile(ASTSource(fn=kernel, signature=sig, constexprs=consts), target=GPUTarget("cuda", 90, 32))
    assert "ptx" in compiled.asm, kernel
    print("compiled", kernel.__name__)
"""


@pytest.mark.skipif(GPU, reason="the GPU tests compile and run them")
def test_alignment_kernels_compile_for_hopper():
    """The interpreter runs a kernel's Python; it does not type-check it as the compiler does (a
    name bound to a tensor in one branch and a scalar in the other compiles nowhere).  The three
    alignment kernels, whose branches are runtime ones, compiled for sm_90 by the CPU's Triton
    (its bundled ptxas), in a process without the interpreter."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parent.parent
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", _COMPILE_FOR_HOPPER], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[:3] == [f"compiled {n}" for n in ("_align_count", "_align_offsets", "_align_scatter")]


def test_moe_align_block_size_on_vllm_docstring_example():
    ids = torch.tensor([[2, 3, 4], [1, 2, 4], [1, 3, 4], [1, 2, 3]], device=DEVICE)
    sorted_ids, expert_ids, post_pad = M.moe_align_block_size(ids - 1, 4, 4)  # experts 0-3 here
    assert sorted_ids[:16].tolist() == [3, 6, 9, 12, 0, 4, 10, 12, 1, 7, 11, 12, 2, 5, 8, 12]
    assert expert_ids[:4].tolist() == [0, 1, 2, 3] and post_pad.item() == 16


# fp16 logits (whose values repeat: ties) at every size, fp32 at the small ones (the dtype changes
# only the load; the interpreter's time goes with E).
@pytest.mark.parametrize(
    "E, k, dtype",
    [(8, 1, torch.float16), (8, 1, torch.float32), (8, 2, torch.float16), (8, 2, torch.float32)]
    + [(60, 8, torch.float16), (128, 8, torch.float16)],
    ids=["8-1-fp16", "8-1-fp32", "8-2-fp16", "8-2-fp32", "60-8-fp16", "128-8-fp16"],
)
# A token a program up to rt.TOPK_ONE_ROW_MAX_T tokens (3: several programs), tiles of several
# tokens above (70: two or three tiles, the last partial).
@pytest.mark.parametrize("T", [3, 70])
def test_topk_softmax_matches_torch(E, k, dtype, T):
    assert (T <= rt.TOPK_ONE_ROW_MAX_T) == (T == 3)
    logits = torch.randn(T, E).to(dtype)
    probs = torch.softmax(logits.double(), dim=-1)
    # Largest first, the lowest expert first among equal probabilities (fp16 logits repeat).
    want_w, want_i = (t[:, :k] for t in torch.sort(probs, dim=-1, descending=True, stable=True))
    # Both renormalize flags at 8 experts (both paths); one each at the interpreter's slow sizes.
    for renormalize in (False, True) if E == 8 else (E == 128,):
        weights, ids = M.topk_softmax(logits.to(DEVICE), k, renormalize)
        assert weights.dtype == torch.float32 and ids.dtype == torch.int32 and weights.shape == (T, k)
        assert torch.equal(ids.cpu().long(), want_i)
        expect = want_w / want_w.sum(-1, keepdim=True) if renormalize else want_w
        torch.testing.assert_close(weights.cpu().double(), expect, rtol=1e-5, atol=1e-6)


def test_topk_softmax_at_256_experts():
    # Qwen3.6's router: a decode token's program has two warps from 256 experts on (a warp per 128),
    # where the one-pass top-k merges across warps; a few tokens keep the interpreter quick.
    logits = torch.randn(5, 256)
    probs = torch.softmax(logits.double(), dim=-1)
    want_w, want_i = (t[:, :8] for t in torch.sort(probs, dim=-1, descending=True, stable=True))
    weights, ids = M.topk_softmax(logits.to(DEVICE), 8, True)
    assert torch.equal(ids.cpu().long(), want_i)
    torch.testing.assert_close(weights.cpu().double(), want_w / want_w.sum(-1, keepdim=True), rtol=1e-5, atol=1e-6)


def test_topk_softmax_breaks_ties_toward_the_lowest_expert():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0], [0.0, 0.0, 0.0, 0.0, 0.0]], device=DEVICE)
    weights, ids = M.topk_softmax(logits, 3, False)
    assert ids.tolist() == [[1, 2, 4], [0, 1, 2]]
    assert torch.allclose(weights[1].cpu(), torch.full((3,), 0.2))


# ---------------------------------------------------------------------------------------
# Bad calls: ValueError naming the argument.


def _good():
    return dict(zip(("hidden_states", "w1", "w2", "topk_weights", "topk_ids"), layer(3, 2, 4, torch.float32)))


BAD_CALLS = [
    ("hidden_states", lambda a: a.update(hidden_states=a["hidden_states"][0])),
    ("hidden_states", lambda a: a.update(hidden_states=a["hidden_states"].to(torch.int32))),
    ("hidden_states", lambda a: a.update(hidden_states=a["hidden_states"].tolist())),
    ("w1", lambda a: a.update(w1=a["w1"][:, :, :-1])),
    ("w1", lambda a: a.update(w1=a["w1"][:, :-1])),
    ("w1", lambda a: a.update(w1=a["w1"].half())),
    ("w2", lambda a: a.update(w2=a["w2"][:, :, :-1])),
    ("w2", lambda a: a.update(w2=a["w2"][:-1])),
    ("topk_weights", lambda a: a.update(topk_weights=a["topk_weights"][:-1])),
    ("topk_weights", lambda a: a.update(topk_weights=a["topk_weights"].long())),
    ("topk_ids", lambda a: a.update(topk_ids=a["topk_ids"][:, :1])),
    ("topk_ids", lambda a: a.update(topk_ids=a["topk_ids"].float())),
    ("activation", lambda a: a.update(activation="relu")),
    ("out", lambda a: a.update(out=torch.empty(3, H + 1, device=DEVICE))),
    ("out", lambda a: a.update(out=torch.empty(3, H, dtype=torch.float16, device=DEVICE))),
    ("out", lambda a: a.update(out=torch.empty(H, 3, device=DEVICE).T)),
    ("requires grad", lambda a: a.update(w2=a["w2"].clone().requires_grad_())),
]


@pytest.mark.parametrize("name, spoil", BAD_CALLS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(BAD_CALLS)])
def test_bad_fused_moe_calls_raise_value_error_naming_the_argument(name, spoil):
    args = _good()
    spoil(args)
    with pytest.raises(ValueError, match=name):
        M.fused_moe(**args, hw="h200")


@pytest.mark.skipif(GPU, reason="on a GPU machine CPU tensors are not the point")
def test_cpu_tensors_need_the_interpreter(monkeypatch):
    args = _good()
    monkeypatch.setattr(rt._launch, "INTERPRET", False)
    with pytest.raises(ValueError, match="hidden_states must be a CUDA tensor"):
        M.fused_moe(**args, hw="h200")


def test_bad_align_and_topk_calls():
    ids = torch.zeros(4, 2, dtype=torch.int32, device=DEVICE)
    for args, name in [
        ((ids.float(), 16, 8), "topk_ids"),
        ((ids, 0, 8), "block_size_m"),
        ((ids, 16.0, 8), "block_size_m"),
        ((ids, 16, 0), "num_experts"),
        ((ids, 16, 10**6), "num_experts"),
    ]:
        with pytest.raises(ValueError, match=name):
            M.moe_align_block_size(*args)
    logits = torch.randn(4, 8, device=DEVICE)
    for args, name in [
        ((logits[0], 2, True), "gating_logits"),
        ((logits.long(), 2, True), "gating_logits"),
        ((logits, 0, True), "k"),
        ((logits, 9, True), "k"),
        ((logits, 2, 1), "renormalize"),
    ]:
        with pytest.raises(ValueError, match=name):
            M.topk_softmax(*args)


def test_unknown_hw_is_a_key_error():
    with pytest.raises(KeyError):
        M.fused_moe(**_good(), hw="no_such_part")


def test_every_target_has_a_policy_for_both_dtype_classes():
    for variant in ("moe_launch_16bit", "moe_launch_fp32"):
        assert sorted(M._POLICIES[variant]) == sorted(HARDWARE)
    assert dataclasses.is_dataclass(M.VARIANTS[next(iter(M.VARIANTS))])


def test_the_build_rejects_moe_tiles_a_target_cannot_hold(project):
    """moe_launch's checks run on every instantiation at build: more stages than the H200's shared
    memory holds, a gemv bucket told not to sum in its down kernel or to chain its launches, or a
    simt bucket given more stages than shared memory holds or a down chunk too large for the
    registers, fail the build
    (exit 2, nothing written) with the file, the policy and the figures."""
    for needed in ("jinja2", "pydantic", "black"):  # the compiler's (a GPU box may run kernels only)
        pytest.importorskip(needed)
    from conftest import run_cli, snapshot

    spec = project / "specs/kernels/moe.toml"
    text = spec.read_text()
    prefill = text.index('name = "prefill"\nnote = "vLLM\'s H200 tiles for 8 x 14336')
    text = text[:prefill] + text[prefill:].replace("num_warps = 8", "num_warps = 8\nnum_stages = 6", 1)
    gemv = text.index('name = "decode"\nt_max = 4\nkernel = "gemv"')
    text = text[:gemv] + text[gemv:].replace('kernel = "gemv"', 'kernel = "gemv"\nfuse_sum = false\nchained = true', 1)
    simt = text.index('name = "decode_one"\nnote = "One token, up to 512')
    text = text[:simt] + text[simt:].replace("num_stages = 3", "num_stages = 16", 1)
    text = text[:simt] + text[simt:].replace("down_block_size_n = 4", "down_block_size_n = 16", 1)
    spec.write_text(text)
    before = snapshot(project / "generated")
    result = run_cli("--root", str(project), "build")
    assert result.code == 2, result.err
    # 6 x (128 + 2 x 128) x 64 x 2 B on the H200 (227 KB opt-in).
    assert (
        "6 stages of 128x64 A and two 64x128 B tiles need 294,912 B of shared memory per block; h200 allows 232,448 B"
        in result.err
    )
    assert (
        "fails check 'the gemv down kernel sums a token's experts itself'" in result.err and "nvidia>=80" in result.err
    )
    # 15 ring steps of two 8 x 512 slabs and the row, 2 B each; the down ring: one step of 16
    # experts' 17 x 256 chunks.
    assert (
        "16 stages of the up GEMM's two 8x512 slabs need 261,120 B of shared memory per block, 2 of the down"
        " GEMM's 16x256 chunks of up to 16 experts 139,264 B; h200 allows 232,448 B" in result.err
    )
    # 16 rows x 256 columns of each expert over 8 warps: 16 weights a thread, twice the limit.
    assert "the simt down GEMM's 16x256 chunk of each expert's rows takes 16 weights a thread at 8 warps" in result.err
    assert "chained (programmatic dependent launch) is built for the simt kernels" in result.err
    assert "got kernel gemv on a100" in result.err
    assert "specs/kernels/moe.toml" in result.err and "nvidia>=90" in result.err
    assert snapshot(project / "generated") == before
