"""Stage 1, specs -> SpecTree: read every TOML file under specs/ and validate it.

The result is a frozen ``SpecTree`` in which every policy value is either a
checked literal or a parsed rule, every threshold is unique per vendor, and
every reference (model, alias, field) points at something that exists.
Problems in all files are collected and raised together as ``SpecErrors``,
including files that cannot be listed, read or decoded (spec files are UTF-8
without a byte-order mark, as tomllib requires) and float literals that
generated code cannot spell (nan, inf).
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from pydantic import BaseModel, ValidationError

from . import rules
from .errors import KeyPath, SpecErrors, SpecProblem, format_keypath, os_reason, problem
from .models import (
    BOUND_RE,
    BUCKET_KEYS,
    HW_RULE_ATTRS,
    INHERITED_KEYS,
    MODEL_RULE_ATTRS,
    POLICY_KEYS,
    VENDORS,
    CheckSpec,
    ConfigSpec,
    ExprRule,
    FieldSpec,
    HardwareSpec,
    ModelSpec,
    PickRule,
    text_problem,
)

SPEC_DIRS = ("hardware", "models", "kernels")
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")


# ---------------------------------------------------------------------------
# Records produced by this stage


@dataclass(frozen=True)
class Source:
    """A spec file: its path relative to the project root, and its text (for line numbers)."""

    path: str
    text: str = field(repr=False)

    def origin(self, keypath: KeyPath) -> tuple["Source", KeyPath, str]:
        """The file that defines ``keypath``, the key path there, and a note for messages
        ("" when the key is defined in this file)."""
        return self, keypath, ""

    @property
    def paths(self) -> tuple[str, ...]:
        """Every spec file this source draws on."""
        return (self.path,)

    def line(self, keypath: KeyPath) -> int | None:
        src, kp, _ = self.origin(keypath)
        return locate(src.text, kp)

    def where(self, keypath: KeyPath) -> str:
        """``path:line`` of a key path (``path`` alone when the line is unknown)."""
        src, kp, _ = self.origin(keypath)
        line = locate(src.text, kp)
        return f"{src.path}:{line}" if line else src.path

    def problem(self, keypath: KeyPath, rule: str, **value: Any) -> SpecProblem:
        src, kp, note = self.origin(keypath)
        return problem(src.path, kp, rule + note, line=locate(src.text, kp), **value)


@dataclass(frozen=True)
class InheritedSource(Source):
    """The source of a config with ``extends``: key paths under an inherited key point at
    the config that defines it, so messages and generated comments cite that file."""

    config: str = ""
    # (key, defining file, defining config) for every inherited key, sorted by key.
    inherited: tuple[tuple[str, Source, str], ...] = field(default=(), repr=False)

    def origin(self, keypath: KeyPath) -> tuple[Source, KeyPath, str]:
        if len(keypath) > 1 and keypath[0] == self.config:
            for key, src, parent in self.inherited:
                if keypath[1] == key:
                    return src, (parent,) + tuple(keypath[1:]), f" (inherited by {self.config})"
        return self, keypath, ""

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(sorted({self.path} | {src.path for _, src, _ in self.inherited}))


@dataclass(frozen=True)
class Hardware:
    name: str  # file stem: the target's key everywhere
    spec: HardwareSpec
    source: Source


@dataclass(frozen=True)
class Model:
    name: str
    spec: ModelSpec
    source: Source


@dataclass(frozen=True)
class Value:
    """A policy value: a literal, an expression, or a pick among candidates."""

    keypath: KeyPath
    literal: Any = None
    expr: rules.Expr | None = None
    candidates: tuple[int, ...] | None = None  # with expr as the 'where' predicate


@dataclass(frozen=True)
class Bound:
    dim: str  # run-time dimension, e.g. "m"
    kind: str  # "min" or "max" (inclusive)
    value: int


@dataclass(frozen=True)
class Bucket:
    name: str
    note: str
    bounds: tuple[Bound, ...]
    values: Mapping[str, Value]
    keypath: KeyPath


@dataclass(frozen=True)
class Policy:
    """One threshold of a config: it serves its vendor from min_arch up to max_arch (or the next threshold)."""

    vendor: str | None  # None: the base policy
    min_arch: int | None
    max_arch: int | None
    note: str
    values: Mapping[str, Value]  # for bucketed configs: defaults shared by the buckets
    buckets: tuple[Bucket, ...] | None
    keypath: KeyPath

    @property
    def label(self) -> str:
        if self.vendor is None:
            return "base"
        upper = f"..{self.max_arch}" if self.max_arch is not None else ""
        return f"{self.vendor}>={self.min_arch}{upper}"


@dataclass(frozen=True)
class Check:
    spec: CheckSpec
    rule: rules.Expr
    when: rules.Expr | None
    keypath: KeyPath


@dataclass(frozen=True)
class Config:
    name: str
    spec: ConfigSpec
    source: Source
    variants: Mapping[str, Mapping[str, Any]]  # variant name -> parameters
    derived: Mapping[str, rules.Expr]
    checks: tuple[Check, ...]
    policies: tuple[Policy, ...]  # sorted by (vendor, min_arch)
    base: Policy | None

    @property
    def bucketed(self) -> bool:
        return self.spec.buckets is not None


@dataclass(frozen=True)
class SpecTree:
    root: Path
    hardware: tuple[Hardware, ...]  # sorted by (vendor, arch, name)
    models: Mapping[str, Model]
    configs: tuple[Config, ...]  # sorted by name

    def config(self, name: str) -> Config:
        for cfg in self.configs:
            if cfg.name == name:
                return cfg
        raise KeyError(name)

    @property
    def files(self) -> tuple[str, ...]:
        paths = [h.source.path for h in self.hardware]
        paths += [m.source.path for m in self.models.values()]
        paths += [p for c in self.configs for p in c.source.paths]
        return tuple(sorted(set(paths)))


# ---------------------------------------------------------------------------
# Entry point


def load(root: Path) -> SpecTree:
    """Read ``root/specs`` and return the validated tree, or raise SpecErrors."""
    problems: list[SpecProblem] = []
    spec_root = root / "specs"
    if not _is_dir(spec_root, "specs", problems):
        raise SpecErrors(problems or [problem("specs", (), f"spec directory not found under {root}")])

    raw: dict[str, list[tuple[str, Source, dict[str, Any]]]] = {d: [] for d in SPEC_DIRS}
    subs = _listdir(spec_root, "specs", problems)
    if subs is None:
        raise SpecErrors(problems)
    for sub in subs:
        rel = f"specs/{sub.name}"
        if sub.name.startswith("."):
            continue
        if _is_dir(sub, rel, problems) and sub.name not in SPEC_DIRS:
            problems.append(problem(rel, (), f"unknown spec directory; expected one of {', '.join(SPEC_DIRS)}"))
    for kind in SPEC_DIRS:
        folder = spec_root / kind
        if not _is_dir(folder, f"specs/{kind}", problems):
            problems.append(problem(f"specs/{kind}", (), "missing spec directory"))
            continue
        for path in _listdir(folder, f"specs/{kind}", problems) or ():
            rel = f"specs/{kind}/{path.name}"
            if path.name.startswith(".") or _is_dir(path, rel, problems):
                continue
            if path.suffix != ".toml":
                problems.append(problem(rel, (), "spec files must end in .toml"))
                continue
            if not _NAME_RE.match(path.stem):
                problems.append(problem(rel, (), f"file name must match {_NAME_RE.pattern} (it is a Python-level key)"))
                continue
            text = _read_text(path, rel, problems)
            if text is None:
                continue
            source = Source(rel, text)
            try:
                data = tomllib.loads(text)
            except tomllib.TOMLDecodeError as exc:
                line = _toml_error_line(str(exc))
                problems.append(problem(rel, (), f"malformed TOML: {exc}", line=line))
                continue
            for keypath, value in _non_finite(data, ()):
                problems.append(
                    source.problem(
                        keypath, "nan and inf are not allowed: generated Python cannot spell them", value=value
                    )
                )
            raw[kind].append((path.stem, source, data))

    hardware = _load_hardware(raw["hardware"], problems)
    models = _load_models(raw["models"], problems)
    configs = _load_configs(raw["kernels"], models, problems)
    if not raw["hardware"] and not problems:
        problems.append(problem("specs/hardware", (), "no hardware specs: at least one target is needed"))
    if problems:
        raise SpecErrors(_without_inherited_repeats(problems))
    return SpecTree(root=root, hardware=hardware, models=models, configs=configs)


def _listdir(folder: Path, rel: str, problems: list[SpecProblem]) -> list[Path] | None:
    """The entries of a spec folder, sorted; None (and a problem) when it cannot be listed."""
    try:
        return sorted(folder.iterdir())
    except OSError as exc:
        problems.append(problem(rel, (), f"cannot list the directory: {os_reason(exc)}"))
        return None


def _is_dir(path: Path, rel: str, problems: list[SpecProblem]) -> bool:
    try:
        return path.is_dir()
    except OSError as exc:  # e.g. a folder above it cannot be searched
        problems.append(problem(rel, (), f"cannot read: {os_reason(exc)}"))
        return False


_BOM = b"\xef\xbb\xbf"


def _read_text(path: Path, rel: str, problems: list[SpecProblem]) -> str | None:
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


def _non_finite(data: Any, keypath: KeyPath):
    """(key path, value) of every nan or inf float in parsed TOML."""
    if isinstance(data, float) and not math.isfinite(data):
        yield keypath, data
    elif isinstance(data, dict):
        for key, value in data.items():
            yield from _non_finite(value, keypath + (key,))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from _non_finite(value, keypath + (i,))


_INHERITED_NOTE = re.compile(r" \(inherited by [a-z][a-z0-9_]*\)")


def _without_inherited_repeats(problems: list[SpecProblem]) -> list[SpecProblem]:
    """A load problem in a parent's key is found once for the parent and once more for each
    config that extends it: keep one report, the parent's own where there is one."""

    def key(p: SpecProblem) -> tuple:
        return (p.file, p.line, p.keypath, _INHERITED_NOTE.sub("", p.rule), p.has_value, repr(p.value))

    own = {key(p) for p in problems if not _INHERITED_NOTE.search(p.rule)}
    out, seen = [], set()
    for p in problems:
        k = key(p)
        if k in seen or (_INHERITED_NOTE.search(p.rule) and k in own):
            continue
        seen.add(k)
        out.append(p)
    return out


def _toml_error_line(message: str) -> int | None:
    match = re.search(r"line (\d+)", message)
    return int(match.group(1)) if match else None


def _validate(model: type[BaseModel], data: Any, source: Source, prefix: KeyPath, problems: list[SpecProblem]):
    """Validate ``data`` with a pydantic model; turn each error into a SpecProblem."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        for err in exc.errors(include_url=False):
            loc = prefix + tuple(err["loc"])
            # pydantic reports union members and "[key]" as extra loc parts; drop those.
            loc = tuple(p for p in loc if not (isinstance(p, str) and (p.startswith("function-") or p.endswith("]"))))
            rule = _explain_pydantic(err)
            if err["type"] == "missing":
                problems.append(source.problem(loc, rule))
            else:
                problems.append(source.problem(loc, rule, value=err.get("input")))
        return None


def _explain_pydantic(err: Mapping[str, Any]) -> str:
    kind = err["type"]
    if kind == "missing":
        return "required key is missing"
    if kind == "extra_forbidden":
        return "unknown key (not part of this spec's schema)"
    msg = str(err["msg"])
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    return msg


# ---------------------------------------------------------------------------
# Hardware and models


def _load_hardware(entries, problems: list[SpecProblem]) -> tuple[Hardware, ...]:
    out = []
    for name, source, data in entries:
        spec = _validate(HardwareSpec, data, source, (), problems)
        if spec is not None:
            out.append(Hardware(name, spec, source))
    names_seen: dict[str, str] = {}
    for hw in out:
        for device_name in hw.spec.device_names:
            other = names_seen.get(device_name.lower())
            if other is not None:
                problems.append(
                    hw.source.problem(
                        ("device_names",),
                        f"device name is also claimed by specs/hardware/{other}.toml; detection would be ambiguous",
                        value=device_name,
                    )
                )
            names_seen[device_name.lower()] = hw.name
    return tuple(sorted(out, key=lambda h: (h.spec.vendor, h.spec.arch, h.name)))


def _load_models(entries, problems: list[SpecProblem]) -> dict[str, Model]:
    out = {}
    for name, source, data in entries:
        spec = _validate(ModelSpec, data, source, (), problems)
        if spec is not None:
            out[name] = Model(name, spec, source)
    return out


# ---------------------------------------------------------------------------
# Kernel configs


def _load_configs(entries, models: Mapping[str, Model], problems: list[SpecProblem]) -> tuple[Config, ...]:
    tables: list[tuple[str, Source, dict[str, Any]]] = []
    for _stem, source, data in entries:
        if not data:
            problems.append(source.problem((), "kernel spec defines no config tables"))
        for name, table in data.items():
            if not _NAME_RE.match(name):
                problems.append(source.problem((name,), f"config name must match {_NAME_RE.pattern}", value=name))
                continue
            if not isinstance(table, dict):
                problems.append(source.problem((name,), "a config must be a table", value=table))
                continue
            tables.append((name, source, table))
    # A config name is defined once: a second definition is reported and not loaded (before
    # validation, so that neither copy can hide the other, and extends finds one parent).
    by_name: dict[str, tuple[Source, dict[str, Any]]] = {}
    for name, source, table in tables:
        if name in by_name:
            first = by_name[name][0]
            problems.append(source.problem((name,), f"config is already defined by {first.path} ({name})", value=name))
        else:
            by_name[name] = (source, table)
    configs: list[Config] = []
    for name, (source, table) in by_name.items():
        merged = _inherit(name, source, table, by_name, problems)
        if merged is None:
            continue
        cfg = _load_config(name, merged[1], merged[0], models, problems)
        if cfg is not None:
            configs.append(cfg)

    # Names are global: config names, record names, dispatch names (variants and aliases).
    seen: dict[str, tuple[str, Config]] = {}
    for cfg in configs:
        keys = [("config", cfg.name, (cfg.name,)), ("record", cfg.spec.record, (cfg.name, "record"))]
        keys += [("dispatch name", v, (cfg.name, "variants", v)) for v in cfg.variants]
        keys += [("dispatch name", a, (cfg.name, "aliases", a)) for a in cfg.spec.aliases]
        for kind, key, path in keys:
            tag = f"{kind}:{key}" if kind == "record" else f"name:{key}"
            if tag in seen and seen[tag][1] is not cfg:
                other = seen[tag][1]
                problems.append(
                    cfg.source.problem(
                        path, f"{kind} is already defined by {other.source.path} ({other.name})", value=key
                    )
                )
            seen.setdefault(tag, (kind, cfg))
    return tuple(sorted(configs, key=lambda c: c.name))


def _inherit(
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


def _load_config(
    name: str, table: dict[str, Any], source: Source, models: Mapping[str, Model], problems: list[SpecProblem]
) -> Config | None:
    start = len(problems)
    spec = _validate(ConfigSpec, table, source, (name,), problems)
    if spec is None:
        return None
    if spec.model is not None and spec.model not in models:
        problems.append(
            source.problem(
                (name, "model"), f"no such model spec (known: {', '.join(sorted(models)) or 'none'})", value=spec.model
            )
        )
    variants = spec.variant_params(name)
    for alias, target in spec.aliases.items():
        if target not in variants:
            problems.append(
                source.problem(
                    (name, "aliases", alias), f"alias must name a variant ({', '.join(variants)})", value=target
                )
            )
        if alias in variants:
            problems.append(source.problem((name, "aliases", alias), "alias shadows a variant of the same name"))
    reserved = set(spec.fields) | {"hw", "model"}
    for variant, params in variants.items():
        for param in params:
            if param in reserved:
                problems.append(
                    source.problem(
                        (name, "variants", variant, param), "parameter name collides with a field or namespace"
                    )
                )
    if spec.buckets is not None:
        for dim in spec.buckets.dims:
            if dim in reserved:
                problems.append(
                    source.problem((name, "buckets", "dims"), "dimension name collides with a field", value=dim)
                )

    # Names a rule may read: fields, derived values, variant parameters.
    param_names = {p for params in variants.values() for p in params}
    known = set(spec.fields) | set(spec.derived) | param_names
    for dname in spec.derived:
        if dname in spec.fields or dname in param_names:
            problems.append(source.problem((name, "derived", dname), "derived name collides with a field or parameter"))

    def parse_rule(text: str, path: KeyPath, extra: frozenset[str] = frozenset()) -> rules.Expr | None:
        try:
            expr = rules.parse(text)
        except rules.RuleError as exc:
            problems.append(source.problem(path, f"invalid rule: {exc}", value=text))
            return None
        unknown = sorted(expr.names - known - extra)
        if unknown:
            problems.append(
                source.problem(
                    path,
                    f"rule reads unknown name(s) {', '.join(unknown)}; known: {', '.join(sorted(known | extra))}",
                    value=text,
                )
            )
            return None
        bad_attr = _check_namespace_attrs(expr, spec.model is not None)
        if bad_attr:
            problems.append(source.problem(path, bad_attr, value=text))
            return None
        return expr

    derived = {}
    for dname, text in spec.derived.items():
        expr = parse_rule(text, (name, "derived", dname))
        if expr is not None:
            derived[dname] = expr

    checks = []
    for i, chk in enumerate(spec.checks):
        rule = parse_rule(chk.rule, (name, "checks", i, "rule"))
        when = parse_rule(chk.when, (name, "checks", i, "when")) if chk.when is not None else None
        if rule is not None and (chk.when is None or when is not None):
            checks.append(Check(chk, rule, when, (name, "checks", i)))

    policies = []
    for i, raw in enumerate(spec.policy):
        pol = _load_policy(raw, (name, "policy", i), spec, source, parse_rule, problems, base=False)
        if pol is not None:
            policies.append(pol)
    base = None
    if spec.base is not None:
        base = _load_policy(spec.base, (name, "base"), spec, source, parse_rule, problems, base=True)

    seen: dict[tuple[str | None, int | None], Policy] = {}
    for pol in policies:
        key = (pol.vendor, pol.min_arch)
        if key in seen:
            problems.append(
                source.problem(
                    pol.keypath + ("min_arch",),
                    f"duplicate threshold {pol.vendor}>={pol.min_arch}: also given at "
                    f"{format_keypath(seen[key].keypath)} (line {source.line(seen[key].keypath)})",
                    value=pol.min_arch,
                )
            )
        seen[key] = pol

    if len(problems) > start:
        return None
    return Config(
        name=name,
        spec=spec,
        source=source,
        variants={k: dict(v) for k, v in variants.items()},
        derived=derived,
        checks=tuple(checks),
        policies=tuple(sorted(policies, key=lambda p: (p.vendor or "", p.min_arch or 0))),
        base=base,
    )


def _check_namespace_attrs(expr: rules.Expr, has_model: bool) -> str | None:
    """The attributes a rule may read are the ones resolve.py puts in its namespaces."""
    for ns, attr in sorted(expr.attrs):
        if ns == "hw" and attr not in HW_RULE_ATTRS:
            return f"'hw.{attr}' is not a hardware attribute (known: {', '.join(HW_RULE_ATTRS)})"
        if ns == "model":
            if not has_model:
                return "rule reads 'model' but the config names no model"
            if attr not in MODEL_RULE_ATTRS:
                return f"'model.{attr}' is not a model attribute (known: {', '.join(MODEL_RULE_ATTRS)})"
    return None


def _load_policy(
    raw: dict[str, Any],
    path: KeyPath,
    spec: ConfigSpec,
    source: Source,
    parse_rule: Callable[..., rules.Expr | None],
    problems: list[SpecProblem],
    *,
    base: bool,
) -> Policy | None:
    start = len(problems)
    vendor = raw.get("vendor")
    min_arch = raw.get("min_arch")
    max_arch = raw.get("max_arch")
    note = raw.get("note", "")
    if base:
        for key in ("vendor", "min_arch", "max_arch"):
            if key in raw:
                problems.append(
                    source.problem(path + (key,), "the base policy applies to every vendor and arch; remove this key")
                )
    else:
        if vendor is None:
            problems.append(source.problem(path, "required key 'vendor' is missing"))
        elif vendor not in VENDORS:
            problems.append(
                source.problem(path + ("vendor",), f"unknown vendor; known: {', '.join(VENDORS)}", value=vendor)
            )
        if min_arch is None:
            problems.append(source.problem(path, "required key 'min_arch' is missing"))
        elif type(min_arch) is not int or min_arch < 0:
            problems.append(source.problem(path + ("min_arch",), "must be a non-negative integer", value=min_arch))
        if max_arch is not None and (type(max_arch) is not int or (type(min_arch) is int and max_arch < min_arch)):
            problems.append(source.problem(path + ("max_arch",), "must be an integer >= min_arch", value=max_arch))
    _check_note(note, path + ("note",), source, problems)

    fields = spec.fields
    bucketed = spec.buckets is not None
    top_values = {}
    for key, value in raw.items():
        if key in POLICY_KEYS:
            continue
        if key not in fields:
            problems.append(
                source.problem(
                    path + (key,), f"not a field of {spec.record} (fields: {', '.join(fields)})", value=value
                )
            )
            continue
        parsed = _parse_value(key, fields[key], value, path + (key,), source, parse_rule, problems)
        if parsed is not None:
            top_values[key] = parsed

    buckets = None
    if bucketed:
        assert spec.buckets is not None
        raw_buckets = raw.get("bucket")
        if not isinstance(raw_buckets, list) or not raw_buckets:
            problems.append(source.problem(path, "a bucketed config's policy needs a non-empty [[...bucket]] list"))
        else:
            buckets = []
            for j, rb in enumerate(raw_buckets):
                b = _load_bucket(rb, path + ("bucket", j), spec, top_values, source, parse_rule, problems)
                if b is not None:
                    buckets.append(b)
            buckets = tuple(buckets)
            if buckets and buckets[-1].bounds:
                problems.append(
                    source.problem(
                        buckets[-1].keypath,
                        "the last bucket must be a catch-all (no bounds) so every shape has a kernel",
                    )
                )
            names = [b.name for b in buckets]
            for b in buckets:
                if names.count(b.name) > 1:
                    problems.append(
                        source.problem(b.keypath + ("name",), "bucket names must be unique in a policy", value=b.name)
                    )
    else:
        if "bucket" in raw:
            problems.append(
                source.problem(path + ("bucket",), "this config is not bucketed (it has no [buckets] table)")
            )
        missing = [f for f in fields if f not in raw]
        if missing:
            problems.append(source.problem(path, f"policy does not set field(s) {', '.join(missing)} of {spec.record}"))

    if len(problems) > start:
        return None
    return Policy(
        vendor=None if base else vendor,
        min_arch=None if base else min_arch,
        max_arch=None if base else max_arch,
        note=note,
        values=top_values,
        buckets=buckets,
        keypath=path,
    )


def _load_bucket(
    raw: Any,
    path: KeyPath,
    spec: ConfigSpec,
    defaults: Mapping[str, Value],
    source: Source,
    parse_rule: Callable[..., rules.Expr | None],
    problems: list[SpecProblem],
) -> Bucket | None:
    assert spec.buckets is not None
    start = len(problems)
    if not isinstance(raw, dict):
        problems.append(source.problem(path, "a bucket must be a table", value=raw))
        return None
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        problems.append(source.problem(path + ("name",), f"bucket name must match {_NAME_RE.pattern}", value=name))
    note = raw.get("note", "")
    _check_note(note, path + ("note",), source, problems)
    bounds: list[Bound] = []
    values: dict[str, Value] = dict(defaults)
    for key, value in raw.items():
        if key in BUCKET_KEYS:
            continue
        bound = BOUND_RE.match(key)
        if bound and bound.group(1) in spec.buckets.dims:
            if type(value) is not int or value < 0:
                problems.append(source.problem(path + (key,), "a bound must be a non-negative integer", value=value))
            else:
                bounds.append(Bound(bound.group(1), bound.group(2), value))
            continue
        if key not in spec.fields:
            dims = ", ".join(f"{d}_min/{d}_max" for d in spec.buckets.dims)
            problems.append(
                source.problem(path + (key,), f"not a field of {spec.record} nor a bound ({dims})", value=value)
            )
            continue
        parsed = _parse_value(key, spec.fields[key], value, path + (key,), source, parse_rule, problems)
        if parsed is not None:
            values[key] = parsed
    missing = [f for f in spec.fields if f not in values]
    if missing:
        problems.append(
            source.problem(path, f"bucket does not set field(s) {', '.join(missing)} (nor does its policy)")
        )
    for dim in spec.buckets.dims:
        lo = [b.value for b in bounds if b.dim == dim and b.kind == "min"]
        hi = [b.value for b in bounds if b.dim == dim and b.kind == "max"]
        if lo and hi and lo[0] > hi[0]:
            problems.append(
                source.problem(path + (f"{dim}_min",), f"{dim}_min > {dim}_max: the bucket matches nothing")
            )
    if len(problems) > start:
        return None
    return Bucket(
        name=name,
        note=note,
        bounds=tuple(sorted(bounds, key=lambda b: (spec.buckets.dims.index(b.dim), b.kind))),  # type: ignore[union-attr]
        values=values,
        keypath=path,
    )


def _check_note(note: Any, path: KeyPath, source: Source, problems: list[SpecProblem]) -> None:
    """A policy's or bucket's note: one line of text, like every doc (models.text_problem)."""
    if not isinstance(note, str):
        problems.append(source.problem(path, "must be a string", value=note))
        return
    why = text_problem(note)
    if why is not None:
        problems.append(source.problem(path, why, value=note))


_LITERAL_TYPES = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,)}


def _parse_value(
    name: str,
    field_spec: FieldSpec,
    raw: Any,
    path: KeyPath,
    source: Source,
    parse_rule: Callable[..., rules.Expr | None],
    problems: list[SpecProblem],
) -> Value | None:
    if isinstance(raw, dict):
        if "expr" in raw:
            rule = _validate(ExprRule, raw, source, path, problems)
            if rule is None:
                return None
            expr = parse_rule(rule.expr, path + ("expr",))
            return None if expr is None else Value(path, expr=expr)
        if "largest" in raw or "smallest" in raw:
            pick = _validate(PickRule, raw, source, path, problems)
            if pick is None:
                return None
            if field_spec.type != "int":
                problems.append(source.problem(path, f"a pick rule needs an int field; '{name}' is {field_spec.type}"))
                return None
            where = parse_rule(pick.where, path + ("where",), frozenset({name}))
            return None if where is None else Value(path, expr=where, candidates=pick.ordered)
        problems.append(
            source.problem(
                path,
                'a table value must be a rule: { expr = "..." } or { largest|smallest = [...], where = "..." }',
                value=raw,
            )
        )
        return None
    allowed = _LITERAL_TYPES[field_spec.type]
    if type(raw) not in allowed:
        problems.append(source.problem(path, f"'{name}' must be a {field_spec.type}", value=raw))
        return None
    if field_spec.choices is not None and raw not in field_spec.choices:
        problems.append(
            source.problem(path, f"'{name}' must be one of {', '.join(map(repr, field_spec.choices))}", value=raw)
        )
        return None
    return Value(path, literal=raw)


# ---------------------------------------------------------------------------
# Locating a key path in TOML text (for line numbers in messages)

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
    """Best-effort 1-based line of ``keypath`` in TOML ``text``.

    Tracks table headers, arrays of tables (with their indices) and ``key =``
    lines; returns the line of the longest prefix of ``keypath`` found.
    Multi-line strings are skipped.  Good enough for the subset of TOML the
    specs use; returns None rather than guess.
    """
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
        key = _KEY_RE.match(line)
        if key:
            full = current + tuple(_split_key(key.group(1)))
            locations.setdefault(full, lineno)
            rest = line[key.end() :]
            for quote in ('"""', "'''"):
                if rest.count(quote) % 2 == 1:
                    in_multiline = quote
    for n in range(len(keypath), 0, -1):
        found = locations.get(tuple(keypath[:n]))
        if found is not None:
            return found
    return None
