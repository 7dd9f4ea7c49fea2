#!/usr/bin/env python3
"""Ahead-of-time warm-up on one GPU: its wall time, and the first calls after it.

    python3 bench/warmup.py --hw h200 --repeats 3     # the H200 run (bench/RESULTS.md)
    python3 bench/warmup.py --cpu-smoke --hw h200     # every phase's wiring in Triton's interpreter

Each phase runs in a fresh process (this script with --phase): (a) warmup, an empty
TRITON_CACHE_DIR, ``generated.warmup`` over every kernel module, timed; (b) first-calls, (a)'s
cache, the first call of every bucket, instantiation and launch plan with other shapes, each
timed, compilations counted (zero asserted, exit 1 otherwise); (c) startup, the same after
``generated.warmup(load=True)``; (d) autotune, bench/matmul.py's first-call child on the same
shapes.  --repeats N repeats (a)-(c), --baseline-repeats N (d).  JSON to $OUT/warmup.json (or
--json).  --cpu-smoke: the interpreter compiles nothing, so (b) compares specialization keys
(policy_runtime.warmup.launch_key) instead, on tiny shapes.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

T_START = time.perf_counter()
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from policy_runtime.report import quiet_on_closed_pipe  # noqa: E402

SMOKE_FIRST_CALL = [((33, 64, 48), 31)]
# --cpu-smoke plans token counts up to 1,024, not 16,384: the exhaustive search over token counts takes
# most of a plan's time in the interpreter, and tests/test_warmup*.py check the default plan itself.
SMOKE_PLAN = {"max_tokens": 1024}


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hw", default=None, help="hardware spec name (default: detect the device)")
    p.add_argument("--dtypes", nargs="+", default=["bfloat16", "float16"])
    p.add_argument("--workers", type=int, default=None, help="warm-up processes (default: the CPUs usable)")
    p.add_argument("--repeats", type=int, default=1, help="runs of phases (a)-(c), each in a fresh process")
    p.add_argument("--baseline-repeats", type=int, default=1, help="runs of (d), each in fresh processes")
    p.add_argument("--cpu-smoke", action="store_true", help="Triton's interpreter, tiny shapes")
    p.add_argument("--json", default=None, help="JSON path (default $OUT/warmup.json)")
    p.add_argument("--phase", choices=["warmup", "first-calls", "startup"], help=argparse.SUPPRESS)
    return p.parse_args(argv)


ARGS = parse()
PLAN_OPTIONS = SMOKE_PLAN if ARGS.cpu_smoke else {}
if ARGS.cpu_smoke:
    os.environ["TRITON_INTERPRET"] = "1"


def first_call_shapes() -> list[tuple[tuple[int, int, int], int]]:
    """bench/matmul.py's FIRST_CALL (shape, a further new M), read from its source (importing it
    would parse this script's arguments)."""
    if ARGS.cpu_smoke:
        return SMOKE_FIRST_CALL
    tree = ast.parse((ROOT / "bench" / "matmul.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "FIRST_CALL" for t in node.targets):
            return [(tuple(s), m) for s, m in ast.literal_eval(node.value)]
    raise RuntimeError("bench/matmul.py defines no FIRST_CALL")


# ---------------------------------------------------------------------------------------
# The phases' processes


def _sync(torch) -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class Compilations:
    """Triton's compilations in this process from now on: new cache entries, the kernels its jit
    hook saw compiled or loaded, the listener's cache misses (where this Triton has a listener)."""

    def __init__(self, triton, cache_dir: str) -> None:
        self.cache_dir = cache_dir
        self.before = self._entries()
        self.loaded: list[str] = []
        self.misses: list[str] | None = None
        runtime = triton.knobs.runtime
        previous = runtime.jit_post_compile_hook

        def hook(*args, **kwargs):
            self.loaded.append(str(kwargs.get("repr", "?")).split("[")[0])
            return previous(*args, **kwargs) if previous is not None else None

        runtime.jit_post_compile_hook = hook
        compilation = getattr(triton.knobs, "compilation", None)
        if compilation is not None and hasattr(compilation, "listener"):
            self.misses = []

            def listener(*, src=None, metadata=None, cache_hit=True, **kwargs):
                if not cache_hit:
                    self.misses.append(str((metadata or {}).get("name", src)))

            compilation.listener = listener

    def _entries(self) -> set[str]:
        try:
            return set(os.listdir(self.cache_dir))
        except OSError:
            return set()

    def summary(self) -> dict:
        new = sorted(self._entries() - self.before)
        return {
            "new_cache_entries": new,
            "kernels_compiled_or_loaded": len(self.loaded),
            "listener_cache_misses": self.misses,
            "compiled": len(new) + len(self.misses or []),
        }


def _first_calls(torch, mm, hw, device, dtype) -> list[dict]:
    rows = []
    for (M, N, K), again in first_call_shapes():
        b = torch.randn(K, N, device=device).to(dtype)
        row = {"shape": [M, N, K], "bucket": mm.select(M, N, K, dtype=dtype, hw=hw).name}
        for label, m in (("first_s", M), ("again_new_m_s", again)):
            a = torch.randn(m, K, device=device).to(dtype)
            _sync(torch)
            t0 = time.perf_counter()
            mm.matmul_triton(a, b, hw=hw)
            _sync(torch)
            row[label] = time.perf_counter() - t0
        rows.append(row)
    return rows


def _bucket_calls(torch, W, modules, hw, dtypes, device) -> list[dict]:
    """The first real call of every bucket, instantiation and plan with other shapes, timed; in
    the interpreter, their launch keys against the warm-up's."""
    other = W.plan(modules, hw, dtypes=dtypes, pick="other", **PLAN_OPTIONS)
    if ARGS.cpu_smoke:
        warm = W.plan(modules, hw, dtypes=dtypes, **PLAN_OPTIONS).keys()
        return [
            {"call": c.describe(), "launches": len(launches), "keys_warmed": all(k in warm for _, k in launches)}
            for c, launches in zip(other.calls, other.launches)
        ]
    rows = []
    for call in other.calls:
        _sync(torch)
        t0 = time.perf_counter()
        try:
            W.driver(call.module).run(call, device)
            _sync(torch)
        except Exception as exc:  # reported; the other calls go on
            rows.append({"call": call.describe(), "error": f"{type(exc).__name__}: {exc}"[:1000]})
            continue
        rows.append({"call": call.describe(), "seconds": time.perf_counter() - t0})
    return rows


def phase_child() -> None:
    """One phase in this fresh process; prints one JSON line last."""
    import_t0 = time.perf_counter()
    import torch
    import triton

    import generated
    from generated import matmul as mm
    from policy_runtime.warmup import engine as W
    from policy_runtime.warmup import calls as warmup_calls

    result = {"imports_s": time.perf_counter() - import_t0}
    modules = [f"generated.{m}" for m in generated.KERNEL_MODULES]
    device = warmup_calls.device()
    dtype = torch.float16 if ARGS.cpu_smoke else torch.bfloat16
    if ARGS.phase == "warmup":
        t0 = time.perf_counter()
        report = generated.warmup(
            ARGS.hw, dtypes=ARGS.dtypes, workers=ARGS.workers, load=False, progress=True, **PLAN_OPTIONS
        )
        result.update(warmup_s=time.perf_counter() - t0, process_s=time.perf_counter() - T_START)
        result["report"] = {k: v for k, v in report.to_json().items() if k != "kernel_list"}
        result["kernels"] = [
            {k: e[k] for k in ("name", "module", "seconds", "error", "where", "compiled_now")}
            for e in report.to_json()["kernel_list"]
        ]
        print(report, file=sys.stderr)
    else:
        torch.matmul(torch.ones(8, 8, device=device), torch.ones(8, 8, device=device))  # CUDA context, cuBLAS
        _sync(torch)
        counts = Compilations(triton, W._cache_dir())
        if ARGS.phase == "startup":
            t0 = time.perf_counter()
            report = generated.warmup(ARGS.hw, dtypes=ARGS.dtypes, workers=0, load=True, **PLAN_OPTIONS)
            result["startup_warmup_s"] = time.perf_counter() - t0
            result["startup_kernels"] = len(report.kernels)
            result["startup_compiled_now"] = report.compiled_now
            result["startup_failed"] = len(report.failed)
        result["first_calls"] = _first_calls(torch, mm, ARGS.hw, device, dtype)
        result["bucket_calls"] = _bucket_calls(torch, W, modules, ARGS.hw, ARGS.dtypes, device)
        result["compilations"] = counts.summary()
    print(json.dumps(result))


def run_phase(phase: str, cache_dir: str) -> dict:
    cmd = [sys.executable, __file__, "--phase", phase, "--dtypes", *ARGS.dtypes]
    cmd += ["--hw", ARGS.hw] if ARGS.hw else []
    cmd += ["--workers", str(ARGS.workers)] if ARGS.workers is not None else []
    cmd += ["--cpu-smoke"] if ARGS.cpu_smoke else []
    env = dict(os.environ, TRITON_CACHE_DIR=cache_dir)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t0
    sys.stderr.write(proc.stderr[-4000:] if phase == "warmup" else "")
    if proc.returncode != 0:
        return {"error": proc.stderr[-4000:], "wall_s": wall}
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["wall_s"] = wall
    return out


def autotune_first_call(method: str, shape: tuple[int, int, int], again: int, warm: bool) -> dict:
    """bench/matmul.py's own first-call child, in a fresh process with an empty cache (``warm``:
    a process that has run some Triton kernel before)."""
    with tempfile.TemporaryDirectory() as cache:
        cmd = [sys.executable, str(ROOT / "bench" / "matmul.py"), "--first-call", method]
        cmd += ["--shape", "x".join(map(str, shape)), "--again-m", str(again)]
        cmd += ["--hw", ARGS.hw] if ARGS.hw else []
        cmd += ["--cpu-smoke"] if ARGS.cpu_smoke else []
        cmd += ["--warm-triton"] if warm else []
        proc = subprocess.run(cmd, env=dict(os.environ, TRITON_CACHE_DIR=cache), capture_output=True, text=True)
        if proc.returncode != 0:
            return {"error": proc.stderr[-2000:]}
        return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------
# The parent: phases, JSON, summary


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def main() -> int:
    if ARGS.phase:
        phase_child()
        return 0
    import torch
    import triton

    env = {
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "hw": ARGS.hw,
        "dtypes": ARGS.dtypes,
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
    }
    print(json.dumps(env), flush=True)
    result: dict = {"env": env, "warmup": [], "first_calls": [], "startup": [], "autotune": [], "errors": []}
    failed = False
    with tempfile.TemporaryDirectory() as keep:
        for rep in range(ARGS.repeats):
            cache = os.path.join(keep, f"cache{rep}")
            os.makedirs(cache)
            a = run_phase("warmup", cache)
            result["warmup"].append(a)
            if "error" in a:
                result["errors"].append(f"warmup: {a['error']}")
                failed = True
                break
            r = a["report"]
            print(
                f"(a) warm-up {rep + 1}: {r['kernels']} kernels ({r['compiled_now']} compiled, {r['failed']} failed) "
                f"in {a['warmup_s']:.1f} s with {r['workers']} workers (process {a['process_s']:.1f} s, imports "
                f"{a['imports_s']:.1f} s; compile time summed {r['compile_s']:.1f} s); cache {r['new_cache_entries']} "
                f"new entries",
                flush=True,
            )
            failed |= r["failed"] > 0
        first_cache = os.path.join(keep, "cache0")
        for rep in range(ARGS.repeats if not failed else 0):
            for phase, key in (("first-calls", "first_calls"), ("startup", "startup")):
                b = run_phase(phase, first_cache)
                result[key].append(b)
                if "error" in b:
                    result["errors"].append(f"{phase}: {b['error']}")
                    failed = True
                    continue
                c = b["compilations"]
                if ARGS.cpu_smoke:
                    cold = [x["call"] for x in b["bucket_calls"] if not x["keys_warmed"]]
                else:
                    cold = []
                broken = [f"{x['call']}: {x['error']}" for x in b["bucket_calls"] if "error" in x]
                result["errors"] += [f"{phase}: {e}" for e in broken]
                failed |= bool(broken)
                if phase == "first-calls":
                    label = f"(b) run {rep + 1}, a fresh process"
                else:
                    label = f"(c) run {rep + 1}, after generated.warmup(load=True) ({b['startup_warmup_s']:.2f} s, "
                    label += f"{b['startup_compiled_now']} compiled)"
                    failed |= bool(b["startup_compiled_now"]) or bool(b["startup_failed"])
                secs = [x["seconds"] for x in b["bucket_calls"] if "seconds" in x]
                first = b["first_calls"][0]
                print(
                    f"{label}: {c['compiled']} compilations ({len(c['new_cache_entries'])} new cache "
                    f"entries, {c['kernels_compiled_or_loaded']} kernels compiled or loaded); first matmul call "
                    f"{'x'.join(map(str, first['shape']))} {first['first_s'] * 1e3:.1f} ms; "
                    f"{len(b['bucket_calls'])} bucket calls"
                    + (f", median {_median(secs) * 1e3:.2f} ms, max {max(secs) * 1e3:.1f} ms" if secs else "")
                    + (f"; calls with unwarmed keys: {cold}" if cold else ""),
                    flush=True,
                )
                failed |= c["compiled"] > 0 or bool(cold)
    # (d) The baselines, from bench/matmul.py's own first-call children.  In (b) the first shape is
    # the process's first Triton call and the later ones come after it: the first is compared with
    # a cold process, the others with one that has run a Triton kernel (matmul.py's --warm-triton).
    for rep in range(ARGS.baseline_repeats):
        for i, (shape, again) in enumerate(first_call_shapes()):
            row = {"shape": list(shape), "again_m": again, "repeat": rep, "triton_initialised": i > 0}
            for method in ("autotune", "generated"):
                row[method] = autotune_first_call(method, shape, again, i > 0)
            result["autotune"].append(row)
    # Summary: first calls per shape after warm-up against autotune's and no warm-up's.
    summary = []
    for i, (shape, _) in enumerate(first_call_shapes()):
        after = _median(b["first_calls"][i]["first_s"] for b in result["first_calls"] if "first_calls" in b)
        started = _median(b["first_calls"][i]["first_s"] for b in result["startup"] if "first_calls" in b)
        rows = [r for r in result["autotune"] if r["shape"] == list(shape)]
        tune = _median(r["autotune"].get("first_s") for r in rows)
        cold = _median(r["generated"].get("first_s") for r in rows)
        entry = {"shape": list(shape), "triton_initialised": i > 0, "after_warmup_s": after}
        entry.update(after_startup_warmup_s=started, autotune_s=tune, no_warmup_s=cold)
        if after is not None and tune:
            entry["after_warmup_vs_autotune"] = after / tune
        if started is not None and tune:
            entry["after_startup_warmup_vs_autotune"] = started / tune
        summary.append(entry)
        fmt = lambda s: f"{s * 1e3:.1f} ms" if s is not None else "-"  # noqa: E731
        state = "Triton initialised" if i > 0 else "the process's first Triton call"
        print(
            f"first call {'x'.join(map(str, shape))} ({state}): after warm-up (fresh process) {fmt(after)}"
            + (f" = {entry['after_warmup_vs_autotune']:.3f}x autotune" if "after_warmup_vs_autotune" in entry else "")
            + f"; after a startup warm-up {fmt(started)}"
            + (
                f" = {entry['after_startup_warmup_vs_autotune']:.4f}x"
                if "after_startup_warmup_vs_autotune" in entry
                else ""
            )
            + f"; autotune {fmt(tune)}; no warm-up {fmt(cold)}",
            flush=True,
        )
    result["summary"] = summary
    walls = [a["warmup_s"] for a in result["warmup"] if "warmup_s" in a]
    if walls:
        print(f"warm-up wall time over {len(walls)} runs: min {min(walls):.1f} s, median {_median(walls):.1f} s")
    path = ARGS.json or (os.path.join(os.environ["OUT"], "warmup.json") if os.environ.get("OUT") else None)
    if path:
        Path(path).write_text(json.dumps(result, indent=1))
    for e in result["errors"]:
        print(f"ERROR {e[-2000:]}", file=sys.stderr)
    print("zero compilations after warm-up: " + ("NO" if failed else "yes"), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(quiet_on_closed_pipe(main))
