"""Reading spec files: listing folders, decoding text, locating a key path's line.

Every failure becomes a ``SpecProblem`` naming the file (and the line, where
known), never an exception: load.py collects them all.  Spec files are UTF-8
without a byte-order mark, as tomllib requires; a float literal generated code
cannot spell (nan, inf) is found here too.
"""

from __future__ import annotations

import functools
import math
import os
import re
import stat
import tomllib
from pathlib import Path
from typing import Any, Callable

from .errors import KeyPath, SpecProblem, os_reason, problem


def listdir(folder: Path, rel: str, problems: list[SpecProblem]) -> list[Path] | None:
    """The entries of a spec folder, sorted; None (and a problem) when it cannot be listed."""
    try:
        return sorted(folder.iterdir())
    except OSError as exc:
        problems.append(problem(rel, (), f"cannot list the directory: {os_reason(exc)}"))
        return None


def is_dir(path: Path, rel: str, problems: list[SpecProblem]) -> bool:
    try:
        return path.is_dir()
    except OSError as exc:  # e.g. a folder above it cannot be searched
        problems.append(problem(rel, (), f"cannot read: {os_reason(exc)}"))
        return False


def regular_file_problem(path: Path) -> str | None:
    """Why ``path`` is not a spec file that can be read (a directory, a FIFO, a socket, a link
    to one of those or to nothing), or None for a regular file or a link to one.  Checked before
    reading: opening a FIFO would block the build."""
    try:
        mode = os.lstat(path).st_mode
        link = stat.S_ISLNK(mode)
        if link:
            mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "a link to nothing (its target does not exist); spec files must be regular files"
    except OSError as exc:
        return f"cannot read: {os_reason(exc)}"
    if stat.S_ISREG(mode):
        return None
    what = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "not a regular file"
    return f"{'a link to ' if link else ''}{what}; spec folders hold only .toml spec files"


# TOML integers are 64-bit; Python's reader takes any size, and generated code would carry it.
INT64 = (-(2**63), 2**63 - 1)


def out_of_range(data: Any, keypath: KeyPath):
    """(key path, value) of every integer outside TOML's 64-bit range in parsed TOML."""
    if isinstance(data, int) and not isinstance(data, bool) and not INT64[0] <= data <= INT64[1]:
        yield keypath, data
    elif isinstance(data, dict):
        for key, value in data.items():
            yield from out_of_range(value, keypath + (key,))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from out_of_range(value, keypath + (i,))


_BOM = b"\xef\xbb\xbf"


def read_text(path: Path, rel: str, problems: list[SpecProblem]) -> str | None:
    """A spec file's text: UTF-8 without a byte-order mark (what tomllib reads)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        problems.append(problem(rel, (), f"cannot read the file: {os_reason(exc)}"))
        return None
    if data.startswith(_BOM):
        problems.append(
            problem(
                rel,
                (),
                "the file starts with a UTF-8 byte-order mark (BOM), which TOML does not allow; "
                "save it as UTF-8 without a BOM",
                line=1,
            )
        )
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        problems.append(
            problem(
                rel,
                (),
                f"not UTF-8 text: byte 0x{data[exc.start]:02x} on line {line} cannot be decoded; "
                "save the file as UTF-8",
                line=line,
            )
        )
        return None


def non_finite(data: Any, keypath: KeyPath):
    """(key path, value) of every nan or inf float in parsed TOML."""
    if isinstance(data, float) and not math.isfinite(data):
        yield keypath, data
    elif isinstance(data, dict):
        for key, value in data.items():
            yield from non_finite(value, keypath + (key,))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from non_finite(value, keypath + (i,))


def toml_error_line(message: str) -> int | None:
    match = re.search(r"line (\d+)", message)
    return int(match.group(1)) if match else None


_HEADER_RE = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_KEY_RE = re.compile(r"^\s*([A-Za-z0-9_\-\"'. ]+?)\s*=")


def _split_key(text: str) -> list[str]:
    parts = []
    for part in re.findall(r'"[^"]*"|\'[^\']*\'|[^.]+', text):
        part = part.strip()
        if part[:1] in "\"'":
            part = part[1:-1]
        parts.append(part)
    return parts


def locate(text: str, keypath: KeyPath) -> int | None:
    """Best-effort 1-based line of ``keypath`` in TOML ``text``: the line of the longest prefix
    of ``keypath`` found; None rather than a guess.  The file is scanned once (``key_lines``),
    so reporting many problems in one file costs one scan, not one per problem."""
    locations = key_lines(text)
    for n in range(len(keypath), 0, -1):
        found = locations.get(tuple(keypath[:n]))
        if found is not None:
            return found
    return None


@functools.lru_cache(maxsize=64)
def key_lines(text: str) -> dict[tuple, int]:
    """Key path -> 1-based line, for every table header, array-of-tables element (with its
    index) and ``key =`` line of TOML ``text``.  Multi-line strings are skipped.  Good enough
    for the subset of TOML the specs use.  (Cached by text: callers must not change the dict.)"""
    locations: dict[tuple, int] = {}
    counters: dict[tuple, int] = {}
    current: tuple = ()
    in_multiline: str | None = None
    for lineno, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if in_multiline:
            if stripped.count(in_multiline) % 2 == 1:
                in_multiline = None
            continue
        if not stripped or stripped.startswith("#"):
            continue
        header = _HEADER_RE.match(line)
        if header and not _KEY_RE.match(line):
            keys = _split_key(header.group(2))
            path: tuple = ()
            for i, key in enumerate(keys):
                path = path + (key,)
                is_last = i == len(keys) - 1
                if is_last and header.group(1) == "[[":
                    counters[path] = counters.get(path, -1) + 1
                    # a new element resets the counters of arrays nested in it
                    for other in [k for k in counters if len(k) > len(path) and k[: len(path)] == path]:
                        del counters[other]
                    path = path + (counters[path],)
                elif path in counters:
                    path = path + (counters[path],)
            current = path
            locations.setdefault(current, lineno)
            continue
        found = _KEY_RE.match(line)
        if found:
            full = current + tuple(_split_key(found.group(1)))
            locations.setdefault(full, lineno)
            rest = line[found.end() :]
            for quote in ('"""', "'''"):
                if rest.count(quote) % 2 == 1:
                    in_multiline = quote
    return locations


# A decimal integer literal Python will not convert (more than 4,300 digits): tomllib raises a
# ValueError naming no key or line.  Such literals are swapped for markers to find their keys.
_LONG_DECIMAL = re.compile(r"(?<![\w.])[+-]?\d(?:_?\d){%d,}(?![\w.])" % 4300)


class IntegerSize:
    """Stands for an integer literal too long to convert, in a problem's value."""

    def __init__(self, digits: int):
        self.digits = digits

    def __repr__(self) -> str:
        return f"an integer of {self.digits:,} digits"


INT64_RULE = "integers are 64-bit in TOML (-2**63 to 2**63 - 1)"


def parse_toml(text: str, rel: str, problem_at: Callable[..., SpecProblem], problems: list[SpecProblem]) -> Any:
    """A spec file's parsed TOML, or None with every problem added: malformed TOML (at its
    line), integers past 64 bits (decimal literals Python will not convert too, at their key),
    nan and inf.  ``problem_at(keypath, rule, value=...)`` locates a problem (Source.problem)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        problems.append(problem(rel, (), f"malformed TOML: {exc}", line=toml_error_line(str(exc))))
        return None
    except ValueError as exc:  # an integer literal of more than 4,300 digits
        found = _long_literals(text)
        if not found:
            problems.append(problem(rel, (), f"cannot read the TOML: {exc}"))
        for located, line, digits in found:
            if located is not None:
                problems.append(problem_at(located, INT64_RULE, value=IntegerSize(digits)))
            else:
                problems.append(problem(rel, (), INT64_RULE, line=line, value=IntegerSize(digits)))
        return None
    start = len(problems)
    for keypath, value in non_finite(data, ()):
        problems.append(
            problem_at(keypath, "nan and inf are not allowed: generated Python cannot spell them", value=value)
        )
    for keypath, value in out_of_range(data, ()):
        problems.append(problem_at(keypath, INT64_RULE, value=value))
    return None if len(problems) > start else data


def _long_literals(text: str) -> list[tuple[KeyPath | None, int, int]]:
    """(key path or None, line, digits) of every decimal literal too long to convert."""
    matches = list(_LONG_DECIMAL.finditer(text))
    markers: dict[int, tuple[int, int]] = {}
    pieces, at = [], 0
    for i, m in enumerate(matches):
        marker = 2**64 + i
        markers[marker] = (text.count("\n", 0, m.start()) + 1, sum(c.isdigit() for c in m.group()))
        pieces += [text[at : m.start()], str(marker)]
        at = m.end()
    pieces.append(text[at:])
    try:
        data = tomllib.loads("".join(pieces))
    except ValueError:  # not where a value goes (in a string, a key): name the line only
        data = None
    keys: dict[int, KeyPath] = {}
    for keypath, value in out_of_range(data, ()) if data is not None else ():
        if value in markers:
            keys[value] = keypath
    return [(keys.get(marker), line, digits) for marker, (line, digits) in markers.items()]
