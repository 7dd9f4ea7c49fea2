"""The cache family (hand-written; generated/cache.py imports its ops): KV-cache kernels
(reshape_and_cache, copy_blocks) and swap_blocks: kernels and launch planners (ops.py), warm-up
driver (warmup.py).

Its one export, ``FAMILY``, is what warm-up and the tuner find by the name.
"""

from ..family import Family


def _driver() -> type:
    from .warmup import CacheDriver

    return CacheDriver


FAMILY = Family(name="cache", driver=_driver)
