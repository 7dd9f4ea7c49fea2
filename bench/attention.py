#!/usr/bin/env python3
"""Benchmark generated/attention.py on one GPU (H200), bf16.

    python3 bench/attention.py                          # the full run (~2-3 min on the H200)
    python3 bench/attention.py --cpu-smoke --hw h200    # tiny fp16 shapes in Triton's interpreter

Each method is checked first (a failed check is recorded, not timed, exit 1), then timed
(policy_runtime/timing.py) in interleaved rounds.  Phases (--phases): prefill (causal and not, head
dims 64/128/256, against SDPA flash, SDPA cuDNN and compiled FlexAttention); paged decode (GQA 1-8,
batch 1-256, context 1k-128k, ragged too: bytes a second against a device copy, SDPA and vLLM's
Triton decode); V1 against V2; the first call of a new length; fp8_decode (an e4m3 KV cache against
the bf16 one and vLLM's k_scale decode); window (prefill with a 4096-token window against
FlexAttention with the same mask, decode with a window as the window's bytes a second).  JSON to
$OUT/attention.json (or --json PATH).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import math
import os
import platform
import sys
import time
import traceback

from smoke import smoke_setup


def _parse():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny fp16 shapes, CPU interpreter")
    ap.add_argument("--hw", default=None, help="hardware spec name (default: detect the GPU)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per case (default 3)")
    ap.add_argument("--budget-s", type=float, default=240.0, help="soft budget: later cases are skipped past it")
    ap.add_argument("--json", default=None, help="JSON path (default $OUT/attention.json)")
    ap.add_argument("--quick", action="store_true", help="fewer prefill lengths and decode cases (the ~2 min run)")
    ap.add_argument(
        "--phases",
        nargs="+",
        default=["prefill", "decode", "v1_v2", "first_call", "fp8_decode", "window"],
        choices=["prefill", "decode", "v1_v2", "first_call", "fp8_decode", "window", "window_prefill", "window_decode"],
        help="which phases to run, in this order (default: all)",
    )
    ap.add_argument(
        "--window-cases",
        default=None,
        help="window phases: only the cases whose label contains this text (e.g. gemma2, d=128)",
    )
    ap.add_argument(
        "--no-flex",
        action="store_true",
        help="leave FlexAttention out (torch.compile recompiles it for new packed lengths: seconds a case)",
    )
    return ap.parse_args()


ARGS = _parse()
SMOKE = smoke_setup(ARGS)  # before torch and Triton are imported

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402

from bench import decode_cases, peers  # noqa: E402
from bench.runlog import RunLog  # noqa: E402
from bench.timing import captured, cpu_ms, gpu_ms, interleaved, rel_err  # noqa: E402
from generated import attention as at  # noqa: E402
from generated.dispatch import target_name  # noqa: E402
from policy_runtime.attention.ops import decode_plan  # noqa: E402
from policy_runtime.report import quiet_on_closed_pipe  # noqa: E402

DEV = "cpu" if SMOKE else "cuda"
DT = torch.float16 if SMOKE else torch.bfloat16
HW = ARGS.hw
ROUNDS = 1 if SMOKE else ARGS.rounds
# Relative error (||ours - sdpa|| / ||sdpa||) a result may have: bf16 rounding of two
# different summation orders is ~3e-3; fp16 in the smoke run less.
MAX_REL_ERR = 2e-2
# Models: head_dim -> (query heads, KV heads); fewer heads in the smoke run (the interpreter
# runs programs one by one): GQA over two KV heads at 128, one KV head at 256.
MODELS = {128: (4, 2), 256: (2, 1)} if SMOKE else {128: (32, 8), 256: (16, 4)}
# Prefill's head dims: MODELS and head_dim 64 (32 query / 8 KV heads) on the GPU.
PREFILL_MODELS = MODELS if SMOKE else {64: (32, 8), **MODELS}
# Decode's shapes (head_dim, query heads, KV heads): GQA ratios 1, 4 and 8 over head dims 64, 128, 256.
DECODE_MODELS = [(128, 4, 2), (256, 4, 1)] if SMOKE else decode_cases.MODELS
# The peers: vLLM's Triton paged decode (../shared/peers/vllm_triton.py, when there) at each of
# VLLM_KV_SPLITS splits, the better of them per case (issue 33: "the better of its 4 and 8 splits";
# 8 is SGLang's default, vLLM's MLA caller uses 4), compiled FlexAttention and SDPA's cuDNN backend
# (GPU only) in prefill.
VLLM, PEER_NOTE = peers.load()
VLLM_KV_SPLITS = (2, 4) if SMOKE else (4, 8)  # (the smoke run: the interpreter runs each split's programs)
RES: dict = {
    "meta": {},
    "prefill": [],
    "decode": [],
    "v1_vs_v2": [],
    "first_call": {},
    "fp8_decode": [],
    "window_prefill": [],
    "window_decode": [],
    "correctness": [],
    "peers": {},
    "skipped": [],
    "errors": [],
}
_COPY: dict = {}
RUN = RunLog("attention", RES, smoke=SMOKE, json_arg=ARGS.json)
elapsed, log, sync, release, write_json = RUN.elapsed, RUN.log, RUN.sync, RUN.release, RUN.write

if SMOKE:
    # One length: every kernel of every bucket runs in tests/test_attention.py; here, the wiring.
    PREFILL_SEQS, PREFILL_TOKENS = [24], 24
    V1V2 = [(1, 300)]  # forced V1 and forced V2 (several partitions) at any length
    # (batch, context, ragged): a short context (V1), a long one (V2: one sequence, the fewest
    # programs), and a ragged batch.
    DECODE_CASES = [(2, 40, False), (1, 600, False), (2, 100, True)]
    # The vLLM peer (slow in the interpreter) at head_dim 128 on the ragged batch only.
    SMOKE_VLLM = {(2, 100, True)}
else:
    PREFILL_SEQS, PREFILL_TOKENS = ([1024, 8192] if ARGS.quick else [1024, 4096, 16384]), 16384
    DECODE_BATCHES, DECODE_CONTEXTS = [1, 8, 32, 128], [1024, 8192, 32768]
    V1V2 = [(8, 16384), (8, 32768), (32, 32768)]
    # Batch 1 to 256, context 1k to 128k, equal and ragged (bench/decode_cases.py).
    DECODE_CASES = decode_cases.CASES + ([] if ARGS.quick else decode_cases.MORE_CASES)
# FP8-cache decode (batch, context, ragged) at head_dims 128 and 256 (MODELS' heads).
FP8_CASES = (
    [(2, 40, False), (2, 100, True)]
    if SMOKE
    else [(8, 8192, False), (8, 32768, False), (32, 8192, False), (32, 32768, True), (64, 16384, False)]
)
# Issue 36's windowed cases: prefill (name, head_dim, heads, KV heads, tokens, window, soft-cap),
# one causal sequence each; decode (head_dim, heads, KV heads, batch, context, window, soft-cap).
if SMOKE:
    WINDOW_PREFILL = [("window d=128", 128, 4, 2, 70, 16, 0.0), ("gemma2 d=256", 256, 4, 2, 70, 16, 50.0)]
    WINDOW_DECODE = [(128, 4, 2, 2, 600, 64, 0.0), (256, 4, 2, 2, 600, 64, 50.0)]
else:
    WINDOW_PREFILL = [
        ("window d=128", 128, 32, 8, 16384, 4096, 0.0),
        ("window d=128", 128, 32, 8, 32768, 4096, 0.0),
        ("gemma2 d=256", 256, 16, 8, 16384, 4096, 50.0),
    ]
    WINDOW_DECODE = [
        (128, 32, 8, 8, 32768, 4096, 0.0), (128, 32, 8, 8, 131072, 4096, 0.0), (128, 32, 8, 32, 32768, 4096, 0.0),
        (128, 32, 8, 64, 32768, 4096, 0.0), (128, 32, 8, 64, 131072, 4096, 0.0),
        (256, 16, 8, 8, 32768, 4096, 50.0), (256, 16, 8, 64, 32768, 4096, 50.0),
    ]  # fmt: skip
    if ARGS.quick:
        WINDOW_PREFILL, WINDOW_DECODE = WINDOW_PREFILL[::2], WINDOW_DECODE[::2]
# The H200's device copy (read + written bytes a second, bench/RESULTS.md): the brief's yardstick,
# reported beside the copy of the same bytes that this run measures.
H200_COPY_TBPS = 4.27
BLOCK_SIZE = 16
# Ragged batches: each sequence's length as a fraction of the phase's sequence length.
RAGGED = decode_cases.RAGGED


def record_error(where, e):
    RES["errors"].append(
        {"where": where, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
    )
    log(f"ERROR in {where}: {type(e).__name__}: {str(e)[:500]}")


def over_budget(what, share=1.0):
    """Past ``share`` of the budget (prefill stops at 45% of it and decode at 85%, so that one phase
    cannot take the others' time)?  Never in the smoke run."""
    if not SMOKE and elapsed() > ARGS.budget_s * share:  # (the smoke run checks every case's wiring)
        RES["skipped"].append(f"{what} (budget)")
        log(f"skip {what} (budget)")
        return True
    return False


def timer(est_ms):
    """GPU ms with about 0.25 s of runs per measurement (5 to 100 runs); one call on the CPU."""
    if SMOKE:
        return cpu_ms
    reps = max(5, min(100, int(250 / max(est_ms, 1e-3))))
    return lambda fn: gpu_ms(fn, reps=reps)


def estimate_ms(fn):
    if SMOKE:
        return 0.0
    fn()
    sync()
    t = time.perf_counter()
    fn()
    sync()
    return (time.perf_counter() - t) * 1e3


def rnd(*shape):
    return (
        torch.randn(*shape, device=DEV, dtype=torch.float32).to(DT)
        if SMOKE
        else torch.randn(*shape, device=DEV, dtype=DT)
    )


def check(name, got, ref):
    """One correctness check: finite and within MAX_REL_ERR of the reference."""
    err = rel_err(got, ref.float())
    ok = bool(torch.isfinite(got).all()) and err < MAX_REL_ERR
    RES["correctness"].append({"check": name, "ok": ok, "rel_err": err})
    if not ok:
        log(f"correctness FAILED {name}: rel err {err:.3g}")
    return ok


def sdpa(q, k, v, causal):
    """SDPA, GQA through enable_gqa; the caller picks the backend (flash_only)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)


def flash_only(fn):
    """fn with SDPA restricted to the flash backend (the math backend on the CPU)."""
    if SMOKE:
        return fn
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def run():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return fn()

    return run


def replayed(fn):
    """fn captured into a CUDA graph (its replay): the per-sequence SDPA calls of a ragged batch
    then run without the host's launch gaps between them.  As it is on the CPU."""
    return fn if SMOKE else captured(fn, warmups=2)[0].replay


def graph_method(row, fn):
    """``fn`` replayed from a CUDA graph, the same launches without the host between them (how a
    server runs decode), or None with the capture's error in ``row`` (none on the CPU)."""
    if SMOKE:
        return None
    try:
        return captured(fn, warmups=2)[0].replay
    except Exception as e:  # noqa: BLE001
        row["graph_error"] = f"{type(e).__name__}: {str(e)[:300]}"
        return None


def geomean(values):
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


# ---------------------------------------------------------------------------------------
# 0. meta


def phase_meta():
    m = RES["meta"]
    m.update(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        python=platform.python_version(),
        torch=torch.__version__,
        triton=triton.__version__,
        cuda=torch.version.cuda,
        smoke=SMOKE,
        dtype=str(DT),
        rounds=ROUNDS,
        argv=sys.argv[1:],
        device="cpu (TRITON_INTERPRET=1)" if SMOKE else torch.cuda.get_device_name(),
    )
    target = target_name(HW, torch.device(DEV))
    m["target"] = target
    m["policies"] = {}
    for head_dim in MODELS:
        sel = at.select(DT, head_dim, hw=HW, device=torch.device(DEV))
        m["policies"][head_dim] = {
            "model": sel.model,
            "config": dataclasses.asdict(sel.config),
            "launch": dataclasses.asdict(sel.launch),
            "prefill_kernel": sel.prefill.name,
            "decode_kernel": sel.decode.name,
        }
        log(f"head_dim {head_dim}: {m['policies'][head_dim]}")
    log(f"{m['date']}  torch {torch.__version__}  triton {triton.__version__}  device {m['device']} -> target {target}")


# ---------------------------------------------------------------------------------------
# 1. prefill


def prefill_lengths(seq, ragged):
    if not ragged:
        return [seq] * max(1, PREFILL_TOKENS // seq)
    n = max(2 if SMOKE else 3, (3 * PREFILL_TOKENS) // (2 * seq))  # (the smoke run: two lengths)
    return [max(1, int(seq * RAGGED[i % len(RAGGED)])) for i in range(n)]


def prefill_flops(lengths, H, D, causal):
    return sum(4 * n * n * D * H / (2 if causal else 1) for n in lengths)


def phase_prefill():
    for causal in (True, False):
        for head_dim, (H, Hkv) in PREFILL_MODELS.items():
            for seq in PREFILL_SEQS:
                for ragged in (False, True):
                    name = f"prefill {'causal' if causal else 'full'} d={head_dim} seq={seq} {'ragged' if ragged else 'equal'}"
                    if over_budget(name, 0.45):
                        continue
                    try:
                        one_prefill(name, causal, head_dim, H, Hkv, seq, ragged)
                    except Exception as e:  # noqa: BLE001
                        record_error(name, e)
                    release()
    rows = [r for r in RES["prefill"] if "ratio" in r]
    key = [r["ratio"] for r in rows if r["causal"] and r["seq"] >= (PREFILL_SEQS[1] if len(PREFILL_SEQS) > 1 else 0)]
    # Issue 33's measure: ours over the best of SDPA flash, cuDNN and FlexAttention on each case
    # (the peers that ran; a case where one was left out counts the others).
    best = [
        r["ours_tflops"] / max(r[p + "_tflops"] for p in ("sdpa", "cudnn", "flex") if p + "_tflops" in r) for r in rows
    ]
    RES["prefill_summary"] = {
        "geomean_causal_4k_16k": geomean(key),
        "min_ratio": min((r["ratio"] for r in rows), default=None),
        "geomean_all": geomean(r["ratio"] for r in rows),
        "geomean_vs_best_peer": geomean(best),
        "min_vs_best_peer": min(best, default=None),
        "cases_under_0_9_of_best_peer": sum(x < 0.9 for x in best),
    }
    log(f"prefill summary: {RES['prefill_summary']}")
    write_json()


# Block masks are built eagerly (create_block_mask's _compile=False: the [tokens, tokens] mask is
# materialized once, a few GB at 32k, outside the timing).  Compiled, the first one took most of
# 233 s on the H200 (pytorch/pytorch#182060: torch.compile of create_block_mask has pathological
# cold compiles at some lengths); eager, the three windowed cases' masks took 8.8 s (the first,
# with CUDA's warm-up) and 0.02 s, and FlexAttention's own compile 2.8-4.5 s a case.
_FLEX = []


def flex_fn():
    """FlexAttention, compiled once (torch.compile) on the GPU; as it is on the CPU."""
    if not _FLEX:
        from torch.nn.attention.flex_attention import flex_attention

        if not SMOKE:
            # One compile per (shape, head dim, score_mod): the prefill phase alone makes a dozen,
            # past dynamo's default limit of 8, after which flex_attention silently ran unfused
            # (5.4 TFLOP/s on the gemma2 window case, 2026-12-03).  Raise the limit, and make
            # hitting it an error rather than a slow peer column.
            import torch._dynamo

            torch._dynamo.config.recompile_limit = 256
            if hasattr(torch._dynamo.config, "fail_on_recompile_limit_hit"):
                torch._dynamo.config.fail_on_recompile_limit_hit = True
        _FLEX.append(flex_attention if SMOKE else torch.compile(flex_attention))
    return _FLEX[0]


def flex_method(q, k, v, lengths, causal):
    """FlexAttention over the packed batch ([1, heads, tokens, dim] views) with a document mask
    (and causal within each sequence): one call for equal and ragged batches alike.  The block
    mask is built here, once, outside the timing (as cu_seqlens are)."""
    from torch.nn.attention.flex_attention import create_block_mask

    total = q.shape[0]
    doc = torch.repeat_interleave(
        torch.arange(len(lengths), device=DEV), torch.tensor(lengths, device=DEV), output_size=total
    )

    def mask_mod(b, h, qi, ki):
        same = doc[qi] == doc[ki]
        return same & (qi >= ki) if causal else same

    block_mask = create_block_mask(mask_mod, 1, None, total, total, device=DEV, _compile=False)
    qf, kf, vf = (t.transpose(0, 1)[None] for t in (q, k, v))
    fa = flex_fn()

    def run():
        return fa(qf, kf, vf, block_mask=block_mask, enable_gqa=True)

    return run


def cudnn_method(q, k, v, lengths, causal):
    """SDPA's cuDNN backend as the flash reference calls SDPA (one call on an equal batch, one
    call per sequence replayed from a CUDA graph on a ragged one).  GQA through enable_gqa; where
    this cuDNN refuses it, K and V expanded to the query heads (outside the timing), noted in
    RES["peers"].  None on the CPU (no cuDNN)."""
    if SMOKE:
        RES["peers"]["cudnn"] = "left out: SDPA's cuDNN backend needs a GPU"
        return None
    from torch.nn.attention import SDPBackend, sdpa_kernel

    H, Hkv = q.shape[1], k.shape[1]

    def calls(kk, vv, gqa):
        cu = [0]
        for n in lengths:
            cu.append(cu[-1] + n)

        def one(a, b):
            qs, ks, vs = (t[a:b].transpose(0, 1)[None] for t in (q, kk, vv))
            return F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, enable_gqa=gqa)

        def run():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                if len(set(lengths)) == 1:
                    B, n = len(lengths), lengths[0]
                    qv, kv2, vv2 = (t.view(B, n, t.shape[1], t.shape[2]).transpose(1, 2) for t in (q, kk, vv))
                    o = F.scaled_dot_product_attention(qv, kv2, vv2, is_causal=causal, enable_gqa=gqa)
                    return o.transpose(1, 2).reshape(q.shape)
                return torch.cat([one(a, b)[0].transpose(0, 1) for a, b in zip(cu, cu[1:])])

        return run

    try:
        fn = calls(k, v, True)
        fn()
        sync()
        RES["peers"].setdefault("cudnn", "GQA through enable_gqa")
    except Exception as e:  # noqa: BLE001
        rep = H // Hkv
        k2, v2 = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        fn = calls(k2, v2, False)
        RES["peers"]["cudnn"] = f"K/V expanded to the query heads (enable_gqa: {type(e).__name__}: {str(e)[:200]})"
    return fn


def one_prefill(name, causal, head_dim, H, Hkv, seq, ragged):
    lengths = prefill_lengths(seq, ragged)
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    total = cu[-1]
    q, k, v = rnd(total, H, head_dim), rnd(total, Hkv, head_dim), rnd(total, Hkv, head_dim)
    cu_t = torch.tensor(cu, dtype=torch.int32, device=DEV)
    out = torch.full_like(q, float("nan"))

    def ours():
        at.prefill_attention(q, k, v, cu_t, cu_t, max(lengths), max(lengths), causal=causal, out=out, hw=HW)

    # SDPA on the same data: [batch, heads, seq, dim] views of equal sequences; one call per
    # sequence of a ragged batch.
    ref_out = torch.empty_like(q)
    if not ragged:
        B = len(lengths)

        def view(t):
            return t.view(B, seq, t.shape[1], head_dim).transpose(1, 2)

        qv, kv, vv = view(q), view(k), view(v)

        def reference():
            ref_out.view(B, seq, H, head_dim).copy_(sdpa(qv, kv, vv, causal).transpose(1, 2))

        reference_timed = flash_only(lambda: sdpa(qv, kv, vv, causal))
    else:
        parts = [(a, b) for a, b in zip(cu, cu[1:])]

        def seq_views(a, b):
            return (t[a:b].transpose(0, 1)[None] for t in (q, k, v))

        def reference():
            for a, b in parts:
                ref_out[a:b] = sdpa(*seq_views(a, b), causal)[0].transpose(0, 1)

        def each_sequence():
            for a, b in parts:
                sdpa(*seq_views(a, b), causal)

        reference_timed = None

    ours()
    flash_only(reference)()
    sync()
    ok = check(name, out, ref_out)
    if reference_timed is None and ok:
        reference_timed = replayed(flash_only(each_sequence))
    row = {
        "name": name,
        "causal": causal,
        "head_dim": head_dim,
        "heads": [H, Hkv],
        "seq": seq,
        "ragged": ragged,
        "lengths": lengths,
        "ok": ok,
    }
    RES["prefill"].append(row)
    if not ok:
        return
    flops = prefill_flops(lengths, H, head_dim, causal)
    methods = {"ours": ours, "sdpa": reference_timed}
    # The peers, each checked against the flash reference before it is timed; one that fails to
    # run or to match is recorded (a failed check, or an error in RES["peers"]) and not timed.
    for peer, make in (
        ("flex", lambda: flex_method(q, k, v, lengths, causal)),
        ("cudnn", lambda: cudnn_method(q, k, v, lengths, causal)),
    ):
        if peer == "flex" and ARGS.no_flex:
            RES["peers"]["flex"] = "left out (--no-flex)"
            continue
        if SMOKE and seq != PREFILL_SEQS[0]:
            continue  # the interpreter's run: the peers' wiring at the shortest length only
        try:
            fn = make()
            if fn is None:
                continue
            got = fn()
            if peer == "flex":
                got = got[0].transpose(0, 1)
            sync()
            if check(f"{name} ({peer})", got, ref_out):
                # A ragged batch's per-sequence cuDNN calls replayed from a CUDA graph, as flash's.
                methods[peer] = replayed(fn) if (ragged and peer == "cudnn") else fn
        except Exception as e:  # noqa: BLE001
            row.setdefault("peer_errors", {})[peer] = f"{type(e).__name__}: {str(e)[:300]}"
            log(f"{name}: {peer}: {row['peer_errors'][peer]}")
    timed = interleaved(methods, ROUNDS, "sdpa", timer(estimate_ms(ours)))
    row.update(
        ours_ms=timed["ours"]["ms"],
        sdpa_ms=timed["sdpa"]["ms"],
        ours_tflops=flops / (timed["ours"]["ms"] * 1e-3) / 1e12,
        sdpa_tflops=flops / (timed["sdpa"]["ms"] * 1e-3) / 1e12,
        ratio=timed["ours"]["ratio"],
    )
    for peer in ("flex", "cudnn"):
        if peer in timed:
            row[f"{peer}_ms"] = timed[peer]["ms"]
            row[f"{peer}_tflops"] = flops / (timed[peer]["ms"] * 1e-3) / 1e12
            # peer time / ours (> 1: ours faster): both ratios are against sdpa, in the same rounds.
            row[f"ours_vs_{peer}"] = timed["ours"]["ratio"] / timed[peer]["ratio"]
    log(
        f"{name:46s} ours {row['ours_tflops']:7.1f} TFLOP/s  sdpa {row['sdpa_tflops']:7.1f}  ratio {row['ratio']:.3f}"
        + "".join(f"  {p} {row[p + '_tflops']:7.1f}" for p in ("flex", "cudnn") if p + "_tflops" in row)
    )


# ---------------------------------------------------------------------------------------
# 2. decode


def copy_bandwidth(nbytes):
    """(read + written bytes) / s of a device copy of min(nbytes, 2 GiB), memoised by size."""
    size = min(nbytes, 2 << 30)
    if size not in _COPY:
        src = torch.empty(size // 2, device=DEV, dtype=torch.int16).random_()
        dst = torch.empty_like(src)
        ms = timer(0.5)(lambda: dst.copy_(src))
        _COPY[size] = 2 * size / (ms * 1e-3)
        del src, dst
        release()
    return _COPY[size]


def paged_cache(batch, context, Hkv, head_dim):
    """K and V caches of batch x context tokens in blocks of BLOCK_SIZE, in random order, the
    block table, and the same K and V contiguous as [batch, kv_heads, context, head_dim]."""
    per = -(-context // BLOCK_SIZE)
    nb = batch * per
    key_cache = rnd(nb, BLOCK_SIZE, Hkv, head_dim)
    value_cache = rnd(nb, BLOCK_SIZE, Hkv, head_dim)
    table = torch.randperm(nb, device=DEV).to(torch.int32).view(batch, per)

    def contiguous(cache):
        return (
            cache[table.long()].view(batch, per * BLOCK_SIZE, Hkv, head_dim)[:, :context].transpose(1, 2).contiguous()
        )

    return key_cache, value_cache, table, contiguous(key_cache), contiguous(value_cache)


def decode_path(sel, batch, context, Hkv):
    """The path decode_attention takes for equal lengths of ``context`` tokens (its own plan)."""
    if context > sel.config.pytorch_decode_threshold:
        return "pytorch"
    _, partition, parts = decode_plan(batch, Hkv, context, sel.config, sel.launch)
    return "V1" if parts == 1 else f"V2 ({parts} partitions of {partition})"


def phase_decode():
    RES["peers"]["vllm_decode"] = PEER_NOTE or (
        f"{peers.path()} (num_kv_splits {' and '.join(map(str, VLLM_KV_SPLITS))}: the better of them per case)"
    )
    log(f"vLLM decode peer: {RES['peers']['vllm_decode']}")
    for head_dim, H, Hkv in DECODE_MODELS:
        for batch, context, ragged in DECODE_CASES:
            name = f"decode d={head_dim} h={H} kv={Hkv} batch={batch} ctx={context}" + (" ragged" if ragged else "")
            if over_budget(name, 0.85):
                continue
            try:
                one_decode(name, head_dim, H, Hkv, batch, context, ragged)
            except Exception as e:  # noqa: BLE001
                record_error(name, e)
            release()
    rows = [r for r in RES["decode"] if "frac_copy" in r]
    RES["decode_summary"] = {
        "min_frac_copy_batch8_ctx8k": min(
            (r["frac_copy"] for r in rows if r["batch"] >= 8 and r["context"] >= 8192), default=None
        ),
    }
    log(f"decode summary: {RES['decode_summary']}")
    write_json()


def vllm_methods(name, what, make, reference, methods, errors_key):
    """The vLLM decode peer at each of VLLM_KV_SPLITS as methods ``vllm<splits>``: those whose output
    passes the check against ``reference`` (``make(splits)`` gives the call)."""
    for splits in VLLM_KV_SPLITS:
        try:
            fn = make(splits)
            got = fn()
            sync()
            if check(f"{name} ({what} {splits} splits)", got, reference):
                methods[f"vllm{splits}"] = fn
        except Exception as e:  # noqa: BLE001
            why = f"{type(e).__name__}: {str(e)[:300]}"
            RES["peers"].setdefault(errors_key, {})[f"{name} ({splits} splits)"] = why
            log(f"{name}: vllm {splits} splits: {why}")


def better_vllm(timed, row):
    """``timed["vllm"]``: the vLLM split count of the least median time (each one's µs and the
    chosen count in ``row``)."""
    tried = [m for m in timed if m.startswith("vllm") and m[4:].isdigit()]
    if tried:
        best = min(tried, key=lambda m: timed[m]["ms"])
        row["vllm_splits_us"] = {m[4:]: timed[m]["ms"] * 1e3 for m in tried}
        row["vllm_splits"] = int(best[4:])
        timed["vllm"] = timed[best]


def one_decode(name, head_dim, H, Hkv, batch, context, ragged=False):
    """One decode case: equal lengths of ``context`` tokens, or (ragged) RAGGED fractions of it.
    The SDPA anchor (flash on contiguous K/V) runs on equal batches only; a ragged batch is
    checked against SDPA per sequence."""
    key_cache, value_cache, table, k_c, v_c = paged_cache(batch, context, Hkv, head_dim)
    lengths = decode_cases.lengths(batch, context, ragged)
    seq_lens = torch.tensor(lengths, dtype=torch.int32, device=DEV)
    query = rnd(batch, H, head_dim)
    out = torch.full_like(query, float("nan"))
    sel = at.select(DT, head_dim, hw=HW, device=torch.device(DEV))

    def ours():
        at.decode_attention(query, key_cache, value_cache, table, seq_lens, out=out, hw=HW)

    q4 = query[:, :, None, :]  # [batch, heads, 1, dim]

    reference = flash_only(lambda: sdpa(q4, k_c, v_c, False))

    ours()
    if ragged:
        ref = torch.cat(
            [sdpa(q4[i : i + 1], k_c[i : i + 1, :, :n], v_c[i : i + 1, :, :n], False) for i, n in enumerate(lengths)]
        )[:, :, 0, :]
    else:
        ref = reference()[:, :, 0, :]
    sync()
    ok = check(name, out, ref)
    methods = {"ours": ours}
    if not ragged:
        methods["sdpa"] = reference
    if VLLM is not None and ok and (not SMOKE or (head_dim == 128 and (batch, context, ragged) in SMOKE_VLLM)):

        def make(splits):
            peer = VLLM.VllmDecode(query, splits, 1.0 / math.sqrt(head_dim))
            return lambda: peer(query, key_cache, value_cache, table, seq_lens)

        vllm_methods(name, "vllm", make, ref, methods, "vllm_decode_errors")
    del ref
    kv_bytes = 2 * sum(lengths) * Hkv * head_dim * query.element_size()
    row = {
        "name": name,
        "head_dim": head_dim,
        "heads": [H, Hkv],
        "batch": batch,
        "context": context,
        "kv_bytes": kv_bytes,
        "path": decode_path(sel, batch, context, Hkv),
        "ragged": ragged,
        "lengths": lengths if ragged else None,
        "ok": ok,
    }
    RES["decode"].append(row)
    if not ok:
        return
    timed = interleaved(methods, ROUNDS, "ours", timer(estimate_ms(ours)))
    key_cache = value_cache = k_c = v_c = None  # free the caches before the copy's buffers
    release()
    ours_bw = kv_bytes / (timed["ours"]["ms"] * 1e-3)
    copy_bw = copy_bandwidth(kv_bytes)
    row.update(
        ours_us=timed["ours"]["ms"] * 1e3,
        ours_tbps=ours_bw / 1e12,
        copy_tbps=copy_bw / 1e12,
        frac_copy=ours_bw / copy_bw,
        kv_once_at_copy_us=kv_bytes / copy_bw * 1e6,
    )
    better_vllm(timed, row)
    # ratio: the median over rounds of ours / the method (> 1: ours faster), the reference being ours.
    for peer in ("sdpa", "vllm"):
        if peer in timed:
            row[f"{peer}_us"] = timed[peer]["ms"] * 1e3
            row[f"ratio_vs_{peer}"] = 1 / timed[peer]["ratio"]
            row[f"{peer}_frac_copy"] = kv_bytes / (timed[peer]["ms"] * 1e-3) / copy_bw
    log(
        f"{name:52s} {row['path']:18s} ours {row['ours_us']:9.1f} us {row['ours_tbps']:6.3f} TB/s "
        f"({row['frac_copy']:.2f} of copy)"
        + "".join(
            f"  {p} {row[p + '_us']:9.1f} us ({row[p + '_frac_copy']:.2f} of copy), {p}/ours {row['ratio_vs_' + p]:.3f}"
            for p in ("sdpa", "vllm")
            if p + "_us" in row
        )
    )


# ---------------------------------------------------------------------------------------
# 3. V1 against V2


def phase_v1_v2():
    for head_dim, (H, Hkv) in MODELS.items():
        for batch, context in V1V2:
            name = f"V1 vs V2 d={head_dim} batch={batch} ctx={context}"
            if over_budget(name):
                continue
            try:
                key_cache, value_cache, table, k_c, v_c = paged_cache(batch, context, Hkv, head_dim)
                del k_c, v_c
                seq_lens = torch.full((batch,), context, dtype=torch.int32, device=DEV)
                query = rnd(batch, H, head_dim)
                sel = at.select(DT, head_dim, hw=HW, device=torch.device(DEV))
                runs = {
                    "V1": (
                        dataclasses.replace(
                            sel.config, v1_v2_threshold=1 << 30, use_native_v1=False, use_native_v2=False
                        ),
                        dataclasses.replace(sel.launch, v1_min_programs=0),
                    ),
                    "V2": (
                        dataclasses.replace(sel.config, v1_v2_threshold=0, use_native_v1=False, use_native_v2=False),
                        sel.launch,
                    ),
                }
                outs = {}
                fns = {}
                for path, (cfg, launch) in runs.items():
                    outs[path] = torch.full_like(query, float("nan"))
                    fns[path] = lambda cfg=cfg, launch=launch, o=outs[path]: at._ATTENTION.decode(
                        query, key_cache, value_cache, table, seq_lens, out=o, hw=HW, config=cfg, launch=launch
                    )
                    fns[path]()
                sync()
                ok = check(f"{name} (V1 against V2)", outs["V1"], outs["V2"].float())
                row = {
                    "name": name,
                    "head_dim": head_dim,
                    "batch": batch,
                    "context": context,
                    "ok": ok,
                    "policy_path": decode_path(sel, batch, context, Hkv),
                }
                RES["v1_vs_v2"].append(row)
                if ok:
                    timed = interleaved(fns, ROUNDS, "V1", timer(estimate_ms(fns["V1"])))
                    row.update(
                        v1_us=timed["V1"]["ms"] * 1e3, v2_us=timed["V2"]["ms"] * 1e3, v2_speedup=timed["V2"]["ratio"]
                    )
                    log(
                        f"{name:42s} V1 {row['v1_us']:9.1f} us  V2 {row['v2_us']:9.1f} us  V1/V2 {row['v2_speedup']:.2f}"
                    )
                key_cache = value_cache = fns = None
            except Exception as e:  # noqa: BLE001
                record_error(name, e)
            release()
    write_json()


# ---------------------------------------------------------------------------------------
# 4. first call of a new length


def phase_first_call():
    head_dim = 128
    H, Hkv = MODELS[head_dim]
    res = RES["first_call"]
    try:
        for n in ((57, 91) if SMOKE else (3001, 5003)):
            q, k, v = rnd(n, H, head_dim), rnd(n, Hkv, head_dim), rnd(n, Hkv, head_dim)
            cu = torch.tensor([0, n], dtype=torch.int32, device=DEV)
            sync()
            t = time.perf_counter()
            at.prefill_attention(q, k, v, cu, cu, n, n, hw=HW)
            sync()
            res.setdefault("prefill_ms", []).append({"length": n, "ms": (time.perf_counter() - t) * 1e3})
        for n in ((33, 520) if SMOKE else (5003, 20011)):  # V1, and V2 past 512 tokens
            key_cache, value_cache, table, _, _ = paged_cache(2, n, Hkv, head_dim)
            sync()
            t = time.perf_counter()
            at.decode_attention(
                rnd(2, H, head_dim),
                key_cache,
                value_cache,
                table,
                torch.full((2,), n, dtype=torch.int32, device=DEV),
                hw=HW,
            )
            sync()
            res.setdefault("decode_ms", []).append({"length": n, "ms": (time.perf_counter() - t) * 1e3})
        log(f"first call of a new length (wall ms, compiled kernels): {res}")
    except Exception as e:  # noqa: BLE001
        record_error("first call", e)
    write_json()


# ---------------------------------------------------------------------------------------
# 5. decode over an FP8 KV cache


def fp8_quantize(cache, scale):
    """vLLM's fp8 cache value of a 16-bit cache: saturate(x / scale) as e4m3fn."""
    return (cache.float() / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)


def phase_fp8_decode():
    target = target_name(HW, torch.device(DEV))
    if target in at.FP8_UNSERVED:
        RES["skipped"].append(f"fp8 decode: {target} has no {at.FP8_UNSERVED[target]}")
        log(f"skip fp8 decode: {target} has no {at.FP8_UNSERVED[target]}")
        return
    for head_dim, (H, Hkv) in MODELS.items():
        for batch, context, ragged in FP8_CASES:
            name = f"fp8 decode d={head_dim} h={H} kv={Hkv} batch={batch} ctx={context}" + (" ragged" if ragged else "")
            if over_budget(name):
                continue
            try:
                one_fp8_decode(name, head_dim, H, Hkv, batch, context, ragged)
            except Exception as e:  # noqa: BLE001
                record_error(name, e)
            release()
    rows = [r for r in RES["fp8_decode"] if "frac_copy" in r]
    RES["fp8_decode_summary"] = {
        "min_frac_copy": min((r["frac_copy"] for r in rows), default=None),
        "min_frac_4_27": min((r["frac_4_27"] for r in rows), default=None),
        "geomean_bf16_over_fp8_time": geomean(r["bf16_over_fp8"] for r in rows),
    }
    log(f"fp8 decode summary: {RES['fp8_decode_summary']}")
    write_json()


def one_fp8_decode(name, head_dim, H, Hkv, batch, context, ragged):
    """The bf16 cache of phase 2 and its fp8 quantization with one per-tensor scale (amax / 448 of
    K and V together, as the peer needs one): ours over each, and the peer over the fp8 one.
    Checked against SDPA on the dequantized cache (the fp8 reads) and on the bf16 one (bf16)."""
    key_cache, value_cache, table, k_c, v_c = paged_cache(batch, context, Hkv, head_dim)
    del k_c, v_c
    lengths = decode_cases.lengths(batch, context, ragged)
    seq_lens = torch.tensor(lengths, dtype=torch.int32, device=DEV)
    query = rnd(batch, H, head_dim)
    scale = torch.maximum(key_cache.abs().amax(), value_cache.abs().amax()).float().reshape(1) / 448.0
    kc8, vc8 = fp8_quantize(key_cache, scale), fp8_quantize(value_cache, scale)
    out8, out16 = torch.full_like(query, float("nan")), torch.full_like(query, float("nan"))
    sel = at.select(DT, head_dim, hw=HW, device=torch.device(DEV), kv_fp8=True)

    def fp8():
        at.decode_attention(query, kc8, vc8, table, seq_lens, out=out8, hw=HW, k_scale=scale, v_scale=scale)

    def bf16():
        at.decode_attention(query, key_cache, value_cache, table, seq_lens, out=out16, hw=HW)

    def reference(kc, vc, sc):
        # SDPA per sequence on the cache made contiguous (dequantized: fp8 * scale, in fp32).
        outs = []
        for i, n in enumerate(lengths):
            blocks = table[i, : -(-n // BLOCK_SIZE)].long()
            k = (kc[blocks].float() * sc).reshape(-1, Hkv, head_dim)[:n].transpose(0, 1)[None]
            v = (vc[blocks].float() * sc).reshape(-1, Hkv, head_dim)[:n].transpose(0, 1)[None]
            outs.append(sdpa(query[i : i + 1, :, None].float(), k, v, False)[0, :, 0])
        return torch.stack(outs)

    fp8()
    bf16()
    sync()
    ok = check(name, out8, reference(kc8, vc8, scale))
    ok = check(f"{name} (bf16 cache)", out16, reference(key_cache, value_cache, 1.0)) and ok
    quant_err = rel_err(out8, out16.float())
    methods = {"fp8": fp8, "bf16": bf16}
    if VLLM is not None and ok and (not SMOKE or head_dim == 128 and not ragged):

        def make(splits):
            peer = VLLM.VllmDecode(query, splits, 1.0 / math.sqrt(head_dim))

            def vllm():
                VLLM.decode_attention_fwd(query, kc8, vc8, peer.o, peer.lse, table, seq_lens, peer.attn_logits,
                                          splits, peer.sm_scale, page_size=BLOCK_SIZE, k_scale=scale)  # fmt: skip
                return peer.o

            return vllm

        vllm_methods(name, "vllm fp8", make, out8.float(), methods, "vllm_fp8_decode_errors")
    fp8_bytes = 2 * sum(lengths) * Hkv * head_dim
    row = {
        "name": name,
        "head_dim": head_dim,
        "heads": [H, Hkv],
        "batch": batch,
        "context": context,
        "ragged": ragged,
        "fp8_bytes": fp8_bytes,
        "decode_kernel": sel.decode.name,
        "path": decode_path(sel, batch, context, Hkv),
        "rel_err_vs_bf16_cache": quant_err,
        "ok": ok,
    }
    RES["fp8_decode"].append(row)
    if not ok:
        return
    graph = graph_method(row, fp8)
    if graph is not None:
        methods["graph"] = graph
    timed = interleaved(methods, ROUNDS, "fp8", timer(estimate_ms(fp8)))
    key_cache = value_cache = kc8 = vc8 = None
    release()
    bw = fp8_bytes / (timed["fp8"]["ms"] * 1e-3)
    copy_bw = copy_bandwidth(fp8_bytes)
    row.update(
        fp8_us=timed["fp8"]["ms"] * 1e3,
        fp8_tbps=bw / 1e12,
        frac_copy=bw / copy_bw,
        frac_4_27=bw / (H200_COPY_TBPS * 1e12),
        bf16_us=timed["bf16"]["ms"] * 1e3,
        bf16_over_fp8=1 / timed["bf16"]["ratio"],
    )
    better_vllm(timed, row)
    if "vllm" in timed:
        row.update(vllm_us=timed["vllm"]["ms"] * 1e3, vllm_over_fp8=1 / timed["vllm"]["ratio"])
    if "graph" in timed:
        # The fp8 call replayed from a CUDA graph: what its launches cost without the host.
        row.update(
            graph_us=timed["graph"]["ms"] * 1e3, graph_frac_copy=fp8_bytes / (timed["graph"]["ms"] * 1e-3) / copy_bw
        )
    log(
        f"{name:56s} {row['path']:18s} fp8 {row['fp8_us']:8.1f} us {row['fp8_tbps']:5.2f} TB/s "
        f"({row['frac_copy']:.2f} of copy, {row['frac_4_27']:.2f} of 4.27)  bf16 {row['bf16_us']:8.1f} us "
        f"(x{row['bf16_over_fp8']:.2f})  rel err vs bf16 {quant_err:.3f}"
        + (f"  vllm {row['vllm_us']:8.1f} us (x{row['vllm_over_fp8']:.2f})" if "vllm_us" in row else "")
        + (f"  graph {row['graph_us']:8.1f} us ({row['graph_frac_copy']:.2f} of copy)" if "graph_us" in row else "")
    )


# 6. sliding windows (issue 36)


def window_ref_rows(q, k, v, rows, window, softcap, scale):
    """fp32 reference of the last ``rows`` query rows of one causal sequence with a window of
    ``window`` keys (itself included) and a soft-cap: only the keys they see are read."""
    n, H, D = q.shape
    g = H // k.shape[1]
    lo = max(0, n - rows - window + 1)
    qq = q[n - rows :].float().transpose(0, 1)  # [H, rows, D]
    kk = k[lo:].float().repeat_interleave(g, 1).transpose(0, 1)
    vv = v[lo:].float().repeat_interleave(g, 1).transpose(0, 1)
    s = torch.matmul(qq, kk.transpose(1, 2)) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(n - rows, n, device=q.device)[:, None]
    j = torch.arange(lo, n, device=q.device)[None, :]
    s = s.masked_fill(~((j <= i) & (j > i - window))[None], float("-inf"))
    return torch.matmul(torch.softmax(s, -1), vv).transpose(0, 1)


def flex_window(q, k, v, window, softcap):
    """Compiled FlexAttention on one causal sequence with the same sliding-window mask (key j
    seen by row i when i - window < j <= i) and soft-cap score_mod; the block mask built once."""
    from torch.nn.attention.flex_attention import create_block_mask

    n = q.shape[0]

    def mask_mod(b, h, qi, ki):
        return (qi >= ki) & (qi - ki < window)

    def score_mod(score, b, h, qi, ki):
        return softcap * torch.tanh(score / softcap)

    block_mask = create_block_mask(mask_mod, 1, None, n, n, device=DEV, _compile=False)
    qf, kf, vf = (t.transpose(0, 1)[None] for t in (q, k, v))
    fa = flex_fn()
    mod = score_mod if softcap > 0 else None

    def run():
        return fa(qf, kf, vf, block_mask=block_mask, score_mod=mod, enable_gqa=True)

    return run


def window_flops(n, window, H, D):
    """Useful FLOPs of causal attention with a window: 4 * D per (row, key seen) pair, per head."""
    # Row i sees min(i + 1, window) keys.
    pairs = n * (n + 1) // 2 if n <= window else window * (window + 1) // 2 + (n - window) * window
    return 4 * pairs * D * H


def one_window_prefill(label, D, H, Hkv, n, window, softcap):
    name = f"prefill {label} seq={n} window={window}" + (f" softcap={softcap:g}" if softcap else "")
    q, k, v = rnd(n, H, D), rnd(n, Hkv, D), rnd(n, Hkv, D)
    cu = torch.tensor([0, n], dtype=torch.int32, device=DEV)
    out = torch.full_like(q, float("nan"))
    scale = 1 / math.sqrt(D)

    def ours():
        at.prefill_attention(q, k, v, cu, cu, n, n, causal=True, window_size=(window - 1, 0), softcap=softcap,
                             out=out, hw=HW)  # fmt: skip

    ours()
    rows = min(n, 256)
    ref = window_ref_rows(q, k, v, rows, window, softcap, scale)
    sync()
    ok = check(name, out[n - rows :], ref)
    row = {"name": name, "head_dim": D, "heads": [H, Hkv], "seq": n, "window": window, "softcap": softcap, "ok": ok}
    RES["window_prefill"].append(row)
    if not ok:
        return
    methods = {"ours": ours}
    if ARGS.no_flex:
        RES["peers"]["flex"] = "left out (--no-flex)"
    else:
        try:
            t0 = time.perf_counter()
            fn = flex_window(q, k, v, window, softcap)
            sync()
            t1 = time.perf_counter()
            got = fn()[0].transpose(0, 1)
            sync()
            row["flex_setup_s"] = {"block_mask": t1 - t0, "first_call": time.perf_counter() - t1}
            log(
                f"{name}: flex block mask {t1 - t0:.1f} s, first call (compile) {row['flex_setup_s']['first_call']:.1f} s"
            )
            # FlexAttention against the same reference rows and against ours over every row.
            if check(f"{name} (flex)", got[n - rows :], ref) and check(f"{name} (flex against ours)", got, out):
                methods["flex"] = fn
        except Exception as e:  # noqa: BLE001
            row["peer_errors"] = {"flex": f"{type(e).__name__}: {str(e)[:300]}"}
            log(f"{name}: flex: {row['peer_errors']['flex']}")
    timed = interleaved(methods, ROUNDS, "ours", timer(estimate_ms(ours)))
    flops = window_flops(n, window, H, D)
    row.update(ours_ms=timed["ours"]["ms"], ours_tflops=flops / (timed["ours"]["ms"] * 1e-3) / 1e12)
    if "flex" in timed:
        # flex time / ours (> 1: ours faster), the median over rounds.
        flex_ms = timed["flex"]["ms"]
        row.update(flex_ms=flex_ms, flex_tflops=flops / (flex_ms * 1e-3) / 1e12)
        row["ours_vs_flex"] = 1 / timed["flex"]["ratio"]
    peer = f"  flex {row['flex_tflops']:7.1f}  flex/ours {row['ours_vs_flex']:.3f}" if "flex_ms" in row else ""
    log(f"{name:52s} ours {row['ours_tflops']:7.1f} TFLOP/s{peer}")


def window_cache(batch, context, window, Hkv, D):
    """A paged cache of batch x context tokens (blocks in random order) whose blocks before the
    window hold NaN (a read there would show in the check), and the window's K and V contiguous
    [batch, kv_heads, window, D]."""
    per = -(-context // BLOCK_SIZE)
    table = torch.randperm(batch * per, device=DEV).to(torch.int32).view(batch, per)
    key_cache = torch.full((batch * per, BLOCK_SIZE, Hkv, D), float("nan"), device=DEV, dtype=DT)
    value_cache = torch.full_like(key_cache, float("nan"))
    first = (context - window) // BLOCK_SIZE  # the first block the window meets
    ids = table[:, first:].reshape(-1).long()
    for cache in (key_cache, value_cache):
        cache[ids] = rnd(ids.numel(), BLOCK_SIZE, Hkv, D)

    def window_of(cache):
        toks = cache[table[:, first:].long()].view(batch, -1, Hkv, D)
        # Tokens first * BLOCK_SIZE ... context - 1 (the last block's tail is past the context).
        return toks[:, : context - first * BLOCK_SIZE][:, -window:].transpose(1, 2).float()

    return key_cache, value_cache, table, window_of(key_cache), window_of(value_cache)


def one_window_decode(D, H, Hkv, batch, context, window, softcap):
    name = f"decode window={window} d={D} h={H} kv={Hkv} batch={batch} ctx={context}" + (
        f" softcap={softcap:g}" if softcap else ""
    )
    key_cache, value_cache, table, k_w, v_w = window_cache(batch, context, window, Hkv, D)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device=DEV)
    query = rnd(batch, H, D)
    out = torch.full_like(query, float("nan"))

    def ours():
        at.decode_attention(query, key_cache, value_cache, table, seq_lens, window_size=(window - 1, 0),
                            softcap=softcap, out=out, hw=HW)  # fmt: skip

    ours()
    g = H // Hkv
    qg = query.float().view(batch, Hkv, g, D)
    s = torch.einsum("bhgd,bhwd->bhgw", qg, k_w) / math.sqrt(D)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    ref = torch.einsum("bhgw,bhwd->bhgd", torch.softmax(s, -1), v_w).reshape(batch, H, D)
    sync()
    ok = check(name, out, ref)
    del s, ref, k_w, v_w
    kv_bytes = 2 * batch * window * Hkv * D * query.element_size()
    sel = at.select(DT, D, hw=HW, device=torch.device(DEV), uses=("window",) + (("softcap",) if softcap else ()))
    row = {"name": name, "head_dim": D, "heads": [H, Hkv], "batch": batch, "context": context, "window": window,
           "softcap": softcap, "kv_bytes": kv_bytes, "ok": ok}  # fmt: skip
    row["path"] = decode_path(sel, batch, window, Hkv)
    RES["window_decode"].append(row)
    if not ok:
        return
    methods = {"ours": ours}
    graph = graph_method(row, ours)
    if graph is not None:
        methods["graph"] = graph
    timed = interleaved(methods, ROUNDS, "ours", timer(estimate_ms(ours)))
    key_cache = value_cache = None
    release()
    bw = kv_bytes / (timed["ours"]["ms"] * 1e-3)
    copy_bw = copy_bandwidth(kv_bytes)
    row.update(ours_us=timed["ours"]["ms"] * 1e3, ours_tbps=bw / 1e12, copy_tbps=copy_bw / 1e12,
               frac_copy=bw / copy_bw, frac_h200_copy=bw / (H200_COPY_TBPS * 1e12))  # fmt: skip
    if "graph" in timed:
        # The same call replayed from a CUDA graph: what the launches cost without the host.
        row.update(
            graph_us=timed["graph"]["ms"] * 1e3, graph_frac_copy=kv_bytes / (timed["graph"]["ms"] * 1e-3) / copy_bw
        )
    log(
        f"{name:66s} {row['path']:18s} {row['ours_us']:8.1f} us {row['ours_tbps']:6.3f} TB/s of the window "
        f"({row['frac_copy']:.2f} of a copy of as many bytes, {row['frac_h200_copy']:.2f} of {H200_COPY_TBPS} TB/s)"
        + (f"  graph {row['graph_us']:8.1f} us ({row['graph_frac_copy']:.2f} of copy)" if "graph_us" in row else "")
    )


def phase_window(parts=("prefill", "decode")):
    if "prefill" in parts:
        for label, D, H, Hkv, n, window, softcap in WINDOW_PREFILL:
            what = f"window prefill {label} seq={n}"
            if ARGS.window_cases and ARGS.window_cases not in label:
                continue
            if over_budget(what):
                continue
            try:
                one_window_prefill(label, D, H, Hkv, n, window, softcap)
            except Exception as e:  # noqa: BLE001
                record_error(what, e)
            release()
    if "decode" in parts:
        for case in WINDOW_DECODE:
            what = f"window decode {case}"
            if ARGS.window_cases and f"d={case[0]}" != ARGS.window_cases:
                continue
            if over_budget(what):
                continue
            try:
                one_window_decode(*case)
            except Exception as e:  # noqa: BLE001
                record_error(what, e)
            release()
    rows = [r for r in RES["window_prefill"] if "ours_vs_flex" in r]
    drows = [r for r in RES["window_decode"] if "frac_copy" in r]
    RES["window_summary"] = {
        "min_prefill_ours_vs_flex": min((r["ours_vs_flex"] for r in rows), default=None),
        "min_decode_frac_copy": min((r["frac_copy"] for r in drows), default=None),
        "min_decode_frac_h200_copy": min((r["frac_h200_copy"] for r in drows), default=None),
    }
    log(f"window summary: {RES['window_summary']}")
    write_json()


def main():
    phase_meta()
    write_json()
    phases = {
        "prefill": phase_prefill,
        "decode": phase_decode,
        "v1_v2": phase_v1_v2,
        "first_call": phase_first_call,
        "fp8_decode": phase_fp8_decode,
        "window": phase_window,
        "window_prefill": lambda: phase_window(("prefill",)),
        "window_decode": lambda: phase_window(("decode",)),
    }
    for name in ARGS.phases:
        phases[name]()
    failed = [c["check"] for c in RES["correctness"] if not c["ok"]]
    log(
        f"correctness: {len(RES['correctness']) - len(failed)}/{len(RES['correctness'])} OK; "
        f"errors: {len(RES['errors'])}; skipped: {len(RES['skipped'])}"
    )
    write_json()
    if failed or RES["errors"]:
        sys.exit(1)


if __name__ == "__main__":
    sys.exit(quiet_on_closed_pipe(main))
