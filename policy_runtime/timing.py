"""GPU timing shared by the benchmarks (bench/) and ``codegen tune``: kernel time with the host's
launch cost off the clock, and interleaved rounds against a reference.

``gpu_ms`` exists because ``triton.testing.do_bench`` records its start event right after the L2
flush: where a launch takes the host longer than the flush takes the GPU, the idle gap counts as
kernel time.  ``gpu_ms`` queues a GPU sleep between the flush and the start event, sized from the
host time of the measured call itself (``codegen tune``'s candidates, launched without call caches,
and multi-launch entry points take the host longer than one kernel): the timed launches are always
queued before the start event fires.  Host overhead is a separate measurement in each benchmark.  The flush reads 256 MiB
where do_bench zeroes its buffer: a write leaves the L2 full of dirty lines that the timed kernel's
first misses must write back; a read leaves it cold and clean, as a serving step finds it after
kernels that read weights and write little.
"""

from __future__ import annotations

import statistics
import subprocess
import time
from typing import Callable

import torch

# The fewest GPU cycles of torch.cuda._sleep queued after each L2 flush (~150 us at the H200's
# clock); gpu_samples_ms sleeps longer where the measured call takes the host longer (sleep_cycles).
SLEEP_CYCLES = 300_000
# How many times the measured call's host time the sleep lasts: the host's time varies from call to
# call (a page fault, an allocation, the GIL), and a sleep that ends early counts the gap as kernel time.
SLEEP_MARGIN = 3.0
# torch.cuda._sleep's cycles per millisecond, per device (measured once: sleep_rate).
_SLEEP_RATE: dict[int, float] = {}
# The flush buffer (256 MiB, several times any L2), as int32 words, and the one-element tensor its
# sum lands in.
_FLUSH: list[torch.Tensor] = []


def flush_l2() -> None:
    """Evict the L2 by reading 256 MiB (the module docstring says why a read and not a write)."""
    if not _FLUSH:
        _FLUSH.append(torch.ones(64 << 20, dtype=torch.int32, device="cuda"))
        _FLUSH.append(torch.empty((), dtype=torch.int64, device="cuda"))
    torch.sum(_FLUSH[0], dim=0, out=_FLUSH[1])


def sleep_rate() -> float:
    """Cycles of ``torch.cuda._sleep`` per GPU millisecond on the current device (measured once a
    process: one sleep of SLEEP_CYCLES timed by events)."""
    dev = torch.cuda.current_device()
    if dev not in _SLEEP_RATE:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1000)  # the first sleep's own start-up off the clock
        start.record()
        torch.cuda._sleep(SLEEP_CYCLES)
        end.record()
        end.synchronize()
        _SLEEP_RATE[dev] = SLEEP_CYCLES / max(start.elapsed_time(end), 1e-3)
    return _SLEEP_RATE[dev]


def sleep_cycles(host_ms: float, rate: float) -> int:
    """GPU sleep, in cycles at ``rate`` cycles a millisecond, that outlasts SLEEP_MARGIN times
    ``host_ms`` of the host's launching, and never less than SLEEP_CYCLES."""
    return max(SLEEP_CYCLES, int(SLEEP_MARGIN * host_ms * rate))


def host_ms(fn: Callable[[], object], calls: int = 3) -> float:
    """The longest wall milliseconds of ``calls`` calls of ``fn``, each started on an idle GPU:
    what the host takes to queue its launches."""
    longest = 0.0
    for _ in range(calls):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        longest = max(longest, (time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return longest


def gpu_samples_ms(
    fn: Callable[[], object], reps: int = 100, warmup: int = 5, flush: Callable[[], None] = flush_l2
) -> list[float]:
    """GPU milliseconds of each of ``reps`` runs of ``fn``, each after an L2 flush (``flush_l2``'s
    read of 256 MiB unless ``flush`` is another), with a GPU sleep between the flush and the start
    event that outlasts the host's time to launch ``fn`` (``sleep_cycles``), so that the host's
    launch time is off the clock."""
    for _ in range(warmup):
        fn()
    cycles = sleep_cycles(host_ms(fn), sleep_rate())
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        flush()
        torch.cuda._sleep(cycles)
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def gpu_ms(fn: Callable[[], object], reps: int = 100, warmup: int = 5, flush: Callable[[], None] = flush_l2) -> float:
    """Median GPU milliseconds of ``fn`` over ``reps`` runs timed as ``gpu_samples_ms`` times them."""
    return statistics.median(gpu_samples_ms(fn, reps, warmup, flush))


def captured(fn: Callable[[], object], warmups: int = 3) -> tuple["torch.cuda.CUDAGraph", object]:
    """fn recorded into a CUDA graph, after ``warmups`` calls on a side stream (as torch's docs
    do: first-call work such as compilation and workspace allocation stays out of the graph), and
    what the recorded call returned, which every replay writes again."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmups):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


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
    kept the middle method (the reference, in bench/matmul.py) in the middle every round, where a
    17 us cuBLAS call ran 5% faster than the same call timed first or last."""
    k = (r // 2) % len(names)
    order = names[k:] + names[:k]
    return order[::-1] if r % 2 else order


def per_round(
    methods: dict[str, Callable[[], object]], rounds: int, timer: Callable[[Callable[[], object]], float] = gpu_ms
) -> dict[str, list[float]]:
    """Time every method once per round, in the order of round_order; per method, its time (ms)
    in each round, in round order."""
    names = list(methods)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        # Rotate the order so clock and thermal drift and position within a round favour nobody.
        for n in round_order(names, r):
            times[n].append(timer(methods[n]))
    return times


def median_ratio(reference: list[float], times: list[float]) -> float:
    """The median over rounds of reference time / method time (> 1: the method is faster)."""
    return statistics.median(r / t for r, t in zip(reference, times))


def interleaved(
    methods: dict[str, Callable[[], object]], rounds: int, reference: str, timer: Callable[..., float] = gpu_ms
) -> dict[str, dict[str, float]]:
    """Time every method once per round, in the order of round_order; per method: the median time
    (ms) and the median over rounds of reference time / method time (so > 1 is faster)."""
    times = per_round(methods, rounds, timer)
    return {n: {"ms": statistics.median(t), "ratio": median_ratio(times[reference], t)} for n, t in times.items()}


def environment() -> dict[str, str]:
    """What the provenance of a measurement records: device, driver, torch and triton."""
    import triton

    if torch.cuda.is_available():
        device = torch.cuda.get_device_name()
        try:
            driver = (
                subprocess.run(
                    ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", "-i", "0"],
                    capture_output=True,
                    text=True,
                    timeout=30,
                ).stdout.strip()
                or "unknown"
            )
        except (OSError, subprocess.SubprocessError):
            driver = "unknown"
    else:
        device, driver = "cpu (Triton interpreter)", "none"
    return {"device": device, "driver": driver, "torch": torch.__version__, "triton": triton.__version__}
