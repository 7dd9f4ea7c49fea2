#!/usr/bin/env python3
"""Sweep attention tiles on one GPU (H200), bf16: which prefill and decode configs to put in the specs.

    python3 bench/attention_sweep.py --json OUT.json                 # every case, to --budget-s (225 s)
    python3 bench/attention_sweep.py --json OUT.json --only 'prefill d=128' --budget-s 55
    python3 bench/attention_sweep.py --cpu-smoke --hw h200 --json OUT.json   # tiny fp16, interpreter

Prefill: (BLOCK_M, BLOCK_N, num_warps, num_stages) per head dim (64/128/256), each with pointer and TMA
loads of K/V (--kv-tma), on causal (8k and 16 x 1k tokens), non-causal and sliding-window (+ soft-cap)
cases, in TFLOP/s, with SDPA (its default backend, flash or cuDNN as
torch picks) beside the plain cases and compiled FlexAttention beside the windowed d=128 case (--flex; its compile takes about a minute).  Decode:
(block_n, num_warps, num_stages, FP8_VIA_F16) over bf16 and fp8 caches and a window, then V2
partition sizes with the case's best tile, as a fraction of a device copy of the bytes read.  Every
config is checked against a reference before it is timed (a failed one is recorded, not timed);
"spec" marks the target's own config.  --only REGEX keeps the cases whose name matches.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import sys

from smoke import smoke_setup


def _parse():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny fp16 shapes, CPU interpreter")
    ap.add_argument("--hw", default=None, help="hardware spec name (default: detect the GPU)")
    ap.add_argument("--json", default=None, help="JSON path (default $OUT/attention_sweep.json)")
    ap.add_argument("--parts", nargs="+", default=["prefill", "decode"], choices=["prefill", "decode"])
    ap.add_argument("--only", default=None, help="regex: run only the cases whose name matches")
    ap.add_argument("--budget-s", type=float, default=225.0, help="configs past this many seconds are skipped")
    ap.add_argument("--no-bf16cvt", action="store_true", help="fp8 decode tiles only with FP8_VIA_F16 (skip the bf16 conversion)")
    ap.add_argument("--flex", action="store_true", help="time compiled FlexAttention on the windowed d=128 case")
    ap.add_argument(
        "--kv-tma",
        choices=["off", "on", "both"],
        default="both",
        help="prefill K/V loads: pointers (off), TMA descriptors (on) or each config both ways (default)",
    )
    return ap.parse_args()


ARGS = _parse()
SMOKE = smoke_setup(ARGS)  # before torch and Triton are imported

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from bench.runlog import RunLog  # noqa: E402
from bench.timing import cpu_ms, gpu_ms, rel_err  # noqa: E402
from generated import attention as at  # noqa: E402
from generated.dispatch import target_name  # noqa: E402
from policy_runtime.attention.ops import (  # noqa: E402
    DecodeKernel,
    PrefillKernel,
    decode_body,
    decode_plan,
    prefill_body,
)
from policy_runtime.report import quiet_on_closed_pipe  # noqa: E402

DEV = "cpu" if SMOKE else "cuda"
DT = torch.float16 if SMOKE else torch.bfloat16
HW = ARGS.hw
ATT = at._ATTENTION
BLOCK_SIZE = 16
# bf16 output of two summation orders: ~3e-3; a wrong mask or tile is O(1).
MAX_REL_ERR = 2e-2
RES: dict = {"meta": {}, "prefill": [], "decode": [], "skipped": [], "errors": []}
RUN = RunLog("attention_sweep", RES, smoke=SMOKE, json_arg=ARGS.json)
log, sync, release = RUN.log, RUN.sync, RUN.release


# ---------------------------------------------------------------------------------------
# Kernels with their tile as constants given at launch (the generated ones bake theirs in).


# fmt: off
@triton.jit(do_not_specialize=["win_left", "win_right", "bt_stride"])
def _sweep_prefill(
        q, k, v, o, cu_q, cu_k, sm_scale, group, sqt, sqh, skt, skh, svt, svh, sot, soh,
        win_left, win_right, softcap, alibi, sinks, bt, bt_stride, skb, svb, k_scale, v_scale,
        HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr, CAUSAL: tl.constexpr,
        WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, SINKS: tl.constexpr,
        PAGED: tl.constexpr, BLOCK_SIZE: tl.constexpr, KV_FP8: tl.constexpr, KV_DESC: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PREC: tl.constexpr):
    prefill_body(q, k, v, o, cu_q, cu_k, sm_scale, group, sqt, sqh, skt, skh, svt, svh, sot, soh,
                 win_left, win_right, softcap, alibi, sinks, bt, bt_stride, skb, svb, k_scale, v_scale,
                 HEAD_DIM, HEAD_PAD, CAUSAL, WINDOW, SOFTCAP, ALIBI, SINKS, PAGED, BLOCK_SIZE, KV_FP8, KV_DESC,
                 BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, DOT_PREC=DOT_PREC)


@triton.jit(do_not_specialize=["bt_stride", "v1_limit", "torch_limit", "partition_size", "max_parts", "win_len"])
def _sweep_decode(
        q, kc, vc, bt, sl, o, part_o, part_m, part_l, sm_scale, group, bt_stride, v1_limit,
        torch_limit, partition_size, max_parts, sqs, sqh, skb, skt, skh, svb, svt, svh, sos, soh,
        win_len, softcap, alibi, sinks, k_scale, v_scale, HEAD_DIM: tl.constexpr,
        HEAD_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, Q_ROWS: tl.constexpr,
        WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, SINKS: tl.constexpr,
        KV_FP8: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PREC: tl.constexpr, FP8_VIA_F16: tl.constexpr,
        PDL: tl.constexpr = False, V_PAIRS: tl.constexpr = False):
    decode_body(q, kc, vc, bt, sl, o, part_o, part_m, part_l, sm_scale, group, bt_stride, v1_limit,
                torch_limit, partition_size, max_parts, sqs, sqh, skb, skt, skh, svb, svt, svh,
                sos, soh, win_len, softcap, alibi, sinks, k_scale, v_scale, HEAD_DIM, HEAD_PAD,
                BLOCK_SIZE, Q_ROWS, WINDOW, SOFTCAP, ALIBI, SINKS, KV_FP8, BLOCK_N=BLOCK_N,
                DOT_PREC=DOT_PREC, FP8_VIA_F16=FP8_VIA_F16, PDL=PDL, V_PAIRS=V_PAIRS)
# fmt: on


class Bound:
    """A jit kernel with some constexprs fixed: ``bound[grid](*args, **kw)`` launches
    ``fn[grid](*args, **consts, **kw)``, as the generated kernels' launch path calls them."""

    def __init__(self, fn, name, **consts):
        self.fn, self.__name__, self.consts = fn, name, consts

    def __getitem__(self, grid):
        return lambda *a, **kw: self.fn[grid](*a, **self.consts, **kw)


def prefill_kernel(bm, bn, w, s):
    name = f"prefill_{bm}x{bn}_w{w}_s{s}"
    return PrefillKernel(kernel=Bound(_sweep_prefill, name, BLOCK_M=bm, BLOCK_N=bn, DOT_PREC="tf32"),
                         dtype_class="16bit", block_m=bm, block_n=bn, num_warps=w, num_stages=s)  # fmt: skip


def decode_kernel(bn, w, s, via_f16=True):
    name = f"decode_n{bn}_w{w}_s{s}" + ("" if via_f16 else "_bf16cvt")
    kern = Bound(_sweep_decode, name, BLOCK_N=bn, DOT_PREC="tf32", FP8_VIA_F16=via_f16)
    return DecodeKernel(kernel=kern, dtype_class="16bit", block_n=bn, num_warps=w, num_stages=s)


# ---------------------------------------------------------------------------------------
# The cases and the configs tried on each.

if SMOKE:
    # (name, head_dim, heads, kv heads, sequences, length, causal, window, softcap)
    PREFILL_CASES = [
        ("prefill d=64 causal", 64, 2, 1, 1, 70, True, 0, 0.0),
        ("prefill d=128 window", 128, 2, 1, 1, 90, True, 24, 0.0),
        ("prefill d=256 window softcap", 256, 2, 1, 1, 40, True, 16, 50.0),
    ]
    PREFILL_TILES = {64: [(16, 16, 4, 1), (32, 16, 4, 1)], 128: [(16, 16, 4, 1), (32, 32, 4, 1)], 256: [(16, 16, 4, 1)]}
    # (name, head_dim, heads, kv heads, batch, context, cache, window, softcap)
    DECODE_CASES = [
        ("decode d=64 bf16", 64, 4, 2, 2, 100, "16bit", 0, 0.0),
        ("decode d=64 fp8", 64, 4, 2, 2, 100, "fp8", 0, 0.0),
        ("decode d=64 window", 64, 4, 2, 2, 150, "16bit", 40, 0.0),
    ]
    DECODE_TILES = {"16bit": [(16, 4, 1), (32, 4, 1)], "fp8": [(16, 4, 1), (32, 4, 1)]}
    PARTITIONS = [32, 64]
else:
    PREFILL_CASES = [
        ("prefill d=64 causal", 64, 32, 8, 2, 8192, True, 0, 0.0),
        ("prefill d=64 full", 64, 32, 8, 2, 8192, False, 0, 0.0),
        ("prefill d=128 causal", 128, 32, 8, 2, 8192, True, 0, 0.0),
        ("prefill d=128 full", 128, 32, 8, 1, 8192, False, 0, 0.0),
        ("prefill d=128 window", 128, 32, 8, 1, 16384, True, 4096, 0.0),
        ("prefill d=256 causal", 256, 16, 4, 1, 8192, True, 0, 0.0),
        ("prefill d=256 window softcap", 256, 16, 8, 1, 16384, True, 4096, 50.0),
        # Short sequences (16 x 1k), where the peers lead most (bench/RESULTS.md's prefill table):
        # a tile is chosen over both lengths.
        ("prefill d=64 causal 1k", 64, 32, 8, 16, 1024, True, 0, 0.0),
        ("prefill d=128 causal 1k", 128, 32, 8, 16, 1024, True, 0, 0.0),
        ("prefill d=256 causal 1k", 256, 16, 4, 16, 1024, True, 0, 0.0),
    ]
    # (BLOCK_M, BLOCK_N, num_warps, num_stages): the base rule's tiles (128x128 w8 s2 at d <= 128,
    # 64x64 w8 s2 at 256), the h200 policy's (64x64 w4 s3, 128x128 w8 s3, 128x64 w8 s2), the
    # tutorial's 128x64 and deeper pipelines, within 227 KB of K/V stages.
    PREFILL_TILES = {
        64: [(128, 128, 8, 2), (128, 128, 8, 3), (128, 64, 8, 3), (128, 64, 4, 3), (64, 64, 4, 3), (128, 128, 4, 3)],
        128: [(128, 128, 8, 2), (128, 128, 8, 3), (128, 64, 8, 2), (128, 64, 8, 3), (128, 64, 4, 3), (64, 64, 4, 3),
              (64, 128, 4, 2), (128, 32, 8, 4), (128, 64, 4, 2), (64, 64, 4, 2)],
        256: [(64, 64, 8, 2), (64, 64, 4, 2), (64, 32, 4, 3), (128, 64, 8, 2), (128, 32, 8, 3), (64, 64, 4, 3),
              (64, 128, 8, 1)],
    }  # fmt: skip
    DECODE_CASES = [
        ("decode d=128 bf16 b8 ctx8k", 128, 32, 8, 8, 8192, "16bit", 0, 0.0),
        ("decode d=128 fp8 b8 ctx8k", 128, 32, 8, 8, 8192, "fp8", 0, 0.0),
        ("decode d=128 bf16 b8 ctx32k", 128, 32, 8, 8, 32768, "16bit", 0, 0.0),
        ("decode d=128 fp8 b8 ctx32k", 128, 32, 8, 8, 32768, "fp8", 0, 0.0),
        ("decode d=128 bf16 b32 ctx8k", 128, 32, 8, 32, 8192, "16bit", 0, 0.0),
        ("decode d=128 fp8 b32 ctx8k", 128, 32, 8, 32, 8192, "fp8", 0, 0.0),
        ("decode d=256 bf16 b8 ctx8k", 256, 16, 4, 8, 8192, "16bit", 0, 0.0),
        ("decode d=256 fp8 b8 ctx8k", 256, 16, 4, 8, 8192, "fp8", 0, 0.0),
        ("decode d=256 fp8 b32 ctx32k", 256, 16, 4, 32, 32768, "fp8", 0, 0.0),
        ("decode d=128 window b8 ctx32k", 128, 32, 8, 8, 32768, "16bit", 4096, 0.0),
        ("decode d=256 window softcap b8 ctx32k", 256, 16, 8, 8, 32768, "16bit", 4096, 50.0),
        ("decode d=64 bf16 b8 ctx8k", 64, 16, 16, 8, 8192, "16bit", 0, 0.0),
        ("decode d=256/2 bf16 b8 ctx8k", 256, 16, 2, 8, 8192, "16bit", 0, 0.0),
        ("decode d=256/2 bf16 b128 ctx4k", 256, 16, 2, 128, 4096, "16bit", 0, 0.0),
        ("decode d=128 bf16 b128 ctx4k", 128, 32, 8, 128, 4096, "16bit", 0, 0.0),
        ("decode d=256 fp8 b32 ctx8k", 256, 16, 4, 32, 8192, "fp8", 0, 0.0),
    ]
    # (block_n, num_warps, num_stages); fp8 tiles also with FP8_VIA_F16 off (the bf16 conversion).
    # Triton 3.6 pipelines the K/V loads a stage behind the block-table load they depend on: 2-4
    # stages keep one K/V buffer, 5-6 two, 7 three (shared memory of the compiled kernels).
    DECODE_TILES = {
        "16bit": [(32, 4, 2), (32, 4, 3), (64, 4, 2), (64, 4, 3), (64, 4, 4), (128, 4, 2), (64, 8, 3), (16, 4, 4),
                  (32, 4, 5), (64, 4, 5), (32, 4, 7), (64, 4, 7)],
        "fp8": [(32, 4, 3), (64, 4, 2), (64, 4, 3), (64, 4, 4), (128, 4, 2), (128, 4, 3), (128, 8, 2), (256, 4, 2),
                (32, 4, 5), (64, 4, 5), (128, 4, 5), (64, 4, 7), (128, 4, 7), (128, 8, 3), (128, 8, 4), (128, 8, 5),
                (256, 4, 3), (256, 8, 2), (256, 8, 3)],
    }
    PARTITIONS = [256, 512, 1024, 2048]


def keep(name):
    return ARGS.only is None or re.search(ARGS.only, name) is not None


def over_budget(what):
    if RUN.elapsed() > ARGS.budget_s:
        RES["skipped"].append(what)
        log(f"skip {what} (budget)")
        return True
    return False


def record_error(where, e):
    RES["errors"].append({"where": where, "error": f"{type(e).__name__}: {str(e)[:800]}"})
    log(f"ERROR in {where}: {type(e).__name__}: {str(e)[:300]}")


def timed_ms(fn, est_ms):
    if SMOKE:
        return cpu_ms(fn)
    return gpu_ms(fn, reps=max(5, min(50, int(150 / max(est_ms, 1e-3)))), warmup=2)


def estimate_ms(fn):
    """One call after the compile (the first call), in ms: sizes the timed repetitions."""
    fn()
    sync()
    if SMOKE:
        return 0.0
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    ev[0].record()
    fn()
    ev[1].record()
    sync()
    return ev[0].elapsed_time(ev[1])


def rnd(*shape):
    return torch.randn(*shape, device=DEV, dtype=torch.float32).to(DT)


def spec_tag(kernel, spec):
    same = (kernel.block_n, kernel.num_warps, kernel.num_stages) == (spec.block_n, spec.num_warps, spec.num_stages)
    if isinstance(kernel, PrefillKernel):
        same = same and kernel.block_m == spec.block_m
    return same


# ---------------------------------------------------------------------------------------
# Prefill


def prefill_flops(seqs, n, H, D, causal, window):
    if window:
        pairs = n * (n + 1) // 2 if n <= window else window * (window + 1) // 2 + (n - window) * window
    else:
        pairs = n * (n + 1) // 2 if causal else n * n
    return 4 * pairs * D * H * seqs


def prefill_reference(q, k, v, seqs, n, causal, window, softcap, scale):
    """SDPA (its default backend on the GPU) for plain cases, per sequence; a windowed case in fp32 on its last
    256 rows (row i sees keys i - window < j <= i).  Returns (rows compared, reference)."""
    H, D = q.shape[1], q.shape[2]
    if not window:
        qv, kv, vv = (t.view(seqs, n, t.shape[1], D).transpose(1, 2) for t in (q, k, v))
        ref = F.scaled_dot_product_attention(qv, kv, vv, is_causal=causal, enable_gqa=True)
        return slice(None), ref.transpose(1, 2).reshape(seqs * n, H, D).float()
    rows = min(n, 256)
    lo = max(0, n - rows - window + 1)
    g = H // k.shape[1]
    qq = q[n - rows :].float().transpose(0, 1)
    kk = k[lo:n].float().repeat_interleave(g, 1).transpose(0, 1)
    vv = v[lo:n].float().repeat_interleave(g, 1).transpose(0, 1)
    s = torch.matmul(qq, kk.transpose(1, 2)) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(n - rows, n, device=q.device)[:, None]
    j = torch.arange(lo, n, device=q.device)[None, :]
    s = s.masked_fill(~((j <= i) & (j > i - window))[None], float("-inf"))
    return slice(n - rows, n), torch.matmul(torch.softmax(s, -1), vv).transpose(0, 1)


def flex_window(q, k, v, window, softcap):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    n = q.shape[0]

    def mask_mod(b, h, qi, ki):
        return (qi >= ki) & (qi - ki < window)

    def score_mod(score, b, h, qi, ki):
        return softcap * torch.tanh(score / softcap)

    block_mask = create_block_mask(mask_mod, 1, None, n, n, device=DEV)
    fa = torch.compile(flex_attention, dynamic=False)
    qf, kf, vf = (t.transpose(0, 1)[None] for t in (q, k, v))
    mod = score_mod if softcap else None
    return lambda: fa(qf, kf, vf, block_mask=block_mask, score_mod=mod, enable_gqa=True)


def one_prefill_case(name, D, H, Hkv, seqs, n, causal, window, softcap):
    total = seqs * n
    q, k, v = rnd(total, H, D), rnd(total, Hkv, D), rnd(total, Hkv, D)
    cu = torch.arange(0, total + 1, n, dtype=torch.int32, device=DEV)
    out = torch.empty_like(q)
    scale = 1 / math.sqrt(D)
    feat = dict(window_size=(window - 1, 0) if window else (-1, -1), softcap=softcap)
    uses = tuple(u for u, on in (("window", window), ("softcap", softcap)) if on)
    sel = ATT.select(DT, D, hw=HW, device=torch.device(DEV), uses=frozenset(uses))
    spec = sel.prefill
    rows, ref = prefill_reference(q, k, v, seqs, n, causal, window, softcap, scale)
    flops = prefill_flops(seqs, n, H, D, causal, window)
    case = {"name": name, "head_dim": D, "heads": [H, Hkv], "seqs": seqs, "seq": n, "causal": causal,
            "window": window, "softcap": softcap, "spec_kernel": spec.name, "configs": []}  # fmt: skip
    RES["prefill"].append(case)
    peers = {}
    if not window:
        qv, kv, vv = (t.view(seqs, n, t.shape[1], D).transpose(1, 2) for t in (q, k, v))
        peers["sdpa"] = lambda: F.scaled_dot_product_attention(qv, kv, vv, is_causal=causal, enable_gqa=True)
    elif ARGS.flex and not SMOKE and D == 128:
        peers["flex"] = flex_window(q, k, v, window, softcap)
    for peer, fn in peers.items():
        try:
            est = estimate_ms(fn)
            ms = timed_ms(fn, est)
            case[f"{peer}_tflops"] = flops / (ms * 1e-3) / 1e12
        except Exception as e:  # noqa: BLE001
            record_error(f"{name} {peer}", e)
    # TMA descriptor loads where the part has them (ops.py's Attention.prefill kv_tma); the
    # record's own choice (attention_launch's prefill_kv_tma) marks the spec row.
    spec_tma = sel.launch.prefill_kv_tma
    tma_ways = {"off": [False], "on": [True], "both": [False, True]}[ARGS.kv_tma]
    for (bm, bn, w, s), tma in ((t, m) for t in PREFILL_TILES[ATT.tile_of(D)] for m in tma_ways):
        kern = prefill_kernel(bm, bn, w, s)
        cfg = {"block_m": bm, "block_n": bn, "num_warps": w, "num_stages": s, "kv_tma": tma,
               "spec": spec_tag(kern, spec) and tma == spec_tma}  # fmt: skip
        case["configs"].append(cfg)
        if over_budget(f"{name} {kern.name}{' tma' if tma else ''}"):
            cfg["skipped"] = "budget"
            continue

        def ours():
            ATT.prefill(q, k, v, cu, cu, n, n, causal=causal, scale=scale, out=out, hw=HW, kernel=kern, kv_tma=tma,
                        **feat)  # fmt: skip

        try:
            out.fill_(float("nan"))
            est = estimate_ms(ours)
            err = rel_err(out[rows], ref)
            cfg["rel_err"] = err
            cfg["ok"] = bool(torch.isfinite(out[rows]).all()) and err < MAX_REL_ERR
            if not cfg["ok"]:
                log(f"{name} {kern.name}: check FAILED (rel err {err:.3g})")
                continue
            ms = timed_ms(ours, est)
            cfg.update(ms=ms, tflops=flops / (ms * 1e-3) / 1e12)
        except Exception as e:  # noqa: BLE001
            cfg["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            record_error(f"{name} {kern.name}", e)
    good = [c for c in case["configs"] if "tflops" in c]
    if good:
        best = max(good, key=lambda c: c["tflops"])
        case["best"] = {k: best[k] for k in ("block_m", "block_n", "num_warps", "num_stages", "kv_tma", "tflops")}
        spec_row = next((c for c in good if c["spec"]), None)
        if spec_row:
            case["best_over_spec"] = best["tflops"] / spec_row["tflops"]
    print_prefill(case)


def print_prefill(case):
    peers = "  ".join(f"{p} {case[p + '_tflops']:.1f}" for p in ("sdpa", "flex") if p + "_tflops" in case)
    log(f"{case['name']} ({case['heads'][0]}/{case['heads'][1]} heads, {case['seqs']} x {case['seq']}) "
        f"spec {case['spec_kernel']}  {peers}")  # fmt: skip
    for c in case["configs"]:
        tile = f"{c['block_m']:4d} x {c['block_n']:<4d} w{c['num_warps']} s{c['num_stages']}"
        tile += " tma" if c.get("kv_tma") else "    "
        what = f"{c['tflops']:8.1f} TFLOP/s" if "tflops" in c else (c.get("skipped") or c.get("error") or "FAILED")
        log(f"    {tile}  {what}{'  (spec)' if c['spec'] else ''}")


# ---------------------------------------------------------------------------------------
# Decode


_COPY: dict = {}


def copy_bandwidth(nbytes):
    """Bytes read + written a second by a device copy of min(nbytes, 2 GiB)."""
    if SMOKE:
        return float("nan")
    size = min(nbytes, 2 << 30)
    if size not in _COPY:
        src = torch.empty(size // 2, device=DEV, dtype=torch.int16).random_()
        dst = torch.empty_like(src)
        _COPY[size] = 2 * size / (gpu_ms(lambda: dst.copy_(src), reps=20) * 1e-3)
    return _COPY[size]


def decode_setup(D, H, Hkv, batch, context, cache, window):
    per = -(-context // BLOCK_SIZE)
    nb = batch * per
    table = torch.randperm(nb, device=DEV).to(torch.int32).view(batch, per)
    kc, vc = rnd(nb, BLOCK_SIZE, Hkv, D), rnd(nb, BLOCK_SIZE, Hkv, D)
    scales = None
    if cache == "fp8":
        sc = torch.maximum(kc.abs().amax(), vc.abs().amax()).float().reshape(1) / 448.0
        kc = (kc.float() / sc).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
        vc = (vc.float() / sc).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
        scales = (sc, sc)
    query = rnd(batch, H, D)
    # fp32 reference over each sequence's (window's) tokens, dequantized.
    span = min(context, window) if window else context
    first = context - span
    ref = torch.empty(batch, H, D, device=DEV, dtype=torch.float32)
    for i in range(batch):
        ids = table[i].long()
        k = kc[ids].float().reshape(-1, Hkv, D)[first:context]
        v = vc[ids].float().reshape(-1, Hkv, D)[first:context]
        if scales is not None:
            k, v = k * scales[0], v * scales[1]
        qg = query[i].float().view(Hkv, H // Hkv, D)
        s = torch.einsum("hgd,nhd->hgn", qg, k) / math.sqrt(D)
        ref[i] = torch.einsum("hgn,nhd->hgd", torch.softmax(s, -1), v).reshape(H, D)
    return table, kc, vc, scales, query, ref, span


def decode_softcap_ref(query, kc, vc, table, context, window, softcap, D, H, Hkv):
    batch = query.shape[0]
    span = min(context, window)
    ref = torch.empty(batch, H, D, device=DEV, dtype=torch.float32)
    for i in range(batch):
        ids = table[i].long()
        k = kc[ids].float().reshape(-1, Hkv, D)[context - span : context]
        v = vc[ids].float().reshape(-1, Hkv, D)[context - span : context]
        s = torch.einsum("hgd,nhd->hgn", query[i].float().view(Hkv, H // Hkv, D), k) / math.sqrt(D)
        s = softcap * torch.tanh(s / softcap)
        ref[i] = torch.einsum("hgn,nhd->hgd", torch.softmax(s, -1), v).reshape(H, D)
    return ref


def one_decode_case(name, D, H, Hkv, batch, context, cache, window, softcap):
    table, kc, vc, scales, query, ref, span = decode_setup(D, H, Hkv, batch, context, cache, window)
    if softcap:
        ref = decode_softcap_ref(query, kc, vc, table, context, window, softcap, D, H, Hkv)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device=DEV)
    out = torch.empty_like(query)
    fp8 = cache == "fp8"
    uses = frozenset(u for u, on in (("window", window), ("softcap", softcap)) if on)
    sel = ATT.select(DT, D, hw=HW, device=torch.device(DEV), uses=uses, kv_fp8=fp8)
    feat = dict(window_size=(window - 1, 0) if window else (-1, -1), softcap=softcap)
    if scales is not None:
        feat.update(k_scale=scales[0], v_scale=scales[1])
    nbytes = 2 * batch * span * Hkv * D * kc.element_size()
    copy_bw = copy_bandwidth(nbytes)
    case = {"name": name, "head_dim": D, "heads": [H, Hkv], "batch": batch, "context": context, "cache": cache,
            "window": window, "softcap": softcap, "kv_bytes": nbytes, "spec_kernel": sel.decode.name,
            "spec_partition": sel.config.partition_size, "configs": []}  # fmt: skip
    RES["decode"].append(case)

    def run_config(kern, partition, label):
        cfg_rec = dataclasses.replace(sel.config, partition_size=partition)
        lrec = dataclasses.replace(sel.launch, v2_min_partition=2 * kern.block_n)
        _, ps, parts = decode_plan(batch, Hkv, span, cfg_rec, lrec)
        row = {"block_n": kern.block_n, "num_warps": kern.num_warps, "num_stages": kern.num_stages,
               "fp8_via_f16": kern.kernel.consts["FP8_VIA_F16"], "partition_size": partition,
               "plan": "V1" if parts == 1 else f"V2 {parts} x {ps}", "label": label,
               "spec": spec_tag(kern, sel.decode) and partition == sel.config.partition_size
               and kern.kernel.consts["FP8_VIA_F16"]}  # fmt: skip
        case["configs"].append(row)
        if over_budget(f"{name} {kern.name} p{partition}"):
            row["skipped"] = "budget"
            return row

        def ours():
            ATT.decode(query, kc, vc, table, seq_lens, out=out, hw=HW, config=cfg_rec, launch=lrec, kernel=kern,
                       **feat)  # fmt: skip

        try:
            out.fill_(float("nan"))
            est = estimate_ms(ours)
            err = rel_err(out, ref)
            row["rel_err"] = err
            row["ok"] = bool(torch.isfinite(out).all()) and err < MAX_REL_ERR
            if not row["ok"]:
                log(f"{name} {kern.name}: check FAILED (rel err {err:.3g})")
                return row
            ms = timed_ms(ours, est)
            row.update(us=ms * 1e3, tbps=nbytes / (ms * 1e-3) / 1e12, frac_copy=nbytes / (ms * 1e-3) / copy_bw)
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            record_error(f"{name} {kern.name}", e)
        return row

    # 1. Tiles at the spec's partition size (fp8: with and without FP8_VIA_F16).
    spec_ps = sel.config.partition_size
    tiles = list(DECODE_TILES[cache])
    spec_tile = (sel.decode.block_n, sel.decode.num_warps, sel.decode.num_stages)
    if spec_tile not in tiles:
        tiles.insert(0, spec_tile)
    for bn, w, s in tiles:
        run_config(decode_kernel(bn, w, s), spec_ps, "tile")
        if fp8 and not ARGS.no_bf16cvt:
            run_config(decode_kernel(bn, w, s, via_f16=False), spec_ps, "tile")
    # 2. Partition sizes with the best tile.
    good = [c for c in case["configs"] if "us" in c]
    if good:
        b = min(good, key=lambda c: c["us"])
        for ps in PARTITIONS:
            if ps != spec_ps and ps >= b["block_n"]:
                run_config(decode_kernel(b["block_n"], b["num_warps"], b["num_stages"], b["fp8_via_f16"]), ps,
                           "partition")  # fmt: skip
    good = [c for c in case["configs"] if "us" in c]
    if good:
        best = min(good, key=lambda c: c["us"])
        case["best"] = {k: best[k] for k in ("block_n", "num_warps", "num_stages", "fp8_via_f16", "partition_size",
                                             "plan", "us", "frac_copy")}  # fmt: skip
        spec_row = next((c for c in good if c["spec"]), None)
        if spec_row:
            case["spec_us"] = spec_row["us"]
            case["spec_over_best"] = spec_row["us"] / best["us"]
    print_decode(case)


def print_decode(case):
    log(f"{case['name']} ({case['heads'][0]}/{case['heads'][1]} heads, {case['kv_bytes'] / 1e6:.0f} MB) "
        f"spec {case['spec_kernel']} partition {case['spec_partition']}")  # fmt: skip
    for c in case["configs"]:
        tile = f"n{c['block_n']:<4d} w{c['num_warps']} s{c['num_stages']} p{c['partition_size']:<5d}"
        tile += "" if case["cache"] != "fp8" else ("  f16cvt" if c["fp8_via_f16"] else " bf16cvt")
        if "us" in c:
            what = f"{c['us']:9.1f} us  {c['tbps']:5.2f} TB/s  {c['frac_copy']:.2f} of copy  {c['plan']}"
        else:
            what = c.get("skipped") or c.get("error") or "FAILED"
        log(f"    {tile}  {what}{'  (spec)' if c['spec'] else ''}")


# ---------------------------------------------------------------------------------------


def main():
    import platform

    RES["meta"].update(smoke=SMOKE, torch=torch.__version__, triton=triton.__version__,
                       python=platform.python_version(), dtype=str(DT), hw=HW,
                       target=target_name(HW, torch.device(DEV)), only=ARGS.only,
                       device=torch.cuda.get_device_name() if not SMOKE else "cpu (Triton interpreter)")  # fmt: skip
    if "prefill" in ARGS.parts:
        for case in PREFILL_CASES:
            if keep(case[0]):
                try:
                    one_prefill_case(*case)
                except Exception as e:  # noqa: BLE001
                    record_error(case[0], e)
                release()
                RUN.write()
    if "decode" in ARGS.parts:
        for case in DECODE_CASES:
            if keep(case[0]):
                try:
                    one_decode_case(*case)
                except Exception as e:  # noqa: BLE001
                    record_error(case[0], e)
                release()
                RUN.write()
    failed = [c for r in RES["prefill"] + RES["decode"] for c in r["configs"] if c.get("ok") is False]
    log("best per case:")
    for r in RES["prefill"] + RES["decode"]:
        if "best" in r:
            vs = r.get("best_over_spec") or (1 / r["spec_over_best"] if r.get("spec_over_best") else None)
            log(f"    {r['name']:40s} {r['best']}" + (f"  spec/best time {1 / vs:.3f}" if vs else ""))
    log(f"checks failed: {len(failed)}; errors: {len(RES['errors'])}; skipped: {len(RES['skipped'])}")
    RUN.write()
    if failed or RES["errors"]:
        sys.exit(1)


if __name__ == "__main__":
    sys.exit(quiet_on_closed_pipe(main))
