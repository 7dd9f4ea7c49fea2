"""The attention family (hand-written; generated/attention.py imports its ops): flash-attention
prefill and paged decode: kernel bodies and host side (ops.py), tuning harness (tune.py), warm-up
driver (warmup.py).

Its one export, ``FAMILY``, is what warm-up and the tuner find by the name.
"""

from ..family import Family


def _driver() -> type:
    from .warmup import AttentionDriver

    return AttentionDriver


def _tune() -> object:
    from .tune import HARNESS

    return HARNESS


FAMILY = Family(name="attention", driver=_driver, tune=_tune)
