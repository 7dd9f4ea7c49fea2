"""Stage 1, specs -> SpecTree: read every TOML file under specs/ and validate it.

This module orchestrates; the jobs live beside it: ``source`` reads and decodes
files (and finds a key's line), ``errors.validate`` turns pydantic's errors into
spec problems, ``inherit`` merges ``extends`` chains, ``policies`` parses and
chains policies, buckets and values.  The records it returns are in ``records``.

The result is a frozen ``SpecTree`` in which every policy value is either a
checked literal or a parsed rule, every threshold is unique per vendor, and
every reference (model, alias, field) points at something that exists.
Problems in all files are collected and raised together as ``SpecErrors``,
including files that cannot be listed, read or decoded (spec files are UTF-8
without a byte-order mark, as tomllib requires) and float literals that
generated code cannot spell (nan, inf).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable, Mapping

from pydantic import BaseModel

from . import rules
from .errors import KeyPath, SpecErrors, SpecProblem, format_value, problem, suggest, validate
from .inherit import inherit
from .models import (
    CITE_REASONS,
    HW_NUMBERS,
    HW_RULE_ATTRS,
    MODEL_RULE_ATTRS,
    ConfigSpec,
    Features,
    HardwareSpec,
    ModelSpec,
    ModuleSpec,
    ProjectSpec,
    VendorSpec,
    model_rule_namespace,
)
from .policies import NAME_RE, load_policies, load_tune
from .records import Check, Config, FrozenMap, Hardware, Model, Module, Project, Source, SpecTree, Vendor, frozen
from .source import is_dir, listdir, parse_toml, read_text, regular_file_problem

SPEC_DIRS = ("vendors", "hardware", "models", "kernels", "modules")
# Folders a spec tree may leave out: without modules/, only the dispatch module is generated.
OPTIONAL_DIRS = ("models", "modules")  # a tree may have no models (no rule reads model.*)
# The one file directly under specs/ (optional): default target and model.
PROJECT_FILE = "project.toml"


# ---------------------------------------------------------------------------
# Entry point


def load(root: Path) -> SpecTree:
    """Read ``root/specs`` and return the validated tree, or raise SpecErrors."""
    problems: list[SpecProblem] = []
    spec_root = root / "specs"
    if not is_dir(spec_root, "specs", problems):
        raise SpecErrors(problems or [problem("specs", (), f"spec directory not found under {root}")])

    raw: dict[str, list[tuple[str, Source, dict[str, Any]]]] = {d: [] for d in SPEC_DIRS}
    subs = listdir(spec_root, "specs", problems)
    if subs is None:
        raise SpecErrors(problems)
    for sub in subs:
        rel = f"specs/{sub.name}"
        if sub.name.startswith("."):
            continue
        if is_dir(sub, rel, problems):
            if sub.name not in SPEC_DIRS:
                problems.append(problem(rel, (), f"unknown spec directory; expected one of {', '.join(SPEC_DIRS)}"))
        elif sub.name != PROJECT_FILE:
            problems.append(
                problem(rel, (), f"unknown file; specs/ holds {PROJECT_FILE} and the folders {', '.join(SPEC_DIRS)}")
            )
    for kind in SPEC_DIRS:
        folder = spec_root / kind
        if not is_dir(folder, f"specs/{kind}", problems):
            if folder.exists():
                problems.append(problem(f"specs/{kind}", (), "not a directory"))
            elif kind not in OPTIONAL_DIRS:
                problems.append(problem(f"specs/{kind}", (), "missing spec directory"))
            continue
        for path in listdir(folder, f"specs/{kind}", problems) or ():
            rel = f"specs/{kind}/{path.name}"
            if path.name.startswith("."):
                continue  # editors' and builds' hidden files
            not_regular = regular_file_problem(path)
            if not_regular is not None:
                problems.append(problem(rel, (), not_regular))
                continue
            if path.suffix != ".toml":
                problems.append(problem(rel, (), "spec files must end in .toml"))
                continue
            if not NAME_RE.match(path.stem):
                problems.append(problem(rel, (), f"file name must match {NAME_RE.pattern} (it is a Python-level key)"))
                continue
            text = read_text(path, rel, problems)
            if text is None:
                continue
            source = Source(rel, text)
            data = parse_toml(text, rel, source.problem, problems)
            if data is not None:
                raw[kind].append((path.stem, source, data))

    project = _load_project(spec_root, problems)
    # A file that cannot be read or parsed is the only thing reported: what other files say of
    # the specs it would define ("no such hardware spec 'h200'") would be false.
    if problems:
        raise SpecErrors(problems)
    vendors = _load_simple(VendorSpec, Vendor, raw["vendors"], problems)
    _check_vendors(vendors, problems)
    hardware = _load_hardware(raw["hardware"], vendors, problems)
    models = _load_simple(ModelSpec, Model, raw["models"], problems)
    # Every hardware file's vendor; None for one that failed to load (its own problem is reported,
    # so a policy naming it in targets is not also told that it does not exist).
    hw_vendors: dict[str, str | None] = {stem: None for stem, _, _ in raw["hardware"]}
    hw_vendors.update({h.name: h.spec.vendor for h in hardware})
    configs = _load_configs(raw["kernels"], models, vendors, hw_vendors, problems)
    modules = _load_simple(ModuleSpec, Module, raw["modules"], problems)
    if not raw["hardware"] and not problems:
        problems.append(problem("specs/hardware", (), "no hardware specs: at least one target is needed"))
    project = _check_project(project, {h.name for h in hardware}, models, problems)
    if problems:
        # Spec files that did not validate (their own problems are reported): what other files
        # say of the names they define ("unknown vendor 'amd'") would be false.
        invalid = {
            "vendor": {stem for stem, _, _ in raw["vendors"]} - set(vendors),
            "model": {stem for stem, _, _ in raw["models"]} - set(models),
            "hardware": {stem for stem, _, _ in raw["hardware"]} - {h.name for h in hardware},
        }
        problems = [p for p in problems if not _names_an_invalid_spec(p, invalid)]
        raise SpecErrors(_without_inherited_repeats(problems))
    assert project is not None
    return SpecTree(
        root=root,
        project=project,
        vendors=FrozenMap(sorted(vendors.items())),
        modules=tuple(modules[n] for n in sorted(modules)),
        hardware=hardware,
        models=FrozenMap(sorted(models.items())),
        configs=configs,
    )


def _names_an_invalid_spec(p: SpecProblem, invalid: Mapping[str, set[str]]) -> bool:
    """Whether ``p`` is only that a key names a spec whose file did not validate."""
    if not p.has_value or not isinstance(p.value, str) or not p.keypath:
        return False
    key = p.keypath[-1] if isinstance(p.keypath[-1], str) else p.keypath[-2] if len(p.keypath) > 1 else None
    kind = {"vendor": "vendor", "models": "model", "default_model": "model", "default_target": "hardware"}.get(str(key))
    return kind is not None and p.value in invalid[kind]


_INHERITED_NOTE = re.compile(r" \(inherited by [a-z][a-z0-9_]*\)")


def _without_inherited_repeats(problems: list[SpecProblem]) -> list[SpecProblem]:
    """A load problem in a parent's key is found once for the parent and once more for each
    config that extends it: keep one report, the parent's own where there is one."""

    def key(p: SpecProblem) -> tuple:
        return (p.file, p.line, p.keypath, _INHERITED_NOTE.sub("", p.rule), p.has_value, format_value(p.value))

    own = {key(p) for p in problems if not _INHERITED_NOTE.search(p.rule)}
    out, seen = [], set()
    for p in problems:
        k = key(p)
        if k in seen or (_INHERITED_NOTE.search(p.rule) and k in own):
            continue
        seen.add(k)
        out.append(p)
    return out


# ---------------------------------------------------------------------------
# Hardware and models


def _load_simple(model: type[BaseModel], record: type, entries, problems: list[SpecProblem]) -> dict[str, Any]:
    """Files that are one spec each (vendors, models, modules): name -> record(name, spec, source)."""
    out = {}
    for name, source, data in entries:
        spec = validate(model, data, source, (), problems)
        if spec is not None:
            out[name] = record(name, spec, source)
    return out


def _load_hardware(entries, vendors: Mapping[str, Vendor], problems: list[SpecProblem]) -> tuple[Hardware, ...]:
    out = []
    for name, source, data in entries:
        found: list[SpecProblem] = []
        spec = validate(HardwareSpec, data, source, (), found)
        vendor = data.get("vendor")
        if isinstance(vendor, str) and vendor not in vendors:
            # the known vendors and the nearest one, rather than the name pattern they all match
            found = [p for p in found if p.keypath != ("vendor",)]
            add = f"add specs/vendors/{vendor}.toml or " if NAME_RE.match(vendor) else ""
            found.append(
                source.problem(
                    ("vendor",),
                    f"unknown vendor; {add}use one of "
                    f"{', '.join(sorted(vendors)) or 'none (specs/vendors/ is empty)'}{suggest(vendor, vendors)}",
                    value=vendor,
                )
            )
        problems += found
        if spec is None or spec.vendor not in vendors:
            continue
        _check_citations(spec, source, problems)
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


def _load_project(spec_root: Path, problems: list[SpecProblem]) -> Project | None:
    path = spec_root / PROJECT_FILE
    rel = f"specs/{PROJECT_FILE}"
    if not path.exists():
        return Project(None, None, None)
    text = read_text(path, rel, problems)
    if text is None:
        return None
    source = Source(rel, text)
    data = parse_toml(text, rel, source.problem, problems)
    if data is None:
        return None
    spec = validate(ProjectSpec, data, source, (), problems)
    return None if spec is None else Project(spec.default_target, spec.default_model, source)


def _check_project(
    project: Project | None, hardware: set[str], models: Mapping[str, Model], problems: list[SpecProblem]
) -> Project | None:
    """The defaults name specs that exist; a tree with one model defaults to it."""
    if project is None:
        return None
    if project.default_target is not None and project.default_target not in hardware:
        assert project.source is not None
        problems.append(
            project.source.problem(
                ("default_target",),
                f"no such hardware spec (known: {', '.join(sorted(hardware))})"
                + suggest(project.default_target, hardware),
                value=project.default_target,
            )
        )
    model = project.default_model
    if model is not None and model not in models:
        assert project.source is not None
        problems.append(
            project.source.problem(
                ("default_model",),
                f"no such model spec (known: {', '.join(sorted(models))}){suggest(model, models)}",
                value=model,
            )
        )
    if model is None and len(models) == 1:
        model = next(iter(models))
    elif model is None and len(models) > 1:
        problems.append(
            problem(
                f"specs/{PROJECT_FILE}",
                ("default_model",),
                f"the tree has {len(models)} models ({', '.join(sorted(models))}): name the default one",
            )
        )
    return Project(project.default_target, model, project.source)


def _check_citations(spec: HardwareSpec, source: Source, problems: list[SpecProblem]) -> None:
    """Every number of a hardware spec names its sources (keys of [sources]) or says how it was
    measured or why it was inferred; every source is cited."""
    used: set[str] = set()
    for attr in HW_NUMBERS:
        if getattr(spec, attr) is not None and attr not in spec.cite:
            problems.append(
                source.problem(
                    ("cite",),
                    f'\'{attr}\' is not cited: add {attr} = "<source keys>" (or "measured: ..." / "inferred: ...")',
                )
            )
    for attr, text in spec.cite.items():
        path = ("cite", attr)
        if attr not in HW_NUMBERS and attr not in Features.model_fields:
            problems.append(
                source.problem(
                    path,
                    f"not a number or feature of the spec (numbers: {', '.join(HW_NUMBERS)})"
                    + suggest(attr, list(HW_NUMBERS) + list(Features.model_fields)),
                    value=text,
                )
            )
            continue
        kind, colon, reason = text.partition(":")
        if colon and kind.strip() in CITE_REASONS:
            if not reason.strip():
                problems.append(source.problem(path, f"'{kind.strip()}:' needs a reason after it", value=text))
            continue
        keys = text.split()
        unknown = [k for k in keys if k not in spec.sources]
        if not keys or unknown:
            problems.append(
                source.problem(
                    path,
                    f"names no source of [sources] ({', '.join(spec.sources)}), nor 'measured: ...' / 'inferred: ...'",
                    value=text,
                )
            )
        used.update(keys)
    for key in spec.sources:
        if key not in used and not any(f"[{key}]" in t for t in spec.cite.values()):
            problems.append(source.problem(("sources", key), "no number cites this source"))


def _check_vendors(vendors: Mapping[str, Vendor], problems: list[SpecProblem]) -> None:
    """Detection can tell the vendors apart: at most one default vendor (the vendor of a device
    name that names none), each name word one vendor's (any case, as detection matches it), and
    every vendor detectable: by its name words, as the default, or as the only HIP vendor (a HIP
    build of torch sees only HIP vendors)."""
    defaults = sorted(v.name for v in vendors.values() if v.spec.default)
    for extra in defaults[1:]:
        problems.append(
            vendors[extra].source.problem(
                ("default",), f"only one vendor may be the default; specs/vendors/{defaults[0]}.toml is too"
            )
        )
    words: dict[str, str] = {}
    for v in vendors.values():
        for i, word in enumerate(v.spec.name_words):
            other = words.setdefault(word.lower(), v.name)
            if other != v.name:
                problems.append(
                    v.source.problem(
                        ("name_words", i),
                        f"name word is also specs/vendors/{other}.toml's (case is ignored); "
                        "detection would be ambiguous",
                        value=word,
                    )
                )
    hip = [v.name for v in vendors.values() if v.spec.hip]
    for v in vendors.values():
        if v.spec.name_words or v.spec.default or hip == [v.name]:
            continue
        problems.append(
            v.source.problem(
                ("name_words",),
                "this vendor can never be detected: it lists no name_words, and is neither the default vendor "
                "(default = true) nor the only HIP vendor (hip = true); "
                "list the words of its device names in name_words",
            )
        )


# ---------------------------------------------------------------------------
# Kernel configs


def _load_configs(
    entries,
    models: Mapping[str, Model],
    vendors: Mapping[str, Vendor],
    hardware: Mapping[str, str | None],
    problems: list[SpecProblem],
) -> tuple[Config, ...]:
    tables: list[tuple[str, Source, dict[str, Any]]] = []
    for _stem, source, data in entries:
        if not data:
            problems.append(source.problem((), "kernel spec defines no config tables"))
        for name, table in data.items():
            if not NAME_RE.match(name):
                problems.append(source.problem((name,), f"config name must match {NAME_RE.pattern}", value=name))
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
        merged = inherit(name, source, table, by_name, problems)
        if merged is None:
            continue
        cfg = _load_config(name, merged[1], merged[0], models, vendors, hardware, problems)
        if cfg is not None:
            configs.append(cfg)

    # Names are global: config names, record names, dispatch names (variants and aliases).
    seen: dict[str, tuple[str, Config]] = {}
    for cfg in configs:
        keys = [("config", cfg.name, (cfg.name,)), ("record", cfg.record, (cfg.name, "record"))]
        keys += [("dispatch name", v, (cfg.name, "variants", v)) for v in cfg.variants]
        keys += [("dispatch name", a, (cfg.name, "aliases", a)) for a in cfg.aliases]
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


def _load_config(
    name: str,
    table: dict[str, Any],
    source: Source,
    models: Mapping[str, Model],
    vendors: Mapping[str, Vendor],
    hardware: Mapping[str, str | None],
    problems: list[SpecProblem],
) -> Config | None:
    start = len(problems)
    spec = validate(ConfigSpec, table, source, (name,), problems)
    if spec is None:
        return None
    for i, model in enumerate(spec.models or ()):
        if model not in models:
            problems.append(
                source.problem(
                    (name, "models", i),
                    f"no such model spec (known: {', '.join(sorted(models)) or 'none'}){suggest(model, models)}",
                    value=model,
                )
            )
    variants = spec.variant_params(name)
    for alias, target in spec.aliases.items():
        if target not in variants:
            problems.append(
                source.problem(
                    (name, "aliases", alias),
                    f"alias must name a variant ({', '.join(variants)}){suggest(target, variants)}",
                    value=target,
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

    reads_model: list[KeyPath] = []  # rules that read model.*
    parse_rule = rule_parser(known, spec.models != (), source, problems, reads_model)

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

    policies, base = load_policies(
        config=name,
        record=spec.record,
        fields=spec.fields,
        dims=spec.buckets.dims if spec.buckets is not None else None,
        raw_policies=spec.policy,
        raw_base=spec.base,
        source=source,
        parse_rule=parse_rule,
        vendors=vendors,
        hardware=hardware,
        problems=problems,
    )
    tune = None
    if spec.tune is not None:
        tune = load_tune(
            config=name,
            record=spec.record,
            fields=spec.fields,
            dims=spec.buckets.dims if spec.buckets is not None else None,
            variants=variants,
            policies=policies,
            base=base,
            spec=spec.tune,
            source=source,
            parse_rule=parse_rule,
            problems=problems,
        )
    _check_selector(name, spec, variants, source, problems)
    for const, target in spec.constants.items():
        if target not in variants and target not in spec.aliases:
            problems.append(
                source.problem(
                    (name, "constants", const),
                    f"must name a variant or alias ({', '.join(list(variants) + list(spec.aliases))})"
                    + suggest(target, list(variants) + list(spec.aliases)),
                    value=target,
                )
            )
    if len(problems) > start:
        return None
    # A config serves every model that has the fields its rules read; ``models`` restricts that,
    # and a model it names without them is one error naming model and fields.
    needed = _model_fields_read(derived, checks, policies, base)
    lacking = {m: tuple(f for f in needed if f not in model_rule_namespace(models[m].spec)) for m in models}
    unserved: tuple[tuple[str, tuple[str, ...]], ...] = ()
    if spec.models is not None:
        served = tuple(sorted(spec.models))
        for i, model in enumerate(spec.models):
            if lacking.get(model):
                problems.append(
                    source.problem(
                        (name, "models", i),
                        f"model {model} ({models[model].source.path}) has no {', '.join(lacking[model])}, "
                        f"which {name}'s rules read: set it in the model's file, or leave the model out",
                        value=model,
                    )
                )
        if len(problems) > start:
            return None
    elif reads_model:
        served = tuple(m for m in sorted(models) if not lacking[m])
        unserved = tuple((m, lacking[m]) for m in sorted(models) if lacking[m])
    else:
        served = ()
    return Config(
        name=name,
        record=spec.record,
        doc=spec.doc,
        source=source,
        models=served,
        fields=FrozenMap(spec.fields),
        dims=spec.buckets.dims if spec.buckets is not None else None,
        aliases=FrozenMap(spec.aliases),
        variants=frozen(variants),
        derived=FrozenMap(derived),
        checks=tuple(checks),
        policies=policies,
        base=base,
        selector=spec.selector,
        constants=FrozenMap(spec.constants),
        tune=tune,
        unserved=unserved,
        requires=spec.requires,
    )


def _model_fields_read(derived: Mapping[str, Any], checks: list[Check], policies: Any, base: Any) -> tuple[str, ...]:
    """The model fields (``model.<field>``) a config's rules read, sorted."""
    exprs = list(derived.values()) + [c.rule for c in checks] + [c.when for c in checks if c.when is not None]
    for pol in list(policies) + ([base] if base is not None else []):
        value_maps = [pol.values] + [b.values for b in pol.buckets or ()]
        for values in value_maps:
            for v in values.values():
                expr = getattr(v, "expr", None) or getattr(v, "where", None)
                if expr is not None:
                    exprs.append(expr)
    return tuple(sorted({attr for e in exprs for ns, attr in e.attrs if ns == "model"}))


def _check_selector(
    name: str, spec: ConfigSpec, variants: Mapping[str, Mapping[str, Any]], source: Source, problems: list[SpecProblem]
) -> None:
    """A selector's parameters match variant parameters every variant has, or model dimensions."""
    if spec.selector is None:
        return
    params = {p for ps in variants.values() for p in ps}
    for param, what in spec.selector.params.items():
        path = (name, "selector", "params", param)
        if what.startswith("model."):
            if what[len("model.") :] not in MODEL_RULE_ATTRS:
                problems.append(
                    source.problem(path, f"not a model dimension (known: {', '.join(MODEL_RULE_ATTRS)})", value=what)
                )
            elif spec.models == ():
                problems.append(source.problem(path, "the config serves no model", value=what))
        elif what not in params or any(what not in ps for ps in variants.values()):
            problems.append(
                source.problem(
                    path, f"not a parameter of every variant (parameters: {', '.join(sorted(params))})", value=what
                )
            )


def rule_parser(
    known: set[str],
    has_model: bool,
    source: Source,
    problems: list[SpecProblem],
    reads_model: list[KeyPath] | None = None,
) -> Callable[..., rules.Expr | None]:
    """The parser of a config's rules: each parsed and vetted, reading only ``known`` names (and
    a pick's own field, ``extra``) and the attributes resolve.py provides; a problem is added to
    ``problems`` (and None returned), the key path of a rule that reads ``model.*`` to
    ``reads_model``.  ``codegen tune --space`` parses its axes with the same one."""

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
                    f"rule reads unknown name(s) {', '.join(unknown)}; known: {', '.join(sorted(known | extra))}"
                    + suggest(unknown[0], known | extra),
                    value=text,
                )
            )
            return None
        bad_attr = _check_namespace_attrs(expr, has_model)
        if bad_attr:
            problems.append(source.problem(path, bad_attr, value=text))
            return None
        if reads_model is not None and any(ns == "model" for ns, _ in expr.attrs):
            reads_model.append(path)
        return expr

    return parse_rule


def _check_namespace_attrs(expr: rules.Expr, has_model: bool) -> str | None:
    """The attributes a rule may read are the ones resolve.py puts in its namespaces."""
    for ns, attr in sorted(expr.attrs):
        if ns == "hw" and attr not in HW_RULE_ATTRS:
            known = ", ".join(HW_RULE_ATTRS)
            return f"'hw.{attr}' is not a hardware attribute (known: {known}){suggest(attr, HW_RULE_ATTRS)}"
        if ns == "model":
            if not has_model:
                return "rule reads 'model' but the config serves no model (models = [])"
            if attr not in MODEL_RULE_ATTRS:
                known = ", ".join(MODEL_RULE_ATTRS)
                return f"'model.{attr}' is not a model attribute (known: {known}){suggest(attr, MODEL_RULE_ATTRS)}"
    return None
