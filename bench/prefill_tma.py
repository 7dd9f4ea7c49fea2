#!/usr/bin/env python3
"""Prefill's K/V loads: TMA descriptors against pointer loads, the same generated kernel and tile
(the h200 policies' ``prefill_kv_tma`` of attention_launch and 3 stages at tile width 128 of
attention were chosen from this).

    python3 bench/prefill_tma.py                  # on a GPU (~40 s)
    python3 bench/prefill_tma.py --cpu-smoke --hw h200

For each case (bf16; equal, ragged and windowed batches; head_dim 64, 128, 256): the target's
prefill kernel launched with ``kv_tma=False`` and ``kv_tma=True`` (policy_runtime/attention/ops.py
``Attention.prefill``), and at head_dim 128 the 2-stage kernel of the same tile both ways too;
each checked against float32 SDPA on the same inputs (relative Frobenius error), then timed with
policy_runtime/timing.py's gpu_ms, both ways in each of 3 interleaved rounds; TFLOP/s count
4 * head_dim per (query row, key seen) pair.  The public ``prefill_attention`` is checked too.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys

from smoke import smoke_setup

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--cpu-smoke", action="store_true", help="tiny fp16 shapes, CPU interpreter (no timing)")
ap.add_argument("--hw", default=None, help="hardware spec name (default: detect the GPU)")
ap.add_argument("--json", default=None, help="results file (default: $OUT/prefill_tma.json)")
ARGS = ap.parse_args()
SMOKE = smoke_setup(ARGS)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from generated import attention as at  # noqa: E402
from generated.dispatch import target_name  # noqa: E402
from policy_runtime.report import quiet_on_closed_pipe  # noqa: E402
from policy_runtime.timing import gpu_ms  # noqa: E402
from runlog import RunLog  # noqa: E402

DEV = "cpu" if SMOKE else "cuda"
DT = torch.float16 if SMOKE else torch.bfloat16
HW = target_name(ARGS.hw)
ATT = at._ATTENTION
ROUNDS = 1 if SMOKE else 3
RES: dict = {"hw": HW, "rounds": ROUNDS, "cases": []}
RUN = RunLog("prefill_tma", RES, smoke=SMOKE, json_arg=ARGS.json)
log = RUN.log

if SMOKE:
    # (head_dim, query heads, kv heads, lengths, causal, window)
    CASES = [(32, 4, 2, [37, 64, 5], True, 0), (32, 4, 2, [70], False, 0), (32, 4, 2, [90], True, 24)]
else:
    CASES = [
        (128, 32, 8, [8192] * 2, True, 0),
        (128, 32, 8, [8192] * 2, False, 0),
        (128, 32, 8, [1024] * 16, True, 0),
        (128, 32, 8, [1024] * 16, False, 0),
        (128, 32, 8, [1000, 333, 8192, 77, 4100], True, 0),
        (128, 32, 8, [16384], True, 4096),
        (64, 32, 8, [8192] * 2, True, 0),
        (64, 32, 8, [8192] * 2, False, 0),
        (64, 32, 8, [1000, 333, 2049], False, 0),
        (256, 16, 4, [8192] * 2, True, 0),
        (256, 16, 4, [8192] * 2, False, 0),
        (256, 16, 4, [999, 4097], True, 0),
    ]


def reference(q, k, v, lens, causal, window):
    outs, a = [], 0
    for n in lens:
        qb, kb, vb = (t[a : a + n].transpose(0, 1).float() for t in (q, k, v))
        mask = None
        if causal or window:
            i = torch.arange(n, device=DEV)[:, None]
            j = torch.arange(n, device=DEV)[None, :]
            mask = j <= i
            if window:
                mask &= j >= i - (window - 1)
        o = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, enable_gqa=True)
        outs.append(o.transpose(0, 1))
        a += n
    return torch.cat(outs)


def rel(got, ref) -> float:
    return ((got.float() - ref).norm() / ref.norm()).item()


def main() -> int:
    for D, H, Hkv, lens, causal, window in CASES:
        T = sum(lens)
        q = torch.randn(T, H, D, device=DEV, dtype=DT)
        # K and V as views of larger buffers: rows past the last sequence hold other data.
        k = torch.randn(T + 64, Hkv, D, device=DEV, dtype=DT)[:T]
        v = torch.randn(T + 64, Hkv, D, device=DEV, dtype=DT)[:T]
        cu = torch.tensor([0] + [sum(lens[: i + 1]) for i in range(len(lens))], dtype=torch.int32, device=DEV)
        ref = reference(q, k, v, lens, causal, window)
        sel = ATT.select(DT, D, HW)
        ws = (window - 1, 0) if window else (-1, -1)
        seen = sum(min(n, window) * n - (min(n, window) * (min(n, window) - 1)) // 2 if window else
                   (n * (n + 1) // 2 if causal else n * n) for n in lens)  # fmt: skip
        flops = 4 * D * H * seen
        kernels = [sel.prefill]
        if D == 128 and sel.prefill.num_stages != 2:
            twin = f"_prefill_16bit_{sel.prefill.block_m}x{sel.prefill.block_n}_w{sel.prefill.num_warps}_s2"
            if twin in at.KERNELS:
                kernels.append(at.KERNELS[twin])
        methods = {}
        for kern in kernels:
            for tma in (False, True):
                name = f"{kern.name} {'tma' if tma else 'pointers'}"
                methods[name] = (lambda kern=kern, tma=tma: ATT.prefill(
                    q, k, v, cu, cu, max(lens), max(lens), causal=causal, window_size=ws, hw=HW, kernel=kern,
                    kv_tma=tma))  # fmt: skip
        row = {"head_dim": D, "heads": [H, Hkv], "lens": lens, "causal": causal, "window": window,
               "policy_kernel": sel.prefill.name, "policy_tma": bool(sel.launch.prefill_kv_tma), "methods": {}}  # fmt: skip
        for name, fn in methods.items():
            row["methods"][name] = {"err": rel(fn(), ref), "ms": []}
        pub = at.prefill_attention(q, k, v, cu, cu, max(lens), max(lens), causal=causal, window_size=ws, hw=HW)
        row["public_err"] = rel(pub, ref)
        bad = [n for n, m in row["methods"].items() if not m["err"] < 2e-2] + (
            ["public"] if not row["public_err"] < 2e-2 else []
        )
        if bad:
            sys.exit(f"prefill_tma: {bad} wrong on d={D} lens={lens} causal={causal} window={window}")
        if not SMOKE:
            for r in range(ROUNDS):
                order = list(methods) if r % 2 == 0 else list(reversed(methods))
                for name in order:
                    row["methods"][name]["ms"].append(gpu_ms(methods[name], reps=30))
            for m in row["methods"].values():
                m["median_ms"] = statistics.median(m["ms"])
                m["tflops"] = flops / m["median_ms"] / 1e9
        RES["cases"].append(row)
        RUN.write()
        desc = f"d={D} {H}/{Hkv} {len(lens)} x {max(lens)}{' ragged' if len(set(lens)) > 1 else ''}"
        desc += f"{' causal' if causal else ' full'}{f' window {window}' if window else ''}"
        parts = []
        for kern in kernels:
            p, t = row["methods"][f"{kern.name} pointers"], row["methods"][f"{kern.name} tma"]
            if SMOKE:
                parts.append(f"{kern.name}: err {p['err']:.1e} / {t['err']:.1e}")
            else:
                parts.append(f"{kern.name}: pointers {p['tflops']:.1f} tma {t['tflops']:.1f} TFLOP/s "
                             f"(x{p['median_ms'] / t['median_ms']:.3f}; err {t['err']:.1e})")  # fmt: skip
        log(f"{desc}: " + "; ".join(parts) + f"; policy {'tma' if row['policy_tma'] else 'pointers'}")
        RUN.release()
    return 0


if __name__ == "__main__":
    sys.exit(quiet_on_closed_pipe(main))
