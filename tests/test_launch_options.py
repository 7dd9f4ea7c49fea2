"""Every launch asks Triton for FP fusion explicitly (policy_runtime/launch.py's launch_kernel):
Triton 3.9 warns that its default turns off in 3.10, and a kernel's rounding and speed would then
change with the Triton version.  A real entry point's launch and warm-up's compile-only scope both
see the option, and the generated kernels' first call prints no FP-fusion warning."""

from __future__ import annotations

import warnings

import torch

from generated import transform
from policy_runtime import call_cache
from policy_runtime import direct as _direct
from policy_runtime import launch as _launch


class Recorder:
    """Stands in for a Triton kernel: records each launch's keyword arguments, then launches the
    real kernel as called."""

    def __init__(self, real):
        self.real, self.launches = real, []

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.launches.append(dict(kwargs))
            return self.real[grid](*args, **kwargs)

        return run


def test_an_entry_points_launch_asks_for_fp_fusion(monkeypatch):
    real = _launch.launch_kernel
    seen = []

    def spy(kernel, grid, *args, **kwargs):
        rec = Recorder(kernel)
        real(rec, grid, *args, **kwargs)
        seen.extend(rec.launches)

    monkeypatch.setattr(_launch, "launch_kernel", spy)
    monkeypatch.setattr(_direct, "ENABLED", False)  # every launch through kernel[grid]
    call_cache.clear_all()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.randn(3, 40, dtype=torch.float16, device=dev)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = transform.silu_and_mul(x, hw=None if x.is_cuda else "h200")
    call_cache.clear_all()
    # Triton 3.9+ warns at a compile that leaves FP fusion to its default (none under the interpreter).
    assert not [w for w in caught if "FP_FUSION" in str(w.message)], [str(w.message) for w in caught]
    ref = torch.nn.functional.silu(x[:, :20].float()) * x[:, 20:].float()
    assert torch.allclose(out.float(), ref, rtol=2e-3, atol=2e-3)
    assert seen and all(kw.get("enable_fp_fusion") is True for kw in seen), seen


def test_warm_ups_compile_only_scope_gets_the_option():
    got = []
    with _launch.compile_only(lambda kernel, grid, args, kwargs: got.append(dict(kwargs))):
        _launch.launch_kernel(object(), (1,), 1, 2, num_warps=4)
    assert got == [{"num_warps": 4, "enable_fp_fusion": True}]
