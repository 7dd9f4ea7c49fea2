"""What a family's warm-up driver builds its calls with (hand-written).

A driver (``policy_runtime/<family>/warmup.py``) lists ``Call``s for the ``Options`` of one
warm-up and runs one call on tensors from ``empty``; the launch plans of a memory-bound kernel
over token counts come from ``launch_plans``, a bucketed kernel's token counts from
``bucket_counts``.

Argument classes (Triton specializes on tensors' dtypes and 16-byte alignment, on integers equal
to 1 or divisible by 16, on constants): what a serving call of the models in
``generated.dispatch.MODEL_DIMS`` (all, or ``models``) passes, tensors 16-byte aligned as torch
allocates them.  ``int_class`` names an integer argument's class; a driver keeps one layout per
class with ``first_of_each_class``.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, TypeVar

import torch

from .. import launch as _launch

__all__ = [
    "DTYPES",
    "DTYPE_ALIASES",
    "DEFAULT_DTYPES",
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_MAX_TOKENS",
    "Options",
    "Call",
    "torch_dtype",
    "device",
    "empty",
    "token_counts",
    "launch_plans",
    "plan_text",
    "bucket_counts",
    "int_class",
    "first_of_each_class",
    "plan_cache_dir",
]

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}
DEFAULT_DTYPES = ("bfloat16", "float16")
# vLLM's default KV-cache block size: the paged-decode kernel's BLOCK_SIZE constant.
DEFAULT_BLOCK_SIZE = 16
# Token counts searched exhaustively for launch plans and buckets (larger ones are sampled).
DEFAULT_MAX_TOKENS = 16384


@dataclass(frozen=True)
class Options:
    """What one warm-up covers; picklable (worker processes get it)."""

    target: str
    dtypes: tuple[str, ...]
    # Model name -> its dimensions and features (generated.dispatch.MODEL_DIMS: ints, and words
    # such as moe_activation), for the models asked.
    models: dict[str, dict[str, Any]] = field(hash=False)
    block_size: int = DEFAULT_BLOCK_SIZE
    max_tokens: int = DEFAULT_MAX_TOKENS
    # "first": each representative call's smallest shape; "other": another shape of the same
    # bucket and plan (a new M, token count or length: what bench/warmup.py calls for real after).
    pick: str = "first"


@dataclass(frozen=True)
class Call:
    """One representative call: ``op`` of a module's driver with ``args`` (plain data)."""

    module: str
    op: str
    args: tuple
    # What it stands for, most general first: ("matmul", "matmul_16bit", "decode", "bfloat16", "b row-major").
    covers: tuple[str, ...]
    # Relative compile cost of its kernels (tensor-core GEMMs 3, memory-bound kernels 1): the
    # heaviest are compiled first.
    weight: int = 1

    def describe(self) -> str:
        return f"{self.module.rsplit('.', 1)[-1]}: {' '.join(self.covers)} {self.args}"


def torch_dtype(name: str) -> torch.dtype:
    return DTYPES[name]


def device() -> torch.device:
    if _launch.INTERPRET:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError(
            "there is no GPU here (torch sees no CUDA device): warm-up and its plan run the calls on one; "
            "TRITON_INTERPRET=1 plans them on the CPU"
        )
    return torch.device("cuda", torch.cuda.current_device())


def empty(shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.empty(tuple(shape), dtype=dtype, device=device)


def token_counts(max_tokens: int, limit: int = 2**22) -> list[int]:
    """Token counts looked at for launch plans and buckets: every one up to max_tokens, then
    powers of two, their neighbours and three times them, up to ``limit``."""
    extra = set()
    for j in range(limit.bit_length()):
        for n in (2**j - 1, 2**j, 2**j + 1, 3 * 2**j):
            if max_tokens < n <= limit:
                extra.add(n)
    return list(range(1, max_tokens + 1)) + sorted(extra)


def _plan_key(p: Any) -> tuple:
    return (p.kernel.__name__, p.consts, p.num_warps, p.info)


@functools.lru_cache(maxsize=None)
def _plan_pieces(planner: Callable[..., Any], rest: tuple, max_tokens: int) -> tuple[tuple[tuple, int, int], ...]:
    """The distinct launch plans of ``planner(n, *rest)`` over the token counts, in order of
    first appearance: (plan key, first n, another n with that plan or the first again).  Those
    that first appear past max_tokens (at the sampled counts) come last.  The search calls the
    planner some 16,000 times (seconds for a whole plan), so its result is also kept on disk
    (``_stored``) for other processes."""
    key = _store_key(planner, rest, max_tokens)
    found = _stored(key)
    if found is not None:
        return found
    seen: dict[tuple, list[int]] = {}
    for n in token_counts(max_tokens):
        ns = seen.setdefault(_plan_key(planner(n, *rest)), [])
        if len(ns) < 2:
            ns.append(n)
    pieces = tuple((key, ns[0], ns[-1]) for key, ns in seen.items())
    _store(key, pieces)
    return pieces


# ---------------------------------------------------------------------------------------
# The searches' results on disk: $POLICY_RUNTIME_CACHE_DIR (empty: nowhere), else
# $XDG_CACHE_HOME/policy_runtime or ~/.cache/policy_runtime, one file per search, named by a hash
# of everything its result depends on: the planner (module and name), repr(rest) (the tables a
# generated module hands over: values only; a repr with an object's address is not stored), the
# token limit, whether Triton's interpreter is on, the torch and Triton versions, and the bytes of
# every source file of policy_runtime and of the planner's own module.  A file that cannot be read
# back is searched again; a cache that cannot be written is only slower.


def plan_cache_dir() -> Optional[Path]:
    env = os.environ.get("POLICY_RUNTIME_CACHE_DIR")
    if env is not None:
        return Path(env) if env else None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "policy_runtime"


@functools.lru_cache(maxsize=None)
def _source_hash(module_file: str) -> str:
    h = hashlib.sha256()
    files = sorted(Path(__file__).resolve().parent.parent.rglob("*.py")) + [Path(module_file)]
    for f in files:
        h.update(str(f.name).encode())
        h.update(f.read_bytes())
    h.update(f"{_launch.INTERPRET} {torch.__version__} {_triton_version()}".encode())
    return h.hexdigest()


def _triton_version() -> str:
    import triton

    return triton.__version__


def _store_key(planner: Callable[..., Any], rest: tuple, max_tokens: int) -> Optional[str]:
    if plan_cache_dir() is None:
        return None
    text = repr(rest)
    module_file = getattr(sys.modules.get(planner.__module__), "__file__", None)
    if " at 0x" in text or module_file is None:
        return None
    h = hashlib.sha256(_source_hash(module_file).encode())
    h.update(f"{planner.__module__}.{planner.__qualname__}|{text}|{max_tokens}".encode())
    return h.hexdigest()


def _stored(key: Optional[str]) -> Optional[tuple]:
    where = plan_cache_dir()
    if key is None or where is None:
        return None
    path = where / "plans" / f"{key}.pickle"
    try:
        found = pickle.loads(path.read_bytes())
    except Exception:  # absent, or unreadable: searched again
        return None
    return found if isinstance(found, tuple) else None


def _store(key: Optional[str], pieces: tuple) -> None:
    where = plan_cache_dir()
    if key is None or where is None:
        return
    folder = where / "plans"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, delete=False, suffix=".tmp") as f:
            f.write(pickle.dumps(pieces))
        os.replace(f.name, folder / f"{key}.pickle")  # whole or not at all, whoever writes too
    except (OSError, pickle.PicklingError):
        pass


def launch_plans(
    opts: Options, notes: list[str], what: str, planner: Callable[..., Any], *rest: Any
) -> list[tuple[tuple, int]]:
    """The plans to warm: one token count each (the first, or with pick "other" another).  A
    plan first seen past max_tokens is noted, not called (its tensors could be huge)."""
    out = []
    for key, first, other in _plan_pieces(planner, rest, opts.max_tokens):
        if first > opts.max_tokens:
            notes.append(f"{what}: plan {plan_text(key)} first appears at {first} tokens, past max_tokens: not warmed")
        else:
            out.append((key, other if opts.pick == "other" and other <= opts.max_tokens else first))
    return out


def plan_text(key: tuple) -> str:
    kernel, consts, warps, info = key
    return f"{kernel}{list(consts)} w{warps}" + (f" info={info}" if info is not None else "")


def bucket_counts(select: Callable[[int], Any], buckets: Sequence[Any], opts: Options) -> dict[int, int]:
    """Bucket index -> a token count it serves (the first, or with pick "other" the next one)."""
    found: dict[int, list[int]] = {}
    index = {id(b): i for i, b in enumerate(buckets)}
    for t in token_counts(opts.max_tokens, 2**16):
        ts = found.setdefault(index[id(select(t))], [])
        if len(ts) < 2:
            ts.append(t)
    return {i: ts[-1] if opts.pick == "other" else ts[0] for i, ts in found.items()}


def int_class(v: int) -> str:
    """How Triton's binder sees an integer argument that it specializes: equal to 1 (a constant),
    a multiple of 16 (0 included), or neither."""
    if v == 1:
        return "1"
    return "16n" if v % 16 == 0 else "n"


_Name = TypeVar("_Name")


def first_of_each_class(candidates: Sequence[tuple[_Name, tuple]]) -> list[tuple[_Name, tuple]]:
    """(name, class) candidates, smallest first: the first of each distinct class, in order."""
    seen: dict[tuple, _Name] = {}
    for name, cls in candidates:
        seen.setdefault(cls, name)
    return [(name, cls) for cls, name in seen.items()]
