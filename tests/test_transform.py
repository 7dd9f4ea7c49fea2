"""generated/transform.py (rms_norm, silu_and_mul, rotary_embedding) against bench/reference_ops.py.

Without a GPU the kernels run in Triton's interpreter on the CPU (tests/conftest.py), in fp16
and fp32 (bf16 math is wrong in the interpreter); on a GPU bf16 is tested too.  Every target's
launch record runs one representative shape set; a few targets with different records run every
shape.  Outputs start as NaN and every element is compared with the torch reference.
"""

from __future__ import annotations

import pytest

import torch  # noqa: E402

import generated.transform as T  # noqa: E402
from bench.reference_ops import (  # noqa: E402
    fused_add_rms_norm_ref,
    rms_norm_ref,
    rotary_embedding_ref,
    silu_and_mul_ref,
)
from generated.dispatch import HARDWARE, dispatch_kernel_config  # noqa: E402
from policy_runtime import launch  # noqa: E402
from policy_runtime.transform import ops as runtime  # noqa: E402
from kernel_cases import (  # noqa: E402
    BROAD,
    DEVICE,
    DTYPE_IDS,
    DTYPES,
    GPU,
    NAN,
    TARGETS,
    cases,
    ones,
    seeded,  # noqa: F401  (autouse fixture: a fixed seed per test)
    zeros,
)

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")

TOL = {torch.float16: 2e-3, torch.float32: 1e-5, torch.bfloat16: 1.6e-2}


def check(actual, expected, exact=False):
    """Every element: same shape, dtype and NaN pattern; values within tolerance (or equal)."""
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    if exact:
        torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)
    else:
        tol = TOL[actual.dtype]
        torch.testing.assert_close(actual, expected, equal_nan=True, atol=tol, rtol=tol)


def rnd(*shape, dtype=torch.float16, scale=1.0):
    return (torch.randn(*shape, dtype=torch.float32) * scale).to(dtype).to(DEVICE)


@pytest.fixture
def poisoned(monkeypatch):
    """While the test runs, torch.empty returns float tensors filled with NaN: the launchers'
    outputs start poisoned.  Returns the shapes allocated, so a test can check it applied."""
    real = torch.empty
    shapes = []

    def empty(*args, **kwargs):
        t = real(*args, **kwargs)
        if t.is_floating_point():
            t.fill_(NAN)
            shapes.append(tuple(t.shape))
        return t

    monkeypatch.setattr(torch, "empty", empty)
    return shapes


def test_launch_records_cover_every_target():
    """The kernels read their records from generated/transform.py's tables: one per kernel and
    target, the record the dispatch module resolved for it."""
    tables = T._KERNELS.launch
    assert list(tables) == ["rms_norm", "silu_and_mul", "rotary_embedding"]
    for kernel, table in tables.items():
        assert sorted(table) == TARGETS
        for t in TARGETS:
            assert table[t] is dispatch_kernel_config(kernel, t)
            assert type(table[t]).__name__ == "TransformLaunch"


def test_kernels_launch_with_the_tables_they_are_given():
    """A TransformKernels plans with its own records, for the target its target_name returns
    (called with hw and the tensor's device), and memoises the plan by target and shape."""
    asked = []

    def target_name(hw, device):
        asked.append((hw, device))
        return "mine"

    # BI-V100's records under a target name that dispatch does not know.
    bi = {k: {"mine": dispatch_kernel_config(k, "bi_v100")} for k in runtime.TransformKernels.KERNELS}
    kernels = runtime.TransformKernels(launch=bi, target_name=target_name)
    x, w = rnd(256, 512), rnd(512)
    for _ in range(2):
        check(kernels.rms_norm(x, w, 1e-6, hw="any"), rms_norm_ref(x, w, 1e-6))
    # The second call of the class replays the first's plan (policy_runtime/call_cache.py).
    assert asked == [("any", x.device)]
    (key,) = kernels._rms_plans
    assert key == ("mine", 256, 512, torch.float16, False)
    # 16 KiB tiles and 64-program waves pack 4 rows a program; the H200's record would pack 1.
    plan = kernels._rms_plans[key]
    assert (plan.grid, plan.consts[:3]) == (64, (False, 4, 512))
    assert runtime.plan_rms_norm(256, 512, 2, False, dispatch_kernel_config("rms_norm", "h200")).consts[1] == 1


def test_kernels_need_exactly_their_tables():
    tables = {k: {} for k in ("rms_norm", "silu_and_mul", "gelu")}
    with pytest.raises(ValueError, match=r"missing \['rotary_embedding'\], unknown \['gelu'\]"):
        runtime.TransformKernels(launch=tables, target_name=lambda hw, device: "h200")


# ---------------------------------------------------------------------------------- rms_norm

RMS_REP = [(7, 1000)]
# 1 token; non-power-of-two rows; tiny rows (1 warp); 3-D; a row > 16384 (two-pass kernel).
RMS_SHAPES = [(1, 4096), (7, 1000), (3, 3584), (5, 17), (2, 3, 96), (2, 16400)]


@pytest.mark.parametrize("target,shape", cases(RMS_REP, RMS_SHAPES))
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("with_res", [False, True], ids=["plain", "residual"])
def test_rms_norm(poisoned, target, shape, dtype, with_res):
    x = rnd(*shape, dtype=dtype, scale=3.0)
    w = rnd(shape[-1], dtype=dtype)
    x0 = x.clone()
    if with_res:
        r = rnd(*shape, dtype=dtype)
        r0 = r.clone()
        out, z = T.rms_norm(x, w, 1e-6, residual=r, hw=target)
        ref_out, ref_z = fused_add_rms_norm_ref(x, r, w, 1e-6)
        check(z, ref_z, exact=True)
        check(out, ref_out)
        assert torch.equal(r, r0)
        assert z.is_contiguous()
    else:
        out = T.rms_norm(x, w, 1e-6, hw=target)
        check(out, rms_norm_ref(x, w, 1e-6))
    assert out.is_contiguous()
    assert torch.equal(x, x0)  # out of place
    assert poisoned.count(tuple(shape)) == (2 if with_res else 1)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_rms_norm_strided_rows_and_fp32_weight(dtype):
    x = rnd(6, 1500, dtype=dtype)[:, 100:1100]  # row stride 1500
    r = rnd(6, 1200, dtype=dtype)[:, :1000]  # row stride 1200
    w = rnd(1000, dtype=torch.float32)
    out, z = T.rms_norm(x, w, 1e-5, residual=r, hw="a100")
    ref_out, ref_z = rms_norm_ref(x, w, 1e-5, r)
    check(z, ref_z, exact=True)
    check(out, ref_out)


@pytest.mark.parametrize("n", [96, 5000])
def test_rms_norm_strided_weight(n):
    """A weight of stride 2 or 0 (expand) is read as the values it shows, in both kernels."""
    x = rnd(3, n)
    for w in (rnd(2 * n)[::2], rnd(1).expand(n)):
        check(T.rms_norm(x, w, 1e-6, hw="h200"), rms_norm_ref(x, w.contiguous(), 1e-6))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("n", [5000, 16400])
def test_rms_norm_two_pass_on_strided_rows(dtype, n):
    """Rows of a tile or more take the two-pass kernel (the row length compiled in up to 16384
    elements, a runtime value past it, a ragged last chunk either way), with x and residual
    each at a row stride of its own."""
    x = rnd(3, n + 96, dtype=dtype)[:, 32 : 32 + n]
    r = rnd(3, n + 8, dtype=dtype)[:, :n]
    w = rnd(n, dtype=dtype)
    plan = runtime.plan_rms_norm(3, n, x.element_size(), True, dispatch_kernel_config("rms_norm", "h200"))
    assert plan.kernel is runtime._rms_norm_loop_kernel and plan.consts[4] == (n if n <= 16384 else 0)
    out, z = T.rms_norm(x, w, 1e-6, residual=r, hw="h200")
    ref_out, ref_z = fused_add_rms_norm_ref(x, r, w, 1e-6)
    check(z, ref_z, exact=True)
    check(out, ref_out)
    check(T.rms_norm(x, w, 1e-6, hw="h200"), rms_norm_ref(x, w, 1e-6))


def test_rms_norm_residual_rounds_z_before_the_norm():
    """z = x + residual is rounded to fp16 before the norm (vLLM's CUDA kernel): with ties,
    the norm of the unrounded sum differs by one fp16 ulp in about half the outputs."""
    x = torch.tensor([1.0, 2.0] * 32, dtype=torch.float16, device=DEVICE).repeat(3, 1)
    r = torch.tensor([2.0**-11, 0.0] * 32, dtype=torch.float16, device=DEVICE).repeat(3, 1)  # a tie
    w = torch.ones(64, dtype=torch.float16, device=DEVICE)
    ref_out, ref_z = fused_add_rms_norm_ref(x, r, w, 1e-6)
    unrounded = rms_norm_ref(x.float() + r.float(), w.float(), 1e-6).half()
    assert not torch.equal(ref_out, unrounded)  # the case tells the two apart
    for hw in BROAD:
        out, z = T.rms_norm(x, w, 1e-6, residual=r, hw=hw)
        check(z, ref_z, exact=True)
        check(out, ref_out, exact=True)


def test_rms_norm_reuses_plan_with_new_data():
    for hw in ("h200", HARDWARE["h200"]):  # a spec name or a HARDWARE record
        x, w = rnd(4, 256), rnd(256)
        check(T.rms_norm(x, w, 1e-6, hw=hw), rms_norm_ref(x, w, 1e-6))


def test_rms_norm_plan_follows_the_record():
    """Hand-computed plans for the H200 record (tile 8 KiB, 8 warps, 1056 programs a wave)."""
    cfg = dispatch_kernel_config("rms_norm", "h200")
    assert (cfg.tile_bytes, cfg.num_warps, cfg.min_programs) == (8192, 8, 1056)
    # bf16 4096: an 8 KiB row fills the tile: the two-pass kernel, one 4096-element chunk,
    # 8 warps so that each thread moves two 16-byte vectors; the row length is compiled in.
    p = runtime.plan_rms_norm(16384, 4096, 2, False, cfg)
    two_pass = runtime._rms_norm_loop_kernel
    assert (p.kernel, p.grid, p.consts, p.num_warps) == (two_pass, 16384, (False, 1, 4096, False, 4096), 8)
    # bf16 8192: two 4096-element chunks, 16 warps (two vectors a thread over the row).
    p = runtime.plan_rms_norm(16384, 8192, 2, False, cfg)
    assert (p.kernel, p.grid, p.consts, p.num_warps) == (two_pass, 16384, (False, 1, 4096, False, 8192), 16)
    # BI-V100's 16 KiB tiles: a bf16 8192 row is one chunk.
    p = runtime.plan_rms_norm(64, 8192, 2, False, dispatch_kernel_config("rms_norm", "bi_v100"))
    assert (p.kernel, p.consts, p.num_warps) == (two_pass, (False, 1, 8192, False, 8192), 16)
    # Rows shorter than a tile stay in registers, packed; the weight is loaded early once a
    # thread holds >= 32 elements (BI-V100: 4 rows of 2048 = 8192 elements over 256 threads).
    p = runtime.plan_rms_norm(4096, 2048, 2, False, dispatch_kernel_config("rms_norm", "bi_v100"))
    assert (p.kernel, p.grid, p.consts, p.num_warps) == (runtime._rms_norm_kernel, 1024, (False, 4, 2048, True), 8)
    # small rows pack 8 KiB per program, then shrink until the grid fills a wave.
    p = runtime.plan_rms_norm(64, 512, 2, False, cfg)
    assert p.consts[1] == 1 and p.grid == 64
    bi = dispatch_kernel_config("rms_norm", "bi_v100")  # 16 KiB tiles, 64 programs a wave
    p = runtime.plan_rms_norm(4096, 512, 2, False, bi)
    assert p.consts[1] == 16 and p.grid == 256
    # fp32 16384: 2048-element (8 KiB) chunks; 16 warps give each thread one vector a chunk.
    p = runtime.plan_rms_norm(1, 16384, 4, False, cfg)
    assert (p.consts, p.num_warps) == ((False, 1, 2048, False, 16384), 16)
    # beyond 16384 elements: 8 KiB chunks, the row length stays a runtime value.
    p = runtime.plan_rms_norm(3, 16400, 2, True, cfg)
    assert (p.kernel, p.grid, p.consts) == (two_pass, 3, (True, 1, 4096, False, 0))


def test_rms_norm_errors():
    x = ones(4, 8, dtype=torch.float16)
    w = ones(8)
    with pytest.raises(ValueError, match=r"weight shape \(7,\) must be \(8,\) for x \(4, 8\)"):
        T.rms_norm(x, ones(7), 1e-6, hw="h200")
    with pytest.raises(TypeError, match="x has dtype torch.int32"):
        T.rms_norm(x.int(), w, 1e-6, hw="h200")
    with pytest.raises(TypeError, match="weight has dtype torch.float64"):
        T.rms_norm(x, w.double(), 1e-6, hw="h200")
    with pytest.raises(ValueError, match=r"residual shape \(4, 9\) != x shape \(4, 8\)"):
        T.rms_norm(x, w, 1e-6, residual=ones(4, 9, dtype=torch.float16), hw="h200")
    with pytest.raises(TypeError, match="residual dtype torch.float32 != x dtype torch.float16"):
        T.rms_norm(x, w, 1e-6, residual=ones(4, 8), hw="h200")
    with pytest.raises(ValueError, match="must be contiguous"):
        T.rms_norm(ones(4, 3, 8, dtype=torch.float16).transpose(0, 1), w, 1e-6, hw="h200")
    with pytest.raises(ValueError, match="unit stride"):
        T.rms_norm(ones(8, 4, dtype=torch.float16).t(), w, 1e-6, hw="h200")
    with pytest.raises(ValueError, match="hidden size is 0"):
        T.rms_norm(ones(4, 0), ones(0), 1e-6, hw="h200")
    with pytest.raises(TypeError):
        T.rms_norm(x, w, 1e-6, None, "h200")  # residual and hw are keyword-only


def test_hw_argument():
    x, w = rnd(2, 8), rnd(8)
    with pytest.raises(KeyError, match="nope"):
        T.rms_norm(x, w, 1e-6, hw="nope")
    if GPU:  # hw=None: the device is detected
        check(T.rms_norm(x, w, 1e-6), rms_norm_ref(x, w, 1e-6))
    else:
        with pytest.raises(RuntimeError, match="pass hw="):
            T.rms_norm(x, w, 1e-6)  # a CPU tensor: nothing to detect


def test_cpu_tensor_rejected_when_compiled(monkeypatch):
    monkeypatch.setattr(launch, "INTERPRET", False)  # the check lives in the shared launch module
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        T.rms_norm(torch.ones(2, 8), torch.ones(8), 1e-6, hw="h200")
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        T.silu_and_mul(torch.ones(2, 8), hw="h200")


# ---------------------------------------------------------------------------------- silu_and_mul

SILU_REP = [(7, 2000)]
SILU_SHAPES = [(1, 8192), (7, 2000), (5, 7168), (3, 34), (2, 3, 64)]


@pytest.mark.parametrize("target,shape", cases(SILU_REP, SILU_SHAPES))
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_silu_and_mul(poisoned, target, shape, dtype):
    x = rnd(*shape, dtype=dtype, scale=4.0)
    x.view(-1)[:4] = torch.tensor([-90.0, 90.0, 0.0, -20.0], dtype=dtype, device=DEVICE)  # saturating
    out = T.silu_and_mul(x, hw=target)
    check(out, silu_and_mul_ref(x))
    assert out.is_contiguous()
    assert poisoned == [(*shape[:-1], shape[-1] // 2)]


def test_silu_and_mul_strided_rows():
    x = rnd(4, 300)[:, 50:250]
    check(T.silu_and_mul(x, hw="h200"), silu_and_mul_ref(x))


def test_silu_and_mul_plan_follows_the_record():
    """Hand-computed: a tile is tile_bytes of loads (two per output element)."""
    h200 = dispatch_kernel_config("silu_and_mul", "h200")  # 4 KiB tiles -> 1024 fp16 outputs
    p = runtime.plan_silu_and_mul(16, 4096, 2, h200)
    assert (p.grid, p.consts, p.num_warps, p.info) == (64, (1, 1024), 4, 4)
    bi = dispatch_kernel_config("silu_and_mul", "bi_v100")  # 16 KiB tiles, halved once to fill 64 programs
    p = runtime.plan_silu_and_mul(16, 4096, 2, bi)
    assert (p.grid, p.consts, p.num_warps, p.info) == (32, (1, 2048), 8, 2)


def test_silu_and_mul_errors():
    with pytest.raises(ValueError, match=r"last dim of x \(3, 7\) must be even"):
        T.silu_and_mul(ones(3, 7, dtype=torch.float16), hw="h200")
    with pytest.raises(TypeError, match="x has dtype torch.float64"):
        T.silu_and_mul(ones(3, 8, dtype=torch.float64), hw="h200")
    with pytest.raises(ValueError, match="unit stride"):
        T.silu_and_mul(ones(8, 4).t(), hw="h200")


# ---------------------------------------------------------------------------------- rotary


def qkv_views(T_, H, KH, hs, dtype, three_d):
    """query and key as views into a fused qkv buffer whose value part and padding are NaN."""
    width = (H + 2 * KH) * hs + 8
    buf = torch.full((T_, width), NAN, dtype=dtype, device=DEVICE)
    buf[:, : (H + KH) * hs] = rnd(T_, (H + KH) * hs, dtype=dtype)
    return buf, *split_qk(buf, H, KH, hs, three_d)


def split_qk(buf, H, KH, hs, three_d):
    q = buf[:, : H * hs]
    k = buf[:, H * hs : (H + KH) * hs]
    if three_d:
        q, k = q.unflatten(1, (H, hs)), k.unflatten(1, (KH, hs))
    return q, k


# tokens, q heads, kv heads, head_size, rot_dim, is_neox, with key, 3-D views
ROPE_REP = [(5, 4, 2, 64, 32, True, True, False), (3, 6, 1, 80, 40, False, True, True)]
ROPE_CASES = ROPE_REP + [
    (1, 4, 2, 64, 64, True, True, False),
    (5, 4, 2, 64, 64, False, True, True),
    (3, 6, 1, 80, 80, True, False, False),
    (4, 3, 3, 48, 16, False, False, True),
    (2, 40, 8, 128, 128, True, True, False),
]


@pytest.mark.parametrize("target,case", cases(ROPE_REP, ROPE_CASES))
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_rotary_embedding(target, case, dtype):
    T_, H, KH, hs, rot, neox, with_key, three_d = case
    max_pos = 50
    cos_sin = rnd(max_pos, rot, dtype=torch.float32 if T_ % 2 else dtype)
    positions = torch.randint(0, max_pos, (T_,), dtype=torch.int64 if H % 2 == 0 else torch.int32).to(DEVICE)
    buf, q, k = qkv_views(T_, H, KH, hs, dtype, three_d)
    before = buf.clone()
    ref = buf.clone()
    rq, rk = split_qk(ref, H, KH, hs, three_d)
    res = T.rotary_embedding(positions, q, k if with_key else None, cos_sin, hs, neox, hw=target)
    assert res[0] is q and res[1] is (k if with_key else None)
    rotary_embedding_ref(positions, rq, rk if with_key else None, cos_sin, hs, neox)
    # The whole buffer: rotated dims, untouched dims past rot_dim, the value part, the padding.
    check(buf, ref)
    if not with_key:
        check(buf[:, H * hs :], before[:, H * hs :], exact=True)  # key, value, padding as before
    heads = (H + KH) * hs
    passed = buf[:, :heads].unflatten(1, (H + KH, hs))[..., rot:]
    assert torch.equal(passed, before[:, :heads].unflatten(1, (H + KH, hs))[..., rot:])


@pytest.mark.parametrize("which", ["stride2", "expanded"])
def test_rotary_strided_positions(which):
    """positions of stride 2 (a column of a [T, 2] tensor) or 0 (expand): token t uses pos[t]."""
    T_, hs = 5, 64
    pos = (
        torch.randint(0, 50, (T_, 2)).to(DEVICE)[:, 1]
        if which == "stride2"
        else zeros(1, dtype=torch.int64).add(7).expand(T_)
    )
    cs = rnd(50, hs)
    q, k = rnd(T_, 2 * hs), rnd(T_, hs)
    rq, rk = q.clone(), k.clone()
    T.rotary_embedding(pos, q, k, cs, hs, True, hw="h200")
    rotary_embedding_ref(pos.contiguous(), rq, rk, cs, hs, True)
    check(q, rq)
    check(k, rk)


def test_rotary_plan_follows_the_record():
    """Hand-computed: heads packed until a program loads tile_bytes, halved to fill a wave."""
    h200 = dispatch_kernel_config("rotary_embedding", "h200")  # 4 KiB: 16 heads of 128 bf16
    p = runtime.plan_rotary_embedding(16384, 32, 8, 128, 128, True, 2, h200)
    assert (p.grid, p.consts, p.info) == (16384 * 3, (128, 64, 64, 16, True), (2, 3))
    # One token: the tile cannot shrink below one 16-byte vector a thread (2048 elements).
    p = runtime.plan_rotary_embedding(1, 32, 8, 128, 128, True, 2, h200)
    assert (p.grid, p.consts[3], p.info, p.num_warps) == (3, 16, (2, 3), 4)
    # Partial rotary (64 of 128): a tile still counts whole 128-element heads (16 heads), whose
    # 16 x 32-element halves need 2 warps for one 16-byte vector a thread.
    p = runtime.plan_rotary_embedding(16384, 32, 8, 64, 128, True, 2, h200)
    assert (p.grid, p.consts, p.info, p.num_warps) == (16384 * 3, (128, 32, 32, 16, True), (2, 3), 2)
    bi = dispatch_kernel_config("rotary_embedding", "bi_v100")  # 16 KiB: 64 heads, 32 q + 8 k -> 2 programs
    p = runtime.plan_rotary_embedding(1, 32, 8, 128, 128, False, 2, bi)
    assert (p.grid, p.consts, p.info) == (2, (128, 64, 64, 32, False), (1, 2))


def test_rotary_errors():
    q = ones(2, 4 * 64, dtype=torch.float16)
    cs = ones(10, 64, dtype=torch.float16)
    pos = zeros(2, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"rot_dim 96 .* <= head_size 64"):
        T.rotary_embedding(pos, q, None, ones(10, 96), 64, True, hw="h200")
    with pytest.raises(ValueError, match=r"rot_dim 63"):
        T.rotary_embedding(pos, q, None, ones(10, 63), 64, True, hw="h200")
    with pytest.raises(ValueError, match="last dim 256 is not a multiple of head_size 60"):
        T.rotary_embedding(pos, q, None, cs, 60, True, hw="h200")
    with pytest.raises(TypeError, match="positions dtype torch.float32"):
        T.rotary_embedding(pos.float(), q, None, cs, 64, True, hw="h200")
    with pytest.raises(ValueError, match=r"positions \(3,\) vs query \(2, 256\)"):
        T.rotary_embedding(zeros(3, dtype=torch.int64), q, None, cs, 64, True, hw="h200")
    with pytest.raises(TypeError, match="key dtype torch.float32 != query dtype torch.float16"):
        T.rotary_embedding(pos, q, q.float(), cs, 64, True, hw="h200")
    with pytest.raises(TypeError, match="query has dtype torch.int64"):
        T.rotary_embedding(pos, q.long(), None, cs, 64, True, hw="h200")
    with pytest.raises(ValueError, match="packed heads"):
        q3 = ones(2, 64, 4, dtype=torch.float16).transpose(1, 2)
        T.rotary_embedding(pos, q3, None, cs, 64, True, hw="h200")
    with pytest.raises(ValueError, match=r"key \(3, 128\) vs query \(2, 256\)"):
        T.rotary_embedding(pos, q, ones(3, 128, dtype=torch.float16), cs, 64, True, hw="h200")
    with pytest.raises(TypeError, match="cos_sin_cache dtype torch.int64"):
        T.rotary_embedding(pos, q, None, cs.long(), 64, True, hw="h200")
    with pytest.raises(ValueError, match=r"cos_sin_cache must be 2-D"):
        T.rotary_embedding(pos, q, None, cs[0], 64, True, hw="h200")
    for bad in (64.5, float("inf"), float("nan"), "64", None, True):
        with pytest.raises(ValueError, match=f"head_size must be a positive integer, got {bad!r}"):
            T.rotary_embedding(pos, q, None, cs, bad, True, hw="h200")
    # Rows that overlap (row stride 64 < 4 heads x 64) would be rotated more than once.
    with pytest.raises(ValueError, match="query .* has overlapping rows"):
        T.rotary_embedding(
            pos, ones(400, dtype=torch.float16).as_strided((2, 256), (64, 1)), None, cs, 64, True, hw="h200"
        )


@pytest.mark.skipif(GPU, reason="positions must be on query's device: on the host only on the CPU")
def test_positions_on_the_host_are_range_checked():
    """CPU positions outside cos_sin_cache's rows raise before the launch, on a replayed plan as on
    the first call (the kernel would read out of bounds)."""
    q = torch.randn(3, 2 * 16).half()
    cs = torch.randn(10, 16)
    for _ in range(2):  # the second round replays the first good call's plan
        T.rotary_embedding(torch.tensor([0, 3, 9]), q, None, cs, 16, True, hw="h200")
        for pos, shown in (([0, 3, 10], r"positions\[2\] = 10"), ([0, -3, 2], r"positions\[1\] = -3")):
            with pytest.raises(
                ValueError, match=rf"rotary_embedding: {shown} is not a row of cos_sin_cache \(0 to 9\)"
            ):
                T.rotary_embedding(torch.tensor(pos), q, None, cs, 16, True, hw="h200")
