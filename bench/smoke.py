"""A benchmark's --cpu-smoke switch, set before torch or Triton is imported (no imports of either here)."""

from __future__ import annotations

import os
import sys
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def smoke_setup(args: Any) -> bool:
    """Whether ``args`` asks for a CPU smoke run; if so, Triton's interpreter is turned on (before
    Triton is imported) and ``--hw`` is required.  The repository root goes on sys.path either way."""
    if args.cpu_smoke:
        os.environ["TRITON_INTERPRET"] = "1"
        if args.hw is None:
            sys.exit("--cpu-smoke needs --hw NAME (a hardware spec name, e.g. h200)")
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    return bool(args.cpu_smoke)
