"""Immutable containers for the spec data: what ``records`` and the spec models hold instead of
dicts and lists, so that nothing a stage passes on can be changed in place."""

from __future__ import annotations

from typing import Any, Iterator, Mapping, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class FrozenMap(Mapping[K, V]):
    """An immutable, hashable mapping that keeps its insertion order."""

    __slots__ = ("_items", "_dict")
    _items: tuple[tuple[K, V], ...]
    _dict: dict[K, V]

    def __init__(self, items: Mapping[K, V] | Any = ()):
        pairs = tuple(items.items()) if isinstance(items, Mapping) else tuple(items)
        object.__setattr__(self, "_items", pairs)
        object.__setattr__(self, "_dict", dict(pairs))

    def __getitem__(self, key: K) -> V:
        return self._dict[key]

    def __iter__(self) -> Iterator[K]:
        return iter(self._dict)

    def __len__(self) -> int:
        return len(self._dict)

    def __hash__(self) -> int:
        return hash(self._items)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self._dict) == dict(other)

    def __repr__(self) -> str:
        return f"FrozenMap({self._dict!r})"

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("FrozenMap is immutable")


def frozen(value: Any) -> Any:
    """A deep-frozen copy of parsed TOML data: dicts become FrozenMaps, lists tuples."""
    if isinstance(value, Mapping):
        return FrozenMap((k, frozen(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return tuple(frozen(v) for v in value)
    return value
