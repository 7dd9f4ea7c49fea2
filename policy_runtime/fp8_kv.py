"""FP8 KV cache: vLLM's ``kv_cache_dtype="fp8"`` semantics, shared by the cache write
(policy_runtime/cache/ops.py) and the attention kernels that read it (policy_runtime/attention/ops.py).

A cache of ``torch.float8_e4m3fn`` holds ``saturate(x / scale)`` rounded to nearest even (vLLM's
``__nv_cvt_float_to_fp8(x / scale, __NV_SATFINITE, E4M3)``), one scale per tensor: ``k_scale`` for
the key cache, ``v_scale`` for the value cache.  A reader takes ``fp8 -> float * scale``.  vLLM
stores such caches as uint8; here they are float8_e4m3fn tensors (a uint8 cache of vLLM's is the
same bytes: ``cache.view(torch.float8_e4m3fn)``, free).  A scale is a Python float or a float32
tensor of one element (vLLM's ``layer._k_scale``) on the cache's device; a tensor is read in the
kernel (no device sync, CUDA-graph safe), so its value is checked only where it is on the CPU.
"""

from __future__ import annotations

import math
from typing import Any, Literal, Optional, overload

import torch
import triton
import triton.language as tl

__all__ = ["FP8_DTYPE", "KV_CACHE_DTYPES", "is_fp8_kv", "kv_scale", "kv_scales", "round_half_even", "to_e4m3", "unserved_error"]

FP8_DTYPE = torch.float8_e4m3fn
# vLLM's names of an e4m3 cache ("fp8" is e4m3 on CUDA); "auto" stores the model's dtype.
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")
# The largest finite e4m3fn value: quantized values saturate to +-448.
FP8_MAX = 448.0

# Python-float scales as one-element device tensors, by (value, device): a constant scale costs
# one host-to-device copy per process, not one per call.
_SCALES: dict[tuple[float, torch.device], torch.Tensor] = {}
_SCALES_LIMIT = 256


def is_fp8_kv(op: str, kv_cache_dtype: Any) -> bool:
    """Whether ``kv_cache_dtype`` (vLLM's string) asks for an e4m3 cache; ValueError otherwise."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(
            f"{op}: kv_cache_dtype must be one of {', '.join(map(repr, KV_CACHE_DTYPES))}, got {kv_cache_dtype!r}"
            + (" (e5m2 caches are not served)" if kv_cache_dtype == "fp8_e5m2" else "")
        )
    return kv_cache_dtype != "auto"


def kv_scale(op: str, name: str, value: Any, device: torch.device) -> torch.Tensor:
    """``value`` (a positive finite float, or a float32 tensor of one element on ``device``) as a
    one-element float32 tensor on ``device``; ValueError naming ``name`` otherwise."""
    if value is None:
        raise ValueError(f"{op}: {name} is required with an fp8 KV cache (vLLM's per-tensor scale)")
    if isinstance(value, torch.Tensor):
        if value.dtype != torch.float32 or value.numel() != 1 or value.dim() > 1:
            raise ValueError(
                f"{op}: {name} must be a float32 tensor of one element (shape () or (1,)), got "
                f"{value.dtype} {tuple(value.shape)}"
            )
        if value.device != device:
            raise ValueError(f"{op}: {name} is on {value.device}, the cache on {device}; they must be on one device")
        if value.device.type == "cpu":
            s = float(value)
            if not (math.isfinite(s) and s > 0.0):
                raise ValueError(f"{op}: {name} must be positive and finite, got {s!r}")
        return value.reshape(1)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{op}: {name} must be a float or a float32 tensor of one element, got {type(value).__name__}")
    s = float(value)
    if not (math.isfinite(s) and s > 0.0):
        raise ValueError(f"{op}: {name} must be positive and finite, got {value!r}")
    key = (s, device)
    t = _SCALES.get(key)
    if t is None:
        if len(_SCALES) >= _SCALES_LIMIT:
            _SCALES.clear()
        t = _SCALES[key] = torch.full((1,), s, dtype=torch.float32, device=device)
    return t


@overload
def kv_scales(op: str, fp8: Literal[True], k_scale: Any, v_scale: Any, device: torch.device,
              fp8_means: str = ...) -> tuple[torch.Tensor, torch.Tensor]: ...


@overload
def kv_scales(op: str, fp8: bool, k_scale: Any, v_scale: Any, device: torch.device,
              fp8_means: str = ...) -> Optional[tuple[torch.Tensor, torch.Tensor]]: ...


def kv_scales(op: str, fp8: bool, k_scale: Any, v_scale: Any, device: torch.device,
              fp8_means: str = "an fp8 (float8_e4m3fn) KV cache") -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """(k_scale, v_scale) as one-element fp32 tensors with an fp8 cache (``kv_scale``); None
    without one, where scales are a ValueError (they apply only to ``fp8_means``)."""
    if not fp8:
        if k_scale is not None or v_scale is not None:
            raise ValueError(f"{op}: k_scale / v_scale apply only to {fp8_means}")
        return None
    return kv_scale(op, "k_scale", k_scale, device), kv_scale(op, "v_scale", v_scale, device)


def unserved_error(op: str, target: str, missing: str, spec: str, served: Optional[list[str]] = None) -> ValueError:
    """The error of an fp8 KV call on a target without e4m3fn (the config in ``spec`` requires it)."""
    tail = f"; served targets: {', '.join(sorted(served))}" if served else ""
    return ValueError(
        f"{op}: an fp8 KV cache needs {missing}, which target {target!r} lacks (specs/hardware/{target}.toml; "
        f"{spec} requires it){tail}"
    )


@triton.jit
def round_half_even(a):
    # a (fp32, 0 <= a < 2^22) rounded to the nearest integer, ties to even, as fp32: the integer
    # part by truncation, the fraction (exact) compared with one half.
    q = a.to(tl.int32)
    frac = a - q.to(tl.float32)
    up = (frac > 0.5) | ((frac == 0.5) & ((q & 1) == 1))
    return (q + up.to(tl.int32)).to(tl.float32)


@triton.jit
def to_e4m3(x):
    # saturate(x) rounded to nearest even on e4m3fn's grid, as float8e4nv.  The byte is built in
    # integer arithmetic and bitcast, so no float -> fp8 conversion runs: its lowering differs
    # between Triton's versions and its interpreter (whose cast drops the carry of a mantissa that
    # rounds up into the next binade), and a GPU compile found bytes other than torch's cast.
    # Normal values (|x| >= 2^-6): the fp32 bits rounded to 3 mantissa bits (ties to even), the
    # exponent rebiased from 127 to 7.  Subnormal ones are multiples of 2^-9: |x| * 2^9 rounded to
    # an integer, ties to even (0..8; 8 is 2^-6, the smallest normal's byte).  The sign is x's bit,
    # so a negative value that rounds to zero is -0.0 (byte 0x80), as torch's cast gives.
    a = tl.minimum(tl.abs(x), 448.0)
    bits = a.to(tl.uint32, bitcast=True)
    normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) >> 20) - 960  # 960 = (127 - 7) << 3
    sub = round_half_even(tl.minimum(a, 0.015625) * 512.0).to(tl.uint32)
    mag = tl.where(a < 0.015625, sub, normal)
    sign = (x.to(tl.uint32, bitcast=True) >> 24) & 0x80
    return (mag | sign).to(tl.uint8).to(tl.float8e4nv, bitcast=True)
