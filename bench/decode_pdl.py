#!/usr/bin/env python3
"""Paged decode with its V2 merge launched as a programmatic dependent launch (PDL: Hopper and
later, what decode_attention does there) or as a plain launch, A/B in one process.

    python3 bench/decode_pdl.py        # on an NVIDIA GPU of compute capability 9.0 or later (~20 s)

Each case (bf16, block size 16, target h200's policy) runs 3 rounds of both modes in turn
(bench/pdl_ab.py: each mode clears the call caches, both must give the same output, each is timed
eager and replayed from a CUDA graph); medians of the rounds, in µs.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

if not torch.cuda.is_available() or torch.version.hip is not None or torch.cuda.get_device_capability()[0] < 9:
    print("decode_pdl.py needs an NVIDIA GPU of compute capability 9.0 or later (programmatic dependent launch)",
          file=sys.stderr)  # fmt: skip
    sys.exit(2)

from bench.pdl_ab import ab  # noqa: E402
from generated import attention as at  # noqa: E402
from policy_runtime.report import quiet_on_closed_pipe  # noqa: E402

BS = 16


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

    med, same = ab(fn, out, rounds=3, reps=60)
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
