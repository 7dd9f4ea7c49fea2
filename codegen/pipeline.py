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
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from . import load, render, resolve

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
