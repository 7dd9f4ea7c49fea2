"""``python -m policy_runtime.warmup``: the warm-up's command line (hand-written)."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Any, Optional, Sequence

from .calls import DEFAULT_BLOCK_SIZE, DEFAULT_MAX_TOKENS
from .engine import plan, warmup

__all__ = ["main"]



def _split_list(values: Optional[list[str]]) -> Optional[list[str]]:
    if values is None:
        return None
    return [v for value in values for v in value.split(",") if v]


def main(argv: Optional[Sequence[str]] = None, out: Any = None, err: Any = None) -> int:
    """``python -m policy_runtime.warmup``: exit 0 when every kernel compiled, 1 when one failed,
    2 on bad arguments (an unknown --hw, dtype, module or model)."""
    out, err = out or sys.stdout, err or sys.stderr
    parser = argparse.ArgumentParser(
        prog="python -m policy_runtime.warmup",
        description="Compile every Triton kernel a target's policies can launch, for the dtypes asked, "
        "without running any, into Triton's cache (TRITON_CACHE_DIR, default ~/.triton/cache).",
    )
    parser.add_argument("--hw", default=None, help="hardware spec name (default: detect the device)")
    parser.add_argument(
        "--dtypes", nargs="+", default=None, help="bfloat16 float16 float32 (default: bfloat16 float16)"
    )
    parser.add_argument("--modules", nargs="+", default=None, help="kernel modules (default: all)")
    parser.add_argument(
        "--models", nargs="+", default=None, help="models of generated.dispatch.MODEL_DIMS (default: all)"
    )
    parser.add_argument("--workers", type=int, default=None, help="compile processes (default: the CPUs usable)")
    parser.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE, help="KV-cache block size (default 16)")
    parser.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS, help="token counts searched exhaustively")
    parser.add_argument("--package", default="generated", help="the generated package (default: generated)")
    parser.add_argument("--plan", action="store_true", help="list the calls and kernels; compile nothing")
    parser.add_argument("--json", default=None, help="also write the report as JSON to this file")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)

    def usage(message: str) -> int:
        print(f"{parser.prog}: error: {message}", file=err)
        return 2

    try:
        package = importlib.import_module(args.package)
        dispatch = importlib.import_module(args.package + ".dispatch")
    except ImportError as exc:
        return usage(f"cannot import the generated package {args.package!r}: {exc}")
    available = list(getattr(package, "KERNEL_MODULES", ()))
    names = _split_list(args.modules) or available
    unknown = [m for m in names if m not in available]
    if unknown or not names:
        return usage(f"unknown module {unknown[0] if unknown else ''!r}; known: {', '.join(available) or 'none'}")
    if args.hw is not None and args.hw not in dispatch.HARDWARE:
        return usage(f"unknown --hw {args.hw!r}; known: {', '.join(sorted(dispatch.HARDWARE))}")
    modules = [f"{args.package}.{m}" for m in names]
    options: dict[str, Any] = dict(dtypes=_split_list(args.dtypes), models=_split_list(args.models))
    options.update(block_size=args.block_size, max_tokens=args.max_tokens)
    try:
        if args.plan:
            p = plan(modules, args.hw, **options)
            for i, call in enumerate(p.calls):
                print(f"{call.describe()}: {', '.join(name for name, _ in p.launches[i]) or 'no launch'}", file=out)
            print(
                f"{p.options.target}: {len(p.calls)} calls, {sum(map(len, p.launches))} launches, "
                f"{len(p.units)} kernels",
                file=out,
            )
            for note in p.notes:
                print(f"note: {note}", file=out)
            return 1 if p.failed else 0
        report = warmup(modules, args.hw, workers=args.workers, load=False, progress=not args.no_progress, **options)
    except ValueError as exc:
        return usage(str(exc))
    except RuntimeError as exc:
        print(f"{parser.prog}: {exc}", file=err)
        return 2
    print(report, file=out)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report.to_json(), f, indent=1)
    return 0 if report.ok else 1
