"""The compiler's stages, in order: each a pure function from one frozen record to the next.

    root (Path) --load--> SpecTree --resolve--> Resolution --render--> Rendered --plan--> Plan
                                                          `--schema--> Rendered (schemas/)

``load`` and ``resolve`` raise ``SpecErrors`` (every problem found, exit 2);
``render`` first checks that the specs provide what each module declares it
reads and that its template exists (also ``SpecErrors``), then only turns
resolved data into formatted text (``context`` builds the templates' data).
The records passed between stages are in ``records``.  Nothing before
``write.apply`` touches the disk, so a failing stage leaves generated/ as it
was; ``apply`` itself is all or nothing (``write.OutputError``).

``outputs`` names what a command writes (generated/ and schemas/) and ``build`` writes it under
the tree's build lock; ``build`` and ``codegen tune``'s write-back both call it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence, TextIO

from . import load, render, resolve, schema, write
from .records import Resolution
from .render import Rendered, is_generated

OUT_DIR = "generated"

# (name, function): source_to_target stages, as in Triton's compiler.
STAGES: tuple[tuple[str, Callable[[Any], Any]], ...] = (
    ("specs_to_tree", load.load),
    ("tree_to_resolution", resolve.resolve),
    ("resolution_to_rendered", render.render),
)


def run(root: Path, until: str | None = None) -> Any:
    """Run the stages from ``root``; stop after the stage named ``until``."""
    value: Any = root
    for name, stage in STAGES:
        value = stage(value)
        if name == until:
            break
    return value


@dataclass(frozen=True)
class Output:
    """One folder the compiler writes: its name under the root, its files, its marker test."""

    folder: str
    rendered: Rendered
    is_ours: Callable[[str], bool]


def outputs(res: Resolution, command: str) -> list[Output]:
    """What ``command`` writes or checks: generated/ and schemas/ (``schema``: schemas/ only)."""
    out = [Output(schema.SCHEMA_DIR, schema.rendered(res.tree), schema.is_schema)]
    if command != "schema":
        out.insert(0, Output(OUT_DIR, render.render(res), is_generated))
    return out


def build(
    root: Path,
    outs: Sequence[Output],
    before: Sequence[write.Plan] = (),
    check: Callable[[], None] | None = None,
) -> list[tuple[Output, write.Plan]]:
    """Write ``outs`` under ``root`` while holding the tree's build lock, each folder all or
    nothing.  ``before`` (``codegen tune``'s spec edits, planned as ``write.Plan``s of specs/)
    goes in with them as one transaction, renamed into place first: a failure leaves every
    folder as it was, and a kill at any moment leaves specs that the next build makes
    generated/ agree with.  ``check`` runs first, under the lock (it raises to write nothing).
    Returns each output's plan (what changed)."""
    with write.build_lock(root / OUT_DIR):
        if check is not None:
            check()
        plans = [(o, write.plan(o.rendered, root / o.folder, o.is_ours)) for o in outs]
        if before:
            write.apply_all([*before, *(plan for _, plan in plans)])
        else:
            for _, plan in plans:
                write.apply(plan)
    return plans


def report(plans: Sequence[tuple[Output, write.Plan]], out: TextIO) -> None:
    """What a build changed, one line per file."""
    for o, plan in plans:
        for change in plan.changes:
            verb = {"create": "created", "update": "updated", "delete": "deleted stale"}[change.kind]
            print(f"{verb} {o.folder}/{change.path}", file=out)
        for rel in plan.foreign:
            print(f"left alone {o.folder}/{rel} (no 'Code generated' marker)", file=out)
        for rel in plan.leftovers:
            print(f"removed leftover temporary file {o.folder}/{rel}", file=out)
        if not plan.changes:
            print(f"{o.folder}/ is up to date ({len(plan.unchanged)} files)", file=out)
