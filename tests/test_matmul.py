"""generated/matmul.py: every specialized kernel on ragged shapes, bucket selection, errors.

The kernel bodies and the host side (launchers, workspaces, checks) are policy_runtime/matmul/ops.py's:
tests of internals read and patch them there (``rt``).

On a machine without a GPU these run in Triton's interpreter (tests/conftest.py sets
TRITON_INTERPRET=1), which cannot do bf16 arithmetic: fp16 and fp32 are tested there, and
bf16 too where a GPU runs the tests (every 16-bit kernel on its ragged shapes).
"""

import ast
import dataclasses
import inspect

import pytest
import torch
import triton

from generated import matmul as mm
from generated.dispatch import HARDWARE
from policy_runtime import launch
from policy_runtime.matmul import ops as rt  # the kernel bodies and host side mm delegates to

TOL = {torch.float16: 3e-3, torch.float32: 2e-5, torch.bfloat16: 1e-2}
GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"


def operands(M, N, K, dtype, *, b_transposed=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(M, K, generator=g).to(dtype)
    if b_transposed:  # B as the .T view of an (N, K) weight, as nn.Linear stores it
        b = torch.randn(N, K, generator=g).to(dtype).t()
    else:
        b = torch.randn(K, N, generator=g).to(dtype)
    return a.to(DEVICE), b.to(DEVICE)


def check(run, M, N, K, dtype, **kw):
    a, b = operands(M, N, K, dtype, **kw)
    ref = a.double().cpu() @ b.double().cpu()
    out = torch.full((M, N), float("nan"), dtype=dtype, device=DEVICE)  # poison: every element must be written
    got = run(a, b, out)
    assert got is out
    assert not torch.isnan(out).any(), "unwritten output elements"
    err = ((out.double().cpu() - ref).norm() / ref.norm()).item()
    assert err < TOL[dtype], f"{(M, N, K)} {dtype}: relative error {err:.2e}"
    return out


def dtype_of(variant_name):
    return torch.float32 if "_fp32_" in variant_name else torch.float16


def dtypes_of(variant_name):
    """The dtypes a kernel is checked in: its 16-bit kernels serve bf16 too, whose arithmetic
    only a GPU does right."""
    d = dtype_of(variant_name)
    return [d, torch.bfloat16] if GPU and d == torch.float16 else [d]


def shapes_for(v):
    """Ragged shapes for one kernel: M = 1, sizes that are multiples of no tile, K < BLOCK_K."""
    if v.kind == "small_m":
        return [(1, 70, 50, False), (7, 130, 300, True)]
    if v.kind == "grouped":
        return [(1, 37, 50, False), (33, 70, 20, False), (19, 130, 300, True)]
    # tma_persistent: TMA-describable operands (rows of a multiple of 16 bytes) run the TMA kernel;
    # K = 50 rows are not, and take the pointer fallback with the same tiles.
    return [(33, 72, 48, False), (130, 264, 40, True), (9, 40, 50, False)]


@pytest.mark.parametrize("name", sorted(mm.VARIANTS))
def test_every_kernel_on_ragged_shapes(name):
    """Each kernel on its ragged shapes.  A split-K kernel's fix-up leaves its counters reset
    after every launch (read back), and is deterministic: its shape of the most tiles is launched
    again, on the partials and counters the first launch left, and gives the same bits."""
    v = mm.VARIANTS[name]
    shapes = shapes_for(v)
    again = max(shapes, key=lambda s: triton.cdiv(s[0], v.block_m) * triton.cdiv(s[1], v.block_n))
    for dtype in dtypes_of(name):
        for M, N, K, bt in shapes:

            def run(a, b, out):
                v.launch(a, b, out, M, N, K)
                return out

            first = check(run, M, N, K, dtype, b_transposed=bt)
            if v.split_k > 1:
                counters = [t for k, t in rt._WORKSPACES.items() if k[2] == "split_k_counters"]
                assert counters and not any(bool(torch.count_nonzero(t)) for t in counters)
                if (M, N, K, bt) == again:
                    assert torch.equal(check(run, M, N, K, dtype, b_transposed=bt), first)


def test_every_target_and_dtype_has_a_policy_whose_buckets_all_run():
    """Each target's policy, both dtype classes: every bucket names an emitted kernel (a TMA
    kernel also its pointer fallback), and every emitted kernel serves some bucket."""
    seen = set()
    for target in sorted(HARDWARE):
        for dtype in (torch.float16, torch.float32):
            for bucket in mm.buckets(target, dtype):
                v = bucket.triton
                seen.add(v.name)
                if v.fallback is not None:  # a TMA kernel's pointer kernel, for other operands
                    assert v.kind == "tma_persistent" and v.fallback.kind == "grouped"
                    assert mm.VARIANTS[v.fallback.name] is v.fallback
                    seen.add(v.fallback.name)
    assert seen == set(mm.VARIANTS)  # and every kernel emitted serves some bucket


# Body constant -> the Variant field the launcher reads it from (grids, split-K buffers).
RECORD_FIELD_OF = {
    "BLOCK_M": "block_m",
    "BLOCK_N": "block_n",
    "BLOCK_K": "block_k",
    "GROUP_M": "group_m",
    "SPLIT_K": "split_k",
    "STAGES": "num_stages",
    "NUM_PROGS": "num_programs",
}


def test_each_record_holds_the_constants_its_kernel_bakes_in():
    """A specialized kernel calls its body (policy_runtime.matmul) with its constants as keyword
    arguments; its Variant record, from which the launcher sizes grids and workspaces, holds the
    same values."""
    for name, v in mm.VARIANTS.items():
        tree = ast.parse(inspect.getsource(v.kernel.fn))
        (call,) = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == f"{v.kind}_body"]
        consts = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
        assert {c: consts[c] for c in RECORD_FIELD_OF if c in consts} == {
            c: getattr(v, f) for c, f in RECORD_FIELD_OF.items() if c in consts
        }, name
        assert consts["DOT_PREC"] == ("ieee" if dtype_of(name) == torch.float32 else "tf32"), name
        assert v.name == name and v.kernel.fn.__module__ == mm.__name__


# Bucket choices of the H200 policy (specs/kernels/matmul.toml, nvidia>=90), as data:
# (shape, bucket, library for every call, library for eager calls only).
H200_BUCKETS = [
    ((1, 4096, 4096), "decode", True, False),
    ((16, 11008, 2048), "decode_wide", False, True),
    ((8, 4096, 4096), "decode", True, False),
    ((128, 4096, 4096), "small", True, False),
    ((64, 11008, 4096), "small", True, False),
    ((129, 2048, 4096), "medium_narrow", True, False),
    ((256, 1024, 4096), "medium_narrow", True, False),
    ((256, 4096, 4096), "medium", True, False),
    ((200, 11008, 4096), "medium_wide", True, False),
    ((256, 8191, 4096), "medium", True, False),
    ((2048, 512, 2048), "narrow", True, False),
    ((300, 1024, 4096), "narrow", True, False),
    ((5120, 512, 2048), "large", True, False),
    ((8192, 512, 8192), "deep", True, False),
    ((8192, 8192, 8192), "huge", False, False),
    ((5120, 11008, 2048), "wide", True, False),
    ((5120, 2048, 11008), "deep", True, False),
    ((5120, 2048, 8192), "deep", True, False),
    ((5120, 2048, 8191), "large", True, False),
    ((5120, 2048, 2048), "large", True, False),
]


@pytest.mark.parametrize("shape, bucket, library, eager_library", H200_BUCKETS)
def test_h200_bucket_selection(shape, bucket, library, eager_library):
    for hw in ("h200", "h100", HARDWARE["h200"]):
        chosen = mm.select(*shape, dtype=torch.bfloat16, hw=hw)
        assert (chosen.name, chosen.library, chosen.eager_library) == (bucket, library, eager_library)


def test_h200_table_holds_only_its_amends_of_the_shared_one():
    # h200's policy amends nvidia>=90's four buckets; the other seven are h100's own objects
    # (slices of the shared table), not copies, and h200 selects through the shared bounds.
    for dtype in (torch.bfloat16, torch.float32):
        h100, h200 = mm.buckets("h100", dtype), mm.buckets("h200", dtype)
        assert [b.name for b in h100] == [b.name for b in h200]
        own = [b.name for b, s in zip(h200, h100) if b is not s]
        assert own == ["decode_wide", "wide", "deep", "large"]
        assert all(b == s for b, s in zip(h200, h100) if b.name not in own)


@pytest.mark.parametrize(
    "shape, bucket, library",
    [((5120, 11008, 2048), "mlp_up", False), ((5120, 11008, 9000), "any", True), ((5120, 2048, 2048), "any", True)],
)
def test_gb10_follows_the_seed_dispatch(shape, bucket, library):
    chosen = mm.select(*shape, dtype=torch.bfloat16, hw="gb10")
    assert (chosen.name, chosen.library) == (bucket, library)
    if bucket == "mlp_up":
        # The seed's 3-stage 128x256x64 does not fit 101,376 B; the policy keeps 2 stages.
        v = chosen.triton
        assert (v.block_m, v.block_n, v.block_k, v.num_stages) == (128, 256, 64, 2)


def test_bi_v100_runs_one_stage_pointer_kernels():
    for dtype in (torch.float16, torch.float32):
        for bucket in mm.buckets("bi_v100", dtype):
            assert not bucket.library
            assert bucket.triton.kind in ("grouped", "small_m")
            assert bucket.triton.num_stages == 1


@pytest.mark.parametrize("target", ["h200", "gb10", "bi_v100", "a10"])
def test_matmul_through_the_policy(target):
    """matmul() on Triton and library buckets alike, ragged and transposed."""
    for M, N, K, bt in [(1, 70, 40, False), (37, 4100, 24, True), (300, 520, 72, False)]:
        check(lambda a, b, out: mm.matmul(a, b, out=out, hw=target), M, N, K, torch.float16, b_transposed=bt)
        out = mm.matmul(*operands(M, N, K, torch.float32, b_transposed=bt), hw=target)
        assert out.shape == (M, N) and out.dtype == torch.float32


def test_library_bucket_calls_torch_matmul_and_triton_bucket_does_not(monkeypatch):
    calls = []
    real = torch.matmul
    monkeypatch.setattr(torch, "matmul", lambda *a, **k: calls.append(1) or real(*a, **k))
    a, b = operands(128, 96, 64, torch.float16)
    mm.matmul(a, b, hw="h200")  # "small" bucket: library
    assert calls == [1]
    mm.matmul_triton(a, b, hw="h200")  # forced Triton
    a, b = operands(40, 96, 64, torch.float16)
    assert not mm.select(40, 96, 64, dtype=torch.float16, hw="bi_v100").eager_library
    mm.matmul(a, b, hw="bi_v100")  # "any" bucket: Triton for every call
    assert calls == [1]


def test_decode_buckets_run_triton_only_in_graph_capture(monkeypatch):
    """A triton_in_graphs bucket: torch.matmul for an eager call, the Triton kernel for a call
    being captured into a CUDA graph (faked here: the interpreter has no graphs), either way
    the right product; matmul_triton always runs the kernel."""
    calls, launches = [], []
    real_matmul, real_launch = torch.matmul, rt.Variant.launch
    monkeypatch.setattr(torch, "matmul", lambda *a, **k: calls.append(1) or real_matmul(*a, **k))
    monkeypatch.setattr(rt.Variant, "launch", lambda self, *a: launches.append(self.name) or real_launch(self, *a))
    capturing = [False]
    monkeypatch.setattr(rt, "_capturing", lambda a: capturing[0])
    for hw, (M, N, K) in [("h200", (16, 8200, 40)), ("a100", (8, 96, 64))]:  # decode_wide; Ampere's decode
        bucket = mm.select(M, N, K, dtype=torch.float16, hw=hw)
        assert bucket.eager_library and not bucket.library
        run = lambda a, b, out: mm.matmul(a, b, out=out, hw=hw)  # noqa: E731
        calls.clear(), launches.clear()
        check(run, M, N, K, torch.float16)
        assert (calls, launches) == ([1], [])
        capturing[0] = True
        check(run, M, N, K, torch.float16)
        assert (calls, launches) == ([1], [bucket.triton.name])
        capturing[0] = False
        check(lambda a, b, out: mm.matmul_triton(a, b, out=out, hw=hw), M, N, K, torch.float16)
        assert (calls, launches) == ([1], [bucket.triton.name] * 2)


# Split-K buckets of the H200 policy: (bucket, GPU shapes, a shape small enough for the interpreter,
# run through the bucket's kernel).
CAPTURED_SPLITS = [
    ("decode", [(8, 4096, 4096), (4, 4096, 4096)], (8, 96, 64)),  # small_m: every tile split
    ("deep", [(5120, 2048, 11008), (4480, 2048, 9000)], (130, 264, 128)),  # TMA: the last wave
]


@pytest.mark.parametrize("spare", [True, False], ids=["spare counters", "counters made in capture"])
@pytest.mark.parametrize("bucket, shapes, cpu_shape", CAPTURED_SPLITS)
def test_captured_split_k_launches_find_zero_counters(bucket, shapes, cpu_shape, spare, monkeypatch):
    """A split-K launch being captured into a CUDA graph must find its counters at zero on
    every replay.  With a spare (zeroed by an earlier eager split launch) the capture takes it
    and records no reset.  Without one, its counters are made in the graph's pool, whose
    zero-fill runs only when that graph replays, and graphs sharing a pool overwrite each
    other's freed memory: each captured launch then records a reset of its counters.  On a GPU:
    real graphs in one shared pool, replayed out of capture order between replays of a graph that
    scribbles on the pool.  Without a GPU: capture faked, pool-made counters filled with garbage."""
    (v,) = {mm.select(*shape, dtype=torch.float16, hw="h200").triton for shape in shapes}
    for M, N, K in shapes + [cpu_shape]:
        tiles = triton.cdiv(M, v.block_m) * triton.cdiv(N, v.block_n)
        assert rt.split_count(v, tiles) > 1
    assert {mm.select(*shape, hw="h200").name for shape in shapes} == {bucket}
    monkeypatch.setattr(rt, "_WORKSPACES", {})
    monkeypatch.setattr(rt, "_UNZEROED", set())
    monkeypatch.setattr(rt, "_SPARE_COUNTERS", {})
    if not GPU:
        run = lambda a, b, out: v.launch(a, b, out, *cpu_shape) or out  # noqa: E731
        check(run, *cpu_shape, torch.float16)  # eager: makes the spare
        spare_buf = rt._SPARE_COUNTERS[torch.device("cpu")]
        if not spare:
            rt._SPARE_COUNTERS.clear()
        monkeypatch.setattr(rt, "_capturing", lambda a: True)
        check(run, *cpu_shape, torch.float16)
        ((key, cnt),) = [(k, t) for k, t in rt._WORKSPACES.items() if k[2] == "split_k_counters (graphs)"]
        assert (cnt is spare_buf) == spare and (key in rt._UNZEROED) == (not spare)
        if not spare:
            cnt.fill_(7)  # what the pool may hold: the launch must reset it
        check(run, *cpu_shape, torch.float16)
        tiles = triton.cdiv(cpu_shape[0], v.block_m) * triton.cdiv(cpu_shape[1], v.block_n)
        assert not bool(torch.count_nonzero(cnt[:tiles]))  # left at zero for the next replay
        return
    cases = []
    for M, N, K in shapes:
        a, b = operands(M, N, K, torch.float16)
        mm.matmul_triton(a, b, hw="h200")  # compile outside capture (and make the spare)
        cases.append((a, b, (a.double() @ b.double()), torch.empty(M, N, dtype=torch.float16, device=DEVICE)))
    if not spare:
        rt._SPARE_COUNTERS.clear()
    torch.cuda.synchronize()
    scribbler = torch.cuda.CUDAGraph()
    with torch.cuda.graph(scribbler):
        junk = torch.full((1 << 22,), 7.0, device=DEVICE)  # freed after capture: the pool reuses it
        junk.mul_(2)
        del junk
    graphs = []
    for a, b, ref, out in cases:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=scribbler.pool()):
            mm.matmul_triton(a, b, out=out, hw="h200")
        graphs.append(g)
    keys = [k for k in rt._WORKSPACES if k[2] == "split_k_counters (graphs)"]
    assert len(keys) == 1 and (keys[0] in rt._UNZEROED) == (not spare)
    for i in (1, 0, 1, 0, 0, 1):
        scribbler.replay()
        a, b, ref, out = cases[i]
        out.fill_(float("nan"))
        graphs[i].replay()
        torch.cuda.synchronize()
        assert not torch.isnan(out).any()
        assert ((out.double() - ref).norm() / ref.norm()).item() < TOL[torch.float16]


def test_capture_check_is_cuda_only():
    a = torch.randn(2, 2)
    assert rt._capturing(a) is False  # a CPU tensor is never captured; no CUDA call is made


def test_views_are_used_as_they_are(monkeypatch):
    """A transposed or sliced operand reaches the kernel as the same tensor: no copies."""
    seen = []
    monkeypatch.setattr(rt.Variant, "launch", lambda self, a, b, c, M, N, K: seen.append((a, b, c)))
    base = torch.randn(64, 200, dtype=torch.float16, device=DEVICE)
    a = base[:, 10:90]  # strided rows
    b = torch.randn(48, 80, dtype=torch.float16, device=DEVICE).t()  # transposed
    out = torch.empty(64, 48, dtype=torch.float16, device=DEVICE)
    mm.matmul_triton(a, b, out=out, hw="h200")
    assert seen and seen[0][0] is a and seen[0][1] is b and seen[0][2] is out


def test_split_k_workspaces_are_per_stream(monkeypatch):
    """Split-K partials and counters are reused launch after launch; calls on two streams must
    not share them.  The stream key is faked (the interpreter has no streams): each stream gets
    its own buffers, a stream's second call reuses its own, and every result is right."""
    v = next(v for name, v in sorted(mm.VARIANTS.items()) if v.split_k > 1 and "_fp32_" not in name)
    stream = ["s0"]
    monkeypatch.setattr(rt, "_stream_key", lambda device: stream[0])
    monkeypatch.setattr(rt, "_WORKSPACES", {})

    def run(a, b, out):
        v.launch(a, b, out, a.shape[0], b.shape[1], a.shape[1])
        return out

    check(run, 7, 130, 300, torch.float16)
    first = dict(rt._WORKSPACES)
    stream[0] = "s1"
    check(run, 7, 130, 300, torch.float16)
    assert {k[1] for k in rt._WORKSPACES} == {"s0", "s1"}
    s0 = {k[2]: t for k, t in rt._WORKSPACES.items() if k[1] == "s0"}
    s1 = {k[2]: t for k, t in rt._WORKSPACES.items() if k[1] == "s1"}
    assert set(s0) == set(s1) == {"split_k_partials", "split_k_counters"}
    assert all(s0[n].data_ptr() != s1[n].data_ptr() for n in s0)
    stream[0] = "s0"
    check(run, 7, 130, 300, torch.float16)
    assert all(rt._WORKSPACES[k] is t for k, t in first.items())  # s0 kept its own buffers


def test_descriptor_scratch_is_a_per_stream_workspace(monkeypatch):
    """The TMA kernels' descriptor scratch (triton.set_allocator hook) comes from the same
    per-device, per-stream workspaces as the split-K buffers, keyed by the stream Triton passes.
    Wiring only: the TMA launch path itself runs on the GPU (tests above, bench/)."""
    calls = []
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(rt, "_workspace", lambda *args: calls.append(args) or f"buffer {len(calls)}")
    assert rt._descriptor_scratch(300, 128, 7) == "buffer 1"
    assert rt._descriptor_scratch(1 << 20, 128, 9) == "buffer 2"
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert rt._descriptor_scratch(300, 128, 7) == "buffer 3"
    cuda0 = torch.device("cuda", 0)
    assert calls == [
        (cuda0, 7, "tma_descriptors", 1 << 16, torch.int8, False),
        (cuda0, 9, "tma_descriptors", 1 << 20, torch.int8, False),
        (cuda0, 7, "tma_descriptors", 1 << 16, torch.int8, True),  # capture: the graph's own
    ]


def test_captured_launches_get_workspaces_of_their_own(monkeypatch):
    """One set of per-stream buffers for eager launches and one for launches being captured."""
    monkeypatch.setattr(rt, "_WORKSPACES", {})
    monkeypatch.setattr(rt, "_UNZEROED", set())
    eager = rt._workspace(torch.device("cpu"), None, "split_k_counters", 10, torch.int32, False)
    graphs = rt._workspace(torch.device("cpu"), None, "split_k_counters", 10, torch.int32, True)
    assert eager.data_ptr() != graphs.data_ptr()
    assert sorted(k[2] for k in rt._WORKSPACES) == ["split_k_counters", "split_k_counters (graphs)"]
    assert {k[2] for k in rt._UNZEROED} == {"split_k_counters (graphs)"}  # made in capture: zeroed on replay only
    assert rt._workspace(torch.device("cpu"), None, "split_k_counters", 10, torch.int32, True) is graphs


SPLIT_VARIANTS = sorted(n for n, v in mm.VARIANTS.items() if v.split_k > 1 and v.kind != "tma_persistent")
TMA_SPLIT_VARIANTS = sorted(n for n, v in mm.VARIANTS.items() if v.split_k > 1 and v.kind == "tma_persistent")


@pytest.mark.parametrize("name", SPLIT_VARIANTS)
def test_split_k_only_fills_one_wave(name):
    """A split-K kernel splits as far as its programs fit one wave of the part (num_programs, the
    SM count), and not at all once its tiles fill the wave; both launches are exact."""
    v = mm.VARIANTS[name]
    assert v.num_programs > 0
    assert rt.split_count(v, 1) == v.split_k
    assert rt.split_count(v, v.num_programs // v.split_k) == v.split_k
    if (v.num_programs, v.split_k) == (132, 2):  # the H100/H200 SM count: by hand
        assert [rt.split_count(v, t) for t in (1, 64, 66, 67, 131, 132, 500)] == [2, 2, 2, 1, 1, 1, 1]
    assert rt.split_count(v, v.num_programs) == 1
    assert rt.split_count(v, 10 * v.num_programs) == 1
    dtype = dtype_of(name)
    M, N, K = (7, 130, 300) if v.kind == "small_m" else (19, 130, 300)
    tiles = triton.cdiv(M, v.block_m) * triton.cdiv(N, v.block_n)
    for wave, splits in ((tiles, 1), (tiles * v.split_k, v.split_k)):
        w = dataclasses.replace(v, num_programs=wave)
        assert rt.split_count(w, tiles) == splits
        rt._WORKSPACES.clear()

        def run(a, b, out):
            w.launch(a, b, out, M, N, K)
            return out

        check(run, M, N, K, dtype)  # with one split, a kernel that still cut K in two would be wrong
        partials = next(t for k, t in rt._WORKSPACES.items() if k[2] == "split_k_partials")
        assert partials.dtype == torch.float32  # the kernel's split-K branch needs these types
        # An unsplit launch sizes nothing for its tiles and writes no partials.
        assert (partials.numel() >= tiles * splits * v.block_m * v.block_n) == (splits > 1)
        assert bool(torch.count_nonzero(partials)) == (splits > 1)




def wave_launched_on_the_cpu(names):
    """One kernel per dtype class (its dot precision and element size), the one with a split
    epilogue (``_epi2``) where the class has one: the wave test's launch mixes whole waves and a
    split last wave, which the epilogue option does not touch; the whole-wave loop of each
    epilogue runs in test_every_kernel_on_ragged_shapes (its split-K-1 TMA kernels), and the split
    wave's store of each in the same test (its split kernels, whose ragged tiles are one wave)."""
    out = set()
    for dtype in {dtype_of(n) for n in names}:
        same = sorted(n for n in names if dtype_of(n) == dtype)
        out.add(next((n for n in same if "_epi" in n), same[0]))
    return out


# One kernel per dtype class launches a full wave plus one tile in the interpreter, and one of them
# twice: such a launch runs num_programs (132 or 148) programs of 128x256 tiles there, ~5 to 13 s of
# CPU each.  Every kernel still runs its ragged shapes (test_every_kernel_on_ragged_shapes), and
# on a GPU every kernel launches this test's shape twice.
TMA_WAVE_LAUNCHED = {name for name in TMA_SPLIT_VARIANTS if GPU} | wave_launched_on_the_cpu(TMA_SPLIT_VARIANTS)


@pytest.mark.parametrize("name", TMA_SPLIT_VARIANTS)
def test_tma_kernel_splits_only_its_last_partial_wave(name, monkeypatch):
    """The persistent TMA kernel walks full waves of whole tiles and splits only the tiles of its
    last, partial wave, as far as their splits fit one wave; a launch with both is exact,
    deterministic, and leaves its counters reset (launched for one kernel per dtype class on the
    CPU: TMA_WAVE_LAUNCHED)."""
    v = mm.VARIANTS[name]
    P = v.num_programs
    assert P > 0 and v.split_k > 1
    if (P, v.split_k) == (132, 4):  # the H100/H200 SM count: by hand
        # tiles -> (tiles in the last partial wave, splits): 1720 = 13 waves + 4 (5120x11008 in
        # 128x256 tiles), 320 = 2 waves + 56 (5120x2048).
        cases = [(1, 4), (33, 4), (34, 3), (44, 3), (45, 2), (66, 2), (67, 1), (131, 1), (132, 1)]
        cases += [(133, 4), (166, 3), (264, 1), (320, 2), (1720, 4)]
        assert [rt.split_count(v, t) for t, _ in cases] == [s for _, s in cases]
    assert rt.split_count(v, P) == rt.split_count(v, 7 * P) == 1  # only full waves: nothing split
    assert rt.split_count(v, P + 1) == rt.split_count(v, 1) == v.split_k
    # One full wave plus one tile, split split_k ways over K tiles that do not divide evenly.
    dtype = dtype_of(name)
    M, N, K = 100, P * v.block_n + 8, v.split_k * v.block_k + 8
    assert triton.cdiv(M, v.block_m) * triton.cdiv(N, v.block_n) == P + 1
    if name not in TMA_WAVE_LAUNCHED:
        return
    rt._WORKSPACES.clear()
    monkeypatch.setattr(rt, "_launch_grouped", None)  # the TMA kernel itself, not its fallback

    def run(a, b, out):
        v.launch(a, b, out, M, N, K)
        return out

    first = check(run, M, N, K, dtype)
    partials = next(t for k, t in rt._WORKSPACES.items() if k[2] == "split_k_partials")
    counters = next(t for k, t in rt._WORKSPACES.items() if k[2] == "split_k_counters")
    assert partials.numel() >= v.split_k * v.block_m * v.block_n
    assert bool(torch.count_nonzero(partials[: v.split_k * v.block_m * v.block_n]))
    assert not bool(torch.count_nonzero(counters))
    if GPU or name == min(TMA_WAVE_LAUNCHED):  # again, on the partials the first launch left
        assert torch.equal(check(run, M, N, K, dtype), first)


def test_empty_and_zero_k():
    a, b = operands(5, 7, 0, torch.float16)
    out = mm.matmul_triton(a, b, hw="h200")
    assert out.shape == (5, 7) and torch.count_nonzero(out) == 0
    a, b = operands(0, 7, 3, torch.float16)
    assert mm.matmul_triton(a, b, hw="h200").shape == (0, 7)


@pytest.mark.parametrize(
    "make, exc, fragment",
    [
        (
            lambda: (torch.randn(4, 5), torch.randn(6, 3)),
            ValueError,
            "inner dimensions differ: a is (4, 5), b is (6, 3)",
        ),
        (lambda: (torch.randn(4), torch.randn(4, 3)), ValueError, "got shapes (4,) and (4, 3)"),
        (lambda: (torch.randn(4, 5).half(), torch.randn(5, 3)), TypeError, "torch.float16 and torch.float32"),
        (lambda: (torch.randn(4, 5).double(), torch.randn(5, 3).double()), TypeError, "torch.float64"),
        (lambda: (torch.randn(4, 5), torch.randn(5, 3).to("meta")), ValueError, "a is on cpu but b is on meta"),
        (lambda: ([[1.0]], torch.randn(1, 1)), TypeError, "must be tensors"),
    ],
)
def test_bad_inputs_raise_clear_errors(make, exc, fragment):
    a, b = make()
    with pytest.raises(exc) as info:
        mm.matmul(a, b, hw="h200")
    assert fragment in str(info.value)


def test_bad_out_raises():
    a, b = torch.randn(4, 5), torch.randn(5, 3)
    with pytest.raises(ValueError, match=r"out must have shape \(4, 3\), got \(3, 4\)"):
        mm.matmul(a, b, out=torch.empty(3, 4), hw="h200")
    with pytest.raises(TypeError, match="out must be torch.float32, got torch.float16"):
        mm.matmul(a, b, out=torch.empty(4, 3, dtype=torch.float16), hw="h200")
    with pytest.raises(TypeError, match="out must be a tensor, got list"):
        mm.matmul(a, b, out=[[0.0] * 3] * 4, hw="h200")


def test_autograd_calls_go_to_torch_matmul_or_raise():
    """The kernels have no backward: matmul gives calls that need one to torch.matmul (so
    gradients flow, on every bucket), matmul_triton refuses them; without grad mode both run."""
    a, b = operands(33, 70, 20, torch.float32)
    w = b.clone().requires_grad_()
    got = mm.matmul(a, w, hw="bi_v100")  # every bi_v100 bucket is a Triton bucket
    assert got.grad_fn is not None
    got.sum().backward()
    torch.testing.assert_close(w.grad, a.t() @ torch.ones(33, 70, device=DEVICE))
    with pytest.raises(ValueError, match="matmul_triton: an input requires grad"):
        mm.matmul_triton(a, w, hw="bi_v100")
    with pytest.raises(ValueError, match="requires grad"):
        mm.matmul_triton(a, b, out=torch.empty(33, 70, device=DEVICE, requires_grad=True), hw="bi_v100")
    with torch.no_grad():
        assert mm.matmul_triton(a, w, hw="bi_v100").grad_fn is None


def test_a_write_to_out_bumps_its_version():
    """Autograd learns of the kernel's write: a saved tensor aliasing out fails backward."""
    a, b = operands(33, 70, 20, torch.float32)
    out = torch.zeros(33, 70, device=DEVICE)
    before = out._version
    mm.matmul_triton(a, b, out=out, hw="bi_v100")
    assert out._version > before


def test_offsets_past_32_bits_go_to_torch_matmul_or_raise(monkeypatch):
    """A 70x64 view with row stride 2**25 (a column slice of a 4.3 GiB tensor) has 4,480 elements
    but offsets past 2**31: the kernels' 32-bit index arithmetic would wrap.  Meta tensors: no memory."""
    monkeypatch.setattr(launch, "INTERPRET", True)  # past the CUDA check, to the offset check
    big = torch.empty(2**25 * 69 + 64, dtype=torch.float16, device="meta")
    a = big.as_strided((70, 64), (2**25, 1))
    b = torch.empty(64, 32, dtype=torch.float16, device="meta")
    with pytest.raises(
        ValueError, match=r"a \(70, 64\) with strides \(33554432, 1\) reaches element offset 2,315,255,871"
    ):
        mm.matmul_triton(a, b, hw="bi_v100")
    assert mm.matmul(a, b, hw="bi_v100").shape == (70, 32)  # torch.matmul
    small = torch.empty(2**24 * 69 + 64, dtype=torch.float16, device="meta").as_strided((70, 64), (2**24, 1))
    assert rt.unservable(small, b, None, 70, 32, 64) is None  # 1,157,627,967 fits
    # The result the launcher allocates counts too: 46,341 x 46,341 reaches 2,147,488,280.
    a, b = (torch.empty(shape, dtype=torch.float16, device="meta") for shape in ((46341, 16), (16, 46341)))
    with pytest.raises(ValueError, match=r"the result \(46341, 46341\) reaches element offset 2,147,488,280"):
        mm.matmul_triton(a, b, hw="bi_v100")
    assert rt.unservable(a[:46340], b[:, :46340], None, 46340, 46340, 16) is None


def test_cpu_tensors_without_the_interpreter(monkeypatch):
    """Compiled kernels need CUDA tensors: matmul falls back to torch.matmul, matmul_triton says so."""
    monkeypatch.setattr(launch, "INTERPRET", False)
    a, b = torch.randn(33, 20), torch.randn(20, 70)
    torch.testing.assert_close(mm.matmul(a, b, hw="bi_v100"), a @ b)
    with pytest.raises(ValueError, match=r"need CUDA tensors \(got cpu; TRITON_INTERPRET=1"):
        mm.matmul_triton(a, b, hw="bi_v100")


def test_out_whose_elements_share_memory_is_rejected():
    a, b = operands(5, 6, 7, torch.float16)
    for out in (
        torch.zeros(1, 6, dtype=torch.float16, device=DEVICE).expand(5, 6),  # stride 0
        torch.zeros(40, dtype=torch.float16, device=DEVICE).as_strided((5, 6), (3, 1)),  # rows overlap
    ):
        for run in (mm.matmul, mm.matmul_triton):
            with pytest.raises(ValueError, match="has elements that share memory"):
                run(a, b, out=out, hw="h200")
    # Transposed, row-strided and interleaved outs do not overlap (strides (1, 11): 5 x 6
    # elements at 55 distinct addresses of 60).
    ref = (a.double() @ b.double()).to(torch.float16)
    for out in (
        torch.empty(6, 5, dtype=torch.float16, device=DEVICE).t(),
        torch.empty(5, 9, dtype=torch.float16, device=DEVICE)[:, :6],
        torch.empty(60, dtype=torch.float16, device=DEVICE).as_strided((5, 6), (1, 11)),
    ):
        assert mm.matmul_triton(a, b, out=out, hw="h200") is out
        torch.testing.assert_close(out, ref, rtol=TOL[torch.float16], atol=TOL[torch.float16])
    # An empty out shares nothing, whatever its strides (torch.matmul accepts it too).
    a0 = torch.empty(0, 7, dtype=torch.float16, device=DEVICE)
    empty = torch.empty(0, 1, dtype=torch.float16, device=DEVICE).expand(0, 6)
    assert mm.matmul_triton(a0, b, out=empty, hw="h200") is empty


def test_tma_launches_restore_the_callers_allocator(monkeypatch):
    """Triton reads its allocator from a context variable (per thread and asyncio task): each TMA
    launch sets the descriptor scratch for its own duration, so a call from a new thread works and
    the caller's allocator (here Triton's default) is left as it was."""
    import threading

    import triton.runtime._allocation as alloc

    class Spy:  # records, per thread, what each launch sets and that it resets
        def __init__(self, real):
            self.real, self.calls = real, []

        def set(self, value):
            self.calls.append((threading.get_ident(), "set", value))
            return self.real.set(value)

        def reset(self, token):
            self.calls.append((threading.get_ident(), "reset", self.real.get()))
            self.real.reset(token)

    spy = Spy(rt._ALLOCATOR)
    monkeypatch.setattr(rt, "_ALLOCATOR", spy)
    before = alloc._allocator.get()
    a, b = operands(260, 1040, 64, torch.float16)
    tma = mm.select(260, 1040, 64, dtype=torch.float16, hw="h200").triton
    assert tma.kind == "tma_persistent"
    out = torch.empty(260, 1040, dtype=torch.float16, device=DEVICE)
    results = []

    def call():
        results.append(mm.matmul_triton(a, b, hw="h200"))

    thread = threading.Thread(target=call)
    thread.start()
    thread.join()
    mm.matmul_triton(a, b, out=out, hw="h200")
    assert alloc._allocator.get() is before
    assert len(results) == 1 and torch.equal(results[0], out)
    scratch = rt._descriptor_scratch
    threads = [call[0] for call in spy.calls]
    assert len(set(threads)) == 2 and spy.calls == [
        (threads[0], "set", scratch),
        (threads[0], "reset", scratch),  # still ours when the launch ended
        (threads[2], "set", scratch),
        (threads[2], "reset", scratch),
    ]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_tensors_on_another_device_launch_there():
    """Operands on cuda:1 while cuda:0 is current: the kernel runs on cuda:1 (the profiler says
    where; a launch on cuda:0 reaching cuda:1's memory over peer access would give the same values)."""
    from torch.profiler import ProfilerActivity, profile

    for name in ("small", "wide"):  # a grouped and a TMA kernel
        shape = {"small": (64, 4096, 256), "wide": (520, 4096, 256)}[name]
        a, b = (t.to("cuda:1") for t in operands(*shape, torch.float16))
        bucket = mm.select(*shape, dtype=torch.float16, hw="h200")
        assert bucket.name == name
        mm.matmul_triton(a, b, hw="h200")  # compiled outside the profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            with torch.cuda.device(0):
                got = mm.matmul_triton(a, b, hw="h200")
            torch.cuda.synchronize(0)
            torch.cuda.synchronize(1)
        ran_on = {e.device_index for e in prof.events() if e.name == bucket.triton.name}
        assert ran_on == {1}
        assert got.device == a.device
        ref = a.double().cpu() @ b.double().cpu()
        assert ((got.double().cpu() - ref).norm() / ref.norm()).item() < TOL[torch.float16]


def test_unknown_hardware_and_cpu_without_hw():
    a, b = torch.randn(4, 5), torch.randn(5, 3)
    with pytest.raises(KeyError, match="h300"):
        mm.matmul(a, b, hw="h300")
    with pytest.raises(RuntimeError, match="pass hw="):
        mm.matmul(a, b)
