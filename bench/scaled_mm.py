#!/usr/bin/env python3
"""Benchmark generated/scaled_mm.py (FP8 e4m3 matmul with scales) on one GPU.

    python3 bench/scaled_mm.py                # the GPU run (about a minute on the H200)
    python3 bench/scaled_mm.py --cpu-smoke    # tiny shapes in Triton's interpreter (no GPU)

Per shape (M, N, K), A e4m3 row-major, B the transpose of a row-major (N, K) weight, bf16 output:
ours and torch._scaled_mm with one scale per tensor and with rowwise scales, ours with 1x128 /
128x128 block scales, and our bf16 matmul_triton on the same shape; each checked against fp32 on
the dequantized inputs (< 1e-2, else exit 1), then timed (policy_runtime/timing.py) in --rounds
interleaved rounds.  Summary: geomeans against torch._scaled_mm over every shape and against our
bf16 matmul over the compute-bound ones.  Writes $OUT/scaled_mm.json when OUT is set.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# (M, N, K): large, compute-bound ones first, then mid-sized ones.
SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (16384, 4096, 4096), (2048, 7168, 2048), (512, 4096, 4096)]
COMPUTE_BOUND = [(4096, 4096, 4096), (8192, 8192, 8192), (16384, 4096, 4096)]
SMOKE_SHAPES = [(40, 256, 256), (1, 128, 384)]


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu-smoke", action="store_true", help="tiny shapes in the interpreter (fp16 output)")
    p.add_argument("--hw", default=None, help="hardware spec name (default: detect the device)")
    p.add_argument("--rounds", type=int, default=6, help="interleaved rounds per shape")
    p.add_argument("--reps", type=int, default=30, help="timed runs per method and round")
    return p.parse_args()


ARGS = parse()
if ARGS.cpu_smoke:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from generated import matmul as mm  # noqa: E402
from generated import scaled_mm as smm  # noqa: E402
from generated.dispatch import target_name  # noqa: E402
from policy_runtime.timing import cpu_ms, environment, gpu_ms, median_ratio, per_round, rel_err  # noqa: E402
from policy_runtime.report import quiet_on_closed_pipe  # noqa: E402

DEVICE = "cpu" if ARGS.cpu_smoke else "cuda"
OUT_DTYPE = torch.float16 if ARGS.cpu_smoke else torch.bfloat16  # the interpreter's bf16 is wrong
FP8 = torch.float8_e4m3fn


def problem(M: int, N: int, K: int) -> dict:
    g = torch.Generator(device=DEVICE).manual_seed(M * 31 + N * 7 + K)
    x = torch.randn(M, K, device=DEVICE, generator=g)
    w = torch.randn(N, K, device=DEVICE, generator=g)
    a, wq = x.to(FP8), w.to(FP8)
    b = wq.t()  # (K, N), column-major
    kb, nb = K // 128, N // 128
    scales = {
        "tensor": (torch.tensor(0.75, device=DEVICE), torch.tensor(1.25, device=DEVICE)),
        "rowwise": (
            torch.rand(M, 1, device=DEVICE, generator=g) + 0.5,
            torch.rand(1, N, device=DEVICE, generator=g) + 0.5,
        ),
        "block": (
            torch.rand(M, kb, device=DEVICE, generator=g) + 0.5,
            torch.rand(kb, nb, device=DEVICE, generator=g) + 0.5,
        ),
    }
    return {"a": a, "b": b, "scales": scales, "a16": x.to(torch.bfloat16 if DEVICE == "cuda" else torch.float16),
            "b16": w.to(torch.bfloat16 if DEVICE == "cuda" else torch.float16).t()}  # fmt: skip


def reference(p: dict, scaling: str) -> torch.Tensor:
    """fp32 on the dequantized inputs (TF32 off)."""
    sa, sb = p["scales"][scaling]
    if scaling == "block":
        sa = sa.repeat_interleave(128, 1)
        sb = sb.repeat_interleave(128, 0).repeat_interleave(128, 1)
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        return (p["a"].float() * sa) @ (p["b"].float() * sb)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def methods(p: dict, hw: str) -> dict:
    a, b = p["a"], p["b"]
    out = {}
    for scaling in ("tensor", "rowwise", "block"):
        sa, sb = p["scales"][scaling]
        out[f"ours {scaling}"] = (lambda sa=sa, sb=sb: smm.scaled_mm(a, b, sa, sb, out_dtype=OUT_DTYPE, hw=hw), scaling)
        if scaling != "block":
            ta, tb = (sa, sb)
            out[f"_scaled_mm {scaling}"] = (
                lambda ta=ta, tb=tb: torch._scaled_mm(a, b, scale_a=ta, scale_b=tb, out_dtype=OUT_DTYPE),
                scaling,
            )
    out["bf16 matmul"] = (lambda: mm.matmul_triton(p["a16"], p["b16"], hw=hw), None)
    return out


def main() -> int:
    hw = target_name(ARGS.hw)
    shapes = SMOKE_SHAPES if ARGS.cpu_smoke else SHAPES
    timer = cpu_ms if ARGS.cpu_smoke else (lambda fn: gpu_ms(fn, reps=ARGS.reps))
    rounds = 2 if ARGS.cpu_smoke else ARGS.rounds
    print(f"target {hw}; {environment()}")
    rows, errors = [], []
    for shape in shapes:
        M, N, K = shape
        p = problem(M, N, K)
        ms = methods(p, hw)
        # Correctness first, each into a NaN-filled output where the method takes one.
        refs = {s: reference(p, s) for s in ("tensor", "rowwise", "block")}
        ref16 = p["a16"].float() @ p["b16"].float()
        errs = {}
        for name, (fn, scaling) in ms.items():
            got = fn()
            err = rel_err(got, refs[scaling] if scaling else ref16)
            errs[name] = err
            if not math.isfinite(err) or err >= 1e-2:
                errors.append(f"{shape} {name}: relative error {err:.3g}")
        times = per_round({n: fn for n, (fn, _) in ms.items()}, rounds, timer)
        med = {n: sorted(t)[len(t) // 2] for n, t in times.items()}
        flop = 2 * M * N * K
        row = {
            "shape": shape,
            "ms": med,
            "tflops": {n: flop / (t * 1e-3) / 1e12 for n, t in med.items()},
            "errors": errs,
            "buckets": smm.select(M, N, K, hw=hw).name,
            "vs_scaled_mm": {
                s: median_ratio(times[f"_scaled_mm {s}"], times[f"ours {s}"]) for s in ("tensor", "rowwise")
            },
            "vs_bf16": {
                s: median_ratio(times["bf16 matmul"], times[f"ours {s}"]) for s in ("tensor", "rowwise", "block")
            },
        }
        rows.append(row)
        print(
            f"| {shape} | {row['buckets']} | "
            + " | ".join(f"{n} {row['tflops'][n]:.1f}" for n in med)
            + f" | vs _scaled_mm tensor {row['vs_scaled_mm']['tensor']:.3f} rowwise {row['vs_scaled_mm']['rowwise']:.3f}"
            + f" | vs bf16 tensor {row['vs_bf16']['tensor']:.2f} rowwise {row['vs_bf16']['rowwise']:.2f}"
            + f" block {row['vs_bf16']['block']:.2f} | max err {max(errs.values()):.2e} |"
        )

    def geomean(values: list[float]) -> float:
        return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")

    bound = [r for r in rows if tuple(r["shape"]) in COMPUTE_BOUND] or rows  # smoke: all of them
    summary = {
        "vs_scaled_mm_all": {s: geomean([r["vs_scaled_mm"][s] for r in rows]) for s in ("tensor", "rowwise")},
        "vs_bf16_compute_bound": {s: geomean([r["vs_bf16"][s] for r in bound]) for s in ("tensor", "rowwise", "block")},
    }
    print(
        "geomean vs torch._scaled_mm (all shapes): "
        + ", ".join(f"{s} {v:.3f}x" for s, v in summary["vs_scaled_mm_all"].items())
    )
    print(
        "geomean vs our bf16 matmul (compute-bound shapes): "
        + ", ".join(f"{s} {v:.2f}x" for s, v in summary["vs_bf16_compute_bound"].items())
    )
    for e in errors:
        print("ERROR", e)
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "target": hw,
        "environment": environment(),
        "rounds": rounds,
        "reps": ARGS.reps,
        "rows": rows,
        "summary": summary,
        "errors": errors,
    }
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "scaled_mm.json").write_text(json.dumps(result, indent=1, default=str))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(quiet_on_closed_pipe(main))
