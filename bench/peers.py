"""The benchmarks' peers: vLLM's Triton fused MoE and paged decode kernels, imported from
``../shared/peers/vllm_triton.py`` (beside the repository, never copied into it) when that file is
there.  Without it the peer columns are left out, and ``load()`` says why.

    from bench.peers import load
    vllm, why = load()          # (module, None) or (None, "reason")

``$VLLM_PEERS`` names another path (an empty value switches the peers off: the tests use it to run
the benchmarks as a checkout without the file would).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ROOT.parent / "shared" / "peers" / "vllm_triton.py"
_NAME = "vllm_triton_peer"


def path() -> Optional[Path]:
    """Where the peers are looked for (None: switched off by an empty $VLLM_PEERS)."""
    given = os.environ.get("VLLM_PEERS")
    if given is None:
        return DEFAULT
    return Path(given) if given else None


def load() -> tuple[Optional[ModuleType], Optional[str]]:
    """(the vllm_triton module, None), or (None, why the peer columns are left out)."""
    where = path()
    if where is None:
        return None, "vLLM peers switched off ($VLLM_PEERS is empty): their columns are left out"
    if not where.is_file():
        return None, f"vLLM peers not found at {where}: their columns are left out"
    if _NAME in sys.modules:
        return sys.modules[_NAME], None
    spec = importlib.util.spec_from_file_location(_NAME, where)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[_NAME] = module  # @triton.jit reads the kernels' source through their module
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001
        del sys.modules[_NAME]
        return None, f"vLLM peers at {where} failed to import ({type(e).__name__}: {str(e)[:200]}): columns left out"
    return module, None
