#!/usr/bin/env python3
"""Tile records for scaled_mm against torch._scaled_mm on one GPU: how specs/kernels/scaled_mm.toml's Hopper
`mid` / `mid_large` stages were chosen (issue 35).

    python3 bench/scaled_mm_tiles.py                     # on a GPU (~1 min)
    python3 bench/scaled_mm_tiles.py --cpu-smoke --hw h200   # every record once, small shapes, interpreter

Each record runs through policy_runtime/scaled_mm/tune.py's ``ScaledMmProblem`` (what ``codegen tune
scaled_mm`` times: the body and constants a generated wrapper would have, launched without the call cache,
so at small shapes its host time shows); printed: TFLOP/s (triton.testing.do_bench), the ratio to
torch._scaled_mm (outer scales) and the largest error against the fp64 reference over its largest value.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from smoke import smoke_setup  # noqa: E402


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu-smoke", action="store_true", help="small shapes in the interpreter, each record once")
    p.add_argument("--hw", default=None, help="hardware spec name (only checked: the records are explicit)")
    return p.parse_args()


ARGS = parse()
SMOKE = smoke_setup(ARGS)  # before torch and Triton are imported

import torch  # noqa: E402
import triton  # noqa: E402

from policy_runtime.scaled_mm.tune import ScaledMmProblem  # noqa: E402
from policy_runtime.report import quiet_on_closed_pipe  # noqa: E402


def rec(bm, bn, bk, warps, stages, group=8):
    return dict(block_m=bm, block_n=bn, block_k=bk, group_m=group, num_warps=warps, num_stages=stages)


OUTER = {
    "128x128x128 w8 s4 (mid)": rec(128, 128, 128, 8, 4),
    "128x256x128 w8 s4 (any)": rec(128, 256, 128, 8, 4),
    "128x128x128 w8 s5": rec(128, 128, 128, 8, 5),
    "128x128x128 w8 s3": rec(128, 128, 128, 8, 3),
    "128x128x128 w4 s4": rec(128, 128, 128, 4, 4),
    "128x128x128 w8 s4 g16": rec(128, 128, 128, 8, 4, 16),
    "128x128x128 w8 s4 g4": rec(128, 128, 128, 8, 4, 4),
    "128x256x64 w8 s4": rec(128, 256, 64, 8, 4),
    "128x128x64 w8 s6": rec(128, 128, 64, 8, 6),
    "64x256x128 w4 s4": rec(64, 256, 128, 4, 4),
    "256x128x128 w8 s3": rec(256, 128, 128, 8, 3),
}
BLOCK = {
    "64x128x128 w4 s3 (policy)": rec(64, 128, 128, 4, 3),
    "64x128x128 w4 s2": rec(64, 128, 128, 4, 2),
    "64x128x128 w4 s3 g16": rec(64, 128, 128, 4, 3, 16),
    "64x128x128 w4 s4": rec(64, 128, 128, 4, 4),
    "64x64x128 w4 s4": rec(64, 64, 128, 4, 4),
    "128x128x128 w8 s3": rec(128, 128, 128, 8, 3),
    "64x128x64 w4 s4": rec(64, 128, 64, 4, 4),
}
OUTER_SHAPES = [(2048, 7168, 2048), (1024, 7168, 2048), (2048, 4096, 4096), (512, 4096, 4096)]
BLOCK_SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (2048, 7168, 2048)]


def main() -> int:
    dev, dtype = ("cpu", torch.float16) if SMOKE else ("cuda", torch.bfloat16)
    outer, block = ([(70, 256, 256)], [(70, 256, 256)]) if SMOKE else (OUTER_SHAPES, BLOCK_SHAPES)
    failed = 0
    for scaling, shapes, records in (("tensor", outer, OUTER), ("rowwise", outer[:1], OUTER), ("block", block, BLOCK)):
        for m, n, k in shapes:
            p = ScaledMmProblem(dict(m=m, n=n, k=k), dtype, dev, scaling)
            lib = None if SMOKE else p.library()
            t_lib = triton.testing.do_bench(lib, warmup=25, rep=200) if lib else float("nan")
            print(f"{scaling} {m}x{n}x{k} _scaled_mm {p.flops / t_lib / 1e9:7.1f} TFLOP/s", flush=True)
            for name, record in records.items():
                try:
                    fn = p.kernel(record)
                    out = fn()
                    err = ((out.float() - p.reference).abs().max() / p.reference.abs().max()).item()
                    if err > 1e-2:
                        raise AssertionError(f"error {err:.1e} against the reference")
                    t = float("nan") if SMOKE else triton.testing.do_bench(fn, warmup=25, rep=200)
                    print(
                        f"{scaling} {m}x{n}x{k} {name:26s} {p.flops / t / 1e9:7.1f} TFLOP/s  {t_lib / t:5.3f}x lib"
                        f"  err {err:.1e}",
                        flush=True,
                    )
                except Exception as e:  # noqa: BLE001
                    failed += 1
                    print(f"{scaling} {m}x{n}x{k} {name:26s} FAILED {type(e).__name__}: {str(e)[:150]}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(quiet_on_closed_pipe(main))
