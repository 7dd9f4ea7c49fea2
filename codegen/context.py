"""Resolution -> template data: the generic context every generated module's template sees.

Templates print; this module decides what they print, as plain data (strings already escaped
for their place, values already as Python literals).  It knows no kernel family: a family's
template reads the configs its module spec declares, and a family that needs more computes it
in a context file beside its template (``ModuleSpec.context``).  The variables (``header``,
``module``, ``hardware``, ``configs``, ...) and the shape of a config, a variant and an
instantiation are documented for template authors in docs/templates.md (tests/test_examples.py
holds it to the context built here).
"""

from __future__ import annotations

import textwrap
from typing import Any, Callable

from .records import SpecTree
from . import emit_rules
from .models import (
    HW_RECORD_FIELDS,
    MODEL_DIMENSIONS,
    MODEL_FEATURES,
    ModelSpec,
    feature_default,
    is_control,
    is_line_break,
    model_features,
)
from .records import Instantiation, Resolution, VariantResolution

# The environment variable that forces the target generated/dispatch.py serves when no hw is given.
TARGET_ENV_VAR = "KERNEL_POLICY_TARGET"


def comment_text(text: str) -> str:
    """``text`` safe to print after ``#``: line breaks and control characters other than tab are
    shown as escapes, everything else as it is.  load.py admits no such characters
    (models.text_problem); this is the second line of defence."""
    if text.isprintable():  # no line break or control character (both are unprintable)
        return text
    return "".join(repr(ch)[1:-1] if is_line_break(ch) or is_control(ch) else ch for ch in text)


def docstring_text(text: str) -> str:
    """``text`` safe to print inside a triple-quoted docstring: one line, its backslashes
    doubled and its triple quotes broken up."""
    return comment_text(text.replace("\\", "\\\\")).replace('"""', '\\"\\"\\"')


def literal(value: Any) -> str:
    """``value`` as a Python literal in black's style (a string in double quotes where that needs
    no escape), for statements a template lays out itself (``# fmt: skip``, which black leaves as
    they are)."""
    text = repr(value)
    if isinstance(value, str) and text.startswith("'") and '"' not in value:
        return '"' + text[1:-1] + '"'
    return text


# Columns of generated code: black's line length for generated/ (codegen/render.py's BLACK_MODE).
LINE_LENGTH = 100


def bucketed_policies(
    config: dict[str, Any], kernel_for: Callable[[str, dict[str, Any], str, dict[str, Any]], tuple[str, dict[str, Any]]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A bucketed config's instantiations as a family's module names them.  Policies: per variant
    and instantiation ``{"name": "<tag>_<suffix>", "variant", "origin", "targets", "buckets"}``
    (``tag``: the variant's name less ``<config>_``), each bucket ``{"index", "name", "kernel",
    "condition" (for an ``if``), "bounds" (for a comment), "note"}`` plus the fields the family
    adds: ``kernel_for(tag, variant, user, bucket)`` returns the kernel's name and those fields
    (``user``: ``"<policy> <bucket>"``).  Tables: per variant ``{"variant", "table": [(target,
    policy name)]}``."""
    policies: list[dict[str, Any]] = []
    tables: list[dict[str, Any]] = []
    for variant in config["variants"].values():
        tag = variant["name"].removeprefix(config["name"] + "_")
        selectors = {}
        for inst in variant["instantiations"]:
            pname = f"{tag}_{inst['suffix']}"
            buckets = []
            for b in inst["buckets"]:
                kernel, extra = kernel_for(tag, variant, f"{pname} {b['name']}", b)
                bounds = b["conditions"]
                buckets.append(
                    {
                        "index": b["index"],
                        "name": b["name"],
                        **extra,
                        "kernel": kernel,
                        "condition": " and ".join(bounds),
                        "bounds": ", ".join(bounds) or "any shape",
                        "note": b["note"],
                    }
                )
            policies.append(
                {
                    "name": pname,
                    "variant": variant["name"],
                    "origin": inst["origin"],
                    "targets": inst["targets"],
                    "buckets": buckets,
                }
            )
            selectors[inst["symbol"]] = pname
        tables.append({"variant": variant["name"], "table": [(t, selectors[s]) for t, s in variant["table"]]})
    return policies, tables


def keyword_arguments(values: dict[str, Any], indent: int = 8) -> str:
    """``NAME=literal, ...`` for a call a template lays out itself (``# fmt: skip``), indented by
    ``indent`` and wrapped between arguments to fit generated code's line length, with room for
    the comma or parenthesis the template puts after the last."""
    text = ", ".join(f"{name}={literal(value)}" for name, value in values.items())
    pad = " " * indent
    return textwrap.fill(
        text,
        width=LINE_LENGTH - 1,
        initial_indent=pad,
        subsequent_indent=pad,
        break_long_words=False,
        break_on_hyphens=False,
    )


def bound_conditions(bounds: Any) -> list[str]:
    """A bucket's bounds as Python comparisons on its dimensions' selector arguments, which are
    the dimension names upper-cased: ``["M <= 16", "N >= 8192"]``."""
    return [f"{b.dim.upper()} {'<=' if b.kind == 'max' else '>='} {b.value}" for b in bounds]


def symbol(vr: VariantResolution, inst: Instantiation) -> str:
    """Module-level name of one instantiation: ATTENTION_FP16_QWEN36_NVIDIA_3FA2C1 (the model
    only for configs resolved per model)."""
    model = f"_{vr.model}" if vr.model is not None else ""
    return f"{vr.variant}{model}_{inst.suffix}".upper()


def target_list(tree: SpecTree, targets: tuple[str, ...]) -> str:
    archs = {hw.name: hw.spec.arch for hw in tree.hardware}
    return ", ".join(f"{t} ({archs[t]})" for t in targets)


def policy_origin(vr: VariantResolution, inst: Instantiation) -> str:
    """Where an instantiation's values came from: policy labels and their lines."""
    src = vr.config.source
    seen = []
    for target in inst.targets:
        pol = vr.resolved[target].policy
        text = f"{pol.label} ({src.where(pol.keypath)})"
        if text not in seen:
            seen.append(text)
    return "; ".join(seen)


def hardware_data(tree: SpecTree) -> list[dict[str, Any]]:
    out = []
    for hw in tree.hardware:

        def value(attr: str) -> Any:
            if attr == "name":
                return hw.name
            return getattr(hw.spec.features if attr in type(hw.spec.features).model_fields else hw.spec, attr)

        values = [(field, repr(value(attr))) for attr, field, _, _ in HW_RECORD_FIELDS]
        out.append(
            {
                "name": hw.name,
                "source": hw.source.path,
                "vendor": hw.spec.vendor,
                "arch": hw.spec.arch,
                "values": values,
            }
        )
    return out


def vendor_data(tree: SpecTree) -> list[dict[str, Any]]:
    return [
        {
            "name": v.name,
            "source": v.source.path,
            "display_name": v.spec.display_name,
            "arch_from": v.spec.arch_from,
            "name_words": v.spec.name_words,
            "default": v.spec.default,
            "hip": v.spec.hip,
        }
        for v in sorted(tree.vendors.values(), key=lambda v: v.name)
    ]


def config_files(tree: SpecTree, name: str) -> tuple[str, ...]:
    """The spec files a config draws on: its own (and inherited) files and its model's."""
    cfg = tree.config(name)
    paths = set(cfg.source.paths)
    paths.update(tree.models[m].source.path for m in cfg.models)
    return tuple(sorted(paths))


def _instantiation(tree: SpecTree, vr: VariantResolution, inst: Instantiation) -> dict[str, Any]:
    data: dict[str, Any] = {
        "symbol": symbol(vr, inst),
        "suffix": inst.suffix,
        "vendor": inst.vendor,
        "arch": inst.arch,
        "origin": policy_origin(vr, inst),
        "targets": target_list(tree, inst.targets),
        "target_names": inst.targets,
    }
    if inst.value.record is not None:
        data["record"] = dict(inst.value.record)
        data["values"] = [(k, repr(v)) for k, v in inst.value.record]
    if inst.value.buckets is not None:
        data["buckets"] = [
            {
                "index": i,
                "name": b.name,
                "note": comment_text(b.note),
                "bounds": [(x.dim, x.kind, x.value) for x in b.bounds],
                "conditions": bound_conditions(b.bounds),
                "record": dict(b.record),
                "values": [(k, repr(v)) for k, v in b.record],
            }
            for i, b in enumerate(inst.value.buckets)
        ]
    return data


def config_data(resolution: Resolution, name: str) -> dict[str, Any]:
    tree = resolution.tree
    cfg = tree.config(name)
    variants: dict[str, dict[str, Any]] = {}
    for vr in resolution.for_config(name):  # sorted by (variant, model)
        insts = [_instantiation(tree, vr, inst) for inst in vr.instantiations]
        by_suffix = {i["suffix"]: i["symbol"] for i in insts}
        table = [(t, by_suffix[vr.target_instantiation[t]]) for t in sorted(vr.target_instantiation)]
        v = variants.setdefault(
            vr.variant,
            {
                "name": vr.variant,
                "params": dict(vr.params),
                "params_text": ", ".join(f"{k}={v!r}" for k, v in sorted(vr.params.items())),
                "names": [vr.variant] + sorted(a for a, v in cfg.aliases.items() if v == vr.variant),
                "n_targets": len(vr.resolved),
                # Targets not served (they lack a feature the config requires): [(target, features)].
                "unserved": [(t, ", ".join(m)) for t, m in sorted(vr.unserved.items())],
                "instantiations": [],
                "by_model": [],
            },
        )
        v["instantiations"] += insts
        v["by_model"].append({"model": vr.model, "instantiations": insts, "table": table})
        if vr.model is None:
            v["table"] = table
    return {
        "name": cfg.name,
        "record": cfg.record,
        "doc": docstring_text(cfg.doc),
        "source": cfg.source.origin((cfg.name, "fields"))[0].path,  # the inherited fields' file
        "bucketed": cfg.bucketed,
        "dims": cfg.dims or (),
        "fields": [(n, f.type, comment_text(f.doc)) for n, f in cfg.fields.items()],
        "models": list(cfg.models),
        "variants": variants,
        "files": config_files(tree, name),
    }


def detection_tables(tree: SpecTree) -> dict[str, Any]:
    """``device_names``: (pattern, spec name), longest first; ``by_arch``: ((vendor, arch), the
    first spec name of that arch in (vendor, arch, name) order)."""
    by_arch: dict[tuple[str, int], str] = {}
    for hw in tree.hardware:
        by_arch.setdefault((hw.spec.vendor, hw.spec.arch), hw.name)
    names = sorted(
        ((dn, hw.name) for hw in tree.hardware for dn in hw.spec.device_names), key=lambda x: (-len(x[0]), x[0])
    )
    return {"device_names": names, "by_arch": sorted(by_arch.items())}


def model_data(tree: SpecTree) -> list[dict[str, Any]]:
    """Every model: its dimensions (those it sets) and the module constants it asks for."""
    out = []
    for name, m in tree.models.items():
        dims = [(d, getattr(m.spec, d)) for d in MODEL_DIMENSIONS if getattr(m.spec, d) is not None]
        prefix = m.spec.constant_prefix
        constants = []
        if prefix is not None:
            constants = [(f"{prefix}_{m.spec.constant_names.get(d, d.upper())}", repr(v)) for d, v in dims]
        out.append(
            {
                "name": name,
                "display_name": m.spec.display_name,
                "source": m.source.path,
                # The dimensions, then the features the model uses (MODEL_DIMS' entry).
                "dims": [(d, repr(v)) for d, v in dims + model_features(m.spec)],
                "constants": constants,
            }
        )
    return out


def selector_data(resolution: Resolution, name: str) -> dict[str, Any] | None:
    """A config's seed-style selector: its parameters and (parameter values) -> (variant, model)
    for every variant and model, first come first kept (equal keys give equal records:
    ``render.check_selectors`` makes sure of it)."""
    cfg = resolution.tree.config(name)
    if cfg.selector is None:
        return None
    table: dict[tuple, tuple[str, str | None]] = {}
    for vr in resolution.for_config(name):
        table.setdefault(selector_key(resolution, vr), (vr.variant, vr.model))
    return {
        "name": cfg.selector.name,
        "record": cfg.record,
        "config": cfg.name,
        "matches": [f"{p} is {what}" for p, what in cfg.selector.params.items()],
        "params": list(cfg.selector.params),
        "table": [(key, variant, model) for key, (variant, model) in table.items()],
        "rules": rules_data(resolution, cfg.name),
    }


def rules_data(resolution: Resolution, name: str) -> dict[str, Any]:
    """A selector's rules as Python (``emit_rules``): one function per policy of the config,
    the chain that picks one by vendor and arch at run time (``[(vendor, min_arch, max_arch,
    targets, function)]`` and the base policy's function or None), and each function argument's
    value in a call of the selector (a selector parameter, or a literal: a variant parameter the
    variants share, a model dimension's documented default)."""
    cfg = resolution.tree.config(name)
    assert cfg.selector is not None
    policies = ([cfg.base] if cfg.base is not None else []) + list(cfg.policies)
    variant_params = sorted({p for params in cfg.variants.values() for p in params})
    model_dims = emit_rules.model_dims_read(cfg, policies)
    given = {what: param for param, what in cfg.selector.params.items()}
    args = []
    for p in variant_params:
        values = {repr(params.get(p)) for params in cfg.variants.values()}
        args.append((p, given.get(p) or (values.pop() if len(values) == 1 else None)))
    for dim in model_dims:
        default = feature_default(dim) if dim in MODEL_FEATURES else ModelSpec.model_fields[dim].default
        args.append((f"model_{dim}", given.get(f"model.{dim}") or (repr(default) if default is not None else None)))
    functions = []
    for pol in policies:
        fn = emit_rules.emit(cfg, pol, tuple(variant_params), model_dims)
        functions.append(
            {
                "name": fn.name,
                "policy": pol.label,
                "line": cfg.source.where(pol.keypath),
                "args": [p for p in fn.params] + [f"model_{d}" for d in fn.model_dims],
                # Each argument's annotation: a variant parameter or dimension is an int, a
                # feature its default's type (a flag, a soft-cap, a scoring's name).
                "types": [arg_type(p) for p in fn.params] + [arg_type(d, model=True) for d in fn.model_dims],
                "statements": fn.statements,
            }
        )
    chain = [(p.vendor, p.min_arch, p.max_arch, p.targets, emit_rules.function_name(cfg, p)) for p in cfg.policies]
    return {
        "functions": functions,
        "chain": chain,
        "base": emit_rules.function_name(cfg, cfg.base) if cfg.base is not None else None,
        "call": args,
        # Function argument -> the selector parameter it comes from (a failed call's hint).
        "hint_params": {arg: value for arg, value in args if value in cfg.selector.params},
        "computable": all(value is not None for _, value in args),
        "missing": [arg for arg, value in args if value is None],
    }


def arg_type(name: str, model: bool = False) -> str:
    """The annotation of a rule function's argument (``int`` but for a model feature that is not)."""
    if model and name in MODEL_FEATURES:
        return type(feature_default(name)).__name__
    return "int"


def selector_key(resolution: Resolution, vr: VariantResolution) -> tuple:
    cfg = vr.config
    assert cfg.selector is not None
    dims = resolution.tree.models[vr.model].spec if vr.model is not None else None
    key = []
    for what in cfg.selector.params.values():
        if what.startswith("model."):
            key.append(getattr(dims, what[len("model.") :]) if dims is not None else None)
        else:
            key.append(vr.params[what])
    return tuple(key)


def defaults_data(resolution: Resolution, configs: tuple[str, ...]) -> dict[str, Any]:
    """The default target and model, and what the dispatch module derives from them: each
    config's default record (its first dispatch name on the default target and model) and the
    module constants the configs ask for."""
    tree = resolution.tree
    target, model = tree.project.default_target, tree.project.default_model
    records: dict[str, str] = {}  # config -> symbol of its default record
    constants: list[tuple[str, str, str]] = []  # (constant, symbol, dispatch name)
    if target is not None:
        for name in configs:
            cfg = tree.config(name)
            if cfg.bucketed:
                continue
            by_name = {}
            for vr in resolution.for_config(name):
                if target in vr.unserved:
                    continue  # the default target lacks a feature the config requires: no record
                if vr.model is None or vr.model == model:
                    sym = symbol(vr, next(i for i in vr.instantiations if target in i.targets))
                    by_name[vr.variant] = sym
            for alias, variant in cfg.aliases.items():
                if variant in by_name:
                    by_name[alias] = by_name[variant]
            if not by_name:
                continue  # the default model is not one the config serves
            first = sorted(cfg.aliases)[0] if cfg.aliases else sorted(cfg.variants)[0]
            records[name] = by_name[first]
            constants += [(const, by_name[dn], dn) for const, dn in cfg.constants.items() if dn in by_name]
    hw_defaults: dict[str, str] = {}
    if target is not None:
        hw_defaults = dict(next(h["values"] for h in hardware_data(tree) if h["name"] == target))
    record_defaults: dict[str, dict[str, str]] = {}
    for vr in resolution.variants:
        for inst in vr.instantiations:
            if records.get(vr.config.name) == symbol(vr, inst):
                record_defaults[vr.config.name] = {k: repr(v) for k, v in inst.value.record or ()}
    return {
        "default_target": target,
        "default_model": model,
        "default_records": records,
        "record_defaults": record_defaults,
        "hw_defaults": hw_defaults,
        "config_constants": sorted(constants),
        "env_var": TARGET_ENV_VAR,
    }


def base_context(resolution: Resolution, configs: tuple[str, ...]) -> dict[str, Any]:
    """Everything but ``header`` and ``module``: the same for every module but ``configs``."""
    tree = resolution.tree
    return {
        **detection_tables(tree),
        "hardware": hardware_data(tree),
        "hw_fields": [(field, pytype, comment_text(doc)) for _, field, pytype, doc in HW_RECORD_FIELDS],
        "vendors": vendor_data(tree),
        "configs": {name: config_data(resolution, name) for name in configs},
        "models": model_data(tree),
        "selectors": [sel for sel in (selector_data(resolution, n) for n in configs) if sel is not None],
        **defaults_data(resolution, configs),
        "modules": [{"name": m.name, "doc": comment_text(m.spec.doc)} for m in tree.modules],
    }
