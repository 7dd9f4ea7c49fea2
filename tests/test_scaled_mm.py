"""generated/scaled_mm.py (FP8 e4m3 matmul with scales) and the spec language's ``requires``.

On a machine without a GPU the kernels run in Triton's interpreter, which loads float8_e4m3fn
tensors and runs the same ``tl.dot`` on them (in fp32 arithmetic) and cannot do bf16 arithmetic:
fp16 and fp32 outputs are tested there.  What the interpreter cannot show (the native FP8
tensor-core path, bf16 output, agreement with torch._scaled_mm) is tested where a GPU runs these
tests (the tests marked so are skipped without CUDA).

Accuracy, two ways, for every kernel and scaling:

- tight: against float64 on the dequantized inputs (fp8 values times their scales), the same
  problem the kernel solves; only fp32 accumulation order and the output's rounding differ.
- the quantization error: against float64 on the original (unquantized) data, with the inputs
  quantized as serving teams do (amax / 448 per tensor, row, or 1x128 / 128x128 block).  e4m3 keeps
  3 mantissa bits, so each element is off by up to 2**-4 relatively; on these random normal inputs
  the result's error (Frobenius norm, relative) measured 3.6-3.8% for every scaling (5 seeds, 3
  shapes: tests' ``problem``), against 0.23-0.24% for the same data in bf16: ``QUANT_BOUND`` holds
  4.5%.  (Per-row and block scales pay off on data whose rows or blocks differ in range, which
  random normal data does not.)
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from conftest import run_cli, snapshot
from generated import scaled_mm as smm
from generated.dispatch import HARDWARE
from policy_runtime.scaled_mm import ops as rt

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
# Relative to the result's largest magnitude: fp32 accumulation, then the output's rounding.
TIGHT = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
# On a GPU the FP8 tensor cores accumulate a tile's products in fewer bits than fp32 (Hopper: about
# 14, DeepSeek-V3 report 3.3.2); block scaling adds each 128-deep step into fp32, the others sum all
# of K in the MMA: measured 4.2e-4 to 5.7e-4 against float64 at fp32 output on the H200.
GPU_ACCUMULATION = 1e-3


def tight(dtype: torch.dtype, scaling: str) -> float:
    if GPU and scaling != "block":
        return max(TIGHT[dtype], GPU_ACCUMULATION)
    return TIGHT[dtype]


# The build, tune and show tests run the compiler (not installed where only the kernels run).
compiler = pytest.mark.skipif(
    importlib.util.find_spec("pydantic") is None, reason="the compiler's dependencies are not installed"
)
QUANT_BOUND = 0.045
OUT_DTYPES = [torch.float16, torch.float32] + ([torch.bfloat16] if GPU else [])
SCALINGS = ("tensor", "rowwise", "block", "mixed")


def _served_by_kernel() -> dict[tuple[str, bool], tuple[str, str, int]]:
    """One (target, bucket, an M the bucket serves) per distinct kernel and variant (outer or block
    scales): every kernel once with each kind of scaling it serves."""
    out: dict[tuple[str, bool], tuple[str, str, int]] = {}
    for target in sorted(HARDWARE):
        if target in smm.UNSERVED:
            continue
        for block in (False, True):
            for b in smm.buckets(hw=target, block_scales=block):
                m = next(
                    m
                    for m in (1, 16, 40, 65, 130, 300, 1100, 2100)
                    if smm.select(m, 256, 256, hw=target, block_scales=block) is b
                )
                out.setdefault((b.triton.name, block), (target, b.name, m))
    return out


KERNELS = _served_by_kernel()


def quantize(x: torch.Tensor, scaling: str, side: str) -> tuple[torch.Tensor, torch.Tensor]:
    """x as e4m3 and its float32 scales, amax / 448 per tensor, row (A) or column (B), or block
    (1x128 for A (M, K), 128x128 for B (K, N))."""
    if scaling == "tensor" or (scaling == "mixed" and side == "b"):
        s = x.abs().amax().clamp(min=1e-12) / FP8_MAX
        return (x / s).to(FP8), s.float().reshape(())
    if scaling in ("rowwise", "mixed"):
        dim = 1 if side == "a" else 0
        s = x.abs().amax(dim=dim, keepdim=True).clamp(min=1e-12) / FP8_MAX
        return (x / s).to(FP8), s.float()
    if side == "a":
        M, K = x.shape
        blocks = x.reshape(M, K // 128, 128)
        s = blocks.abs().amax(dim=2).clamp(min=1e-12) / FP8_MAX
        return (blocks / s[:, :, None]).reshape(M, K).to(FP8), s.float()
    K, N = x.shape
    blocks = x.reshape(K // 128, 128, N // 128, 128)
    s = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / FP8_MAX
    return (blocks / s[:, None, :, None]).reshape(K, N).to(FP8), s.float()


def dequantized(q: torch.Tensor, s: torch.Tensor, side: str) -> torch.Tensor:
    """float64 values the kernel multiplies: q times its scale, broadcast to q's shape."""
    full = s.double()
    if full.dim() == 2 and full.shape != (q.shape[0], 1) and full.shape != (1, q.shape[1]):
        full = (
            full.repeat_interleave(128, dim=1)
            if side == "a"
            else full.repeat_interleave(128, 0).repeat_interleave(128, 1)
        )
    return q.double() * full


def problem(M: int, N: int, K: int, scaling: str, seed: int = 0, b_transposed: bool = True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g)
    w = torch.randn(N, K, generator=g)  # an nn.Linear weight: B = w.t()
    qa, sa = quantize(x, scaling, "a")
    qb, sb = quantize(w.t().contiguous(), scaling, "b")
    if b_transposed:
        qb = qb.t().contiguous().t()  # the (K, N) view of a row-major (N, K) weight
    ref_q = dequantized(qa, sa, "a") @ dequantized(qb, sb, "b")
    ref_x = x.double() @ w.double().t()
    dev = [t.to(DEVICE) for t in (qa, qb, sa, sb)]
    return dev, ref_q, ref_x, (x, w)


def rel(c: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest error relative to the largest magnitude."""
    return ((c.double().cpu() - ref).abs().max() / ref.abs().max()).item()


def frob(c: torch.Tensor, ref: torch.Tensor) -> float:
    """Frobenius norm of the error relative to the reference's."""
    return ((c.double().cpu() - ref).norm() / ref.norm()).item()


# ----------------------------------------------------------------------------------------------
# Every kernel, every scaling: tight against the dequantized problem, then the quantization error


# Each kernel of the outer variant with the three outer scalings, each of the block variant with
# block scales (the scalings a call can route to it).
CASES = [
    (kernel, block, scaling)
    for kernel, block in sorted(KERNELS)
    for scaling in (("block",) if block else ("tensor", "rowwise", "mixed"))
]


@pytest.mark.parametrize("kernel,block,scaling", CASES)
def test_every_kernel_matches_fp64_on_dequantized_inputs(kernel, block, scaling):
    target, bucket, M = KERNELS[kernel, block]
    # Ragged M, N and K past one tile where the scaling allows (block scales need 128 | K, N).
    N, K = (256, 384) if scaling == "block" else (200, 300)
    (a, b, sa, sb), ref_q, ref_x, _ = problem(M, N, K, scaling)
    assert smm.select(M, N, K, hw=target, block_scales=block).triton.name == kernel
    dtype = OUT_DTYPES[SCALINGS.index(scaling) % len(OUT_DTYPES)]  # each output dtype on every kernel
    c = smm.scaled_mm(a, b, sa, sb, out_dtype=dtype, hw=target)
    assert c.dtype == dtype and c.shape == (M, N)
    assert rel(c, ref_q) < tight(dtype, scaling), (kernel, scaling, rel(c, ref_q))
    assert frob(c, ref_x) < QUANT_BOUND, (kernel, scaling, frob(c, ref_x))


def test_quantization_error_is_that_of_fp8_not_of_the_kernel():
    # The error against the original data comes from rounding the inputs to e4m3: the kernel's
    # result is as far from it as fp64 on the dequantized inputs is (to fp32 accumulation), and
    # well beyond bf16's rounding of the same data.
    target, _, M = KERNELS[sorted(KERNELS)[0]]
    for scaling in ("tensor", "rowwise", "block"):
        (a, b, sa, sb), ref_q, ref_x, (x, w) = problem(M, 256, 256, scaling, seed=1)
        c = smm.scaled_mm(a, b, sa, sb, out_dtype=torch.float32, hw=target)
        fp8_err, exact_err = frob(c, ref_x), frob(ref_q, ref_x)
        bf16_err = frob(x.bfloat16().double() @ w.bfloat16().double().t(), ref_x)
        assert abs(fp8_err - exact_err) < 1e-5, (scaling, fp8_err, exact_err)
        assert bf16_err < fp8_err < QUANT_BOUND, (scaling, bf16_err, fp8_err)


def test_row_major_b_strided_a_and_out():
    target, _, M = KERNELS[sorted(KERNELS)[0]]
    (a, b, sa, sb), ref_q, _, _ = problem(M, 128, 256, "rowwise", b_transposed=False)
    wide = torch.zeros(M, 2 * 256, dtype=FP8, device=DEVICE)
    wide[:, ::2] = a
    out = torch.full((M, 2 * 128), float("nan"), dtype=torch.float32, device=DEVICE)
    res = smm.scaled_mm(wide[:, ::2], b, sa, sb, out_dtype=torch.float32, out=out[:, ::2], hw=target)
    assert res.data_ptr() == out.data_ptr()
    assert rel(out[:, ::2], ref_q) < tight(torch.float32, "rowwise")
    assert torch.isnan(out[:, 1::2]).all()  # untouched


def test_k_zero_and_empty():
    target = next(iter(KERNELS.values()))[0]
    a, b = torch.zeros(4, 0, dtype=FP8, device=DEVICE), torch.zeros(0, 8, dtype=FP8, device=DEVICE)
    one = torch.tensor(1.0, device=DEVICE)
    assert smm.scaled_mm(a, b, one, one, out_dtype=torch.float32, hw=target).eq(0).all()
    a, b = torch.zeros(0, 16, dtype=FP8, device=DEVICE), torch.zeros(16, 8, dtype=FP8, device=DEVICE)
    assert smm.scaled_mm(a, b, one, one, hw=target).shape == (0, 8)


# ----------------------------------------------------------------------------------------------
# Bad arguments: ValueError naming the argument


def _bad(M=32, N=256, K=256):
    g = torch.Generator().manual_seed(0)
    return torch.randn(M, K, generator=g).to(FP8), torch.randn(K, N, generator=g).to(FP8)


@pytest.mark.parametrize(
    "shape_a, shape_b, dtype, fragment",
    [
        ((32, 3), (), torch.float32, "scale_a has shape (32, 3)"),
        ((), (3, 256), torch.float32, "scale_b has shape (3, 256)"),
        ((), (), torch.float16, "scale_a must be float32, got torch.float16"),
        ((32, 2), (1, 256), torch.float32, "block scaling needs both"),
        ((32, 1), (2, 2), torch.float32, "block scaling needs both"),
    ],
    ids=["scale_a shape", "scale_b shape", "dtype", "block and column", "row and block"],
)
def test_bad_scales_name_the_argument(shape_a, shape_b, dtype, fragment):
    a, b = _bad()
    sa, sb = torch.ones(shape_a, dtype=dtype), torch.ones(shape_b, dtype=torch.float32)
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        smm.scaled_mm(a, b, sa, sb, hw="h200")


@pytest.mark.parametrize("K, N, arg", [(192, 256, "scale_a"), (256, 192, "scale_b")])
def test_block_that_does_not_divide_the_dims(K, N, arg):
    a, b = _bad(32, N, K)
    kb, nb = -(-K // 128), -(-N // 128)
    with pytest.raises(ValueError, match=f"{arg} gives block scales, but the block size 128 does not divide"):
        smm.scaled_mm(a, b, torch.ones(32, kb), torch.ones(kb, nb), hw="h200")
    # Block counts rounded down do not fit either: the message says why.
    with pytest.raises(ValueError, match="block scales need K and N multiples of 128"):
        smm.scaled_mm(a, b, torch.ones(32, K // 128), torch.ones(K // 128, N // 128), hw="h200")


def test_bad_inputs():
    a, b = _bad()
    one = torch.tensor(1.0)
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        smm.scaled_mm(a.float(), b, one, one, hw="h200")
    with pytest.raises(TypeError, match="out_dtype"):
        smm.scaled_mm(a, b, one, one, out_dtype=torch.int32, hw="h200")
    with pytest.raises(ValueError, match="scale_b must be a float32 tensor"):
        smm.scaled_mm(a, b, one, 1.0, hw="h200")
    with pytest.raises(ValueError, match="inner dimensions"):
        smm.scaled_mm(a, b[:128], one, one, hw="h200")


# ----------------------------------------------------------------------------------------------
# Targets without FP8: not served, named at build and at call


def test_targets_without_e4m3fn_are_not_served():
    lacking = sorted(t for t in HARDWARE if not HARDWARE[t].fp8_e4m3fn)
    assert lacking == ["a10", "a100", "bi_v100", "mi300x"]  # the hardware specs' data
    assert sorted(smm.UNSERVED) == lacking
    a, b = _bad()
    one = torch.tensor(1.0)
    for target in lacking:
        with pytest.raises(ValueError, match=f"target '{target}' has no fp8_e4m3fn"):
            smm.scaled_mm(a, b, one, one, hw=target)
        with pytest.raises(ValueError, match=f"target '{target}' has no fp8_e4m3fn"):
            smm.buckets(hw=target)


@compiler
def test_build_summary_names_the_targets_not_served(project):
    result = run_cli("--root", str(project), "build")
    assert result.code == 0, result
    assert "scaled_mm: not served on mi300x, bi_v100, a100, a10: no fp8_e4m3fn" in result.out


@compiler
def test_requires_is_generic(project):
    # Any feature flag: requiring TMA as well leaves the sm_89 and sm_12x parts unserved too, and
    # the generated table says which feature each lacks.
    path = project / "specs/kernels/scaled_mm.toml"
    path.write_text(path.read_text().replace('requires = ["fp8_e4m3fn"]', 'requires = ["fp8_e4m3fn", "tma"]'))
    result = run_cli("--root", str(project), "build")
    assert result.code == 0, result
    assert "scaled_mm: not served on mi300x, bi_v100, a100, a10: no fp8_e4m3fn, tma; l40s: no tma" in result.out
    text = (project / "generated/scaled_mm.py").read_text()
    assert '"l40s": "tma"' in text and '"a100": "fp8_e4m3fn, tma"' in text


@compiler
def test_requires_names_a_feature(project):
    path = project / "specs/kernels/scaled_mm.toml"
    path.write_text(path.read_text().replace('requires = ["fp8_e4m3fn"]', 'requires = ["fp8_e4m3"]'))
    before = snapshot(project / "generated")
    result = run_cli("--root", str(project), "build")
    assert result.code == 2 and "Traceback" not in result.err, result
    assert "scaled_mm.toml" in result.err and "requires" in result.err and "'fp8_e4m3'" in result.err
    assert "fp8_e4m3fn" in result.err  # the known features are listed
    assert snapshot(project / "generated") == before


# ----------------------------------------------------------------------------------------------
# Warm-up covers the FP8 variants


def test_warmup_plans_every_bucket_scaling_and_layout():
    from policy_runtime.warmup import engine as W

    plan = W.plan(["generated.scaled_mm"], "h200", dtypes=["float16"])
    assert not plan.failed, plan.failed
    covers = {c.covers for c in plan.calls}
    outer = [b.name for b in smm.buckets(hw="h200")]
    block = [b.name for b in smm.buckets(hw="h200", block_scales=True)]
    layouts = ("b = w.t()", "b row-major")
    assert covers == {
        ("scaled_mm", "scaled_mm_e4m3", n, "float16", s, layout)
        for n in outer
        for s in ("tensor", "rowwise")
        for layout in layouts
    } | {("scaled_mm", "scaled_mm_e4m3_block", n, "float16", "block", layout) for n in block for layout in layouts}
    kernels = {name for launches in plan.launches for name, _ in launches}
    assert kernels == {b.triton.name for b in smm.buckets(hw="h200") + smm.buckets(hw="h200", block_scales=True)}
    # tensor, rowwise and block scales and the two layouts specialize differently: each distinct
    # (kernel, scaling, layout) is one kernel to compile (the block variant's mid and any buckets
    # share one kernel)
    distinct = {(b.triton.name, s) for b in smm.buckets(hw="h200") for s in ("tensor", "rowwise")}
    distinct |= {(b.triton.name, "block") for b in smm.buckets(hw="h200", block_scales=True)}
    assert len(plan.units) == len(distinct) * len(layouts)
    unserved = W.plan(["generated.scaled_mm"], "a100", dtypes=["float16"])
    assert not unserved.calls and "scaled_mm: not served on a100: no fp8_e4m3fn" in unserved.notes


# ----------------------------------------------------------------------------------------------
# The GPU: the native FP8 tensor-core path against torch._scaled_mm


@pytest.mark.skipif(not GPU, reason="the native FP8 tensor-core dot and torch._scaled_mm need a CUDA GPU")
@pytest.mark.parametrize("scaling", ["tensor", "rowwise"])
@pytest.mark.parametrize("M", [16, 200, 1024])
def test_gpu_matches_torch_scaled_mm(scaling, M):
    N, K = 512, 1024
    (a, b, sa, sb), ref_q, _, _ = problem(M, N, K, scaling)
    ours = smm.scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
    sa_t, sb_t = (sa, sb) if scaling == "rowwise" else (sa.reshape(()), sb.reshape(()))
    theirs = torch._scaled_mm(a, b, scale_a=sa_t, scale_b=sb_t, out_dtype=torch.bfloat16)
    assert rel(ours, ref_q) < TIGHT[torch.bfloat16]
    assert rel(ours.float(), theirs.double().cpu()) < TIGHT[torch.bfloat16]


@pytest.mark.skipif(not GPU, reason="the native FP8 tensor-core dot needs a CUDA GPU")
def test_gpu_block_scaled_large():
    (a, b, sa, sb), ref_q, ref_x, _ = problem(512, 1024, 2048, "block")
    c = smm.scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
    assert rel(c, ref_q) < TIGHT[torch.bfloat16]
    assert frob(c, ref_x) < QUANT_BOUND


# ----------------------------------------------------------------------------------------------
# codegen tune: the harness runs the generated kernels' body with their constants


def test_the_tune_harness_launches_what_the_generated_wrappers_do():
    import ast
    import inspect
    import textwrap

    from policy_runtime.scaled_mm import tune as scaled_mm_tune

    for name, v in smm.VARIANTS.items():
        (func,) = ast.parse(textwrap.dedent(inspect.getsource(v.kernel.fn))).body
        call = func.body[0].value
        constants = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
        record = dict(
            block_m=v.block_m, block_n=v.block_n, block_k=v.block_k, group_m=v.group_m,
            num_warps=v.num_warps, num_stages=v.num_stages,
        )  # fmt: skip
        tuned = scaled_mm_tune.variant(record)
        assert tuned.kernel.body is getattr(rt, call.func.id) and tuned.kernel.consts == constants, name


@pytest.mark.parametrize("scaling", ["rowwise", "block"])
def test_the_tune_harness_runs_records_correctly(scaling):
    from policy_runtime.scaled_mm import tune as scaled_mm_tune

    problem = scaled_mm_tune.HARNESS.problem({"m": 40, "n": 256, "k": 256}, torch.float16, DEVICE, {"scaling": scaling})
    record = dict(block_m=32, block_n=64, block_k=64, group_m=8, num_warps=4, num_stages=2)
    assert problem.error(problem.kernel(record)()) < TIGHT[torch.float16]
    library = problem.library()
    assert (library is None) == (scaling == "block")
    if library is not None:
        assert problem.error(library()) < TIGHT[torch.float16]


@compiler
def test_tune_runs_in_the_interpreter_and_the_result_builds(project):
    r = run_cli(
        "--root", str(project), "tune", "scaled_mm", "--hw", "h200", "--shapes", "40x256x256", "--dtype", "float16",
        "--space", "block_m=32,64", "block_n=64", "block_k=128", "num_stages=3", "--buckets", "small", "--quiet",
        "--scope", "policy",
    )  # fmt: skip
    assert r.code == 0, r.err + r.out
    assert "incumbent failed" not in r.out and "2/2" in r.out, r.out
    assert run_cli("--root", str(project), "check").code == 0


@compiler
def test_tune_refuses_a_target_not_served():
    r = run_cli("tune", "scaled_mm", "--hw", "a100", "--dry-run", "--quiet")
    assert r.code == 2 and "scaled_mm requires fp8_e4m3fn, which a100" in r.err, r


@compiler
def test_show_and_explain_name_a_target_not_served():
    shown = run_cli("show", "scaled_mm", "--hw", "a100")
    assert shown.code == 0 and "not served (requires fp8_e4m3fn): a100 (no fp8_e4m3fn)" in shown.out, shown
    explained = run_cli("explain", "scaled_mm", "block_m", "--hw", "a100")
    assert explained.code == 2 and "scaled_mm requires fp8_e4m3fn, which a100" in explained.err, explained
    served = run_cli("explain", "scaled_mm", "block_n", "--hw", "h200")
    assert served.code == 0 and "served by nvidia>=90" in served.out, served
