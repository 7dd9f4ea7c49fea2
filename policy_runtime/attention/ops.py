"""The hand-written half of generated/attention.py: attention kernel bodies and the host side.

generated/attention.py (templates/attention/module.py.j2) holds what varies with the specs: one small
``@triton.jit`` kernel per distinct prefill tile (``AttentionConfig``'s ``triton_block_m/n``,
``triton_num_warps/stages``) and per distinct decode tile (``AttentionLaunch``), each calling a
body below with its constants as keyword arguments; the tables of records per dtype, model (or
head_dim) and target; and the public functions, which hand those tables to an ``Attention``
object (below).  Everything else is here: the bodies (``prefill_body``, ``decode_body``), the V2 merge
kernel, the PyTorch path of long decode sequences, the hook for vendor decode kernels, the
argument checks and the path of one call.  The generated module's docstrings say what the entry
points promise.  Names with a leading underscore are the kernel module's internals, not API.

Numerics: scores and the softmax state (running max, running sum, output accumulator) are fp32;
``exp2`` with ``scale * log2(e)`` folded into the scores; K and V tiles are multiplied in the
input dtype (fp32 inputs: IEEE fp32 products, no TF32).  Rows that see no key (a causal row
above the bottom-right diagonal, a sequence of length 0) give zeros.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
from triton.tools.tensor_descriptor import TensorDescriptor

from .. import launch as _launch
from ..call_cache import NO_PLAN, CallCache, args_key, lookup, step, tensor_key
from ..fp8_kv import FP8_DTYPE, kv_scales, unserved_error
from ..sizing import grid_even_share

__all__ = ["Attention", "PrefillKernel", "DecodeKernel", "Policy", "Decode", "Selected", "record_uses"]

# In the kernels: scores are scaled by scale * log2(e) = scale * 1.4426950408889634 (softmax in
# base 2: exp2 is one instruction), and a row's running max starts at -1e30, not -inf, so that a
# tile in which a row sees no key (all scores -inf) gives exp2(-inf - m) = 0 and a rescale
# exp2(m - m) = 1, never NaN.
# The V2 merge: one program a slice of _MERGE_BLOCK_D head_dim columns of one (sequence, head),
# reading _MERGE_BLOCK_P partitions a step.  Two fixed shapes (warm-up compiles both; no length or
# bound compiles another): a launch of at least _MERGE_WIDE programs of at most _MERGE_BLOCK_P
# partitions takes one-warp programs of 16 partitions a step, any other four-warp programs of 64
# (batch 1 at long context: few programs; long contexts: many partitions, each step of a program a
# round trip to memory: 8 x 128k ragged at head_dim 256 merged in 20 us one-warp, 12 four-warp).
# Against the one shape before (64 partitions, 4 warps, two passes), merge alone on an H200
# (bench/results/h200_decode_merge_variants.log, us, partials in L2): 128 sequences x 16 heads x 8
# partitions at head_dim 256 29.0 -> 9.7, 256 x 16 x 2 52.9 -> 14.5, 32 x 32 x 16 at 128 11.4 ->
# 6.2, 8 x 32 x 8 6.1 -> 4.8; 1 x 16 x 256 at 256 8.2 -> 7.3 (the four-warp shape).
_MERGE_BLOCK_D = 64
_MERGE_BLOCK_P = 64
_MERGE_WARPS = 4
_MERGE_WIDE = 128
_MERGE_WIDE_BLOCK_P = 16
_MERGE_WIDE_WARPS = 1
# CUDA's limit on a grid's second and third dimensions.
_MAX_GRID_YZ = 65535
# Plans of the entry points' calls by argument class (keyed with the Attention object).
_PREFILL_CALLS = CallCache("prefill_attention")
_DECODE_CALLS = CallCache("decode_attention")

# ---------------------------------------------------------------------------------------
# Kernel bodies: generated/attention.py's specialized kernels call prefill_body and decode_body with
# their constants.


@triton.jit
def _online_softmax_step(acc, m_i, l_i, s, v, s_scale, DOT_PREC: tl.constexpr):
    # One key tile of the online softmax: s [rows, keys] times s_scale (> 0) are base-2 scores
    # (-inf where masked), v [keys, dim] the tile's values.  Returns the rescaled state.
    # Prefill passes raw q k^T and the logits scale: a row's max is scaled once, and the scale
    # joins exp2's argument as one fused multiply-add an element, where scaling the tile first
    # cost a multiply an element more (on an H200, 1-6% of prefill at head_dim 64 and 128;
    # scratch kernels of 2026-12-03, bench/RESULTS.md).  Decode passes scaled scores and 1.0.
    p, alpha, m_new, l_i = _softmax_weights(m_i, l_i, s, s_scale)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PREC)
    return acc, m_new, l_i


@triton.jit
def _softmax_weights(m_i, l_i, s, s_scale):
    # The online softmax's weights of a key tile: (p, alpha, m_new, l_new), p [rows, keys] the
    # tile's base-2 weights against the new row maxima m_new, alpha the old state's rescale.
    m_new = tl.maximum(m_i, tl.max(s, 1) * s_scale)
    alpha = tl.math.exp2(m_i - m_new)
    p = tl.math.exp2(s * s_scale - m_new[:, None])
    return p, alpha, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit
def _fp8_pairs(w, dtype: tl.constexpr):
    # 16-bit words, each two adjacent e4m3fn bytes of one token (head_dim columns 2i and 2i + 1),
    # as (even, odd) columns of ``dtype`` (exact).
    lo = (w & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(dtype)
    hi = ((w >> 8) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(dtype)
    return lo, hi


@triton.jit
def _logits(q, k, qk_scale, sm_scale, softcap, DOT_PREC: tl.constexpr, SOFTCAP: tl.constexpr):
    # Base-2 scores of a tile: q k^T * scale * log2(e); with SOFTCAP (flash-attn's softcap, on the
    # scaled scores before any mask or bias) softcap * tanh(q k^T * scale / softcap) * log2(e).
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC)
    if SOFTCAP:
        # tanh(x) = 1 - 2 / (1 + 2^(2 x log2(e))), x = s * scale / softcap: one exp2 and one
        # division an element (2^+inf = inf gives 1, 2^-inf = 0 gives -1: no overflow at any x),
        # times softcap * log2(e) for the base-2 softmax.
        c = softcap * 1.4426950408889634
        e = tl.math.exp2(s * (2.8853900817779268 * sm_scale / softcap))
        s = c - (2.0 * c) / (1.0 + e)
    else:
        s = s * qk_scale
    return s


@triton.jit
def _fp16_query(q, sm_scale):
    # A bf16 query tile as fp16, for dots with fp8 tiles converted to fp16 (e4m3 -> fp16 is one
    # paired instruction and exact; e4m3 -> bf16 takes several, on every element of every tile).
    # Exact: q is divided by 2^e, the power of two that brings |q| under 2^15 (e = 0 for any
    # ordinary query), and 2^e joins the scale; fp16 holds bf16's 8 significant bits from 2^-17
    # up, and the P operand of the V dot is then fp16 too (11 bits for bf16's 8).
    qf = q.to(tl.float32)
    qmax = tl.max(tl.max(tl.abs(qf), 1), 0)
    e = tl.maximum(tl.math.ceil(tl.math.log2(qmax)) - 15.0, 0.0)
    return (qf * tl.math.exp2(-e)).to(tl.float16), sm_scale * tl.math.exp2(e)


@triton.jit
def _sink(acc, m_i, l_i, sink):
    # A per-row attention sink (gpt-oss; vLLM's `sinks`): base-2 logit `sink` joins the softmax
    # denominator and carries no value.  -inf: no sink.
    m_new = tl.maximum(m_i, sink)
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.math.exp2(sink - m_new)
    return acc * alpha[:, None], m_new, l_i


@triton.jit
def _prefill_tile(acc, m_i, l_i, q, k_base, v_base, skt, svt, start, k_len, diag, qk_scale, sm_scale, softcap,
                  slope, win_left, win_right, offs_n, offs_d, d_ok, bt_row, skb, svb, desc_row, desc_col,
                  MASKED: tl.constexpr, CAUSAL: tl.constexpr, DOT_PREC: tl.constexpr, PADDED: tl.constexpr,
                  WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, PAGED: tl.constexpr,
                  BLOCK_SIZE: tl.constexpr, KV_FP8: tl.constexpr, KV_DESC: tl.constexpr):
    # Keys [start, start + BLOCK_N) of one sequence.  MASKED: the tile may cross the end of the
    # keys or (CAUSAL) the diagonal or (WINDOW) an edge of the window; an unmasked tile is seen
    # whole by every row.  PADDED: the tile's columns past the head_dim are not loaded (zeros).
    # PAGED: key j is at block bt_row[j // BLOCK_SIZE], slot j % BLOCK_SIZE of the caches.
    # KV_FP8: the tiles are e4m3fn, converted (exactly) to the query's dtype; their scales are
    # folded into sm_scale / qk_scale and the output by the caller.  KV_DESC: k_base and v_base
    # are TMA descriptors over [total_k, num_kv_heads * head_dim] (the tile at row desc_row +
    # start, column desc_col); rows past total_k read as zeros, rows of the next sequence are
    # masked as past k_len (and zeroed in V: p = 0 times a non-finite value would not be 0).
    cols = start + offs_n
    if KV_DESC:
        k = k_base.load([desc_row + start, desc_col])
        v = v_base.load([desc_row + start, desc_col])
        if MASKED:
            v = tl.where((cols < k_len)[:, None], v, 0.0)
    else:
        if PAGED:
            blk = tl.load(bt_row + cols // BLOCK_SIZE, mask=cols < k_len, other=0).to(tl.int64)
            slot = cols % BLOCK_SIZE
            k_ptrs = k_base + (blk * skb + slot * skt)[:, None] + offs_d[None, :]
            v_ptrs = v_base + (blk * svb + slot * svt)[:, None] + offs_d[None, :]
        else:
            rows = cols.to(tl.int64)
            k_ptrs = k_base + rows[:, None] * skt + offs_d[None, :]
            v_ptrs = v_base + rows[:, None] * svt + offs_d[None, :]
        if MASKED:
            in_k = cols < k_len
            if PADDED:
                k = tl.load(k_ptrs, mask=in_k[:, None] & d_ok[None, :], other=0.0)
                v = tl.load(v_ptrs, mask=in_k[:, None] & d_ok[None, :], other=0.0)
            else:
                k = tl.load(k_ptrs, mask=in_k[:, None], other=0.0)
                v = tl.load(v_ptrs, mask=in_k[:, None], other=0.0)
        else:
            if PADDED:
                k = tl.load(k_ptrs, mask=d_ok[None, :], other=0.0)
                v = tl.load(v_ptrs, mask=d_ok[None, :], other=0.0)
            else:
                k = tl.load(k_ptrs)
                v = tl.load(v_ptrs)
    if KV_FP8:
        k = k.to(q.dtype)
        v = v.to(q.dtype)
    if SOFTCAP or ALIBI or KV_FP8:
        # Scaled scores (an fp8 cache's k_scale joins the scale on the device, where the host
        # cannot make it positive).
        s = _logits(q, k, qk_scale, sm_scale, softcap, DOT_PREC, SOFTCAP)
        if ALIBI:
            # flash-attn's ALiBi: -slope * |i + k_len - q_len - j| (slope in base 2 here).
            s = s - slope * tl.abs(diag[:, None] - cols[None, :]).to(tl.float32)
        s_scale = 1.0
    else:
        # Raw q k^T, scaled in the softmax step after a row's max (the host makes sm_scale > 0).
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC)
        s_scale = qk_scale
    if MASKED:
        seen = (cols < k_len)[None, :]
        if CAUSAL:
            seen = seen & (cols[None, :] <= diag[:, None])
        if WINDOW:
            seen = seen & (cols[None, :] >= diag[:, None] - win_left) & (cols[None, :] <= diag[:, None] + win_right)
        s = tl.where(seen, s, float("-inf"))
    return _online_softmax_step(acc, m_i, l_i, s, v, s_scale, DOT_PREC)


@triton.jit
def prefill_body(q_ptr, k_ptr, v_ptr, o_ptr, cu_q, cu_k, sm_scale, group, sqt, sqh, skt, skh, svt, svh,
             sot, soh, win_left, win_right, softcap, alibi_ptr, sinks_ptr, bt_ptr, bt_stride, skb, svb, k_scale,
             v_scale, HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
             SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, SINKS: tl.constexpr, PAGED: tl.constexpr,
             BLOCK_SIZE: tl.constexpr, KV_FP8: tl.constexpr, KV_DESC: tl.constexpr, BLOCK_M: tl.constexpr,
             BLOCK_N: tl.constexpr, DOT_PREC: tl.constexpr):
    # grid = (query blocks of the longest sequence, heads, sequences).  Program (i, h, b) takes
    # query block (last - i) of sequence b, head h: under a causal mask the longest blocks start
    # first.  Lengths are read from cu_q / cu_k, never passed as arguments: a new length
    # compiles nothing.  HEAD_PAD: the tile's width, the power of two at least HEAD_DIM.
    # The features (flash-attn's semantics; each off costs nothing, its code is not compiled):
    # WINDOW, row i sees keys diag_i - win_left <= j <= diag_i + win_right (diag_i = i + k_len -
    # q_len), and only the key tiles that meet a row's window are read; SOFTCAP, scores are
    # softcap * tanh(scores / softcap); ALIBI, -slope_h * |diag_i - j| is added; SINKS, head h's
    # logit sinks[h] joins the softmax denominator.  PAGED (flash-attn's block_table): k_ptr and
    # v_ptr are paged caches, sequence b's key j at block bt[b, j // BLOCK_SIZE], and cu_k gives
    # the lengths only.  KV_FP8: e4m3fn K/V, dequantized as fp8 * k_scale (folded into sm_scale)
    # and fp8 * v_scale (applied to the output).  KV_DESC (neither PAGED nor KV_FP8, HEAD_PAD ==
    # HEAD_DIM): k_ptr and v_ptr are TMA descriptors over K and V viewed as [total_k, num_kv_heads
    # * head_dim], tiles of BLOCK_N x HEAD_DIM (the strides skt, skh, svt, svh are theirs).
    m_block = tl.num_programs(0) - 1 - tl.program_id(0)
    head = tl.program_id(1)
    seq = tl.program_id(2)
    q_start = tl.load(cu_q + seq)
    q_len = tl.load(cu_q + seq + 1) - q_start
    if m_block * BLOCK_M >= q_len:
        return
    k_start = tl.load(cu_k + seq)
    k_len = tl.load(cu_k + seq + 1) - k_start
    kv_head = head // group
    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_PAD)
    d_ok = offs_d < HEAD_DIM
    in_q = offs_m < q_len
    q_rows = (q_start + offs_m).to(tl.int64)
    if HEAD_PAD != HEAD_DIM:
        q_mask = in_q[:, None] & d_ok[None, :]
    else:
        q_mask = in_q[:, None]
    q = tl.load(q_ptr + q_rows[:, None] * sqt + head * sqh + offs_d[None, :], mask=q_mask, other=0.0)
    desc_col = kv_head * HEAD_DIM
    if KV_DESC:
        k_base = k_ptr
        v_base = v_ptr
        bt_row = bt_ptr
    elif PAGED:
        k_base = k_ptr + kv_head * skh
        v_base = v_ptr + kv_head * svh
        bt_row = bt_ptr + seq.to(tl.int64) * bt_stride
    else:
        k_base = k_ptr + k_start.to(tl.int64) * skt + kv_head * skh
        v_base = v_ptr + k_start.to(tl.int64) * svt + kv_head * svh
        bt_row = bt_ptr
    if KV_FP8:
        sm_scale = sm_scale * tl.load(k_scale)
    qk_scale = sm_scale * 1.4426950408889634
    if ALIBI:
        slope = tl.load(alibi_ptr + head).to(tl.float32) * 1.4426950408889634
    else:
        slope = 0.0
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_PAD], dtype=tl.float32)
    # Bottom-right causal alignment: row i sees keys j <= i + k_len - q_len.
    shift = k_len - q_len
    diag = offs_m + shift
    if WINDOW:
        # The key tiles that meet some row's window [diag - win_left, diag + win_right] (CAUSAL:
        # win_right is 0), in three runs: masked tiles across the window's left edge, unmasked
        # tiles every row sees whole, masked tiles across its right edge (the diagonal) and the
        # end of the keys.  Tile starts stay multiples of BLOCK_N from lo's tile.
        first_diag = m_block * BLOCK_M + shift
        lo = (tl.maximum(first_diag - win_left, 0) // BLOCK_N) * BLOCK_N
        hi = tl.minimum(k_len, first_diag + BLOCK_M + win_right)
        # Keys every row sees: j >= the last row's left bound, j <= the first row's right bound.
        full_lo = tl.maximum(first_diag + BLOCK_M - 1 - win_left, 0)
        full_lo = lo + tl.cdiv(tl.maximum(full_lo - lo, 0), BLOCK_N) * BLOCK_N
        full_hi = tl.minimum(first_diag + win_right + 1, k_len)
        full_hi = tl.maximum(lo + (tl.maximum(full_hi - lo, 0) // BLOCK_N) * BLOCK_N, full_lo)
        edge = tl.minimum(full_lo, full_hi)
        for start in range(lo, tl.minimum(edge, hi), BLOCK_N):
            acc, m_i, l_i = _prefill_tile(acc, m_i, l_i, q, k_base, v_base, skt, svt, start, k_len, diag, qk_scale,
                                          sm_scale, softcap, slope, win_left, win_right, offs_n, offs_d, d_ok, bt_row,
                                          skb, svb, k_start, desc_col, True, CAUSAL, DOT_PREC, HEAD_PAD != HEAD_DIM,
                                          True, SOFTCAP, ALIBI, PAGED, BLOCK_SIZE, KV_FP8, KV_DESC)
        for start in range(edge, full_hi, BLOCK_N):
            acc, m_i, l_i = _prefill_tile(acc, m_i, l_i, q, k_base, v_base, skt, svt, start, k_len, diag, qk_scale,
                                          sm_scale, softcap, slope, win_left, win_right, offs_n, offs_d, d_ok, bt_row,
                                          skb, svb, k_start, desc_col, False, CAUSAL, DOT_PREC, HEAD_PAD != HEAD_DIM,
                                          True, SOFTCAP, ALIBI, PAGED, BLOCK_SIZE, KV_FP8, KV_DESC)
        for start in range(tl.maximum(full_hi, edge), hi, BLOCK_N):
            acc, m_i, l_i = _prefill_tile(acc, m_i, l_i, q, k_base, v_base, skt, svt, start, k_len, diag, qk_scale,
                                          sm_scale, softcap, slope, win_left, win_right, offs_n, offs_d, d_ok, bt_row,
                                          skb, svb, k_start, desc_col, True, CAUSAL, DOT_PREC, HEAD_PAD != HEAD_DIM,
                                          True, SOFTCAP, ALIBI, PAGED, BLOCK_SIZE, KV_FP8, KV_DESC)
    else:
        if CAUSAL:
            hi = tl.minimum(k_len, (m_block + 1) * BLOCK_M + shift)
            # Keys every row of the block sees: j <= first row + shift.
            whole = tl.minimum(hi, m_block * BLOCK_M + shift + 1)
        else:
            hi = k_len
            whole = k_len
        whole = (tl.maximum(whole, 0) // BLOCK_N) * BLOCK_N
        for start in range(0, whole, BLOCK_N):
            acc, m_i, l_i = _prefill_tile(acc, m_i, l_i, q, k_base, v_base, skt, svt, start, k_len, diag, qk_scale,
                                          sm_scale, softcap, slope, win_left, win_right, offs_n, offs_d, d_ok, bt_row,
                                          skb, svb, k_start, desc_col, False, CAUSAL, DOT_PREC, HEAD_PAD != HEAD_DIM,
                                          False, SOFTCAP, ALIBI, PAGED, BLOCK_SIZE, KV_FP8, KV_DESC)
        for start in range(whole, hi, BLOCK_N):
            acc, m_i, l_i = _prefill_tile(acc, m_i, l_i, q, k_base, v_base, skt, svt, start, k_len, diag, qk_scale,
                                          sm_scale, softcap, slope, win_left, win_right, offs_n, offs_d, d_ok, bt_row,
                                          skb, svb, k_start, desc_col, True, CAUSAL, DOT_PREC, HEAD_PAD != HEAD_DIM,
                                          False, SOFTCAP, ALIBI, PAGED, BLOCK_SIZE, KV_FP8, KV_DESC)
    if SINKS:
        acc, m_i, l_i = _sink(acc, m_i, l_i, tl.load(sinks_ptr + head).to(tl.float32) * 1.4426950408889634)
    out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    if KV_FP8:
        out = out * tl.load(v_scale)
    tl.store(o_ptr + q_rows[:, None] * sot + head * soh + offs_d[None, :], out.to(o_ptr.dtype.element_ty),
             mask=q_mask)


@triton.jit
def decode_body(q_ptr, kc_ptr, vc_ptr, bt_ptr, sl_ptr, o_ptr, part_o, part_m, part_l, sm_scale, group,
            bt_stride, v1_limit, torch_limit, partition_size, max_parts, sqs, sqh, skb, skt, skh, svb,
            svt, svh, sos, soh, win_len, softcap, alibi_ptr, sinks_ptr, k_scale, v_scale, HEAD_DIM: tl.constexpr,
            HEAD_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, Q_ROWS: tl.constexpr, WINDOW: tl.constexpr,
            SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, SINKS: tl.constexpr, KV_FP8: tl.constexpr,
            BLOCK_N: tl.constexpr, DOT_PREC: tl.constexpr, FP8_VIA_F16: tl.constexpr, PDL: tl.constexpr = False,
            V_PAIRS: tl.constexpr = False):
    # grid = (sequences, KV heads, partitions).  One program serves the `group` query heads of
    # one KV head (their rows padded to Q_ROWS for the tensor cores), so a KV tile is read once
    # per group.  A sequence's context is its last `span` tokens: all of them, or (WINDOW) the
    # last win_len, so a window's blocks are the only ones read.  A context of at most v1_limit
    # tokens is V1: partition 0 covers it whole and writes the output.  A longer one is V2:
    # partition p covers its tokens [p * partition_size, (p + 1) * partition_size) and writes its
    # normalised partial output and its softmax state for _merge.  A context longer than
    # torch_limit is left to the PyTorch path.  SOFTCAP, ALIBI (vLLM's slope * (j - seq_len + 1))
    # and SINKS (in partition 0's state) as in prefill_body.  KV_FP8 (vLLM's fp8 cache): e4m3fn tiles
    # converted to the query's dtype after the load, k_scale folded into the logits scale and
    # v_scale into the output (before a V2 partial is stored: the merge is linear in it).
    # FP8_VIA_F16 (bf16 queries over an fp8 cache): the tiles become fp16, not bf16 (_fp16_query).
    # V_PAIRS (an fp8 cache whose V rows are 2-byte aligned): V is read as 16-bit words, two
    # head_dim columns of a token each, and its even and odd columns are two P V dots of half the
    # width, interleaved once at the end.  The P V dot reduces over tokens, which the cache keeps
    # apart; read as bytes, V reached the dot through one shared-memory load a byte (128 a thread
    # a tile, the fp8 decode's limit), as words it arrives through ldmatrix.trans (an H200 at
    # head_dim 128, batch 32 x 8k: 0.67 -> 0.78 of copy; bench/RESULTS.md).
    # PDL (Hopper and later): the merge, launched after this kernel as a programmatic dependent
    # launch, may be scheduled as soon as every program here has started; it waits on the device
    # for this kernel to finish before it reads.
    if PDL:
        gdc_launch_dependents()
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    part = tl.program_id(2)
    seq_len = tl.load(sl_ptr + seq)
    if WINDOW:
        span = tl.minimum(seq_len, win_len)
        first = seq_len - span
    else:
        span = seq_len
        first = 0
    is_v2 = span > v1_limit
    start = first + tl.where(is_v2, part * partition_size, 0)
    end = tl.where(is_v2, tl.minimum(start + partition_size, seq_len), seq_len)
    skip = (span > torch_limit) | ((span <= v1_limit) & (part > 0)) | (is_v2 & (start >= seq_len))
    if skip:
        return
    offs_g = tl.arange(0, Q_ROWS)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_PAD)
    d_ok = offs_d < HEAD_DIM
    in_group = offs_g < group
    if HEAD_PAD != HEAD_DIM:
        g_mask = in_group[:, None] & d_ok[None, :]
    else:
        g_mask = in_group[:, None]
    heads = kv_head * group + offs_g
    seq64 = seq.to(tl.int64)
    q = tl.load(q_ptr + seq64 * sqs + heads[:, None] * sqh + offs_d[None, :], mask=g_mask, other=0.0)
    bt_row = bt_ptr + seq64 * bt_stride
    k_head = kc_ptr + kv_head * skh
    v_head = vc_ptr + kv_head * svh
    if KV_FP8:
        sm_scale = sm_scale * tl.load(k_scale)
        if FP8_VIA_F16:
            if q.dtype == tl.bfloat16:
                q, sm_scale = _fp16_query(q, sm_scale)
    qk_scale = sm_scale * 1.4426950408889634
    if ALIBI:
        slopes = tl.load(alibi_ptr + heads, mask=in_group, other=0.0).to(tl.float32) * 1.4426950408889634
    m_i = tl.full([Q_ROWS], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([Q_ROWS], dtype=tl.float32)
    acc = tl.zeros([Q_ROWS, HEAD_PAD], dtype=tl.float32)
    if V_PAIRS:
        offs_w = tl.arange(0, HEAD_PAD // 2)
        w_ok = offs_w < HEAD_DIM // 2
        v_words = vc_ptr.to(tl.pointer_type(tl.int16), bitcast=True) + (kv_head * svh) // 2
        acc_even = tl.zeros([Q_ROWS, HEAD_PAD // 2], dtype=tl.float32)
        acc_odd = tl.zeros([Q_ROWS, HEAD_PAD // 2], dtype=tl.float32)
    for tok0 in range(start, end, BLOCK_N):
        toks = tok0 + offs_n
        live = toks < end
        block = tl.load(bt_row + toks // BLOCK_SIZE, mask=live, other=0).to(tl.int64)
        slot = toks % BLOCK_SIZE
        if HEAD_PAD != HEAD_DIM:
            kv_mask = live[:, None] & d_ok[None, :]
        else:
            kv_mask = live[:, None]
        k = tl.load(k_head + block[:, None] * skb + slot[:, None] * skt + offs_d[None, :], mask=kv_mask, other=0.0)
        if KV_FP8:
            k = k.to(q.dtype)
        s = _logits(q, k, qk_scale, sm_scale, softcap, DOT_PREC, SOFTCAP)
        if ALIBI:
            s = s + slopes[:, None] * (toks - (seq_len - 1)).to(tl.float32)[None, :]
        s = tl.where(live[None, :], s, float("-inf"))
        if V_PAIRS:
            rows = (block * svb + slot * svt) // 2
            w = tl.load(v_words + rows[:, None] + offs_w[None, :], mask=live[:, None] & w_ok[None, :], other=0)
            v_even, v_odd = _fp8_pairs(w, q.dtype)
            p, alpha, m_i, l_i = _softmax_weights(m_i, l_i, s, 1.0)
            p = p.to(q.dtype)
            acc_even = tl.dot(p, v_even, acc_even * alpha[:, None], input_precision=DOT_PREC)
            acc_odd = tl.dot(p, v_odd, acc_odd * alpha[:, None], input_precision=DOT_PREC)
        else:
            v = tl.load(v_head + block[:, None] * svb + slot[:, None] * svt + offs_d[None, :], mask=kv_mask,
                        other=0.0)
            if KV_FP8:
                v = v.to(q.dtype)
            acc, m_i, l_i = _online_softmax_step(acc, m_i, l_i, s, v, 1.0, DOT_PREC)
    if V_PAIRS:
        # Columns 2i and 2i + 1 from acc_even's and acc_odd's column i.
        acc = tl.reshape(tl.join(acc_even, acc_odd), (Q_ROWS, HEAD_PAD))
    if SINKS:
        sink = tl.load(sinks_ptr + heads, mask=in_group, other=float("-inf")).to(tl.float32) * 1.4426950408889634
        acc, m_i, l_i = _sink(acc, m_i, l_i, tl.where(part == 0, sink, float("-inf")))
    out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    if KV_FP8:
        out = out * tl.load(v_scale)
    if span <= v1_limit:
        tl.store(o_ptr + seq64 * sos + heads[:, None] * soh + offs_d[None, :], out.to(o_ptr.dtype.element_ty),
                 mask=g_mask)
    else:
        # Partials of (sequence, head, partition) at ((seq * heads + head) * max_parts + part).
        idx = (seq64 * (group * tl.num_programs(1)) + heads) * max_parts + part
        tl.store(part_o + idx[:, None] * HEAD_DIM + offs_d[None, :], out, mask=g_mask)
        tl.store(part_m + idx, m_i, mask=in_group)
        tl.store(part_l + idx, l_i, mask=in_group)


@triton.jit(do_not_specialize=["v1_limit", "torch_limit", "partition_size", "max_parts"])
def _merge(o_ptr, part_o, part_m, part_l, sl_ptr, v1_limit, torch_limit, partition_size, max_parts, sos,
           soh, HEAD_DIM: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr = False):
    # grid = (sequences, heads, cdiv(HEAD_DIM, BLOCK_D)): the log-sum-exp merge of a V2
    # sequence's partitions, BLOCK_D columns of one head a program, in one pass over BLOCK_P
    # partitions a step.  Partition p weighs l_p * 2^(m_p - M) with M the largest m_p (base 2),
    # kept as a running maximum: the sums so far are rescaled by 2^(M_old - M_new) when it grows.
    # The output is the weighted mean of the partitions' normalised outputs.  Exact up to
    # rounding.  sl_ptr: each sequence's context length (the decode kernel's span: a windowed
    # call's lengths clamped to its window).  PDL: launched as a programmatic dependent launch of
    # the decode kernel, whose partials it waits for.
    if PDL:
        gdc_wait()
    seq = tl.program_id(0)
    head = tl.program_id(1)
    span = tl.load(sl_ptr + seq)
    if (span <= v1_limit) | (span > torch_limit):
        return
    n_parts = tl.cdiv(span, partition_size)
    base = (seq.to(tl.int64) * tl.num_programs(1) + head) * max_parts
    offs_p = tl.arange(0, BLOCK_P)
    offs_d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    if HEAD_DIM % BLOCK_D != 0:
        d_ok = offs_d < HEAD_DIM
    else:
        d_ok = offs_d >= 0
    m_run = tl.full([1], -1.0e30, dtype=tl.float32)
    w_sum = tl.zeros([1], dtype=tl.float32)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for p0 in range(0, n_parts, BLOCK_P):
        p = p0 + offs_p
        live = p < n_parts
        m = tl.load(part_m + base + p, mask=live, other=-1.0e30)
        w = tl.load(part_l + base + p, mask=live, other=0.0)
        o = tl.load(part_o + (base + p)[:, None] * HEAD_DIM + offs_d[None, :], mask=live[:, None] & d_ok[None, :],
                    other=0.0)
        m_new = tl.maximum(m_run, tl.max(m, 0))
        rescale = tl.math.exp2(m_run - m_new)
        w = w * tl.math.exp2(m - m_new)
        acc = acc * rescale + tl.sum(o * w[:, None], 0)
        w_sum = w_sum * rescale + tl.sum(w, 0)
        m_run = m_new
    tl.store(o_ptr + seq.to(tl.int64) * sos + head * soh + offs_d, (acc / w_sum).to(o_ptr.dtype.element_ty), mask=d_ok)


# ---------------------------------------------------------------------------------------
# Records of the generated kernels and tables.


@dataclass(frozen=True)
class PrefillKernel:
    """One specialized prefill kernel of generated/attention.py and the constants it bakes in."""

    kernel: Any
    # "16bit" (fp16 and bf16 inputs) or "fp32".
    dtype_class: str
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int

    @property
    def name(self) -> str:
        return self.kernel.__name__


@dataclass(frozen=True)
class DecodeKernel:
    """One specialized paged-decode kernel of generated/attention.py and its constants."""

    kernel: Any
    dtype_class: str
    block_n: int
    num_warps: int
    num_stages: int

    @property
    def name(self) -> str:
        return self.kernel.__name__


@dataclass(frozen=True)
class Policy:
    """A target's AttentionConfig record for one dtype and model, and the prefill kernel built
    from its tiles (for fp32 inputs: half as many key rows, the same bytes of K/V staging)."""

    config: Any
    prefill: PrefillKernel


@dataclass(frozen=True)
class Decode:
    """A target's AttentionLaunch record for one element size and head_dim, and its decode kernel."""

    launch: Any
    kernel: DecodeKernel


@dataclass(frozen=True)
class Selected:
    """What serves a call: the target, the model whose records serve its head_dim, the
    AttentionConfig record (prefill tiles, decode thresholds, native flags), the AttentionLaunch
    record (decode tiles, prefill's K/V loads) and the two kernels."""

    target: str
    model: str
    config: Any
    launch: Any
    prefill: PrefillKernel
    decode: DecodeKernel
    # The model's AttentionFeatures record on the target (None where the tables have none).
    features: Any = None


# Table keys of the dtypes a call may have.
_DTYPE_KEY = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}
_CLASS_OF = {"float16": "16bit", "bfloat16": "16bit", "float32": "fp32"}

# A vendor decode kernel: called with keyword arguments out, query, key_cache, value_cache,
# block_tables, seq_lens, scale, max_seq_len; writes out.
NativeDecode = Callable[..., Any]


# ---------------------------------------------------------------------------------------
# Checks on a call.


def _tensor(op: str, name: str, t: Any, dims: int, what: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{op}: {name} must be a tensor {what}, got {type(t).__name__}")
    if t.dim() != dims:
        raise ValueError(f"{op}: {name} must be {what}, got shape {tuple(t.shape)}")
    return t


def _float_dtype(op: str, name: str, t: torch.Tensor) -> str:
    key = _DTYPE_KEY.get(t.dtype)
    if key is None:
        raise ValueError(f"{op}: {name} has dtype {t.dtype}; expected float16, bfloat16 or float32")
    return key


def _same_dtype(op: str, name: str, t: torch.Tensor, ref: torch.Tensor, ref_name: str) -> None:
    if t.dtype != ref.dtype:
        raise ValueError(f"{op}: {name} has dtype {t.dtype}, {ref_name} {ref.dtype}; they must match")


def _unit_last(op: str, name: str, t: torch.Tensor) -> None:
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{op}: {name} {tuple(t.shape)} needs unit stride in its last dim, got strides {t.stride()}")


def _same_device(op: str, name: str, t: torch.Tensor, ref: torch.Tensor, ref_name: str) -> None:
    if t.device != ref.device:
        raise ValueError(f"{op}: {name} is on {t.device}, {ref_name} on {ref.device}; they must be on one device")


def _index(op: str, name: str, t: Any, what: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int32:
        got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{op}: {name} must be an int32 tensor {what}, got {got}")
    return t


def _length(op: str, name: str, n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"{op}: {name} must be an int >= 0, got {n!r}")
    return n


def _scale(op: str, scale: Any, head_dim: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"{op}: scale must be a finite float or None, got {scale!r}")
    return float(scale)


def _out(op: str, out: Any, shape: tuple[int, ...], ref: torch.Tensor, ref_name: str) -> torch.Tensor:
    if out is None:
        return torch.empty(shape, dtype=ref.dtype, device=ref.device)
    if not isinstance(out, torch.Tensor):
        raise ValueError(f"{op}: out must be a tensor, got {type(out).__name__}")
    if tuple(out.shape) != shape:
        raise ValueError(f"{op}: out must have shape {shape}, got {tuple(out.shape)}")
    _same_dtype(op, "out", out, ref, ref_name)
    _same_device(op, "out", out, ref, ref_name)
    _unit_last(op, "out", out)
    return out


def _tile_width(head_dim: int) -> int:
    # The kernels' tile across the head: the power of two at least head_dim (and 16, a
    # tensor-core step); columns past head_dim are masked, never read or written.
    return max(16, _launch.pow2ceil(head_dim))


@dataclass(frozen=True)
class Features:
    """A call's attention features, checked: ``window`` (left, right) as flash-attn's
    ``window_size`` (-1 unbounded), ``softcap`` (0.0: none), ``alibi`` and ``sinks`` (fp32 [num_heads]
    on the call's device, or None)."""

    window: tuple[int, int]
    softcap: float
    alibi: Optional[torch.Tensor]
    sinks: Optional[torch.Tensor]

    @property
    def used(self) -> bool:
        return self.window != (-1, -1) or self.softcap > 0.0 or self.alibi is not None or self.sinks is not None

    @property
    def uses(self) -> frozenset[str]:
        """The features the call uses, by the names ``record_uses`` gives a model's."""
        if not self.used:
            return _NO_FEATURES
        names = (("window", self.window != (-1, -1)), ("softcap", self.softcap > 0.0),
                 ("alibi", self.alibi is not None), ("sinks", self.sinks is not None))  # fmt: skip
        return frozenset(n for n, on in names if on)

    def torch_scores(self, scores: torch.Tensor, tok0: int, n: int, first: int, Hkv: int, G: int) -> torch.Tensor:
        """The PyTorch decode path's scores [Hkv, G, tokens] of keys tok0... (scaled) with the
        soft-cap, ALiBi bias and window mask the kernels apply."""
        if self.softcap > 0.0:
            scores = torch.tanh(scores / self.softcap) * self.softcap
        pos = torch.arange(tok0, tok0 + scores.shape[-1], device=scores.device)
        if self.alibi is not None:
            scores = scores + self.alibi.view(Hkv, G, 1) * (pos - (n - 1)).float()
        if first > 0:
            scores = scores.masked_fill(pos < first, -math.inf)
        return scores


_NO_FEATURES: frozenset[str] = frozenset()


def record_uses(record: Any) -> frozenset[str]:
    """The features an AttentionFeatures record enables: "window", "softcap", "alibi", "sinks"."""
    names = (("window", record.sliding_window > 0), ("softcap", record.softcap > 0.0), ("alibi", record.alibi),
             ("sinks", record.sinks))  # fmt: skip
    return frozenset(n for n, on in names if on)


def _features(op: str, ref_name: str, ref: torch.Tensor, H: int, window_size: Any, softcap: Any, alibi: Any,
              sinks: Any) -> Features:
    ok = (isinstance(window_size, (tuple, list)) and len(window_size) == 2
          and all(isinstance(w, int) and not isinstance(w, bool) and w >= -1 for w in window_size))  # fmt: skip
    if not ok:
        raise ValueError(f"{op}: window_size must be (left, right), ints >= -1 (-1: unbounded), got {window_size!r}")
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or not math.isfinite(softcap) or softcap < 0:
        raise ValueError(f"{op}: softcap must be a finite float >= 0 (0: none), got {softcap!r}")
    vectors = []
    for name, t in (("alibi_slopes", alibi), ("sinks", sinks)):
        if t is not None:
            if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or tuple(t.shape) != (H,):
                got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"{op}: {name} must be a float32 tensor [num_heads={H}], got {got}")
            _same_device(op, name, t, ref, ref_name)
        vectors.append(_unit_stride(t))
    return Features((int(window_size[0]), int(window_size[1])), float(softcap), vectors[0], vectors[1])


# ---------------------------------------------------------------------------------------
# The entry points over one generated module's tables.


class Attention:
    """prefill_attention, decode_attention, select and register_native_decode of
    generated/attention.py, over its tables.

    ``policies``: dtype name ("float16", "bfloat16", "float32") -> model -> target -> Policy.
    ``decode``: element class ("16bit", "fp32") -> head_dim -> target -> Decode.
    ``model_of_head_dim``: tile head_dim -> the model whose AttentionConfig records serve it.
    A call's head_dim may be any multiple of 8 up to the widest tile: its kernels run the
    smallest tile at least as wide (the tile is padded, not the tensors), with that tile's
    records, whose shared-memory checks were made for the tile.
    ``model_head_dim``: model -> its head_dim; ``features``: model -> target -> its
    AttentionFeatures.  A call with features runs the records of a model of its tile whose
    features include the call's (their register checks counted them; the fewest extra
    features, then the tile's own model, then by name); a call with features no such model uses
    runs the tile's records, its kernel specialization compiled on first use.
    ``hardware``: target -> hardware record (its sm_count sizes the PyTorch path's tiles).
    ``target_name(hw, device)``: the spec name a call launches for.
    ``decode_fp8``: query class -> head_dim -> target -> Decode over an FP8 (e4m3fn) KV cache;
    ``fp8_unserved``: target -> the feature it lacks for one (an fp8 cache raises ValueError there).
    """

    def __init__(
        self,
        *,
        policies: Mapping[str, Mapping[str, Mapping[str, Policy]]],
        decode: Mapping[str, Mapping[int, Mapping[str, Decode]]],
        model_of_head_dim: Mapping[int, str],
        hardware: Mapping[str, Any],
        target_name: Callable[[Any, Any], str],
        decode_fp8: Optional[Mapping[str, Mapping[int, Mapping[str, Decode]]]] = None,
        fp8_unserved: Optional[Mapping[str, str]] = None,
        model_head_dim: Optional[Mapping[str, int]] = None,
        features: Optional[Mapping[str, Mapping[str, Any]]] = None,
    ) -> None:
        missing = [k for k in _DTYPE_KEY.values() if k not in policies] + [
            k for k in ("16bit", "fp32") if k not in decode
        ]
        if missing:
            raise ValueError(f"Attention: tables missing for {missing}")
        self.policies = policies
        self.decode_tables = decode
        self.model_of_head_dim = dict(model_of_head_dim)
        self.head_dims = tuple(sorted(self.model_of_head_dim))
        self.hardware = hardware
        self.target_name = target_name
        self.model_head_dim = dict(model_head_dim or {})
        self.features = features or {}
        # (tile, target, features) -> the model whose records serve such calls.
        self._feature_models: dict[tuple[int, str, frozenset[str]], str] = {}
        self.native: dict[int, Optional[NativeDecode]] = {1: None, 2: None}
        # Counts register_native's calls: in decode's call-cache key (a plan of Triton launches
        # stands for a call whose vendor kernel is registered later no more).
        self._native_epoch = 0
        self.decode_fp8_tables = decode_fp8 or {}
        self.fp8_unserved = dict(fp8_unserved or {})

    # -- tables ---------------------------------------------------------------------------

    def select(self, dtype: torch.dtype, head_dim: int, hw: Any = None, device: Any = None,
               uses: frozenset[str] = _NO_FEATURES, kv_fp8: bool = False) -> Selected:
        """The records and kernels that serve calls of ``dtype`` and ``head_dim`` on a target,
        using the features ``uses`` ("window", "softcap", "alibi", "sinks"; none by default);
        ``kv_fp8``: over an FP8 KV cache, whose decode tiles are AttentionLaunchFp8's."""
        key = _DTYPE_KEY.get(dtype)
        if key is None:
            raise ValueError(f"attention: dtype {dtype} is not served; expected float16, bfloat16 or float32")
        tile = self.tile_of(head_dim)
        if tile is None:
            raise ValueError(f"attention: head_dim {head_dim} is not served; {self.served()}")
        model = self.model_of_head_dim[tile]
        target = self.target_name(hw, device)
        if uses:
            model = self._model_using(tile, target, frozenset(uses), model)
        policy = self.policies[key][model][target]
        if kv_fp8:
            missing = self.fp8_unserved.get(target)
            if missing is not None or target not in self.decode_fp8_tables.get(_CLASS_OF[key], {}).get(tile, {}):
                served = sorted(self.decode_fp8_tables.get("16bit", {}).get(tile, {}))
                raise unserved_error("attention", target, missing or "fp8_e4m3fn",
                                     "specs/kernels/attention.toml's attention_launch_fp8", served)
            dec = self.decode_fp8_tables[_CLASS_OF[key]][tile][target]
        else:
            dec = self.decode_tables[_CLASS_OF[key]][tile][target]
        feat = self.features.get(model, {}).get(target)
        return Selected(target, model, policy.config, dec.launch, policy.prefill, dec.kernel, feat)

    def _model_using(self, tile: int, target: str, uses: frozenset[str], default: str) -> str:
        # The model of this tile whose features include ``uses``: the fewest extra ones, then
        # the tile's own model, then by name; none: the tile's own model.
        key = (tile, target, uses)
        found = self._feature_models.get(key)
        if found is None:
            ranked = []
            for model, head_dim in self.model_head_dim.items():
                record = self.features.get(model, {}).get(target)
                if record is None or self.tile_of(head_dim) != tile:
                    continue
                has = record_uses(record)
                if uses <= has:
                    ranked.append((len(has - uses), model != default, model))
            found = min(ranked)[2] if ranked else default
            self._feature_models[key] = found
        return found

    def tile_of(self, head_dim: Any) -> Optional[int]:
        """The tile width (a head_dim of the tables) that serves ``head_dim``: the smallest at
        least as wide, for a multiple of 8; None where none does."""
        if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 8 or head_dim % 8:
            return None
        return next((t for t in self.head_dims if t >= head_dim), None)

    def served(self) -> str:
        return f"the kernels serve multiples of 8 up to {self.head_dims[-1]} (tiles {list(self.head_dims)})"

    def register_native(self, version: int, fn: Optional[NativeDecode]) -> Optional[NativeDecode]:
        """Register (or with None remove) the vendor decode kernel of ``version`` (1 or 2);
        returns the one it replaces."""
        if version not in (1, 2):
            raise ValueError(f"register_native_decode: version must be 1 or 2, got {version!r}")
        if fn is not None and not callable(fn):
            raise ValueError(f"register_native_decode: fn must be callable or None, got {type(fn).__name__}")
        old = self.native[version]
        self.native[version] = fn
        self._native_epoch += 1
        return old

    # -- prefill --------------------------------------------------------------------------

    def prefill(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=True,
                scale=None, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, sinks=None, out=None, hw=None,
                block_table=None, k_scale=None, v_scale=None,
                kernel: Optional[PrefillKernel] = None, kv_tma: Optional[bool] = None) -> torch.Tensor:
        """Varlen flash attention (generated/attention.py's prefill_attention).  ``kernel``
        (tests, benchmarks) runs that prefill kernel instead of the target's; ``kv_tma`` (tests,
        benchmarks) asks for (True) or refuses (False) TMA descriptors for K and V where the call
        allows them (default: the AttentionLaunch record's ``prefill_kv_tma``; with ``kernel``,
        False).  A call of a class seen before replays its launch (policy_runtime/call_cache.py): the launch depends on
        max_seqlen_q / max_seqlen_k (in the key), never on cu_seqlens' contents, which a CPU
        call's hit checks again as the full path does."""
        args = (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
        opts = (causal, scale, window_size, softcap, alibi_slopes, sinks, out, hw, block_table, k_scale, v_scale)
        if kernel is not None or kv_tma is not None:
            return self._prefill(*args, *opts, kernel, kv_tma)[0]
        ck, plan = lookup(
            _PREFILL_CALLS,
            q,
            lambda: (
                id(self), hw, tensor_key(q), tensor_key(k), tensor_key(v), tensor_key(cu_seqlens_q),
                tensor_key(cu_seqlens_k), cu_seqlens_q is cu_seqlens_k, k_scale is v_scale,
                args_key(max_seqlen_q, max_seqlen_k, causal, scale, window_size, softcap, alibi_slopes, sinks, out,
                         block_table, k_scale, v_scale),
            ),
        )  # fmt: skip
        if plan is not None and plan is not NO_PLAN:
            return _prefill_hit(plan, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes,
                                sinks, out, block_table, k_scale, v_scale)
        if ck is None or plan is NO_PLAN:
            return self._prefill(*args, *opts, None, None)[0]
        with _PREFILL_CALLS.record() as rec:
            out, cls = self._prefill(*args, *opts, None, None)
        _PREFILL_CALLS.commit(rec, ck, cls[0] if cls else (), data=cls[1] if cls else None)
        return out

    def _prefill(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale,
                 window_size, softcap, alibi_slopes, sinks, out, hw, block_table, k_scale, v_scale,
                 kernel, kv_tma) -> tuple[torch.Tensor, Optional[tuple]]:
        # The full path: (out, (the named tensors of its launch, _PrefillClass)), or (out, None)
        # where it launched nothing.
        op = "prefill_attention"
        paged = block_table is not None
        _tensor(op, "q", q, 3, "[total_q, num_heads, head_dim]")
        if paged:
            _tensor(op, "k", k, 4, "a paged cache [num_blocks, block_size, num_kv_heads, head_dim] (block_table)")
            _tensor(op, "v", v, 4, "a paged cache [num_blocks, block_size, num_kv_heads, head_dim] (block_table)")
        else:
            _tensor(op, "k", k, 3, "[total_k, num_kv_heads, head_dim]")
            _tensor(op, "v", v, 3, "[total_k, num_kv_heads, head_dim]")
        dkey = _float_dtype(op, "q", q)
        kv_fp8 = _kv_dtype(op, ("k", k), ("v", v), q, "q")
        bf16 = _launch.interpreted_bf16_dots(q)  # an fp8 cache's tiles become q's dtype too
        if bf16 is not None:
            raise ValueError(f"{op}: q is {bf16}")
        total_q, H, D = q.shape
        total_k, Hkv, Dk = (k.shape[0] * k.shape[1], *k.shape[2:]) if paged else k.shape
        if tuple(v.shape) != tuple(k.shape):
            raise ValueError(f"{op}: v {tuple(v.shape)} must have k's shape {tuple(k.shape)}")
        if Dk != D:
            raise ValueError(f"{op}: k has head_dim {Dk}, q {D}; they must match")
        if Hkv == 0 or H % Hkv:
            raise ValueError(f"{op}: q's {H} heads must be a multiple of k's {Hkv} KV heads")
        if self.tile_of(D) is None:
            raise ValueError(f"{op}: q has head_dim {D}; {self.served()}")
        for name, t in (("q", q), ("k", k), ("v", v)):
            _unit_last(op, name, t)
        _index(op, "cu_seqlens_q", cu_seqlens_q, "[batch + 1]")
        _index(op, "cu_seqlens_k", cu_seqlens_k, "[batch + 1]")
        if cu_seqlens_q.dim() != 1 or cu_seqlens_q.shape[0] < 1 or cu_seqlens_k.shape != cu_seqlens_q.shape:
            raise ValueError(
                f"{op}: cu_seqlens_q {tuple(cu_seqlens_q.shape)} and cu_seqlens_k {tuple(cu_seqlens_k.shape)} "
                "must both be 1-D of batch + 1 entries"
            )
        max_q = _length(op, "max_seqlen_q", max_seqlen_q)
        _length(op, "max_seqlen_k", max_seqlen_k)
        sm_scale = _scale(op, scale, D)
        for name, t in (("k", k), ("v", v), ("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
            _same_device(op, name, t, q, "q")
        feat = _features(op, "q", q, H, window_size, softcap, alibi_slopes, sinks)
        scales = _kv_scales(op, kv_fp8, k_scale, v_scale, q.device)
        batch = cu_seqlens_q.shape[0] - 1
        bs = k.shape[1] if paged else 1
        if paged:
            _index(op, "block_table", block_table, "[batch, max_blocks]")
            if block_table.dim() != 2 or block_table.shape[0] != batch:
                raise ValueError(
                    f"{op}: block_table must be [batch={batch}, max_blocks], got {tuple(block_table.shape)}"
                )
            _unit_last(op, "block_table", block_table)
            _same_device(op, "block_table", block_table, q, "q")
            if bs < 1:
                raise ValueError(f"{op}: k has block_size {bs}")
        out = _out(op, out, (total_q, H, D), q, "q")
        _launch.check_runnable(op, "q", q)
        if batch > _MAX_GRID_YZ:
            raise ValueError(f"{op}: {batch} sequences; at most {_MAX_GRID_YZ} per call")
        if cu_seqlens_q.device.type == "cpu":
            _prefill_host_checks(q, k, cu_seqlens_q, cu_seqlens_k, block_table, max_q, max_seqlen_k)
        if kernel is None:
            sel = self.select(q.dtype, D, hw, q.device, feat.uses, kv_fp8=kv_fp8)
            kernel = sel.prefill
            if kv_tma is None:
                kv_tma = sel.launch.prefill_kv_tma
        elif kv_fp8:
            self.select(q.dtype, D, hw, q.device, kv_fp8=True)  # the target must serve fp8 caches
        elif kernel.dtype_class != _CLASS_OF[dkey]:
            raise ValueError(f"{op}: kernel {kernel.name} serves {kernel.dtype_class} inputs, not {q.dtype}")
        if batch == 0 or max_q == 0 or H == 0 or total_q == 0:
            return out, None
        cu_q, cu_k = _unit_stride(cu_seqlens_q), _unit_stride(cu_seqlens_k)
        grid = (_launch.cdiv(max_q, kernel.block_m), H, batch)
        # flash-attn's window: (left, right), -1 unbounded, right 0 under a causal mask.  An
        # unbounded side is a bound no key reaches; no window at all compiles no window code.
        left, right = feat.window
        if causal:
            right = 0
        window = left >= 0 or (right >= 0 and not causal)
        unbounded = max_q + max_seqlen_k + 1
        win_left = left if left >= 0 else unbounded
        win_right = right if right >= 0 else unbounded
        dummy = _unused_fp32(q.device)
        alibi = feat.alibi if feat.alibi is not None else dummy
        sink = feat.sinks if feat.sinks is not None else dummy
        ks, vs = scales if scales is not None else (dummy, dummy)
        # Paged: (block, slot, head) strides of the caches; else (token, head) and no blocks.
        kst, vst = (k.stride(), v.stride()) if paged else ((0, *k.stride()), (0, *v.stride()))
        bt = block_table if paged else _unused_i32(q.device)
        # TMA descriptors for K and V (made through call_cache.step: a replayed call makes its own).
        desc = (bool(kv_tma) and not paged and not kv_fp8 and kernel.dtype_class == "16bit" and _tma_rows(k, D)
                and _tma_rows(v, D))  # fmt: skip
        kk, vv = (step(_kv_descriptor, k, kernel.block_n), step(_kv_descriptor, v, kernel.block_n)) if desc else (k, v)

        # The kernels take a row's max of raw scores before scaling them (prefill_body's RAW
        # tiles), which needs a positive scale: scale * (q k^T) = |scale| * ((-q) k^T), and a
        # zero scale is 1 * (0 k^T).  Only such degenerate scales pay for a copy of q.
        qs = q
        if sm_scale <= 0.0:
            qs = step(torch.neg, q) if sm_scale < 0.0 else step(torch.zeros_like, q)
            sm_scale = -sm_scale if sm_scale < 0.0 else 1.0

        with _launch.on_device(q):
            _launch.launch_kernel(
                kernel.kernel, grid,
                qs, kk, vv, out, cu_q, cu_k, sm_scale, H // Hkv,
                qs.stride(0), qs.stride(1), kst[1], kst[2], vst[1], vst[2],
                out.stride(0), out.stride(1), win_left, win_right, feat.softcap, alibi, sink,
                bt, bt.stride(0) if paged else 0, kst[0], vst[0], ks, vs,
                D, _tile_width(D), bool(causal), window, feat.softcap > 0.0, feat.alibi is not None,
                feat.sinks is not None, paged, bs, kv_fp8, desc,
                num_warps=kernel.num_warps, num_stages=kernel.num_stages,
            )  # fmt: skip
        # As _prefill_hit names them: an object at most once (call_cache's commit).
        named = (q, k, v, out, cu_q, None if cu_k is cu_q else cu_k, feat.alibi, feat.sinks,
                 block_table, ks if scales else None, vs if scales and vs is not ks else None, dummy,
                 _unused_i32(q.device))  # fmt: skip
        return out, (named, _PrefillClass(kv_fp8, cu_seqlens_q.device.type == "cpu", dummy, _unused_i32(q.device)))

    # -- decode ---------------------------------------------------------------------------

    def decode(self, query, key_cache, value_cache, block_tables, seq_lens, *, scale=None, window_size=(-1, -1),
               softcap=0.0, alibi_slopes=None, sinks=None, out=None, hw=None, max_seq_len=None,
               k_scale=None, v_scale=None,
               config: Any = None, kernel: Optional[DecodeKernel] = None, launch: Any = None) -> torch.Tensor:
        """Paged decode (generated/attention.py's decode_attention).  ``config`` (an
        AttentionConfig, e.g. with smaller thresholds), ``launch`` (an AttentionLaunch) and
        ``kernel`` replace the target's, for tests and benchmarks.  A call of a class seen before
        replays its launches (policy_runtime/call_cache.py; V2: the decode and merge launches one
        after the other).  Where the full path reads the lengths on the host (CPU tensors, or a
        bound past the PyTorch path's threshold), a hit reads and checks them too, and replays
        only where they give the recorded launch plan and no sequence for the PyTorch path."""
        args = (query, key_cache, value_cache, block_tables, seq_lens)
        if config is not None or kernel is not None or launch is not None:
            return self._decode(*args, scale, window_size, softcap, alibi_slopes, sinks, out, hw, max_seq_len,
                                k_scale, v_scale, config, kernel, launch)[0]
        ck, plan = lookup(
            _DECODE_CALLS,
            query,
            lambda: (
                id(self), self._native_epoch, hw, tensor_key(query), tensor_key(key_cache),
                tensor_key(value_cache), tensor_key(block_tables), tensor_key(seq_lens), k_scale is v_scale,
                args_key(out, scale, window_size, softcap, alibi_slopes, sinks, max_seq_len, k_scale, v_scale),
            ),
        )  # fmt: skip
        if plan is not None and plan is not NO_PLAN:
            got = _decode_hit(plan, query, key_cache, value_cache, block_tables, seq_lens, alibi_slopes, sinks, out,
                              max_seq_len, k_scale, v_scale)
            if got is not None:
                return got
            # These lengths give another launch plan (or the PyTorch path): recorded afresh.
        opts = (scale, window_size, softcap, alibi_slopes, sinks, out, hw, max_seq_len, k_scale, v_scale)
        if ck is None or plan is NO_PLAN:
            return self._decode(*args, *opts, None, None, None)[0]
        with _DECODE_CALLS.record() as rec:
            out, cls = self._decode(*args, *opts, None, None, None)
        if cls is not None:  # None: its lengths sent a sequence to the PyTorch path (no plan)
            _DECODE_CALLS.commit(rec, ck, cls[0] if cls else (), data=cls[1] if cls else None)
        return out

    def _decode(self, query, key_cache, value_cache, block_tables, seq_lens, scale, window_size, softcap,
                alibi_slopes, sinks, out, hw, max_seq_len, k_scale, v_scale, config, kernel,
                launch) -> tuple[torch.Tensor, Optional[tuple]]:
        # The full path: (out, (the named tensors of its launches, _DecodeClass)); (out, ()) where
        # it launched no Triton kernel for a reason its key decides; (out, None) where its
        # lengths sent a sequence to the PyTorch path.
        op = "decode_attention"
        _tensor(op, "query", query, 3, "[num_seqs, num_heads, head_dim]")
        _tensor(op, "key_cache", key_cache, 4, "[num_blocks, block_size, num_kv_heads, head_dim]")
        _tensor(op, "value_cache", value_cache, 4, "[num_blocks, block_size, num_kv_heads, head_dim]")
        dkey = _float_dtype(op, "query", query)
        kv_fp8 = _kv_dtype(op, ("key_cache", key_cache), ("value_cache", value_cache), query, "query")
        bf16 = None if kv_fp8 else _launch.interpreted_bf16_dots(query)  # over fp8: fp16 dots (FP8_VIA_F16)
        if bf16 is not None:
            raise ValueError(f"{op}: query is {bf16}")
        S, H, D = query.shape
        nb, bs, Hkv, Dk = key_cache.shape
        if tuple(value_cache.shape) != tuple(key_cache.shape):
            raise ValueError(f"{op}: value_cache {tuple(value_cache.shape)} must have key_cache's shape "
                             f"{tuple(key_cache.shape)}")
        if Dk != D:
            raise ValueError(f"{op}: key_cache has head_dim {Dk}, query {D}; they must match")
        if Hkv == 0 or H % Hkv:
            raise ValueError(f"{op}: query's {H} heads must be a multiple of key_cache's {Hkv} KV heads")
        if self.tile_of(D) is None:
            raise ValueError(f"{op}: query has head_dim {D}; {self.served()}")
        if bs < 1:
            raise ValueError(f"{op}: key_cache has block_size {bs}")
        for name, t in (("query", query), ("key_cache", key_cache), ("value_cache", value_cache)):
            _unit_last(op, name, t)
        _index(op, "block_tables", block_tables, "[num_seqs, max_blocks]")
        _index(op, "seq_lens", seq_lens, "[num_seqs]")
        if block_tables.dim() != 2 or block_tables.shape[0] != S:
            raise ValueError(f"{op}: block_tables must be [num_seqs={S}, max_blocks], got {tuple(block_tables.shape)}")
        if seq_lens.dim() != 1 or seq_lens.shape[0] != S:
            raise ValueError(f"{op}: seq_lens must be [num_seqs={S}], got {tuple(seq_lens.shape)}")
        _unit_last(op, "block_tables", block_tables)
        sm_scale = _scale(op, scale, D)
        if max_seq_len is not None:
            _length(op, "max_seq_len", max_seq_len)
        for name, t in (("key_cache", key_cache), ("value_cache", value_cache), ("block_tables", block_tables),
                        ("seq_lens", seq_lens)):
            _same_device(op, name, t, query, "query")
        feat = _features(op, "query", query, H, window_size, softcap, alibi_slopes, sinks)
        scales = _kv_scales(op, kv_fp8, k_scale, v_scale, query.device)
        out = _out(op, out, (S, H, D), query, "query")
        _launch.check_runnable(op, "query", query)
        sel = self.select(query.dtype, D, hw, query.device, feat.uses, kv_fp8=kv_fp8)
        cfg = config if config is not None else sel.config
        lcfg = launch if launch is not None else sel.launch
        if kernel is None:
            kernel = sel.decode
        elif kernel.dtype_class != _CLASS_OF[dkey]:
            raise ValueError(f"{op}: kernel {kernel.name} serves {kernel.dtype_class} inputs, not {query.dtype}")
        if S == 0 or H == 0:
            return out, ()
        seq_lens = _unit_stride(seq_lens)
        # No sequence is longer than the block table holds (or the caller's max_seq_len): the
        # bound that sizes a launch while the lengths stay on the device.
        capacity = block_tables.shape[1] * bs
        if max_seq_len is not None:
            capacity = min(capacity, max_seq_len)
        torch_limit = cfg.pytorch_decode_threshold
        # The one query is the last token: it sees the window's win_len = left + 1 last keys
        # (flash-attn's window_size[0]; the right side reaches no key).  A context is a
        # sequence's last min(length, win_len) tokens; only those are read.
        win_len = feat.window[0] + 1 if feat.window[0] >= 0 else None
        span = capacity if win_len is None else min(capacity, win_len)
        lens: Optional[list[int]] = None
        if seq_lens.device.type == "cpu" or span > torch_limit:
            # Host lengths: free for CPU tensors; for CUDA tensors one copy (a sync), only where a
            # sequence may be long enough for the PyTorch path.
            lens = seq_lens.tolist()
            _check_lengths(op, lens, capacity, max_seq_len, bs, block_tables, nb)
        spans = lens if lens is None or win_len is None else [min(n, win_len) for n in lens]
        long_rows = [i for i, n in enumerate(spans) if n > torch_limit] if spans is not None else []
        named: Optional[tuple] = None
        if len(long_rows) < S:
            bound = span
            if spans is not None:
                bound = max((n for n in spans if n <= torch_limit), default=0)
            named = self._decode_kernels(out, query, key_cache, value_cache, block_tables, seq_lens, sm_scale, cfg,
                                         lcfg, kernel, bound, long_rows, feat, win_len, scales)
            if named:
                cls = _DecodeClass(lens is not None, _decode_choice(S, Hkv, bound, cfg, lcfg), (S, H, D), win_len,
                                   scales is not None, capacity, bs, nb, torch_limit, cfg, lcfg,
                                   _unused_fp32(query.device))
        if long_rows and not _launch.compiling():  # warm-up's compile-only scope: no Triton kernel here
            assert lens is not None
            sm_count = self.hardware[sel.target].sm_count
            _torch_decode(out, query, key_cache, value_cache, block_tables, lens, long_rows, sm_scale,
                          cfg.pytorch_max_tile_blocks, sm_count, feat, scales)
            return out, None
        return out, (named, cls) if named else ()

    def _decode_kernels(self, out, query, key_cache, value_cache, block_tables, seq_lens, sm_scale, cfg, lcfg,
                        kernel, bound, long_rows, feat, win_len, scales=None) -> Optional[tuple]:
        # The sequences whose context is at most pytorch_decode_threshold tokens (bound: the
        # longest of them, or the block table's capacity): a registered vendor kernel where the
        # policy says so (and the call uses no feature and no fp8 cache: the hook's signature has
        # neither), else the Triton kernels, whose named tensors it returns (_decode_hit's).
        S, H, D = query.shape
        Hkv = key_cache.shape[2]
        version = 1 if bound <= cfg.v1_v2_threshold else 2
        plain = not feat.used and scales is None
        native = self.native[version] if getattr(cfg, f"use_native_v{version}") and plain else None
        if native is not None:
            if _launch.compiling():
                return None  # warm-up's compile-only scope: a vendor kernel has nothing for it to compile
            if long_rows:
                skip = set(long_rows)
                rows = torch.tensor([i for i in range(S) if i not in skip], device=query.device)
                sub = torch.empty((rows.shape[0], H, D), dtype=out.dtype, device=out.device)
                native(out=sub, query=query.index_select(0, rows), key_cache=key_cache, value_cache=value_cache,
                       block_tables=block_tables.index_select(0, rows), seq_lens=seq_lens.index_select(0, rows),
                       scale=sm_scale, max_seq_len=bound)
                out.index_copy_(0, rows, sub)
            else:
                native(out=out, query=query, key_cache=key_cache, value_cache=value_cache, block_tables=block_tables,
                       seq_lens=seq_lens, scale=sm_scale, max_seq_len=bound)
            return None
        v1_limit, ps, parts = decode_plan(S, Hkv, bound, cfg, lcfg)
        if parts > _MAX_GRID_YZ or Hkv > _MAX_GRID_YZ or H > _MAX_GRID_YZ:
            raise ValueError(f"decode_attention: {parts} partitions of {H} heads exceed the launch grid")
        if parts > 1:
            part_o, part_m, part_l = _v2_workspace(S, H, parts, D, query.device)
        else:
            # Not read (every sequence is V1), but fp32 like the real buffers: a pointer of another
            # dtype would compile a second kernel.
            part_o = part_m = part_l = _unused_fp32(query.device)
        group = H // Hkv
        q_rows = max(16, _launch.pow2ceil(group))
        torch_limit = cfg.pytorch_decode_threshold
        kst, vst = key_cache.stride(), value_cache.stride()
        dummy = _unused_fp32(query.device)
        alibi = feat.alibi if feat.alibi is not None else dummy
        sink = feat.sinks if feat.sinks is not None else dummy
        ks, vs = scales if scales is not None else (dummy, dummy)
        # The merge reads each sequence's context length: a windowed call's lengths clamped.
        spans = seq_lens if win_len is None or parts == 1 else seq_lens.clamp(max=win_len)
        # Hopper and later: the merge is a programmatic dependent launch, scheduled while the
        # decode kernel's last programs run (V1 launches take the same PDL constant, so a class
        # compiles one decode kernel whatever its split).
        # The decode kernel's per-call constants (defaults False, passed only when on): PDL, and
        # V_PAIRS for an fp8 cache whose V rows allow it.
        pdl = _launch.programmatic(query)
        consts = {"PDL": True} if pdl else {}
        if scales is not None and _fp8_pairs_aligned(value_cache):
            consts["V_PAIRS"] = True

        with _launch.on_device(query):
            _launch.launch_kernel(
                kernel.kernel, (S, Hkv, parts),
                query, key_cache, value_cache, block_tables, seq_lens, out, part_o, part_m, part_l, sm_scale,
                group, block_tables.stride(0), v1_limit, torch_limit, ps, parts, query.stride(0), query.stride(1),
                kst[0], kst[1], kst[2], vst[0], vst[1], vst[2], out.stride(0), out.stride(1),
                win_len if win_len is not None else 0, feat.softcap, alibi, sink, ks, vs,
                D, _tile_width(D), key_cache.shape[1], q_rows, win_len is not None, feat.softcap > 0.0,
                feat.alibi is not None, feat.sinks is not None, scales is not None,
                num_warps=kernel.num_warps, num_stages=kernel.num_stages, **consts,
            )  # fmt: skip
            if parts > 1:
                wide = merge_is_wide(S, H, D, parts)
                _launch.launch_kernel(
                    _merge, _merge_grid(S, H, D),
                    out, part_o, part_m, part_l, spans, v1_limit, torch_limit, ps, parts, out.stride(0),
                    out.stride(1), D, _MERGE_WIDE_BLOCK_P if wide else _MERGE_BLOCK_P, _merge_block_d(D),
                    num_warps=_MERGE_WIDE_WARPS if wide else _MERGE_WARPS,
                    **({"PDL": True, "launch_pdl": True} if pdl else {}),
                )  # fmt: skip
        # As _decode_hit names them: an object at most once (call_cache's commit).
        v2 = parts > 1
        return (query, key_cache, value_cache, block_tables, seq_lens, out, part_o if v2 else None,
                part_m if v2 else None, part_l if v2 else None, spans if spans is not seq_lens else None, feat.alibi,
                feat.sinks, ks if scales else None, vs if scales and vs is not ks else None, dummy)  # fmt: skip


def _fp8_pairs_aligned(value_cache: torch.Tensor) -> bool:
    # Whether decode_body may read an fp8 value cache as 16-bit words (V_PAIRS): every row 2-byte
    # aligned.  Keyed on what a call-cache key holds: the data pointer's 16-byte alignment and the
    # strides (a cache that is not 16-byte aligned reads bytes, a class of its own in Triton's
    # specialization anyway).
    return value_cache.data_ptr() % 16 == 0 and all(st % 2 == 0 for st in value_cache.stride()[:3])


def _merge_block_d(D: int) -> int:
    # The merge's column slice at head_dim D (its padded tile's width, at most _MERGE_BLOCK_D).
    return min(_tile_width(D), _MERGE_BLOCK_D)


def _merge_grid(S: int, H: int, D: int) -> tuple[int, int, int]:
    # The merge's grid: (sequences, heads, column slices).
    return (S, H, _launch.cdiv(D, _merge_block_d(D)))


def merge_is_wide(S: int, H: int, D: int, parts: int) -> bool:
    """Whether the V2 merge of S sequences of H heads of head_dim D in at most ``parts`` partitions
    takes its wide launch shape: _MERGE_WIDE programs or more (one a column slice of a sequence's
    head) of at most _MERGE_BLOCK_P partitions."""
    return math.prod(_merge_grid(S, H, D)) >= _MERGE_WIDE and parts <= _MERGE_BLOCK_P


def decode_plan(S: int, Hkv: int, bound: int, cfg: Any, lcfg: Any) -> tuple[int, int, int]:
    """(v1_limit, partition, partitions) of a Triton decode launch of S sequences and Hkv KV heads
    whose lengths are at most ``bound``, by its AttentionConfig and AttentionLaunch records: the
    sequences of at most v1_limit tokens run V1 (one program each), longer ones V2 in partitions
    of ``partition`` tokens; ``partitions`` is 1 where every sequence is V1."""
    v1_limit = cfg.v1_v2_threshold
    if S * Hkv < lcfg.v1_min_programs:
        # Too few (sequence, KV head) programs to fill the part: split every sequence longer
        # than one partition.
        v1_limit = min(v1_limit, cfg.partition_size)
    if bound <= v1_limit:
        split = lcfg.v1_split_partition
        if split and S * Hkv >= lcfg.v1_min_programs and bound > split and bound >= lcfg.v1_split_min_bound:
            # Enough programs for V1, but in a ragged batch the longest sequences' programs would
            # be the last wave's, alone: those longer than v1_split_percent % of the bound run V2
            # in partitions of v1_split_partition tokens.
            return bound * lcfg.v1_split_percent // 100, split, _launch.cdiv(bound, split)
        return v1_limit, cfg.partition_size, 1
    # V2 partitions start at v2_max_partition tokens (0: the model's partition_size) and halve,
    # down to v2_min_partition, while the launch has fewer than v2_min_programs programs: the
    # longest partitions that keep the part's SMs busy.
    ps = lcfg.v2_max_partition or cfg.partition_size
    parts = _launch.cdiv(bound, ps)
    while S * Hkv * parts < lcfg.v2_min_programs and ps // 2 >= lcfg.v2_min_partition:
        ps //= 2
        parts = _launch.cdiv(bound, ps)
    if parts == 1:
        # One partition holds every sequence: that is V1 (the kernel writes the output itself).
        return max(v1_limit, bound), ps, 1
    return v1_limit, ps, parts


def _v2_workspace(S: int, H: int, parts: int, D: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """(part_o, part_m, part_l) of a V2 decode launch: the partitions' fp32 outputs, then their
    maxima and sums in one buffer, part_l at a multiple of 4 floats: Triton specializes pointers
    on 16-byte alignment, and S * H * parts floats in would compile a second decode kernel and
    merge for the calls where that product is not a multiple of 4 (the full path and a call-cache
    hit allocate them here alike)."""
    part_o = torch.empty((S, H, parts, D), dtype=torch.float32, device=device)
    n = S * H * parts
    step = _launch.cdiv(n, 4) * 4
    part_ml = torch.empty(step + n, dtype=torch.float32, device=device)
    return part_o, part_ml[:n], part_ml[step:]


def _unit_stride(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    # A 1-D vector argument (lengths, offsets, slopes, sinks) as the kernels read it: unit stride.
    return t if t is None or t.stride(0) == 1 else t.contiguous()


def _decode_choice(S: int, Hkv: int, bound: int, cfg: Any, lcfg: Any) -> tuple:
    # What a decode launch's bound decides: the version (a vendor kernel's) and decode_plan.
    return (bound <= cfg.v1_v2_threshold, *decode_plan(S, Hkv, bound, cfg, lcfg))


class _DecodeClass:
    """What a decode plan keeps beside its launches: whether its class reads the lengths on the
    host (``reads``) and the choice they gave (``_decode_choice``), out's shape, the window, the
    fp8 flag, and what the host checks of the lengths and the V2 workspaces need."""

    __slots__ = ("reads", "choice", "shape", "win_len", "fp8", "capacity", "bs", "nb", "torch_limit", "cfg",
                 "lcfg", "dummy", "parts")  # fmt: skip

    def __init__(self, reads, choice, shape, win_len, fp8, capacity, bs, nb, torch_limit, cfg, lcfg, dummy):
        self.reads, self.choice, self.shape, self.win_len, self.fp8 = reads, choice, shape, win_len, fp8
        self.capacity, self.bs, self.nb, self.torch_limit, self.cfg, self.lcfg = capacity, bs, nb, torch_limit, cfg, lcfg
        self.dummy, self.parts = dummy, choice[-1]


def _hit_scales(op: str, fp8: bool, k_scale: Any, v_scale: Any, device: torch.device) -> tuple:
    # A planned fp8 call's checked scale tensors as its plan names them: (None, None) without an
    # fp8 cache; v_scale None where it is k_scale's tensor (the plan then names one tensor).
    if not fp8:
        return None, None
    ks, vs = kv_scales(op, True, k_scale, v_scale, device)
    return ks, (None if vs is ks else vs)


def _decode_hit(plan, query, key_cache, value_cache, block_tables, seq_lens, alibi, sinks, out, max_seq_len,
                k_scale, v_scale) -> Optional[torch.Tensor]:
    # A decode call of a planned class: the full path's steps that depend on more than the key
    # (scales, host lengths, workspaces), then the recorded launches.  None: these lengths give
    # another plan, or the PyTorch path (the caller records the call afresh).
    c = plan.data
    seq_lens = _unit_stride(seq_lens)
    ks, vs = _hit_scales("decode_attention", c.fp8, k_scale, v_scale, query.device)
    if c.reads:
        lens = seq_lens.tolist()
        _check_lengths("decode_attention", lens, c.capacity, max_seq_len, c.bs, block_tables, c.nb)
        win = c.win_len
        bound = max(lens) if win is None else min(max(lens), win)
        if bound > c.torch_limit or _decode_choice(c.shape[0], key_cache.shape[2], bound, c.cfg, c.lcfg) != c.choice:
            return None
    if out is None:
        out = torch.empty_like(query, memory_format=torch.contiguous_format)
    alibi, sinks = _unit_stride(alibi), _unit_stride(sinks)
    parts = c.parts
    if parts > 1:
        spans = seq_lens.clamp(max=c.win_len) if c.win_len is not None else None
        S, H, D = c.shape[0], c.shape[1], c.shape[2]
        tensors = (query, key_cache, value_cache, block_tables, seq_lens, out,
                   *_v2_workspace(S, H, parts, D, query.device), spans, alibi, sinks, ks, vs, c.dummy)  # fmt: skip
    else:
        tensors = (query, key_cache, value_cache, block_tables, seq_lens, out, None, None, None, None, alibi, sinks,
                   ks, vs, c.dummy)  # fmt: skip
    with _launch.on_device(query):
        plan.launch(tensors)
    return out


class _PrefillClass:
    """What a prefill plan keeps beside its launch: the fp8 flag, whether cu_seqlens are on the
    CPU (a hit checks their contents again), the fp32 stand-in of absent vectors."""

    __slots__ = ("fp8", "reads", "dummy", "dummy_i32")

    def __init__(self, fp8, reads, dummy, dummy_i32):
        self.fp8, self.reads, self.dummy, self.dummy_i32 = fp8, reads, dummy, dummy_i32


def _prefill_host_checks(q, k, cu_seqlens_q, cu_seqlens_k, block_table, max_q, max_k) -> None:
    # CPU cu_seqlens: offsets and lengths against the tensors, max_seqlen_* and (paged) the
    # block table, as the full path and a hit both check them (no device sync).
    op = "prefill_attention"
    total_q = q.shape[0]
    if block_table is not None:
        # A sequence's keys are its block-table row's first len_k slots.
        bs = k.shape[1]
        total_k = block_table.shape[1] * bs * (cu_seqlens_q.shape[0] - 1)
        _check_cu_seqlens(op, cu_seqlens_q, cu_seqlens_k, total_q, total_k, max_q, max_k)
        ck = cu_seqlens_k.tolist()
        lens = [b - a for a, b in zip(ck, ck[1:])]
        _check_lengths(op, lens, block_table.shape[1] * bs, None, bs, block_table, k.shape[0],
                       lens_name="cu_seqlens_k", table_name="block_table", cache_name="k")
    else:
        _check_cu_seqlens(op, cu_seqlens_q, cu_seqlens_k, total_q, k.shape[0], max_q, max_k)


def _prefill_hit(plan, q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k, alibi, sinks, out, block_table, k_scale,
                 v_scale) -> torch.Tensor:
    # A prefill call of a planned class: the full path's steps that depend on more than the key
    # (scales, CPU checks of cu_seqlens, contiguous copies), then the recorded launch.
    c = plan.data
    ks, vs = _hit_scales("prefill_attention", c.fp8, k_scale, v_scale, q.device)
    if c.reads:
        _prefill_host_checks(q, k, cu_seqlens_q, cu_seqlens_k, block_table, max_q, max_k)
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    cu_q, cu_k = _unit_stride(cu_seqlens_q), _unit_stride(cu_seqlens_k)
    alibi, sinks = _unit_stride(alibi), _unit_stride(sinks)
    with _launch.on_device(q):
        plan.launch((q, k, v, out, cu_q, None if cu_k is cu_q else cu_k, alibi, sinks, block_table, ks, vs, c.dummy,
                     c.dummy_i32))
    return out


def _tma_rows(t: torch.Tensor, head_dim: int) -> bool:
    # Can K or V [total_k, num_kv_heads, head_dim] be read as a TMA descriptor's [total_k,
    # num_kv_heads * head_dim]?  head_dim its own tile's width (a power of two from 16: the tile is
    # not padded, and a descriptor's box is the tile), heads packed in a token's row, rows that do
    # not overlap (a tensor map's row stride spans its row: no broadcast keys), the base and the
    # row stride 16-byte aligned.
    es = t.element_size()
    return (
        head_dim == _tile_width(head_dim)
        and head_dim * es >= 16
        and (t.shape[1] == 1 or t.stride(1) == head_dim)
        and t.shape[0] > 0
        and t.stride(0) >= t.shape[1] * head_dim
        and (t.stride(0) * es) % 16 == 0
        and t.data_ptr() % 16 == 0
    )


def _kv_descriptor(t: torch.Tensor, block_n: int) -> TensorDescriptor:
    # A TMA descriptor over K or V [total_k, num_kv_heads, head_dim] (``_tma_rows``) viewed as
    # [total_k, num_kv_heads * head_dim], tiles of block_n keys x one head.
    T, H, D = t.shape
    return TensorDescriptor(t, [T, H * D], [t.stride(0), 1], [block_n, D])


_UNUSED: dict[torch.device, torch.Tensor] = {}


def _unused_fp32(device: torch.device) -> torch.Tensor:
    t = _UNUSED.get(device)
    if t is None:
        t = _UNUSED[device] = torch.zeros(16, dtype=torch.float32, device=device)
    return t


_UNUSED_I32: dict[torch.device, torch.Tensor] = {}


def _unused_i32(device: torch.device) -> torch.Tensor:
    # The block table of an unpaged prefill: int32 like a real one (one kernel either way).
    t = _UNUSED_I32.get(device)
    if t is None:
        t = _UNUSED_I32[device] = torch.zeros((1, 16), dtype=torch.int32, device=device)
    return t


def _kv_dtype(op: str, k: tuple[str, torch.Tensor], v: tuple[str, torch.Tensor], ref: torch.Tensor,
              ref_name: str) -> bool:
    """Whether K and V are an FP8 (e4m3fn) cache: both float8_e4m3fn, or both of ``ref``'s dtype."""
    (kn, kt), (vn, vt) = k, v
    if kt.dtype == FP8_DTYPE or vt.dtype == FP8_DTYPE:
        if kt.dtype != vt.dtype:
            raise ValueError(f"{op}: {kn} has dtype {kt.dtype}, {vn} {vt.dtype}; an fp8 cache needs both float8_e4m3fn")
        return True
    _same_dtype(op, kn, kt, ref, ref_name)
    _same_dtype(op, vn, vt, ref, ref_name)
    return False


def _kv_scales(op: str, kv_fp8: bool, k_scale: Any, v_scale: Any,
               device: torch.device) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """The fp8 cache's (k_scale, v_scale) as one-element fp32 tensors; None for a 16/32-bit cache
    (which takes no scales): policy_runtime/fp8_kv.py's kv_scales."""
    return kv_scales(op, kv_fp8, k_scale, v_scale, device)


def _check_cu_seqlens(op: str, cu_q: torch.Tensor, cu_k: torch.Tensor, total_q: int, total_k: int,
                      max_q: int, max_k: int) -> None:
    # Only for CPU tensors (no device sync): offsets from 0, non-decreasing, within the tensors,
    # no sequence longer than max_seqlen_*.
    for name, cu, total, longest, lname in (("cu_seqlens_q", cu_q, total_q, max_q, "max_seqlen_q"),
                                             ("cu_seqlens_k", cu_k, total_k, max_k, "max_seqlen_k")):
        vals = cu.tolist()
        lens = [b - a for a, b in zip(vals, vals[1:])]
        if vals[0] != 0 or any(n < 0 for n in lens) or vals[-1] > total:
            raise ValueError(f"{op}: {name} {vals} must rise from 0 to at most {total}")
        if lens and max(lens) > longest:
            raise ValueError(f"{op}: {name} has a sequence of {max(lens)} tokens, longer than {lname}={longest}")


def _check_lengths(op: str, lens: list[int], capacity: int, max_seq_len: Optional[int], bs: int,
                   block_tables: torch.Tensor, nb: int, lens_name: str = "seq_lens", table_name: str = "block_tables",
                   cache_name: str = "key_cache") -> None:
    # Lengths already on the host: within the block table and max_seq_len; block ids checked
    # where the table is on the CPU too (no device sync).
    bad = [n for n in lens if n < 0 or n > capacity]
    if bad:
        why = f"{table_name} holds {block_tables.shape[1]} blocks of {bs}"
        if max_seq_len is not None:
            why += f", max_seq_len={max_seq_len}"
        raise ValueError(f"{op}: {lens_name} has {bad[0]}; lengths must be in [0, {capacity}] ({why})")
    if block_tables.device.type == "cpu" and lens:
        used = torch.arange(block_tables.shape[1])[None, :] < torch.tensor([-(-n // bs) for n in lens])[:, None]
        wrong = _launch.first_outside(block_tables, 0, nb, where=used)
        if wrong is not None:
            s, j = wrong
            raise ValueError(f"{op}: {table_name}[{s}, {j}] = {int(block_tables[s, j])} is not a block of "
                             f"{cache_name} (0 to {nb - 1})")


def _torch_decode(out, query, key_cache, value_cache, block_tables, lens, rows, sm_scale, max_tile_blocks,
                  sm_count, feat: Optional["Features"] = None, scales: Optional[tuple] = None) -> None:
    """The PyTorch path of sequences whose context is longer than pytorch_decode_threshold: per
    sequence, its cache blocks in tiles of at most ``max_tile_blocks`` (``grid_even_share`` gives
    the number of tiles, the blocks are shared evenly among them), each tile's scores and softmax
    state in fp32, the tiles merged exactly (log-sum-exp).  ``feat``: the call's window (only the
    window's blocks are read), soft-cap, ALiBi slopes and sinks, as the kernels apply them.
    ``scales``: an fp8 cache's (k_scale, v_scale) tensors, by which its values are multiplied."""
    _, H, D = query.shape
    bs, Hkv = key_cache.shape[1], key_cache.shape[2]
    G = H // Hkv
    win_len = feat.window[0] + 1 if feat is not None and feat.window[0] >= 0 else None
    for s in rows:
        n = lens[s]
        first = 0 if win_len is None else max(0, n - win_len)
        n_blocks = -(-n // bs)
        b_first = first // bs
        share = grid_even_share(n_blocks - b_first, max_tile_blocks, sm_count)
        tiles = share["total_tiles"]
        base, extra = divmod(n_blocks - b_first, tiles)
        q = query[s].float().view(Hkv, G, D) * sm_scale
        m = torch.full((Hkv, G), -math.inf, device=query.device)
        l = torch.zeros((Hkv, G), device=query.device)
        acc = torch.zeros((Hkv, G, D), device=query.device)
        b0 = b_first
        for t in range(tiles):
            b1 = b0 + base + (1 if t < extra else 0)
            ids = block_tables[s, b0:b1].long()
            toks = min(n, b1 * bs) - b0 * bs
            k = key_cache.index_select(0, ids).reshape(-1, Hkv, D)[:toks].float()
            v = value_cache.index_select(0, ids).reshape(-1, Hkv, D)[:toks].float()
            if scales is not None:
                k, v = k * scales[0], v * scales[1]
            scores = torch.einsum("hgd,nhd->hgn", q, k)
            if feat is not None:
                scores = feat.torch_scores(scores, b0 * bs, n, first, Hkv, G)
            m_t = scores.amax(-1)
            p = torch.exp(scores - m_t[..., None])
            m_new = torch.maximum(m, m_t)
            a, b = torch.exp(m - m_new), torch.exp(m_t - m_new)
            acc = acc * a[..., None] + torch.einsum("hgn,nhd->hgd", p, v) * b[..., None]
            l = l * a + p.sum(-1) * b
            m = m_new
            b0 = b1
        if feat is not None and feat.sinks is not None:
            sink = feat.sinks.view(Hkv, G)
            m_new = torch.maximum(m, sink)
            a = torch.exp(m - m_new)
            acc, l = acc * a[..., None], l * a + torch.exp(sink - m_new)
        out[s] = (acc / l[..., None]).reshape(H, D).to(out.dtype)
