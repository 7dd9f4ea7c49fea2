"""The result of ``codegen check``, remembered for inputs that did not change.

A no-op ``check`` spends most of its time importing the compiler (Pydantic's models, Jinja2).
The ``codegen check`` command therefore first looks for an entry (in ``locations.cache_dir()``,
one per root) that a full check which passed left, and prints that check's output without
importing the compiler when all of these are byte for byte what they were then:

- every file under the root's ``specs/``, ``templates/``, ``generated/`` and ``schemas/``
  (``__pycache__`` aside), and under the packaged templates and codegen's own package;
- every other Python file the full check had loaded (``sys.modules``: the runtime modules
  context files import, ...), by content; those of installed distributions (Jinja2, Pydantic,
  black's version module, ...) by size and modification time;
- Python's version, its executable, ``sys.path`` and the root's path.

Anything else (a link or a FIFO in those folders, a folder missing, an unreadable file or entry,
an entry written by another codegen) runs the full check.  Only a check that passed (exit 0) is
remembered, and only when nothing changed while it ran; ``codegen build`` remembers the check of
what it wrote (the pre-commit hook's check follows a build).  ``CODEGEN_CACHE_DIR=""`` disables it.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
import tempfile
from pathlib import Path

from . import locations

FORMAT = "codegen-check-result 1"
# Path components of installed distributions: their files are known by size and mtime.
_INSTALLED = {"site-packages", "dist-packages"}


class _Uncacheable(Exception):
    """An input the cache does not reason about: run the full check."""


def _entry_path(root: Path) -> Path | None:
    folder = locations.cache_dir()
    if folder is None:
        return None
    name = hashlib.sha256(f"{root}\0{sys.executable}".encode()).hexdigest()[:32]
    return folder / "check" / f"{name}.json"


def _walk(h: "hashlib._Hash", folder: Path, label: str) -> None:
    """Every entry below ``folder`` (sorted; ``__pycache__`` skipped) into ``h``: names and bytes."""
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError as exc:
        raise _Uncacheable(f"cannot list {folder}") from exc
    for entry in entries:
        try:
            mode = entry.stat(follow_symlinks=False).st_mode
        except OSError as exc:
            raise _Uncacheable(entry.path) from exc
        name = f"{label}/{entry.name}"
        if stat.S_ISDIR(mode):
            if entry.name == "__pycache__":
                continue
            h.update(f"D\0{name}\0".encode())
            _walk(h, Path(entry.path), name)
        elif stat.S_ISREG(mode):
            try:
                data = Path(entry.path).read_bytes()
            except OSError as exc:
                raise _Uncacheable(entry.path) from exc
            h.update(f"F\0{name}\0{len(data)}\0".encode())
            h.update(data)
        else:  # a link, a FIFO, ...: the full check says what it makes of it
            raise _Uncacheable(entry.path)


def fingerprint(root: Path, outputs: bool = True) -> str | None:
    """A hash of the folders a check reads (``outputs``: and compares), codegen's source and the
    interpreter; None when one of them is something the cache does not reason about."""
    h = hashlib.sha256()
    h.update(f"{FORMAT}\0{sys.version}\0{sys.executable}\0{sys.path!r}\0{root}\0{outputs}\0".encode())
    folders = [
        ("codegen", Path(__file__).resolve().parent),
        ("packaged-templates", locations.packaged_templates()),
        ("templates", root / "templates"),
        ("specs", root / "specs"),
    ]
    if outputs:
        folders += [("generated", root / "generated"), ("schemas", root / "schemas")]
    try:
        for label, folder in folders:
            if label == "templates" and not os.path.lexists(folder):
                h.update(b"no templates/\0")
                continue
            if not stat.S_ISDIR(os.lstat(folder).st_mode):
                return None
            _walk(h, folder, label)
    except (OSError, _Uncacheable):
        return None
    return h.hexdigest()


def _is_installed(path: str) -> bool:
    return not _INSTALLED.isdisjoint(Path(path).parts)


def _signature(path: str) -> str | None:
    """What a loaded module's file is recorded by: its bytes' hash, or for an installed
    distribution's file its size and modification time; None if it cannot be read."""
    try:
        if _is_installed(path):
            st = os.stat(path)
            return f"stat {st.st_size} {st.st_mtime_ns}"
        return "sha256 " + hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def _loaded_files() -> list[str]:
    """The files of every module loaded now, but the standard library's (Python's version
    stands for those)."""
    import sysconfig

    paths = sysconfig.get_paths()
    stdlib = {os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib")}
    found = set()
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if not isinstance(file, str) or not os.path.isfile(file):
            continue
        real = os.path.realpath(file)
        if not _is_installed(real) and any(real.startswith(s + os.sep) for s in stdlib):
            continue
        found.add(real)
    return sorted(found)


def lookup(root: Path) -> tuple[str | None, str | None]:
    """(the remembered output of a passing check of ``root`` whose inputs are unchanged or None,
    the fingerprint to store a new result under or None)."""
    digest = fingerprint(root)
    path = _entry_path(root)
    if digest is None or path is None:
        return None, digest
    try:
        entry = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None, digest
    if not isinstance(entry, dict) or entry.get("format") != FORMAT or entry.get("fingerprint") != digest:
        return None, digest
    deps, output = entry.get("deps"), entry.get("output")
    if not isinstance(deps, dict) or not isinstance(output, str):
        return None, digest
    for file, signature in deps.items():
        if _signature(file) != signature:
            return None, digest
    return output, digest


def store(root: Path, digest: str | None, output: str) -> None:
    """Remember ``output`` of a check that passed, if its inputs are still those it started with."""
    path = _entry_path(root)
    if digest is None or path is None:
        return
    deps = {file: _signature(file) for file in _loaded_files()}
    if None in deps.values() or fingerprint(root) != digest:
        return  # something changed while the check ran, or cannot be read: remember nothing
    entry = {"format": FORMAT, "fingerprint": digest, "root": str(root), "deps": deps, "output": output}
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as handle:
                json.dump(entry, handle, sort_keys=True)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        pass  # a cache that cannot be written is skipped
