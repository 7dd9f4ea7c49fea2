"""The results file of one shard: JSON lines, a header, then one line per finished chunk.

    {"kind": "header", "fingerprint": "42edafe24a53", "config": "matmul", "target": "h200",
     "shard": [0, 2], "env": {"device": ..., "driver": ..., "torch": ..., "triton": ...}, ...}
    {"kind": "chunk", "index": 4, "bucket": "small", "keys": [...], "shapes": {"128x4096x4096":
     {"incumbent_ms": .., "spread": .., "library_ms": .., "library_vs_incumbent": ..,
      "candidates": {KEY: {"ms": .., "vs_incumbent": .., "vs_library": ..} | {"failed": why}}}}}

A line is appended and fsync'd when its chunk is done, so a killed run loses at most the chunk
it was in, and a line cut short by the kill is ignored on reading.  ``merge`` folds files of one
plan (same fingerprint) from any number of shards and hosts.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping


class ResultsError(Exception):
    """A results file that cannot be used (another plan's, unreadable): exit 2 with the message."""


class ResultsFile:
    """A shard's results file: its header and chunks; ``append`` adds a chunk line."""

    def __init__(self, path: Path, header: Mapping[str, Any], chunks: dict[int, dict[str, Any]]):
        self.path = path
        self.header = dict(header)
        self.chunks = chunks

    @classmethod
    def open(cls, path: Path, header: Mapping[str, Any], fresh: bool = False) -> "ResultsFile":
        """The file at ``path`` for this plan: resumed if it holds the same plan's results,
        created with ``header`` if it does not exist (or ``fresh``)."""
        if path.exists() and not fresh:
            _drop_cut_line(path)
            old = read(path)
            if old.header.get("fingerprint") != header["fingerprint"] or old.header.get("shard") != header["shard"]:
                raise ResultsError(
                    f"{path} holds results of another plan (fingerprint {old.header.get('fingerprint')}, shard "
                    f"{old.header.get('shard')}; this run: {header['fingerprint']}, shard {header['shard']}): "
                    "pass --fresh to start over, or another --results path"
                )
            return old
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w") as f:
            f.write(json.dumps(header, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        return cls(path, header, {})

    def done(self) -> set[int]:
        return set(self.chunks)

    def append(self, line: Mapping[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(line, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.chunks[line["index"]] = dict(line)


def _drop_cut_line(path: Path) -> None:
    """Cut a last line that a kill left without its newline, before appending after it."""
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with open(path, "r+b") as f:
            f.truncate(data.rfind(b"\n") + 1)


def read(path: Path) -> ResultsFile:
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise ResultsError(f"cannot read {path}: {exc.strerror or exc}") from None
    header = None
    chunks: dict[int, dict[str, Any]] = {}
    for n, text in enumerate(lines, 1):
        try:
            line = json.loads(text)
        except json.JSONDecodeError:
            if n == len(lines):
                continue  # the last line of a killed run, cut short
            raise ResultsError(f"{path}:{n}: not a JSON line") from None
        if not isinstance(line, dict) or "kind" not in line:
            raise ResultsError(f"{path}:{n}: not a results line (no 'kind')")
        if line["kind"] == "header":
            if header is not None:
                raise ResultsError(f"{path}:{n}: a second header")
            header = line
        elif line["kind"] == "chunk" and isinstance(line.get("index"), int):
            chunks[line["index"]] = line
        else:
            raise ResultsError(f"{path}:{n}: unknown line kind {line.get('kind')!r}")
    if header is None or "fingerprint" not in header:
        raise ResultsError(f"{path}: no header line (not a codegen tune results file)")
    return ResultsFile(Path(path), header, chunks)


@dataclass(frozen=True)
class Merged:
    """Results of one plan from several files."""

    fingerprint: str
    config: str
    target: str
    headers: tuple[dict[str, Any], ...]  # one per file, in the order given
    chunks: dict[int, dict[str, Any]]  # chunk index -> its line


def merge(files: Iterable[ResultsFile]) -> Merged:
    files = list(files)
    if not files:
        raise ResultsError("no results files given")
    first = files[0].header
    for f in files[1:]:
        if f.header["fingerprint"] != first["fingerprint"]:
            raise ResultsError(
                f"{f.path} is from another plan (fingerprint {f.header['fingerprint']}; {files[0].path}: "
                f"{first['fingerprint']}): merge only the shards of one tune"
            )
    chunks: dict[int, dict[str, Any]] = {}
    for f in files:
        for index, line in f.chunks.items():
            chunks.setdefault(index, line)  # a chunk measured twice (a re-run shard): the first file's
    return Merged(first["fingerprint"], first["config"], first["target"], tuple(f.header for f in files), chunks)
