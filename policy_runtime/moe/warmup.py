"""generated/moe.py's warm-up driver (hand-written; policy_runtime/warmup/ runs it).

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
fused_moe with an ``expert_map`` compiles on first use.
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
            for dtype in opts.dtypes:
                buckets, select = self.moe.policies[self.moe.variant_of_dtype[torch_dtype(dtype)]][opts.target]
                # The buckets this model's expert shape reaches (a bucket for another shape is
                # another model's to compile).
                counts = bucket_counts(lambda t, inter=inter: select(t, inter), buckets, opts)
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
                # A token a program up to TOPK_ONE_ROW_MAX_T tokens, tiles of tokens above.
                for path, T in (("one row", 1), ("tiles", TOPK_ONE_ROW_MAX_T + 1)):
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
        scorings = [dims["moe_scoring"]] if dims.get("moe_scoring") else list(SCORINGS)
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
        target, dtype, T, E, k, inter, hidden, act = call.args
        dt = torch_dtype(dtype)
        x = empty((T, hidden), dt, device)
        w1, w2 = self._weight((E, 2 * inter, hidden), dt, device), self._weight((E, hidden, inter), dt, device)
        weights = empty((T, k), torch.float32, device)
        ids = torch.zeros((T, k), dtype=torch.int32, device=device)
        self.moe.fused_moe(x, w1, w2, weights, ids, act, None, target)

