"""What the families' tuning harnesses (``policy_runtime/<family>/tune.py``, named by each
spec's ``[<config>.tune] harness``) share.

A harness runs a candidate record through the family's own launchers, on the kernel body the
generated wrapper for that record would call, with the same constants: ``BoundKernel`` stands in
for the generated wrapper.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

import torch

from .timing import rel_err


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


class Problem:
    """What every problem of a harness has: an fp32 ``reference`` its outputs are checked
    against, and (unless it overrides ``library``) no vendor library to time."""

    reference: torch.Tensor

    def library(self) -> Optional[Callable[[], torch.Tensor]]:
        return None

    def error(self, out: torch.Tensor) -> float:
        return rel_err(out, self.reference)


@dataclass(frozen=True)
class Harness:
    """What a spec's ``[<config>.tune] harness`` names (``HARNESS`` of a family's tune module):
    ``problem(shape, dtype, device, params)`` builds the family's Problem for one shape (its bucket
    dimensions by name; ``params`` the model sizes the spec hands over).  A harness may also carry
    a ``timer`` (codegen/tune/measure.py reads it where present)."""

    problem: Callable[[Mapping[str, int], torch.dtype, Any, Mapping[str, Any]], Problem]
