"""Ahead-of-time warm-up (hand-written): compile every kernel a target's policies can launch, running none.

``generated.warmup(hw, dtypes=..., workers=...)`` (every kernel module) and
``generated.<module>.warmup(...)`` (one) call ``warmup``; ``python -m policy_runtime.warmup``
(``cli.py``) is the command for deployment scripts.  ``engine.py`` plans and compiles, ``report.py``
says what was done, ``calls.py`` is what a family's driver (``policy_runtime/<family>/warmup.py``,
whose docstring lists the calls and argument classes it covers) builds its calls with.  Triton's
normal cache (``TRITON_CACHE_DIR``, default ``~/.triton/cache``) is filled, for this machine's GPU
with the launch records of ``hw``: warm up on the part you serve on.  What no driver covers (another
dtype, block size or model, a stride of another class) compiles on first use.
"""

from .calls import Call, Options
from .engine import Plan, Unit, launch_key, plan, warmup
from .report import Kernel, Report

__all__ = ["Call", "Options", "Plan", "Unit", "Kernel", "Report", "plan", "warmup", "launch_key"]
