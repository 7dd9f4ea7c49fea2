"""generated/moe.py's fused_moe_fp8 (w8a8 e4m3fn, vLLM's fused_experts(use_fp8_w8a8=True)).

Without a GPU the kernels run in Triton's interpreter, which loads e4m3 tensors and computes their
dots in fp32 (fp16 and fp32 outputs here; bf16 on the GPU: tests/test_moe_fp8_gpu.py).  Its
float-to-fp8 cast rounds wrongly where a mantissa carries into the exponent, so the kernels round
to the e4m3 grid in fp32 first (``_e4m3_round``): ``test_quantize_rounds_as_torch`` holds that
rounding to torch's cast, ties and subnormals included.

Accuracy, two ways:

- tight: against float64 on the dequantized inputs, the activations quantized as the call does
  (per tensor static or amax / 448, or per token and 128-group) and the intermediate rounded to the
  output dtype and quantized likewise.  Measured 2-4e-4 (relative Frobenius norm) at fp16 output:
  the output's rounding.  ``TIGHT`` holds 2e-3 (fp16), 1e-4 (fp32).
- the quantization error: against fused_moe (fp16) on the original, unquantized weights and
  activations.  e4m3 keeps 3 mantissa bits; with the activations, the weights and the intermediate
  quantized, random normal layers (T 17, E 8, top-2, H = I = 128, seeds 0-4) measured 6.4-6.8%
  (per tensor) and 6.2-6.4% (128-block), against 0.05% for fused_moe itself: ``QUANT_BOUND`` holds 8%.

Sizes are small (E 4-8, H and I 128-256) so the file runs in seconds in the interpreter.
"""

from __future__ import annotations

import ast
import inspect

import pytest
import torch

from generated import moe as M
from generated import scaled_mm as smm
from generated.dispatch import HARDWARE
from kernel_cases import DEVICE, GPU, routing, seeded  # noqa: F401  (autouse fixture: a fixed seed per test)
from policy_runtime.moe import fp8 as rt
from policy_runtime.moe import tune

FP8 = torch.float8_e4m3fn
BLOCK = [128, 128]
TIGHT = {torch.float16: 2e-3, torch.float32: 1e-4, torch.bfloat16: 1e-2}
if GPU:
    # The FP8 MMA's accumulation and fp32 division moving an intermediate element across an e4m3
    # rounding boundary (tests/test_moe_fp8_gpu.py's GPU_TIGHT); dynamic scales: rescaled_bound.
    TIGHT = {dtype: 1.5e-2 for dtype in TIGHT}
QUANT_BOUND = 0.08
# The target whose policy the tests run (one token of narrow experts simt, the rest grouped).
HW = "h200"


def quant_weights(w: torch.Tensor, block: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights [E, n, k] as e4m3 and their float32 scales: amax / 448 per expert, or per 128x128 block."""
    if not block:
        s = w.abs().amax(dim=(1, 2)).clamp(min=1e-12) / 448
        return (w / s[:, None, None]).to(FP8), s.float()
    E, n, k = w.shape
    nb, kb = -(-n // 128), -(-k // 128)
    padded = torch.zeros(E, nb * 128, kb * 128, dtype=w.dtype)
    padded[:, :n, :k] = w
    blocks = padded.view(E, nb, 128, kb, 128)
    s = blocks.abs().amax(dim=(2, 4)).clamp(min=1e-12) / 448
    q = (blocks / s[:, :, None, :, None]).view(E, nb * 128, kb * 128)[:, :n, :k]
    return q.to(FP8).contiguous(), s.float()


def dequant_weights(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    if s.dim() == 1:
        return q.double() * s.double()[:, None, None]
    E, n, k = q.shape
    full = s.double().repeat_interleave(128, 1).repeat_interleave(128, 2)[:, :n, :k]
    return q.double() * full


def quant_dequant(x: torch.Tensor, block: bool, static: torch.Tensor | None) -> torch.Tensor:
    """x as the call quantizes it, dequantized (float64): per token and 128-group, by a static
    scale, or by amax / 448 (at least 1e-10)."""
    x = x.float()
    if block:
        T, K = x.shape
        g = x.view(T, K // 128, 128)
        s = g.abs().amax(-1).clamp(min=1e-10) / 448
        q = (g / s[..., None]).clamp(-448, 448).to(FP8).view(T, K)
        return q.double() * s.double().repeat_interleave(128, 1)
    s = static.float().reshape(()) if static is not None else x.abs().amax().clamp(min=1e-10) / 448
    return (x / s).clamp(-448, 448).to(FP8).double() * s.double()


def act_and_mul(gu: torch.Tensor, inter: int, activation: str) -> torch.Tensor:
    if activation == "swigluoai":
        g, u = gu[:, 0::2].clamp(max=7), gu[:, 1::2].clamp(-7, 7)
        return g * torch.sigmoid(1.702 * g) * (u + 1)
    g, u = gu[:, :inter], gu[:, inter:]
    return (torch.nn.functional.silu(g) if activation == "silu" else torch.nn.functional.gelu(g)) * u


def reference(
    x, w1, w2, weights, ids, *, block, a1=None, a2=None, activation="silu", expert_map=None, intermediate_error=False
):
    """float64 on the dequantized inputs (w1, w2 dequantized float64), the activations quantized
    as the call does; the intermediate rounded to x's dtype first.  Slots of other ranks' experts
    (expert_map -1) are skipped.  ``intermediate_error``: also return the intermediate's e4m3
    rounding error (relative Frobenius norm), which ``rescaled_bound`` reads."""
    x, weights, ids = x.cpu(), weights.cpu().double(), ids.cpu().long()
    if expert_map is not None:
        ids = expert_map.cpu().long()[ids]
    T, H = x.shape
    k, inter = ids.shape[1], w2.shape[2]
    xd = quant_dequant(x, block, a1)
    flat = ids.reshape(-1)
    here = (flat >= 0).nonzero().flatten()
    h = torch.zeros(T * k, inter, dtype=torch.float64)
    for e in flat[here].unique().tolist():
        rows = (flat == e).nonzero().flatten()
        h[rows] = act_and_mul(xd[rows // k] @ w1[e].T, inter, activation)
    hd = quant_dequant(h[here].to(x.dtype), block, a2)
    out = torch.zeros(T, H, dtype=torch.float64)
    for e in flat[here].unique().tolist():
        sel = (flat[here] == e).nonzero().flatten()
        rows = here[sel]
        out.index_add_(0, rows // k, (hd[sel] @ w2[e].T) * weights.reshape(-1)[rows, None])
    if intermediate_error:
        hx = h[here].to(x.dtype).double()
        return out, ((hd - hx).norm() / hx.norm()).item()
    return out


def rescaled_bound(intermediate_err: float, dynamic: bool) -> float:
    """The GPU bound of a case against ``reference``: ``TIGHT`` where the intermediate's scale is
    fixed (static or unused); with scales computed in the call from the intermediate (dynamic per
    tensor, or per token and 128-group), 1.5 x its e4m3 error, at least ``TIGHT``.  On the GPU the
    FP8 MMA's accumulation moves the intermediate's amax by an ulp of its dtype from the
    reference's; the scale moves with it and every element of the tensor or group is rounded
    afresh: two independent e4m3 roundings differ by sqrt(2) x their rms error (see
    tests/test_moe_fp8_gpu.py's docstring for the measurements)."""
    tight = TIGHT[torch.float16]
    return max(tight, 1.5 * intermediate_err) if (GPU and dynamic) else tight


def layer(T, E, k, H, I, dtype, block):
    x = torch.randn(T, H).to(dtype)
    w1 = torch.randn(E, 2 * I, H) / H**0.5
    w2 = torch.randn(E, H, I) / I**0.5
    w1q, w1s = quant_weights(w1, block)
    w2q, w2s = quant_weights(w2, block)
    weights, ids = routing(T, E, k)
    return x, (w1, w2), (w1q, w1s, w2q, w2s), weights, ids


def to_device(*ts):
    return [t.to(DEVICE) if isinstance(t, torch.Tensor) else t for t in ts]


def rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.cpu().double() - ref).norm() / ref.norm()).item()


def test_quantize_rounds_as_torch():
    """The quantizing kernel against torch's e4m3 cast: every finite e4m3 value, the midpoints
    between neighbours (ties to even) and values just off them, subnormals, and values past 448."""
    grid = torch.arange(256, dtype=torch.uint8).view(FP8).float()
    grid = grid[torch.isfinite(grid)].unique()
    mids = (grid[1:] + grid[:-1]) / 2
    x = torch.cat([grid, mids, mids * (1 + 2**-20), mids * (1 - 2**-20), torch.randn(1000) * 100,
                   torch.randn(500) * 1e-3, torch.tensor([1e-30, 500.0, -1000.0])])  # fmt: skip
    x = torch.nn.functional.pad(x, (0, -x.numel() % 128)).view(-1, 128)
    q = torch.empty(x.shape, dtype=FP8)
    x, q = to_device(x, q)
    rt._quantize(x, q, rt.TENSOR, torch.ones(1, device=DEVICE), None)
    assert torch.equal(q.cpu().float(), x.cpu().clamp(-448, 448).to(FP8).float())


@pytest.mark.parametrize("M, K", [(1, 128), (7, 300), (33, 2048), (4128, 256)])
def test_dynamic_scale_reduces_every_partial_maximum_and_zeroes_the_next_amax(M, K):
    """Dynamic per tensor: _fp8_amax's partial maxima (one, some, and fewer programs than tiles at
    4128 x 256) reduced to amax / 448 wherever the largest value lies (the last tile's last element
    here), and the launch zeroes ``reset`` (the intermediate's amax, which starts as garbage); a
    static scale is left as it was."""
    x = torch.randn(M, K).to(torch.float16)
    x[-1, -1] = -50.0  # the amax, in the last tile of the last program
    q = torch.empty(M, K, dtype=FP8)
    reset = torch.full((1,), 1e30)
    x, q, reset = to_device(x, q, reset)
    tiles = -(-M // rt._AMAX_ROWS) * -(-K // rt._AMAX_BLOCK)
    assert (tiles > rt.AMAX_PARTS) == (M == 4128)
    scale = rt._quantize(x, q, rt.TENSOR, None, None, reset=reset)
    want = torch.tensor(50.0) / 448
    assert scale.cpu().item() == want.item()
    assert reset.cpu().item() == 0.0
    assert torch.equal(q.cpu().float(), (x.cpu().float() / want).clamp(-448, 448).to(FP8).float())
    static = to_device(torch.full((1,), 0.5))[0]
    rt._quantize(x, q, rt.TENSOR, static, None)
    assert static.cpu().item() == 0.5


SCALINGS = ("tensor dynamic", "tensor static", "block")


@pytest.mark.parametrize("T, scaling", [(T, s) for T in (1, 7, 33) for s in SCALINGS if (T, s) != (7, "tensor static")])
def test_tight_against_dequantized(T, scaling):
    """Through the h200 policy (T 1 of 128 columns its simt decode_one bucket, 7 and 33 grouped ones), fp16."""
    block = scaling == "block"
    E, k, H, I = 8, 2, 128, 128
    x, _, (w1q, w1s, w2q, w2s), weights, ids = layer(T, E, k, H, I, torch.float16, block)
    a1 = a2 = None
    if scaling == "tensor static":
        # a2 below the intermediate's amax / 448: its largest values saturate at 448, as the reference's.
        a1, a2 = (x.float().abs().max() / 448 * 1.25).reshape(()), torch.tensor([0.004])
    args = to_device(x, w1q, w2q, weights, ids, w1s, w2s, a1, a2)
    out = M.fused_moe_fp8(*args[:5], w1_scale=args[5], w2_scale=args[6], a1_scale=args[7], a2_scale=args[8],
                          block_shape=BLOCK if block else None, hw=HW)  # fmt: skip
    assert out.dtype == torch.float16 and out.shape == (T, H)
    ref = reference(x, dequant_weights(w1q, w1s), dequant_weights(w2q, w2s), weights, ids, block=block, a1=a1, a2=a2)
    assert rel(out, ref) < TIGHT[torch.float16]


@pytest.mark.parametrize("index, name", list(enumerate(sorted(M.VARIANTS_FP8))))
def test_every_kernel_pair(index, name):
    """Every generated FP8 kernel pair at T = 2 (simt) or 5, by turns with block scales and fp32
    output or per-tensor scales and fp16 output (the policy tests above run both scalings)."""
    v = M.VARIANTS_FP8[name]
    T = 2 if v.kind == "simt" else 5
    for block, dtype in [((True, torch.float32), (False, torch.float16))[index % 2]]:
        x, _, (w1q, w1s, w2q, w2s), weights, ids = layer(T, 4, 2, 128, 128, dtype, block)
        args = to_device(x, w1q, w2q, weights, ids, w1s, w2s)
        out = M._MOE_FP8.fused_moe_fp8(*args[:5], w1_scale=args[5], w2_scale=args[6],
                                       block_shape=BLOCK if block else None, variant=v)  # fmt: skip
        ref = reference(x, dequant_weights(w1q, w1s), dequant_weights(w2q, w2s), weights, ids, block=block)
        assert rel(out, ref) < TIGHT[dtype], (name, T, block)


@pytest.mark.parametrize("split", [2, 3])
def test_down_gemm_split_k(split):
    """A grouped record with its down GEMM's K split (down_split_k; the runs' fp32 partial rows
    added by the reduce), as codegen tune builds it: one expert a token (no reduce without the
    split), top-3 with expert parallelism, block scales on a K of three 128-column tiles (runs of
    1-2 tiles, a run past the end with split 3 of 2 tiles) and per-tensor scales on a ragged K."""
    record = dict(kernel="grouped", block_size_m=16, block_size_n=64, block_size_k=128, group_size_m=1,
                  num_warps=4, num_stages=2, fuse_sum=False, down_block_size_n=64, down_block_size_k=128,
                  down_num_warps=4, down_num_stages=2, down_split_k=split)  # fmt: skip
    v = tune.fp8_variant(record)
    assert v.down_split_k == split and v.down.consts["SPLIT_K"] == split
    emap = torch.tensor([-1, 2, -1, 0, 3, -1, 1, -1], dtype=torch.int32)
    for k, H, I, block, ep in ((1, 128, 384, True, False), (3, 128, 256, False, True), (2, 96, 176, False, False)):
        x, _, (w1q, w1s, w2q, w2s), weights, ids = layer(3, 8 if ep else 4, k, H, I, torch.float16, block)
        if ep:
            w1q, w1s, w2q, w2s = (t[[3, 6, 1, 4]].contiguous() for t in (w1q, w1s, w2q, w2s))
        args = to_device(x, w1q, w2q, weights, ids, w1s, w2s, emap if ep else None)
        out = M._MOE_FP8.fused_moe_fp8(*args[:5], w1_scale=args[5], w2_scale=args[6], expert_map=args[7],
                                       block_shape=BLOCK if block else None, variant=v)  # fmt: skip
        ref, ierr = reference(x, dequant_weights(w1q, w1s), dequant_weights(w2q, w2s), weights, ids, block=block,
                              expert_map=emap if ep else None, intermediate_error=True)  # fmt: skip
        assert rel(out, ref) < rescaled_bound(ierr, dynamic=True), (split, k, block, ep)


@pytest.mark.parametrize("kind", ["simt", "grouped"])
def test_ragged_dims_and_activations(kind):
    """Per-tensor scales on dims no tile divides (H 96, I 48: masked K steps), gelu and gpt-oss's
    interleaved swigluoai; block scales with swigluoai (gate and up rows in the same blocks)."""
    v = next(v for v in M.VARIANTS_FP8.values() if v.kind == kind)
    for H, I, block, act in ((96, 48, False, "gelu"), (96, 48, False, "swigluoai"), (128, 128, True, "swigluoai")):
        x, _, (w1q, w1s, w2q, w2s), weights, ids = layer(2, 4, 2, H, I, torch.float16, block)
        args = to_device(x, w1q, w2q, weights, ids, w1s, w2s)
        out = M._MOE_FP8.fused_moe_fp8(*args[:5], w1_scale=args[5], w2_scale=args[6], activation=act,
                                       block_shape=BLOCK if block else None, variant=v)  # fmt: skip
        ref, ierr = reference(x, dequant_weights(w1q, w1s), dequant_weights(w2q, w2s), weights, ids, block=block,
                              activation=act, intermediate_error=True)  # fmt: skip
        assert rel(out, ref) < rescaled_bound(ierr, dynamic=True), (H, I, block, act, ierr)


GROUPED_TILE_WIDTHS = sorted({v.block_n for v in M.VARIANTS_FP8.values() if v.kind == "grouped"})


@pytest.mark.parametrize("block_n", GROUPED_TILE_WIDTHS)
@pytest.mark.parametrize("act", ["silu", "swigluoai"])
def test_block_scales_of_each_column_block(block_n, act):
    """Weight scales that differ by up to 16x from one 128x128 block to the next (H 256, I 384: 2
    and 3 column blocks, gate and up halves, or interleaved for swigluoai): a tile that read
    another block's scale (the kernels take one scale a K step for tiles at most a block wide)
    would be off by that factor.  Every grouped tile width of the generated pairs."""
    v = next(v for v in M.VARIANTS_FP8.values() if v.kind == "grouped" and v.block_n == block_n)
    T, E, k, H, I = 5, 4, 2, 256, 384
    x, _, (w1q, w1s, w2q, w2s), weights, ids = layer(T, E, k, H, I, torch.float16, True)
    g = torch.Generator().manual_seed(7)
    w1s = w1s * 2.0 ** torch.randint(-2, 3, w1s.shape, generator=g)
    w2s = w2s * 2.0 ** torch.randint(-2, 3, w2s.shape, generator=g)
    args = to_device(x, w1q, w2q, weights, ids, w1s, w2s)
    out = M._MOE_FP8.fused_moe_fp8(*args[:5], w1_scale=args[5], w2_scale=args[6], activation=act,
                                   block_shape=BLOCK, variant=v)  # fmt: skip
    ref, ierr = reference(x, dequant_weights(w1q, w1s), dequant_weights(w2q, w2s), weights, ids, block=True,
                          activation=act, intermediate_error=True)  # fmt: skip
    assert rel(out, ref) < rescaled_bound(ierr, dynamic=True), (block_n, act, ierr)


@pytest.mark.parametrize("T", [1, 33])
@pytest.mark.parametrize("scaling", ["tensor dynamic", "block"])
def test_expert_map(T, scaling):
    """Expert parallelism: 8 global experts, this rank holds 4 (in another order); other ranks'
    slots add nothing (and leave the dynamic scales alone)."""
    block = scaling == "block"
    x, _, (w1q, w1s, w2q, w2s), weights, ids = layer(T, 8, 3, 128, 128, torch.float16, block)
    emap = torch.tensor([-1, 2, -1, 0, 3, -1, 1, -1], dtype=torch.int32)
    local = [3, 6, 1, 4]  # local expert j is global local[j]
    w1q, w1s, w2q, w2s = (t[local].contiguous() for t in (w1q, w1s, w2q, w2s))
    args = to_device(x, w1q, w2q, weights, ids, w1s, w2s, emap)
    out = M.fused_moe_fp8(*args[:5], w1_scale=args[5], w2_scale=args[6], expert_map=args[7],
                          block_shape=BLOCK if block else None, hw=HW)  # fmt: skip
    ref = reference(x, dequant_weights(w1q, w1s), dequant_weights(w2q, w2s), weights, ids, block=block,
                    expert_map=emap)  # fmt: skip
    assert rel(out, ref) < TIGHT[torch.float16]


@pytest.mark.parametrize("scaling", ["tensor dynamic", "block"])
def test_quantization_error_against_fused_moe(scaling):
    """fused_moe_fp8 on quantized weights against fused_moe (fp16) on the original data, both
    against float64 on the original data: the quantization error, under QUANT_BOUND."""
    block = scaling == "block"
    T, E, k, H, I = 17, 8, 2, 128, 128
    x, (w1, w2), (w1q, w1s, w2q, w2s), weights, ids = layer(T, E, k, H, I, torch.float16, block)
    args = to_device(x, w1q, w2q, weights, ids, w1s, w2s, w1.half(), w2.half())
    fp8 = M.fused_moe_fp8(*args[:5], w1_scale=args[5], w2_scale=args[6], block_shape=BLOCK if block else None, hw=HW)
    half = M.fused_moe(args[0], args[7], args[8], args[3], args[4], hw=HW)
    exact = torch.zeros(T, H, dtype=torch.float64)
    xd, flat = x.double(), ids.long().reshape(-1)
    for r, e in enumerate(flat.tolist()):
        gu = xd[r // k] @ w1[e].double().T
        exact[r // k] += weights.reshape(-1)[r].double() * (act_and_mul(gu[None], I, "silu")[0] @ w2[e].double().T)
    assert rel(half, exact) < 2e-3
    assert 0.01 < rel(fp8, exact) < QUANT_BOUND


def test_policy_tables_and_unserved_targets():
    """The FP8 policy serves the targets with e4m3fn tensor cores, the same ones scaled_mm serves;
    buckets and select take dtype float8_e4m3fn; a call elsewhere names the target and feature."""
    assert set(M.UNSERVED_FP8) == set(smm.UNSERVED)
    assert set(M.UNSERVED_FP8) | set(M._POLICIES_FP8["moe_fp8_launch_e4m3"]) == set(HARDWARE)
    assert set(M.UNSERVED_FP8.values()) == {"fp8_e4m3fn"}
    names = [b.name for b in M.buckets(hw=HW, dtype=FP8)]
    assert names == ["decode_one", "decode_wide", "small", "medium", "prefill", "prefill_large"]
    # Prefill: 64-row tiles to 3072 tokens, 128x128 on 8 warps from 3073.
    large = [M.select(t, 2048, dtype=FP8, hw=HW) for t in (513, 3072, 3073)]
    assert [b.name for b in large] == ["prefill", "prefill", "prefill_large"]
    assert [(b.variant.block_m, b.variant.num_warps) for b in large] == [(64, 4), (64, 4), (128, 8)]
    assert [M.select(t, 768, dtype=FP8, hw=HW).name for t in (1, 2, 4, 5)] == ["decode_one", "small", "small", "small"]
    # One token: simt up to 1024 intermediate columns, the grouped tiles past them, with the down
    # GEMM's K split past 4096 columns (up to 2 tokens).
    picks = [M.select(t, i, dtype=FP8, hw=HW).variant for t, i in ((1, 768), (1, 1024), (1, 1025), (1, 4096), (1, 4097),
                                                                     (2, 14336), (3, 14336))]  # fmt: skip
    assert [(v.kind, v.down_split_k) for v in picks] == [
        ("simt", 1),
        ("simt", 1),
        ("grouped", 1),
        ("grouped", 1),
        ("grouped", 4),
        ("grouped", 4),
        ("grouped", 1),
    ]
    assert M.select(4096, 768, dtype=FP8, hw=HW).variant.kind == "grouped"
    assert M.select(1, 768, hw=HW).variant.kind != "grouped"  # the 16-bit tables are untouched
    x, _, (w1q, w1s, w2q, w2s), weights, ids = layer(2, 4, 2, 128, 128, torch.float16, False)
    x, w1q, w1s, w2q, w2s, weights, ids = to_device(x, w1q, w1s, w2q, w2s, weights, ids)
    for target in sorted(M.UNSERVED_FP8):
        with pytest.raises(ValueError, match=rf"fused_moe_fp8: target '{target}' has no fp8_e4m3fn"):
            M.fused_moe_fp8(x, w1q, w2q, weights, ids, w1_scale=w1s, w2_scale=w2s, hw=target)
        with pytest.raises(ValueError, match=target):
            M.buckets(hw=target, dtype=FP8)


def _bad_calls():
    E, H, I = 4, 128, 128
    x = torch.randn(3, H).half()
    w1q, w1s = quant_weights(torch.randn(E, 2 * I, H), False)
    w2q, w2s = quant_weights(torch.randn(E, H, I), False)
    b1q, b1s = quant_weights(torch.randn(E, 2 * I, H), True)
    b2q, b2s = quant_weights(torch.randn(E, H, I), True)
    weights, ids = routing(3, E, 2)
    ok = dict(w1_scale=w1s, w2_scale=w2s)
    blk = dict(w1_scale=b1s, w2_scale=b2s, block_shape=BLOCK)
    rag = torch.randn(3, 96).half()
    r1q, r1s = quant_weights(torch.randn(E, 2 * I, 96), True)
    r2q, r2s = quant_weights(torch.randn(E, 96, I), True)
    return (
        [
            ("w1_scale must be \\(4,\\)", (x, w1q, w2q), dict(ok, w1_scale=w1s[:3])),
            ("w2_scale must be float32", (x, w1q, w2q), dict(ok, w2_scale=w2s.half())),
            ("w1_scale must be a float32 tensor", (x, w1q, w2q), dict(ok, w1_scale=[1.0] * 4)),
            ("w1_scale must be \\(4, 2, 1\\)", (x, b1q, b2q), dict(blk, w1_scale=b1s[:, :1])),
            ("w2_scale must be \\(4, 1, 1\\)", (x, b1q, b2q), dict(blk, w2_scale=w2s)),
            ("block_shape must be None .* or \\[128, 128\\]", (x, b1q, b2q), dict(blk, block_shape=[64, 64])),
            ("block size 128 does not divide H", (rag, r1q, r2q), dict(w1_scale=r1s, w2_scale=r2s, block_shape=BLOCK)),
            ("a1_scale must be None with block_shape", (x, b1q, b2q), dict(blk, a1_scale=torch.ones(1))),
            ("a2_scale must hold one value", (x, w1q, w2q), dict(ok, a2_scale=torch.ones(2))),
            ("a1_scale must be float32", (x, w1q, w2q), dict(ok, a1_scale=torch.ones(1, dtype=torch.float64))),
            ("w1 must be torch.float8_e4m3fn", (x, w1q.half(), w2q), ok),
            ("hidden_states must be float16, bfloat16 or float32", (x.to(FP8), w1q, w2q), ok),
            ("activation must be one of", (x, w1q, w2q), dict(ok, activation="relu")),
        ],
        weights,
        ids,
    )


def test_bad_arguments_name_them():
    calls, weights, ids = _bad_calls()
    weights, ids = to_device(weights, ids)
    for pattern, tensors, kw in calls:
        kw = {name: to_device(v)[0] for name, v in kw.items()}
        with pytest.raises(ValueError, match=pattern):
            M.fused_moe_fp8(*to_device(*tensors), weights, ids, hw=HW, **kw)


@pytest.mark.skipif(GPU, reason="the scale-device check needs a CPU input and a second device")
def test_scale_on_another_device():
    calls, weights, ids = _bad_calls()
    _, (x, w1, w2), kw = calls[0]
    with pytest.raises(ValueError, match="w1_scale is on meta but hidden_states is on cpu"):
        M.fused_moe_fp8(x, w1, w2, weights, ids, hw=HW, w1_scale=torch.ones(4, device="meta"), w2_scale=kw["w2_scale"])


def test_each_record_holds_the_constants_its_kernels_bake_in():
    fields = {"BLOCK_M": "block_m", "GROUP_M": "group_m", "FUSE_SUM": "fuse_sum"}
    tile = {"up": {"BLOCK_N": "block_n", "BLOCK_K": "block_k", "STAGES": "num_stages"},
            "down": {"BLOCK_N": "down_block_n", "BLOCK_K": "down_block_k", "STAGES": "down_num_stages",
                     "SPLIT_K": "down_split_k"}}  # fmt: skip
    for name, v in M.VARIANTS_FP8.items():
        for part, kernel in (("up", v.up), ("down", v.down)):
            tree = ast.parse(inspect.getsource(kernel.fn))
            (call,) = [
                n
                for n in ast.walk(tree)
                if isinstance(n, ast.Call) and getattr(n.func, "id", None) == f"fp8_{v.kind}_{part}_body"
            ]
            consts = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords if isinstance(kw.value, ast.Constant)}
            known = {**fields, **tile[part]}
            assert consts["SCALE_BLOCK"] == 128 and {"BLOCK_N", "BLOCK_K"} <= set(consts), name
            assert {c: consts[c] for c in consts if c in known} == {
                c: getattr(v, known[c]) for c in consts if c in known
            }
        assert v.name == name and v.up.fn.__module__ == M.__name__


def test_no_argument_that_varies_with_T_is_specialized_on():
    """T reaches the FP8 kernels only through the grid, the grouped ones' numel and row-block
    bound, and the quantizing kernels' row count."""

    def unspecialized(kernel):
        names = getattr(kernel, "kwargs", {}).get("do_not_specialize")  # the interpreter's function
        names = kernel.do_not_specialize if names is None else names
        return {kernel.arg_names[n] if isinstance(n, int) else n for n in names or ()}

    for v in M.VARIANTS_FP8.values():
        for kernel in (v.up, v.down):
            params = set(inspect.signature(kernel.fn).parameters)
            if v.kind == "grouped":
                assert unspecialized(kernel) == {"numel", "num_m_blocks"} <= params
            else:
                assert not {"T", "M", "numel", "num_m_blocks"} & params
    assert unspecialized(rt._fp8_quant) == {"M", "amax_n", "reset_n"}
    assert unspecialized(rt._fp8_amax) == {"M"}


def _fp8_launches(T, scaling):
    """(kernel name, constexpr PDL, launch_pdl) of each launch of one fused_moe_fp8 call through
    the h200 policy, captured by warm-up's compile-only scope (nothing runs)."""
    from policy_runtime import launch

    block = scaling == "block"
    x, _, (w1q, w1s, w2q, w2s), weights, ids = layer(T, 8, 2, 128, 128, torch.float16, block)
    a1 = a2 = None
    if scaling == "tensor static":
        a1, a2 = torch.tensor([0.01]), torch.tensor([0.004])
    args = to_device(x, w1q, w2q, weights, ids, w1s, w2s, a1, a2)
    seen = []
    with launch.compile_only(lambda kernel, grid, a, kwargs: seen.append((kernel, kwargs))):
        M.fused_moe_fp8(*args[:5], w1_scale=args[5], w2_scale=args[6], a1_scale=args[7], a2_scale=args[8],
                        block_shape=BLOCK if block else None, hw=HW)  # fmt: skip
    return [(getattr(k, "__name__", k.fn.__name__), kw.get("PDL"), kw.get("launch_pdl", False)) for k, kw in seen]


@pytest.mark.parametrize("T", [1, 33])
@pytest.mark.parametrize("scaling", SCALINGS)
def test_every_launch_of_a_call_is_a_link_of_one_dependent_chain(T, scaling, monkeypatch):
    """Where the device has programmatic dependent launch, every launch of a call (quantizations,
    alignment, GEMMs, reduce) is a link of one chain: each lets the next start (PDL); all but the
    grouped GEMMs are launched dependent (launch_pdl), waiting on the device, the first on whatever
    came before the call (a router that releases its dependants early).
    Without it (the interpreter, ROCm, before 9.0) the same kernels launch plainly, PDL off."""
    from policy_runtime import launch

    monkeypatch.setattr(launch, "programmatic", lambda t: False)
    plain = _fp8_launches(T, scaling)
    monkeypatch.setattr(launch, "programmatic", lambda t: True)
    chained = _fp8_launches(T, scaling)
    names = [name for name, _, _ in plain]
    assert [name for name, _, _ in chained] == names
    # A simt call runs its up and down kernels after the quantizations; a grouped one aligns too.
    assert len(names) >= (4 if T == 1 else 7) - (scaling == "tensor static") - (scaling == "block"), names
    assert names[0] in ("_fp8_amax", "_fp8_quant") and any(n.startswith("_align") for n in names) == (T > 1)
    assert all(pdl is False and not dependent for _, pdl, dependent in plain)
    # The grouped GEMMs are launched plainly (they lose as dependants), still releasing the next.
    grouped = [link for link in chained if link[0].startswith("_moe_e4m3_grouped")]
    assert len(grouped) == (0 if T == 1 else 2) and all(link[1:] == (True, False) for link in grouped)
    assert all(link[1:] == (True, True) for link in chained if link not in grouped), chained
