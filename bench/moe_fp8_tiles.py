#!/usr/bin/env python3
"""Grouped tile records for fused_moe_fp8's prefill on one GPU: how specs/kernels/moe.toml's Hopper
`prefill` and `prefill_large` tiles were chosen (issue 35).

    python3 bench/moe_fp8_tiles.py                                   # the wide sweep at 4096 tokens
    python3 bench/moe_fp8_tiles.py --set prefill --tokens 1024 2048 4096 --models qwen3_30b mixtral dsv3 dsv3_256
    python3 bench/moe_fp8_tiles.py --set tma --tokens 4096 8192       # prefill_large's tile, weights by TMA
    python3 bench/moe_fp8_tiles.py --cpu-smoke --hw h200             # every record once in the interpreter

Each record (a `moe_fp8_launch` grouped record, policy_runtime/moe/tune.py's ``fp8_variant``) runs
the layer with 128-block and per-tensor scales (dynamic activation scales); printed: µs
(triton.testing.do_bench), the ratio to our bf16 ``fused_moe`` on the same data, and the relative
difference from the policy's own choice (0 where the kernels do the same arithmetic; tiles of fewer
than 64 rows take mma.sync, whose accumulation differs).  Weights random, routing by topk_softmax of
random logits.  dsv3 is 64 of DeepSeek-V3's experts (bench/moe_fp8.py's), dsv3_256 all 256.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from smoke import smoke_setup  # noqa: E402


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu-smoke", action="store_true", help="a tiny layer in the interpreter, each record once")
    p.add_argument("--hw", default=None, help="hardware spec name (default: detect the device)")
    p.add_argument("--set", default="wide", choices=["wide", "prefill", "down", "tma"], help="the records to run")
    p.add_argument("--models", nargs="+", default=None, help="models (default: qwen3_30b mixtral dsv3)")
    p.add_argument("--tokens", type=int, nargs="+", default=None, help="token counts (default 4096)")
    return p.parse_args()


ARGS = parse()
SMOKE = smoke_setup(ARGS)  # before torch and Triton are imported

import torch  # noqa: E402
import triton  # noqa: E402

from generated import moe as M  # noqa: E402
from policy_runtime.moe import tune  # noqa: E402
from policy_runtime.report import quiet_on_closed_pipe  # noqa: E402

FP8 = torch.float8_e4m3fn
# name: (experts, hidden H, intermediate I, top-k)
MODELS = {
    "qwen3_30b": (128, 2048, 768, 8),
    "mixtral": (8, 4096, 14336, 2),
    "dsv3": (64, 7168, 2048, 8),
    "dsv3_256": (256, 7168, 2048, 8),
    "tiny": (4, 128, 256, 2),
}
DEV = "cpu" if SMOKE else "cuda"
DT = torch.float16 if SMOKE else torch.bfloat16


def rec(bm, bn, warps, stages, group=16, down_bn=None, down_warps=None, down_stages=None, down_bk=128, tma=False):
    return dict(
        kernel="grouped", block_size_m=bm, block_size_n=bn, block_size_k=128, group_size_m=group, num_warps=warps,
        num_stages=stages, fuse_sum=False, down_block_size_n=down_bn or bn, down_block_size_k=down_bk,
        down_num_warps=down_warps or warps, down_num_stages=down_stages or stages, down_split_k=1, weights_tma=tma,
    )  # fmt: skip


RECORDS = {
    "wide": {
        "64x128 w4 s4": rec(64, 128, 4, 4),
        "64x128 w4 s3": rec(64, 128, 4, 3),
        "64x64 w4 s4": rec(64, 64, 4, 4),
        "64x64 w4 s3": rec(64, 64, 4, 3),
        "up 64x64, down 64x128 w4 s4": rec(64, 64, 4, 4, down_bn=128),
        "128x64 w8 s4": rec(128, 64, 8, 4),
        "128x128 w8 s3": rec(128, 128, 8, 3),
        "32x128 w4 s4": rec(32, 128, 4, 4),
        "64x128 w4 s4 g8": rec(64, 128, 4, 4, group=8),
    },
    "prefill": {
        "64x128 w4 s4": rec(64, 128, 4, 4),
        "128x128 w8 s3": rec(128, 128, 8, 3),
        "128x128 w8 s4": rec(128, 128, 8, 4),
    },
    # prefill_large's up GEMM (128x128, 8 warps, 3 stages) with other down GEMM tiles.
    "down": {
        "128x128 w8 s3": rec(128, 128, 8, 3),
        "down 128x256 w8 s3": rec(128, 128, 8, 3, down_bn=256),
        "down 128x256 w8 s4": rec(128, 128, 8, 3, down_bn=256, down_stages=4),
        "down 128x128 w8 s4": rec(128, 128, 8, 3, down_stages=4),
        "down 128x128 w4 s3": rec(128, 128, 8, 3, down_warps=4),
        "down 128x128x64 w8 s5": rec(128, 128, 8, 3, down_stages=5, down_bk=64),
        "down 128x64 w4 s4": rec(128, 128, 8, 3, down_bn=64, down_warps=4, down_stages=4),
    },
    # prefill_large's tile with the weights read through TMA descriptors (its policy since the
    # weights_tma field), against pointer loads, and the stages and down tiles the descriptors'
    # smaller shared-memory footprint may now allow (not swept with them yet).
    "tma": {
        "128x128 w8 s3 pointers": rec(128, 128, 8, 3),
        "128x128 w8 s3 tma": rec(128, 128, 8, 3, tma=True),
        "128x128 w8 s4 tma": rec(128, 128, 8, 4, tma=True),
        "up s4, down s3 tma": rec(128, 128, 8, 4, down_stages=3, tma=True),
        "down 128x256 w8 s3 tma": rec(128, 128, 8, 3, down_bn=256, tma=True),
    },
}


def quantize(w: torch.Tensor, block: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 weights and float32 scales: per 128x128 block, or per expert."""
    E, n, k = w.shape
    if block:
        b = w.view(E, n // 128, 128, k // 128, 128)
        s = b.abs().amax(dim=(2, 4)).float().clamp(min=1e-12) / 448
        return (b / s[:, :, None, :, None]).view(E, n, k).to(FP8), s
    s = w.abs().amax(dim=(1, 2)).float().clamp(min=1e-12) / 448
    return (w / s[:, None, None]).to(FP8), s


def timed(fn) -> float:
    """µs of one call: one call in the interpreter, else do_bench's median."""
    if SMOKE:
        fn()
        return float("nan")
    return triton.testing.do_bench(fn, warmup=10, rep=100) * 1e3


def main() -> int:
    models = ARGS.models or (["tiny"] if SMOKE else ["qwen3_30b", "mixtral", "dsv3"])
    tokens = ARGS.tokens or ([17] if SMOKE else [4096])
    records = RECORDS[ARGS.set]
    failed = 0
    for model in models:
        E, H, I, k = MODELS[model]
        for T in tokens:
            torch.manual_seed(0)
            x = torch.randn(T, H, device=DEV).to(DT)
            w1 = (torch.randn(E, 2 * I, H, device=DEV) / math.sqrt(H)).to(DT)
            w2 = (torch.randn(E, H, I, device=DEV) / math.sqrt(I)).to(DT)
            weights, ids = M.topk_softmax(torch.randn(T, E, device=DEV), k, True)
            t_bf16 = timed(lambda: M.fused_moe(x, w1, w2, weights, ids, hw=ARGS.hw))
            print(f"{model} T={T} bf16 fused_moe {t_bf16:.1f} us", flush=True)
            for block in (True, False):
                q1, s1 = quantize(w1, block)
                q2, s2 = quantize(w2, block)
                shape = [128, 128] if block else None
                kw = dict(w1_scale=s1, w2_scale=s2, block_shape=shape)
                policy = M.fused_moe_fp8(x, q1, q2, weights, ids, hw=ARGS.hw, **kw).float()
                scaling = "block" if block else "tensor"
                for name, record in records.items():
                    try:
                        v = tune.fp8_variant(record)
                        fn = lambda: M._MOE_FP8.fused_moe_fp8(x, q1, q2, weights, ids, variant=v, **kw)  # noqa: E731
                        diff = ((fn().float() - policy).norm() / policy.norm()).item()
                        if SMOKE and diff > 1e-3:  # the interpreter's arithmetic is the same for every tile
                            raise AssertionError(f"differs from the policy's result by {diff:.1e}")
                        t = timed(fn)
                        print(
                            f"{model} T={T} {scaling:6s} {name:28s} {t:9.1f} us  {t_bf16 / t:5.2f}x bf16"
                            f"  rel diff vs policy {diff:.1e}",
                            flush=True,
                        )
                    except Exception as e:  # noqa: BLE001
                        failed += 1
                        print(f"{model} T={T} {scaling:6s} {name:28s} FAILED {type(e).__name__}: {str(e)[:200]}")
            del w1, w2
            if not SMOKE:
                torch.cuda.empty_cache()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(quiet_on_closed_pipe(main))
