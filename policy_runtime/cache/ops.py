"""KV-cache operations: reshape_and_cache and copy_blocks (Triton), swap_blocks (torch).

generated/cache.py builds one ``CacheKernels`` from its per-target launch records (``CacheLaunch``,
resolved by the compiler) and its ``target_name``; its public functions (which document the
semantics) call that object's methods, or ``swap_blocks``, which has no launch record.  Caches use
the flash layout [num_blocks, block_size, kv_heads, head_size] in the key's dtype, or (with
``kv_cache_dtype="fp8"``) float8_e4m3fn written with per-tensor scales (policy_runtime/fp8_kv.py).
Bad shapes, strides, devices or scales raise ValueError, bad dtypes TypeError; slots and block ids
are not range-checked (that would need a device sync; vLLM does not check them either).

Launch rule (CCCL's transform policy): a program copies about ``tile_bytes``, then the tile is
halved until the grid has ``min_programs`` programs or each thread holds one 16-byte vector;
``num_warps`` shrinks until every thread has a vector.  A call signature's plan is memoised.
"""

from __future__ import annotations

import math
import operator
from typing import Any, Callable, Mapping, Optional

import torch
import triton
import triton.language as tl

from ..call_cache import NO_PLAN, CallCache, arg_key, lookup, tensor_key
from ..fp8_kv import FP8_DTYPE, is_fp8_kv, kv_scales, to_e4m3, unserved_error
from ..launch import (
    INDEX_DTYPES,
    LaunchPlan,
    cdiv,
    check_device,
    check_float,
    check_runnable,
    first_outside,
    fit_warps,
    launch_tables,
    on_device,
    pow2ceil,
    pow2floor,
    remember,
    run_plan,
)

__all__ = ["CacheKernels", "swap_blocks"]

# Plans of reshape_and_cache and copy_blocks calls by argument class (keyed with the CacheKernels
# object).
_RC_CALLS = CallCache("reshape_and_cache")
_CB_CALLS = CallCache("copy_blocks")
# What copy_blocks' key reads of each cache, attribute by attribute over the list (in C, no
# Python frame per cache): every one its full path checks, and the data pointers its table holds.
_CACHE_ATTRS = operator.attrgetter("__class__", "shape", "dtype")


def _caches_key(key_caches: Any, value_caches: Any) -> tuple:
    """copy_blocks' key of its caches (TypeError for a list holding a non-tensor)."""
    caches = (*key_caches, *value_caches)
    return (
        tuple(map(_CACHE_ATTRS, caches)), tuple(map(torch.Tensor.stride, caches)),
        tuple(map(torch.Tensor.data_ptr, caches)), tuple(map(torch.Tensor.get_device, caches)),
    )  # fmt: skip


# copy_blocks' per-cache offset tables kept on the device before the memo is cleared.
_TABLE_CACHE_LIMIT = 64


class CacheKernels:
    """reshape_and_cache and copy_blocks, launched with one module's launch records.

    ``launch``: kernel name (each of ``KERNELS``) -> hardware spec name -> launch record.
    ``target_name(hw, device)``: the spec name a call launches for (generated.dispatch's: ``hw``
    when given, else the tensors' CUDA device, detected).  ``unserved``: target -> the hardware
    feature it lacks for the fp8 write (``reshape_and_cache_fp8`` has no record there).  Launch plans are memoised per object,
    by target and call signature, and so are copy_blocks' device tables of cache offsets, by the
    caches' data pointers.  The methods take the arguments of generated/cache.py's functions,
    whose docstrings say what they do.
    """

    KERNELS = ("reshape_and_cache", "copy_blocks", "reshape_and_cache_fp8")

    def __init__(
        self,
        *,
        launch: Mapping[str, Mapping[str, Any]],
        target_name: Callable[[Any, Any], str],
        unserved: Optional[Mapping[str, str]] = None,
    ) -> None:
        self.launch = launch_tables(type(self).__name__, self.KERNELS, launch)
        self.target_name = target_name
        self.unserved = dict(unserved or {})
        self._rc_plans: dict = {}
        self._cb_plans: dict = {}
        self._cb_tables: dict = {}

    def reshape_and_cache(self, key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype="auto",
                          k_scale=None, v_scale=None, *, hw=None):
        """Scatter key/value token rows into the paged caches at ``slot_mapping`` (-1: skip);
        with ``kv_cache_dtype="fp8"``, quantized to e4m3fn by ``k_scale`` / ``v_scale``.  A call
        of a class seen before replays its plan (policy_runtime/call_cache.py; fp8 calls, whose
        scales are converted per call, and strided slot mappings, copied first, have none)."""
        ck, plan = lookup(
            _RC_CALLS,
            key,
            lambda: (
                id(self), hw, arg_key(kv_cache_dtype), arg_key(k_scale), arg_key(v_scale), tensor_key(key),
                tensor_key(value), tensor_key(key_cache), tensor_key(value_cache), tensor_key(slot_mapping),
            ),
        )
        if plan is not None and plan is not NO_PLAN:
            if slot_mapping.is_cpu:
                _check_slots_on_host(slot_mapping, key_cache.shape[0], key_cache.shape[1])
            with on_device(key):
                plan.launch((key, value, key_cache, value_cache, slot_mapping, _unused_scale(key.device)))
            return None
        args = (key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale)
        if ck is None or plan is NO_PLAN:
            return self._reshape_and_cache(*args, hw=hw)
        with _RC_CALLS.record() as rec:
            self._reshape_and_cache(*args, hw=hw)
        _RC_CALLS.commit(rec, ck, (key, value, key_cache, value_cache, slot_mapping, _unused_scale(key.device)))
        return None

    def _reshape_and_cache(self, key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype="auto",
                           k_scale=None, v_scale=None, *, hw=None):
        op = "reshape_and_cache"
        fp8 = is_fp8_kv(op, kv_cache_dtype)
        check_float(op, "key", key)
        if key.dim() != 3 or value.shape != key.shape:
            raise ValueError(
                f"{op}: key {tuple(key.shape)} and value {tuple(value.shape)} must both be "
                "[tokens, kv_heads, head_size]"
            )
        if value.dtype != key.dtype:
            raise TypeError(f"{op}: value dtype {value.dtype} != key dtype {key.dtype}")
        if key_cache.dim() != 4 or value_cache.shape != key_cache.shape:
            raise ValueError(
                f"{op}: key_cache {tuple(key_cache.shape)} and value_cache "
                f"{tuple(value_cache.shape)} must both be [num_blocks, block_size, kv_heads, head_size]"
            )
        want = FP8_DTYPE if fp8 else key.dtype
        if key_cache.dtype != want or value_cache.dtype != want:
            raise TypeError(
                f"{op}: cache dtypes {key_cache.dtype}/{value_cache.dtype} must equal {want} "
                f"(kv_cache_dtype={kv_cache_dtype!r}, key {key.dtype})"
                + ("; a uint8 cache of vLLM's: pass cache.view(torch.float8_e4m3fn)" if fp8 else "")
            )
        scales = kv_scales(op, fp8, k_scale, v_scale, key.device, "kv_cache_dtype='fp8'")
        _, kvh, hs = key.shape
        nb, bs, ckvh, chs = key_cache.shape
        if (ckvh, chs) != (kvh, hs):
            raise ValueError(f"{op}: cache {tuple(key_cache.shape)} does not match key {tuple(key.shape)}")
        if slot_mapping.dim() != 1 or slot_mapping.dtype not in INDEX_DTYPES:
            raise ValueError(
                f"{op}: slot_mapping must be 1-D int64 or int32, got "
                f"{tuple(slot_mapping.shape)} {slot_mapping.dtype}"
            )
        T = slot_mapping.shape[0]
        if key.shape[0] < T:
            raise ValueError(
                f"{op}: slot_mapping has {T} entries but key {tuple(key.shape)} only {key.shape[0]} tokens"
            )
        for name, t in (("key", key), ("value", value), ("key_cache", key_cache), ("value_cache", value_cache)):
            if t.stride(-1) != 1:
                raise ValueError(f"{op}: {name} {tuple(t.shape)} needs unit last stride, got {t.stride()}")
        dev = key.get_device()
        check_runnable(op, "key", key)
        check_device(op, "value", value, dev, "key")
        check_device(op, "key_cache", key_cache, dev, "key")
        check_device(op, "value_cache", value_cache, dev, "key")
        check_device(op, "slot_mapping", slot_mapping, dev, "key")
        if scales is not None:
            ks, vs = scales
        target = self.target_name(hw, key.device)
        kname = "reshape_and_cache_fp8" if fp8 else "reshape_and_cache"
        if fp8 and target in self.unserved:
            raise unserved_error(op, target, self.unserved[target], "specs/kernels/cache.toml's cache_launch_fp8",
                                 list(self.launch[kname]))
        if slot_mapping.is_cpu:
            _check_slots_on_host(slot_mapping, nb, bs)
        if T == 0 or nb == 0:
            return
        if slot_mapping.stride(0) != 1:
            slot_mapping = slot_mapping.contiguous()
        E = kvh * hs
        key_ = (target, T, E, hs, key.dtype, fp8)
        plan = self._rc_plans.get(key_)
        if plan is None:
            cfg = self.launch[kname][target]
            plan = remember(self._rc_plans, key_, plan_reshape_and_cache(T, E, hs, key.element_size(), cfg, fp8))
        kst, vst, kcst, vcst = key.stride(), value.stride(), key_cache.stride(), value_cache.stride()
        if not fp8:
            # Not read (FP8 is off), but fp32 pointers like the scales: one kernel either way.
            ks = vs = _unused_scale(key.device)
        args = (key, value, key_cache, value_cache, slot_mapping, ks, vs, T, plan.info, E, bs)
        strides = (kst[0], kst[1], vst[0], vst[1], kcst[0], kcst[1], kcst[2], vcst[0], vcst[1], vcst[2])
        run_plan(plan, key, args + strides)

    def copy_blocks(self, key_caches, value_caches, block_mapping, *, hw=None):
        """``cache[dst] = cache[src]`` for every row (src, dst) of block_mapping and every cache,
        in one launch.  A call of a class seen before replays it (policy_runtime/call_cache.py):
        the class is every cache's type, shape, strides, dtype, device and data pointer (the
        launch reads offsets between them from a device table its plan keeps), and the mapping's
        ``tensor_key``; a mapping the full path copies (strided, or on the host) has no plan."""
        anchor = key_caches[0] if type(key_caches) in (list, tuple) and key_caches else block_mapping
        ck, plan = lookup(
            _CB_CALLS,
            anchor,
            lambda: (id(self), hw, len(key_caches), _caches_key(key_caches, value_caches), tensor_key(block_mapping)),
        )
        if plan is not None and plan is not NO_PLAN:
            if block_mapping.is_cpu and anchor is not block_mapping:
                _check_blocks_on_host("copy_blocks", block_mapping, anchor.shape[0], anchor.shape[0])
            with on_device(anchor):
                plan.launch((anchor, plan.data, block_mapping))
            return None
        if ck is None or plan is NO_PLAN:
            return self._copy_blocks(key_caches, value_caches, block_mapping, hw=hw)
        with _CB_CALLS.record() as rec:
            self._copy_blocks(key_caches, value_caches, block_mapping, hw=hw, named=(named := []))
        _CB_CALLS.commit(rec, ck, tuple(named), data=named[1] if named else None)
        return None

    def _copy_blocks(self, key_caches, value_caches, block_mapping, *, hw=None, named=None):
        # The full path; ``named`` (a list) gets the anchor, the offset table and the caller's
        # mapping (a copy of it the launch takes instead is no tensor a hit could pass: no plan).
        op = "copy_blocks"
        given = block_mapping
        if len(key_caches) != len(value_caches):
            raise ValueError(f"{op}: {len(key_caches)} key caches vs {len(value_caches)} value caches")
        _check_mapping(op, block_mapping)
        if not key_caches:
            return
        caches = [*key_caches, *value_caches]
        c0 = caches[0]
        check_float(op, "key_caches[0]", c0)
        if c0.dim() < 1:
            raise ValueError(f"{op}: caches need a leading num_blocks dim, got shape ()")
        shape, strides, dtype, dev = c0.shape, c0.stride(), c0.dtype, c0.get_device()
        check_runnable(op, "key_caches[0]", c0)
        for i, c in enumerate(caches):
            if c.dtype != dtype:
                raise TypeError(f"{op}: cache {i} dtype {c.dtype} != key_caches[0] dtype {dtype}")
            if c.shape != shape or c.stride() != strides or c.get_device() != dev:
                raise ValueError(
                    f"{op}: cache {i} is {tuple(c.shape)} strides {c.stride()} on {c.device}; "
                    f"expected {tuple(shape)} strides {strides} on {c0.device}"
                )
        block_numel = 1
        for dim in range(len(shape) - 1, 0, -1):
            if shape[dim] != 1 and strides[dim] != block_numel:
                raise ValueError(f"{op}: blocks must be contiguous; cache {tuple(shape)} has strides {strides}")
            block_numel *= shape[dim]
        if shape[0] > 1 and strides[0] < block_numel:
            # Blocks that share memory would make a copy's result depend on the program order.
            raise ValueError(f"{op}: cache {tuple(shape)} has overlapping blocks (strides {strides})")
        target = self.target_name(hw, c0.device)
        n = block_mapping.shape[0]
        if block_mapping.is_cpu:
            _check_blocks_on_host(op, block_mapping, shape[0], shape[0])
        if n == 0 or block_numel == 0:
            return
        if block_mapping.get_device() != dev:
            if block_mapping.is_cuda:
                raise ValueError(f"{op}: block_mapping is on {block_mapping.device}, the caches on {c0.device}")
            block_mapping = block_mapping.to(c0.device)
        if not block_mapping.is_contiguous():
            block_mapping = block_mapping.contiguous()
        esize = c0.element_size()
        table, unit = self._offset_table(caches, esize, c0.device)
        key = (target, n, len(caches), block_numel, unit, dtype)
        plan = self._cb_plans.get(key)
        if plan is None:
            cfg = self.launch["copy_blocks"][target]
            plan = remember(self._cb_plans, key, plan_copy_blocks(n, len(caches), block_numel, unit, esize, cfg))
        if named is not None:
            named += (c0, table, given)
        run_plan(plan, c0, (c0, table, block_mapping, n, plan.info, strides[0], block_numel))

    def _offset_table(self, caches: list, esize: int, device: torch.device) -> tuple[torch.Tensor, int]:
        """(device table of each cache's offset from caches[0] in UNITs, UNIT), memoised by the
        caches' data pointers so that a call copies nothing to the device."""
        ptrs = tuple(c.data_ptr() for c in caches)
        key = (ptrs, esize, device)
        entry = self._cb_tables.get(key)
        if entry is None:
            anchor = ptrs[0]
            unit = 16 // esize if all((p - anchor) % 16 == 0 for p in ptrs) else 1
            offsets = [(p - anchor) // (unit * esize) for p in ptrs]
            table = torch.tensor(offsets, dtype=torch.int64).to(device)
            if len(self._cb_tables) >= _TABLE_CACHE_LIMIT:
                self._cb_tables.clear()
            entry = self._cb_tables[key] = (table, unit)
        return entry


_UNUSED: dict[torch.device, torch.Tensor] = {}


def _unused_scale(device: torch.device) -> torch.Tensor:
    t = _UNUSED.get(device)
    if t is None:
        t = _UNUSED[device] = torch.ones(1, dtype=torch.float32, device=device)
    return t


def swap_blocks(src, dst, block_mapping):
    """``dst[d] = src[s]`` for each row (s, d) of a CPU block_mapping, in three torch ops
    (generated/cache.py's swap_blocks, whose docstring says more)."""
    op = "swap_blocks"
    if src.dtype != dst.dtype:
        raise TypeError(f"{op}: src dtype {src.dtype} != dst dtype {dst.dtype}")
    if src.dim() < 1 or dst.dim() != src.dim() or src.shape[1:] != dst.shape[1:]:
        raise ValueError(f"{op}: block shapes differ: src {tuple(src.shape)} dst {tuple(dst.shape)}")
    _check_mapping(op, block_mapping)
    if block_mapping.device.type != "cpu":
        raise ValueError(f"{op}: block_mapping must be on the CPU, got {block_mapping.device}")
    if block_mapping.shape[0] == 0:
        return
    _check_blocks_on_host(op, block_mapping, src.shape[0], dst.shape[0])
    mapping = block_mapping.long()
    moved = src.index_select(0, mapping[:, 0].to(src.device)).to(dst.device)
    dst.index_copy_(0, mapping[:, 1].to(dst.device), moved)


def _check_mapping(op: str, block_mapping: torch.Tensor) -> None:
    if block_mapping.dim() != 2 or block_mapping.shape[1] != 2 or block_mapping.dtype not in INDEX_DTYPES:
        raise ValueError(
            f"{op}: block_mapping must be [n, 2] int64 or int32, got "
            f"{tuple(block_mapping.shape)} {block_mapping.dtype}"
        )


def _check_blocks_on_host(op: str, block_mapping: torch.Tensor, src_blocks: int, dst_blocks: int) -> None:
    # A mapping on the host (a CPU tensor; copy_blocks copies it to the caches' device after):
    # each row (src, dst) blocks the caches have.  A mapping on the GPU is not checked (a device
    # sync); there an id past the caches is an out-of-bounds copy, as in vLLM.
    bad = first_outside(block_mapping, 0, block_mapping.new_tensor([src_blocks, dst_blocks]))
    if bad is not None:
        i, j = bad
        src, dst = (int(v) for v in block_mapping[i])
        blocks = (src_blocks, dst_blocks)[j]
        raise ValueError(
            f"{op}: block_mapping[{i}] = ({src}, {dst}) names a {('source', 'destination')[j]} block "
            f"the caches do not have (0 to {blocks - 1})"
        )


# ----------------------------------------------------------------------------------------------
# reshape_and_cache (flash layout [num_blocks, block_size, kv_heads, head_size])


def _check_slots_on_host(slot_mapping: torch.Tensor, num_blocks: int, block_size: int) -> None:
    # Slots already on the host (CPU tensors, the interpreter's): each negative (skipped) or a slot
    # of the cache.  On a GPU this would take a device sync; there a slot past the cache is an
    # out-of-bounds write, as in vLLM.
    bad = first_outside(slot_mapping, -math.inf, num_blocks * block_size)
    if bad is not None:
        (t,) = bad
        raise ValueError(
            f"reshape_and_cache: slot_mapping[{t}] = {int(slot_mapping[t])} is past the cache's "
            f"{num_blocks * block_size} slots ({num_blocks} blocks of {block_size}); a negative slot skips the token"
        )


@triton.jit(do_not_specialize=["n_tokens"])
def _reshape_and_cache_kernel(
    k_ptr,
    v_ptr,
    kc_ptr,
    vc_ptr,
    slot_ptr,
    k_scale,
    v_scale,
    n_tokens,
    n_e_blocks,
    kv_elems,
    block_size,
    k_ts,
    k_hs,
    v_ts,
    v_hs,
    kc_bs,
    kc_ps,
    kc_hs,
    vc_bs,
    vc_ps,
    vc_hs,
    HEAD_SIZE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_E: tl.constexpr,
    FP8: tl.constexpr,
):
    # Program (token block, element block) of a [BLOCK_T, BLOCK_E] tile of the flattened
    # [tokens, kv_heads * head_size] key and value; a slot < 0 skips its token.  FP8: the caches
    # are e4m3fn, written saturate(x / scale) (k_scale, v_scale: one-element fp32 tensors).
    pid = tl.program_id(0)
    pt = pid // n_e_blocks
    pe = pid - pt * n_e_blocks
    toks = pt * BLOCK_T + tl.arange(0, BLOCK_T)
    tmask = toks < n_tokens
    slots = tl.load(slot_ptr + toks, mask=tmask, other=-1).to(tl.int64)
    e = pe * BLOCK_E + tl.arange(0, BLOCK_E)
    head = e // HEAD_SIZE  # constexpr divisor: a shift or a multiply
    dd = e - head * HEAD_SIZE
    emask = (e < kv_elems)[None, :]
    t64 = toks.to(tl.int64)
    # The key and value loads do not wait for the slot (only the stores are masked by it), and
    # both are issued before either store: the compiler cannot move the value load above a
    # store that might alias it.  The slot's latency overlaps theirs instead of preceding it.
    lm = tmask[:, None] & emask
    kv = tl.load(k_ptr + (t64 * k_ts)[:, None] + (head * k_hs + dd)[None, :], mask=lm)
    vv = tl.load(v_ptr + (t64 * v_ts)[:, None] + (head * v_hs + dd)[None, :], mask=lm)
    blk = slots // block_size
    off = slots - blk * block_size
    m = (slots >= 0)[:, None] & emask
    if FP8:
        # div_rn: IEEE division (Triton's `/` on fp32 is approximate on NVIDIA GPUs, which moves
        # values at a rounding boundary of e4m3 by one step against torch's and vLLM's x / scale).
        kv = to_e4m3(tl.math.div_rn(kv.to(tl.float32), tl.load(k_scale)))
        vv = to_e4m3(tl.math.div_rn(vv.to(tl.float32), tl.load(v_scale)))
    kc_offs = (blk * kc_bs + off * kc_ps)[:, None] + (head * kc_hs + dd)[None, :]
    tl.store(kc_ptr + kc_offs, kv, mask=m)
    vc_offs = (blk * vc_bs + off * vc_ps)[:, None] + (head * vc_hs + dd)[None, :]
    tl.store(vc_ptr + vc_offs, vv, mask=m)


def plan_reshape_and_cache(n_tokens: int, kv_elems: int, head_size: int, esize: int, cfg: Any,
                           fp8: bool = False) -> LaunchPlan:
    """Constexprs (HEAD_SIZE, BLOCK_T, BLOCK_E, FP8); info = element blocks per token block.  A
    tile is sized by the key's element (the loads); the fp8 write stores a byte an element."""
    vec = max(1, 16 // esize)
    tile = pow2floor(max(1, cfg.tile_bytes // (2 * esize)))  # key and value loads
    be = min(pow2ceil(kv_elems), tile)
    bt = min(max(1, tile // be), pow2ceil(n_tokens))
    min_elems = cfg.num_warps * cfg.warp_size * vec
    # Fewer tokens per program, then narrower element blocks, until the grid fills a wave.
    while cdiv(n_tokens, bt) * cdiv(kv_elems, be) < cfg.min_programs and bt * be > min_elems:
        if bt > 1:
            bt //= 2
        elif be > 1:
            be //= 2
        else:
            break
    neb = cdiv(kv_elems, be)
    w = fit_warps(bt * be, vec, cfg)
    return LaunchPlan(_reshape_and_cache_kernel, cdiv(n_tokens, bt) * neb, (head_size, bt, be, fp8), w, neb)


# ----------------------------------------------------------------------------------------------
# copy_blocks (every layer's key and value cache in one launch)


@triton.jit(do_not_specialize=["n_pairs"])
def _copy_blocks_kernel(
    anchor_ptr,
    offs_ptr,
    map_ptr,
    n_pairs,
    n_chunks,
    block_stride,
    block_numel,
    UNIT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # Program (cache, pair, chunk).  Cache c starts offs[c] * UNIT elements after the anchor
    # (key_caches[0]): offsets relative to one pointer argument keep the 16-byte divisibility
    # Triton knows for it (UNIT = 16 / element size when every cache is 16-byte aligned), so
    # copies stay vectorised; a table of absolute addresses would not.
    pid = tl.program_id(0)
    chunk = pid % n_chunks
    rest = pid // n_chunks
    pair = rest % n_pairs
    cache = rest // n_pairs
    src = tl.load(map_ptr + 2 * pair).to(tl.int64)
    dst = tl.load(map_ptr + 2 * pair + 1).to(tl.int64)
    base = anchor_ptr + tl.load(offs_ptr + cache) * UNIT
    e = chunk * BLOCK + tl.arange(0, BLOCK)
    m = e < block_numel
    v = tl.load(base + src * block_stride + e, mask=m)
    tl.store(base + dst * block_stride + e, v, mask=m)


def plan_copy_blocks(n_pairs: int, n_caches: int, block_numel: int, unit: int, esize: int, cfg: Any) -> LaunchPlan:
    """Constexprs (UNIT, BLOCK); info = chunks per block."""
    vec = max(1, 16 // esize)
    blk = min(pow2ceil(block_numel), pow2floor(max(1, cfg.tile_bytes // esize)))
    min_elems = cfg.num_warps * cfg.warp_size * vec
    while blk > min_elems and cdiv(block_numel, blk) * n_pairs * n_caches < cfg.min_programs:
        blk //= 2
    nch = cdiv(block_numel, blk)
    w = fit_warps(blk, vec, cfg)
    return LaunchPlan(_copy_blocks_kernel, n_caches * n_pairs * nch, (unit, blk), w, nch)
