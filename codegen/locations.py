"""Where codegen finds its packaged templates and keeps its caches.

A module of its own, importing only the standard library: ``check``'s result cache
(``check_cache``) needs both before it decides whether the compiler must be imported at all.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path


def packaged_templates() -> Path:
    """The templates that ship with codegen: the ``codegen_templates`` package when installed
    (a wheel, or an editable install of this repository), else this checkout's templates/."""
    try:
        spec = importlib.util.find_spec("codegen_templates")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(__file__).resolve().parent.parent / "templates"


def cache_dir() -> Path | None:
    """Where codegen's caches are kept: ``$CODEGEN_CACHE_DIR`` (empty: nowhere), else
    ``$XDG_CACHE_HOME/codegen`` or ``~/.cache/codegen``."""
    env = os.environ.get("CODEGEN_CACHE_DIR")
    if env is not None:
        return Path(env) if env else None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "codegen"
