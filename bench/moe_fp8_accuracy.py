#!/usr/bin/env python3
"""Where fused_moe_fp8's per-tensor error comes from, per bucket (issue 35).

    python3 bench/moe_fp8_accuracy.py             # on a GPU (~20 s)
    python3 bench/moe_fp8_accuracy.py --cpu-smoke --hw h200

For each bucket, the call's output against tests/test_moe_fp8.py's float64 reference (static and
dynamic per-tensor scales), and, with a dynamic scale (the up GEMM stores the intermediate h in
x's dtype), h as the up GEMM wrote it (caught at the quantizer) against the reference's h: its
relative error beside that of rounding the reference to x's dtype alone, and the share of
elements that differ from that rounding (an exact fp32 accumulation differs in almost none).
"""

from __future__ import annotations

import argparse
import os
import sys

from smoke import smoke_setup

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--cpu-smoke", action="store_true", help="tiny fp16 shapes, CPU interpreter")
ap.add_argument("--hw", default=None, help="hardware spec name (default: detect the GPU)")
ARGS = ap.parse_args()
SMOKE = smoke_setup(ARGS)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import torch  # noqa: E402

from generated import moe as M  # noqa: E402
from generated.dispatch import target_name  # noqa: E402
from policy_runtime.moe import fp8 as rt  # noqa: E402
from policy_runtime.report import quiet_on_closed_pipe  # noqa: E402
from test_moe_fp8 import act_and_mul, dequant_weights, layer, quant_dequant, reference  # noqa: E402

DEV = "cpu" if SMOKE else "cuda"
DT = torch.float16 if SMOKE else torch.bfloat16
HW = target_name(ARGS.hw)
E, k, H, I = (4, 2, 128, 64) if SMOKE else (16, 4, 1024, 512)
caught: list[torch.Tensor] = []
_quantize = rt._quantize


def spy(x, q, *a, **kw):
    caught.append(x.clone())
    return _quantize(x, q, *a, **kw)


def main() -> int:
    rt._quantize = spy
    torch.manual_seed(0)
    print(f"target {HW}; torch {torch.__version__}; E {E} top-{k} H {H} I {I} {DT}")
    for T in (40,) if SMOKE else (7, 300, 1000, 2048):
        bucket = M.select(T, I, dtype=torch.float8_e4m3fn, hw=HW)
        x, _, (w1q, w1s, w2q, w2s), weights, ids = layer(T, E, k, H, I, DT, False)
        dev = [t.to(DEV) for t in (x, w1q, w2q, weights, ids, w1s, w2s)]
        for static in (False, True):
            caught.clear()
            a1 = (x.float().abs().max() / 448).reshape(1).to(DEV) if static else None
            a2 = torch.tensor([0.01], device=DEV) if static else None
            out = M.fused_moe_fp8(*dev[:5], w1_scale=dev[5], w2_scale=dev[6], a1_scale=a1, a2_scale=a2, hw=HW)
            ref, ierr = reference(x, dequant_weights(w1q, w1s), dequant_weights(w2q, w2s), weights, ids, block=False,
                                  a1=None if a1 is None else a1.cpu(), a2=None if a2 is None else a2.cpu(),
                                  intermediate_error=True)  # fmt: skip
            err = ((out.cpu().double() - ref).norm() / ref.norm()).item()
            line = f"T={T:5d} bucket={bucket.name:8s} {'static ' if static else 'dynamic'} out err {err:.3e} (h's e4m3 err {ierr:.3e})"
            if not static:
                h = caught[1].cpu()  # the second quantization is h's: [T * k, I], rows in (token, slot) order
                xd, w1d, flat = quant_dequant(x, False, None), dequant_weights(w1q, w1s), ids.reshape(-1).long()
                hr = torch.zeros(T * k, I, dtype=torch.float64)
                for e in flat.unique().tolist():
                    rows = (flat == e).nonzero().flatten()
                    hr[rows] = act_and_mul(xd[rows // k] @ w1d[e].T, I, "silu")
                hb = hr.to(DT)
                line += (f" | h: rel err {((h.double() - hr).norm() / hr.norm()).item():.3e} (rounding to {DT} alone"
                         f" {((hb.double() - hr).norm() / hr.norm()).item():.3e}), differs from that rounding in"
                         f" {(h != hb).float().mean().item():.3%}")
            print(line, flush=True)
    return 0


sys.exit(quiet_on_closed_pipe(main))
