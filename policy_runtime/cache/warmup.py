"""generated/cache.py's warm-up driver (hand-written; policy_runtime/warmup/ runs it).

Calls covered, in the dtypes asked: reshape_and_cache (int64 slot_mapping; key and value [tokens,
kv_heads, head_dim], caches [blocks, ``block_size``, kv_heads, head_dim]; and, on targets with
e4m3fn, the fp8 write with float32 tensor scales) per plan over token counts as above; copy_blocks (int64 block_mapping, caches 16-byte aligned) per plan over pair
counts.
"""

from __future__ import annotations

from typing import Any

import torch

from ..warmup.calls import Call, Options, empty, launch_plans, plan_text, torch_dtype
from . import ops as _cache

__all__ = ["CacheDriver"]

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
                esize = torch_dtype(dtype).itemsize
                # copy_blocks: every cache 16-byte aligned (UNIT 16 bytes); its plan reads pairs
                # times caches, so one layer's two caches and every pair count cover any layers.
                planners = (
                    ("reshape_and_cache", _cache.plan_reshape_and_cache, (kvh * hd, hd, esize)),
                    ("copy_blocks", _cache.plan_copy_blocks, (2, bs * kvh * hd, max(1, 16 // esize), esize)),
                )
                if opts.target in launch["reshape_and_cache_fp8"]:
                    # The fp8 cache write (kv_cache_dtype="fp8"), on targets with e4m3fn.
                    planners += (("reshape_and_cache_fp8", _cache.plan_reshape_and_cache, (kvh * hd, hd, esize)),)
                for op, planner, rest in planners:
                    cfg = launch[op][opts.target]
                    for key, n in launch_plans(opts, notes, f"{op} {model} {dtype}", planner, *rest, cfg):
                        covers = (op, model, dtype, plan_text(key))
                        calls.append(Call(self.module, op, (opts.target, dtype, n, kvh, hd, bs), covers))
        return calls, notes

    def run(self, call: Call, device: torch.device) -> None:
        target, dtype, n, kvh, hd, bs = call.args
        dt = torch_dtype(dtype)
        if call.op in ("reshape_and_cache", "reshape_and_cache_fp8"):
            fp8 = call.op == "reshape_and_cache_fp8"
            blocks = n // bs + 1
            key, value = empty((n, kvh, hd), dt, device), empty((n, kvh, hd), dt, device)
            cdt = torch.float8_e4m3fn if fp8 else dt
            kc, vc = empty((blocks, bs, kvh, hd), cdt, device), empty((blocks, bs, kvh, hd), cdt, device)
            slots = torch.arange(n, dtype=torch.int64, device=device)
            if fp8:
                scale = torch.ones(1, dtype=torch.float32, device=device)
                self.kernels.reshape_and_cache(key, value, kc, vc, slots, "fp8", scale, scale, hw=target)
            else:
                self.kernels.reshape_and_cache(key, value, kc, vc, slots, hw=target)
        else:
            kc, vc = empty((2 * n, bs, kvh, hd), dt, device), empty((2 * n, bs, kvh, hd), dt, device)
            src = torch.arange(n, dtype=torch.int64, device=device)
            self.kernels.copy_blocks([kc], [vc], torch.stack([src, src + n], dim=1), hw=target)

