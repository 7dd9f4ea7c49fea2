"""policy_runtime/fp8_kv.py's ``to_e4m3`` (the fp8 KV cache write's rounding) against torch's
float32 -> float8_e4m3fn cast, byte for byte, on every class of fp32 value: all finite fp16 bit
patterns scaled into e4m3's normal, subnormal and saturating ranges (ties to even and binade edges
among them), the midpoints between neighbouring e4m3 values and values one fp32 ulp off them,
+-0, fp32 subnormals, 448 and past it.  It also runs Triton's own ``.to(tl.float8e4nv)`` cast of
the same values and prints where that differs from torch's (a diagnostic: to_e4m3 builds the byte
in integer arithmetic and never runs that cast).

On the CPU the kernel runs in Triton's interpreter; on a GPU, compiled (the H200 found other bytes
than torch's in the cache write, where the interpreter agreed):
``python -m pytest -n 0 -q -s tests/test_fp8_cast.py`` prints the mismatches of each in seconds.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from kernel_cases import DEVICE
from policy_runtime.fp8_kv import to_e4m3

FP8 = torch.float8_e4m3fn
BLOCK = 1024


@triton.jit
def _cast_kernel(x_ptr, ours_ptr, triton_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(ours_ptr + offs, to_e4m3(x), mask=mask)
    # Triton's cast of the saturated value, for comparison only.
    tl.store(triton_ptr + offs, tl.minimum(tl.maximum(x, -448.0), 448.0).to(tl.float8e4nv), mask=mask)


def value_classes() -> dict[str, torch.Tensor]:
    """Named float32 test values (both signs)."""
    h = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(torch.float16).float()
    h = h[torch.isfinite(h)]
    grid = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(FP8).float()
    grid = grid[torch.isfinite(grid)].unique()
    mids = (grid[1:] + grid[:-1]) / 2
    ulp_up = torch.nextafter(mids, torch.full_like(mids, float("inf")))
    ulp_down = torch.nextafter(mids, torch.zeros_like(mids))
    edges = torch.tensor([0.0, -0.0, 2.0**-6, 2.0**-7, 2.0**-9, 2.0**-10, 2.0**-10 * 3, 448.0, 464.0, 465.0,
                          480.0, 1e4, 3.0e38, 1e-39, -1e-39, 1e-45, 2.0**-126])  # fmt: skip
    classes = {
        "fp16 patterns": h,
        "fp16 patterns * 2^-8 (subnormals)": h * 2.0**-8,
        "fp16 patterns * 2^-16": h * 2.0**-16,
        "fp16 patterns * 0.37 (arbitrary mantissas)": h * 0.37,
        "e4m3 values": grid,
        "midpoints (ties)": mids,
        "midpoints + 1 ulp": ulp_up,
        "midpoints - 1 ulp": ulp_down,
        "edges (+-0, binades, saturation, fp32 subnormals)": edges,
    }
    return {k: torch.cat([v, -v]) for k, v in classes.items()}


def mismatches(x: torch.Tensor, got: torch.Tensor, want: torch.Tensor) -> str:
    g, w = got.view(torch.uint8).cpu(), want.view(torch.uint8).cpu()
    bad = (g != w).nonzero().flatten()
    if bad.numel() == 0:
        return ""
    shown = [(x[i].item(), hex(g[i].item()), hex(w[i].item())) for i in bad[:8].tolist()]
    return f"{bad.numel()} of {g.numel()} differ; (x, got, torch): {shown}"


def test_to_e4m3_gives_torchs_bytes_on_every_value_class():
    report, failed = [], []
    for name, x in value_classes().items():
        want = x.clamp(-448.0, 448.0).to(FP8)
        xd = x.to(DEVICE)
        ours = torch.empty(x.shape, dtype=FP8, device=DEVICE)
        theirs = torch.empty_like(ours)
        _cast_kernel[(triton.cdiv(x.numel(), BLOCK),)](xd, ours, theirs, x.numel(), BLOCK=BLOCK)
        bad = mismatches(x, ours, want)
        bad_triton = mismatches(x, theirs, want)
        report.append(f"{name}: to_e4m3 {bad or 'exact'}; Triton's cast {bad_triton or 'exact'}")
        if bad:
            failed.append(f"{name}: {bad}")
    print("\n".join(report))
    assert not failed, "\n".join(failed)


@pytest.mark.skipif(DEVICE != "cuda", reason="the division's rounding differs only when compiled")
def test_division_by_a_scale_is_ieee():
    """The cache write's x / scale (tl.math.div_rn) against torch's division, then the cast: the
    same bytes for random bf16 data and odd scales."""
    from generated import cache as C

    g = torch.Generator(device="cuda").manual_seed(0)
    for scale in (0.02, 0.0173, 3.3, 1e-3):
        k = (torch.randn(4096, 1, 128, device="cuda", generator=g) * 2).bfloat16()
        kc = torch.zeros(256, 16, 1, 128, dtype=FP8, device="cuda")
        slots = torch.arange(4096, device="cuda")
        s = torch.tensor([scale], device="cuda")
        C.reshape_and_cache(k, k, kc, kc.clone(), slots, "fp8", s, s)
        want = (k.float() / s).clamp(-448, 448).to(FP8)
        bad = mismatches(k.flatten().float().cpu(), kc.view(-1, 1, 128)[:4096].flatten(), want.flatten())
        assert not bad, (scale, bad)
