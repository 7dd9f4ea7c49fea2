"""scaled_mm's tuning harness: how ``python -m codegen tune scaled_mm`` runs a record on a problem.

Named by ``[scaled_mm.tune] harness`` in specs/kernels/scaled_mm.toml; the protocol is
policy_runtime/matmul/tune.py's (``codegen/tune/measure.py``).  The problem: A (m, k) e4m3
row-major, B (k, n) e4m3 the transpose of a row-major (n, k) weight, output in the spec's
``dtype``, with the scaling the spec's ``params.scaling`` names ("tensor", "rowwise" or "block");
the library is torch._scaled_mm for the first two (none for block scales).  A record runs through
``Variant.launch`` of policy_runtime/scaled_mm/ops.py on the body and constants generated/scaled_mm.py's
wrapper for it would have (policy_runtime/scaled_mm/constexprs.py).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

import torch

from . import ops as _smm
from .constexprs import SCALE_BLOCK, body_constants
from ..tuning import BoundKernel, Harness, Problem

FP8 = torch.float8_e4m3fn


def variant(record: Mapping[str, Any]) -> _smm.Variant:
    """The runtime ``Variant`` of a bucket record, its kernel the body and constants the
    generated wrapper would have."""
    body, constants = body_constants(record)
    return _smm.Variant(
        kernel=BoundKernel(getattr(_smm, body), "candidate_scaled_mm", constants),
        block_m=record["block_m"],
        block_n=record["block_n"],
        block_k=record["block_k"],
        group_m=record["group_m"],
        num_warps=record["num_warps"],
        num_stages=record["num_stages"],
    )


class ScaledMmProblem(Problem):
    """C = (A * scale_a) @ (B * scale_b) for one (m, n, k): seeded e4m3 inputs and scales, an fp32
    reference on the dequantized inputs, one output per runner."""

    def __init__(self, shape: Mapping[str, int], dtype: torch.dtype, device: Any, scaling: str, seed: int = 0):
        self.m, self.n, self.k = m, n, k = shape["m"], shape["n"], shape["k"]
        self.dtype, self.scaling = dtype, scaling
        gen = torch.Generator(device="cpu").manual_seed(seed)
        self.a = torch.randn(m, k, generator=gen).to(FP8).to(device)
        self.b = torch.randn(n, k, generator=gen).to(FP8).to(device).t()
        if scaling == "tensor":
            sa, sb = torch.tensor(0.75), torch.tensor(1.25)
        elif scaling == "rowwise":
            sa, sb = torch.rand(m, 1, generator=gen) + 0.5, torch.rand(1, n, generator=gen) + 0.5
        elif scaling == "block":
            sa = torch.rand(m, -(-k // SCALE_BLOCK), generator=gen) + 0.5
            sb = torch.rand(-(-k // SCALE_BLOCK), -(-n // SCALE_BLOCK), generator=gen) + 0.5
        else:
            raise ValueError(f"scaled_mm tune: params.scaling must be tensor, rowwise or block, got {scaling!r}")
        self.sa, self.sb = sa.to(device), sb.to(device)
        self.scales = _smm.check_scales("scaled_mm tune", self.a, self.b, self.sa, self.sb)
        full_a, full_b = self.sa, self.sb
        if scaling == "block":
            full_a = full_a.repeat_interleave(SCALE_BLOCK, 1)[:, :k]
            full_b = full_b.repeat_interleave(SCALE_BLOCK, 0).repeat_interleave(SCALE_BLOCK, 1)[:k, :n]
        self.reference = (self.a.float() * full_a).double().matmul((self.b.float() * full_b).double()).float()
        self.flops = 2.0 * m * n * k

    def kernel(self, record: Mapping[str, Any]) -> Callable[[], torch.Tensor]:
        v = variant(record)
        out = torch.full((self.m, self.n), float("nan"), dtype=self.dtype, device=self.a.device)
        a, b, scales, m, n, k = self.a, self.b, self.scales, self.m, self.n, self.k

        def run() -> torch.Tensor:
            v.launch(a, b, out, scales, m, n, k)
            return out

        return run

    def library(self) -> Optional[Callable[[], torch.Tensor]]:
        if self.scaling == "block":
            return None
        return lambda: torch._scaled_mm(self.a, self.b, scale_a=self.sa, scale_b=self.sb, out_dtype=self.dtype)


HARNESS = Harness(
    problem=lambda shape, dtype, device, params: ScaledMmProblem(shape, dtype, device, params.get("scaling", "rowwise"))
)
