"""Record lookup for the generated dispatch module (hand-written): by kernel name, target and
model, and by a seed-style selector's parameters.  Plain dictionary lookups; no rule runs."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

__all__ = ["record", "select"]


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


def select(table: Mapping[tuple, tuple], key: tuple, function: str, params: Sequence[str]) -> tuple:
    """(variant, model) of a seed-style selector's parameters; KeyError listing the known ones."""
    found = table.get(key)
    if found is None:
        given = ", ".join(f"{p}={v!r}" for p, v in zip(params, key))
        known = "; ".join(
            f"{model or variant} ({', '.join(f'{p}={v!r}' for p, v in zip(params, k))})"
            for k, (variant, model) in table.items()
        )
        raise KeyError(f"{function}: no model has {given}; known: {known}")
    return found
