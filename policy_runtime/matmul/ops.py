"""The hand-written half of generated/matmul.py: the kernel bodies and the host side.

generated/matmul.py (templates/matmul/module.py.j2) holds what varies with the specs: one small
``@triton.jit`` kernel per distinct bucket config, which calls a body below with its constants
baked in, and its ``Variant`` record; each target's buckets and selector; the tables by dtype
and target; and the public functions, which hand those tables to a ``Matmul`` (below).
Everything else is here: the kernel bodies (``grouped_body``, ``small_m_body``, ``tma_persistent_body``
and their helpers), one launcher per kernel kind, the per-device and per-stream split-K
workspaces and descriptor scratch, the argument checks and the path of one call
(``Matmul.run``).  The generated module's docstring says what its kernels and entry points
promise.  Names keep their leading underscore: they are the kernel module's internals, not API.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Literal, Optional

import torch
import triton
import triton.language as tl

from .. import call_cache as _call_cache
from .. import launch as _launch
from ..call_cache import tensor_key
from ..lookup import PolicyTables

# ---------------------------------------------------------------------------------------
# Kernel bodies: generated/matmul.py's specialized kernels call grouped_body, small_m_body and
# tma_persistent_body with their constants.


@triton.jit
def tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    # Grouped order: GROUP_M rows of tiles are walked column by column, so
    # consecutive tiles share rows of A and columns of B in L2.
    group_size = GROUP_M * num_pid_n
    first_m = (tile_id // group_size) * GROUP_M
    rows = tl.minimum(num_pid_m - first_m, GROUP_M)
    r = tile_id % group_size
    return first_m + r % rows, r // rows


@triton.jit
def _count_in(acc, ws_tile, cnt, split, splits, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # Split-K fix-up, first half: store this split's fp32 partial tile, then count it in.
    # True for the last split to arrive, which then sums the partials (_sum_partials) and
    # resets the counter for the next launch.  Nobody waits: no deadlock.
    local = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    tl.store(ws_tile + split * (BLOCK_M * BLOCK_N) + local, acc)
    tl.debug_barrier()
    return tl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu") == splits - 1


@triton.jit
def _sum_partials(ws_tile, splits, col0, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WIDTH: tl.constexpr):
    # Columns [col0, col0 + WIDTH) of a tile's partials, summed in split order: bit-identical
    # run to run, whichever split arrived last.
    local = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + col0 + tl.arange(0, WIDTH)[None, :]
    total = tl.zeros((BLOCK_M, WIDTH), dtype=tl.float32)
    for s in range(splits):
        total += tl.load(ws_tile + s * (BLOCK_M * BLOCK_N) + local, cache_modifier=".cg")
    return total


@triton.jit
def _store_or_reduce(acc, c_ptr, ws_ptr, cnt_ptr, tile, pid_k, offs_m, offs_n, M, N, stride_cm,
                     stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr):
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    # SPLIT_K is the kernel's most splits; the launch's own count is the grid's second axis
    # (fewer where the tiles alone fill a wave of the part, see split_count).
    splits = tl.num_programs(1)
    if SPLIT_K == 1:
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)
    elif splits == 1:
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)
    else:
        ws_tile = ws_ptr + tile.to(tl.int64) * (splits * BLOCK_M * BLOCK_N)
        if _count_in(acc, ws_tile, cnt_ptr + tile, pid_k, splits, BLOCK_M, BLOCK_N):
            tl.debug_barrier()
            total = _sum_partials(ws_tile, splits, 0, BLOCK_M, BLOCK_N, BLOCK_N)
            tl.store(c_ptrs, total.to(c_ptr.dtype.element_ty), mask=c_mask)
            tl.atomic_xchg(cnt_ptr + tile, 0, sem="relaxed", scope="gpu")


@triton.jit
def grouped_body(a_ptr, b_ptr, c_ptr, ws_ptr, cnt_ptr, M, N, K, stride_am, stride_ak, stride_bk,
             stride_bn, stride_cm, stride_cn, EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr,
             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
             SPLIT_K: tl.constexpr, DOT_PREC: tl.constexpr):
    # grid = (tiles, splits <= SPLIT_K); split s takes whole K tiles [s * per_split, (s + 1) * per_split).
    pid_k = tl.program_id(1)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = tile_coords(tl.program_id(0), num_pid_m, num_pid_n, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    k_tiles = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(k_tiles, tl.num_programs(1))
    kt0 = pid_k * per_split
    kt1 = tl.minimum(kt0 + per_split, k_tiles)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + (kt0 * BLOCK_K + offs_k)[None, :] * stride_ak
    b_ptrs = b_ptr + (kt0 * BLOCK_K + offs_k)[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(kt0, kt1):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=mask_m[:, None], other=0.0)
            b = tl.load(b_ptrs, mask=mask_n[None, :], other=0.0)
        else:
            k_left = K - kt * BLOCK_K
            a = tl.load(a_ptrs, mask=mask_m[:, None] & (offs_k[None, :] < k_left), other=0.0)
            b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & mask_n[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PREC)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    _store_or_reduce(acc, c_ptr, ws_ptr, cnt_ptr, pid_m * num_pid_n + pid_n, pid_k, offs_m, offs_n, M,
                     N, stride_cm, stride_cn, BLOCK_M, BLOCK_N, SPLIT_K)


@triton.jit
def small_m_body(a_ptr, b_ptr, c_ptr, ws_ptr, cnt_ptr, M, N, K, stride_am, stride_ak, stride_bk,
             stride_bn, stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, STAGES: tl.constexpr,
             DOT_PREC: tl.constexpr):
    # grid = (N tiles, splits <= SPLIT_K, M tiles): N tiles vary fastest, so programs running
    # together stream disjoint slices of B, which is what bounds a decode GEMM.
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    k_tiles = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(k_tiles, tl.num_programs(1))
    kt0 = pid_k * per_split
    kt1 = tl.minimum(kt0 + per_split, k_tiles)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in tl.range(kt0, kt1, num_stages=STAGES):
        kk = kt * BLOCK_K + offs_k
        mask_k = kk < K
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + kk[None, :] * stride_ak,
                    mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        b = tl.load(b_ptr + kk[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                    mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PREC)
    _store_or_reduce(acc, c_ptr, ws_ptr, cnt_ptr, pid_m * tl.num_programs(0) + pid_n, pid_k, offs_m,
                     offs_n, M, N, stride_cm, stride_cn, BLOCK_M, BLOCK_N, SPLIT_K)


@triton.jit
def _tma_load_a(a_desc, om, ok, A_TRANS: tl.constexpr):
    if A_TRANS:  # descriptor over the (K, M) storage of a column-major A
        return a_desc.load([ok, om]).T
    else:
        return a_desc.load([om, ok])


@triton.jit
def _tma_load_b(b_desc, ok, on, B_TRANS: tl.constexpr):
    if B_TRANS:  # descriptor over the (N, K) storage of B, e.g. an nn.Linear weight's .T
        return b_desc.load([on, ok]).T
    else:
        return b_desc.load([ok, on])


@triton.jit
def _tma_store_c(c_desc, acc, om, on, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 EPILOGUE_SUBTILE: tl.constexpr):
    if EPILOGUE_SUBTILE == 2:
        # Two (BLOCK_M, BLOCK_N / 2) halves: half the staging buffer, so one more stage fits.
        halves = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
        c0, c1 = tl.split(halves)
        c_desc.store([om, on], c0.to(c_desc.dtype))
        c_desc.store([om, on + BLOCK_N // 2], c1.to(c_desc.dtype))
    else:
        c_desc.store([om, on], acc.to(c_desc.dtype))


@triton.jit
def _tma_tile(a_desc, b_desc, om, on, kt0, kt1, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr, A_TRANS: tl.constexpr, B_TRANS: tl.constexpr,
              DOT_PREC: tl.constexpr):
    # One tile's product over K tiles [kt0, kt1), in fp32.
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for ki in range(kt0, kt1):
        a = _tma_load_a(a_desc, om, ki * BLOCK_K, A_TRANS)
        b = _tma_load_b(b_desc, ki * BLOCK_K, on, B_TRANS)
        acc = tl.dot(a, b, acc, input_precision=DOT_PREC)
    return acc


@triton.jit
def tma_persistent_body(a_ptr, b_ptr, c_ptr, ws_ptr, cnt_ptr, M, N, K, splits, stride_a, stride_b,
                    stride_c, A_TRANS: tl.constexpr, B_TRANS: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                    SPLIT_K: tl.constexpr, NUM_PROGS: tl.constexpr,
                    EPILOGUE_SUBTILE: tl.constexpr, FLATTEN: tl.constexpr, DOT_PREC: tl.constexpr):
    # grid = (min(NUM_PROGS, tiles * splits),); program p takes tiles p, p + NUM_PROGS, ...
    # With splits > 1 (at most SPLIT_K; see split_count) only the full waves are walked so: the
    # tiles of the last, partial wave are each cut into `splits` K ranges, one per program,
    # so that wave ends after 1 / splits of a tile's time instead of a whole tile's.
    # Descriptors are built on the device (global scratch from triton.set_allocator);
    # out-of-bounds loads are zero-filled and stores clipped, so ragged edges need no masks.
    if A_TRANS:
        a_desc = tl.make_tensor_descriptor(a_ptr, shape=[K, M], strides=[stride_a, 1],
                                           block_shape=[BLOCK_K, BLOCK_M])
    else:
        a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_a, 1],
                                           block_shape=[BLOCK_M, BLOCK_K])
    if B_TRANS:
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[stride_b, 1],
                                           block_shape=[BLOCK_N, BLOCK_K])
    else:
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[stride_b, 1],
                                           block_shape=[BLOCK_K, BLOCK_N])
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[stride_c, 1],
                                       block_shape=[BLOCK_M, BLOCK_N // EPILOGUE_SUBTILE])
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    tiles = num_pid_m * num_pid_n
    whole = tiles
    if SPLIT_K > 1:
        if splits > 1:
            whole = tiles - tiles % NUM_PROGS
    # The epilogue recomputes its tile from a second counter: a value live across the
    # tile loop and the epilogue would defeat the flattened loop's pipelining.
    tile_c = tl.program_id(0) - NUM_PROGS
    for tile in tl.range(tl.program_id(0), whole, NUM_PROGS, flatten=FLATTEN):
        pid_m, pid_n = tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
        acc = _tma_tile(a_desc, b_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, 0, k_tiles, BLOCK_M,
                        BLOCK_N, BLOCK_K, A_TRANS, B_TRANS, DOT_PREC)
        tile_c += NUM_PROGS
        pid_mc, pid_nc = tile_coords(tile_c, num_pid_m, num_pid_n, GROUP_M)
        _tma_store_c(c_desc, acc, pid_mc * BLOCK_M, pid_nc * BLOCK_N, BLOCK_M, BLOCK_N,
                     EPILOGUE_SUBTILE)
    if SPLIT_K > 1:
        last = tiles - whole  # tiles in the split wave (0 when splits == 1)
        if tl.program_id(0) < last * splits:
            slot = tl.program_id(0) % last
            split = tl.program_id(0) // last
            pid_m, pid_n = tile_coords(whole + slot, num_pid_m, num_pid_n, GROUP_M)
            om = pid_m * BLOCK_M
            on = pid_n * BLOCK_N
            acc = _tma_tile(a_desc, b_desc, om, on, split * k_tiles // splits,
                            (split + 1) * k_tiles // splits, BLOCK_M, BLOCK_N, BLOCK_K, A_TRANS,
                            B_TRANS, DOT_PREC)
            ws_tile = ws_ptr + slot.to(tl.int64) * (splits * BLOCK_M * BLOCK_N)
            if _count_in(acc, ws_tile, cnt_ptr + slot, split, splits, BLOCK_M, BLOCK_N):
                tl.debug_barrier()
                WIDTH: tl.constexpr = BLOCK_N // EPILOGUE_SUBTILE
                for h in tl.static_range(EPILOGUE_SUBTILE):
                    total = _sum_partials(ws_tile, splits, h * WIDTH, BLOCK_M, BLOCK_N, WIDTH)
                    c_desc.store([om, on + h * WIDTH], total.to(c_desc.dtype))
                tl.atomic_xchg(cnt_ptr + slot, 0, sem="relaxed", scope="gpu")


# ---------------------------------------------------------------------------------------
# Host side: workspaces per device and stream.

_WORKSPACES: dict[tuple[Any, Any, str], torch.Tensor] = {}
_OUTGROWN: list[torch.Tensor] = []
# Workspaces made while a CUDA graph was being captured: their zero-fill runs only when that
# graph replays, so split-K counters among them are reset by every launch captured with them.
_UNZEROED: set[tuple[Any, Any, str]] = set()
# Per device: split-K counters for one wave, zeroed by an eager launch (and synchronised), kept
# for the next capture on a stream whose graphs have no counters that are already zero.
_SPARE_COUNTERS: dict[Any, torch.Tensor] = {}


def _stream_key(device: torch.device) -> Any:
    # Split-K partials and counters, and the descriptor scratch, are reused launch after
    # launch: stream order makes that safe on one stream, so each stream has its own.  The
    # raw handle is what Triton's own launcher asks torch for (0.4-0.5 us against 2.9 us for
    # torch.cuda.current_stream on the H200 host).
    return torch._C._cuda_getCurrentRawStream(device.index) if device.type == "cuda" else None


def _workspace_key(device: torch.device, stream: Any, name: str, captured: bool) -> tuple[Any, Any, str]:
    # Buffers for launches being captured into CUDA graphs are kept apart from eager ones.
    return (device, stream, name + " (graphs)" if captured else name)


def _workspace(device: torch.device, stream: Any, name: str, numel: int, dtype: torch.dtype, captured: bool) -> torch.Tensor:
    # Grow-only buffers per device and stream.  The split-K counters are left at zero by
    # every kernel that uses them, so they are zeroed only when (re)allocated.  A buffer that
    # is outgrown stays alive (at least doubling bounds them): a CUDA graph that captured it
    # replays its address.  Launches being captured into a CUDA graph get a set of their own
    # (made in the graph's pool, "(graphs)" in the key), which eager launches never touch.
    key = _workspace_key(device, stream, name, captured)
    buf = _WORKSPACES.get(key)
    if buf is None or buf.numel() < numel:
        if buf is not None:
            _OUTGROWN.append(buf)
        size = max(numel, 256, 2 * buf.numel() if buf is not None else 0)
        buf = _WORKSPACES[key] = torch.zeros(size, dtype=dtype, device=device)
        if captured:
            _UNZEROED.add(key)
    return buf


def _split_k_counters(device: torch.device, stream: Any, used: int, wave: int, captured: bool) -> torch.Tensor:
    # Split-K counters are zero between launches: the last split of each tile resets its own.
    # That holds for a buffer from its first zero-fill on.  A launch being captured would
    # otherwise make its buffer in the graph's pool, zeroed only when that graph replays, and
    # have to record a reset before its kernel (~3 us of graph time on the H200 at decode
    # sizes).  So eager split launches keep one spare buffer per device, zeroed at once, and a
    # capture on a stream without zeroed counters takes it.  (An older buffer being replaced
    # stays alive for the graphs that hold it, and they keep their reset.)
    if not captured:
        if device not in _SPARE_COUNTERS:
            _SPARE_COUNTERS[device] = torch.zeros(max(wave, 256), dtype=torch.int32, device=device)
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # zero before any graph on any stream replays
        return _workspace(device, stream, "split_k_counters", used, torch.int32, False)
    key = _workspace_key(device, stream, "split_k_counters", True)
    spare = _SPARE_COUNTERS.get(device)
    if (key not in _WORKSPACES or key in _UNZEROED) and spare is not None and spare.numel() >= used:
        if key in _WORKSPACES:
            _OUTGROWN.append(_WORKSPACES[key])
        _WORKSPACES[key] = _SPARE_COUNTERS.pop(device)
        _UNZEROED.discard(key)
    cnt = _workspace(device, stream, "split_k_counters", used, torch.int32, True)
    if used and key in _UNZEROED:
        cnt[:used].zero_()
    return cnt


# ---------------------------------------------------------------------------------------
# Launchers, one per kernel kind.


def _split_tiles(v: Variant, tiles: int) -> int:
    # The tiles a launch may split in K: all of them for the grouped and small_m kernels (one
    # program per tile and split), those of the last, partial wave for tma_persistent (its
    # programs walk the full waves whole).
    return tiles % v.num_programs if v.kind == "tma_persistent" else tiles


def split_count(v: Variant, tiles: int) -> int:
    # Split K only as far as the split tiles' programs fit one wave of the part
    # (v.num_programs, its SM count): splitting tiles that already fill the SMs only adds
    # partial-tile traffic.
    split = _split_tiles(v, tiles)
    if v.split_k == 1 or split == 0:
        return 1
    return max(1, min(v.split_k, v.num_programs // split))


def _split_k_buffers(v: Variant, c: torch.Tensor, tiles: int, splits: int) -> tuple[torch.Tensor, torch.Tensor]:
    # tiles: the launch's tiles; those whose K it splits (_split_tiles) each get a counter and
    # `splits` partials.
    if v.split_k == 1:
        return c, c  # the kernel has no split-K code
    # A split-K kernel always gets fp32 partials and int32 counters, even for a launch that
    # does not split (its split-K branch is compiled all the same, for those types); only a
    # split launch needs them sized for its tiles.
    #
    # A launch being captured into a CUDA graph gets buffers of its own, which eager launches
    # never use; its counters are zero on every replay (_split_k_counters).
    captured, stream = _capturing(c), _stream_key(c.device)
    used = _split_tiles(v, tiles) if splits > 1 else 0
    ws = _workspace(c.device, stream, "split_k_partials", used * splits * v.block_m * v.block_n, torch.float32, captured)
    return ws, _split_k_counters(c.device, stream, used, v.num_programs, captured)


def _launch_grouped(v: Variant, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, M: int, N: int, K: int) -> None:
    tiles = _launch.cdiv(M, v.block_m) * _launch.cdiv(N, v.block_n)
    splits = split_count(v, tiles)
    ws, cnt = _split_k_buffers(v, c, tiles, splits)
    _launch.launch_kernel(
        v.kernel, (tiles, splits),
        a, b, c, ws, cnt, M, N, K, *a.stride(), *b.stride(), *c.stride(), K % v.block_k == 0, num_warps=v.num_warps, num_stages=v.num_stages
    )


def _launch_small_m(v: Variant, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, M: int, N: int, K: int) -> None:
    grid_n, grid_m = _launch.cdiv(N, v.block_n), _launch.cdiv(M, v.block_m)
    splits = split_count(v, grid_n * grid_m)
    ws, cnt = _split_k_buffers(v, c, grid_n * grid_m, splits)
    _launch.launch_kernel(
        v.kernel, (grid_n, splits, grid_m),
        a, b, c, ws, cnt, M, N, K, *a.stride(), *b.stride(), *c.stride(), num_warps=v.num_warps, num_stages=v.num_stages
    )


def _tma_layout(t: torch.Tensor) -> Optional[tuple[bool, int]]:
    # (transposed, leading stride) of a 2-D operand TMA can describe: a 16-byte aligned
    # base, unit stride in one dimension and a leading stride of a multiple of 16 bytes.
    # A column-major operand is described through its transpose.
    if t.data_ptr() % 16:
        return None
    rows, cols = t.shape
    s0, s1 = t.stride()
    size = t.element_size()
    if s1 == 1 and cols > 1:
        lead, trans = (s0 if rows > 1 else cols), False
    elif s0 == 1 and rows > 1:
        lead, trans = (s1 if cols > 1 else rows), True
    else:
        return None
    return (trans, lead) if (lead * size) % 16 == 0 and lead >= (rows if trans else cols) else None


def _descriptor_scratch(size: int, alignment: int, stream: Any) -> torch.Tensor:
    # triton.set_allocator hook for device-built descriptors.  Triton passes the launch's raw
    # stream handle, the same key as _stream_key, so each stream gets its own grow-only buffer
    # next to its split-K workspaces.  Torch's allocations are 256-byte aligned (alignment <= 128).
    # Launches being captured into a CUDA graph get their own, as the split-K buffers do.
    device = torch.device("cuda", torch.cuda.current_device())
    captured = torch.cuda.is_current_stream_capturing()
    return _workspace(device, stream, "tma_descriptors", max(size, 1 << 16), torch.int8, captured)


# Triton reads its allocator from a context variable at each launch (per thread and asyncio
# task); a launch sets ours for its own duration and then restores the caller's.
_ALLOCATOR = triton.runtime._allocation._allocator


def _launch_tma_persistent(v: Variant, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, M: int, N: int, K: int) -> None:
    la, lb, lc = _tma_layout(a), _tma_layout(b), _tma_layout(c)
    if la is None or lb is None or lc is None or lc[0]:
        assert v.fallback is not None
        return _launch_grouped(v.fallback, a, b, c, M, N, K)
    tiles = _launch.cdiv(M, v.block_m) * _launch.cdiv(N, v.block_n)
    splits = split_count(v, tiles)
    ws, cnt = _split_k_buffers(v, c, tiles, splits)
    token = _ALLOCATOR.set(_descriptor_scratch)
    try:
        _launch.launch_kernel(
            v.kernel, (min(v.num_programs, tiles * splits),),
            a, b, c, ws, cnt, M, N, K, splits, la[1], lb[1], lc[1], la[0], lb[0],
            num_warps=v.num_warps, num_stages=v.num_stages
        )
    finally:
        _ALLOCATOR.reset(token)


# ---------------------------------------------------------------------------------------
# Records of the generated kernels and buckets.

# The kernel kinds (a matmul record's ``kernel`` field, its choices in specs/kernels/matmul.toml).
KernelKind = Literal["grouped", "small_m", "tma_persistent"]

@dataclass(frozen=True)
class Variant:
    """One specialized kernel of generated/matmul.py and the launch constants it was generated with."""

    kernel: Any
    kind: KernelKind
    block_m: int
    block_n: int
    block_k: int
    group_m: int
    split_k: int
    num_warps: int
    num_stages: int
    num_programs: int
    # For tma_persistent: the pointer kernel with the same tiles, for operands TMA cannot describe.
    fallback: Optional[Variant] = None

    @property
    def name(self) -> str:
        return self.kernel.__name__

    def launch(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, M: int, N: int, K: int) -> None:
        _LAUNCH[self.kind](self, a, b, c, M, N, K)


_LAUNCH: dict[KernelKind, Callable[..., None]] = {
    "grouped": _launch_grouped,
    "small_m": _launch_small_m,
    "tma_persistent": _launch_tma_persistent,
}


@dataclass(frozen=True)
class Bucket:
    """One bucket of a policy: its name, who serves it, its kernel."""

    name: str
    # The vendor library serves every call.
    library: bool
    # The vendor library serves eager calls; the kernel serves calls captured into a CUDA graph.
    eager_library: bool
    triton: Variant


# A target's policy for one dtype: its buckets in order, and the function that picks one for (M, N, K).
Policy = tuple[tuple[Bucket, ...], Callable[[int, int, int], Bucket]]


# ---------------------------------------------------------------------------------------
# Checks on a call.


def _check(a: Any, b: Any, out: Any, dtypes: Any) -> tuple[int, int, int]:
    # Shapes, dtypes (a and b share one of ``dtypes``), devices and out; (M, N, K).
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        raise TypeError(f"matmul: a and b must be tensors, got {type(a).__name__} and {type(b).__name__}")
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"matmul: a must be (M, K) and b (K, N); got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    M, K = a.shape
    if b.shape[0] != K:
        raise ValueError(f"matmul: inner dimensions differ: a is {tuple(a.shape)}, b is {tuple(b.shape)}")
    if a.dtype not in dtypes or b.dtype != a.dtype:
        raise TypeError(
            f"matmul: a and b must share one of float16, bfloat16, float32; got {a.dtype} and {b.dtype}"
        )
    if a.device != b.device:
        raise ValueError(f"matmul: a is on {a.device} but b is on {b.device}")
    N = b.shape[1]
    if out is not None:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"matmul: out must be a tensor, got {type(out).__name__}")
        if tuple(out.shape) != (M, N):
            raise ValueError(f"matmul: out must have shape {(M, N)}, got {tuple(out.shape)}")
        if out.dtype != a.dtype:
            raise TypeError(f"matmul: out must be {a.dtype}, got {out.dtype}")
        if out.device != a.device:
            raise ValueError(f"matmul: out is on {out.device} but a is on {a.device}")
        if overlapping(out):
            raise ValueError(
                f"matmul: out {tuple(out.shape)} with strides {out.stride()} has elements that share memory"
            )
    return M, N, K


def overlapping(t: torch.Tensor) -> bool:
    # Do two elements of a 2-D tensor share an address?  With strides s0, s1 > 0, rows i, i'
    # and columns j, j' meet where (i - i') s0 = (j' - j) s1: the smallest such steps are
    # s1 / g rows and s0 / g columns (g = gcd), so they meet iff both fit the shape.
    (rows, cols), (s0, s1) = t.shape, t.stride()
    if rows == 0 or cols == 0:
        return False
    if rows < 2 or cols < 2:
        return (rows > 1 and s0 == 0) or (cols > 1 and s1 == 0)
    if s0 == 0 or s1 == 0:
        return True
    g = math.gcd(s0, s1)
    return s1 // g < rows and s0 // g < cols


def unservable(a: torch.Tensor, b: torch.Tensor, out: Optional[torch.Tensor], M: int, N: int, K: int) -> Optional[str]:
    # Why a Triton kernel cannot serve this (non-empty) call, or None.  Runs on every call of
    # the Triton path: plain arithmetic on the shapes _check already read.
    if not a.is_cuda and not _launch.INTERPRET:  # the interpreter runs kernels on CPU tensors
        return f"the Triton kernels need CUDA tensors (got {a.device}; TRITON_INTERPRET=1 runs them on the CPU)"
    bf16 = _launch.interpreted_bf16_dots(a)
    if bf16 is not None:
        return f"a and b are {bf16}"
    if (a.requires_grad or b.requires_grad or (out is not None and out.requires_grad)) and torch.is_grad_enabled():
        return "an input requires grad, and the Triton kernels have no backward"
    (a0, a1), (b0, b1) = a.stride(), b.stride()
    (o0, o1) = out.stride() if out is not None else (N, 1)  # else the contiguous result made here
    reach = (
        (M - 1) * abs(a0) + (K - 1) * abs(a1),
        (K - 1) * abs(b0) + (N - 1) * abs(b1),
        (M - 1) * abs(o0) + (N - 1) * abs(o1),
    )
    if max(reach) < 2**31:
        return None
    far = max(reach)
    name, t = {reach[0]: ("a", a), reach[1]: ("b", b)}.get(far, ("out", out))
    what = f"{name} {tuple(t.shape)} with strides {t.stride()}" if t is not None else f"the result ({M}, {N})"
    return f"{what} reaches element offset {far:,}, past the kernels' 32-bit index arithmetic"


def _capturing(a: torch.Tensor) -> bool:
    # Is this call being recorded into a CUDA graph (so only its GPU time will recur)?
    return a.is_cuda and torch.cuda.is_current_stream_capturing()


def _vendor(a: torch.Tensor, b: torch.Tensor, out: Optional[torch.Tensor]) -> torch.Tensor:
    # The vendor library (torch.matmul -> cuBLAS), into out when one is given.
    return torch.matmul(a, b) if out is None else torch.matmul(a, b, out=out)


# ---------------------------------------------------------------------------------------
# The entry points over one generated module's tables.

# Plans of matmul and matmul_triton calls, by argument class (keyed with the Matmul object).
_CALLS = _call_cache.CallCache("matmul")


@dataclass(frozen=True)
class Matmul(PolicyTables):
    """matmul, matmul_triton, buckets and select of generated/matmul.py, over its tables (each
    target's ``Policy`` per variant)."""

    def select(self, M: int, N: int, K: int, dtype: torch.dtype, hw: Any, device: Any) -> Bucket:
        return self.policy(dtype, hw, device)[1](M, N, K)

    def run(self, a: Any, b: Any, out: Any, hw: Any, force_triton: bool) -> torch.Tensor:
        """C = A @ B into out (or a new tensor): the bucket's Triton kernel, or the vendor library
        where the policy says it wins (never with ``force_triton``).  A call of an argument class
        seen before replays its launches (call_cache.py; the split-K workspaces, per stream, are
        held in the plan)."""
        key, plan = _call_cache.lookup(
            _CALLS,
            a,
            lambda: (
                id(self), force_triton, hw, tensor_key(a), tensor_key(b),
                None if out is None else tensor_key(out), _call_cache.stream_of(a),
            ),
        )  # fmt: skip
        if key is None:  # off, or not tensors / an unhashable hw: the full path's checks
            return self._run(a, b, out, hw, force_triton)
        if plan is not None and plan is not _call_cache.NO_PLAN:
            shape, tma = plan.data
            given = out is not None
            if out is None:
                out = torch.empty(shape, dtype=a.dtype, device=a.device)
            with _launch.on_device(a):
                if tma:
                    token = _ALLOCATOR.set(_descriptor_scratch)
                    try:
                        plan.launch((a, b, out))
                    finally:
                        _ALLOCATOR.reset(token)
                else:
                    plan.launch((a, b, out))
            if given:
                torch.autograd.graph.increment_version(out)
            return out
        if plan is not None or _call_cache.grad_needed(a, b, out):
            return self._run(a, b, out, hw, force_triton)
        with _CALLS.record() as rec:
            result = self._run(a, b, out, hw, force_triton)
        tma = self.policy(a.dtype, hw, a.device)[1](*result.shape, a.shape[1]).triton.kind == "tma_persistent"
        _CALLS.commit(rec, key, (a, b, result), data=(tuple(result.shape), tma), held=True)
        return result

    def _run(self, a: Any, b: Any, out: Any, hw: Any, force_triton: bool) -> torch.Tensor:
        # The full path of a call: checks, bucket, vendor or Triton.
        M, N, K = _check(a, b, out, self.variant_of_dtype)
        bucket = self.policy(a.dtype, hw, a.device)[1](M, N, K)
        if not force_triton and (bucket.library or (bucket.eager_library and not _capturing(a))):
            # The policy measured the vendor library faster for this bucket (for an eager call:
            # less host time than Triton's launch, which a CUDA graph does not replay).
            return _vendor(a, b, out)
        why = unservable(a, b, out, M, N, K)
        if why is not None:
            if force_triton:
                raise ValueError(f"matmul_triton: {why}")
            return _vendor(a, b, out)
        given = out is not None
        if out is None:
            out = torch.empty((M, N), dtype=a.dtype, device=a.device)
        if M == 0 or N == 0:
            return out
        if K == 0:
            return out.zero_()
        with _launch.on_device(a):
            bucket.triton.launch(a, b, out, M, N, K)
        if given:
            # A write autograd did not see: saved tensors that alias out now fail backward loudly.
            torch.autograd.graph.increment_version(out)
        return out
