"""Stage 3 of ``codegen tune``: results -> one verdict per bucket, from the results alone.

``tune`` (any number of workers) and ``tune merge`` (files from any number of hosts) decide with
this one function on the same data, so they write the same specs.  Per bucket: a candidate
measured and correct on every shape scores the geometric mean of incumbent time / its time; its
spread is the incumbent's largest deviation against itself in its chunk; the best replaces the
incumbent only past 1 + spread (ties: higher score, then smaller key).  A backend (where the
family has one) flips only when the other side wins by more than the spread, never for values
in ``keep`` nor where a kernel takes less than ``min_kernel_us`` on some shape (there host launch
time, not measured here, decides).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from .plan import INCUMBENT, BucketPlan, Candidate, Plan
from .results import Merged


@dataclass(frozen=True)
class Verdict:
    bucket: str
    shapes: tuple[str, ...]
    planned: int  # candidates in the plan (after the checks)
    rejected: int  # dropped by the spec's checks, never launched
    measured: int  # measured on every shape
    unmeasured: int  # not reached (budget) or measured on some shapes only
    failed: tuple[tuple[str, str], ...]  # (label, why) disqualified at run time
    best: Candidate | None  # the best-scoring measured candidate
    best_score: float | None  # its incumbent time / its time (geomean over shapes)
    spread: float | None  # the spread it had to beat
    winner: Candidate | None  # best, if it beat the incumbent by more than the spread
    kernel_vs_library: float | None  # library time / kept kernel's time (geomean)
    backend: Any  # the new backend value, or None where it does not change
    incumbent_failed: str | None  # the incumbent itself failed its check (nothing is decided)

    @property
    def changed(self) -> bool:
        return self.winner is not None or self.backend is not None


def _geomean(xs: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(x) for x in xs))


def _median_of(lines: list[dict], shape: str, key: str) -> float | None:
    values = [line["shapes"][shape][key] for line in lines if key in line["shapes"].get(shape, {})]
    return statistics.median(values) if values else None


def decide(plan: Plan, merged: Merged) -> tuple[Verdict, ...]:
    return tuple(_bucket(plan, b, merged) for b in plan.buckets)


def _bucket(plan: Plan, b: BucketPlan, merged: Merged) -> Verdict:
    shapes = tuple(plan.shape_text(s) for s in b.shapes)
    lines = [line for line in merged.chunks.values() if line["bucket"] == b.name]
    per: dict[str, dict[str, dict]] = {}  # key -> shape -> result
    spread_of: dict[str, float] = {}
    lib_vs_inc: dict[str, list[float]] = {s: [] for s in shapes}
    incumbent_failed = None
    for line in lines:
        chunk_spread = 0.0
        for s in shapes:
            entry = line["shapes"].get(s, {})
            if "incumbent_failed" in entry:
                incumbent_failed = entry["incumbent_failed"]
                continue
            chunk_spread = max(chunk_spread, entry.get("spread", 0.0))
            if "library_vs_incumbent" in entry:
                lib_vs_inc[s].append(entry["library_vs_incumbent"])
            for key, res in entry.get("candidates", {}).items():
                per.setdefault(key, {})[s] = res
        for key in line["keys"]:
            spread_of[key] = chunk_spread
    failed = []
    scored: list[tuple[float, str]] = []
    for key, by_shape in per.items():
        why = next((r["failed"] for r in by_shape.values() if "failed" in r), None)
        if why is not None:
            failed.append((plan.candidate(key).label, why))
        elif len(by_shape) == len(shapes):
            scored.append((_geomean([by_shape[s]["vs_incumbent"] for s in shapes]), key))
    scored.sort(key=lambda t: (-t[0], t[1]))
    best = plan.candidate(scored[0][1]) if scored else None
    best_score = scored[0][0] if scored else None
    spread = spread_of.get(best.key) if best is not None else None
    winner = best if best is not None and best_score > 1.0 + spread else None  # type: ignore[operator]

    kernel_vs_library = None
    if winner is not None and all("vs_library" in per[winner.key][s] for s in shapes):
        kernel_vs_library = _geomean([per[winner.key][s]["vs_library"] for s in shapes])
    elif winner is None and all(lib_vs_inc[s] for s in shapes):
        kernel_vs_library = _geomean([statistics.median(lib_vs_inc[s]) for s in shapes])
    backend = None
    tb = plan.backend
    kept = winner.key if winner is not None else None
    kernel_ms = [(per[kept][s]["ms"] if kept is not None else _median_of(lines, s, "incumbent_ms")) for s in shapes]
    launch_bound = tb is not None and any(ms is None or ms * 1e3 < tb.min_kernel_us for ms in kernel_ms)
    if tb is not None and kernel_vs_library is not None and incumbent_failed is None and not launch_bound:
        current = b.incumbent.record[tb.field]
        margin = 1.0 + (spread if spread is not None else max(spread_of.values(), default=0.0))
        if current not in tb.keep:
            if current == tb.library and kernel_vs_library > margin:
                backend = tb.kernel
            elif current == tb.kernel and kernel_vs_library < 1.0 / margin:
                backend = tb.library
    measured = len(scored)
    return Verdict(
        bucket=b.name,
        shapes=shapes,
        planned=len(b.candidates),
        rejected=len(b.rejected),
        measured=measured,
        unmeasured=len(b.candidates) - measured - len(failed),
        failed=tuple(sorted(failed)),
        best=best,
        best_score=best_score,
        spread=spread,
        winner=winner if incumbent_failed is None else None,
        kernel_vs_library=kernel_vs_library,
        backend=backend,
        incumbent_failed=incumbent_failed,
    )


__all__ = ["Verdict", "decide", "INCUMBENT"]
