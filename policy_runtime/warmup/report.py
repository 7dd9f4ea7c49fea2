"""What a warm-up did (``Report``: its summary and its JSON) and its progress bar (hand-written)."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any, Optional

__all__ = ["Kernel", "Report", "Progress"]



@dataclass
class Kernel:
    """One compiled kernel (a unit): what it is, its Triton hashes, time, error."""

    name: str
    module: str
    calls: list[str]
    hashes: list[str]
    seconds: float
    error: Optional[str]
    where: str  # "this process" or "worker"
    compiled_now: Optional[bool] = None


@dataclass
class Report:
    """What a warm-up did.  ``str(report)`` is its summary; ``to_json()`` its data."""

    target: str
    dtypes: tuple[str, ...]
    models: tuple[str, ...]
    modules: tuple[str, ...]
    interpreter: bool
    calls: int
    launches: int
    kernels: list[Kernel]
    notes: list[str]
    failed_calls: list[str]
    wall_s: float
    workers: int
    cache_dir: str
    new_cache_entries: int

    @property
    def failed(self) -> list[Kernel]:
        return [k for k in self.kernels if k.error is not None]

    @property
    def ok(self) -> bool:
        return not self.failed and not self.failed_calls

    @property
    def compiled_now(self) -> int:
        return sum(1 for k in self.kernels if k.compiled_now)

    @property
    def compile_s(self) -> float:
        return sum(k.seconds for k in self.kernels)

    def by_module(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for k in self.kernels:
            out[k.module.rsplit(".", 1)[-1]] = out.get(k.module.rsplit(".", 1)[-1], 0) + 1
        return dict(sorted(out.items()))

    def __str__(self) -> str:
        n = len(self.kernels)
        lines = [
            f"warm-up of {self.target} ({', '.join(self.dtypes)}; models {', '.join(self.models) or 'none'}): "
            f"{_count(len(self.modules), 'module')}, {_count(self.calls, 'call')}, {_count(self.launches, 'launch')}"
        ]
        if self.interpreter:
            lines.append(f"  kernels: {n} planned; Triton's interpreter (TRITON_INTERPRET=1) compiles nothing")
        else:
            known = [k for k in self.kernels if k.compiled_now is not None and k.error is None]
            split = ""
            if known:
                now = sum(1 for k in known if k.compiled_now)
                split = f" ({now} compiled now, {len(known) - now} from the cache)"
            lines.append(f"  kernels: {n - len(self.failed)} ready{split}, {len(self.failed)} failed")
        where = f"{self.workers} worker processes and this one" if self.workers else "this process"
        lines.append(f"  wall time: {self.wall_s:.1f} s in {where} (compile time summed: {self.compile_s:.1f} s)")
        lines.append(f"  cache: {self.cache_dir} ({self.new_cache_entries} new entries)")
        lines.append("  per module: " + ", ".join(f"{m} {c}" for m, c in self.by_module().items()))
        for k in self.failed:
            lines.append(f"  FAILED {k.name} ({k.calls[0] if k.calls else k.module}): {k.error}")
        for c in self.failed_calls:
            lines.append(f"  FAILED call {c}")
        for note in self.notes:
            lines.append(f"  note: {note}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "dtypes": list(self.dtypes),
            "models": list(self.models),
            "modules": list(self.modules),
            "interpreter": self.interpreter,
            "calls": self.calls,
            "launches": self.launches,
            "kernels": len(self.kernels),
            "compiled_now": self.compiled_now,
            "failed": len(self.failed),
            "wall_s": self.wall_s,
            "compile_s": self.compile_s,
            "workers": self.workers,
            "cache_dir": self.cache_dir,
            "new_cache_entries": self.new_cache_entries,
            "by_module": self.by_module(),
            "notes": self.notes,
            "failed_calls": self.failed_calls,
            "kernel_list": [
                {
                    "name": k.name,
                    "module": k.module,
                    "calls": k.calls,
                    "hashes": k.hashes,
                    "seconds": k.seconds,
                    "error": k.error,
                    "where": k.where,
                    "compiled_now": k.compiled_now,
                }
                for k in self.kernels
            ],
        }


def _count(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "es" if word.endswith("h") else "s")


class Progress:
    """A one-line progress bar on stderr (redrawn in a terminal, a line per tenth otherwise)."""

    def __init__(self, total: int, enabled: bool, stream: Any = None) -> None:
        self.total, self.enabled = total, enabled and total > 0
        self.stream = stream or sys.stderr
        self.done, self.t0, self.step = 0, time.perf_counter(), -1
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def advance(self, what: str) -> None:
        self.done += 1
        if not self.enabled:
            return
        frac = self.done / self.total
        bar = "#" * int(frac * 30)
        line = f"warm-up [{bar:<30}] {self.done}/{self.total} kernels {time.perf_counter() - self.t0:5.1f} s {what}"
        if self.tty:
            self.stream.write("\r" + line[:119].ljust(119))
            if self.done == self.total:
                self.stream.write("\n")
        elif int(frac * 10) > self.step:
            self.step = int(frac * 10)
            self.stream.write(line + "\n")
        self.stream.flush()

