"""Diagnostics: every problem in the specs becomes one ``SpecProblem``.

A problem names the file, the key path inside it (and the line, when the
locator can find it), the offending value and the rule it broke.  Stages
collect all problems they can find before stopping, so a user fixes a spec
tree in one pass rather than one error per run.  The CLI prints them and
exits 2; nothing that raises ``SpecErrors`` has touched ``generated/``.
"""

from __future__ import annotations

import difflib
import typing
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from pydantic import BaseModel, ValidationError

KeyPath = tuple[str | int, ...]


def format_keypath(path: KeyPath) -> str:
    """``("attention", "policy", 0, "block")`` -> ``attention.policy[0].block``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "<top level>"


# A value in a message is printed bounded, so that the report itself cannot fail (Python refuses
# to print an integer of more than 4,300 digits) nor run to pages.
MAX_VALUE_TEXT = 80


def format_value(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int):
        if value.bit_length() > 332:  # past 100 digits (and Python refuses past 4,300): its size only
            return f"{'-' if value < 0 else ''}an integer of {value.bit_length():,} bits"
        return f"{value:,}"
    return bounded(value)


def bounded(value: Any, limit: int = MAX_VALUE_TEXT) -> str:
    """``repr(value)``, cut to ``limit`` characters with the count of those left out; a container
    holding an integer too large to print is shown by its type and size."""
    try:
        text = repr(value)
    except ValueError:  # an integer past Python's 4,300 digits somewhere inside
        size = f" of {len(value):,} items" if hasattr(value, "__len__") else ""
        return f"a {type(value).__name__}{size} holding an integer too large to print"
    if len(text) <= limit:
        return text
    return f"{text[: limit - 3]}... ({len(text) - limit + 3:,} more characters)"


def suggest(name: Any, known: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the known name nearest ``name`` (case ignored), or ``""``."""
    near = _nearest(name, known)
    return f"; did you mean {near!r}?" if near is not None else ""


def _nearest(name: Any, known: Iterable[str]) -> str | None:
    """The known name nearest ``name`` (difflib, case ignored), None if none is close or
    ``name`` is itself known."""
    if not isinstance(name, str):
        return None
    by_lower: dict[str, str] = {}
    for k in sorted(known):
        by_lower.setdefault(k.lower(), k)
    if name.lower() in by_lower:
        return None if by_lower[name.lower()] == name else by_lower[name.lower()]
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=1)
    return by_lower[close[0]] if close else None


def unknown(what: str, name: Any, known: Iterable[str]) -> str:
    """The rule of a name that names nothing: ``unknown vendor; known: a, b; did you mean 'a'?``."""
    names = sorted(set(known))
    return f"unknown {what}; known: {', '.join(names) or 'none'}{suggest(name, names)}"


@dataclass(frozen=True)
class SpecProblem:
    file: str  # path relative to the spec root's parent, e.g. "specs/kernels/moe.toml"
    keypath: KeyPath  # where in the file; () for the whole file
    rule: str  # what was required, in words
    value: Any = None  # the offending value, when there is one
    line: int | None = None  # 1-based line of the key, when the locator found it
    has_value: bool = False  # distinguishes "value is None" from "no value to show"

    def render(self) -> str:
        where = self.file + (f":{self.line}" if self.line else "")
        text = f"{where}: {format_keypath(self.keypath)}: {self.rule}"
        if self.has_value:
            text += f" (got {format_value(self.value)})"
        return text


def problem(file: str, keypath: KeyPath, rule: str, *, line: int | None = None, **value: Any) -> SpecProblem:
    """Build a problem; pass ``value=...`` to show the offending value."""
    if value and set(value) != {"value"}:
        raise TypeError(f"unexpected keyword arguments {sorted(value)}")
    return SpecProblem(
        file=file, keypath=keypath, rule=rule, line=line, value=value.get("value"), has_value="value" in value
    )


def os_reason(exc: OSError) -> str:
    """The reason an OSError gives, without its errno and path (the message names the path)."""
    return exc.strerror or str(exc)


class SpecErrors(Exception):
    """Raised by a stage with every problem it found; never empty."""

    def __init__(self, problems: Iterable[SpecProblem]):
        self.problems = tuple(problems)
        assert self.problems, "SpecErrors needs at least one problem"
        super().__init__("\n".join(p.render() for p in self.problems))


# ---------------------------------------------------------------------------
# Pydantic errors as spec problems


def validate(model: type[BaseModel], data: Any, source: Any, prefix: KeyPath, problems: list[SpecProblem]) -> Any:
    """Validate ``data`` with a pydantic model; turn each error into a SpecProblem located by
    ``source`` (a records.Source).  None when invalid."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        missing = {tuple(e["loc"]) for e in errors if e["type"] == "missing"}
        # a misspelt required key is one problem: the unknown key, naming the one it misses
        renamed: set[tuple] = set()
        for err in errors:
            if err["type"] == "extra_forbidden":
                near = _nearest(err["loc"][-1], _keys_at(model, tuple(err["loc"][:-1])))
                if near is not None and tuple(err["loc"][:-1]) + (near,) in missing:
                    renamed.add(tuple(err["loc"][:-1]) + (near,))
        for err in errors:
            if err["type"] == "missing" and tuple(err["loc"]) in renamed:
                continue
            loc = prefix + tuple(err["loc"])
            # pydantic reports union members and "[key]" as extra loc parts; drop those.
            loc = tuple(p for p in loc if not (isinstance(p, str) and (p.startswith("function-") or p.endswith("]"))))
            rule = explain_pydantic(err)
            if err["type"] == "extra_forbidden":
                near = _nearest(err["loc"][-1], _keys_at(model, tuple(err["loc"][:-1])))
                if near is not None:
                    missed = tuple(err["loc"][:-1]) + (near,) in renamed
                    rule += f"; did you mean {near!r}{' (a required key, missing)' if missed else ''}?"
            if err["type"] == "missing":
                problems.append(source.problem(loc, rule))
            else:
                problems.append(source.problem(loc, rule, value=err.get("input")))
        return None


def _keys_at(model: type[BaseModel], loc: tuple) -> list[str]:
    """The keys the table at ``loc`` of ``model`` allows (best effort: [] where not found)."""
    current: Any = model
    for part in loc:
        if isinstance(part, str) and part in current.model_fields:
            current = _model_in(current.model_fields[part].annotation)
            if current is None:
                return []
        # a list index or a dict key: the model found for the field is its elements'
    return [f.alias or name for name, f in current.model_fields.items()]


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def explain_pydantic(err: Mapping[str, Any]) -> str:
    kind = err["type"]
    if kind == "missing":
        return "required key is missing"
    if kind == "extra_forbidden":
        return "unknown key (not part of this spec's schema)"
    msg = str(err["msg"])
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    return msg
