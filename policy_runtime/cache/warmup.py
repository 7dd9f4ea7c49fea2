"""generated/cache.py's warm-up driver (hand-written; policy_runtime/warmup/ runs it).

Calls covered, in the dtypes asked: reshape_and_cache (int64 slot_mapping; key and value [tokens,
kv_heads, head_dim], caches [blocks, ``block_size``, kv_heads, head_dim]; on targets with e4m3fn
also the fp8 write, float32 tensor scales) per plan over token counts, and copy_blocks (int64
block_mapping, caches 16-byte aligned) per plan over pair counts.  Argument classes: the token
count (slot_mapping's length) and pair count are ``do_not_specialize``, the element counts, block
size and strides within a block are the model's and the deployment's.  Key and value may be
packed or views of a fused qkv projection (rows (num_heads + 2 * num_kv_heads) * head_dim apart),
the caches separate or the two halves of one [blocks, 2, ...] tensor (``KV_LAYOUTS``,
``CACHE_LAYOUTS``): one call per plan and class of those strides (``int_class``).  A head_dim is
a multiple of 8 here, so every view starts 16-byte aligned in 16-bit dtypes.  slot_mapping in
int32 compiles on first use.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..warmup.calls import Call, Options, empty, first_of_each_class, int_class, launch_plans, plan_text, torch_dtype
from . import ops as _cache

__all__ = ["CacheDriver", "KV_LAYOUTS", "CACHE_LAYOUTS"]

# How reshape_and_cache's key and value lie: packed [T, kv_heads, head_dim], or views of a fused
# qkv projection; and its caches: two tensors, or the halves of one [blocks, 2, block_size, ...].
KV_LAYOUTS = ("packed", "qkv view")
CACHE_LAYOUTS = ("separate", "kv pairs")


class CacheDriver:
    """generated/cache.py's calls: every launch plan of reshape_and_cache over token counts (in
    each class of layout, ``write_classes``) and of copy_blocks over pair counts, per model and
    dtype."""

    def __init__(self, module: str, kernels: Any) -> None:
        self.module, self.kernels = module, kernels

    @staticmethod
    def write_classes(nq: int, kvh: int, hd: int, bs: int) -> list[tuple[tuple[str, str], tuple]]:
        """((key/value layout, cache layout), class) of reshape_and_cache: the classes of the key's
        and value's row stride and of the caches' block stride; one pair of layouts per class."""
        out: list[tuple[tuple[str, str], tuple]] = []
        for kv in KV_LAYOUTS:
            rows = kvh * hd if kv == "packed" else (nq + 2 * kvh) * hd
            for caches in CACHE_LAYOUTS:
                block = bs * kvh * hd * (1 if caches == "separate" else 2)
                out.append(((kv, caches), (f"k/v rows {int_class(rows)}", f"cache blocks {int_class(block)}")))
        return first_of_each_class(out)

    def calls(self, opts: Options) -> tuple[list[Call], list[str]]:
        calls: list[Call] = []
        notes: list[str] = []
        launch, bs = self.kernels.launch, opts.block_size
        for model, dims in opts.models.items():
            hd, kvh = dims.get("head_dim"), dims.get("num_kv_heads")
            if not hd or not kvh:
                continue
            nq = dims.get("num_heads") or kvh
            for dtype in opts.dtypes:
                esize = torch_dtype(dtype).itemsize
                # copy_blocks: every cache 16-byte aligned (UNIT 16 bytes); its plan reads pairs
                # times caches, so one layer's two caches and every pair count cover any layers.
                planners: tuple[tuple[str, Callable[..., Any], tuple], ...] = (
                    ("reshape_and_cache", _cache.plan_reshape_and_cache, (kvh * hd, hd, esize)),
                    ("copy_blocks", _cache.plan_copy_blocks, (2, bs * kvh * hd, max(1, 16 // esize), esize)),
                )
                if opts.target in launch["reshape_and_cache_fp8"]:
                    # The fp8 cache write (kv_cache_dtype="fp8"), on targets with e4m3fn.
                    planners += (("reshape_and_cache_fp8", _cache.plan_reshape_and_cache, (kvh * hd, hd, esize)),)
                for op, planner, rest in planners:
                    cfg = launch[op][opts.target]
                    classes = self.write_classes(nq, kvh, hd, bs) if op != "copy_blocks" else [(("", ""), ())]
                    for key, n in launch_plans(opts, notes, f"{op} {model} {dtype}", planner, *rest, cfg):
                        for (kv, caches), c in classes:
                            desc = f"{kv}, {caches}: " + ", ".join(c) if c else f"blocks {int_class(bs * kvh * hd)}"
                            covers = (op, model, dtype, desc, plan_text(key))
                            args = (opts.target, dtype, n, nq, kvh, hd, bs) + ((kv, caches) if c else ())
                            calls.append(Call(self.module, op, args, covers))
        return calls, notes

    def run(self, call: Call, device: torch.device) -> None:
        target, dtype, n, nq, kvh, hd, bs, *layouts = call.args
        dt = torch_dtype(dtype)
        if call.op in ("reshape_and_cache", "reshape_and_cache_fp8"):
            kv, caches = layouts
            fp8 = call.op == "reshape_and_cache_fp8"
            blocks = n // bs + 1
            if kv == "packed":
                key, value = empty((n, kvh, hd), dt, device), empty((n, kvh, hd), dt, device)
            else:
                qkv = empty((n, (nq + 2 * kvh) * hd), dt, device)
                key, value = (x.view(n, kvh, hd) for x in qkv.split([nq * hd, kvh * hd, kvh * hd], dim=-1)[1:])
            cdt = torch.float8_e4m3fn if fp8 else dt
            if caches == "separate":
                kc, vc = empty((blocks, bs, kvh, hd), cdt, device), empty((blocks, bs, kvh, hd), cdt, device)
            else:
                kc, vc = empty((blocks, 2, bs, kvh, hd), cdt, device).unbind(1)
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
