"""Exploration of the two decode misses (issues 15 and 16): where the time goes, and which knob moves it.

Not a benchmark of record: it sweeps kernel constants and prototypes that are not (yet) in the
specs, on the cases bench/attention.py and bench/moe.py report below their targets, and writes
every number to $OUT/explore_decode.json (bench/results/ keeps the runs RESULTS.md cites).

Phases 10-14 ran on 2026-12-01 against the layer before the chained decode record ("current"); since
then "current" is that record (phases 15-19).

Cases: attention decode on a paged cache of block size 16 in random order (as bench/attention.py),
d=128 with 8 KV heads (32 query heads) and d=256 with 4 (16), batch 8 at 8k and batch 1 at 32k (phase
3 adds batch 1 at 8k and batch 8 at 32k); fused MoE at T = 1 and 4 (qwen36, and 128 experts x 2048 x
768), top-8.  Times are GPU times against a copy of the same bytes.

--phase 1  per-kernel times from the profiler (decode kernel and merge; routing, up and down GEMMs)
           for the target's records; decode tiles (block_n, warps, stages) x V2 partition sizes
           through ``Attention.decode(kernel=, config=)``; the gemv up and down kernels over a grid of
           constants, each alone; a split-K prototype of the up GEMM (fp32 partials, the activation
           applied where the down GEMM reads them).
--phase 2  prototypes: decode with the block ids read a tile ahead, the merge over 64 partitions in
           head_dim slices (since adopted), against an identity block table too; the gemv down kernel
           over a grid of constants; topk_softmax's tile rows and warps.
--phase 3  the two decode bodies x tiles x partition sizes (256-2048 tokens), every sequence V2.
--phase 4  programmatic dependent launch: the merge, and MoE's up and down GEMMs, launched with
           launch_pdl=True and waiting on the device for their producers (with and without the
           producers releasing them as they start).
--phase 5  MoE decode on the CUDA cores: policy_runtime.moe's _simt_up and _simt_down (register
           slabs, no shared memory, no padding rows) over a grid of constants, each alone and the
           best pair end to end; topk_softmax with value and index packed in one int64 key (one
           reduction a pick); the time of an empty kernel (the floor of one launch).  T = 1, 4, 16.
--phase 6  the L2 flush before each timed run: gpu_ms zeroed 256 MiB, which leaves the L2 full of
           dirty lines that the timed kernel's first reads must write back.  The decode cases, a
           plain read and copies of their bytes, timed after each kind of flush: "zero" (as
           gpu_ms did), "read" (a sum over 256 MiB: the L2 left cold and clean; gpu_ms's since),
           "zero+read".
--phase 7  phase 3's leading candidates for both decode targets (on the reading flush), each timed
           in 5 interleaved rounds: batch 1 at 32k, batch 8 at 8k and 32k, batch 32 at 8k.
--phase 8  MoE decode: the simt kernels with their loops unrolled (1, 2, 4), chained by
           programmatic dependent launch (the down kernel loading its first weight slab before it
           waits), 8 or 4 down rows a program; against the current layer, 3 interleaved rounds.
--phase 9  the h200 decode tiles with V2 partitions of 64-512 tokens where a call has few programs:
           batch 1 at 4k, 8k and 32k, batch 2 at 16k, 4 and 8 at 8k; 3 interleaved rounds.
--phase 10 MoE decode: the layer's parts alone (an empty kernel, the router, the up and down
           kernels), and both GEMMs in one launch whose programs draw tiles from a ticket counter,
           the down tiles waiting (acquire) for their token's up tiles.  (Its "read of the weight
           bytes" row is torch's int32 sum, far below copy bandwidth: not a floor.)
--phase 11 MoE decode: the down kernel loading a chunk of all k experts' rows at once (_down3d) and
           the up kernel a step ahead (_up_pf), each alone over a grid of constants, then the best
           chained by programmatic dependent launch (router -> up -> down, the down kernel loading
           its first chunk before it waits), against the record before ("cur"), also as graphs.
--phase 12 MoE decode: the up kernel prefetching the down kernel's w2 rows into L2 (at its start or
           end, w1's loads evict-first), chained.
--phase 13 MoE decode: _down3d two chunks ahead, and three up kernels x seven down tiles, chained.
--phase 14 MoE decode: routing inside the two GEMM launches (each program computes its token's
           top-k from the logits; vLLM's older gating_output form), against the chained layer.
--phase 15 MoE decode: the chained layer's kernels with their registers capped (maxnreg) so that more
           programs are resident at once.
--phase 16 MoE decode: a timeline of the chained layer (each program's start and end, from the GPU's
           global timer), and one kernel for both GEMMs without a grid-wide dependency: each program
           takes one routed row and a block of the intermediate columns, computes them (the up GEMM)
           and multiplies them at once by the same columns of its expert's w2 (the down GEMM split
           over the intermediate size), adding into an fp32 accumulator; the last program converts
           it into the output and zeroes it for the next call.
--phase 17 MoE decode: phase 16's timeline with each start stored at once, over pairs of up and down
           tiles of the production bodies (and each compiled kernel's registers), each pair also timed
           untraced in interleaved rounds.  T = 1.
--phase 18 MoE decode: the down kernel loading its first two w2 chunks before it waits for the up
           kernel, and the rows of h a chunk ahead; T = 1, against the current layer.
--phase 19 the time outside the layer's span: chains of empty kernels (plain, programmatic dependent
           launch), the layer with the router a dependent launch too, the router's cold logits.
--phase 20 the router's top-k in one pass (int64 keys of probability and expert, tl.topk; since
           adopted) against its k rounds of argmax: alone and in the layer, T = 1; ids and weights
           checked equal.
--phase 21 MoE decode: phase 14's routing inside the two GEMM launches with the one-pass top-k (on one
           copy of the row, or one a warp), against the chained layer on h200's and e128's tiles; T = 1.
--phase 22 the one-pass router on 1, 2 or 4 warps at one token: alone and in the layer.
--phase 23 MoE decode: the chained layer over a grid of up and down tiles of the production bodies
           (routed by the production router), per expert shape, T = 1, 2 and 4.
--phase 24 phase 23 at T = 1 over narrower up slabs (128-element K steps) and down programs of 2-16
           warps.
--phase 25 MoE decode, T = 1: the down kernel waits for a counter of finished up programs (release /
           acquire atomics) instead of the up grid's completion (griddepcontrol.wait); the last down
           program past the wait zeroes the counters for the next call.
--phase 26 what a lone call's events hold besides its kernels: gpu_ms around nothing, a one-element
           torch fill, an empty Triton kernel and the T = 1 layer, and the layer's and nothing's
           per-run samples (their spread and the values they take).
--phase 27 MoE decode, T = 1, two launches: the up launch's first program routes the token (the
           one-pass top-k) and sets a flag (release) that the others wait on (acquire) before they
           read its ids; the down kernel as now, its first program zeroing the flag after its wait.
--phase 28 MoE decode, T = 1: the up and down loops software-pipelined (tl.range's num_stages: every
           load staged through shared memory by cp.async), over up slabs and down chunks and stages.
--phase 29 MoE decode, T = 1 and 4: the unstaged up loop as it was (pointers carried and advanced, a
           plain range) against the production body at STAGES 1 (base + k0 in a tl.range).
--phase 30 MoE decode, T = 1: the down kernel's unstaged loop with base + k0 addresses, and the production
           bodies at 1-3 stages, over up slabs and down chunks.

    python3 bench/explore_decode.py --phase N [--only attention|moe] [--quick]
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time
import traceback
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait, globaltimer, smid  # noqa: E402

from policy_runtime import attention as A  # noqa: E402
from policy_runtime import moe as M  # noqa: E402
from bench.runlog import RunLog  # noqa: E402
from policy_runtime.timing import (  # noqa: E402
    SLEEP_CYCLES,
    captured,
    flush_l2,
    gpu_ms,
    gpu_samples_ms,
    per_round,
    rel_err,
)
from policy_runtime.tuning import BoundKernel  # noqa: E402

AP = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
AP.add_argument("--only", choices=["attention", "moe"], default=None)
AP.add_argument("--quick", action="store_true", help="a few configs each (a smoke run of the script)")
AP.add_argument("--hw", default="h200")
AP.add_argument(
    "--phase",
    type=int,
    default=1,
    help="1: sweeps of the current kernels; 2: prototypes; 3: decode bodies x partition sizes; 4: dependent launch; "
    "5: MoE decode on the CUDA cores; 6: the L2 flush; 7: decode candidates in rounds; "
    "8: MoE decode unrolled and chained; 9: small decode grids x partition sizes; "
    "10: MoE decode GEMMs in one launch; 11: MoE decode, more loads in flight, chained; "
    "12: the up kernel prefetches the down's weights to L2; 13: the down kernel two chunks ahead; "
    "14: routing inside the two GEMM launches; 15: MoE decode kernels with capped registers; "
    "16: MoE decode timeline, and both GEMMs split over the intermediate size in one launch; "
    "17: MoE decode timelines over up and down tile pairs; 18: the down kernel's first chunks and h ahead; "
    "19: launch overhead of chains, the router as a dependent launch; 20: the router's top-k in one pass; "
    "21: routing inside the GEMM launches with the one-pass top-k; 22: the one-pass router's warps; "
    "23: the chained decode layer's tile pairs per expert shape, T = 1, 2, 4; 24: narrower slabs and wider down "
    "programs at T = 1; 25: the down kernel waits on a counter of finished up programs, not on the up grid; "
    "26: the timer's own cost (events around nothing, a torch kernel, an empty Triton kernel) and its samples; "
    "27: one token routed by the up launch's first program, the others waiting on its flag; "
    "28: the simt loops software-pipelined (cp.async stages) over slabs, chunks and stages; "
    "29: the unstaged up loop, pointers carried or base + k0; "
    "30: the down loop as base + k0 too, and every depth over slabs and chunks",
)
ARGS = AP.parse_args()
DEV, DT, HW = "cuda", torch.bfloat16, ARGS.hw
RES: dict = {
    "moe30": [],
    "moe29": [],
    "moe28": [],
    "moe27": [],
    "moe26": [],
    "moe25": [],
    "moe24": [],
    "moe23": [],
    "moe22": [],
    "moe21": [],
    "moe20": [],
    "moe19": [],
    "moe18": [],
    "moe17": [],
    "moe16": [],
    "timeline": [],
    "moe15": [],
    "moe14": [],
    "moe13": [],
    "moe12": [],
    "moe11": [],
    "moe10": [],
    "attention9": [],
    "moe8": [],
    "attention7": [],
    "flush": [],
    "moe5": [],
    "pdl": [],
    "attention3": [],
    "attention2": [],
    "moe2": [],
    "attention": [],
    "attention_profile": [],
    "moe": [],
    "moe_profile": [],
    "errors": [],
    "copy": {},
}
RUN = RunLog("explore_decode", RES, smoke=False)
log, save = RUN.log, RUN.write


# The decode body as these phases measured it (2026-12-01): every attention feature off, the tile as
# wide as the head (policy_runtime.attention._decode has since taken the features and a padded tile;
# with them off it compiles the same code).
@triton.jit
def _decode_cur(q, kc, vc, bt, sl, o, part_o, part_m, part_l, sm_scale, group, bt_stride, v1_limit, torch_limit,
                partition_size, max_parts, sqs, sqh, skb, skt, skh, svb, svt, svh, sos, soh,
                HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, Q_ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
                DOT_PREC: tl.constexpr):  # fmt: skip
    A._decode(q, kc, vc, bt, sl, o, part_o, part_m, part_l, sm_scale, group, bt_stride, v1_limit, torch_limit,
              partition_size, max_parts, sqs, sqh, skb, skt, skh, svb, svt, svh, sos, soh, 0, 0.0, part_m, part_m,
              HEAD_DIM, HEAD_DIM, BLOCK_SIZE, Q_ROWS, False, False, False, False, BLOCK_N, DOT_PREC)  # fmt: skip


def copy_tbps(nbytes):
    """(read + written) bytes / s of a device copy of nbytes (memoised)."""
    if nbytes not in RES["copy"]:
        src = torch.empty(nbytes // 2, dtype=torch.int16, device=DEV).random_()
        dst = torch.empty_like(src)
        RES["copy"][nbytes] = 2 * nbytes / (gpu_ms(lambda: dst.copy_(src)) * 1e-3) / 1e12
    return RES["copy"][nbytes]


def kernel_times(fn, iters=30):
    """Mean GPU µs per call of each kernel fn launches (profiler), each call after an L2 flush."""
    from torch.profiler import ProfilerActivity, profile

    flush = torch.empty(256 << 20, dtype=torch.int8, device=DEV)
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            flush.zero_()
            torch.cuda._sleep(100_000)
            fn()
        torch.cuda.synchronize()
    times = {}
    for e in prof.key_averages():
        total = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if total and e.count >= iters and "Fill" not in e.key and "sleep" not in e.key.lower():
            times[e.key[:60]] = round(total / iters, 2)
    return times


def checked(row, out, ref, run):
    """Poison ``out``, run once, and record in ``row`` the relative error against ``ref``: under 2e-2?"""
    out.fill_(float("nan"))
    run()
    row["rel_err"] = err = rel_err(out, ref)
    return err < 2e-2


def attempt(key, row, label, body, show, done="us"):
    """One explored variant: ``body()`` fills ``row`` (its check, its times); an exception is the
    row's error.  The row joins RES[key], and the log gets ``label`` with ``show(row)`` where the row
    has its ``done`` figure, else with its error or its relative error."""
    try:
        body()
    except Exception as e:  # noqa: BLE001
        row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    RES[key].append(row)
    log(f"  {label}: " + (show(row) if done in row else str(row.get("error") or row.get("rel_err"))))


# ---------------------------------------------------------------------------------------
# 1. attention decode

ATT_CASES = [(128, 32, 8, 8, 8192), (256, 16, 4, 8, 8192), (128, 32, 8, 1, 32768), (256, 16, 4, 1, 32768)]


def paged_case(D, H, Hkv, batch, context):
    """A paged cache of batch x context tokens (blocks of 16 in random order), queries, an output,
    the fp32 reference, and the time of a copy of the KV bytes (us)."""
    per = -(-context // 16)
    nb = batch * per
    kc = torch.randn(nb, 16, Hkv, D, device=DEV, dtype=DT)
    vc = torch.randn(nb, 16, Hkv, D, device=DEV, dtype=DT)
    table = torch.randperm(nb, device=DEV).to(torch.int32).view(batch, per)
    lens = torch.full((batch,), context, dtype=torch.int32, device=DEV)
    q = torch.randn(batch, H, D, device=DEV, dtype=DT)
    out = torch.empty_like(q)
    ref = torch.empty(batch, H, D, device=DEV)
    for s in range(batch):
        rows = table[s].long()
        k = kc[rows].reshape(-1, Hkv, D)[:context].float()
        v = vc[rows].reshape(-1, Hkv, D)[:context].float()
        qq = q[s].float().view(Hkv, H // Hkv, D)
        sc = torch.einsum("hgd,lhd->hgl", qq, k) * D**-0.5
        ref[s] = torch.einsum("hgl,lhd->hgd", sc.softmax(-1), v).reshape(H, D)
    kv_bytes = 2 * batch * context * Hkv * D * 2
    return kc, vc, table, lens, q, out, ref, kv_bytes / (copy_tbps(kv_bytes) * 1e12) * 1e6


def att_case(D, H, Hkv, batch, context):
    import generated.attention as G

    att = G._ATTENTION
    kc, vc, table, lens, q, out, ref, floor_us = paged_case(D, H, Hkv, batch, context)
    sel = att.select(DT, D, HW, torch.device(DEV))
    base_cfg = {f: getattr(sel.config, f) for f in sel.config.__dataclass_fields__}
    name = f"d={D} kv={Hkv} batch={batch} ctx={context}"

    def run(kernel=None, ps=None):
        cfg = SimpleNamespace(**dict(base_cfg, partition_size=ps)) if ps else None
        return lambda: att.decode(q, kc, vc, table, lens, out=out, hw=HW, kernel=kernel, config=cfg)

    cur = run()
    prof = kernel_times(cur)
    cur_us = gpu_ms(cur) * 1e3
    RES["attention_profile"].append(
        {
            "case": name,
            "kernels": prof,
            "e2e_us": cur_us,
            "floor_us": floor_us,
            "current": sel.decode.name,
            "partition_size": sel.config.partition_size,
        }
    )
    log(
        f"{name}: current {sel.decode.name} ps={sel.config.partition_size}: {cur_us:.1f} us "
        f"(floor {floor_us:.1f}, {floor_us / cur_us:.2f} of copy); kernels {prof}"
    )
    blocks = {128: [32, 64, 128], 256: [16, 32, 64]}[D]
    grid = list(itertools.product(blocks, [4, 8], [2, 3, 4]))
    if ARGS.quick:
        grid = grid[:2]
    for bn, w, st in grid:
        body = BoundKernel(_decode_cur, f"dec_{D}_{bn}_{w}_{st}", dict(BLOCK_N=bn, DOT_PREC="tf32"))
        kern = A.DecodeKernel(kernel=body, dtype_class="16bit", block_n=bn, num_warps=w, num_stages=st)
        for ps in [256, 512, 1024]:
            row = {"case": name, "block_n": bn, "warps": w, "stages": st, "partition_size": ps}

            def measure(row=row, fn=run(kern, ps)):
                if not checked(row, out, ref, fn):
                    row["bad"] = True
                    return
                us = gpu_ms(fn) * 1e3
                row.update(us=us, frac_copy=floor_us / us, vs_current=cur_us / us)

            attempt(
                "attention",
                row,
                f"{name} bn={bn} w={w} st={st} ps={ps}",
                measure,
                lambda r: f"{r['us']:.1f} us {r['frac_copy']:.2f} of copy ({r['vs_current']:.3f}x current)",
            )
        save()


# ---------------------------------------------------------------------------------------
# 2. MoE decode: the gemv kernels and a split-K prototype of the up GEMM


@triton.jit
def _up_split(
    x_ptr,
    w_ptr,
    part_ptr,
    ids_ptr,
    N,
    K,
    top_k,
    k_chunk,
    rows,
    stride_xm,
    stride_we,
    stride_wn,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    # Prototype: program (r, n, s) computes gate and up columns [n*BLOCK_N, +BLOCK_N) of flat row
    # r over K chunk s, in fp32, into part[s, r, 0:N] (gate) and part[s, r, N:2N] (up).
    r = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    s = tl.program_id(2)
    cols = (offs_n % N).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    lane = tl.arange(0, 16)[:, None]
    first = lane == 0
    expert = tl.load(ids_ptr + r).to(tl.int64)
    k_lo = s * k_chunk
    a_ptrs = x_ptr + (r // top_k).to(tl.int64) * stride_xm + lane * 0 + (k_lo + offs_k)[None, :]
    g_ptrs = w_ptr + expert * stride_we + cols[None, :] * stride_wn + (k_lo + offs_k)[:, None]
    u_ptrs = g_ptrs + N * stride_wn
    acc_g = tl.zeros((16, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((16, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, k_chunk, BLOCK_K):
        a = tl.load(a_ptrs, mask=first, other=0.0)
        g = tl.load(g_ptrs)
        u = tl.load(u_ptrs)
        acc_g = tl.dot(a, g, acc_g)
        acc_u = tl.dot(a, u, acc_u)
        a_ptrs += BLOCK_K
        g_ptrs += BLOCK_K
        u_ptrs += BLOCK_K
    base = part_ptr + (s * rows + r).to(tl.int64) * (2 * N) + lane * 0
    tl.store(base + offs_n[None, :], acc_g, mask=first & (offs_n < N)[None, :])
    tl.store(base + N + offs_n[None, :], acc_u, mask=first & (offs_n < N)[None, :])


@triton.jit
def _down_act(
    part_ptr,
    w_ptr,
    out_ptr,
    weights_ptr,
    ids_ptr,
    N,
    K,
    top_k,
    rows,
    stride_we,
    stride_wn,
    stride_om,
    SPLIT: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    # Prototype: _gemv_down whose A row is SiLU(sum_s gate_s) * (sum_s up_s), rounded to the
    # weights' dtype, read from _up_split's fp32 partials (K here is the intermediate size).
    t = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = (offs_n % N).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    lane = tl.arange(0, 16)[:, None]
    first = lane == 0
    k_tiles = K // BLOCK_K
    acc = tl.zeros((16, BLOCK_N), dtype=tl.float32)
    for it in range(0, top_k * k_tiles):
        r = t * top_k + it // k_tiles
        k0 = (it % k_tiles) * BLOCK_K
        expert = tl.load(ids_ptr + r).to(tl.int64)
        weight = tl.load(weights_ptr + r).to(tl.float32)
        g = tl.zeros((16, BLOCK_K), dtype=tl.float32)
        u = tl.zeros((16, BLOCK_K), dtype=tl.float32)
        for s in tl.static_range(SPLIT):
            p = part_ptr + (s * rows + r).to(tl.int64) * (2 * K) + lane * 0 + (k0 + offs_k)[None, :]
            g += tl.load(p, mask=first, other=0.0)
            u += tl.load(p + K, mask=first, other=0.0)
        a = (g / (1.0 + tl.exp(-g)) * u).to(w_ptr.dtype.element_ty)
        b = tl.load(w_ptr + expert * stride_we + cols[None, :] * stride_wn + (k0 + offs_k)[:, None])
        acc += weight * tl.dot(a, b)
    o_ptrs = out_ptr + t.to(tl.int64) * stride_om + lane * 0 + offs_n[None, :]
    tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=first & (offs_n < N)[None, :])


MOE_SHAPES = {"qwen36": (256, 3584, 512, 8), "e128": (128, 2048, 768, 8)}


def moe_data(shape, T):
    """Seeded hidden states, w1, w2 and fp32 router logits of one MoE case."""
    E, H, inter, k = MOE_SHAPES[shape]
    g = torch.Generator(device=DEV).manual_seed(T)
    x = torch.randn(T, H, device=DEV, generator=g).to(DT)
    w1 = (torch.randn(E, 2 * inter, H, device=DEV, generator=g) / H**0.5).to(DT)
    w2 = (torch.randn(E, H, inter, device=DEV, generator=g) / inter**0.5).to(DT)
    return x, w1, w2, torch.randn(T, E, device=DEV, generator=g)


def moe_case(shape, T):
    import generated.moe as G

    E, H, inter, k = MOE_SHAPES[shape]
    x, w1, w2, logits = moe_data(shape, T)
    weights, ids = G.topk_softmax(logits, k, True)
    wf, idf = weights.view(-1), ids.view(-1)
    used = idf.unique().numel()
    wbytes = used * 3 * H * inter * 2
    up_bytes, down_bytes = used * 2 * H * inter * 2, used * H * inter * 2
    copy = copy_tbps(1 << 30)
    name = f"{shape} T={T}"
    # fp32 reference
    ref = torch.zeros(T, H, device=DEV)
    for j in range(T * k):
        e = int(idf[j])
        hh = x[j // k].float() @ w1[e].float().T
        a = torch.nn.functional.silu(hh[:inter]) * hh[inter:]
        ref[j // k] += wf[j] * (a.to(DT).float() @ w2[e].float().T)
    out = torch.empty(T, H, device=DEV, dtype=DT)

    def full():
        ww, ii = G.topk_softmax(logits, k, True)
        return G.fused_moe(x, w1, w2, ww, ii, out=out, hw=HW)

    prof = kernel_times(full)
    e2e = gpu_ms(full) * 1e3
    bucket = G.select(T, inter, dtype=DT, hw=HW, device=DEV)
    RES["moe_profile"].append(
        {
            "case": name,
            "kernels": prof,
            "e2e_us": e2e,
            "weight_bytes": wbytes,
            "frac_copy": wbytes / (e2e * 1e-6) / (copy * 1e12),
            "bucket": bucket.variant.name,
        }
    )
    log(
        f"{name}: current {bucket.variant.name}: {e2e:.1f} us ({wbytes / (e2e * 1e-6) / (copy * 1e12):.2f} of copy),"
        f" floor {wbytes / (copy * 1e12) * 1e6:.1f} us; kernels {prof}"
    )
    numel = T * k
    h = torch.empty(numel, inter, device=DEV, dtype=DT)
    # h as the current kernels compute it, for the down kernels alone.
    v0 = bucket.variant
    v0.run(x, w1, w2, wf, idf, out, 0, E)
    grid = list(itertools.product([16, 32, 64], [64, 128, 256], [4, 8], [4, 6]))
    if ARGS.quick:
        grid = grid[:2]
    for bn, bk, w, st in grid:
        opts = dict(num_warps=w, num_stages=st)
        consts = dict(BLOCK_N=bn, BLOCK_K=bk, DOT_PREC="tf32")
        row = {"case": name, "kernel": "gemv", "block_n": bn, "block_k": bk, "warps": w, "stages": st}

        def up():
            M._gemv_up[(numel, triton.cdiv(inter, bn))](
                x,
                w1,
                h,
                idf,
                inter,
                H,
                k,
                x.stride(0),
                x.stride(1),
                *w1.stride(),
                *h.stride(),
                0,
                H % bk == 0,
                **consts,
                **opts,
            )

        def down():
            M._gemv_down[(T, triton.cdiv(H, bn))](
                h,
                w2,
                out,
                wf,
                idf,
                H,
                inter,
                k,
                *h.stride(),
                *w2.stride(),
                *out.stride(),
                inter % bk == 0,
                **consts,
                **opts,
            )

        def measure():
            up()
            down()
            if checked(row, out, ref, lambda: (up(), down())):
                row["up_us"] = gpu_ms(up) * 1e3
                row["down_us"] = gpu_ms(down) * 1e3
                row["up_frac"] = up_bytes / (row["up_us"] * 1e-6) / (copy * 1e12)
                row["down_frac"] = down_bytes / (row["down_us"] * 1e-6) / (copy * 1e12)

        attempt(
            "moe",
            row,
            f"{name} gemv bn={bn} bk={bk} w={w} st={st}",
            measure,
            lambda r: f"up {r['up_us']:.1f} us ({r['up_frac']:.2f}), down {r['down_us']:.1f} us ({r['down_frac']:.2f})",
            done="up_us",
        )
    save()
    # split-K prototype of the up GEMM, the activation in the down GEMM
    sgrid = list(itertools.product([2, 4, 7], [16, 32], [128], [4], [4, 6]))
    if ARGS.quick:
        sgrid = sgrid[:2]
    for split, bn, bk, w, st in sgrid:
        if H % (split * bk) or inter % bk:
            continue
        part = torch.empty(split, numel, 2 * inter, device=DEV, dtype=torch.float32)
        opts = dict(num_warps=w, num_stages=st)
        row = {"case": name, "kernel": "split", "split": split, "block_n": bn, "block_k": bk, "warps": w, "stages": st}

        def sup():
            _up_split[(numel, triton.cdiv(inter, bn), split)](
                x,
                w1,
                part,
                idf,
                inter,
                H,
                k,
                H // split,
                numel,
                x.stride(0),
                w1.stride(0),
                w1.stride(1),
                BLOCK_N=bn,
                BLOCK_K=bk,
                **opts,
            )

        def sdown():
            _down_act[(T, triton.cdiv(H, bn))](
                part,
                w2,
                out,
                wf,
                idf,
                H,
                inter,
                k,
                numel,
                w2.stride(0),
                w2.stride(1),
                out.stride(0),
                SPLIT=split,
                BLOCK_N=bn,
                BLOCK_K=bk,
                **opts,
            )

        def both():
            sup()
            sdown()

        def measure():
            both()
            if checked(row, out, ref, both):
                row["up_us"] = gpu_ms(sup) * 1e3
                row["down_us"] = gpu_ms(sdown) * 1e3
                row["both_us"] = gpu_ms(both) * 1e3
                row["up_frac"] = up_bytes / (row["up_us"] * 1e-6) / (copy * 1e12)
                row["both_frac"] = (up_bytes + down_bytes) / (row["both_us"] * 1e-6) / (copy * 1e12)

        attempt(
            "moe",
            row,
            f"{name} split={split} bn={bn} bk={bk} st={st}",
            measure,
            lambda r: f"up {r['up_us']:.1f} ({r['up_frac']:.2f}) down {r['down_us']:.1f} both {r['both_us']:.1f} "
            f"({r['both_frac']:.2f})",
            done="up_us",
        )
    save()


# ---------------------------------------------------------------------------------------
# Phase 2: prototypes.  Decode with the block table read one tile ahead; a merge over every
# partition at once, split over head_dim; MoE's down GEMM with expert ids and weights read one
# step ahead; topk_softmax's tile and warps.


@triton.jit
def _decode_pf(
    q_ptr,
    kc_ptr,
    vc_ptr,
    bt_ptr,
    sl_ptr,
    o_ptr,
    part_o,
    part_m,
    part_l,
    sm_scale,
    group,
    bt_stride,
    v1_limit,
    torch_limit,
    partition_size,
    max_parts,
    sqs,
    sqh,
    skb,
    skt,
    skh,
    svb,
    svt,
    svh,
    sos,
    soh,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    Q_ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    part = tl.program_id(2)
    seq_len = tl.load(sl_ptr + seq)
    is_v2 = seq_len > v1_limit
    start = tl.where(is_v2, part * partition_size, 0)
    end = tl.where(is_v2, tl.minimum(part * partition_size + partition_size, seq_len), seq_len)
    skip = (seq_len > torch_limit) | ((seq_len <= v1_limit) & (part > 0)) | (is_v2 & (start >= seq_len))
    if skip:
        return
    offs_g = tl.arange(0, Q_ROWS)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    in_group = offs_g < group
    heads = kv_head * group + offs_g
    seq64 = seq.to(tl.int64)
    q = tl.load(q_ptr + seq64 * sqs + heads[:, None] * sqh + offs_d[None, :], mask=in_group[:, None], other=0.0)
    bt_row = bt_ptr + seq64 * bt_stride
    k_head = kc_ptr + kv_head * skh
    v_head = vc_ptr + kv_head * svh
    qk_scale = sm_scale * 1.4426950408889634
    m_i = tl.full([Q_ROWS], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([Q_ROWS], dtype=tl.float32)
    acc = tl.zeros([Q_ROWS, HEAD_DIM], dtype=tl.float32)
    toks = start + offs_n
    block = tl.load(bt_row + toks // BLOCK_SIZE, mask=toks < end, other=0).to(tl.int64)
    for tok0 in range(start, end, BLOCK_N):
        toks = tok0 + offs_n
        live = toks < end
        nxt = toks + BLOCK_N
        block_next = tl.load(bt_row + nxt // BLOCK_SIZE, mask=nxt < end, other=0).to(tl.int64)
        slot = toks % BLOCK_SIZE
        k = tl.load(
            k_head + block[:, None] * skb + slot[:, None] * skt + offs_d[None, :], mask=live[:, None], other=0.0
        )
        v = tl.load(
            v_head + block[:, None] * svb + slot[:, None] * svt + offs_d[None, :], mask=live[:, None], other=0.0
        )
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * qk_scale
        s = tl.where(live[None, :], s, float("-inf"))
        acc, m_i, l_i = A._online_softmax_step(acc, m_i, l_i, s, v, DOT_PREC)
        block = block_next
    out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    if seq_len <= v1_limit:
        tl.store(
            o_ptr + seq64 * sos + heads[:, None] * soh + offs_d[None, :],
            out.to(o_ptr.dtype.element_ty),
            mask=in_group[:, None],
        )
    else:
        idx = (seq64 * (group * tl.num_programs(1)) + heads) * max_parts + part
        tl.store(part_o + idx[:, None] * HEAD_DIM + offs_d[None, :], out, mask=in_group[:, None])
        tl.store(part_m + idx, m_i, mask=in_group)
        tl.store(part_l + idx, l_i, mask=in_group)


@triton.jit(do_not_specialize=["v1_limit", "torch_limit", "partition_size", "max_parts"])
def _merge_par(
    o_ptr,
    part_o,
    part_m,
    part_l,
    sl_ptr,
    v1_limit,
    torch_limit,
    partition_size,
    max_parts,
    sos,
    soh,
    HEAD_DIM: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # grid = (sequences, heads, HEAD_DIM // BLOCK_D); BLOCK_P partitions a step.
    seq = tl.program_id(0)
    head = tl.program_id(1)
    offs_d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    seq_len = tl.load(sl_ptr + seq)
    if (seq_len <= v1_limit) | (seq_len > torch_limit):
        return
    n_parts = tl.cdiv(seq_len, partition_size)
    base = (seq.to(tl.int64) * tl.num_programs(1) + head) * max_parts
    offs_p = tl.arange(0, BLOCK_P)
    m_run = tl.full([BLOCK_P], -1.0e30, dtype=tl.float32)
    for p0 in range(0, n_parts, BLOCK_P):
        p = p0 + offs_p
        m_run = tl.maximum(m_run, tl.load(part_m + base + p, mask=p < n_parts, other=-1.0e30))
    m_all = tl.max(m_run, 0)
    w_sum = tl.zeros([BLOCK_P], dtype=tl.float32)
    acc = tl.zeros([BLOCK_P, BLOCK_D], dtype=tl.float32)
    for p0 in range(0, n_parts, BLOCK_P):
        p = p0 + offs_p
        live = p < n_parts
        w = tl.load(part_l + base + p, mask=live, other=0.0) * tl.math.exp2(
            tl.load(part_m + base + p, mask=live, other=-1.0e30) - m_all
        )
        o = tl.load(part_o + (base + p)[:, None] * HEAD_DIM + offs_d[None, :], mask=live[:, None], other=0.0)
        acc += o * w[:, None]
        w_sum += w
    out = tl.sum(acc, 0) / tl.sum(w_sum, 0)
    tl.store(o_ptr + seq.to(tl.int64) * sos + head * soh + offs_d, out.to(o_ptr.dtype.element_ty))


def att_case2(D, H, Hkv, batch, context):
    kc, vc, table, lens, q, out, ref, floor_us = paged_case(D, H, Hkv, batch, context)
    nb = table.numel()
    ident = torch.arange(nb, device=DEV).to(torch.int32).view(table.shape)
    name = f"d={D} kv={Hkv} batch={batch} ctx={context}"
    group = H // Hkv
    q_rows = max(16, triton.next_power_of_2(group))
    configs = {
        128: [(64, 4, 3), (64, 4, 2), (32, 4, 3), (64, 4, 4), (128, 4, 2)],
        256: [(32, 4, 2), (32, 4, 3), (64, 8, 2), (64, 8, 3), (64, 4, 2)],
    }[D]
    if ARGS.quick:
        configs = configs[:1]
    for (bn, w, st), ps, body, merge, tab in itertools.product(
        configs, [512, 1024], ["cur", "pf"], ["cur", "par"], ["rand", "ident"]
    ):
        if tab == "ident" and (merge == "cur" or body == "cur"):
            continue
        parts = triton.cdiv(context, ps)
        part_o = torch.empty((batch, H, parts, D), dtype=torch.float32, device=DEV)
        part_ml = torch.empty((2, batch, H, parts), dtype=torch.float32, device=DEV)
        kern = _decode_cur if body == "cur" else _decode_pf
        bt = table if tab == "rand" else ident
        bp = min(128, triton.next_power_of_2(parts))
        bd = 64 if D >= 64 else D

        def run():
            kern[(batch, Hkv, parts)](
                q,
                kc,
                vc,
                bt,
                lens,
                out,
                part_o,
                part_ml[0],
                part_ml[1],
                D**-0.5,
                group,
                bt.stride(0),
                0,
                1 << 30,
                ps,
                parts,
                q.stride(0),
                q.stride(1),
                *kc.stride()[:3],
                *vc.stride()[:3],
                out.stride(0),
                out.stride(1),
                D,
                16,
                q_rows,
                BLOCK_N=bn,
                DOT_PREC="tf32",
                num_warps=w,
                num_stages=st,
            )
            if merge == "cur":
                # The merge as it was before phase 2: 16 partitions a step, a whole head a program
                # (today's _merge with its column slice the whole head_dim).
                A._merge[(batch, H, 1)](
                    out,
                    part_o,
                    part_ml[0],
                    part_ml[1],
                    lens,
                    0,
                    1 << 30,
                    ps,
                    parts,
                    out.stride(0),
                    out.stride(1),
                    D,
                    16,
                    D,
                    num_warps=4,
                )
            else:
                _merge_par[(batch, H, D // bd)](
                    out,
                    part_o,
                    part_ml[0],
                    part_ml[1],
                    lens,
                    0,
                    1 << 30,
                    ps,
                    parts,
                    out.stride(0),
                    out.stride(1),
                    D,
                    bp,
                    bd,
                    num_warps=4,
                )

        row = {
            "case": name,
            "block_n": bn,
            "warps": w,
            "stages": st,
            "partition_size": ps,
            "body": body,
            "merge": merge,
            "table": tab,
        }

        def measure():
            if tab == "rand":
                ok = checked(row, out, ref, run)
            else:  # the identity table: the reference is the random one's, so only finite outputs count
                out.fill_(float("nan"))
                run()
                ok = bool(torch.isfinite(out).all())
            if ok:
                us = gpu_ms(run) * 1e3
                row.update(us=us, frac_copy=floor_us / us, floor_us=floor_us)
                if merge == "par" and tab == "rand":
                    row["kernels"] = kernel_times(run)

        attempt(
            "attention2",
            row,
            f"{name} {body}/{merge}/{tab} bn={bn} w={w} st={st} ps={ps}",
            measure,
            lambda r: f"{r['us']:.1f} us {r['frac_copy']:.2f} of copy ({r['us'] / floor_us:.2f}x floor) {r.get('kernels', '')}",
        )
    save()


def moe_case2(shape, T):
    import generated.moe as G

    E, H, inter, k = MOE_SHAPES[shape]
    x, w1, w2, logits = moe_data(shape, T)
    weights, ids = G.topk_softmax(logits, k, True)
    wf, idf = weights.view(-1), ids.view(-1)
    used = idf.unique().numel()
    down_bytes = used * H * inter * 2
    copy = copy_tbps(1 << 30)
    name = f"{shape} T={T}"
    numel = T * k
    h = torch.empty(numel, inter, device=DEV, dtype=DT)
    out = torch.empty(T, H, device=DEV, dtype=DT)
    bucket = G.select(T, inter, dtype=DT, hw=HW, device=DEV)
    bucket.variant.run(x, w1, w2, wf, idf, out, 0, E)
    ref = out.float().clone()
    # "down_cur" / "down_pf" rows of h200_explore_decode2.json: the down kernel before and after it read the
    # expert ids a step ahead (the "pf" prototype, since then policy_runtime.moe._gemv_down); measured now: the latter.
    for bn, bk, w, st, body in itertools.product([16, 32, 64], [128, 256], [4], [3, 4, 6], ["pf"]):
        if ARGS.quick and bn != 32:
            continue
        opts = dict(num_warps=w, num_stages=st)
        row = {"case": name, "kernel": "down_" + body, "block_n": bn, "block_k": bk, "warps": w, "stages": st}

        def down():
            M._gemv_down[(T, triton.cdiv(H, bn))](
                h,
                w2,
                out,
                wf,
                idf,
                H,
                inter,
                k,
                *h.stride(),
                *w2.stride(),
                *out.stride(),
                True,
                BLOCK_N=bn,
                BLOCK_K=bk,
                DOT_PREC="tf32",
                **opts,
            )

        if inter % bk:
            continue

        def measure():
            # h from the bucket's own up kernel
            bucket.variant.run(x, w1, w2, wf, idf, out, 0, E)
            M._gemv_up[(numel, triton.cdiv(inter, 32))](
                x,
                w1,
                h,
                idf,
                inter,
                H,
                k,
                x.stride(0),
                x.stride(1),
                *w1.stride(),
                *h.stride(),
                0,
                H % 128 == 0,
                BLOCK_N=32,
                BLOCK_K=128,
                DOT_PREC="tf32",
                num_warps=4,
                num_stages=4,
            )
            if checked(row, out, ref, down):
                row["down_us"] = gpu_ms(down) * 1e3
                row["down_frac"] = down_bytes / (row["down_us"] * 1e-6) / (copy * 1e12)

        attempt(
            "moe2",
            row,
            f"{name} down {body} bn={bn} bk={bk} st={st}",
            measure,
            lambda r: f"{r['down_us']:.1f} us ({r['down_frac']:.2f})",
            done="down_us",
        )
    # topk_softmax: tile rows and warps
    wref, iref = G.topk_softmax(logits, k, True)
    e_block = triton.next_power_of_2(E)
    for bt_rows, w in itertools.product([1, 2, 4, 16], [1, 2, 4]):
        if ARGS.quick and w != 1:
            continue
        ww = torch.empty(T, k, device=DEV)
        ii = torch.empty(T, k, dtype=torch.int32, device=DEV)

        def topk():
            M._topk_softmax_kernel[(triton.cdiv(T, bt_rows),)](
                logits,
                ww,
                ii,
                T,
                E,
                k,
                logits.stride(0),
                logits.stride(1),
                RENORMALIZE=True,
                BLOCK_T=bt_rows,
                E_BLOCK=e_block,
                K_BLOCK=triton.next_power_of_2(k),
                num_warps=w,
            )

        row = {"case": name, "kernel": "topk", "block_t": bt_rows, "warps": w}

        def measure():
            topk()
            row["same"] = bool(torch.equal(ii, iref) and torch.allclose(ww, wref))
            row["us"] = gpu_ms(topk) * 1e3

        attempt("moe2", row, f"{name} topk rows={bt_rows} w={w}", measure, lambda r: f"{r['us']} same={r['same']}")
    save()


ATT3_CONFIGS = {
    128: [("cur", 64, 4, 3), ("cur", 64, 4, 2), ("pf", 32, 4, 3), ("pf", 32, 4, 4), ("pf", 64, 4, 2), ("pf", 64, 4, 3)],
    256: [("cur", 32, 4, 2), ("cur", 32, 4, 3), ("pf", 32, 4, 3), ("pf", 32, 4, 4), ("pf", 16, 4, 4), ("pf", 64, 8, 2)],
}
# Phase 7: the candidates phase 3 (on the reading flush) left for both decode targets, per head_dim.
ATT7_CONFIGS = {
    128: [("cur", 64, 4, 3, 512), ("cur", 64, 4, 3, 256), ("cur", 64, 4, 2, 512), ("pf", 32, 4, 3, 512),
          ("pf", 32, 4, 3, 1024), ("pf", 64, 4, 2, 512)],
    256: [("cur", 32, 4, 2, 512), ("cur", 32, 4, 2, 256), ("cur", 32, 4, 3, 256), ("pf", 32, 4, 3, 256),
          ("pf", 32, 4, 3, 512), ("pf", 32, 4, 3, 1024), ("pf", 32, 4, 2, 256), ("pf", 32, 4, 2, 512)],
}  # fmt: skip


def decode_run(case, body, bn, w, st, ps):
    """One V2 decode call (every sequence V2) of a paged case with this body, tile and partition
    size, and the current merge."""
    D, H, Hkv, batch, context, (kc, vc, table, lens, q, out) = case
    parts = triton.cdiv(context, ps)
    part_o = torch.empty((batch, H, parts, D), dtype=torch.float32, device=DEV)
    part_ml = torch.empty((2, batch, H, parts), dtype=torch.float32, device=DEV)
    kern = _decode_cur if body == "cur" else _decode_pf
    bd = min(D, A._MERGE_BLOCK_D)

    def run():
        kern[(batch, Hkv, parts)](
            q, kc, vc, table, lens, out, part_o, part_ml[0], part_ml[1], D**-0.5, H // Hkv, table.stride(0), 0,
            1 << 30, ps, parts, q.stride(0), q.stride(1), *kc.stride()[:3], *vc.stride()[:3], out.stride(0),
            out.stride(1), D, 16, 16, BLOCK_N=bn, DOT_PREC="tf32", num_warps=w, num_stages=st)  # fmt: skip
        A._merge[(batch, H, D // bd)](
            out, part_o, part_ml[0], part_ml[1], lens, 0, 1 << 30, ps, parts, out.stride(0), out.stride(1), D,
            A._MERGE_BLOCK_P, bd, num_warps=4)  # fmt: skip

    return run


def att_case3(D, H, Hkv, batch, context):
    """Phase 3: the decode bodies (current, block ids a tile ahead) x tiles x V2 partition sizes,
    with the current merge, every sequence V2."""
    kc, vc, table, lens, q, out, ref, floor_us = paged_case(D, H, Hkv, batch, context)
    case = (D, H, Hkv, batch, context, (kc, vc, table, lens, q, out))
    name = f"d={D} kv={Hkv} batch={batch} ctx={context}"
    for (body, bn, w, st), ps in itertools.product(ATT3_CONFIGS[D], [256, 512, 1024, 2048]):
        run = decode_run(case, body, bn, w, st, ps)
        row = {
            "case": name,
            "batch": batch,
            "context": context,
            "head_dim": D,
            "body": body,
            "block_n": bn,
            "warps": w,
            "stages": st,
            "partition_size": ps,
            "programs": batch * Hkv * triton.cdiv(context, ps),
        }

        def measure():
            if checked(row, out, ref, run):
                us = gpu_ms(run) * 1e3
                row.update(us=us, frac_copy=floor_us / us, floor_us=floor_us)

        attempt(
            "attention3",
            row,
            f"{name} {body} bn={bn} w={w} st={st} ps={ps}",
            measure,
            lambda r: f"{r['us']:.1f} us {r['frac_copy']:.2f} of copy ({r['us'] / floor_us:.2f}x floor)",
        )
    save()


# Phase 9: the production tiles (h200) with partitions halved below the policy's 512 tokens.
ATT9_CONFIGS = {
    128: [("cur", 64, 4, 3, ps) for ps in (64, 128, 256, 512)],
    256: [("cur", 32, 4, 2, ps) for ps in (64, 128, 256, 512)],
}


def att_case9(D, H, Hkv, batch, context):
    att_case7(D, H, Hkv, batch, context, rounds=3, configs=ATT9_CONFIGS, res_key="attention9")


def att_case7(D, H, Hkv, batch, context, rounds=5, configs=ATT7_CONFIGS, res_key="attention7"):
    """Phase 7: phase 3's leading candidates, each checked, then timed in interleaved rounds."""
    kc, vc, table, lens, q, out, ref, floor_us = paged_case(D, H, Hkv, batch, context)
    case = (D, H, Hkv, batch, context, (kc, vc, table, lens, q, out))
    name = f"d={D} kv={Hkv} batch={batch} ctx={context}"
    runs = {}
    for body, bn, w, st, ps in configs[D]:
        key = f"{body} bn={bn} w={w} st={st} ps={ps}"
        run = decode_run(case, body, bn, w, st, ps)
        out.fill_(float("nan"))
        run()
        err = rel_err(out, ref)
        if err < 2e-2:
            runs[key] = run
        else:
            log(f"  {name} {key}: rel err {err}")
    times = per_round(runs, rounds)
    for key, t in times.items():
        us = statistics.median(t) * 1e3
        RES[res_key].append({"case": name, "config": key, "us": us, "rounds_us": [x * 1e3 for x in t],
                                  "floor_us": floor_us, "x_floor": us / floor_us})  # fmt: skip
        log(f"  {name} {key}: {us:.1f} us ({us / floor_us:.3f}x floor, {floor_us / us:.3f} of copy), rounds "
            + " ".join(f"{x * 1e3:.1f}" for x in t))  # fmt: skip
    save()


# ---------------------------------------------------------------------------------------
# Phase 4: programmatic dependent launch (PDL).  Each dependent kernel (the merge after decode;
# MoE's up GEMM after routing, its down GEMM after the up) is launched with launch_pdl=True and
# waits (griddepcontrol.wait) before it reads its producer's output, so that its launch overlaps
# the producer's tail; with TRIG the producer also lets its dependants launch as it starts.


@triton.jit
def _decode_trig(q, kc, vc, bt, sl, o, part_o, part_m, part_l, sm_scale, group, bt_stride, v1_limit, torch_limit,
                 partition_size, max_parts, sqs, sqh, skb, skt, skh, svb, svt, svh, sos, soh,
                 HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, Q_ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
                 DOT_PREC: tl.constexpr, TRIG: tl.constexpr):  # fmt: skip
    if TRIG:
        gdc_launch_dependents()
    _decode_cur(q, kc, vc, bt, sl, o, part_o, part_m, part_l, sm_scale, group, bt_stride, v1_limit, torch_limit,
                partition_size, max_parts, sqs, sqh, skb, skt, skh, svb, svt, svh, sos, soh, HEAD_DIM, BLOCK_SIZE,
                Q_ROWS, BLOCK_N, DOT_PREC)  # fmt: skip


@triton.jit
def _merge_wait(o_ptr, part_o, part_m, part_l, sl_ptr, v1_limit, torch_limit, partition_size, max_parts, sos, soh,
                HEAD_DIM: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr):  # fmt: skip
    gdc_wait()
    A._merge(o_ptr, part_o, part_m, part_l, sl_ptr, v1_limit, torch_limit, partition_size, max_parts, sos, soh,
             HEAD_DIM, BLOCK_P, BLOCK_D)  # fmt: skip


@triton.jit
def _topk_trig(logits_ptr, weights_ptr, ids_ptr, T, E, k, stride_lt, stride_le, RENORMALIZE: tl.constexpr,
               BLOCK_T: tl.constexpr, E_BLOCK: tl.constexpr, K_BLOCK: tl.constexpr, TRIG: tl.constexpr):  # fmt: skip
    # The router; TRIG lets a dependent launch start as it starts (the body's TRIGGER since phase 11's
    # adoption; before, this wrapper called gdc_launch_dependents itself).
    M._topk_softmax_kernel(logits_ptr, weights_ptr, ids_ptr, T, E, k, stride_lt, stride_le, RENORMALIZE, BLOCK_T,
                           E_BLOCK, K_BLOCK, TRIG)  # fmt: skip


@triton.jit
def _up_wait(x_ptr, w_ptr, h_ptr, ids_ptr, N, K, top_k, stride_xm, stride_xk, stride_we, stride_wn, stride_wk,
             stride_hm, stride_hn, ACT: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_K: tl.constexpr, DOT_PREC: tl.constexpr, TRIG: tl.constexpr):  # fmt: skip
    gdc_wait()
    if TRIG:
        gdc_launch_dependents()
    M._gemv_up(x_ptr, w_ptr, h_ptr, ids_ptr, N, K, top_k, stride_xm, stride_xk, stride_we, stride_wn, stride_wk,
               stride_hm, stride_hn, ACT, EVEN_K, BLOCK_N, BLOCK_K, DOT_PREC)  # fmt: skip


@triton.jit
def _down_wait(h_ptr, w_ptr, out_ptr, weights_ptr, ids_ptr, N, K, top_k, stride_hm, stride_hk, stride_we, stride_wn,
               stride_wk, stride_om, stride_on, EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               DOT_PREC: tl.constexpr):  # fmt: skip
    gdc_wait()
    M._gemv_down(h_ptr, w_ptr, out_ptr, weights_ptr, ids_ptr, N, K, top_k, stride_hm, stride_hk, stride_we,
                 stride_wn, stride_wk, stride_om, stride_on, EVEN_K, BLOCK_N, BLOCK_K, DOT_PREC)  # fmt: skip


def att_case4(D, H, Hkv, batch, context):
    kc, vc, table, lens, q, out, ref, floor_us = paged_case(D, H, Hkv, batch, context)
    name = f"d={D} kv={Hkv} batch={batch} ctx={context}"
    bn, st = (64, 3) if D == 128 else (32, 2)  # the h200 records
    ps = 512
    parts = triton.cdiv(context, ps)
    part_o = torch.empty((batch, H, parts, D), dtype=torch.float32, device=DEV)
    part_ml = torch.empty((2, batch, H, parts), dtype=torch.float32, device=DEV)
    bd = min(D, A._MERGE_BLOCK_D)
    args = (
        q,
        kc,
        vc,
        table,
        lens,
        out,
        part_o,
        part_ml[0],
        part_ml[1],
        D**-0.5,
        H // Hkv,
        table.stride(0),
        0,
        1 << 30,
        ps,
        parts,
        q.stride(0),
        q.stride(1),
        *kc.stride()[:3],
        *vc.stride()[:3],
        out.stride(0),
        out.stride(1),
        D,
        16,
        16,
    )
    margs = (
        out,
        part_o,
        part_ml[0],
        part_ml[1],
        lens,
        0,
        1 << 30,
        ps,
        parts,
        out.stride(0),
        out.stride(1),
        D,
        A._MERGE_BLOCK_P,
        bd,
    )

    def variant(mode):
        def run():
            if mode == "base":
                _decode_cur[(batch, Hkv, parts)](*args, BLOCK_N=bn, DOT_PREC="tf32", num_warps=4, num_stages=st)
                A._merge[(batch, H, D // bd)](*margs, num_warps=4)
            else:
                _decode_trig[(batch, Hkv, parts)](*args, BLOCK_N=bn, DOT_PREC="tf32", TRIG=mode == "pdl_trig",
                                                  num_warps=4, num_stages=st)  # fmt: skip
                _merge_wait[(batch, H, D // bd)](*margs, num_warps=4, launch_pdl=True)

        return run

    for mode in ("base", "pdl", "pdl_trig", "base"):
        row = {"case": name, "mode": mode}

        def measure(fn=variant(mode)):
            if checked(row, out, ref, fn):
                us = gpu_ms(fn) * 1e3
                row.update(us=us, x_floor=us / floor_us)

        attempt("pdl", row, f"{name} {mode}", measure, lambda r: f"{r['us']:.1f} us ({r['x_floor']:.3f}x floor)")
    save()


def moe_case4(shape, T):
    import generated.moe as G

    E, H, inter, k = MOE_SHAPES[shape]
    x, w1, w2, logits = moe_data(shape, T)
    out = torch.empty(T, H, device=DEV, dtype=DT)
    v = G.select(T, inter, dtype=DT, hw=HW, device=DEV).variant
    ww, ii = G.topk_softmax(logits, k, True)
    G.fused_moe(x, w1, w2, ww, ii, out=out, hw=HW)
    ref = out.float().clone()
    wbytes = ii.unique().numel() * 3 * H * inter * 2
    copy = copy_tbps(1 << 30)
    name = f"{shape} T={T}"
    numel = T * k
    h = torch.empty(numel, inter, device=DEV, dtype=DT)
    wf = torch.empty(numel, device=DEV)
    idf = torch.empty(numel, dtype=torch.int32, device=DEV)
    e_block = triton.next_power_of_2(E)
    opts = dict(num_warps=v.num_warps, num_stages=v.num_stages)
    consts = dict(BLOCK_N=v.block_n, BLOCK_K=v.block_k, DOT_PREC="tf32")

    def variant(mode):
        pdl = mode != "base"
        trig = mode == "pdl_trig"

        def run():
            if pdl:
                _topk_trig[(T,)](logits, wf, idf, T, E, k, logits.stride(0), logits.stride(1), RENORMALIZE=True,
                                 BLOCK_T=1, E_BLOCK=e_block, K_BLOCK=triton.next_power_of_2(k), TRIG=trig,
                                 num_warps=1)  # fmt: skip
                _up_wait[(numel, triton.cdiv(inter, v.block_n))](
                    x, w1, h, idf, inter, H, k, x.stride(0), x.stride(1), *w1.stride(), *h.stride(), 0,
                    H % v.block_k == 0, TRIG=trig, launch_pdl=True, **consts, **opts)  # fmt: skip
                _down_wait[(T, triton.cdiv(H, v.block_n))](
                    h, w2, out, wf, idf, H, inter, k, *h.stride(), *w2.stride(), *out.stride(), inter % v.block_k == 0,
                    launch_pdl=True, **consts, **opts)  # fmt: skip
            else:
                a, b = G.topk_softmax(logits, k, True)
                G.fused_moe(x, w1, w2, a, b, out=out, hw=HW)

        return run

    for mode in ("base", "pdl", "pdl_trig", "base"):
        row = {"case": name, "mode": mode, "kernels": v.name}

        def measure(fn=variant(mode)):
            if checked(row, out, ref, fn):
                us = gpu_ms(fn) * 1e3
                row.update(us=us, frac_copy=wbytes / (us * 1e-6) / (copy * 1e12))

        attempt("pdl", row, f"{name} {mode}", measure, lambda r: f"{r['us']:.1f} us ({r['frac_copy']:.3f} of copy)")
    save()


# ---------------------------------------------------------------------------------------
# 5. MoE decode on the CUDA cores


# The simt down kernel as policy_runtime/moe.py had it until phase 11 (one expert's slab a step, in slot
# order): phases 5, 6, 8 and 11 measured it, and run it from here.


@triton.jit
def _simt_down_v1(h_ptr, w_ptr, out_ptr, weights_ptr, ids_ptr, N, K, top_k, stride_hm, stride_hk, stride_we,
                  stride_wn, stride_wk, stride_om, stride_on, EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr):  # fmt: skip
    # One token t per program (axis 0), BLOCK_N output columns (axis 1), on the CUDA cores as
    # _simt_up: one flat loop over (expert slot j, K step), the weighted row h[t * k + j] times a
    # BLOCK_N x BLOCK_K slab of w[e] into fp32 accumulators of the slab's shape (each element
    # summed in slot order), reduced over K at the end.  The next step's expert id and weight are
    # read a step ahead, so that a slab's address never waits on a load of its own step.
    t = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = (offs_n % N).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    k_tiles = (K + BLOCK_K - 1) // BLOCK_K
    steps = top_k * k_tiles
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    expert = tl.load(ids_ptr + t * top_k).to(tl.int64)
    weight = tl.load(weights_ptr + t * top_k).to(tl.float32)
    for it in range(0, steps):
        r = t * top_k + it // k_tiles
        k0 = (it % k_tiles) * BLOCK_K
        r_next = t * top_k + tl.minimum(it + 1, steps - 1) // k_tiles
        expert_next = tl.load(ids_ptr + r_next).to(tl.int64)
        weight_next = tl.load(weights_ptr + r_next).to(tl.float32)
        a_ptrs = h_ptr + r.to(tl.int64) * stride_hm + (k0 + offs_k) * stride_hk
        b_ptrs = w_ptr + expert * stride_we + cols[:, None] * stride_wn + (k0 + offs_k)[None, :] * stride_wk
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_ok = offs_k < K - k0
            a = tl.load(a_ptrs, mask=k_ok, other=0.0)
            b = tl.load(b_ptrs, mask=k_ok[None, :], other=0.0)
        acc += b.to(tl.float32) * (a.to(tl.float32) * weight)[None, :]
        expert = expert_next
        weight = weight_next
    o = tl.sum(acc, axis=1)
    tl.store(out_ptr + t.to(tl.int64) * stride_om + offs_n * stride_on, o.to(out_ptr.dtype.element_ty), mask=offs_n < N)


@triton.jit
def _empty(x_ptr):
    pass


@triton.jit
def _topk_packed(logits_ptr, weights_ptr, ids_ptr, E, k, stride_lt, stride_le, RENORMALIZE: tl.constexpr,
                 E_BLOCK: tl.constexpr, K_BLOCK: tl.constexpr):  # fmt: skip
    # Prototype: one token a program; each pick is one int64 max over (probability bits << 32 |
    # E_BLOCK - 1 - expert): a probability is non-negative, so its bits order as it does, and among
    # equal ones the lowest expert wins (as _topk_softmax_kernel's tie-break).
    t = tl.program_id(0)
    ex = tl.arange(0, E_BLOCK)
    in_e = ex < E
    x = tl.load(logits_ptr + t.to(tl.int64) * stride_lt + ex * stride_le, mask=in_e, other=float("-inf"))
    x = x.to(tl.float32)
    p = tl.exp(x - tl.max(x, axis=0))
    p = p / tl.sum(p, axis=0)
    key = (p.to(tl.int32, bitcast=True).to(tl.int64) << 32) | (E_BLOCK - 1 - ex).to(tl.int64)
    key = tl.where(in_e, key, -1)
    kk = tl.arange(0, K_BLOCK)
    vals = tl.zeros((K_BLOCK,), dtype=tl.float32)
    idx = tl.zeros((K_BLOCK,), dtype=tl.int32)
    for j in range(0, k):
        best = tl.max(key, axis=0)
        vals = tl.where(kk == j, (best >> 32).to(tl.int32).to(tl.float32, bitcast=True), vals)
        idx = tl.where(kk == j, E_BLOCK - 1 - (best & 0xFFFFFFFF).to(tl.int32), idx)
        key = tl.where(key == best, -1, key)
    if RENORMALIZE:
        vals = vals / tl.sum(vals, axis=0)
    tl.store(weights_ptr + t * k + kk, vals, mask=kk < k)
    tl.store(ids_ptr + t * k + kk, idx, mask=kk < k)


def moe_case5(shape, T):
    import generated.moe as G

    E, H, inter, k = MOE_SHAPES[shape]
    x, w1, w2, logits = moe_data(shape, T)
    out = torch.empty(T, H, device=DEV, dtype=DT)
    wref, iref = G.topk_softmax(logits, k, True)
    G.fused_moe(x, w1, w2, wref, iref, out=out, hw=HW)
    ref = out.float().clone()
    used = iref.unique().numel()
    up_bytes, down_bytes = used * 2 * H * inter * 2, used * H * inter * 2
    copy = copy_tbps(1 << 30)
    frac = lambda nbytes, us: nbytes / (us * 1e-6) / (copy * 1e12)  # noqa: E731
    name = f"{shape} T={T}"
    numel = T * k
    wf, idf = wref.view(-1), iref.view(-1)
    h = torch.empty(numel, inter, device=DEV, dtype=DT)
    e_block = triton.next_power_of_2(E)
    row = {"case": name, "kernel": "floor"}
    row["us"] = gpu_ms(lambda: _empty[(1,)](out)) * 1e3
    RES["moe5"].append(row)

    def current():
        a, b = G.topk_softmax(logits, k, True)
        G.fused_moe(x, w1, w2, a, b, out=out, hw=HW)

    row = {"case": name, "kernel": "current", "kernels": G.select(T, inter, dtype=DT, hw=HW, device=DEV).variant.name}
    row["us"] = us = gpu_ms(current) * 1e3
    row["frac_copy"] = frac(up_bytes + down_bytes, us)
    RES["moe5"].append(row)
    log(f"{name}: floor {RES['moe5'][-2]['us']:.1f} us; current {us:.1f} us ({row['frac_copy']:.3f} of copy)")
    ww = torch.empty(T, k, device=DEV)
    ii = torch.empty(T, k, dtype=torch.int32, device=DEV)

    def packed():
        _topk_packed[(T,)](logits, ww, ii, E, k, logits.stride(0), logits.stride(1), RENORMALIZE=True,
                           E_BLOCK=e_block, K_BLOCK=triton.next_power_of_2(k), num_warps=1)  # fmt: skip

    for kind, fn in (("topk", lambda: G.topk_softmax(logits, k, True)), ("topk_packed", packed)):
        row = {"case": name, "kernel": kind}

        def measure(fn=fn, kind=kind):
            fn()
            if kind == "topk_packed":
                row["same"] = bool(torch.equal(ii, iref) and torch.allclose(ww, wref))
            row["us"] = gpu_ms(fn) * 1e3

        attempt("moe5", row, f"{name} {kind}", measure, lambda r: f"{r['us']} same={r.get('same')}")
    best = {}
    for part in ("up", "down"):
        for bn, bk, w, st in itertools.product([4, 8, 16], [128, 256, 512], [2, 4, 8], [1, 3]):
            if ARGS.quick and (bn != 8 or w != 4):
                continue
            opts = dict(num_warps=w, num_stages=st, BLOCK_N=bn, BLOCK_K=bk)
            row = {"case": name, "kernel": "simt_" + part, "block_n": bn, "block_k": bk, "warps": w, "stages": st}
            if part == "up":

                def fn(opts=opts, bn=bn, bk=bk):
                    M._simt_up[(numel, triton.cdiv(inter, bn))](
                        x, w1, h, idf, inter, H, k, x.stride(0), x.stride(1), *w1.stride(), *h.stride(), 0,
                        H % bk == 0, PDL=False, **opts)  # fmt: skip

            else:

                def fn(opts=opts, bn=bn, bk=bk):
                    _simt_down_v1[(T, triton.cdiv(H, bn))](
                        h, w2, out, wf, idf, H, inter, k, *h.stride(), *w2.stride(), *out.stride(), inter % bk == 0,
                        **opts)  # fmt: skip

            def measure(fn=fn, opts=opts, part=part):
                if part == "down":
                    best["up"][1]()  # h from the fastest up kernel
                else:
                    h.fill_(float("nan"))

                def run():
                    fn()
                    if part == "up":
                        _best_down_check(G, x, w1, w2, wf, idf, h, out, T, H, inter, k)

                if checked(row, out, ref, run):
                    row["us"] = us = gpu_ms(fn) * 1e3
                    row["frac_copy"] = frac(up_bytes if part == "up" else down_bytes, us)
                    if part not in best or us < best[part][0]:
                        best[part] = (us, fn, opts)

            attempt(
                "moe5",
                row,
                f"{name} simt {part} bn={bn} bk={bk} w={w} st={st}",
                measure,
                lambda r: f"{r['us']:.1f} us ({r['frac_copy']:.2f})",
            )
        save()
    if "up" not in best or "down" not in best:
        return

    def pair(routing):
        def run():
            if routing == "packed":
                packed()
                a, b = ww.view(-1), ii.view(-1)
            else:
                a, b = G.topk_softmax(logits, k, True)
                a, b = a.view(-1), b.view(-1)
            hh = torch.empty(numel, inter, device=DEV, dtype=DT)
            uo, do = best["up"][2], best["down"][2]
            M._simt_up[(numel, triton.cdiv(inter, uo["BLOCK_N"]))](
                x, w1, hh, b, inter, H, k, x.stride(0), x.stride(1), *w1.stride(), *hh.stride(), 0,
                H % uo["BLOCK_K"] == 0, PDL=False, **uo)  # fmt: skip
            _simt_down_v1[(T, triton.cdiv(H, do["BLOCK_N"]))](
                hh, w2, out, a, b, H, inter, k, *hh.stride(), *w2.stride(), *out.stride(), inter % do["BLOCK_K"] == 0,
                **do)  # fmt: skip

        return run

    for routing in ("topk", "packed", "topk"):
        row = {"case": name, "kernel": "simt_pair", "routing": routing, "up": best["up"][2], "down": best["down"][2]}
        fn = pair(routing)
        out.fill_(float("nan"))
        fn()
        row["rel_err"] = err = rel_err(out, ref)
        if err < 2e-2:
            row["us"] = us = gpu_ms(fn) * 1e3
            row["frac_copy"] = frac(up_bytes + down_bytes, us)
        RES["moe5"].append(row)
        log(f"  {name} simt pair ({routing}) up {best['up'][2]} down {best['down'][2]}: "
            + (f"{row['us']:.1f} us ({row['frac_copy']:.3f} of copy)" if "us" in row else str(row["rel_err"])))  # fmt: skip
    save()


def _best_down_check(G, x, w1, w2, wf, idf, h, out, T, H, inter, k):
    """out from h (just written by an up kernel under test) through the reference tensor-core down kernel."""
    M._gemv_down[(T, triton.cdiv(H, 32))](
        h, w2, out, wf, idf, H, inter, k, *h.stride(), *w2.stride(), *out.stride(), inter % 128 == 0,
        BLOCK_N=32, BLOCK_K=128, DOT_PREC="tf32", num_warps=4, num_stages=3)  # fmt: skip


# ---------------------------------------------------------------------------------------
# 6. the L2 flush


@triton.jit
def _read_sum(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    # Each program sums BLOCK elements: a plain read of x at the memory's rate.
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + tl.program_id(0), tl.sum(tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)))


_ZEROED: list = []


def flush_of(mode):
    """The L2 flush of ``mode`` for gpu_ms: "zero" (zeroing 256 MiB, as gpu_ms did before phase 6 and as
    do_bench does), "read" (gpu_ms's own: flush_l2), or "zero+read" (one then the other)."""
    if not _ZEROED:
        _ZEROED.append(torch.empty(256 << 20, dtype=torch.int8, device=DEV))

    def flush():
        if "zero" in mode:
            _ZEROED[0].zero_()
        if "read" in mode:
            flush_l2()

    return flush


def flush_cases():
    import generated.attention as GA
    import generated.moe as G

    cases = []
    dummy = torch.empty(1, device=DEV)
    cases.append(("empty kernel", lambda: _empty[(1,)](dummy), 0))
    for nbytes in (88 << 20, 134 << 20, 268 << 20, 512 << 20):
        src = torch.randn(nbytes // 2, device=DEV).to(DT)
        dst = torch.empty_like(src)
        part = torch.empty(triton.cdiv(src.numel(), 8192), device=DEV)
        cases.append((f"copy {nbytes >> 20} MiB", lambda d=dst, s=src: d.copy_(s), 2 * nbytes))
        cases.append(
            (
                f"read {nbytes >> 20} MiB",
                lambda s=src, p=part: _read_sum[(p.numel(),)](s, p, s.numel(), BLOCK=8192),
                nbytes,
            )
        )
    for shape, T in (("qwen36", 1), ("qwen36", 4), ("e128", 1)):
        E, H, inter, k = MOE_SHAPES[shape]
        x, w1, w2, logits = moe_data(shape, T)
        out = torch.empty(T, H, device=DEV, dtype=DT)
        _, ii = G.topk_softmax(logits, k, True)
        wbytes = ii.unique().numel() * 3 * H * inter * 2

        def moe(x=x, w1=w1, w2=w2, logits=logits, out=out, k=k):
            a, b = G.topk_softmax(logits, k, True)
            G.fused_moe(x, w1, w2, a, b, out=out, hw=HW)

        cases.append((f"moe {shape} T={T} current", moe, wbytes))
        if T == 1:

            def simt(x=x, w1=w1, w2=w2, logits=logits, out=out, k=k, H=H, inter=inter, T=T):
                a, b = G.topk_softmax(logits, k, True)
                a, b = a.view(-1), b.view(-1)
                hh = torch.empty(T * k, inter, device=DEV, dtype=DT)
                M._simt_up[(T * k, triton.cdiv(inter, 8))](
                    x, w1, hh, b, inter, H, k, x.stride(0), x.stride(1), *w1.stride(), *hh.stride(), 0, H % 512 == 0,
                    BLOCK_N=8, BLOCK_K=512, PDL=False, num_warps=4, num_stages=1)  # fmt: skip
                _simt_down_v1[(T, triton.cdiv(H, 4))](
                    hh, w2, out, a, b, H, inter, k, *hh.stride(), *w2.stride(), *out.stride(), inter % 512 == 0,
                    BLOCK_N=4, BLOCK_K=512, num_warps=4, num_stages=1)  # fmt: skip

            cases.append((f"moe {shape} T={T} simt", simt, wbytes))
    for D, H, Hkv, batch, context in ((128, 32, 8, 8, 8192), (256, 16, 4, 8, 8192), (128, 32, 8, 1, 32768),
                                      (256, 16, 4, 1, 32768)):  # fmt: skip
        kc, vc, table, lens, q, o, _, _ = paged_case(D, H, Hkv, batch, context)
        fn = lambda q=q, kc=kc, vc=vc, table=table, lens=lens, o=o: GA.decode_attention(  # noqa: E731
            q, kc, vc, table, lens, out=o, hw=HW
        )
        cases.append((f"decode d={D} batch={batch} ctx={context}", fn, 2 * batch * context * Hkv * D * 2))
    return cases


def flush_phase():
    cases = flush_cases()
    for r in range(2):
        for name, fn, nbytes in cases:
            row = {"case": name, "bytes": nbytes, "round": r}
            for mode in ("zero", "read", "zero+read"):
                row[mode] = gpu_ms(fn, reps=50, flush=flush_of(mode)) * 1e3
            RES["flush"].append(row)
            tb = {m: nbytes / (row[m] * 1e-6) / 1e12 for m in ("zero", "read", "zero+read")} if nbytes else {}
            log(f"{name} (round {r}): " + ", ".join(f"{m} {row[m]:.1f} us" + (f" {tb[m]:.2f} TB/s" if tb else "")
                                                     for m in ("zero", "read", "zero+read")))  # fmt: skip
        save()


# ---------------------------------------------------------------------------------------
# 8. MoE decode: the simt kernels unrolled, and chained by programmatic dependent launch


@triton.jit
def _simt_up8(x_ptr, w_ptr, h_ptr, ids_ptr, N, K, top_k, stride_xm, stride_xk, stride_we, stride_wn, stride_wk,
              stride_hm, stride_hn, EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              UNROLL: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
    # Prototype: policy_runtime.moe._simt_up (SiLU) with its K loop unrolled UNROLL times; PDL:
    # waits for the routing kernel's ids, then lets the down kernel launch.
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    r = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = (offs_n % N).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    expert = tl.load(ids_ptr + r).to(tl.int64)
    a_ptrs = x_ptr + (r // top_k).to(tl.int64) * stride_xm + offs_k * stride_xk
    g_ptrs = w_ptr + expert * stride_we + cols[:, None] * stride_wn + offs_k[None, :] * stride_wk
    u_ptrs = g_ptrs + N * stride_wn
    acc_g = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, loop_unroll_factor=UNROLL):
        if EVEN_K:
            a = tl.load(a_ptrs + k0 * stride_xk)
            g = tl.load(g_ptrs + k0 * stride_wk)
            u = tl.load(u_ptrs + k0 * stride_wk)
        else:
            k_ok = offs_k < K - k0
            a = tl.load(a_ptrs + k0 * stride_xk, mask=k_ok, other=0.0)
            g = tl.load(g_ptrs + k0 * stride_wk, mask=k_ok[None, :], other=0.0)
            u = tl.load(u_ptrs + k0 * stride_wk, mask=k_ok[None, :], other=0.0)
        a = a.to(tl.float32)[None, :]
        acc_g += g.to(tl.float32) * a
        acc_u += u.to(tl.float32) * a
    gate = tl.sum(acc_g, axis=1)
    up = tl.sum(acc_u, axis=1)
    h = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(h_ptr + r.to(tl.int64) * stride_hm + offs_n * stride_hn, h.to(h_ptr.dtype.element_ty), mask=offs_n < N)


@triton.jit
def _simt_down8(h_ptr, w_ptr, out_ptr, weights_ptr, ids_ptr, N, K, top_k, stride_hm, stride_hk, stride_we, stride_wn,
                stride_wk, stride_om, stride_on, EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                UNROLL: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
    # Prototype: policy_runtime.moe._simt_down with its loop unrolled UNROLL times, the expert ids
    # and weights (the routing's, complete before the up kernel let this one launch) read up front;
    # PDL: the first weight slab is loaded before waiting for the up kernel's rows.
    t = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = (offs_n % N).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    k_tiles = (K + BLOCK_K - 1) // BLOCK_K
    steps = top_k * k_tiles
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    expert = tl.load(ids_ptr + t * top_k).to(tl.int64)
    b_first = tl.load(w_ptr + expert * stride_we + cols[:, None] * stride_wn + offs_k[None, :] * stride_wk,
                      mask=(offs_k < K)[None, :], other=0.0)  # fmt: skip
    if PDL:
        gdc_wait()
    for it in tl.range(0, steps, loop_unroll_factor=UNROLL):
        r = t * top_k + it // k_tiles
        k0 = (it % k_tiles) * BLOCK_K
        e = tl.load(ids_ptr + r).to(tl.int64)
        weight = tl.load(weights_ptr + r).to(tl.float32)
        a_ptrs = h_ptr + r.to(tl.int64) * stride_hm + (k0 + offs_k) * stride_hk
        b_ptrs = w_ptr + e * stride_we + cols[:, None] * stride_wn + (k0 + offs_k)[None, :] * stride_wk
        k_ok = offs_k < K - k0
        if it == 0:
            b = b_first
        elif EVEN_K:
            b = tl.load(b_ptrs)
        else:
            b = tl.load(b_ptrs, mask=k_ok[None, :], other=0.0)
        a = tl.load(a_ptrs, mask=k_ok, other=0.0)
        acc += b.to(tl.float32) * (a.to(tl.float32) * weight)[None, :]
    o = tl.sum(acc, axis=1)
    tl.store(out_ptr + t.to(tl.int64) * stride_om + offs_n * stride_on, o.to(out_ptr.dtype.element_ty), mask=offs_n < N)


def moe_case8(shape, T):
    import generated.moe as G

    E, H, inter, k = MOE_SHAPES[shape]
    x, w1, w2, logits = moe_data(shape, T)
    out = torch.empty(T, H, device=DEV, dtype=DT)
    ww, ii = G.topk_softmax(logits, k, True)
    G.fused_moe(x, w1, w2, ww, ii, out=out, hw=HW)
    ref = out.float().clone()
    wbytes = ii.unique().numel() * 3 * H * inter * 2
    copy = copy_tbps(1 << 30)
    name = f"{shape} T={T}"
    numel = T * k
    h = torch.empty(numel, inter, device=DEV, dtype=DT)
    wf = torch.empty(numel, device=DEV)
    idf = torch.empty(numel, dtype=torch.int32, device=DEV)
    e_block = triton.next_power_of_2(E)

    def chain(unroll, pdl, bn_up=8, bn_down=8, bk=512):
        def run():
            _topk_trig[(T,)](logits, wf, idf, T, E, k, logits.stride(0), logits.stride(1), RENORMALIZE=True,
                             BLOCK_T=1, E_BLOCK=e_block, K_BLOCK=triton.next_power_of_2(k), TRIG=pdl,
                             num_warps=1)  # fmt: skip
            _simt_up8[(numel, triton.cdiv(inter, bn_up))](
                x, w1, h, idf, inter, H, k, x.stride(0), x.stride(1), *w1.stride(), *h.stride(), H % bk == 0,
                BLOCK_N=bn_up, BLOCK_K=bk, UNROLL=unroll, PDL=pdl, num_warps=4, num_stages=1,
                **({"launch_pdl": True} if pdl else {}))  # fmt: skip
            _simt_down8[(T, triton.cdiv(H, bn_down))](
                h, w2, out, wf, idf, H, inter, k, *h.stride(), *w2.stride(), *out.stride(), inter % bk == 0,
                BLOCK_N=bn_down, BLOCK_K=bk, UNROLL=unroll, PDL=pdl, num_warps=4, num_stages=1,
                **({"launch_pdl": True} if pdl else {}))  # fmt: skip

        return run

    def current():
        a, b = G.topk_softmax(logits, k, True)
        G.fused_moe(x, w1, w2, a, b, out=out, hw=HW)

    runs = {"current": current}
    for unroll, pdl, bn_down in itertools.product([1, 2, 4], [False, True], [8, 4]):
        runs[f"simt unroll={unroll} pdl={pdl} bn_down={bn_down}"] = chain(unroll, pdl, bn_down=bn_down)
    good = {}
    for key, fn in runs.items():
        try:
            out.fill_(float("nan"))
            fn()
            err = rel_err(out, ref)
            if err < 2e-2:
                good[key] = fn
            else:
                log(f"  {name} {key}: rel err {err}")
        except Exception as e:  # noqa: BLE001
            RES["moe8"].append({"case": name, "config": key, "error": f"{type(e).__name__}: {str(e)[:300]}"})
            log(f"  {name} {key}: {type(e).__name__}: {str(e)[:200]}")
    times = per_round(good, 3)
    for key, t in times.items():
        us = statistics.median(t) * 1e3
        frac = wbytes / (us * 1e-6) / (copy * 1e12)
        RES["moe8"].append(
            {"case": name, "config": key, "us": us, "rounds_us": [x * 1e3 for x in t], "frac_copy": frac}
        )
        log(f"  {name} {key}: {us:.1f} us ({frac:.3f} of copy)")
    save()


# ---------------------------------------------------------------------------------------
# Phase 10: both decode GEMMs in one launch.  Programs draw tiles from a ticket counter (all up
# tiles first), so a down tile only ever waits on tiles already drawn by running programs: no
# co-residency is assumed and no order of dispatch.  A down tile loads its first w2 chunk for all
# k experts, then waits (acquire) until its token's up tiles have released their rows of h.  The
# last program to finish zeroes the counters for the next launch.


@triton.jit
def _fused_dec(x_ptr, w1_ptr, w2_ptr, out_ptr, h_ptr, weights_ptr, ids_ptr, sync_ptr, T, H, I, top_k, n_up, n_total,
               stride_xm, stride_xk, s1e, s1n, s1k, s2e, s2n, s2k, stride_hm, stride_hn, stride_om, stride_on,
               BN_UP: tl.constexpr, BK_UP: tl.constexpr, BN_DOWN: tl.constexpr, BK_DOWN: tl.constexpr,
               KB: tl.constexpr, TB: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
    if PDL:
        gdc_wait()
    tile = tl.atomic_add(sync_ptr, 1)
    up_cols = tl.cdiv(I, BN_UP)
    if tile < n_up:
        r = tile // up_cols
        offs_n = (tile % up_cols) * BN_UP + tl.arange(0, BN_UP)
        cols = (offs_n % I).to(tl.int64)
        offs_k = tl.arange(0, BK_UP)
        expert = tl.load(ids_ptr + r).to(tl.int64)
        a_ptrs = x_ptr + (r // top_k).to(tl.int64) * stride_xm + offs_k * stride_xk
        g_ptrs = w1_ptr + expert * s1e + cols[:, None] * s1n + offs_k[None, :] * s1k
        u_ptrs = g_ptrs + I * s1n
        acc_g = tl.zeros((BN_UP, BK_UP), dtype=tl.float32)
        acc_u = tl.zeros((BN_UP, BK_UP), dtype=tl.float32)
        for k0 in range(0, H, BK_UP):
            k_ok = offs_k < H - k0
            a = tl.load(a_ptrs, mask=k_ok, other=0.0).to(tl.float32)[None, :]
            g = tl.load(g_ptrs, mask=k_ok[None, :], other=0.0)
            u = tl.load(u_ptrs, mask=k_ok[None, :], other=0.0)
            acc_g += g.to(tl.float32) * a
            acc_u += u.to(tl.float32) * a
            a_ptrs += BK_UP * stride_xk
            g_ptrs += BK_UP * s1k
            u_ptrs += BK_UP * s1k
        gate = tl.sum(acc_g, axis=1)
        up = tl.sum(acc_u, axis=1)
        hv = gate / (1.0 + tl.exp(-gate)) * up
        tl.store(h_ptr + r.to(tl.int64) * stride_hm + offs_n * stride_hn, hv.to(h_ptr.dtype.element_ty),
                 mask=offs_n < I)  # fmt: skip
        tl.debug_barrier()
        tl.atomic_add(sync_ptr + 2 + r // top_k, 1, sem="release")
    else:
        d = tile - n_up
        down_cols = tl.cdiv(H, BN_DOWN)
        t = d // down_cols
        d_cols = (d % down_cols) * BN_DOWN + tl.arange(0, BN_DOWN)
        d_rows = (d_cols % H).to(tl.int64)
        slot = tl.arange(0, KB)
        slot_ok = slot < top_k
        flat = t * top_k + slot
        experts = tl.load(ids_ptr + flat, mask=slot_ok, other=0).to(tl.int64)
        wts = tl.load(weights_ptr + flat, mask=slot_ok, other=0.0).to(tl.float32)
        d_k = tl.arange(0, BK_DOWN)
        v_ptrs = w2_ptr + experts[:, None, None] * s2e + d_rows[None, :, None] * s2n + d_k[None, None, :] * s2k
        h_ptrs = h_ptr + flat.to(tl.int64)[:, None] * stride_hm + d_k[None, :] * stride_hn
        v = tl.load(v_ptrs, mask=slot_ok[:, None, None] & (d_k < I)[None, None, :], other=0.0)
        need = top_k * up_cols
        done = tl.atomic_add(sync_ptr + 2 + t, 0, sem="acquire")
        while done < need:
            done = tl.atomic_add(sync_ptr + 2 + t, 0, sem="acquire")
        acc = tl.zeros((KB, BN_DOWN), dtype=tl.float32)
        for k0 in range(0, I, BK_DOWN):
            hh = tl.load(h_ptrs, mask=slot_ok[:, None] & (d_k < I - k0)[None, :], other=0.0, cache_modifier=".cg")
            v_next = tl.load(v_ptrs + BK_DOWN * s2k, other=0.0,
                             mask=slot_ok[:, None, None] & (d_k < I - k0 - BK_DOWN)[None, None, :])  # fmt: skip
            acc += tl.sum(v.to(tl.float32) * hh.to(tl.float32)[:, None, :], axis=2)
            v = v_next
            h_ptrs += BK_DOWN * stride_hn
            v_ptrs += BK_DOWN * s2k
        o = tl.sum(acc * wts[:, None], axis=0)
        tl.store(out_ptr + t.to(tl.int64) * stride_om + d_cols * stride_on, o.to(out_ptr.dtype.element_ty),
                 mask=d_cols < H)  # fmt: skip
    fin = tl.atomic_add(sync_ptr + 1, 1, sem="acq_rel")
    if fin == n_total - 1:
        tb = tl.arange(0, TB)
        tl.store(sync_ptr + tb, tl.zeros((TB,), dtype=tl.int32), mask=tb < 2 + T)


def fused_dec_launcher(x, w1, w2, out, wf, idf, sync, T, k, bn_up, bk_up, bn_down, bk_down, warps, pdl):
    """A call of _fused_dec (h allocated per call, as fused_moe does)."""
    H, inter = x.shape[1], w2.shape[2]
    n_up = T * k * triton.cdiv(inter, bn_up)
    n_total = n_up + T * triton.cdiv(H, bn_down)

    def run():
        h = torch.empty(T * k, inter, device=x.device, dtype=x.dtype)
        _fused_dec[(n_total,)](
            x, w1, w2, out, h, wf, idf, sync, T, H, inter, k, n_up, n_total, x.stride(0), x.stride(1), *w1.stride(),
            *w2.stride(), *h.stride(), *out.stride(), BN_UP=bn_up, BK_UP=bk_up, BN_DOWN=bn_down, BK_DOWN=bk_down,
            KB=triton.next_power_of_2(k), TB=triton.next_power_of_2(T + 2), PDL=pdl, num_warps=warps, num_stages=1,
            **({"launch_pdl": True} if pdl else {}))  # fmt: skip

    return run


FUSED10 = [  # (bn_up, bk_up, bn_down, bk_down, warps)
    (8, 512, 4, 512, 4),
    (8, 512, 4, 256, 4),
    (8, 256, 4, 256, 4),
    (16, 256, 4, 256, 8),
    (8, 512, 2, 512, 4),
    (8, 512, 8, 256, 8),
    (4, 512, 4, 512, 2),
    (8, 1024, 4, 512, 4),
]


def moe_setup(shape, T):
    """Phases 10-14's case: its data, the current layer's output as the reference, the routed
    buffers the prototypes' router writes (wf, idf), and the fraction of copy of a time."""
    import generated.moe as G

    E, H, inter, k = MOE_SHAPES[shape]
    x, w1, w2, logits = moe_data(shape, T)
    out = torch.empty(T, H, device=DEV, dtype=DT)
    ww, ii = G.topk_softmax(logits, k, True)
    G.fused_moe(x, w1, w2, ww, ii, out=out, hw=HW)
    used = ii.unique().numel()
    copy = copy_tbps(1 << 30)
    c = SimpleNamespace(
        G=G, E=E, H=H, inter=inter, k=k, T=T, x=x, w1=w1, w2=w2, logits=logits, out=out, ref=out.float().clone(),
        ids_ref=ii, name=f"{shape} T={T}", numel=T * k, wbytes=used * 3 * H * inter * 2,
        up_bytes=used * 2 * H * inter * 2, down_bytes=used * H * inter * 2, wf=torch.empty(T * k, device=DEV),
        idf=torch.empty(T * k, dtype=torch.int32, device=DEV), e_block=triton.next_power_of_2(E),
        kb=triton.next_power_of_2(k),
    )  # fmt: skip
    c.frac = lambda nbytes, us: nbytes / (us * 1e-6) / (copy * 1e12)
    # What the phases' launches name most, in one tuple to unpack.
    c.names = (c.x, c.w1, c.w2, c.out, c.wf, c.idf, c.H, c.inter, c.k, c.numel, c.kb)
    return c


def router(c, pdl):
    """The router into c.wf and c.idf; with ``pdl`` it lets a dependent launch start as it starts."""
    _topk_trig[(c.T,)](c.logits, c.wf, c.idf, c.T, c.E, c.k, c.logits.stride(0), c.logits.stride(1), RENORMALIZE=True,
                       BLOCK_T=1, E_BLOCK=c.e_block, K_BLOCK=c.kb, TRIG=pdl, num_warps=1)  # fmt: skip


def current_layer(c):
    """topk_softmax + fused_moe as the generated module runs them."""

    def run():
        a, b = c.G.topk_softmax(c.logits, c.k, True)
        c.G.fused_moe(c.x, c.w1, c.w2, a, b, out=c.out, hw=HW)

    return run


def checked_runs(key, c, runs, more=None):
    """The runs whose output checks twice (poisoned before each), and ``more(row, name, fn)`` where
    given; each logged and recorded under RES[key]."""
    good = {}
    for name, fn in runs.items():
        row = {"case": c.name, "config": name}

        def body(fn=fn, row=row, name=name):
            if (
                checked(row, c.out, c.ref, fn)
                and checked(row, c.out, c.ref, fn)
                and (more is None or more(row, name, fn))
            ):
                good[name] = fn
                row["ok"] = True

        attempt(key, row, f"{c.name} {name} check", body, lambda r: "ok", done="ok")
    return good


def timed_rounds(key, c, methods, rounds, suffix=""):
    """Each method's median time over interleaved rounds, recorded and logged fastest first; the
    names, fastest first."""
    times = per_round(methods, rounds)
    ranked = sorted(times, key=lambda n: statistics.median(times[n]))
    for name in ranked:
        us = statistics.median(times[name]) * 1e3
        rounds_us = [v * 1e3 for v in times[name]]
        RES[key].append(
            {
                "case": c.name,
                "config": name + suffix,
                "us": us,
                "rounds_us": rounds_us,
                "frac_copy": c.frac(c.wbytes, us),
            }
        )
        log(
            f"  {c.name} {name}{suffix}: {us:.1f} us ({c.frac(c.wbytes, us):.3f} of copy) rounds {[round(v, 1) for v in rounds_us]}"
        )
    return ranked


def graph_timed(key, c, name, fn):
    """``fn`` captured in a CUDA graph, its replay checked, then timed."""
    row = {"case": c.name, "config": name + " (graph)"}

    def body():
        graph, _ = captured(fn)
        c.out.fill_(float("nan"))
        graph.replay()
        row["rel_err"] = err = rel_err(c.out, c.ref)
        if err < 2e-2:
            row["us"] = us = gpu_ms(graph.replay) * 1e3
            row["frac_copy"] = c.frac(c.wbytes, us)

    attempt(key, row, f"{c.name} {name} (graph)", body, lambda r: f"{r['us']:.1f} us ({r['frac_copy']:.3f})")


def timed_with_graphs(key, c, runs, rounds, suffix=""):
    """timed_rounds over ``runs``, then each, fastest first, as graph replays."""
    for name in timed_rounds(key, c, runs, rounds, suffix):
        graph_timed(key, c, name, runs[name])


def leaders(key, c, good, ranked, current, rounds=5, n=4):
    """The ``n`` fastest of ``ranked`` and the current layer again, in ``rounds`` interleaved rounds,
    then each as graph replays."""
    lead = {name: good[name] for name in ranked[:n] if name != "current"}
    lead["current"] = current
    timed_with_graphs(key, c, lead, rounds, suffix=f" ({rounds} rounds)")


def moe_case10(shape, T):
    c = moe_setup(shape, T)
    sync = torch.zeros(64, dtype=torch.int32, device=DEV)
    bucket = c.G.select(T, c.inter, dtype=DT, hw=HW, device=DEV).variant
    h0 = torch.empty(c.numel, c.inter, device=DEV, dtype=DT)
    router(c, False)
    parts = {
        "empty kernel": lambda: _empty[(1,)](c.out),
        "topk alone": lambda: c.G.topk_softmax(c.logits, c.k, True),
        "up alone (current)": lambda: _launch_up(bucket, c, h0),
        "down alone (current)": lambda: _launch_down(bucket, c, h0),
        "read of the weight bytes": _reader(c.wbytes),
    }
    for name, fn in parts.items():
        row = {"case": c.name, "config": name}
        attempt("moe10", row, f"{c.name} {name}", lambda fn=fn, row=row: row.update(us=gpu_ms(fn) * 1e3),
                lambda r: f"{r['us']:.1f} us")  # fmt: skip

    runs = {"current": current_layer(c)}
    for cfg in FUSED10:
        for pdl in (False, True):
            run = fused_dec_launcher(c.x, c.w1, c.w2, c.out, c.wf, c.idf, sync, T, c.k, *cfg, pdl)

            def chain(run=run, pdl=pdl):
                router(c, pdl)
                run()

            runs[f"fused bn_up={cfg[0]} bk_up={cfg[1]} bn_down={cfg[2]} bk_down={cfg[3]} w={cfg[4]} pdl={pdl}"] = chain

    def counters_reset(row, name, fn):
        # A third call: the counters the calls before left must be zero again.
        ok = checked(row, c.out, c.ref, fn)
        assert int(sync.abs().sum()) == 0, f"counters left {sync[:8].tolist()}"
        return ok

    good = checked_runs("moe10", c, runs, counters_reset)
    timed_rounds("moe10", c, good, 3)
    save()


def _launch_up(v, c, h):
    """The bucket's (simt) up kernel alone, unchained."""
    v.up[(c.numel, triton.cdiv(c.inter, v.block_n))](
        c.x, c.w1, h, c.idf, c.inter, c.H, c.k, c.x.stride(0), c.x.stride(1), *c.w1.stride(), *h.stride(), 0,
        c.H % v.block_k == 0, PDL=False, num_warps=v.num_warps, num_stages=v.num_stages)  # fmt: skip


def _launch_down(v, c, h):
    """The bucket's (simt) down kernel alone, unchained."""
    v.down[(c.T, triton.cdiv(c.H, v.down_block_n))](
        h, c.w2, c.out, c.wf, c.idf, c.H, c.inter, c.k, *h.stride(), *c.w2.stride(), *c.out.stride(), KB=c.kb,
        PDL=False, num_warps=v.down_num_warps, num_stages=v.num_stages)  # fmt: skip


def _reader(nbytes):
    """torch.sum over nbytes of int32 into an int64: meant as the floor of one launch's read, but
    torch's int32 -> int64 sum runs far below copy bandwidth (116-455 us in phase 10), so it is not
    one; phase 6's _read_sum is."""
    src = torch.ones(nbytes // 4, dtype=torch.int32, device=DEV)
    dst = torch.empty((), dtype=torch.int64, device=DEV)
    return lambda: torch.sum(src, dim=0, out=dst)


# ---------------------------------------------------------------------------------------
# Phase 11: more loads in flight per program, and the three launches chained by programmatic
# dependent launch.  _down3d loads one K chunk of all k experts' rows at once ([KB, BN, BK]) and
# the next chunk before it multiplies; under PDL it loads its first chunk (its ids come from the
# router, finished before the up kernel released it) before it waits for the up kernel.  _up_pf
# loads each step's slab a step ahead; RED reduces over K each step (fewer registers).


@triton.jit
def _down3d(h_ptr, w_ptr, out_ptr, weights_ptr, ids_ptr, N, K, top_k, stride_hm, stride_hk, swe, swn, swk, som, son,
            BN: tl.constexpr, BK: tl.constexpr, KB: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
    t = tl.program_id(0)
    offs_n = tl.program_id(1) * BN + tl.arange(0, BN)
    rows = (offs_n % N).to(tl.int64)
    slot = tl.arange(0, KB)
    slot_ok = slot < top_k
    flat = t * top_k + slot
    experts = tl.load(ids_ptr + flat, mask=slot_ok, other=0).to(tl.int64)
    offs_k = tl.arange(0, BK)
    v_ptrs = w_ptr + experts[:, None, None] * swe + rows[None, :, None] * swn + offs_k[None, None, :] * swk
    v = tl.load(v_ptrs, mask=slot_ok[:, None, None] & (offs_k < K)[None, None, :], other=0.0)
    if PDL:
        gdc_wait()
    wts = tl.load(weights_ptr + flat, mask=slot_ok, other=0.0).to(tl.float32)
    h_ptrs = h_ptr + flat.to(tl.int64)[:, None] * stride_hm + offs_k[None, :] * stride_hk
    acc = tl.zeros((KB, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        hh = tl.load(h_ptrs, mask=slot_ok[:, None] & (offs_k < K - k0)[None, :], other=0.0)
        v_next = tl.load(v_ptrs + BK * swk, mask=slot_ok[:, None, None] & (offs_k < K - k0 - BK)[None, None, :],
                         other=0.0)  # fmt: skip
        acc += tl.sum(v.to(tl.float32) * hh.to(tl.float32)[:, None, :], axis=2)
        v = v_next
        h_ptrs += BK * stride_hk
        v_ptrs += BK * swk
    o = tl.sum(acc * wts[:, None], axis=0)
    tl.store(out_ptr + t.to(tl.int64) * som + offs_n * son, o.to(out_ptr.dtype.element_ty), mask=offs_n < N)


@triton.jit
def _up_pf(x_ptr, w_ptr, h_ptr, ids_ptr, N, K, top_k, sxm, sxk, swe, swn, swk, shm, shn, BN: tl.constexpr,
           BK: tl.constexpr, RED: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    r = tl.program_id(0)
    offs_n = tl.program_id(1) * BN + tl.arange(0, BN)
    cols = (offs_n % N).to(tl.int64)
    offs_k = tl.arange(0, BK)
    expert = tl.load(ids_ptr + r).to(tl.int64)
    a_ptrs = x_ptr + (r // top_k).to(tl.int64) * sxm + offs_k * sxk
    g_ptrs = w_ptr + expert * swe + cols[:, None] * swn + offs_k[None, :] * swk
    u_ptrs = g_ptrs + N * swn
    g = tl.load(g_ptrs, mask=(offs_k < K)[None, :], other=0.0)
    u = tl.load(u_ptrs, mask=(offs_k < K)[None, :], other=0.0)
    if RED:
        acc_g = tl.zeros((BN,), dtype=tl.float32)
        acc_u = tl.zeros((BN,), dtype=tl.float32)
    else:
        acc_g = tl.zeros((BN, BK), dtype=tl.float32)
        acc_u = tl.zeros((BN, BK), dtype=tl.float32)
    for k0 in range(0, K, BK):
        a = tl.load(a_ptrs, mask=offs_k < K - k0, other=0.0).to(tl.float32)[None, :]
        nxt = (offs_k < K - k0 - BK)[None, :]
        g_next = tl.load(g_ptrs + BK * swk, mask=nxt, other=0.0)
        u_next = tl.load(u_ptrs + BK * swk, mask=nxt, other=0.0)
        if RED:
            acc_g += tl.sum(g.to(tl.float32) * a, axis=1)
            acc_u += tl.sum(u.to(tl.float32) * a, axis=1)
        else:
            acc_g += g.to(tl.float32) * a
            acc_u += u.to(tl.float32) * a
        g = g_next
        u = u_next
        a_ptrs += BK * sxk
        g_ptrs += BK * swk
        u_ptrs += BK * swk
    if RED:
        gate = acc_g
        up = acc_u
    else:
        gate = tl.sum(acc_g, axis=1)
        up = tl.sum(acc_u, axis=1)
    hv = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(h_ptr + r.to(tl.int64) * shm + offs_n * shn, hv.to(h_ptr.dtype.element_ty), mask=offs_n < N)


@triton.jit
def _simt_down_pdl(h_ptr, w_ptr, out_ptr, weights_ptr, ids_ptr, N, K, top_k, shm, shk, swe, swn, swk, som, son,
                   EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    gdc_wait()
    _simt_down_v1(h_ptr, w_ptr, out_ptr, weights_ptr, ids_ptr, N, K, top_k, shm, shk, swe, swn, swk, som, son, EVEN_K,
                  BLOCK_N, BLOCK_K)  # fmt: skip


# The h200 decode record phases 5-10 ended with, which phase 11 starts from ("cur"): simt 8 x 512 slabs
# on 4 warps for both GEMMs, the down kernel one expert a step (_simt_down_v1).
CUR11 = dict(BLOCK_N=8, BLOCK_K=512, num_warps=4, num_stages=1)


def moe_case11(shape, T):
    c = moe_setup(shape, T)
    x, w1, w2, out, wf, idf, H, inter, k, numel, kb = c.names
    pdl_opt = lambda pdl: {"launch_pdl": True} if pdl else {}  # noqa: E731
    router(c, False)

    def up_cur(hh, pdl):
        M._simt_up[(numel, triton.cdiv(inter, 8))](
            x, w1, hh, idf, inter, H, k, x.stride(0), x.stride(1), *w1.stride(), *hh.stride(), ACT=0,
            EVEN_K=H % 512 == 0, PDL=pdl, **CUR11, **pdl_opt(pdl))  # fmt: skip

    def down_cur(hh, pdl):
        (_simt_down_pdl if pdl else _simt_down_v1)[(c.T, triton.cdiv(H, 8))](
            hh, w2, out, wf, idf, H, inter, k, *hh.stride(), *w2.stride(), *out.stride(), EVEN_K=inter % 512 == 0,
            **CUR11, **pdl_opt(pdl))  # fmt: skip

    h = torch.empty(numel, inter, device=DEV, dtype=DT)
    up_cur(h, False)
    h_ref = h.clone()

    def up_pf(hh, pdl, bn, bk, w, red):
        _up_pf[(numel, triton.cdiv(inter, bn))](
            x, w1, hh, idf, inter, H, k, x.stride(0), x.stride(1), *w1.stride(), *hh.stride(), BN=bn, BK=bk, RED=red,
            PDL=pdl, num_warps=w, num_stages=1, **pdl_opt(pdl))  # fmt: skip

    def down3d(hh, pdl, bn, bk, w):
        _down3d[(c.T, triton.cdiv(H, bn))](
            hh, w2, out, wf, idf, H, inter, k, *hh.stride(), *w2.stride(), *out.stride(), BN=bn, BK=bk, KB=kb, PDL=pdl,
            num_warps=w, num_stages=1, **pdl_opt(pdl))  # fmt: skip

    # Each kernel alone (no PDL), checked: up kernels against the current up's h, down kernels by out.
    best = {}
    alone = {"up cur": ("up", lambda: up_cur(h, False)), "down cur": ("down", lambda: down_cur(h_ref, False))}
    for bn, bk, w, red in itertools.product([4, 8, 16], [256, 512], [4, 8], [False, True]):
        alone[f"up_pf bn={bn} bk={bk} w={w} red={red}"] = ("up", lambda a=(bn, bk, w, red): up_pf(h, False, *a))
    for bn, bk, w in itertools.product([2, 4, 8], [128, 256, 512], [4, 8]):
        alone[f"down3d bn={bn} bk={bk} w={w}"] = ("down", lambda a=(bn, bk, w): down3d(h_ref, False, *a))
    for key, (part, fn) in alone.items():
        row = {"case": c.name, "config": key, "part": part}

        def body(fn=fn, row=row, part=part, key=key):
            if part == "up":
                h.fill_(float("nan"))
                fn()
                row["rel_err"] = err = rel_err(h, h_ref)
                if err >= 2e-2:
                    return
            elif not checked(row, out, c.ref, fn):
                return
            row["us"] = us = gpu_ms(fn) * 1e3
            row["frac_copy"] = c.frac(c.up_bytes if part == "up" else c.down_bytes, us)
            if key.split()[0] not in ("up", "down") and (part not in best or us < best[part][0]):
                best[part] = (us, key)

        attempt("moe11", row, f"{c.name} {key}", body, lambda r: f"{r['us']:.1f} us ({r['frac_copy']:.2f})")
    save()

    def cfg_of(key):
        vals = dict(kv.split("=") for kv in key.split()[1:])
        out_ = [int(vals["bn"]), int(vals["bk"]), int(vals["w"])]
        return out_ + ([vals["red"] == "True"] if "red" in vals else [])

    bu = cfg_of(best["up"][1]) if "up" in best else None
    bd = cfg_of(best["down"][1]) if "down" in best else None

    def chain(pdl, up_new, down_new):
        def run():
            hh = torch.empty(numel, inter, device=DEV, dtype=DT)
            router(c, pdl)
            up_pf(hh, pdl, *bu) if up_new else up_cur(hh, pdl)
            down3d(hh, pdl, *bd) if down_new else down_cur(hh, pdl)

        return run

    runs = {"current": current_layer(c), "cur kernels pdl": chain(True, False, False)}
    if bd:
        runs[f"cur up + down3d {bd}"] = chain(False, False, True)
        runs[f"cur up + down3d {bd} pdl"] = chain(True, False, True)
    if bu and bd:
        runs[f"up_pf {bu} + down3d {bd}"] = chain(False, True, True)
        runs[f"up_pf {bu} + down3d {bd} pdl"] = chain(True, True, True)
    good = checked_runs("moe11", c, runs)
    timed_rounds("moe11", c, good, 5)
    # The same chains as CUDA graph replays (PDL edges captured), timed once each.
    for name, fn in good.items():
        graph_timed("moe11", c, name, fn)
    save()


# ---------------------------------------------------------------------------------------
# Phase 12: the up kernel warms the L2 with the down kernel's weights.  Each up program knows its
# expert; it issues L2 prefetches (no registers, nothing waits on them) for its share of that
# expert's w2 rows, so that the down kernel's weights stream from memory while the up GEMM does
# and the down kernel reads them from the L2.  PF: 1 at the program's start, 2 at its end; EVICT:
# w1's loads marked evict_first and the prefetches evict_last (w1 is read once; w2's lines must
# outlive the rest of w1's stream).


@triton.jit
def _prefetch_l2(ptrs, LAST: tl.constexpr):
    if LAST:
        tl.inline_asm_elementwise("mov.b32 $0, 0;\n\tprefetch.global.L2::evict_last [$1];", "=r,l", [ptrs],
                                  dtype=tl.int32, is_pure=False, pack=1)  # fmt: skip
    else:
        tl.inline_asm_elementwise("mov.b32 $0, 0;\n\tprefetch.global.L2 [$1];", "=r,l", [ptrs], dtype=tl.int32,
                                  is_pure=False, pack=1)  # fmt: skip


@triton.jit
def _up_l2(x_ptr, w_ptr, h_ptr, ids_ptr, w2_ptr, N, K, top_k, sxm, sxk, swe, swn, swk, shm, shn, s2e, s2n,
           BN: tl.constexpr, BK: tl.constexpr, PF: tl.constexpr, EVICT: tl.constexpr, PDL: tl.constexpr,
           LINE: tl.constexpr, PF_BLOCK: tl.constexpr):  # fmt: skip
    # As M._simt_up (EVEN_K), plus: this program's share of w2[expert] (the rows
    # [nb * rpp, (nb + 1) * rpp) of its K=N columns, w2 being [E, K_up=H... ] below) prefetched to L2.
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    r = tl.program_id(0)
    nb = tl.program_id(1)
    offs_n = nb * BN + tl.arange(0, BN)
    cols = (offs_n % N).to(tl.int64)
    offs_k = tl.arange(0, BK)
    expert = tl.load(ids_ptr + r).to(tl.int64)
    if PF == 1:
        _w2_share(w2_ptr, expert, nb, tl.num_programs(1), K, N, s2e, s2n, EVICT, LINE, PF_BLOCK)
    a_ptrs = x_ptr + (r // top_k).to(tl.int64) * sxm + offs_k * sxk
    g_ptrs = w_ptr + expert * swe + cols[:, None] * swn + offs_k[None, :] * swk
    u_ptrs = g_ptrs + N * swn
    acc_g = tl.zeros((BN, BK), dtype=tl.float32)
    acc_u = tl.zeros((BN, BK), dtype=tl.float32)
    for k0 in range(0, K, BK):
        a = tl.load(a_ptrs)
        if EVICT:
            g = tl.load(g_ptrs, eviction_policy="evict_first")
            u = tl.load(u_ptrs, eviction_policy="evict_first")
        else:
            g = tl.load(g_ptrs)
            u = tl.load(u_ptrs)
        a = a.to(tl.float32)[None, :]
        acc_g += g.to(tl.float32) * a
        acc_u += u.to(tl.float32) * a
        a_ptrs += BK * sxk
        g_ptrs += BK * swk
        u_ptrs += BK * swk
    if PF == 2:
        _w2_share(w2_ptr, expert, nb, tl.num_programs(1), K, N, s2e, s2n, EVICT, LINE, PF_BLOCK)
    gate = tl.sum(acc_g, axis=1)
    up = tl.sum(acc_u, axis=1)
    hv = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(h_ptr + r.to(tl.int64) * shm + offs_n * shn, hv.to(h_ptr.dtype.element_ty), mask=offs_n < N)


@triton.jit
def _w2_share(w2_ptr, expert, nb, nprog, H, I, s2e, s2n, EVICT: tl.constexpr, LINE: tl.constexpr,
              PF_BLOCK: tl.constexpr):  # fmt: skip
    # w2[expert] is [H, I] with unit column stride; LINE elements make one 128-byte line.  Program nb
    # of nprog takes rows [nb * rpp, min(H, (nb + 1) * rpp)), every line of each.
    rpp = tl.cdiv(H, nprog)
    lpr = tl.cdiv(I, LINE)
    row0 = nb * rpp
    n_lines = tl.minimum(rpp, H - row0) * lpr
    base = w2_ptr + expert * s2e
    for l0 in range(0, n_lines, PF_BLOCK):
        li = l0 + tl.arange(0, PF_BLOCK)
        li = tl.minimum(li, n_lines - 1)
        ptrs = base + (row0 + li // lpr).to(tl.int64) * s2n + (li % lpr) * LINE
        _prefetch_l2(ptrs, EVICT)


def moe_case12(shape, T):
    c = moe_setup(shape, T)
    x, w1, w2, out, wf, idf, H, inter, k, numel, kb = c.names

    def chain(bn_up, bk_up, w_up, pf, evict, down, pdl=True):
        def run():
            hh = torch.empty(numel, inter, device=DEV, dtype=DT)
            router(c, pdl)
            _up_l2[(numel, triton.cdiv(inter, bn_up))](
                x, w1, hh, idf, w2, inter, H, k, x.stride(0), x.stride(1), *w1.stride(), *hh.stride(), w2.stride(0),
                w2.stride(1), BN=bn_up, BK=bk_up, PF=pf, EVICT=evict, PDL=pdl, LINE=64, PF_BLOCK=256, num_warps=w_up,
                num_stages=1, **({"launch_pdl": True} if pdl else {}))  # fmt: skip
            bn, bk, w = down
            _down3d[(T, triton.cdiv(H, bn))](
                hh, w2, out, wf, idf, H, inter, k, *hh.stride(), *w2.stride(), *out.stride(), BN=bn, BK=bk, KB=kb,
                PDL=pdl, num_warps=w, num_stages=1, **({"launch_pdl": True} if pdl else {}))  # fmt: skip

        return run

    runs = {"current": current_layer(c)}
    for (bn_up, bk_up, w_up), pf, evict, down in itertools.product(
        [(8, 512, 4), (8, 256, 4)], [0, 1, 2], [False, True], [(4, 128, 4), (4, 256, 8), (8, 128, 4)]
    ):
        if pf == 0 and evict:
            continue
        runs[f"up {bn_up}x{bk_up} w{w_up} pf={pf} evict={evict} down3d {down}"] = chain(
            bn_up, bk_up, w_up, pf, evict, down
        )
    good = checked_runs("moe12", c, runs)
    ranked = timed_rounds("moe12", c, good, 3)
    # The leaders again, 5 rounds against current, and as graph replays.
    leaders("moe12", c, good, ranked, runs["current"])
    save()


# ---------------------------------------------------------------------------------------
# Phase 13: _down3d two chunks ahead (DEPTH 2: chunks 0 and 1 loaded before the PDL wait, then
# chunk i + 2 and h's chunk i + 1 issued before chunk i is multiplied), against one ahead.


@triton.jit
def _down3d2(h_ptr, w_ptr, out_ptr, weights_ptr, ids_ptr, N, K, top_k, stride_hm, stride_hk, swe, swn, swk, som, son,
             BN: tl.constexpr, BK: tl.constexpr, KB: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
    t = tl.program_id(0)
    offs_n = tl.program_id(1) * BN + tl.arange(0, BN)
    rows = (offs_n % N).to(tl.int64)
    slot = tl.arange(0, KB)
    slot_ok = slot < top_k
    flat = t * top_k + slot
    experts = tl.load(ids_ptr + flat, mask=slot_ok, other=0).to(tl.int64)
    offs_k = tl.arange(0, BK)
    v_ptrs = w_ptr + experts[:, None, None] * swe + rows[None, :, None] * swn + offs_k[None, None, :] * swk
    ok3 = slot_ok[:, None, None]
    v0 = tl.load(v_ptrs, mask=ok3 & (offs_k < K)[None, None, :], other=0.0)
    v1 = tl.load(v_ptrs + BK * swk, mask=ok3 & (offs_k < K - BK)[None, None, :], other=0.0)
    if PDL:
        gdc_wait()
    wts = tl.load(weights_ptr + flat, mask=slot_ok, other=0.0).to(tl.float32)
    h_ptrs = h_ptr + flat.to(tl.int64)[:, None] * stride_hm + offs_k[None, :] * stride_hk
    hh = tl.load(h_ptrs, mask=slot_ok[:, None] & (offs_k < K)[None, :], other=0.0)
    acc = tl.zeros((KB, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        v2 = tl.load(v_ptrs + 2 * BK * swk, mask=ok3 & (offs_k < K - k0 - 2 * BK)[None, None, :], other=0.0)
        h_next = tl.load(h_ptrs + BK * stride_hk, mask=slot_ok[:, None] & (offs_k < K - k0 - BK)[None, :], other=0.0)
        acc += tl.sum(v0.to(tl.float32) * hh.to(tl.float32)[:, None, :], axis=2)
        v0 = v1
        v1 = v2
        hh = h_next
        h_ptrs += BK * stride_hk
        v_ptrs += BK * swk
    o = tl.sum(acc * wts[:, None], axis=0)
    tl.store(out_ptr + t.to(tl.int64) * som + offs_n * son, o.to(out_ptr.dtype.element_ty), mask=offs_n < N)


def moe_case13(shape, T):
    c = moe_setup(shape, T)
    x, w1, w2, out, wf, idf, H, inter, k, numel, kb = c.names

    def chain(up, down, depth):
        kind, bn_up, bk_up, w_up = up
        bn, bk, w = down

        def run():
            hh = torch.empty(numel, inter, device=DEV, dtype=DT)
            router(c, True)
            grid = (numel, triton.cdiv(inter, bn_up))
            if kind == "simt":
                M._simt_up[grid](
                    x, w1, hh, idf, inter, H, k, x.stride(0), x.stride(1), *w1.stride(), *hh.stride(), ACT=0,
                    EVEN_K=H % bk_up == 0, BLOCK_N=bn_up, BLOCK_K=bk_up, PDL=True, num_warps=w_up, num_stages=1,
                    launch_pdl=True)  # fmt: skip
            else:
                _up_pf[grid](
                    x, w1, hh, idf, inter, H, k, x.stride(0), x.stride(1), *w1.stride(), *hh.stride(), BN=bn_up,
                    BK=bk_up, RED=False, PDL=True, num_warps=w_up, num_stages=1, launch_pdl=True)  # fmt: skip
            body = _down3d2 if depth == 2 else _down3d
            body[(T, triton.cdiv(H, bn))](
                hh, w2, out, wf, idf, H, inter, k, *hh.stride(), *w2.stride(), *out.stride(), BN=bn, BK=bk, KB=kb,
                PDL=True, num_warps=w, num_stages=1, launch_pdl=True)  # fmt: skip

        return run

    runs = {"current": current_layer(c)}
    ups = [("simt", 8, 512, 4), ("pf", 8, 256, 4), ("simt", 8, 256, 4)]
    downs = [(4, 128, 4), (4, 256, 8), (2, 128, 2), (2, 256, 4), (4, 64, 2), (8, 128, 8), (2, 128, 4)]
    for up, down, depth in itertools.product(ups, downs, [1, 2]):
        runs[f"up {up} down3d {down} depth {depth}"] = chain(up, down, depth)
    good = checked_runs("moe13", c, runs)
    ranked = timed_rounds("moe13", c, good, 3)
    leaders("moe13", c, good, ranked, runs["current"])
    save()


# ---------------------------------------------------------------------------------------
# Phase 14: routing inside the GEMM launches (vLLM's older fused_moe(gating_output=...) form):
# every up program computes its token's softmax top-k from the logits (L2-resident after the first
# program) and takes its slot's expert; the programs of column block 0 write the routed ids and
# weights.  The down kernel computes the same top-k before its PDL wait and loads its first w2 chunk
# with it.  Two launches for the layer, no router kernel.


@triton.jit
def _topk_row(logits_ptr, t, E, k, stride_lt, stride_le, RENORMALIZE: tl.constexpr, E_BLOCK: tl.constexpr,
              K_BLOCK: tl.constexpr, ONE_PASS: tl.constexpr, ROWS: tl.constexpr):  # fmt: skip
    # ONE_PASS (phase 21): topk_softmax's one-pass top-k on ROWS identical copies of the row (one a
    # warp at ROWS = num_warps, so that its merges stay within a warp), the copies' results then
    # equal; else (phase 14) k rounds of argmax.
    if ONE_PASS:
        rr = tl.arange(0, ROWS)
        ex2 = tl.arange(0, E_BLOCK)
        in_e2 = ex2 < E
        xr = tl.load(logits_ptr + t.to(tl.int64) * stride_lt + ex2[None, :] * stride_le + 0 * rr[:, None],
                     mask=in_e2[None, :], other=float("-inf")).to(tl.float32)  # fmt: skip
        pr = tl.exp(xr - tl.max(xr, axis=1)[:, None])
        pr = pr / tl.sum(pr, axis=1)[:, None]
        pr = tl.where(in_e2[None, :], pr, -2.0)
        keys = (pr.to(tl.int32, bitcast=True).to(tl.int64) << 32) | (E_BLOCK - 1 - ex2)[None, :].to(tl.int64)
        top = tl.max(tl.topk(keys, K_BLOCK, dim=1), axis=0)
        kk2 = tl.arange(0, K_BLOCK)
        vals2 = (top >> 32).to(tl.int32).to(tl.float32, bitcast=True)
        if RENORMALIZE:
            vals2 = vals2 / tl.sum(tl.where(kk2 < k, vals2, 0.0), axis=0)
        return vals2, (E_BLOCK - 1 - (top & 0xFFFFFFFF)).to(tl.int32)
    ex = tl.arange(0, E_BLOCK)
    in_e = ex < E
    x = tl.load(logits_ptr + t.to(tl.int64) * stride_lt + ex * stride_le, mask=in_e, other=float("-inf"),
                cache_modifier=".cg").to(tl.float32)  # fmt: skip
    p = tl.exp(x - tl.max(x, axis=0))
    p = p / tl.sum(p, axis=0)
    p = tl.where(in_e, p, -2.0)
    kk = tl.arange(0, K_BLOCK)
    vals = tl.zeros((K_BLOCK,), dtype=tl.float32)
    idx = tl.zeros((K_BLOCK,), dtype=tl.int32)
    for j in range(0, k):
        best, at = tl.max(p, axis=0, return_indices=True, return_indices_tie_break_left=True)
        vals = tl.where(kk == j, best, vals)
        idx = tl.where(kk == j, at, idx)
        p = tl.where(ex == at, -1.0, p)
    if RENORMALIZE:
        vals = vals / tl.sum(vals, axis=0)
    return vals, idx


@triton.jit
def _up_routed(x_ptr, w_ptr, h_ptr, logits_ptr, weights_ptr, ids_ptr, E, N, K, top_k, stride_lt, stride_le, sxm, sxk,
               swe, swn, swk, shm, shn, RENORMALIZE: tl.constexpr, E_BLOCK: tl.constexpr, K_BLOCK: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr, ONE_PASS: tl.constexpr,
               ROWS: tl.constexpr):  # fmt: skip
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    r = tl.program_id(0)
    t = r // top_k
    j = r % top_k
    vals, idx = _topk_row(logits_ptr, t, E, top_k, stride_lt, stride_le, RENORMALIZE, E_BLOCK, K_BLOCK, ONE_PASS, ROWS)
    kk = tl.arange(0, K_BLOCK)
    expert = tl.sum(tl.where(kk == j, idx, 0), axis=0).to(tl.int64)
    if tl.program_id(1) == 0:
        tl.store(ids_ptr + r, expert.to(tl.int32))
        tl.store(weights_ptr + r, tl.sum(tl.where(kk == j, vals, 0.0), axis=0))
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = (offs_n % N).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = x_ptr + t.to(tl.int64) * sxm + offs_k * sxk
    g_ptrs = w_ptr + expert * swe + cols[:, None] * swn + offs_k[None, :] * swk
    u_ptrs = g_ptrs + N * swn
    acc_g = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs).to(tl.float32)[None, :]
        g = tl.load(g_ptrs)
        u = tl.load(u_ptrs)
        acc_g += g.to(tl.float32) * a
        acc_u += u.to(tl.float32) * a
        a_ptrs += BLOCK_K * sxk
        g_ptrs += BLOCK_K * swk
        u_ptrs += BLOCK_K * swk
    gate = tl.sum(acc_g, axis=1)
    up = tl.sum(acc_u, axis=1)
    hv = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(h_ptr + r.to(tl.int64) * shm + offs_n * shn, hv.to(h_ptr.dtype.element_ty), mask=offs_n < N)


@triton.jit
def _down_routed(h_ptr, w_ptr, out_ptr, logits_ptr, E, N, K, top_k, stride_lt, stride_le, stride_hm, stride_hk, swe,
                 swn, swk, som, son, RENORMALIZE: tl.constexpr, E_BLOCK: tl.constexpr, BN: tl.constexpr,
                 BK: tl.constexpr, KB: tl.constexpr, PDL: tl.constexpr, ONE_PASS: tl.constexpr,
                 ROWS: tl.constexpr):  # fmt: skip
    t = tl.program_id(0)
    wts, experts = _topk_row(logits_ptr, t, E, top_k, stride_lt, stride_le, RENORMALIZE, E_BLOCK, KB, ONE_PASS, ROWS)
    experts = experts.to(tl.int64)
    offs_n = tl.program_id(1) * BN + tl.arange(0, BN)
    rows = (offs_n % N).to(tl.int64)
    slot = tl.arange(0, KB)
    slot_ok = slot < top_k
    flat = t * top_k + slot
    offs_k = tl.arange(0, BK)
    v_ptrs = w_ptr + experts[:, None, None] * swe + rows[None, :, None] * swn + offs_k[None, None, :] * swk
    v = tl.load(v_ptrs, mask=slot_ok[:, None, None] & (offs_k < K)[None, None, :], other=0.0)
    if PDL:
        gdc_wait()
    h_ptrs = h_ptr + flat.to(tl.int64)[:, None] * stride_hm + offs_k[None, :] * stride_hk
    acc = tl.zeros((KB, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        hh = tl.load(h_ptrs, mask=slot_ok[:, None] & (offs_k < K - k0)[None, :], other=0.0)
        v_next = tl.load(v_ptrs + BK * swk, mask=slot_ok[:, None, None] & (offs_k < K - k0 - BK)[None, None, :],
                         other=0.0)  # fmt: skip
        acc += tl.sum(v.to(tl.float32) * hh.to(tl.float32)[:, None, :], axis=2)
        v = v_next
        h_ptrs += BK * stride_hk
        v_ptrs += BK * swk
    o = tl.sum(acc * tl.where(slot_ok, wts, 0.0)[:, None], axis=0)
    tl.store(out_ptr + t.to(tl.int64) * som + offs_n * son, o.to(out_ptr.dtype.element_ty), mask=offs_n < N)


def routed_layer(c, bn_up, bk_up, w_up, down, one_pass=False, rows=False):
    """Phases 14 and 21: the layer in two launches, each computing the routing from the logits."""
    x, w1, w2, out, wf, idf, H, inter, k, numel, kb = c.names
    logits, E, e_block, T = c.logits, c.E, c.e_block, c.T
    bn, bk, w = down

    def run():
        hh = torch.empty(numel, inter, device=DEV, dtype=DT)
        _up_routed[(numel, triton.cdiv(inter, bn_up))](
            x, w1, hh, logits, wf, idf, E, inter, H, k, logits.stride(0), logits.stride(1), x.stride(0),
            x.stride(1), *w1.stride(), *hh.stride(), RENORMALIZE=True, E_BLOCK=e_block, K_BLOCK=kb, BLOCK_N=bn_up,
            BLOCK_K=bk_up, PDL=True, ONE_PASS=one_pass, ROWS=w_up if rows else 1, num_warps=w_up, num_stages=1,
            launch_pdl=True)  # fmt: skip
        _down_routed[(T, triton.cdiv(H, bn))](
            hh, w2, out, logits, E, H, inter, k, logits.stride(0), logits.stride(1), *hh.stride(), *w2.stride(),
            *out.stride(), RENORMALIZE=True, E_BLOCK=e_block, BN=bn, BK=bk, KB=kb, PDL=True, ONE_PASS=one_pass,
            ROWS=w if rows else 1, num_warps=w, num_stages=1, launch_pdl=True)  # fmt: skip

    return run


def moe_case14(shape, T):
    c = moe_setup(shape, T)
    x, w1, w2, out, wf, idf, H, inter, k, numel, kb = c.names

    def chained(bn_up, bk_up, w_up, down):
        bn, bk, w = down

        def run():
            hh = torch.empty(numel, inter, device=DEV, dtype=DT)
            router(c, True)
            M._simt_up[(numel, triton.cdiv(inter, bn_up))](
                x, w1, hh, idf, inter, H, k, x.stride(0), x.stride(1), *w1.stride(), *hh.stride(), ACT=0,
                EVEN_K=H % bk_up == 0, BLOCK_N=bn_up, BLOCK_K=bk_up, PDL=True, num_warps=w_up, num_stages=1,
                launch_pdl=True)  # fmt: skip
            _down3d[(T, triton.cdiv(H, bn))](
                hh, w2, out, wf, idf, H, inter, k, *hh.stride(), *w2.stride(), *out.stride(), BN=bn, BK=bk, KB=kb,
                PDL=True, num_warps=w, num_stages=1, launch_pdl=True)  # fmt: skip

        return run

    runs = {"current": current_layer(c)}
    for up in [(8, 512, 4), (8, 256, 4)]:
        for down in [(4, 128, 4), (4, 256, 8)]:
            runs[f"chained up {up} down {down}"] = chained(*up, down)
            runs[f"routed up {up} down {down}"] = routed_layer(c, *up, down)

    def same_ids(row, name, fn):
        # The routed kernels' ids against topk_softmax's.
        row["ids_same"] = bool(torch.equal(idf.view(T, k), c.ids_ref)) if name.startswith("routed") else None
        return True

    idf.fill_(-1)
    good = checked_runs("moe14", c, runs, same_ids)
    timed_with_graphs("moe14", c, good, 5)
    save()


# ---------------------------------------------------------------------------------------
# Phase 15: the chained layer's kernels (policy_runtime.moe's simt bodies, h200's decode record) with
# their registers capped (Triton's maxnreg), so that more programs are resident at once: the up
# kernel at 8 x 512 takes 133 registers (3 programs a SM: 396 slots for 512-768 programs), the down
# kernel at 4 x 128 takes 79 (6 a SM: 792 slots for 896 programs at qwen36's T = 1).


def moe_case15(shape, T):
    c = moe_setup(shape, T)
    x, w1, w2, out, wf, idf, H, inter, k, numel, kb = c.names
    regs = {}

    def chain(up_cap, down_cap):
        up_opt = {"maxnreg": up_cap} if up_cap else {}
        down_opt = {"maxnreg": down_cap} if down_cap else {}

        def run():
            hh = torch.empty(numel, inter, device=DEV, dtype=DT)
            router(c, True)
            ku = M._simt_up[(numel, triton.cdiv(inter, 8))](
                x, w1, hh, idf, inter, H, k, x.stride(0), x.stride(1), *w1.stride(), *hh.stride(), ACT=0,
                EVEN_K=H % 512 == 0, BLOCK_N=8, BLOCK_K=512, PDL=True, num_warps=4, num_stages=1, launch_pdl=True,
                **up_opt)  # fmt: skip
            kd = M._simt_down[(T, triton.cdiv(H, 4))](
                hh, w2, out, wf, idf, H, inter, k, *hh.stride(), *w2.stride(), *out.stride(), BLOCK_N=4, BLOCK_K=128,
                KB=kb, PDL=True, num_warps=4, num_stages=1, launch_pdl=True, **down_opt)  # fmt: skip
            for name, kern in (("up", ku), ("down", kd)):
                if kern is not None and hasattr(kern, "n_regs"):
                    regs[f"{name} cap {up_cap if name == 'up' else down_cap}"] = (kern.n_regs, kern.n_spills)

        return run

    runs = {"current": current_layer(c)}
    for up_cap, down_cap in itertools.product([None, 128], [None, 72, 64]):
        runs[f"up maxnreg {up_cap} down maxnreg {down_cap}"] = chain(up_cap, down_cap)
    good = checked_runs("moe15", c, runs)
    log(f"  {c.name} registers, spills: {regs}")
    RES["moe15"].append({"case": c.name, "registers_spills": {key: list(v) for key, v in regs.items()}})
    timed_with_graphs("moe15", c, good, 5)
    save()


# Phase 16: where the chained layer's time goes, from the GPU's global timer (each program's start,
# its end and its SM), and both GEMMs in one launch with no grid-wide dependency between them.
# _sk16: one routed row r = t * k + j and BN intermediate columns a program: the up GEMM for those
# columns (as _simt_up), then at once the down GEMM's share of them, w2[e][:, cols] (H x BN, a BH-row
# chunk at a time, the next loaded before this one is used; with PRE the first chunk is loaded
# before the up GEMM), scaled by the routing weight and added (fp32, relaxed atomics) into an fp32
# accumulator.  The last program to take a ticket converts the accumulator into the output and
# zeroes it and the ticket for the next call, so one launch follows the router and nothing waits
# on a grid but the router.  Run 2026-12-01 (bench/results/h200_explore_decode16.*): the configs that
# passed their check took 1.3-2.4x the chained layer's time (39.6 against 30.3 us at best, e128; 51.1
# against 30.0, qwen36; its programs did not fit one wave), and 5 of 9 configs at T = 1 failed theirs
# (relative error 0.14-0.19): not investigated, the structure being the slower one.


@triton.jit
def _stamp(tr_ptr, slot, t0):
    # This program's [start, end, SM] at tr_ptr[3 * slot] (phase 16: the start held to the end).
    tl.store(tr_ptr + 3 * slot, t0)
    tl.store(tr_ptr + 3 * slot + 1, globaltimer())
    tl.store(tr_ptr + 3 * slot + 2, smid().to(tl.int64))


@triton.jit
def _stamp_start(tr_ptr, slot, ON: tl.constexpr):
    # Phase 17: the start stored at once, so that no register holds it through the kernel.
    if ON:
        tl.store(tr_ptr + 3 * slot, globaltimer())


@triton.jit
def _stamp_end(tr_ptr, slot, ON: tl.constexpr):
    if ON:
        tl.store(tr_ptr + 3 * slot + 1, globaltimer())
        tl.store(tr_ptr + 3 * slot + 2, smid().to(tl.int64))


@triton.jit
def _tl_router(logits_ptr, weights_ptr, ids_ptr, tr_ptr, T, E, k, stride_lt, stride_le, E_BLOCK: tl.constexpr,
               K_BLOCK: tl.constexpr):  # fmt: skip
    t0 = globaltimer()
    M._topk_softmax_kernel(logits_ptr, weights_ptr, ids_ptr, T, E, k, stride_lt, stride_le, True, 1, E_BLOCK,
                           K_BLOCK, True)  # fmt: skip
    _stamp(tr_ptr, tl.program_id(0), t0)


@triton.jit
def _tl_up(x_ptr, w_ptr, h_ptr, ids_ptr, tr_ptr, N, K, top_k, sxm, sxk, swe, swn, swk, shm, shn, BN: tl.constexpr,
           BK: tl.constexpr):  # fmt: skip
    t0 = globaltimer()
    M._simt_up(x_ptr, w_ptr, h_ptr, ids_ptr, N, K, top_k, sxm, sxk, swe, swn, swk, shm, shn, 0, True, BN, BK, True)
    _stamp(tr_ptr, tl.program_id(0) * tl.num_programs(1) + tl.program_id(1), t0)


@triton.jit
def _tl_down(h_ptr, w_ptr, out_ptr, weights_ptr, ids_ptr, tr_ptr, N, K, top_k, shm, shk, swe, swn, swk, som, son,
             BN: tl.constexpr, BK: tl.constexpr, KB: tl.constexpr):  # fmt: skip
    t0 = globaltimer()
    M._simt_down(h_ptr, w_ptr, out_ptr, weights_ptr, ids_ptr, N, K, top_k, shm, shk, swe, swn, swk, som, son, BN, BK,
                 KB, True)  # fmt: skip
    _stamp(tr_ptr, tl.program_id(0) * tl.num_programs(1) + tl.program_id(1), t0)


@triton.jit
def _sk16(x_ptr, w1_ptr, w2_ptr, acc_ptr, out_ptr, weights_ptr, ids_ptr, cnt_ptr, tr_ptr, T, H, I, top_k, n_prog,
          sxm, sxk, s1e, s1n, s1k, s2e, s2n, s2k, som, son, BN: tl.constexpr, BK: tl.constexpr, BH: tl.constexpr,
          EB: tl.constexpr, PRE: tl.constexpr, PDL: tl.constexpr, TRACE: tl.constexpr):  # fmt: skip
    t0 = globaltimer()
    if PDL:
        gdc_wait()
    r = tl.program_id(0)
    offs_n = tl.program_id(1) * BN + tl.arange(0, BN)
    n_ok = offs_n < I
    cols = (offs_n % I).to(tl.int64)
    offs_k = tl.arange(0, BK)
    expert = tl.load(ids_ptr + r).to(tl.int64)
    t = r // top_k
    a_ptrs = x_ptr + t.to(tl.int64) * sxm + offs_k * sxk
    g_ptrs = w1_ptr + expert * s1e + cols[:, None] * s1n + offs_k[None, :] * s1k
    u_ptrs = g_ptrs + I * s1n
    offs_h = tl.arange(0, BH)
    d_ptrs = w2_ptr + expert * s2e + offs_h[:, None] * s2n + cols[None, :] * s2k
    if PRE:
        v = tl.load(d_ptrs, mask=(offs_h < H)[:, None], other=0.0)
    acc_g = tl.zeros((BN, BK), dtype=tl.float32)
    acc_u = tl.zeros((BN, BK), dtype=tl.float32)
    for k0 in range(0, H, BK):
        k_ok = offs_k < H - k0
        a = tl.load(a_ptrs, mask=k_ok, other=0.0).to(tl.float32)[None, :]
        g = tl.load(g_ptrs, mask=k_ok[None, :], other=0.0)
        u = tl.load(u_ptrs, mask=k_ok[None, :], other=0.0)
        acc_g += g.to(tl.float32) * a
        acc_u += u.to(tl.float32) * a
        a_ptrs += BK * sxk
        g_ptrs += BK * s1k
        u_ptrs += BK * s1k
    gate = tl.sum(acc_g, axis=1)
    up = tl.sum(acc_u, axis=1)
    hv = (gate / (1.0 + tl.exp(-gate)) * up).to(x_ptr.dtype.element_ty).to(tl.float32)
    hv = tl.where(n_ok, hv, 0.0) * tl.load(weights_ptr + r).to(tl.float32)
    if not PRE:
        v = tl.load(d_ptrs, mask=(offs_h < H)[:, None], other=0.0)
    o_ptrs = acc_ptr + t.to(tl.int64) * H + offs_h
    for h0 in range(0, H, BH):
        v_next = tl.load(d_ptrs + BH * s2n, mask=(offs_h < H - h0 - BH)[:, None], other=0.0)
        part = tl.sum(v.to(tl.float32) * hv[None, :], axis=1)
        tl.atomic_add(o_ptrs, part, mask=offs_h < H - h0, sem="relaxed")
        v = v_next
        d_ptrs += BH * s2n
        o_ptrs += BH
    # Every thread's adds ordered before the ticket (the CUDA threadFenceReduction pattern).
    tl.inline_asm_elementwise("fence.acq_rel.gpu;\n\tmov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
    tl.debug_barrier()
    ticket = tl.atomic_add(cnt_ptr, 1, sem="acq_rel")
    if ticket == n_prog - 1:
        offs_e = tl.arange(0, EB)
        for tt in range(0, T):
            for e0 in range(0, H, EB):
                m = offs_e < H - e0
                p = acc_ptr + tt * H + e0 + offs_e
                val = tl.load(p, mask=m, other=0.0, cache_modifier=".cg")
                tl.store(out_ptr + tt * som + (e0 + offs_e) * son, val.to(out_ptr.dtype.element_ty), mask=m)
                tl.store(p, tl.zeros((EB,), dtype=tl.float32), mask=m)
        tl.store(cnt_ptr, 0)
    if TRACE:
        _stamp(tr_ptr, tl.program_id(0) * tl.num_programs(1) + tl.program_id(1), t0)


SK16 = [  # (BN, BK, BH, warps, PRE)
    (16, 256, 256, 4, True),
    (16, 512, 256, 8, True),
    (16, 256, 256, 4, False),
    (16, 256, 128, 4, True),
    (16, 512, 128, 4, True),
    (8, 512, 256, 4, True),
    (8, 256, 512, 4, True),
    (32, 256, 128, 8, True),
    (32, 128, 128, 4, True),
]


def sk_layer(c, bn, bk, bh, warps, pre, acc, cnt, tr=None):
    """The router, then _sk16 (a programmatic dependent launch)."""
    x, w1, w2, out, wf, idf, H, inter, k, numel, kb = c.names
    grid = (numel, triton.cdiv(inter, bn))
    n_prog = grid[0] * grid[1]

    def run():
        router(c, True)
        _sk16[grid](
            x, w1, w2, acc, out, wf, idf, cnt, acc if tr is None else tr, c.T, H, inter, k, n_prog, x.stride(0),
            x.stride(1), *w1.stride(), *w2.stride(), *out.stride(), BN=bn, BK=bk, BH=bh, EB=1024, PRE=pre, PDL=True,
            TRACE=tr is not None, num_warps=warps, num_stages=1, launch_pdl=True)  # fmt: skip

    return run


def chained_traced(c, v, tr_r, tr_u, tr_d):
    """The chained layer (the bucket's simt record) with every program stamping its start and end."""
    x, w1, w2, out, wf, idf, H, inter, k, numel, kb = c.names

    def run():
        hh = torch.empty(numel, inter, device=DEV, dtype=DT)
        _tl_router[(c.T,)](c.logits, wf, idf, tr_r, c.T, c.E, k, c.logits.stride(0), c.logits.stride(1),
                           E_BLOCK=c.e_block, K_BLOCK=kb, num_warps=1)  # fmt: skip
        _tl_up[(numel, triton.cdiv(inter, v.block_n))](
            x, w1, hh, idf, tr_u, inter, H, k, x.stride(0), x.stride(1), *w1.stride(), *hh.stride(), BN=v.block_n,
            BK=v.block_k, num_warps=v.num_warps, num_stages=1, launch_pdl=True)  # fmt: skip
        _tl_down[(c.T, triton.cdiv(H, v.down_block_n))](
            hh, w2, out, wf, idf, tr_d, H, inter, k, *hh.stride(), *w2.stride(), *out.stride(), BN=v.down_block_n,
            BK=v.down_block_k, KB=kb, num_warps=v.down_num_warps, num_stages=1, launch_pdl=True)  # fmt: skip

    return run


def _spread(vals):
    """min, 10th percentile, median, 90th percentile and max of vals (us)."""
    q = sorted(vals)
    n = len(q)
    return [q[0], q[n // 10], q[n // 2], q[(9 * n) // 10], q[-1]]


def timeline(c, name, fn, parts, reps=20):
    """``fn`` run ``reps`` times after a flush; per part (name -> [n, 3] int64 stamps), the median over
    runs of each program's start and end spread (us after the router's start), and of the layer's
    span; recorded and logged."""
    runs = []
    for _ in range(reps):
        for tr in parts.values():
            tr.zero_()
        flush_l2()
        torch.cuda._sleep(SLEEP_CYCLES)
        fn()
        torch.cuda.synchronize()
        stamps = {p: tr.view(-1, 3).cpu() for p, tr in parts.items()}
        base = min(int(s[:, 0].min()) for s in stamps.values())
        one = {}
        for p, s in stamps.items():
            one[p + " start"] = _spread([(int(v) - base) / 1e3 for v in s[:, 0]])
            one[p + " end"] = _spread([(int(v) - base) / 1e3 for v in s[:, 1]])
            one[p + " SMs"] = [int(s[:, 2].unique().numel())] * 5
        runs.append(one)
    med = {key: [statistics.median(r[key][i] for r in runs) for i in range(5)] for key in runs[0]}
    RES["timeline"].append({"case": c.name, "config": name, "reps": reps, "us_min_p10_med_p90_max": med})
    log(f"  {c.name} timeline {name} (us from the first program's start: min p10 median p90 max, median of {reps}):")
    for key, v in med.items():
        log(f"    {key:>14}: " + " ".join(f"{x:6.2f}" for x in v))


def traced(name, c, fn, parts, key="moe16"):
    """timeline() as one attempt: its error, if any, recorded."""
    row = {"case": c.name, "config": "timeline " + name}

    def body():
        fn()  # compiled before the timed runs
        timeline(c, name, fn, parts)
        row["timeline"] = "ok"

    attempt(key, row, f"{c.name} timeline {name}", body, lambda r: "ok", done="timeline")


def moe_case16(shape, T):
    c = moe_setup(shape, T)
    x, w1, w2, out, wf, idf, H, inter, k, numel, kb = c.names
    acc = torch.zeros(T, H, device=DEV, dtype=torch.float32)
    cnt = torch.zeros(1, device=DEV, dtype=torch.int32)
    runs = {"current": current_layer(c)}
    for cfg in SK16:
        runs["sk BN={} BK={} BH={} w={} pre={}".format(*cfg)] = sk_layer(c, *cfg, acc, cnt)

    def left_clean(row, name, fn):
        ok = checked(row, c.out, c.ref, fn)
        torch.cuda.synchronize()
        if name != "current":
            row["left"] = [float(acc.abs().sum()), int(cnt.item())]
            ok = ok and row["left"] == [0.0, 0]
        return ok

    good = checked_runs("moe16", c, runs, left_clean)
    ranked = timed_rounds("moe16", c, good, 5)
    leaders("moe16", c, good, ranked, runs["current"], rounds=5, n=4)
    # Timelines: the chained layer (h200's record, and e128's tiles), the fastest split layer.
    bucket = c.G.select(T, c.inter, dtype=DT, hw=HW, device=DEV).variant
    n_up = numel * triton.cdiv(inter, bucket.block_n)
    tr = {
        "router": torch.zeros(T * 3, dtype=torch.int64, device=DEV),
        "up": torch.zeros(n_up * 3, dtype=torch.int64, device=DEV),
        "down": torch.zeros(T * triton.cdiv(H, bucket.down_block_n) * 3, dtype=torch.int64, device=DEV),
    }
    traced("chained " + bucket.name, c, chained_traced(c, bucket, tr["router"], tr["up"], tr["down"]), tr)
    e128v = SimpleNamespace(block_n=8, block_k=256, num_warps=4, down_block_n=4, down_block_k=256, down_num_warps=8)
    tr2 = dict(tr, up=torch.zeros(numel * triton.cdiv(inter, 8) * 3, dtype=torch.int64, device=DEV),
               down=torch.zeros(T * triton.cdiv(H, 4) * 3, dtype=torch.int64, device=DEV))  # fmt: skip
    traced(
        "chained up 8x256 w4, down 4x256 w8", c, chained_traced(c, e128v, tr2["router"], tr2["up"], tr2["down"]), tr2
    )
    best = [n for n in ranked if n.startswith("sk ")][:1]
    for name in best:
        cfg = next(cf for cf in SK16 if "sk BN={} BK={} BH={} w={} pre={}".format(*cf) == name)
        n_sk = numel * triton.cdiv(inter, cfg[0])
        trs = {"router": tr["router"], "split": torch.zeros(n_sk * 3, dtype=torch.int64, device=DEV)}

        def split_fn(cfg=cfg, trs=trs):
            x_, w1_, w2_, out_, wf_, idf_, H_, inter_, k_, numel_, kb_ = c.names
            grid = (numel_, triton.cdiv(inter_, cfg[0]))
            _tl_router[(c.T,)](c.logits, wf_, idf_, trs["router"], c.T, c.E, k_, c.logits.stride(0),
                               c.logits.stride(1), E_BLOCK=c.e_block, K_BLOCK=kb_, num_warps=1)  # fmt: skip
            _sk16[grid](
                x_, w1_, w2_, acc, out_, wf_, idf_, cnt, trs["split"], c.T, H_, inter_, k_, grid[0] * grid[1],
                x_.stride(0), x_.stride(1), *w1_.stride(), *w2_.stride(), *out_.stride(), BN=cfg[0], BK=cfg[1],
                BH=cfg[2], EB=1024, PRE=cfg[4], PDL=True, TRACE=True, num_warps=cfg[3], num_stages=1,
                launch_pdl=True)  # fmt: skip

        traced(name, c, split_fn, trs)
    save()


# Phase 17: phase 16's timeline again with each start stored at once (phase 16 held it in a
# register to the end, which may cost the up kernel a resident program per SM), over pairs of up
# and down tiles of the production bodies, with each compiled kernel's registers; and each pair
# timed untraced (the same wrappers, stamps compiled out) in interleaved rounds.


@triton.jit
def _t17_router(logits_ptr, weights_ptr, ids_ptr, tr_ptr, T, E, k, stride_lt, stride_le, E_BLOCK: tl.constexpr,
                K_BLOCK: tl.constexpr, ON: tl.constexpr):  # fmt: skip
    _stamp_start(tr_ptr, tl.program_id(0), ON)
    M._topk_softmax_kernel(logits_ptr, weights_ptr, ids_ptr, T, E, k, stride_lt, stride_le, True, 1, E_BLOCK,
                           K_BLOCK, True)  # fmt: skip
    _stamp_end(tr_ptr, tl.program_id(0), ON)


@triton.jit
def _t17_up(x_ptr, w_ptr, h_ptr, ids_ptr, tr_ptr, N, K, top_k, sxm, sxk, swe, swn, swk, shm, shn, BN: tl.constexpr,
            BK: tl.constexpr, ON: tl.constexpr):  # fmt: skip
    slot = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
    _stamp_start(tr_ptr, slot, ON)
    M._simt_up(x_ptr, w_ptr, h_ptr, ids_ptr, N, K, top_k, sxm, sxk, swe, swn, swk, shm, shn, 0, True, BN, BK, True)
    _stamp_end(tr_ptr, slot, ON)


@triton.jit
def _t17_down(h_ptr, w_ptr, out_ptr, weights_ptr, ids_ptr, tr_ptr, N, K, top_k, shm, shk, swe, swn, swk, som, son,
              BN: tl.constexpr, BK: tl.constexpr, KB: tl.constexpr, ON: tl.constexpr):  # fmt: skip
    slot = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
    _stamp_start(tr_ptr, slot, ON)
    M._simt_down(h_ptr, w_ptr, out_ptr, weights_ptr, ids_ptr, N, K, top_k, shm, shk, swe, swn, swk, som, son, BN, BK,
                 KB, True)  # fmt: skip
    _stamp_end(tr_ptr, slot, ON)


UP17 = [(8, 512, 4), (8, 256, 4), (16, 256, 8), (16, 512, 8)]
DOWN17 = [(4, 128, 4), (4, 256, 8), (8, 128, 8), (2, 128, 2), (2, 256, 4)]


def moe_case17(shape, T):
    c = moe_setup(shape, T)
    x, w1, w2, out, wf, idf, H, inter, k, numel, kb = c.names
    regs = {}

    def pair(up, down, parts=None):
        (bn_u, bk_u, w_u), (bn_d, bk_d, w_d) = up, down
        on = parts is not None
        tr = parts or {"router": idf, "up": idf, "down": idf}  # never written when off

        def run():
            hh = torch.empty(numel, inter, device=DEV, dtype=DT)
            kr = _t17_router[(T,)](c.logits, wf, idf, tr["router"], T, c.E, k, c.logits.stride(0), c.logits.stride(1),
                                   E_BLOCK=c.e_block, K_BLOCK=kb, ON=on, num_warps=1)  # fmt: skip
            ku = _t17_up[(numel, triton.cdiv(inter, bn_u))](
                x, w1, hh, idf, tr["up"], inter, H, k, x.stride(0), x.stride(1), *w1.stride(), *hh.stride(), BN=bn_u,
                BK=bk_u, ON=on, num_warps=w_u, num_stages=1, launch_pdl=True)  # fmt: skip
            kd = _t17_down[(T, triton.cdiv(H, bn_d))](
                hh, w2, out, wf, idf, tr["down"], H, inter, k, *hh.stride(), *w2.stride(), *out.stride(), BN=bn_d,
                BK=bk_d, KB=kb, ON=on, num_warps=w_d, num_stages=1, launch_pdl=True)  # fmt: skip
            for name, kern in (("router", kr), (f"up {up}", ku), (f"down {down}", kd)):
                if kern is not None and hasattr(kern, "n_regs"):
                    regs[f"{name} {'traced' if on else 'plain'}"] = [kern.n_regs, kern.n_spills]

        return run

    runs = {"current": current_layer(c)}
    for up in UP17:
        for down in DOWN17:
            runs[f"up {up} down {down}"] = pair(up, down)
    good = checked_runs("moe17", c, runs)
    ranked = timed_rounds("moe17", c, good, 5)
    leaders("moe17", c, good, ranked, runs["current"], rounds=5, n=5)
    for up in UP17:
        for down in DOWN17:
            name = f"up {up} down {down}"
            if name not in good:
                continue
            parts = {
                "router": torch.zeros(T * 3, dtype=torch.int64, device=DEV),
                "up": torch.zeros(numel * triton.cdiv(inter, up[0]) * 3, dtype=torch.int64, device=DEV),
                "down": torch.zeros(T * triton.cdiv(H, down[0]) * 3, dtype=torch.int64, device=DEV),
            }
            traced(name, c, pair(up, down, parts), parts, key="moe17")
    log(f"  {c.name} registers, spills: {regs}")
    RES["moe17"].append({"case": c.name, "registers_spills": regs})
    save()


# Phase 18: the down kernel's start after phase 17's timelines.  Its programs become resident as up
# programs end (the up GEMM's last ~2 us, while fewer up programs are left to use the bandwidth)
# and wait there; PRE2 loads the first two w2 chunks before the wait instead of one (the loop then
# loads chunk i + 2 after it uses chunk i, so no more than two chunks are held, as now); HA loads
# the rows of h one chunk ahead, so that no step waits on an L2 round trip for h.


@triton.jit
def _down18(h_ptr, w_ptr, out_ptr, weights_ptr, ids_ptr, tr_ptr, N, K, top_k, shm, shk, swe, swn, swk, som, son,
            BN: tl.constexpr, BK: tl.constexpr, KB: tl.constexpr, PRE2: tl.constexpr, HA: tl.constexpr,
            ON: tl.constexpr):  # fmt: skip
    t = tl.program_id(0)
    stamp = t * tl.num_programs(1) + tl.program_id(1)
    _stamp_start(tr_ptr, stamp, ON)
    offs_n = tl.program_id(1) * BN + tl.arange(0, BN)
    rows = (offs_n % N).to(tl.int64)
    slot = tl.arange(0, KB)
    slot_ok = slot < top_k
    flat = t * top_k + slot
    experts = tl.load(ids_ptr + flat, mask=slot_ok, other=0, cache_modifier=".cg").to(tl.int64)
    offs_k = tl.arange(0, BK)
    w_ptrs = w_ptr + experts[:, None, None] * swe + rows[None, :, None] * swn + offs_k[None, None, :] * swk
    w_ok = slot_ok[:, None, None]
    b = tl.load(w_ptrs, mask=w_ok & (offs_k < K)[None, None, :], other=0.0)
    if PRE2:
        b1 = tl.load(w_ptrs + BK * swk, mask=w_ok & (offs_k < K - BK)[None, None, :], other=0.0)
    gdc_wait()
    weight = tl.load(weights_ptr + flat, mask=slot_ok, other=0.0).to(tl.float32)
    a_ptrs = h_ptr + flat.to(tl.int64)[:, None] * shm + offs_k[None, :] * shk
    acc = tl.zeros((KB, BN), dtype=tl.float32)
    if HA:
        a = tl.load(a_ptrs, mask=slot_ok[:, None] & (offs_k < K)[None, :], other=0.0)
    for k0 in range(0, K, BK):
        if HA:
            a_cur = a
            a = tl.load(a_ptrs + BK * shk, mask=slot_ok[:, None] & (offs_k < K - k0 - BK)[None, :], other=0.0)
        else:
            a_cur = tl.load(a_ptrs, mask=slot_ok[:, None] & (offs_k < K - k0)[None, :], other=0.0)
        if PRE2:
            acc += tl.sum(b.to(tl.float32) * a_cur.to(tl.float32)[:, None, :], axis=2)
            b = b1
            b1 = tl.load(w_ptrs + 2 * BK * swk, mask=w_ok & (offs_k < K - k0 - 2 * BK)[None, None, :], other=0.0)
        else:
            b_next = tl.load(w_ptrs + BK * swk, mask=w_ok & (offs_k < K - k0 - BK)[None, None, :], other=0.0)
            acc += tl.sum(b.to(tl.float32) * a_cur.to(tl.float32)[:, None, :], axis=2)
            b = b_next
        a_ptrs += BK * shk
        w_ptrs += BK * swk
    o = tl.sum(acc * weight[:, None], axis=0)
    tl.store(out_ptr + t.to(tl.int64) * som + offs_n * son, o.to(out_ptr.dtype.element_ty), mask=offs_n < N)
    _stamp_end(tr_ptr, stamp, ON)


UP18 = [(8, 512, 4), (8, 256, 4)]
DOWN18 = [(4, 128, 4), (4, 256, 8), (2, 128, 2), (2, 256, 4)]


def moe_case18(shape, T):
    c = moe_setup(shape, T)
    x, w1, w2, out, wf, idf, H, inter, k, numel, kb = c.names
    regs = {}

    def pair(up, down, pre2, ha, parts=None):
        (bn_u, bk_u, w_u), (bn_d, bk_d, w_d) = up, down
        on = parts is not None
        tr = parts or {"router": idf, "up": idf, "down": idf}  # never written when off

        def run():
            hh = torch.empty(numel, inter, device=DEV, dtype=DT)
            _t17_router[(T,)](c.logits, wf, idf, tr["router"], T, c.E, k, c.logits.stride(0), c.logits.stride(1),
                              E_BLOCK=c.e_block, K_BLOCK=kb, ON=on, num_warps=1)  # fmt: skip
            _t17_up[(numel, triton.cdiv(inter, bn_u))](
                x, w1, hh, idf, tr["up"], inter, H, k, x.stride(0), x.stride(1), *w1.stride(), *hh.stride(), BN=bn_u,
                BK=bk_u, ON=on, num_warps=w_u, num_stages=1, launch_pdl=True)  # fmt: skip
            kd = _down18[(T, triton.cdiv(H, bn_d))](
                hh, w2, out, wf, idf, tr["down"], H, inter, k, *hh.stride(), *w2.stride(), *out.stride(), BN=bn_d,
                BK=bk_d, KB=kb, PRE2=pre2, HA=ha, ON=on, num_warps=w_d, num_stages=1, launch_pdl=True)  # fmt: skip
            if kd is not None and hasattr(kd, "n_regs"):
                regs[f"down {down} pre2={pre2} ha={ha} {'traced' if on else 'plain'}"] = [kd.n_regs, kd.n_spills]

        return run

    runs = {"current": current_layer(c)}
    combos = [(up, down, pre2, ha) for up in UP18 for down in DOWN18 for pre2 in (False, True) for ha in (False, True)]
    for up, down, pre2, ha in combos:
        runs[f"up {up} down {down} pre2={pre2} ha={ha}"] = pair(up, down, pre2, ha)
    good = checked_runs("moe18", c, runs)
    ranked = timed_rounds("moe18", c, good, 5)
    leaders("moe18", c, good, ranked, runs["current"], rounds=7, n=6)
    for name in [n for n in ranked if n != "current"][:4]:
        up, down, pre2, ha = next(cb for cb in combos if f"up {cb[0]} down {cb[1]} pre2={cb[2]} ha={cb[3]}" == name)
        parts = {
            "router": torch.zeros(T * 3, dtype=torch.int64, device=DEV),
            "up": torch.zeros(numel * triton.cdiv(inter, up[0]) * 3, dtype=torch.int64, device=DEV),
            "down": torch.zeros(T * triton.cdiv(H, down[0]) * 3, dtype=torch.int64, device=DEV),
        }
        traced(name, c, pair(up, down, pre2, ha, parts), parts, key="moe18")
    log(f"  {c.name} registers, spills: {regs}")
    RES["moe18"].append({"case": c.name, "registers_spills": regs})
    save()


def simt_layer(c, v, route):
    """The chained simt layer on bucket variant ``v``'s tiles with ``route()`` as its router
    (it writes c.wf and c.idf and lets the up kernel start)."""
    x, w1, w2, out, wf, idf, H, inter, k, numel, kb = c.names

    def run():
        hh = torch.empty(numel, inter, device=DEV, dtype=DT)
        route()
        M._simt_up[(numel, triton.cdiv(inter, v.block_n))](
            x, w1, hh, idf, inter, H, k, x.stride(0), x.stride(1), *w1.stride(), *hh.stride(), ACT=0,
            EVEN_K=H % v.block_k == 0, BLOCK_N=v.block_n, BLOCK_K=v.block_k, PDL=True, num_warps=v.num_warps,
            num_stages=1, launch_pdl=True)  # fmt: skip
        M._simt_down[(c.T, triton.cdiv(H, v.down_block_n))](
            hh, w2, out, wf, idf, H, inter, k, *hh.stride(), *w2.stride(), *out.stride(), BLOCK_N=v.down_block_n,
            BLOCK_K=v.down_block_k, KB=kb, PDL=True, num_warps=v.down_num_warps, num_stages=1,
            launch_pdl=True)  # fmt: skip

    return run


# Phase 19: the time outside the layer's span.  Phase 17 put the chained layer's last program's end
# 26.0 us after the router's first instruction (qwen36) and the events 30.2 us apart: ~4 us of
# launching and event overhead for three launches, where one empty kernel costs 3.0 us.  Here:
# chains of one and three empty kernels, plain and as programmatic dependent launches; the layer
# with the router itself a programmatic dependent launch (waiting on the device before it reads);
# and the router's own time split at the arrival of its (cold) logits.  (In the run of 2026-12-01 the
# split read 0.06 us: its load did not depend on the first stamp, so the compiler issued it before;
# the load now takes an offset computed from that stamp, t0 >> 63, zero for any time the
# global timer reads.)


@triton.jit
def _e19(x_ptr, WAIT: tl.constexpr, TRIG: tl.constexpr):
    if WAIT:
        gdc_wait()
    if TRIG:
        gdc_launch_dependents()


@triton.jit
def _r19(logits_ptr, weights_ptr, ids_ptr, T, E, k, stride_lt, stride_le, E_BLOCK: tl.constexpr,
         K_BLOCK: tl.constexpr):  # fmt: skip
    gdc_wait()
    M._topk_softmax_kernel(logits_ptr, weights_ptr, ids_ptr, T, E, k, stride_lt, stride_le, True, 1, E_BLOCK,
                           K_BLOCK, True)  # fmt: skip


@triton.jit
def _r19_split(logits_ptr, tr_ptr, E, E_BLOCK: tl.constexpr):
    # start, the logits' arrival (a stamp that depends on their max), the softmax's end.
    t0 = globaltimer()
    tl.store(tr_ptr, t0)
    ex = tl.arange(0, E_BLOCK)
    x = tl.load(logits_ptr + ex + (t0 >> 63).to(tl.int32), mask=ex < E, other=float("-inf")).to(tl.float32)
    m = tl.max(x, axis=0)
    tl.store(tr_ptr + 1, tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,f", [m], dtype=tl.int64,
                                                   is_pure=False, pack=1))  # fmt: skip
    p = tl.exp(x - m)
    s = tl.sum(p, axis=0)
    tl.store(tr_ptr + 2, tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,f", [s], dtype=tl.int64,
                                                   is_pure=False, pack=1))  # fmt: skip


def moe_case19(shape, T):
    c = moe_setup(shape, T)
    x, w1, w2, out, wf, idf, H, inter, k, numel, kb = c.names
    dummy = torch.empty(1, device=DEV)
    pdl = {"launch_pdl": True}
    chains = {
        "1 empty": lambda: _e19[(1,)](dummy, WAIT=False, TRIG=False),
        "3 empty, plain": lambda: [_e19[(1,)](dummy, WAIT=False, TRIG=False) for _ in range(3)],
        "3 empty, 2nd and 3rd PDL": lambda: (
            _e19[(1,)](dummy, WAIT=False, TRIG=True),
            _e19[(1,)](dummy, WAIT=True, TRIG=True, **pdl),
            _e19[(1,)](dummy, WAIT=True, TRIG=False, **pdl),
        ),
        "3 empty, all PDL": lambda: (
            _e19[(1,)](dummy, WAIT=True, TRIG=True, **pdl),
            _e19[(1,)](dummy, WAIT=True, TRIG=True, **pdl),
            _e19[(1,)](dummy, WAIT=True, TRIG=False, **pdl),
        ),
    }
    for name, fn in chains.items():
        row = {"case": c.name, "config": name}
        attempt("moe19", row, f"{c.name} {name}", lambda fn=fn, row=row: row.update(us=gpu_ms(fn) * 1e3),
                lambda r: f"{r['us']:.2f} us")  # fmt: skip
        graph_row = {"case": c.name, "config": name + " (graph)"}

        def in_graph(fn=fn, row=graph_row):
            graph, _ = captured(fn)
            row["us"] = gpu_ms(graph.replay) * 1e3

        attempt("moe19", graph_row, f"{c.name} {name} (graph)", in_graph, lambda r: f"{r['us']:.2f} us")

    v = c.G.select(T, c.inter, dtype=DT, hw=HW, device=DEV).variant

    def router_pdl():
        _r19[(T,)](c.logits, wf, idf, T, c.E, k, c.logits.stride(0), c.logits.stride(1), E_BLOCK=c.e_block,
                   K_BLOCK=kb, num_warps=1, launch_pdl=True)  # fmt: skip

    def layer(pdl):
        return simt_layer(c, v, router_pdl if pdl else lambda: router(c, True))

    runs = {"current": current_layer(c), "layer": layer(False), "layer, router PDL": layer(True)}
    good = checked_runs("moe19", c, runs)
    timed_with_graphs("moe19", c, good, 7)
    tr = torch.zeros(3, dtype=torch.int64, device=DEV)
    spans = []
    for _ in range(20):
        flush_l2()
        torch.cuda._sleep(SLEEP_CYCLES)
        _r19_split[(1,)](c.logits, tr, c.E, E_BLOCK=c.e_block, num_warps=1)
        torch.cuda.synchronize()
        t = tr.tolist()
        spans.append(((t[1] - t[0]) / 1e3, (t[2] - t[1]) / 1e3))
    load_us = statistics.median(a for a, _ in spans)
    softmax_us = statistics.median(b for _, b in spans)
    RES["moe19"].append({"case": c.name, "config": "router split", "logits_arrival_us": load_us,
                         "softmax_us": softmax_us})  # fmt: skip
    log(f"  {c.name} router: cold logits arrive {load_us:.2f} us after its start; softmax {softmax_us:.2f} us more")
    save()


# Phase 20: the router's top-k in one pass (since adopted: topk_softmax's body; router() above runs
# it, so phases 10-19 rerun with it).  _topk_rounds is the body before: k rounds, each a row-wide
# argmax (five shuffle levels in a row at one warp) and a removal.  The one-pass body packs each
# probability and its expert into one int64 key (the probability's bits above, E_BLOCK - 1 - expert
# below: larger probability first, the lower expert among equals, as the rounds pick) and keeps the
# K_BLOCK largest keys with Triton's bitonic top-k (tl.topk): a sort within each thread, then merges
# across lanes, each moving K_BLOCK keys at once.


@triton.jit
def _topk_rounds(logits_ptr, weights_ptr, ids_ptr, T, E, k, stride_lt, stride_le, RENORMALIZE: tl.constexpr,
                 BLOCK_T: tl.constexpr, E_BLOCK: tl.constexpr, K_BLOCK: tl.constexpr, TRIGGER: tl.constexpr):  # fmt: skip
    if TRIGGER:
        gdc_launch_dependents()
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    ex = tl.arange(0, E_BLOCK)
    in_t = rows < T
    in_e = ex < E
    x = tl.load(
        logits_ptr + rows.to(tl.int64)[:, None] * stride_lt + ex[None, :] * stride_le,
        mask=in_t[:, None] & in_e[None, :],
        other=0.0,
    ).to(tl.float32)
    x = tl.where(in_e[None, :], x, float("-inf"))
    p = tl.exp(x - tl.max(x, axis=1)[:, None])
    p = p / tl.sum(p, axis=1)[:, None]
    p = tl.where(in_e[None, :], p, -2.0)
    kk = tl.arange(0, K_BLOCK)
    vals = tl.zeros((BLOCK_T, K_BLOCK), dtype=tl.float32)
    idx = tl.zeros((BLOCK_T, K_BLOCK), dtype=tl.int32)
    for j in range(0, k):
        best, at = tl.max(p, axis=1, return_indices=True, return_indices_tie_break_left=True)
        vals = tl.where(kk[None, :] == j, best[:, None], vals)
        idx = tl.where(kk[None, :] == j, at[:, None], idx)
        p = tl.where(ex[None, :] == at[:, None], -1.0, p)
    if RENORMALIZE:
        vals = vals / tl.sum(vals, axis=1)[:, None]
    offs = rows.to(tl.int64)[:, None] * k + kk[None, :]
    mask = in_t[:, None] & (kk < k)[None, :]
    tl.store(weights_ptr + offs, vals, mask=mask)
    tl.store(ids_ptr + offs, idx, mask=mask)


def moe_case20(shape, T):
    c = moe_setup(shape, T)
    x, w1, w2, out, wf, idf, H, inter, k, numel, kb = c.names
    v = c.G.select(T, c.inter, dtype=DT, hw=HW, device=DEV).variant

    def rounds(logits, trig):
        _topk_rounds[(T,)](logits, wf, idf, T, c.E, k, logits.stride(0), logits.stride(1), RENORMALIZE=True,
                           BLOCK_T=1, E_BLOCK=c.e_block, K_BLOCK=kb, TRIGGER=trig, num_warps=1)  # fmt: skip

    def route(new, trig):
        if new:
            router(c, trig)
        else:
            rounds(c.logits, trig)

    # The one-pass body's ids and weights equal the rounds' bit for bit, on these logits and on ties.
    row = {"case": c.name, "config": "router check"}

    def same():
        for name, logits in (("", c.logits), ("ties_", c.logits.clone())):
            if name:
                logits[:, 1::2] = logits[:, 0::2]  # every probability twice
            new_w, new_i = c.G.topk_softmax(logits, k, True)
            rounds(logits, False)
            torch.cuda.synchronize()
            row[name + "ids_equal"] = bool(torch.equal(idf.view(T, k), new_i))
            row[name + "weights_equal"] = bool(torch.equal(wf.view(T, k), new_w))
        row["ok"] = all(row[q] for q in row if q.endswith("_equal"))

    attempt(
        "moe20", row, f"{c.name} router check", same, lambda r: str({q: r[q] for q in r if "equal" in q}), done="ok"
    )

    def layer(new):
        return simt_layer(c, v, lambda: route(new, True))

    alone = {"router, rounds": lambda: route(False, False), "router, one-pass top-k": lambda: route(True, False)}
    timed_rounds("moe20", c, alone, 7)
    runs = {"current": current_layer(c), "layer, rounds": layer(False), "layer, one-pass top-k": layer(True)}
    good = checked_runs("moe20", c, runs)
    timed_with_graphs("moe20", c, good, 9)
    save()


# Phase 21: phase 14's routing inside the two GEMM launches (no router kernel), with phase 20's
# one-pass top-k: on one copy of the row spread over all warps (ROWS 1), or on one copy a warp
# (ROWS = num_warps) so that its merges stay within a warp.  Against the chained layer (with the
# one-pass router) on h200's tiles and on e128's.


def moe_case21(shape, T):
    c = moe_setup(shape, T)
    x, w1, w2, out, wf, idf, H, inter, k, numel, kb = c.names
    e128 = SimpleNamespace(block_n=8, block_k=256, num_warps=4, down_block_n=4, down_block_k=256, down_num_warps=8)
    runs = {
        "current": current_layer(c),
        "chained, e128 tiles": simt_layer(c, e128, lambda: router(c, True)),
    }
    for up, down in (((8, 512, 4), (4, 128, 4)), ((8, 256, 4), (4, 256, 8))):
        runs[f"routed up {up} down {down}, rounds"] = routed_layer(c, *up, down)
        for rows in (False, True):
            runs[f"routed up {up} down {down}, one pass, rows={rows}"] = routed_layer(c, *up, down, True, rows)

    def same_ids(row, name, fn):
        if name.startswith("routed"):
            row["ids_same"] = bool(torch.equal(idf.view(T, k), c.ids_ref))
            return row["ids_same"]
        return True

    good = checked_runs("moe21", c, runs, same_ids)
    ranked = timed_rounds("moe21", c, good, 9)
    for name in ranked[:4] + [n for n in ("current", "chained, e128 tiles") if n not in ranked[:4]]:
        graph_timed("moe21", c, name, good[name])
    save()


# Phase 22: the one-pass router's warps.  topk_softmax gives a decode token one warp (with the k
# rounds, cross-warp reductions were most of its time: phase 2); the one-pass top-k merges K_BLOCK
# keys per level, so at 256 experts (8 a lane on one warp) more warps may pay.


def moe_case22(shape, T):
    c = moe_setup(shape, T)
    v = c.G.select(T, c.inter, dtype=DT, hw=HW, device=DEV).variant

    def route(warps, trig):
        M._topk_softmax_kernel[(T,)](c.logits, c.wf, c.idf, T, c.E, c.k, c.logits.stride(0), c.logits.stride(1),
                                     RENORMALIZE=True, BLOCK_T=1, E_BLOCK=c.e_block, K_BLOCK=c.kb, TRIGGER=trig,
                                     num_warps=warps)  # fmt: skip

    alone = {f"router, {w} warp(s)": (lambda w=w: route(w, False)) for w in (1, 2, 4)}
    timed_rounds("moe22", c, alone, 7)
    runs = {"current": current_layer(c)}
    for w in (1, 2, 4):
        runs[f"layer, router on {w} warp(s)"] = simt_layer(c, v, lambda w=w: route(w, True))

    def same_ids(row, name, fn):
        row["ids_same"] = bool(torch.equal(c.idf.view(T, c.k), c.ids_ref))
        return row["ids_same"]

    good = checked_runs("moe22", c, runs, same_ids)
    timed_with_graphs("moe22", c, good, 9)
    save()


# Phase 23: tiles per expert shape.  One decode record serves both shapes on h200 (chosen for
# qwen36); phase 17 found e128's own pair at T = 1.  Here the production bodies, chained and
# routed by the production router, over a grid of up and down tiles at T = 1, 2 and 4 (the decode
# bucket's range), each shape apart, so that each can have its own record.

UP23 = [(8, 512, 4), (8, 256, 4), (16, 256, 8), (4, 256, 4), (4, 512, 4), (8, 256, 2)]
DOWN23 = [(4, 128, 4), (4, 256, 8), (8, 256, 8), (2, 256, 4), (8, 128, 4), (4, 512, 8)]


def moe_case23(shape, T, ups=UP23, downs=DOWN23, key="moe23"):
    c = moe_setup(shape, T)
    warps = min(4, max(1, c.e_block // 128))  # topk_softmax's own choice for a decode token

    def route():
        M._topk_softmax_kernel[(T,)](c.logits, c.wf, c.idf, T, c.E, c.k, c.logits.stride(0), c.logits.stride(1),
                                     RENORMALIZE=True, BLOCK_T=1, E_BLOCK=c.e_block, K_BLOCK=c.kb, TRIGGER=True,
                                     num_warps=warps)  # fmt: skip

    runs = {"current": current_layer(c)}
    for (bn, bk, w), (dbn, dbk, dw) in itertools.product(ups, downs):
        tiles = SimpleNamespace(block_n=bn, block_k=bk, num_warps=w, down_block_n=dbn, down_block_k=dbk,
                                down_num_warps=dw)  # fmt: skip
        runs[f"up {(bn, bk, w)} down {(dbn, dbk, dw)}"] = simt_layer(c, tiles, route)
    good = checked_runs(key, c, runs)
    ranked = timed_rounds(key, c, good, 5)
    leaders(key, c, good, ranked, runs["current"], rounds=9, n=6)
    save()


# Phase 24: phase 23 at T = 1 around its winners: up slabs with 128-element K steps (more programs,
# fewer bytes each), down programs on 2 to 16 warps.

UP24 = [(8, 512, 4), (8, 256, 4), (8, 128, 2), (8, 128, 4), (4, 128, 2), (4, 512, 2)]
DOWN24 = [(4, 256, 8), (2, 256, 8), (4, 128, 8), (8, 256, 16), (2, 128, 4), (4, 256, 16)]


def moe_case24(shape, T):
    moe_case23(shape, T, UP24, DOWN24, "moe24")


# Phase 25: the down kernel's wait.  griddepcontrol.wait returns once the up grid has completed and
# its writes are flushed; here each up program, once its rows of h are stored, counts itself done
# (a CTA barrier, then a release add), and each down program, launched dependently as now, loads
# its ids and first chunk, then spins on that count (acquire) until every up program is done.  The
# last down program past the wait (a second count) zeroes both counts for the next call, which
# cannot start before this down grid ends (its router is a plain launch).


@triton.jit
def _up25(x_ptr, w_ptr, h_ptr, ids_ptr, cnt_ptr, N, K, top_k, sxm, sxk, swe, swn, swk, shm, shn,
          BN: tl.constexpr, BK: tl.constexpr):  # fmt: skip
    # The production up body (SiLU, K steps that divide K, a dependent launch), then the count.
    M._simt_up(x_ptr, w_ptr, h_ptr, ids_ptr, N, K, top_k, sxm, sxk, swe, swn, swk, shm, shn, 0, True, BN, BK, True)
    tl.debug_barrier()  # every thread's rows stored before the count says so
    tl.atomic_add(cnt_ptr, 1, sem="release")


@triton.jit
def _down_synced(h_ptr, w_ptr, out_ptr, weights_ptr, ids_ptr, sync_ptr, n_up, N, K, top_k, shm, shk, swe, swn, swk,
                 som, son, BN: tl.constexpr, BK: tl.constexpr, KB: tl.constexpr, COUNTED: tl.constexpr):  # fmt: skip
    # The production down body with another wait.  COUNTED (phase 25): spin on sync_ptr[0], the count
    # of finished up programs, until it reaches n_up; the last program past the wait (sync_ptr[1]
    # counts them) zeroes both.  Else (phase 27): the up grid's completion, then the first program
    # zeroes the flag sync_ptr[0] (nobody reads it now).
    t = tl.program_id(0)
    offs_n = tl.program_id(1) * BN + tl.arange(0, BN)
    rows = (offs_n % N).to(tl.int64)
    slot = tl.arange(0, KB)
    slot_ok = slot < top_k
    flat = t * top_k + slot
    experts = tl.load(ids_ptr + flat, mask=slot_ok, other=0, cache_modifier=".cg").to(tl.int64)
    offs_k = tl.arange(0, BK)
    w_ptrs = w_ptr + experts[:, None, None] * swe + rows[None, :, None] * swn + offs_k[None, None, :] * swk
    w_ok = slot_ok[:, None, None]
    b = tl.load(w_ptrs, mask=w_ok & (offs_k < K)[None, None, :], other=0.0)
    if COUNTED:
        done = tl.atomic_add(sync_ptr, 0, sem="acquire")
        while done < n_up:
            done = tl.atomic_add(sync_ptr, 0, sem="acquire")
        n_down = tl.num_programs(0) * tl.num_programs(1)
        if tl.atomic_add(sync_ptr + 1, 1, sem="relaxed") == n_down - 1:  # the last past the wait
            tl.atomic_xchg(sync_ptr, 0, sem="relaxed")
            tl.atomic_xchg(sync_ptr + 1, 0, sem="relaxed")
    else:
        gdc_wait()
        if (tl.program_id(0) == 0) & (tl.program_id(1) == 0):
            tl.atomic_xchg(sync_ptr, 0, sem="relaxed")
    weight = tl.load(weights_ptr + flat, mask=slot_ok, other=0.0).to(tl.float32)
    a_ptrs = h_ptr + flat.to(tl.int64)[:, None] * shm + offs_k[None, :] * shk
    acc = tl.zeros((KB, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        a = tl.load(a_ptrs, mask=slot_ok[:, None] & (offs_k < K - k0)[None, :], other=0.0)
        b_next = tl.load(w_ptrs + BK * swk, mask=w_ok & (offs_k < K - k0 - BK)[None, None, :], other=0.0)
        acc += tl.sum(b.to(tl.float32) * a.to(tl.float32)[:, None, :], axis=2)
        b = b_next
        a_ptrs += BK * shk
        w_ptrs += BK * swk
    o = tl.sum(acc * weight[:, None], axis=0)
    tl.store(out_ptr + t.to(tl.int64) * som + offs_n * son, o.to(out_ptr.dtype.element_ty), mask=offs_n < N)


def moe_case25(shape, T):
    c = moe_setup(shape, T)
    x, w1, w2, out, wf, idf, H, inter, k, numel, kb = c.names
    v = c.G.select(T, c.inter, dtype=DT, hw=HW, device=DEV).variant
    cnt = torch.zeros(2, dtype=torch.int32, device=DEV)
    warps = min(4, max(1, c.e_block // 128))

    def route():
        M._topk_softmax_kernel[(T,)](c.logits, wf, idf, T, c.E, k, c.logits.stride(0), c.logits.stride(1),
                                     RENORMALIZE=True, BLOCK_T=1, E_BLOCK=c.e_block, K_BLOCK=kb, TRIGGER=True,
                                     num_warps=warps)  # fmt: skip

    def counted():
        hh = torch.empty(numel, inter, device=DEV, dtype=DT)
        route()
        n_up = numel * triton.cdiv(inter, v.block_n)
        _up25[(numel, triton.cdiv(inter, v.block_n))](
            x, w1, hh, idf, cnt, inter, H, k, x.stride(0), x.stride(1), *w1.stride(), *hh.stride(), BN=v.block_n,
            BK=v.block_k, num_warps=v.num_warps, num_stages=1, launch_pdl=True)  # fmt: skip
        _down_synced[(T, triton.cdiv(H, v.down_block_n))](
            hh, w2, out, wf, idf, cnt, n_up, H, inter, k, *hh.stride(), *w2.stride(), *out.stride(),
            BN=v.down_block_n, BK=v.down_block_k, KB=kb, COUNTED=True, num_warps=v.down_num_warps, num_stages=1,
            launch_pdl=True)  # fmt: skip

    runs = {"current": current_layer(c), "chained, grid wait": simt_layer(c, v, route), "counted wait": counted}

    def left_clean(row, name, fn):
        torch.cuda.synchronize()
        row["counts_after"] = cnt.tolist()
        return row["counts_after"] == [0, 0]

    good = checked_runs("moe25", c, runs, left_clean)
    timed_with_graphs("moe25", c, good, 9)
    save()


# Phase 26: the timer's own cost.  gpu_ms (flush, GPU sleep, start event, the call, end event) around
# nothing at all, around a one-element torch fill, an empty Triton kernel and the T = 1 layer, in
# interleaved rounds; then 200 samples of nothing and of the layer, each after its own flush and
# sleep, for their spread and the values they take.


def moe_case26(shape, T):
    c = moe_setup(shape, T)
    one = torch.zeros(1, device=DEV)
    dummy = torch.zeros(1, device=DEV)
    methods = {
        "nothing": lambda: None,
        "torch fill of one element": lambda: one.fill_(1.0),
        "empty Triton kernel": lambda: _e19[(1,)](dummy, WAIT=False, TRIG=False),
        "layer": current_layer(c),
    }
    times = per_round(methods, 9)
    for name, t in times.items():
        us = statistics.median(t) * 1e3
        RES["moe26"].append({"case": c.name, "config": name, "us": us, "rounds_us": [v * 1e3 for v in t]})
        log(f"  {c.name} {name}: {us:.2f} us, rounds {[round(v * 1e3, 2) for v in t]}")
    for name in ("nothing", "layer"):
        got = [ms * 1e3 for ms in gpu_samples_ms(methods[name], reps=200)]
        vals = sorted(got)
        q = [vals[int(p * (len(vals) - 1))] for p in (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)]
        distinct = sorted({round(v, 3) for v in got})
        steps = sorted({round(b - a, 3) for a, b in zip(distinct, distinct[1:])})[:5]
        RES["moe26"].append({"case": c.name, "config": f"{name} samples", "samples_us": got})
        log(
            f"  {c.name} {name} samples: min p10 p25 median p75 p90 max {[round(v, 3) for v in q]}, mean"
            f" {statistics.mean(got):.3f}, {len(distinct)} distinct values, smallest steps {steps}"
        )
    save()


# Phase 27: no router launch at one token.  Phase 21 routed inside every program of both GEMMs (each
# computed the top-k: slower); here only the up launch's first program does, then sets a flag, and
# the others (resident at once, with nothing to read until then) spin on it.  The down kernel is
# phase 25's, waiting on the up grid as the production body does, its first program then zeroing
# the flag.  (The up kernel's body is a copy of the production one but for its ids' load, read
# past L1, as it was measured.)


@triton.jit
def _up27(x_ptr, w_ptr, h_ptr, logits_ptr, weights_ptr, ids_ptr, flag_ptr, E, N, K, top_k, stride_lt, stride_le,
          sxm, sxk, swe, swn, swk, shm, shn, E_BLOCK: tl.constexpr, K_BLOCK: tl.constexpr, BN: tl.constexpr,
          BK: tl.constexpr):  # fmt: skip
    if (tl.program_id(0) == 0) & (tl.program_id(1) == 0):
        vals, idx = _topk_row(
            logits_ptr, tl.program_id(0), E, top_k, stride_lt, stride_le, True, E_BLOCK, K_BLOCK, True, 1
        )
        kk = tl.arange(0, K_BLOCK)
        tl.store(ids_ptr + kk, idx, mask=kk < top_k)
        tl.store(weights_ptr + kk, vals, mask=kk < top_k)
        tl.debug_barrier()
        tl.atomic_xchg(flag_ptr, 1, sem="release")
    ready = tl.atomic_add(flag_ptr, 0, sem="acquire")
    while ready == 0:
        ready = tl.atomic_add(flag_ptr, 0, sem="acquire")
    gdc_launch_dependents()
    r = tl.program_id(0)
    offs_n = tl.program_id(1) * BN + tl.arange(0, BN)
    cols = (offs_n % N).to(tl.int64)
    offs_k = tl.arange(0, BK)
    expert = tl.load(ids_ptr + r, cache_modifier=".cg").to(tl.int64)
    a_ptrs = x_ptr + (r // top_k).to(tl.int64) * sxm + offs_k * sxk
    g_ptrs = w_ptr + expert * swe + cols[:, None] * swn + offs_k[None, :] * swk
    u_ptrs = g_ptrs + N * swn
    acc_g = tl.zeros((BN, BK), dtype=tl.float32)
    acc_u = tl.zeros((BN, BK), dtype=tl.float32)
    for k0 in range(0, K, BK):
        a = tl.load(a_ptrs).to(tl.float32)[None, :]
        acc_g += tl.load(g_ptrs).to(tl.float32) * a
        acc_u += tl.load(u_ptrs).to(tl.float32) * a
        a_ptrs += BK * sxk
        g_ptrs += BK * swk
        u_ptrs += BK * swk
    gate = tl.sum(acc_g, axis=1)
    up = tl.sum(acc_u, axis=1)
    h = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(h_ptr + r.to(tl.int64) * shm + offs_n * shn, h.to(h_ptr.dtype.element_ty), mask=offs_n < N)


def moe_case27(shape, T):
    c = moe_setup(shape, T)
    x, w1, w2, out, wf, idf, H, inter, k, numel, kb = c.names
    v = c.G.select(T, c.inter, dtype=DT, hw=HW, device=DEV).variant
    flag = torch.zeros(1, dtype=torch.int32, device=DEV)

    def flagged():
        hh = torch.empty(numel, inter, device=DEV, dtype=DT)
        _up27[(numel, triton.cdiv(inter, v.block_n))](
            x, w1, hh, c.logits, wf, idf, flag, c.E, inter, H, k, c.logits.stride(0), c.logits.stride(1),
            x.stride(0), x.stride(1), *w1.stride(), *hh.stride(), E_BLOCK=c.e_block, K_BLOCK=kb, BN=v.block_n,
            BK=v.block_k, num_warps=v.num_warps, num_stages=1)  # fmt: skip
        _down_synced[(T, triton.cdiv(H, v.down_block_n))](
            hh, w2, out, wf, idf, flag, 0, H, inter, k, *hh.stride(), *w2.stride(), *out.stride(), BN=v.down_block_n,
            BK=v.down_block_k, KB=kb, COUNTED=False, num_warps=v.down_num_warps, num_stages=1,
            launch_pdl=True)  # fmt: skip

    runs = {"current": current_layer(c), "flagged, two launches": flagged}

    def same_ids(row, name, fn):
        torch.cuda.synchronize()
        row["flag_after"] = int(flag.item())
        if name == "current":
            return True
        row["ids_same"] = bool(torch.equal(idf.view(T, k), c.ids_ref))
        return row["ids_same"] and row["flag_after"] == 0

    good = checked_runs("moe27", c, runs, same_ids)
    timed_with_graphs("moe27", c, good, 9)
    save()


# Phase 28: the simt loops software-pipelined.  The production bodies kept one K step of weights in
# flight a program (up) or two (down, by hand); a loop written with tl.range(..., num_stages=S) has
# Triton stage every load of the loop through shared memory by cp.async, S - 1 steps ahead, with no
# registers held for the steps in flight.  Run 2026-12-01 (bench/results/h200_explore_decode28.*)
# on prototypes of that form: _simt_up with its loop so written, and _simt_down with its first
# chunk peeled (loaded before the wait, as before) and the rest of its loop so written, no chunk
# loaded ahead by hand; since adopted as the production bodies' STAGES (> 1), which this phase now
# runs (stages 0: the body at STAGES 1, the unstaged loops).  Same products in the same order
# either way, so outputs match bit for bit.  T = 1.


# Up slabs (rows, K step in elements, warps), stages; down chunks (rows, K step, warps), stages (0: the
# body at STAGES 1; phase 28's down prototype at 1, its first chunk peeled and no chunk loaded ahead by
# hand, is no longer a form of the production body, which this phase now runs at STAGES 1 there too).
UP28 = [(bn, bk, w) for bn in (4, 8, 16) for bk in (256, 512) for w in (2, 4)]
DOWN28 = [(4, 128, 4), (4, 256, 8), (8, 256, 8), (2, 256, 4), (8, 128, 4)]


def staged_layer(c, up, up_st, down, down_form, regs):
    """The chained T-token layer (production router) with the production up body on ``up``'s tiles at
    STAGES ``up_st`` (0 runs as 1) and the down GEMM on ``down``'s: the production body at STAGES
    ``down_form`` (an int; 0 runs as 1), or ``down_form`` itself (a prototype with _simt_down's
    launch signature and no STAGES).  Each compiled kernel's registers, spills and shared bytes
    land in ``regs``."""
    x, w1, w2, out, wf, idf, H, inter, k, numel, kb = c.names
    (bn, bk, w), (dbn, dbk, dw) = up, down
    assert H % bk == 0 and inter % dbk == 0, "whole K steps only"
    warps = min(4, max(1, c.e_block // 128))  # topk_softmax's own choice for a decode token
    staged = isinstance(down_form, int)

    def run():
        hh = torch.empty(numel, inter, device=DEV, dtype=DT)
        M._topk_softmax_kernel[(c.T,)](c.logits, wf, idf, c.T, c.E, k, c.logits.stride(0), c.logits.stride(1),
                                       RENORMALIZE=True, BLOCK_T=1, E_BLOCK=c.e_block, K_BLOCK=kb, TRIGGER=True,
                                       num_warps=warps)  # fmt: skip
        ku = M._simt_up[(numel, triton.cdiv(inter, bn))](
            x, w1, hh, idf, inter, H, k, x.stride(0), x.stride(1), *w1.stride(), *hh.stride(), ACT=0,
            EVEN_K=True, BLOCK_N=bn, BLOCK_K=bk, STAGES=max(up_st, 1), PDL=True, num_warps=w, num_stages=1,
            launch_pdl=True)  # fmt: skip
        kern = M._simt_down if staged else down_form
        kd = kern[(c.T, triton.cdiv(H, dbn))](
            hh, w2, out, wf, idf, H, inter, k, *hh.stride(), *w2.stride(), *out.stride(), BLOCK_N=dbn,
            BLOCK_K=dbk, KB=kb, PDL=True, num_warps=dw, num_stages=1, launch_pdl=True,
            **({"STAGES": max(down_form, 1)} if staged else {}))  # fmt: skip
        down_name = f"s{down_form}" if staged else down_form.__name__
        for name, kern in ((f"up {up} s{up_st}", ku), (f"down {down} {down_name}", kd)):
            if kern is not None and hasattr(kern, "n_regs"):
                regs[name] = [kern.n_regs, kern.n_spills, kern.metadata.shared]

    return run


def stage_sweep(key, shape, T, ups, downs):
    """Stage A: ``ups`` ((tiles, stages) pairs) against the record's down kernel; stage B: the two
    best and the record's up kernel against ``downs`` ((tiles, form) pairs, forms as staged_layer
    takes them); then the leaders in 9 rounds and as graphs."""
    c = moe_setup(shape, T)
    v = c.G.select(T, c.inter, dtype=DT, hw=HW, device=DEV).variant
    cur_up, cur_st = (v.block_n, v.block_k, v.num_warps), v.num_stages
    cur_down = ((v.down_block_n, v.down_block_k, v.down_num_warps), v.down_num_stages)
    regs = {}

    def name(up, up_st, down, form):
        return f"up {up} s{up_st} down {down} {f's{form}' if isinstance(form, int) else form.__name__}"

    runs = {"current": current_layer(c)}
    ups = list(dict.fromkeys([(cur_up, cur_st)] + ups))
    for up, st in ups:
        runs[name(up, st, *cur_down)] = staged_layer(c, up, st, *cur_down, regs)
    good = checked_runs(key, c, runs)
    ranked = timed_rounds(key, c, good, 5)
    best = [next((u, st) for u, st in ups if name(u, st, *cur_down) == n) for n in ranked if n != "current"][:2]
    runs_b = {"current": runs["current"]}
    for up, st in dict.fromkeys(best + [(cur_up, cur_st)]):
        for down, form in dict.fromkeys([cur_down] + downs):
            runs_b[name(up, st, down, form)] = staged_layer(c, up, st, down, form, regs)
    good_b = checked_runs(key, c, runs_b)
    ranked_b = timed_rounds(key, c, good_b, 5, suffix=" [B]")
    leaders(key, c, good_b, ranked_b, runs["current"], rounds=9, n=6)
    log(f"  {c.name} registers, spills, shared bytes: {regs}")
    RES[key].append({"case": c.name, "registers_spills_shared": regs})
    save()


def moe_case28(shape, T):
    ups = [(u, st) for u in UP28 for st in (2, 3)] + [((8, 512, 4), st) for st in (0, 2, 3, 4)]
    stage_sweep("moe28", shape, T, ups, [(d, s) for d in DOWN28 for s in (1, 2, 3)])


# Phase 29: the unstaged up loop's two forms.  Phase 28's adoption rewrote _simt_up's loop for every
# record: addresses as base + k0 in a tl.range, where the loop before carried its pointers and
# advanced them (a plain range).  _up_carried is the body before (ACT 0, whole K steps, chained);
# against the production body at STAGES 1, each bucket's own tiles, in the chained layer, T = 1 and 4.


@triton.jit
def _up_carried(x_ptr, w_ptr, h_ptr, ids_ptr, N, K, top_k, sxm, sxk, swe, swn, swk, shm, shn, BN: tl.constexpr,
                BK: tl.constexpr):  # fmt: skip
    gdc_wait()
    gdc_launch_dependents()
    r = tl.program_id(0)
    offs_n = tl.program_id(1) * BN + tl.arange(0, BN)
    cols = (offs_n % N).to(tl.int64)
    offs_k = tl.arange(0, BK)
    expert = tl.load(ids_ptr + r).to(tl.int64)
    a_ptrs = x_ptr + (r // top_k).to(tl.int64) * sxm + offs_k * sxk
    g_ptrs = w_ptr + expert * swe + cols[:, None] * swn + offs_k[None, :] * swk
    u_ptrs = g_ptrs + N * swn
    acc_g = tl.zeros((BN, BK), dtype=tl.float32)
    acc_u = tl.zeros((BN, BK), dtype=tl.float32)
    for k0 in range(0, K, BK):
        a = tl.load(a_ptrs).to(tl.float32)[None, :]
        acc_g += tl.load(g_ptrs).to(tl.float32) * a
        acc_u += tl.load(u_ptrs).to(tl.float32) * a
        a_ptrs += BK * sxk
        g_ptrs += BK * swk
        u_ptrs += BK * swk
    gate = tl.sum(acc_g, axis=1)
    up = tl.sum(acc_u, axis=1)
    h = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(h_ptr + r.to(tl.int64) * shm + offs_n * shn, h.to(h_ptr.dtype.element_ty), mask=offs_n < N)


def moe_case29(shape, T):
    c = moe_setup(shape, T)
    x, w1, w2, out, wf, idf, H, inter, k, numel, kb = c.names
    v = c.G.select(T, c.inter, dtype=DT, hw=HW, device=DEV).variant
    warps = min(4, max(1, c.e_block // 128))  # topk_softmax's own choice for a decode token
    assert H % v.block_k == 0, "phase 29 runs whole K steps only"

    def layer(carried):
        def run():
            hh = torch.empty(numel, inter, device=DEV, dtype=DT)
            M._topk_softmax_kernel[(T,)](c.logits, wf, idf, T, c.E, k, c.logits.stride(0), c.logits.stride(1),
                                         RENORMALIZE=True, BLOCK_T=1, E_BLOCK=c.e_block, K_BLOCK=kb, TRIGGER=True,
                                         num_warps=warps)  # fmt: skip
            grid = (numel, triton.cdiv(inter, v.block_n))
            if carried:
                _up_carried[grid](
                    x, w1, hh, idf, inter, H, k, x.stride(0), x.stride(1), *w1.stride(), *hh.stride(), BN=v.block_n,
                    BK=v.block_k, num_warps=v.num_warps, num_stages=1, launch_pdl=True)  # fmt: skip
            else:
                M._simt_up[grid](
                    x, w1, hh, idf, inter, H, k, x.stride(0), x.stride(1), *w1.stride(), *hh.stride(), ACT=0,
                    EVEN_K=True, BLOCK_N=v.block_n, BLOCK_K=v.block_k, PDL=True, STAGES=1, num_warps=v.num_warps,
                    num_stages=1, launch_pdl=True)  # fmt: skip
            M._simt_down[(T, triton.cdiv(H, v.down_block_n))](
                hh, w2, out, wf, idf, H, inter, k, *hh.stride(), *w2.stride(), *out.stride(), BLOCK_N=v.down_block_n,
                BLOCK_K=v.down_block_k, KB=kb, PDL=True, STAGES=v.down_num_stages, num_warps=v.down_num_warps,
                num_stages=1, launch_pdl=True)  # fmt: skip

        return run

    runs = {"current": current_layer(c), "up at STAGES 1 (base + k0)": layer(False), "up carried": layer(True)}
    good = checked_runs("moe29", c, runs)
    timed_with_graphs("moe29", c, good, 9)
    save()


# Phase 30: after phase 29 (the up loop's addresses as base + k0 beat carried pointers by 3-4 us),
# the down kernel's unstaged loop in that form too: _down_k0 is _simt_down at STAGES 1 (the next
# chunk loaded into registers before this one is used) with base + k0 addresses, whole K steps.
# With the production bodies at every depth, over up slabs and down chunks, T = 1.


@triton.jit
def _down_k0(h_ptr, w_ptr, out_ptr, weights_ptr, ids_ptr, N, K, top_k, shm, shk, swe, swn, swk, som, son,
             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, KB: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
    t = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = (offs_n % N).to(tl.int64)
    slot = tl.arange(0, KB)
    slot_ok = slot < top_k
    flat = t * top_k + slot
    experts = tl.load(ids_ptr + flat, mask=slot_ok, other=0, cache_modifier=".cg").to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + experts[:, None, None] * swe + rows[None, :, None] * swn + offs_k[None, None, :] * swk
    w_ok = slot_ok[:, None, None]
    b = tl.load(w_ptrs, mask=w_ok, other=0.0)
    gdc_wait()
    weight = tl.load(weights_ptr + flat, mask=slot_ok, other=0.0).to(tl.float32)
    a_ptrs = h_ptr + flat.to(tl.int64)[:, None] * shm + offs_k[None, :] * shk
    acc = tl.zeros((KB, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs + k0 * shk, mask=slot_ok[:, None], other=0.0)
        b_next = tl.load(w_ptrs + (k0 + BLOCK_K) * swk, mask=w_ok & (k0 + BLOCK_K < K), other=0.0)
        acc += tl.sum(b.to(tl.float32) * a.to(tl.float32)[:, None, :], axis=2)
        b = b_next
    o = tl.sum(acc * weight[:, None], axis=0)
    tl.store(out_ptr + t.to(tl.int64) * som + offs_n * son, o.to(out_ptr.dtype.element_ty), mask=offs_n < N)


UP30 = [(8, 256, 4), (4, 256, 2), (4, 256, 4), (8, 512, 4), (16, 256, 4), (8, 128, 2), (4, 512, 2)]
DOWN30 = [(4, 256, 8), (2, 256, 4), (8, 256, 8), (4, 128, 4), (2, 128, 2)]


def moe_case30(shape, T):
    ups = [(u, st) for u in UP30 for st in (1, 2, 3)]
    downs = [(d, form) for d in DOWN30 for form in (1, 2, 3, _down_k0)]
    stage_sweep("moe30", shape, T, ups, downs)


def main():
    RES["meta"] = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": time.strftime("%Y-%m-%d"),
    }
    if ARGS.phase == 6:
        flush_phase()
        log("done")
        return
    jobs = []
    att, moe = {
        1: (att_case, moe_case),
        2: (att_case2, moe_case2),
        3: (att_case3, None),
        4: (att_case4, moe_case4),
        5: (None, moe_case5),
        7: (att_case7, None),
        8: (None, moe_case8),
        9: (att_case9, None),
        10: (None, moe_case10),
        11: (None, moe_case11),
        12: (None, moe_case12),
        13: (None, moe_case13),
        14: (None, moe_case14),
        15: (None, moe_case15),
        16: (None, moe_case16),
        17: (None, moe_case17),
        18: (None, moe_case18),
        19: (None, moe_case19),
        20: (None, moe_case20),
        21: (None, moe_case21),
        22: (None, moe_case22),
        23: (None, moe_case23),
        24: (None, moe_case24),
        25: (None, moe_case25),
        26: (None, moe_case26),
        27: (None, moe_case27),
        28: (None, moe_case28),
        29: (None, moe_case29),
        30: (None, moe_case30),
    }[ARGS.phase]
    cases = ATT_CASES
    if ARGS.phase == 7:
        cases = [
            (D, H, Hkv, b, c)
            for D, H, Hkv in ((128, 32, 8), (256, 16, 4))
            for b, c in ((1, 32768), (8, 8192), (8, 32768), (32, 8192))
        ]
    if ARGS.phase == 9:
        cases = [
            (D, H, Hkv, b, c)
            for D, H, Hkv in ((128, 32, 8), (256, 16, 4))
            for b, c in ((1, 4096), (1, 8192), (1, 32768), (2, 16384), (4, 8192), (8, 8192))
        ]
    if ARGS.phase == 3:
        cases = [
            (D, H, Hkv, b, c)
            for D, H, Hkv in ((128, 32, 8), (256, 16, 4))
            for b, c in ((1, 8192), (1, 32768), (8, 8192), (8, 32768))
        ]
    if att is not None and ARGS.only in (None, "attention"):
        jobs += [(att, c) for c in cases]
    if moe is not None and ARGS.only in (None, "moe"):
        ts = {5: (1, 4, 16), 8: (1, 4, 16), 23: (1, 2, 4)}.get(ARGS.phase, (1, 4))
        jobs += [(moe, (s, T)) for s in MOE_SHAPES for T in ts]
        if ARGS.phase in (17, 18, 19, 20, 21, 22, 24, 25, 26, 27, 28, 30):
            jobs = [j for j in jobs if j[1][1] == 1]
        if ARGS.phase in (16, 17, 18, 19, 20, 21, 22) and ARGS.quick:
            jobs = jobs[:1]
    for fn, args in jobs:
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001
            RES["errors"].append({"job": f"{fn.__name__}{args}", "error": traceback.format_exc()[-2000:]})
            log(f"ERROR {fn.__name__}{args}: {type(e).__name__}: {e}")
        torch.cuda.empty_cache()
        save()
    log("done")


if __name__ == "__main__":
    main()
