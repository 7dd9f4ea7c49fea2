"""Stage 4, Rendered -> Plan -> disk: compare with generated/, then write or report.

``plan`` reads generated/ and decides, file by file, what would change.  It
writes nothing, so ``check`` is ``plan`` plus a report.  ``apply`` performs
a plan: each file is written to a temporary file in the same folder and
moved into place with ``os.replace`` (atomic on POSIX and Windows), and only
when its bytes change.  Files in generated/ that the build no longer
produces are deleted only if they carry the "Code generated" marker; any
other file there is left alone and reported.
"""

from __future__ import annotations

import difflib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .render import Rendered, is_generated


@dataclass(frozen=True)
class Change:
    path: str  # relative to generated/
    kind: str  # "create", "update", "delete"
    old: bytes | None
    new: bytes | None


@dataclass(frozen=True)
class Plan:
    out_dir: Path
    changes: tuple[Change, ...]  # sorted by path
    unchanged: tuple[str, ...]
    foreign: tuple[str, ...]  # files in generated/ without the marker, left alone

    @property
    def stale(self) -> bool:
        return bool(self.changes)


def _existing(out_dir: Path) -> dict[str, Path]:
    found = {}
    if out_dir.is_dir():
        for path in sorted(out_dir.rglob("*")):
            rel = path.relative_to(out_dir).as_posix()
            if path.is_file() and "__pycache__" not in path.parts and not path.name.startswith("."):
                found[rel] = path
    return found


def plan(rendered: Rendered, out_dir: Path) -> Plan:
    existing = _existing(out_dir)
    changes = []
    unchanged = []
    foreign = []
    for rel, generated in sorted(rendered.files.items()):
        path = existing.get(rel)
        if path is None:
            changes.append(Change(rel, "create", None, generated.content()))
            continue
        old = path.read_bytes()
        # The stamp decides without formatting; anything else is compared byte for byte.
        if generated.is_current(old) or old == generated.content():
            unchanged.append(rel)
        else:
            changes.append(Change(rel, "update", old, generated.content()))
    for rel, path in existing.items():
        if rel in rendered.files:
            continue
        old = path.read_bytes()
        if is_generated(old.decode("utf-8", errors="replace")):
            changes.append(Change(rel, "delete", old, None))
        else:
            foreign.append(rel)
    changes.sort(key=lambda c: c.path)
    return Plan(out_dir, tuple(changes), tuple(unchanged), tuple(foreign))


def apply(p: Plan) -> None:
    """Perform a plan.  Every new file's bytes already exist in memory."""
    p.out_dir.mkdir(parents=True, exist_ok=True)
    for change in p.changes:
        target = p.out_dir / change.path
        if change.kind == "delete":
            target.unlink()
            continue
        assert change.new is not None
        target.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(target, change.new)


def _atomic_write(target: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def diff(change: Change, prefix: str) -> str:
    """Unified diff of one change, from what is on disk to what build would write."""
    old = (change.old or b"").decode("utf-8", errors="replace").splitlines(keepends=True)
    new = (change.new or b"").decode("utf-8", errors="replace").splitlines(keepends=True)
    name = f"{prefix}/{change.path}"
    from_name = name if change.old is not None else "/dev/null"
    to_name = name if change.new is not None else "/dev/null"
    text = "".join(difflib.unified_diff(old, new, fromfile=from_name, tofile=to_name))
    return text if text.endswith("\n") or not text else text + "\n\\ No newline at end of file\n"
