"""The warm-up engine (hand-written): plan, group, compile, spread over worker processes.

``plan`` asks each module's family driver (``policy_runtime.<family>.FAMILY``, found by the
module's name) for its representative calls and runs each in a compile-only scope
(``policy_runtime.launch.compile_only``): the host side runs as in a real call and every launch
goes to the scope instead of the GPU.  Launches are grouped by their specialization key (one group
is one kernel to compile).  ``warmup`` compiles each group with Triton's own
``kernel.warmup(...)`` and loads its binary: in this process, lightest first, until one had to be
compiled; the rest in spawned worker processes, heaviest first, sharing Triton's on-disk cache
(``TRITON_CACHE_DIR``), then loaded here from it.  Under TRITON_INTERPRET=1 nothing is compiled;
the calls and launches are still planned.
"""

from __future__ import annotations

import base64
import concurrent.futures
import importlib
import inspect
import multiprocessing
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Sequence

import torch
import triton

from .. import family as _family
from .. import launch as _launch
from .calls import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_DTYPES,
    DEFAULT_MAX_TOKENS,
    DTYPE_ALIASES,
    DTYPES,
    Call,
    Options,
    device,
)
from .report import Kernel, Progress, Report

__all__ = ["Plan", "Unit", "plan", "warmup", "launch_key"]

# A compile that took longer than this, or wrote to the cache, was not a cache hit.
_COMPILED_S = 0.25


# ----------------------------------------------------------------------------------------------
# Launch keys: what Triton compiles a launch by


def _params(kernel: Any) -> Optional[list[tuple[str, bool, bool, bool]]]:
    """(name, constexpr, do_not_specialize, do_not_specialize_on_alignment) per parameter of a
    jitted (or interpreted) kernel; None for anything else (a test's stand-in)."""
    cached = getattr(kernel, "_policy_runtime_params", None)
    if cached is not None:
        return cached
    fn = getattr(kernel, "fn", None)
    if fn is None:
        return None
    kw = getattr(kernel, "kwargs", None) or {}
    dns = set(getattr(kernel, "do_not_specialize", None) or kw.get("do_not_specialize") or ())
    dnsa = set(
        getattr(kernel, "do_not_specialize_on_alignment", None) or kw.get("do_not_specialize_on_alignment") or ()
    )
    params = [
        (p.name, "constexpr" in str(p.annotation), p.name in dns or i in dns, p.name in dnsa or i in dnsa)
        for i, p in enumerate(inspect.signature(fn).parameters.values())
    ]
    try:
        kernel._policy_runtime_params = params
    except AttributeError:
        pass
    return params


try:  # Triton >= 3.5: the binder's own specialization of one argument
    from triton.backends.compiler import BaseBackend as _BaseBackend
    from triton.runtime.jit import native_specialize_impl as _native_specialize
except ImportError:  # pragma: no cover - older Triton
    _native_specialize = None


def _arg_class(value: Any, param: Optional[tuple[str, bool, bool, bool]]) -> Any:
    """How Triton's binder specializes one argument: its type and divisibility (or the value
    of a constant)."""
    if param is not None and param[1]:
        return ("constexpr", repr(value))
    specialize = param is None or not param[2]
    align = param is None or not param[3]
    if _native_specialize is not None:
        try:
            return _native_specialize(_BaseBackend, value, False, specialize, align)
        except Exception:
            pass
    if isinstance(value, torch.Tensor):
        return (str(value.dtype), align and value.data_ptr() % 16 == 0)
    if isinstance(value, bool) or value is None or isinstance(value, float):
        return (type(value).__name__,)
    if isinstance(value, int):
        if specialize and value == 1:
            return ("constexpr", 1)
        return ("i32" if -(2**31) <= value < 2**31 else "i64", specialize and value % 16 == 0)
    return (type(value).__name__, repr(value))


def _kernel_name(kernel: Any) -> str:
    return getattr(kernel, "__name__", None) or type(kernel).__name__


def launch_key(kernel: Any, args: tuple, kwargs: dict) -> tuple:
    """The launch's specialization key: kernel, argument classes, constants and options (what
    Triton compiles one binary for; a coarser grouping than this never loses a launch, see
    ``_units``)."""
    params = _params(kernel)
    by_name = {p[0]: p for p in params or ()}
    classes = tuple(_arg_class(a, params[i] if params and i < len(params) else None) for i, a in enumerate(args))
    options = tuple(
        sorted((k, _arg_class(v, by_name[k]) if k in by_name else ("option", repr(v))) for k, v in kwargs.items())
    )
    fn = getattr(kernel, "fn", None)
    where = f"{fn.__module__}.{fn.__qualname__}" if fn is not None else _kernel_name(kernel)
    return (where, classes, options)



# ----------------------------------------------------------------------------------------------
# Compile-only runs


@dataclass
class _Compiled:
    kernel: str
    hash: Optional[str]
    seconds: float
    error: Optional[str]


def _compile(kernel: Any, grid: tuple, args: tuple, kwargs: dict) -> _Compiled:
    """Triton's warm-up of one launch (compile, or load from the cache; nothing runs), then its
    binary loaded as a first launch would (Triton builds the launcher there, where it builds one
    per signature, and checks the kernel's resources on this device)."""
    t0 = time.perf_counter()
    try:
        compiled = kernel.warmup(*args, grid=grid, **kwargs)
        init = getattr(compiled, "_init_handles", None)
        if init is not None:
            init()
        return _Compiled(_kernel_name(kernel), getattr(compiled, "hash", None), time.perf_counter() - t0, None)
    except Exception as exc:  # reported with the kernel; the other kernels go on
        message = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:500]
        return _Compiled(_kernel_name(kernel), None, time.perf_counter() - t0, message)


class _Handler:
    """The compile-only scope's handler for one call: records every launch (kernel, key) and
    compiles those whose number is in ``compile``."""

    def __init__(self, compile: frozenset[int] = frozenset()) -> None:
        self.compile = compile
        self.launches: list[tuple[str, tuple]] = []
        self.compiled: dict[int, _Compiled] = {}

    def __call__(self, kernel: Any, grid: tuple, args: tuple, kwargs: dict) -> None:
        number = len(self.launches)
        self.launches.append((_kernel_name(kernel), launch_key(kernel, args, kwargs)))
        if number in self.compile:
            self.compiled[number] = _compile(kernel, grid, args, kwargs)


# Drivers built so far, by module name (a driver memoises what it searched, e.g. matmul's shapes).
_DRIVERS: dict[str, Any] = {}


def driver(module: str) -> Any:
    """The warm-up driver of a generated module (``generated.matmul``), or None: its family's
    (``policy_runtime.matmul``, by the module's name) over the tables the module hands warm-up
    (``WARMUP_TABLES``; generated modules do not import the warm-up)."""
    if module not in _DRIVERS:
        family = _family.find(module.rpartition(".")[2])
        tables = getattr(importlib.import_module(module), "WARMUP_TABLES", None)
        found = None
        if family is not None and family.driver is not None and tables is not None:
            found = family.driver()(module, tables)
        _DRIVERS[module] = found
    return _DRIVERS[module]


def _run_call(call: Call, device: torch.device, compile: frozenset[int] = frozenset()) -> _Handler:
    handler = _Handler(compile)
    with _launch.compile_only(handler):
        driver(call.module).run(call, device)
    return handler



# ----------------------------------------------------------------------------------------------
# Plans: calls, their launches, and the kernels (groups of launches) to compile


@dataclass(frozen=True)
class Unit:
    """One kernel to compile: the launches (call index, launch number) that share a key."""

    kernel: str
    module: str
    key: tuple
    launches: tuple[tuple[int, int], ...]
    weight: int


@dataclass
class Plan:
    """What a warm-up compiles: the calls, each call's launches (kernel name, key), the kernels."""

    options: Options
    modules: tuple[str, ...]
    calls: list[Call]
    launches: list[list[tuple[str, tuple]]]
    units: list[Unit]
    notes: list[str]
    # Call index -> why it failed (a representative call that raised).
    failed: dict[int, str]

    def keys(self) -> set[tuple]:
        return {key for launches in self.launches for _, key in launches}


def _units(calls: list[Call], launches: list[list[tuple[str, tuple]]]) -> list[Unit]:
    """Launches grouped by key, the heaviest calls' kernels first (then in call order).  A group
    is compiled by one process, launch by launch, so launches that Triton would tell apart but
    the key does not are all still compiled."""
    groups: dict[tuple, list[tuple[int, int]]] = {}
    first: dict[tuple, tuple[str, str, int]] = {}
    for i, per_call in enumerate(launches):
        for j, (name, key) in enumerate(per_call):
            groups.setdefault(key, []).append((i, j))
            first.setdefault(key, (name, calls[i].module, calls[i].weight))
    units = [Unit(first[k][0], first[k][1], k, tuple(v), max(calls[i].weight for i, _ in v)) for k, v in groups.items()]
    return sorted(units, key=lambda u: -u.weight)


def _options(
    dispatch: Any,
    hw: Any,
    dtypes: Optional[Iterable[Any]],
    models: Optional[Iterable[str]],
    block_size: int,
    max_tokens: int,
    pick: str,
) -> Options:
    if isinstance(hw, str) and hw not in dispatch.HARDWARE:
        raise ValueError(f"unknown hw {hw!r}; known: {', '.join(sorted(dispatch.HARDWARE))}")
    target = dispatch.target_name(hw, None)
    names = []
    for d in DEFAULT_DTYPES if dtypes is None else dtypes:
        name = next((n for n, t in DTYPES.items() if t == d), None) if isinstance(d, torch.dtype) else None
        if name is None and isinstance(d, str):
            name = DTYPE_ALIASES.get(d.lower(), d.lower())
        if name not in DTYPES:
            raise ValueError(f"unknown dtype {d!r}; expected {', '.join(DTYPES)} (or {', '.join(DTYPE_ALIASES)})")
        if name not in names:
            names.append(name)
    if not names:
        raise ValueError("no dtypes given")
    dims = getattr(dispatch, "MODEL_DIMS", {})
    chosen = list(dims) if models is None else list(models)
    unknown = [m for m in chosen if m not in dims]
    if unknown:
        raise ValueError(f"unknown model {unknown[0]!r}; known: {', '.join(dims) or 'none'}")
    if block_size < 1 or max_tokens < 1:
        raise ValueError(f"block_size and max_tokens must be positive, got {block_size} and {max_tokens}")
    if pick not in ("first", "other"):
        raise ValueError(f"pick must be 'first' or 'other', got {pick!r}")
    return Options(target, tuple(names), {m: dict(dims[m]) for m in chosen}, block_size, max_tokens, pick)


def _package(modules: Sequence[str]) -> str:
    packages = {m.rpartition(".")[0] for m in modules}
    if len(packages) != 1 or not next(iter(packages)):
        raise ValueError(f"modules must be kernel modules of one generated package, got {list(modules)}")
    return packages.pop()


def plan(
    modules: Sequence[str],
    hw: Any = None,
    *,
    dtypes: Optional[Iterable[Any]] = None,
    models: Optional[Iterable[str]] = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    pick: str = "first",
) -> Plan:
    """The representative calls of ``modules`` (e.g. ``["generated.matmul"]``) for a target, run
    in a compile-only scope that compiles nothing: their launches and the kernels they need."""
    modules = tuple(modules)
    dispatch = importlib.import_module(_package(modules) + ".dispatch")
    opts = _options(dispatch, hw, dtypes, models, block_size, max_tokens, pick)
    dev = device()  # before the calls are listed (seconds of token counts): no GPU fails at once
    calls, notes = [], []
    for module in modules:
        found = driver(module)
        if found is None:
            notes.append(f"{module} has no warm-up driver (no family package with one, or no WARMUP_TABLES)")
            continue
        more, why = found.calls(opts)
        calls += more
        notes += why
    seen, unique = set(), []
    for call in calls:  # equal calls (models with equal dimensions): one of them
        if (call.module, call.op, call.args) not in seen:
            seen.add((call.module, call.op, call.args))
            unique.append(call)
    launches, failed = [], {}
    for i, call in enumerate(unique):
        try:
            launches.append(_run_call(call, dev).launches)
        except Exception as exc:
            launches.append([])
            failed[i] = f"{type(exc).__name__}: {exc}"
    return Plan(opts, modules, unique, launches, _units(unique, launches), notes, failed)



# ----------------------------------------------------------------------------------------------
# Compiling a plan


def _cache_dir() -> str:
    knobs = getattr(triton, "knobs", None)
    d = getattr(getattr(knobs, "cache", None), "dir", None)
    return d or os.environ.get("TRITON_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".triton", "cache")


def _cache_entries(cache_dir: str) -> set[str]:
    try:
        return set(os.listdir(cache_dir))
    except OSError:
        return set()


def _entry(kernel_hash: str) -> str:
    # Triton's file cache keeps a kernel in a folder named after its hash in base 32.
    return base64.b32encode(bytes.fromhex(kernel_hash)).decode().rstrip("=")


def _compile_unit(unit: Unit, calls: Any, device: torch.device) -> list[_Compiled]:
    """Compile one unit in this process: run each of its calls, compiling its launches there."""
    by_call: dict[int, set[int]] = {}
    for i, j in unit.launches:
        by_call.setdefault(i, set()).add(j)
    out = []
    for i, numbers in by_call.items():
        try:
            handler = _run_call(calls[i], device, frozenset(numbers))
        except Exception as exc:
            out.append(_Compiled(unit.kernel, None, 0.0, f"{calls[i].describe()}: {type(exc).__name__}: {exc}"))
            continue
        for j in sorted(numbers):
            got = handler.compiled.get(j)
            if got is None or handler.launches[j][0] != unit.kernel:  # the call launched otherwise this time
                got = _Compiled(unit.kernel, None, 0.0, f"{calls[i].describe()}: launch {j} is not {unit.kernel}")
            out.append(got)
    return out


def _worker_init(cache_dir: str, device_index: Optional[int]) -> None:
    os.environ["TRITON_CACHE_DIR"] = cache_dir
    knobs = getattr(triton, "knobs", None)
    if knobs is not None and hasattr(knobs, "cache"):
        try:
            knobs.cache.dir = cache_dir
        except Exception:
            pass
    if device_index is not None:
        torch.cuda.set_device(device_index)


def _worker_compile(unit: Unit, calls: dict[int, Call]) -> list[_Compiled]:
    """In a worker process: one unit, given the calls it needs (by their index in the plan)."""
    return _compile_unit(unit, calls, device())


def _default_workers() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _compile_in_workers(
    units: Sequence[Unit],
    calls: Sequence[Call],
    workers: int,
    cache_dir: str,
    done: Callable[[int, list[_Compiled]], None],
) -> None:
    """Compile ``units`` in ``workers`` spawned processes (a unit a task, taken in order as
    processes free up); ``done(index, results)`` as each finishes."""
    device_index = None if _launch.INTERPRET else torch.cuda.current_device()
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(
        max_workers=workers, mp_context=context, initializer=_worker_init, initargs=(cache_dir, device_index)
    ) as pool:
        futures = {}
        for index, unit in enumerate(units):
            needed = {i: calls[i] for i, _ in unit.launches}
            futures[pool.submit(_worker_compile, unit, needed)] = index
        for future in concurrent.futures.as_completed(futures):
            index = futures[future]
            try:
                results = future.result()
            except Exception as exc:  # a worker that died: the kernel is reported failed
                results = [_Compiled(units[index].kernel, None, 0.0, f"worker process: {type(exc).__name__}: {exc}")]
            done(index, results)



def warmup(
    modules: Sequence[str],
    hw: Any = None,
    *,
    dtypes: Optional[Iterable[Any]] = None,
    workers: Optional[int] = None,
    models: Optional[Iterable[str]] = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    load: bool = True,
    progress: bool = False,
) -> Report:
    """Compile every kernel of ``modules`` (``["generated.matmul", ...]``) that the target's
    policies can launch, running none; returns a ``Report``.

    ``hw``: a spec name, a HARDWARE record, or None to detect the device.  ``dtypes``: names
    (``"bfloat16"``, ``"float16"``, ``"float32"``; ``bf16``, ``fp16``, ``fp32``) or torch dtypes;
    default bfloat16 and float16.  ``workers``: processes to compile in when the cache is cold
    (default: the CPUs this process may use; 0 or 1: this process only).  ``models``: names in
    ``generated.dispatch.MODEL_DIMS`` (default all).  ``block_size``: the KV-cache block size
    (default 16).  ``max_tokens``: token counts searched exhaustively (default 16384).  ``load``:
    leave every kernel loaded in this process too (so its first calls load nothing), not only in
    Triton's cache.  ``progress``: a progress bar on stderr.  Bad arguments raise ValueError.
    Spawned workers import this process's main module, as any ``multiprocessing`` spawn does: call
    this under ``if __name__ == "__main__":`` in a script.
    """
    t0 = time.perf_counter()
    if not _launch.INTERPRET and not torch.cuda.is_available():
        raise RuntimeError(
            "warm-up compiles for this machine's GPU and there is none; under TRITON_INTERPRET=1 it plans the calls only"
        )
    p = plan(modules, hw, dtypes=dtypes, models=models, block_size=block_size, max_tokens=max_tokens)
    workers = _default_workers() if workers is None else max(0, int(workers))
    cache_dir = _cache_dir()
    before = _cache_entries(cache_dir)
    dev = device()
    results: dict[int, tuple[list[_Compiled], str]] = {}
    bar = Progress(len(p.units), progress)

    def finish(index: int, compiled: list[_Compiled], where: str) -> None:
        results[index] = (compiled, where)
        bar.advance(p.units[index].kernel)

    # This process first, lightest kernels first; once one had to be compiled (a cold cache), the
    # rest go to worker processes, heaviest first.
    pending = list(range(len(p.units)))
    used = 0
    while pending:
        index = pending.pop()
        entries = _cache_entries(cache_dir)
        compiled = _compile_unit(p.units[index], p.calls, dev)
        finish(index, compiled, "this process")
        cold = _cache_entries(cache_dir) != entries or sum(c.seconds for c in compiled) > _COMPILED_S
        if cold and workers > 1 and len(pending) > 1 and not _launch.INTERPRET:
            used = min(workers, len(pending))
            break
    if used:
        rest = [p.units[i] for i in pending]
        try:
            _compile_in_workers(rest, p.calls, used, cache_dir, lambda k, c: finish(pending[k], c, "worker"))
        except Exception as exc:  # no worker processes here (e.g. a main module that spawns): this process
            p.notes.append(f"worker processes failed ({type(exc).__name__}: {exc}); compiled in this process")
            for index in pending:
                if index not in results:
                    finish(index, _compile_unit(p.units[index], p.calls, dev), "this process")
        if load:
            for index in pending:
                _compile_unit(p.units[index], p.calls, dev)
    after = _cache_entries(cache_dir)
    new = after - before
    kernels = []
    for index, unit in enumerate(p.units):
        compiled, where = results[index]
        hashes = sorted({c.hash for c in compiled if c.hash})
        error = next((c.error for c in compiled if c.error), None)
        now = None
        if hashes and all(_entry(h) in after for h in hashes):
            now = any(_entry(h) in new for h in hashes)
        calls = sorted({p.calls[i].describe() for i, _ in unit.launches})
        kernels.append(
            Kernel(unit.kernel, unit.module, calls, hashes, sum(c.seconds for c in compiled), error, where, now)
        )
    return Report(
        target=p.options.target,
        dtypes=p.options.dtypes,
        models=tuple(p.options.models),
        modules=p.modules,
        interpreter=_launch.INTERPRET,
        calls=len(p.calls),
        launches=sum(len(x) for x in p.launches),
        kernels=kernels,
        notes=p.notes,
        failed_calls=[f"{p.calls[i].describe()}: {why}" for i, why in sorted(p.failed.items())],
        wall_s=time.perf_counter() - t0,
        workers=used,
        cache_dir=cache_dir,
        new_cache_entries=len(new),
    )

