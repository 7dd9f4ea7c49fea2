"""policy_runtime/direct.py on the CPU (Triton's interpreter): the launch class keys exactly what
Triton specializes on, a call of a new class (a misaligned view, another stride, an int that
becomes 1, another dtype, a non-contiguous input) makes a new entry and gets the right result,
the cache is bounded, results are the same with it off, the interpreter's fallback is the one
named, and the argument assembly of a compiled entry (checked with a stand-in compiled kernel)."""

import os
import subprocess
import sys
import threading

import pytest
import torch
import triton
import triton.language as tl

from conftest import REPO
from generated import cache as C
from generated import matmul as MM
from generated import moe as MOE
from generated import transform as TR
from policy_runtime import call_cache, direct, launch

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU paths; the GPU test is test_direct_launch_gpu")


@triton.jit
def _scale_kernel(x_ptr, out_ptr, n, stride, factor, BLOCK: tl.constexpr, SHIFT: tl.constexpr = 0.0):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs * stride, mask=mask)
    tl.store(out_ptr + offs, x * factor + SHIFT, mask=mask)


@pytest.fixture(autouse=True)
def fresh_cache():
    direct.clear()
    with direct.enabled(True):
        yield
    direct.clear()


def scale(x, n, stride, factor=2.0, **kw):
    out = torch.zeros(n, dtype=x.dtype)
    launch.launch_kernel(_scale_kernel, (triton.cdiv(n, 16),), x, out, n, stride, factor, BLOCK=16, **kw)
    return out


def key(*args, **kwargs):
    return direct.launch_class(_scale_kernel, args, kwargs)


def test_the_class_keys_what_triton_specializes_on():
    x = torch.zeros(64)
    out = torch.zeros(64)
    base = key(x, out, 32, 2, 1.0, BLOCK=16)
    assert key(x, out, 48, 2, 3.5, BLOCK=16) == base  # same classes: n % 16 == 0, float values free
    assert key(torch.zeros(64), out, 32, 2, 1.0, BLOCK=16) == base  # another aligned tensor
    different = {
        "misaligned pointer (storage offset 1)": key(x[1:], out, 32, 2, 1.0, BLOCK=16),
        "n not a multiple of 16": key(x, out, 33, 2, 1.0, BLOCK=16),
        "stride 1": key(x, out, 32, 1, 1.0, BLOCK=16),
        "stride 16": key(x, out, 32, 16, 1.0, BLOCK=16),
        "n past 32 bits": key(x, out, 2**31 + 16, 2, 1.0, BLOCK=16),
        "dtype": key(x.half(), out, 32, 2, 1.0, BLOCK=16),
        "constexpr value": key(x, out, 32, 2, 1.0, BLOCK=32),
        "constexpr given by name": key(x, out, 32, 2, 1.0, BLOCK=16, SHIFT=1.0),
        "option": key(x, out, 32, 2, 1.0, BLOCK=16, num_warps=2),
        "bool for an int": key(x, out, 32, True, 1.0, BLOCK=16),
    }
    assert all(k != base for k in different.values()), [n for n, k in different.items() if k == base]
    assert len(set(different.values())) == len(different)
    # n = 17 and n = 33 are one class for Triton (not 1, not % 16): one entry serves both.
    assert key(x, out, 17, 2, 1.0, BLOCK=16) == key(x, out, 33, 2, 1.0, BLOCK=16)
    with pytest.raises(TypeError):  # a list is unhashable: launch() leaves such a launch to Triton
        hash(key(x, out, [1], 2, 1.0, BLOCK=16))


def test_a_new_class_makes_an_entry_and_reuses_nothing_of_another():
    buf = torch.arange(80, dtype=torch.float32)
    got = scale(buf, 33, 1)
    assert torch.equal(got, buf[:33] * 2) and direct.size() == 1
    got = scale(buf, 17, 1, factor=3.0)  # the same class: the entry is hit, the result is this call's
    assert torch.equal(got, buf[:17] * 3) and direct.size() == 1
    got = scale(buf[1:], 33, 1)  # misaligned view of the same storage
    assert torch.equal(got, buf[1:34] * 2) and direct.size() == 2
    got = scale(buf, 33, 2)  # stride 2
    assert torch.equal(got, buf[0:66:2] * 2) and direct.size() == 3
    got = scale(buf, 1, 1)  # n == 1: a constant for Triton
    assert torch.equal(got, buf[:1] * 2) and direct.size() == 4
    got = scale(buf.half(), 33, 1)
    assert torch.equal(got, (buf[:33] * 2).half()) and direct.size() == 5
    got = scale(buf, 33, 1, SHIFT=0.5)
    assert torch.equal(got, buf[:33] * 2 + 0.5) and direct.size() == 6


def test_the_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(direct, "LIMIT", 3)
    buf = torch.arange(64, dtype=torch.float32)
    sizes = []
    for view, n, stride in ((buf, 33, 1), (buf, 31, 2), (buf, 1, 1), (buf[1:], 33, 1), (buf, 4, 16)):  # 5 classes
        got = scale(view, n, stride)
        assert torch.equal(got, view[: n * stride : stride] * 2)
        sizes.append(direct.size())
    assert sizes == [1, 2, 3, 1, 2]  # cleared when full, then filled again


def test_off_means_every_launch_through_triton(monkeypatch):
    buf = torch.arange(64, dtype=torch.float32)
    with direct.enabled(False):
        assert torch.equal(scale(buf, 33, 1), buf[:33] * 2)
    assert direct.size() == 0


def test_the_interpreters_fallback_is_named_and_hits_go_through_it(monkeypatch):
    calls = []
    real = direct.interpreted_launch

    def counted(kernel, grid, args, kwargs):
        calls.append(kernel)
        real(kernel, grid, args, kwargs)

    monkeypatch.setattr(direct, "interpreted_launch", counted)
    buf = torch.arange(64, dtype=torch.float32)
    for _ in range(3):
        assert torch.equal(scale(buf, 33, 1), buf[:33] * 2)
    assert calls == [_scale_kernel] * 3 and direct.size() == 1
    (entry,) = direct._CACHE.values()
    assert entry.compiled is None  # no CompiledKernel under the interpreter


def test_a_compiled_entry_passes_the_bound_arguments_in_signature_order(monkeypatch):
    """The GPU path of an entry, with a stand-in for Triton's CompiledKernel: positional
    arguments, then those given by name, then the defaults, after Triton's launch header."""
    seen = []

    class Compiled:
        function, packed_metadata = "fn", "meta"

        def run(self, *args):
            seen.append(args)

        def launch_metadata(self, *args):  # only with a launch hook set
            raise AssertionError("no hook is set")

    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 77, raising=False)
    x, out = torch.zeros(4), torch.zeros(4)
    args, kwargs = (x, out, 4, 1, 2.0), {"BLOCK": 16, "num_warps": 1}
    entry = direct._entry(_scale_kernel, Compiled(), args, kwargs)
    args2, kwargs2 = (x, out, 4, 1), {"SHIFT": 1.0, "BLOCK": 16, "factor": 2.0}
    entry2 = direct._entry(_scale_kernel, Compiled(), args2, kwargs2)
    monkeypatch.setattr(direct, "INTERPRET", False)
    entry((3, 2), args, kwargs, 0)
    hooks = (triton.knobs.runtime.launch_enter_hook, triton.knobs.runtime.launch_exit_hook)
    assert seen == [(3, 2, 1, 77, "fn", "meta", None, *hooks, x, out, 4, 1, 2.0, 16, 0.0)]
    # Named arguments in another order than the signature's are put in the signature's order.
    seen.clear()
    entry2((1,), args2, kwargs2, 0)
    assert seen[0][9:] == (x, out, 4, 1, 2.0, 16, 1.0)


def test_a_wrapper_without_run_goes_through_its_own_launch(monkeypatch):
    """The compiled path given an object that is not a JITFunction and has no ``run`` (the tile
    sweep's kernels with some constexprs fixed, bench/attention_sweep.py's Bound): launched as
    ``kernel[grid](...)``, every time, no entry made, and a recording call told it cannot replay."""
    launched = []

    class Wrapper:
        fn = _scale_kernel.fn

        def __getitem__(self, grid):
            return lambda *a, **kw: launched.append((grid, a, kw))

    monkeypatch.setattr(direct, "INTERPRET", False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    x, out = torch.zeros(4), torch.zeros(4)
    wrapper = Wrapper()
    rec = []
    monkeypatch.setitem(direct.RECORDERS, threading.get_ident(), rec)  # as CallCache.record sets it
    for _ in range(2):
        direct.launch(wrapper, (1,), (x, out, 4, 1, 2.0), {"num_warps": 1})
    assert launched == [((1,), (x, out, 4, 1, 2.0), {"num_warps": 1})] * 2
    assert direct.size() == 0
    assert rec == [None, None]


# ---------------------------------------------------------------------------------------------
# The public entry points: a call of another class makes an entry and is right.


def calls_of(fn, *argsets):
    """fn on each argument set with the cache on (counting new entries), then off; the outputs.
    Both caches start empty: what other tests of this process made is not counted as a hit here."""
    direct.clear()
    call_cache.clear_all()
    on, made = [], []
    for args in argsets:
        before = direct.size()
        on.append(fn(*args))
        made.append(direct.size() - before)
    with direct.enabled(False):
        off = [fn(*args) for args in argsets]
    return on, off, made


def test_matmul_triton_a_misaligned_b_after_an_aligned_a():
    torch.manual_seed(0)
    storage = torch.randn(5 * 24 + 1, dtype=torch.float32)
    b = torch.randn(24, 7, dtype=torch.float32)
    a = storage[:-1].view(5, 24)
    a_misaligned = storage[1:].view(5, 24)  # same shape and strides, data_ptr % 16 == 4
    a_strided = torch.randn(24, 5, dtype=torch.float32).t()  # column-major: another stride class
    a_one = storage[:24].view(1, 24)  # M == 1
    fn = lambda a_: MM.matmul_triton(a_, b, hw="h200")  # noqa: E731
    on, off, made = calls_of(fn, (a,), (a_misaligned,), (a,), (a_strided,), (a_one,))
    assert made == [1, 1, 0, 1, 1]  # a's second call is a hit
    for a_, got, ref in zip((a, a_misaligned, a, a_strided, a_one), on, off):
        want = a_.double() @ b.double()
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)
        assert torch.equal(got, ref)


def test_transform_and_cache_entry_points_same_with_and_without_the_cache():
    torch.manual_seed(1)
    x = torch.randn(4, 257, dtype=torch.float16)
    w = torch.randn(257, dtype=torch.float16)
    xs = torch.randn(4 * 257 + 8, dtype=torch.float16)[8:].view(4, 257)  # 16-byte aligned again
    xm = torch.randn(4 * 257 + 1, dtype=torch.float16)[1:].view(4, 257)  # misaligned
    on, off, made = calls_of(lambda t: TR.rms_norm(t, w, 1e-6, hw="h200"), (x,), (xm,), (xs,))
    assert made[0] == 1 and made[1] == 1
    for t, got, ref in zip((x, xm, xs), on, off):
        want = t.double() * torch.rsqrt(t.double().pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
        torch.testing.assert_close(got.double(), want, rtol=2e-3, atol=2e-3)
        assert torch.equal(got, ref)
    gu = torch.randn(3, 64, dtype=torch.float32)
    gu_nc = torch.randn(3, 72, dtype=torch.float32)[:, 4:68]  # non-contiguous: row stride 72
    on, off, made = calls_of(lambda t: TR.silu_and_mul(t, hw="h200"), (gu,), (gu_nc,), (gu,))
    assert made == [1, 1, 0]
    for t, got, ref in zip((gu, gu_nc, gu), on, off):
        g, u = t.double()[:, :32], t.double()[:, 32:]
        torch.testing.assert_close(got.double(), g * torch.sigmoid(g) * u, rtol=1e-5, atol=1e-5)
        assert torch.equal(got, ref)
    kv = torch.randn(3, 2, 8, dtype=torch.float32)
    slots = torch.tensor([0, 3, 5])

    def cache(k):
        kc, vc = torch.zeros(4, 2, 2, 8), torch.zeros(4, 2, 2, 8)
        C.reshape_and_cache(k, k, kc, vc, slots, hw="h200")
        return kc

    kv_one = kv[:1]
    slots_one = slots[:1]
    on, off, made = calls_of(cache, (kv,), (kv[:, :, :],))
    assert made == [1, 0] and torch.equal(on[0], off[0])
    want = torch.zeros(4 * 2, 2, 8)
    want[slots] = kv
    assert torch.equal(on[0], want.view(4, 2, 2, 8))
    kc, vc = torch.zeros(4, 2, 2, 8), torch.zeros(4, 2, 2, 8)
    before = direct.size()
    C.reshape_and_cache(kv_one, kv_one, kc, vc, slots_one, hw="h200")  # one token: T == 1
    assert direct.size() == before + 1 and torch.equal(kc.view(8, 2, 8)[0], kv_one[0])


def test_moe_entry_points_same_with_and_without_the_cache():
    torch.manual_seed(2)
    E, H, inter, k = 4, 32, 16, 2
    x = torch.randn(3, H, dtype=torch.float32)
    w1, w2 = torch.randn(E, 2 * inter, H) / 8, torch.randn(E, H, inter) / 8
    logits = torch.randn(3, E)
    wts, ids = MOE.topk_softmax(logits, k, True)
    fn = lambda t: MOE.fused_moe(t, w1, w2, wts, ids, hw="h200")  # noqa: E731
    on, off, made = calls_of(fn, (x,), (x.clone(),))
    assert made[0] >= 2 and made[1] == 0  # up and down GEMMs, then hits
    assert torch.equal(on[0], off[0]) and torch.equal(on[1], off[1])
    ref = torch.zeros(3, H, dtype=torch.float64)
    for t in range(3):
        for j in range(k):
            e = int(ids[t, j])
            h = w1[e].double() @ x[t].double()
            act = torch.nn.functional.silu(h[:inter]) * h[inter:]
            ref[t] += wts[t, j].double() * (w2[e].double() @ act)
    torch.testing.assert_close(on[0].double(), ref, rtol=1e-3, atol=1e-3)


def test_the_environment_variable_turns_the_cache_off():
    """POLICY_RUNTIME_DIRECT_LAUNCH=0 turns off the direct launches and with them the call caches
    (tests/test_call_cache.py's test_off_with_direct_launches checks the in-code switch): silu_and_mul
    and matmul_triton called twice each remember one launch class and one plan each, or none."""
    code = (
        "import torch; from policy_runtime import call_cache, direct; from generated import transform as TR;"
        "from generated import matmul as MM;"
        "[TR.silu_and_mul(torch.randn(2, 32), hw='h200') for _ in range(2)];"
        "[MM.matmul_triton(torch.randn(2, 8), torch.randn(8, 4), hw='h200') for _ in range(2)];"
        "print(direct.ENABLED, direct.size(), sum(call_cache.sizes().values()))"
    )
    for value, want in (("0", "False 0 0"), ("1", "True 2 2")):
        env = dict(os.environ, TRITON_INTERPRET="1", POLICY_RUNTIME_DIRECT_LAUNCH=value)
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.split() == want.split()


def test_one_device_guard_for_every_launch(monkeypatch):
    calls = []
    monkeypatch.setattr(launch, "ready_triton", lambda: calls.append(1) or setattr(launch, "FIRST_LAUNCH", False))
    monkeypatch.setattr(launch, "FIRST_LAUNCH", True)
    with launch.on_device(torch.zeros(1)) as g:
        assert g is None  # a CPU tensor: no guard
    with launch.on_device(torch.zeros(1)):
        pass
    assert calls == [1]  # Triton's setup once, before the first launch
    import policy_runtime.attention.ops as at
    import policy_runtime.matmul.ops as mm
    import policy_runtime.moe.ops as mo
    import policy_runtime.scaled_mm.ops as sm

    for mod in (at, mm, mo, sm):
        src = open(mod.__file__).read()
        assert "torch.cuda.device(" not in src and "on_device(" in src, mod.__name__
