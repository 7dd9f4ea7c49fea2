"""Programmatic dependent launch on and off, A/B in one process (bench/decode_pdl.py, bench/moe_pdl.py).

"Off" replaces policy_runtime.launch.programmatic with a function that answers False: every launch
site then launches plainly, with the same kernels' PDL constexpr off.
"""

from __future__ import annotations

import statistics
from typing import Callable

import torch

from policy_runtime import call_cache
from policy_runtime import launch as _launch
from policy_runtime.timing import captured, gpu_ms

MODES = ("off", "pdl")


def ab(
    fn: Callable[[], object], out: torch.Tensor, rounds: int, reps: int, exact: bool = True
) -> tuple[dict[str, list[float]], bool]:
    """Each round runs both modes in turn; each mode clears the call caches, runs ``fn`` once and
    keeps ``out``, then times ``fn`` eager and replayed from a CUDA graph (gpu_ms).  Returns each
    mode's [eager, graph] medians over the rounds in µs, and whether both modes wrote the same bytes
    (``exact``) or the same values within a rounding (fp32 atomics, whose order varies)."""
    real = _launch.programmatic
    res: dict[str, list[tuple[float, float]]] = {m: [] for m in MODES}
    outs = {}
    try:
        for _ in range(rounds):
            for mode in MODES:
                _launch.programmatic = real if mode == "pdl" else (lambda t: False)
                call_cache.clear_all()
                fn()
                torch.cuda.synchronize()
                outs[mode] = out.clone()
                res[mode].append((gpu_ms(fn, reps=reps), gpu_ms(captured(fn)[0].replay, reps=reps)))
    finally:
        _launch.programmatic = real
        call_cache.clear_all()
    med = {m: [statistics.median(x[i] for x in v) * 1e3 for i in (0, 1)] for m, v in res.items()}
    a, b = outs["off"], outs["pdl"]
    return med, torch.equal(a, b) if exact else torch.allclose(a.float(), b.float(), rtol=1e-2, atol=1e-3)
