"""The spec data model: what a TOML file under specs/ may say (README: "Layout", "Writing a policy").

Every model is frozen, forbids unknown keys (a misspelt key is an error naming the file and key
path) and takes strict scalars (``"64"`` is not an int, ``true`` is not 1).  Units live in field
names (``_bytes``, ``_gbps``).  A hardware number cites its public source; a policy value is a
literal or a rule evaluated per target (``rules.py``).  Nothing here knows files or lines
(``load.py`` attaches them).  Text the templates print is held to what is safe there: a doc or
note is one line without control characters (``DocText``), a name an identifier, not a keyword.

Six kinds of spec file: ``specs/project.toml`` -> ``ProjectSpec``; ``specs/vendors/<name>.toml``
-> ``VendorSpec``; ``specs/hardware/<name>.toml`` -> ``HardwareSpec`` (``<name>`` keys the target
everywhere: ``HARDWARE["bi_v100"]``); ``specs/models/<name>.toml`` -> ``ModelSpec``;
``specs/kernels/<file>.toml`` -> one or more ``ConfigSpec`` tables (record fields, variants,
checks, policies per vendor and arch threshold); ``specs/modules/<name>.toml`` -> ``ModuleSpec``.
"""

from __future__ import annotations

import keyword
import re
import unicodedata
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)

from .frozen import frozen

IDENT = r"^[a-z][a-z0-9_]*$"
Ident = Annotated[str, Field(pattern=IDENT)]
PosInt = Annotated[StrictInt, Field(gt=0)]


def Upto(limit: int) -> Any:
    """A positive integer no larger than ``limit``: a figure with a physical range (a part with
    more than 2**20 threads per block is a typo, and would reach generated code as one)."""
    return Annotated[StrictInt, Field(gt=0, le=limit)]


KIB, GIB, TIB = 2**10, 2**30, 2**40


def is_line_break(ch: str) -> bool:
    """A character str.splitlines() breaks on (\\n, \\r, \\x85, \\u2028, ...)."""
    return len((ch + "x").splitlines()) > 1


def is_control(ch: str) -> bool:
    """A control character other than tab."""
    return unicodedata.category(ch) == "Cc" and ch != "\t"


def text_problem(text: str) -> str | None:
    """Why ``text`` is not a valid doc or note, or None.  Docs and notes are one line of text
    (any characters but line breaks and control characters; a tab is allowed): generated code
    carries them as one-line comments and docstrings (render.py escapes backslashes and
    triple quotes there), and a spec reads the same whether or not a note is printed."""
    if text.isprintable():  # the common case: no line break or control character (both unprintable)
        return None
    if any(is_line_break(ch) for ch in text):
        return "must be one line (it has a line break)"
    bad = next((ch for ch in text if is_control(ch)), None)
    if bad is not None:
        return f"must not contain control characters (it has {bad!r})"
    return None


def _one_line(text: str) -> str:
    why = text_problem(text)
    if why is not None:
        raise ValueError(why)
    return text


# A doc or note: printed as it is into a generated comment or docstring.
DocText = Annotated[StrictStr, AfterValidator(_one_line)]


def _not_keyword(name: str) -> str:
    if keyword.iskeyword(name):
        raise ValueError(f"{name!r} is a Python keyword; the name must be usable as a Python identifier")
    return name


NotKeyword = AfterValidator(_not_keyword)


# A record field: an attribute and a keyword argument in generated code.  (Soft keywords such
# as 'match' are valid identifiers.)
FieldName = Annotated[str, Field(pattern=IDENT), NotKeyword]


# What a spec model keeps of a table it stores: an immutable copy (records hold these models).
Frozen = AfterValidator(frozen)


class Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ---------------------------------------------------------------------------
# Vendors


class VendorSpec(Spec):
    """``specs/vendors/<name>.toml``: what detection needs to know of a vendor's devices.

    Arch numbers are the vendor's own; this says how a device's report becomes one.
    """

    display_name: StrictStr
    # How torch's report of a device becomes this vendor's arch number:
    #   "capability": 10 * major + minor of torch.cuda.get_device_capability (NVIDIA 9.0 -> 90).
    #   "gfx": the number in the device's gcnArchName ("gfx942:sramecc+:xnack-" -> 942; a
    #          stepping letter counts as its hex digit: "gfx90a" -> 910).
    arch_from: Literal["capability", "gfx"]
    # Whole words (any case) in a device name that identify the vendor when no hardware spec's
    # device_names matched ("Instinct", "Radeon").
    name_words: tuple[Annotated[StrictStr, Field(min_length=1)], ...] = ()
    # True for the vendor a device name without any vendor's words is taken to be (at most one).
    default: StrictBool = False
    # True if the vendor's devices appear through torch's ROCm (HIP) build: a process on a HIP
    # build of torch sees only such vendors.
    hip: StrictBool = False


# ---------------------------------------------------------------------------
# Hardware


class Features(Spec):
    """Architectural features that select kernel structure, not just sizes."""

    async_copy: StrictBool = Field(
        description="Async global->shared copies (cp.async, Ampere+): what num_stages > 1 relies on."
    )
    tma: StrictBool = Field(description="Tensor Memory Accelerator bulk copies (Hopper+): tensor descriptors.")
    wgmma: StrictBool = Field(description="Warpgroup MMA (sm_90a): Triton's Hopper tensor-core path.")
    tcgen05: StrictBool = Field(description="5th-generation tensor core instructions with tensor memory (sm_100).")
    clusters: StrictBool = Field(
        description="Thread block clusters usable from Triton (broken on sm_121, Triton #8335)."
    )
    # FP8 formats the part's tensor cores compute in (configs ``requires`` them).  False unless the
    # spec says so: a spec that predates them claims no FP8.
    fp8_e4m3fn: StrictBool = Field(
        default=False, description="FP8 e4m3fn (OCP E4M3) tensor-core inputs (torch.float8_e4m3fn)."
    )
    fp8_e5m2: StrictBool = Field(
        default=False, description="FP8 e5m2 (OCP E5M2) tensor-core inputs (torch.float8_e5m2)."
    )
    fp8_e4m3fnuz: StrictBool = Field(
        default=False, description="FP8 e4m3fnuz (exponent bias 8, no negative zero) tensor-core inputs (torch.float8_e4m3fnuz)."
    )
    fp8_e5m2fnuz: StrictBool = Field(
        default=False, description="FP8 e5m2fnuz (exponent bias 16, no negative zero) tensor-core inputs (torch.float8_e5m2fnuz)."
    )


def _doc(text: str) -> Any:
    """A field's description: why it exists.  The generated HardwareCapability prints it as the
    comment above the field, so the field list and its comments have one source (this model)."""
    return Field(description=text)


class HardwareSpec(Spec):
    """One target part.  Field names (and order) of the seed's HardwareCapability come first;
    the generated ``HardwareCapability`` has exactly these fields (``HW_RECORD_FIELDS``)."""

    display_name: StrictStr = _doc("Marketing name of the part.")
    # A vendor of specs/vendors/ (load.py checks it): arch numbers are per vendor and never
    # compared across vendors (iluvatar 100, the BI-V100, and nvidia 100, the B200, never meet).
    vendor: Ident = _doc("Vendor spec name (specs/vendors/<vendor>.toml).")
    # The vendor's own architecture number (NVIDIA: 10*major + minor of the compute capability;
    # AMD: the gfx target's number; Iluvatar: its own numbering).  Policies chain on it.
    arch: Upto(10**6) = _doc("Vendor's own architecture number; policies chain on it.")
    warp_size: Upto(1024) = _doc("Threads per warp (wavefront).")
    max_threads_per_block: Upto(2**20) = _doc("Most threads in one block.")
    max_shared_memory_per_block: Upto(GIB) = _doc("Shared memory a block gets without opt-in.")
    max_registers_per_thread: Upto(2**16) = _doc("Registers one thread may use.")
    # None where the vendor publishes no figure (GB10); no rule may then read it.
    l2_cache_size_bytes: Upto(TIB) | None = Field(
        default=None, description="L2 cache size; None where the vendor publishes none."
    )
    memory_bandwidth_gbps: Upto(10**7) = _doc("Peak memory bandwidth (datasheet).")
    sm_count: Upto(2**20) = _doc("Streaming multiprocessors (compute units).")
    # CCCL's arch_to_min_bytes_in_flight for NVIDIA; measured for BI-V100.
    bytes_in_flight: Upto(GIB) = _doc(
        "Bytes each SM keeps in flight to saturate memory (CCCL's arch_to_min_bytes_in_flight)."
    )
    # Triton opts in automatically: the limit a Triton kernel's tiles must fit.
    max_shared_memory_per_block_optin: Upto(GIB) = _doc(
        "Shared memory a block may opt in to: the limit Triton kernels fit."
    )
    shared_memory_per_sm: Upto(GIB) = _doc("Shared memory per SM.")
    max_threads_per_sm: Upto(2**24) = _doc("Resident threads per SM; bounds occupancy.")
    # detect_hardware matches them before falling back to the arch.
    device_names: tuple[Annotated[StrictStr, Field(min_length=1)], ...] = _doc(
        "Whole-word, case-insensitive substrings of the driver's device name that identify this part."
    )
    features: Features
    # Where the numbers come from: key -> citation ("CCG" -> "CUDA C++ Programming Guide, ...").
    sources: Annotated[dict[UpperIdent, DocText], Frozen] = Field(min_length=1)
    # Numeric field -> the keys of its sources ("CCG DEV"), or "measured: <how>" / "inferred:
    # <why>".  load.py checks that every number is cited and every citation resolves.
    cite: Annotated[dict[FieldName, DocText], Frozen]

    @model_validator(mode="after")
    def _consistent(self) -> "HardwareSpec":
        if self.max_shared_memory_per_block_optin < self.max_shared_memory_per_block:
            raise ValueError(
                "max_shared_memory_per_block_optin must be >= max_shared_memory_per_block "
                f"({self.max_shared_memory_per_block_optin} < {self.max_shared_memory_per_block})"
            )
        if self.shared_memory_per_sm < self.max_shared_memory_per_block_optin:
            raise ValueError("shared_memory_per_sm must be >= max_shared_memory_per_block_optin")
        if self.max_threads_per_sm < self.max_threads_per_block:
            raise ValueError("max_threads_per_sm must be >= max_threads_per_block")
        if self.max_threads_per_block % self.warp_size:
            raise ValueError("max_threads_per_block must be a multiple of warp_size")
        return self


# The generated HardwareCapability's fields, in order: (record field, type, comment), from the
# model above (``arch`` keeps the seed's name ``arch_version``; features are flattened).  The
# template prints this list; nothing else spells the field list out.
_RECORD_NAMES = {"arch": "arch_version"}
_PY_TYPES = {"display_name": "str", "vendor": "str", "device_names": "tuple[str, ...]"}


# The seed's fields first, in its order, so its positional and keyword arguments both fit; the
# spec's identity (name, display name, device names) last.
_RECORD_LAST = ("device_names", "display_name")
# Where the figures come from: checked at load, printed by `show --sources`, not generated.
_NOT_RECORDED = ("features", "sources", "cite")


def _record_fields() -> tuple[tuple[str, str, str, str], ...]:
    out = []
    for attr, info in HardwareSpec.model_fields.items():
        if attr in _NOT_RECORDED or attr in _RECORD_LAST:
            continue
        pytype = "Optional[int]" if attr == "l2_cache_size_bytes" else _PY_TYPES.get(attr, "int")
        out.append((attr, _RECORD_NAMES.get(attr, attr), pytype, info.description or ""))
    for attr, info in Features.model_fields.items():
        out.append((attr, attr, "bool", info.description or ""))
    for attr in _RECORD_LAST:
        out.append((attr, attr, _PY_TYPES[attr], HardwareSpec.model_fields[attr].description or ""))
    out.append(("name", "name", "str", "Spec name (file stem): the key of HARDWARE and of every dispatch table."))
    return tuple(out)


# What rules read as ``hw.<attr>``: every number and flag of the part (its features
# flattened), its spec name and a derived figure; not its display name or device names.
# ``load.py`` accepts exactly these attributes and ``resolve.py`` builds exactly this
# namespace (``hw_rule_namespace``), so a rule that loads can be evaluated.
_HW_NOT_IN_RULES = ("display_name", "device_names", "features", "sources", "cite")
HW_RULE_ATTRS: tuple[str, ...] = tuple(
    sorted(
        (set(HardwareSpec.model_fields) - set(_HW_NOT_IN_RULES))
        | set(Features.model_fields)
        | {"name", "bandwidth_per_sm_gbps"}
    )
)
HW_RECORD_FIELDS = _record_fields()
# The numbers of a hardware spec: each must be cited (``HardwareSpec.cite``).
HW_NUMBERS: tuple[str, ...] = tuple(
    attr for attr, _, pytype, _ in HW_RECORD_FIELDS if pytype in ("int", "Optional[int]")
)
CITE_REASONS = ("measured", "inferred")


def hw_rule_namespace(name: str, spec: HardwareSpec) -> dict[str, Any]:
    """The ``hw`` namespace of rules for the target ``name``: exactly HW_RULE_ATTRS."""
    flat = {attr: getattr(spec, attr) for attr in HardwareSpec.model_fields if attr not in _HW_NOT_IN_RULES}
    flat.update({attr: getattr(spec.features, attr) for attr in Features.model_fields})
    flat["name"] = name
    flat["bandwidth_per_sm_gbps"] = spec.memory_bandwidth_gbps / spec.sm_count
    return {attr: flat[attr] for attr in HW_RULE_ATTRS}


# ---------------------------------------------------------------------------
# Models (the network a policy is tuned for)


UpperIdent = Annotated[str, Field(pattern=r"^[A-Z][A-Z0-9_]*$")]


class ModelSpec(Spec):
    """``specs/models/<name>.toml``: the dimensions policies are computed for.  A small required
    core every transformer has; MoE and serving fields only where the model has them.  A rule
    that reads a field the model lacks is a build error naming the model, the rule and the field.
    """

    display_name: StrictStr
    # Core: attention and MLP shapes.
    head_dim: Upto(2**16)
    num_heads: Upto(2**16)
    num_kv_heads: Upto(2**16)
    hidden_size: Upto(2**24)
    intermediate_size: Upto(2**24)
    max_seq_len: Upto(2**31)
    # Mixture of experts (None: a dense model).
    num_experts: Upto(2**20) | None = None
    top_k: Upto(2**20) | None = None
    moe_intermediate_size: Upto(2**24) | None = None
    # Serving: concurrent sequences the server runs (vLLM --max-num-seqs).  Default 1: one
    # sequence at a time, as the seed's deployment; a selector called with other dimensions
    # computes with it too (select_moe_config has no such parameter).
    max_num_seqs: Upto(2**24) = Field(
        default=1,
        description="Concurrent sequences the server runs (vLLM --max-num-seqs); default 1 (one at a time, as the seed).",
    )
    # Attention features (defaults: not used).  sliding_window: the keys a query sees on the
    # model's local layers, itself included (HF config's ``sliding_window``; flash-attn's
    # window_size (sliding_window - 1, 0)); logit_softcap: attention scores become
    # softcap * tanh(scores / softcap) (Gemma 2's ``attn_logit_softcapping``); attention_sinks: a
    # learned per-head logit in the softmax denominator (gpt-oss); alibi: ALiBi position biases
    # (BLOOM, MPT) in place of rotary embeddings.
    sliding_window: Upto(2**31) | None = None
    logit_softcap: Annotated[StrictFloat, Field(gt=0, allow_inf_nan=False)] | None = None
    attention_sinks: StrictBool = False
    alibi: StrictBool = False
    # MoE routing (models with experts; defaults: softmax over the experts' logits, top_k of them,
    # SiLU-gated experts).  moe_scoring: "softmax" or "sigmoid" (DeepSeek-V3) scores;
    # moe_score_bias: a learned per-expert bias added to the scores for the choice only
    # (DeepSeek-V3's e_score_correction_bias); moe_num_expert_group / moe_topk_group: the experts
    # in groups, top_k chosen within the best moe_topk_group groups; moe_routed_scaling_factor:
    # the routed experts' weights scaled by it; moe_activation: the experts' gate activation
    # ("silu", "gelu", or "swigluoai": gpt-oss's clamped SwiGLU; fused_moe's activations).
    moe_scoring: Literal["softmax", "sigmoid"] = "softmax"
    moe_score_bias: StrictBool = False
    moe_num_expert_group: Upto(2**20) | None = None
    moe_topk_group: Upto(2**20) | None = None
    moe_routed_scaling_factor: Annotated[StrictFloat, Field(gt=0, allow_inf_nan=False)] | None = None
    moe_activation: Literal["silu", "gelu", "swigluoai"] = "silu"
    # Module constants generated/dispatch.py defines for this model: ``<prefix>_<FIELD>`` for
    # every field the model sets (``QWEN36_HEAD_DIM``), under the name ``constant_names`` gives
    # where it gives one (``hidden_size = "HIDDEN"``: ``QWEN36_HIDDEN``).  None: no constants.
    constant_prefix: UpperIdent | None = None
    constant_names: Annotated[dict[FieldName, UpperIdent], Frozen] = Field(default={}, validate_default=True)

    @model_validator(mode="after")
    def _moe_complete(self) -> "ModelSpec":
        if (self.num_experts is None) != (self.top_k is None):
            raise ValueError("num_experts and top_k go together: a model with experts sets both, a dense model neither")
        if self.top_k is not None and self.num_experts is not None and self.top_k > self.num_experts:
            raise ValueError(f"top_k ({self.top_k}) must be <= num_experts ({self.num_experts})")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        unknown = sorted(set(self.constant_names) - set(MODEL_DIMENSIONS))
        if unknown:
            raise ValueError(f"constant_names names no dimension: {', '.join(unknown)}")
        routing = [f for f in MODEL_EXPERT_FEATURES if f in self.model_fields_set]
        if routing and self.num_experts is None:
            raise ValueError(f"{', '.join(routing)}: routing fields need num_experts and top_k")
        groups_name, topk_name = "moe_num_expert_group", "moe_topk_group"
        groups, topk_groups = getattr(self, groups_name), getattr(self, topk_name)
        if (groups is None) != (topk_groups is None):
            raise ValueError(f"{groups_name} and {topk_name} go together: grouped routing sets both")
        if groups is not None and topk_groups is not None:
            if self.num_experts is not None and self.num_experts % groups:
                raise ValueError(f"num_experts ({self.num_experts}) must be a multiple of {groups_name} ({groups})")
            if topk_groups > groups:
                raise ValueError(f"{topk_name} ({topk_groups}) must be <= {groups_name} ({groups})")
        return self


# The dimensions: what rules may read as ``model.<attr>`` (a model sets all of the core and
# may leave the rest unset).
MODEL_DIMENSIONS: tuple[str, ...] = (
    "head_dim",
    "num_heads",
    "num_kv_heads",
    "hidden_size",
    "intermediate_size",
    "max_seq_len",
    "num_experts",
    "top_k",
    "moe_intermediate_size",
    "max_num_seqs",
)
# The features: attention and MoE routing choices, each with a default meaning "not used"
# (None, False, or the plain kind: softmax scoring, SiLU).  A model's features are those that
# differ from the default: generated/dispatch.py's MODEL_DIMS carries them beside the
# dimensions, so warm-up compiles the kernel specializations they select, and rules may read them.
# The routing features (models with experts only).
MODEL_EXPERT_FEATURES: tuple[str, ...] = (
    "moe_scoring",
    "moe_score_bias",
    "moe_num_expert_group",
    "moe_topk_group",
    "moe_routed_scaling_factor",
    "moe_activation",
)
MODEL_FEATURES: tuple[str, ...] = (
    "sliding_window",
    "logit_softcap",
    "attention_sinks",
    "alibi",
) + MODEL_EXPERT_FEATURES
MODEL_RULE_ATTRS: tuple[str, ...] = tuple(sorted(MODEL_DIMENSIONS + MODEL_FEATURES))


def model_features(spec: ModelSpec) -> list[tuple[str, Any]]:
    """The features the model uses (its values that differ from the defaults), in
    MODEL_FEATURES order."""
    fields = type(spec).model_fields
    return [(f, getattr(spec, f)) for f in MODEL_FEATURES if getattr(spec, f) != fields[f].default]


# What a rule reads for a feature the model leaves unset (None in its spec): no window, no
# soft-cap, the experts in one group of which one is chosen (plain top-k), weights unscaled.
FEATURE_OFF: dict[str, Any] = {
    "sliding_window": 0,
    "logit_softcap": 0.0,
    "moe_num_expert_group": 1,
    "moe_topk_group": 1,
    "moe_routed_scaling_factor": 1.0,
}


def feature_default(name: str) -> Any:
    """The value rules read for the feature ``name`` where a model does not use it."""
    return FEATURE_OFF.get(name, ModelSpec.model_fields[name].default)


def model_rule_namespace(spec: ModelSpec) -> dict[str, Any]:
    """The ``model`` namespace of rules: the dimensions the model sets and every feature, those
    it does not use at their FEATURE_OFF value, so a rule that reads a feature serves every model
    (a dense model's routing: softmax, ungrouped)."""
    values = {attr: getattr(spec, attr) for attr in MODEL_DIMENSIONS}
    out = {attr: value for attr, value in values.items() if value is not None}
    out.update((f, feature_default(f)) for f in MODEL_FEATURES)
    out.update(model_features(spec))
    return dict(sorted(out.items()))


# ---------------------------------------------------------------------------
# Kernel configs and policies

FieldType = Literal["int", "float", "bool", "str"]
Scalar = StrictBool | StrictInt | StrictFloat | StrictStr


class FieldSpec(Spec):
    """One field of a generated config record."""

    type: FieldType
    doc: DocText
    # Allowed values (for enumerations such as a kernel kind).
    choices: tuple[Scalar, ...] | None = None
    # The value where no policy in a target's chain sets the field: a literal or a rule
    # (``{ expr = "hw.sm_count if split_k > 1 else 0" }``), so that a derived default is stated
    # once, not written into every policy and checked afterwards.  load.py parses it.
    default: Annotated[Scalar | dict[str, Any] | None, Frozen] = None


class ExprRule(Spec):
    """``{ expr = "..." }``: the value is the expression's value."""

    expr: StrictStr


class PickRule(Spec):
    """``{ largest = [..], where = ".." }`` / ``{ smallest = [..], where = ".." }``.

    The candidates are tried from largest (or smallest) down (or up); the
    first for which ``where`` holds, with the field's own name bound to the
    candidate, is the value.  No candidate holding is an error.
    """

    largest: tuple[StrictInt, ...] | None = Field(default=None, min_length=1)
    smallest: tuple[StrictInt, ...] | None = Field(default=None, min_length=1)
    where: StrictStr

    @model_validator(mode="after")
    def _one_direction(self) -> "PickRule":
        if (self.largest is None) == (self.smallest is None):
            raise ValueError("give exactly one of 'largest' or 'smallest'")
        return self

    @property
    def ordered(self) -> tuple[int, ...]:
        if self.largest is not None:
            return tuple(sorted(self.largest, reverse=True))
        assert self.smallest is not None
        return tuple(sorted(self.smallest))


Rule = ExprRule | PickRule


class CheckSpec(Spec):
    """A condition every resolved record must satisfy on its target."""

    name: StrictStr
    rule: StrictStr
    # Only checked when this holds (e.g. only for buckets that run Triton).
    when: StrictStr | None = None
    # Format string for the failure message; may use {hw.x}, {model.x},
    # params, fields and derived values, e.g. "{smem_bytes:,} B".
    message: StrictStr | None = None


class ProvenanceSpec(Spec):
    """Where a policy's or bucket's values were measured: the table ``codegen tune`` writes next
    to the values it changes (``provenance = { ... }``), so a reader of the spec sees on what
    part, with what software and against what the numbers won, not only a free-text note."""

    tool: StrictStr  # "codegen tune"
    device: StrictStr  # the device name the driver reports ("NVIDIA H200")
    driver: StrictStr
    torch: StrictStr
    triton: StrictStr
    date: Annotated[StrictStr, Field(pattern=r"^\d{4}-\d{2}-\d{2}$")]
    # The problem shapes timed (one value per bucket dimension, "MxNxK"-style).
    shapes: tuple[StrictStr, ...] = Field(min_length=1)
    # Geometric mean over the shapes of (previous config's time / this config's time).
    vs_previous: Annotated[StrictFloat, Field(gt=0)]
    # The same against the vendor library, where the family has one.
    vs_library: Annotated[StrictFloat, Field(gt=0)] | None = None
    # Run-to-run spread of the measurement (the previous config against itself); a winner had to
    # beat the previous config by more than this.
    spread: Annotated[StrictFloat, Field(ge=0)]
    # The values this change replaced, as they were written.
    previous: Annotated[dict[FieldName, Scalar | dict[str, Any]], Frozen] = Field(default={}, validate_default=True)
    command: StrictStr


class TuneBackendSpec(Spec):
    """A field that says who serves a bucket, which the tuner may flip between the vendor library
    and the family's kernel by what it measured."""

    field: FieldName
    library: Scalar  # the value meaning "the vendor library serves"
    kernel: Scalar  # the value written where the kernel beats the library by more than the spread
    # Values the tuner never changes: chosen for reasons it does not measure (host launch time).
    keep: tuple[Scalar, ...] = ()
    # The backend changes only where the kernel takes at least this long (GPU time, on every
    # shape of the bucket): below, a host launch costs as much as the kernel, and the tuner,
    # which times GPU work with the launch off the clock, cannot say who serves a call faster.
    min_kernel_us: Annotated[StrictInt, Field(ge=0)] = 0


class TuneSpaceSpec(Spec):
    """One region of a family's search space: the product of its axes, over the incumbent
    bucket's values for the fields it does not name."""

    name: Ident
    doc: DocText = ""
    # The buckets it applies to (by name); None: every bucket.
    buckets: tuple[Ident, ...] | None = None
    # Field -> the values to try, each a literal or { expr = "..." } (load.py parses them as
    # policy values; the written spec gets them as they are written here).
    axes: Annotated[dict[FieldName, tuple[Scalar | dict[str, Any], ...]], Frozen] = Field(min_length=1)


class TuneSpec(Spec):
    """``[<config>.tune]``: what ``python -m codegen tune <config>`` needs to tune this family;
    no code per family in the tuner."""

    # The family's tuning harness: ordinary Python that builds a problem for a shape and runs a
    # record's kernel, the incumbent's and the library's.  By default the ``tune`` of the family
    # of the module reading this config (``policy_runtime.<module>.FAMILY``); a project whose
    # runtime lives elsewhere names it as "module:attribute".
    harness: Annotated[StrictStr, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$")] | None = None
    # The variant whose records are timed (others are only checked); the harness's dtype.
    variant: Ident
    dtype: Literal["float16", "bfloat16", "float32"] = "bfloat16"
    # The problem's dimensions for a config that is not bucketed (whose one record serves every
    # problem: the policy is tuned as one bucket); a bucketed config's are its bucket dimensions.
    dims: tuple[Ident, ...] | None = None
    # Default problem shapes, one value per dimension in order; each is timed for the bucket that
    # serves it.
    shapes: tuple[tuple[PosInt, ...], ...] = Field(min_length=1)
    # Fixed problem parameters handed to the harness with each shape, and model fields added to
    # them (from --model, else the tree's default model), e.g. a MoE layer's expert count and sizes.
    params: Annotated[dict[Ident, Scalar], Frozen] = Field(default={}, validate_default=True)
    model_params: tuple[Ident, ...] = ()
    # Relative error (Frobenius norm, against the harness's fp32 reference) above which a
    # candidate is disqualified.
    tolerance: Annotated[StrictFloat, Field(gt=0)]
    rounds: PosInt = 6  # interleaved timing rounds per chunk of candidates
    chunk: PosInt = 8  # candidates timed together with the incumbent and the library
    budget_s: PosInt = 900  # default --budget
    backend: TuneBackendSpec | None = None
    space: tuple[TuneSpaceSpec, ...] = Field(min_length=1)


class BucketDims(Spec):
    """Run-time dimensions a bucketed config's buckets may bound."""

    dims: tuple[Annotated[str, Field(pattern=r"^[a-z]$")], ...] = Field(min_length=1)
    doc: DocText


# Keys a config inherits through ``extends``: what its values are and how they are chosen.  Its
# identity (record, doc, variants, aliases) is always its own.
INHERITED_KEYS = ("models", "fields", "derived", "checks", "buckets", "policy", "base", "tune")


class SelectorSpec(Spec):
    """A selector function: its name and parameters (parameter -> what it matches)."""

    name: Annotated[str, Field(pattern=r"^[a-z_][a-z0-9_]*$"), NotKeyword]
    params: Annotated[dict[FieldName, Annotated[str, Field(pattern=r"^(model\.)?[a-z][a-z0-9_]*$")]], Frozen] = Field(
        min_length=1
    )


class ConfigSpec(Spec):
    """One config record and its policies (a top-level table of a kernel file)."""

    # The generated class; render.py also rejects a name the dispatch module itself uses.
    record: Annotated[str, Field(pattern=r"^[A-Z][A-Za-z0-9]*$"), NotKeyword]
    doc: DocText
    # Another config (in any kernel file) whose inheritable keys (INHERITED_KEYS) this one
    # takes where it does not set them; a key set here replaces the inherited one whole.
    # load.py merges before validation, so this model only sees the merged table.
    extends: Ident | None = None
    # The model specs the config is resolved for, each seen by the rules as ``model``.  None:
    # every model of the tree if a rule reads ``model.*``, else none (resolved once).
    models: tuple[Ident, ...] | None = None
    # A seed-style selector function generated/dispatch.py defines for this config (e.g.
    # ``select_attention_config(hw, dtype_size, head_dim, ...)``): its parameters, in order,
    # each matching a variant parameter or a model dimension (``"model.head_dim"``); it looks up
    # the instantiation whose parameters match (no rule runs at call time).
    selector: SelectorSpec | None = None
    # Module constants generated/dispatch.py defines: name -> dispatch name, the record of the
    # default target and model (``ATTENTION_FP16 = "attention_fp16"``).
    constants: dict[UpperIdent, Ident] = {}
    # Names this config is resolved under, each binding parameters the rules
    # see as plain names (e.g. dtype_bytes).  Default: one variant named after
    # the config with no parameters.
    variants: dict[Ident, dict[Ident, Scalar]] | None = None
    # Extra dispatch names for existing variants (e.g. attention -> attention_fp16).
    aliases: dict[Ident, Ident] = {}
    # Hardware features (``Features`` flags, e.g. ``fp8_e4m3fn``) every target must have: a
    # target without one gets no instantiation, the build names it, and the generated entry
    # point raises ValueError naming the target and the feature.
    requires: tuple[Ident, ...] = ()
    fields: dict[FieldName, FieldSpec] = Field(min_length=1)
    # Named intermediate values (rules) the checks and messages may use; not emitted.
    derived: dict[Ident, StrictStr] = {}
    checks: tuple[CheckSpec, ...] = ()
    # Present for configs whose policies are lists of shape buckets.
    buckets: BucketDims | None = None
    # Raw policy tables: validated against this config's fields by load.py,
    # which knows the field types (see policy_model()).
    policy: tuple[dict[str, Any], ...] = ()
    # Serves any target no threshold serves (any vendor, below every threshold,
    # or past a max_arch).  Without one, such a target is an error.
    base: dict[str, Any] | None = None
    # How ``codegen tune`` measures this family (bucketed configs only).
    tune: TuneSpec | None = None

    @field_validator("variants")
    @classmethod
    def _variants_nonempty(cls, v: dict[str, dict[str, Any]] | None) -> dict[str, dict[str, Any]] | None:
        if v is not None and not v:
            raise ValueError("variants, when given, must name at least one variant")
        return v

    @field_validator("requires")
    @classmethod
    def _requires_features(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        known = list(Features.model_fields)
        for name in v:
            if name not in known:
                raise ValueError(f"requires names {name!r}, not a hardware feature ({', '.join(known)})")
        return v

    @model_validator(mode="after")
    def _has_policy(self) -> "ConfigSpec":
        if not self.policy and self.base is None:
            raise ValueError("a config needs at least one [[policy]] table or a [base] policy")
        return self

    def variant_params(self, config_name: str) -> dict[str, dict[str, Any]]:
        return dict(self.variants) if self.variants is not None else {config_name: {}}


# Keys of a policy table that are not record fields.
POLICY_KEYS = ("vendor", "min_arch", "max_arch", "targets", "note", "tuned", "provenance", "bucket", "amend")
# Keys of a bucket table that are not record fields: a name, bounds, where its values come from.
BUCKET_KEYS = ("name", "note", "provenance")
# Keys of an amend table (a change to one bucket of the policy a policy chains from).
AMEND_KEYS = ("bucket", "note", "provenance")
BOUND_RE = re.compile(r"^([a-z])_(min|max)$")


# ---------------------------------------------------------------------------
# The project


class ProjectSpec(Spec):
    """``specs/project.toml`` (optional): choices that concern the whole tree."""

    # The target dispatch serves when no ``hw`` is given and no device is detected (a hardware
    # spec name); None: then the lookup is an error.
    default_target: Ident | None = None
    # The model dispatch serves when no ``model`` is given; None: the tree's only model.
    default_model: Ident | None = None


# ---------------------------------------------------------------------------
# Generated modules (kernel families)


class ReadSpec(Spec):
    """What a generated module reads of one config, checked before anything is rendered: a spec
    tree that lacks it fails the build (exit 2) instead of building a module that fails at run
    time."""

    # Dispatch names (variants, or aliases of a plain config) the module looks up.
    variants: tuple[Ident, ...] = ()
    # Record fields it reads.
    fields: tuple[FieldName, ...] = ()
    # Variant parameters its template (or context file) reads.
    params: tuple[Ident, ...] = ()
    # Whether it expects a bucketed config, and the bucket dimensions it can select on.
    bucketed: StrictBool = False
    dims: tuple[Annotated[str, Field(pattern=r"^[a-z]$")], ...] = ()


# A file under a template folder: "module.py.j2", or in a family's folder "matmul/module.py.j2".
ModuleFile = Annotated[str, Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*(/[A-Za-z0-9_][A-Za-z0-9_.\-]*)*$")]


class ModuleSpec(Spec):
    """``specs/modules/<name>.toml``: one generated module, ``generated/<name>.py``.

    A kernel family is this file, its template and (if it needs one) a context file beside the
    template; the compiler itself names no family.
    """

    # One line for generated/__init__.py's list of modules.
    doc: DocText
    # Jinja2 template, looked up in <root>/templates first, then in the packaged templates.
    template: ModuleFile
    # Optional Python file beside the template (same lookup) defining
    # ``context(ctx: dict) -> dict``: family-specific values computed from the generic context
    # (names and data only; see codegen/context.py), merged into it.
    context: ModuleFile | None = None
    # Config name -> what the module reads of it.  Its header names these configs' spec files,
    # and the template sees exactly these configs as ``configs``.
    reads: Annotated[dict[Ident, ReadSpec], Frozen] = Field(min_length=1)
