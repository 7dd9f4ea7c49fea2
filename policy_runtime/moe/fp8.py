"""generated/moe.py's FP8 path (hand-written): fused MoE w8a8 e4m3fn, vLLM's semantics.

``fused_moe_fp8`` is vLLM's ``fused_experts(..., use_fp8_w8a8=True)``: e4m3 weights with float32
scales, activations quantized inside the call, fp32 accumulation, output in hidden_states' dtype.
``block_shape=None``: a scale per expert for w1 and w2 (``(E,)``), the activations' static
(``a1_scale``, ``a2_scale``) or dynamic (amax / 448, computed in the call), applied to each
accumulated tile.  ``block_shape=[128, 128]`` (DeepSeek-V3's): weight scales per 128x128 block,
activations quantized per token and 128-group (vLLM's ``per_token_group_quant_fp8``), each K step's
product scaled before it is added.  The intermediate is rounded to hidden_states' dtype, then
quantized the same way for the down GEMM.  Bodies ``grouped`` (tensor cores, rows aligned per
expert) and ``simt`` (decode on the CUDA cores) are specialized per bucket in generated/moe.py
(specs/kernels/moe.toml's ``moe_fp8_launch``); the interpreter runs them on the CPU.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

import torch
import triton
import triton.language as tl

from .. import launch as _launch
from ..call_cache import NO_PLAN, CallCache, args_key, grad_needed, lookup, step, tensor_key
from ..lookup import PolicyTables
from ..fp8_kv import to_e4m3
from ..scaled_mm.constexprs import SCALE_BLOCK
from .ops import (
    SUM_BLOCK,
    KernelPair,
    act_and_mul,
    align,
    chain_link,
    check_expert_map,
    check_fused,
    fail,
    load_rows,
    replay_routed,
    run_routed,
    sum_rows,
)

FP8 = torch.float8_e4m3fn
# e4m3fn's largest finite value: a scale maps amax onto it.
FP8_MAX = 448.0
# The least amax a scale is computed from (vLLM's per_token_group_quant_fp8 eps): an all-zero
# group or tensor gets a tiny scale and zeros, never a division by zero.
AMAX_FLOOR = 1e-10
# Scalings (the kernels' SCALING constexpr).
TENSOR, BLOCK = 0, 1
# The up GEMM's epilogue (its OUT constexpr): store the intermediate in hidden_states' dtype (the
# block scaling quantizes it after); the same and an atomic amax of it (dynamic per-tensor); or
# quantized by a static scale, in e4m3.
OUT_PLAIN, OUT_AMAX, OUT_STATIC = 0, 1, 2
# How the intermediate is rounded before a static quantization (the ROUND constexpr): to
# hidden_states' dtype, as the other epilogues store it.
_ROUND = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
# The quantizing kernel's modes (its MODE constexpr) and tile: ROWS rows of one 128-column group.
Q_STATIC, Q_DYNAMIC, Q_GROUP = 0, 1, 2
_Q_ROWS = 16
# The dynamic per-tensor amax: at most AMAX_PARTS programs, each the largest |x| of its share of
# _AMAX_ROWS x _AMAX_BLOCK tiles (16 KB of 16-bit x a load), which _fp8_quant's programs reduce (a
# 512-byte read each).
AMAX_PARTS = 128
_AMAX_ROWS = 32
_AMAX_BLOCK = 256
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# ---------------------------------------------------------------------------------------
# Activation quantization.


@triton.jit
def _e4m3_round_in_software(v):
    # v (fp32, |v| <= 448) rounded to the nearest e4m3fn value, ties to even, still in fp32:
    # policy_runtime/fp8_kv.py's to_e4m3 (the cache write's, which builds the byte in integer
    # arithmetic and is held to torch's cast on every class of value) read back exactly.  The cast
    # to e4m3 after is then exact.
    return to_e4m3(v).to(tl.float32)


@triton.jit
def _e4m3_round_by_the_cast(v):
    # v as it is: a compiled kernel's cast to e4m3 rounds to nearest, ties to even (the GPU's
    # conversion).
    return v


# What readies an fp32 value (|v| <= 448) for its cast to e4m3fn, so that the cast gives the
# nearest e4m3fn value, ties to even.  Triton's interpreter's cast loses the carry when a
# mantissa rounds up to the next power of two (125.4 became 64): there the value is rounded in
# software first.  Compiled kernels leave it to the cast: the software rounding, about twenty
# integer and float operations an element, made the quantizing kernel ALU-bound on the H200.
# (A function chosen here, not a constexpr global the kernels test: Triton 3.6 hashes a kernel's
# transitive constexpr globals only if the callee's hash was taken first, so such a global made
# a kernel's cache key depend on which kernel a process compiled first, and a warmed cache miss.)
_e4m3_round = _e4m3_round_in_software if _launch.INTERPRET else _e4m3_round_by_the_cast


@triton.jit(do_not_specialize=["M"])
def _fp8_amax(x_ptr, part_ptr, M, K, stride_xm, stride_xk, ROWS: tl.constexpr, BLOCK: tl.constexpr,
              PDL: tl.constexpr = False):
    # part_ptr[p] = max |x| over the ROWS x BLOCK tiles p, p + P, p + 2P, ... (row-major over the
    # tiles; grid (P,), P at most AMAX_PARTS): partial maxima, which _fp8_quant reduces, so no
    # buffer is zeroed before (one launch fewer than an atomic maximum into a zeroed scalar).
    # PDL: a link of the call's launch.Chain (every kernel of this module).
    chain_link(PDL)
    p = tl.program_id(0)
    col_tiles = tl.cdiv(K, BLOCK)
    m = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
    for t in range(p, tl.cdiv(M, ROWS) * col_tiles, tl.num_programs(0)):
        rows = (t // col_tiles) * ROWS + tl.arange(0, ROWS)
        cols = (t % col_tiles) * BLOCK + tl.arange(0, BLOCK)
        mask = (rows < M)[:, None] & (cols < K)[None, :]
        x = tl.load(x_ptr + rows.to(tl.int64)[:, None] * stride_xm + cols[None, :] * stride_xk, mask=mask, other=0.0)
        m = tl.maximum(m, tl.abs(x.to(tl.float32)))
    tl.store(part_ptr + p, tl.max(m))


@triton.jit(do_not_specialize=["M", "amax_n", "reset_n"])
def _fp8_quant(
    x_ptr,
    q_ptr,
    s_ptr,
    amax_ptr,
    amax_n,
    reset_ptr,
    reset_n,
    M,
    K,
    stride_xm,
    stride_xk,
    stride_qm,
    stride_qk,
    stride_sm,
    stride_sk,
    MODE: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
    AMAX_PARTS: tl.constexpr,
    PDL: tl.constexpr = False,
):
    # M (tokens or routed rows), amax_n and reset_n are not specialized on, so a new T (or another
    # mix of static and dynamic scales) compiles nothing.
    # q = clamp(x / scale, -448, 448) in e4m3 for a ROWS x BLOCK tile (grid: row tiles, column
    # tiles).  MODE 0: scale s_ptr[0] (static per tensor); 1: max(amax, floor) / 448, amax the
    # largest of amax_ptr[:amax_n] (dynamic per tensor: _fp8_amax's partial maxima, or the up
    # GEMM's atomic one; program (0, 0) stores the scale to s_ptr[0]); 2: per row and BLOCK-column group, its
    # amax / 448, stored to s_ptr[row, group] (vLLM's per_token_group_quant_fp8).  Divisions are
    # div_rn (IEEE): Triton's fp32 `/` is approximate on NVIDIA GPUs, and an x / scale that should
    # land exactly on a tie of e4m3's grid (frequent with 16-bit x and a scale of amax / 448) then
    # rounds the other way from torch's x / scale (cache/ops.py's reshape_and_cache does the same).
    chain_link(PDL)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    row_ok = rows < M
    mask = row_ok[:, None] & (cols < K)[None, :]
    x = tl.load(x_ptr + rows.to(tl.int64)[:, None] * stride_xm + cols[None, :] * stride_xk, mask=mask, other=0.0)
    x = x.to(tl.float32)
    if (reset_n > 0) & (tl.program_id(0) == 0) & (tl.program_id(1) == 0):
        # The next amax gathered by atomics (the up GEMM's, of the intermediate) starts at zero:
        # this launch precedes it on the stream.
        tl.store(reset_ptr, 0.0)
    if MODE == 0:
        q = tl.math.div_rn(x, tl.load(s_ptr))
    elif MODE == 1:
        parts = tl.arange(0, AMAX_PARTS)
        amax = tl.max(tl.load(amax_ptr + parts, mask=parts < amax_n, other=0.0))
        scale = tl.math.div_rn(tl.maximum(amax, 1e-10), 448.0)
        q = tl.math.div_rn(x, scale)
        if (tl.program_id(0) == 0) & (tl.program_id(1) == 0):
            tl.store(s_ptr, scale)
    else:
        scale = tl.math.div_rn(tl.maximum(tl.max(tl.abs(x), axis=1), 1e-10), 448.0)
        q = tl.math.div_rn(x, scale[:, None])
        s_ptrs = s_ptr + rows.to(tl.int64) * stride_sm + tl.program_id(1) * stride_sk
        tl.store(s_ptrs, scale, mask=row_ok)
    q = _e4m3_round(tl.minimum(tl.maximum(q, -448.0), 448.0))
    q_ptrs = q_ptr + rows.to(tl.int64)[:, None] * stride_qm + cols[None, :] * stride_qk
    tl.store(q_ptrs, q.to(q_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _fp8_epilogue(h, h_ptrs, hs_ptr, amax_ptr, mask, OUT: tl.constexpr, ROUND: tl.constexpr):
    # The up GEMM's intermediate h (fp32) stored: in h_ptr's dtype (OUT 0), the same and its amax
    # gathered (OUT 1), or rounded to hidden_states' dtype (ROUND: 1 fp16, 2 bf16) and quantized
    # by the static scale hs_ptr[0] to e4m3 (OUT 2).
    if OUT == 2:
        if ROUND == 1:
            h = h.to(tl.float16).to(tl.float32)
        elif ROUND == 2:
            h = h.to(tl.bfloat16).to(tl.float32)
        q = _e4m3_round(tl.minimum(tl.maximum(tl.math.div_rn(h, tl.load(hs_ptr)), -448.0), 448.0))
        tl.store(h_ptrs, q.to(h_ptrs.dtype.element_ty), mask=mask)
    else:
        hr = h.to(h_ptrs.dtype.element_ty)
        tl.store(h_ptrs, hr, mask=mask)
        if OUT == 1:
            a = tl.where(mask, tl.abs(hr.to(tl.float32)), 0.0)
            tl.atomic_max(amax_ptr, tl.max(a), sem="relaxed")


# ---------------------------------------------------------------------------------------
# GEMM bodies: generated/moe.py's specialized FP8 kernels call these with their constants.


@triton.jit
def fp8_grouped_up_body(
    x_ptr,
    xs_ptr,
    w_ptr,
    ws_ptr,
    h_ptr,
    hs_ptr,
    amax_ptr,
    sorted_ptr,
    experts_ptr,
    post_pad_ptr,
    numel,
    num_m_blocks,
    N,
    K,
    top_k,
    stride_xm,
    stride_xk,
    stride_xsm,
    stride_xsk,
    stride_we,
    stride_wn,
    stride_wk,
    stride_wse,
    stride_wsn,
    stride_wsk,
    stride_hm,
    stride_hn,
    ACT: tl.constexpr,
    EVEN_K: tl.constexpr,
    SCALING: tl.constexpr,
    OUT: tl.constexpr,
    ROUND: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    SCALE_BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
    W_DESC: tl.constexpr = False,
):
    # policy_runtime/moe/ops.py's grouped_up_body on e4m3 operands: one aligned block of one expert's rows,
    # BLOCK_N columns of each half of w1, grouped order.  SCALING 0: the accumulated tiles times
    # xs[0] * ws[e]; 1: each K step's products times xs[row, kb] and ws[e, n // 128, kb] (n the
    # weight row: gate and up halves have their own blocks).
    chain_link(PDL)
    group = GROUP_M * ((N + BLOCK_N - 1) // BLOCK_N)
    first_m = (tl.program_id(0) // group) * GROUP_M
    group_m = tl.minimum(num_m_blocks - first_m, GROUP_M)
    pid_m = first_m + (tl.program_id(0) % group) % group_m
    pid_n = (tl.program_id(0) % group) // group_m
    if pid_m * BLOCK_M < tl.load(post_pad_ptr):
        tok = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
        valid = tok < numel  # padding rows hold numel
        expert = tl.load(experts_ptr + pid_m).to(tl.int64)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        cols = (offs_n % N).to(tl.int64)  # wrapped: every weight load is in bounds, stores masked
        offs_k = tl.arange(0, BLOCK_K)
        src = (tok // top_k).to(tl.int64)
        a_ptrs = x_ptr + src[:, None] * stride_xm + offs_k[None, :] * stride_xk
        if ACT == 2:  # gpt-oss: gate and up rows interleaved
            g_rows = 2 * cols
            u_rows = g_rows + 1
        else:
            g_rows = cols
            u_rows = cols + N
        if W_DESC:  # w_ptr: a TMA descriptor over w as [experts * 2N, K] (not interleaved)
            g_row = (expert * (stride_we // stride_wn) + (pid_n * BLOCK_N) % N).to(tl.int32)
            u_row = g_row + N
        else:
            g_ptrs = w_ptr + expert * stride_we + g_rows[None, :] * stride_wn + offs_k[:, None] * stride_wk
            u_ptrs = w_ptr + expert * stride_we + u_rows[None, :] * stride_wn + offs_k[:, None] * stride_wk
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if SCALING == 1:
            xs_ptrs = xs_ptr + src * stride_xsm
            gs_ptrs = ws_ptr + expert * stride_wse + (g_rows // SCALE_BLOCK) * stride_wsn
            us_ptrs = ws_ptr + expert * stride_wse + (u_rows // SCALE_BLOCK) * stride_wsn
            # A tile's weight rows within one scale block (block scales need N a multiple of 128;
            # tiles start at multiples of BLOCK_N, a power of two): one weight scale a K step,
            # folded into the row scales.  Interleaved halves (ACT 2) read 2 * BLOCK_N rows.
            n0 = (pid_n * BLOCK_N) % N
            if ACT == 2:
                gs_one = ws_ptr + expert * stride_wse + ((2 * n0) // SCALE_BLOCK) * stride_wsn
                us_one = gs_one
            else:
                gs_one = ws_ptr + expert * stride_wse + (n0 // SCALE_BLOCK) * stride_wsn
                us_one = ws_ptr + expert * stride_wse + ((n0 + N) // SCALE_BLOCK) * stride_wsn
        for kt in range(0, (K + BLOCK_K - 1) // BLOCK_K):
            if W_DESC:
                a = load_rows(a_ptrs, valid, offs_k, K - kt * BLOCK_K, EVEN_K)
                g = w_ptr.load([g_row, kt * BLOCK_K]).T
                u = w_ptr.load([u_row, kt * BLOCK_K]).T
            elif EVEN_K:
                a = tl.load(a_ptrs, mask=valid[:, None], other=0.0)
                g = tl.load(g_ptrs)
                u = tl.load(u_ptrs)
            else:
                k_ok = offs_k < K - kt * BLOCK_K
                a = tl.load(a_ptrs, mask=valid[:, None] & k_ok[None, :], other=0.0)
                g = tl.load(g_ptrs, mask=k_ok[:, None], other=0.0)
                u = tl.load(u_ptrs, mask=k_ok[:, None], other=0.0)
            if SCALING == 1:
                kb = (kt * BLOCK_K) // SCALE_BLOCK
                xs = tl.load(xs_ptrs + kb * stride_xsk, mask=valid, other=0.0)
                if BLOCK_N * (2 if ACT == 2 else 1) <= SCALE_BLOCK:
                    # One multiply-add an element: the next dot waits for it.
                    sg = (xs * tl.load(gs_one + kb * stride_wsk))[:, None]
                    su = (xs * tl.load(us_one + kb * stride_wsk))[:, None]
                    acc_g = tl.fma(tl.dot(a, g), sg, acc_g)
                    acc_u = tl.fma(tl.dot(a, u), su, acc_u)
                else:
                    acc_g += tl.dot(a, g) * xs[:, None] * tl.load(gs_ptrs + kb * stride_wsk)[None, :]
                    acc_u += tl.dot(a, u) * xs[:, None] * tl.load(us_ptrs + kb * stride_wsk)[None, :]
            else:
                acc_g = tl.dot(a, g, acc_g)
                acc_u = tl.dot(a, u, acc_u)
            a_ptrs += BLOCK_K * stride_xk
            if not W_DESC:
                g_ptrs += BLOCK_K * stride_wk
                u_ptrs += BLOCK_K * stride_wk
        if SCALING == 0:
            s = tl.load(xs_ptr) * tl.load(ws_ptr + expert * stride_wse)
            acc_g = acc_g * s
            acc_u = acc_u * s
        h = act_and_mul(acc_g, acc_u, ACT)
        h_ptrs = h_ptr + tok.to(tl.int64)[:, None] * stride_hm + offs_n[None, :] * stride_hn
        _fp8_epilogue(h, h_ptrs, hs_ptr, amax_ptr, valid[:, None] & (offs_n < N)[None, :], OUT, ROUND)


@triton.jit
def fp8_grouped_down_body(
    h_ptr,
    hs_ptr,
    w_ptr,
    ws_ptr,
    out_ptr,
    weights_ptr,
    sorted_ptr,
    experts_ptr,
    post_pad_ptr,
    numel,
    num_m_blocks,
    N,
    K,
    top_k,
    stride_hm,
    stride_hk,
    stride_hsm,
    stride_hsk,
    stride_we,
    stride_wn,
    stride_wk,
    stride_wse,
    stride_wsn,
    stride_wsk,
    stride_om,
    stride_on,
    EVEN_K: tl.constexpr,
    SCALING: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    FUSE_SUM: tl.constexpr,
    SCALE_BLOCK: tl.constexpr,
    SPLIT_K: tl.constexpr,
    PDL: tl.constexpr = False,
    W_DESC: tl.constexpr = False,
):
    # policy_runtime/moe/ops.py's grouped_down_body on e4m3 operands: weights[row] * (h[row] @ w[e].T) for
    # one aligned block, scaled as fp8_grouped_up_body (h's scale hs[0] or hs[row, kb]); FUSE_SUM adds
    # it into out[row // k] (fp32, atomically), else writes out[row].  SPLIT_K > 1 (grid axis 1:
    # the split) splits K's tiles into SPLIT_K runs, program s taking run s; without FUSE_SUM
    # out is then fp32 partial rows, row * SPLIT_K + s (a token's k * SPLIT_K rows adjacent, for
    # sum_rows), so few aligned blocks of a long K (one token of Mixtral's 14336) still fill the GPU.
    chain_link(PDL)
    group = GROUP_M * ((N + BLOCK_N - 1) // BLOCK_N)
    first_m = (tl.program_id(0) // group) * GROUP_M
    group_m = tl.minimum(num_m_blocks - first_m, GROUP_M)
    pid_m = first_m + (tl.program_id(0) % group) % group_m
    pid_n = (tl.program_id(0) % group) // group_m
    if pid_m * BLOCK_M < tl.load(post_pad_ptr):
        tok = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
        valid = tok < numel
        expert = tl.load(experts_ptr + pid_m).to(tl.int64)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        cols = (offs_n % N).to(tl.int64)
        offs_k = tl.arange(0, BLOCK_K)
        a_ptrs = h_ptr + tok.to(tl.int64)[:, None] * stride_hm + offs_k[None, :] * stride_hk
        if W_DESC:  # w_ptr: a TMA descriptor over w as [experts * N, K]
            b_row = (expert * (stride_we // stride_wn) + (pid_n * BLOCK_N) % N).to(tl.int32)
        else:
            b_ptrs = w_ptr + expert * stride_we + cols[None, :] * stride_wn + offs_k[:, None] * stride_wk
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if SCALING == 1:
            hs_ptrs = hs_ptr + tok.to(tl.int64) * stride_hsm
            bs_ptrs = ws_ptr + expert * stride_wse + (cols // SCALE_BLOCK) * stride_wsn
            # As the up GEMM's: a tile at most one scale block wide has one weight scale a step.
            bs_one = ws_ptr + expert * stride_wse + (((pid_n * BLOCK_N) % N) // SCALE_BLOCK) * stride_wsn
        k_tiles = (K + BLOCK_K - 1) // BLOCK_K
        kt_lo = 0
        kt_hi = k_tiles
        if SPLIT_K > 1:
            per = (k_tiles + SPLIT_K - 1) // SPLIT_K
            kt_lo = tl.program_id(1) * per
            kt_hi = tl.minimum(kt_lo + per, k_tiles)
            a_ptrs += kt_lo * BLOCK_K * stride_hk
            if not W_DESC:
                b_ptrs += kt_lo * BLOCK_K * stride_wk
        for kt in range(kt_lo, kt_hi):
            if W_DESC:
                a = load_rows(a_ptrs, valid, offs_k, K - kt * BLOCK_K, EVEN_K)
                b = w_ptr.load([b_row, kt * BLOCK_K]).T
            elif EVEN_K:
                a = tl.load(a_ptrs, mask=valid[:, None], other=0.0)
                b = tl.load(b_ptrs)
            else:
                k_ok = offs_k < K - kt * BLOCK_K
                a = tl.load(a_ptrs, mask=valid[:, None] & k_ok[None, :], other=0.0)
                b = tl.load(b_ptrs, mask=k_ok[:, None], other=0.0)
            if SCALING == 1:
                kb = (kt * BLOCK_K) // SCALE_BLOCK
                hs = tl.load(hs_ptrs + kb * stride_hsk, mask=valid, other=0.0)
                if BLOCK_N <= SCALE_BLOCK:
                    acc = tl.fma(tl.dot(a, b), (hs * tl.load(bs_one + kb * stride_wsk))[:, None], acc)
                else:
                    acc += tl.dot(a, b) * hs[:, None] * tl.load(bs_ptrs + kb * stride_wsk)[None, :]
            else:
                acc = tl.dot(a, b, acc)
            a_ptrs += BLOCK_K * stride_hk
            if not W_DESC:
                b_ptrs += BLOCK_K * stride_wk
        coef = tl.load(weights_ptr + tok, mask=valid, other=0.0).to(tl.float32)
        if SCALING == 0:
            coef = coef * (tl.load(hs_ptr) * tl.load(ws_ptr + expert * stride_wse))
        acc = acc * coef[:, None]
        mask = valid[:, None] & (offs_n < N)[None, :]
        if FUSE_SUM:
            o_ptrs = out_ptr + (tok // top_k).to(tl.int64)[:, None] * stride_om + offs_n[None, :] * stride_on
            tl.atomic_add(o_ptrs, acc, mask=mask, sem="relaxed")
        else:
            row = tok.to(tl.int64)
            if SPLIT_K > 1:
                row = row * SPLIT_K + tl.program_id(1)
            o_ptrs = out_ptr + row[:, None] * stride_om + offs_n[None, :] * stride_on
            tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def fp8_simt_up_body(
    x_ptr,
    xs_ptr,
    w_ptr,
    ws_ptr,
    h_ptr,
    hs_ptr,
    amax_ptr,
    ids_ptr,
    N,
    K,
    top_k,
    stride_xm,
    stride_xk,
    stride_xsm,
    stride_xsk,
    stride_we,
    stride_wn,
    stride_wk,
    stride_wse,
    stride_wsn,
    stride_wsk,
    stride_hm,
    stride_hn,
    ACT: tl.constexpr,
    EVEN_K: tl.constexpr,
    SCALING: tl.constexpr,
    OUT: tl.constexpr,
    ROUND: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    STAGES: tl.constexpr,
    SCALE_BLOCK: tl.constexpr,
    EP: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    # One flat row r = t * k + j a program (axis 0), BLOCK_N columns of each half (axis 1), on the
    # CUDA cores (policy_runtime/moe/ops.py's simt_up_body on one-byte weights): each step a BLOCK_N x
    # BLOCK_K slab of both halves times the row (e4m3 values, products exact in fp32) into fp32
    # accumulators of the slab's shape, reduced over K at the end.  SCALING 1 scales each step's
    # products by the row's group scale and the slab rows' block scales; 0 the sums by xs[0] *
    # ws[e].  STAGES > 1 stages the loop's loads through shared memory (tl.range).  EP: a row of
    # another rank's expert (id -1) loads nothing and is not read by the down kernel.
    chain_link(PDL)
    r = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = (offs_n % N).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    expert = tl.load(ids_ptr + r).to(tl.int64)
    k_end = K
    if EP:
        k_end = tl.where(expert >= 0, K, 0)
        expert = tl.maximum(expert, 0)
    src = (r // top_k).to(tl.int64)
    a_ptrs = x_ptr + src * stride_xm + offs_k * stride_xk
    if ACT == 2:  # gpt-oss: gate and up rows interleaved
        g_rows = 2 * cols
        u_rows = g_rows + 1
    else:
        g_rows = cols
        u_rows = cols + N
    g_ptrs = w_ptr + expert * stride_we + g_rows[:, None] * stride_wn + offs_k[None, :] * stride_wk
    u_ptrs = w_ptr + expert * stride_we + u_rows[:, None] * stride_wn + offs_k[None, :] * stride_wk
    gs_ptrs = ws_ptr + expert * stride_wse + (g_rows // SCALE_BLOCK) * stride_wsn
    us_ptrs = ws_ptr + expert * stride_wse + (u_rows // SCALE_BLOCK) * stride_wsn
    acc_g = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in tl.range(0, k_end, BLOCK_K, num_stages=STAGES):
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
        if SCALING == 1:
            kb = k0 // SCALE_BLOCK
            xs = tl.load(xs_ptr + src * stride_xsm + kb * stride_xsk)
            acc_g += (g.to(tl.float32) * a) * (xs * tl.load(gs_ptrs + kb * stride_wsk))[:, None]
            acc_u += (u.to(tl.float32) * a) * (xs * tl.load(us_ptrs + kb * stride_wsk))[:, None]
        else:
            acc_g += g.to(tl.float32) * a
            acc_u += u.to(tl.float32) * a
    gate = tl.sum(acc_g, axis=1)
    up = tl.sum(acc_u, axis=1)
    if SCALING == 0:
        s = tl.load(xs_ptr) * tl.load(ws_ptr + expert * stride_wse)
        gate = gate * s
        up = up * s
    h = act_and_mul(gate, up, ACT)
    h_ptrs = h_ptr + r.to(tl.int64) * stride_hm + offs_n * stride_hn
    _fp8_epilogue(h, h_ptrs, hs_ptr, amax_ptr, offs_n < N, OUT, ROUND)


@triton.jit
def fp8_simt_down_body(
    h_ptr,
    hs_ptr,
    w_ptr,
    ws_ptr,
    out_ptr,
    weights_ptr,
    ids_ptr,
    N,
    K,
    top_k,
    stride_hm,
    stride_hk,
    stride_hsm,
    stride_hsk,
    stride_we,
    stride_wn,
    stride_wk,
    stride_wse,
    stride_wsn,
    stride_wsk,
    stride_om,
    stride_on,
    SCALING: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    STAGES: tl.constexpr,
    SCALE_BLOCK: tl.constexpr,
    KB: tl.constexpr,
    EP: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    # One token t a program (axis 0), BLOCK_N output columns (axis 1), on the CUDA cores, as
    # policy_runtime/moe/ops.py's simt_down_body on one-byte weights: each step loads a K chunk of
    # the BLOCK_N w2 rows of all the token's k experts at once (a [KB, BLOCK_N, BLOCK_K] slab, KB =
    # k padded to a power of two: k times the bytes in flight of one expert a step) times the k
    # rows of h, reduced over the chunk into fp32 [KB, BLOCK_N] sums.  Block scales (SCALING 1)
    # multiply each step's sums by h's group scale and the slab rows' w2 block scales; the routing
    # weight (per tensor: times hs[0] * ws[e]) scales each slot's sums at the end, the k added in a
    # fixed order.  STAGES > 1 stages the loop's loads through shared memory (tl.range).  EP: slots
    # of another rank's expert (id -1) load nothing and add nothing.
    chain_link(PDL)
    t = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = (offs_n % N).to(tl.int64)
    slot = tl.arange(0, KB)
    slot_ok = slot < top_k
    flat = (t * top_k + slot).to(tl.int64)
    experts = tl.load(ids_ptr + flat, mask=slot_ok, other=0).to(tl.int64)
    if EP:
        slot_ok = slot_ok & (experts >= 0)
        experts = tl.maximum(experts, 0)
    weight = tl.load(weights_ptr + flat, mask=slot_ok, other=0.0).to(tl.float32)
    if SCALING == 0:
        weight = weight * tl.load(hs_ptr) * tl.load(ws_ptr + experts * stride_wse, mask=slot_ok, other=0.0)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = h_ptr + flat[:, None] * stride_hm + offs_k[None, :] * stride_hk
    b_ptrs = (w_ptr + experts[:, None, None] * stride_we + rows[None, :, None] * stride_wn
              + offs_k[None, None, :] * stride_wk)  # fmt: skip
    bs_ptrs = ws_ptr + experts[:, None] * stride_wse + (rows // SCALE_BLOCK)[None, :] * stride_wsn
    acc = tl.zeros((KB, BLOCK_N), dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        k_ok = offs_k < K - k0
        a = tl.load(a_ptrs + k0 * stride_hk, mask=slot_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
        b = tl.load(b_ptrs + k0 * stride_wk, mask=slot_ok[:, None, None] & k_ok[None, None, :], other=0.0)
        part = tl.sum(b.to(tl.float32) * a[:, None, :], axis=2)
        if SCALING == 1:
            kb = k0 // SCALE_BLOCK
            hsc = tl.load(hs_ptr + flat * stride_hsm + kb * stride_hsk, mask=slot_ok, other=0.0)
            bsc = tl.load(bs_ptrs + kb * stride_wsk, mask=slot_ok[:, None], other=0.0)
            acc += part * (hsc[:, None] * bsc)
        else:
            acc += part
    o = tl.sum(acc * weight[:, None], axis=0)
    tl.store(out_ptr + t.to(tl.int64) * stride_om + offs_n * stride_on, o.to(out_ptr.dtype.element_ty), mask=offs_n < N)


# ---------------------------------------------------------------------------------------
# Scales of a call.


@dataclass(frozen=True)
class MoEScales:
    """The checked scales of one fused_moe_fp8 call: the scaling (TENSOR or BLOCK), the weights'
    scale tensors and their (expert, n-block, k-block) strides (0 where a scale does not vary),
    and the static activation scales (None: dynamic)."""

    scaling: int
    w1: torch.Tensor
    w1_strides: tuple[int, int, int]
    w2: torch.Tensor
    w2_strides: tuple[int, int, int]
    a1: Optional[torch.Tensor]
    a2: Optional[torch.Tensor]


def _scale_tensor(op: str, name: str, s: Any, device: torch.device) -> torch.Tensor:
    if not isinstance(s, torch.Tensor):
        fail(op, f"{name} must be a float32 tensor, got {type(s).__name__}")
    if s.dtype != torch.float32:
        fail(op, f"{name} must be float32, got {s.dtype}")
    if s.device != device:
        fail(op, f"{name} is on {s.device} but hidden_states is on {device}")
    if s.requires_grad and torch.is_grad_enabled():
        fail(op, f"{name} requires grad, and the kernels have no backward")
    return s


def check_moe_scales(
    op: str,
    H: int,
    inter: int,
    E: int,
    w1_scale: Any,
    w2_scale: Any,
    a1_scale: Any,
    a2_scale: Any,
    block_shape: Any,
    device: torch.device,
) -> MoEScales:
    """The scaling a call's scales and ``block_shape`` ask for, or ValueError naming the argument."""
    blocked = block_shape is not None
    if blocked:
        ok = isinstance(block_shape, (list, tuple)) and len(block_shape) == 2
        if not ok or any(isinstance(v, bool) or v != SCALE_BLOCK for v in block_shape):
            fail(
                op,
                f"block_shape must be None (per-tensor scales) or [{SCALE_BLOCK}, {SCALE_BLOCK}], got {block_shape!r}",
            )
        for dim, size in (("H (hidden_states' columns)", H), ("I (w2's columns)", inter)):
            if size % SCALE_BLOCK:
                fail(
                    op, f"block_shape {list(block_shape)}: the block size {SCALE_BLOCK} does not divide {dim} = {size}"
                )
    w1s = _scale_tensor(op, "w1_scale", w1_scale, device)
    w2s = _scale_tensor(op, "w2_scale", w2_scale, device)
    named = (("w1_scale", w1s, 2 * inter, H), ("w2_scale", w2s, H, inter))
    strides: list[Any] = []  # each a (expert, n, k) stride triple
    for name, s, n, k in named:
        if blocked:
            want = (E, -(-n // SCALE_BLOCK), -(-k // SCALE_BLOCK))
            if tuple(s.shape) != want:
                blocks = f"(experts, {n}/{SCALE_BLOCK}, {k}/{SCALE_BLOCK} blocks)"
                fail(op, f"{name} must be {want} {blocks} for block_shape "
                          f"{list(block_shape)}, got {tuple(s.shape)}")  # fmt: skip
            strides.append(tuple(s.stride()))
        else:
            if s.dim() < 1 or s.shape[0] != E or s.numel() != E:
                fail(op, f"{name} must be ({E},), one scale per expert (per-tensor scaling; block_shape "
                          f"[{SCALE_BLOCK}, {SCALE_BLOCK}] for block scales), got {tuple(s.shape)}")  # fmt: skip
            strides.append((s.stride(0) if E > 1 else 0, 0, 0))
    acts: list[Optional[torch.Tensor]] = []
    for name, s in (("a1_scale", a1_scale), ("a2_scale", a2_scale)):
        if s is None:
            acts.append(None)
            continue
        s = _scale_tensor(op, name, s, device)
        if blocked:
            fail(op, f"{name} must be None with block_shape: activations are quantized per token and "
                      f"{SCALE_BLOCK}-column group inside the call")  # fmt: skip
        if s.numel() != 1 or s.dim() > 2:
            fail(
                op, f"{name} must hold one value (a static per-tensor scale: (), (1,) or (1, 1)), got {tuple(s.shape)}"
            )
        acts.append(s.reshape(1))
    return MoEScales(BLOCK if blocked else TENSOR, w1s, strides[0], w2s, strides[1], acts[0], acts[1])


# ---------------------------------------------------------------------------------------
# Records of the generated kernels and buckets.


def _quantize(
    x: torch.Tensor,
    q: torch.Tensor,
    scaling: int,
    static: Optional[torch.Tensor],
    amax: Optional[torch.Tensor],
    reset: Optional[torch.Tensor] = None,
    chain: Optional[_launch.Chain] = None,
) -> torch.Tensor:
    """x (M, K) into q in e4m3: per tensor by ``static`` or by the amax (dynamic; ``amax`` the one
    already gathered, else gathered here), or per row and 128-group; returns the scales as the GEMMs
    read them ((1,) or (M, K / 128)).  ``reset``: a one-element fp32 tensor the launch zeroes (the
    intermediate's amax, which the up GEMM gathers by atomics after it).  ``chain``: the launches
    are links of a caller's chain of dependent launches."""

    def link() -> dict:
        return {} if chain is None else chain.link()

    M, K = x.shape
    grid = (_launch.cdiv(M, _Q_ROWS), _launch.cdiv(K, SCALE_BLOCK))
    amax_n = 1
    if scaling == BLOCK:
        scale = step(torch.empty, (M, K // SCALE_BLOCK), dtype=torch.float32, device=x.device)
        mode, amax_arg = Q_GROUP, scale
    elif static is not None:
        scale, mode, amax_arg = static, Q_STATIC, static
    else:
        scale, mode = step(torch.empty, 1, dtype=torch.float32, device=x.device), Q_DYNAMIC
        if amax is None:
            tiles = _launch.cdiv(M, _AMAX_ROWS) * _launch.cdiv(K, _AMAX_BLOCK)
            amax_n = min(AMAX_PARTS, tiles)
            amax = step(torch.empty, amax_n, dtype=torch.float32, device=x.device)
            _launch.launch_kernel(
                _fp8_amax, (amax_n,), x, amax, M, K, x.stride(0), x.stride(1), ROWS=_AMAX_ROWS, BLOCK=_AMAX_BLOCK,
                **link(), num_warps=8,
            )  # fmt: skip
        amax_arg = amax
    s_strides = scale.stride() if scale.dim() == 2 else (0, 0)
    _launch.launch_kernel(
        _fp8_quant, grid,
        x, q, scale, amax_arg, amax_n, scale if reset is None else reset, int(reset is not None), M, K,
        x.stride(0), x.stride(1), q.stride(0), q.stride(1), *s_strides, MODE=mode, ROWS=_Q_ROWS,
        BLOCK=SCALE_BLOCK, AMAX_PARTS=AMAX_PARTS, **link(), num_warps=4,
    )  # fmt: skip
    return scale


@dataclass(frozen=True)
class Fp8Variant(KernelPair):
    """One pair of specialized FP8 kernels (moe_fp8_launch: grouped or simt) and how to run it."""

    # grouped: the down GEMM's K split in this many runs (the spec's down_split_k; its kernel's
    # SPLIT_K), their fp32 partial rows added by the reduce.
    down_split_k: int = 1

    def run(
        self,
        x: torch.Tensor,
        w1: torch.Tensor,
        w2: torch.Tensor,
        weights: torch.Tensor,
        ids: torch.Tensor,
        out: torch.Tensor,
        act: int,
        num_experts: int,
        scales: MoEScales,
        ep: bool = False,
    ) -> None:
        """out[t] = sum_j weights[t, j] * dq(q(act-and-mul(dq(q(x[t])) @ dq(w1[e]).T))) @ dq(w2[e]).T
        for checked, non-empty operands (q: quantized to e4m3 as ``scales`` say, dq: times the
        scales; ``weights`` and ``ids`` flat and contiguous).  ``ep``: ids may be -1 (another
        rank's expert), and such rows add nothing."""
        T, H = x.shape
        inter = w2.shape[2]
        numel = weights.numel()
        k = numel // T
        dev = x.device
        compiling = _launch.compiling()
        # Every launch of the call, the quantizations, the alignment and the reduce included, is a
        # link of one chain of programmatic dependent launches where the device has them (Hopper
        # and later): each is scheduled while the one before runs, and waits on the device for it,
        # but the grouped GEMMs, launched plainly (still letting the next launch start early).  On
        # the H200 (bench/results/h200_moe_fp8_chain_parts.log: CUDA graphs, plain launches' time
        # over the chain's) the chain with them dependent read 0.94-0.99 on four of five grouped
        # cases and with them plain 1.01-1.08 (dsv3 one token 0.978 -> 1.035, qwen3_30b two tokens
        # 0.985 -> 1.076, mixtral four 0.941 -> 1.010; qwen3_30b 16 tokens 1.039 -> 1.026); the
        # simt GEMMs gain as links (qwen3_30b one token 1.087).
        chain = _launch.Chain(x)
        # Torch ops between the launches go through ``step``: a call cache's plan replays them.
        x_q = step(torch.empty, (T, H), dtype=FP8, device=dev)
        # The intermediate: quantized by the up GEMM's epilogue (static scale), else stored in x's
        # dtype and quantized after (its amax gathered by the up GEMM where dynamic per tensor, into
        # a scalar the quantization of x zeroes).
        amax = None
        if scales.scaling == TENSOR and scales.a2 is None:
            amax = step(torch.empty, 1, dtype=torch.float32, device=dev)
        x_s = _quantize(x, x_q, scales.scaling, scales.a1, None, reset=amax, chain=chain)
        simt = self.kind == "simt"
        # Rows of other ranks' experts are never written by the grouped up GEMM; where a pass
        # quantizes every row after it, they start at zero (never read either way).
        alloc = torch.zeros if ep and not simt else torch.empty
        hs_arg: Optional[torch.Tensor]  # the intermediate's scale, as the down GEMM reads it
        amax_arg: Optional[torch.Tensor]  # where the up GEMM's epilogue gathers the amax
        if scales.scaling == TENSOR and scales.a2 is not None:
            out_mode, h = OUT_STATIC, step(torch.empty, (numel, inter), dtype=FP8, device=dev)
            hs_arg = amax_arg = scales.a2
        elif scales.scaling == TENSOR:
            out_mode, h = OUT_AMAX, step(alloc, (numel, inter), dtype=x.dtype, device=dev)
            hs_arg = amax_arg = amax
        else:
            out_mode, h = OUT_PLAIN, step(alloc, (numel, inter), dtype=x.dtype, device=dev)
            hs_arg = amax_arg = x_s
        opts = dict(num_warps=self.num_warps, num_stages=1 if simt else self.num_stages)
        down_opts = dict(num_warps=self.down_num_warps, num_stages=1 if simt else self.down_num_stages)
        x_ss = x_s.stride() if x_s.dim() == 2 else (0, 0)
        up_tail = (act, H % self.block_k == 0, scales.scaling, out_mode, _ROUND[x.dtype])

        def intermediate() -> tuple[torch.Tensor, torch.Tensor]:
            # h as the down GEMM reads it, e4m3, and its scales.
            if out_mode == OUT_STATIC:
                return h, scales.a2  # type: ignore[return-value]
            h_q = step(torch.empty, (numel, inter), dtype=FP8, device=dev)
            return h_q, _quantize(h, h_q, scales.scaling, None, amax, chain=chain)

        if simt:
            _launch.launch_kernel(
                self.up, (numel, _launch.cdiv(inter, self.block_n)),
                x_q, x_s, w1, scales.w1, h, hs_arg, amax_arg, ids, inter, H, k, *x_q.stride(), *x_ss,
                *w1.stride(), *scales.w1_strides, *h.stride(), *up_tail, EP=ep, **chain.link(), **opts,
            )  # fmt: skip
            h_q, h_s = intermediate()
            h_ss = h_s.stride() if h_s.dim() == 2 else (0, 0)
            _launch.launch_kernel(
                self.down, (T, _launch.cdiv(H, self.down_block_n)),
                h_q, h_s, w2, scales.w2, out, weights, ids, H, inter, k, *h_q.stride(), *h_ss, *w2.stride(),
                *scales.w2_strides, *out.stride(), scales.scaling, KB=_launch.pow2ceil(k), EP=ep, **chain.link(),
                **down_opts,
            )  # fmt: skip
            return
        sorted_ids, expert_ids, post_pad = align(ids, self.block_m, num_experts, chain)
        blocks = min(expert_ids.numel(), numel // self.block_m + min(num_experts, numel))
        w1_arg, w2_arg, up_desc_kw, down_desc_kw = self.weight_args(w1, w2, act)
        _launch.launch_kernel(
            self.up, (blocks * _launch.cdiv(inter, self.block_n),),
            x_q, x_s, w1_arg, scales.w1, h, hs_arg, amax_arg, sorted_ids, expert_ids, post_pad, numel, blocks,
            inter, H, k, *x_q.stride(), *x_ss, *w1.stride(), *scales.w1_strides, *h.stride(), *up_tail,
            **chain.link(dependent=False), **up_desc_kw, **opts,
        )  # fmt: skip
        h_q, h_s = intermediate()
        h_ss = h_s.stride() if h_s.dim() == 2 else (0, 0)
        down_head = (h_q, h_s, w2_arg, scales.w2)
        down_mid = (sorted_ids, expert_ids, post_pad, numel, blocks, H, inter, k, *h_q.stride(), *h_ss,
                    *w2.stride(), *scales.w2_strides)  # fmt: skip
        down_tail = (inter % self.down_block_k == 0, scales.scaling)
        split = self.down_split_k
        grid = (blocks * _launch.cdiv(H, self.down_block_n), split)
        if self.fuse_sum:
            if out.dtype == torch.float32:
                acc = out if compiling else step(torch.Tensor.zero_, out)
            else:
                acc = step(torch.zeros, (T, H), dtype=torch.float32, device=dev)
            _launch.launch_kernel(
                self.down, grid, *down_head, acc, weights, *down_mid, *acc.stride(), *down_tail,
                **chain.link(dependent=False), **down_desc_kw,
                **down_opts,
            )  # fmt: skip
            if acc is not out and not compiling:
                step(torch.Tensor.copy_, out, acc)
            return
        # One expert a token, K not split: its weighted row is the token's output.  With expert
        # parallelism the rows of other ranks' experts are never written: they start at zero.
        # Split K: fp32 partials, split rows of a routed row adjacent (the reduce adds k * split).
        if k == 1 and split == 1:
            rows = step(torch.Tensor.zero_, out) if ep and not compiling else out
        else:
            rows_dtype = x.dtype if split == 1 else torch.float32
            rows = step(torch.zeros if ep else torch.empty, (numel * split, H), dtype=rows_dtype, device=dev)
        _launch.launch_kernel(
            self.down, grid, *down_head, rows, weights, *down_mid, *rows.stride(), *down_tail,
            **chain.link(dependent=False), **down_desc_kw,
            **down_opts,
        )  # fmt: skip
        if rows is not out:
            block_n = min(SUM_BLOCK, _launch.pow2ceil(H))
            block_t = SUM_BLOCK // block_n
            _launch.launch_kernel(
                sum_rows, (_launch.cdiv(T, block_t), _launch.cdiv(H, block_n)),
                rows, out, T, H, k * split, rows.stride(0), out.stride(0), out.stride(1),
                BLOCK_T=block_t, BLOCK_N=block_n, **chain.link(), num_warps=4,
            )  # fmt: skip


@dataclass(frozen=True)
class Fp8Bucket:
    """One bucket of an FP8 policy: its name and its kernels."""

    name: str
    variant: Fp8Variant


Fp8Policy = tuple[tuple[Fp8Bucket, ...], Callable[[int, int], Fp8Bucket]]

# Plans of fused_moe_fp8's calls by argument class (call_cache.py).
_FP8_CALLS = CallCache("fused_moe_fp8")


# ---------------------------------------------------------------------------------------
# The entry point (its arguments checked by ops.check_fused, its scales by check_moe_scales).


@dataclass(frozen=True)
class MoEFp8(PolicyTables):
    """fused_moe_fp8 of generated/moe.py over its FP8 tables (each served target's policy) and the
    targets it does not serve (target -> the hardware feature they lack)."""

    unserved: Mapping[str, str] = field(default_factory=dict)

    def policy(self, dtype: Any, hw: Any, device: Any) -> Fp8Policy:
        target = self.target_name(hw, device)
        missing = self.unserved.get(target)
        variant = self.variant_of_dtype[FP8]
        if missing is not None:
            served = sorted(self.policies[variant])
            raise ValueError(
                f"fused_moe_fp8: target {target!r} has no {missing} (specs/hardware/{target}.toml), which "
                f"specs/kernels/moe.toml's moe_fp8_launch requires; served targets: {', '.join(served)}"
            )
        return self.policies[variant][target]  # type: ignore[return-value]

    def fused_moe_fp8(
        self,
        x: Any,
        w1: Any,
        w2: Any,
        topk_weights: Any,
        topk_ids: Any,
        *,
        w1_scale: Any,
        w2_scale: Any,
        a1_scale: Any = None,
        a2_scale: Any = None,
        block_shape: Any = None,
        activation: Any = "silu",
        out: Any = None,
        hw: Any = None,
        expert_map: Any = None,
        variant: Optional[Fp8Variant] = None,
    ) -> torch.Tensor:
        """The w8a8 FP8 MoE layer into out (or a new tensor), by the bucket's kernels for T and the
        experts' intermediate size (or by ``variant``'s, for tests and benchmarks).  A call of a
        class seen before replays its plan (call_cache.py): the quantizing launches, the
        allocations and the GEMMs of its full path, back to back."""
        args = (x, w1, w2, topk_weights, topk_ids, w1_scale, w2_scale, a1_scale, a2_scale, block_shape, activation,
                out, hw, expert_map, variant)  # fmt: skip
        key, plan = lookup(
            _FP8_CALLS,
            x,
            lambda: (
                id(self), tensor_key(x), tensor_key(w1), tensor_key(w2), tensor_key(topk_weights),
                tensor_key(topk_ids), tensor_key(w1_scale), tensor_key(w2_scale),
                args_key(a1_scale, a2_scale, block_shape, activation, out, hw, expert_map), variant,
            ),
        )  # fmt: skip
        if plan is not None and plan is not NO_PLAN:
            # The static activation scales as the launches took them: one value, the same memory.
            scales = (w1_scale, w2_scale, a1_scale, a2_scale)
            return replay_routed(
                "fused_moe_fp8", plan, x, w1, w2, topk_weights, topk_ids, out, expert_map, scales
            )
        if key is None or plan is NO_PLAN or grad_needed(x, topk_weights, out, w1_scale, w2_scale, a1_scale, a2_scale):
            return self._fused_moe_fp8(*args)
        named: list = []
        with _FP8_CALLS.record() as rec:
            result = self._fused_moe_fp8(*args, named)
        _FP8_CALLS.commit(rec, key, tuple(named))
        return result

    def _fused_moe_fp8(
        self, x, w1, w2, topk_weights, topk_ids, w1_scale, w2_scale, a1_scale, a2_scale, block_shape, activation,
        out, hw, expert_map, variant, named=None,
    ):  # fmt: skip
        # The full path; ``named`` (a list) gets the tensors its launches take: run_routed's, then
        # the scales (the activations' as checked: one-element views).
        op = "fused_moe_fp8"
        T, H, inter, E, k = check_fused(
            "fused_moe_fp8", x, w1, w2, topk_weights, topk_ids, activation, out, DTYPES, FP8
        )
        scales = check_moe_scales(op, H, inter, E, w1_scale, w2_scale, a1_scale, a2_scale, block_shape, x.device)
        if expert_map is not None:
            expert_map = check_expert_map(op, expert_map, topk_ids, E)
        if variant is None:
            variant = self.policy(FP8, hw, x.device)[1](T, inter).variant
        run = functools.partial(variant.run, scales=scales)
        result = run_routed(
            op, run, x, w1, w2, topk_weights, topk_ids, out, activation, (T, H, inter, E), expert_map, named
        )
        if named:
            named += (scales.w1, scales.w2, scales.a1, scales.a2)
        return result
