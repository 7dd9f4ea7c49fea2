"""generated/attention.py: every specialized prefill and decode kernel against a float64 reference,
the decode paths (V1, V2, PyTorch, vendor hook) and their routing, the tables, argument errors.

Without a GPU the kernels run in Triton's interpreter on the CPU (tests/conftest.py), in fp16 and
fp32; on a GPU bf16 is tested too.  Each distinct kernel (a collapsed instantiation: every target
that shares its constants runs the same code) is tested once, on small ragged shapes; the public
entry points run on the targets whose records differ most.  The decode paths are forced through
records with small thresholds (``dataclasses.replace`` of a target's AttentionConfig), handed to
the runtime object the generated module builds (``attention._ATTENTION``).
"""

from __future__ import annotations

import ast
import dataclasses
import math

import pytest
import torch

from generated import attention as at
from generated.dispatch import HARDWARE, dispatch_kernel_config
from kernel_cases import (
    BROAD,
    DEVICE,
    DTYPES,
    GPU,
    NAN,
    TARGETS,
    seeded,  # noqa: F401  (autouse fixture: a fixed seed per test)
)
from policy_runtime.attention import ops as rt
from policy_runtime.attention.ops import DecodeKernel, PrefillKernel

# Argument values that live in device memory (lengths, offsets, block ids) are checked only for CPU
# tensors: reading them from a GPU would synchronise every call (vLLM does not check them either).
HOST_VALUES = pytest.mark.skipif(GPU, reason="values in device memory are not read (no sync): checked for CPU tensors")

ATT = at._ATTENTION
TOL = {torch.float16: 4e-3, torch.bfloat16: 3e-2, torch.float32: 2e-4}
PREFILL = sorted(n for n, k in at.KERNELS.items() if isinstance(k, PrefillKernel))
DECODE = sorted(n for n, k in at.KERNELS.items() if isinstance(k, DecodeKernel))


def dtypes_of(kernel):
    """The dtypes a kernel is checked in: 16-bit kernels serve bf16 too, which only a GPU computes right."""
    if kernel.dtype_class == "fp32":
        return [torch.float32]
    return [d for d in DTYPES if d != torch.float32]


def rnd(*shape, dtype):
    return torch.randn(*shape, dtype=torch.float32).to(dtype).to(DEVICE)


def i32(values):
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


def offsets(lengths):
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out


# ---------------------------------------------------------------------------------------
# float64 references


def prefill_ref(q, k, v, lq, lk, causal, scale):
    out = torch.zeros(q.shape, dtype=torch.float64)
    group = q.shape[1] // k.shape[1]
    cq, ck = offsets(lq), offsets(lk)
    for b, (nq, nk) in enumerate(zip(lq, lk)):
        qq = q[cq[b] : cq[b + 1]].double().cpu()
        kk = k[ck[b] : ck[b + 1]].double().cpu().repeat_interleave(group, 1)
        vv = v[ck[b] : ck[b + 1]].double().cpu().repeat_interleave(group, 1)
        s = torch.einsum("qhd,khd->hqk", qq, kk) * scale
        if causal:
            i = torch.arange(nq)[:, None]
            j = torch.arange(nk)[None, :]
            s = s.masked_fill(j > i + nk - nq, -math.inf)
        p = torch.softmax(s, -1).nan_to_num(0.0)  # a row that sees no key: zeros
        out[cq[b] : cq[b + 1]] = torch.einsum("hqk,khd->qhd", p, vv)
    return out


def decode_ref(query, key_cache, value_cache, block_tables, lens, scale):
    S, H, D = query.shape
    bs, Hkv = key_cache.shape[1], key_cache.shape[2]
    out = torch.zeros((S, H, D), dtype=torch.float64)
    for s, n in enumerate(lens):
        if n == 0:
            continue
        t = torch.arange(n)
        blocks = block_tables[s].cpu().long()[t // bs]
        kk = key_cache.cpu()[blocks, t % bs].double().repeat_interleave(H // Hkv, 1)
        vv = value_cache.cpu()[blocks, t % bs].double().repeat_interleave(H // Hkv, 1)
        p = torch.softmax(torch.einsum("hd,khd->hk", query[s].double().cpu(), kk) * scale, -1)
        out[s] = torch.einsum("hk,khd->hd", p, vv)
    return out


def assert_close(got, ref, dtype, what):
    assert not torch.isnan(got).any(), f"{what}: unwritten (NaN) output"
    err = (got.double().cpu() - ref).abs().max().item() if got.numel() else 0.0
    assert err < TOL[dtype], f"{what}: max abs error {err:.2e}"


# ---------------------------------------------------------------------------------------
# Prefill: every kernel


def run_prefill(kernel, dtype, lq, lk, H, Hkv, D, causal, scale=None, **kw):
    q = rnd(sum(lq), H, D, dtype=dtype)
    k = rnd(sum(lk), Hkv, D, dtype=dtype)
    v = rnd(sum(lk), Hkv, D, dtype=dtype)
    out = torch.full(q.shape, NAN, dtype=dtype, device=DEVICE)  # poison: every row must be written
    got = ATT.prefill(
        q,
        k,
        v,
        i32(offsets(lq)),
        i32(offsets(lk)),
        max(lq),
        max(lk),
        causal=causal,
        scale=scale,
        out=out,
        hw="h200",
        kernel=kernel,
        **kw,
    )
    assert got is out
    ref = prefill_ref(q, k, v, lq, lk, causal, scale if scale is not None else 1 / math.sqrt(D))
    assert_close(out, ref, dtype, f"{kernel.name} {dtype} lq={lq} lk={lk} H={H}/{Hkv} causal={causal}")


# Ragged batches: a sequence of one token, q shorter than k (bottom-right causal), q longer
# than k (rows that see no key), lengths that are multiples of no tile, more keys than one tile.
RAGGED = [([1, 37, 10, 70], [1, 37, 4, 150]), ([19, 0, 64], [40, 5, 64])]


@pytest.mark.parametrize("name", PREFILL)
def test_every_prefill_kernel_on_ragged_batches(name):
    kernel = at.KERNELS[name]
    for dtype in dtypes_of(kernel):
        # GQA ratios 2 (two KV heads: the second serves heads 2 and 3), 8 and 1; causal and not.  A
        # program takes one query head (its KV head is head // group, a runtime value): more heads
        # only repeat programs (test_prefill_through_the_public_function runs ratio 4).
        run_prefill(kernel, dtype, *RAGGED[0], H=4, Hkv=2, D=64, causal=True)
        run_prefill(kernel, dtype, *RAGGED[1], H=8, Hkv=1, D=64, causal=False, scale=0.3)
        run_prefill(kernel, dtype, [33], [50], H=2, Hkv=2, D=64, causal=True)


@pytest.mark.parametrize("target", BROAD)
@pytest.mark.parametrize("head_dim", at.HEAD_DIMS)
def test_prefill_through_the_public_function(target, head_dim):
    """The target's policy for the head_dim: its kernel, tiles and records, in fp16."""
    sel = at.select(torch.float16, head_dim, hw=target)
    assert sel.prefill.block_m == sel.config.triton_block_m and sel.prefill.block_n == sel.config.triton_block_n
    lq, lk = [5, 20], [9, 20]
    q = rnd(sum(lq), 4, head_dim, dtype=torch.float16)
    k = rnd(sum(lk), 1, head_dim, dtype=torch.float16)
    v = rnd(sum(lk), 1, head_dim, dtype=torch.float16)
    got = at.prefill_attention(q, k, v, i32(offsets(lq)), i32(offsets(lk)), 20, 20, hw=target)
    assert got.shape == q.shape and got.dtype == q.dtype
    assert_close(got, prefill_ref(q, k, v, lq, lk, True, 1 / math.sqrt(head_dim)), torch.float16, target)


@pytest.mark.parametrize("scale", [-0.3, 0.0, 1e-3])
def test_prefill_takes_any_finite_scale(scale):
    """The kernels take a row's max of the raw scores before scaling them, which holds for a
    positive scale only: a negative or zero scale reaches them as |scale| on -q, or 1 on zeros.
    q is a strided view (a fused qkv projection's slice), the batch ragged with causal rows that
    see no key, and the second call replays the first's plan (the copy of q made again)."""
    lq, lk = [1, 37, 10, 70], [1, 37, 4, 150]
    H, Hkv, D = 4, 2, 64
    qkv = rnd(sum(lq), H + 2 * Hkv, D, dtype=torch.float16)
    q = qkv[:, :H]
    k, v = rnd(sum(lk), Hkv, D, dtype=torch.float16), rnd(sum(lk), Hkv, D, dtype=torch.float16)
    cq, ck = i32(offsets(lq)), i32(offsets(lk))
    ref = prefill_ref(q, k, v, lq, lk, True, scale)
    for call in range(2):
        got = at.prefill_attention(q, k, v, cq, ck, max(lq), max(lk), scale=scale, hw="h200")
        assert_close(got, ref, torch.float16, f"scale={scale} call {call}")
    assert bool((q == qkv[:, :H]).all())  # q itself is never written


def test_prefill_out_rows_outside_every_sequence_are_left_alone():
    q = rnd(10, 2, 64, dtype=torch.float32)
    k = rnd(6, 2, 64, dtype=torch.float32)
    out = torch.full(q.shape, 7.0, device=DEVICE)
    at.prefill_attention(q, k, k, i32([0, 4]), i32([0, 6]), 4, 6, out=out, hw="h200")
    assert bool((out[4:] == 7.0).all()) and not bool((out[:4] == 7.0).any())


# ---------------------------------------------------------------------------------------
# Decode: every kernel on every path


def paged(lens, bs, Hkv, D, dtype, spare=1):
    """Caches with a random block table (each sequence's blocks scattered, one spare column)."""
    per = [max(1, -(-n // bs)) for n in lens]
    width = max(per) + spare
    nb = sum(per) + 3
    key_cache = rnd(nb, bs, Hkv, D, dtype=dtype)
    value_cache = rnd(nb, bs, Hkv, D, dtype=dtype)
    perm = torch.randperm(nb)
    table = torch.zeros(len(lens), width, dtype=torch.int32)
    used = 0
    for s, n in enumerate(per):
        table[s, :n] = perm[used : used + n].to(torch.int32)
        used += n
    return key_cache, value_cache, table.to(DEVICE)


def small_config(target="h200", **over):
    """The target's qwen36 record with thresholds small enough for the interpreter: V1 up to 48
    tokens, V2 partitions of 32 above, the PyTorch path above 100 in tiles of 2 blocks."""
    base = dispatch_kernel_config("attention_fp16", target)
    values = dict(partition_size=32, v1_v2_threshold=48, pytorch_decode_threshold=100, pytorch_max_tile_blocks=2)
    values.update(over)
    return dataclasses.replace(base, **values)


def launch_record(head_dim=64, target="h200", **over):
    # Partitions of the test's small_config (v2_max_partition 0), and no split of long V1
    # sequences (whose bound, 8k on h200, no small test reaches), unless a test says otherwise.
    over.setdefault("v2_max_partition", 0)
    over.setdefault("v1_split_partition", 0)
    over.setdefault("v1_split_min_bound", 0)
    return dataclasses.replace(dispatch_kernel_config(f"decode_d{head_dim}_16bit", target), **over)


# V1 (0, 1, 17, 48: a partial last block, a length of 0 and 1), V2 (49, 96: one and three
# partitions, 96 a whole number of blocks), PyTorch (130: 5 tiles of 2 blocks at block size 16).
LENS = [0, 1, 17, 48, 49, 96, 130]
LENS_BACK = [130, 96, 49, 17, 0]


def run_decode(kernel, dtype, lens, bs, H, Hkv, D, config, launch, scale=None, hw="h200"):
    key_cache, value_cache, table = paged(lens, bs, Hkv, D, dtype)
    query = rnd(len(lens), H, D, dtype=dtype)
    out = torch.full(query.shape, NAN, dtype=dtype, device=DEVICE)
    got = ATT.decode(
        query,
        key_cache,
        value_cache,
        table,
        i32(lens),
        scale=scale,
        out=out,
        hw=hw,
        config=config,
        launch=launch,
        kernel=kernel,
    )
    assert got is out
    ref = decode_ref(query, key_cache, value_cache, table, lens, scale if scale is not None else 1 / math.sqrt(D))
    assert_close(out, ref, dtype, f"{kernel.name if kernel else hw} {dtype} bs={bs} H={H}/{Hkv}")


@pytest.mark.parametrize("name", DECODE)
def test_every_decode_kernel_on_v1_v2_and_pytorch_paths(name):
    kernel = at.KERNELS[name]
    cfg, launch = small_config(), launch_record(v1_min_programs=0)
    for i, dtype in enumerate(dtypes_of(kernel)):
        # One mixed batch per call; block sizes 16 and 32; GQA ratios 4, 1 and 8 (a program serves
        # one KV head's group, its rows padded to 16 at each ratio: two KV heads show the offsets,
        # more repeat programs).  The second batch, in reverse order, keeps a length of each path
        # (PyTorch, V2 of three and two partitions, a partial block, 0): a program per sequence, KV
        # head and partition, each sequence more.
        run_decode(kernel, dtype, LENS, 16, 8, 2, 64, cfg, launch)
        run_decode(kernel, dtype, LENS_BACK, 32, 2, 2, 64, cfg, launch, scale=0.2)
        if i == 0:
            run_decode(kernel, dtype, [3, 60], 16, 8, 1, 64, cfg, launch)


def test_the_merge_takes_more_partitions_than_one_step_in_column_slices():
    """70 partitions (the merge reads rt._MERGE_BLOCK_P a step) of a head_dim of two column slices,
    beside a sequence of one partition and a V1 one."""
    assert 70 > rt._MERGE_BLOCK_P > rt._MERGE_WIDE_BLOCK_P and 128 > rt._MERGE_BLOCK_D
    cfg = small_config(partition_size=16, v1_v2_threshold=16, pytorch_decode_threshold=4096)
    kernel = ATT.select(torch.float16, 128, "h200", None).decode
    run_decode(kernel, torch.float16, [70 * 16 - 3, 17, 9], 16, 4, 2, 128, cfg, launch_record(128, v1_min_programs=0))


@pytest.mark.parametrize("sequences, heads, parts, wide", [(3, 4, 70, False), (4, 16, 40, True), (4, 16, 70, False)])
def test_the_merge_in_each_launch_shape(sequences, heads, parts, wide, monkeypatch):
    """The merge's two launch shapes (rt._MERGE_WIDE programs or more of at most _MERGE_BLOCK_P
    partitions: one-warp programs of _MERGE_WIDE_BLOCK_P partitions a step; else _MERGE_BLOCK_P on
    more warps), each over more partitions than one step reads (the running maximum rescales the
    sums of earlier steps), a sequence of one step and a V1 one, against float64."""
    launched = []
    real = rt._launch.launch_kernel

    def spy(kernel, grid, *args, **kwargs):
        if kernel is rt._merge:
            launched.append((grid[0] * grid[1] * grid[2], args[12], kwargs["num_warps"]))
        real(kernel, grid, *args, **kwargs)

    monkeypatch.setattr(rt._launch, "launch_kernel", spy)
    cfg = small_config(partition_size=16, v1_v2_threshold=16, pytorch_decode_threshold=4096)
    kernel = ATT.select(torch.float16, 128, "h200", None).decode
    lens = [parts * 16 - 3, 13 * 16 + 1, 9, 20 * 16][:sequences]
    run_decode(kernel, torch.float16, lens, 16, heads, 2, 128, cfg, launch_record(128, v1_min_programs=0))
    (programs, block_p, warps), = launched
    assert programs >= rt._MERGE_WIDE if heads == 16 else programs < rt._MERGE_WIDE
    assert (block_p, warps) == ((rt._MERGE_WIDE_BLOCK_P, rt._MERGE_WIDE_WARPS) if wide else
                                (rt._MERGE_BLOCK_P, rt._MERGE_WARPS))  # fmt: skip
    assert max(lens) // 16 > block_p


@pytest.mark.parametrize("target", BROAD)
@pytest.mark.parametrize("head_dim", at.HEAD_DIMS)
def test_decode_through_the_public_function(target, head_dim):
    """The target's own records: every length below its thresholds is V1, in one launch."""
    lens = [0, 5, 40]
    key_cache, value_cache, table = paged(lens, 16, 2, head_dim, torch.float16)
    query = rnd(3, 8, head_dim, dtype=torch.float16)
    got = at.decode_attention(query, key_cache, value_cache, table, i32(lens), hw=target)
    ref = decode_ref(query, key_cache, value_cache, table, lens, 1 / math.sqrt(head_dim))
    assert_close(got, ref, torch.float16, target)


class Spy:
    """Counts launches of a Triton kernel (``kernel[grid](...)``) and records the PyTorch path's rows."""

    def __init__(self, monkeypatch):
        self.merges = 0
        self.torch_rows: list[list[int]] = []
        merge, torch_decode = rt._merge, rt._torch_decode
        spy = self

        class Merge:
            def __getitem__(self, grid):
                spy.merges += 1
                return merge[grid]

        def torch_path(out, query, kc, vc, bt, lens, rows, *rest):
            spy.torch_rows.append(list(rows))
            return torch_decode(out, query, kc, vc, bt, lens, rows, *rest)

        monkeypatch.setattr(rt, "_merge", Merge())
        monkeypatch.setattr(rt, "_torch_decode", torch_path)


@pytest.mark.skipif(
    GPU,
    reason="on a GPU the lengths stay in device memory: a launch plans V2 partitions and the merge for its "
    "bound and the kernels route each sequence on the device; the host-side routing is tested on the CPU",
)
def test_decode_routes_each_sequence_by_the_thresholds(monkeypatch):
    spy = Spy(monkeypatch)
    launch = launch_record(v1_min_programs=0)
    run_decode(None, torch.float32, [5, 48], 16, 4, 2, 64, small_config(), launch)
    assert (spy.merges, spy.torch_rows) == (0, [])  # V1 only: no merge
    run_decode(None, torch.float32, [5, 49], 16, 4, 2, 64, small_config(), launch)
    assert (spy.merges, spy.torch_rows) == (1, [])  # one V2 sequence: merged
    run_decode(None, torch.float32, [101, 5, 100], 16, 4, 2, 64, small_config(), launch)
    assert spy.torch_rows == [[0]]  # only the sequence above pytorch_decode_threshold
    run_decode(None, torch.float32, [101, 130], 16, 4, 2, 64, small_config(), launch)
    assert spy.torch_rows[-1] == [0, 1]  # every sequence on the PyTorch path: no kernel launch
    assert spy.merges == 2


def test_a_call_with_too_few_programs_splits_v1_lengths_into_partitions(monkeypatch):
    spy = Spy(monkeypatch)
    cfg = small_config(v1_v2_threshold=1000)
    # 2 sequences x 2 KV heads = 4 programs: V1 where a launch may have 4, V2 above 32 tokens where it needs 5.
    run_decode(None, torch.float32, [40, 20], 16, 4, 2, 64, cfg, launch_record(v1_min_programs=4))
    assert spy.merges == 0
    run_decode(None, torch.float32, [40, 20], 16, 4, 2, 64, cfg, launch_record(v1_min_programs=5))
    assert spy.merges == 1
    # The generated records ask for one wave of the part's SMs; h200's (measured) for 1.5 waves
    # of two programs an SM.
    for target in TARGETS:
        sel = at.select(torch.float16, 128, hw=target)
        waves = 3 if target == "h200" else 1
        assert sel.launch.v1_min_programs == waves * HARDWARE[target].sm_count


def test_a_v2_launch_with_too_few_programs_halves_its_partitions(monkeypatch):
    """Partitions of 32 tokens (small_config): 5 per sequence of the launch's bound.  Where the
    launch needs more programs than 2 sequences x 2 KV heads x 5, they halve (down to
    v2_min_partition), the merge is told the partition the decode kernel used, and the result
    matches the reference (run_decode)."""
    merges = []
    merge = rt._merge

    class Merge:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                merges.append(args[7:9])  # partition_size, max_parts
                return merge[grid](*args, **kwargs)

            return launch

    monkeypatch.setattr(rt, "_merge", Merge())
    cfg = small_config(pytorch_decode_threshold=4096)
    lens = [130, 77]
    # The launch's bound: the longest length where they are on the host (CPU tensors), else the
    # block table's capacity (10 blocks of 16).  (v2_min_programs, v2_min_partition) -> the
    # partition used: 2 x 2 x 5 programs at 32 tokens; at 16, 36 (CPU) or 40; at 8, 68 or 80.
    bound = 160 if GPU else 130
    for min_programs, min_partition, want in ((20, 16, 32), (21, 16, 16), (40, 16, 16), (41, 8, 8), (10**6, 8, 8),
                                              (0, 16, 32)):  # fmt: skip
        launch = launch_record(v1_min_programs=0, v2_min_programs=min_programs, v2_min_partition=min_partition)
        run_decode(None, torch.float32, lens, 16, 4, 2, 64, cfg, launch)
        assert merges[-1] == (want, -(-bound // want)), (min_programs, min_partition)
    # The generated records ask for one wave of resident programs (h200's, measured: 1.5 waves of
    # two an SM, from 2048-token partitions at head_dim 128), down to two key tiles.
    for target in TARGETS:
        for head_dim in at.HEAD_DIMS:
            rec = at.select(torch.float16, head_dim, hw=target).launch
            if target == "h200":
                longest = 2048 if head_dim == 128 else 0
                assert (rec.v2_min_programs, rec.v2_max_partition) == (3 * HARDWARE[target].sm_count, longest)
            else:
                assert rec.v2_min_programs == rec.programs_per_sm * HARDWARE[target].sm_count
                assert rec.v2_max_partition == 0
            assert rec.v2_min_partition == 2 * rec.block_n


def test_v2_partitions_start_at_v2_max_partition_and_halve_while_too_few_programs():
    """decode_plan: V2 partitions start at v2_max_partition tokens (0: the model's partition_size)
    and halve while the launch has fewer than v2_min_programs programs, down to v2_min_partition;
    a plan left with one partition is V1; a launch with too few (sequence, KV head) pairs splits
    even below v1_v2_threshold."""
    cfg = small_config(v1_v2_threshold=1000)  # partition_size 32
    rec = launch_record(v1_min_programs=64, v2_min_programs=64, v2_min_partition=16, v2_max_partition=256)
    # 64 pairs at 2000 tokens: 256-token partitions, 8 a sequence (512 programs: no halving).
    assert rt.decode_plan(16, 4, 2000, cfg, rec) == (1000, 256, 8)
    # 2 pairs at 2000 tokens: halved until 2 x parts >= 64 -> 64-token partitions, 32 a sequence.
    assert rt.decode_plan(1, 2, 2000, cfg, rec) == (32, 64, 32)
    # Too few pairs for V1 below the threshold: split past partition_size (32): 900 tokens ->
    # 256, 128, 64, 32 (29 parts x 2 = 58 < 64), 16 (57 x 2 = 114).
    assert rt.decode_plan(1, 2, 900, cfg, rec) == (32, 16, 57)
    # Enough pairs and lengths at most the threshold: V1.
    assert rt.decode_plan(16, 4, 900, cfg, rec) == (1000, 32, 1)
    # 0: the model's partition_size is where V2 starts.
    assert rt.decode_plan(16, 4, 2000, cfg, dataclasses.replace(rec, v2_max_partition=0)) == (1000, 32, 63)
    # A plan of one partition is V1 whatever v1_v2_threshold says (the kernel writes the output).
    short = small_config(v1_v2_threshold=20)
    assert rt.decode_plan(16, 4, 200, short, rec) == (200, 256, 1)


def test_a_v1_launch_splits_its_longest_sequences_where_the_record_says():
    """v1_split_partition: a launch with enough programs for V1 and a bound at most
    v1_v2_threshold, and at least v1_split_min_bound, runs its sequences longer than
    v1_split_percent % of the bound as V2 in partitions of v1_split_partition tokens; too few
    programs, a longer or shorter bound or a bound of one such partition keep the rules above;
    0 never splits."""
    cfg = small_config(v1_v2_threshold=1000)  # partition_size 32
    rec = launch_record(v1_min_programs=64, v2_min_programs=64, v2_min_partition=16, v2_max_partition=256,
                        v1_split_partition=64, v1_split_percent=75, v1_split_min_bound=500)  # fmt: skip
    assert rt.decode_plan(16, 4, 900, cfg, rec) == (675, 64, 15)
    assert rt.decode_plan(16, 4, 500, cfg, rec) == (375, 64, 8)
    assert rt.decode_plan(16, 4, 499, cfg, rec) == (1000, 32, 1)
    assert rt.decode_plan(16, 4, 2000, cfg, rec) == (1000, 256, 8)
    assert rt.decode_plan(1, 2, 900, cfg, rec) == (32, 16, 57)
    assert rt.decode_plan(16, 4, 900, cfg, dataclasses.replace(rec, v1_split_partition=0)) == (1000, 32, 1)
    assert rt.decode_plan(16, 4, 64, cfg, dataclasses.replace(rec, v1_split_min_bound=0)) == (1000, 32, 1)
    # h200's 16-bit records split bounds of 8k and up past 3/4 (measured): into 1024-token
    # partitions at head_dim 256, 2048 at 64 and 128; the fp32 records and other targets' do not.
    for target in TARGETS:
        for head_dim in at.HEAD_DIMS:
            for dtype in (torch.float16, torch.float32):
                got = at.select(dtype, head_dim, hw=target).launch
                split = 1024 if head_dim == 256 else 2048
                want = (split, 75, 8192) if (target, dtype) == ("h200", torch.float16) else (0, 0, 0)
                assert (got.v1_split_partition, got.v1_split_percent, got.v1_split_min_bound) == want, (
                    target, head_dim, dtype)  # fmt: skip


def test_a_ragged_batch_with_its_longest_sequences_split_matches_the_reference(monkeypatch):
    """The split end to end (V1 up to 100 tokens): of lengths up to 46, those past 75% of the
    bound (the longest length, 46, where the lengths are on the host; the block table's
    capacity, 64, on a GPU) run V2 in 16-token partitions, merged; the others V1."""
    spy = Spy(monkeypatch)
    lens = [46, 9, 35, 34, 1, 0, 20, 46]
    cfg = small_config(v1_v2_threshold=100, pytorch_decode_threshold=200)
    rec = launch_record(v1_min_programs=4, v1_split_partition=16, v1_split_percent=75)
    run_decode(None, torch.float32, lens, 16, 4, 2, 64, cfg, rec)
    assert spy.merges == 1
    run_decode(None, torch.float32, lens, 16, 4, 2, 64, cfg, dataclasses.replace(rec, v1_split_partition=0))
    assert spy.merges == 1


def test_the_pytorch_path_tiles_follow_grid_even_share(monkeypatch):
    """130 tokens in blocks of 16: 9 blocks, tiles of at most 2 blocks -> 5 tiles (2, 2, 2, 2, 1),
    each gathered once; the merged result matches the reference (run_decode)."""
    sizes = []
    index_select = torch.Tensor.index_select

    def spy(self, dim, index):
        if self.dim() == 4:
            sizes.append(index.numel())
        return index_select(self, dim, index)

    monkeypatch.setattr(torch.Tensor, "index_select", spy)
    run_decode(None, torch.float32, [130], 16, 4, 2, 64, small_config(), launch_record(v1_min_programs=0))
    assert sizes == [2, 2, 2, 2, 2, 2, 2, 2, 1, 1]  # key and value of each tile


# ---------------------------------------------------------------------------------------
# Vendor kernels through the hook


@pytest.fixture
def natives():
    """Fake vendor kernels (the float64 reference) that record their calls; removed afterwards."""
    calls = []

    def make(version):
        def native(*, out, query, key_cache, value_cache, block_tables, seq_lens, scale, max_seq_len):
            calls.append((version, seq_lens.tolist(), max_seq_len))
            ref = decode_ref(query, key_cache, value_cache, block_tables, seq_lens.tolist(), scale)
            out.copy_(ref.to(out.dtype))

        return native

    old = [at.register_native_decode(v, make(v)) for v in (1, 2)]
    yield calls
    for v, fn in zip((1, 2), old):
        at.register_native_decode(v, fn)


def test_registered_vendor_kernels_serve_where_the_policy_says(natives, monkeypatch):
    spy = Spy(monkeypatch)
    launch = launch_record(v1_min_programs=0)

    def calls():
        # (version, lengths); the host bound handed over lies between the longest length and the
        # block table's capacity (CPU lengths are read for free: the longest; CUDA ones are not).
        for _, lens, bound in natives:
            assert max(lens) <= bound <= 64
        return [(v, lens) for v, lens, _ in natives]

    # h200: use_native_v1 and use_native_v2.  The longest length (40) or the capacity (4 blocks
    # of 16 = 64 tokens) picks the version: at most v1_v2_threshold -> V1.
    assert small_config("h200").use_native_v1 and small_config("h200").use_native_v2
    run_decode(None, torch.float32, [5, 40], 16, 4, 2, 64, small_config(v1_v2_threshold=64), launch)
    run_decode(None, torch.float32, [5, 40], 16, 4, 2, 64, small_config(v1_v2_threshold=30), launch)
    assert calls() == [(1, [5, 40]), (2, [5, 40])]
    assert spy.merges == 0
    # A sequence for the PyTorch path: the vendor kernel gets the others.
    natives.clear()
    run_decode(None, torch.float32, [5, 130, 40], 16, 4, 2, 64, small_config(v1_v2_threshold=64), launch)
    assert natives == [(1, [5, 40], 40)] and spy.torch_rows == [[1]]  # lengths on the host: bound 40
    # bi_v100: use_native_v1 only; mi300x: neither.  The Triton kernels serve the rest.
    natives.clear()
    for target, threshold in (("bi_v100", 64), ("bi_v100", 30), ("mi300x", 64)):
        run_decode(
            None,
            torch.float32,
            [5, 40],
            16,
            4,
            2,
            64,
            small_config(target, v1_v2_threshold=threshold),
            launch,
            hw=target,
        )
    assert calls() == [(1, [5, 40])]
    assert spy.merges == 1  # bi_v100's V2 call ran the Triton kernels


def test_without_registered_vendor_kernels_the_triton_kernels_serve(monkeypatch):
    assert ATT.native == {1: None, 2: None}
    spy = Spy(monkeypatch)
    run_decode(None, torch.float32, [5, 60], 16, 4, 2, 64, small_config(), launch_record(v1_min_programs=0))
    assert spy.merges == 1


def test_register_native_decode_checks_its_arguments():
    with pytest.raises(ValueError, match="version must be 1 or 2"):
        at.register_native_decode(3, print)
    with pytest.raises(ValueError, match="fn must be callable"):
        at.register_native_decode(1, "ixformer")


# ---------------------------------------------------------------------------------------
# Tables


def test_every_target_dtype_and_head_dim_has_its_records_and_kernels():
    """Each call class resolves to the records dispatch gives its model (by head_dim) and to
    kernels whose constants are those records' (fp32 prefill: half the key rows, same bytes);
    every generated kernel serves some target."""
    assert at.HEAD_DIMS == (64, 128, 256)
    # The model of the smallest head_dim at least the tile's; at 256, the default model (qwen36)
    # before gemma2_9b of the same head_dim.
    models = {64: "gpt_oss_20b", 128: "llama31_8b", 256: "qwen36"}
    seen = set()
    for target in TARGETS:
        for dtype, variant in (
            (torch.float16, "attention_fp16"),
            (torch.bfloat16, "attention_bf16"),
            (torch.float32, "attention_fp16"),
        ):
            for head_dim in at.HEAD_DIMS:
                sel = at.select(dtype, head_dim, hw=target)
                cfg = dispatch_kernel_config(variant, target, model=models[head_dim])
                assert (sel.target, sel.model, sel.config) == (target, models[head_dim], cfg)
                size = "fp32" if dtype == torch.float32 else "16bit"
                assert sel.launch == dispatch_kernel_config(f"decode_d{head_dim}_{size}", target)
                pf, dc = sel.prefill, sel.decode
                assert at.KERNELS[pf.name] is pf and at.KERNELS[dc.name] is dc
                assert pf.dtype_class == dc.dtype_class == size
                rows = cfg.triton_block_n if size == "16bit" else max(16, cfg.triton_block_n // 2)
                assert (pf.block_m, pf.block_n, pf.num_warps, pf.num_stages) == (
                    cfg.triton_block_m,
                    rows,
                    cfg.triton_num_warps,
                    cfg.triton_num_stages,
                )
                if cfg.triton_block_n >= 32:  # the fp32 tile stages the bytes the 16-bit one does
                    assert pf.block_n * pf_bytes(size) == cfg.triton_block_n * 2
                assert (dc.block_n, dc.num_warps, dc.num_stages) == (
                    sel.launch.block_n,
                    sel.launch.num_warps,
                    sel.launch.num_stages,
                )
                seen.update((pf.name, dc.name))
                if target not in at.FP8_UNSERVED:
                    # Over an fp8 KV cache: the same prefill kernel, AttentionLaunchFp8's decode tiles.
                    sel8 = at.select(dtype, head_dim, hw=target, kv_fp8=True)
                    assert sel8.prefill is pf and sel8.config == cfg
                    assert sel8.launch == dispatch_kernel_config(f"decode_d{head_dim}_fp8", target)
                    d8 = sel8.decode
                    assert at.KERNELS[d8.name] is d8 and d8.dtype_class == size
                    assert (d8.block_n, d8.num_warps, d8.num_stages) == (
                        sel8.launch.block_n,
                        sel8.launch.num_warps,
                        sel8.launch.num_stages,
                    )
                    seen.add(d8.name)
    assert seen == set(at.KERNELS)


def pf_bytes(size):
    return 4 if size == "fp32" else 2


def test_decode_tiles_fit_each_targets_shared_memory():
    """What the attention_launch checks hold at build, recomputed from the records."""
    for target in TARGETS:
        hw = HARDWARE[target]
        for dtype, size in ((torch.float16, 2), (torch.float32, 4)):
            for head_dim in at.HEAD_DIMS:
                rec = at.select(dtype, head_dim, hw=target).launch
                smem = rec.block_n * head_dim * size * 2 * rec.num_stages + 16 * head_dim * size
                assert smem <= hw.max_shared_memory_per_block_optin, (target, head_dim, size)
                assert rec.num_stages == 1 or hw.async_copy
                # A pipelined tile leaves room for the programs an SM its record asks for.
                assert rec.num_stages == 1 or rec.programs_per_sm * smem <= hw.shared_memory_per_sm, (target, head_dim)


def test_lengths_are_not_specialized_on():
    """Prefill kernels take no length argument (they read cu_seqlens) and keep the window's bounds
    (an unbounded side is passed as a bound past the lengths) and a paged call's block-table
    width (bt_stride) out of specialization; decode
    kernels keep every argument that moves with the lengths or the block table's width (and the
    window's length) out of specialization."""
    tree = ast.parse(open(at.__file__).read())
    decode_args = {"bt_stride", "v1_limit", "torch_limit", "partition_size", "max_parts", "win_len"}
    prefill_args = {"win_left", "win_right", "bt_stride"}
    found = 0
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith(("_prefill_", "_decode_")):
            found += 1
            args = {a.arg for a in node.args.args}
            (deco,) = node.decorator_list
            if node.name.startswith("_prefill_"):
                assert not args & {"max_seqlen_q", "max_seqlen_k", "total_q", "total_k", "batch"}
                kw = {k.arg: ast.literal_eval(k.value) for k in deco.keywords}
                assert set(kw["do_not_specialize"]) == prefill_args and prefill_args <= args
            else:
                kw = {k.arg: ast.literal_eval(k.value) for k in deco.keywords}
                assert set(kw["do_not_specialize"]) == decode_args and decode_args <= args
    assert found == len(at.KERNELS)


def test_each_kernel_bakes_in_the_constants_of_its_record():
    """A specialized kernel calls its body (policy_runtime.attention) with its tile as keyword
    constants; its record, from which the launcher sizes the grid and takes warps and stages,
    holds the same values (and the kernel's name spells them out)."""
    tree = ast.parse(open(at.__file__).read())
    bodies = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in at.KERNELS:
            (call,) = [
                n
                for n in ast.walk(node)
                if isinstance(n, ast.Call) and getattr(n.func, "id", "") in ("prefill_body", "decode_body")
            ]
            # Constants are literals; PDL and V_PAIRS are the wrapper's own launch constants (the
            # host decides them per call), passed through.
            forwarded = {k.arg for k in call.keywords if isinstance(k.value, ast.Name) and k.value.id == k.arg}
            assert forwarded == (set() if call.func.id == "prefill_body" else {"PDL", "V_PAIRS"}), node.name
            bodies[node.name] = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg not in forwarded}
    assert sorted(bodies) == sorted(at.KERNELS)
    for name, consts in bodies.items():
        k = at.KERNELS[name]
        assert consts["DOT_PREC"] == ("ieee" if k.dtype_class == "fp32" else "tf32")
        if isinstance(k, PrefillKernel):
            assert (consts["BLOCK_M"], consts["BLOCK_N"]) == (k.block_m, k.block_n)
            assert name == f"_prefill_{k.dtype_class}_{k.block_m}x{k.block_n}_w{k.num_warps}_s{k.num_stages}"
        else:
            assert consts["BLOCK_N"] == k.block_n
            assert name == f"_decode_{k.dtype_class}_n{k.block_n}_w{k.num_warps}_s{k.num_stages}"


@pytest.mark.skipif(not GPU, reason="compilation counts need a GPU")
def test_a_new_length_compiles_nothing():
    dev = torch.cuda.current_device()
    sel = at.select(torch.float16, 128, hw=None)

    if not hasattr(sel.prefill.kernel, "device_caches"):
        pytest.skip("this Triton keeps no per-device kernel cache to count")

    def compiled(kernel):
        return len(kernel.kernel.device_caches[dev][0])

    def prefill(n):
        q = rnd(n, 8, 128, dtype=torch.float16)
        k = rnd(n, 2, 128, dtype=torch.float16)
        cu = i32([0, n])
        at.prefill_attention(q, k, k, cu, cu, n, n)

    def decode(n):
        key_cache, value_cache, table = paged([n], 16, 2, 128, torch.float16)
        at.decode_attention(rnd(1, 8, 128, dtype=torch.float16), key_cache, value_cache, table, i32([n]))

    prefill(100)
    decode(100)
    before = compiled(sel.prefill), compiled(sel.decode)
    for n in (37, 1000, 5000):
        prefill(n)
        decode(n)
    torch.cuda.synchronize()
    assert (compiled(sel.prefill), compiled(sel.decode)) == before


# ---------------------------------------------------------------------------------------
# Errors name the argument


def prefill_args(**over):
    args = dict(
        q=rnd(6, 4, 64, dtype=torch.float16),
        k=rnd(8, 2, 64, dtype=torch.float16),
        v=rnd(8, 2, 64, dtype=torch.float16),
        cu_seqlens_q=i32([0, 6]),
        cu_seqlens_k=i32([0, 8]),
        max_seqlen_q=6,
        max_seqlen_k=8,
    )
    args.update(over)
    return args


@pytest.mark.parametrize(
    "over, fragment",
    [
        (dict(q=torch.zeros(6, 4, 64, dtype=torch.int32)), "q has dtype torch.int32"),
        (dict(k=rnd(8, 2, 64, dtype=torch.float32)), "k has dtype torch.float32, q torch.float16"),
        (dict(q=rnd(6, 256, dtype=torch.float16)), "q must be [total_q, num_heads, head_dim]"),
        (dict(v=rnd(7, 2, 64, dtype=torch.float16)), "v (7, 2, 64) must have k's shape (8, 2, 64)"),
        (
            dict(k=rnd(8, 3, 64, dtype=torch.float16), v=rnd(8, 3, 64, dtype=torch.float16)),
            "q's 4 heads must be a multiple of k's 3 KV heads",
        ),
        (
            dict(
                q=rnd(6, 4, 100, dtype=torch.float16),
                k=rnd(8, 2, 100, dtype=torch.float16),
                v=rnd(8, 2, 100, dtype=torch.float16),
            ),
            "q has head_dim 100; the kernels serve multiples of 8 up to 256 (tiles [64, 128, 256])",
        ),
        (dict(q=rnd(6, 4, 128, dtype=torch.float16)[..., ::2]), "q (6, 4, 64) needs unit stride in its last dim"),
        (dict(cu_seqlens_q=torch.tensor([0, 6])), "cu_seqlens_q must be an int32 tensor"),
        (dict(cu_seqlens_k=i32([0, 4, 8])), "must both be 1-D of batch + 1 entries"),
        (dict(max_seqlen_q=-1), "max_seqlen_q must be an int >= 0"),
        pytest.param(
            dict(max_seqlen_q=3),
            "cu_seqlens_q has a sequence of 6 tokens, longer than max_seqlen_q=3",
            marks=HOST_VALUES,
        ),
        pytest.param(
            dict(cu_seqlens_k=i32([0, 9])), "cu_seqlens_k [0, 9] must rise from 0 to at most 8", marks=HOST_VALUES
        ),
        (dict(k=torch.empty(8, 2, 64, dtype=torch.float16, device="meta")), "k is on meta"),
    ],
)
def test_prefill_errors_name_the_argument(over, fragment):
    with pytest.raises(ValueError) as exc:
        at.prefill_attention(**prefill_args(**over), hw="h200")
    assert fragment in str(exc.value)


def test_prefill_out_and_scale_errors():
    args = prefill_args()
    with pytest.raises(ValueError, match=r"out must have shape \(6, 4, 64\)"):
        at.prefill_attention(**args, out=rnd(6, 4, 32, dtype=torch.float16), hw="h200")
    with pytest.raises(ValueError, match="out has dtype torch.float32, q torch.float16"):
        at.prefill_attention(**args, out=rnd(6, 4, 64, dtype=torch.float32), hw="h200")
    with pytest.raises(ValueError, match="scale must be a finite float"):
        at.prefill_attention(**args, scale=float("nan"), hw="h200")
    with pytest.raises(KeyError):
        at.prefill_attention(**args, hw="h300")


def decode_args(**over):
    key_cache, value_cache, table = paged([20, 3], 16, 2, 64, torch.float16)
    args = dict(
        query=rnd(2, 4, 64, dtype=torch.float16),
        key_cache=key_cache,
        value_cache=value_cache,
        block_tables=table,
        seq_lens=i32([20, 3]),
    )
    args.update(over)
    return args


@pytest.mark.parametrize(
    "over, fragment",
    [
        (dict(query=torch.zeros(2, 4, 64, dtype=torch.int64)), "query has dtype torch.int64"),
        (dict(key_cache=torch.zeros(8, 16, 2, 64, dtype=torch.float32)), "key_cache has dtype torch.float32"),
        (dict(key_cache=torch.zeros(8, 16, 128, dtype=torch.float16)), "key_cache must be [num_blocks, block_size"),
        (dict(value_cache=torch.zeros(9, 16, 2, 64, dtype=torch.float16)), "value_cache (9, 16, 2, 64) must have"),
        (dict(query=rnd(2, 3, 64, dtype=torch.float16)), "query's 3 heads must be a multiple of key_cache's 2"),
        (dict(query=rnd(2, 4, 128, dtype=torch.float16)), "key_cache has head_dim 64, query 128"),
        (dict(block_tables=torch.zeros(2, 3, dtype=torch.int64)), "block_tables must be an int32 tensor"),
        (dict(block_tables=i32([[0, 1]])), "block_tables must be [num_seqs=2, max_blocks]"),
        (dict(seq_lens=i32([20])), "seq_lens must be [num_seqs=2]"),
        pytest.param(dict(seq_lens=i32([20, 49])), "seq_lens has 49; lengths must be in [0, 48]", marks=HOST_VALUES),
        pytest.param(
            dict(block_tables=i32([[0, 99], [2, 3]])),
            "block_tables[0, 1] = 99 is not a block of key_cache",
            marks=HOST_VALUES,
        ),
        (dict(query=torch.empty(2, 4, 64, dtype=torch.float16, device="meta")), "on meta"),
        (
            dict(key_cache=torch.zeros(6, 16, 2, 128, dtype=torch.float16)[..., ::2]),
            "key_cache (6, 16, 2, 64) needs unit stride",
        ),
    ],
)
def test_decode_errors_name_the_argument(over, fragment):
    with pytest.raises(ValueError) as exc:
        at.decode_attention(**decode_args(**over), hw="h200")
    assert fragment in str(exc.value)


def test_decode_with_a_host_bound_of_the_lengths(monkeypatch):
    """max_seq_len (as vLLM passes it) sizes the launch in place of the block table's capacity: a
    table with room for 16 blocks but lengths of at most 40 needs no V2 partition or merge."""
    spy = Spy(monkeypatch)
    lens = [5, 40]
    key_cache, value_cache, table = paged(lens, 16, 2, 64, torch.float32, spare=14)
    query = rnd(2, 4, 64, dtype=torch.float32)
    cfg = small_config(v1_v2_threshold=48)
    got = ATT.decode(
        query,
        key_cache,
        value_cache,
        table,
        i32(lens),
        hw="h200",
        max_seq_len=40,
        config=cfg,
        launch=launch_record(v1_min_programs=0),
    )
    assert_close(got, decode_ref(query, key_cache, value_cache, table, lens, 1 / 8), torch.float32, "max_seq_len")
    assert spy.merges == 0
    if not GPU:  # lengths on the device are not read (a sync): checked only for CPU tensors
        with pytest.raises(
            ValueError,
            match=r"seq_lens has 40; lengths must be in \[0, 39\] \(block_tables holds 17 "
            r"blocks of 16, max_seq_len=39\)",
        ):
            at.decode_attention(query, key_cache, value_cache, table, i32(lens), hw="h200", max_seq_len=39)
    with pytest.raises(ValueError, match="max_seq_len must be an int >= 0"):
        at.decode_attention(query, key_cache, value_cache, table, i32(lens), hw="h200", max_seq_len=-1)


def test_decode_out_errors_and_an_empty_batch():
    args = decode_args()
    with pytest.raises(ValueError, match=r"out must have shape \(2, 4, 64\)"):
        at.decode_attention(**args, out=rnd(2, 4, 32, dtype=torch.float16), hw="h200")
    key_cache, value_cache = args["key_cache"], args["value_cache"]
    empty = at.decode_attention(
        rnd(0, 4, 64, dtype=torch.float16),
        key_cache,
        value_cache,
        torch.zeros(0, 2, dtype=torch.int32, device=DEVICE),
        i32([]),
        hw="h200",
    )
    assert empty.shape == (0, 4, 64)


@pytest.mark.skipif(GPU, reason="the CPU-tensor error applies without the interpreter")
def test_cpu_tensors_need_the_interpreter(monkeypatch):
    from policy_runtime import launch

    monkeypatch.setattr(launch, "INTERPRET", False)
    with pytest.raises(ValueError, match="query must be a CUDA tensor"):
        at.decode_attention(**decode_args(), hw="h200")
    with pytest.raises(ValueError, match="q must be a CUDA tensor"):
        at.prefill_attention(**prefill_args(), hw="h200")
