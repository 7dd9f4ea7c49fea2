#!/usr/bin/env python3
"""How a block-scaled FP8 matmul's per-K-step scaling runs on the H200: the variants tried for
specs/kernels/scaled_mm.toml's block tiles (issue 35), standalone, beside the generated kernel.

    python3 bench/scaled_mm_block_variants.py            # on a GPU (~2 min)
    TRITON_INTERPRET=1 python3 bench/scaled_mm_block_variants.py   # CPU: every variant's result

C = (A * scale_a) @ (B * scale_b) with 1x128 scales on A and 128x128 on B: each 128-deep K step's
product is scaled before it joins the accumulator.  Variants: base (scale_a and scale_b as two
vectors: two multiplies and an add an element, as policy_runtime/scaled_mm/ops.py did before),
FOLD (scale_b one value a tile, folded into the row scales: one multiply-add), PIPE (the next
step's dot issued before this step's product is scaled: two products in flight), WS (tl.range's
warp_specialize), over tile shapes.  Prints TFLOP/s (triton.testing.do_bench) and the error
against fp32 on the dequantized inputs, with our bf16 matmul_triton and torch.matmul beside.
"""

import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu-smoke", action="store_true", help="every variant on a small problem in the interpreter")
    p.add_argument("--hw", default=None, help="hardware spec name for the generated kernel's row (default: detect)")
    return p.parse_args()


ARGS = parse()

from policy_runtime.matmul.ops import tile_coords  # noqa: E402  (the generated kernels' tile order)
from policy_runtime.scaled_mm.tune import ScaledMmProblem  # noqa: E402
from policy_runtime.report import quiet_on_closed_pipe  # noqa: E402

CPU = ARGS.cpu_smoke or not torch.cuda.is_available()
DEV = "cpu" if CPU else "cuda"


@triton.jit
def blockmm(
    a_ptr,
    b_ptr,
    c_ptr,
    sa_ptr,
    sb_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    stride_sam,
    stride_sak,
    stride_sbk,
    stride_sbn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    PIPE: tl.constexpr,
    WS: tl.constexpr,
    FOLD: tl.constexpr,
):
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = tile_coords(tl.program_id(0), num_pid_m, num_pid_n, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    sa_ptrs = sa_ptr + offs_m * stride_sam
    sb_one = sb_ptr + ((pid_n * BLOCK_N) // 128) * stride_sbn
    sb_ptrs = sb_ptr + (offs_n // 128) * stride_sbn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    KT = K // BLOCK_K
    if PIPE:
        a = tl.load(a_ptrs, mask=mask_m[:, None], other=0.0)
        b = tl.load(b_ptrs, mask=mask_n[None, :], other=0.0)
        s_prev = tl.load(sa_ptrs, mask=mask_m, other=0.0) * tl.load(sb_one)
        d_prev = tl.dot(a, b)
        for kt in range(1, KT):
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
            a = tl.load(a_ptrs, mask=mask_m[:, None], other=0.0)
            b = tl.load(b_ptrs, mask=mask_n[None, :], other=0.0)
            s = tl.load(sa_ptrs + kt * stride_sak, mask=mask_m, other=0.0) * tl.load(sb_one + kt * stride_sbk)
            d = tl.dot(a, b)
            acc += d_prev * s_prev[:, None]
            d_prev = d
            s_prev = s
        acc += d_prev * s_prev[:, None]
    else:
        for kt in tl.range(0, KT, warp_specialize=WS):
            a = tl.load(a_ptrs, mask=mask_m[:, None], other=0.0)
            b = tl.load(b_ptrs, mask=mask_n[None, :], other=0.0)
            sa = tl.load(sa_ptrs + kt * stride_sak, mask=mask_m, other=0.0)
            if FOLD:
                s = sa * tl.load(sb_one + kt * stride_sbk)
                acc += tl.dot(a, b) * s[:, None]
            else:
                sb = tl.load(sb_ptrs + kt * stride_sbk, mask=mask_n, other=0.0)
                acc += tl.dot(a, b) * sa[:, None] * sb[None, :]
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


def run(a, b, sa, sb, c, cfg):
    bm, bn, bk, w, st, pipe, ws, fold = cfg
    M, K = a.shape
    N = b.shape[1]
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
    blockmm[grid](
        a,
        b,
        c,
        sa,
        sb,
        M,
        N,
        K,
        a.stride(0),
        a.stride(1),
        b.stride(0),
        b.stride(1),
        c.stride(0),
        c.stride(1),
        sa.stride(0),
        sa.stride(1),
        sb.stride(0),
        sb.stride(1),
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=bk,
        GROUP_M=8,
        PIPE=pipe,
        WS=ws,
        FOLD=fold,
        num_warps=w,
        num_stages=st,
    )


def problem(M, N, K):
    """e4m3 a (M, K), b the (K, N) view of a row-major weight, 1x128 / 128x128 scales, and the fp64
    reference on the dequantized inputs: ``codegen tune scaled_mm``'s problem (block scaling)."""
    p = ScaledMmProblem(dict(m=M, n=N, k=K), torch.float32, DEV, "block")
    return p.a, p.b, p.sa, p.sb, p.reference


CFGS = {
    # name: (bm, bn, bk, warps, stages, pipe, ws, fold)
    "base 128x128 w8 s4": (128, 128, 128, 8, 4, False, False, False),
    "fold 128x128 w8 s4": (128, 128, 128, 8, 4, False, False, True),
    "fold 128x128 w8 s3": (128, 128, 128, 8, 3, False, False, True),
    "pipe 128x128 w8 s4": (128, 128, 128, 8, 4, True, False, True),
    "pipe 128x128 w8 s3": (128, 128, 128, 8, 3, True, False, True),
    "fold 64x128 w4 s4": (64, 128, 128, 4, 4, False, False, True),
    "fold 64x128 w4 s3": (64, 128, 128, 4, 3, False, False, True),
    "pipe 64x128 w4 s4": (64, 128, 128, 4, 4, True, False, True),
    "ws 128x128 w8 s4": (128, 128, 128, 8, 4, False, True, True),
    "ws 128x128 w4 s4": (128, 128, 128, 4, 4, False, True, True),
    "fold 128x64 w4 s4": (128, 64, 128, 4, 4, False, False, True),
    "pipe 128x64 w4 s4": (128, 64, 128, 4, 4, True, False, True),
}


def main():
    if CPU:
        a, b, sa, sb, want = problem(64, 256, 384)
        for name, cfg in CFGS.items():
            cfg = (32, min(cfg[1], 128), 128, *cfg[3:])
            c = torch.empty(64, 256, device=DEV)
            run(a, b, sa, sb, c, cfg)
            err = ((c - want).abs().max() / want.abs().max()).item()
            print(f"{name}: rel err {err:.2e}")
            assert err < 1e-5, name
        return
    from generated import scaled_mm as SMM
    from generated import matmul as MM

    shapes = [(4096, 4096, 4096), (8192, 8192, 8192), (16384, 4096, 4096), (2048, 7168, 2048), (512, 4096, 4096)]
    for M, N, K in shapes:
        a, b, sa, sb, want = problem(M, N, K)
        flops = 2 * M * N * K
        c = torch.empty(M, N, device=DEV, dtype=torch.bfloat16)
        row = {}
        ab, bb = (
            torch.randn(M, K, device=DEV, dtype=torch.bfloat16),
            torch.randn(N, K, device=DEV, dtype=torch.bfloat16).t(),
        )
        fns = {
            "generated block": lambda: SMM.scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16, out=c, hw=ARGS.hw),
            "bf16 matmul_triton": lambda: MM.matmul_triton(ab, bb),
            "bf16 torch": lambda: torch.matmul(ab, bb),
        }
        for name, cfg in CFGS.items():
            fns[name] = lambda cfg=cfg: run(a, b, sa, sb, c, cfg)
        for name, fn in fns.items():
            try:
                fn()
                torch.cuda.synchronize()
                if "bf16" not in name:
                    err = ((c.float() - want).abs().max() / want.abs().max()).item()
                else:
                    err = float("nan")
                ms = triton.testing.do_bench(fn, warmup=50, rep=300)
                row[name] = flops / ms / 1e9
                print(f"{M}x{N}x{K} {name:22s} {flops / ms / 1e9:8.1f} TFLOP/s  err {err:.1e}", flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"{M}x{N}x{K} {name:22s} FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
        best = max((v, k) for k, v in row.items() if "bf16" not in k)
        print(
            f"{M}x{N}x{K} best {best[1]} {best[0]:.1f}; vs bf16 matmul_triton {best[0] / row.get('bf16 matmul_triton', float('nan')):.2f}x",
            flush=True,
        )


if __name__ == "__main__":
    sys.exit(quiet_on_closed_pipe(main))
