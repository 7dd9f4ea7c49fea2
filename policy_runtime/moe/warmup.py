"""generated/moe.py's warm-up driver (hand-written; policy_runtime/warmup/ runs it).

A model's routing and activation are its MoERouting record on the target (``WARMUP_TABLES.routing``;
its MODEL_DIMS entry where the tables have none), as attention's driver reads AttentionFeatures.
Calls covered, in the dtypes asked: fused_moe (the model's ``moe_activation``, or every
activation where it names none; int32 topk_ids, fp32 topk_weights, no expert_map) for each bucket
of ``moe_launch`` (at the first token count up to 2**16 it serves) and each model with experts
(its num_experts, top_k, moe_intermediate_size, hidden_size; expert weights as zero-stride views
of one expert, which Triton specializes as it does their real strides, multiples of 16), with the
alignment and reduce kernels the bucket launches; and topk_softmax over the model's experts,
renormalizing and not, at a decode token count (a token a program) and above (tiles of tokens:
the first prefill's routing compiles nothing either); and grouped_topk likewise, for the model's
``moe_scoring`` (or softmax and sigmoid), with and without a correction bias (fp32), with its
``moe_num_expert_group``, ``moe_topk_group`` and ``moe_routed_scaling_factor`` (none where it
names none); the routers' logits in each dtype asked and in float32 (vLLM's routers take
both; a float32 router is common). fused_moe_fp8 (targets with e4m3fn; hidden_states in each dtype asked) for each
bucket of ``moe_fp8_launch`` the model's shape reaches, each activation as above, with static
per-tensor activation scales, dynamic ones and 128-block scales (where H and I are multiples of
128), scales float32 and contiguous. fused_moe with an ``expert_map`` compiles on first use.
"""

from __future__ import annotations

from typing import Any

import torch

from ..warmup.calls import Call, Options, bucket_counts, empty, torch_dtype
from .ops import ACTIVATIONS as _MOE_ACTIVATIONS
from .ops import SCORINGS, TOPK_ONE_ROW_MAX_T
from .ops import grouped_topk as _grouped_topk
from .ops import topk_softmax as _topk_softmax

__all__ = ["MoEDriver"]

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
            dims = self._with_routing(model, dims, opts.target)
            for dtype in opts.dtypes:
                buckets, select = self.moe.policies[self.moe.variant_of_dtype[torch_dtype(dtype)]][opts.target]
                # The buckets this model's expert shape reaches (a bucket for another shape is
                # another model's to compile).
                counts = bucket_counts(lambda t: select(t, inter), buckets, opts)  # called here: no late binding
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
                        what: tuple[Any, ...] = ("fused_moe", model, dtype, b.name, b.variant.name, act)
                        args: tuple[Any, ...] = (opts.target, dtype, counts[i], E, k, inter, hidden, act)
                        calls.append(Call(self.module, "fused_moe", args, what, 3))
                calls += self._fp8_calls(opts, model, dtype, inter, acts, notes)
            # The routers' logits: each dtype asked, and float32 (once).
            for dtype in list(dict.fromkeys([*opts.dtypes, "float32"])):
                # A token a program up to TOPK_ONE_ROW_MAX_T tokens, tiles of tokens above.
                for path, T in (("one row", 1), ("tiles", TOPK_ONE_ROW_MAX_T + 1)):
                    for renormalize in (True, False):
                        if not dims.get("moe_grouped"):
                            what = ("topk_softmax", model, dtype, "renormalize" if renormalize else "plain", path)
                            args = (opts.target, dtype, T + 2 if opts.pick == "other" else T, E, k, renormalize)
                            calls.append(Call(self.module, "topk_softmax", args, what))
                        calls += self._routers(opts, model, dims, dtype, path, T, renormalize)
        return calls, notes

    def _with_routing(self, model: str, dims: dict, target: str) -> dict:
        """``dims`` with the model's MoERouting record on ``target`` in MODEL_DIMS' names (and
        ``moe_grouped``: its router is grouped_topk alone); ``dims`` where the tables have none."""
        rec = getattr(self.moe, "routing", {}).get(model, {}).get(target)
        if rec is None:
            return dims
        return {
            **dims,
            "moe_scoring": rec.scoring,
            "moe_score_bias": rec.score_bias,
            "moe_num_expert_group": rec.num_expert_group,
            "moe_topk_group": rec.topk_group,
            "moe_routed_scaling_factor": rec.routed_scaling_factor,
            "moe_activation": rec.activation,
            "moe_grouped": rec.grouped,
        }

    def _routers(
        self, opts: Options, model: str, dims: dict, dtype: str, path: str, T: int, renormalize: bool
    ) -> list[Call]:
        """grouped_topk's specializations for a model: its scoring (or both), with and without a
        correction bias, its expert groups and scaling factor (none where it names none); the
        plain softmax one is topk_softmax's kernel, above."""
        E, k = dims["num_experts"], dims["top_k"]
        groups, topk_group = dims.get("moe_num_expert_group") or 1, dims.get("moe_topk_group") or 1
        scale = dims.get("moe_routed_scaling_factor") or 1.0
        scorings = [dims["moe_scoring"]] if dims.get("moe_scoring") else list(SCORINGS)
        # A record names its bias; MODEL_DIMS without one: with and without.
        biases = [bool(dims["moe_score_bias"])] if "moe_grouped" in dims else [False, True]
        calls = []
        for scoring in scorings:
            for bias in biases:
                if scoring == "softmax" and not bias and groups == 1 and scale == 1.0:
                    continue
                what = ("grouped_topk", model, dtype, scoring, "bias" if bias else "no bias",
                        "renormalize" if renormalize else "plain", path)  # fmt: skip
                n = T + 2 if opts.pick == "other" else T
                args = (opts.target, dtype, n, E, k, renormalize, scoring, bias, groups, topk_group, scale)
                calls.append(Call(self.module, "grouped_topk", args, what))
        return calls

    # fused_moe_fp8's scalings as its kernels specialize them (block: where H and I are multiples of 128).
    FP8_SCALINGS = ("tensor static", "tensor dynamic", "block")

    def _fp8_calls(
        self, opts: Options, model: str, dtype: str, inter: int, acts: list[str], notes: list[str]
    ) -> list[Call]:
        """fused_moe_fp8 (the module's ``fp8`` tables, on targets with e4m3fn) for each bucket the
        model's shape reaches, each scaling and activation; hidden_states in ``dtype``."""
        fp8 = getattr(self.moe, "fp8", None)
        if fp8 is None or opts.target in fp8.unserved:
            note = f"moe fused_moe_fp8: not served on {opts.target}: no {fp8.unserved[opts.target]}" if fp8 else ""
            if fp8 is not None and note not in notes:
                notes.append(note)
            return []
        E, k, hidden = (opts.models[model][d] for d in ("num_experts", "top_k", "hidden_size"))
        buckets, select = fp8.policies[fp8.variant_of_dtype[torch.float8_e4m3fn]][opts.target]
        counts = bucket_counts(lambda t: select(t, inter), buckets, opts)
        calls = []
        for i, b in enumerate(buckets):
            if i not in counts:
                continue
            for scaling in self.FP8_SCALINGS:
                if scaling == "block" and (hidden % 128 or inter % 128):
                    notes.append(f"moe fused_moe_fp8 {opts.target} {b.name}: {model}'s H {hidden} or I {inter} "
                                 "is not a multiple of 128: no block scaling")  # fmt: skip
                    continue
                for act in acts:
                    what = ("fused_moe_fp8", model, dtype, b.name, b.variant.name, scaling, act)
                    args = (opts.target, dtype, counts[i], E, k, inter, hidden, act, scaling)
                    calls.append(Call(self.module, "fused_moe_fp8", args, what, 3))
        return calls

    @staticmethod
    def _weight(shape: tuple[int, int, int], dt: torch.dtype, device: torch.device) -> torch.Tensor:
        # Zero-stride views over one expert: Triton specializes the zero expert stride as it does
        # the real one where that is a multiple of 16 (it then marks both divisible by 16).
        E, rows, cols = shape
        if (rows * cols) % 16 == 0:
            return empty((1, rows, cols), dt, device).expand(E, rows, cols)
        return empty(shape, dt, device)

    def run(self, call: Call, device: torch.device) -> None:
        if call.op == "topk_softmax":
            _, dtype, T, E, k, renormalize = call.args
            _topk_softmax(empty((T, E), torch_dtype(dtype), device), k, renormalize)
            return
        if call.op == "grouped_topk":
            _, dtype, T, E, k, renormalize, scoring, bias, groups, topk_group, scale = call.args
            _grouped_topk(
                empty((T, E), torch_dtype(dtype), device), k, renormalize, scoring_func=scoring,
                e_score_correction_bias=empty((E,), torch.float32, device) if bias else None,
                num_expert_group=groups, topk_group=topk_group, routed_scaling_factor=scale,
            )  # fmt: skip
            return
        if call.op == "fused_moe_fp8":
            target, dtype, T, E, k, inter, hidden, act, scaling = call.args
            fp8, blocked = torch.float8_e4m3fn, scaling == "block"
            w1, w2 = self._weight((E, 2 * inter, hidden), fp8, device), self._weight((E, hidden, inter), fp8, device)
            if blocked:
                s1 = empty((E, -(-2 * inter // 128), -(-hidden // 128)), torch.float32, device)
                s2 = empty((E, -(-hidden // 128), -(-inter // 128)), torch.float32, device)
            else:
                s1, s2 = empty((E,), torch.float32, device), empty((E,), torch.float32, device)
            static = empty((1,), torch.float32, device) if scaling == "tensor static" else None
            self.moe.fp8.fused_moe_fp8(
                empty((T, hidden), torch_dtype(dtype), device), w1, w2, empty((T, k), torch.float32, device),
                torch.zeros((T, k), dtype=torch.int32, device=device), w1_scale=s1, w2_scale=s2, a1_scale=static,
                a2_scale=static, block_shape=[128, 128] if blocked else None, activation=act, hw=target,
            )  # fmt: skip
            return
        target, dtype, T, E, k, inter, hidden, act = call.args
        dt = torch_dtype(dtype)
        x = empty((T, hidden), dt, device)
        w1, w2 = self._weight((E, 2 * inter, hidden), dt, device), self._weight((E, hidden, inter), dt, device)
        weights = empty((T, k), torch.float32, device)
        ids = torch.zeros((T, k), dtype=torch.int32, device=device)
        self.moe.fused_moe(x, w1, w2, weights, ids, act, None, target)

