#!/usr/bin/env python3
"""Benchmark generated/matmul.py against torch.matmul (cuBLAS) and triton.autotune, on one GPU.

    python3 bench/matmul.py                 # the H200 run recorded in bench/RESULTS.md
    python3 bench/matmul.py --cpu-smoke     # tiny fp16 shapes in Triton's interpreter (no GPU)
    python3 bench/matmul.py --first-call-only --repeats 3   # only the first-call latencies, 3 times

Per shape (bf16): (a) matmul as dispatched, (b) matmul_triton (the bucket's kernel), (c)
torch.matmul, (d) triton.autotune over the target's bucket configs (as the seed does), and
torch.matmul against itself as the control; each checked into a NaN-filled output (relative
error < 1e-2, else exit 1), then timed as GPU time (bench_ms) in interleaved rounds, ratios
against torch.matmul in the same round.  Then, in fresh processes with an empty Triton cache,
the first call of a new shape and of a new M; host time per call at M = 1 and at a decode
shape; "triton_in_graphs" buckets also as CUDA-graph replays.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHAPES = [
    (5120, 11008, 2048),
    (5120, 2048, 11008),
    (5120, 2048, 2048),
    (5120, 512, 2048),
    (8192, 8192, 8192),
    (16, 11008, 2048),
    (1, 4096, 4096),
    (128, 4096, 4096),
]
SMOKE_SHAPES = [(33, 70, 48), (1, 40, 64), (8, 96, 32)]
# First-call latency: (shape, a further new M in the same bucket).
FIRST_CALL = [((16, 11008, 2048), 13), ((8192, 8192, 8192), 8200), ((5120, 11008, 2048), 5000)]


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu-smoke", action="store_true", help="tiny fp16 shapes in the interpreter")
    p.add_argument("--hw", default=None, help="hardware spec name (default: detect the device)")
    p.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="interleaved rounds per shape (default 10: each of 5 methods twice in each place; 2 with"
        " --cpu-smoke: a forward and a reversed round)",
    )
    p.add_argument("--overhead-calls", type=int, default=3000)
    p.add_argument(
        "--first-call-only",
        action="store_true",
        help="measure only the first-call latencies (fresh processes), --repeats times",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="first-call measurements per shape and Triton state; the order of generated and autotune"
        " alternates between repeats (default 1; 0: none)",
    )
    p.add_argument("--first-call", choices=["generated", "autotune"], help=argparse.SUPPRESS)
    p.add_argument("--shape", default=None, help=argparse.SUPPRESS)
    p.add_argument("--again-m", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--warm-triton", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rounds is None:
        args.rounds = 2 if args.cpu_smoke else 10
    if args.rounds < 1 or args.repeats < 0:
        p.error("--rounds must be at least 1 and --repeats at least 0")
    return args


ARGS = parse()
if ARGS.cpu_smoke:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from bench.timing import captured, cpu_ms, gpu_ms, interleaved, rel_err  # noqa: E402
from generated import matmul as mm  # noqa: E402
from generated.dispatch import target_name  # noqa: E402
from policy_runtime.matmul.ops import grouped_body as _grouped  # noqa: E402  (the kernel body the generated kernels share)
from policy_runtime.report import quiet_on_closed_pipe  # noqa: E402

DEVICE = "cpu" if ARGS.cpu_smoke else "cuda"
DTYPE = torch.float16 if ARGS.cpu_smoke else torch.bfloat16


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


# ---------------------------------------------------------------------------------------
# (d) the autotune baseline


def candidate_configs(hw: str | None) -> list[tuple]:
    """The target's distinct bucket configs: (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, warps, stages)."""
    seen = []
    for bucket in mm.buckets(hw, DTYPE, torch.device(DEVICE)):
        v = bucket.triton
        key = (v.block_m, v.block_n, v.block_k, v.group_m, v.num_warps, v.num_stages)
        if key not in seen:
            seen.append(key)
    return seen


def make_autotuned(configs: list[tuple]):
    @triton.autotune(
        configs=[
            triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": g}, num_warps=w, num_stages=s)
            for bm, bn, bk, g, w, s in configs
        ],
        key=["M", "N", "K"],
    )
    @triton.heuristics({"EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0})
    @triton.jit(do_not_specialize=["M"])  # as the generated kernels: a new M re-tunes, not recompiles
    def autotuned(
        a,
        b,
        c,
        M,
        N,
        K,
        sam,
        sak,
        sbk,
        sbn,
        scm,
        scn,
        EVEN_K: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        GROUP_M: tl.constexpr,
    ):
        _grouped(
            a, b, c, c, c, M, N, K, sam, sak, sbk, sbn, scm, scn, EVEN_K, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, 1, "tf32"
        )

    def run(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        M, K = a.shape
        N = b.shape[1]
        c = out if out is not None else torch.empty((M, N), dtype=a.dtype, device=a.device)

        def grid(meta):
            return (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]), 1)

        autotuned[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))
        return c

    return run


# ---------------------------------------------------------------------------------------
# Measurements


def bench_ms(fn) -> float:
    """GPU milliseconds (bench/timing.py: L2 flushed, launch time off the clock); one timed call
    in the CPU smoke mode."""
    return cpu_ms(fn) if ARGS.cpu_smoke else gpu_ms(fn)


def measure_in_graphs(a, b, ref, hw) -> dict:
    """For a triton_in_graphs bucket: matmul and torch.matmul captured into CUDA graphs (where
    matmul runs its Triton kernel), checked, then replays timed against each other."""
    M, N = a.shape[0], b.shape[1]
    outs = {name: torch.full((M, N), float("nan"), device=a.device, dtype=a.dtype) for name in ("matmul", "torch")}
    graphs = {
        # For a triton_in_graphs bucket the side-stream warm-up runs cuBLAS (an eager call); the
        # Triton kernel is already compiled by then (column (b)), its graph buffers made in the capture.
        "matmul": captured(lambda: mm.matmul(a, b, out=outs["matmul"], hw=hw))[0],
        "torch": captured(lambda: torch.matmul(a, b, out=outs["torch"]))[0],
    }
    errors = {}
    for name, graph in graphs.items():
        outs[name].fill_(float("nan"))
        errors[name] = check_into_nan(lambda out, g=graph: g.replay(), (M, N), ref, outs[name])
    timed = interleaved({name: graph.replay for name, graph in graphs.items()}, ARGS.rounds, "torch", bench_ms)
    return {"rel_err": errors, "ms": {k: t["ms"] for k, t in timed.items()}, "ratio": timed["matmul"]["ratio"]}


# Relative error a method may have against the float32 reference (bf16 inputs: ~1.7e-3 measured).
MAX_REL_ERR = 1e-2


def check_into_nan(fn, shape, ref, out=None) -> float:
    """Relative error of fn(out) written into a NaN-filled out (a new one, or ``out`` already
    filled); a wrong or partly unwritten result ends the benchmark (exit 1) instead of being timed."""
    if out is None:
        out = torch.full(shape, float("nan"), device=DEVICE, dtype=DTYPE)
    fn(out)
    sync()
    err = rel_err(out, ref)
    if not err < MAX_REL_ERR:  # NaN fails too
        raise SystemExit(f"matmul bench: wrong result at {shape}: relative error {err} (limit {MAX_REL_ERR})")
    return err


def measure_shapes(shapes, hw, autotune_run) -> list[dict]:
    rows = []
    for M, N, K in shapes:
        a = torch.randn(M, K, device=DEVICE, dtype=torch.float32).to(DTYPE)
        b = torch.randn(K, N, device=DEVICE, dtype=torch.float32).to(DTYPE)
        ref = a.float() @ b.float()
        bucket = mm.select(M, N, K, dtype=DTYPE, hw=hw, device=a.device)
        # Each method given an out, or None to allocate its own (as the timed calls do).
        checks = {
            "matmul": lambda out: mm.matmul(a, b, out=out, hw=hw),
            "triton": lambda out: mm.matmul_triton(a, b, out=out, hw=hw),
            "torch": lambda out: torch.matmul(a, b, out=out),
            "autotune": lambda out: autotune_run(a, b, out),
        }
        # Correctness first (and compile/tune outside the timing), each into a NaN-filled out: a
        # fresh torch.empty could reuse the previous method's block, right values included.
        errors = {name: check_into_nan(fn, (M, N), ref) for name, fn in checks.items()}
        sync()
        methods = {name: (lambda fn=fn: fn(None)) for name, fn in checks.items()}
        # cuBLAS timed against itself: the spread of this column is the measurement's noise.
        methods["torch (control)"] = methods["torch"]
        timed = interleaved(methods, ARGS.rounds, "torch", bench_ms)
        flops = 2.0 * M * N * K
        row = {
            "shape": [M, N, K],
            "bucket": bucket.name,
            "backend": "library" if bucket.library else ("triton in graphs" if bucket.eager_library else "triton"),
            "kernel": bucket.triton.name,
            "rel_err": errors,
            "ms": {k: t["ms"] for k, t in timed.items()},
            "tflops": {k: flops / t["ms"] / 1e9 for k, t in timed.items()},
            "ratio_vs_torch": {k: t["ratio"] for k, t in timed.items() if k != "torch"},
        }
        rows.append(row)
        r = row["ratio_vs_torch"]
        print(
            f"{M}x{N}x{K:<6} bucket {bucket.name:<12} torch {row['tflops']['torch']:7.1f} TF/s | "
            f"matmul {r['matmul']:.3f}x  triton {r['triton']:.3f}x  autotune {r['autotune']:.3f}x  "
            f"(cuBLAS vs itself {r['torch (control)']:.3f}x) | err {max(errors.values()):.1e}",
            flush=True,
        )
        if bucket.eager_library and DEVICE == "cuda":  # the interpreter has no CUDA graphs
            row["in_graphs"] = g = measure_in_graphs(a, b, ref, hw)
            print(
                f"{M}x{N}x{K:<6} in CUDA graphs: matmul (Triton) {g['ratio']:.3f}x torch.matmul "
                f"({g['ms']['matmul'] * 1e3:.1f} vs {g['ms']['torch'] * 1e3:.1f} us) | "
                f"err {max(g['rel_err'].values()):.1e}",
                flush=True,
            )
    return rows


def host_overhead(hw, M: int, N: int, K: int) -> dict:
    """Microseconds per call of back-to-back calls, no graphs: host cost where the GPU work is
    shorter than the launch, and the eager loop's real per-call time either way."""
    if ARGS.cpu_smoke:
        M, N, K = min(M, 4), 64, 64
    a = torch.randn(M, K, device=DEVICE, dtype=torch.float32).to(DTYPE)
    b = torch.randn(K, N, device=DEVICE, dtype=torch.float32).to(DTYPE)
    # The interpreter's calls take milliseconds: a few show the loop's wiring, not a host cost.
    warm, n = (2, 3) if ARGS.cpu_smoke else (20, ARGS.overhead_calls)
    out = {}
    for name, fn in [
        ("torch.matmul", lambda: torch.matmul(a, b)),
        ("matmul", lambda: mm.matmul(a, b, hw=hw)),
        ("matmul_triton", lambda: mm.matmul_triton(a, b, hw=hw)),
        ("torch.matmul (again)", lambda: torch.matmul(a, b)),
    ]:
        for _ in range(warm):
            fn()
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        out[name] = (time.perf_counter() - t0) / n * 1e6
    return out


def first_call_child() -> None:
    """Runs in a fresh process with an empty TRITON_CACHE_DIR; prints one JSON line."""
    M, N, K = map(int, ARGS.shape.split("x"))
    a = torch.randn(M, K, device=DEVICE, dtype=torch.float32).to(DTYPE)
    b = torch.randn(K, N, device=DEVICE, dtype=torch.float32).to(DTYPE)
    a2 = torch.randn(ARGS.again_m, K, device=DEVICE, dtype=torch.float32).to(DTYPE)
    if ARGS.first_call == "generated":

        def fn(x):
            return mm.matmul_triton(x, b, hw=ARGS.hw)

    else:
        configs = candidate_configs(ARGS.hw)
        run = make_autotuned(configs[:1] if ARGS.cpu_smoke else configs)

        def fn(x):
            return run(x, b)

    torch.matmul(a, b)  # CUDA context, cuBLAS handle: not part of the first call
    if ARGS.warm_triton:
        # A process that has already run some Triton kernel: driver and runtime initialised.
        from generated.transform import silu_and_mul

        silu_and_mul(torch.randn(2, 64, device=DEVICE, dtype=DTYPE), hw=ARGS.hw)
    sync()
    t0 = time.perf_counter()
    fn(a)
    sync()
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    fn(a2)
    sync()
    again = time.perf_counter() - t0
    print(json.dumps({"first_s": first, "again_new_m_s": again}))


def first_call_latency(hw) -> list[dict]:
    # --repeats times over every case; the order of the two methods alternates between repeats, so
    # neither always runs first on a freshly started machine.
    rows = []
    cases = [((33, 70, 48), 31)] if ARGS.cpu_smoke else FIRST_CALL
    for rep in range(ARGS.repeats):
        methods = ("generated", "autotune") if rep % 2 == 0 else ("autotune", "generated")
        for (M, N, K), again_m in cases:
            for warm in (False, True):
                row = {"shape": [M, N, K], "again_m": again_m, "triton_initialised": warm, "repeat": rep}
                for method in methods:
                    row[method] = first_call_process(hw, method, (M, N, K), again_m, warm)
                rows.append(row)
                g, t = row["generated"], row["autotune"]
                label = "Triton already initialised" if warm else "cold"
                label += f", repeat {rep + 1}" if ARGS.repeats > 1 else ""
                if "first_s" in g and "first_s" in t:
                    print(
                        f"first call {M}x{N}x{K} ({label}): generated {g['first_s']:.2f} s, autotune {t['first_s']:.2f} s "
                        f"({g['first_s'] / t['first_s']:.2f}x); new M={again_m}: generated "
                        f"{g['again_new_m_s'] * 1e3:.2f} ms, autotune {t['again_new_m_s'] * 1e3:.1f} ms",
                        flush=True,
                    )
                else:
                    print(f"first call {M}x{N}x{K} ({label}): {row}", flush=True)
    return rows


def first_call_process(hw, method: str, shape: tuple[int, int, int], again_m: int, warm: bool) -> dict:
    """One first-call measurement in a fresh process with an empty Triton cache."""
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TRITON_CACHE_DIR=cache)
        cmd = [sys.executable, __file__, "--first-call", method, "--shape", "x".join(map(str, shape))]
        cmd += ["--again-m", str(again_m)]
        cmd += ["--hw", hw] if hw else []
        cmd += ["--cpu-smoke"] if ARGS.cpu_smoke else []
        cmd += ["--warm-triton"] if warm else []
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            return {"error": proc.stderr[-2000:]}
        return json.loads(proc.stdout.strip().splitlines()[-1])


def first_call_summary(rows: list[dict]) -> list[dict]:
    """Per shape and Triton state: the ratios generated / autotune of every repeat, and their range."""
    summary: dict[tuple, dict] = {}
    for r in rows:
        g, t = r["generated"], r["autotune"]
        if "first_s" not in g or "first_s" not in t:
            continue
        key = (tuple(r["shape"]), r["triton_initialised"])
        entry = summary.setdefault(key, {"shape": r["shape"], "triton_initialised": key[1], "ratios": []})
        entry["ratios"].append(g["first_s"] / t["first_s"])
    for entry in summary.values():
        entry["min"], entry["max"] = min(entry["ratios"]), max(entry["ratios"])
        entry["median"] = statistics.median(entry["ratios"])
    return list(summary.values())


def geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values))


def main() -> None:
    if ARGS.first_call:
        first_call_child()
        return
    hw = ARGS.hw
    env = {
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name() if DEVICE == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "target": target_name(hw, torch.device(DEVICE)),
    }
    print(json.dumps(env), flush=True)
    if ARGS.first_call_only:
        first = first_call_latency(hw)
        spread = first_call_summary(first)
        for e in spread:
            state = "initialised" if e["triton_initialised"] else "cold"
            print(
                f"first call {'x'.join(map(str, e['shape']))} ({state}): generated / autotune over "
                f"{len(e['ratios'])} repeats: min {e['min']:.2f}x, median {e['median']:.2f}x, max {e['max']:.2f}x",
                flush=True,
            )
        if os.environ.get("OUT"):
            result = {"env": env, "first_call": first, "first_call_summary": spread}
            Path(os.environ["OUT"], "matmul_first_call.json").write_text(json.dumps(result, indent=1))
        return
    configs = candidate_configs(hw)
    print(f"autotune candidates ({len(configs)}): {configs}", flush=True)
    # The interpreter has no driver to benchmark with: the smoke run checks the wiring with one config.
    autotune_run = make_autotuned(configs[:1] if ARGS.cpu_smoke else configs)
    rows = measure_shapes(SMOKE_SHAPES if ARGS.cpu_smoke else SHAPES, hw, autotune_run)
    overhead = host_overhead(hw, 1, 4096, 4096)
    print("host us/call at (1, 4096, 4096): " + ", ".join(f"{k} {v:.1f}" for k, v in overhead.items()), flush=True)
    # A decode shape whose Triton kernel wins on GPU time (the h200 policy runs it only in CUDA
    # graphs): per-call time of an eager loop, dispatched and forced.
    decode_loop = host_overhead(hw, 16, 11008, 2048)
    print(
        "eager loop us/call at (16, 11008, 2048): " + ", ".join(f"{k} {v:.1f}" for k, v in decode_loop.items()),
        flush=True,
    )
    first = first_call_latency(hw)
    summary = {
        "geomean_matmul": geomean(r["ratio_vs_torch"]["matmul"] for r in rows),
        "geomean_triton": geomean(r["ratio_vs_torch"]["triton"] for r in rows),
        "geomean_autotune": geomean(r["ratio_vs_torch"]["autotune"] for r in rows),
        "min_matmul": min(r["ratio_vs_torch"]["matmul"] for r in rows),
        # cuBLAS against itself: how far from 1.0 a ratio moves with nothing changed.
        "control_min": min(r["ratio_vs_torch"]["torch (control)"] for r in rows),
        "control_max": max(r["ratio_vs_torch"]["torch (control)"] for r in rows),
        "host_overhead_ratio": overhead["matmul"] / min(overhead["torch.matmul"], overhead["torch.matmul (again)"]),
    }
    result = {
        "env": env,
        "shapes": rows,
        "host_overhead_us": overhead,
        "decode_eager_loop_us": decode_loop,
        "first_call": first,
        "first_call_summary": first_call_summary(first),
        "summary": summary,
    }
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "matmul.json").write_text(json.dumps(result, indent=1))

    print(
        "\n| shape (M, N, K) | bucket | cuBLAS TFLOP/s | matmul | matmul_triton | autotune | cuBLAS vs itself | max rel err |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        t, q = r["tflops"], r["ratio_vs_torch"]
        print(
            f"| {tuple(r['shape'])} | {r['bucket']} ({r['backend']}) | {t['torch']:.1f} | {t['matmul']:.1f} ({q['matmul']:.3f}x)"
            f" | {t['triton']:.1f} ({q['triton']:.3f}x) | {t['autotune']:.1f} ({q['autotune']:.3f}x)"
            f" | {q['torch (control)']:.3f}x | {max(r['rel_err'].values()):.1e} |"
        )
    print(
        f"\ngeomean vs torch.matmul: matmul {summary['geomean_matmul']:.3f}x (min {summary['min_matmul']:.3f}x), "
        f"matmul_triton {summary['geomean_triton']:.3f}x, autotune {summary['geomean_autotune']:.3f}x; "
        f"host overhead at M=1: {summary['host_overhead_ratio']:.2f}x torch.matmul; "
        f"cuBLAS against itself {summary['control_min']:.3f}-{summary['control_max']:.3f}x"
    )
    for r in rows:
        if "in_graphs" in r:
            print(f"in CUDA graphs, {tuple(r['shape'])}: matmul (Triton) {r['in_graphs']['ratio']:.3f}x torch.matmul")


if __name__ == "__main__":
    sys.exit(quiet_on_closed_pipe(main))
