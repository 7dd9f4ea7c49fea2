#!/usr/bin/env python3
"""Benchmark generated/attention.py against torch SDPA on one GPU (H200), bf16.

    python3 bench/attention.py                          # the full run (~2-3 min on the H200)
    python3 bench/attention.py --cpu-smoke --hw h200    # tiny fp16 shapes in Triton's interpreter

Every method is checked at its timed size first (a failed check is recorded, not timed, exit 1),
then timed as GPU time (bench/timing.py) in interleaved rounds; ratios are the median over rounds
of reference time / ours.  Phases (--phases picks some): (1) prefill, causal and not, head_dim
64 / 128 / 256, 1k / 4k / 16k tokens (--quick: 1k, 8k), equal and ragged batches, TFLOP/s against
SDPA (flash), with SDPA's cuDNN backend and compiled FlexAttention (--no-flex leaves it out) as
peers; (2) paged decode (block size 16), GQA 1 to 8, batch 1-256, context 1k-128k, equal and
ragged: KV bytes a second as a fraction of a device copy, against SDPA on the same K/V made
contiguous and vLLM's Triton paged decode (bench/peers.py); (3) V1 against V2 past the policy's
threshold; (4) the first call of a new length.  JSON to $OUT/attention.json (or --json PATH).
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
        default=["prefill", "decode", "v1_v2", "first_call"],
        choices=["prefill", "decode", "v1_v2", "first_call"],
        help="which phases to run, in this order (default: all)",
    )
    ap.add_argument(
        "--no-flex",
        action="store_true",
        help="leave FlexAttention out (torch.compile recompiles it for every packed length: minutes a case)",
    )
    return ap.parse_args()


ARGS = _parse()
SMOKE = ARGS.cpu_smoke
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    if ARGS.hw is None:
        sys.exit("--cpu-smoke needs --hw NAME (a hardware spec name, e.g. h200)")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402

from bench import peers  # noqa: E402
from bench.runlog import RunLog  # noqa: E402
from bench.timing import captured, cpu_ms, gpu_ms, interleaved, rel_err  # noqa: E402
from generated import attention as at  # noqa: E402
from generated.dispatch import target_name  # noqa: E402
from policy_runtime.attention.ops import decode_plan  # noqa: E402

DEV = "cpu" if SMOKE else "cuda"
DT = torch.float16 if SMOKE else torch.bfloat16
HW = ARGS.hw
ROUNDS = 1 if SMOKE else ARGS.rounds
# Relative error (||ours - sdpa|| / ||sdpa||) a result may have: bf16 rounding of two
# different summation orders is ~3e-3; fp16 in the smoke run less.
MAX_REL_ERR = 2e-2
# Models: head_dim -> (query heads, KV heads); fewer heads in the smoke run (the interpreter
# runs programs one by one).
MODELS = {128: (4, 2), 256: (4, 1)} if SMOKE else {128: (32, 8), 256: (16, 4)}
# Prefill's head dims: MODELS and head_dim 64 (32 query / 8 KV heads) on the GPU.
PREFILL_MODELS = MODELS if SMOKE else {64: (32, 8), **MODELS}
# Decode's shapes (head_dim, query heads, KV heads): GQA ratios 1, 4 and 8 over head dims 64, 128, 256.
DECODE_MODELS = (
    [(128, 4, 2), (256, 4, 1)]
    if SMOKE
    else [(64, 16, 16), (128, 32, 8), (128, 64, 8), (256, 16, 4), (256, 16, 2)]
)
# The peers: vLLM's Triton paged decode (../shared/peers/vllm_triton.py, when there) with
# VLLM_KV_SPLITS splits (SGLang's default; vLLM's MLA caller uses 4), compiled FlexAttention and
# SDPA's cuDNN backend (GPU only) in prefill.
VLLM, PEER_NOTE = peers.load()
VLLM_KV_SPLITS = 8
RES: dict = {
    "meta": {},
    "prefill": [],
    "decode": [],
    "v1_vs_v2": [],
    "first_call": {},
    "correctness": [],
    "peers": {},
    "skipped": [],
    "errors": [],
}
_COPY: dict = {}
RUN = RunLog("attention", RES, smoke=SMOKE, json_arg=ARGS.json)
elapsed, log, sync, release, write_json = RUN.elapsed, RUN.log, RUN.sync, RUN.release, RUN.write

if SMOKE:
    PREFILL_SEQS, PREFILL_TOKENS = [24, 70], 24
    DECODE_BATCHES, DECODE_CONTEXTS = [1, 2], [40, 600]
    V1V2 = [(1, 600)]
    # (batch, context, ragged): every pair of batch and context of the smoke run, and one ragged.
    DECODE_CASES = [(b, c, False) for c in DECODE_CONTEXTS for b in DECODE_BATCHES] + [(3, 100, True)]
    # The vLLM peer (slow in the interpreter) at head_dim 128 on these only.
    SMOKE_VLLM = {(1, 40, False), (3, 100, True)}
else:
    PREFILL_SEQS, PREFILL_TOKENS = ([1024, 8192] if ARGS.quick else [1024, 4096, 16384]), 16384
    DECODE_BATCHES, DECODE_CONTEXTS = [1, 8, 32, 128], [1024, 8192, 32768]
    V1V2 = [(8, 16384), (8, 32768), (32, 32768)]
    # Batch 1 to 256, context 1k to 128k, equal and ragged (RAGGED fractions of the context).
    DECODE_CASES = [
        (1, 1024, False), (1, 131072, False), (8, 8192, False), (8, 131072, True),
        (32, 32768, False), (32, 32768, True), (128, 4096, False), (256, 1024, False), (256, 8192, True),
    ]  # fmt: skip
    if not ARGS.quick:
        DECODE_CASES += [(1, 8192, False), (8, 32768, False), (64, 16384, True), (128, 8192, False), (256, 4096, False)]
BLOCK_SIZE = 16
# Ragged batches: each sequence's length as a fraction of the phase's sequence length.
RAGGED = (1.0, 0.73, 0.41, 0.9, 0.17, 0.58)


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
    n = max(3, (3 * PREFILL_TOKENS) // (2 * seq))
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
    RES["prefill_summary"] = {
        "geomean_causal_4k_16k": geomean(key),
        "min_ratio": min((r["ratio"] for r in rows), default=None),
        "geomean_all": geomean(r["ratio"] for r in rows),
    }
    log(f"prefill summary: {RES['prefill_summary']}")
    write_json()


_FLEX = []


def flex_fn():
    """FlexAttention, compiled once (torch.compile) on the GPU; as it is on the CPU."""
    if not _FLEX:
        from torch.nn.attention.flex_attention import flex_attention

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

    block_mask = create_block_mask(mask_mod, 1, None, total, total, device=DEV, _compile=not SMOKE)
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
    RES["peers"]["vllm_decode"] = PEER_NOTE or f"{peers.path()} (num_kv_splits {VLLM_KV_SPLITS})"
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


def one_decode(name, head_dim, H, Hkv, batch, context, ragged=False):
    """One decode case: equal lengths of ``context`` tokens, or (ragged) RAGGED fractions of it.
    The SDPA anchor (flash on contiguous K/V) runs on equal batches only; a ragged batch is
    checked against SDPA per sequence."""
    key_cache, value_cache, table, k_c, v_c = paged_cache(batch, context, Hkv, head_dim)
    lengths = [max(1, int(context * RAGGED[i % len(RAGGED)])) for i in range(batch)] if ragged else [context] * batch
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
        try:
            peer = VLLM.VllmDecode(query, VLLM_KV_SPLITS, 1.0 / math.sqrt(head_dim))

            def vllm():
                return peer(query, key_cache, value_cache, table, seq_lens)

            got = vllm()
            sync()
            if check(f"{name} (vllm)", got, ref):
                methods["vllm"] = vllm
        except Exception as e:  # noqa: BLE001
            RES["peers"].setdefault("vllm_decode_errors", {})[name] = f"{type(e).__name__}: {str(e)[:300]}"
            log(f"{name}: vllm: {type(e).__name__}: {str(e)[:300]}")
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
        for n in ((33, 700) if SMOKE else (5003, 20011)):
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


def main():
    phase_meta()
    write_json()
    phases = {"prefill": phase_prefill, "decode": phase_decode, "v1_v2": phase_v1_v2, "first_call": phase_first_call}
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
    main()
