"""Stage 4 of ``codegen tune``: verdicts -> edited spec text (tomlkit), every other byte kept.

Where a change goes:

* The target's policy serves only this target, and no other target's policy chains from it (or
  ``scope="policy"`` was asked): in that policy.
  A bucket the policy lists itself is edited in place; a bucket it takes from the policy it
  chains from gets (or updates) an ``[[...amend]]`` table naming it.
* The policy serves other targets too (h100 and h200 share nvidia>=90): a new policy limited to
  this target (``targets = ["h200"]``) at the same threshold, chained from that policy, right
  after it in the file, with one ``amend`` per changed bucket; the other targets keep theirs.

Each changed bucket or amend gets the fields that differ (the space's values as written in the
spec, ``{ expr = "..." }`` included), a note, and a ``provenance`` table (``models.ProvenanceSpec``:
device, driver, versions, date, shapes, the measured ratios and spread, the values replaced, the
command).  Nothing is written here: ``edits`` returns new texts, and the CLI checks that the
edited tree builds before it replaces a file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import tomlkit
from tomlkit.items import Table

from ..records import Config, Policy, SpecTree
from ..resolve import chain
from .decide import Verdict
from .plan import Plan, written_value


class WriteBackError(Exception):
    """The winners cannot be written where asked: exit 2 with the message."""


@dataclass(frozen=True)
class Edit:
    path: str  # spec file, relative to the project root
    before: str
    after: str


def _toml(value: Any) -> Any:
    if isinstance(value, Mapping):
        t = tomlkit.inline_table()
        for k, v in value.items():
            t.append(k, _toml(v))
        return t
    if isinstance(value, (list, tuple)):
        return [_toml(v) for v in value]
    return value


def changes(plan: Plan, v: Verdict) -> dict[str, Any]:
    """The fields a verdict writes, as written in a spec: the winner's values that resolve
    differently from the incumbent's in some variant, and a new backend."""
    out: dict[str, Any] = {}
    if v.winner is not None:
        inc = plan.bucket(v.bucket).incumbent
        for f, written in v.winner.written.items():
            if any(v.winner.records[var][f] != inc.records[var][f] for var in inc.records):
                out[f] = written
    if v.backend is not None and plan.backend is not None:
        out[plan.backend.field] = v.backend
    return out


def edits(
    tree: SpecTree,
    plan: Plan,
    verdicts: tuple[Verdict, ...],
    *,
    env: Mapping[str, str],
    date: str,
    command: str,
    scope: str = "target",
) -> list[Edit]:
    todo = [(v, changes(plan, v)) for v in verdicts]
    todo = [(v, ch) for v, ch in todo if ch]
    if not todo:
        return []
    cfg = tree.config(plan.config)
    hw = next(h for h in tree.hardware if h.name == plan.target)
    policy = chain(cfg, hw)
    assert policy is not None
    plain = policy.buckets is None  # a config that is not bucketed: its one record is the "bucket"
    src, keypath, _ = cfg.source.origin(policy.keypath)
    doc = tomlkit.parse(src.text)
    serving = [h.name for h in tree.hardware if policy in _lineage(cfg, chain(cfg, h))]
    if scope == "policy" or serving == [plan.target]:
        table = _at(doc, keypath)
        amend_into = table
    else:
        if policy.targets is not None:
            raise WriteBackError(
                f"{plan.target}'s policy {policy.label} is limited to several targets ({', '.join(serving)}); "
                "split it by hand, or pass --scope policy to change it for all of them"
            )
        table = None
        amend_into = _new_policy(doc, policy, keypath, plan, hw.spec.vendor, hw.spec.arch, date, plain)
    measured_all = not plan.idle and all(v.unmeasured == 0 and not v.failed for v in verdicts)
    for v, ch in todo:
        if plain:
            values = policy.values
            target_table = amend_into  # the policy's own table, or the new one
        else:
            values = next(b for b in policy.buckets if b.name == v.bucket).values  # type: ignore[union-attr]
            own = None  # the bucket's table in the policy's own table, if it has one
            if table is not None and "bucket" in table:
                own = next((t for t in table["bucket"] if t.get("name") == v.bucket), None)
            target_table = own if own is not None else _amend_table(amend_into, v.bucket)
        previous = {f: written_value(values[f]) for f in ch if f in values}
        for f, value in ch.items():
            target_table[f] = _toml(value)
        if not (plain and table is not None):  # a policy's own note says what the policy is for: kept
            target_table["note"] = _note(plan, v, env, date)
        if "provenance" in target_table:
            del target_table["provenance"]
        target_table.add("provenance", _provenance(plan, v, env, date, command, previous))
    if table is not None and not policy.tuned and measured_all and "tuned" in table:
        del table["tuned"]  # every bucket of the policy was measured on the part it serves
    after = tomlkit.dumps(doc)
    if table is None:
        after = _blank_line_before(after, hw.spec.vendor, plan.target)
    return [Edit(src.path, src.text, after)] if after != src.text else []


def _blank_line_before(text: str, vendor: str, target: str) -> str:
    """A blank line before the new policy's header where tomlkit put it straight after the line
    above (when it is the file's last table, the one before ends without one)."""
    lines = text.split("\n")
    for i in range(1, len(lines) - 3):
        new = lines[i + 1] == f'vendor = "{vendor}"' and lines[i + 3] == f'targets = ["{target}"]'
        if lines[i].startswith("[[") and new and lines[i - 1].strip():
            lines.insert(i, "")
            break
    return "\n".join(lines)


def _lineage(cfg: Config, policy: Policy | None) -> list[Policy]:
    """``policy`` and every policy it chains from: a change to any of them reaches its targets."""
    by_label = {p.label: p for p in cfg.policies + ((cfg.base,) if cfg.base is not None else ())}
    out = []
    while policy is not None:
        out.append(policy)
        policy = by_label.get(policy.parent) if policy.parent is not None else None
    return out


def _at(doc: Any, keypath: tuple) -> Table:
    node = doc
    for part in keypath:
        node = node[part]
    return node


def _new_policy(
    doc: Any, parent: Policy, keypath: tuple, plan: Plan, vendor: str, arch: int, date: str, plain: bool
) -> Table:
    """A policy limited to the plan's target, chained from ``parent``, after it in the file."""
    t = tomlkit.table()
    t.add("vendor", vendor)
    t.add("min_arch", parent.min_arch if parent.vendor == vendor and parent.min_arch is not None else arch)
    t.add("targets", [plan.target])
    if not plain:
        t.add(
            "note",
            f"Measured on {plan.target} only (codegen tune, {date}): the buckets amended below; "
            f"the rest as {parent.label}, which other parts of this arch keep.",
        )
    if not parent.tuned:
        t.add("tuned", False)
    if not plain:
        t.add(tomlkit.nl())
        t.add("amend", tomlkit.aot())
    config_table = _at(doc, keypath[:1])
    policies = config_table.get("policy")
    if policies is None:
        policies = tomlkit.aot()
        config_table["policy"] = policies
        policies.append(t)
    elif len(keypath) == 3 and keypath[1] == "policy":
        policies.insert(keypath[2] + 1, t)
    else:
        policies.append(t)
    return t


def _amend_table(policy_table: Table, bucket: str) -> Table:
    amends = policy_table.get("amend")
    if amends is None:
        amends = tomlkit.aot()
        policy_table["amend"] = amends
    for t in amends:
        if t.get("bucket") == bucket:
            return t
    t = tomlkit.table()
    t.add("bucket", bucket)
    amends.append(t)
    return amends[len(amends) - 1]


def _note(plan: Plan, v: Verdict, env: Mapping[str, str], date: str) -> str:
    parts = []
    if v.winner is not None:
        parts.append(
            f"{v.best_score:.3f}x the previous config's time over {len(v.shapes)} shape(s) "
            f"(spread {v.spread:.1%}; {v.measured} of {v.planned} candidates measured)"
        )
    if v.kernel_vs_library is not None:
        parts.append(f"{v.kernel_vs_library:.3f}x the library")
    if v.backend is not None:
        parts.append(f"so the {v.backend} backend serves it")
    return f"codegen tune, {date}, {env.get('device', '?')}: " + "; ".join(parts) + "."


def _provenance(
    plan: Plan, v: Verdict, env: Mapping[str, str], date: str, command: str, previous: Mapping[str, Any]
) -> Table:
    t = tomlkit.table()
    t.add("tool", "codegen tune")
    for key in ("device", "driver", "torch", "triton"):
        t.add(key, str(env.get(key, "unknown")))
    t.add("date", date)
    t.add("shapes", list(v.shapes))
    t.add("vs_previous", round(v.best_score if v.winner is not None else 1.0, 4))  # type: ignore[arg-type]
    if v.kernel_vs_library is not None:
        t.add("vs_library", round(v.kernel_vs_library, 4))
    t.add("spread", round(v.spread or 0.0, 4))
    if previous:
        t.add("previous", _toml(previous))
    t.add("command", command)
    t.add(tomlkit.nl())
    return t
