"""Stage 4, Rendered -> Plan -> disk: compare with generated/, then write or report.

``plan`` reads generated/ and decides, file by file, what would change.  It
writes nothing, so ``check`` is ``plan`` plus a report.  ``apply`` performs
a plan in two phases: first every new file's bytes go to a temporary file in
its target's folder (``.<name>.<random>.tmp``); only when all of them are
written are they moved into place with ``os.replace`` (atomic on POSIX and
Windows), and then stale files are deleted.  Only files whose bytes change
are written.  Files in generated/ that the build no longer produces are
deleted only if they carry the "Code generated" marker; any other file there
is left alone and reported.

A file that cannot be read, written or deleted raises ``OutputError`` naming
the path and the reason.  Before that, ``apply`` removes its temporary files
and undoes the replacements and deletions it already made (their old bytes
are in the plan), so generated/ is left as it was.  Temporary files a killed
build left behind are recognised by their name (``TEMP_RE``): ``plan``
ignores them and ``apply`` removes them.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; builds there are not serialized
    fcntl = None  # type: ignore[assignment]

from .errors import os_reason
from .render import Rendered, is_generated

# A temporary file of apply: "." + the target's name + "." + mkstemp's 8 random characters + ".tmp".
TEMP_RE = re.compile(r"^\.(?P<target>.+)\.[a-z0-9_]{8}\.tmp$")


class OutputError(Exception):
    """generated/ could not be read or written; the message names the path and the reason."""


# Beside generated/: held (an advisory lock, released by the OS when the process ends, even when
# it is killed) while a build plans and writes, so that two builds of one tree never interleave.
LOCK_NAME = ".codegen.lock"


@contextlib.contextmanager
def build_lock(out_dir: Path) -> Iterator[None]:
    """Hold the tree's build lock, or raise OutputError at once if another build holds it."""
    if fcntl is None:
        yield
        return
    path = out_dir.parent / LOCK_NAME
    try:
        handle = open(path, "a+b")
    except OSError as exc:
        raise OutputError(f"cannot open the build lock {path}: {os_reason(exc)}") from None
    with handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OutputError(
                f"another codegen build of this tree is running (it holds {path}); wait for it and build again"
            ) from None
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


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
    leftovers: tuple[str, ...] = ()  # temporary files of an earlier, killed build

    @property
    def stale(self) -> bool:
        return bool(self.changes)


def _show(out_dir: Path, rel: str) -> str:
    return f"{out_dir.name}/{rel}"


def _existing(out_dir: Path) -> dict[str, Path]:
    """Files below out_dir, by path relative to it; dot-files (temporary files) are not listed."""
    found: dict[str, Path] = {}
    try:
        if not out_dir.is_dir():
            return found
        for path in sorted(out_dir.rglob("*")):
            rel = path.relative_to(out_dir).as_posix()
            if path.is_file() and "__pycache__" not in path.parts and not path.name.startswith("."):
                found[rel] = path
    except OSError as exc:
        raise OutputError(f"cannot list {out_dir.name}/: {os_reason(exc)}") from None
    return found


def _leftovers(out_dir: Path, rendered: Rendered) -> tuple[str, ...]:
    """Temporary files of apply, for files this build writes, that an earlier build left."""
    found = []
    folders = sorted({(out_dir / rel).parent for rel in rendered.files})
    try:
        for folder in folders:
            if not folder.is_dir():
                continue
            for path in sorted(folder.iterdir()):
                match = TEMP_RE.match(path.name)
                if match is None:
                    continue
                target = (folder / match["target"]).relative_to(out_dir).as_posix()
                if target in rendered.files and path.is_file():
                    found.append(path.relative_to(out_dir).as_posix())
    except OSError as exc:
        raise OutputError(f"cannot list {out_dir.name}/: {os_reason(exc)}") from None
    return tuple(found)


def _read(path: Path, out_dir: Path, rel: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise OutputError(f"cannot read {_show(out_dir, rel)}: {os_reason(exc)}") from None


def plan(rendered: Rendered, out_dir: Path, is_ours: Callable[[str], bool] = is_generated) -> Plan:
    """What writing ``rendered`` into ``out_dir`` would change.  A file there that ``rendered``
    lacks is deleted only if ``is_ours`` says it carries the output's marker."""
    existing = _existing(out_dir)
    changes = []
    unchanged = []
    foreign = []
    for rel, generated in sorted(rendered.files.items()):
        path = existing.get(rel)
        if path is None:
            changes.append(Change(rel, "create", None, generated.content()))
            continue
        old = _read(path, out_dir, rel)
        # The stamp decides without formatting; anything else is compared byte for byte.
        if generated.is_current(old) or old == generated.content():
            unchanged.append(rel)
        else:
            changes.append(Change(rel, "update", old, generated.content()))
    for rel, path in existing.items():
        if rel in rendered.files:
            continue
        old = _read(path, out_dir, rel)
        if is_ours(old.decode("utf-8", errors="replace")):
            changes.append(Change(rel, "delete", old, None))
        else:
            foreign.append(rel)
    changes.sort(key=lambda c: c.path)
    return Plan(out_dir, tuple(changes), tuple(unchanged), tuple(foreign), _leftovers(out_dir, rendered))


def apply(p: Plan) -> None:
    """Perform a plan (every new file's bytes already exist in memory): all or nothing.

    Raises OutputError after restoring generated/ when a file cannot be written or deleted.
    """
    apply_all([p])


def apply_all(plans: Sequence[Plan]) -> None:
    """Perform several plans as one, all or nothing: every plan's new files are written to
    temporary files first, then moved into place in the order of ``plans`` (``codegen tune``
    passes its spec edits first, then generated/ and schemas/), then stale files are deleted.
    A failure puts every folder back as it was and raises OutputError naming the step."""
    writes = [(p.out_dir, c) for p in plans for c in p.changes if c.kind != "delete"]
    deletes = [(p.out_dir, c) for p in plans for c in p.changes if c.kind == "delete"]
    folders = ", ".join(f"{p.out_dir.name}/" for p in plans)
    unchanged = f"{folders} {'was' if len(plans) == 1 else 'were'} not changed"
    staged: list[tuple[str, Path, Change]] = []  # (temporary file, folder, change)
    done: list[tuple[Path, Change]] = []  # changes already on disk, in order
    pending: tuple[Path, Change, str | None] | None = None  # the phase-2 step under way
    what, rel = "create the folder", folders  # the step under way, for the message
    try:
        for p in plans:
            rel = p.out_dir.name + "/"
            p.out_dir.mkdir(parents=True, exist_ok=True)
        # Phase 1: every file's bytes in a temporary file next to it.
        for out_dir, change in writes:
            assert change.new is not None
            rel = _show(out_dir, change.path)
            target = out_dir / change.path
            what = "create the folder of"
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.is_dir() or (target.exists() and not target.is_file()):
                raise OutputError(f"cannot write {rel}: it exists and is not a file; {unchanged}")
            what = "write a temporary file for"
            staged.append((write_temp(target, change.new), out_dir, change))
        # Phase 2: move them all into place, then delete stale files.
        what = "replace"
        for tmp, out_dir, change in staged:
            rel = _show(out_dir, change.path)
            pending = (out_dir, change, tmp)  # an interrupt may surface after the rename itself is done
            os.replace(tmp, out_dir / change.path)
            done.append((out_dir, change))
            pending = None
        what = "delete"
        for out_dir, change in deletes:
            rel = _show(out_dir, change.path)
            pending = (out_dir, change, None)
            (out_dir / change.path).unlink()
            done.append((out_dir, change))
            pending = None
    except BaseException as exc:  # also KeyboardInterrupt: put the folders back, then re-raise
        if pending is not None and (pending[0], pending[1]) not in done:
            out_dir, change, step_tmp = pending
            # Did the step happen although it raised?  Its temporary file is gone / its target is.
            if not os.path.lexists(step_tmp if step_tmp is not None else out_dir / change.path):
                done.append((out_dir, change))
        for tmp, _out_dir, _change in staged:
            _remove(tmp)
        if isinstance(exc, OutputError):
            raise
        not_restored = _undo(done)
        lost = f"could not restore {', '.join(not_restored)}" if not_restored else ""
        if not isinstance(exc, OSError):
            if lost:
                exc.add_note(lost)
            raise
        state = lost or unchanged
        raise OutputError(f"cannot {what} {rel}: {os_reason(exc)}; {state}") from None
    for p in plans:
        for leftover in p.leftovers:
            _remove(str(p.out_dir / leftover))


def _undo(done: list[tuple[Path, Change]]) -> list[str]:
    """Put back what apply already changed, newest first; the paths it could not restore."""
    failed = []
    for out_dir, change in reversed(done):
        target = out_dir / change.path
        tmp = None
        try:
            if change.old is None:
                target.unlink()
            else:
                tmp = write_temp(target, change.old)
                os.replace(tmp, target)
        except OSError:
            failed.append(_show(out_dir, change.path))
            if tmp is not None:
                _remove(tmp)
    return sorted(failed)


def write_temp(target: Path, data: bytes) -> str:
    """A temporary file next to ``target`` holding ``data`` (synced), named as TEMP_RE says;
    ``os.replace`` it onto ``target`` to put the bytes in place atomically."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
    except BaseException:
        _remove(tmp)
        raise
    return tmp


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def diff(change: Change, prefix: str) -> str:
    """Unified diff of one change, from what is on disk to what build would write."""
    old = (change.old or b"").decode("utf-8", errors="replace").splitlines(keepends=True)
    new = (change.new or b"").decode("utf-8", errors="replace").splitlines(keepends=True)
    name = f"{prefix}/{change.path}"
    from_name = name if change.old is not None else "/dev/null"
    to_name = name if change.new is not None else "/dev/null"
    import difflib  # only a stale file needs it

    text = "".join(difflib.unified_diff(old, new, fromfile=from_name, tofile=to_name))
    return text if text.endswith("\n") or not text else text + "\n\\ No newline at end of file\n"
