"""A config's policies: parse each policy, bucket and value, then chain their values.

Validation by hand (the fields of a policy are the config's own fields, which
pydantic cannot know statically): thresholds, target lists, notes, bounds and
values, each problem with its file, line and key path.

Chaining (as CCCL's ChainedPolicy): a policy states only what differs from the
policy it chains from, its *parent*: the same vendor's policy (serving every
target of the vendor) with the next lower threshold, or, for a policy limited
to named ``targets``, the vendor's policy at or below its own threshold; the
base policy when there is none.  A field no policy in the chain sets takes the
field's ``default``.  A bucketed policy that lists no buckets takes its
parent's, over its own values, and may change some of them by name with
``[[...amend]]`` tables (``bucket = "small"`` and the fields that differ): what
``codegen tune`` writes for one part of an arch that others share.  A field
still unset is reported when resolve meets a target that the incomplete policy
serves.  ``provenance`` tables (``models.ProvenanceSpec``) say where values
were measured.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Mapping

from . import rules
from .errors import KeyPath, SpecProblem, format_keypath, suggest, unknown, validate
from .models import (
    AMEND_KEYS,
    BOUND_RE,
    BUCKET_KEYS,
    POLICY_KEYS,
    ExprRule,
    FieldSpec,
    PickRule,
    ProvenanceSpec,
    TuneSpec,
    text_problem,
)
from .records import (
    Bound,
    Bucket,
    ExprValue,
    FrozenMap,
    LiteralValue,
    PickValue,
    Policy,
    Source,
    Tune,
    TuneSpace,
    Value,
)

NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
_LITERAL_TYPES = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,)}
ParseRule = Callable[..., "rules.Expr | None"]


class _Raw:
    """A policy as written: its own values and, for bucketed configs, its own buckets and its
    amends of its parent's."""

    def __init__(self, policy: Policy, own: dict[str, Value], buckets: list[tuple] | None, amends: list[tuple]):
        self.policy = policy
        self.own = own
        self.buckets = buckets  # [(name, note, bounds, own values, keypath, provenance)] or None
        self.amends = amends  # [(bucket name, note, own values, keypath, provenance)]


def load_policies(
    *,
    config: str,
    record: str,
    fields: Mapping[str, FieldSpec],
    dims: tuple[str, ...] | None,
    raw_policies: tuple[dict[str, Any], ...],
    raw_base: dict[str, Any] | None,
    source: Source,
    parse_rule: ParseRule,
    vendors: Mapping[str, Any],
    hardware: Mapping[str, str | None],
    problems: list[SpecProblem],
) -> tuple[tuple[Policy, ...], Policy | None]:
    """The config's policies, sorted by (vendor, min_arch, targets), and its base policy; each
    with every value its chain gives (``Policy.values``, ``Bucket.values``)."""
    ctx = _Ctx(config, record, fields, dims, source, parse_rule, vendors, hardware, problems)
    defaults: dict[str, Value] = {}
    for fname, fspec in fields.items():
        if fspec.default is not None:
            parsed = ctx.value(fname, fspec.default, (config, "fields", fname, "default"))
            if parsed is not None:
                defaults[fname] = parsed
    raws = []
    for i, raw in enumerate(raw_policies):
        r = ctx.policy(raw, (config, "policy", i), base=False)
        if r is not None:
            raws.append(r)
    base = ctx.policy(raw_base, (config, "base"), base=True) if raw_base is not None else None
    _check_duplicates(raws, source, problems)
    raws.sort(key=lambda r: (r.policy.vendor or "", r.policy.min_arch or 0, r.policy.targets or ()))

    chained: dict[int, tuple[dict[str, Value], list[tuple] | None]] = {}

    def chain(r: _Raw | None) -> tuple[dict[str, Value], list[tuple] | None]:
        if r is None:
            return dict(defaults), None
        if id(r) not in chained:
            values, buckets = chain(_parent(r, raws, base))
            values.update(r.own)
            if r.buckets is not None:
                buckets = r.buckets
            elif r.amends:
                buckets = _amend(r, buckets, source, problems)
            chained[id(r)] = (values, buckets)
        values, buckets = chained[id(r)]
        return dict(values), buckets

    def finish(r: _Raw) -> Policy:
        values, buckets = chain(r)
        parent = _parent(r, raws, base)
        out_buckets = None
        if dims is not None:
            if not buckets:
                problems.append(
                    source.problem(
                        r.policy.keypath,
                        "a bucketed config's policy needs a non-empty [[...bucket]] list "
                        "(nor does a policy it chains from have one)",
                    )
                )
            else:
                out_buckets = tuple(
                    Bucket(name, note, bounds, FrozenMap({**values, **own}), keypath, prov)
                    for name, note, bounds, own, keypath, prov in buckets
                )
        return _replace(
            r.policy,
            values=FrozenMap(values),
            buckets=out_buckets,
            parent=parent.policy.label if parent is not None else None,
        )

    policies = tuple(finish(r) for r in raws)
    return policies, (finish(base) if base is not None else None)


def _amend(r: _Raw, buckets: list[tuple] | None, source: Source, problems: list[SpecProblem]) -> list[tuple] | None:
    """The parent's buckets with ``r``'s amends applied: an amended bucket keeps its name and
    bounds and takes the amend's values over its own (and its note and provenance, if given)."""
    if buckets is None:
        problems.append(
            source.problem(
                r.policy.keypath + ("amend",),
                "amend needs buckets to change: " "neither this policy nor one it chains from lists any",
            )
        )
        return None
    out = list(buckets)
    names = [b[0] for b in out]
    for bname, note, own, keypath, prov in r.amends:
        if bname not in names:
            problems.append(
                source.problem(
                    keypath + ("bucket",),
                    f"no such bucket in the policy this one chains from (buckets: {', '.join(names)})"
                    + suggest(bname, names),
                    value=bname,
                )
            )
            continue
        i = names.index(bname)
        name, old_note, bounds, old_own, _, old_prov = out[i]
        out[i] = (name, note or old_note, bounds, {**old_own, **own}, keypath, prov or old_prov)
    return out


def _replace(policy: Policy, **changes: Any) -> Policy:
    from dataclasses import replace

    return replace(policy, **changes)


def _parent(r: _Raw, raws: list[_Raw], base: _Raw | None) -> _Raw | None:
    """The policy ``r`` chains from: the vendor's next lower threshold serving every target
    (for a policy limited to named targets: at or below its own), else the base policy."""
    p = r.policy
    if p.vendor is None:
        return None
    best = None
    for other in raws:
        q = other.policy
        if other is r or q.vendor != p.vendor or q.targets is not None:
            continue
        below = q.min_arch < p.min_arch or (p.targets is not None and q.min_arch == p.min_arch)  # type: ignore[operator]
        if below and (best is None or q.min_arch > best.policy.min_arch):  # type: ignore[operator]
            best = other
    return best if best is not None else base


def _check_duplicates(raws: list[_Raw], source: Source, problems: list[SpecProblem]) -> None:
    seen: dict[tuple, Policy] = {}
    for r in raws:
        pol = r.policy
        key = (pol.vendor, pol.min_arch, pol.targets)
        if key in seen:
            problems.append(
                source.problem(
                    pol.keypath + ("min_arch",),
                    f"duplicate threshold {pol.label}: also given at "
                    f"{format_keypath(seen[key].keypath)} (line {source.line(seen[key].keypath)})",
                    value=pol.min_arch,
                )
            )
        seen[key] = pol


class _Ctx:
    """What parsing a config's policies needs, so the functions below take few arguments."""

    def __init__(self, config, record, fields, dims, source, parse_rule, vendors, hardware, problems):
        self.config = config
        self.record = record
        self.fields = fields
        self.dims = dims
        self.source = source
        self.parse_rule = parse_rule
        self.vendors = vendors
        self.hardware = hardware  # spec name -> vendor
        self.problems = problems

    def problem(self, keypath: KeyPath, rule: str, **value: Any) -> None:
        self.problems.append(self.source.problem(keypath, rule, **value))

    # -- one policy ----------------------------------------------------------------------

    def policy(self, raw: dict[str, Any], path: KeyPath, *, base: bool) -> _Raw | None:
        start = len(self.problems)
        vendor = raw.get("vendor")
        min_arch = raw.get("min_arch")
        max_arch = raw.get("max_arch")
        targets = raw.get("targets")
        note = raw.get("note", "")
        tuned = raw.get("tuned", True)
        if type(tuned) is not bool:
            self.problem(path + ("tuned",), "must be true or false", value=tuned)
        provenance = self.provenance(raw, path)
        if base:
            for key in ("vendor", "min_arch", "max_arch", "targets"):
                if key in raw:
                    self.problem(path + (key,), "the base policy applies to every vendor and arch; remove this key")
        else:
            if vendor is None:
                self.problem(path, "required key 'vendor' is missing")
            elif vendor not in self.vendors:
                self.problem(path + ("vendor",), unknown("vendor", vendor, self.vendors), value=vendor)
            if min_arch is None:
                self.problem(path, "required key 'min_arch' is missing")
            elif type(min_arch) is not int or min_arch < 0:
                self.problem(path + ("min_arch",), "must be a non-negative integer", value=min_arch)
            if max_arch is not None and (type(max_arch) is not int or (type(min_arch) is int and max_arch < min_arch)):
                self.problem(path + ("max_arch",), "must be an integer >= min_arch", value=max_arch)
            if targets is not None:
                targets = self._targets(targets, vendor, path + ("targets",))
        self.note(note, path + ("note",))

        own: dict[str, Value] = {}
        for key, value in raw.items():
            if key in POLICY_KEYS:
                continue
            if key not in self.fields:
                self.problem(
                    path + (key,),
                    f"not a field of {self.record} (fields: {', '.join(self.fields)}){suggest(key, self.fields)}",
                    value=value,
                )
                continue
            parsed = self.value(key, value, path + (key,))
            if parsed is not None:
                own[key] = parsed

        buckets = None
        amends: list[tuple] = []
        if self.dims is not None:
            raw_buckets = raw.get("bucket")
            if raw_buckets is not None:
                if not isinstance(raw_buckets, list) or not raw_buckets:
                    self.problem(path + ("bucket",), "a policy's [[...bucket]] list must not be empty")
                else:
                    buckets = self._buckets(raw_buckets, path)
            if "amend" in raw:
                amends = self._amends(raw["amend"], path, base=base, own_buckets=raw_buckets is not None)
        else:
            for key in ("bucket", "amend"):
                if key in raw:
                    self.problem(path + (key,), "this config is not bucketed (it has no [buckets] table)")

        if len(self.problems) > start:
            return None
        policy = Policy(
            vendor=None if base else vendor,
            min_arch=None if base else min_arch,
            max_arch=None if base else max_arch,
            targets=None if base or targets is None else tuple(sorted(targets)),
            note=note,
            values=FrozenMap(own),
            buckets=None,
            keypath=path,
            tuned=tuned is True,
            provenance=provenance,
        )
        return _Raw(policy, own, buckets, amends)

    def provenance(self, raw: dict[str, Any], path: KeyPath) -> ProvenanceSpec | None:
        if "provenance" not in raw:
            return None
        return validate(ProvenanceSpec, raw["provenance"], self.source, path + ("provenance",), self.problems)

    def _amends(self, raw_amends: Any, path: KeyPath, *, base: bool, own_buckets: bool) -> list[tuple]:
        if base:
            self.problem(path + ("amend",), "the base policy chains from nothing: write its buckets instead")
            return []
        if own_buckets:
            self.problem(
                path + ("amend",), "this policy lists its own buckets: change those instead of amending its parent's"
            )
            return []
        if not isinstance(raw_amends, list) or not raw_amends:
            self.problem(path + ("amend",), "a policy's [[...amend]] list must not be empty")
            return []
        out = []
        seen: set[str] = set()
        for j, ra in enumerate(raw_amends):
            apath = path + ("amend", j)
            if not isinstance(ra, dict):
                self.problem(apath, "an amend must be a table", value=ra)
                continue
            bname = ra.get("bucket")
            if not isinstance(bname, str) or not NAME_RE.match(bname):
                self.problem(apath + ("bucket",), "must name a bucket of the policy this one chains from", value=bname)
                continue
            if bname in seen:
                self.problem(apath + ("bucket",), "this bucket is already amended in this policy", value=bname)
            seen.add(bname)
            note = ra.get("note", "")
            self.note(note, apath + ("note",))
            own: dict[str, Value] = {}
            for key, value in ra.items():
                if key in AMEND_KEYS:
                    continue
                if key not in self.fields:
                    self.problem(
                        apath + (key,),
                        f"not a field of {self.record} (an amend changes field values, not bounds; "
                        f"fields: {', '.join(self.fields)}){suggest(key, self.fields)}",
                        value=value,
                    )
                    continue
                parsed = self.value(key, value, apath + (key,))
                if parsed is not None:
                    own[key] = parsed
            out.append((bname, note, own, apath, self.provenance(ra, apath)))
        return out

    def _targets(self, targets: Any, vendor: Any, path: KeyPath) -> tuple[str, ...] | None:
        if not isinstance(targets, list) or not targets or not all(isinstance(t, str) for t in targets):
            self.problem(path, "must be a non-empty list of hardware spec names", value=targets)
            return None
        out = []
        for i, t in enumerate(targets):
            if t not in self.hardware:
                self.problem(
                    path + (i,),
                    f"no such hardware spec (known: {', '.join(sorted(self.hardware))}){suggest(t, self.hardware)}",
                    value=t,
                )
            elif self.hardware[t] is None:  # its file failed to load, and says why
                out.append(t)
            elif self.hardware[t] != vendor:
                self.problem(path + (i,), f"target is a {self.hardware[t]} part; this policy is for {vendor}", value=t)
            else:
                out.append(t)
        return tuple(out)

    def _buckets(self, raw_buckets: list, path: KeyPath) -> list[tuple] | None:
        start = len(self.problems)
        out = []
        for j, rb in enumerate(raw_buckets):
            b = self._bucket(rb, path + ("bucket", j))
            if b is not None:
                out.append(b)
        if out and out[-1][2]:
            self.problem(out[-1][4], "the last bucket must be a catch-all (no bounds) so every shape has a kernel")
        names = [b[0] for b in out]
        for b in out:
            if names.count(b[0]) > 1:
                self.problem(b[4] + ("name",), "bucket names must be unique in a policy", value=b[0])
        return out if len(self.problems) == start else None

    def _bucket(self, raw: Any, path: KeyPath) -> tuple | None:
        assert self.dims is not None
        start = len(self.problems)
        if not isinstance(raw, dict):
            self.problem(path, "a bucket must be a table", value=raw)
            return None
        name = raw.get("name")
        if not isinstance(name, str) or not NAME_RE.match(name):
            self.problem(path + ("name",), f"bucket name must match {NAME_RE.pattern}", value=name)
        note = raw.get("note", "")
        self.note(note, path + ("note",))
        bounds: list[Bound] = []
        own: dict[str, Value] = {}
        for key, value in raw.items():
            if key in BUCKET_KEYS:
                continue
            bound = BOUND_RE.match(key)
            if bound and bound.group(1) in self.dims:
                if type(value) is not int or value < 0:
                    self.problem(path + (key,), "a bound must be a non-negative integer", value=value)
                else:
                    bounds.append(Bound(bound.group(1), bound.group(2), value))
                continue
            if key not in self.fields:
                dims = ", ".join(f"{d}_min/{d}_max" for d in self.dims)
                self.problem(
                    path + (key,),
                    f"not a field of {self.record} nor a bound ({dims})"
                    + suggest(key, list(self.fields) + [f"{d}_{k}" for d in self.dims for k in ("min", "max")]),
                    value=value,
                )
                continue
            parsed = self.value(key, value, path + (key,))
            if parsed is not None:
                own[key] = parsed
        for dim in self.dims:
            lo = [b.value for b in bounds if b.dim == dim and b.kind == "min"]
            hi = [b.value for b in bounds if b.dim == dim and b.kind == "max"]
            if lo and hi and lo[0] > hi[0]:
                self.problem(path + (f"{dim}_min",), f"{dim}_min > {dim}_max: the bucket matches nothing")
        if len(self.problems) > start:
            return None
        ordered = tuple(sorted(bounds, key=lambda b: (self.dims.index(b.dim), b.kind)))  # type: ignore[union-attr]
        return (name, note, ordered, own, path, self.provenance(raw, path))

    def note(self, note: Any, path: KeyPath) -> None:
        """A policy's or bucket's note: one line of text, like every doc (models.text_problem)."""
        if not isinstance(note, str):
            self.problem(path, "must be a string", value=note)
            return
        why = text_problem(note)
        if why is not None:
            self.problem(path, why, value=note)

    # -- one value -----------------------------------------------------------------------

    def value(self, name: str, raw: Any, path: KeyPath) -> Value | None:
        field_spec = self.fields[name]
        if isinstance(raw, Mapping):  # a table (a field's default arrives frozen)
            raw = dict(raw)
            if "expr" in raw:
                rule = validate(ExprRule, raw, self.source, path, self.problems)
                if rule is None:
                    return None
                expr = self.parse_rule(rule.expr, path + ("expr",))
                return None if expr is None else ExprValue(path, expr)
            if "largest" in raw or "smallest" in raw:
                pick = validate(PickRule, raw, self.source, path, self.problems)
                if pick is None:
                    return None
                if field_spec.type != "int":
                    self.problem(path, f"a pick rule needs an int field; '{name}' is {field_spec.type}")
                    return None
                where = self.parse_rule(pick.where, path + ("where",), frozenset({name}))
                return None if where is None else PickValue(path, where, pick.ordered)
            self.problem(
                path,
                'a table value must be a rule: { expr = "..." } or { largest|smallest = [...], where = "..." }',
                value=raw,
            )
            return None
        if type(raw) not in _LITERAL_TYPES[field_spec.type]:
            self.problem(path, f"'{name}' must be a {field_spec.type}", value=raw)
            return None
        if field_spec.choices is not None and raw not in field_spec.choices:
            self.problem(path, f"'{name}' must be one of {', '.join(map(repr, field_spec.choices))}", value=raw)
            return None
        return LiteralValue(path, raw)


def load_tune(
    *,
    config: str,
    record: str,
    fields: Mapping[str, FieldSpec],
    dims: tuple[str, ...] | None,
    variants: Mapping[str, Any],
    policies: tuple[Policy, ...],
    base: Policy | None,
    spec: TuneSpec,
    source: Source,
    parse_rule: ParseRule,
    problems: list[SpecProblem],
) -> Tune | None:
    """``[<config>.tune]`` checked against the config: its variant, shapes, backend field and
    search axes (each value parsed as a policy value of its field)."""
    start = len(problems)
    path: KeyPath = (config, "tune")
    ctx = _Ctx(config, record, fields, dims, source, parse_rule, {}, {}, problems)
    if dims is not None and spec.dims is not None:
        ctx.problem(path + ("dims",), f"a bucketed config's problems have its bucket dimensions ({', '.join(dims)})")
    if dims is None:
        if spec.dims is None:
            ctx.problem(path, "a config that is not bucketed names its problem dimensions: dims = [...]")
            return None
        dims = spec.dims
    if spec.variant not in variants:
        ctx.problem(path + ("variant",), f"no such variant (variants: {', '.join(variants)})", value=spec.variant)
    for i, shape in enumerate(spec.shapes):
        if len(shape) != len(dims):
            ctx.problem(path + ("shapes", i), f"a shape gives one value per dimension ({', '.join(dims)})", value=shape)
    if spec.backend is not None:
        bpath = path + ("backend",)
        if spec.backend.field not in fields:
            ctx.problem(
                bpath + ("field",),
                f"not a field of {record} (fields: {', '.join(fields)}){suggest(spec.backend.field, fields)}",
                value=spec.backend.field,
            )
        else:
            for key in ("library", "kernel"):
                ctx.value(spec.backend.field, getattr(spec.backend, key), bpath + (key,))
    known = {b.name for p in policies + ((base,) if base is not None else ()) for b in p.buckets or ()}
    spaces = []
    for i, space in enumerate(spec.space):
        spath = path + ("space", i)
        for j, bname in enumerate(space.buckets or ()):
            if bname not in known:
                ctx.problem(
                    spath + ("buckets", j),
                    f"no policy has a bucket of this name ({', '.join(sorted(known))}){suggest(bname, known)}",
                    value=bname,
                )
        axes: dict[str, tuple[Value, ...]] = {}
        for fname, values in space.axes.items():
            apath = spath + ("axes", fname)
            if fname not in fields:
                ctx.problem(apath, f"not a field of {record} (fields: {', '.join(fields)}){suggest(fname, fields)}")
                continue
            if not values:
                ctx.problem(apath, "an axis needs at least one value")
                continue
            parsed = []
            for k, raw in enumerate(values):
                if isinstance(raw, Mapping) and "expr" not in raw:
                    ctx.problem(
                        apath + (k,), 'a search axis takes literals and { expr = "..." } rules', value=dict(raw)
                    )
                    continue
                v = ctx.value(fname, raw, apath + (k,))
                if v is not None:
                    parsed.append(v)
            axes[fname] = tuple(parsed)
        spaces.append(TuneSpace(space.name, space.doc, space.buckets, FrozenMap(axes), spath))
    names = [s.name for s in spec.space]
    for i, name in enumerate(names):
        if names.index(name) != i:
            ctx.problem(path + ("space", i, "name"), "space names must be unique", value=name)
    if len(problems) > start:
        return None
    return Tune(spec, tuple(spaces), path)
