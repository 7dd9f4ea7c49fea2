"""``extends``: a config table with its parent configs' inheritable keys merged in.

A config that follows the same rules as another says ``extends = "<config>"`` and sets only its
identity (record, doc, variants, aliases); the nearest definer of each inheritable key
(``models.INHERITED_KEYS``) wins, and a key set by the child replaces the inherited one whole.
The merged table gets an ``InheritedSource``, which locates inherited keys in their own files,
so messages and generated comments cite the line that defines them.
"""

from __future__ import annotations

from typing import Any, Mapping

from .errors import SpecProblem
from .models import INHERITED_KEYS
from .records import InheritedSource, Source


def inherit(
    name: str,
    source: Source,
    table: dict[str, Any],
    by_name: Mapping[str, tuple[Source, dict[str, Any]]],
    problems: list[SpecProblem],
) -> tuple[Source, dict[str, Any]] | None:
    """A config table with its ``extends`` chain merged in (the nearest definer of each
    inheritable key wins), and a source that locates inherited keys in their own files."""
    if "extends" not in table:
        return source, table
    merged = dict(table)
    inherited: dict[str, tuple[Source, str]] = {}
    chain = [name]
    cur, cur_source, cur_table = name, source, table
    while "extends" in cur_table:
        parent = cur_table["extends"]
        path = (cur, "extends")
        known = ", ".join(sorted(n for n in by_name if n != cur))
        if not isinstance(parent, str):
            problems.append(
                cur_source.problem(path, f"must be a string naming a config (known: {known})", value=parent)
            )
            return None
        if parent not in by_name:
            problems.append(cur_source.problem(path, f"no such config to extend (known: {known})", value=parent))
            return None
        if parent in chain:
            problems.append(
                cur_source.problem(path, f"extends forms a cycle: {' -> '.join(chain + [parent])}", value=parent)
            )
            return None
        chain.append(parent)
        cur_source, cur_table = by_name[parent]
        cur = parent
        for key in INHERITED_KEYS:
            if key not in merged and key in cur_table:
                merged[key] = cur_table[key]
                inherited[key] = (cur_source, parent)
    view = InheritedSource(
        source.path, source.text, name, tuple((k, src, p) for k, (src, p) in sorted(inherited.items()))
    )
    return view, merged
