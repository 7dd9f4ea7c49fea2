"""generated/scaled_mm.py's warm-up driver (hand-written; policy_runtime/warmup/ runs it).

Calls covered (targets with e4m3fn tensor cores; others are named in the notes): every bucket of
``scaled_mm_e4m3`` with A row-major and B either the transpose of a row-major (N, K) weight or
row-major, output in each dtype asked, and each scaling its tiles serve: one scale per tensor,
scale_a (M, 1) and scale_b (1, N) contiguous; block scales (M, K/128) and (K/128, N/128)
contiguous (``scaled_mm_e4m3_block``'s buckets); N and K
multiples of 128. Other scale strides, K not a multiple of block_k and a transposed A compile on
first use.
"""

from __future__ import annotations

from typing import Any

import torch

from ..matmul.warmup import MatmulDriver
from ..warmup.calls import Call, Options, empty, torch_dtype

__all__ = ["ScaledMmDriver"]

class ScaledMmDriver:
    """generated/scaled_mm.py's calls: ``ScaledMm.run`` for every bucket of a served target, each
    output dtype asked, each scaling (per tensor, per row/column, 128-blocks) and B layout."""

    # Scale kinds as the kernels specialize them: per tensor (strides 0), rowwise (unit strides),
    # block (a row stride of K/128, multiples of 16 here).
    SCALINGS = ("tensor", "rowwise", "block")
    LAYOUTS = ("b = w.t()", "b row-major")

    class _Grid(MatmulDriver):
        # N and K multiples of 128 (block scales need them) from 256, where no block scale has
        # the shape of a per-tensor or per-row one; M anything.
        DIMS = [256 * 2**j for j in range(7)]

        # One shape a bucket, N and K on the grid (multiples of 128: block scales need them), as
        # the docstring says: scaled_mm's other argument classes compile on first use.
        OFFSETS = (0,)

        @classmethod
        def arg_class(cls, M: int, N: int, K: int, v: Any) -> tuple:
            return ()

    def __init__(self, module: str, smm: Any) -> None:
        self.module, self.smm = module, smm
        self._shapes: dict[tuple, dict[tuple[int, tuple], tuple]] = {}  # as MatmulDriver's

    def calls(self, opts: Options) -> tuple[list[Call], list[str]]:
        calls: list[Call] = []
        if opts.target in self.smm.unserved:
            return calls, [f"scaled_mm: not served on {opts.target}: no {self.smm.unserved[opts.target]}"]
        notes: list[str] = []
        for variant, policies in self.smm.policies.items():
            buckets, select = policies[opts.target]
            memo = (variant, opts.target, opts.pick)
            if memo not in self._shapes:
                self._shapes[memo] = self._Grid.shapes(buckets, select, opts.pick)
            shapes = self._shapes[memo]
            for i, b in enumerate(buckets):
                if (i, ()) not in shapes:
                    notes.append(f"scaled_mm {variant} {opts.target} {b.name}: no (M, N, K) on the search grid reaches it")
                    continue
                M, N, K = shapes[i, ()]
                # The block variant's tiles serve block scales only, the other's the outer ones.
                scalings = ("block",) if variant == self.smm.block_variant else self.SCALINGS[:2]
                for dtype in opts.dtypes:
                    for scaling in scalings:
                        for layout in self.LAYOUTS:
                            covers = ("scaled_mm", variant, b.name, dtype, scaling, layout)
                            args = (opts.target, dtype, M, N, K, scaling, layout)
                            calls.append(Call(self.module, "scaled_mm", args, covers, 3))
        return calls, notes

    def run(self, call: Call, device: torch.device) -> None:
        target, dtype, M, N, K, scaling, layout = call.args
        fp8 = torch.float8_e4m3fn
        a = empty((M, K), fp8, device)
        b = empty((K, N), fp8, device) if layout == "b row-major" else empty((N, K), fp8, device).t()
        shapes = {"tensor": ((), ()), "rowwise": ((M, 1), (1, N)), "block": ((M, K // 128), (K // 128, N // 128))}
        sa, sb = (empty(s, torch.float32, device) for s in shapes[scaling])
        self.smm.run(a, b, sa, sb, torch_dtype(dtype), None, target)

