"""The records that pass between the compiler's stages, in one place.

Rules every record here follows (in the spirit of torchgen/model.py):

* Frozen all the way down: dataclasses with ``frozen=True`` whose fields are
  tuples, ``FrozenMap``s, frozen pydantic specs or other such records; nothing a
  later stage can change in place.
* One class per kind of value: a policy value is a ``LiteralValue``, an
  ``ExprValue`` or a ``PickValue``, never one record with optional fields.
* Every entry knows where it came from: a ``Source`` (the spec file) and a key
  path in it, so a problem found in any stage names file, line and key.
* Ordered for determinism: every tuple is sorted by a stated key.

Stages: load (specs -> ``SpecTree``), resolve (``SpecTree`` -> ``Resolution``);
render and write have their own small records (``render.GeneratedFile``,
``write.Plan``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import rules
from .errors import KeyPath, SpecProblem, problem
from .frozen import FrozenMap, frozen
from .models import (
    CheckSpec,
    FieldSpec,
    HardwareSpec,
    ModelSpec,
    ModuleSpec,
    ProvenanceSpec,
    SelectorSpec,
    TuneSpec,
    VendorSpec,
)
from .source import locate

__all__ = ["FrozenMap", "frozen"]  # re-exported: the stages build records with them


# ---------------------------------------------------------------------------
# Spec files


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


# ---------------------------------------------------------------------------
# Stage 1, load: the spec tree


@dataclass(frozen=True)
class Vendor:
    name: str  # file stem: the vendor's name in hardware specs and policies
    spec: VendorSpec
    source: Source


@dataclass(frozen=True)
class Module:
    """A generated module a spec tree declares: generated/<name>.py."""

    name: str
    spec: ModuleSpec
    source: Source


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
class LiteralValue:
    """A policy value written as a literal: ``block_n = 64``."""

    keypath: KeyPath
    value: Any


@dataclass(frozen=True)
class ExprValue:
    """A value computed per target: ``num_stages = { expr = "2 if hw.async_copy else 1" }``."""

    keypath: KeyPath
    expr: rules.Expr


@dataclass(frozen=True)
class PickValue:
    """The first candidate, in order, for which ``where`` holds with the field bound to it:
    ``{ largest = [128, 64], where = "..." }``.  ``where`` may read derived values that read
    the field; they are evaluated per candidate."""

    keypath: KeyPath
    where: rules.Expr
    candidates: tuple[int, ...]


Value = LiteralValue | ExprValue | PickValue


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
    # Every field: the bucket's own values over its policy's (chained) values, and over those
    # the values of an ``amend`` of a policy that chains from the bucket's.
    values: FrozenMap[str, Value]
    keypath: KeyPath
    # Where the values were measured (written by ``codegen tune``); None where nobody said.
    provenance: ProvenanceSpec | None = None


@dataclass(frozen=True)
class Policy:
    """One threshold of a config: it serves its vendor from min_arch up to max_arch (or the next
    threshold), only the named targets when ``targets`` is set.  ``values`` holds every field:
    what the policy sets over what the policy it chains from sets (down to the base policy and
    the fields' defaults), so a policy states only what differs."""

    vendor: str | None  # None: the base policy
    min_arch: int | None
    max_arch: int | None
    targets: tuple[str, ...] | None  # hardware spec names; None: every target of the vendor
    note: str
    values: FrozenMap[str, Value]  # for bucketed configs: the defaults its buckets start from
    buckets: tuple[Bucket, ...] | None
    keypath: KeyPath
    # The policy it chains from (its values are the defaults of this one's); None for the base.
    parent: str | None = None
    # False where the values were not measured on the parts it serves (``tuned = false``; a
    # policy's own key, not inherited): build and show name the targets such policies serve.
    tuned: bool = True
    provenance: ProvenanceSpec | None = None

    @property
    def label(self) -> str:
        if self.vendor is None:
            return "base"
        upper = f"..{self.max_arch}" if self.max_arch is not None else ""
        only = f"[{','.join(self.targets)}]" if self.targets else ""
        return f"{self.vendor}>={self.min_arch}{upper}{only}"


@dataclass(frozen=True)
class Check:
    spec: CheckSpec
    rule: rules.Expr
    when: rules.Expr | None
    keypath: KeyPath


@dataclass(frozen=True)
class TuneSpace:
    """One region of a config's search space, its axes parsed as policy values."""

    name: str
    doc: str
    buckets: tuple[str, ...] | None  # None: every bucket
    axes: FrozenMap[str, tuple[Value, ...]]  # field -> values to try, in the order written
    keypath: KeyPath


@dataclass(frozen=True)
class Tune:
    """``[<config>.tune]``: how ``codegen tune`` measures a family (``models.TuneSpec``)."""

    spec: TuneSpec
    spaces: tuple[TuneSpace, ...]
    keypath: KeyPath


@dataclass(frozen=True)
class Config:
    """One config table of a kernel spec file, validated, with its extends chain merged."""

    name: str
    record: str  # the generated class
    doc: str
    source: Source
    # The models it is resolved for (each seen by the rules as ``model``), sorted; () when no
    # rule reads ``model.*`` (resolved once).
    models: tuple[str, ...]
    fields: FrozenMap[str, FieldSpec]  # in record order
    dims: tuple[str, ...] | None  # bucket dimensions; None for a plain config
    aliases: FrozenMap[str, str]  # extra dispatch name -> variant
    variants: FrozenMap[str, FrozenMap[str, Any]]  # variant name -> parameters
    derived: FrozenMap[str, rules.Expr]
    checks: tuple[Check, ...]
    policies: tuple[Policy, ...]  # sorted by (vendor, min_arch, targets)
    base: Policy | None
    selector: SelectorSpec | None = None  # a seed-style selector function for dispatch.py
    constants: FrozenMap[str, str] = FrozenMap()  # module constant -> dispatch name
    tune: Tune | None = None  # how codegen tune measures it; None: not tunable
    # Models it does not serve, without a ``models`` list, for want of fields its rules read:
    # (model, missing fields); the build's summary names them.
    unserved: tuple[tuple[str, tuple[str, ...]], ...] = ()
    requires: tuple[str, ...] = ()  # hardware features a target must have to be served

    @property
    def bucketed(self) -> bool:
        return self.dims is not None


@dataclass(frozen=True)
class Project:
    """specs/project.toml, resolved: the default target and model (None where there is none)."""

    default_target: str | None
    default_model: str | None
    source: Source | None  # None when the tree has no project.toml


@dataclass(frozen=True)
class SpecTree:
    root: Path
    project: Project
    vendors: FrozenMap[str, Vendor]
    modules: tuple[Module, ...]  # sorted by name
    hardware: tuple[Hardware, ...]  # sorted by (vendor, arch, name)
    models: FrozenMap[str, Model]
    configs: tuple[Config, ...]  # sorted by name

    def config(self, name: str) -> Config:
        for cfg in self.configs:
            if cfg.name == name:
                return cfg
        raise KeyError(name)

    @property
    def files(self) -> tuple[str, ...]:
        paths = [self.project.source.path] if self.project.source is not None else []
        paths += [v.source.path for v in self.vendors.values()]
        paths += [m.source.path for m in self.modules]
        paths += [h.source.path for h in self.hardware]
        paths += [m.source.path for m in self.models.values()]
        paths += [p for c in self.configs for p in c.source.paths]
        return tuple(sorted(set(paths)))


# ---------------------------------------------------------------------------
# Stage 2, resolve: values per target, collapsed

Record = tuple[tuple[str, Any], ...]  # (field, value) in declared field order


@dataclass(frozen=True)
class ResolvedBucket:
    name: str
    note: str
    bounds: tuple[Bound, ...]
    record: Record

    @property
    def key(self) -> tuple:
        return (self.name, self.bounds, self.record)


@dataclass(frozen=True)
class Resolved:
    """One config variant on one target."""

    target: str
    policy: Policy
    record: Record | None  # plain configs
    buckets: tuple[ResolvedBucket, ...] | None  # bucketed configs

    @property
    def key(self) -> tuple:
        """What makes two targets share an instantiation: the values, not where they came from."""
        if self.buckets is not None:
            return tuple(b.key for b in self.buckets)
        return self.record  # type: ignore[return-value]


@dataclass(frozen=True)
class Instantiation:
    """A group of targets of one vendor with equal resolved values."""

    suffix: str  # "nvidia_3fa2c1": vendor and digest of the values (no arch: names never move)
    vendor: str
    arch: int
    targets: tuple[str, ...]  # sorted by (arch, name)
    policies: tuple[str, ...]  # labels of the policies the members chained to
    value: Resolved  # the member with the lowest arch (all members' keys are equal)


@dataclass(frozen=True)
class VariantResolution:
    config: Config
    variant: str
    model: str | None  # the model it was resolved for; None for a config that reads no model
    params: FrozenMap[str, Any]
    resolved: FrozenMap[str, Resolved]  # target name -> resolution, in target order
    instantiations: tuple[Instantiation, ...]  # sorted by (vendor, arch, suffix)
    target_instantiation: FrozenMap[str, str]  # target name -> instantiation suffix
    # target name -> the required features it lacks (``Config.requires``): not resolved, not served
    unserved: FrozenMap[str, tuple[str, ...]] = FrozenMap()


@dataclass(frozen=True)
class Resolution:
    tree: SpecTree
    variants: tuple[VariantResolution, ...]  # sorted by (config name, variant name, model)

    def for_config(self, name: str) -> tuple[VariantResolution, ...]:
        return tuple(v for v in self.variants if v.config.name == name)
