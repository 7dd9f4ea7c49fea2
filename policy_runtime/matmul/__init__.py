"""The matmul family (hand-written; generated/matmul.py imports its ops): shape-bucketed Triton
matmul: kernel bodies and host side (ops.py), the constants a record gives its kernel
(constexprs.py), the tuning harness (tune.py), the warm-up driver (warmup.py).

Its one export, ``FAMILY``, is what warm-up and the tuner find by the name.
"""

from ..family import Family


def _driver() -> type:
    from .warmup import MatmulDriver

    return MatmulDriver


def _tune() -> object:
    from .tune import HARNESS

    return HARNESS


FAMILY = Family(name="matmul", driver=_driver, tune=_tune)
