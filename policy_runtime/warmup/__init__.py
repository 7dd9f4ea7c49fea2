"""Ahead-of-time warm-up (hand-written): compile every kernel a target's policies can launch."""

from .engine import *  # noqa: F401,F403
from .engine import main, plan, warmup  # noqa: F401
