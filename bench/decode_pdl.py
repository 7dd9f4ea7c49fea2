#!/usr/bin/env python3
"""Paged decode with its V2 merge launched as a programmatic dependent launch (PDL: Hopper and
later, what decode_attention does there) or as a plain launch, A/B in one process.

    python3 bench/decode_pdl.py        # on an NVIDIA GPU of compute capability 9.0 or later (~20 s)

Each case (bf16, block size 16, target h200's policy) runs 3 rounds of both modes in turn; each
mode clears the call caches, checks that both give the same output, and is timed eager and
replayed from a CUDA graph (policy_runtime/timing.py's gpu_ms); medians of the rounds, in µs.
"Off" replaces policy_runtime.launch.programmatic with a function that answers False.
"""

from __future__ import annotations

import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

if not torch.cuda.is_available() or torch.version.hip is not None or torch.cuda.get_device_capability()[0] < 9:
    print("decode_pdl.py needs an NVIDIA GPU of compute capability 9.0 or later (programmatic dependent launch)",
          file=sys.stderr)  # fmt: skip
    sys.exit(2)

from generated import attention as at  # noqa: E402
from policy_runtime import call_cache  # noqa: E402
from policy_runtime import launch as _launch  # noqa: E402
from policy_runtime.report import quiet_on_closed_pipe  # noqa: E402
from policy_runtime.timing import captured, gpu_ms  # noqa: E402

BS = 16
real = _launch.programmatic


def case(D, H, Hkv, batch, ctx, window):
    per = -(-ctx // BS)
    table = torch.randperm(batch * per, device="cuda").to(torch.int32).view(batch, per)
    kc = torch.randn(batch * per, BS, Hkv, D, device="cuda").to(torch.bfloat16)
    vc = torch.randn_like(kc)
    q = torch.randn(batch, H, D, device="cuda").to(torch.bfloat16)
    lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    kw = {"window_size": (window - 1, 0)} if window else {}
    out = torch.empty_like(q)

    def fn():
        at.decode_attention(q, kc, vc, table, lens, out=out, hw="h200", **kw)

    res, outs = {}, {}
    for _ in range(3):
        for mode in ("off", "pdl"):
            _launch.programmatic = real if mode == "pdl" else (lambda t: False)
            call_cache.clear_all()
            fn()
            torch.cuda.synchronize()
            outs[mode] = out.clone()
            e = gpu_ms(fn, reps=60)
            g = gpu_ms(captured(fn)[0].replay, reps=60)
            res.setdefault(mode, []).append((e, g))
    _launch.programmatic = real
    call_cache.clear_all()
    same = torch.equal(outs["off"], outs["pdl"])
    med = {m: [statistics.median(x[i] for x in v) * 1e3 for i in (0, 1)] for m, v in res.items()}
    print(f"d={D} {H}/{Hkv} b{batch} ctx{ctx} win{window}: off eager {med['off'][0]:7.1f} graph {med['off'][1]:7.1f} | "
          f"pdl eager {med['pdl'][0]:7.1f} graph {med['pdl'][1]:7.1f} | same {same}", flush=True)  # fmt: skip


# (head_dim, heads, KV heads, batch, context, window)
CASES = [
    (128, 32, 8, 8, 32768, 4096), (128, 32, 8, 1, 1024, 0), (128, 32, 8, 8, 8192, 0), (128, 32, 8, 1, 32768, 0),
    (256, 16, 8, 8, 32768, 4096), (64, 16, 16, 8, 8192, 0), (256, 16, 2, 32, 32768, 0), (128, 32, 8, 32, 32768, 0),
    (128, 32, 8, 256, 1024, 0),
]  # fmt: skip


def main() -> int:
    for c in CASES:
        case(*c)
    return 0


sys.exit(quiet_on_closed_pipe(main))
