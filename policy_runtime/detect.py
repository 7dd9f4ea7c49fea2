"""Device detection and hardware-name normalisation for the generated dispatch module
(hand-written).

The generated ``dispatch.py`` builds one ``Detector`` from its tables (hardware records,
device-name patterns, the spec of each (vendor, arch), the vendor table of ``specs/vendors``)
and exposes its methods as ``detect_hardware`` and ``target_name``.  Nothing here names a
vendor: how a vendor's device report becomes an arch number, and which words in a device name
identify it, are data (``Vendor``).
"""

from __future__ import annotations

import os
import re
import sys
import warnings
from dataclasses import dataclass
from types import FrameType
from typing import Any, Mapping, Optional, Union

__all__ = ["Detector", "Vendor", "arch_number"]


@dataclass(frozen=True)
class Vendor:
    """One vendor of specs/vendors/<name>.toml, as detection needs it."""

    name: str
    # "capability": 10 * major + minor; "gfx": the number in the gcnArchName ("gfx942" -> 942).
    arch_from: str
    # Whole words (any case) in a device name that identify the vendor.
    name_words: tuple[str, ...]
    # The vendor of a device name that names no vendor.
    default: bool
    # Devices seen through torch's ROCm (HIP) build.
    hip: bool


def arch_number(vendor: Vendor, capability: Optional[tuple[int, int]], arch_name: Optional[str]) -> Optional[int]:
    """The vendor's arch number from a device report, or None when the report lacks what the
    vendor's ``arch_from`` needs."""
    if vendor.arch_from == "gfx":
        if not arch_name:
            return None
        match = re.match(r"^\s*gfx([0-9a-fA-F]+)", arch_name)
        if match is None:
            return None
        digits = match.group(1)
        # Decimal digits, a stepping letter as its hex value: gfx942 -> 942, gfx90a -> 910.
        return sum(int(d, 16) * 10 ** (len(digits) - 1 - i) for i, d in enumerate(digits))
    if capability is None:
        return None
    return capability[0] * 10 + capability[1]


def _user_stacklevel(module: str) -> int:
    """A warnings stacklevel pointing at the first frame outside the detection modules."""
    frame: Optional[FrameType] = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_globals.get("__name__") in (module, __name__):
        frame, level = frame.f_back, level + 1
    return level


class Detector:
    """Maps a device to a hardware spec name; remembers each CUDA device it detected."""

    def __init__(
        self,
        *,
        hardware: Mapping[str, Any],
        device_names: tuple[tuple[str, str], ...],
        by_arch: Mapping[tuple[str, int], str],
        vendors: Mapping[str, Vendor],
        spec_files: Mapping[str, str],
        record_type: type[Any],
        module: str,
        default_target: Optional[str] = None,
        env_var: Optional[str] = None,
    ):
        self.hardware = hardware  # spec name -> HardwareCapability
        self.device_names = device_names  # (whole-word pattern, spec name), longest first
        self.by_arch = by_arch  # (vendor, arch) -> the first spec name of that arch
        self.vendors = vendors
        self.spec_files = spec_files  # spec name -> the spec file (named in warnings)
        self.record_type = record_type
        self.module = module  # the generated module's __name__, for warning stack levels
        # CUDA device index -> detected spec name: detection (and its warnings) runs once each.
        self.detected: dict[int, str] = {}
        # Served when no hw is given and no device is detected (the spec tree's default target).
        self.default_target = default_target
        # A spec name in this environment variable (read once, here) is the target whenever no
        # hw is given, whatever the device: for machines whose device detection misleads.
        self.env_var = env_var
        self.forced = os.environ.get(env_var) or None if env_var else None

    # -- names -------------------------------------------------------------------------------

    def hardware_name(self, hw: Union[str, Any, None]) -> str:
        """The spec name of ``hw``: a spec name, a hardware record (a HARDWARE record, or any
        record with ``vendor`` and ``arch_version`` such as a hand-written dispatch file's), or
        None: the forced target, else the detected device, else the default target."""
        if hw is None:
            if self.forced is not None:
                return self._forced()
            if self.default_target is not None and not _device_available():
                return self.default_target
            return self.detect()
        if isinstance(hw, str):
            if hw not in self.hardware:
                raise KeyError(f"Unknown hardware: {hw!r}. Available: {sorted(self.hardware)}")
            return hw
        if isinstance(hw, self.record_type) and self.hardware.get(hw.name) == hw:
            return hw.name
        if hasattr(hw, "vendor") and hasattr(hw, "arch_version"):
            return self._record_name(hw)
        raise TypeError(f"hw must be a spec name, a HardwareCapability or None, not {type(hw).__name__}")

    def _forced(self) -> str:
        if self.forced not in self.hardware:
            raise KeyError(f"{self.env_var}={self.forced!r} names no hardware spec; available: {sorted(self.hardware)}")
        return self.forced  # type: ignore[return-value]

    def _record_name(self, hw: Any) -> str:
        """The spec of a hardware record made elsewhere: the one of its vendor and arch whose
        fields it shares all equal; else that arch's spec, with a warning naming the fields that
        differ."""
        same_arch = [
            rec for rec in self.hardware.values() if rec.vendor == hw.vendor and rec.arch_version == hw.arch_version
        ]
        if not same_arch:
            known = ", ".join(f"{r.vendor} {r.arch_version}" for r in self.hardware.values())
            raise KeyError(f"no hardware spec for vendor {hw.vendor!r} arch {hw.arch_version}; specs exist for {known}")

        def differing(rec: Any) -> list[str]:
            out = []
            for name in rec.__dataclass_fields__:
                if name != "name" and hasattr(hw, name) and getattr(hw, name) != getattr(rec, name):
                    out.append(f"{name} {getattr(hw, name)!r} (spec: {getattr(rec, name)!r})")
            return out

        for rec in same_arch:
            if not differing(rec):
                return rec.name
        chosen = self.by_arch.get((hw.vendor, hw.arch_version), same_arch[0].name)
        warnings.warn(
            f"hardware record of {hw.vendor} arch {hw.arch_version} matches no spec exactly; using "
            f"{chosen!r} ({self.spec_files[chosen]}), whose figures differ: {'; '.join(differing(self.hardware[chosen]))}",
            RuntimeWarning,
            stacklevel=_user_stacklevel(self.module),
        )
        return chosen

    def target_name(self, hw: Union[str, Any, None] = None, device: Any = None) -> str:
        """``hw`` when given; else the forced target; else the spec of CUDA device ``device`` (a
        torch.device, "cuda:1", an int index), detected once per device index; with no
        ``device``, the current device, or the default target where there is none."""
        if hw is not None:
            return self.hardware_name(hw)
        if self.forced is not None:
            return self._forced()
        if device is None:
            return self.hardware_name(None)
        if getattr(device, "type", None) == "cuda" and device.index is not None:
            # The launchers' hot path: a tensor's device, detected on an earlier call.
            name = self.detected.get(device.index)
            if name is not None:
                return name
        return self.detect_device(self._device_index(device))

    def detect(
        self,
        vendor: Optional[str] = None,
        capability: Optional[tuple[int, int]] = None,
        name: Optional[str] = None,
        arch_name: Optional[str] = None,
    ) -> str:
        if vendor is None and capability is None and name is None and arch_name is None:
            return self.detect_device()
        return self.choose(vendor, capability, name, f"device {name!r}" if name else "the device", arch_name)

    # -- devices -----------------------------------------------------------------------------

    def _device_index(self, device: Any) -> Optional[int]:
        if device is None:
            return None
        torch = _import_torch()
        if isinstance(device, bool) or not isinstance(device, (int, str, torch.device)):
            raise TypeError(
                f"device must be a torch.device, a device string ('cuda:1') or an int index, "
                f"not {type(device).__name__}"
            )
        if isinstance(device, int):
            if device < 0:
                raise ValueError(f"device index must be >= 0, not {device}")
            return device
        dev = torch.device(device)
        if dev.type != "cuda":
            raise RuntimeError(
                f"no hardware to detect for a tensor on {dev}; pass hw='<spec name>' "
                f"(one of {', '.join(sorted(self.hardware))})"
            )
        return dev.index

    def detect_device(self, index: Optional[int] = None) -> str:
        """Detect CUDA device ``index`` (None: the current one), once per index."""
        torch = _import_torch()
        if not torch.cuda.is_available():
            raise RuntimeError(
                "detect_hardware(): no GPU device is available; pass hw='<spec name>' "
                f"(one of {', '.join(sorted(self.hardware))})"
            )
        if index is None:
            index = torch.cuda.current_device()
        spec_name = self.detected.get(index)
        if spec_name is not None:
            return spec_name
        device_name = torch.cuda.get_device_name(index)
        capability = tuple(torch.cuda.get_device_capability(index))
        props = torch.cuda.get_device_properties(index)
        arch_name = getattr(props, "gcnArchName", None)
        # A HIP build of torch sees only its HIP vendors; which one, the name tells.
        vendor = None
        if getattr(torch.version, "hip", None):
            hip = [v.name for v in self.vendors.values() if v.hip]
            if len(hip) == 1:
                vendor = hip[0]
        where = f"cuda:{index} ({device_name!r})"
        spec_name = self.choose(vendor, capability, device_name, where, arch_name)
        sm_count = getattr(props, "multi_processor_count", None)
        spec = self.hardware[spec_name]
        if sm_count is not None and sm_count != spec.sm_count:
            warnings.warn(
                f"{where} has {sm_count} SMs but hardware spec {spec_name!r} "
                f"({self.spec_files[spec_name]}) says sm_count = {spec.sm_count}; launch policies size "
                f"their grids from the spec's figure.  Pass hw='<spec name>' or add a spec for this part",
                RuntimeWarning,
                stacklevel=_user_stacklevel(self.module),
            )
        self.detected[index] = spec_name
        return spec_name

    # -- choosing a spec ---------------------------------------------------------------------

    def match_device_name(self, name: str) -> Optional[tuple[str, str]]:
        """(pattern, spec name) of the longest device_names pattern in ``name``, any vendor."""
        for pattern, spec_name in self.device_names:
            if re.search(rf"(?<![A-Za-z0-9]){re.escape(pattern)}(?![A-Za-z0-9])", name, re.IGNORECASE):
                return pattern, spec_name
        return None

    def vendor_from_name(self, name: str) -> Optional[str]:
        """The vendor whose words a device name contains, else the default vendor (or None)."""
        for vendor in self.vendors.values():
            for word in vendor.name_words:
                if re.search(rf"(?<![A-Za-z0-9]){re.escape(word)}(?![A-Za-z0-9])", name, re.IGNORECASE):
                    return vendor.name
        return next((v.name for v in self.vendors.values() if v.default), None)

    def choose(
        self,
        vendor: Optional[str],
        capability: Optional[tuple[int, int]],
        name: Optional[str],
        where: str,
        arch_name: Optional[str] = None,
    ) -> str:
        if name:
            match = self.match_device_name(name)
            if match is not None:
                return match[1]
        patterns = ", ".join(repr(p) for p, _ in self.device_names)
        tried = f"{where} matches no spec's device_names ({patterns})" if name else f"{where}: no device name was given"
        known = ", ".join(sorted({v for v, _ in self.by_arch}))
        if vendor is None:
            if not name:
                raise RuntimeError(
                    "detect_hardware(): no vendor and no device name were given; "
                    f"pass a vendor ({known}) or a device name"
                )
            vendor = self.vendor_from_name(name)
            if vendor is None:
                raise RuntimeError(f"detect_hardware(): {tried}, and no vendor's name_words are in it{_NO_SPEC}")
        if vendor not in self.vendors or not any(v == vendor for v, _ in self.by_arch):
            raise RuntimeError(
                f"detect_hardware(): {tried}, and it has unknown vendor {vendor!r}; specs exist for {known}"
                f"{_NO_SPEC}"
            )
        info = self.vendors[vendor]
        arch = arch_number(info, capability, arch_name)
        if arch is None:
            need = "gfx arch name (torch's gcnArchName)" if info.arch_from == "gfx" else "capability"
            raise RuntimeError(f"detect_hardware(): {tried}, and no {need} was given to fall back on its arch")
        exact = self.by_arch.get((vendor, arch))
        if exact is not None:
            spec = self.hardware[exact]
            warnings.warn(
                f"{tried}; using {exact!r} ({self.spec_files[exact]}, {spec.display_name}), the {vendor} "
                f"arch {arch} spec, matched by arch only: its figures (sm_count {spec.sm_count}, "
                f"bandwidth, caches) may not be this part's.  Pass hw='<spec name>' or add a spec for this part",
                RuntimeWarning,
                stacklevel=_user_stacklevel(self.module),
            )
            return exact
        lower = [a for (v, a) in self.by_arch if v == vendor and a < arch]
        if not lower:
            archs = ", ".join(str(a) for (v, a) in sorted(self.by_arch) if v == vendor)
            raise RuntimeError(
                f"detect_hardware(): {tried}, and {vendor} arch {arch} is below every {vendor} spec ({archs})"
                f"{_NO_SPEC}"
            )
        chosen = self.by_arch[(vendor, max(lower))]
        warnings.warn(
            f"no hardware spec for {vendor} arch {arch} ({name!r}); using {chosen!r} "
            f"(arch {max(lower)}) from {self.spec_files[chosen]}, the nearest lower arch of the same vendor, "
            f"matched by arch only: {tried}",
            RuntimeWarning,
            stacklevel=_user_stacklevel(self.module),
        )
        return chosen


# What a user whose device has no spec can do, ending each such error.
_NO_SPEC = (
    ".  Add a spec for this part (specs/hardware/<name>.toml, then `python -m codegen build`), or "
    "pass hw='<spec name>' to run another part's policies"
)


def _device_available() -> bool:
    """Is there a GPU torch can see?  (False without torch.)"""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _import_torch() -> Any:
    try:
        import torch
    except ImportError:
        raise RuntimeError("detect_hardware() needs torch to query the device; pass hw='<spec name>' instead") from None
    return torch
