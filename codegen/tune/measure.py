"""Stage 2 of ``codegen tune``: run one shard of a plan on the device at hand.

Per chunk (a bucket and up to ``chunk`` candidates), on each of the bucket's shapes, through the
family's harness: correctness first (two runs into a NaN-filled output; an error past the
spec's ``tolerance``, a NaN or an exception disqualifies, and the results file says why); then
GPU time (policy_runtime/timing.py) of every passing candidate, the incumbent twice and the
library in ``rounds`` interleaved rounds, per candidate the median of per-round ratios, the
spread the incumbent's largest deviation against its second copy.  Each finished chunk is one
JSON line appended (fsync'd) to the results file, so a killed run resumes; past the budget no
chunk starts.  Imports torch and the harness: only ``tune`` (never ``build``) reaches it.
"""

from __future__ import annotations

import importlib
import math
import os
import time
from typing import Any, Callable, Mapping

from .plan import Candidate, Chunk, Plan
from .results import ResultsFile


def load_harness(spec: str) -> Any:
    """The harness ``module:attribute`` names; where that is a family (``policy_runtime.<name>:FAMILY``),
    the family's ``tune``."""
    from policy_runtime.family import Family

    module, _, attr = spec.partition(":")
    try:
        found = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise RuntimeError(f"cannot load the tuning harness {spec!r}: {exc}") from None
    if isinstance(found, Family):
        if found.tune is None:
            raise RuntimeError(f"cannot load the tuning harness {spec!r}: the {found.name} family has no tune")
        found = found.tune()
    return found


def _gpu_timer(estimate: float) -> Callable[[Callable[[], object]], float]:
    from policy_runtime.timing import gpu_ms

    # About 25 ms of kernel time per timing: enough runs for a stable median at 20 us, few at 10 ms.
    reps = max(5, min(50, int(25.0 / max(estimate, 1e-3))))
    return lambda fn: gpu_ms(fn, reps=reps, warmup=2)


class Shard:
    """One worker's share of a plan (``plan.shard(i, n)``), measured into ``results``."""

    def __init__(self, plan: Plan, index: int, count: int, results: ResultsFile, budget_s: float):
        self.plan = plan
        self.index = index
        self.count = count
        self.results = results
        self.budget_s = budget_s
        self.harness = load_harness(plan.harness)
        self._problems: dict[tuple[int, ...], Any] = {}

    def pending(self) -> list[Chunk]:
        done = self.results.done()
        return [c for c in self.plan.shard(self.index, self.count) if c.index not in done]

    def run(self, progress: Callable[[Chunk, dict], None] | None = None) -> dict[str, Any]:
        """Measure every pending chunk until the budget is spent; a summary of what ran."""
        start = time.monotonic()
        pending = self.pending()
        ran = 0
        for chunk in pending:
            if time.monotonic() - start > self.budget_s:
                break
            line = self.measure(chunk)
            self.results.append(line)
            ran += 1
            if progress is not None:
                progress(chunk, line)
        return {"ran": ran, "left": len(pending) - ran, "seconds": time.monotonic() - start}

    # -- one chunk -------------------------------------------------------------------------

    def _problem(self, shape: tuple[int, ...]) -> Any:
        if shape not in self._problems:
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
            self._problems.clear()  # one shape's buffers at a time (8192^3 in bf16: 384 MiB)
            self._problems[shape] = self.harness.problem(
                dict(zip(self.plan.dims, shape)),
                getattr(torch, self.plan.dtype),
                device,
                dict(self.plan.params, target=self.plan.target),
            )
        return self._problems[shape]

    def _checked(self, problem: Any, cand: Candidate) -> tuple[Callable[[], Any] | None, str]:
        """A candidate's runner after two correct runs, or None and why it is disqualified.  The
        runner's output (a tensor the problem owns, NaN before the first run) is NaN-filled again
        between the runs, so the second must write every element too."""
        try:
            run = problem.kernel(dict(cand.record))
            errors = []
            for _ in range(2):
                out = run()
                errors.append(problem.error(out))
                out.fill_(float("nan"))
        except Exception as exc:  # noqa: BLE001 - a config that does not compile or launch is a result
            return None, f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        worst = max(errors, key=lambda e: (math.isnan(e), e))
        if math.isnan(worst) or worst > self.plan.tolerance:
            return None, f"relative error {worst:.3g} > tolerance {self.plan.tolerance:g}"
        return run, ""

    def measure(self, chunk: Chunk) -> dict[str, Any]:
        from policy_runtime.timing import cpu_ms, median_ratio, per_round

        import torch

        t0 = time.monotonic()
        bucket = self.plan.bucket(chunk.bucket)
        cands = [self.plan.candidate(k) for k in chunk.keys]
        shapes: dict[str, Any] = {}
        for shape in bucket.shapes:
            problem = self._problem(shape)
            entry: dict[str, Any] = {"candidates": {}}
            shapes[self.plan.shape_text(shape)] = entry
            inc_run, why = self._checked(problem, bucket.incumbent)
            if inc_run is None:
                entry["incumbent_failed"] = why
                continue
            methods: dict[str, Callable[[], object]] = {"incumbent": inc_run, "incumbent_again": inc_run}
            library = problem.library()
            if library is not None:
                methods["library"] = library
            for c in cands:
                run, why = self._checked(problem, c)
                if run is None:
                    entry["candidates"][c.key] = {"failed": why}
                else:
                    methods[c.key] = run
            timer = getattr(self.harness, "timer", None)
            if timer is None:
                if torch.cuda.is_available():
                    from policy_runtime.timing import gpu_ms

                    timer = _gpu_timer(gpu_ms(inc_run, reps=3, warmup=1))
                else:
                    timer = cpu_ms
            times = per_round(methods, self.plan.rounds, timer)
            inc = times["incumbent"]
            entry["incumbent_ms"] = _median(inc)
            entry["spread"] = max(abs(1.0 - a / b) for a, b in zip(inc, times["incumbent_again"]))
            if library is not None:
                entry["library_ms"] = _median(times["library"])
                entry["library_vs_incumbent"] = median_ratio(times["library"], inc)
            for c in cands:
                if c.key not in methods:
                    continue
                t = times[c.key]
                res = {"ms": _median(t), "vs_incumbent": median_ratio(inc, t)}
                if library is not None:
                    res["vs_library"] = median_ratio(times["library"], t)
                entry["candidates"][c.key] = res
        return {
            "kind": "chunk",
            "index": chunk.index,
            "bucket": chunk.bucket,
            "keys": list(chunk.keys),
            "shapes": shapes,
            "seconds": round(time.monotonic() - t0, 3),
            "pid": os.getpid(),
            "device_env": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
        }


def _median(xs: list[float]) -> float:
    import statistics

    return statistics.median(xs)


def shard_header(plan: Plan, index: int, count: int, command: str) -> Mapping[str, Any]:
    from policy_runtime.timing import environment

    return {
        "kind": "header",
        "fingerprint": plan.fingerprint,
        "config": plan.config,
        "target": plan.target,
        "shard": [index, count],
        "chunks": len(plan.shard(index, count)),
        "env": environment(),  # policy_runtime.timing: device, driver, torch, triton
        "command": command,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


__all__ = ["Shard", "shard_header", "load_harness"]
