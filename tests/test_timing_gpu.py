"""policy_runtime/timing.py's gpu_ms keeps the host's launch time off the clock however long the host
takes (the sleep before the start event is sized from the measured call's own host time): the
benchmarks' and ``codegen tune``'s numbers are kernel time.  The sizing rule runs anywhere; the
timings need a CUDA GPU (skipped without one)."""

from __future__ import annotations

import time

import pytest
import torch

from policy_runtime import timing


def test_the_sleep_outlasts_the_hosts_launching_by_the_margin():
    rate = 1.98e6  # cycles a millisecond (an H200's clock)
    # A host faster than the floor's sleep: the floor.
    assert timing.sleep_cycles(0.01, rate) == timing.SLEEP_CYCLES
    # A host slower than it: SLEEP_MARGIN times the host's time.
    for host in (0.5, 2.0, 20.0):
        cycles = timing.sleep_cycles(host, rate)
        assert cycles >= timing.SLEEP_MARGIN * host * rate - 1
        assert cycles / rate > host


def _busy(ms: float) -> None:
    t0 = time.perf_counter()
    while (time.perf_counter() - t0) * 1e3 < ms:
        pass


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (times kernels)")
@pytest.mark.parametrize("host_ms", [1.0, 3.0])
def test_gpu_ms_does_not_count_a_slow_hosts_time(host_ms):
    # One small kernel launched after host_ms of host work (a candidate launched through Triton's
    # own path, or an entry point of several launches, takes the host this long): its GPU time is
    # the kernel's, as for the same kernel launched at once.  With the fixed sleep (SLEEP_CYCLES,
    # ~150 us) the gap between the start event and the launch counted: on an H200, a 4 us kernel
    # read 32 us behind 0.5 ms of host work and 1544 us behind 2 ms.
    x = torch.zeros(1 << 16, device="cuda")
    quick = timing.gpu_ms(lambda: x.add_(1.0), reps=20)

    def slow():
        _busy(host_ms)
        x.add_(1.0)

    got = timing.gpu_ms(slow, reps=20)
    assert got < quick + 0.02, (got, quick)
