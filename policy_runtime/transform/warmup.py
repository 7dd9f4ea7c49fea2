"""generated/transform.py's warm-up driver (hand-written; policy_runtime/warmup/ runs it).

Calls covered, in the dtypes asked: rms_norm (with and without residual; weight of x's dtype)
over hidden_size, silu_and_mul, gelu_tanh_and_mul, swigluoai_and_mul and mul_and_silu over
intermediate_size, rotary_embedding (packed heads; int64 positions, cos_sin_cache of the query's
dtype, rot_dim = head_dim, NeoX and GPT-J) over the model's query and KV heads: one call per
distinct launch plan over every token count from 1 to ``max_tokens`` (a plan is the kernel, its
constants, warps and the block counts it passes). Counts past it are sampled (powers of two,
their neighbours and three times them, up to 2**22): a plan first seen there is reported in the
notes, not warmed (every plan of the specs here appears below 4096 tokens). Everything else
(rotary_embedding on strided heads, ...) compiles on first use.
"""

from __future__ import annotations

from typing import Any

import torch

from ..warmup.calls import Call, Options, empty, launch_plans, plan_text, torch_dtype
from . import ops as _transform

__all__ = ["TransformDriver"]

class TransformDriver:
    """generated/transform.py's calls: every launch plan of rms_norm, silu_and_mul and
    rotary_embedding over token counts, per model and dtype."""

    PLANNERS = {
        "rms_norm": _transform.plan_rms_norm,
        "silu_and_mul": _transform.plan_silu_and_mul,
        "rotary_embedding": _transform.plan_rotary_embedding,
        **{op: _transform.plan_act_and_mul for op in _transform.ACTS},
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
                esize = torch_dtype(dtype).itemsize
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
                    for op, act in _transform.ACTS.items():
                        jobs.append((op, (), (inter, esize, act), (inter,)))
                if hd and nq and nk:
                    for neox in (True, False):
                        variant = ("neox" if neox else "gptj",)
                        jobs.append(("rotary_embedding", variant, (nq, nk, hd, hd, neox, esize), (nq, nk, hd, neox)))
                for op, variant, rest, args in jobs:
                    # The other gated activations launch on silu_and_mul's records.
                    records = self.kernels.launch["silu_and_mul" if op in _transform.ACTS else op]
                    planner, cfg = self.PLANNERS[op], records[opts.target]
                    for key, n in launch_plans(opts, notes, " ".join((op, model, dtype, *variant)), planner, *rest, cfg):
                        covers = (op, model, dtype, *variant, plan_text(key))
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
            nq, nk, hd, neox = rest
            positions = torch.zeros(n, dtype=torch.int64, device=device)
            query, key = empty((n, nq * hd), dt, device), empty((n, nk * hd), dt, device)
            cos_sin = empty((16, hd), dt, device)
            self.kernels.rotary_embedding(positions, query, key, cos_sin, hd, neox, hw=target)

