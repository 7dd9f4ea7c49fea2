"""Record lookup for the generated modules (hand-written): by kernel name, target and model
(generated/dispatch.py; its selectors' computed path is policy_runtime/rule_functions.py); a
bucketed kernel module's policy by dtype and target (``PolicyTables``: generated/matmul.py and
moe.py).  Plain dictionary lookups; no rule runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

__all__ = ["record", "PolicyTables"]


def record(
    by_model: Mapping[Optional[str], Mapping[str, Any]],
    kernel_name: str,
    target: str,
    model: Optional[str],
    default_model: Optional[str],
    models: Sequence[str],
) -> Any:
    """The record of one config variant on ``target`` for ``model`` (None: the default model).
    ``by_model`` has the single key None for a config that reads no model."""
    if model is not None and model not in models:
        raise KeyError(f"Unknown model: {model!r}. Available: {sorted(models)}")
    if None in by_model:
        return by_model[None][target]
    chosen = model if model is not None else default_model
    table = by_model.get(chosen)  # type: ignore[arg-type]
    if table is None:
        raise KeyError(f"{kernel_name!r} is not resolved for model {chosen!r}; it serves {sorted(by_model)}")  # type: ignore[type-var]
    return table[target]


@dataclass(frozen=True)
class PolicyTables:
    """A bucketed kernel module's policies: per variant (by input dtype) and target, the buckets
    in the order they are tried and the function that picks one.  The modules' entry-point
    classes (policy_runtime.matmul.Matmul, policy_runtime.moe.MoE) extend it."""

    # Variant name (matmul_16bit, moe_launch_fp32, ...) -> hardware spec name -> (buckets, select).
    policies: Mapping[str, Mapping[str, tuple[tuple[Any, ...], Callable[..., Any]]]]
    # Input dtype -> variant name; the dtypes a call may have.
    variant_of_dtype: Mapping[Any, str]
    # generated.dispatch.target_name: (hw, device) -> hardware spec name.
    target_name: Callable[[Any, Any], str]

    def policy(self, dtype: Any, hw: Any, device: Any) -> tuple[tuple[Any, ...], Callable[..., Any]]:
        return self.policies[self.variant_of_dtype[dtype]][self.target_name(hw, device)]

    def buckets(self, dtype: Any, hw: Any, device: Any) -> tuple[Any, ...]:
        return self.policy(dtype, hw, device)[0]
