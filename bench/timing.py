"""The benchmarks' timing: policy_runtime/timing.py (shared with ``codegen tune``), re-exported."""

from policy_runtime.timing import (  # noqa: F401
    SLEEP_CYCLES,
    captured,
    cpu_ms,
    gpu_ms,
    interleaved,
    median_ratio,
    per_round,
    rel_err,
    round_order,
)
