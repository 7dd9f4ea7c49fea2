"""Stage 1 of ``codegen tune``: SpecTree + target + shapes -> Plan.

Per bucket of the target's policy that a shape falls in: the incumbent (the bucket as the specs
resolve it today) and the candidates of the family's search space.  A candidate is the bucket's
values with the space's axes in place of some; the compiler resolves it for the target, in every
variant of the config (the written spec must build for all of them), and runs the config's
checks: a candidate that fails one is listed with the check's message and never launched.  Two
candidates that resolve to the same records, or to the incumbent's, are one.

The plan is data, the same on every host for the same specs and arguments: candidates of a bucket
are ordered by a digest of their values (an even sample of the space where a budget stops the
run early), cut into chunks of ``chunk`` candidates, and the buckets' chunks interleaved; a
shard takes every n-th chunk.  ``fingerprint`` digests all of it; a results file records it, so
results of another plan are never mixed in.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from ..errors import SpecProblem, validate
from ..load import rule_parser
from ..policies import load_tune
from ..records import (
    Bound,
    Config,
    ExprValue,
    FrozenMap,
    LiteralValue,
    Policy,
    PickValue,
    Source,
    SpecTree,
    Tune,
    TuneSpace,
    Value,
)
from ..models import TuneBackendSpec, TuneSpaceSpec
from ..resolve import chain, missing_features, resolve_target

INCUMBENT = "incumbent"


class PlanError(Exception):
    """A tune that cannot be planned (unknown kernel or target, no shape in any bucket...): the
    CLI prints the message and exits 2."""


@dataclass(frozen=True)
class Candidate:
    """One point of the search space for one bucket."""

    key: str  # 12 hex digits of its written values: its name in results files
    bucket: str
    # The fields the space sets, as they are written in a spec (int, str, bool, or
    # {"expr": "..."}), in field order; the incumbent's: the fields every space of the bucket sets.
    written: FrozenMap[str, Any]
    # The timed variant's resolved record (every field), what the harness runs.
    record: FrozenMap[str, Any]
    # Every variant's resolved record, to find the fields that differ from the incumbent's.
    records: FrozenMap[str, FrozenMap[str, Any]]
    space: str  # the space it came from; "incumbent"

    @property
    def label(self) -> str:
        return " ".join(f"{k}={_short(v)}" for k, v in self.written.items())


@dataclass(frozen=True)
class BucketPlan:
    name: str
    shapes: tuple[tuple[int, ...], ...]
    incumbent: Candidate
    candidates: tuple[Candidate, ...]  # in plan order
    rejected: tuple[tuple[str, str], ...]  # (candidate label, why): failed a check, never launched


@dataclass(frozen=True)
class Chunk:
    index: int
    bucket: str
    keys: tuple[str, ...]


@dataclass(frozen=True)
class Plan:
    config: str
    target: str
    variant: str
    model: str | None
    dims: tuple[str, ...]
    dtype: str
    harness: str
    params: FrozenMap[str, Any]  # fixed problem parameters for the harness (the spec's, the model's)
    rounds: int
    tolerance: float
    budget_s: int
    buckets: tuple[BucketPlan, ...]  # buckets with at least one shape, in policy order
    idle: tuple[str, ...]  # buckets no shape falls in (not tuned)
    chunks: tuple[Chunk, ...]
    policy: str  # label of the policy the target chains to
    # The family's backend field (who serves a bucket), which decide may flip; None: none.
    backend: TuneBackendSpec | None
    fingerprint: str

    def bucket(self, name: str) -> BucketPlan:
        return next(b for b in self.buckets if b.name == name)

    def candidate(self, key: str) -> Candidate:
        for b in self.buckets:
            if b.incumbent.key == key:
                return b.incumbent
            for c in b.candidates:
                if c.key == key:
                    return c
        raise KeyError(key)

    def shard(self, i: int, n: int) -> tuple[Chunk, ...]:
        return tuple(c for c in self.chunks if c.index % n == i)

    def shape_text(self, shape: Sequence[int]) -> str:
        return "x".join(map(str, shape))


def _short(v: Any) -> str:
    if isinstance(v, Mapping):
        return "{" + (str(v["expr"]) if "expr" in v else f"pick {v.get('pick')} where {v.get('where')}") + "}"
    return str(v).lower() if isinstance(v, bool) else str(v)


def written_value(value: Value) -> Any:
    """A policy value as a spec writes it."""
    if isinstance(value, LiteralValue):
        return value.value
    if isinstance(value, ExprValue):
        return {"expr": value.expr.source}
    assert isinstance(value, PickValue)
    return {"pick": list(value.candidates), "where": value.where.source}


def _digest(obj: Any, n: int = 12) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:n]


def in_bucket(bounds: Sequence[Bound], dims: Sequence[str], shape: Sequence[int]) -> bool:
    for b in bounds:
        v = shape[list(dims).index(b.dim)]
        if (b.kind == "min" and v < b.value) or (b.kind == "max" and v > b.value):
            return False
    return True


def cli_space(cfg: Config, axes: Sequence[str], buckets: Sequence[str] | None) -> TuneSpace:
    """``--space block_m=64,128 num_stages=3,4 block_k=expr:128//dtype_bytes``: one space over
    the given buckets (all where none are named), checked as a spec's space is."""
    raw: dict[str, list[Any]] = {}
    for item in axes:
        name, sep, values = item.partition("=")
        if not sep or not name or not values:
            raise PlanError(f"--space: expected FIELD=V1,V2,... (got {item!r})")
        raw[name] = [_cli_value(v) for v in values.split(",")]
    assert cfg.tune is not None
    problems: list[SpecProblem] = []
    source = Source("--space", "")
    space = validate(
        TuneSpaceSpec,
        {"name": "command_line", "buckets": list(buckets) if buckets else None, "axes": raw},
        source,
        (),
        problems,
    )
    if space is None:
        raise PlanError("; ".join(p.render() for p in problems))
    spec = cfg.tune.spec.model_copy(update={"space": (space,)})
    tune = load_tune(
        config=cfg.name,
        record=cfg.record,
        fields=cfg.fields,
        dims=cfg.dims,
        variants=cfg.variants,
        policies=cfg.policies,
        base=cfg.base,
        spec=spec,
        source=source,
        parse_rule=rule_parser(
            set(cfg.fields) | set(cfg.derived) | {p for ps in cfg.variants.values() for p in ps},
            bool(cfg.models),
            source,
            problems,
        ),
        problems=problems,
    )
    if tune is None:
        raise PlanError("; ".join(p.render() for p in problems))
    return tune.spaces[0]


def _cli_value(text: str) -> Any:
    if text.startswith("expr:"):
        return {"expr": text[5:]}
    if text in ("true", "false"):
        return text == "true"
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def plan(
    tree: SpecTree,
    config: str,
    target: str,
    *,
    shapes: Sequence[Sequence[int]] | None = None,
    space: TuneSpace | None = None,
    model: str | None = None,
    dtype: str | None = None,
    chunk: int | None = None,
    rounds: int | None = None,
    budget_s: int | None = None,
) -> Plan:
    try:
        cfg = tree.config(config)
    except KeyError:
        tunable = [c.name for c in tree.configs if c.tune is not None]
        raise PlanError(f"no kernel config {config!r} (tunable: {', '.join(tunable) or 'none'})") from None
    if cfg.tune is None:
        tunable = [c.name for c in tree.configs if c.tune is not None]
        raise PlanError(
            f"{config} declares no [{config}.tune] table, so it cannot be tuned (tunable: {', '.join(tunable) or 'none'})"
        )
    hw = next((h for h in tree.hardware if h.name == target), None)
    if hw is None:
        raise PlanError(f"no hardware spec {target!r} (known: {', '.join(h.name for h in tree.hardware)})")
    missing = missing_features(cfg, hw)
    if missing:
        raise PlanError(f"{config} requires {', '.join(missing)}, which {target} ({hw.source.path}) lacks: not served there")
    tune: Tune = cfg.tune
    if cfg.models and model is None:
        model = tree.project.default_model if tree.project.default_model in cfg.models else cfg.models[0]
    if not cfg.models:
        model = None
    policy = chain(cfg, hw)
    assert policy is not None  # resolve() passed for the tree
    dims = cfg.dims if cfg.dims is not None else tune.spec.dims
    assert dims is not None  # load_tune checked
    problems = [tuple(s) for s in (shapes if shapes is not None else tune.spec.shapes)]
    for s in problems:
        if len(s) != len(dims):
            raise PlanError(f"shape {'x'.join(map(str, s))}: give one value per dimension ({', '.join(dims)})")
    slots = _slots(policy)
    by_bucket: dict[str, list[tuple[int, ...]]] = {}
    for s in problems:
        slot = next(sl for sl in slots if in_bucket(sl.bounds, dims, s))
        if s not in by_bucket.setdefault(slot.name, []):
            by_bucket[slot.name].append(s)
    spaces = (space,) if space is not None else tune.spaces
    _check_size(
        cfg, [sl.name for sl in slots if sl.name in by_bucket], spaces, "--space" if space is not None else None
    )
    bplans = [
        _bucket_plan(tree, target, cfg, sl, tuple(by_bucket[sl.name]), spaces, model)
        for sl in slots
        if sl.name in by_bucket
    ]
    size = chunk or tune.spec.chunk
    per_bucket = [
        [(b.name, tuple(c.key for c in b.candidates[j : j + size])) for j in range(0, len(b.candidates), size)]
        for b in bplans
    ]
    chunks = tuple(
        Chunk(i, name, keys)
        for i, (name, keys) in enumerate(x for row in itertools.zip_longest(*per_bucket) for x in row if x is not None)
    )
    spec = tune.spec
    params = dict(spec.params)
    if spec.model_params:
        name = model or tree.project.default_model
        if name is None or name not in tree.models:
            raise PlanError(f"{config}'s tune reads model fields ({', '.join(spec.model_params)}): pass --model")
        mspec = tree.models[name].spec
        for field in spec.model_params:
            value = getattr(mspec, field, None)
            if value is None:
                raise PlanError(f"model {name} has no {field}, which {config}'s tune hands its harness")
            params[field] = value
    core: dict[str, Any] = dict(
        config=config,
        target=target,
        variant=spec.variant,
        model=model,
        dims=tuple(dims),
        dtype=dtype or spec.dtype,
        harness=spec.harness or _family_harness(tree, config),
        rounds=rounds or spec.rounds,
        tolerance=spec.tolerance,
        params=FrozenMap(params),
    )
    fingerprint = _digest(
        [
            dict(core, params=params),
            [[b.name, b.shapes, b.incumbent.key, dict(b.incumbent.record)] for b in bplans],
            [[c.index, c.bucket, c.keys] for c in chunks],
        ]
    )
    return Plan(
        **core,
        budget_s=budget_s or spec.budget_s,
        buckets=tuple(bplans),
        idle=tuple(sl.name for sl in slots if sl.name not in by_bucket),
        chunks=chunks,
        policy=policy.label,
        backend=spec.backend,
        fingerprint=fingerprint,
    )


# The most records (candidates x the config's variants) a plan resolves and checks.  Each takes
# about a millisecond to resolve, so a plan at the cap takes a second or two, and 1,000 candidates
# take about ten minutes to time on an H200.  A space past it is a slip (an axis too many) or wants
# --buckets and fewer values.
MAX_RECORDS = 2000


def _family_harness(tree: SpecTree, config: str) -> str:
    """``policy_runtime.<module>:FAMILY`` of the module that reads ``config`` (its family's
    ``tune`` is the harness): a spec that names no harness of its own."""
    readers = [m.name for m in tree.modules if config in m.spec.reads]
    if not readers:
        raise PlanError(f"{config}'s tune names no harness and no module reads {config}: no family to ask for one")
    return f"policy_runtime.{readers[0]}:FAMILY"


def _check_size(cfg: Config, buckets: Sequence[str], spaces: Sequence[TuneSpace], option: str | None) -> None:
    """Refuse, before resolving anything, a plan of more than MAX_RECORDS records: the product
    of each space's axes, times the buckets (with shapes) it applies to, times the variants."""
    parts = []
    total = 0
    for sp in spaces:
        applies = [b for b in buckets if sp.buckets is None or b in sp.buckets]
        if not applies:
            continue
        product = math.prod(len(v) for v in sp.axes.values())
        total += product * len(applies)
        axes = " x ".join(f"{name} {len(v)}" for name, v in sp.axes.items())
        where = "" if option else f"space {sp.name} ({cfg.source.where(sp.keypath)}): "
        text = f"{where}{axes} = {product:,} in each of {len(applies)} bucket(s) ({', '.join(applies)})"
        parts.append((product * len(applies), text))
    records = total * len(cfg.variants)
    if records <= MAX_RECORDS:
        return
    parts.sort(key=lambda p: -p[0])
    raise PlanError(
        f"{option or cfg.name + '.tune'}: the search space is too large to plan: {total:,} candidates ({'; '.join(t for _, t in parts)}) "
        f"x {len(cfg.variants)} variant(s) = {records:,} records to resolve and check, over the cap of "
        f"{MAX_RECORDS:,} (each takes about 1 ms to check, so a plan stays within a second or two, and 1,000 "
        "candidates take about 10 minutes to time on an H200): give fewer values, or name --buckets"
    )


# The one "bucket" of a config that is not bucketed: its policy's record.
PLAIN = "policy"


@dataclass(frozen=True)
class _Slot:
    """What a candidate changes: a bucket of the policy, or (PLAIN) the policy's own values."""

    name: str
    bounds: tuple[Bound, ...]
    values: Mapping[str, Value]
    policy: Policy
    index: int | None  # the bucket's position; None for PLAIN

    def with_values(self, values: Mapping[str, Value]) -> Policy:
        """The policy with ``values`` in this slot; of a bucketed policy, only this bucket (each
        bucket's record is resolved and checked on its own, so the others need not be: a
        candidate costs one record per variant, not one per bucket)."""
        merged: FrozenMap[str, Any] = FrozenMap({**self.values, **values})
        if self.index is None:
            return replace(self.policy, values=merged)
        buckets = self.policy.buckets
        assert buckets is not None
        return replace(self.policy, buckets=(replace(buckets[self.index], values=merged),))

    def record(self, resolved: Any) -> Any:
        return resolved.record if self.index is None else resolved.buckets[0].record


def _slots(policy: Policy) -> list[_Slot]:
    if policy.buckets is None:
        return [_Slot(PLAIN, (), policy.values, policy, None)]
    return [_Slot(b.name, b.bounds, b.values, policy, i) for i, b in enumerate(policy.buckets)]


def _bucket_plan(
    tree: SpecTree,
    target: str,
    cfg: Config,
    slot: _Slot,
    shapes: tuple[tuple[int, ...], ...],
    spaces: Sequence[TuneSpace],
    model: str | None,
) -> BucketPlan:
    assert cfg.tune is not None
    variant = cfg.tune.spec.variant
    mine = [s for s in spaces if s.buckets is None or slot.name in s.buckets]
    axes_fields = [f for f in cfg.fields if any(f in s.axes for s in mine)]

    def resolve(values: Mapping[str, Value]) -> tuple[FrozenMap | None, str]:
        pol = slot.with_values(values)
        records = {}
        for v in sorted(cfg.variants):
            r, problems = resolve_target(tree, cfg, v, target, model, pol, hints=False)
            if r is None:
                first = problems[0].rule if problems else "no record"
                return None, first + ("" if len(cfg.variants) == 1 else f" [variant {v}]")
            records[v] = FrozenMap(slot.record(r))
        return FrozenMap(records), ""

    inc_records, why = resolve({})
    if inc_records is None:
        raise PlanError(f"the incumbent of bucket {slot.name} does not resolve: {why}")
    inc_written: FrozenMap[str, Any] = FrozenMap(
        {f: written_value(slot.values[f]) for f in axes_fields if f in slot.values}
    )
    incumbent = Candidate(
        _digest([INCUMBENT, dict(inc_records[variant])]),
        slot.name,
        inc_written,
        inc_records[variant],
        inc_records,
        INCUMBENT,
    )
    seen = {inc_records}
    candidates = []
    rejected = []
    for space in mine:
        names = list(space.axes)
        for combo in itertools.product(*(space.axes[n] for n in names)):
            values = dict(zip(names, combo))
            written: FrozenMap[str, Any] = FrozenMap({f: written_value(values[f]) for f in cfg.fields if f in values})
            records, why = resolve(values)
            if records is None:
                rejected.append((" ".join(f"{k}={_short(v)}" for k, v in written.items()), why))
                continue
            if records in seen:
                continue
            seen.add(records)
            key = _digest([slot.name, dict(records[variant]), dict(written)])
            candidates.append(Candidate(key, slot.name, written, records[variant], records, space.name))
    candidates.sort(key=lambda c: hashlib.sha256(c.key.encode()).hexdigest())
    return BucketPlan(slot.name, shapes, incumbent, tuple(candidates), tuple(rejected))
