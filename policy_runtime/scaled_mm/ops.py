"""FP8 matmul with scales (hand-written): the kernel body and host side of generated/scaled_mm.py.

C = (A * scale_a) @ (B * scale_b) for A (M, K) and B (K, N) in float8_e4m3fn, accumulated in fp32
and stored as bf16, fp16 or fp32.  The scaling follows from the scales' shapes (both float32):

- ``outer``: each scale one value (per tensor), or ``scale_a`` (M, 1) per row of A and ``scale_b``
  (1, N) per column of B (torch._scaled_mm's per-tensor and rowwise semantics; here the two kinds
  may also be mixed, one per-tensor and the other per-row/column).  The product of the fp8 values is
  accumulated unscaled and the scales multiply the fp32 tile in the epilogue, as cuBLAS does.
- ``block``: ``scale_a`` (M, K/128), one per row of A and 128-element block of K (1x128 activation
  scales), and ``scale_b`` (K/128, N/128), one per 128x128 block of B (DeepSeek-V3's weights; vLLM's
  w8a8 block fp8).  Every K step (a divisor of 128) lies in one block, so each step's fp32 dot is
  scaled by its rows' and columns' scales before it is added: the sum over blocks is exact in fp32.

One kernel body (``scaled_grouped_body``) serves both scalings as a constexpr; generated/scaled_mm.py
specializes it per bucket config.  Triton's interpreter runs the same ``tl.dot`` on fp8 tensors, so
the CPU tests run the kernel itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch
import triton
import triton.language as tl

from .. import call_cache as _call_cache
from .. import launch as _launch
from ..lookup import PolicyTables
from .constexprs import SCALE_BLOCK
from ..matmul.ops import overlapping, tile_coords, unservable

# Input dtypes the kernels take, and the output dtypes they store.
INPUT_DTYPES = (torch.float8_e4m3fn,)
OUTPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# Scalings (the kernel's SCALING constexpr).
OUTER, BLOCK = 0, 1

# ---------------------------------------------------------------------------------------
# Kernel body: generated/scaled_mm.py's specialized kernels call it with their constants.


@triton.jit
def scaled_grouped_body(
    a_ptr,
    b_ptr,
    c_ptr,
    sa_ptr,
    sb_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    stride_sam,
    stride_sak,
    stride_sbk,
    stride_sbn,
    EVEN_K: tl.constexpr,
    SCALING: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    SCALE_BLOCK: tl.constexpr,
):
    # One program per C tile, in grouped order.  SCALING 0 (outer): scale_a[m * stride_sam] and
    # scale_b[n * stride_sbn] (a stride 0 for one scale per tensor) in the epilogue.  SCALING 1
    # (block): scale_a[m, k // 128] and scale_b[k // 128, n // 128] on every K step.
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = tile_coords(tl.program_id(0), num_pid_m, num_pid_n, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if SCALING == 1:
        sa_ptrs = sa_ptr + offs_m * stride_sam
        # A tile at most one scale block wide lies in one block (tiles start at multiples of
        # BLOCK_N, a power of two): one scale_b value a K step, folded into the row scales.
        sb_ptrs = sb_ptr + (offs_n // SCALE_BLOCK) * stride_sbn
        sb_one = sb_ptr + ((pid_n * BLOCK_N) // SCALE_BLOCK) * stride_sbn
    for kt in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=mask_m[:, None], other=0.0)
            b = tl.load(b_ptrs, mask=mask_n[None, :], other=0.0)
        else:
            k_left = K - kt * BLOCK_K
            a = tl.load(a_ptrs, mask=mask_m[:, None] & (offs_k[None, :] < k_left), other=0.0)
            b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & mask_n[None, :], other=0.0)
        if SCALING == 1:
            kb = (kt * BLOCK_K) // SCALE_BLOCK
            sa = tl.load(sa_ptrs + kb * stride_sak, mask=mask_m, other=0.0)
            if BLOCK_N <= SCALE_BLOCK:
                # One multiply-add an element (the step's product waits for it before the next
                # dot: the fewer instructions here, the sooner the tensor cores go on).
                acc = tl.fma(tl.dot(a, b), (sa * tl.load(sb_one + kb * stride_sbk))[:, None], acc)
            else:
                sb = tl.load(sb_ptrs + kb * stride_sbk, mask=mask_n, other=0.0)
                acc += tl.dot(a, b) * sa[:, None] * sb[None, :]
        else:
            acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    if SCALING == 0:
        sa = tl.load(sa_ptr + offs_m * stride_sam, mask=mask_m, other=0.0)
        sb = tl.load(sb_ptr + offs_n * stride_sbn, mask=mask_n, other=0.0)
        acc = acc * sa[:, None] * sb[None, :]
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


# ---------------------------------------------------------------------------------------
# Records of the generated kernels and buckets.


@dataclass(frozen=True)
class Variant:
    """One specialized kernel of generated/scaled_mm.py and the launch constants it was generated with."""

    kernel: Any
    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int

    @property
    def name(self) -> str:
        return self.kernel.__name__

    def launch(
        self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, scales: "Scales", M: int, N: int, K: int
    ) -> None:
        tiles = triton.cdiv(M, self.block_m) * triton.cdiv(N, self.block_n)
        _launch.launch_kernel(
            self.kernel, (tiles,),
            a, b, c, scales.a, scales.b, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
            c.stride(0), c.stride(1), *scales.strides, K % self.block_k == 0, scales.scaling,
            num_warps=self.num_warps, num_stages=self.num_stages,
        )  # fmt: skip


@dataclass(frozen=True)
class Bucket:
    """One bucket of a policy: its name and its kernel."""

    name: str
    triton: Variant


# A target's policy: its buckets in order, and the function that picks one for (M, N, K).
Policy = tuple[tuple[Bucket, ...], Callable[[int, int, int], Bucket]]


# ---------------------------------------------------------------------------------------
# Checks on a call.


@dataclass(frozen=True)
class Scales:
    """The scales of one call as the kernel reads them: the scaling (OUTER or BLOCK), the two
    tensors and their strides (scale_a's row and K-block strides, scale_b's K-block and column
    strides; 0 along a dimension a scale does not vary over)."""

    scaling: int
    a: torch.Tensor
    b: torch.Tensor
    strides: tuple[int, int, int, int]


def _scale_kinds(s: torch.Tensor, per: tuple[int, int], block: tuple[int, int]) -> dict[str, tuple[int, int]]:
    # The readings of one scale's shape: "tensor" (one value), "vector" (per row of A / per
    # column of B: shape ``per``) and "block" (shape ``block``), each with its two strides
    # (along the scale's first and second dimension as the kernel indexes them).
    kinds: dict[str, tuple[int, int]] = {}
    shape = tuple(s.shape)
    if s.numel() == 1 and s.dim() <= 2:
        kinds["tensor"] = (0, 0)
    if shape == per:
        kinds["vector"] = (s.stride(0), s.stride(1))
    if shape == block:
        kinds["block"] = (s.stride(0), s.stride(1))
    return kinds


def check_scales(op: str, a: torch.Tensor, b: torch.Tensor, scale_a: Any, scale_b: Any) -> Scales:
    """The scaling a call's scales ask for, or ValueError naming the argument that is wrong."""
    M, K = a.shape
    N = b.shape[1]
    for name, s in (("scale_a", scale_a), ("scale_b", scale_b)):
        if not isinstance(s, torch.Tensor):
            raise ValueError(f"{op}: {name} must be a float32 tensor, got {type(s).__name__}")
        if s.dtype != torch.float32:
            raise ValueError(f"{op}: {name} must be float32, got {s.dtype}")
        if s.device != a.device:
            raise ValueError(f"{op}: {name} is on {s.device} but a is on {a.device}")
        if s.requires_grad and torch.is_grad_enabled():
            raise ValueError(f"{op}: {name} requires grad, and the kernels have no backward")
    kb, nb = -(-K // SCALE_BLOCK), -(-N // SCALE_BLOCK)
    ka = _scale_kinds(scale_a, (M, 1), (M, kb))
    kb_ = _scale_kinds(scale_b, (1, N), (kb, nb))
    for name, s, kinds, shapes in (
        (
            "scale_a",
            scale_a,
            ka,
            f"() or (1,) or (1, 1) per tensor, ({M}, 1) per row of a, ({M}, {kb}) per 1x128 block",
        ),
        (
            "scale_b",
            scale_b,
            kb_,
            f"() or (1,) or (1, 1) per tensor, (1, {N}) per column of b, ({kb}, {nb}) per 128x128 block",
        ),
    ):
        if not kinds:
            uneven = [f"{d} = {v}" for d, v in (("K", K), ("N", N)) if v % SCALE_BLOCK]
            note = f" (block scales need K and N multiples of {SCALE_BLOCK}: {', '.join(uneven)})" if uneven else ""
            raise ValueError(
                f"{op}: {name} has shape {tuple(s.shape)}; for a {tuple(a.shape)} @ b {tuple(b.shape)} it must be "
                f"{shapes}{note}"
            )
    # A (M, 1) / (1, N) scale is read per row / column even where M or N is 1 (one launch
    # signature for every M), a one-value scale of another shape with stride 0.
    outer_a = ka.get("vector") or ka.get("tensor")
    outer_b = kb_.get("vector") or kb_.get("tensor")
    if outer_a is not None and outer_b is not None:
        # scale_a (M, 1) reads stride(0) per row; scale_b (1, N) reads stride(1) per column.
        return Scales(OUTER, scale_a, scale_b, (outer_a[0], 0, 0, outer_b[1]))
    if "block" in ka and "block" in kb_:
        for dim, size in (("K", K), ("N", N)):
            if size % SCALE_BLOCK:
                arg = "scale_a" if dim == "K" else "scale_b"
                raise ValueError(
                    f"{op}: {arg} gives block scales, but the block size {SCALE_BLOCK} does not divide {dim} = {size}"
                )
        (sam, sak), (sbk, sbn) = ka["block"], kb_["block"]
        return Scales(BLOCK, scale_a, scale_b, (sam, sak, sbk, sbn))
    blocked, other = ("scale_a", "scale_b") if "block" in ka and outer_a is None else ("scale_b", "scale_a")
    raise ValueError(
        f"{op}: {blocked} has block-scale shape {tuple((scale_a if blocked == 'scale_a' else scale_b).shape)} but "
        f"{other} has shape {tuple((scale_b if blocked == 'scale_a' else scale_a).shape)}: block scaling needs both "
        f"scale_a ({M}, {kb}) and scale_b ({kb}, {nb})"
    )


def check_call(op: str, a: Any, b: Any, out: Any, out_dtype: Any) -> tuple[int, int, int]:
    """Shapes, dtypes and devices of a, b and out; (M, N, K)."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        raise TypeError(f"{op}: a and b must be tensors, got {type(a).__name__} and {type(b).__name__}")
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"{op}: a must be (M, K) and b (K, N); got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    M, K = a.shape
    if b.shape[0] != K:
        raise ValueError(f"{op}: inner dimensions differ: a is {tuple(a.shape)}, b is {tuple(b.shape)}")
    if a.dtype not in INPUT_DTYPES or b.dtype != a.dtype:
        raise TypeError(f"{op}: a and b must both be torch.float8_e4m3fn; got {a.dtype} and {b.dtype}")
    if out_dtype not in OUTPUT_DTYPES:
        raise TypeError(f"{op}: out_dtype must be one of bfloat16, float16, float32; got {out_dtype}")
    if a.device != b.device:
        raise ValueError(f"{op}: a is on {a.device} but b is on {b.device}")
    N = b.shape[1]
    if out is not None:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"{op}: out must be a tensor, got {type(out).__name__}")
        if tuple(out.shape) != (M, N):
            raise ValueError(f"{op}: out must have shape {(M, N)}, got {tuple(out.shape)}")
        if out.dtype != out_dtype:
            raise TypeError(f"{op}: out must be {out_dtype} (out_dtype), got {out.dtype}")
        if out.device != a.device:
            raise ValueError(f"{op}: out is on {out.device} but a is on {a.device}")
        if overlapping(out):
            raise ValueError(f"{op}: out {tuple(out.shape)} with strides {out.stride()} has elements that share memory")
    return M, N, K


# ---------------------------------------------------------------------------------------
# The entry point over the generated module's tables.


# Plans of scaled_mm calls, by argument class (keyed with the ScaledMm object).
_CALLS = _call_cache.CallCache("scaled_mm")


@dataclass(frozen=True)
class ScaledMm(PolicyTables):
    """scaled_mm, buckets and select of generated/scaled_mm.py, over its tables (each served
    target's ``Policy``) and the targets it does not serve (target -> the feature they lack)."""

    unserved: Mapping[str, str] = field(default_factory=dict)
    # The variant whose tiles serve 128-block scales (variant_of_dtype's serve the outer ones).
    block_variant: str = ""

    def served_target(self, op: str, hw: Any, device: Any) -> str:
        target = self.target_name(hw, device)
        missing = self.unserved.get(target)
        if missing is not None:
            served = sorted(self.policies[self.variant(False)])
            raise ValueError(
                f"{op}: target {target!r} has no {missing} (specs/hardware/{target}.toml), which "
                f"specs/kernels/scaled_mm.toml requires; served targets: {', '.join(served)}"
            )
        return target

    def variant(self, block_scales: bool) -> str:
        """The variant whose tiles serve a call with block scales or with outer ones."""
        return self.block_variant if block_scales else self.variant_of_dtype[INPUT_DTYPES[0]]

    def policy(self, variant: str, hw: Any, device: Any) -> Policy:
        target = self.served_target("scaled_mm", hw, device)
        return self.policies[variant][target]

    def select(self, M: int, N: int, K: int, hw: Any, device: Any, block_scales: bool = False) -> Bucket:
        return self.policy(self.variant(block_scales), hw, device)[1](M, N, K)

    def run(self, a: Any, b: Any, scale_a: Any, scale_b: Any, out_dtype: Any, out: Any, hw: Any) -> torch.Tensor:
        """C = (A * scale_a) @ (B * scale_b) into out (or a new tensor) by the bucket's kernel.  A
        call of an argument class seen before (shapes, strides, dtypes, alignment of a, b, the
        scales and out) replays its launch (call_cache.py): the checks and the bucket's choice
        depend on nothing else."""
        tk = _call_cache.tensor_key
        key, plan = _call_cache.lookup(
            _CALLS,
            a,
            lambda: (
                id(self),
                hw,
                out_dtype,
                tk(a),
                tk(b),
                tk(scale_a),
                tk(scale_b),
                None if out is None else tk(out),
                scale_a is scale_b,
            ),
        )
        if key is None:  # off, or not tensors / an unhashable hw: the full path's checks
            return self._run(a, b, scale_a, scale_b, out_dtype, out, hw)
        if plan is not None and plan is not _call_cache.NO_PLAN:
            given = out is not None
            if out is None:
                out = _call_cache.new_like(plan.data)
            with _launch.on_device(a):
                plan.launch((a, b, scale_a, scale_b, out))
            if given:
                torch.autograd.graph.increment_version(out)
            return out
        if plan is not None or _call_cache.grad_needed(a, b, scale_a, scale_b, out):
            return self._run(a, b, scale_a, scale_b, out_dtype, out, hw)
        with _CALLS.record() as rec:
            result = self._run(a, b, scale_a, scale_b, out_dtype, out, hw)
        # One tensor as both scales (one per-tensor value, say) is a class of its own (the key says
        # so): its plan reads scale_a's place for both.
        _CALLS.commit(
            rec,
            key,
            (a, b, scale_a, None if scale_b is scale_a else scale_b, result),
            data=_call_cache.template(result),
        )
        return result

    def _run(self, a: Any, b: Any, scale_a: Any, scale_b: Any, out_dtype: Any, out: Any, hw: Any) -> torch.Tensor:
        # The full path of a call: checks, scaling, bucket, launch.
        op = "scaled_mm"
        M, N, K = check_call(op, a, b, out, out_dtype)
        scales = check_scales(op, a, b, scale_a, scale_b)
        bucket = self.policy(self.variant(scales.scaling == BLOCK), hw, a.device)[1](M, N, K)
        why = unservable(a, b, out, M, N, K)
        if why is not None:
            raise ValueError(f"{op}: {why}")
        given = out is not None
        if out is None:
            out = torch.empty((M, N), dtype=out_dtype, device=a.device)
        if M == 0 or N == 0:
            return out
        if K == 0:
            return out.zero_()
        with _launch.on_device(a):
            bucket.triton.launch(a, b, out, scales, M, N, K)
        if given:
            torch.autograd.graph.increment_version(out)
        return out
