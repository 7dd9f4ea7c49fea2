"""fused_moe's tuning harness: how ``python -m codegen tune moe_launch`` runs a bucket record.

Named by ``[moe_launch.tune] harness`` in specs/kernels/moe.toml; the protocol is the one
policy_runtime/matmul/tune.py describes.  A problem is one MoE layer call of shape (T, I): T
tokens through experts of intermediate size I (the policy's bucket dimensions ``t`` and ``i``);
the rest of the layer's sizes come from ``params`` (the spec hands the model's ``num_experts``,
``hidden_size`` and ``top_k``), the routing from a seeded top-k softmax.  A record runs
through ``Variant.run`` of policy_runtime/moe/ops.py (alignment, both GEMMs, the sum), as
``fused_moe`` runs a bucket's kernels, on the kernel bodies generated/moe.py's wrappers would call
with the record's constants (one mapping for both: policy_runtime/moe/constexprs.py).  No vendor
library: the family declares no backend to choose.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import torch

from . import ops as _moe
from .constexprs import body_constants
from ..tuning import BoundKernel, Harness, Problem


def variant(record: Mapping[str, Any], dtype_bytes: int) -> _moe.Variant:
    """The runtime ``Variant`` of a ``MoELaunchConfig`` record: its kernels the bodies and constants
    generated/moe.py's wrappers would have (policy_runtime/moe/constexprs.py, which the template's
    context reads too)."""
    kernels = {
        part: BoundKernel(getattr(_moe, body), f"candidate{body}", constants)
        for part, (body, constants) in body_constants(record, dtype_bytes).items()
    }
    return _moe.Variant(
        up=kernels["up"],
        down=kernels["down"],
        kind=record["kernel"],
        block_m=record["block_size_m"],
        block_n=record["block_size_n"],
        block_k=record["block_size_k"],
        group_m=record["group_size_m"],
        num_warps=record["num_warps"],
        num_stages=record["num_stages"],
        fuse_sum=record["fuse_sum"],
        down_block_n=record["down_block_size_n"],
        down_block_k=record["down_block_size_k"],
        down_num_warps=record["down_num_warps"],
        down_num_stages=record["down_num_stages"],
        chained=record["chained"],
    )


class MoEProblem(Problem):
    """T tokens through one MoE layer of expert intermediate size ``inter``: seeded weights and
    routing, an fp32 per-expert reference."""

    def __init__(self, T: int, inter: int, params: Mapping[str, Any], dtype: torch.dtype, device: Any, seed: int = 0):
        E, H, k = params["num_experts"], params["hidden_size"], params["top_k"]
        gen = torch.Generator(device="cpu").manual_seed(seed)

        def rand(*shape: int, scale: float) -> torch.Tensor:
            return (torch.randn(*shape, generator=gen) * scale).to(device=device, dtype=dtype)

        self.E = E
        self.x = rand(T, H, scale=1.0)
        self.w1 = rand(E, 2 * inter, H, scale=H**-0.5)
        self.w2 = rand(E, H, inter, scale=inter**-0.5)
        logits = torch.randn(T, E, generator=gen).to(device)
        weights, ids = torch.topk(torch.softmax(logits, dim=-1), k, dim=-1)
        self.weights = (weights / weights.sum(-1, keepdim=True)).float().contiguous().view(-1)
        self.ids = ids.to(torch.int32).contiguous().view(-1)
        self.reference = self._reference(T, H, inter, k)

    def _reference(self, T: int, H: int, inter: int, k: int) -> torch.Tensor:
        out = torch.zeros(T, H, dtype=torch.float32, device=self.x.device)
        x = self.x.float()
        tok = torch.arange(T, device=self.x.device).repeat_interleave(k)
        for e in torch.unique(self.ids).tolist():
            rows = (self.ids == e).nonzero().flatten()
            h = x[tok[rows]] @ self.w1[e].float().T
            act = torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]
            out.index_add_(0, tok[rows], (act @ self.w2[e].float().T) * self.weights[rows, None])
        return out

    def kernel(self, record: Mapping[str, Any]) -> Callable[[], torch.Tensor]:
        v = variant(record, self.x.element_size())
        out = torch.full_like(self.x, float("nan"))
        act = _moe.ACTIVATIONS["silu"]

        def run() -> torch.Tensor:
            v.run(self.x, self.w1, self.w2, self.weights, self.ids, out, act, self.E)
            return out

        return run


HARNESS = Harness(
    problem=lambda shape, dtype, device, params: MoEProblem(shape["t"], shape["i"], params, dtype, device)
)
