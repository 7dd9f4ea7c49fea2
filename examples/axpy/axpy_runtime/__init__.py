"""The axpy family's hand-written runtime: the kernel body and the host side.

generated/axpy.py (built from templates/axpy/module.py.j2) imports this package by its absolute name, as
this repository's generated modules import policy_runtime: it must be importable wherever the
generated package is (here, both sit in the project root; a project that ships a wheel puts both
in it).  What does not vary with the specs lives here as ordinary Python; what does (the block
size of each target, baked into a kernel of its own) is generated.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def axpy_body(x_ptr, y_ptr, out_ptr, alpha, n, BLOCK: tl.constexpr):
    """out[i] = alpha * x[i] + y[i] for the BLOCK elements of this program."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, (alpha * x + y).to(out_ptr.dtype.element_ty), mask=mask)


def launch(kernel, block_size: int, num_warps: int, alpha: float, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Check the arguments and launch a generated kernel (one of axpy_body's specializations)."""
    if x.shape != y.shape or x.dtype != y.dtype or x.device != y.device:
        raise ValueError(
            f"axpy: x and y differ: {tuple(x.shape)} {x.dtype} {x.device}, " f"{tuple(y.shape)} {y.dtype} {y.device}"
        )
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"axpy: floating-point tensors only (got {x.dtype})")
    x, y = x.contiguous(), y.contiguous()
    out = torch.empty_like(x)
    n = x.numel()
    if n:
        kernel[(triton.cdiv(n, block_size),)](x, y, out, alpha, n, num_warps=num_warps)
    return out
