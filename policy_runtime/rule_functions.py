"""What the rule functions of generated/dispatch.py call besides builtins (hand-written).

The functions of the rule language (codegen/rules.py, ``FUNCTIONS``) with the same meaning, and
the error a failed check raises at run time, worded as the build words it: the check, the spec's
message, the numbers it read."""

from __future__ import annotations

import math
from typing import Any, Mapping, NoReturn

__all__ = [
    "ceil_div",
    "clamp",
    "pow2_floor",
    "pow2_ceil",
    "log2",
    "check_failed",
    "no_candidate",
    "with_hint",
    "RuleFailed",
    "CheckFailed",
    "Chain",
]


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def clamp(x: Any, lo: Any, hi: Any) -> Any:
    return max(lo, min(hi, x))


def pow2_floor(x: int) -> int:
    if x < 1:
        raise ValueError(f"pow2_floor needs a positive argument, got {x}")
    return 1 << (int(x).bit_length() - 1)


def pow2_ceil(x: int) -> int:
    if x < 1:
        raise ValueError(f"pow2_ceil needs a positive argument, got {x}")
    return 1 << (int(x) - 1).bit_length()


def log2(x: Any) -> float:
    return math.log2(x)


class RuleFailed(ValueError):
    """A record computed at run time fails: a check, or a pick no candidate satisfies."""


class CheckFailed(RuleFailed):
    """A record computed at run time fails one of its config's checks."""

    def __init__(self, text: str, check: str):
        super().__init__(text)
        self.check = check


class _Namespace:
    def __init__(self, values: Mapping[str, Any]):
        self.__dict__.update(values)


def check_failed(check: str, rule: str, message: str, numbers: Mapping[str, Any], hw: Any) -> NoReturn:
    """Raise CheckFailed: "fails check 'NAME': MESSAGE (RULE with a = 1, hw.b = 2)"."""
    shown = ", ".join(f"{k} = {v!r}" for k, v in numbers.items())
    text = f"fails check '{check}': "
    if message:
        values = {k: v for k, v in numbers.items() if "." not in k}
        model = {k.split(".", 1)[1]: v for k, v in numbers.items() if k.startswith("model.")}
        try:
            text += message.format_map({**values, "hw": hw, "model": _Namespace(model)}) + f" ({rule}: {shown})"
        except (KeyError, AttributeError, ValueError, IndexError):
            text += f"{rule}: {shown}"
    else:
        text += f"{rule}: {shown}"
    raise CheckFailed(text, check)


def no_candidate(message: str, numbers: Mapping[str, Any]) -> NoReturn:
    """Raise ValueError: no candidate of a pick passes its condition (the last one's numbers)."""
    shown = ", ".join(f"{k} = {v!r}" for k, v in numbers.items())
    raise RuleFailed(f"{message} (the last: {shown})")


def _smaller(value: int) -> list[int]:
    """Powers of two below ``value``, largest first: the dimensions are sizes and counts, and a
    hint of a 3-byte dtype would help no one."""
    return [1 << b for b in range(max(value - 1, 0).bit_length() - 1, -1, -1)]


def with_hint(exc: RuleFailed, function: Any, hw: Any, dims: Mapping[str, Any], params: Mapping[str, str]) -> RuleFailed:
    """``exc`` with the largest smaller value of each selector parameter that, the others kept,
    gives a record passing every check: "; head_dim = 384, or dtype_size = 2 would pass"."""
    found = []
    for arg, param in params.items():
        value = dims[arg]
        if type(value) is not int:
            continue
        for steps, candidate in enumerate(_smaller(value), start=1):
            try:
                function(hw, **{**dims, arg: candidate})
            except RuleFailed:
                continue
            found.append((steps, f"{param} = {candidate}"))
            break
    found.sort(key=lambda f: f[0])
    if not found:
        return exc
    hinted = type(exc).__new__(type(exc))
    hinted.__dict__.update(exc.__dict__)
    hinted.args = (f"{exc}; {', or '.join(text for _, text in found[:3])} would pass",)
    return hinted


class Chain:
    """A config's rule functions by policy, chained as the build chains them (codegen/resolve.py,
    ``chain``): the policy of the hardware's vendor with the largest ``min_arch`` at most its
    arch (one limited to named targets that include it winning at one threshold), not past its
    ``max_arch``; else the base policy's function."""

    def __init__(self, entries: tuple, base: Any, hardware: Mapping[str, Any], record_type: Any):
        self.entries = entries
        self.base = base
        self.hardware = hardware
        # The hardware record class; its defaults (the default target's figures) fill a record of
        # a vendor no spec has.
        self.record_type = record_type
        self.by_target = {name: self.function(r.vendor, r.arch_version, name) for name, r in hardware.items()}
        self._spec_ids = {id(r): name for name, r in hardware.items()}
        # Hardware records built by hand (frozen, so hashable) -> what serving() found for them.
        self._seen: dict[Any, tuple[Any, Any, bool]] = {}

    def function(self, vendor: str, arch: int, name: Any = None) -> Any:
        best = None
        for v, lo, hi, targets, fn in self.entries:
            if targets is not None and name not in targets:
                continue
            if v == vendor and lo <= arch:
                rank = (lo, targets is not None)
                if best is None or rank > best[0]:
                    best = (rank, hi, fn)
        if best is not None and (best[1] is None or arch <= best[1]):
            return best[2]
        if self.base is None:
            raise ValueError(f"no policy serves {vendor} arch {arch}, and the config has no base policy")
        return self.base

    def serving(self, hw: Any, hardware_name: Any) -> tuple[Any, Any, bool]:
        """(hardware record, rule function, whether the record is a spec'd target's).  A name or
        None is the spec ``hardware_name`` says; a record whose every figure equals a spec's of
        its vendor and arch is that spec; any other record is computed from its own figures, those
        it lacks taken from its vendor's spec nearest below its arch (else the lowest above; a
        vendor no spec has: the record class's defaults), but for the opt-in shared memory, which
        is its block limit where it gives none."""
        if hw is None or isinstance(hw, str):
            name = hardware_name(hw)
            return self.hardware[name], self.by_target[name], True
        name = self._spec_ids.get(id(hw))
        if name is not None:
            return hw, self.by_target[name], True
        try:
            return self._seen[hw]
        except (KeyError, TypeError):  # not seen yet, or not hashable
            pass
        found = self._serving_record(hw)
        try:
            if len(self._seen) >= 64:  # records built per call would grow it without bound
                self._seen.clear()
            self._seen[hw] = found
        except TypeError:
            pass
        return found

    def _serving_record(self, hw: Any) -> tuple[Any, Any, bool]:
        vendor, arch = hw.vendor, hw.arch_version
        same = [(n, r) for n, r in self.hardware.items() if r.vendor == vendor and r.arch_version == arch]
        for n, r in same:
            if all(getattr(hw, f) == getattr(r, f) for f in _figures(r) if hasattr(hw, f)):
                return r, self.by_target[n], True
        own = [(r.arch_version, n) for n, r in self.hardware.items() if r.vendor == vendor]
        below = [x for x in own if x[0] <= arch]
        fill = self.hardware[max(below)[1] if below else min(own)[1]] if own else self.record_type()
        values = {}
        for f in _figures(fill):
            values[f] = getattr(hw, f) if hasattr(hw, f) else getattr(fill, f)
        if not hasattr(hw, "max_shared_memory_per_block_optin") and hasattr(hw, "max_shared_memory_per_block"):
            # A seed-style record has no opt-in figure: its block limit is its only one.
            values["max_shared_memory_per_block_optin"] = hw.max_shared_memory_per_block
        values["name"] = getattr(hw, "name", None) or f"a hand-built {vendor} arch {arch} record"
        record = type(fill)(**values)
        return record, self.function(vendor, arch, values["name"]), False


def _figures(record: Any) -> list[str]:
    fields = getattr(record, "__dataclass_fields__", None)
    return [f for f in fields if f != "name"] if fields else [f for f in vars(record) if not f.startswith("_")]
