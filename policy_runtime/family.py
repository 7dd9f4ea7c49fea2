"""A kernel family's one exported object (hand-written).

Each family package (``policy_runtime/<name>/``, named as its module spec ``specs/modules/<name>.toml``
and its generated module ``generated/<name>.py``) exports ``FAMILY``: what warm-up and the tuner
need of it, found by that name (``find``).  Its fields load their modules only when called, so
importing a family's record constants (``<name>/constexprs.py``, read by the compiler) imports
neither torch nor the warm-up.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Optional

__all__ = ["Family", "find"]


@dataclass(frozen=True)
class Family:
    """``driver()``: the warm-up driver class (``Driver(module name, the generated module's
    WARMUP_TABLES)``, with ``calls(options)`` and ``run(call, device)``); ``tune()``: the tuning
    harness (``policy_runtime.tuning.Harness``); None where the family has none."""

    name: str
    driver: Optional[Callable[[], type]] = None
    tune: Optional[Callable[[], Any]] = None


def find(name: str, package: str = "policy_runtime") -> Optional[Family]:
    """The family ``<package>.<name>`` exports, or None where no such package exists."""
    try:
        module = importlib.import_module(f"{package}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name in (f"{package}.{name}", package):
            return None
        raise
    family = getattr(module, "FAMILY", None)
    if family is not None and not isinstance(family, Family):
        raise TypeError(f"{package}.{name}.FAMILY is a {type(family).__name__}, not a Family")
    return family
