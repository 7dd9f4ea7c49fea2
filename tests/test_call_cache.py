"""policy_runtime/call_cache.py on the CPU (Triton's interpreter): for each cached entry point, a
second call of the same class is a hit (no recording) and gives bitwise the output of the uncached
path; a call that differs in a stride, the alignment of a view, a dtype, an option or the target
misses, makes its own plan and is right against a float64 reference; bad input raises the same
error with the cache on as off and makes no plan; the caches are bounded and off where direct
launches are off or inside warm-up's compile-only scope."""

import pytest
import torch

from generated import cache as C
from generated import matmul as MM
from generated import scaled_mm as SMM
from generated import transform as TR
from policy_runtime import call_cache, direct, launch

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU paths; the GPU test is test_direct_launch_gpu")


@pytest.fixture(autouse=True)
def fresh():
    call_cache.clear_all()
    with direct.enabled(True):
        yield
    call_cache.clear_all()


@pytest.fixture
def recorded(monkeypatch):
    """The names of the caches whose record() ran (a miss), in order."""
    seen = []
    real = call_cache.CallCache.record

    def spy(self):
        seen.append(self.name)
        return real(self)

    monkeypatch.setattr(call_cache.CallCache, "record", spy)
    return seen


def view(shape, dtype=torch.float32, offset=0, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = 1
    for s in shape:
        n *= s
    return torch.randn(n + offset, generator=g).to(dtype)[offset:].view(*shape)


def uncached(fn, *args):
    with direct.enabled(False):
        return fn(*args)


def flat(out):
    if isinstance(out, (tuple, list)):
        return [t for part in out for t in flat(part)]
    return [] if out is None else [out]


def check(fn, args, ref, recorded, name, *, miss, tol):
    """One call: a miss (recorded) or a hit as said; outputs bitwise those of the uncached path
    (on clones of the arguments: some entries write in place) and close to ``ref``."""
    before = len(recorded)
    fresh_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    got = fn(*args)
    assert (len(recorded) - before == 1) == miss and (not miss or recorded[-1] == name), (recorded, miss)
    want = uncached(fn, *fresh_args)
    for g, w in zip(flat(got), flat(want), strict=True):
        assert torch.equal(g, w)
    for g, r in zip(flat(got), flat(ref(*args if not isinstance(ref, tuple) else ())), strict=True):
        torch.testing.assert_close(g.double(), r.double(), rtol=tol, atol=tol)
    return got


# ---------------------------------------------------------------------------------------------
# matmul_triton


def test_matmul_triton_hits_and_misses(recorded):
    fn = lambda a, b, hw="h200": MM.matmul_triton(a, b, hw=hw)  # noqa: E731
    ref = lambda a, b, hw="h200": a.double() @ b.double()  # noqa: E731
    b = view((24, 7), seed=1)
    a = view((5, 24))
    check(fn, (a, b), ref, recorded, "matmul", miss=True, tol=1e-4)
    check(fn, (view((5, 24), seed=2), view((24, 7), seed=3)), ref, recorded, "matmul", miss=False, tol=1e-4)
    assert call_cache.sizes()["matmul"] == 1
    for args in (
        (view((5, 24), offset=1), b),  # misaligned view of the same shape
        (view((24, 5)).t(), b),  # column-major a: another stride
        (view((5, 24), dtype=torch.float16), b.half()),  # dtype
        (view((1, 24)), b),  # another M
        (a, b, "a100"),  # another target
    ):
        check(fn, args, ref, recorded, "matmul", miss=True, tol=2e-3)
        check(fn, args, ref, recorded, "matmul", miss=False, tol=2e-3)
    assert call_cache.sizes()["matmul"] == 6


def test_matmul_triton_into_out(recorded):
    a, b = view((3, 40)), view((40, 20), seed=1)
    out = torch.empty(3, 20)
    for miss in (True, False):
        got = MM.matmul_triton(a, b, out=out, hw="h200")
        assert got is out and recorded == ["matmul"]
        torch.testing.assert_close(out.double(), a.double() @ b.double(), rtol=1e-4, atol=1e-4)
    wide = torch.empty(3, 40)[:, ::2]  # a strided out: another class
    MM.matmul_triton(a, b, out=wide, hw="h200")
    assert recorded == ["matmul", "matmul"]
    torch.testing.assert_close(wide.double(), a.double() @ b.double(), rtol=1e-4, atol=1e-4)


def test_matmul_bad_calls_raise_as_without_the_cache():
    a, b = view((4, 16)), view((16, 8))
    MM.matmul_triton(a, b, out=torch.empty(4, 8), hw="h200")
    bad = (
        (a, view((15, 8))),  # inner dimensions
        (a, b.half()),  # dtypes differ
        (a.tolist(), b),  # not a tensor
        (a, b, torch.empty(4, 9)),  # out's shape
        (a, b, torch.empty(4, 8, dtype=torch.float16)),  # out's dtype
        (a, b, torch.empty(4, 1).expand(4, 8)),  # overlapping out
    )
    for args in bad:
        errors = []
        for on in (True, False):
            with direct.enabled(on), pytest.raises((ValueError, TypeError)) as e:
                MM.matmul_triton(*args[:2], out=args[2] if len(args) > 2 else None, hw="h200")
            errors.append((type(e.value), str(e.value)))
        assert errors[0] == errors[1]
    assert call_cache.sizes()["matmul"] == 1
    grad = a.clone().requires_grad_()
    with pytest.raises(ValueError, match="requires grad"):
        MM.matmul_triton(grad, b, hw="h200")
    with torch.no_grad():  # allowed without grad, and never cached (grad mode is not in the key)
        MM.matmul_triton(grad, b, hw="h200")
    with pytest.raises(ValueError, match="requires grad"):
        MM.matmul_triton(grad, b, hw="h200")
    assert call_cache.sizes()["matmul"] == 1


def test_matmul_empty_problems_keep_their_full_path():
    a, b = view((3, 0)), view((0, 5))
    for _ in range(2):
        out = torch.full((3, 5), 7.0)
        assert torch.equal(MM.matmul_triton(a, b, out=out, hw="h200"), torch.zeros(3, 5))


# ---------------------------------------------------------------------------------------------
# transform and cache


def rms_ref(x, w, eps, residual=None):
    z = x if residual is None else (x + residual).to(x.dtype)
    zd = z.double()
    y = zd * torch.rsqrt(zd.pow(2).mean(-1, keepdim=True) + eps) * w.double()
    return y if residual is None else (y, z)


def test_rms_norm_hits_and_misses(recorded):
    fn = lambda x, w, eps=1e-6, hw="h200": TR.rms_norm(x, w, eps, hw=hw)  # noqa: E731
    ref = lambda x, w, eps=1e-6, hw="h200": rms_ref(x, w, eps)  # noqa: E731
    w = view((257,), seed=1)
    check(fn, (view((4, 257)), w), ref, recorded, "rms_norm", miss=True, tol=1e-4)
    check(fn, (view((4, 257), seed=5), w), ref, recorded, "rms_norm", miss=False, tol=1e-4)
    for args in (
        (view((4, 257), offset=1), w),  # misaligned
        (view((4, 300))[:, :257], w),  # row stride 300
        (view((4, 257), dtype=torch.float16), w),  # dtype
        (view((4, 257)), w, 1e-2),  # eps
        (view((4, 257)), w, 1e-6, "a100"),  # target
        (view((4, 257)), view((514,), seed=1)[::2]),  # strided weight (copied: no plan, still right)
    ):
        check(fn, args, ref, recorded, "rms_norm", miss=True, tol=2e-3)
        check(fn, args, ref, recorded, "rms_norm", miss=False, tol=2e-3)


def test_rms_norm_residual_hits_and_misses(recorded):
    fn = lambda x, w, r: TR.rms_norm(x, w, 1e-6, residual=r, hw="h200")  # noqa: E731
    ref = lambda x, w, r: rms_ref(x, w, 1e-6, r)  # noqa: E731
    w = view((64,), seed=1)
    check(fn, (view((3, 64)), w, view((3, 64), seed=2)), ref, recorded, "rms_norm", miss=True, tol=1e-4)
    check(fn, (view((3, 64), seed=3), w, view((3, 64), seed=4)), ref, recorded, "rms_norm", miss=False, tol=1e-4)
    check(fn, (view((3, 64)), w, view((3, 64), offset=2)), ref, recorded, "rms_norm", miss=True, tol=1e-4)
    # Without the residual: another class.
    got = TR.rms_norm(view((3, 64)), w, 1e-6, hw="h200")
    assert recorded[-1] == "rms_norm" and len(recorded) == 3 and isinstance(got, torch.Tensor)


def test_options_read_on_the_host_as_tensors_are_never_planned(recorded):
    # eps, head_size and is_neox are read on the host into the launch: as tensors (which the full
    # path accepts) their value is no part of a key, so such calls run uncached every time.
    x, w = view((3, 64)), view((64,), seed=1)
    for eps in (1e-6, 100.0, 1e-6):
        got = TR.rms_norm(x, w, torch.tensor(eps), hw="h200")
        torch.testing.assert_close(got.double(), rms_ref(x, w, eps), rtol=1e-5, atol=1e-5)
    assert recorded == [] and call_cache.sizes()["rms_norm"] == 0
    hs = 16
    pos, cs = torch.tensor([3, 0, 7]), view((8, hs), seed=9)
    for neox in (True, False):
        q, k = view((3, 4 * hs)), view((3, 2 * hs), seed=1)
        want = rope_ref(pos, q.clone(), k.clone(), cs, hs, neox)
        TR.rotary_embedding(pos, q, k, cs, torch.tensor(hs), torch.tensor(neox), hw="h200")
        for g, r in zip((q.view(3, -1, hs), k.view(3, -1, hs)), want):
            torch.testing.assert_close(g.double(), r, rtol=1e-5, atol=1e-5)
    assert recorded == [] and call_cache.sizes()["rotary_embedding"] == 0


def test_a_tensor_passed_twice_makes_no_plan(recorded):
    # rms_norm(x, w, residual=x): the recorded launch could not tell x from the residual, and a
    # later call of the same key with two tensors would read one for both.
    x, w = view((3, 64)), view((64,), seed=1)
    for _ in range(2):
        TR.rms_norm(x, w, 1e-6, residual=x, hw="h200")
    assert recorded == ["rms_norm", "rms_norm"] and call_cache.sizes()["rms_norm"] == 0
    fn = lambda x, w, r: TR.rms_norm(x, w, 1e-6, residual=r, hw="h200")  # noqa: E731
    ref = lambda x, w, r: rms_ref(x, w, 1e-6, r)  # noqa: E731
    check(fn, (view((3, 64), seed=2), w, view((3, 64), seed=3)), ref, recorded, "rms_norm", miss=True, tol=1e-4)
    # A hit whose caller passes one tensor twice: right (each launch argument has its own place).
    check(fn, (x, w, x), ref, recorded, "rms_norm", miss=False, tol=1e-4)


def silu_ref(x):
    d = x.shape[-1] // 2
    g, u = x.double()[..., :d], x.double()[..., d:]
    return g * torch.sigmoid(g) * u


def test_silu_and_mul_hits_and_misses(recorded):
    fn = lambda x, hw="h200": TR.silu_and_mul(x, hw=hw)  # noqa: E731
    ref = lambda x, hw="h200": silu_ref(x)  # noqa: E731
    check(fn, (view((3, 64)),), ref, recorded, "silu_and_mul", miss=True, tol=1e-5)
    check(fn, (view((3, 64), seed=1),), ref, recorded, "silu_and_mul", miss=False, tol=1e-5)
    for args in ((view((3, 72))[:, 4:68],), (view((3, 64), offset=1),), (view((2, 3, 64)),), (view((3, 64)), "a10")):
        check(fn, args, ref, recorded, "silu_and_mul", miss=True, tol=1e-5)
        check(fn, args, ref, recorded, "silu_and_mul", miss=False, tol=1e-5)


def act_ref(op, x, alpha=1.702, limit=7.0):
    xd = x.double()
    d = x.shape[-1] // 2
    if op == "swigluoai_and_mul":
        g, u = xd[..., 0::2].clamp(max=limit), xd[..., 1::2].clamp(-limit, limit)
        return g * torch.sigmoid(alpha * g) * (u + 1)
    a, b = xd[..., :d], xd[..., d:]
    if op == "mul_and_silu":
        return a * b * torch.sigmoid(b)
    return torch.nn.functional.gelu(a, approximate="tanh") * b


@pytest.mark.parametrize("op", ["gelu_tanh_and_mul", "swigluoai_and_mul", "mul_and_silu"])
def test_other_activations_hit_and_miss(recorded, op):
    fn = lambda x, hw="h200", **kw: getattr(TR, op)(x, hw=hw, **kw)  # noqa: E731
    ref = lambda x, hw="h200", **kw: act_ref(op, x, **kw)  # noqa: E731
    check(fn, (view((3, 64)),), ref, recorded, "act_and_mul", miss=True, tol=1e-5)
    check(fn, (view((3, 64), seed=1),), ref, recorded, "act_and_mul", miss=False, tol=1e-5)
    for args in ((view((3, 72))[:, 4:68],), (view((2, 3, 64)),), (view((3, 64)), "a10")):
        check(fn, args, ref, recorded, "act_and_mul", miss=True, tol=1e-5)
        check(fn, args, ref, recorded, "act_and_mul", miss=False, tol=1e-5)
    if op == "swigluoai_and_mul":  # alpha and limit: their values are in the launch, so in the key
        x = view((3, 64), seed=2) * 4
        for kw in ({"alpha": 1.0}, {"limit": 2.5}, {"alpha": 1.0, "limit": 2.5}):
            before = len(recorded)
            got = fn(x, **kw)
            assert recorded[before:] == ["act_and_mul"]  # a miss: never the default values' plan
            torch.testing.assert_close(got.double(), act_ref(op, x, **kw), rtol=1e-5, atol=1e-5)
    # The three activations share one cache, never one plan.
    for other in ("gelu_tanh_and_mul", "swigluoai_and_mul", "mul_and_silu"):
        x = view((3, 64), seed=3)
        torch.testing.assert_close(getattr(TR, other)(x, hw="h200").double(), act_ref(other, x), rtol=1e-5, atol=1e-5)


def rope_ref(pos, q, k, cs, hs, neox):
    def rot(t):
        t = t.double().reshape(t.shape[0], -1, hs).clone()
        rd = cs.shape[1]
        c, s = cs.double()[pos][:, None, : rd // 2], cs.double()[pos][:, None, rd // 2 :]
        if neox:
            x1, x2 = t[..., : rd // 2].clone(), t[..., rd // 2 : rd].clone()
            t[..., : rd // 2], t[..., rd // 2 : rd] = x1 * c - x2 * s, x2 * c + x1 * s
        else:
            x1, x2 = t[..., 0:rd:2].clone(), t[..., 1:rd:2].clone()
            t[..., 0:rd:2], t[..., 1:rd:2] = x1 * c - x2 * s, x2 * c + x1 * s
        return t

    return rot(q), rot(k)


def test_rotary_embedding_hits_and_misses(recorded):
    hs = 16

    def fn(pos, q, k, cs, neox=True, hw="h200"):
        TR.rotary_embedding(pos, q, k, cs, hs, neox, hw=hw)
        return q.view(q.shape[0], -1, hs), k.view(k.shape[0], -1, hs)

    def case(neox=True, hw="h200", offset=0, dtype=torch.float32, seed=0):
        pos = torch.tensor([3, 0, 7])
        q, k = view((3, 4 * hs), dtype, offset, seed), view((3, 2 * hs), dtype, 0, seed + 1)
        return (pos, q, k, view((8, hs), seed=9), neox, hw)

    def checked(args, miss):
        ref = rope_ref(args[0], args[1].clone(), args[2].clone(), args[3], hs, args[4])
        tol = 1e-5 if args[1].dtype == torch.float32 else 2e-3
        check(fn, args, lambda *a: ref, recorded, "rotary_embedding", miss=miss, tol=tol)

    checked(case(), True)
    checked(case(seed=4), False)
    for kw in ({"neox": False}, {"hw": "a100"}, {"offset": 2}, {"dtype": torch.float16}):
        checked(case(**kw), True)
        checked(case(**kw, seed=6), False)


def test_reshape_and_cache_hits_and_misses(recorded):
    def fn(key, value, slots, kc_shape=(4, 2, 2, 8)):
        kc, vc = torch.zeros(kc_shape), torch.zeros(kc_shape)
        C.reshape_and_cache(key, value, kc, vc, slots, hw="h200")
        return kc, vc

    def ref(key, value, slots, kc_shape=(4, 2, 2, 8)):
        kc, vc = torch.zeros(kc_shape), torch.zeros(kc_shape)
        kc.view(-1, *kc_shape[2:])[slots] = key[: len(slots)]
        vc.view(-1, *kc_shape[2:])[slots] = value[: len(slots)]
        return kc, vc

    slots = torch.tensor([0, 3, 5])
    check(fn, (view((3, 2, 8)), view((3, 2, 8), seed=1), slots), ref, recorded, "reshape_and_cache", miss=True, tol=0)
    # Another slot mapping (contents are never read on the host): a hit, written where it says.
    check(
        fn,
        (view((3, 2, 8), seed=2), view((3, 2, 8), seed=3), torch.tensor([7, 1, 2])),
        ref,
        recorded,
        "reshape_and_cache",
        miss=False,
        tol=0,
    )
    for args in (
        (view((3, 2, 8), offset=1), view((3, 2, 8)), slots),  # misaligned key
        (view((3, 2, 16))[:, :, :8], view((3, 2, 8)), slots),  # strided heads
        (view((3, 2, 8)), view((3, 2, 8)), slots[:1]),  # one token
        (view((3, 2, 8)), view((3, 2, 8)), slots.int()),  # int32 slots
        (view((3, 2, 8)), view((3, 2, 8)), torch.tensor([0, 9, 3, 9, 5])[::2]),  # strided slots: copied, no plan
    ):
        check(fn, args, ref, recorded, "reshape_and_cache", miss=True, tol=0)
        check(fn, args, ref, recorded, "reshape_and_cache", miss=False, tol=0)
    with pytest.raises(ValueError, match="slot_mapping must be 1-D"):
        fn(view((3, 2, 8)), view((3, 2, 8)), slots.view(3, 1))


def caches(n=2, shape=(6, 4, 2, 8), dtype=torch.float32, offset=0, seed=0):
    """n key and n value caches; with ``offset``, views that many elements into their storage."""
    made = [view(shape, dtype, offset, seed + i) for i in range(2 * n)]
    return made[:n], made[n:]


def copied(kcs, vcs, mapping, recorded, *, miss, hw="h200"):
    """copy_blocks on the caches (kept), a miss or a hit as said; each cache bitwise what the
    uncached path and the reference make of a copy of it."""
    before = [c.clone() for c in kcs + vcs]
    n = len(kcs)
    seen = len(recorded)
    C.copy_blocks(kcs, vcs, mapping, hw=hw)
    assert (len(recorded) - seen == 1) == miss and (not miss or recorded[-1] == "copy_blocks"), (recorded, miss)
    got = [c.clone() for c in kcs + vcs]
    for c, b in zip(kcs + vcs, before):
        c.copy_(b)
    uncached(lambda: C.copy_blocks(kcs, vcs, mapping, hw=hw))
    want = [c.clone() for c in kcs + vcs]
    ref = [b.clone() for b in before]
    src, dst = mapping[:, 0].long(), mapping[:, 1].long()
    for c in ref:
        c[dst] = c[src]
    for g, w, r in zip(got, want, ref, strict=True):
        assert torch.equal(g, w) and torch.equal(g, r)
    assert len(got) == 2 * n


def test_copy_blocks_hits_and_misses(recorded):
    kcs, vcs = caches()
    pairs = torch.tensor([[0, 3], [2, 5]])
    copied(kcs, vcs, pairs, recorded, miss=True)
    copied(kcs, vcs, torch.tensor([[1, 4], [5, 0]]), recorded, miss=False)  # another mapping: a hit
    for args in (
        (kcs, vcs, torch.tensor([[1, 4], [5, 0], [2, 3]])),  # three pairs
        (kcs, vcs, pairs.int()),  # int32 mapping
        (*caches(seed=4), pairs),  # other caches (other data pointers): another offset table
        (*caches(offset=1), pairs),  # misaligned caches: offsets in elements, not 16-byte units
        (*caches(dtype=torch.float16), pairs),  # dtype
        (kcs[:1], vcs[:1], pairs),  # one layer
        (kcs, vcs, pairs, "a100"),  # target
    ):
        copied(*args[:3], recorded, miss=True, hw=args[3] if len(args) > 3 else "h200")
        copied(*args[:3], recorded, miss=False, hw=args[3] if len(args) > 3 else "h200")
    assert call_cache.sizes()["copy_blocks"] == 8
    # A strided mapping is copied by the full path: no plan, still right every time.
    strided = torch.tensor([[0, 9, 3], [2, 9, 5]])[:, ::2]
    copied(kcs, vcs, strided, recorded, miss=True)
    copied(kcs, vcs, strided, recorded, miss=False)
    plans = call_cache.named("copy_blocks").plans
    assert len(plans) == 9 and sum(p is call_cache.NO_PLAN for p in plans.values()) == 1


def test_copy_blocks_bad_calls_raise_as_without_the_cache():
    kcs, vcs = caches()
    pairs = torch.tensor([[0, 3]])
    C.copy_blocks(kcs, vcs, pairs, hw="h200")
    # Same data pointers, another shape: a cache of the planned call viewed otherwise.
    other = vcs[1].view(6, 4, 16)
    for args in (
        (kcs, vcs[:1], pairs),  # counts differ
        (kcs, [vcs[0], other], pairs),  # a cache of another shape
        (kcs, [vcs[0], vcs[1].half()], pairs),  # another dtype
        (kcs, [vcs[0], "cache"], pairs),  # not a tensor
        (kcs, vcs, pairs.view(1, 2, 1)),  # mapping's shape
    ):
        errors = []
        for on in (True, False):
            with direct.enabled(on), pytest.raises((ValueError, TypeError, AttributeError)) as e:
                C.copy_blocks(*args, hw="h200")
            errors.append((type(e.value), str(e.value)))
        assert errors[0] == errors[1]
    assert call_cache.sizes()["copy_blocks"] == 1


# ---------------------------------------------------------------------------------------------
# scaled_mm (FP8): the scales are part of the class (their shapes choose the scaling)

FP8 = torch.float8_e4m3fn


def fp8_problem(M, N, K, seed=0):
    # a (M, K) and b (K, N) as e4m3 (b the transposed view of a row-major weight), values exact in
    # e4m3 so the float64 reference multiplies what the kernel does.
    a = view((M, K), seed=seed).clamp(-8, 8).to(FP8)
    b = view((N, K), seed=seed + 1).clamp(-8, 8).to(FP8).t()
    return a, b


def fp8_scales(M, N, K, scaling, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = {"tensor": ((), ()), "rowwise": ((M, 1), (1, N)), "block": ((M, K // 128), (K // 128, N // 128))}
    sa, sb = shapes[scaling]
    return torch.rand(sa, generator=g) + 0.5, torch.rand(sb, generator=g) + 0.5


def smm_ref(a, b, sa, sb, out_dtype=torch.float32):
    # float64 C of the dequantized inputs, each scale broadcast over its block.
    def full(s, rows, cols, block_rows):
        s = s.double()
        if s.dim() == 2 and s.shape not in ((rows, 1), (1, cols)):
            s = s.repeat_interleave(block_rows, 0).repeat_interleave(128, 1)[:rows, :cols]
        return s

    M, K = a.shape
    N = b.shape[1]
    return (a.double() * full(sa, M, K, 1)) @ (b.double() * full(sb, K, N, 128))


@pytest.mark.parametrize("scaling", ["tensor", "rowwise", "block"])
def test_scaled_mm_hits_and_misses(recorded, scaling):
    fn = lambda a, b, sa, sb, hw="h200": SMM.scaled_mm(a, b, sa, sb, out_dtype=torch.float32, hw=hw)  # noqa: E731
    M, N, K = 5, 128, 256
    args = (*fp8_problem(M, N, K), *fp8_scales(M, N, K, scaling))
    check(fn, args, smm_ref, recorded, "scaled_mm", miss=True, tol=1e-4)
    # New data (and new scale values) of the same class: a hit.
    check(fn, (*fp8_problem(M, N, K, 2), *fp8_scales(M, N, K, scaling, 3)), smm_ref, recorded, "scaled_mm",
          miss=False, tol=1e-4)  # fmt: skip
    assert call_cache.sizes()["scaled_mm"] == 1
    a, b, sa, sb = args
    for other in (
        (fp8_problem(3, N, K)[0], b, *fp8_scales(3, N, K, scaling)),  # another M
        (a, b.contiguous(), sa, sb),  # row-major b: another stride
        (a, b, sa, sb, "h100"),  # another target
    ):
        check(fn, other, smm_ref, recorded, "scaled_mm", miss=True, tol=1e-4)
        check(fn, other, smm_ref, recorded, "scaled_mm", miss=False, tol=1e-4)
    assert call_cache.sizes()["scaled_mm"] == 4


def test_scaled_mm_scales_of_another_shape_or_one_tensor_for_both(recorded):
    fn = lambda a, b, sa, sb: SMM.scaled_mm(a, b, sa, sb, out_dtype=torch.float32, hw="h200")  # noqa: E731
    M, N, K = 4, 128, 256
    a, b = fp8_problem(M, N, K)
    sa, sb = fp8_scales(M, N, K, "tensor")
    check(fn, (a, b, sa, sb), smm_ref, recorded, "scaled_mm", miss=True, tol=1e-4)
    # Per-row/column scales after per-tensor ones: another class, never the tensor plan.
    check(fn, (a, b, *fp8_scales(M, N, K, "rowwise")), smm_ref, recorded, "scaled_mm", miss=True, tol=1e-4)
    # One tensor as both scales: a class of its own, planned (no recording on the second call) ...
    one = torch.tensor(0.75)
    check(fn, (a, b, one, one), smm_ref, recorded, "scaled_mm", miss=True, tol=1e-4)
    check(fn, (a, b, one, one), smm_ref, recorded, "scaled_mm", miss=False, tol=1e-4)
    # ... and two tensors after it take their own plan, each scale read from its own place.
    check(fn, (a, b, torch.tensor(0.5), torch.tensor(2.0)), smm_ref, recorded, "scaled_mm", miss=False, tol=1e-4)
    assert call_cache.sizes()["scaled_mm"] == 3


def test_scaled_mm_into_out_and_bad_calls_raise_as_without_the_cache(recorded):
    M, N, K = 4, 128, 256
    a, b = fp8_problem(M, N, K)
    sa, sb = fp8_scales(M, N, K, "rowwise")
    out = torch.empty(M, N, dtype=torch.float16)
    for _ in range(2):
        got = SMM.scaled_mm(a, b, sa, sb, out_dtype=torch.float16, out=out, hw="h200")
        assert got is out
        torch.testing.assert_close(out.double(), smm_ref(a, b, sa, sb), rtol=2e-3, atol=2e-3)
    assert recorded == ["scaled_mm"]
    bad = (
        (a, b, sa[:3], sb, torch.float16, None),  # scale_a's shape
        (a, b, sa.double(), sb, torch.float16, None),  # scale_a's dtype
        (a, b, sa, sb, torch.float16, torch.empty(M, N + 1, dtype=torch.float16)),  # out's shape
        (a, b, sa, sb, torch.float32, out),  # out's dtype against out_dtype
        (a, b[:128], sa, sb, torch.float16, None),  # inner dimensions
    )
    for a_, b_, sa_, sb_, dt, o in bad:
        errors = []
        for on in (True, False):
            with direct.enabled(on), pytest.raises((ValueError, TypeError)) as e:
                SMM.scaled_mm(a_, b_, sa_, sb_, out_dtype=dt, out=o, hw="h200")
            errors.append((type(e.value), str(e.value)))
        assert errors[0] == errors[1]
    assert call_cache.sizes()["scaled_mm"] == 1


# ---------------------------------------------------------------------------------------------
# Bounds and switches


def test_each_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(call_cache, "LIMIT", 2)
    sizes = []
    for rows in (1, 2, 3, 4, 5):
        x = view((rows, 64))
        torch.testing.assert_close(TR.silu_and_mul(x, hw="h200").double(), silu_ref(x), rtol=1e-5, atol=1e-5)
        sizes.append(call_cache.sizes()["silu_and_mul"])
    assert sizes == [1, 2, 1, 2, 1]


def test_no_plans_inside_a_compile_only_scope():
    seen = []
    with launch.compile_only(lambda kernel, grid, args, kwargs: seen.append(kernel)):
        TR.silu_and_mul(view((3, 64)), hw="h200")
        TR.silu_and_mul(view((3, 64)), hw="h200")
    assert len(seen) == 2 and call_cache.sizes()["silu_and_mul"] == 0
    TR.silu_and_mul(view((3, 64)), hw="h200")
    assert call_cache.sizes()["silu_and_mul"] == 1
    with launch.compile_only(lambda kernel, grid, args, kwargs: seen.append(kernel)):
        TR.silu_and_mul(view((3, 64)), hw="h200")  # a class with a plan: still handed to the scope
    assert len(seen) == 3


def test_off_with_direct_launches():
    # The in-code switch; POLICY_RUNTIME_DIRECT_LAUNCH=0, in a fresh process, is checked with the
    # direct launches' (tests/test_direct_launch.py: no plan either way then).
    with direct.enabled(False):
        TR.silu_and_mul(view((3, 64)), hw="h200")
    assert call_cache.sizes()["silu_and_mul"] == 0
