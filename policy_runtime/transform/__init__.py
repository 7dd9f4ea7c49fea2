"""The transform family (hand-written; generated/transform.py imports its ops): RMSNorm, gated
activations and RoPE: kernels and launch planners (ops.py), warm-up driver (warmup.py).

Its one export, ``FAMILY``, is what warm-up and the tuner find by the name.
"""

from ..family import Family


def _driver() -> type:
    from .warmup import TransformDriver

    return TransformDriver


FAMILY = Family(name="transform", driver=_driver)
