"""The hand-written half of generated/moe.py: fused MoE's kernel bodies and host side.

generated/moe.py holds what varies with the specs (per bucket config a pair of ``@triton.jit``
kernels, up GEMM and down GEMM, that call a body below with its constants baked in; the bucket
tables) and hands them to a ``MoE`` (below).  Kernel kinds (a bucket's ``kernel``):
``grouped``, vLLM's structure (rows sorted and padded per expert to ``block_size_m``, the
weighted rows summed by fp32 atomics where ``fuse_sum``, else by a reduce in slot order);
``gemv``, decode without alignment (a row in a 16-row tensor-core tile, the down kernel one
token a program, summing its k experts in slot order); ``simt``, decode on the CUDA cores
(slabs of weights in registers, no padding rows: at one token 0.8x the gemv's time on an
H200), ``chained`` as programmatic dependent launches on Hopper and later.

Arithmetic is fp32; the activation is rounded once to the input dtype (as vLLM's intermediate
cache), the output once.  Index arithmetic into the weights and the routed rows is 64-bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, Optional

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
from triton.tools.tensor_descriptor import TensorDescriptor

from .. import launch as _launch
from ..call_cache import NO_PLAN, CallCache, args_key, grad_needed, lookup, new_like, step, template, tensor_key
from ..lookup import PolicyTables

# Activations of the up GEMM's gate half, as vLLM's fused_moe names them (act_and_mul's ACT).
# swigluoai is gpt-oss's: alpha 1.702, limit 7, and its w1 interleaves gate and up rows (row 2n
# is gate column n, row 2n + 1 up column n), as vLLM's swigluoai_and_mul reads its input.
ACTIVATIONS = {"silu": 0, "gelu": 1, "swigluoai": 2}
_INDEX_DTYPES = (torch.int32, torch.int64)
# Experts and top-k are held in one program's registers (padded to powers of two).
_MAX_EXPERTS = 4096
# The alignment kernels: the flat ids of a segment (a program's), and the counts the prefix sums
# load at a time (segments x experts).  From _ALIGN_SORT_FROM ids x experts one program a segment
# counts (a histogram) and sorts its ids by expert: each id read twice whatever the experts.
# Below, one program an expert and segment scans the segment for that expert, which is quicker
# while ids x experts is small (one sort of 1024 ids takes longer than a scan); the H200's
# crossover was 2**21 (8,192 ids of 256 experts, 32,768 of 64;
# bench/results/h200_moe_align_sort_ab.log).  Segments of 1024 ids were the fastest of 1024, 2048
# and 4096 for the scan (bench/results/h200_moe_align_ab.log).
_ALIGN_BLOCK = 1024
_ALIGN_SORT_FROM = 2**21
_ALIGN_TILE = 4096
# Plans of the routers' and moe_align_block_size's calls by argument class (call_cache.py).
_ROUTE_CALLS = CallCache("topk_softmax")
_ALIGN_CALLS = CallCache("moe_align_block_size")
_FUSED_CALLS = CallCache("fused_moe")
# Elements a program of the reduce kernel sums (up to 1024 columns of one token, or as many
# tokens as make 1024 elements).
SUM_BLOCK = 1024
# topk_softmax gives each token of a call of at most this many its own program (see there).
TOPK_ONE_ROW_MAX_T = 64


# ---------------------------------------------------------------------------------------
# Kernel bodies: generated/moe.py's specialized kernels call these with their constants.


# Helpers are written out in each body rather than called: in Triton's interpreter (the CPU
# tests) every call of a jit function costs more than the arithmetic it saves.  (The activation
# epilogue is one call a program.)


@triton.jit
def act_and_mul(gate, up, ACT: tl.constexpr):
    # The up GEMM's epilogue, fp32 (vLLM's activations; ACTIVATIONS numbers them).
    if ACT == 0:
        h = gate / (1.0 + tl.exp(-gate)) * up  # SiLU(gate) * up
    elif ACT == 1:
        h = 0.5 * gate * (1.0 + tl.erf(gate * 0.7071067811865476)) * up  # GELU (erf) * up
    else:
        # swigluoai (gpt-oss): gate clamped above at 7, up to [-7, 7];
        # gate * sigmoid(1.702 * gate) * (up + 1).
        gate = tl.minimum(gate, 7.0)
        up = tl.minimum(tl.maximum(up, -7.0), 7.0)
        h = gate / (1.0 + tl.exp(-1.702 * gate)) * (up + 1.0)
    return h



@triton.jit
def chain_link(PDL: tl.constexpr):
    # The top of a kernel launched as a link of launch.Chain (PDL): wait on the device until
    # the launch before has finished and its writes are visible, then let the next launch start.
    # Nothing is read or written before.  PDL False: nothing.
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def load_rows(a_ptrs, valid, offs_k, k_left, EVEN_K: tl.constexpr):
    # A K step of a grouped GEMM's gathered rows (padding rows and columns past K zero).
    if EVEN_K:
        return tl.load(a_ptrs, mask=valid[:, None], other=0.0)
    return tl.load(a_ptrs, mask=valid[:, None] & (offs_k < k_left)[None, :], other=0.0)


@triton.jit
def grouped_up_body(x_ptr, w_ptr, h_ptr, sorted_ptr, experts_ptr, post_pad_ptr, numel, num_m_blocks,
                N, K, top_k, stride_xm, stride_xk, stride_we, stride_wn, stride_wk, stride_hm,
                stride_hn, ACT: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                DOT_PREC: tl.constexpr, PDL: tl.constexpr = False, W_DESC: tl.constexpr = False):
    # h[row] = act(x[row // k] @ w[e, :N].T) * (x[row // k] @ w[e, N:].T) for the flat rows of
    # one aligned block (one expert e), BLOCK_N columns of each half.  grid = (blocks * N tiles,).
    # Grouped order: GROUP_M row blocks walked column by column, so consecutive programs share an
    # expert's columns in L2 (a large call gives one expert several consecutive blocks).  PDL: a
    # link of the call's launch.Chain (as the alignment and the reduce).
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
        a_ptrs = x_ptr + (tok // top_k).to(tl.int64)[:, None] * stride_xm + offs_k[None, :] * stride_xk
        if W_DESC:  # w_ptr: a TMA descriptor over w as [experts * 2N, K] (not interleaved)
            g_row = (expert * (stride_we // stride_wn) + (pid_n * BLOCK_N) % N).to(tl.int32)
            u_row = g_row + N
        elif ACT == 2:  # gpt-oss: gate and up rows interleaved
            g_ptrs = w_ptr + expert * stride_we + (2 * cols)[None, :] * stride_wn + offs_k[:, None] * stride_wk
            u_ptrs = g_ptrs + stride_wn
        else:
            g_ptrs = w_ptr + expert * stride_we + cols[None, :] * stride_wn + offs_k[:, None] * stride_wk
            u_ptrs = g_ptrs + N * stride_wn
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
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
            acc_g = tl.dot(a, g, acc_g, input_precision=DOT_PREC)
            acc_u = tl.dot(a, u, acc_u, input_precision=DOT_PREC)
            a_ptrs += BLOCK_K * stride_xk
            if not W_DESC:
                g_ptrs += BLOCK_K * stride_wk
                u_ptrs += BLOCK_K * stride_wk
        h = act_and_mul(acc_g, acc_u, ACT)
        h_ptrs = h_ptr + tok.to(tl.int64)[:, None] * stride_hm + offs_n[None, :] * stride_hn
        tl.store(h_ptrs, h.to(h_ptr.dtype.element_ty), mask=valid[:, None] & (offs_n < N)[None, :])


@triton.jit
def grouped_down_body(h_ptr, w_ptr, out_ptr, weights_ptr, sorted_ptr, experts_ptr, post_pad_ptr, numel,
                  num_m_blocks, N, K, top_k, stride_hm, stride_hk, stride_we, stride_wn, stride_wk,
                  stride_om, stride_on, EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                  DOT_PREC: tl.constexpr, FUSE_SUM: tl.constexpr, PDL: tl.constexpr = False,
                  W_DESC: tl.constexpr = False):
    # weights[row] * (h[row] @ w[e].T) for the flat rows of one aligned block, BLOCK_N columns:
    # FUSE_SUM adds it into out[row // k] (fp32, atomically), else writes out[row].
    # Grouped order: GROUP_M row blocks walked column by column, so consecutive programs share an
    # expert's columns in L2 (a large call gives one expert several consecutive blocks).  PDL: a
    # link of the call's launch.Chain.
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
        for kt in range(0, (K + BLOCK_K - 1) // BLOCK_K):
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
            acc = tl.dot(a, b, acc, input_precision=DOT_PREC)
            a_ptrs += BLOCK_K * stride_hk
            if not W_DESC:
                b_ptrs += BLOCK_K * stride_wk
        acc = acc * tl.load(weights_ptr + tok, mask=valid, other=0.0).to(tl.float32)[:, None]
        mask = valid[:, None] & (offs_n < N)[None, :]
        if FUSE_SUM:
            o_ptrs = out_ptr + (tok // top_k).to(tl.int64)[:, None] * stride_om + offs_n[None, :] * stride_on
            tl.atomic_add(o_ptrs, acc, mask=mask, sem="relaxed")
        else:
            o_ptrs = out_ptr + tok.to(tl.int64)[:, None] * stride_om + offs_n[None, :] * stride_on
            tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def gemv_up_body(x_ptr, w_ptr, h_ptr, ids_ptr, N, K, top_k, stride_xm, stride_xk, stride_we, stride_wn,
             stride_wk, stride_hm, stride_hn, ACT: tl.constexpr, EVEN_K: tl.constexpr,
             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PREC: tl.constexpr,
             EP: tl.constexpr = False):
    # One flat row r = t * k + j per program (axis 0), BLOCK_N columns of each half (axis 1).
    # The row is the first of a 16-row tile (the others masked to zero) so that the weight tiles
    # feed tensor-core dots, which Triton pipelines num_stages deep: decode streams weights.
    # EP (expert parallelism): a row whose id is -1 (an expert on another rank) loads nothing
    # (its K loop is empty) and is not read by the down kernel.
    r = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = (offs_n % N).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    lane = tl.arange(0, 16)[:, None]
    first = lane == 0
    expert = tl.load(ids_ptr + r).to(tl.int64)
    k_end = K
    if EP:
        k_end = tl.where(expert >= 0, K, 0)
        expert = tl.maximum(expert, 0)
    a_ptrs = x_ptr + (r // top_k).to(tl.int64) * stride_xm + lane * 0 + offs_k[None, :] * stride_xk
    if ACT == 2:  # gpt-oss: gate and up rows interleaved
        g_ptrs = w_ptr + expert * stride_we + (2 * cols)[None, :] * stride_wn + offs_k[:, None] * stride_wk
        u_ptrs = g_ptrs + stride_wn
    else:
        g_ptrs = w_ptr + expert * stride_we + cols[None, :] * stride_wn + offs_k[:, None] * stride_wk
        u_ptrs = g_ptrs + N * stride_wn
    acc_g = tl.zeros((16, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((16, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, k_end, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=first, other=0.0)
            g = tl.load(g_ptrs)
            u = tl.load(u_ptrs)
        else:
            k_ok = offs_k < K - k0
            a = tl.load(a_ptrs, mask=first & k_ok[None, :], other=0.0)
            g = tl.load(g_ptrs, mask=k_ok[:, None], other=0.0)
            u = tl.load(u_ptrs, mask=k_ok[:, None], other=0.0)
        acc_g = tl.dot(a, g, acc_g, input_precision=DOT_PREC)
        acc_u = tl.dot(a, u, acc_u, input_precision=DOT_PREC)
        a_ptrs += BLOCK_K * stride_xk
        g_ptrs += BLOCK_K * stride_wk
        u_ptrs += BLOCK_K * stride_wk
    h = act_and_mul(acc_g, acc_u, ACT)
    h_ptrs = h_ptr + r.to(tl.int64) * stride_hm + lane * 0 + offs_n[None, :] * stride_hn
    tl.store(h_ptrs, h.to(h_ptr.dtype.element_ty), mask=first & (offs_n < N)[None, :])


@triton.jit
def gemv_down_body(h_ptr, w_ptr, out_ptr, weights_ptr, ids_ptr, N, K, top_k, stride_hm, stride_hk,
               stride_we, stride_wn, stride_wk, stride_om, stride_on, EVEN_K: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PREC: tl.constexpr,
               EP: tl.constexpr = False):
    # One token t per program (axis 0), BLOCK_N output columns (axis 1): the sum over its k
    # experts of weight * (h[t * k + j] @ w[e].T), in slot order, in one flat loop over (j, K);
    # the row padded to a 16-row tile as in gemv_up_body, each step's product weighted in fp32.
    # The next step's expert id and weight are read a step ahead, so that the weight tile's
    # address never waits on a load of the same step (T = 1, qwen36: 19.0 -> 17.8 us on an H200,
    # exploration at commit cc8149c).
    t = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = (offs_n % N).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    lane = tl.arange(0, 16)[:, None]
    first = lane == 0
    k_tiles = (K + BLOCK_K - 1) // BLOCK_K
    steps = top_k * k_tiles
    acc = tl.zeros((16, BLOCK_N), dtype=tl.float32)
    expert = tl.load(ids_ptr + t * top_k).to(tl.int64)
    weight = tl.load(weights_ptr + t * top_k).to(tl.float32)
    for it in range(0, steps):
        r = t * top_k + it // k_tiles
        k0 = (it % k_tiles) * BLOCK_K
        r_next = t * top_k + tl.minimum(it + 1, steps - 1) // k_tiles
        expert_next = tl.load(ids_ptr + r_next).to(tl.int64)
        weight_next = tl.load(weights_ptr + r_next).to(tl.float32)
        a_ptrs = h_ptr + r.to(tl.int64) * stride_hm + lane * 0 + (k0 + offs_k)[None, :] * stride_hk
        if EP:
            # A slot of another rank's expert (id -1): nothing loaded, its weight 0.
            here = expert >= 0
            b_ptrs = w_ptr + tl.maximum(expert, 0) * stride_we + cols[None, :] * stride_wn
            b_ptrs += (k0 + offs_k)[:, None] * stride_wk
            k_ok = offs_k < tl.where(here, K - k0, 0)
            a = tl.load(a_ptrs, mask=first & k_ok[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=k_ok[:, None], other=0.0)
            weight = tl.where(here, weight, 0.0)
        else:
            b_ptrs = w_ptr + expert * stride_we + cols[None, :] * stride_wn + (k0 + offs_k)[:, None] * stride_wk
            if EVEN_K:
                a = tl.load(a_ptrs, mask=first, other=0.0)
                b = tl.load(b_ptrs)
            else:
                k_ok = offs_k < K - k0
                a = tl.load(a_ptrs, mask=first & k_ok[None, :], other=0.0)
                b = tl.load(b_ptrs, mask=k_ok[:, None], other=0.0)
        acc += weight * tl.dot(a, b, input_precision=DOT_PREC)
        expert = expert_next
        weight = weight_next
    o_ptrs = out_ptr + t.to(tl.int64) * stride_om + lane * 0 + offs_n[None, :] * stride_on
    tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=first & (offs_n < N)[None, :])


@triton.jit
def simt_up_body(x_ptr, w_ptr, h_ptr, ids_ptr, N, K, top_k, stride_xm, stride_xk, stride_we, stride_wn,
             stride_wk, stride_hm, stride_hn, ACT: tl.constexpr, EVEN_K: tl.constexpr,
             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr, STAGES: tl.constexpr = 1,
             EP: tl.constexpr = False):
    # One flat row r = t * k + j per program (axis 0), BLOCK_N columns of each half (axis 1), on
    # the CUDA cores: each step loads a BLOCK_N x BLOCK_K slab of both halves and multiplies it by
    # the row elementwise into fp32 accumulators of the slab's shape, which are reduced over K
    # once, at the end.  No padding rows: every byte loaded is a weight the row needs, and a
    # program is small enough that several share an SM.  STAGES 1: each slab goes straight into
    # registers, one step in flight; STAGES > 1: tl.range has Triton stage every load of the loop
    # through shared memory by cp.async, STAGES - 1 steps ahead (on an H200 at one token, qwen36's
    # 8 x 512 slabs at 3 stages with the down kernel at 2: 28.9 against 30.2 us,
    # exploration at commit eefc4d2).  Addresses are base + k0, not pointers carried and
    # advanced through the loop: unstaged on 256-element slab rows (the records that run so), 3-4 us
    # less per layer at T = 1 and 4 on both shapes; on 512-element rows unstaged (no record) 1.8 us
    # more (exploration at commit 5e75820).
    # PDL (launched as a programmatic dependent launch): wait until the kernel before (the router)
    # has finished and its writes are visible, then let the down kernel launch; nothing is read
    # before the wait.
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    r = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = (offs_n % N).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    expert = tl.load(ids_ptr + r).to(tl.int64)
    k_end = K
    if EP:
        # A row of another rank's expert (id -1): an empty loop, nothing loaded (as gemv_up_body).
        k_end = tl.where(expert >= 0, K, 0)
        expert = tl.maximum(expert, 0)
    a_ptrs = x_ptr + (r // top_k).to(tl.int64) * stride_xm + offs_k * stride_xk
    if ACT == 2:  # gpt-oss: gate and up rows interleaved
        g_ptrs = w_ptr + expert * stride_we + (2 * cols)[:, None] * stride_wn + offs_k[None, :] * stride_wk
        u_ptrs = g_ptrs + stride_wn
    else:
        g_ptrs = w_ptr + expert * stride_we + cols[:, None] * stride_wn + offs_k[None, :] * stride_wk
        u_ptrs = g_ptrs + N * stride_wn
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
        acc_g += g.to(tl.float32) * a
        acc_u += u.to(tl.float32) * a
    gate = tl.sum(acc_g, axis=1)
    up = tl.sum(acc_u, axis=1)
    h = act_and_mul(gate, up, ACT)
    tl.store(h_ptr + r.to(tl.int64) * stride_hm + offs_n * stride_hn, h.to(h_ptr.dtype.element_ty), mask=offs_n < N)


@triton.jit
def simt_down_body(h_ptr, w_ptr, out_ptr, weights_ptr, ids_ptr, N, K, top_k, stride_hm, stride_hk,
               stride_we, stride_wn, stride_wk, stride_om, stride_on, BLOCK_N: tl.constexpr,
               BLOCK_K: tl.constexpr, KB: tl.constexpr, PDL: tl.constexpr, STAGES: tl.constexpr = 1,
               EP: tl.constexpr = False):
    # One token t per program (axis 0), BLOCK_N output columns (axis 1), on the CUDA cores: each
    # step loads a K chunk of the BLOCK_N weight rows of all the token's k experts at once (a
    # [KB, BLOCK_N, BLOCK_K] slab, KB = k padded to a power of two) and multiplies it by the k rows
    # of h, reducing over the chunk into fp32 [KB, BLOCK_N] accumulators; the routing weights
    # scale the k sums at the end, added in a fixed order (the same every run).  Against one
    # expert a step, a program keeps k times the bytes in flight: alone at one token on an H200
    # (4 x 128 chunks, 4 warps) 12.4 against 13.1 us (qwen36) and 12.1 against 17.1 us (128
    # experts x 768) (exploration at commit 52e0da3).  STAGES 1: the next chunk is loaded
    # into registers before this one is used; STAGES > 1: the loop after the first chunk is a
    # tl.range of that depth (its loads staged through shared memory by cp.async, as simt_up_body's).
    # PDL: the ids (written by the router, finished before the up kernel let this one launch; read
    # past L1) and the first chunk are loaded before waiting for the up kernel, h after.
    t = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = (offs_n % N).to(tl.int64)
    slot = tl.arange(0, KB)
    slot_ok = slot < top_k
    flat = t * top_k + slot
    experts = tl.load(ids_ptr + flat, mask=slot_ok, other=0, cache_modifier=".cg").to(tl.int64)
    if EP:
        # Slots of another rank's experts (id -1) load nothing and weigh 0.
        slot_ok = slot_ok & (experts >= 0)
        experts = tl.maximum(experts, 0)
    offs_k = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + experts[:, None, None] * stride_we + rows[None, :, None] * stride_wn + offs_k[None, None, :] * stride_wk
    w_ok = slot_ok[:, None, None]
    b = tl.load(w_ptrs, mask=w_ok & (offs_k < K)[None, None, :], other=0.0)
    if PDL:
        gdc_wait()
    weight = tl.load(weights_ptr + flat, mask=slot_ok, other=0.0).to(tl.float32)
    a_ptrs = h_ptr + flat.to(tl.int64)[:, None] * stride_hm + offs_k[None, :] * stride_hk
    acc = tl.zeros((KB, BLOCK_N), dtype=tl.float32)
    if STAGES == 1:
        for k0 in range(0, K, BLOCK_K):
            a = tl.load(a_ptrs, mask=slot_ok[:, None] & (offs_k < K - k0)[None, :], other=0.0)
            b_next = tl.load(w_ptrs + BLOCK_K * stride_wk, mask=w_ok & (offs_k < K - k0 - BLOCK_K)[None, None, :], other=0.0)
            acc += tl.sum(b.to(tl.float32) * a.to(tl.float32)[:, None, :], axis=2)
            b = b_next
            a_ptrs += BLOCK_K * stride_hk
            w_ptrs += BLOCK_K * stride_wk
    else:
        a = tl.load(a_ptrs, mask=slot_ok[:, None] & (offs_k < K)[None, :], other=0.0)
        acc += tl.sum(b.to(tl.float32) * a.to(tl.float32)[:, None, :], axis=2)
        for k0 in tl.range(BLOCK_K, K, BLOCK_K, num_stages=STAGES):
            a = tl.load(a_ptrs + k0 * stride_hk, mask=slot_ok[:, None] & (offs_k < K - k0)[None, :], other=0.0)
            b = tl.load(w_ptrs + k0 * stride_wk, mask=w_ok & (offs_k < K - k0)[None, None, :], other=0.0)
            acc += tl.sum(b.to(tl.float32) * a.to(tl.float32)[:, None, :], axis=2)
    o = tl.sum(acc * weight[:, None], axis=0)
    tl.store(out_ptr + t.to(tl.int64) * stride_om + offs_n * stride_on, o.to(out_ptr.dtype.element_ty), mask=offs_n < N)


# ---------------------------------------------------------------------------------------
# Kernels launched as they are: the reduce of unfused weighted rows, alignment, routing.


@triton.jit(do_not_specialize=["T"])
def sum_rows(rows_ptr, out_ptr, T, N, top_k, stride_rm, stride_om, stride_on, BLOCK_T: tl.constexpr,
              BLOCK_N: tl.constexpr, PDL: tl.constexpr = False):
    # out[t] = sum over j < k of rows[t * k + j], in slot order, fp32; BLOCK_T tokens and BLOCK_N
    # columns a program: grid = (T tiles, N tiles).  PDL: a link of a launch.Chain.
    chain_link(PDL)
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    offs = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (t < T)[:, None] & (offs < N)[None, :]
    row = t.to(tl.int64) * top_k
    acc = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
    for j in range(0, top_k):
        ptrs = rows_ptr + (row + j)[:, None] * stride_rm + offs[None, :]
        acc += tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    o_ptrs = out_ptr + t.to(tl.int64)[:, None] * stride_om + offs[None, :] * stride_on
    tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["numel", "sort"])
def _align_count(ids_ptr, counts_ptr, numel, num_experts, sort, BLOCK: tl.constexpr, BINS: tl.constexpr,
                 PDL: tl.constexpr = False):
    # counts[s, e] = how many of segment s's flat ids (BLOCK of them) are e.  ``sort`` (what
    # align chose, as for _align_scatter): one program a segment, a histogram of BINS >
    # num_experts bins; otherwise grid (experts, segments), each program counting one expert.
    # Ids outside [0, num_experts) are counted nowhere.  PDL (the three alignment kernels): a
    # link of a launch.Chain.
    chain_link(PDL)
    if sort:
        _align_histogram(ids_ptr, counts_ptr, numel, num_experts, tl.program_id(0), BLOCK, BINS)
    else:
        s = tl.program_id(1)
        e = tl.program_id(0)
        ids = _align_load(ids_ptr, s * BLOCK + tl.arange(0, BLOCK), numel, num_experts)
        tl.store(counts_ptr + s * num_experts + e, tl.sum((ids == e).to(tl.int32), axis=0))


@triton.jit
def _align_histogram(ids_ptr, counts_ptr, numel, num_experts, s, BLOCK: tl.constexpr, BINS: tl.constexpr):
    ids = _align_load(ids_ptr, s * BLOCK + tl.arange(0, BLOCK), numel, num_experts)
    bins = tl.arange(0, BINS)
    tl.store(counts_ptr + s * num_experts + bins, tl.histogram(ids, BINS), mask=bins < num_experts)


@triton.jit
def _align_load(ids_ptr, offs, numel, num_experts):
    # Flat ids offs as int32, num_experts past the end and for any id outside [0, num_experts).
    ids = tl.load(ids_ptr + offs, mask=offs < numel, other=num_experts).to(tl.int32)
    return tl.where((ids >= 0) & (ids < num_experts), ids, num_experts)


@triton.jit(do_not_specialize=["segments", "sort"])
def _align_offsets(counts_ptr, post_pad_ptr, num_experts, block_size, segments, sort, E_BLOCK: tl.constexpr,
                   S_BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    # One program: the counts [segments, experts] become where each segment's rows of each expert
    # go.  Expert e's padded range starts after the padded counts of the experts before it (each
    # summed over the segments); segment s's rows of e follow those of the segments before s.
    # Where _align_scatter sorts a segment's ids by expert (``sort``), what is stored is that
    # start less the segment's ids of the experts before e (where e's first id lands in the sorted
    # segment).
    # Row ``segments`` gets each expert's start, the row after its count; post_pad the padded total.
    chain_link(PDL)
    ex = tl.arange(0, E_BLOCK)
    experts = ex < num_experts
    totals = tl.zeros((E_BLOCK,), dtype=tl.int32)
    for s0 in range(0, segments, S_BLOCK):
        seg = s0 + tl.arange(0, S_BLOCK)
        ptrs = counts_ptr + seg[:, None] * num_experts + ex[None, :]
        totals += tl.sum(tl.load(ptrs, mask=(seg < segments)[:, None] & experts[None, :], other=0), axis=0)
    padded = (totals + block_size - 1) // block_size * block_size
    start = tl.cumsum(padded, axis=0) - padded
    run = start
    for s0 in range(0, segments, S_BLOCK):
        seg = s0 + tl.arange(0, S_BLOCK)
        ptrs = counts_ptr + seg[:, None] * num_experts + ex[None, :]
        mask = (seg < segments)[:, None] & experts[None, :]
        tile = tl.load(ptrs, mask=mask, other=0)
        before = (tl.cumsum(tile, axis=1) - tile) * sort  # the segment's ids of lower experts
        tl.store(ptrs, run[None, :] + tl.cumsum(tile, axis=0) - tile - before, mask=mask)
        run += tl.sum(tile, axis=0)
    tl.store(counts_ptr + segments * num_experts + ex, start, mask=experts)
    tl.store(counts_ptr + (segments + 1) * num_experts + ex, totals, mask=experts)
    tl.store(post_pad_ptr, tl.sum(padded, axis=0))


@triton.jit(do_not_specialize=["numel", "max_padded", "max_blocks", "segments", "sort"])
def _align_scatter(ids_ptr, offsets_ptr, sorted_ptr, experts_ptr, post_pad_ptr, numel, num_experts,
                   block_size, max_padded, max_blocks, segments, sort, BLOCK: tl.constexpr,
                   PDL: tl.constexpr = False):
    # Each segment's ids of each expert go, in order, from where _align_offsets put them, then
    # each expert's padding rows.  ``sort``: grid (segments + experts), program s < segments
    # sorting its segment's ids by (expert, position), program segments + e padding expert e.
    # Otherwise grid (experts, segments): program (e, s) takes segment s's ids of expert e (a
    # running prefix sum), and (e, 0) pads e.
    chain_link(PDL)
    if sort:
        p = tl.program_id(0)
        if p < segments:
            _align_sort_segment(ids_ptr, offsets_ptr, sorted_ptr, numel, num_experts, p, BLOCK)
        else:
            _align_pad_expert(offsets_ptr, sorted_ptr, experts_ptr, post_pad_ptr, numel, num_experts,
                              block_size, max_padded, max_blocks, segments, p - segments, BLOCK)
    else:
        _align_scan_segment(ids_ptr, offsets_ptr, sorted_ptr, numel, num_experts, tl.program_id(0),
                            tl.program_id(1), BLOCK)
        if tl.program_id(1) == 0:
            _align_pad_expert(offsets_ptr, sorted_ptr, experts_ptr, post_pad_ptr, numel, num_experts,
                              block_size, max_padded, max_blocks, segments, tl.program_id(0), BLOCK)


@triton.jit
def _align_scan_segment(ids_ptr, offsets_ptr, sorted_ptr, numel, num_experts, e, s, BLOCK: tl.constexpr):
    # Segment s's ids of expert e, in order, from its offset on.
    offs = s * BLOCK + tl.arange(0, BLOCK)
    hit = (_align_load(ids_ptr, offs, numel, num_experts) == e).to(tl.int32)
    to = tl.load(offsets_ptr + s * num_experts + e) + tl.cumsum(hit, axis=0) - hit
    tl.store(sorted_ptr + to, offs, mask=hit != 0)


@triton.jit
def _align_sort_segment(ids_ptr, offsets_ptr, sorted_ptr, numel, num_experts, s, BLOCK: tl.constexpr):
    # Segment s's ids sorted by (expert, position); the i-th goes to i + its expert's offset.
    lanes = tl.arange(0, BLOCK)
    ids = _align_load(ids_ptr, s * BLOCK + lanes, numel, num_experts)
    keys = tl.sort(ids * BLOCK + lanes)
    e = keys // BLOCK
    routed = e < num_experts
    to = tl.load(offsets_ptr + s * num_experts + e, mask=routed, other=0) + lanes
    tl.store(sorted_ptr + to, s * BLOCK + keys % BLOCK, mask=routed)


@triton.jit
def _align_pad_expert(offsets_ptr, sorted_ptr, experts_ptr, post_pad_ptr, numel, num_experts, block_size,
                      max_padded, max_blocks, segments, e, BLOCK: tl.constexpr):
    # Expert e's padding rows (numel) and its blocks' expert id, then its 1/E of the tail.
    lanes = tl.arange(0, BLOCK)
    start = tl.load(offsets_ptr + segments * num_experts + e)
    count = tl.load(offsets_ptr + (segments + 1) * num_experts + e)
    end = start + (count + block_size - 1) // block_size * block_size
    total = tl.load(post_pad_ptr)
    pad = tl.zeros((BLOCK,), dtype=tl.int32) + numel
    for q in range(start + count, end, BLOCK):
        tl.store(sorted_ptr + q + lanes, pad, mask=q + lanes < end)
    mine = tl.zeros((BLOCK,), dtype=tl.int32) + e
    for b in range(start // block_size, end // block_size, BLOCK):
        tl.store(experts_ptr + b + lanes, mine, mask=b + lanes < end // block_size)
    share = (max_padded - total + num_experts - 1) // num_experts
    lo = total + e * share
    hi = tl.minimum(lo + share, max_padded)
    for q in range(lo, hi, BLOCK):
        tl.store(sorted_ptr + q + lanes, pad, mask=q + lanes < hi)
    first_block = total // block_size
    share = (max_blocks - first_block + num_experts - 1) // num_experts
    lo = first_block + e * share
    hi = tl.minimum(lo + share, max_blocks)
    for b in range(lo, hi, BLOCK):
        tl.store(experts_ptr + b + lanes, tl.zeros((BLOCK,), dtype=tl.int32), mask=b + lanes < hi)


@triton.jit(do_not_specialize=["T"])
def _topk_softmax_kernel(logits_ptr, weights_ptr, ids_ptr, T, E, k, stride_lt, stride_le,
                         RENORMALIZE: tl.constexpr, BLOCK_T: tl.constexpr, E_BLOCK: tl.constexpr,
                         K_BLOCK: tl.constexpr, TRIGGER: tl.constexpr, bias_ptr=None, topk_group=1,
                         group_size=1, scale=1.0, SIGMOID: tl.constexpr = False,
                         HAS_BIAS: tl.constexpr = False, GROUPS: tl.constexpr = 1,
                         SCALED: tl.constexpr = False):
    # BLOCK_T tokens per program: the E scores in fp32 (softmax over the logits, or SIGMOID of
    # each), non-finite scores set to 0 (vLLM's rule: CUDA-graph padding rows give NaN logits,
    # and NaN weights crashed serving), then the k largest, the lowest expert index first among
    # equals.  Each score and its expert are one int64 key (the score's bits above, ordered as
    # the scores are; E_BLOCK - 1 - expert below), and Triton's bitonic
    # top-k keeps the K_BLOCK largest keys in one pass: per thread, then a few merges across
    # threads, each moving K_BLOCK keys at once.  (Before: k rounds of a row-wide argmax and a
    # removal.  At one token on an H200 the router took 5.5 against 5.9 us alone, and the chained
    # layer 30.1 against 31.0 us (qwen36), 29.6 against 31.0 (128 experts x 768):
    # exploration at commit 05ae135.)
    # DeepSeek-V3's routing (vLLM's grouped_topk), each part a constexpr that compiles to nothing
    # when off: HAS_BIAS adds bias[e] to the scores that choose (groups and experts), while the
    # weights are the unbiased scores; GROUPS > 1 splits the experts into GROUPS groups of
    # group_size, scores each group (its largest score; with a bias, the sum of its two largest
    # biased scores), keeps the topk_group best groups (the lowest index first among equals) and
    # chooses the k experts among theirs; SCALED multiplies the weights by scale (vLLM's
    # routed_scaling_factor) after any renormalization.
    # TRIGGER (Hopper and later): a kernel launched after this one as a programmatic dependent
    # launch (fused_moe's chained up GEMM) may start now; it waits on the device for this kernel to
    # finish before it reads.
    if TRIGGER:
        gdc_launch_dependents()
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    ex = tl.arange(0, E_BLOCK)
    in_t = rows < T
    in_e = ex < E
    row_ptrs = logits_ptr + rows.to(tl.int64)[:, None] * stride_lt
    x = tl.load(row_ptrs + ex[None, :] * stride_le, mask=in_t[:, None] & in_e[None, :], other=0.0).to(tl.float32)
    if SIGMOID:
        p = 1.0 / (1.0 + tl.exp(-x))
    else:
        x = tl.where(in_e[None, :], x, float("-inf"))
        row_max = tl.max(x, axis=1)
        p = tl.exp(x - row_max[:, None])
        row_sum = tl.sum(p, axis=1)
        p = p / row_sum[:, None]
    p = tl.where(tl.abs(p) < float("inf"), p, 0.0)  # NaN and +-Inf -> 0
    choose = p
    if HAS_BIAS:
        choose = p + tl.load(bias_ptr + ex, mask=in_e, other=0.0).to(tl.float32)[None, :]
    choose = tl.where(in_e[None, :], choose, float("-inf"))  # padding columns never picked
    if GROUPS > 1:
        grp = ex // group_size
        gi = tl.arange(0, GROUPS)
        gscore = tl.zeros((BLOCK_T, GROUPS), dtype=tl.float32)
        for g in tl.static_range(GROUPS):
            mine = (grp == g)[None, :]
            s = tl.where(mine, choose, float("-inf"))
            best = tl.max(s, axis=1)
            if HAS_BIAS:
                # The second largest: the largest once the first (lowest index) of the best is out.
                first = tl.min(tl.where(s == best[:, None], ex[None, :], E_BLOCK), axis=1)
                best += tl.max(tl.where(ex[None, :] == first[:, None], float("-inf"), s), axis=1)
            gscore = tl.where(gi[None, :] == g, best[:, None], gscore)
        # A group is kept when fewer than topk_group groups rank above it.
        a = gscore[:, :, None]
        b = gscore[:, None, :]
        above = (b > a) | ((b == a) & (gi[None, None, :] < gi[None, :, None]))
        kept = tl.sum(above.to(tl.int32), axis=2) < topk_group
        allowed = tl.zeros((BLOCK_T, E_BLOCK), dtype=tl.int1)
        for g in tl.static_range(GROUPS):
            kept_g = tl.sum(tl.where(gi[None, :] == g, kept.to(tl.int32), 0), axis=1) > 0
            allowed = allowed | ((grp == g)[None, :] & kept_g[:, None])
        choose = tl.where(allowed, choose, float("-inf"))
    bits = choose.to(tl.int32, bitcast=True)
    if HAS_BIAS:
        # Biased scores may be negative: flip the magnitude bits of negative ones, so that signed
        # integer order is float order.  (Unbiased scores are >= 0, and -inf's bits are a negative
        # integer: their bits order as they do.)
        bits = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    keys = (bits.to(tl.int64) << 32) | (E_BLOCK - 1 - ex)[None, :].to(tl.int64)
    if K_BLOCK == 1:
        top = tl.max(keys, axis=1, keep_dims=True)  # Triton 3.6's tl.topk fails to compile at k = 1
    else:
        top = tl.topk(keys, K_BLOCK, dim=1)  # [BLOCK_T, K_BLOCK], largest first
    idx = (E_BLOCK - 1 - (top & 0xFFFFFFFF)).to(tl.int32)
    kk = tl.arange(0, K_BLOCK)
    if HAS_BIAS:
        # The weights are the unbiased scores of the chosen experts, computed again as above.
        xk = tl.load(row_ptrs + idx * stride_le, mask=in_t[:, None] & (kk < k)[None, :], other=0.0).to(tl.float32)
        if SIGMOID:
            vals = 1.0 / (1.0 + tl.exp(-xk))
        else:
            vals = tl.exp(xk - row_max[:, None]) / row_sum[:, None]
        vals = tl.where(tl.abs(vals) < float("inf"), vals, 0.0)
    else:
        vals = (top >> 32).to(tl.int32).to(tl.float32, bitcast=True)
    if RENORMALIZE:
        total = tl.sum(tl.where(kk[None, :] < k, vals, 0.0), axis=1)
        vals = vals / tl.where(total > 0, total, 1.0)[:, None]  # all-zero (non-finite) rows stay 0
    if SCALED:
        vals = vals * scale
    offs = rows.to(tl.int64)[:, None] * k + kk[None, :]
    mask = in_t[:, None] & (kk < k)[None, :]
    tl.store(weights_ptr + offs, vals, mask=mask)
    tl.store(ids_ptr + offs, idx, mask=mask)


# ---------------------------------------------------------------------------------------
# Records of the generated kernels and buckets.

# The kernel kinds (a moe_launch record's ``kernel`` field, its choices in specs/kernels/moe.toml).
KernelKind = Literal["grouped", "gemv", "simt"]

@dataclass(frozen=True)
class KernelPair:
    """What a pair of specialized MoE kernels of generated/moe.py was generated with, 16-bit and
    FP8 alike (``up``: the first GEMM with the activation, ``down``: the second with the routing
    weights): the record's tile fields, as ``kernel_name`` spells them into the pair's name."""

    up: Any
    down: Any
    kind: KernelKind
    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int
    fuse_sum: bool
    # The down GEMM's own tile and warps (the spec's down_* fields; equal to the up GEMM's unless
    # the record says otherwise).
    down_block_n: int
    down_block_k: int
    down_num_warps: int
    # The down GEMM's pipelining depth (the spec's down_num_stages; the up GEMM's unless the record
    # says otherwise).
    down_num_stages: int
    # grouped: the expert weights through TMA descriptors where the call's layout allows
    # (the spec's weights_tma; weights_arg).
    weights_tma: bool = False

    @property
    def name(self) -> str:
        return self.up.__name__.removesuffix("_up")

    def weight_args(self, w1: torch.Tensor, w2: torch.Tensor, act: int) -> tuple[Any, Any, dict, dict]:
        """The grouped GEMMs' w1 and w2 arguments (TMA descriptors or the tensors, weights_arg; not
        for gpt-oss's interleaved w1) and each kernel's W_DESC keyword (none for a pair generated
        without weights_tma, whose wrappers take no W_DESC)."""
        w1_arg, up_desc = weights_arg(w1, self.block_n, self.block_k, self.weights_tma and act != 2)
        w2_arg, down_desc = weights_arg(w2, self.down_block_n, self.down_block_k, self.weights_tma)
        if not self.weights_tma:
            return w1_arg, w2_arg, {}, {}
        return w1_arg, w2_arg, {"W_DESC": up_desc}, {"W_DESC": down_desc}


def weights_arg(w: torch.Tensor, block_n: int, block_k: int, tma: bool) -> tuple[Any, bool]:
    """A grouped GEMM's expert weights [experts, rows, K] as its kernel takes them: where ``tma``
    (the record asks: its check puts it only on parts with TMA; Triton's interpreter runs
    descriptor loads too) and the layout allows it (K contiguous, 16-byte aligned base and rows,
    an expert a whole number of rows apart: packed, padded, or one expert's weights broadcast at
    stride 0, as warm-up passes them), a TMA descriptor over the rows of all experts, block_n x
    block_k tiles (the kernel's row is expert * (stride(0) // stride(1)) + n); else the tensor.
    The flag says which (the kernel's W_DESC)."""
    E, R, K = w.shape
    se, sn, sk = w.stride()
    es = w.element_size()
    ok = (
        tma and (w.is_cuda or _launch.INTERPRET) and sk == 1 and sn >= K and (sn * es) % 16 == 0
        and se >= 0 and se % sn == 0 and w.data_ptr() % 16 == 0
    )  # fmt: skip
    rows = (E - 1) * (se // sn) + R if ok else 0  # the last expert's end, in rows of sn elements
    if not ok or rows >= 2**31:  # (descriptor coordinates are int32)
        return w, False
    return step(TensorDescriptor, w, [rows, K], [sn, 1], [block_n, block_k]), True


@dataclass(frozen=True)
class Variant(KernelPair):
    """One pair of specialized 16-bit / fp32 kernels (moe_launch) and how to run it."""

    # simt: both GEMMs launched as programmatic dependent launches where the device has them.
    chained: bool = False

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
        ep: bool = False,
    ) -> None:
        """out[t] = sum_j weights[t, j] * act-and-mul(x[t] @ w1[e].T) @ w2[e].T, e = ids[t, j],
        for checked, non-empty operands (``weights`` and ``ids`` flat and contiguous).  ``ep``:
        ids may be -1 (an expert on another rank; expert parallelism), and such rows are skipped
        and add nothing; the gemv and simt kernels are then their EP specialization, the grouped
        ones are unchanged (alignment leaves those rows out)."""
        T, H = x.shape
        inter = w2.shape[2]
        numel = weights.numel()
        k = numel // T
        # Torch ops between the launches go through ``step``: a call cache's plan replays them.
        h = step(torch.empty, (numel, inter), dtype=x.dtype, device=x.device)
        # simt's loops set their own depth (tl.range, the STAGES its wrappers pass), so its
        # launches leave Triton's kernel-wide one at 1.
        simt = self.kind == "simt"
        opts = dict(num_warps=self.num_warps, num_stages=1 if simt else self.num_stages)
        down_opts = dict(num_warps=self.down_num_warps, num_stages=1 if simt else self.down_num_stages)
        if self.kind in ("gemv", "simt"):
            # One routed row a program (up), one token a program (down).  simt's down kernel takes
            # the padded expert count; gemv's whether its K steps divide I.  Chained (simt): the up
            # kernel waits on the device for the kernel before it (the router) and releases the
            # down kernel as it starts; the down kernel loads its first weights, then waits for the
            # up kernel.  Each launch returns at once; nothing syncs with the host.
            link: dict[str, Any] = {"EP": ep}
            down_last: dict[str, Any] = {"EVEN_K": inter % self.down_block_k == 0}
            if simt:
                link = dict(EP=ep, **(_launch.Chain(x).link() if self.chained else {"PDL": False}))
                down_last = {"KB": _launch.pow2ceil(k)}
            _launch.launch_kernel(
                self.up, (numel, _launch.cdiv(inter, self.block_n)),
                x, w1, h, ids, inter, H, k, x.stride(0), x.stride(1), *w1.stride(), *h.stride(),
                act, H % self.block_k == 0, **link, **opts,
            )  # fmt: skip
            _launch.launch_kernel(
                self.down, (T, _launch.cdiv(H, self.down_block_n)),
                h, w2, out, weights, ids, H, inter, k, *h.stride(), *w2.stride(), *out.stride(),
                **down_last, **link, **down_opts,
            )  # fmt: skip
            return
        # The alignment, the GEMMs and the reduce are links of one chain of programmatic dependent
        # launches where the device has them (Hopper and later), the GEMMs launched plainly (as
        # fused_moe_fp8's: policy_runtime/moe/fp8.py's Fp8Variant.run says why).
        chain = _launch.Chain(x)
        sorted_ids, expert_ids, post_pad = align(ids, self.block_m, num_experts, chain)
        # Row blocks that can hold rows: each expert's full blocks, plus one partial block for
        # each expert that has any.  Past it (and past post_pad) nothing is launched or done.
        blocks = min(expert_ids.numel(), numel // self.block_m + min(num_experts, numel))
        w1_arg, w2_arg, up_desc_kw, down_desc_kw = self.weight_args(w1, w2, act)
        _launch.launch_kernel(
            self.up, (blocks * _launch.cdiv(inter, self.block_n),),
            x, w1_arg, h, sorted_ids, expert_ids, post_pad, numel, blocks, inter, H, k,
            x.stride(0), x.stride(1), *w1.stride(), *h.stride(), act, H % self.block_k == 0,
            **chain.link(dependent=False), **up_desc_kw, **opts,
        )  # fmt: skip
        grid = (blocks * _launch.cdiv(H, self.down_block_n),)
        if self.fuse_sum:
            # In warm-up's compile-only scope nothing runs, and out is left as it was.
            compiling = _launch.compiling()
            if out.dtype == torch.float32:
                acc = out if compiling else step(torch.Tensor.zero_, out)
            else:
                acc = step(torch.zeros, (T, H), dtype=torch.float32, device=x.device)
            _launch.launch_kernel(
                self.down, grid,
                h, w2_arg, acc, weights, sorted_ids, expert_ids, post_pad, numel, blocks, H, inter, k,
                *h.stride(), *w2.stride(), *acc.stride(), inter % self.down_block_k == 0,
                **chain.link(dependent=False), **down_desc_kw, **down_opts,
            )  # fmt: skip
            if acc is not out and not compiling:
                step(torch.Tensor.copy_, out, acc)
            return
        # One expert a token: its weighted row is the token's output.  With expert parallelism the
        # rows of other ranks' experts are never written: they start at zero.
        if k == 1:
            rows = step(torch.Tensor.zero_, out) if ep and not _launch.compiling() else out
        else:
            rows = step(torch.zeros if ep else torch.empty, (numel, H), dtype=x.dtype, device=x.device)
        _launch.launch_kernel(
            self.down, grid,
            h, w2_arg, rows, weights, sorted_ids, expert_ids, post_pad, numel, blocks, H, inter, k,
            *h.stride(), *w2.stride(), *rows.stride(), inter % self.down_block_k == 0,
            **chain.link(dependent=False), **down_desc_kw, **down_opts,
        )  # fmt: skip
        if k > 1:
            block_n = min(SUM_BLOCK, _launch.pow2ceil(H))
            block_t = SUM_BLOCK // block_n
            _launch.launch_kernel(
                sum_rows, (_launch.cdiv(T, block_t), _launch.cdiv(H, block_n)),
                rows, out, T, H, k, rows.stride(0), out.stride(0), out.stride(1),
                BLOCK_T=block_t, BLOCK_N=block_n, **chain.link(), num_warps=4,
            )  # fmt: skip


@dataclass(frozen=True)
class Bucket:
    """One bucket of a policy: its name and its kernels."""

    name: str
    variant: Variant


# A target's policy for one dtype: its buckets in order, and the function that picks one for a
# call's shape (T tokens, experts of intermediate size I).
Policy = tuple[tuple[Bucket, ...], Callable[[int, int], Bucket]]


# ---------------------------------------------------------------------------------------
# Checks on a call (every problem a ValueError naming the argument).


def fail(op: str, message: str) -> None:
    raise ValueError(f"{op}: {message}")


def tensor_arg(op: str, name: str, t: Any, dims: int) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        fail(op, f"{name} must be a tensor, got {type(t).__name__}")
    if t.dim() != dims:
        fail(op, f"{name} must have {dims} dimensions, got shape {tuple(t.shape)}")
    return t


def same_device(op: str, name: str, t: torch.Tensor, first: torch.Tensor, first_name: str) -> None:
    if t.device != first.device:
        fail(op, f"{name} is on {t.device} but {first_name} is on {first.device}")


def index_tensor(op: str, name: str, t: torch.Tensor) -> None:
    if t.dtype not in _INDEX_DTYPES:
        fail(op, f"{name} must be int32 or int64, got {t.dtype}")


def _experts_count(op: str, name: str, n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= _MAX_EXPERTS:
        fail(op, f"{name} must be an int from 1 to {_MAX_EXPERTS}, got {n!r}")
    return n


def check_fused(
    op: str,
    x: Any,
    w1: Any,
    w2: Any,
    topk_weights: Any,
    topk_ids: Any,
    activation: Any,
    out: Any,
    dtypes: Any,
    weight_dtype: Optional[torch.dtype] = None,
) -> tuple[int, int, int, int, int]:
    """(T, H, I, E, k) of a valid call of ``op``: fused_moe (weights of hidden_states' dtype) or
    fused_moe_fp8 (``weight_dtype`` e4m3fn weights; its scales are checked apart)."""
    x = tensor_arg(op, "hidden_states", x, 2)
    T, H = x.shape
    if x.dtype not in dtypes:
        fail(op, f"hidden_states must be float16, bfloat16 or float32 (the output's dtype), got {x.dtype}")
    w1 = tensor_arg(op, "w1", w1, 3)
    E, two_i, h1 = w1.shape
    if h1 != H or two_i % 2:
        fail(op, f"w1 must be [E, 2 * I, H] with H = {H} (hidden_states' columns), got {tuple(w1.shape)}")
    w2 = tensor_arg(op, "w2", w2, 3)
    if tuple(w2.shape) != (E, H, two_i // 2):
        fail(op, f"w2 must be [E, H, I] = {(E, H, two_i // 2)} to match w1 {tuple(w1.shape)}, got {tuple(w2.shape)}")
    if E == 0:
        fail(op, "w1 and w2 have no experts")
    for name, w in (("w1", w1), ("w2", w2)):
        if weight_dtype is not None and w.dtype != weight_dtype:
            fail(op, f"{name} must be {weight_dtype} (w8a8 FP8), got {w.dtype}")
        if weight_dtype is None and w.dtype != x.dtype:
            fail(op, f"{name} must have hidden_states' dtype {x.dtype}, got {w.dtype}")
    topk_weights = tensor_arg(op, "topk_weights", topk_weights, 2)
    topk_ids = tensor_arg(op, "topk_ids", topk_ids, 2)
    if topk_weights.shape[0] != T or topk_weights.shape[1] < 1:
        fail(op, f"topk_weights must be [T, k] with T = {T} and k >= 1, got {tuple(topk_weights.shape)}")
    if topk_ids.shape != topk_weights.shape:
        fail(op, f"topk_ids must have topk_weights' shape {tuple(topk_weights.shape)}, got {tuple(topk_ids.shape)}")
    if not topk_weights.is_floating_point():
        fail(op, f"topk_weights must be a float tensor, got {topk_weights.dtype}")
    index_tensor(op, "topk_ids", topk_ids)
    if activation not in ACTIVATIONS:
        fail(op, f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    named = [("w1", w1), ("w2", w2), ("topk_weights", topk_weights), ("topk_ids", topk_ids)]
    if out is not None:
        out = tensor_arg(op, "out", out, 2)
        if tuple(out.shape) != (T, H):
            fail(op, f"out must have shape {(T, H)}, got {tuple(out.shape)}")
        if out.dtype != x.dtype:
            fail(op, f"out must have hidden_states' dtype {x.dtype}, got {out.dtype}")
        if H > 1 and T > 1 and (out.stride(1) != 1 or out.stride(0) < H):
            fail(op, f"out must have unit column stride and rows that do not overlap, got strides {out.stride()}")
        named.append(("out", out))
    for name, t in named:
        same_device(op, name, t, x, "hidden_states")
    _launch.check_runnable(op, "hidden_states", x)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (x, w1, w2, topk_weights)):
        fail(op, "an input requires grad, and the kernels have no backward")
    return T, H, two_i // 2, E, topk_ids.shape[1]


def check_expert_map(op: str, expert_map: Any, topk_ids: torch.Tensor, local_experts: Optional[int]) -> torch.Tensor:
    """A checked expert map: [global experts] int32/int64 on topk_ids' device, each entry a local
    expert id or -1 (its entries range-checked only on the host: check_routing_on_host)."""
    m = tensor_arg(op, "expert_map", expert_map, 1)
    index_tensor(op, "expert_map", m)
    same_device(op, "expert_map", m, topk_ids, "topk_ids")
    if m.shape[0] < 1:
        fail(op, "expert_map is empty: it maps each global expert id to this rank's id, or -1")
    if local_experts is not None and m.shape[0] < local_experts:
        fail(op, f"expert_map has {m.shape[0]} global experts, fewer than the {local_experts} of w1 and w2")
    return m


def check_routing_on_host(op: str, topk_ids: torch.Tensor, experts: int, expert_map: Optional[torch.Tensor]) -> None:
    """Routing that is on the host already (CPU tensors, the interpreter's): each id an expert of
    w1 and w2, or with ``expert_map`` one of its global experts, and each map entry a local expert
    or -1.  On a GPU this would take a device sync, so there an id out of range is not checked
    (the grouped kernels skip it, the small-T kernels read out of bounds), as vLLM's."""
    if not topk_ids.is_cpu or topk_ids.numel() == 0:
        return
    n = experts if expert_map is None else expert_map.shape[0]
    bad = _launch.first_outside(topk_ids, 0, n)
    if bad is not None:
        t, j = bad
        whose = "expert_map's global experts" if expert_map is not None else "the experts of w1 and w2"
        fail(op, f"topk_ids[{t}, {j}] = {int(topk_ids[t, j])} is not one of {whose} (0 to {n - 1})")
    if expert_map is not None and expert_map.is_cpu:
        bad = _launch.first_outside(expert_map, -1, experts)
        if bad is not None:
            (g,) = bad
            fail(op, f"expert_map[{g}] = {int(expert_map[g])} is neither an expert of w1 and w2 "
                     f"(0 to {experts - 1}) nor -1 (another rank's)")  # fmt: skip


# ---------------------------------------------------------------------------------------
# Alignment and routing (no policy: one launch shape for every target).


def align(ids: torch.Tensor, block_size: int, num_experts: int, chain: _launch.Chain,
          named: Optional[list] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # Checked, flat, contiguous ids; the three launches are links of the caller's ``chain``.
    # ``named`` (a list) gets the counts and expert ids.
    numel = ids.numel()
    max_padded = numel + num_experts * (block_size - 1)
    max_blocks = _launch.cdiv(max_padded, block_size)
    segments = align_segments(numel)
    sizes = align_sizes(max_padded, max_blocks, num_experts, segments)
    sorted_ids, expert_ids, post_pad, counts = step(_align_buffers, ids, sizes)
    sort = int(numel * num_experts >= _ALIGN_SORT_FROM)
    grid = (segments,) if sort else (num_experts, segments)
    _launch.launch_kernel(
        _align_count, grid, ids, counts, numel, num_experts, sort, BLOCK=_ALIGN_BLOCK,
        BINS=_launch.pow2ceil(num_experts + 1), **chain.link(), num_warps=4,
    )  # fmt: skip
    e_block = _launch.pow2ceil(num_experts)
    _launch.launch_kernel(
        _align_offsets, (1,), counts, post_pad, num_experts, block_size, segments, sort,
        E_BLOCK=e_block, S_BLOCK=max(1, _ALIGN_TILE // e_block), **chain.link(), num_warps=4,
    )  # fmt: skip
    _launch.launch_kernel(
        _align_scatter, (segments + num_experts,) if sort else grid,
        ids, counts, sorted_ids, expert_ids, post_pad, numel, num_experts, block_size, max_padded, max_blocks,
        segments, sort, BLOCK=_ALIGN_BLOCK, **chain.link(), num_warps=4,
    )  # fmt: skip
    if named is not None:
        named += [counts, expert_ids]
    return sorted_ids, expert_ids, post_pad


def align_segments(numel: int) -> int:
    """The segments of the flat ids the alignment kernels split among programs, _ALIGN_BLOCK
    ids each; at least one."""
    return max(1, _launch.cdiv(numel, _ALIGN_BLOCK))


def align_sizes(max_padded: int, max_blocks: int, num_experts: int, segments: int) -> list[int]:
    """The int32 buffer of one alignment, split: sorted ids, expert ids, post_pad and the
    per-segment counts (then offsets) with each expert's start and count, each starting 16 bytes
    in (Triton specializes on that), the gaps between them."""
    def pad(n: int) -> int:
        return _launch.cdiv(n, 4) * 4 - n

    return [max_padded, pad(max_padded), max_blocks, pad(max_blocks), 1, 3, (segments + 2) * num_experts]


def _align_buffers(ids: torch.Tensor, sizes: list[int]) -> tuple[torch.Tensor, ...]:
    # One allocation (each costs the host microseconds), split into the four tensors.
    parts = torch.empty(sum(sizes), dtype=torch.int32, device=ids.device).split_with_sizes(sizes)
    return parts[0], parts[2], parts[4], parts[6]


def moe_align_block_size(
    topk_ids: Any, block_size_m: Any, num_experts: Any, *, expert_map: Any = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """vLLM's moe_align_block_size; generated/moe.py's docstring says what it returns.  A call
    of a class seen before replays its launches (call_cache.py)."""
    key, plan = lookup(
        _ALIGN_CALLS,
        topk_ids,
        lambda: (tensor_key(topk_ids), args_key(block_size_m, num_experts, expert_map)),
    )
    if plan is not None and plan is not NO_PLAN:
        ids = topk_ids.reshape(-1).contiguous()
        sorted_ids, expert_ids, post_pad, counts = _align_buffers(ids, plan.data)
        with _launch.on_device(topk_ids):
            plan.launch((ids, counts, sorted_ids, expert_ids, post_pad))
            if expert_map is not None:
                expert_ids = expert_map[expert_ids.long()].to(torch.int32)
        return sorted_ids, expert_ids, post_pad
    if key is None or plan is NO_PLAN:
        return _moe_align_block_size(topk_ids, block_size_m, num_experts, expert_map)
    named: list = []
    with _ALIGN_CALLS.record() as rec:
        result = _moe_align_block_size(topk_ids, block_size_m, num_experts, expert_map, named)
    if named:
        ids, (sorted_ids, _, post_pad) = named[0], result
        counts, expert_ids = named[1], named[2]
        max_padded = sorted_ids.shape[0]
        sizes = align_sizes(max_padded, expert_ids.shape[0], num_experts, align_segments(ids.numel()))
        _ALIGN_CALLS.commit(rec, key, (ids, counts, sorted_ids, expert_ids, post_pad), data=sizes)
    else:
        _ALIGN_CALLS.commit(rec, key, ())
    return result


def _moe_align_block_size(topk_ids, block_size_m, num_experts, expert_map, named=None):
    # The full path; ``named`` (a list) gets the flat ids, the counts and the expert ids it launched with.
    op = "moe_align_block_size"
    if not isinstance(topk_ids, torch.Tensor):
        fail(op, f"topk_ids must be a tensor, got {type(topk_ids).__name__}")
    index_tensor(op, "topk_ids", topk_ids)
    if isinstance(block_size_m, bool) or not isinstance(block_size_m, int) or block_size_m < 1:
        fail(op, f"block_size_m must be a positive int, got {block_size_m!r}")
    _experts_count(op, "num_experts", num_experts)
    if topk_ids.numel() >= 2**31 - num_experts * block_size_m:
        fail(op, f"topk_ids has {topk_ids.numel():,} elements; the int32 sorted ids need fewer")
    if expert_map is not None:
        expert_map = check_expert_map(op, expert_map, topk_ids, None)
        if expert_map.shape[0] != num_experts:
            fail(op, f"expert_map must have num_experts = {num_experts} entries, got {expert_map.shape[0]}")
    _launch.check_runnable(op, "topk_ids", topk_ids)
    with _launch.on_device(topk_ids):
        ids = topk_ids.reshape(-1).contiguous()
        # The three launches one dependent chain on Hopper and later (launch.Chain).
        sorted_ids, expert_ids, post_pad = align(ids, block_size_m, num_experts, _launch.Chain(ids), named)
        if named is not None:
            named.insert(0, ids)
        if expert_map is not None:
            # As vLLM: every block's global expert through the map, -1 for another rank's.
            expert_ids = expert_map[expert_ids.long()].to(torch.int32)
        return sorted_ids, expert_ids, post_pad


def topk_softmax(gating_logits: Any, k: Any, renormalize: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's topk_softmax; generated/moe.py's docstring says what it returns."""
    return _route("topk_softmax", gating_logits, k, renormalize, "softmax", None, 1, 1, 1.0)


# Router scorings, as vLLM's grouped_topk names them.
SCORINGS = ("softmax", "sigmoid")


def grouped_topk(
    gating_logits: Any,
    k: Any,
    renormalize: Any,
    *,
    scoring_func: Any = "softmax",
    e_score_correction_bias: Any = None,
    num_expert_group: Any = 1,
    topk_group: Any = 1,
    routed_scaling_factor: Any = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's grouped_topk (DeepSeek-V3's routing); generated/moe.py's docstring says what it returns."""
    return _route(
        "grouped_topk", gating_logits, k, renormalize, scoring_func, e_score_correction_bias,
        num_expert_group, topk_group, routed_scaling_factor,
    )  # fmt: skip


def _positive_int(op: str, name: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        fail(op, f"{name} must be a positive int, got {v!r}")
    return v


def _route(
    op: str, gating_logits: Any, k: Any, renormalize: Any, scoring: Any, bias: Any, groups: Any, topk_group: Any,
    scale: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    # A call of a class seen before replays its launch (call_cache.py).
    key, plan = lookup(
        _ROUTE_CALLS,
        gating_logits,
        lambda: (
            op, tensor_key(gating_logits), args_key(k, renormalize, scoring, bias, groups, topk_group, scale),
        ),
    )  # fmt: skip
    if plan is not None and plan is not NO_PLAN:
        x = gating_logits
        if bias is not None and bias.stride(0) != 1 and bias.shape[0] > 1:
            bias = bias.contiguous()
        weights, ids = new_like(plan.data[0]), new_like(plan.data[1])
        with _launch.on_device(x):
            plan.launch((x, weights, ids, bias))
        return weights, ids
    if key is None or plan is NO_PLAN:
        return _route_full(op, gating_logits, k, renormalize, scoring, bias, groups, topk_group, scale, None)
    named: list = []
    with _ROUTE_CALLS.record() as rec:
        weights, ids = _route_full(op, gating_logits, k, renormalize, scoring, bias, groups, topk_group, scale,
                                   named)  # fmt: skip
    _ROUTE_CALLS.commit(rec, key, (gating_logits, weights, ids, named[0] if named else None),
                        data=(template(weights), template(ids)))  # fmt: skip
    return weights, ids


def _route_full(
    op: str, gating_logits: Any, k: Any, renormalize: Any, scoring: Any, bias: Any, groups: Any, topk_group: Any,
    scale: Any, named: Optional[list],
) -> tuple[torch.Tensor, torch.Tensor]:
    # The full path of a router call; ``named`` (a list) gets the bias it launched with.
    x = tensor_arg(op, "gating_logits", gating_logits, 2)
    if not x.is_floating_point():
        fail(op, f"gating_logits must be a float tensor, got {x.dtype}")
    T, E = x.shape
    _experts_count(op, "gating_logits' columns (experts)", E)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= E:
        fail(op, f"k must be an int from 1 to the {E} experts, got {k!r}")
    if not isinstance(renormalize, bool):
        fail(op, f"renormalize must be a bool, got {renormalize!r}")
    if scoring not in SCORINGS:
        fail(op, f"scoring_func must be one of {list(SCORINGS)}, got {scoring!r}")
    groups = _positive_int(op, "num_expert_group", groups)
    topk_group = _positive_int(op, "topk_group", topk_group)
    if E % groups or groups & (groups - 1):
        fail(op, f"num_expert_group must be a power of two dividing the {E} experts, got {groups}")
    if topk_group > groups:
        fail(op, f"topk_group must be at most num_expert_group {groups}, got {topk_group}")
    if k > topk_group * (E // groups):
        fail(op, f"k {k} is more than the {topk_group * (E // groups)} experts of topk_group {topk_group} groups")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        fail(op, f"routed_scaling_factor must be a finite number, got {scale!r}")
    if bias is not None:
        bias = tensor_arg(op, "e_score_correction_bias", bias, 1)
        if bias.shape[0] != E or not bias.is_floating_point():
            fail(
                op,
                f"e_score_correction_bias must be a float tensor of shape ({E},), got {bias.dtype} {tuple(bias.shape)}",
            )
        same_device(op, "e_score_correction_bias", bias, x, "gating_logits")
        if E > 1 and bias.stride(0) != 1:
            bias = bias.contiguous()
    _launch.check_runnable(op, "gating_logits", x)
    weights = torch.empty((T, k), dtype=torch.float32, device=x.device)
    ids = torch.empty((T, k), dtype=torch.int32, device=x.device)
    if T == 0:
        return weights, ids
    e_block = _launch.pow2ceil(E)
    # Up to 64 tokens a call (decode), one token a program: at T = 1 and 4 (256 experts, top-8) 9.9 ->
    # 6.0 us a call against 16-token, 4-warp tiles on an H200, where the tile's cross-warp
    # reductions were most of the time (exploration at commit cc8149c, the k-round
    # top-k).  A warp per 128 experts (4 logits a lane), up to 4: with the one-pass top-k, 256
    # experts on 2 warps took the router 5.3 against 5.6 us and the chained layer at T = 1 about
    # 0.4 us less than on one; 128 experts gained nothing from a second
    # (exploration at commit 03e74a8).  Larger calls keep the tiles of up to 4,096 logits.
    small = T <= TOPK_ONE_ROW_MAX_T
    block_t = 1 if small else max(1, min(64, 4096 // e_block))
    warps = min(4, max(1, e_block // 128)) if small else 4
    # The DeepSeek-V3 parts only where asked: the plain softmax router launches as it always did.
    # With any of them, every argument is positional (the bias too): call_cache.py replays only
    # positional tensors, and direct.py only named arguments that follow the positional ones.
    extra: tuple = ()
    if scoring == "sigmoid" or bias is not None or groups > 1 or scale != 1.0:
        grouped = groups > 1
        extra = (
            bias, topk_group if grouped else 1, E // groups if grouped else 1, float(scale) if scale != 1.0 else 1.0,
            scoring == "sigmoid", bias is not None, groups, scale != 1.0,
        )  # fmt: skip
        if named is not None:
            named.append(bias)
    with _launch.on_device(x):
        if extra:
            _launch.launch_kernel(
                _topk_softmax_kernel, (_launch.cdiv(T, block_t),),
                x, weights, ids, T, E, k, x.stride(0), x.stride(1), renormalize, block_t, e_block,
                _launch.pow2ceil(k), _launch.programmatic(x), *extra, num_warps=warps,
            )  # fmt: skip
        else:
            _launch.launch_kernel(
                _topk_softmax_kernel, (_launch.cdiv(T, block_t),),
                x, weights, ids, T, E, k, x.stride(0), x.stride(1), RENORMALIZE=renormalize,
                BLOCK_T=block_t, E_BLOCK=e_block, K_BLOCK=_launch.pow2ceil(k),
                TRIGGER=_launch.programmatic(x), num_warps=warps,
            )  # fmt: skip
    return weights, ids


# ---------------------------------------------------------------------------------------
# The entry points over one generated module's tables.


@dataclass(frozen=True)
class MoE(PolicyTables):
    """fused_moe, buckets and select of generated/moe.py, over its tables (each target's
    ``Policy`` per variant); ``fp8``: fused_moe_fp8's (policy_runtime.moe_fp8.MoEFp8), which
    serve the dtype float8_e4m3fn; ``routing``: each model's MoERouting record by target (the
    router and activation its layers call, which warm-up compiles)."""

    fp8: Any = None
    routing: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def policy(self, dtype: torch.dtype, hw: Any, device: Any) -> Policy:
        if self.fp8 is not None and dtype == torch.float8_e4m3fn:
            return self.fp8.policy(dtype, hw, device)
        if dtype not in self.variant_of_dtype:
            fail("fused_moe", f"dtype must be float16, bfloat16 or float32, got {dtype}")
        return super().policy(dtype, hw, device)

    def select(self, T: int, I: int, dtype: torch.dtype, hw: Any, device: Any) -> Bucket:
        return self.policy(dtype, hw, device)[1](T, I)

    def fused_moe(
        self,
        x: Any,
        w1: Any,
        w2: Any,
        topk_weights: Any,
        topk_ids: Any,
        activation: Any,
        out: Any,
        hw: Any,
        variant: Optional[Variant] = None,
        expert_map: Any = None,
    ) -> torch.Tensor:
        """The fused MoE layer into out (or a new tensor), by the bucket's kernels for T and the
        experts' intermediate size (or by ``variant``'s, for tests and benchmarks).  A call of a
        class seen before replays its plan (call_cache.py): the alignment, the allocations and
        the launches of its full path, back to back."""
        key, plan = lookup(
            _FUSED_CALLS,
            x,
            lambda: (
                id(self), tensor_key(x), tensor_key(w1), tensor_key(w2), tensor_key(topk_weights),
                tensor_key(topk_ids), args_key(activation, out, hw, expert_map), variant,
            ),
        )  # fmt: skip
        if plan is not None and plan is not NO_PLAN:
            return replay_routed("fused_moe", plan, x, w1, w2, topk_weights, topk_ids, out, expert_map, ())
        if key is None or plan is NO_PLAN or grad_needed(x, w1, w2, topk_weights, out):
            return self._fused_moe(x, w1, w2, topk_weights, topk_ids, activation, out, hw, variant, expert_map)
        named: list = []
        with _FUSED_CALLS.record() as rec:
            result = self._fused_moe(x, w1, w2, topk_weights, topk_ids, activation, out, hw, variant, expert_map,
                                     named)  # fmt: skip
        _FUSED_CALLS.commit(rec, key, tuple(named))
        return result

    def _fused_moe(self, x, w1, w2, topk_weights, topk_ids, activation, out, hw, variant, expert_map, named=None):
        # The full path; ``named`` (a list) gets the tensors its launches take (run_routed's).
        T, H, inter, E, k = check_fused(
            "fused_moe", x, w1, w2, topk_weights, topk_ids, activation, out, self.variant_of_dtype
        )
        if expert_map is not None:
            expert_map = check_expert_map("fused_moe", expert_map, topk_ids, E)
        if variant is None:
            variant = self.policy(x.dtype, hw, x.device)[1](T, inter).variant
        bf16 = _launch.interpreted_bf16_dots(x) if variant.kind != "simt" else None  # simt kernels: no dots
        if bf16 is not None:
            fail("fused_moe", f"hidden_states are {bf16} (the {variant.kind} kernels of {variant.name})")
        return run_routed(
            "fused_moe", variant.run, x, w1, w2, topk_weights, topk_ids, out, activation, (T, H, inter, E), expert_map, named
        )


def replay_routed(
    op: str,
    plan: Any,
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    out: Optional[torch.Tensor],
    expert_map: Optional[torch.Tensor],
    extra: tuple,
) -> torch.Tensor:
    """A call cache's hit of fused_moe or fused_moe_fp8: run_routed's output and routing, then
    ``plan`` over the tensors run_routed names (``extra``: the scales fused_moe_fp8 names).  The
    routing is passed [T, k] where the launches took its flat view: the same memory, contiguous."""
    check_routing_on_host(op, topk_ids, w1.shape[0], expert_map)
    given = out is not None
    if out is None:
        # run_routed's contiguous [T, H] of x's dtype, for a third of torch.empty's host time.
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    weights = topk_weights.contiguous()
    ids = topk_ids.contiguous()
    with _launch.on_device(x):
        if expert_map is not None:
            ids = expert_map[ids.long()].to(torch.int32)
        plan.run((x, w1, w2, weights, ids, out, *extra))
    if given:
        torch.autograd.graph.increment_version(out)
    return out


def run_routed(
    op: str,
    run: Callable[..., None],
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    out: Optional[torch.Tensor],
    activation: str,
    dims: tuple[int, int, int, int],
    expert_map: Optional[torch.Tensor],
    named: Optional[list] = None,
) -> torch.Tensor:
    """The host side fused_moe and fused_moe_fp8 share after their checks: the output (new, or
    ``out``), the empty cases, Triton's one-off setup, the flat routing (through ``expert_map`` to
    this rank's ids) and ``run`` (a variant's ``run``, its scales bound) under x's device guard.
    ``dims``: T, H, the experts' intermediate size and the local expert count.  ``named`` (a
    list, for a call cache's plan) gets x, w1, w2, the flat weights and ids and out, as the
    launches take them (replay_routed passes them so)."""
    T, H, inter, E = dims
    check_routing_on_host(op, topk_ids, E, expert_map)
    given = out is not None
    if out is None:
        out = torch.empty((T, H), dtype=x.dtype, device=x.device)
    if T == 0 or H == 0:
        return out
    if inter == 0:
        return out.zero_()
    weights = topk_weights.contiguous().view(-1)
    ids = topk_ids.contiguous().view(-1)
    with _launch.on_device(x):
        if expert_map is not None:
            # Global ids to this rank's (-1: another rank's expert), one gather on the device.
            ids = expert_map[ids.long()].to(torch.int32)
        if named is not None:
            named += (x, w1, w2, weights, ids, out)
        run(x, w1, w2, weights, ids, out, ACTIVATIONS[activation], E, ep=expert_map is not None)
    if given:
        # A write autograd did not see: saved tensors that alias out now fail backward loudly.
        torch.autograd.graph.increment_version(out)
    return out
