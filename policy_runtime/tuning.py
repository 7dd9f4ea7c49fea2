"""What the families' tuning harnesses (``policy_runtime/<family>_tune.py``, named by each
spec's ``[<config>.tune] harness``) share.

A harness runs a candidate record through the family's own launchers, on the kernel body the
generated wrapper for that record would call, with the same constants: ``BoundKernel`` stands in
for the generated wrapper.
"""

from __future__ import annotations

from typing import Any, Callable


class BoundKernel:
    """A kernel body with a record's constants bound: launched as a generated wrapper is,
    ``kernel[grid](*runtime args, num_warps=.., num_stages=..)``."""

    def __init__(self, body: Any, name: str, consts: dict[str, Any]):
        self.body = body
        self.consts = consts
        self.__name__ = name

    def __getitem__(self, grid: tuple) -> Callable[..., Any]:
        launch = self.body[grid]
        return lambda *args, **kw: launch(*args, **self.consts, **kw)
