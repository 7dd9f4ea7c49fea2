"""Why a resolved value is what it is: ``codegen explain``, ``show --json`` and the list of
targets that no measured policy serves.

``explain CONFIG FIELD --hw NAME [--model NAME]`` prints the policy that served the target and
the chain of policies it takes its values from, the rule (or literal) that gave the field and
the line that wrote it, each candidate of a pick with the value of its condition, and the
outcome of every check with its numbers.
"""

from __future__ import annotations

from typing import Any

from . import rules
from .errors import bounded, suggest
from .records import Config, ExprValue, LiteralValue, PickValue, Policy, Resolution, VariantResolution
from .resolve import Scope, chain, hw_namespace, missing_features, model_scope


def _chain(cfg: Config, policy: Policy) -> list[Policy]:
    """The policy and those it takes its values from, nearest first, down to the base."""
    by_label = {p.label: p for p in cfg.policies}
    out = [policy]
    while out[-1].parent is not None:
        parent = cfg.base if out[-1].parent == "base" else by_label.get(out[-1].parent)
        if parent is None or parent in out:
            break
        out.append(parent)
    return out


def check_names(res: Resolution, *, kernel: str | None = None, hw: str | None = None, model: str | None = None) -> None:
    """The names a command's options give exist: ValueError naming the option, the known names
    and the nearest one otherwise."""
    tree = res.tree
    if kernel is not None and not _matching(res, kernel):
        raise ValueError(f"unknown kernel {bounded(kernel)}; {_known(kernel, _kernel_names(res))}")
    if hw is not None and hw not in {h.name for h in tree.hardware}:
        raise ValueError(f"unknown hardware {bounded(hw)} (--hw); {_known(hw, {h.name for h in tree.hardware})}")
    if model is not None and model not in tree.models:
        raise ValueError(f"unknown model {bounded(model)} (--model); {_known(model, tree.models)}")


def _kernel_names(res: Resolution) -> set[str]:
    """Every config, variant and alias name."""
    return {n for v in res.variants for n in (v.variant, v.config.name, *v.config.aliases)}


def _known(name: str, known: Any) -> str:
    return f"known: {', '.join(sorted(known))}{suggest(name, known)}"


def _matching(res: Resolution, name: str) -> list[VariantResolution]:
    """The resolutions a config, variant or alias name selects."""
    return [
        vr for vr in res.variants if name in (vr.variant, vr.config.name) or vr.config.aliases.get(name) == vr.variant
    ]


def explain(res: Resolution, name: str, field: str, hw_name: str, model: str | None) -> list[str]:
    """The lines of ``codegen explain``; ValueError (with the reason) for a bad question."""
    tree = res.tree
    matches = _matching(res, name)
    if not matches:
        raise ValueError(f"unknown config or variant {bounded(name)}; {_known(name, _kernel_names(res))}")
    check_names(res, hw=hw_name, model=model)
    cfg = matches[0].config
    if field not in cfg.fields:
        raise ValueError(
            f"{cfg.record} has no field {bounded(field)}; fields: {', '.join(cfg.fields)}{suggest(field, cfg.fields)}"
        )
    hardware = {hw.name: hw for hw in tree.hardware}
    if cfg.models:
        model = model or tree.project.default_model
        if model not in cfg.models:
            raise ValueError(f"{cfg.name} is resolved for models {', '.join(cfg.models)}, not {model!r}")
    else:
        model = None
    # The variant named (through an alias too), or the first of the config named, for the model.
    wanted = cfg.aliases.get(name, name)
    variant = next((vr for vr in matches if vr.model == model and vr.variant == wanted), None) or next(
        vr for vr in matches if vr.model == model
    )
    hw = hardware[hw_name]
    missing = missing_features(cfg, hw)
    if missing:
        raise ValueError(f"{cfg.name} requires {', '.join(missing)}, which {hw_name} ({hw.source.path}) lacks: not served")
    policy = chain(cfg, hw)
    assert policy is not None  # resolve succeeded for every target
    lines = [
        f"{variant.variant}.{field} on {hw_name} ({hw.spec.vendor} {hw.spec.arch}, {hw.source.path})"
        + (f", model {model}" if model else "")
        + (f", parameters {', '.join(f'{k}={v!r}' for k, v in variant.params.items())}" if variant.params else ""),
    ]
    thresholds = [p.label for p in sorted(cfg.policies, key=lambda p: p.min_arch or 0) if p.vendor == hw.spec.vendor]
    lines.append(
        f"  served by {policy.label} ({cfg.source.where(policy.keypath)})"
        + ("" if policy.tuned else ", tuned = false: not measured on this part")
        + f"; {hw.spec.vendor} thresholds: {', '.join(thresholds) or 'none (the base policy serves)'}"
    )
    chained = _chain(cfg, policy)
    if len(chained) > 1:
        lines.append(f"  chains from {' -> '.join(p.label for p in chained[1:])}")
    scope_model = model_scope(tree, model)
    buckets = policy.buckets if policy.buckets is not None else (None,)
    for bucket in buckets:
        values = bucket.values if bucket is not None else policy.values
        scope = Scope(cfg, values, variant.params, hw_namespace(hw), scope_model)
        indent = "  "
        if bucket is not None:
            bounds = " ".join(f"{b.dim}{'<=' if b.kind == 'max' else '>='}{b.value}" for b in bucket.bounds) or "any"
            lines.append(f"  bucket {bucket.name} ({bounds}):")
            indent = "    "
        lines += _explain_value(cfg, scope, field, values, indent)
        lines += _explain_checks(cfg, scope, indent)
    return lines


def _explain_value(cfg: Config, scope: Scope, field: str, values: Any, indent: str) -> list[str]:
    value = values.get(field)
    where = cfg.source.where(value.keypath) if value is not None else "the field's default"
    result = scope.get(field)
    if isinstance(value, LiteralValue):
        return [f"{indent}{field} = {result!r}: a literal ({where})"]
    if isinstance(value, ExprValue):
        return [f"{indent}{field} = {result!r}: rule '{value.expr.source}' ({where})"]
    assert isinstance(value, PickValue)
    lines = [
        f"{indent}{field} = {result!r}: the first of {list(value.candidates)} for which '{value.where.source}' ({where})"
    ]
    for candidate in value.candidates:
        env = scope.trying(field, candidate).env()
        try:
            ok = rules.evaluate(value.where, env)
            why = "holds" if ok else f"fails: {rules.explain_failure(value.where, env)}"
        except rules.RuleError as exc:
            ok, why = False, f"error: {exc}"
        lines.append(f"{indent}  {candidate}: {why}{'  <- chosen' if candidate == result and ok else ''}")
        if ok:
            break
    return lines


def _explain_checks(cfg: Config, scope: Scope, indent: str) -> list[str]:
    lines = []
    env = scope.env()
    for check in cfg.checks:
        try:
            if check.when is not None and not rules.evaluate(check.when, env):
                lines.append(f"{indent}check '{check.spec.name}': not applied ('{check.when.source}' is false)")
                continue
            ok = rules.evaluate(check.rule, env)
        except rules.RuleError as exc:
            lines.append(f"{indent}check '{check.spec.name}': error: {exc}")
            continue
        detail = rules.explain_holds(check.rule, env) if ok else rules.explain_failure(check.rule, env)
        lines.append(f"{indent}check '{check.spec.name}': {'passes' if ok else 'FAILS'} ({detail})")
    return lines


# ---------------------------------------------------------------------------
# Targets no measured policy serves; show --json


def unmeasured(res: Resolution) -> list[str]:
    """One line per config: the targets served by its base policy or by a policy marked
    ``tuned = false`` (its values were not measured on them)."""
    lines = []
    for cfg in res.tree.configs:
        vrs = res.for_config(cfg.name)
        if not vrs:
            continue
        by_policy: dict[str, list[str]] = {}
        for target, r in vrs[0].resolved.items():
            if r.policy.vendor is None or not r.policy.tuned:
                by_policy.setdefault(r.policy.label, []).append(target)
        if by_policy:
            parts = [
                f"{', '.join(ts)} ({label}{'' if label == 'base' else ', tuned = false'})"
                for label, ts in by_policy.items()
            ]
            lines.append(f"{cfg.name}: not measured on {'; '.join(parts)}")
    return lines


def unserved(res: Resolution) -> list[str]:
    """One line per config and model it does not serve for want of fields its rules read
    (``moe: not served for llama31_8b: no num_experts, top_k``), and one per config that requires
    hardware features, naming the targets that lack them (``<config>: not served on a10, a100:
    no <feature>``)."""
    lines = [
        f"{cfg.name}: not served for {model}: no {', '.join(fields)}"
        for cfg in res.tree.configs
        for model, fields in cfg.unserved
    ]
    for cfg in res.tree.configs:
        vrs = res.for_config(cfg.name)
        if not vrs or not vrs[0].unserved:
            continue
        by_missing: dict[tuple[str, ...], list[str]] = {}
        for target, missing in vrs[0].unserved.items():
            by_missing.setdefault(missing, []).append(target)
        parts = [f"{', '.join(ts)}: no {', '.join(m)}" for m, ts in by_missing.items()]
        lines.append(f"{cfg.name}: not served on {'; '.join(parts)}")
    return lines


def as_json(res: Resolution, kernel: str | None = None, hw: str | None = None) -> dict[str, Any]:
    """The resolved tree: every config's records per variant, model and target; only the
    variants ``kernel`` names (a config, variant or alias) and the target ``hw``, when given."""
    tree = res.tree
    configs: dict[str, Any] = {}
    for vr in res.variants if kernel is None else _matching(res, kernel):
        cfg = configs.setdefault(
            vr.config.name,
            {
                "record": vr.config.record,
                "source": vr.config.source.path,
                "models": list(vr.config.models),
                "variants": {},
            },
        )
        variant = cfg["variants"].setdefault(vr.variant, {"params": dict(vr.params), "models": {}})
        variant["models"][vr.model or ""] = _variant_json(vr, hw)
    return {
        "default_target": tree.project.default_target,
        "default_model": tree.project.default_model,
        "hardware": {
            h.name: {"vendor": h.spec.vendor, "arch": h.spec.arch, "source": h.source.path}
            for h in tree.hardware
            if hw is None or h.name == hw
        },
        "models": {name: m.source.path for name, m in tree.models.items()},
        "configs": configs,
    }


def _variant_json(vr: VariantResolution, hw: str | None = None) -> dict[str, Any]:
    out = {}
    for target, r in vr.resolved.items():
        if hw is not None and target != hw:
            continue
        entry: dict[str, Any] = {
            "policy": r.policy.label,
            "policy_line": vr.config.source.where(r.policy.keypath),
            "tuned": r.policy.tuned,
            "instantiation": vr.target_instantiation[target],
        }
        if r.record is not None:
            entry["record"] = dict(r.record)
        else:
            entry["buckets"] = [
                {"name": b.name, "bounds": [[x.dim, x.kind, x.value] for x in b.bounds], "record": dict(b.record)}
                for b in r.buckets or ()
            ]
        out[target] = entry
    return out


def sources(tree: Any, only: str | None = None) -> list[str]:
    """``show --sources``: every target's figures with the sources they cite."""
    lines = []
    for hw in tree.hardware:
        if only is not None and hw.name != only:
            continue
        lines.append(f"== {hw.name} ({hw.spec.display_name}, {hw.source.path}) ==")
        for attr, text in hw.spec.cite.items():
            value = getattr(hw.spec.features if attr in type(hw.spec.features).model_fields else hw.spec, attr)
            keys = text.split()
            shown = text if ":" in text.split(" ")[0] else ", ".join(f"[{k}]" for k in keys)
            lines.append(f"  {attr} = {value!r}: {shown}")
        lines.append("  sources:")
        lines += [f"    [{key}] {citation}" for key, citation in hw.spec.sources.items()]
    return lines
