"""The ``tune`` command's arguments (``codegen/cli.py`` builds its parser from this, without
importing the tuner itself, which only ``tune`` needs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def add_parser(sub: Any) -> None:  # noqa: C901 - one flag per line
    t = sub.add_parser(
        "tune",
        help="time a family's candidates on the GPUs here and write the winners into its spec "
        "(tune merge FILES...: fold shards' results)",
        description="Time the candidates of a kernel family's search space ([<kernel>.tune] in its spec) "
        "against each bucket's current config and the vendor library, on one worker per visible GPU, and "
        "write the winners back into the spec (with provenance), then rebuild generated/. "
        "`tune merge FILES...` folds the results files of --shard runs and writes as tune would.",
    )
    t.add_argument(
        "kernel", help="the config to tune (one with a [<config>.tune] table), or `merge` followed by results files"
    )
    t.add_argument("files", nargs="*", help="with merge: the shards' results files")
    t.add_argument("--hw", default="auto", help="hardware spec name, or auto (the device here; default)")
    t.add_argument("--shapes", nargs="+", metavar="AxBxC", help="problem shapes (default: the spec's)")
    t.add_argument("--space", nargs="+", metavar="FIELD=V1,V2", help="search these values instead of the spec's space")
    t.add_argument("--buckets", nargs="+", metavar="NAME", help="with --space: only these buckets")
    t.add_argument("--budget", type=float, help="seconds of measuring (default: the spec's budget_s)")
    t.add_argument("--rounds", type=int, help="interleaved timing rounds (default: the spec's)")
    t.add_argument("--chunk", type=int, help="candidates timed together (default: the spec's)")
    t.add_argument("--model", help="model spec, for configs resolved per model (default: the tree's)")
    t.add_argument("--dtype", choices=("float16", "bfloat16", "float32"),
                   help="time in this dtype (default: the spec's; one of the tuned variant's dtypes: the CPU "
                   "interpreter needs float16, its bfloat16 arithmetic is wrong)")  # fmt: skip
    t.add_argument("--shard", metavar="I/N", help="measure only chunk slice I of N; write a results file, no specs")
    t.add_argument("--results", type=Path, help="results file (with --shard) or folder (default: .codegen-tune/)")
    t.add_argument("--fresh", action="store_true", help="discard earlier results of this plan instead of resuming")
    t.add_argument("--devices", help="comma-separated GPU ids, one worker each (default: every visible GPU)")
    t.add_argument("--scope", choices=("target", "policy"), default="target",
                   help="target: a winner applies only to the part it was measured on (default); policy: to "
                   "every part its policy serves")  # fmt: skip
    t.add_argument("--plan", action="store_true", help="print the plan and stop: measure and write nothing")
    t.add_argument("--dry-run", action="store_true",
                   help="measure, then print the spec diff; write nothing (results go to a temporary folder)")  # fmt: skip
    t.add_argument("--no-build", action="store_true", help="write the specs but do not rebuild generated/")
    t.add_argument("--quiet", action="store_true", help="no progress bar (CI logs); the summary still prints")
