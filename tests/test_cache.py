"""generated/cache.py (reshape_and_cache, copy_blocks, swap_blocks) against bench/reference_ops.py.

Without a GPU the kernels run in Triton's interpreter on the CPU (tests/conftest.py), in fp16
and fp32; on a GPU bf16 is tested too.  Every target's launch record runs one representative
case; a few targets with different records run every case.  Caches start as NaN where the op
must write, and every element of every cache is compared bit for bit with the torch reference
(the ops are pure copies).
"""

from __future__ import annotations

import dataclasses

import pytest

import torch  # noqa: E402

import generated.cache as C  # noqa: E402
from bench.reference_ops import (  # noqa: E402
    copy_blocks_ref,
    reshape_and_cache_ref,
    swap_blocks_ref,
)
from generated.dispatch import dispatch_kernel_config  # noqa: E402
from policy_runtime.cache import ops as runtime  # noqa: E402
from policy_runtime import launch  # noqa: E402
from kernel_cases import (  # noqa: E402
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


def check_exact(actual, expected):
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)


def rnd(*shape, dtype=torch.float16):
    return torch.randn(*shape, dtype=torch.float32).to(dtype).to(DEVICE)


def test_launch_records_cover_every_target():
    """The kernels read their records from generated/cache.py's tables: one per kernel and
    target, the record the dispatch module resolved for it."""
    tables = C._KERNELS.launch
    assert list(tables) == ["reshape_and_cache", "copy_blocks", "reshape_and_cache_fp8"]
    for kernel, table in tables.items():
        # The fp8 write: the targets with e4m3fn, the others named with the feature they lack.
        served = TARGETS if kernel != "reshape_and_cache_fp8" else sorted(set(TARGETS) - set(C.FP8_UNSERVED))
        assert sorted(table) == served
        for t in served:
            assert table[t] is dispatch_kernel_config(kernel, t)
            assert type(table[t]).__name__ == ("CacheLaunchFp8" if kernel.endswith("fp8") else "CacheLaunch")
    assert sorted(C.FP8_UNSERVED) == ["a10", "a100", "bi_v100", "mi300x"]
    assert set(C.FP8_UNSERVED.values()) == {"fp8_e4m3fn"}


def test_kernels_launch_with_the_tables_they_are_given():
    """A CacheKernels plans with its own records, for the target its target_name returns
    (called with hw and the caches' device), and memoises plans per object."""
    asked = []

    def target_name(hw, device):
        asked.append((hw, device))
        return "mine"

    # Records of 64-byte tiles, one warp, under a target name that dispatch does not know.
    tiny = {
        k: {"mine": dataclasses.replace(dispatch_kernel_config(k, "h200"), tile_bytes=64, num_warps=1)}
        for k in runtime.CacheKernels.KERNELS
    }
    kernels = runtime.CacheKernels(launch=tiny, target_name=target_name)
    kcs, vcs = [rnd(6, 4, 2, 8) for _ in range(2)], [rnd(6, 4, 2, 8) for _ in range(2)]
    ref_k, ref_v = [c.clone() for c in kcs], [c.clone() for c in vcs]
    mapping = torch.tensor([[0, 3], [2, 5]], device=DEVICE)
    kernels.copy_blocks(kcs, vcs, mapping, hw="any")
    copy_blocks_ref(ref_k, ref_v, mapping)
    for a, b in zip(kcs + vcs, ref_k + ref_v):
        check_exact(a, b)
    assert asked == [("any", kcs[0].device)]
    (key,) = kernels._cb_plans
    assert key == ("mine", 2, 4, 64, 8, torch.float16)  # pairs, caches, block size, UNIT, dtype
    # 64-element blocks in 32-element chunks (every target's own record copies a block at once).
    plan = kernels._cb_plans[key]
    assert (plan.grid, plan.consts, plan.num_warps, plan.info) == (2 * 4 * 2, (8, 32), 1, 2)
    assert key not in C._KERNELS._cb_plans


def test_kernels_need_exactly_their_tables():
    with pytest.raises(ValueError, match=r"missing \['copy_blocks', 'reshape_and_cache_fp8'\], unknown none"):
        runtime.CacheKernels(launch={"reshape_and_cache": {}}, target_name=lambda hw, device: "h200")


# ---------------------------------------------------------------------------------- reshape_and_cache

# tokens, kv heads, head_size, block_size, num_blocks, caches are views of one [nb, 2, ...]
# tensor, int32 slots.  Every third slot is -1; key and value have 2 tokens more than slots.
RC_REP = [(9, 3, 80, 4, 5, True, False)]
RC_CASES = RC_REP + [
    (1, 2, 64, 16, 3, False, False),
    (12, 2, 64, 4, 6, False, True),
    (40, 8, 128, 16, 4, True, False),
]


@pytest.mark.parametrize("target,case", cases(RC_REP, RC_CASES))
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_reshape_and_cache(target, case, dtype):
    T, KH, hs, bs, nb, fused, i32 = case
    qkv = rnd(T + 2, (4 + 2 * KH) * hs, dtype=dtype)  # key and value: strided views
    key = qkv[:, 4 * hs : (4 + KH) * hs].unflatten(1, (KH, hs))
    value = qkv[:, (4 + KH) * hs :].unflatten(1, (KH, hs))
    if fused:
        kv = torch.full((nb, 2, bs, KH, hs), NAN, dtype=dtype, device=DEVICE)
        kc, vc = kv[:, 0], kv[:, 1]
    else:
        kc = torch.full((nb, bs, KH, hs), NAN, dtype=dtype, device=DEVICE)
        vc = torch.full((nb, bs, KH, hs), NAN, dtype=dtype, device=DEVICE)
    slots = torch.randperm(nb * bs)[:T]
    slots[::3] = -1
    slots = slots.to(torch.int32 if i32 else torch.int64).to(DEVICE)
    ref_kc, ref_vc = kc.clone(), vc.clone()
    C.reshape_and_cache(key, value, kc, vc, slots, hw=target)
    reshape_and_cache_ref(key, value, ref_kc, ref_vc, slots)
    check_exact(kc, ref_kc)
    check_exact(vc, ref_vc)
    written = (slots >= 0).sum().item()
    assert (~torch.isnan(kc)).flatten(2).all(-1).sum().item() == written  # -1 slots skipped


def test_reshape_and_cache_plan_follows_the_record():
    """Hand-computed: a tile is tile_bytes of loads (key and value), then shrunk to fill a wave."""
    h200 = dispatch_kernel_config("reshape_and_cache", "h200")  # 4 KiB: 1024 bf16 of key + 1024 of value
    p = runtime.plan_reshape_and_cache(16384, 1024, 128, 2, h200)
    assert (p.grid, p.consts, p.num_warps, p.info) == (16384, (128, 1, 1024, False), 4, 1)
    bi = dispatch_kernel_config("reshape_and_cache", "bi_v100")  # 16 KiB: 4 tokens of 1024
    p = runtime.plan_reshape_and_cache(16384, 1024, 128, 2, bi)
    assert (p.grid, p.consts, p.num_warps, p.info) == (4096, (128, 4, 1024, False), 8, 1)
    # 16 tokens: halved while the grid is short of a wave, down to one vector a thread.
    p = runtime.plan_reshape_and_cache(16, 1024, 128, 2, bi)
    assert (p.grid, p.consts, p.num_warps) == (8, (128, 2, 1024, False), 8)


def test_reshape_and_cache_errors():
    k = ones(2, 2, 8, dtype=torch.float16)
    c = ones(3, 4, 2, 8, dtype=torch.float16)
    s = zeros(2, dtype=torch.int64)
    with pytest.raises(TypeError, match="cache dtypes torch.float32/torch.float32 must equal"):
        C.reshape_and_cache(k, k, c.float(), c.float(), s, hw="h200")
    with pytest.raises(TypeError, match="value dtype torch.float32 != key dtype torch.float16"):
        C.reshape_and_cache(k, k.float(), c, c, s, hw="h200")
    with pytest.raises(TypeError, match="key has dtype torch.int32"):
        C.reshape_and_cache(k.int(), k.int(), c, c, s, hw="h200")
    c16 = ones(3, 4, 2, 16, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"cache \(3, 4, 2, 16\) does not match key \(2, 2, 8\)"):
        C.reshape_and_cache(k, k, c16, c16, s, hw="h200")
    with pytest.raises(ValueError, match=r"key \(2, 16\) and value \(2, 16\) must both be"):
        C.reshape_and_cache(k.flatten(1), k.flatten(1), c, c, s, hw="h200")
    with pytest.raises(ValueError, match=r"key_cache \(3, 2, 8\) and value_cache \(3, 4, 2, 8\) must both be"):
        C.reshape_and_cache(k, k, c[:, 0], c, s, hw="h200")
    with pytest.raises(ValueError, match="slot_mapping has 3 entries but key"):
        C.reshape_and_cache(k, k, c, c, zeros(3, dtype=torch.int64), hw="h200")
    with pytest.raises(ValueError, match=r"slot_mapping must be 1-D int64 or int32, got \(2,\) torch.float32"):
        C.reshape_and_cache(k, k, c, c, s.float(), hw="h200")
    with pytest.raises(ValueError, match="key_cache .* needs unit last stride"):
        ct = ones(3, 4, 8, 2, dtype=torch.float16).transpose(2, 3)
        C.reshape_and_cache(k, k, ct, ct, s, hw="h200")
    with pytest.raises(KeyError, match="nope"):
        C.reshape_and_cache(k, k, c, c, s, hw="nope")
    if not GPU:
        with pytest.raises(RuntimeError, match="pass hw="):
            C.reshape_and_cache(k, k, c, c, s)  # CPU tensors: nothing to detect


def test_cpu_tensor_rejected_when_compiled(monkeypatch):
    monkeypatch.setattr(launch, "INTERPRET", False)  # the check lives in the shared launch module
    k = torch.ones(2, 2, 8)
    c = torch.ones(3, 4, 2, 8)
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        C.reshape_and_cache(k, k, c, c, torch.zeros(2, dtype=torch.int64), hw="h200")
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        C.copy_blocks([c], [c.clone()], torch.tensor([[0, 1]]), hw="h200")


# ---------------------------------------------------------------------------------- copy_blocks

# layers, pairs, layout, int32 mapping, (block_size, kv_heads, head_size).  Layouts: "own"
# (one tensor per cache), "fused" (key/value views of one [nb, 2, ...] tensor per layer: block
# stride != block size), "packed" (caches at odd element offsets in one buffer: offsets in
# single elements, not 16-byte units).
CB_REP = [(3, 4, "fused", False, (4, 2, 24))]
CB_CASES = CB_REP + [
    (1, 1, "own", False, (4, 2, 24)),
    (2, 3, "own", True, (4, 2, 24)),
    (2, 5, "packed", False, (4, 2, 24)),
    (2, 2, "own", False, (16, 4, 64)),  # 4096-element blocks: split into chunks
]


def make_caches(layers, layout, nb, block, dtype):
    shape = (nb, *block)
    numel = nb * torch.Size(block).numel()
    if layout == "fused":
        kvs = [rnd(nb, 2, *block, dtype=dtype) for _ in range(layers)]
        return [t[:, 0] for t in kvs], [t[:, 1] for t in kvs]
    if layout == "packed":
        flat = rnd(2 * layers * (numel + 3), dtype=dtype)
        views = [flat[i * (numel + 3) + 1 :][:numel].view(shape) for i in range(2 * layers)]
        return views[:layers], views[layers:]
    return [rnd(*shape, dtype=dtype) for _ in range(layers)], [rnd(*shape, dtype=dtype) for _ in range(layers)]


@pytest.mark.parametrize("target,case", cases(CB_REP, CB_CASES))
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_copy_blocks(target, case, dtype):
    layers, n, layout, i32, block = case
    nb = 10
    kcs, vcs = make_caches(layers, layout, nb, block, dtype)
    for c in kcs + vcs:
        c[5:] = NAN  # destinations poisoned
    mapping = torch.stack([torch.randperm(5)[:n], 5 + torch.randperm(5)[:n]], dim=1)
    mapping = mapping.to(torch.int32 if i32 else torch.int64)
    if layout != "own":
        mapping = mapping.to(DEVICE)  # "own": a CPU mapping, copied to the caches' device
    ref_k = [c.clone() for c in kcs]
    ref_v = [c.clone() for c in vcs]
    C.copy_blocks(kcs, vcs, mapping, hw=target)
    copy_blocks_ref(ref_k, ref_v, mapping)
    for a, b in zip(kcs + vcs, ref_k + ref_v):
        check_exact(a, b)
        assert (~torch.isnan(a)).flatten(1).all(-1).sum().item() == 5 + n


def test_copy_blocks_new_caches_same_shape():
    """The offset table is memoised by data pointers: new caches must get a new table."""
    for _ in range(2):
        kcs = [rnd(6, 4, 2, 8) for _ in range(2)]
        vcs = [rnd(6, 4, 2, 8) for _ in range(2)]
        ref_k = [c.clone() for c in kcs]
        ref_v = [c.clone() for c in vcs]
        mapping = torch.tensor([[0, 3], [2, 5]], device=DEVICE)
        C.copy_blocks(kcs, vcs, mapping, hw="a100")
        copy_blocks_ref(ref_k, ref_v, mapping)
        for a, b in zip(kcs + vcs, ref_k + ref_v):
            check_exact(a, b)


def test_copy_blocks_plan_follows_the_record():
    h200 = dispatch_kernel_config("copy_blocks", "h200")  # 4 KiB chunks: 2048 bf16
    p = runtime.plan_copy_blocks(1024, 64, 16 * 8 * 128, 8, 2, h200)
    assert (p.grid, p.consts, p.num_warps, p.info) == (1024 * 64 * 8, (8, 2048), 8, 8)
    bi = dispatch_kernel_config("copy_blocks", "bi_v100")  # 16 KiB: one chunk of 8192 a 16 KiB block
    p = runtime.plan_copy_blocks(4, 64, 16 * 4 * 128, 1, 2, bi)
    assert (p.grid, p.consts, p.info) == (256, (1, 8192), 1)
    # One pair, two caches: halved to fill a wave, but never below one vector a thread.
    p = runtime.plan_copy_blocks(1, 2, 16 * 4 * 128, 8, 2, bi)
    assert (p.grid, p.consts, p.info) == (8, (8, 2048), 4)
    p = runtime.plan_copy_blocks(1, 2, 16 * 8 * 128, 8, 2, h200)
    assert (p.grid, p.consts, p.info) == (16, (8, 2048), 8)


def test_copy_blocks_errors_and_noops():
    a = ones(4, 2, 8, dtype=torch.float16)
    bm = torch.tensor([[0, 1]], device=DEVICE)
    C.copy_blocks([], [], bm, hw="h200")
    C.copy_blocks([a], [a.clone()], zeros(0, 2, dtype=torch.int64), hw="h200")
    with pytest.raises(ValueError, match=r"cache 1 is \(4, 2, 4\) strides"):
        C.copy_blocks([a], [ones(4, 2, 4, dtype=torch.float16)], bm, hw="h200")
    with pytest.raises(TypeError, match=r"cache 1 dtype torch.float32 != key_caches\[0\] dtype torch.float16"):
        C.copy_blocks([a], [a.float()], bm, hw="h200")
    with pytest.raises(TypeError, match="key_caches\\[0\\] has dtype torch.int32"):
        C.copy_blocks([a.int()], [a.int()], bm, hw="h200")
    with pytest.raises(ValueError, match="1 key caches vs 2 value caches"):
        C.copy_blocks([a], [a, a], bm, hw="h200")
    with pytest.raises(ValueError, match=r"block_mapping must be \[n, 2\] int64 or int32, got \(2,\)"):
        C.copy_blocks([a], [a.clone()], torch.tensor([0, 1], device=DEVICE), hw="h200")
    with pytest.raises(ValueError, match="blocks must be contiguous"):
        b = ones(4, 8, 2, dtype=torch.float16).transpose(1, 2)
        C.copy_blocks([b], [b.clone().transpose(1, 2).contiguous().transpose(1, 2)], bm, hw="h200")
    # Blocks sharing memory (a block stride below the block size, or 0): rejected, not raced.
    for shared in (ones(32, dtype=torch.float16).as_strided((4, 2, 4), (4, 4, 1)), a[:1].expand(4, 2, 8)):
        with pytest.raises(ValueError, match="overlapping blocks"):
            C.copy_blocks([shared], [shared], bm, hw="h200")


# ---------------------------------------------------------------------------------- swap_blocks


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("direction", ["out", "in"])
def test_swap_blocks(dtype, direction):
    """Device to CPU and back (both on the CPU without a GPU)."""
    src_dev, dst_dev = (DEVICE, "cpu") if direction == "out" else ("cpu", DEVICE)
    src = rnd(6, 4, 2, 8, dtype=dtype).to(src_dev)
    dst = torch.full((9, 4, 2, 8), NAN, dtype=dtype, device=dst_dev)
    ref = dst.cpu()
    bm = torch.tensor([[1, 7], [5, 0], [2, 3]], dtype=torch.int32)
    C.swap_blocks(src, dst, bm)
    swap_blocks_ref(src.cpu(), ref, bm)
    check_exact(dst.cpu(), ref)
    assert (~torch.isnan(dst)).flatten(1).all(-1).sum().item() == 3


def test_swap_blocks_errors():
    src = rnd(6, 4, 2, 8)
    dst = torch.empty(9, 4, 2, 8, dtype=torch.float16)
    bm = torch.tensor([[1, 7]])
    with pytest.raises(TypeError, match="src dtype torch.float16 != dst dtype torch.float64"):
        C.swap_blocks(src, dst.double(), bm)
    with pytest.raises(ValueError, match=r"block shapes differ: src \(6, 4, 2, 8\) dst \(9, 4, 2, 4\)"):
        C.swap_blocks(src, dst[..., :4], bm)
    with pytest.raises(ValueError, match=r"block shapes differ: src \(6,\) dst \(\)"):
        C.swap_blocks(src.flatten()[:6], dst.flatten()[0], bm)
    with pytest.raises(ValueError, match=r"block_mapping must be \[n, 2\]"):
        C.swap_blocks(src, dst, bm[:, :1])


def test_block_ids_on_the_host_are_range_checked():
    """A block_mapping on the host (a CPU tensor; copy_blocks copies it to a GPU's caches after,
    swap_blocks takes only those) is checked before any copy, on copy_blocks' replayed plan as on
    its first call: in the interpreter a block past the caches was copied out of bounds and the
    process died (free(): invalid pointer); swap_blocks raised torch's IndexError."""
    a = ones(4, 2, 8, dtype=torch.float16)
    b = a.clone()
    for _ in range(2):  # the second round replays the first good call's plan
        C.copy_blocks([a], [b], torch.tensor([[0, 1]]), hw="h200")
        for mapping, shown, which in (([[0, 4]], r"\(0, 4\)", "destination"), ([[-1, 2]], r"\(-1, 2\)", "source")):
            with pytest.raises(
                ValueError,
                match=rf"copy_blocks: block_mapping\[0\] = {shown} names a {which} block the caches do "
                r"not have \(0 to 3\)",
            ):
                C.copy_blocks([a], [b], torch.tensor(mapping), hw="h200")
    # swap_blocks: source and destination caches of their own block counts (src 4, dst 6).
    dst = torch.zeros(6, 2, 8, dtype=torch.float16)
    C.swap_blocks(a, dst, torch.tensor([[3, 5]]))
    for mapping, row, which, last in (
        ([[0, 1], [4, 0]], r"1\] = \(4, 0\)", "source", 3),
        ([[0, 6]], r"0\] = \(0, 6\)", "destination", 5),
    ):
        with pytest.raises(
            ValueError, match=rf"swap_blocks: block_mapping\[{row} names a {which} block .* \(0 to {last}\)"
        ):
            C.swap_blocks(a, dst, torch.tensor(mapping))


@pytest.mark.skipif(GPU, reason="slot_mapping must be on key's device: on the host only on the CPU")
def test_slots_on_the_host_are_range_checked():
    """CPU slots past the cache raise before the launch (a negative one still skips its token),
    on a replayed plan as on the first call."""
    k = ones(2, 2, 8, dtype=torch.float16)
    kc, vc = ones(3, 4, 2, 8, dtype=torch.float16), ones(3, 4, 2, 8, dtype=torch.float16)
    for _ in range(2):
        C.reshape_and_cache(k, k, kc, vc, torch.tensor([0, -1]), hw="h200")
        with pytest.raises(ValueError, match=r"slot_mapping\[1\] = 12 is past the cache's 12 slots \(3 blocks of 4\)"):
            C.reshape_and_cache(k, k, kc, vc, torch.tensor([0, 12]), hw="h200")
