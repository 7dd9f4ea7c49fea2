"""``python -m generated.dispatch [--hw NAME] [--model NAME]``: print a target's hardware and
config tables, as a hand-written dispatch file's ``__main__`` does (hand-written)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import Any, Callable, Mapping, Optional, Sequence, TextIO

# What a shell reports for a command that SIGPIPE ended (`yes | head`: 128 + 13).
EXIT_CLOSED_PIPE = 141


def quiet_on_closed_pipe(command: Callable[[], int]) -> int:
    """Run a command-line ``command`` that prints to stdout.  A reader that closes the output
    early (``python -m generated.dispatch | head -1``) ends it quietly, as coreutils do: no
    traceback, exit 141."""
    try:
        code = command()
        sys.stdout.flush()  # here, not at exit: a reader gone by now is the same closed pipe
        return code
    except BrokenPipeError:
        # Python flushes stdout again at exit; point it at the null device so that finds nothing to say.
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return EXIT_CLOSED_PIPE


def main(
    argv: Optional[Sequence[str]],
    *,
    hardware: Mapping[str, Any],
    models: Sequence[str],
    kernel_names: Callable[[], list],
    lookup: Callable[..., Any],
    grid_even_share: Callable[..., dict],
    default_target: Optional[str],
    default_model: Optional[str],
    out: Optional[TextIO] = None,
) -> int:
    if out is None:  # the command line: a reader that goes away early ends it quietly
        return quiet_on_closed_pipe(
            lambda: main(
                argv,
                hardware=hardware,
                models=models,
                kernel_names=kernel_names,
                lookup=lookup,
                grid_even_share=grid_even_share,
                default_target=default_target,
                default_model=default_model,
                out=sys.stdout,
            )
        )
    parser = argparse.ArgumentParser(
        prog="python -m generated.dispatch", description="Print a target's hardware record and config tables."
    )
    parser.add_argument(
        "--hw", choices=sorted(hardware), default=default_target, help=f"target (default: {default_target})"
    )
    parser.add_argument(
        "--model", choices=sorted(models), default=default_model, help=f"model (default: {default_model})"
    )
    args = parser.parse_args(argv)
    if args.hw is None:
        parser.error("no default target: pass --hw")
    hw = hardware[args.hw]
    write = (lambda text: out.write(text + "\n")) if out is not None else print
    write(f"generated.dispatch: kernel policy dispatch for {hw.display_name} ({args.hw}), model {args.model}\n")
    write(f"Hardware: {hw.vendor} {hw.display_name}")
    write(
        f"  SMs: {hw.sm_count}, SMEM: {hw.max_shared_memory_per_block // 1024}KB, "
        f"BW: {hw.memory_bandwidth_gbps}GB/s, BW/SM: {hw.bandwidth_per_sm_gbps:.1f}GB/s"
    )
    write(f"  bytes_in_flight: {hw.bytes_in_flight // 1024}KB\n")
    for name in kernel_names():
        try:
            record = lookup(name, args.hw, args.model)
        except KeyError:
            continue  # a config that does not serve this model
        write(f"[{name}]")
        for field in dataclasses.fields(record):
            write(f"  {field.name}: {getattr(record, field.name)}")
        write("")
    write("GridEvenShare example (50K token decode, block_size=16):")
    for key, value in grid_even_share(50000 // 16, tile_size=1024, sm_count=hw.sm_count).items():
        write(f"  {key}: {value}")
    return 0
