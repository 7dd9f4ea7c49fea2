"""generated/matmul.py's warm-up driver (hand-written; policy_runtime/warmup/ runs it).

Calls covered, in the dtypes asked: every bucket of ``matmul_16bit`` / ``matmul_fp32``
(``matmul_triton``'s path, so the buckets ``matmul`` leaves to the vendor library too), A row-
major (M, K), B row-major (K, N) or the transpose of a row-major (N, K) weight (``w.t()``), the
output new; in each bucket, every argument class of (N, K) that reaches it
(``MatmulDriver.arg_class``): N and K each 1, a multiple of 16, of 8 or of 4 (what decides
whether TMA can describe an operand, else the bucket's grouped fallback runs), or none of these;
K a multiple of the bucket's block_k (the kernels' EVEN_K) or not; for a persistent TMA kernel, a
launch that splits K and one that does not. M is never specialized on (but an (M, 1) operand's
TMA descriptor takes M as its stride: its class too where N or K is 1). So odd shapes
(300x12345x777, 7x5000x3000) compile nothing (tests/test_warmup_classes.py on the CPU,
tests/test_warmup_gpu.py on a GPU). Transposed A, other strided views and operands at addresses
that are not 16-byte aligned compile on first use.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from .. import launch as _launch
from ..warmup.calls import Call, Options, empty, torch_dtype
from .ops import split_count as _mm_splits

__all__ = ["MatmulDriver"]

class MatmulDriver:
    """generated/matmul.py's calls: ``Matmul.run`` (matmul_triton's path) for every bucket and
    every argument class of (N, K) that reaches it."""

    # Candidate (M, N, K) of the bucket search: N and K multiples of 16 (and 1), M anything (M is
    # not specialized on); then each of the smallest shapes a bucket serves with N and K moved by
    # OFFSETS, which give every argument class of a size (``size_class``) and K both a multiple of
    # block_k and not.
    DIMS = sorted({1} | {16 * 2**j for j in range(12)} | {48 * 2**j for j in range(10)})
    MS = sorted({m for j in range(17) for m in (2**j - 1, 2**j, 2**j + 1, 3 * 2**j)} - {0})
    OFFSETS: tuple[int, ...] = (0, 1, 4, 8, 16)
    # How many of a bucket's smallest shapes are moved by OFFSETS in the search.
    NEAREST = 200
    LAYOUTS = ("b row-major", "b = w.t()")

    @staticmethod
    def size_class(v: int) -> str:
        """How a call sees a size (and the strides it makes: a row-major operand's leading stride
        is N or K): Triton's binder tells 1, multiples of 16 and the rest apart; the launcher's TMA
        test (a leading stride of a multiple of 16 bytes) also multiples of 8 (16-bit elements)
        and of 4 (fp32) from the rest."""
        if v == 1:
            return "1"
        return next((f"{d}n" for d in (16, 8, 4) if v % d == 0), "odd")

    @classmethod
    def arg_class(cls, M: int, N: int, K: int, v: Any) -> tuple:
        """The argument class of a call of a bucket's kernel ``v`` (its Variant) with (M, N, K):
        each size's class, whether K is a multiple of the kernel's block_k (the grouped kernels'
        EVEN_K) and, for a persistent TMA kernel, whether the launch splits K (its ``splits``
        argument is 1 or not) and, where N or K is 1, M's class (an (M, 1) operand's descriptor
        takes M as its leading stride); with the layout, what decides the launch's specialization
        (pointers are torch's, 16-byte aligned)."""
        tma: tuple = ()
        if v.kind == "tma_persistent":
            tma = (_mm_splits(v, _launch.cdiv(M, v.block_m) * _launch.cdiv(N, v.block_n)) == 1,)
            if N == 1 or K == 1:
                tma += (cls.size_class(M),)
        return (cls.size_class(N), cls.size_class(K), K % v.block_k == 0, *tma)

    @staticmethod
    def describe_class(c: tuple) -> str:
        text = f"N {c[0]}, K {c[1]}" + (", even K" if c[2] else "")
        if len(c) > 3:
            text += ", unsplit" if c[3] else ", split K"
        return text + (f", M {c[4]}" if len(c) > 4 else "")

    def __init__(self, module: str, mm: Any) -> None:
        self.module, self.mm = module, mm
        # (variant, target, pick) -> {(bucket index, argument class): (M, N, K)}
        self._shapes: dict[tuple, dict[tuple[int, tuple], tuple]] = {}

    def calls(self, opts: Options) -> tuple[list[Call], list[str]]:
        calls, notes = [], []
        for dtype in opts.dtypes:
            variant = self.mm.variant_of_dtype[torch_dtype(dtype)]
            buckets, select = self.mm.policies[variant][opts.target]
            memo = (variant, opts.target, opts.pick)
            if memo not in self._shapes:
                self._shapes[memo] = self.shapes(buckets, select, opts.pick)
            shapes = self._shapes[memo]
            for i, b in enumerate(buckets):
                if not any(j == i for j, _ in shapes):
                    notes.append(f"matmul {variant} {opts.target} {b.name}: no (M, N, K) on the search grid reaches it")
                    continue
                for layout in self.LAYOUTS:
                    for (j, cls), (M, N, K) in shapes.items():
                        if j != i:
                            continue
                        covers = ("matmul", variant, b.name, dtype, layout, self.describe_class(cls))
                        calls.append(Call(self.module, "matmul", (opts.target, dtype, M, N, K, layout), covers, 3))
        return calls, notes

    @classmethod
    def shapes(
        cls, buckets: Sequence[Any], select: Callable[[int, int, int], Any], pick: str
    ) -> dict[tuple[int, tuple], tuple]:
        """(bucket index, argument class) -> (M, N, K): for each bucket, each argument class of
        (N, K) (``arg_class``) that some shape on the search grid gives it, the smallest such
        operands, in the order of the grid; with pick "other", the same N and K and the nearest
        other M the bucket serves."""
        index = {id(b): i for i, b in enumerate(buckets)}
        hits: dict[int, list[tuple]] = {}
        for N in cls.DIMS:
            for K in cls.DIMS:
                for M in cls.MS:
                    hits.setdefault(index[id(select(M, N, K))], []).append((M * K + K * N + M * N, M, N, K))
        best: dict[tuple[int, tuple], tuple] = {}
        for near in hits.values():
            for _, M, N0, K0 in sorted(near)[: cls.NEAREST]:
                for N in (N0 + o for o in cls.OFFSETS):
                    for K in (K0 + o for o in cls.OFFSETS):
                        i = index[id(select(M, N, K))]
                        key = (i, cls.arg_class(M, N, K, buckets[i].triton))
                        size = (M * K + K * N + M * N, M, N, K)
                        if key not in best or size < best[key]:
                            best[key] = size
        shapes = {key: best[key][1:] for key in sorted(best, key=lambda k: (k[0], best[k]))}
        if pick == "other":
            for (i, c), (M, N, K) in shapes.items():
                others = [
                    m
                    for m in cls.MS
                    if m != M and select(m, N, K) is buckets[i] and cls.arg_class(m, N, K, buckets[i].triton) == c
                ]
                if others:
                    shapes[i, c] = (min(others, key=lambda m: (abs(m - M), -m)), N, K)
        return shapes

    def run(self, call: Call, device: torch.device) -> None:
        target, dtype, M, N, K, layout = call.args
        dt = torch_dtype(dtype)
        a = empty((M, K), dt, device)
        b = empty((K, N), dt, device) if layout == "b row-major" else empty((N, K), dt, device).t()
        self.mm.run(a, b, None, target, force_triton=True)

