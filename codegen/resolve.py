"""Stage 2, SpecTree -> Resolution: chain, evaluate, validate and collapse policies.

For every config variant and every target: (1) chain, as CCCL's ChainedPolicy: the policy of
the target's vendor with the largest ``min_arch`` <= its arch (vendors never mix; ``max_arch``
stops a chain; none: the base policy, else an error); (2) evaluate its rules against ``hw``,
``model`` and the variant's parameters in dependency order, each value of its field's type and
finite; (3) validate the record against the target's own limits (the config's checks: shared
memory is not monotonic in arch, 163 KB a block on 8.0, 99 KB on 8.6/8.9); (4) collapse targets
of one vendor whose records are equal into one instantiation, named after the vendor and a
digest of its values (``nvidia_3fa2c1``; no arch, so adding a target of any arch or vendor renames
nothing unchanged; no field at its literal default, so adding a field with a default renames
nothing either), recording the group's lowest arch, which ``show`` and the comments state.
"""

from __future__ import annotations

import hashlib
import math
import re
import string
from dataclasses import dataclass, replace
from typing import Any, Mapping

from . import rules
from .errors import SpecErrors, SpecProblem
from .records import (
    Check,
    Config,
    ExprValue,
    FrozenMap,
    Hardware,
    Instantiation,
    LiteralValue,
    Policy,
    Record,
    Resolution,
    Resolved,
    ResolvedBucket,
    SpecTree,
    Value,
    VariantResolution,
)
from .models import hw_rule_namespace, model_rule_namespace

# ---------------------------------------------------------------------------


def hw_namespace(hw: Hardware) -> dict[str, Any]:
    """What rules see as ``hw``: the spec's numbers, its features, and derived figures
    (``models.HW_RULE_ATTRS``, the attributes load.py lets a rule read)."""
    return hw_rule_namespace(hw.name, hw.spec)


def resolve(tree: SpecTree) -> Resolution:
    found: list[tuple[SpecProblem, Config, str]] = []
    hw_ns = {hw.name: hw_namespace(hw) for hw in tree.hardware}
    out: list[VariantResolution] = []
    # Variants of equal parameters (attention_fp16 and attention_bf16: dtype_bytes = 2) resolve
    # alike: each (config, parameters, model) is evaluated once.
    done: dict[tuple, tuple[list, dict[str, Resolved], dict[str, tuple[str, ...]]]] = {}
    for cfg in tree.configs:
        for variant in sorted(cfg.variants):
            for model in cfg.models or (None,):
                params = cfg.variants[variant]
                key = (cfg.name, tuple(sorted((k, repr(v)) for k, v in params.items())), model)
                if key not in done:
                    done[key] = _resolve_targets(tree, cfg, params, model, hw_ns)
                problems, resolved, unserved = done[key]
                found += [(p, cfg, variant) for p in _merge_targets(cfg, problems)]
                if not problems:
                    vr = _collapse(cfg, variant, model, params, resolved, tree)
                    out.append(replace(vr, unserved=FrozenMap(unserved)))
    if found:
        raise SpecErrors(_merge_variants(found))
    return Resolution(tree=tree, variants=tuple(out))


def _resolve_targets(
    tree: SpecTree, cfg: Config, params: Mapping[str, Any], model: str | None, hw_ns: Mapping[str, Any]
) -> tuple[list, dict[str, Resolved], dict[str, tuple[str, ...]]]:
    """One variant's parameters and model on every target: the problems found (SpecProblems and
    _CheckFailures), the records of the targets served and the features the others lack."""
    problems: list = []
    resolved: dict[str, Resolved] = {}
    unserved: dict[str, tuple[str, ...]] = {}
    scope = model_scope(tree, model)
    for hw in tree.hardware:
        missing = missing_features(cfg, hw)
        if missing:
            unserved[hw.name] = missing
            continue
        r = _resolve_one(cfg, params, hw, hw_ns[hw.name], scope, problems)
        if r is not None:
            resolved[hw.name] = r
    return problems, resolved, unserved


def missing_features(cfg: Config, hw: Hardware) -> tuple[str, ...]:
    """The hardware features ``cfg`` requires that ``hw`` lacks: such a target is not served."""
    return tuple(f for f in cfg.requires if not getattr(hw.spec.features, f))


@dataclass(frozen=True)
class _Where:
    """Where a record is resolved, for messages: policy, target, model, bucket."""

    policy: str
    hw: Hardware
    model: str  # "" without a model
    bucket: str | None

    def target(self) -> str:
        return f"{self.hw.name} ({self.hw.spec.vendor} {self.hw.spec.arch}, {self.hw.source.path})"

    def rest(self) -> str:
        out = f" for {self.model}" if self.model else ""
        return out + (f", bucket {self.bucket}" if self.bucket else "")

    def __str__(self) -> str:
        return f"policy {self.policy} on target {self.target()}{self.rest()}"


@dataclass(frozen=True)
class _CheckFailure:
    """A check a record failed; failures of one check at one spec line on several targets are
    reported as one problem listing the targets (``_merge_targets``)."""

    keypath: tuple
    where: _Where
    check: str
    message: str
    record: tuple = ()  # the record's table: failures are merged per table, reported at the first's key


def _merge_targets(cfg: Config, problems: list) -> list[SpecProblem]:
    """Problems as found, with the check failures of one check, policy, model and bucket on
    several targets merged into one line that lists the targets (their messages, where they
    differ other than by the target's name)."""
    groups: dict[tuple, list[_CheckFailure]] = {}
    out: list[Any] = []
    for p in problems:
        if isinstance(p, _CheckFailure):
            key = (p.record or p.keypath, p.where.policy, p.where.rest(), p.check)
            if key not in groups:
                groups[key] = []
                out.append(key)
            groups[key].append(p)
        else:
            out.append(p)
    merged = []
    for item in out:
        if isinstance(item, SpecProblem):
            merged.append(item)
            continue
        failures = groups[item]
        first = failures[0]
        if len(failures) == 1:
            merged.append(
                cfg.source.problem(first.keypath, f"{first.where}: fails check '{first.check}': {first.message}")
            )
            continue
        targets = ", ".join(f.where.target() for f in failures)
        texts = {f.message.replace(f.where.hw.name, "{target}") for f in failures}
        if len(texts) == 1:
            detail = first.message + (f" (likewise on {', '.join(f.where.hw.name for f in failures[1:])})")
        else:
            detail = "; ".join(f"{f.where.hw.name}: {f.message}" for f in failures)
        merged.append(
            cfg.source.problem(
                first.keypath,
                f"policy {first.where.policy} on {len(failures)} targets {targets}{first.where.rest()}: "
                f"fails check '{first.check}': {detail}",
            )
        )
    return merged


@dataclass(frozen=True)
class ModelScope:
    """The model a config is resolved for: its namespace and how messages name it."""

    name: str | None
    namespace: Mapping[str, Any]
    label: str  # "model llama31_8b (specs/models/llama31_8b.toml)"; "" without a model


def model_scope(tree: SpecTree, model: str | None) -> ModelScope:
    if model is None:
        return ModelScope(None, {}, "")
    m = tree.models[model]
    return ModelScope(model, model_rule_namespace(m.spec), f"model {model} ({m.source.path})")


def _merge_variants(found: list[tuple[SpecProblem, Config, str]]) -> list[SpecProblem]:
    """A problem that several variants of a config share is reported once, naming them."""
    merged: dict[str, tuple[SpecProblem, Config, list[str]]] = {}
    for p, cfg, variant in found:
        merged.setdefault(p.render(), (p, cfg, []))[2].append(variant)
    out = []
    for p, cfg, variants in merged.values():
        if len(cfg.variants) > 1:
            p = replace(p, rule=f"{p.rule} [variant{'s' if len(variants) > 1 else ''} {', '.join(variants)}]")
        out.append(p)
    return out


def chain(cfg: Config, hw: Hardware) -> Policy | None:
    """The policy that serves ``hw``: the largest threshold <= its arch, same vendor only; at
    one threshold, a policy limited to named targets that include ``hw`` wins."""
    best = None
    for pol in cfg.policies:
        if pol.targets is not None and hw.name not in pol.targets:
            continue
        if pol.vendor == hw.spec.vendor and pol.min_arch is not None and pol.min_arch <= hw.spec.arch:
            rank = (pol.min_arch, pol.targets is not None)
            if best is None or rank > (best.min_arch, best.targets is not None):
                best = pol
    if best is not None and best.max_arch is not None and hw.spec.arch > best.max_arch:
        best = None
    return best if best is not None else cfg.base


def resolve_target(
    tree: SpecTree,
    cfg: Config,
    variant: str,
    target: str,
    model: str | None = None,
    policy: Policy | None = None,
    hints: bool = True,
) -> tuple[Resolved | None, list[SpecProblem]]:
    """One variant of ``cfg`` on one target, with ``policy`` in place of the one the target
    chains to when given (``codegen tune`` resolves its candidates so): the resolution, or None
    and every problem found (check failures included).  ``hints=False``: a failed check's
    message lacks the smaller values that would pass (searching them costs ~20 checks)."""
    hw = next(h for h in tree.hardware if h.name == target)
    problems: list = []
    r = _resolve_one(
        cfg, cfg.variants[variant], hw, hw_namespace(hw), model_scope(tree, model), problems, policy, hints
    )
    return (r if not problems else None), _merge_targets(cfg, problems)


def _resolve_one(
    cfg: Config,
    params: Mapping[str, Any],
    hw: Hardware,
    hw_ns: Mapping[str, Any],
    model: ModelScope,
    problems: list[SpecProblem],
    policy: Policy | None = None,
    hints: bool = True,
) -> Resolved | None:
    policy = policy if policy is not None else chain(cfg, hw)
    if policy is None:
        # (threshold, policy) of the target's vendor: a vendor's policies all have a threshold.
        vendor_policies = [
            (p.min_arch, p)
            for p in cfg.policies
            if p.vendor == hw.spec.vendor and p.min_arch is not None and (p.targets is None or hw.name in p.targets)
        ]
        if vendor_policies and all(arch > hw.spec.arch for arch, _ in vendor_policies):
            why = (
                f"arch {hw.spec.arch} is below every {hw.spec.vendor} threshold "
                f"({', '.join(str(arch) for arch, _ in vendor_policies)}) and there is no base policy"
            )
        elif vendor_policies:
            capped = max((ap for ap in vendor_policies if ap[0] <= hw.spec.arch), key=lambda ap: ap[0])[1]
            why = f"the chained policy {capped.label} stops at max_arch {capped.max_arch} and there is no base policy"
        else:
            why = f"no {hw.spec.vendor} policy and no base policy"
        problems.append(
            cfg.source.problem(
                (cfg.name, "policy"),
                f"no policy for target {hw.name} ({hw.spec.vendor} arch {hw.spec.arch}, {hw.source.path}): {why}",
            )
        )
        return None

    context = _Where(policy.label, hw, model.label if model.name is not None else "", None)
    if policy.buckets is None:
        record = _evaluate(cfg, policy.values, params, hw_ns, model, policy.keypath, context, problems, hints)
        return None if record is None else Resolved(hw.name, policy, record, None)
    buckets = []
    ok = True
    for bucket in policy.buckets:
        record = _evaluate(
            cfg,
            bucket.values,
            params,
            hw_ns,
            model,
            bucket.keypath,
            replace(context, bucket=bucket.name),
            problems,
            hints,
        )
        if record is None:
            ok = False
        else:
            buckets.append(ResolvedBucket(bucket.name, bucket.note, bucket.bounds, record))
    return Resolved(hw.name, policy, None, tuple(buckets)) if ok else None


def _evaluate(
    cfg: Config,
    values: Mapping[str, Value],
    params: Mapping[str, Any],
    hw_ns: Mapping[str, Any],
    model: ModelScope,
    keypath: tuple,
    context: "_Where",
    problems: list,
    hints: bool = True,
) -> Record | None:
    """Evaluate every field of one record, then run the config's checks on it."""
    missing = [f for f in cfg.fields if f not in values]
    if missing:
        problems.append(
            cfg.source.problem(
                keypath,
                f"{context}: no value for field(s) {', '.join(missing)} of {cfg.record}: neither this policy, "
                "the policies it chains from, nor the fields' defaults set them",
            )
        )
        return None
    scope = Scope(cfg, values, params, hw_ns, model)
    record = []
    for name, field_spec in cfg.fields.items():
        try:
            value = scope.get(name)
        except rules.RuleError as exc:
            where = getattr(exc, "keypath", None) or values[name].keypath
            problems.append(cfg.source.problem(where, f"{context}: {exc}"))
            return None
        err = _type_error(name, field_spec.type, field_spec.choices, value)
        if err:
            problems.append(cfg.source.problem(values[name].keypath, f"{context}: {err}", value=value))
            return None
        record.append((name, value))
    failed = False
    for check in cfg.checks:
        fixes: list[str] = []
        msg = _run_check(check, scope, fixes, hints)
        if msg:
            where = _check_keypath(cfg, check, values, keypath, fixes)
            problems.append(_CheckFailure(where, context, check.spec.name, msg, keypath))
            failed = True
    return None if failed else tuple(record)


def _check_keypath(cfg: Config, check: Check, values: Mapping[str, Value], keypath: tuple, fixes: list[str]) -> tuple:
    """Where a failed check is reported: the key of a field its rule reads (one whose smaller
    value would pass first, then one it names, then one read through derived values), set in
    this record's own table if one is, else where it is inherited from; the record's table when
    the rule reads no field."""
    direct = check.rule.names
    seen, pending = set(direct), list(direct)
    while pending:
        rule = cfg.derived.get(pending.pop())
        for name in rule.names if rule is not None else ():
            if name not in seen:
                seen.add(name)
                pending.append(name)
    fields = [f for f in fixes if f in values]
    fields += [f for f in cfg.fields if f in direct and f in values and f not in fields]
    fields += [f for f in cfg.fields if f in seen and f in values and f not in fields]
    here = [f for f in fields if tuple(values[f].keypath[: len(keypath)]) == tuple(keypath)]
    chosen = (here or fields)[:1]
    return tuple(values[chosen[0]].keypath) if chosen else keypath


def _type_error(name: str, ftype: str, choices: tuple | None, value: Any) -> str | None:
    ok = {
        "int": type(value) is int,
        "float": type(value) in (int, float),
        "bool": type(value) is bool,
        "str": type(value) is str,
    }[ftype]
    if not ok:
        return f"rule for '{name}' gave a {type(value).__name__}; the field is {ftype}"
    if type(value) is int and not -(2**63) <= value < 2**63:
        return f"rule for '{name}' gave an integer outside 64 bits; generated code carries 64-bit values"
    if type(value) is float and not math.isfinite(value):
        return f"rule for '{name}' gave {value!r}; a field's value must be finite (generated Python cannot spell it)"
    if choices is not None and value not in choices:
        return f"rule for '{name}' gave a value outside {', '.join(map(repr, choices))}"
    return None


def _run_check(check: Check, scope: "Scope", fixes: list[str] | None = None, hints: bool = True) -> str | None:
    """A failed check's message, or None; the fields whose smaller value would pass go to ``fixes``
    (with ``hints``: tune's plans skip that search, which is most of a rejected candidate's cost)."""
    env = scope.env()
    try:
        if check.when is not None and not rules.evaluate(check.when, env):
            return None
        if rules.evaluate(check.rule, env):
            return None
        detail = rules.explain_failure(check.rule, env)
        hint = _fitting_value(check, scope, fixes) if hints else None
        hint = f"; {hint} would pass" if hint else ""
        if check.spec.message:
            return f"{_format_message(check.spec.message, scope)} ({detail}){hint}"
        return detail + hint
    except rules.RuleError as exc:
        return str(exc)


def _fitting_value(check: Check, scope: "Scope", fixes: list[str] | None = None) -> str | None:
    """For a failed check: the largest smaller values of the int fields it reads (directly or
    through derived values) with which the record would pass every check, one field changed at
    a time; e.g. "block_k = 32, or num_stages = 2".  None where no such change passes."""
    reads: list[str] = []
    pending = sorted(check.rule.names)
    while pending:
        name = pending.pop(0)
        if name in reads:
            continue
        reads.append(name)
        if name in scope.cfg.derived:
            pending += sorted(scope.cfg.derived[name].names)
    found = []
    for name, field in scope.cfg.fields.items():
        if name not in reads or field.type != "int" or name in scope.fixed:
            continue
        value = scope.get(name)
        for steps, candidate in enumerate(_smaller(value), start=1):
            if _passes_all(scope.trying(name, candidate)):
                found.append((steps, name, f"{name} = {candidate}"))
                break
    found.sort(key=lambda f: f[0])
    if fixes is not None:
        fixes += [name for _, name, _ in found]
    return ", or ".join(text for _, _, text in found[:3]) or None


def _smaller(value: int) -> list[int]:
    """Values below ``value`` to try, largest first: every one below 17, then powers of two."""
    out = [v for v in range(min(value - 1, 16), 0, -1)]
    if value > 17:
        out = [1 << b for b in range((value - 1).bit_length() - 1, 4, -1)] + out
    return out[:24]


def _passes_all(scope: "Scope") -> bool:
    env = scope.env()
    try:
        for check in scope.cfg.checks:
            if (check.when is None or rules.evaluate(check.when, env)) and not rules.evaluate(check.rule, env):
                return False
    except rules.RuleError:
        return False
    return True


class _Namespace:
    """Attribute access for str.format in check messages: {hw.sm_count}."""

    def __init__(self, values: Mapping[str, Any]):
        self.__dict__.update(values)


def _format_message(template: str, scope: "Scope") -> str:
    class Lookup(dict):
        def __missing__(self, key: str) -> Any:
            if key == "hw":
                return _Namespace(scope.hw_ns)
            if key == "model":
                return _Namespace(scope.model.namespace)
            return scope.get(key)

    wide = _wide_format_spec(template)
    if wide is not None:
        return (
            f"{template} [message not formatted: the format spec {wide!r} asks for more than {_MAX_WIDTH} characters]"
        )
    try:
        text = template.format_map(Lookup())
    except (KeyError, AttributeError, ValueError, IndexError, rules.RuleError) as exc:
        return f"{template} [message could not be formatted: {exc}]"
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 3] + "..."


# A check message is one line of a report: no field of it wider than _MAX_WIDTH, at most
# _MAX_MESSAGE characters in all (a width such as {x:>999999999} would take gigabytes).
_MAX_WIDTH = 200
_MAX_MESSAGE = 2000


def _wide_format_spec(template: str) -> str | None:
    """A format spec in ``template`` whose width or precision exceeds _MAX_WIDTH, or None."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError:
        return None  # format_map reports it
    for _, _, spec, _ in parsed:
        for number in re.findall(r"\d+", spec or ""):
            if int(number[:6]) > _MAX_WIDTH or len(number) > 6:
                return spec
    return None


class Scope:
    """Lazy, memoised evaluation of one record's fields and derived values."""

    def __init__(
        self,
        cfg: Config,
        values: Mapping[str, Value],
        params: Mapping[str, Any],
        hw_ns: Mapping[str, Any],
        model: ModelScope,
        fixed: Mapping[str, Any] | None = None,
    ):
        self.cfg = cfg
        # A pick's candidate under test: the field's value while its ``where`` (and every
        # derived value it reads) is evaluated.
        self.fixed = fixed or {}
        self.values = values
        self.params = params
        self.hw_ns = hw_ns
        self.model = model
        self.cache: dict[str, Any] = {}
        self.stack: list[str] = []

    def env(self) -> rules.Env:
        labels = {"model": self.model.label} if self.model.name is not None else None
        return rules.Env(self.get, {"hw": self.hw_ns, "model": self.model.namespace}, labels)

    def trying(self, name: str, candidate: Any) -> "Scope":
        """A scope in which ``name`` is ``candidate``: derived values that read it follow."""
        return Scope(self.cfg, self.values, self.params, self.hw_ns, self.model, {**self.fixed, name: candidate})

    def get(self, name: str) -> Any:
        if name in self.fixed:
            return self.fixed[name]
        if name in self.cache:
            return self.cache[name]
        if name in self.params:
            return self.params[name]
        if name in self.stack:
            cycle = " -> ".join(self.stack[self.stack.index(name) :] + [name])
            raise rules.RuleError(f"rules depend on each other in a cycle: {cycle}")
        self.stack.append(name)
        try:
            if name in self.values:
                try:
                    value = self._value(name, self.values[name])
                except rules.RuleError as exc:
                    # Report at the value whose rule failed, not at a field that reads it.
                    if getattr(exc, "keypath", None) is None:
                        exc.keypath = self.values[name].keypath  # type: ignore[attr-defined]
                    raise
            elif name in self.cfg.derived:
                value = rules.evaluate(self.cfg.derived[name], self.env())
            else:  # load.py checked every name a rule reads
                raise rules.RuleError(f"'{name}' is not defined")
        finally:
            self.stack.pop()
        self.cache[name] = value
        return value

    def _value(self, name: str, value: Value) -> Any:
        if isinstance(value, LiteralValue):
            return value.value
        if isinstance(value, ExprValue):
            return rules.evaluate(value.expr, self.env())
        for candidate in value.candidates:
            if rules.evaluate(value.where, self.trying(name, candidate).env()):
                return candidate
        last = value.candidates[-1]
        why = rules.explain_failure(value.where, self.trying(name, last).env())
        return _raise(
            f"no candidate for '{name}' in {list(value.candidates)} satisfies '{value.where.source}' "
            f"(the last, {last}: {why})"
        )


def _raise(message: str) -> Any:
    raise rules.RuleError(message)


# ---------------------------------------------------------------------------


def value_digest(key: Any, width: int = 6) -> str:
    """``width`` hex digits of a stable hash of resolved values (their repr: ints, floats, bools,
    strings and tuples of them print the same on every machine and Python run)."""
    return hashlib.sha256(repr(key).encode()).hexdigest()[:width]


def _name_key(cfg: Config, res: Resolved) -> tuple:
    """The values an instantiation's name digests: its record (each bucket's, with the bucket's
    name and bounds) less the fields at their literal defaults.  A field added with a default that
    the existing policies keep is then absent from every existing digest: adding it renames
    nothing.  (A default given by a rule is a value of the target's and stays in.)"""
    literal = {
        n: f.default for n, f in cfg.fields.items() if f.default is not None and not isinstance(f.default, Mapping)
    }

    def strip(record: tuple) -> tuple:
        return tuple(
            (n, v) for n, v in record if not (n in literal and type(v) is type(literal[n]) and v == literal[n])
        )

    if res.buckets is not None:
        return tuple((b.name, b.bounds, strip(b.record)) for b in res.buckets)
    return strip(res.record or ())


def _collapse(
    cfg: Config,
    variant: str,
    model: str | None,
    params: Mapping[str, Any],
    resolved: dict[str, Resolved],
    tree: SpecTree,
) -> VariantResolution:
    by_name = {hw.name: hw for hw in tree.hardware}
    groups: dict[tuple, list[str]] = {}
    for target in resolved:  # tree.hardware order: (vendor, arch, name)
        groups.setdefault((by_name[target].spec.vendor, resolved[target].key), []).append(target)

    raw = []
    for (vendor, _key), members in groups.items():
        members.sort(key=lambda t: (by_name[t].spec.arch, t))
        lead = by_name[members[0]]
        policies = tuple(dict.fromkeys(resolved[t].policy.label for t in members))
        raw.append((vendor, lead.spec.arch, members, policies))

    # Six hex digits name a group; two groups of one vendor whose digests share them (about one
    # chance in 16 million per pair) both take longer ones, so no name depends on the others.
    # The digest leaves out fields at their literal defaults (_name_key).
    lead_of = {gk: resolved[members[0]] for gk, members in groups.items()}
    digests = {gk: value_digest(_name_key(cfg, lead_of[gk]), 64) for gk in groups}
    short = [(gk[0], d[:6]) for gk, d in digests.items()]
    insts = []
    for (vendor, arch, members, policies), gk in zip(raw, groups):
        width = 6 if short.count((vendor, digests[gk][:6])) == 1 else 16
        suffix = f"{vendor}_{digests[gk][:width]}"
        insts.append(Instantiation(suffix, vendor, arch, tuple(members), policies, resolved[members[0]]))
    insts.sort(key=lambda i: (i.vendor, i.arch, i.suffix))
    target_inst = {t: inst.suffix for inst in insts for t in inst.targets}
    ordered = {t: resolved[t] for t in resolved}
    return VariantResolution(
        config=cfg,
        variant=variant,
        model=model,
        params=FrozenMap(params),
        resolved=FrozenMap(ordered),
        instantiations=tuple(insts),
        target_instantiation=FrozenMap((t, target_inst[t]) for t in ordered),
    )
