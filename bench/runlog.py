"""What the benchmark scripts share: a run's clock, its log lines, and its results file.

A script makes one ``RunLog`` at import (after its arguments are parsed) and uses its methods where it
used to keep its own copies: ``log`` prefixes every line with the seconds since the run began,
``write`` rewrites the results JSON atomically (a killed run leaves the previous phase's file whole),
``sync`` and ``release`` wait for the GPU (nothing in a CPU smoke run).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Optional

import torch


class RunLog:
    def __init__(self, name: str, results: dict, *, smoke: bool, json_arg: Optional[str] = None):
        # The results file's default name ($OUT/<name>.json), the dict it holds, whether the run is
        # a CPU smoke run (no CUDA calls), and --json when given.
        self.name = name
        self.results = results
        self.smoke = smoke
        self.json_arg = json_arg
        self.t0 = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def log(self, *a: Any) -> None:
        print(f"[{self.elapsed():6.1f}s]", *a, flush=True)

    def sync(self) -> None:
        if not self.smoke:
            torch.cuda.synchronize()

    def release(self) -> None:
        """Wait for the GPU and return cached blocks to it (between cases of different sizes)."""
        if not self.smoke:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

    def path(self) -> Optional[str]:
        """--json, else $OUT/<name>.json, else None (no file)."""
        if self.json_arg:
            return self.json_arg
        out = os.environ.get("OUT")
        return os.path.join(out, f"{self.name}.json") if out else None

    def write(self) -> None:
        """Rewrite the results file (with the run's elapsed seconds in results["meta"]); a file that
        cannot be written is reported in the log, and the run goes on."""
        p = self.path()
        if not p:
            return
        self.results.setdefault("meta", {})["elapsed_s"] = round(self.elapsed(), 1)
        try:
            os.makedirs(os.path.dirname(os.path.abspath(p)), exist_ok=True)
            with open(p + ".tmp", "w") as f:
                json.dump(self.results, f, indent=1, default=str)
            os.replace(p + ".tmp", p)
        except OSError as e:
            self.log(f"could not write {p}: {e}")
