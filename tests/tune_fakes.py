"""A tuning harness with a fake clock, for the tuner's tests (no GPU, no kernel compiles).

A record's time is a fixed function of its tiles, so every run, worker and shard measures the
same numbers and decisions can be compared exactly.  Records with ``block_n == 32`` return NaN
(and are the fastest of all): the tuner must disqualify them, never write them.  Every problem
and kernel built is counted in ``CALLS`` (per process), for the resume tests.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import torch

CALLS: list[tuple[str, Any]] = []


def fake_ms(record: Mapping[str, Any]) -> float:
    if record["block_n"] == 32:
        return 0.001  # the fastest, and wrong
    return 1000.0 / (record["block_m"] * record["block_n"]) + 0.01 * record["num_stages"]


class _Problem:
    def __init__(self, shape: Mapping[str, int]):
        self.shape = dict(shape)
        self.reference = torch.ones(4, dtype=torch.float32)

    def kernel(self, record: Mapping[str, Any]) -> Callable[[], torch.Tensor]:
        CALLS.append(("kernel", dict(record)))
        bad = record["block_n"] == 32
        out = torch.empty(4)

        def run() -> torch.Tensor:
            out.fill_(float("nan") if bad else 1.0)
            return out

        run.fake_ms = fake_ms(record)  # type: ignore[attr-defined]
        return run

    def library(self) -> None:
        return None  # no vendor library: backends stay as they are (test_decide covers flips)

    def error(self, out: torch.Tensor) -> float:
        return ((out - self.reference).norm() / self.reference.norm()).item()


class _Harness:
    @staticmethod
    def timer(fn: Callable[[], object]) -> float:
        fn()
        return fn.fake_ms  # type: ignore[attr-defined]

    def problem(self, shape: Mapping[str, int], dtype: torch.dtype, device: Any, params: Mapping[str, Any]) -> _Problem:
        CALLS.append(("problem", dict(shape)))
        return _Problem(shape)


HARNESS = _Harness()
