"""Cached direct launches (hand-written): a launch of a class seen before skips Triton's
``JITFunction.run`` (binder, specialization key, cache lookup, hooks) and calls the compiled
kernel's launcher with the arguments in place.

``launch(kernel, grid, args, kwargs)`` keys each launch by exactly what Triton specializes on
(``launch_class``: the device, each tensor's dtype and 16-byte pointer alignment, each integer's
class (== 1, % 16, 32/64-bit range), each TMA descriptor's dtype and block shape, constexpr
values, the options); the first launch of a class
goes through Triton and remembers its ``CompiledKernel``, later ones call it directly.  Under
``TRITON_INTERPRET=1`` there is no compiled kernel: entries launch through ``interpreted_launch``
(``kernel[grid](...)``), so the cache logic still runs on the CPU.  ``POLICY_RUNTIME_DIRECT_LAUNCH=0``
turns the cache off (every launch through Triton; ``enabled`` scopes it in code).  The cache is
bounded (``LIMIT`` entries, then cleared).  A hit does not re-read Triton's knobs (debug,
instrumentation) nor re-check the kernel's global values: those are read at a class's first
launch.  Launch sites reach it through ``launch.launch_kernel``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import threading
from typing import Any, Iterator, Optional

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor


# Read as launch.py reads it (no import of launch.py, which imports this module).
INTERPRET = bool(triton.knobs.runtime.interpret)
# Read once at import: "0", "false", "off" or "no" turn the cache off (debugging).
ENV = "POLICY_RUNTIME_DIRECT_LAUNCH"
ENABLED = os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "off", "no")
# Launch classes remembered before the cache is cleared (a server sees few distinct classes).
LIMIT = 1024

_CACHE: dict[tuple, "_Entry"] = {}
# Thread id -> the launches of the call that thread is recording (call_cache.py), else empty.
RECORDERS: dict[int, list] = {}
_I32 = 2**31
_I64 = 2**63


@contextlib.contextmanager
def enabled(on: bool) -> Iterator[None]:
    """A scope with the cache on or off (process-wide; tests and bench/host_cost.py)."""
    global ENABLED
    before, ENABLED = ENABLED, on
    try:
        yield
    finally:
        ENABLED = before


def clear() -> None:
    _CACHE.clear()


def size() -> int:
    return len(_CACHE)


# ----------------------------------------------------------------------------------------------
# Launch classes


@functools.lru_cache(maxsize=None)
def _constexprs(kernel: Any) -> tuple[tuple[bool, ...], dict[str, bool], tuple[str, ...], tuple]:
    # Per kernel: constexpr flag of each parameter by position and by name, the names, defaults.
    fn = getattr(kernel, "fn", kernel)
    params = list(inspect.signature(fn).parameters.values())
    # Over-marking is safe (a value in the key only splits classes): any annotation naming
    # constexpr counts, as a string (postponed annotations) or as tl.constexpr itself.
    flags = tuple("constexpr" in str(getattr(p.annotation, "__name__", p.annotation)) for p in params)
    names = tuple(p.name for p in params)
    defaults = tuple(p.default for p in params)
    return flags, dict(zip(names, flags)), names, defaults


def _value_class(v: Any, const: bool) -> Any:
    # What Triton's specialization sees of one argument (_launch_class inlines the common cases).
    if isinstance(v, torch.Tensor):
        return (v.dtype, v.data_ptr() % 16 == 0)
    t = type(v)
    if const:
        return (t, v)  # a constexpr: its value (the type too: True and 1 are one dict key)
    if t is int:
        return _int_class(v)
    if t is bool:
        return "i1"
    if t is float:
        return "fp32"
    if t is TensorDescriptor:
        # A host TMA descriptor: Triton specializes on its dtype and block shape (shape and
        # strides are run-time arguments; the base is 16-byte aligned by construction).
        extra = (getattr(v, "padding", None), getattr(v, "round_f32_to_tf32", None))
        return (t, v.base.dtype, tuple(v.block_shape), *extra)
    return (t, v)  # None, dtypes and the rest: by value (unhashable ones are never cached)


def _int_class(v: int) -> tuple:
    # Triton's integer classes: == 1 (a constant), divisible by 16, 32-bit, 64-bit or unsigned.
    return (v == 1, v % 16 == 0, -_I32 <= v < _I32, -_I64 <= v < _I64)


def launch_class(kernel: Any, args: tuple, kwargs: dict) -> tuple:
    """The key of a launch: everything Triton's choice of compiled kernel depends on (the
    current device, each argument's class, the options and constexpr keyword values)."""
    return _launch_class(kernel, args, kwargs, torch.cuda.current_device() if not INTERPRET else -1)


def _launch_class(kernel: Any, args: tuple, kwargs: dict, dev: int) -> tuple:
    flags, by_name, _, _ = _constexprs(kernel)
    # _value_class, with its two common cases (tensors, plain ints) inline: this runs every launch.
    pos = tuple(
        [
            (v.dtype, v.data_ptr() % 16 == 0)
            if isinstance(v, torch.Tensor)
            else (v == 1, v % 16 == 0, -_I32 <= v < _I32, -_I64 <= v < _I64)
            if type(v) is int and not c
            else _value_class(v, c)
            for v, c in zip(args, flags)
        ]
    )
    kw = tuple([(k, _value_class(v, by_name.get(k, True))) for k, v in kwargs.items()])
    return (kernel, dev, pos, kw)


# ----------------------------------------------------------------------------------------------
# Entries


class _Entry:
    """How to launch one class: its compiled kernel's launcher and where each bound argument
    comes from (positional arguments, then named ones, then the signature's defaults)."""

    __slots__ = ("kernel", "compiled", "names", "tail")

    def __init__(self, kernel: Any, compiled: Any, names: tuple[str, ...], tail: tuple):
        self.kernel = kernel
        self.compiled = compiled  # None under the interpreter
        self.names = names  # kernel parameters given by name, in signature order
        self.tail = tail  # default values of the parameters given neither way

    def __call__(self, grid: tuple, args: tuple, kwargs: dict, device: int) -> None:
        compiled = self.compiled
        if compiled is None:
            interpreted_launch(self.kernel, grid, args, kwargs)
            return
        values = args + tuple([kwargs[n] for n in self.names]) + self.tail if self.names or self.tail else args
        knobs = triton.knobs.runtime
        stream = torch._C._cuda_getCurrentRawStream(device)
        enter = knobs.launch_enter_hook
        # Triton's launch metadata, for launch hooks (a profiler's); without a hook, none.
        hooked = enter is not None and getattr(enter, "calls", True)  # 3.9's HookChain: its hooks
        meta = compiled.launch_metadata(grid, stream, *values) if hooked else None
        n = len(grid)
        compiled.run(
            grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1, stream, compiled.function,
            compiled.packed_metadata, meta, enter, knobs.launch_exit_hook, *values,
        )


def _unrecorded() -> None:
    # A launch left to Triton cannot be replayed: a call recording it makes no plan.
    if RECORDERS:
        recording = RECORDERS.get(threading.get_ident())
        if recording is not None:
            recording.append(None)


class Bound:
    """One recorded launch of an entry with its grid, named arguments and defaults fixed: called
    with the positional arguments only (call_cache.py's plans)."""

    __slots__ = ("entry", "grid", "kwargs", "rest", "dims", "device")

    def __init__(self, entry: _Entry, grid: tuple, kwargs: dict, device: int):
        self.entry, self.grid, self.kwargs, self.device = entry, grid, dict(kwargs), device
        self.rest = tuple([kwargs[n] for n in entry.names]) + entry.tail
        n = len(grid)
        self.dims = (grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1)

    def __call__(self, args: tuple) -> None:
        entry = self.entry
        compiled = entry.compiled
        if compiled is None:
            interpreted_launch(entry.kernel, self.grid, args, self.kwargs)
            return
        values = args + self.rest
        knobs = triton.knobs.runtime
        stream = torch._C._cuda_getCurrentRawStream(self.device)
        enter = knobs.launch_enter_hook
        hooked = enter is not None and getattr(enter, "calls", True)  # as _Entry.__call__
        meta = compiled.launch_metadata(self.grid, stream, *values) if hooked else None
        x, y, z = self.dims
        compiled.run(
            x, y, z, stream, compiled.function, compiled.packed_metadata, meta, enter, knobs.launch_exit_hook, *values
        )


def interpreted_launch(kernel: Any, grid: tuple, args: tuple, kwargs: dict) -> None:
    """Under TRITON_INTERPRET=1 (no compiled kernel to call): ``kernel[grid](*args, **kwargs)``."""
    kernel[grid](*args, **kwargs)


def _entry(kernel: Any, compiled: Any, args: tuple, kwargs: dict) -> Optional[_Entry]:
    # The entry for a launch Triton just ran, or None where it cannot be replayed directly.
    if getattr(kernel, "pre_run_hooks", None):
        return None
    if not INTERPRET and not isinstance(kernel, triton.runtime.jit.JITFunction):
        return None  # an autotuner or heuristics wrapper adds arguments of its own: left to Triton
    _, _, names, defaults = _constexprs(kernel)
    given = [n for n in names[len(args) :] if n in kwargs]
    rest = names[len(args) + len(given) :]
    if any(n in kwargs for n in rest) or any(d is inspect.Parameter.empty for d in defaults[len(names) - len(rest) :]):
        return None  # named arguments out of signature order: left to Triton
    tail = tuple(defaults[len(names) - len(rest) :])
    if compiled is None and not INTERPRET:
        return None
    if compiled is not None and (not hasattr(compiled, "run") or not hasattr(compiled, "packed_metadata")):
        return None  # a Triton whose CompiledKernel differs: every launch through Triton
    return _Entry(kernel, compiled, tuple(given), tail)


def launch(kernel: Any, grid: tuple, args: tuple, kwargs: dict) -> None:
    """Launch ``kernel[grid](*args, **kwargs)``: directly where this launch's class was seen
    before (and the cache is on), else through Triton, remembering the compiled kernel."""
    if not ENABLED or callable(grid):
        _unrecorded()
        kernel[grid](*args, **kwargs)
        return
    dev = torch.cuda.current_device() if not INTERPRET else -1
    try:
        key = _launch_class(kernel, args, kwargs, dev)
        entry = _CACHE.get(key)
    except TypeError:  # an unhashable argument: no class to remember
        _unrecorded()
        kernel[grid](*args, **kwargs)
        return
    if entry is not None:
        entry(grid, args, kwargs, dev)
    else:
        if INTERPRET:
            interpreted_launch(kernel, grid, args, kwargs)
            compiled = None
        elif not hasattr(kernel, "run"):
            # Not a JITFunction (a benchmark's wrapper fixing some constexprs): Triton's launch.
            _unrecorded()
            kernel[grid](*args, **kwargs)
            return
        else:
            compiled = kernel.run(*args, grid=grid, warmup=False, **kwargs)
        entry = _entry(kernel, compiled, args, kwargs)
        if entry is not None:
            if len(_CACHE) >= LIMIT:
                _CACHE.clear()
            _CACHE[key] = entry
    if RECORDERS:
        recording = RECORDERS.get(threading.get_ident())
        if recording is not None:
            recording.append((entry, tuple(grid), args, kwargs, dev))


def replay(kernel: Any, grid: tuple, args: tuple, kwargs: dict) -> Any:
    """A callable that repeats one launch directly (no key, no lookup): ``bench/host_cost.py``'s
    floor of a cached launch.  Launches once through Triton to get the compiled kernel."""
    compiled = kernel.run(*args, grid=grid, warmup=False, **kwargs)
    made = _entry(kernel, compiled, args, kwargs)
    if made is None:
        raise RuntimeError(f"{getattr(kernel, '__name__', kernel)}: this launch cannot be replayed directly")
    dev = torch.cuda.current_device() if not INTERPRET else -1
    return functools.partial(made, tuple(grid), tuple(args), dict(kwargs), dev)
