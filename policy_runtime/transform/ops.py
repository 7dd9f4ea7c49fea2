"""RMSNorm, SiLU-and-mul and rotary embedding (vLLM semantics): Triton kernels and launchers.

generated/transform.py builds one ``TransformKernels`` from its per-target launch records
(``TransformLaunch``: num_warps, tile_bytes, min_programs, max_warps, warp_size, resolved from the
specs by the compiler) and its ``target_name``, and its public functions (which document the
semantics) call the methods of that object.  Nothing here varies with the specs.

Inputs are fp16, bf16 or fp32.  Arithmetic is fp32 with one rounding at the output.  Bad shapes,
strides or devices raise ValueError, bad dtypes TypeError.  Indices (positions) are
range-checked only where they are on the host (CPU tensors): on a GPU that would need a device
sync (vLLM does not check them either).

Launch rule (CCCL's transform policy): a program loads about ``tile_bytes`` (rows or heads
packed), then the tile is halved until the grid has ``min_programs`` programs or each thread
holds a single 16-byte vector; ``num_warps`` shrinks until every thread has a vector.  The plan
of a call signature (target and shape) is computed once and memoised.  CPU tensors run only under
TRITON_INTERPRET=1.
"""

from __future__ import annotations

import math
import operator
from typing import Any, Callable, Mapping

import torch
import triton
import triton.language as tl

from ..call_cache import NO_PLAN, CallCache, arg_key, lookup, new_like, scalar_key, template, tensor_key
from ..launch import (
    FLOAT_DTYPES,
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

__all__ = ["TransformKernels"]

_CONTIGUOUS = torch.contiguous_format
# Plans of the entry points' calls by argument class (keyed with the TransformKernels object).
_RMS_CALLS = CallCache("rms_norm")
_SILU_CALLS = CallCache("silu_and_mul")
_ACT_CALLS = CallCache("act_and_mul")
_ROPE_CALLS = CallCache("rotary_embedding")


def _one_output(cache: CallCache, x: torch.Tensor, parts: Any, full: Any) -> torch.Tensor:
    """An entry point of one input x and one new output: a call whose key (``parts()``) has a
    plan replays it into a new tensor like the recorded output; a miss runs ``full()`` recorded."""
    key, plan = lookup(cache, x, parts)
    if plan is not None and plan is not NO_PLAN:
        out = new_like(plan.data)
        with on_device(x):
            plan.launch((x, out))
        return out
    if key is None or plan is NO_PLAN:
        return full()
    with cache.record() as rec:
        out = full()
    cache.commit(rec, key, (x, out), data=template(out))
    return out


# Longest row (elements, padded to a power of two) for which rms_norm compiles the row length
# into its two-pass kernel (longer rows keep it a runtime value); also the largest chunk of that
# kernel and the widest row the register kernel holds.
_RMS_MAX_BLOCK_N = 16384


class TransformKernels:
    """rms_norm, silu_and_mul and rotary_embedding, launched with one module's launch records.

    ``launch``: kernel name (each of ``KERNELS``) -> hardware spec name -> launch record.
    ``target_name(hw, device)``: the spec name a call launches for (generated.dispatch's: ``hw``
    when given, else the tensors' CUDA device, detected).  Launch plans are memoised per object,
    by target and call signature.  The methods take the arguments of generated/transform.py's
    functions, whose docstrings say what they do.
    """

    KERNELS = ("rms_norm", "silu_and_mul", "rotary_embedding")

    def __init__(
        self,
        *,
        launch: Mapping[str, Mapping[str, Any]],
        target_name: Callable[[Any, Any], str],
    ) -> None:
        self.launch = launch_tables(type(self).__name__, self.KERNELS, launch)
        self.target_name = target_name
        self._rms_plans: dict = {}
        self._silu_plans: dict = {}
        self._act_plans: dict = {}
        self._rope_plans: dict = {}

    def rms_norm(self, x, weight, eps, *, residual=None, hw=None):
        """RMSNorm over the last dim, out of place; with ``residual``, returns ``(norm(z), z)``
        for ``z = (x + residual).to(x.dtype)``.  A call of a class seen before replays its plan
        (policy_runtime/call_cache.py)."""
        has_res = residual is not None
        key, plan = lookup(
            _RMS_CALLS,
            x,
            lambda: (
                id(self), hw, scalar_key(eps), tensor_key(x), tensor_key(weight),
                tensor_key(residual) if has_res else None,
            ),
        )  # fmt: skip
        if plan is not None and plan is not NO_PLAN:
            # empty_like: the full path's contiguous tensors, for a third of torch.empty's host time.
            out = torch.empty_like(x, memory_format=_CONTIGUOUS)
            if not has_res:
                with on_device(x):
                    plan.launch((x, weight, out, None, None))
                return out
            z = torch.empty_like(x, memory_format=_CONTIGUOUS)
            with on_device(x):
                plan.launch((x, weight, out, residual, z))
            return out, z
        if key is None or plan is NO_PLAN:
            return self._rms_norm(x, weight, eps, residual=residual, hw=hw)
        with _RMS_CALLS.record() as rec:
            result = self._rms_norm(x, weight, eps, residual=residual, hw=hw)
        out, z = result if has_res else (result, None)
        _RMS_CALLS.commit(rec, key, (x, weight, out, residual, z))
        return result

    def _rms_norm(self, x, weight, eps, *, residual=None, hw=None):
        op = "rms_norm"
        check_float(op, "x", x)
        check_float(op, "weight", weight)
        if x.dim() == 0:
            raise ValueError(f"{op}: x must have at least 1 dimension, got shape ()")
        N = x.shape[-1]
        if weight.dim() != 1 or weight.shape[0] != N:
            raise ValueError(f"{op}: weight shape {tuple(weight.shape)} must be ({N},) for x {tuple(x.shape)}")
        if N == 0:
            raise ValueError(f"{op}: hidden size is 0 (x {tuple(x.shape)})")
        xs = _row_stride(op, "x", x, N)
        dev = x.get_device()
        check_runnable(op, "x", x)
        check_device(op, "weight", weight, dev, "x")
        if N > 1 and weight.stride(0) != 1:
            weight = weight.contiguous()
        has_res = residual is not None
        rs = xs
        if has_res:
            if residual.shape != x.shape:
                raise ValueError(f"{op}: residual shape {tuple(residual.shape)} != x shape {tuple(x.shape)}")
            if residual.dtype != x.dtype:
                raise TypeError(f"{op}: residual dtype {residual.dtype} != x dtype {x.dtype}")
            check_device(op, "residual", residual, dev, "x")
            rs = _row_stride(op, "residual", residual, N)
        target = self.target_name(hw, x.device)
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        z = torch.empty(x.shape, dtype=x.dtype, device=x.device) if has_res else None
        n_rows = x.numel() // N
        if n_rows:
            key = (target, n_rows, N, x.dtype, has_res)
            plan = self._rms_plans.get(key)
            if plan is None:
                cfg = self.launch["rms_norm"][target]
                plan = remember(self._rms_plans, key, plan_rms_norm(n_rows, N, x.element_size(), has_res, cfg))
            # Without a residual, r/z are unused: any pointer of the right dtype will do.
            r_t, z_t = (residual, z) if has_res else (x, out)
            run_plan(plan, x, (x, weight, out, r_t, z_t, n_rows, N, xs, rs, float(eps)))
        return (out, z) if has_res else out

    def silu_and_mul(self, x, *, hw=None):
        """x [..., 2d] -> ``silu(x[..., :d]) * x[..., d:]``, a new [..., d] tensor (a call of a
        class seen before replays its plan)."""
        return _one_output(_SILU_CALLS, x, lambda: (id(self), hw, tensor_key(x)), lambda: self._silu_and_mul(x, hw=hw))

    def _silu_and_mul(self, x, *, hw=None):
        op = "silu_and_mul"
        check_float(op, "x", x)
        if x.dim() == 0 or x.shape[-1] == 0 or x.shape[-1] % 2:
            raise ValueError(f"{op}: last dim of x {tuple(x.shape)} must be even and > 0")
        two_d = x.shape[-1]
        d = two_d // 2
        xs = _row_stride(op, "x", x, two_d)
        check_runnable(op, "x", x)
        target = self.target_name(hw, x.device)
        out = torch.empty((*x.shape[:-1], d), dtype=x.dtype, device=x.device)
        n_rows = x.numel() // two_d
        if n_rows:
            key = (target, n_rows, d, x.dtype)
            plan = self._silu_plans.get(key)
            if plan is None:
                cfg = self.launch["silu_and_mul"][target]
                plan = remember(self._silu_plans, key, plan_silu_and_mul(n_rows, d, x.element_size(), cfg))
            run_plan(plan, x, (x, out, n_rows, d, xs, plan.info))
        return out

    def act_and_mul(self, op, x, *, alpha=1.702, limit=7.0, hw=None):
        """gelu_tanh_and_mul, swigluoai_and_mul or mul_and_silu (``op``): x [..., 2d] -> a new
        [..., d] tensor; one kernel, the activation a constexpr (``ACTS``), on silu_and_mul's
        launch records (the same bytes a program).  A call of a class seen before (the op, x's
        class, the target, alpha's and limit's values: its launch takes them) replays its plan."""
        return _one_output(
            _ACT_CALLS,
            x,
            lambda: (id(self), op, hw, tensor_key(x), scalar_key(alpha), scalar_key(limit)),
            lambda: self._act_and_mul(op, x, alpha=alpha, limit=limit, hw=hw),
        )

    def _act_and_mul(self, op, x, *, alpha, limit, hw):
        act = ACTS[op]
        check_float(op, "x", x)
        if x.dim() == 0 or x.shape[-1] == 0 or x.shape[-1] % 2:
            raise ValueError(f"{op}: last dim of x {tuple(x.shape)} must be even and > 0")
        if act == ACTS["swigluoai_and_mul"]:
            for name, v in (("alpha", alpha), ("limit", limit)):
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                    raise ValueError(f"{op}: {name} must be a finite number, got {v!r}")
        two_d = x.shape[-1]
        d = two_d // 2
        xs = _row_stride(op, "x", x, two_d)
        check_runnable(op, "x", x)
        target = self.target_name(hw, x.device)
        out = torch.empty((*x.shape[:-1], d), dtype=x.dtype, device=x.device)
        n_rows = x.numel() // two_d
        if n_rows:
            key = (target, n_rows, d, x.dtype, act)
            plan = self._act_plans.get(key)
            if plan is None:
                cfg = self.launch["silu_and_mul"][target]
                plan = remember(self._act_plans, key, plan_act_and_mul(n_rows, d, x.element_size(), act, cfg))
            run_plan(plan, x, (x, out, n_rows, d, xs, plan.info, float(alpha), float(limit)))
        return out

    def rotary_embedding(self, positions, query, key, cos_sin_cache, head_size, is_neox, *, hw=None):
        """Rotates query and key (may be None) in place; returns (query, key).  A call of a class
        seen before replays its plan."""
        ck, plan = lookup(
            _ROPE_CALLS,
            query,
            lambda: (
                id(self),
                hw,
                scalar_key(head_size),
                scalar_key(is_neox),
                tensor_key(positions),
                tensor_key(query),
                arg_key(key),
                tensor_key(cos_sin_cache),
            ),
        )
        if plan is not None and plan is not NO_PLAN:
            if positions.is_cpu:
                _check_positions_on_host(positions, cos_sin_cache.shape[0])
            with on_device(query):
                plan.launch((positions, query, key, cos_sin_cache))
            return query, key
        if ck is None or plan is NO_PLAN:
            return self._rotary_embedding(positions, query, key, cos_sin_cache, head_size, is_neox, hw=hw)
        with _ROPE_CALLS.record() as rec:
            result = self._rotary_embedding(positions, query, key, cos_sin_cache, head_size, is_neox, hw=hw)
        _ROPE_CALLS.commit(rec, ck, (positions, query, key, cos_sin_cache))
        return result

    def _rotary_embedding(self, positions, query, key, cos_sin_cache, head_size, is_neox, *, hw=None):
        op = "rotary_embedding"
        check_float(op, "query", query)
        if positions.dtype not in INDEX_DTYPES:
            raise TypeError(f"{op}: positions dtype {positions.dtype} must be int64 or int32")
        if positions.dim() != 1:
            raise ValueError(f"{op}: positions must be 1-D [tokens], got {tuple(positions.shape)}")
        # An int, NumPy integer or one-element integer tensor; not a bool (True == 1), a float or a string.
        try:
            hs = operator.index(head_size)
        except TypeError:
            hs = 0
        if hs <= 0 or isinstance(head_size, bool) or getattr(head_size, "dtype", None) == torch.bool:
            raise ValueError(f"{op}: head_size must be a positive integer, got {head_size!r}")
        head_size = hs
        T, nq, qs, qhs = _heads_view(op, "query", query, head_size)
        if positions.shape[0] != T:
            raise ValueError(
                f"{op}: positions {tuple(positions.shape)} vs query {tuple(query.shape)}: token counts differ"
            )
        if cos_sin_cache.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{op}: cos_sin_cache dtype {cos_sin_cache.dtype} must be float16, bfloat16 or float32")
        if cos_sin_cache.dim() != 2:
            raise ValueError(
                f"{op}: cos_sin_cache must be 2-D [max_position, rot_dim], got {tuple(cos_sin_cache.shape)}"
            )
        rot = cos_sin_cache.shape[1]
        if rot % 2 or rot == 0 or rot > head_size:
            raise ValueError(
                f"{op}: rot_dim {rot} (cos_sin_cache {tuple(cos_sin_cache.shape)}) must be even, "
                f"> 0 and <= head_size {head_size}"
            )
        if cos_sin_cache.stride(1) != 1:
            raise ValueError(
                f"{op}: cos_sin_cache {tuple(cos_sin_cache.shape)} needs unit last stride, "
                f"got {cos_sin_cache.stride()}"
            )
        dev = query.get_device()
        check_runnable(op, "query", query)
        check_device(op, "positions", positions, dev, "query")
        if T > 1 and positions.stride(0) != 1:
            positions = positions.contiguous()
        check_device(op, "cos_sin_cache", cos_sin_cache, dev, "query")
        if positions.is_cpu:
            _check_positions_on_host(positions, cos_sin_cache.shape[0])
        nk, ks, khs = 0, qs, qhs
        if key is not None:
            if key.dtype != query.dtype:
                raise TypeError(f"{op}: key dtype {key.dtype} != query dtype {query.dtype}")
            Tk, nk, ks, khs = _heads_view(op, "key", key, head_size)
            if Tk != T:
                raise ValueError(f"{op}: key {tuple(key.shape)} vs query {tuple(query.shape)}: token counts differ")
            check_device(op, "key", key, dev, "query")
        target = self.target_name(hw, query.device)
        if T:
            is_neox = bool(is_neox)
            strided = qhs != head_size or khs != head_size
            key_ = (target, T, nq, nk, rot, head_size, is_neox, query.dtype, strided)
            plan = self._rope_plans.get(key_)
            if plan is None:
                cfg = self.launch["rotary_embedding"][target]
                plan = remember(
                    self._rope_plans,
                    key_,
                    plan_rotary_embedding(T, nq, nk, rot, head_size, is_neox, query.element_size(), cfg, strided),
                )
            nqb, nhb = plan.info
            k_t = key if key is not None else query  # no key blocks are launched without a key
            args = (positions, query, k_t, cos_sin_cache, qs, ks, cos_sin_cache.stride(0))
            run_plan(plan, query, args + (nq, nk, nqb, nhb, qhs, khs))
        return query, key


def _check_positions_on_host(positions: torch.Tensor, max_position: int) -> None:
    # Positions already on the host (CPU tensors, the interpreter's): each a row of cos_sin_cache.
    # On a GPU this would take a device sync; there a position past it is an out-of-bounds read.
    bad = first_outside(positions, 0, max_position)
    if bad is not None:
        (t,) = bad
        raise ValueError(
            f"rotary_embedding: positions[{t}] = {int(positions[t])} is not a row of cos_sin_cache "
            f"(0 to {max_position - 1})"
        )


# ----------------------------------------------------------------------------------------------
# Shapes and strides


def _shrink_tile(programs, r: int, c: int, min_elems: int, min_programs: int) -> tuple[int, int]:
    """Halve rows per program ``r``, then columns ``c``, while ``programs(r, c)`` is below
    ``min_programs`` and the tile keeps more than ``min_elems`` elements."""
    while programs(r, c) < min_programs and r * c > min_elems:
        if r > 1:
            r //= 2
        elif c > 1:
            c //= 2
        else:
            break
    return r, c


def _row_stride(op: str, name: str, t: torch.Tensor, n: int) -> int:
    """Row stride of ``t`` viewed as [rows, n]: free for 2-D, rank > 2 must be contiguous."""
    if t.stride(-1) != 1 and n > 1:
        raise ValueError(f"{op}: {name} {tuple(t.shape)} must have unit stride in the last dim (strides {t.stride()})")
    if t.dim() == 1:
        return n
    if t.dim() == 2:
        if t.shape[0] <= 1:
            return n
        if t.stride(0) < n:
            raise ValueError(f"{op}: {name} {tuple(t.shape)} has overlapping rows (strides {t.stride()})")
        return t.stride(0)
    if not t.is_contiguous():
        raise ValueError(
            f"{op}: {name} {tuple(t.shape)} with strides {t.stride()}: inputs of rank > 2 must be contiguous"
        )
    return n


def _heads_view(op: str, name: str, t: torch.Tensor, head_size: int) -> tuple[int, int, int, int]:
    """(tokens, heads, row stride, head stride) of a [T, H * head_size] or [T, H, head_size]
    tensor; a 3-D one's heads may be strided (a view of a fused projection), as long as no two
    of its elements share memory."""
    if t.dim() == 2:
        if t.shape[1] % head_size:
            raise ValueError(
                f"{op}: {name} last dim {t.shape[1]} is not a multiple of head_size {head_size} "
                f"({name} {tuple(t.shape)})"
            )
        nh = t.shape[1] // head_size
        if t.stride(1) != 1:
            raise ValueError(f"{op}: {name} {tuple(t.shape)} needs unit last stride, got {t.stride()}")
    elif t.dim() == 3:
        if t.shape[2] != head_size:
            raise ValueError(f"{op}: {name} {tuple(t.shape)} head dim != head_size {head_size}")
        nh = t.shape[1]
        if t.stride(2) != 1 and head_size > 1:
            raise ValueError(
                f"{op}: {name} {tuple(t.shape)} needs packed heads (unit last stride), strides {t.stride()}"
            )
        hstride = t.stride(1) if nh > 1 else head_size
        if hstride != head_size:
            # Strided heads: rotated in place, so the heads of a token and the tokens must not
            # overlap (tokens apart by more than a token's heads span, or heads apart by more
            # than all tokens span).
            T = t.shape[0]
            rows_apart = T <= 1 or t.stride(0) >= (nh - 1) * hstride + head_size
            if hstride < head_size or not (rows_apart or hstride >= (T - 1) * t.stride(0) + head_size):
                raise ValueError(
                    f"{op}: {name} {tuple(t.shape)} with strides {t.stride()} has overlapping heads or tokens"
                )
            return T, nh, t.stride(0), hstride
    else:
        raise ValueError(
            f"{op}: {name} must be [tokens, heads * head_size] or [tokens, heads, head_size], got {tuple(t.shape)}"
        )
    if t.shape[0] > 1 and t.stride(0) < nh * head_size:
        # Rotated in place: overlapping rows would be rotated more than once.
        raise ValueError(f"{op}: {name} {tuple(t.shape)} has overlapping rows (strides {t.stride()})")
    return t.shape[0], nh, t.stride(0), head_size


# ----------------------------------------------------------------------------------------------
# RMSNorm (+ fused residual add)


@triton.jit(do_not_specialize=["n_rows"])
def _rms_norm_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    r_ptr,
    z_ptr,
    n_rows,
    N,
    x_stride,
    r_stride,
    eps,
    HAS_RES: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    W_EARLY: tl.constexpr,
):
    # One program normalises BLOCK_R rows held entirely in registers.  W_EARLY: issue the
    # weight load before the reduction's barrier (hides its latency, costs registers).
    pid = tl.program_id(0)
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_N)
    cmask = cols < N
    mask = (rows < n_rows)[:, None] & cmask[None, :]
    rows64 = rows.to(tl.int64)
    x = tl.load(x_ptr + (rows64 * x_stride)[:, None] + cols[None, :], mask=mask, other=0.0)
    x = x.to(tl.float32)
    if HAS_RES:
        r = tl.load(r_ptr + (rows64 * r_stride)[:, None] + cols[None, :], mask=mask, other=0.0)
        r = r.to(tl.float32)
    if W_EARLY:
        w = tl.load(w_ptr + cols, mask=cmask, other=0.0)
    o_offs = (rows64 * N)[:, None] + cols[None, :]
    if HAS_RES:
        # z is rounded to the input dtype and the norm is computed from the rounded value.
        zq = (x + r).to(z_ptr.dtype.element_ty)
        tl.store(z_ptr + o_offs, zq, mask=mask)
        x = zq.to(tl.float32)
    ss = tl.sum(x * x, axis=1)
    inv = tl.rsqrt(ss / N + eps)
    if not W_EARLY:
        w = tl.load(w_ptr + cols, mask=cmask, other=0.0)
    y = x * inv[:, None] * w.to(tl.float32)[None, :]
    tl.store(out_ptr + o_offs, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rms_sq_chunk(x_row, r_row, z_row, start, N, HAS_RES: tl.constexpr, BLOCK_N: tl.constexpr):
    # First pass over one chunk: x (or z = x + residual, stored rounded) squared.  evict_last
    # keeps the row in L2 for the second pass.
    cols = start + tl.arange(0, BLOCK_N)
    m = cols < N
    x = tl.load(x_row + cols, mask=m, other=0.0, eviction_policy="evict_last").to(tl.float32)
    if HAS_RES:
        r = tl.load(r_row + cols, mask=m, other=0.0).to(tl.float32)
        zq = (x + r).to(z_row.dtype.element_ty)
        tl.store(z_row + cols, zq, mask=m)
        x = zq.to(tl.float32)
    return x * x


@triton.jit
def _rms_out_chunk(src_row, w_ptr, o_row, start, N, inv, BLOCK_N: tl.constexpr):
    # Second pass over one chunk: reread x (or z), mostly from L2, scale and store.
    cols = start + tl.arange(0, BLOCK_N)
    m = cols < N
    x = tl.load(src_row + cols, mask=m, other=0.0, eviction_policy="evict_first").to(tl.float32)
    w = tl.load(w_ptr + cols, mask=m, other=0.0, eviction_policy="evict_last").to(tl.float32)
    tl.store(o_row + cols, (x * inv * w).to(o_row.dtype.element_ty), mask=m)


@triton.jit(do_not_specialize=["n_rows"])
def _rms_norm_loop_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    r_ptr,
    z_ptr,
    n_rows,
    N,
    x_stride,
    r_stride,
    eps,
    HAS_RES: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    W_EARLY: tl.constexpr,
    STATIC_N: tl.constexpr,
):
    # Rows of a tile or more: one program per row, two passes over BLOCK_N chunks, reading x
    # (or z) twice.  STATIC_N > 0 is the row length as a compile-time constant (N == STATIC_N):
    # the chunk loops unroll and full chunks lose their masks; 0 keeps N a runtime value.
    # n_rows is not read (the grid has one program per row) and not specialized on: as in the
    # other kernels, a new token count compiles nothing.
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_stride
    r_row = r_ptr + row * r_stride
    z_row = z_ptr + row * N
    o_row = out_ptr + row * N
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    if STATIC_N > 0:
        for start in tl.static_range(0, STATIC_N, BLOCK_N):
            acc += _rms_sq_chunk(x_row, r_row, z_row, start, STATIC_N, HAS_RES, BLOCK_N)
    else:
        for start in range(0, N, BLOCK_N):
            acc += _rms_sq_chunk(x_row, r_row, z_row, start, N, HAS_RES, BLOCK_N)
    inv = tl.rsqrt(tl.sum(acc, axis=0) / N + eps)
    if HAS_RES:
        tl.debug_barrier()  # this program's z stores become visible to all its threads
        src_row = z_row
    else:
        src_row = x_row
    if STATIC_N > 0:
        for start in tl.static_range(0, STATIC_N, BLOCK_N):
            _rms_out_chunk(src_row, w_ptr, o_row, start, STATIC_N, inv, BLOCK_N)
    else:
        for start in range(0, N, BLOCK_N):
            _rms_out_chunk(src_row, w_ptr, o_row, start, N, inv, BLOCK_N)


def plan_rms_norm(n_rows: int, N: int, esize: int, has_res: bool, cfg: Any) -> LaunchPlan:
    """Kernel and constexprs: rows shorter than a tile are packed whole into registers
    (HAS_RES, BLOCK_R, BLOCK_N, W_EARLY), several a program until a program loads tile_bytes,
    fewer while the grid is below min_programs; rows of a tile or more take the two-pass
    kernel (HAS_RES, 1, BLOCK_N, False, STATIC_N)."""
    vec = max(1, 16 // esize)
    block_n = pow2ceil(N)
    if block_n > _RMS_MAX_BLOCK_N or N * esize >= cfg.tile_bytes:
        # One program per row, tile-sized chunks read twice (the second time mostly from L2),
        # two 16-byte vectors per thread over the row.  On the H200 (bf16, 16384 rows) this ran
        # hidden 4096 at 3.95 TB/s against 3.86 for the row kept in registers, and hidden 8192
        # at 4.17 TB/s (the device copy's rate) with the row length a compile-time constant,
        # 4.13 without (commit eceb570).  Rows past _RMS_MAX_BLOCK_N keep N at run time.
        chunk = min(pow2floor(max(vec, cfg.tile_bytes // esize)), _RMS_MAX_BLOCK_N, block_n)
        w = pow2floor(max(1, N // (2 * vec * cfg.warp_size)))
        w = max(1, min(w, cfg.max_warps, chunk // (vec * cfg.warp_size)))
        static_n = N if block_n <= _RMS_MAX_BLOCK_N else 0
        return LaunchPlan(_rms_norm_loop_kernel, n_rows, (has_res, 1, chunk, False, static_n), w)
    row_load = N * esize * (2 if has_res else 1)
    r = min(pow2floor(max(1, cfg.tile_bytes // row_load)), pow2ceil(n_rows))
    while r > 1 and cdiv(n_rows, r) < cfg.min_programs:
        r //= 2
    w = fit_warps(r * block_n, vec, cfg, grow=True)
    # The early weight load costs ~8 registers a thread: worth it only once a thread already
    # holds >= 32 row elements (past the full-occupancy register count anyway).
    early = r * block_n >= 32 * w * cfg.warp_size
    return LaunchPlan(_rms_norm_kernel, cdiv(n_rows, r), (has_res, r, block_n, early), w)


# ----------------------------------------------------------------------------------------------
# SiLU and mul


@triton.jit
def _gated_tile(n_rows, d, n_col_blocks, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    # This program's (row block, column block) of a [BLOCK_R, BLOCK_D] output tile of the gated
    # activations: its column block, int64 rows, columns and the in-bounds mask.
    pid = tl.program_id(0)
    pr = pid // n_col_blocks
    pc = pid - pr * n_col_blocks
    rows = (pr * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    cols = pc * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = (rows < n_rows)[:, None] & (cols < d)[None, :]
    return pc, rows, cols, mask


@triton.jit(do_not_specialize=["n_rows"])
def _silu_and_mul_kernel(
    x_ptr,
    out_ptr,
    n_rows,
    d,
    x_stride,
    n_col_blocks,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # Program (row block, column block) of a [BLOCK_R, BLOCK_D] output tile; the two halves
    # of x are two vector loads, at ptr and ptr + d.
    _, rows, cols, mask = _gated_tile(n_rows, d, n_col_blocks, BLOCK_R, BLOCK_D)
    a_ptrs = x_ptr + (rows * x_stride)[:, None] + cols[None, :]
    a = tl.load(a_ptrs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(a_ptrs + d, mask=mask, other=0.0).to(tl.float32)
    y = a / (1.0 + tl.exp(-a)) * b
    out_ptrs = out_ptr + (rows * d)[:, None] + cols[None, :]
    tl.store(out_ptrs, y.to(out_ptr.dtype.element_ty), mask=mask)


def plan_silu_and_mul(n_rows: int, d: int, esize: int, cfg: Any) -> LaunchPlan:
    """Constexprs (BLOCK_R, BLOCK_D); info = number of column blocks."""
    vec = max(1, 16 // esize)
    tile = pow2floor(max(1, cfg.tile_bytes // (2 * esize)))  # output elements, two loads each
    bd = min(pow2ceil(d), tile)
    br = min(max(1, tile // bd), pow2ceil(n_rows))
    min_elems = cfg.num_warps * cfg.warp_size * vec
    br, bd = _shrink_tile(lambda r, c: cdiv(n_rows, r) * cdiv(d, c), br, bd, min_elems, cfg.min_programs)
    ncb = cdiv(d, bd)
    w = fit_warps(br * bd, vec, cfg)
    return LaunchPlan(_silu_and_mul_kernel, cdiv(n_rows, br) * ncb, (br, bd), w, ncb)


# ----------------------------------------------------------------------------------------------
# Other gated activations (vLLM's): one kernel, the activation a constexpr

# ACT of _act_and_mul_kernel per public function.
ACTS = {"gelu_tanh_and_mul": 0, "swigluoai_and_mul": 1, "mul_and_silu": 2}


@triton.jit(do_not_specialize=["n_rows"])
def _act_and_mul_kernel(
    x_ptr,
    out_ptr,
    n_rows,
    d,
    x_stride,
    n_col_blocks,
    alpha,
    limit,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
    ACT: tl.constexpr,
):
    # _silu_and_mul_kernel's tiles.  ACT 0: gelu_tanh(x[:d]) * x[d:]; 1 (swigluoai, gpt-oss):
    # pairs (gate, up) = (x[2i], x[2i + 1]), one contiguous load de-interleaved in registers,
    # gate clamped above at limit, up to [-limit, limit], gate * sigmoid(alpha * gate) * (up + 1);
    # 2: x[:d] * silu(x[d:]).
    pc, rows, cols, mask = _gated_tile(n_rows, d, n_col_blocks, BLOCK_R, BLOCK_D)
    if ACT == 1:
        j = pc * 2 * BLOCK_D + tl.arange(0, 2 * BLOCK_D)
        pair = tl.load(
            x_ptr + (rows * x_stride)[:, None] + j[None, :],
            mask=(rows < n_rows)[:, None] & (j < 2 * d)[None, :],
            other=0.0,
        ).to(tl.float32)
        gate, up = tl.split(tl.reshape(pair, [BLOCK_R, BLOCK_D, 2]))
        gate = tl.minimum(gate, limit)
        up = tl.minimum(tl.maximum(up, -limit), limit)
        y = gate / (1.0 + tl.exp(-alpha * gate)) * (up + 1.0)
    else:
        a_ptrs = x_ptr + (rows * x_stride)[:, None] + cols[None, :]
        a = tl.load(a_ptrs, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(a_ptrs + d, mask=mask, other=0.0).to(tl.float32)
        if ACT == 0:
            # 0.5 * (1 + tanh(z)) = sigmoid(2z): no cancellation near 0, exact limits in fp32.
            z = 0.7978845608028654 * (a + 0.044715 * a * a * a)
            y = a / (1.0 + tl.exp(-2.0 * z)) * b
        else:
            y = a * (b / (1.0 + tl.exp(-b)))
    out_ptrs = out_ptr + (rows * d)[:, None] + cols[None, :]
    tl.store(out_ptrs, y.to(out_ptr.dtype.element_ty), mask=mask)


def plan_act_and_mul(n_rows: int, d: int, esize: int, act: int, cfg: Any) -> LaunchPlan:
    """silu_and_mul's plan for _act_and_mul_kernel: constexprs (BLOCK_R, BLOCK_D, ACT); info =
    number of column blocks."""
    p = plan_silu_and_mul(n_rows, d, esize, cfg)
    return LaunchPlan(_act_and_mul_kernel, p.grid, (*p.consts, act), p.num_warps, p.info)


# ----------------------------------------------------------------------------------------------
# Rotary embedding (in place)


@triton.jit(do_not_specialize=["n_q_heads", "n_k_heads"])
def _rope_kernel(
    pos_ptr,
    q_ptr,
    k_ptr,
    cs_ptr,
    q_stride,
    k_stride,
    cs_stride,
    n_q_heads,
    n_k_heads,
    n_q_blocks,
    n_head_blocks,
    q_head_stride,
    k_head_stride,
    HEAD_SIZE: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    IS_NEOX: tl.constexpr,
    STRIDED: tl.constexpr = False,
):
    # Program (token, block of BLOCK_H heads): head blocks [0, n_q_blocks) are query, the rest
    # key.  The head counts are runtime values so that both branches see a tensor ``nh``.
    # Heads are HEAD_SIZE apart (packed), or with STRIDED q_head_stride / k_head_stride apart
    # (views of a fused projection); packed calls never read the head strides.
    pid = tl.program_id(0)
    tok = pid // n_head_blocks
    hb = pid - tok * n_head_blocks
    tok64 = tok.to(tl.int64)
    pos = tl.load(pos_ptr + tok64).to(tl.int64)
    d = tl.arange(0, BLOCK_HALF)
    dmask = d < HALF
    cs_row = cs_ptr + pos * cs_stride
    cos = tl.load(cs_row + d, mask=dmask, other=0.0).to(tl.float32)[None, :]
    sin = tl.load(cs_row + HALF + d, mask=dmask, other=0.0).to(tl.float32)[None, :]
    if hb < n_q_blocks:
        base = q_ptr + tok64 * q_stride
        nh = n_q_heads
        h0 = hb * BLOCK_H
        hstride = q_head_stride
    else:
        base = k_ptr + tok64 * k_stride
        nh = n_k_heads
        h0 = (hb - n_q_blocks) * BLOCK_H
        hstride = k_head_stride
    h = h0 + tl.arange(0, BLOCK_H)
    hmask = (h < nh)[:, None]
    if STRIDED:
        hp = base + (h.to(tl.int64) * hstride)[:, None]
    else:
        hp = base + (h * HEAD_SIZE)[:, None]
    if IS_NEOX:
        # Halves: x1 = dims [0, HALF), x2 = dims [HALF, 2 * HALF).
        m = hmask & dmask[None, :]
        p1 = hp + d[None, :]
        x1 = tl.load(p1, mask=m, other=0.0).to(tl.float32)
        x2 = tl.load(p1 + HALF, mask=m, other=0.0).to(tl.float32)
        tl.store(p1, (x1 * cos - x2 * sin).to(q_ptr.dtype.element_ty), mask=m)
        tl.store(p1 + HALF, (x2 * cos + x1 * sin).to(q_ptr.dtype.element_ty), mask=m)
    else:
        # Interleaved pairs (2i, 2i + 1): one contiguous load, de-interleaved in registers.
        j = tl.arange(0, 2 * BLOCK_HALF)
        m = hmask & (j < 2 * HALF)[None, :]
        p = hp + j[None, :]
        x = tl.load(p, mask=m, other=0.0).to(tl.float32)
        x1, x2 = tl.split(tl.reshape(x, [BLOCK_H, BLOCK_HALF, 2]))
        o = tl.join(x1 * cos - x2 * sin, x2 * cos + x1 * sin)
        tl.store(p, tl.reshape(o, [BLOCK_H, 2 * BLOCK_HALF]).to(q_ptr.dtype.element_ty), mask=m)


def plan_rotary_embedding(
    n_tokens: int,
    n_q: int,
    n_k: int,
    rot_dim: int,
    head_size: int,
    is_neox: bool,
    esize: int,
    cfg: Any,
    strided: bool = False,
) -> LaunchPlan:
    """Constexprs (HEAD_SIZE, HALF, BLOCK_HALF, BLOCK_H, IS_NEOX[, STRIDED]); info = (query head
    blocks, head blocks per token)."""
    vec = max(1, 16 // esize)
    half = rot_dim // 2
    bhalf = pow2ceil(half)
    tile_elems = pow2floor(max(1, cfg.tile_bytes // esize))
    # A tile counts whole heads (the memory a program spans), not only their rotated part: with
    # rot_dim 64 of 128 on the H200, 16 heads a program ran at 3.44 TB/s against 3.31 for 32.
    span = max(2 * bhalf, pow2ceil(head_size))
    bh = max(1, min(pow2floor(max(1, tile_elems // span)), pow2ceil(max(n_q, n_k))))
    min_elems = cfg.num_warps * cfg.warp_size * vec

    def programs(b: int) -> int:
        return n_tokens * (cdiv(n_q, b) + cdiv(n_k, b))

    # Each of the two loads (x1, x2) is a [bh, bhalf] tile: warps and shrinking go by that.
    while bh > 1 and programs(bh) < cfg.min_programs and bh * bhalf > min_elems:
        bh //= 2
    nqb = cdiv(n_q, bh)
    nhb = nqb + cdiv(n_k, bh)
    w = fit_warps(bh * bhalf, vec, cfg)
    # STRIDED only where asked: a packed call launches as it always did.
    consts = (head_size, half, bhalf, bh, is_neox) + ((True,) if strided else ())
    return LaunchPlan(_rope_kernel, n_tokens * nhb, consts, w, (nqb, nhb))
