"""The results file of one shard: JSON lines, a header, then one line per finished chunk.

    {"kind": "header", "fingerprint": "42edafe24a53", "config": "matmul", "target": "h200",
     "shard": [0, 2], "env": {"device": ..., "driver": ..., "torch": ..., "triton": ...}, ...}
    {"kind": "chunk", "index": 4, "bucket": "small", "keys": [...], "shapes": {"128x4096x4096":
     {"incumbent_ms": .., "spread": .., "library_ms": .., "library_vs_incumbent": ..,
      "candidates": {KEY: {"ms": .., "vs_incumbent": .., "vs_library": ..} | {"failed": why}}}}}

A line is appended and fsync'd when its chunk is done, so a killed run loses at most the chunk
it was in, and a line cut short by the kill (text after the last newline) is ignored on reading.
Every other line must be what tune writes: ``read`` validates each against a schema
(``HeaderLine``, ``ChunkLine``) and ``check_plan`` each chunk against the plan, so a file that
is not a results file, or is damaged, is refused naming the file and line.  ``merge`` folds files of one
plan (same fingerprint) from any number of shards and hosts.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Iterable, Literal, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError, model_validator

from .. import write


class ResultsError(Exception):
    """A results file that cannot be used (another plan's, unreadable, damaged, not one): exit 2
    with the message (one line per problem, each naming the file and line)."""


# -- what tune writes: a schema per line ------------------------------------------------------

Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Text = Annotated[StrictStr, Field(max_length=10_000)]


class _Line(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CandidateResult(_Line):
    """One candidate on one shape: its times, or why it was disqualified."""

    ms: Positive | None = None
    vs_incumbent: Positive | None = None
    vs_library: Positive | None = None
    failed: Text | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> "CandidateResult":
        timed = self.ms is not None and self.vs_incumbent is not None
        if self.failed is not None and (self.ms, self.vs_incumbent, self.vs_library) != (None, None, None):
            raise ValueError("a failed candidate has no times")
        if self.failed is None and not timed:
            raise ValueError("a candidate has 'ms' and 'vs_incumbent', or 'failed'")
        return self


class ShapeEntry(_Line):
    """One shape of a chunk: the incumbent's time and spread, the library's, the candidates'."""

    candidates: dict[Text, CandidateResult] = {}
    incumbent_failed: Text | None = None
    incumbent_ms: Positive | None = None
    spread: NonNegative | None = None
    library_ms: Positive | None = None
    library_vs_incumbent: Positive | None = None

    @model_validator(mode="after")
    def _complete(self) -> "ShapeEntry":
        if self.incumbent_failed is None and (self.incumbent_ms is None or self.spread is None):
            raise ValueError("a shape has 'incumbent_ms' and 'spread', or 'incumbent_failed'")
        if (self.library_ms is None) != (self.library_vs_incumbent is None):
            raise ValueError("'library_ms' and 'library_vs_incumbent' go together")
        return self


class ChunkLine(_Line):
    """A finished chunk (``measure.Shard.measure``)."""

    kind: Literal["chunk"]
    index: Annotated[StrictInt, Field(ge=0)]
    bucket: Text
    keys: list[Text]
    shapes: dict[Text, ShapeEntry]
    seconds: NonNegative
    pid: StrictInt
    device_env: Text


class PlanArgs(_Line):
    """What besides the specs decided the plan (``cli.plan_args``)."""

    shapes: list[Text] | None
    space: list[Text] | None
    buckets: list[Text] | None
    rounds: StrictInt | None
    chunk: StrictInt | None
    model: Text | None
    dtype: Text | None


class HeaderLine(_Line):
    """A results file's first line (``measure.shard_header`` and the plan's arguments)."""

    kind: Literal["header"]
    fingerprint: Annotated[StrictStr, Field(pattern=r"^[0-9a-f]{12}$")]
    config: Text
    target: Text
    shard: tuple[Annotated[StrictInt, Field(ge=0)], Annotated[StrictInt, Field(ge=1)]]
    chunks: Annotated[StrictInt, Field(ge=0)]
    env: dict[Text, Text]
    command: Text
    started: Text
    plan_args: PlanArgs

    @model_validator(mode="after")
    def _shard(self) -> "HeaderLine":
        if not self.shard[0] < self.shard[1]:
            raise ValueError(f"shard {self.shard[0]}/{self.shard[1]}: I must be in 0..N-1")
        return self


def _problems(exc: ValidationError, where: str) -> list[str]:
    out = []
    for e in exc.errors():
        loc = ".".join(str(x) for x in e["loc"])
        got = "" if e["type"] == "missing" else f" (got {_short(e.get('input'))})"
        out.append(f"{where}: {loc + ': ' if loc else ''}{e['msg']}{got}")
    return out


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# -- files ------------------------------------------------------------------------------------


class ResultsFile:
    """A shard's results file: its header and chunks; ``append`` adds a chunk line."""

    def __init__(
        self,
        path: Path,
        header: Mapping[str, Any],
        chunks: dict[int, dict[str, Any]],
        lines: Mapping[int, int] | None = None,
    ):
        self.path = path
        self.header = dict(header)
        self.chunks = chunks
        self.lines = dict(lines or {})  # chunk index -> its line number in the file
        self.dropped: list[tuple[int, str]] = []  # (chunk, why): results not resumed (``open``)

    @classmethod
    def open(cls, path: Path, header: Mapping[str, Any], fresh: bool = False) -> "ResultsFile":
        """The file at ``path`` for this plan: resumed if it holds the same plan's results,
        created with ``header`` if it does not exist (or ``fresh``, or it holds nothing but a
        header a kill cut short).  Chunks whose incumbent failed on every shape (a broken
        device or environment: nothing was decided from them) are dropped, to be measured again."""
        if path.exists() and not fresh and not _only_cut(path):
            old = read(path)
            if old.header.get("fingerprint") != header["fingerprint"] or old.header.get("shard") != header["shard"]:
                raise ResultsError(
                    f"{path} holds results of another plan (fingerprint {old.header.get('fingerprint')}, shard "
                    f"{old.header.get('shard')}; this run: {header['fingerprint']}, shard {header['shard']}): "
                    "pass --fresh to start over, or another --results path"
                )
            old._rewrite_without_failures()
            return old
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "w") as f:
                f.write(json.dumps(header, sort_keys=True) + "\n")
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            raise ResultsError(f"cannot write the results file {path}: {exc.strerror or exc}") from None
        return cls(path, header, {})

    def _rewrite_without_failures(self) -> None:
        """Keep only lines worth resuming: drop a cut last line, and chunks whose incumbent
        failed on every shape (the file is rewritten atomically)."""
        failed = {
            i: next(iter(line["shapes"].values()))["incumbent_failed"]
            for i, line in self.chunks.items()
            if line["shapes"] and all("incumbent_failed" in e for e in line["shapes"].values())
        }
        data = self.path.read_bytes()
        cut = bool(data) and not data.endswith(b"\n")
        if not failed and not cut:
            return
        kept = [json.dumps(self.header, sort_keys=True)]
        kept += [
            json.dumps(line, sort_keys=True)
            for i, line in sorted(self.chunks.items(), key=lambda t: self.lines[t[0]])
            if i not in failed
        ]
        try:
            tmp = write.write_temp(self.path, ("\n".join(kept) + "\n").encode())
            os.replace(tmp, self.path)
        except OSError as exc:
            raise ResultsError(f"cannot rewrite the results file {self.path}: {exc.strerror or exc}") from None
        self.dropped = sorted(failed.items())
        for i in failed:
            del self.chunks[i]
        order = [i for i in sorted(self.chunks, key=lambda i: self.lines[i])]
        self.lines = {i: n for n, i in enumerate(order, 2)}

    def done(self) -> set[int]:
        return set(self.chunks)

    def append(self, line: Mapping[str, Any]) -> None:
        try:
            with open(self.path, "a") as f:
                f.write(json.dumps(line, sort_keys=True) + "\n")
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            raise ResultsError(f"cannot append to the results file {self.path}: {exc.strerror or exc}") from None
        self.chunks[line["index"]] = dict(line)
        self.lines[line["index"]] = len(self.lines) + 2

    def check_plan(self, plan: Any) -> None:
        """Each chunk is one of the plan's, in this file's shard, with the plan's bucket, keys
        and shapes: otherwise ResultsError naming the file and line."""
        i, n = self.header["shard"]
        problems = []
        for index, line in sorted(self.chunks.items(), key=lambda t: self.lines.get(t[0], 0)):
            where = f"{self.path}:{self.lines.get(index, '?')}: chunk {index}"
            if index >= len(plan.chunks):
                problems.append(f"{where}: the plan has {len(plan.chunks)} chunks")
                continue
            chunk = plan.chunks[index]
            if index % n != i:
                problems.append(f"{where}: not in shard {i}/{n}, which this file holds")
            if line["bucket"] != chunk.bucket or tuple(line["keys"]) != chunk.keys:
                problems.append(f"{where}: its bucket and candidates are not the plan's ({chunk.bucket})")
                continue
            bucket = plan.bucket(chunk.bucket)
            shapes = {plan.shape_text(s) for s in bucket.shapes}
            if set(line["shapes"]) != shapes:
                problems.append(
                    f"{where}: shapes {', '.join(sorted(line['shapes']))}, not the bucket's {', '.join(sorted(shapes))}"
                )
                continue
            for s, entry in line["shapes"].items():
                extra = sorted(set(entry.get("candidates", {})) - set(chunk.keys))
                if extra:
                    problems.append(f"{where}: shape {s}: results of candidates not in the chunk ({', '.join(extra)})")
        if problems:
            raise ResultsError(_listed(problems))


def _listed(problems: Sequence[str], most: int = 20) -> str:
    more = f"\n  ... and {len(problems) - most} more" if len(problems) > most else ""
    return "\n  ".join(["damaged results file(s):", *problems[:most]]) + more if len(problems) > 1 else problems[0]


def _only_cut(path: Path) -> bool:
    """The file holds no complete line (a kill cut its header short, or it is empty)."""
    try:
        return b"\n" not in path.read_bytes()
    except OSError:
        return False


def read(path: Path) -> ResultsFile:
    """Read and validate a results file: a header line, then chunk lines, each as tune writes
    them (the schemas above); text after the last newline is a line a kill cut short, ignored."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ResultsError(f"cannot read {path}: {exc.strerror or exc}") from None
    *complete, _cut = data.split(b"\n")  # the part after the last newline: cut short, or empty
    if not complete:
        raise ResultsError(f"{path}: {'empty' if not data else 'no complete line'}: not a codegen tune results file")
    not_ours = f"not a codegen tune results file (its first line is not tune's header"
    try:
        first = json.loads(complete[0].decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ResultsError(f"{path}:1: {not_ours}: not a JSON line)") from None
    if not isinstance(first, dict) or first.get("kind") != "header":
        raise ResultsError(f"{path}:1: {not_ours})")
    problems: list[str] = []
    try:
        HeaderLine.model_validate(first)
    except ValidationError as exc:
        problems += _problems(exc, f"{path}:1: header")
    chunks: dict[int, dict[str, Any]] = {}
    lines: dict[int, int] = {}
    for n, raw in enumerate(complete[1:], 2):
        where = f"{path}:{n}"
        try:
            line = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            problems.append(f"{where}: not UTF-8 text")
            continue
        except (ValueError, RecursionError):  # RecursionError: nested past the parser's depth
            problems.append(f"{where}: not a JSON line")
            continue
        if not isinstance(line, dict) or line.get("kind") != "chunk":
            kind = line.get("kind") if isinstance(line, dict) else None
            problems.append(
                f"{where}: not a chunk line ({'a second header' if kind == 'header' else f'kind {_short(kind)}'})"
            )
            continue
        try:
            ChunkLine.model_validate(line)
        except ValidationError as exc:
            problems += _problems(exc, f"{where}: chunk")
            continue
        if line["index"] in chunks:
            problems.append(f"{where}: chunk {line['index']} again (line {lines[line['index']]} has it)")
            continue
        chunks[line["index"]] = line
        lines[line["index"]] = n
    if problems:
        raise ResultsError(_listed(problems))
    return ResultsFile(path, first, chunks, lines)


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
