"""The scaled_mm family (hand-written; generated/scaled_mm.py imports its ops): FP8 e4m3 matmul with
tensor, row/column or 128-block scales: kernel body and host side (ops.py), record constants
(constexprs.py), tuning harness (tune.py), warm-up driver (warmup.py).

Its one export, ``FAMILY``, is what warm-up and the tuner find by the name.
"""

from ..family import Family


def _driver() -> type:
    from .warmup import ScaledMmDriver

    return ScaledMmDriver


def _tune() -> object:
    from .tune import HARNESS

    return HARNESS


FAMILY = Family(name="scaled_mm", driver=_driver, tune=_tune)
