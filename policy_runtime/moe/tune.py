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

from ..tuning import BoundKernel, Harness, Problem
from . import fp8 as _fp8
from . import ops as _moe
from .constexprs import body_constants, fp8_body_constants


def launch_fields(record: Mapping[str, Any]) -> dict[str, Any]:
    """The launch fields a ``moe_launch`` or ``moe_fp8_launch`` record gives its runtime variant
    (``Variant`` and ``Fp8Variant`` name them alike), by the variant's field names."""
    return dict(
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
        weights_tma=record.get("weights_tma", False),
    )


def variant(record: Mapping[str, Any], dtype_bytes: int) -> _moe.Variant:
    """The runtime ``Variant`` of a ``MoELaunchConfig`` record: its kernels the bodies and constants
    generated/moe.py's wrappers would have (policy_runtime/moe/constexprs.py, which the template's
    context reads too)."""
    kernels = {
        part: BoundKernel(getattr(_moe, body), f"candidate{body}", constants)
        for part, (body, constants) in body_constants(record, dtype_bytes).items()
    }
    return _moe.Variant(up=kernels["up"], down=kernels["down"], chained=record["chained"], **launch_fields(record))


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


# ---------------------------------------------------------------------------------------
# fused_moe_fp8 (``[moe_fp8_launch.tune]``): the same layer on e4m3 weights.


def fp8_variant(record: Mapping[str, Any]) -> Any:
    """The runtime ``Fp8Variant`` of a ``MoEFp8LaunchConfig`` record, on the bodies and constants
    generated/moe.py's FP8 wrappers would have (policy_runtime/moe/constexprs.py)."""
    kernels = {
        part: BoundKernel(getattr(_fp8, body), f"candidate{body}", constants)
        for part, (body, constants) in fp8_body_constants(record).items()
    }
    return _fp8.Fp8Variant(
        up=kernels["up"], down=kernels["down"], down_split_k=record["down_split_k"], **launch_fields(record)
    )


class MoEFp8Problem(MoEProblem):
    """MoEProblem's layer with w1 and w2 quantized to e4m3 (per expert, or per 128x128 block with
    ``scaling`` "block"), hidden states in ``dtype`` quantized by the call (dynamic per tensor, or
    per token and 128-group); the reference is fp32 on the dequantized weights and the unquantized
    activations, so a candidate's error is the activations' quantization (a few percent)."""

    def __init__(self, T: int, inter: int, params: Mapping[str, Any], dtype: torch.dtype, device: Any, seed: int = 0):
        self.block = params.get("scaling", "block") == "block"
        if params.get("scaling", "block") not in ("tensor", "block"):
            raise ValueError(f"moe_fp8_launch tune: params.scaling must be tensor or block, got {params['scaling']!r}")
        super().__init__(T, inter, params, dtype, device, seed)
        self.w1, self.s1 = self._quantize(self.w1)
        self.w2, self.s2 = self._quantize(self.w2)
        H = self.x.shape[1]
        self.scales = _fp8.check_moe_scales(
            "moe_fp8_launch tune", H, inter, self.E, self.s1, self.s2, None, None,
            [128, 128] if self.block else None, self.x.device,
        )  # fmt: skip
        # The reference on the dequantized weights (MoEProblem's reads self.w1 / self.w2).
        q1, q2 = self.w1, self.w2
        self.w1, self.w2 = self._dequantize(q1, self.s1), self._dequantize(q2, self.s2)
        self.reference = self._reference(T, H, inter, self.weights.numel() // T)
        self.w1, self.w2 = q1, q2

    def _quantize(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        w = w.float()
        if not self.block:
            s = w.abs().amax(dim=(1, 2)).clamp(min=1e-12) / 448
            return (w / s[:, None, None]).to(torch.float8_e4m3fn), s
        E, n, k = w.shape
        nb, kb = -(-n // 128), -(-k // 128)
        padded = torch.zeros(E, nb * 128, kb * 128, device=w.device)
        padded[:, :n, :k] = w
        blocks = padded.view(E, nb, 128, kb, 128)
        s = blocks.abs().amax(dim=(2, 4)).clamp(min=1e-12) / 448
        q = (blocks / s[:, :, None, :, None]).view(E, nb * 128, kb * 128)[:, :n, :k]
        return q.to(torch.float8_e4m3fn).contiguous(), s.contiguous()

    def _dequantize(self, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        if not self.block:
            return q.float() * s[:, None, None]
        E, n, k = q.shape
        return q.float() * s.repeat_interleave(128, 1).repeat_interleave(128, 2)[:, :n, :k]

    def kernel(self, record: Mapping[str, Any]) -> Callable[[], torch.Tensor]:
        v = fp8_variant(record)
        out = torch.full_like(self.x, float("nan"))
        act = _moe.ACTIVATIONS["silu"]

        def run() -> torch.Tensor:
            v.run(self.x, self.w1, self.w2, self.weights, self.ids, out, act, self.E, self.scales)
            return out

        return run


HARNESS_FP8 = Harness(
    problem=lambda shape, dtype, device, params: MoEFp8Problem(shape["t"], shape["i"], params, dtype, device)
)
