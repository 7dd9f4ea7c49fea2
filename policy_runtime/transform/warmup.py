"""generated/transform.py's warm-up driver (hand-written; policy_runtime/warmup/ runs it).

Calls covered, in the dtypes asked: rms_norm (with and without residual; weight of x's dtype)
over hidden_size, silu_and_mul, gelu_tanh_and_mul, swigluoai_and_mul and mul_and_silu over
intermediate_size, rotary_embedding (int64 positions, cos_sin_cache of the query's dtype, rot_dim
= head_dim, NeoX and GPT-J) over the model's query and KV heads: one call per distinct launch
plan over every token count from 1 to ``max_tokens`` (kernel, constants, warps and the block
counts it passes; counts past it are sampled up to 2**22, a plan first seen there is noted, not
warmed).  Argument classes: token counts and head counts are ``do_not_specialize``; row lengths
and contiguous rows' strides are the model's.  rotary_embedding's query and key may also be
views (``ROPE_LAYOUTS``): of a fused qkv projection (rows (num_heads + 2 * num_kv_heads) *
head_dim apart), or strided heads (each head_dim wide in a 3 * head_dim slab, as GPT-NeoX's
fused projection; the kernel's STRIDED specialization): one call per plan and class of the row
and head strides (``int_class``).  Rows of rms_norm or the activations that are views of a wider
tensor compile on first use where their stride's class differs from the row length's.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..warmup.calls import Call, Options, empty, first_of_each_class, int_class, launch_plans, plan_text, torch_dtype
from . import ops as _transform

__all__ = ["TransformDriver", "ROPE_LAYOUTS", "rope_strides"]

# How rotary_embedding's query and key lie in memory: packed [T, heads * head_dim], views of a
# fused qkv projection, or [T, heads, head_dim] views whose heads are 3 * head_dim apart.
ROPE_LAYOUTS = ("packed", "qkv view", "strided heads")


def rope_strides(layout: str, nq: int, nk: int, hd: int) -> tuple[int, int, int, int]:
    """(query's row stride, key's, query's head stride, key's) as rotary_embedding passes them
    for a layout of ``ROPE_LAYOUTS`` (a view of one head has the head size as its head stride)."""
    if layout == "packed":
        return nq * hd, nk * hd, hd, hd
    if layout == "qkv view":
        return (nq + 2 * nk) * hd, (nq + 2 * nk) * hd, hd, hd
    return 3 * nq * hd, 3 * nk * hd, 3 * hd if nq > 1 else hd, 3 * hd if nk > 1 else hd


class TransformDriver:
    """generated/transform.py's calls: every launch plan of rms_norm, silu_and_mul, the other
    gated activations and rotary_embedding over token counts, per model, dtype and (rotary)
    class of layout (``rope_classes``)."""

    PLANNERS: dict[str, Callable[..., Any]] = {
        "rms_norm": _transform.plan_rms_norm,
        "silu_and_mul": _transform.plan_silu_and_mul,
        "rotary_embedding": _transform.plan_rotary_embedding,
        **{op: _transform.plan_act_and_mul for op in _transform.ACTS},
    }

    def __init__(self, module: str, kernels: Any) -> None:
        self.module, self.kernels = module, kernels

    @staticmethod
    def rope_classes(nq: int, nk: int, hd: int) -> list[tuple[str, tuple]]:
        """(layout, class) of rotary_embedding: the classes of the query's and key's row strides
        and, for strided heads, of their head strides; one layout of each class."""
        out = []
        for layout in ROPE_LAYOUTS:
            qs, ks, qhs, khs = rope_strides(layout, nq, nk, hd)
            heads = "packed heads" if qhs == khs == hd else f"heads {int_class(qhs)}/{int_class(khs)} apart"
            out.append((layout, (f"q rows {int_class(qs)}", f"k rows {int_class(ks)}", heads)))
        return first_of_each_class(out)

    @staticmethod
    def row_class(op: str, args: tuple) -> str:
        # rms_norm and the gated activations: contiguous rows, their length (the model's) also
        # their stride.
        n = args[0] if op == "rms_norm" else 2 * args[0]
        return f"rows {int_class(n)}"

    def calls(self, opts: Options) -> tuple[list[Call], list[str]]:
        calls: list[Call] = []
        notes: list[str] = []
        for model, dims in opts.models.items():
            hidden, inter = dims.get("hidden_size"), dims.get("intermediate_size")
            hd, nq, nk = dims.get("head_dim"), dims.get("num_heads"), dims.get("num_kv_heads")
            for dtype in opts.dtypes:
                esize = torch_dtype(dtype).itemsize
                # (op, variant, its planner's arguments after the token count, the call's after it[,
                # the planner's after the record, the class])
                jobs: list[tuple] = []
                if hidden:
                    for res in (False, True):
                        jobs.append(
                            ("rms_norm", ("residual" if res else "plain",), (hidden, esize, res), (hidden, res))
                        )
                if inter:
                    jobs.append(("silu_and_mul", (), (inter, esize), (inter,)))
                    # The other gated activations (a model names none: every one).
                    for op, act in _transform.ACTS.items():
                        jobs.append((op, (), (inter, esize, act), (inter,)))
                if hd and nq and nk:
                    for neox in (True, False):
                        variant = ("neox" if neox else "gptj",)
                        for layout, c in self.rope_classes(nq, nk, hd):
                            strided = c[2] != "packed heads"
                            jobs.append(("rotary_embedding", variant, (nq, nk, hd, hd, neox, esize),
                                         (nq, nk, hd, neox, layout), (strided,), f"{layout}: " + ", ".join(c)))  # fmt: skip
                for op, variant, rest, args, *more in jobs:
                    after, desc = more if more else ((), self.row_class(op, args))
                    # The other gated activations launch on silu_and_mul's records.
                    records = self.kernels.launch["silu_and_mul" if op in _transform.ACTS else op]
                    planner, cfg = self.PLANNERS[op], records[opts.target]
                    what = " ".join((op, model, dtype, *variant))
                    for key, n in launch_plans(opts, notes, what, planner, *rest, cfg, *after):
                        covers = (op, model, dtype, *variant, desc, plan_text(key))
                        calls.append(Call(self.module, op, (opts.target, dtype, n, *args), covers))
        return calls, notes

    def run(self, call: Call, device: torch.device) -> None:
        target, dtype, n, *rest = call.args
        dt = torch_dtype(dtype)
        if call.op == "rms_norm":
            hidden, res = rest
            x = empty((n, hidden), dt, device)
            residual = empty((n, hidden), dt, device) if res else None
            self.kernels.rms_norm(x, empty((hidden,), dt, device), 1e-6, residual=residual, hw=target)
        elif call.op == "silu_and_mul":
            (inter,) = rest
            self.kernels.silu_and_mul(empty((n, 2 * inter), dt, device), hw=target)
        elif call.op in _transform.ACTS:
            (inter,) = rest
            self.kernels.act_and_mul(call.op, empty((n, 2 * inter), dt, device), hw=target)
        else:
            nq, nk, hd, neox, layout = rest
            positions = torch.zeros(n, dtype=torch.int64, device=device)
            if layout == "packed":
                query, key = empty((n, nq * hd), dt, device), empty((n, nk * hd), dt, device)
            elif layout == "qkv view":
                query, key, _ = empty((n, (nq + 2 * nk) * hd), dt, device).split([nq * hd, nk * hd, nk * hd], dim=-1)
            else:
                query = empty((n, nq, 3 * hd), dt, device)[:, :, :hd]
                key = empty((n, nk, 3 * hd), dt, device)[:, :, :hd]
            cos_sin = empty((16, hd), dt, device)
            self.kernels.rotary_embedding(positions, query, key, cos_sin, hd, neox, hw=target)
