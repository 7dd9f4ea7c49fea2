"""GPU timing shared by the benchmarks: kernel time with the host's launch cost off the clock, and
interleaved rounds against a reference.

``gpu_ms`` exists because ``triton.testing.do_bench`` records its start event right after the L2
flush: when a launch takes the host longer than the flush takes the GPU (a Python launch path on a
slow host), the GPU idles between the two and the idle time is counted as kernel time.  On
2026-11-30 one H200 host launched torch.matmul in 22 us and matmul_triton in 48 us (another, 15 and
29 us): there do_bench put the 20 us decode kernels at 0.78x cuBLAS, against 1.03x on the faster
host.  Host overhead is a separate measurement in each benchmark.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

# GPU cycles of torch.cuda._sleep queued after each L2 flush (~150 us at the H200's clock): longer
# than the host takes to launch any method measured here, so each timed kernel is already queued
# when its start event fires.
SLEEP_CYCLES = 300_000
_FLUSH: list[torch.Tensor] = []


def gpu_ms(fn: Callable[[], object], reps: int = 100) -> float:
    """Median GPU milliseconds of ``fn`` over ``reps`` runs, each after a 256 MiB L2 flush (as
    do_bench), with a GPU sleep between the flush and the start event."""
    if not _FLUSH:
        _FLUSH.append(torch.empty(256 << 20, dtype=torch.int8, device="cuda"))
    flush = _FLUSH[0]
    for _ in range(5):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        flush.zero_()
        torch.cuda._sleep(SLEEP_CYCLES)
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def cpu_ms(fn: Callable[[], object]) -> float:
    """Wall milliseconds of one call: the CPU smoke modes' stand-in for gpu_ms (interpreter)."""
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    """||got - ref|| / ||ref||, got compared in float32 against a float32 reference."""
    return ((got.float() - ref).norm() / ref.norm()).item()


def round_order(names: list[str], r: int) -> list[str]:
    """The order of round r: rotated by r // 2, reversed in odd rounds, so that over 2 x len(names)
    rounds every method runs exactly twice in every position.  Plain forward/backward alternation
    kept the middle method (the reference, in bench/matmul.py) in the middle every round; on
    2026-11-30 a 17 us cuBLAS call timed there ran 5% faster than the same call timed first or last."""
    k = (r // 2) % len(names)
    order = names[k:] + names[:k]
    return order[::-1] if r % 2 else order


def interleaved(
    methods: dict[str, Callable[[], object]], rounds: int, reference: str, timer: Callable[..., float] = gpu_ms
) -> dict[str, dict[str, float]]:
    """Time every method once per round, in the order of round_order; per method: the median time
    (ms) and the median over rounds of reference time / method time (so > 1 is faster)."""
    names = list(methods)
    times: dict[str, list[float]] = {n: [] for n in names}
    ratios: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        # Rotate the order so clock and thermal drift and position within a round favour nobody.
        this = {n: timer(methods[n]) for n in round_order(names, r)}
        for n, t in this.items():
            times[n].append(t)
            ratios[n].append(this[reference] / t)
    return {n: {"ms": statistics.median(times[n]), "ratio": statistics.median(ratios[n])} for n in names}
