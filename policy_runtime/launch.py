"""The runtime's shared launch API (hand-written): what families and generated modules use.

- Setup and launch: ``INTERPRET`` (Triton's interpreter is on), ``FIRST_LAUNCH`` / ``ready_triton``
  (Triton's one-off setup, before a process's first compiled launch), ``launch_kernel`` (every
  launch site goes through it; cached direct launches, direct.py), ``on_device`` (the device
  guard of every launch), ``programmatic`` (PDL launches possible), ``compile_only`` /
  ``compiling`` (warm-up's scope, in which launches are handed to it, not run).
- Launch plans of the memory-bound kernels: ``LaunchPlan``, ``remember``, ``run_plan``,
  ``fit_warps``, ``cdiv``, ``pow2ceil``, ``pow2floor``; ``launch_tables`` checks the launch tables a
  generated module hands its family.
- Argument checks, each written once (a ValueError or TypeError naming the operation and the
  argument): ``check_runnable`` (a CUDA tensor, or any under the interpreter), ``check_float``,
  ``check_device``, ``interpreted_bf16_dots`` (bfloat16 dots the interpreter gets wrong),
  ``first_outside`` (indices on the host out of range);
  ``FLOAT_DTYPES``, ``INDEX_DTYPES``.
Names with a leading underscore are this module's own.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from contextvars import ContextVar
from typing import Any, Callable, Iterator, Optional

import torch
import triton

from . import direct as _direct

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int64, torch.int32)
# Triton's interpreter runs kernels on CPU tensors; compiled kernels need CUDA tensors.
# Read as Triton reads it (TRITON_INTERPRET=0, false, off: compiled).
INTERPRET = bool(triton.knobs.runtime.interpret)
_MAX_GRID = 2**31 - 1
# CCCL's most items per thread: rms_norm adds warps (up to max_warps) for rows beyond it.
_MAX_ITEMS_PER_THREAD = 32
# Memoised plans per kernel before the memo is cleared (a server sees few distinct shapes).
_PLAN_CACHE_LIMIT = 4096


# ----------------------------------------------------------------------------------------------
# A process's first launch

# True until ready_triton has run (once per process; a race between threads only repeats it).
FIRST_LAUNCH = True


def ready_triton() -> None:
    """Before a process's first compiled launch: initialise Triton's CUDA driver while a thread
    computes Triton's own cache key.

    Any process's first Triton launch pays both, one after the other, inside that launch: the
    driver builds its C helper module (a compiler subprocess), and the cache key hashes Triton's
    ~500 MB compiler library (file reads and hashlib release the GIL).  Neither needs the other,
    so here they overlap (README.md gives what that saved on the H200).  Best effort: where this Triton has no ``triton_key``, only
    the driver is initialised here; where a step fails, the launch does it again and raises
    Triton's own error.
    """
    global FIRST_LAUNCH
    FIRST_LAUNCH = False
    if INTERPRET:
        return  # the interpreter compiles nothing
    try:
        from triton.runtime.cache import triton_key
    except ImportError:
        triton_key = None
    worker = None
    if triton_key is not None:
        worker = threading.Thread(target=_quietly, args=(triton_key,), name="triton_key", daemon=True)
        worker.start()
    try:
        triton.runtime.driver.active.get_current_target()
    except Exception:
        pass  # the launch initialises the driver again and raises Triton's error
    finally:
        if worker is not None:
            worker.join()


def _quietly(fn: Any) -> None:
    # A setup step whose failure the launch itself will meet and report.
    try:
        fn()
    except Exception:
        pass


# ----------------------------------------------------------------------------------------------
# Programmatic dependent launch


@functools.lru_cache(maxsize=None)
def _pdl_device(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def programmatic(t: torch.Tensor) -> bool:
    """Can kernels on ``t``'s device be launched as programmatic dependent launches (CUDA's PDL:
    ``griddepcontrol``, NVIDIA compute capability 9.0 and later)?  Not under the interpreter, and
    not on ROCm, whose torch reports a gfx number as the capability."""
    return t.is_cuda and not INTERPRET and torch.version.hip is None and _pdl_device(t.get_device())


class Chain:
    """The launches of one call as a chain of programmatic dependent launches, where ``t``'s device
    has them.  ``link()`` gives a launch's keyword arguments: constexpr ``PDL`` (the kernel calls
    ``gdc_wait()`` then ``gdc_launch_dependents()`` before it reads or writes anything, so the next
    launch may start as soon as this one has) and ``launch_pdl``: its programs are scheduled while
    the kernel before it on the stream runs (the call's previous link, or for the first link
    whatever came before the call: a router that releases its dependants early, such as
    topk_softmax's on these devices, or any kernel, which then simply finishes first) and wait on
    the device for it.  ``link(dependent=False)``: launched plainly (after everything before it on
    the stream; its wait a no-op), still letting the next one start early.  The results are those of
    plain launches in stream order.  Without PDL every link is ``PDL=False``."""

    __slots__ = ("on",)

    def __init__(self, t: torch.Tensor):
        self.on = programmatic(t)

    def link(self, dependent: bool = True) -> dict[str, bool]:
        if not self.on:
            return {"PDL": False}
        if not dependent:
            return {"PDL": True}
        return {"PDL": True, "launch_pdl": True}


# ----------------------------------------------------------------------------------------------
# Launches, and warm-up's compile-only scope

# A launch handler: (kernel, grid, args, kwargs) -> None.
_LaunchHandler = Callable[[Any, tuple, tuple, dict], None]

# The compile-only scope of this thread or asyncio task (policy_runtime/warmup/): its handler
# gets each launch instead of the GPU.  Threads started inside a scope launch as usual.
_COMPILE_ONLY: ContextVar[Optional[_LaunchHandler]] = ContextVar("policy_runtime_compile_only", default=None)
# Scopes open in the process: until one opens, a launch reads no context variable.
_SCOPES = 0
_SCOPES_LOCK = threading.Lock()


def launch_kernel(kernel: Any, grid: tuple, *args: Any, **kwargs: Any) -> None:
    """``kernel[grid](*args, **kwargs)``; inside a compile-only scope, the scope's handler gets
    the launch instead (warm-up compiles it without running it).  Every launch site of the
    kernel modules goes through here, or through ``run_plan``.

    Triton's FP fusion (``a * b + c`` contracted to one fused multiply-add) is asked for on every
    launch: Triton 3.9 warns that its default turns off in 3.10, which would change every kernel's
    rounding and speed with the Triton version.  ``TRITON_FORCE_DISABLE_FP_FUSION=1`` still turns
    it off."""
    kwargs["enable_fp_fusion"] = True
    if _SCOPES:
        handler = _COMPILE_ONLY.get()
        if handler is not None:
            handler(kernel, grid, args, kwargs)
            return
    _direct.launch(kernel, grid, args, kwargs)


_NO_GUARD = contextlib.nullcontext()


@functools.cache
def _several_gpus() -> bool:
    # Only a process that sees several GPUs can have tensors off the current device.
    return torch.cuda.device_count() > 1


def on_device(t: torch.Tensor) -> contextlib.AbstractContextManager:
    """``with on_device(t):`` around the launches of a call on ``t``: Triton's first-launch
    setup (once per process), then a ``torch.cuda.device`` guard where ``t`` is a CUDA tensor
    off the current device, else a no-op context.  Every launch site's one device guard."""
    if FIRST_LAUNCH:
        ready_triton()
    if t.is_cuda and _several_gpus() and t.get_device() != torch.cuda.current_device():
        return torch.cuda.device(t.device)
    return _NO_GUARD


@contextlib.contextmanager
def compile_only(handler: _LaunchHandler) -> Iterator[None]:
    """A scope in which this thread's (or task's) launches go to ``handler``, not to the GPU:
    the host side of each call runs (checks, plans, workspaces, outputs allocated), the kernels
    do not, and outputs are left as they were."""
    global _SCOPES
    with _SCOPES_LOCK:
        _SCOPES += 1
    token = _COMPILE_ONLY.set(handler)
    try:
        yield
    finally:
        _COMPILE_ONLY.reset(token)
        with _SCOPES_LOCK:
            _SCOPES -= 1


def scopes_open() -> bool:
    """Is a compile-only scope open anywhere in the process (call_cache.py then plans nothing)?"""
    return bool(_SCOPES)


def compiling() -> bool:
    """Is this thread (or task) in a compile-only scope?  Paths that run no Triton kernel (a
    vendor kernel, PyTorch) skip their work there."""
    return bool(_SCOPES) and _COMPILE_ONLY.get() is not None


def interpreted_bf16_dots(t: torch.Tensor) -> Optional[str]:
    """Why the interpreter cannot run a kernel whose dots take ``t``'s bfloat16 values, or None.
    Triton's interpreter keeps bfloat16 as uint16, and its ``tl.dot`` multiplies those raw bits
    (triton-lang/triton#11584; its maintainers: the interpreter does not support bfloat16): such a
    call returned values near 1e10, silently.  Elementwise bfloat16 work is right there, and a
    compile-only scope runs nothing (warm-up plans bfloat16 kernels on the CPU): None for both."""
    if INTERPRET and t.dtype == torch.bfloat16 and not compiling():
        return (
            "bfloat16, whose dots Triton's interpreter (TRITON_INTERPRET=1) computes from the raw bits "
            "(triton-lang/triton#11584): on the CPU use float16 or float32; bfloat16 runs on a GPU"
        )
    return None


# ----------------------------------------------------------------------------------------------
# Launch plans


def pow2ceil(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def pow2floor(n: int) -> int:
    return 1 if n <= 1 else 1 << (n.bit_length() - 1)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class LaunchPlan:
    """How to launch one call signature: grid-bound kernel, constexpr values, num_warps."""

    __slots__ = ("kernel", "grid", "consts", "num_warps", "info")

    def __init__(self, kernel, grid: int, consts: tuple, num_warps: int, info: Any = None):
        if grid > _MAX_GRID:
            raise ValueError(f"a grid of {grid} programs exceeds {_MAX_GRID}")
        self.kernel = kernel
        self.grid = grid
        self.consts = consts
        self.num_warps = num_warps
        self.info = info  # runtime arguments that follow from the plan (block counts)


def remember(plans: dict, key: tuple, plan: LaunchPlan) -> LaunchPlan:
    if len(plans) >= _PLAN_CACHE_LIMIT:
        plans.clear()
    plans[key] = plan
    return plan


def run_plan(plan: LaunchPlan, on: torch.Tensor, args: tuple) -> None:
    """Launch the plan on ``on``'s device (``on_device``), through ``launch_kernel``."""
    with on_device(on):
        launch_kernel(plan.kernel, (plan.grid,), *args, *plan.consts, num_warps=plan.num_warps)


def fit_warps(elems: int, vec: int, cfg: Any, grow: bool = False) -> int:
    """The record's num_warps, halved until each thread has at least one ``vec`` vector; with
    ``grow``, first doubled (up to max_warps) while a thread would hold more than
    _MAX_ITEMS_PER_THREAD elements."""
    w = cfg.num_warps
    if grow:
        while elems > w * cfg.warp_size * _MAX_ITEMS_PER_THREAD and w < cfg.max_warps:
            w *= 2
    while w > 1 and elems < w * cfg.warp_size * vec:
        w //= 2
    return w


# ----------------------------------------------------------------------------------------------
# Validation


def first_outside(t: torch.Tensor, lo: Any, hi: Any, where: Optional[torch.Tensor] = None) -> Optional[tuple[int, ...]]:
    """The index of ``t``'s first element outside [lo, hi) (``where`` True there, if given), or
    None: the range check of indices a call has on the host (CPU tensors; on a GPU it would take a
    device sync).  ``lo`` and ``hi`` are numbers or tensors that broadcast against ``t``."""
    bad = (t < lo) | (t >= hi)
    if where is not None:
        bad &= where
    found = bad.nonzero()
    return tuple(int(i) for i in found[0]) if found.shape[0] else None


def check_float(op: str, name: str, t: torch.Tensor) -> None:
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{op}: {name} has dtype {t.dtype}; expected float16, bfloat16 or float32")


def check_runnable(op: str, name: str, t: torch.Tensor) -> None:
    if not INTERPRET and not t.is_cuda:
        raise ValueError(
            f"{op}: {name} must be a CUDA tensor (got device {t.device}); " "set TRITON_INTERPRET=1 to run on the CPU"
        )


def check_device(op: str, name: str, t: torch.Tensor, dev: int, first: str) -> None:
    if t.get_device() != dev:
        raise ValueError(f"{op}: {name} is on {t.device}, expected the device of {first}")


# ----------------------------------------------------------------------------------------------
# Launch records


def launch_tables(owner: str, kernels: tuple[str, ...], launch: Any) -> dict[str, dict[str, Any]]:
    """``launch`` (kernel name -> target name -> launch record) as plain dicts, checked to name
    exactly ``kernels``: a generated module that lacks a table fails at import, not at a call."""
    missing = [k for k in kernels if k not in launch]
    unknown = sorted(k for k in launch if k not in kernels)
    if missing or unknown:
        raise ValueError(
            f"{owner}: launch tables must be given for exactly {', '.join(kernels)}; "
            f"missing {missing or 'none'}, unknown {unknown or 'none'}"
        )
    return {k: dict(launch[k]) for k in kernels}
