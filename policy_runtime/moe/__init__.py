"""The moe family (hand-written; generated/moe.py imports its ops): fused mixture-of-experts:
routing, alignment, the expert GEMMs' bodies and host side (ops.py), record constants
(constexprs.py), tuning harness (tune.py), warm-up driver (warmup.py).

Its one export, ``FAMILY``, is what warm-up and the tuner find by the name.
"""

from ..family import Family


def _driver() -> type:
    from .warmup import MoEDriver

    return MoEDriver


def _tune() -> object:
    from .tune import HARNESS

    return HARNESS


FAMILY = Family(name="moe", driver=_driver, tune=_tune)
