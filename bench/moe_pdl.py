#!/usr/bin/env python3
"""The MoE entry points with their launches as one chain of programmatic dependent launches (PDL:
Hopper and later, what the calls do there) or as plain launches, A/B in one process.

    python3 bench/moe_pdl.py                  # on an NVIDIA GPU of compute capability 9.0 or later
    python3 bench/moe_pdl.py --layers fp8 --models qwen3_30b --tokens 1 4

Layers: ``fp8`` fused_moe_fp8 (per-tensor dynamic and 128-block scales, random e4m3 weights: the
kernels' time does not depend on the values), ``bf16`` fused_moe, ``align`` moe_align_block_size
(block 16); bf16 hidden states, target h200's policy.  Each case runs 3 rounds of both modes in
turn (bench/pdl_ab.py: each mode clears the call caches, both must give the same bytes, each is
timed eager and replayed from a CUDA graph); medians of the rounds, in µs.  fused_moe's grouped
buckets whose down GEMM adds rows by fp32 atomics (fuse_sum) are compared within a rounding.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

# name: (experts, hidden H, intermediate I, top-k), as bench/moe_fp8.py's
MODELS = {"mixtral": (8, 4096, 14336, 2), "qwen3_30b": (128, 2048, 768, 8), "dsv3": (64, 7168, 2048, 8)}
TOKENS = [1, 2, 4, 16, 256, 4096]


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", nargs="+", default=["fp8", "bf16", "align"], choices=["fp8", "bf16", "align"])
    p.add_argument("--models", nargs="+", default=["qwen3_30b", "mixtral", "dsv3"], choices=sorted(MODELS))
    p.add_argument("--tokens", type=int, nargs="+", default=TOKENS)
    p.add_argument("--rounds", type=int, default=3)
    return p.parse_args()


ARGS = parse()
if not torch.cuda.is_available() or torch.version.hip is not None or torch.cuda.get_device_capability()[0] < 9:
    print("moe_pdl.py needs an NVIDIA GPU of compute capability 9.0 or later (programmatic dependent launch)",
          file=sys.stderr)  # fmt: skip
    sys.exit(2)

from bench.pdl_ab import ab  # noqa: E402
from generated import moe as M  # noqa: E402
from policy_runtime.report import quiet_on_closed_pipe  # noqa: E402

FP8 = torch.float8_e4m3fn


def weights(E: int, H: int, I: int, layer: str) -> dict:
    g = torch.Generator(device="cuda").manual_seed(E + H + I)
    if layer == "bf16":
        return {"w1": torch.randn(E, 2 * I, H, device="cuda", generator=g).div_(H**0.5).to(torch.bfloat16),
                "w2": torch.randn(E, H, I, device="cuda", generator=g).div_(I**0.5).to(torch.bfloat16)}  # fmt: skip
    if layer == "align":
        return {}
    w1 = (torch.randn(E, 2 * I, H, device="cuda", generator=g) * 16).to(FP8)
    w2 = (torch.randn(E, H, I, device="cuda", generator=g) * 16).to(FP8)
    scale = 1 / (16 * H**0.5)
    return {
        "w1": w1, "w2": w2,
        "tensor": (torch.full((E,), scale, device="cuda"), torch.full((E,), scale, device="cuda"), None),
        "block": (torch.full((E, 2 * I // 128, H // 128), scale, device="cuda"),
                  torch.full((E, H // 128, I // 128), scale, device="cuda"), [128, 128]),
    }  # fmt: skip


def case(model: str, w: dict, T: int, layer: str, scaling: str) -> None:
    E, H, I, k = MODELS[model]
    x = torch.randn(T, H, device="cuda").to(torch.bfloat16)
    logits = torch.randn(T, E, device="cuda")
    topk_w, topk_ids = torch.topk(torch.softmax(logits, -1), k, dim=-1)
    topk_ids = topk_ids.to(torch.int32)
    out = torch.empty_like(x)
    exact = True
    if layer == "fp8":
        s1, s2, block = w[scaling]

        def fn():
            M.fused_moe_fp8(x, w["w1"], w["w2"], topk_w, topk_ids, w1_scale=s1, w2_scale=s2, block_shape=block,
                            out=out, hw="h200")  # fmt: skip

        bucket = M.select(T, I, dtype=FP8, hw="h200")
    elif layer == "bf16":

        def fn():
            M.fused_moe(x, w["w1"], w["w2"], topk_w, topk_ids, out=out, hw="h200")

        bucket = M.select(T, I, dtype=torch.bfloat16, hw="h200")
        exact = not bucket.variant.fuse_sum
    else:
        out = torch.empty(T * k + E * 15, dtype=torch.int32, device="cuda")

        def fn():
            sorted_ids, _, _ = M.moe_align_block_size(topk_ids, 16, E)
            out.copy_(sorted_ids)

        bucket = None
    med, same = ab(fn, out, rounds=ARGS.rounds, reps=40, exact=exact)
    what = f"{layer} {scaling} ({bucket.name})" if bucket else "align"
    print(f"{model} T={T} {what}: off eager {med['off'][0]:8.1f} graph {med['off'][1]:8.1f} | "
          f"pdl eager {med['pdl'][0]:8.1f} graph {med['pdl'][1]:8.1f} | off/pdl {med['off'][0] / med['pdl'][0]:.3f} "
          f"{med['off'][1] / med['pdl'][1]:.3f} | same {same}", flush=True)  # fmt: skip
    if not same:
        raise SystemExit(f"{model} T={T} {what}: the chained call's output differs from the plain one's")


def main() -> int:
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {__import__('triton').__version__}")
    for layer in ARGS.layers:
        for model in ARGS.models:
            w = weights(*MODELS[model][:3], layer)
            for T in ARGS.tokens:
                for scaling in ("tensor", "block") if layer == "fp8" else ("",):
                    case(model, w, T, layer, scaling)
            del w
            torch.cuda.empty_cache()
    return 0


sys.exit(quiet_on_closed_pipe(main))
