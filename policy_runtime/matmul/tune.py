"""matmul's tuning harness: how ``python -m codegen tune matmul`` runs a record on a problem.

The matmul family's ``tune`` (policy_runtime.matmul.FAMILY); the tuner knows no family, only this
protocol (``codegen/tune/measure.py``): ``HARNESS.problem(shape, dtype, device, params)`` -> a
problem for one shape (``{"m", "n", "k"}``; ``params["target"]``: the hardware spec tuned), whose
``kernel(record)`` returns a no-argument callable running a bucket record (ValueError where it
cannot serve the problem), ``library()`` the same for torch.matmul, ``error(out)`` the relative
error against an fp32 reference, and ``flops``.  A record runs through the generated kernels'
launchers (``Variant.launch`` of ops.py: split rule, workspaces, TMA descriptors and fallback) on
the body and constants generated/matmul.py's wrapper would use (constexprs.py, one mapping for both).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import torch

from .. import launch as _launch
from . import ops as _mm
from .constexprs import body_constants, fallback_record
from ..tuning import BoundKernel, Harness, Problem


def variant(record: Mapping[str, Any], dtype_bytes: int) -> _mm.Variant:
    """The runtime ``Variant`` of a bucket record: its kernel the body and constants
    generated/matmul.py's wrapper would have, a TMA kernel's pointer-kernel fallback the one it
    would name (policy_runtime/matmul/constexprs.py, which the template's context reads too)."""
    kind = record["kernel"]
    body, constants = body_constants(record, dtype_bytes)
    fallback = variant(fallback_record(record), dtype_bytes) if kind == "tma_persistent" else None
    return _mm.Variant(
        kernel=BoundKernel(getattr(_mm, body), f"candidate_{kind}", constants),
        kind=kind,
        block_m=record["block_m"],
        block_n=record["block_n"],
        block_k=record["block_k"],
        group_m=record["group_m"],
        split_k=record["split_k"],
        num_warps=record["num_warps"],
        num_stages=record["num_stages"],
        num_programs=record["num_programs"],
        fallback=fallback,
    )


class MatmulProblem(Problem):
    """C = A @ B for one (m, n, k): seeded inputs, an fp32 reference, one output per runner."""

    def __init__(self, shape: Mapping[str, int], dtype: torch.dtype, device: Any, seed: int = 0):
        self.m, self.n, self.k = shape["m"], shape["n"], shape["k"]
        gen = torch.Generator(device="cpu").manual_seed(seed)
        self.a = torch.randn(self.m, self.k, generator=gen).to(device=device, dtype=dtype)
        self.b = torch.randn(self.k, self.n, generator=gen).to(device=device, dtype=dtype)
        self.reference = self.a.float() @ self.b.float()
        self.flops = 2.0 * self.m * self.n * self.k

    def kernel(self, record: Mapping[str, Any]) -> Callable[[], torch.Tensor]:
        bf16 = _launch.interpreted_bf16_dots(self.a)  # as the entry points refuse it (launch.py)
        if bf16 is not None:
            raise ValueError(f"a and b are {bf16} (codegen tune --dtype float16)")
        v = variant(record, self.a.element_size())
        out = torch.full((self.m, self.n), float("nan"), dtype=self.a.dtype, device=self.a.device)
        a, b, m, n, k = self.a, self.b, self.m, self.n, self.k

        def run() -> torch.Tensor:
            v.launch(a, b, out, m, n, k)
            return out

        return run

    def library(self) -> Callable[[], torch.Tensor]:
        out = torch.empty((self.m, self.n), dtype=self.a.dtype, device=self.a.device)
        return lambda: torch.matmul(self.a, self.b, out=out)


HARNESS = Harness(problem=lambda shape, dtype, device, params: MatmulProblem(shape, dtype, device))
