"""Exploration of the two decode misses (issues 15 and 16): where the time goes, and which knob moves it.

Not a benchmark of record: it sweeps kernel constants and prototypes that are not (yet) in the
specs, on the cases bench/attention.py and bench/moe.py report below their targets, and writes
every number to $OUT/explore_decode.json (bench/results/ keeps the runs RESULTS.md cites).

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
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait  # noqa: E402

from policy_runtime import attention as A  # noqa: E402
from policy_runtime import moe as M  # noqa: E402
from bench.runlog import RunLog  # noqa: E402
from policy_runtime.timing import flush_l2, gpu_ms, per_round, rel_err  # noqa: E402
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
    "8: MoE decode unrolled and chained; 9: small decode grids x partition sizes",
)
ARGS = AP.parse_args()
DEV, DT, HW = "cuda", torch.bfloat16, ARGS.hw
RES: dict = {
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
        body = BoundKernel(A._decode, f"dec_{D}_{bn}_{w}_{st}", dict(BLOCK_N=bn, DOT_PREC="tf32"))
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
    bucket = G.select(T, dtype=DT, hw=HW, device=DEV)
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
        kern = A._decode if body == "cur" else _decode_pf
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
    bucket = G.select(T, dtype=DT, hw=HW, device=DEV)
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
    kern = A._decode if body == "cur" else _decode_pf
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
    A._decode(q, kc, vc, bt, sl, o, part_o, part_m, part_l, sm_scale, group, bt_stride, v1_limit, torch_limit,
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
    if TRIG:
        gdc_launch_dependents()
    M._topk_softmax_kernel(logits_ptr, weights_ptr, ids_ptr, T, E, k, stride_lt, stride_le, RENORMALIZE, BLOCK_T,
                           E_BLOCK, K_BLOCK)  # fmt: skip


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
                A._decode[(batch, Hkv, parts)](*args, BLOCK_N=bn, DOT_PREC="tf32", num_warps=4, num_stages=st)
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
    v = G.select(T, dtype=DT, hw=HW, device=DEV).variant
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

    row = {"case": name, "kernel": "current", "kernels": G.select(T, dtype=DT, hw=HW, device=DEV).variant.name}
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
                        H % bk == 0, **opts)  # fmt: skip

            else:

                def fn(opts=opts, bn=bn, bk=bk):
                    M._simt_down[(T, triton.cdiv(H, bn))](
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
                H % uo["BLOCK_K"] == 0, **uo)  # fmt: skip
            M._simt_down[(T, triton.cdiv(H, do["BLOCK_N"]))](
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
                    BLOCK_N=8, BLOCK_K=512, num_warps=4, num_stages=1)  # fmt: skip
                M._simt_down[(T, triton.cdiv(H, 4))](
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
        jobs += [(moe, (s, T)) for s in MOE_SHAPES for T in ((1, 4, 16) if ARGS.phase in (5, 8) else (1, 4))]
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
