"""Paged decode's tuning harness: how ``python -m codegen tune attention`` runs an AttentionConfig.

Named by ``[attention.tune] harness`` in specs/kernels/attention.toml; the protocol is the one
policy_runtime/matmul/tune.py describes.  A problem is one ``decode_attention`` call: ``batch``
sequences of ``context`` tokens each, one query token per sequence, on a paged cache (blocks of 16
tokens in a shuffled block table); the heads and head_dim come from ``params`` (the spec hands the
model's ``num_heads``, ``num_kv_heads`` and ``head_dim``), and ``params["target"]`` names the part.
A record (the decode fields of an AttentionConfig: partition size, V1/V2 and PyTorch thresholds)
replaces the target's own in the generated module's decode path (the same launch code, kernels and
merge); the decode kernels themselves are the target's.  No vendor library: no backend to choose.
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace
from typing import Any, Callable, Mapping

import torch

from ..tuning import Harness, Problem

BLOCK_SIZE = 16


class DecodeProblem(Problem):
    def __init__(self, batch: int, context: int, params: Mapping[str, Any], dtype: torch.dtype, device: Any):
        H, Hkv, D = params["num_heads"], params["num_kv_heads"], params["head_dim"]
        self.target = params["target"]
        gen = torch.Generator(device="cpu").manual_seed(0)
        blocks_per_seq = -(-context // BLOCK_SIZE)
        num_blocks = batch * blocks_per_seq
        self.query = torch.randn(batch, H, D, generator=gen).to(device=device, dtype=dtype)
        self.key_cache = torch.randn(num_blocks, BLOCK_SIZE, Hkv, D, generator=gen).to(device=device, dtype=dtype)
        self.value_cache = torch.randn(num_blocks, BLOCK_SIZE, Hkv, D, generator=gen).to(device=device, dtype=dtype)
        table = torch.randperm(num_blocks, generator=gen).to(torch.int32).view(batch, blocks_per_seq)
        self.block_tables = table.to(device)
        self.seq_lens = torch.full((batch,), context, dtype=torch.int32, device=device)
        self.reference = self._reference(batch, context, H, Hkv, D)

    def _reference(self, batch: int, context: int, H: int, Hkv: int, D: int) -> torch.Tensor:
        out = torch.empty(batch, H, D, dtype=torch.float32, device=self.query.device)
        for s in range(batch):
            rows = self.block_tables[s].long()
            k = self.key_cache[rows].reshape(-1, Hkv, D)[:context].float()  # [L, Hkv, D]
            v = self.value_cache[rows].reshape(-1, Hkv, D)[:context].float()
            q = self.query[s].float().view(Hkv, H // Hkv, D)
            scores = torch.einsum("hgd,lhd->hgl", q, k) * D**-0.5
            out[s] = torch.einsum("hgl,lhd->hgd", scores.softmax(-1), v).reshape(H, D)
        return out

    def kernel(self, record: Mapping[str, Any]) -> Callable[[], torch.Tensor]:
        attention = importlib.import_module("generated.attention")._ATTENTION  # the target's tables
        config = SimpleNamespace(**record)
        out = torch.full_like(self.query, float("nan"))

        def run() -> torch.Tensor:
            attention.decode(
                self.query, self.key_cache, self.value_cache, self.block_tables, self.seq_lens,
                out=out, hw=self.target, config=config,
            )  # fmt: skip
            return out

        return run


HARNESS = Harness(
    problem=lambda shape, dtype, device, params: DecodeProblem(shape["batch"], shape["context"], params, dtype, device)
)
