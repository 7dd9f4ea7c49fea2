"""Shared helpers: temporary project trees and in-process CLI runs."""

from __future__ import annotations

import io
import shutil
import textwrap
from dataclasses import dataclass
from pathlib import Path

import os

import pytest

# pytest-xdist's workers share the cores: each worker's torch (and the processes it starts) gets
# its share of them for intra-op threads.  Left at torch's default, every worker runs a thread per
# core, and N workers on N cores spend CPU time contending (the interpreter's kernel tests about
# doubled their CPU time on 2 cores).  Set before torch is first imported; an explicit
# OMP_NUM_THREADS is kept.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
if _WORKERS > 1 and "OMP_NUM_THREADS" not in os.environ:
    _CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    os.environ["OMP_NUM_THREADS"] = str(max(1, _CORES // _WORKERS))

# Kernel tests run on the CPU in Triton's interpreter when there is no GPU.  The
# variable must be set before triton is first imported (by any test module).
try:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
except ImportError:  # the compiler's own tests do not need torch
    pass

REPO = Path(__file__).resolve().parent.parent


@dataclass
class CliResult:
    code: int
    out: str
    err: str


def run_cli(*argv: str) -> CliResult:
    from codegen.cli import main  # imported here: kernel tests on a GPU machine need no compiler

    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return CliResult(code, out.getvalue(), err.getvalue())


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of the real project's specs/ and committed generated/ and schemas/ in a temporary root."""
    root = tmp_path / "proj"
    root.mkdir()
    shutil.copytree(REPO / "specs", root / "specs")
    shutil.copytree(REPO / "schemas", root / "schemas")
    shutil.copytree(REPO / "generated", root / "generated", ignore=shutil.ignore_patterns("__pycache__"))
    return root


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Bytes and mtime of every file below ``folder``: equal snapshots mean untouched."""
    return {
        p.relative_to(folder).as_posix(): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def hw_toml(vendor: str = "nvidia", arch: int = 80, *, optin: int = 166912, per_sm: int | None = None, **over) -> str:
    """A minimal, valid hardware spec; keyword arguments override fields."""
    fields = {
        "display_name": f'"{vendor} {arch}"',
        "vendor": f'"{vendor}"',
        "arch": arch,
        "device_names": f'["{vendor.upper()}{arch}X{optin}"]',
        "warp_size": 32,
        "max_threads_per_block": 1024,
        "max_threads_per_sm": 2048,
        "max_shared_memory_per_block": 49152,
        "max_shared_memory_per_block_optin": optin,
        "shared_memory_per_sm": per_sm or optin + 1024,
        "max_registers_per_thread": 255,
        "l2_cache_size_bytes": 1 << 20,
        "memory_bandwidth_gbps": 1000,
        "sm_count": 100,
        "bytes_in_flight": 16384,
    }
    fields.update(over)
    body = "\n".join(f"{k} = {v}" for k, v in fields.items())
    numbers = [k for k in fields if k not in ("display_name", "vendor", "device_names")]
    cite = "".join(f'{k} = "T"\n' for k in numbers)
    return (
        body
        + "\n\n[features]\nasync_copy = true\ntma = false\nwgmma = false\ntcgen05 = false\nclusters = false\n"
        + '\n[sources]\nT = "a test figure"\n\n[cite]\n'
        + cite
    )


MODEL_TOML = """display_name = "m"
head_dim = 256
num_heads = 8
num_kv_heads = 4
max_seq_len = 1000
max_num_seqs = 1
num_experts = 8
top_k = 2
hidden_size = 512
intermediate_size = 1024
"""


def vendor_toml(
    arch_from: str = "capability", words: tuple[str, ...] = (), default: bool = False, hip: bool = False
) -> str:
    return (
        f'display_name = "v"\narch_from = "{arch_from}"\nname_words = {list(words)!r}\n'
        f"default = {str(default).lower()}\nhip = {str(hip).lower()}\n".replace("'", '"')
    )


# The vendors of a test tree unless it names its own.
VENDORS = {
    "nvidia": vendor_toml(words=("NVIDIA",), default=True),
    "iluvatar": vendor_toml(words=("Iluvatar",)),
    "amd": vendor_toml("gfx", ("AMD",), hip=True),
}


def make_tree(
    root: Path,
    hardware: dict[str, str],
    kernels: dict[str, str],
    models: dict[str, str] | None = None,
    vendors: dict[str, str] | None = None,
    modules: dict[str, str] | None = None,
) -> Path:
    """Write a spec tree under ``root``: {stem: toml text} per folder."""
    folders = [
        ("vendors", VENDORS if vendors is None else vendors),
        ("hardware", hardware),
        ("kernels", kernels),
        ("models", models or {"m": MODEL_TOML}),
    ]
    if modules is not None:
        folders.append(("modules", modules))
    for folder, files in folders:
        d = root / "specs" / folder
        d.mkdir(parents=True, exist_ok=True)
        for stem, text in files.items():
            (d / f"{stem}.toml").write_text(textwrap.dedent(text))
    return root
