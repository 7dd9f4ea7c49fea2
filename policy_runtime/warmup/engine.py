"""Ahead-of-time warm-up: compile every kernel a target's policies can launch, running none.

``generated.warmup(hw, dtypes=..., workers=...)`` (every kernel module) and
``generated.<module>.warmup(...)`` (one) call ``warmup`` below; ``python -m policy_runtime.warmup``
is the command for deployment scripts (``--help``).  What it does:

1. Each kernel module's driver (a ``MatmulDriver``, ``TransformDriver``, ... below, over that
   module's own tables, which its ``_WARMUP`` names) lists the *representative
   calls* of the target: one call of a public entry point per bucket, instantiation or launch
   plan the target's policies can reach, for each dtype asked (``Call``).
2. Each call runs through the entry point's own path inside a compile-only scope
   (``policy_runtime.launch._compile_only``): the host side runs as in a real call (checks,
   bucket, plan, workspaces, outputs allocated) and every launch site hands its launch to the
   scope instead of the GPU, so the argument types and constants are exactly a real call's.  The
   launches are grouped by their specialization key (the kernel, each argument as Triton's binder
   specializes it, the constants and launch options): one group is one kernel to compile.
3. Each group is compiled by Triton's own warm-up, ``kernel.warmup(*args, grid=grid, **kwargs)``
   (which compiles and caches without launching), and its binary loaded (Triton's
   ``_init_handles``: a launcher where Triton builds one per signature, the resource checks).
   Groups compile in this process, the lightest first, until one had to be compiled (new
   entries in Triton's cache, or it took long): the rest are then spread over ``workers``
   processes (spawned, the heaviest first; Triton's on-disk cache is shared, so each writes
   there), and with ``load`` this process then loads them from that cache.  A cache that is
   already warm is loaded in this process alone.

Triton's normal cache (``TRITON_CACHE_DIR``, default ``~/.triton/cache``) is what is filled: a
later process on the same machine, or a container image built with that directory, starts warm.
Kernels are compiled for this machine's GPU (Triton's current device), with the launch records
of ``hw`` (a spec name or record; None detects the device, as the kernel modules do): warm up on
the part you serve on.  Under TRITON_INTERPRET=1 nothing is compiled; the calls and launches are
still planned (the tests check them on the CPU).

Argument classes covered (Triton specializes on the dtypes of tensors, on 16-byte alignment of
their addresses, on integers equal to 1 or divisible by 16, on constants): what a serving call of
the models in ``generated.dispatch.MODEL_DIMS`` (all of them, or ``models``) passes.  Tensors are
16-byte aligned (torch's allocations are; views at offsets of whole heads or rows of 16-bit
multiples of 16 elements keep it), in the dtypes asked:

- matmul: every bucket of ``matmul_16bit`` / ``matmul_fp32`` (``matmul_triton``'s path, so the
  buckets ``matmul`` leaves to the vendor library too), A row-major (M, K), B row-major (K, N) or
  the transpose of a row-major (N, K) weight (``w.t()``), the output new; in each bucket, every
  argument class of (N, K) that reaches it (``MatmulDriver.arg_class``): N and K each 1, a
  multiple of 16, of 8 or of 4 (what decides whether TMA can describe an operand, else the
  bucket's grouped fallback runs), or none of these; K a multiple of the bucket's block_k (the
  kernels' EVEN_K) or not; for a persistent TMA kernel, a launch that splits K and one that does
  not.  M is never specialized on (but an (M, 1) operand's TMA descriptor takes M as its stride:
  its class too where N or K is 1).  So odd shapes (300x12345x777, 7x5000x3000) compile nothing
  (tests/test_warmup_classes.py on the CPU, tests/test_warmup_gpu.py on a GPU).  Transposed A,
  other strided views and operands at addresses that are not 16-byte aligned compile on first use.
- scaled_mm (targets with e4m3fn tensor cores; others are named in the notes): every bucket of
  ``scaled_mm_e4m3`` with A row-major and B either the transpose of a row-major (N, K) weight or
  row-major, output in each dtype asked, and each scaling: one scale per tensor, scale_a (M, 1) and
  scale_b (1, N) contiguous, block scales (M, K/128) and (K/128, N/128) contiguous; N and K
  multiples of 128.  Other scale strides, K not a multiple of block_k and a transposed A compile on
  first use.
- transform: rms_norm (with and without residual; weight of x's dtype) over hidden_size,
  silu_and_mul, gelu_tanh_and_mul, swigluoai_and_mul and mul_and_silu over intermediate_size,
  rotary_embedding (packed heads; int64 positions, cos_sin_cache of the
  query's dtype, rot_dim = head_dim, NeoX and GPT-J) over the model's query and KV heads: one call
  per distinct launch plan over every token count from 1 to ``max_tokens`` (a plan is the kernel,
  its constants, warps and the block counts it passes).  Counts past it are sampled (powers of
  two, their neighbours and three times them, up to 2**22): a plan first seen there is reported
  in the notes, not warmed (every plan of the specs here appears below 4096 tokens).
- cache: reshape_and_cache (int64 slot_mapping; key and value [tokens, kv_heads, head_dim],
  caches [blocks, ``block_size``, kv_heads, head_dim]) per plan over token counts as above;
  copy_blocks (int64 block_mapping, caches 16-byte aligned) per plan over pair counts.
- attention: prefill (int32 cu_seqlens, causal and not) and paged decode (int32 block tables and
  lengths, cache blocks of ``block_size`` tokens) for each model whose head_dim the kernels serve,
  with the model's query and KV heads; decode so that both the decode kernel and the V2 merge
  compile.  Each in every attention feature set the model's layers use (its MODEL_DIMS entry:
  ``logit_softcap``, ``alibi`` and ``attention_sinks`` on every layer, ``sliding_window`` on its
  local layers, so a windowed model warms its windowed and its unwindowed kernels; fp32 slopes
  and sinks), as ``attention_feature_sets`` lists them.  A registered vendor decode kernel and
  the PyTorch path of long sequences compile nothing.
- moe: fused_moe (the model's ``moe_activation``, or every activation where it names none; int32
  topk_ids, fp32 topk_weights, no expert_map) for each bucket of ``moe_launch`` (at
  the first token count up to 2**16 it serves) and each model with experts (its num_experts,
  top_k, moe_intermediate_size, hidden_size; expert weights as zero-stride views of one expert,
  which Triton specializes as it does their real strides, multiples of 16), with the alignment and
  reduce kernels the bucket launches; and topk_softmax over the model's experts, renormalizing
  and not, at a decode token count (a token a program) and above (tiles of tokens: the first
  prefill's routing compiles nothing either); and grouped_topk likewise, for the model's
  ``moe_scoring`` (or softmax and sigmoid), with and without a correction bias (fp32), with its
  ``moe_num_expert_group``, ``moe_topk_group`` and ``moe_routed_scaling_factor`` (none where it
  names none).

Everything else (another dtype, activation, block size or model, a stride of another class,
fused_moe with an ``expert_map``, rotary_embedding on strided heads) compiles on first use as
before.
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import functools
import importlib
import inspect
import json
import multiprocessing
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Sequence

import torch
import triton

from ..cache import ops as _cache
from .. import launch as _launch
from ..transform import ops as _transform
from ..matmul.ops import _splits as _mm_splits
from ..moe.ops import _ACTIVATIONS as _MOE_ACTIVATIONS
from ..moe.ops import _SCORINGS, _TOPK_ONE_ROW_MAX_T
from ..moe.ops import grouped_topk as _grouped_topk
from ..moe.ops import topk_softmax as _topk_softmax

__all__ = [
    "Call",
    "Options",
    "Plan",
    "Report",
    "plan",
    "warmup",
    "main",
    "MatmulDriver",
    "ScaledMmDriver",
    "TransformDriver",
    "CacheDriver",
    "AttentionDriver",
    "MoEDriver",
]

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
_DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}
DEFAULT_DTYPES = ("bfloat16", "float16")
# vLLM's default KV-cache block size: the paged-decode kernel's BLOCK_SIZE constant.
DEFAULT_BLOCK_SIZE = 16
# Token counts searched exhaustively for launch plans and buckets (larger ones are sampled).
DEFAULT_MAX_TOKENS = 16384
# A compile that took longer than this, or wrote to the cache, was not a cache hit.
_COMPILED_S = 0.25


# ----------------------------------------------------------------------------------------------
# Options, calls


@dataclass(frozen=True)
class Options:
    """What one warm-up covers; picklable (worker processes get it)."""

    target: str
    dtypes: tuple[str, ...]
    # Model name -> its dimensions (generated.dispatch.MODEL_DIMS), for the models asked.
    models: dict[str, dict[str, int]] = field(hash=False)
    block_size: int = DEFAULT_BLOCK_SIZE
    max_tokens: int = DEFAULT_MAX_TOKENS
    # "first": each representative call's smallest shape; "other": another shape of the same
    # bucket and plan (a new M, token count or length: what bench/warmup.py calls for real after).
    pick: str = "first"


@dataclass(frozen=True)
class Call:
    """One representative call: ``op`` of a module's driver with ``args`` (plain data)."""

    module: str
    op: str
    args: tuple
    # What it stands for, most general first: ("matmul", "matmul_16bit", "decode", "bfloat16", "b row-major").
    covers: tuple[str, ...]
    # Relative compile cost of its kernels (tensor-core GEMMs 3, memory-bound kernels 1): the
    # heaviest are compiled first.
    weight: int = 1

    def describe(self) -> str:
        return f"{self.module.rsplit('.', 1)[-1]}: {' '.join(self.covers)} {self.args}"


def _dtype(name: str) -> torch.dtype:
    return DTYPES[name]


def _device() -> torch.device:
    if _launch._INTERPRET:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError(
            "there is no GPU here (torch sees no CUDA device): warm-up and its plan run the calls on one; "
            "TRITON_INTERPRET=1 plans them on the CPU"
        )
    return torch.device("cuda", torch.cuda.current_device())


def _empty(shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.empty(tuple(shape), dtype=dtype, device=device)


def _token_counts(max_tokens: int, limit: int = 2**22) -> list[int]:
    """Token counts looked at for launch plans and buckets: every one up to max_tokens, then
    powers of two, their neighbours and three times them, up to ``limit``."""
    extra = set()
    for j in range(limit.bit_length()):
        for n in (2**j - 1, 2**j, 2**j + 1, 3 * 2**j):
            if max_tokens < n <= limit:
                extra.add(n)
    return list(range(1, max_tokens + 1)) + sorted(extra)


def _plan_key(p: Any) -> tuple:
    return (p.kernel.__name__, p.consts, p.num_warps, p.info)


@functools.lru_cache(maxsize=None)
def _plan_pieces(planner: Callable[..., Any], rest: tuple, max_tokens: int) -> tuple[tuple[tuple, int, int], ...]:
    """The distinct launch plans of ``planner(n, *rest)`` over the token counts, in order of
    first appearance: (plan key, first n, another n with that plan or the first again).  Those
    that first appear past max_tokens (at the sampled counts) come last."""
    seen: dict[tuple, list[int]] = {}
    for n in _token_counts(max_tokens):
        ns = seen.setdefault(_plan_key(planner(n, *rest)), [])
        if len(ns) < 2:
            ns.append(n)
    return tuple((key, ns[0], ns[-1]) for key, ns in seen.items())


def _pieces(
    opts: Options, notes: list[str], what: str, planner: Callable[..., Any], *rest: Any
) -> list[tuple[tuple, int]]:
    """The plans to warm: one token count each (the first, or with pick "other" another).  A
    plan first seen past max_tokens is noted, not called (its tensors could be huge)."""
    out = []
    for key, first, other in _plan_pieces(planner, rest, opts.max_tokens):
        if first > opts.max_tokens:
            notes.append(f"{what}: plan {_plan_text(key)} first appears at {first} tokens, past max_tokens: not warmed")
        else:
            out.append((key, other if opts.pick == "other" and other <= opts.max_tokens else first))
    return out


def _plan_text(key: tuple) -> str:
    kernel, consts, warps, info = key
    return f"{kernel}{list(consts)} w{warps}" + (f" info={info}" if info is not None else "")


def _bucket_counts(select: Callable[[int], Any], buckets: Sequence[Any], opts: Options) -> dict[int, int]:
    """Bucket index -> a token count it serves (the first, or with pick "other" the next one)."""
    found: dict[int, list[int]] = {}
    index = {id(b): i for i, b in enumerate(buckets)}
    for t in _token_counts(opts.max_tokens, 2**16):
        ts = found.setdefault(index[id(select(t))], [])
        if len(ts) < 2:
            ts.append(t)
    return {i: ts[-1] if opts.pick == "other" else ts[0] for i, ts in found.items()}


# ----------------------------------------------------------------------------------------------
# Drivers: the representative calls of one kernel module, and how to run one


class MatmulDriver:
    """generated/matmul.py's calls: ``Matmul.run`` (matmul_triton's path) for every bucket and
    every argument class of (N, K) that reaches it."""

    # Candidate (M, N, K) of the bucket search: N and K multiples of 16 (and 1), M anything (M is
    # not specialized on); then each of the smallest shapes a bucket serves with N and K moved by
    # OFFSETS, which give every argument class of a size (``size_class``) and K both a multiple of
    # block_k and not.
    DIMS = sorted({1} | {16 * 2**j for j in range(12)} | {48 * 2**j for j in range(10)})
    MS = sorted({m for j in range(17) for m in (2**j - 1, 2**j, 2**j + 1, 3 * 2**j)} - {0})
    OFFSETS = (0, 1, 4, 8, 16)
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
        tma = ()
        if v.kind == "tma_persistent":
            tma = (_mm_splits(v, _launch._cdiv(M, v.block_m) * _launch._cdiv(N, v.block_n)) == 1,)
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
        self._shapes: dict[tuple, dict[int, tuple]] = {}

    def calls(self, opts: Options) -> tuple[list[Call], list[str]]:
        calls, notes = [], []
        for dtype in opts.dtypes:
            variant = self.mm.variant_of_dtype[_dtype(dtype)]
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
        dt = _dtype(dtype)
        a = _empty((M, K), dt, device)
        b = _empty((K, N), dt, device) if layout == "b row-major" else _empty((N, K), dt, device).t()
        self.mm.run(a, b, None, target, force_triton=True)


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
        self._shapes: dict[tuple, dict[int, tuple]] = {}

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
                for dtype in opts.dtypes:
                    for scaling in self.SCALINGS:
                        for layout in self.LAYOUTS:
                            covers = ("scaled_mm", variant, b.name, dtype, scaling, layout)
                            args = (opts.target, dtype, M, N, K, scaling, layout)
                            calls.append(Call(self.module, "scaled_mm", args, covers, 3))
        return calls, notes

    def run(self, call: Call, device: torch.device) -> None:
        target, dtype, M, N, K, scaling, layout = call.args
        fp8 = torch.float8_e4m3fn
        a = _empty((M, K), fp8, device)
        b = _empty((K, N), fp8, device) if layout == "b row-major" else _empty((N, K), fp8, device).t()
        shapes = {"tensor": ((), ()), "rowwise": ((M, 1), (1, N)), "block": ((M, K // 128), (K // 128, N // 128))}
        sa, sb = (_empty(s, torch.float32, device) for s in shapes[scaling])
        self.smm.run(a, b, sa, sb, _dtype(dtype), None, target)


class TransformDriver:
    """generated/transform.py's calls: every launch plan of rms_norm, silu_and_mul and
    rotary_embedding over token counts, per model and dtype."""

    PLANNERS = {
        "rms_norm": _transform._plan_rms_norm,
        "silu_and_mul": _transform._plan_silu_and_mul,
        "rotary_embedding": _transform._plan_rotary_embedding,
        **{op: _transform._plan_act_and_mul for op in _transform._ACTS},
    }

    def __init__(self, module: str, kernels: Any) -> None:
        self.module, self.kernels = module, kernels

    def calls(self, opts: Options) -> tuple[list[Call], list[str]]:
        calls: list[Call] = []
        notes: list[str] = []
        for model, dims in opts.models.items():
            hidden, inter = dims.get("hidden_size"), dims.get("intermediate_size")
            hd, nq, nk = dims.get("head_dim"), dims.get("num_heads"), dims.get("num_kv_heads")
            for dtype in opts.dtypes:
                esize = _dtype(dtype).itemsize
                # (op, variant, its planner's arguments after the token count, the call's after it)
                jobs: list[tuple[str, tuple, tuple, tuple]] = []
                if hidden:
                    for res in (False, True):
                        jobs.append(
                            ("rms_norm", ("residual" if res else "plain",), (hidden, esize, res), (hidden, res))
                        )
                if inter:
                    jobs.append(("silu_and_mul", (), (inter, esize), (inter,)))
                    # The other gated activations (a model names none: every one).
                    for op, act in _transform._ACTS.items():
                        jobs.append((op, (), (inter, esize, act), (inter,)))
                if hd and nq and nk:
                    for neox in (True, False):
                        variant = ("neox" if neox else "gptj",)
                        jobs.append(("rotary_embedding", variant, (nq, nk, hd, hd, neox, esize), (nq, nk, hd, neox)))
                for op, variant, rest, args in jobs:
                    # The other gated activations launch on silu_and_mul's records.
                    records = self.kernels.launch["silu_and_mul" if op in _transform._ACTS else op]
                    planner, cfg = self.PLANNERS[op], records[opts.target]
                    for key, n in _pieces(opts, notes, " ".join((op, model, dtype, *variant)), planner, *rest, cfg):
                        covers = (op, model, dtype, *variant, _plan_text(key))
                        calls.append(Call(self.module, op, (opts.target, dtype, n, *args), covers))
        return calls, notes

    def run(self, call: Call, device: torch.device) -> None:
        target, dtype, n, *rest = call.args
        dt = _dtype(dtype)
        if call.op == "rms_norm":
            hidden, res = rest
            x = _empty((n, hidden), dt, device)
            residual = _empty((n, hidden), dt, device) if res else None
            self.kernels.rms_norm(x, _empty((hidden,), dt, device), 1e-6, residual=residual, hw=target)
        elif call.op == "silu_and_mul":
            (inter,) = rest
            self.kernels.silu_and_mul(_empty((n, 2 * inter), dt, device), hw=target)
        elif call.op in _transform._ACTS:
            (inter,) = rest
            self.kernels.act_and_mul(call.op, _empty((n, 2 * inter), dt, device), hw=target)
        else:
            nq, nk, hd, neox = rest
            positions = torch.zeros(n, dtype=torch.int64, device=device)
            query, key = _empty((n, nq * hd), dt, device), _empty((n, nk * hd), dt, device)
            cos_sin = _empty((16, hd), dt, device)
            self.kernels.rotary_embedding(positions, query, key, cos_sin, hd, neox, hw=target)


class CacheDriver:
    """generated/cache.py's calls: every launch plan of reshape_and_cache over token counts and
    of copy_blocks over pair counts, per model and dtype."""

    def __init__(self, module: str, kernels: Any) -> None:
        self.module, self.kernels = module, kernels

    def calls(self, opts: Options) -> tuple[list[Call], list[str]]:
        calls: list[Call] = []
        notes: list[str] = []
        launch, bs = self.kernels.launch, opts.block_size
        for model, dims in opts.models.items():
            hd, kvh = dims.get("head_dim"), dims.get("num_kv_heads")
            if not (hd and kvh):
                continue
            for dtype in opts.dtypes:
                esize = _dtype(dtype).itemsize
                # copy_blocks: every cache 16-byte aligned (UNIT 16 bytes); its plan reads pairs
                # times caches, so one layer's two caches and every pair count cover any layers.
                planners = (
                    ("reshape_and_cache", _cache._plan_reshape_and_cache, (kvh * hd, hd, esize)),
                    ("copy_blocks", _cache._plan_copy_blocks, (2, bs * kvh * hd, max(1, 16 // esize), esize)),
                )
                for op, planner, rest in planners:
                    cfg = launch[op][opts.target]
                    for key, n in _pieces(opts, notes, f"{op} {model} {dtype}", planner, *rest, cfg):
                        covers = (op, model, dtype, _plan_text(key))
                        calls.append(Call(self.module, op, (opts.target, dtype, n, kvh, hd, bs), covers))
        return calls, notes

    def run(self, call: Call, device: torch.device) -> None:
        target, dtype, n, kvh, hd, bs = call.args
        dt = _dtype(dtype)
        if call.op == "reshape_and_cache":
            blocks = n // bs + 1
            key, value = _empty((n, kvh, hd), dt, device), _empty((n, kvh, hd), dt, device)
            kc, vc = _empty((blocks, bs, kvh, hd), dt, device), _empty((blocks, bs, kvh, hd), dt, device)
            slots = torch.arange(n, dtype=torch.int64, device=device)
            self.kernels.reshape_and_cache(key, value, kc, vc, slots, hw=target)
        else:
            kc, vc = _empty((2 * n, bs, kvh, hd), dt, device), _empty((2 * n, bs, kvh, hd), dt, device)
            src = torch.arange(n, dtype=torch.int64, device=device)
            self.kernels.copy_blocks([kc], [vc], torch.stack([src, src + n], dim=1), hw=target)


def attention_feature_sets(dims: dict) -> list[tuple[str, dict]]:
    """The attention feature sets a model's layers call with, from its MODEL_DIMS entry: (label,
    keyword arguments of prefill_attention / decode_attention, less the tensors' values).  Its
    soft-cap, ALiBi and sinks apply to every layer; a sliding window to its local layers only (Gemma 2,
    gpt-oss alternate local and global layers), so a model with a window has two sets."""
    common: dict = {}
    if dims.get("logit_softcap"):
        common["softcap"] = float(dims["logit_softcap"])
    if dims.get("alibi"):
        common["alibi"] = True
    if dims.get("attention_sinks"):
        common["sinks"] = True
    label = "+".join(sorted(common)) or "plain"
    sets = [(label, common)]
    if dims.get("sliding_window"):
        sets.append((f"window{dims['sliding_window']}" + "".join(f"+{k}" for k in sorted(common)),
                     {**common, "window": int(dims["sliding_window"])}))  # fmt: skip
    return sets


def _attention_kwargs(items: tuple, heads: int, device: torch.device) -> dict:
    # A call's feature set (its sorted items, hashable) as keyword arguments with tensors.
    feat, out = dict(items), {}
    if "window" in feat:
        out["window_size"] = (feat["window"] - 1, 0)  # a model's sliding_window W: flash-attn's (W - 1, 0)
    if "softcap" in feat:
        out["softcap"] = feat["softcap"]
    if feat.get("alibi"):
        out["alibi_slopes"] = _empty((heads,), torch.float32, device)
    if feat.get("sinks"):
        out["sinks"] = _empty((heads,), torch.float32, device)
    return out


class AttentionDriver:
    """generated/attention.py's calls: prefill (causal and not) and paged decode (the decode
    kernel and the V2 merge) per model whose head_dim the kernels serve, dtype and feature set
    the model's layers use (``attention_feature_sets``: each compiles its own specialization)."""

    def __init__(self, module: str, att: Any) -> None:
        self.module, self.att = module, att

    def calls(self, opts: Options) -> tuple[list[Call], list[str]]:
        calls, notes = [], []
        other = opts.pick == "other"
        for model, dims in opts.models.items():
            hd, nq, nk = dims.get("head_dim"), dims.get("num_heads"), dims.get("num_kv_heads")
            if not (hd and nq and nk):
                continue
            if self.att.tile_of(hd) is None:
                notes.append(f"attention {model}: head_dim {hd} is not served ({self.att.served()})")
                continue
            for dtype in opts.dtypes:
                sel = self.att.select(_dtype(dtype), hd, opts.target)
                tokens = 37 if other else 16
                for label, feat in attention_feature_sets(dims):
                    for causal in (True, False):
                        what = ("prefill", model, dtype, "causal" if causal else "full", sel.prefill.name, label)
                        args = (opts.target, dtype, tokens, nq, nk, hd, causal, tuple(sorted(feat.items())))
                        calls.append(Call(self.module, "prefill", args, what, 3))
                    # A context past v1_v2_threshold (and not past the PyTorch path's threshold, where
                    # the lengths would go to the host): the decode kernel and the merge, one launch
                    # each.  A windowed call's decode kernel is its own specialization and the merge
                    # is the same kernel as the model's other set's: a context of at most one
                    # partition (V1 at any batch) compiles it alone.
                    cfg, bs = sel.config, opts.block_size
                    limit = cfg.v1_v2_threshold + 1
                    if limit > cfg.pytorch_decode_threshold:
                        limit = cfg.v1_v2_threshold  # no V2 on this target: the decode kernel alone
                    if "window" in feat:
                        limit = min(feat["window"], cfg.partition_size)
                    blocks = -(-limit // bs)
                    seqs = 3 if other else 1
                    what = ("decode", model, dtype, f"{blocks * bs} tokens", sel.decode.name, label)
                    args = (opts.target, dtype, seqs, nq, nk, hd, bs, blocks, tuple(sorted(feat.items())))
                    calls.append(Call(self.module, "decode", args, what, 3))
        return calls, notes

    def run(self, call: Call, device: torch.device) -> None:
        if call.op == "prefill":
            target, dtype, t, nq, nk, hd, causal, feat = call.args
            dt = _dtype(dtype)
            q, k, v = _empty((t, nq, hd), dt, device), _empty((t, nk, hd), dt, device), _empty((t, nk, hd), dt, device)
            cu = torch.tensor([0, t], dtype=torch.int32, device=device)
            self.att.prefill(q, k, v, cu, cu, t, t, causal=causal, hw=target, **_attention_kwargs(feat, nq, device))
        else:
            target, dtype, seqs, nq, nk, hd, bs, blocks, feat = call.args
            dt = _dtype(dtype)
            query = _empty((seqs, nq, hd), dt, device)
            kc, vc = _empty((1, bs, nk, hd), dt, device), _empty((1, bs, nk, hd), dt, device)
            table = torch.zeros((seqs, blocks), dtype=torch.int32, device=device)
            lens = torch.full((seqs,), blocks * bs, dtype=torch.int32, device=device)
            self.att.decode(query, kc, vc, table, lens, hw=target, **_attention_kwargs(feat, nq, device))


class MoEDriver:
    """generated/moe.py's calls: fused_moe for every bucket and topk_softmax, per model with
    experts and dtype."""

    def __init__(self, module: str, moe: Any) -> None:
        self.module, self.moe = module, moe

    def calls(self, opts: Options) -> tuple[list[Call], list[str]]:
        calls, notes = [], []
        for model, dims in opts.models.items():
            E, k, inter, hidden = (
                dims.get(d) for d in ("num_experts", "top_k", "moe_intermediate_size", "hidden_size")
            )
            if not (E and k and inter and hidden):
                continue
            for dtype in opts.dtypes:
                buckets, select = self.moe.policies[self.moe.variant_of_dtype[_dtype(dtype)]][opts.target]
                # The buckets this model's expert shape reaches (a bucket for another shape is
                # another model's to compile).
                counts = _bucket_counts(lambda t, inter=inter: select(t, inter), buckets, opts)
                # The model's activation, or (a model that names none) every one fused_moe has.
                acts = [dims["moe_activation"]] if dims.get("moe_activation") else list(_MOE_ACTIVATIONS)
                for i, b in enumerate(buckets):
                    if i not in counts:
                        notes.append(
                            f"moe {opts.target} {b.name} ({dtype}): no token count up to 2**16 reaches it"
                            f" at {model}'s expert intermediate size {inter}"
                        )
                        continue
                    for act in acts:
                        what = ("fused_moe", model, dtype, b.name, b.variant.name, act)
                        args = (opts.target, dtype, counts[i], E, k, inter, hidden, act)
                        calls.append(Call(self.module, "fused_moe", args, what, 3))
                # A token a program up to _TOPK_ONE_ROW_MAX_T tokens, tiles of tokens above.
                for path, T in (("one row", 1), ("tiles", _TOPK_ONE_ROW_MAX_T + 1)):
                    for renormalize in (True, False):
                        what = ("topk_softmax", model, dtype, "renormalize" if renormalize else "plain", path)
                        args = (opts.target, dtype, T + 2 if opts.pick == "other" else T, E, k, renormalize)
                        calls.append(Call(self.module, "topk_softmax", args, what))
                        calls += self._routers(opts, model, dims, dtype, path, T, renormalize)
        return calls, notes

    def _routers(
        self, opts: Options, model: str, dims: dict, dtype: str, path: str, T: int, renormalize: bool
    ) -> list[Call]:
        """grouped_topk's specializations for a model: its scoring (or both), with and without a
        correction bias, its expert groups and scaling factor (none where it names none); the
        plain softmax one is topk_softmax's kernel, above."""
        E, k = dims["num_experts"], dims["top_k"]
        groups, topk_group = dims.get("moe_num_expert_group") or 1, dims.get("moe_topk_group") or 1
        scale = dims.get("moe_routed_scaling_factor") or 1.0
        scorings = [dims["moe_scoring"]] if dims.get("moe_scoring") else list(_SCORINGS)
        calls = []
        for scoring in scorings:
            for bias in (False, True):
                if scoring == "softmax" and not bias and groups == 1 and scale == 1.0:
                    continue
                what = ("grouped_topk", model, dtype, scoring, "bias" if bias else "no bias",
                        "renormalize" if renormalize else "plain", path)  # fmt: skip
                n = T + 2 if opts.pick == "other" else T
                args = (opts.target, dtype, n, E, k, renormalize, scoring, bias, groups, topk_group, scale)
                calls.append(Call(self.module, "grouped_topk", args, what))
        return calls

    @staticmethod
    def _weight(shape: tuple[int, int, int], dt: torch.dtype, device: torch.device) -> torch.Tensor:
        # Zero-stride views over one expert: Triton specializes the zero expert stride as it does
        # the real one where that is a multiple of 16 (it then marks both divisible by 16).
        E, rows, cols = shape
        if (rows * cols) % 16 == 0:
            return _empty((1, rows, cols), dt, device).expand(E, rows, cols)
        return _empty(shape, dt, device)

    def run(self, call: Call, device: torch.device) -> None:
        if call.op == "topk_softmax":
            _, dtype, T, E, k, renormalize = call.args
            _topk_softmax(_empty((T, E), _dtype(dtype), device), k, renormalize)
            return
        if call.op == "grouped_topk":
            _, dtype, T, E, k, renormalize, scoring, bias, groups, topk_group, scale = call.args
            _grouped_topk(
                _empty((T, E), _dtype(dtype), device), k, renormalize, scoring_func=scoring,
                e_score_correction_bias=_empty((E,), torch.float32, device) if bias else None,
                num_expert_group=groups, topk_group=topk_group, routed_scaling_factor=scale,
            )  # fmt: skip
            return
        target, dtype, T, E, k, inter, hidden, act = call.args
        dt = _dtype(dtype)
        x = _empty((T, hidden), dt, device)
        w1, w2 = self._weight((E, 2 * inter, hidden), dt, device), self._weight((E, hidden, inter), dt, device)
        weights = _empty((T, k), torch.float32, device)
        ids = torch.zeros((T, k), dtype=torch.int32, device=device)
        self.moe.fused_moe(x, w1, w2, weights, ids, act, None, target)


# ----------------------------------------------------------------------------------------------
# Launch keys: what Triton compiles a launch by


def _params(kernel: Any) -> Optional[list[tuple[str, bool, bool, bool]]]:
    """(name, constexpr, do_not_specialize, do_not_specialize_on_alignment) per parameter of a
    jitted (or interpreted) kernel; None for anything else (a test's stand-in)."""
    cached = getattr(kernel, "_policy_runtime_params", None)
    if cached is not None:
        return cached
    fn = getattr(kernel, "fn", None)
    if fn is None:
        return None
    kw = getattr(kernel, "kwargs", None) or {}
    dns = set(getattr(kernel, "do_not_specialize", None) or kw.get("do_not_specialize") or ())
    dnsa = set(
        getattr(kernel, "do_not_specialize_on_alignment", None) or kw.get("do_not_specialize_on_alignment") or ()
    )
    params = [
        (p.name, "constexpr" in str(p.annotation), p.name in dns or i in dns, p.name in dnsa or i in dnsa)
        for i, p in enumerate(inspect.signature(fn).parameters.values())
    ]
    try:
        kernel._policy_runtime_params = params
    except AttributeError:
        pass
    return params


try:  # Triton >= 3.5: the binder's own specialization of one argument
    from triton.backends.compiler import BaseBackend as _BaseBackend
    from triton.runtime.jit import native_specialize_impl as _native_specialize
except ImportError:  # pragma: no cover - older Triton
    _native_specialize = None


def _arg_class(value: Any, param: Optional[tuple[str, bool, bool, bool]]) -> Any:
    """How Triton's binder specializes one argument: its type and divisibility (or the value
    of a constant)."""
    if param is not None and param[1]:
        return ("constexpr", repr(value))
    specialize = param is None or not param[2]
    align = param is None or not param[3]
    if _native_specialize is not None:
        try:
            return _native_specialize(_BaseBackend, value, False, specialize, align)
        except Exception:
            pass
    if isinstance(value, torch.Tensor):
        return (str(value.dtype), align and value.data_ptr() % 16 == 0)
    if isinstance(value, bool) or value is None or isinstance(value, float):
        return (type(value).__name__,)
    if isinstance(value, int):
        if specialize and value == 1:
            return ("constexpr", 1)
        return ("i32" if -(2**31) <= value < 2**31 else "i64", specialize and value % 16 == 0)
    return (type(value).__name__, repr(value))


def _kernel_name(kernel: Any) -> str:
    return getattr(kernel, "__name__", None) or type(kernel).__name__


def launch_key(kernel: Any, args: tuple, kwargs: dict) -> tuple:
    """The launch's specialization key: kernel, argument classes, constants and options (what
    Triton compiles one binary for; a coarser grouping than this never loses a launch, see
    ``_units``)."""
    params = _params(kernel)
    by_name = {p[0]: p for p in params or ()}
    classes = tuple(_arg_class(a, params[i] if params and i < len(params) else None) for i, a in enumerate(args))
    options = tuple(
        sorted((k, _arg_class(v, by_name[k]) if k in by_name else ("option", repr(v))) for k, v in kwargs.items())
    )
    fn = getattr(kernel, "fn", None)
    where = f"{fn.__module__}.{fn.__qualname__}" if fn is not None else _kernel_name(kernel)
    return (where, classes, options)


# ----------------------------------------------------------------------------------------------
# Compile-only runs


@dataclass
class _Compiled:
    kernel: str
    hash: Optional[str]
    seconds: float
    error: Optional[str]


def _compile(kernel: Any, grid: tuple, args: tuple, kwargs: dict) -> _Compiled:
    """Triton's warm-up of one launch (compile, or load from the cache; nothing runs), then its
    binary loaded as a first launch would (Triton builds the launcher there, where it builds one
    per signature, and checks the kernel's resources on this device)."""
    t0 = time.perf_counter()
    try:
        compiled = kernel.warmup(*args, grid=grid, **kwargs)
        init = getattr(compiled, "_init_handles", None)
        if init is not None:
            init()
        return _Compiled(_kernel_name(kernel), getattr(compiled, "hash", None), time.perf_counter() - t0, None)
    except Exception as exc:  # reported with the kernel; the other kernels go on
        message = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:500]
        return _Compiled(_kernel_name(kernel), None, time.perf_counter() - t0, message)


class _Handler:
    """The compile-only scope's handler for one call: records every launch (kernel, key) and
    compiles those whose number is in ``compile``."""

    def __init__(self, compile: frozenset[int] = frozenset()) -> None:
        self.compile = compile
        self.launches: list[tuple[str, tuple]] = []
        self.compiled: dict[int, _Compiled] = {}

    def __call__(self, kernel: Any, grid: tuple, args: tuple, kwargs: dict) -> None:
        number = len(self.launches)
        self.launches.append((_kernel_name(kernel), launch_key(kernel, args, kwargs)))
        if number in self.compile:
            self.compiled[number] = _compile(kernel, grid, args, kwargs)


# Drivers built so far, by module name (a driver memoises what it searched, e.g. matmul's shapes).
_DRIVERS: dict[str, Any] = {}


def _driver(module: str) -> Any:
    """The module's warm-up driver, or None: its ``_WARMUP`` names a driver class below and the
    module attribute holding the tables it reads (generated modules do not import this module)."""
    if module not in _DRIVERS:
        mod = importlib.import_module(module)
        spec = getattr(mod, "_WARMUP", None)
        _DRIVERS[module] = None if spec is None else globals()[spec[0]](module, getattr(mod, spec[1]))
    return _DRIVERS[module]


def _run_call(call: Call, device: torch.device, compile: frozenset[int] = frozenset()) -> _Handler:
    handler = _Handler(compile)
    with _launch._compile_only(handler):
        _driver(call.module).run(call, device)
    return handler


# ----------------------------------------------------------------------------------------------
# Plans: calls, their launches, and the kernels (groups of launches) to compile


@dataclass(frozen=True)
class Unit:
    """One kernel to compile: the launches (call index, launch number) that share a key."""

    kernel: str
    module: str
    key: tuple
    launches: tuple[tuple[int, int], ...]
    weight: int


@dataclass
class Plan:
    """What a warm-up compiles: the calls, each call's launches (kernel name, key), the kernels."""

    options: Options
    modules: tuple[str, ...]
    calls: list[Call]
    launches: list[list[tuple[str, tuple]]]
    units: list[Unit]
    notes: list[str]
    # Call index -> why it failed (a representative call that raised).
    failed: dict[int, str]

    def keys(self) -> set[tuple]:
        return {key for launches in self.launches for _, key in launches}


def _units(calls: list[Call], launches: list[list[tuple[str, tuple]]]) -> list[Unit]:
    """Launches grouped by key, the heaviest calls' kernels first (then in call order).  A group
    is compiled by one process, launch by launch, so launches that Triton would tell apart but
    the key does not are all still compiled."""
    groups: dict[tuple, list[tuple[int, int]]] = {}
    first: dict[tuple, tuple[str, str, int]] = {}
    for i, per_call in enumerate(launches):
        for j, (name, key) in enumerate(per_call):
            groups.setdefault(key, []).append((i, j))
            first.setdefault(key, (name, calls[i].module, calls[i].weight))
    units = [Unit(first[k][0], first[k][1], k, tuple(v), max(calls[i].weight for i, _ in v)) for k, v in groups.items()]
    return sorted(units, key=lambda u: -u.weight)


def _options(
    dispatch: Any,
    hw: Any,
    dtypes: Optional[Iterable[Any]],
    models: Optional[Iterable[str]],
    block_size: int,
    max_tokens: int,
    pick: str,
) -> Options:
    if isinstance(hw, str) and hw not in dispatch.HARDWARE:
        raise ValueError(f"unknown hw {hw!r}; known: {', '.join(sorted(dispatch.HARDWARE))}")
    target = dispatch.target_name(hw, None)
    names = []
    for d in DEFAULT_DTYPES if dtypes is None else dtypes:
        name = next((n for n, t in DTYPES.items() if t == d), None) if isinstance(d, torch.dtype) else None
        if name is None and isinstance(d, str):
            name = _DTYPE_ALIASES.get(d.lower(), d.lower())
        if name not in DTYPES:
            raise ValueError(f"unknown dtype {d!r}; expected {', '.join(DTYPES)} (or {', '.join(_DTYPE_ALIASES)})")
        if name not in names:
            names.append(name)
    if not names:
        raise ValueError("no dtypes given")
    dims = getattr(dispatch, "MODEL_DIMS", {})
    chosen = list(dims) if models is None else list(models)
    unknown = [m for m in chosen if m not in dims]
    if unknown:
        raise ValueError(f"unknown model {unknown[0]!r}; known: {', '.join(dims) or 'none'}")
    if block_size < 1 or max_tokens < 1:
        raise ValueError(f"block_size and max_tokens must be positive, got {block_size} and {max_tokens}")
    if pick not in ("first", "other"):
        raise ValueError(f"pick must be 'first' or 'other', got {pick!r}")
    return Options(target, tuple(names), {m: dict(dims[m]) for m in chosen}, block_size, max_tokens, pick)


def _package(modules: Sequence[str]) -> str:
    packages = {m.rpartition(".")[0] for m in modules}
    if len(packages) != 1 or not next(iter(packages)):
        raise ValueError(f"modules must be kernel modules of one generated package, got {list(modules)}")
    return packages.pop()


def plan(
    modules: Sequence[str],
    hw: Any = None,
    *,
    dtypes: Optional[Iterable[Any]] = None,
    models: Optional[Iterable[str]] = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    pick: str = "first",
) -> Plan:
    """The representative calls of ``modules`` (e.g. ``["generated.matmul"]``) for a target, run
    in a compile-only scope that compiles nothing: their launches and the kernels they need."""
    modules = tuple(modules)
    dispatch = importlib.import_module(_package(modules) + ".dispatch")
    opts = _options(dispatch, hw, dtypes, models, block_size, max_tokens, pick)
    calls, notes = [], []
    for module in modules:
        driver = _driver(module)
        if driver is None:
            notes.append(f"{module} has no warm-up driver (_WARMUP): its template defines none")
            continue
        more, why = driver.calls(opts)
        calls += more
        notes += why
    seen, unique = set(), []
    for call in calls:  # equal calls (models with equal dimensions): one of them
        if (call.module, call.op, call.args) not in seen:
            seen.add((call.module, call.op, call.args))
            unique.append(call)
    device = _device()
    launches, failed = [], {}
    for i, call in enumerate(unique):
        try:
            launches.append(_run_call(call, device).launches)
        except Exception as exc:
            launches.append([])
            failed[i] = f"{type(exc).__name__}: {exc}"
    return Plan(opts, modules, unique, launches, _units(unique, launches), notes, failed)


# ----------------------------------------------------------------------------------------------
# Compiling a plan


def _cache_dir() -> str:
    knobs = getattr(triton, "knobs", None)
    d = getattr(getattr(knobs, "cache", None), "dir", None)
    return d or os.environ.get("TRITON_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".triton", "cache")


def _cache_entries(cache_dir: str) -> set[str]:
    try:
        return set(os.listdir(cache_dir))
    except OSError:
        return set()


def _entry(kernel_hash: str) -> str:
    # Triton's file cache keeps a kernel in a folder named after its hash in base 32.
    return base64.b32encode(bytes.fromhex(kernel_hash)).decode().rstrip("=")


def _compile_unit(unit: Unit, calls: Any, device: torch.device) -> list[_Compiled]:
    """Compile one unit in this process: run each of its calls, compiling its launches there."""
    by_call: dict[int, set[int]] = {}
    for i, j in unit.launches:
        by_call.setdefault(i, set()).add(j)
    out = []
    for i, numbers in by_call.items():
        try:
            handler = _run_call(calls[i], device, frozenset(numbers))
        except Exception as exc:
            out.append(_Compiled(unit.kernel, None, 0.0, f"{calls[i].describe()}: {type(exc).__name__}: {exc}"))
            continue
        for j in sorted(numbers):
            got = handler.compiled.get(j)
            if got is None or handler.launches[j][0] != unit.kernel:  # the call launched otherwise this time
                got = _Compiled(unit.kernel, None, 0.0, f"{calls[i].describe()}: launch {j} is not {unit.kernel}")
            out.append(got)
    return out


def _worker_init(cache_dir: str, device_index: Optional[int]) -> None:
    os.environ["TRITON_CACHE_DIR"] = cache_dir
    knobs = getattr(triton, "knobs", None)
    if knobs is not None and hasattr(knobs, "cache"):
        try:
            knobs.cache.dir = cache_dir
        except Exception:
            pass
    if device_index is not None:
        torch.cuda.set_device(device_index)


def _worker_compile(unit: Unit, calls: dict[int, Call]) -> list[_Compiled]:
    """In a worker process: one unit, given the calls it needs (by their index in the plan)."""
    return _compile_unit(unit, calls, _device())


def _default_workers() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _compile_in_workers(
    units: Sequence[Unit],
    calls: Sequence[Call],
    workers: int,
    cache_dir: str,
    done: Callable[[int, list[_Compiled]], None],
) -> None:
    """Compile ``units`` in ``workers`` spawned processes (a unit a task, taken in order as
    processes free up); ``done(index, results)`` as each finishes."""
    device_index = None if _launch._INTERPRET else torch.cuda.current_device()
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(
        max_workers=workers, mp_context=context, initializer=_worker_init, initargs=(cache_dir, device_index)
    ) as pool:
        futures = {}
        for index, unit in enumerate(units):
            needed = {i: calls[i] for i, _ in unit.launches}
            futures[pool.submit(_worker_compile, unit, needed)] = index
        for future in concurrent.futures.as_completed(futures):
            index = futures[future]
            try:
                results = future.result()
            except Exception as exc:  # a worker that died: the kernel is reported failed
                results = [_Compiled(units[index].kernel, None, 0.0, f"worker process: {type(exc).__name__}: {exc}")]
            done(index, results)


# ----------------------------------------------------------------------------------------------
# The report


@dataclass
class Kernel:
    """One compiled kernel (a unit): what it is, its Triton hashes, time, error."""

    name: str
    module: str
    calls: list[str]
    hashes: list[str]
    seconds: float
    error: Optional[str]
    where: str  # "this process" or "worker"
    compiled_now: Optional[bool] = None


@dataclass
class Report:
    """What a warm-up did.  ``str(report)`` is its summary; ``to_json()`` its data."""

    target: str
    dtypes: tuple[str, ...]
    models: tuple[str, ...]
    modules: tuple[str, ...]
    interpreter: bool
    calls: int
    launches: int
    kernels: list[Kernel]
    notes: list[str]
    failed_calls: list[str]
    wall_s: float
    workers: int
    cache_dir: str
    new_cache_entries: int

    @property
    def failed(self) -> list[Kernel]:
        return [k for k in self.kernels if k.error is not None]

    @property
    def ok(self) -> bool:
        return not self.failed and not self.failed_calls

    @property
    def compiled_now(self) -> int:
        return sum(1 for k in self.kernels if k.compiled_now)

    @property
    def compile_s(self) -> float:
        return sum(k.seconds for k in self.kernels)

    def by_module(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for k in self.kernels:
            out[k.module.rsplit(".", 1)[-1]] = out.get(k.module.rsplit(".", 1)[-1], 0) + 1
        return dict(sorted(out.items()))

    def __str__(self) -> str:
        n = len(self.kernels)
        lines = [
            f"warm-up of {self.target} ({', '.join(self.dtypes)}; models {', '.join(self.models) or 'none'}): "
            f"{_count(len(self.modules), 'module')}, {_count(self.calls, 'call')}, {_count(self.launches, 'launch')}"
        ]
        if self.interpreter:
            lines.append(f"  kernels: {n} planned; Triton's interpreter (TRITON_INTERPRET=1) compiles nothing")
        else:
            known = [k for k in self.kernels if k.compiled_now is not None and k.error is None]
            split = ""
            if known:
                now = sum(1 for k in known if k.compiled_now)
                split = f" ({now} compiled now, {len(known) - now} from the cache)"
            lines.append(f"  kernels: {n - len(self.failed)} ready{split}, {len(self.failed)} failed")
        where = f"{self.workers} worker processes and this one" if self.workers else "this process"
        lines.append(f"  wall time: {self.wall_s:.1f} s in {where} (compile time summed: {self.compile_s:.1f} s)")
        lines.append(f"  cache: {self.cache_dir} ({self.new_cache_entries} new entries)")
        lines.append("  per module: " + ", ".join(f"{m} {c}" for m, c in self.by_module().items()))
        for k in self.failed:
            lines.append(f"  FAILED {k.name} ({k.calls[0] if k.calls else k.module}): {k.error}")
        for c in self.failed_calls:
            lines.append(f"  FAILED call {c}")
        for note in self.notes:
            lines.append(f"  note: {note}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "dtypes": list(self.dtypes),
            "models": list(self.models),
            "modules": list(self.modules),
            "interpreter": self.interpreter,
            "calls": self.calls,
            "launches": self.launches,
            "kernels": len(self.kernels),
            "compiled_now": self.compiled_now,
            "failed": len(self.failed),
            "wall_s": self.wall_s,
            "compile_s": self.compile_s,
            "workers": self.workers,
            "cache_dir": self.cache_dir,
            "new_cache_entries": self.new_cache_entries,
            "by_module": self.by_module(),
            "notes": self.notes,
            "failed_calls": self.failed_calls,
            "kernel_list": [
                {
                    "name": k.name,
                    "module": k.module,
                    "calls": k.calls,
                    "hashes": k.hashes,
                    "seconds": k.seconds,
                    "error": k.error,
                    "where": k.where,
                    "compiled_now": k.compiled_now,
                }
                for k in self.kernels
            ],
        }


def _count(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "es" if word.endswith("h") else "s")


class _Progress:
    """A one-line progress bar on stderr (redrawn in a terminal, a line per tenth otherwise)."""

    def __init__(self, total: int, enabled: bool, stream: Any = None) -> None:
        self.total, self.enabled = total, enabled and total > 0
        self.stream = stream or sys.stderr
        self.done, self.t0, self.step = 0, time.perf_counter(), -1
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def advance(self, what: str) -> None:
        self.done += 1
        if not self.enabled:
            return
        frac = self.done / self.total
        bar = "#" * int(frac * 30)
        line = f"warm-up [{bar:<30}] {self.done}/{self.total} kernels {time.perf_counter() - self.t0:5.1f} s {what}"
        if self.tty:
            self.stream.write("\r" + line[:119].ljust(119))
            if self.done == self.total:
                self.stream.write("\n")
        elif int(frac * 10) > self.step:
            self.step = int(frac * 10)
            self.stream.write(line + "\n")
        self.stream.flush()


def warmup(
    modules: Sequence[str],
    hw: Any = None,
    *,
    dtypes: Optional[Iterable[Any]] = None,
    workers: Optional[int] = None,
    models: Optional[Iterable[str]] = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    load: bool = True,
    progress: bool = False,
) -> Report:
    """Compile every kernel of ``modules`` (``["generated.matmul", ...]``) that the target's
    policies can launch, running none; returns a ``Report``.

    ``hw``: a spec name, a HARDWARE record, or None to detect the device.  ``dtypes``: names
    (``"bfloat16"``, ``"float16"``, ``"float32"``; ``bf16``, ``fp16``, ``fp32``) or torch dtypes;
    default bfloat16 and float16.  ``workers``: processes to compile in when the cache is cold
    (default: the CPUs this process may use; 0 or 1: this process only).  ``models``: names in
    ``generated.dispatch.MODEL_DIMS`` (default all).  ``block_size``: the KV-cache block size
    (default 16).  ``max_tokens``: token counts searched exhaustively (default 16384).  ``load``:
    leave every kernel loaded in this process too (so its first calls load nothing), not only in
    Triton's cache.  ``progress``: a progress bar on stderr.  Bad arguments raise ValueError.
    Spawned workers import this process's main module, as any ``multiprocessing`` spawn does: call
    this under ``if __name__ == "__main__":`` in a script.
    """
    t0 = time.perf_counter()
    if not _launch._INTERPRET and not torch.cuda.is_available():
        raise RuntimeError(
            "warm-up compiles for this machine's GPU and there is none; under TRITON_INTERPRET=1 it plans the calls only"
        )
    p = plan(modules, hw, dtypes=dtypes, models=models, block_size=block_size, max_tokens=max_tokens)
    workers = _default_workers() if workers is None else max(0, int(workers))
    cache_dir = _cache_dir()
    before = _cache_entries(cache_dir)
    device = _device()
    results: dict[int, tuple[list[_Compiled], str]] = {}
    bar = _Progress(len(p.units), progress)

    def finish(index: int, compiled: list[_Compiled], where: str) -> None:
        results[index] = (compiled, where)
        bar.advance(p.units[index].kernel)

    # This process first, lightest kernels first; once one had to be compiled (a cold cache), the
    # rest go to worker processes, heaviest first.
    pending = list(range(len(p.units)))
    used = 0
    while pending:
        index = pending.pop()
        entries = _cache_entries(cache_dir)
        compiled = _compile_unit(p.units[index], p.calls, device)
        finish(index, compiled, "this process")
        cold = _cache_entries(cache_dir) != entries or sum(c.seconds for c in compiled) > _COMPILED_S
        if cold and workers > 1 and len(pending) > 1 and not _launch._INTERPRET:
            used = min(workers, len(pending))
            break
    if used:
        rest = [p.units[i] for i in pending]
        try:
            _compile_in_workers(rest, p.calls, used, cache_dir, lambda k, c: finish(pending[k], c, "worker"))
        except Exception as exc:  # no worker processes here (e.g. a main module that spawns): this process
            p.notes.append(f"worker processes failed ({type(exc).__name__}: {exc}); compiled in this process")
            for index in pending:
                if index not in results:
                    finish(index, _compile_unit(p.units[index], p.calls, device), "this process")
        if load:
            for index in pending:
                _compile_unit(p.units[index], p.calls, device)
    after = _cache_entries(cache_dir)
    new = after - before
    kernels = []
    for index, unit in enumerate(p.units):
        compiled, where = results[index]
        hashes = sorted({c.hash for c in compiled if c.hash})
        error = next((c.error for c in compiled if c.error), None)
        now = None
        if hashes and all(_entry(h) in after for h in hashes):
            now = any(_entry(h) in new for h in hashes)
        calls = sorted({p.calls[i].describe() for i, _ in unit.launches})
        kernels.append(
            Kernel(unit.kernel, unit.module, calls, hashes, sum(c.seconds for c in compiled), error, where, now)
        )
    return Report(
        target=p.options.target,
        dtypes=p.options.dtypes,
        models=tuple(p.options.models),
        modules=p.modules,
        interpreter=_launch._INTERPRET,
        calls=len(p.calls),
        launches=sum(len(x) for x in p.launches),
        kernels=kernels,
        notes=p.notes,
        failed_calls=[f"{p.calls[i].describe()}: {why}" for i, why in sorted(p.failed.items())],
        wall_s=time.perf_counter() - t0,
        workers=used,
        cache_dir=cache_dir,
        new_cache_entries=len(new),
    )


# ----------------------------------------------------------------------------------------------
# The command line: python -m policy_runtime.warmup


def _split_list(values: Optional[list[str]]) -> Optional[list[str]]:
    if values is None:
        return None
    return [v for value in values for v in value.split(",") if v]


def main(argv: Optional[Sequence[str]] = None, out: Any = None, err: Any = None) -> int:
    """``python -m policy_runtime.warmup``: exit 0 when every kernel compiled, 1 when one failed,
    2 on bad arguments (an unknown --hw, dtype, module or model)."""
    out, err = out or sys.stdout, err or sys.stderr
    parser = argparse.ArgumentParser(
        prog="python -m policy_runtime.warmup",
        description="Compile every Triton kernel a target's policies can launch, for the dtypes asked, "
        "without running any, into Triton's cache (TRITON_CACHE_DIR, default ~/.triton/cache).",
    )
    parser.add_argument("--hw", default=None, help="hardware spec name (default: detect the device)")
    parser.add_argument(
        "--dtypes", nargs="+", default=None, help="bfloat16 float16 float32 (default: bfloat16 float16)"
    )
    parser.add_argument("--modules", nargs="+", default=None, help="kernel modules (default: all)")
    parser.add_argument(
        "--models", nargs="+", default=None, help="models of generated.dispatch.MODEL_DIMS (default: all)"
    )
    parser.add_argument("--workers", type=int, default=None, help="compile processes (default: the CPUs usable)")
    parser.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE, help="KV-cache block size (default 16)")
    parser.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS, help="token counts searched exhaustively")
    parser.add_argument("--package", default="generated", help="the generated package (default: generated)")
    parser.add_argument("--plan", action="store_true", help="list the calls and kernels; compile nothing")
    parser.add_argument("--json", default=None, help="also write the report as JSON to this file")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)

    def usage(message: str) -> int:
        print(f"{parser.prog}: error: {message}", file=err)
        return 2

    try:
        package = importlib.import_module(args.package)
        dispatch = importlib.import_module(args.package + ".dispatch")
    except ImportError as exc:
        return usage(f"cannot import the generated package {args.package!r}: {exc}")
    available = list(getattr(package, "KERNEL_MODULES", ()))
    names = _split_list(args.modules) or available
    unknown = [m for m in names if m not in available]
    if unknown or not names:
        return usage(f"unknown module {unknown[0] if unknown else ''!r}; known: {', '.join(available) or 'none'}")
    if args.hw is not None and args.hw not in dispatch.HARDWARE:
        return usage(f"unknown --hw {args.hw!r}; known: {', '.join(sorted(dispatch.HARDWARE))}")
    modules = [f"{args.package}.{m}" for m in names]
    options = dict(dtypes=_split_list(args.dtypes), models=_split_list(args.models))
    options.update(block_size=args.block_size, max_tokens=args.max_tokens)
    try:
        if args.plan:
            p = plan(modules, args.hw, **options)
            for i, call in enumerate(p.calls):
                print(f"{call.describe()}: {', '.join(name for name, _ in p.launches[i]) or 'no launch'}", file=out)
            print(
                f"{p.options.target}: {len(p.calls)} calls, {sum(map(len, p.launches))} launches, "
                f"{len(p.units)} kernels",
                file=out,
            )
            for note in p.notes:
                print(f"note: {note}", file=out)
            return 1 if p.failed else 0
        report = warmup(modules, args.hw, workers=args.workers, load=False, progress=not args.no_progress, **options)
    except ValueError as exc:
        return usage(str(exc))
    except RuntimeError as exc:
        print(f"{parser.prog}: {exc}", file=err)
        return 2
    print(report, file=out)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report.to_json(), f, indent=1)
    return 0 if report.ok else 1


if __name__ == "__main__":
    # The imported module, not this __main__ copy: worker processes unpickle its classes by name.
    from policy_runtime.report import quiet_on_closed_pipe
    from policy_runtime.warmup.engine import main as _main

    sys.exit(quiet_on_closed_pipe(_main))
