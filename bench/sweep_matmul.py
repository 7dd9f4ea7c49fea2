#!/usr/bin/env python3
"""Sweep Triton matmul configs against cuBLAS on one GPU: the tool for choosing a target's policy.

    python3 bench/sweep_matmul.py                                   # default shapes and candidates
    python3 bench/sweep_matmul.py --shapes 5120x512x2048 --rounds 6
    python3 bench/sweep_matmul.py --shapes 128x4096x4096 --candidates grp:128x64x128:w4s4:sk2 sm:16x64x256:w4s3
    python3 bench/sweep_matmul.py --cpu-smoke --hw h200             # tiny fp16 shapes, interpreter

A candidate runs one of the kernel bodies that generated/matmul.py specializes (``_grouped``,
``_small_m``, ``_tma_persistent`` of policy_runtime/matmul.py) with its constants given at launch,
so a winner goes into specs/kernels/matmul.toml as it is, with one difference: a grp or sm
candidate's ``skK`` always splits K ways, while a policy's ``split_k`` is a ceiling that a launch
lowers where its tiles fill the SMs (a tma candidate's ``skK`` is that same ceiling, on the tiles
of its last partial wave).
Candidate syntax, fields after the kind in any order:

    grp:BMxBNxBK:wWsS[:skK][:gG]              grouped pointer kernel, split-K K, GROUP_M G
    sm:BMxBNxBK:wWsS[:skK]                    small_m (decode) kernel
    tma:BMxBNxBK:wWsS[:pP|:pSM][:fl][:epi2][:gG][:skK]   persistent TMA kernel, P programs (SM:
                                              the part's SM count), flattened loop, split
                                              epilogue, last partial wave split up to K ways

Per shape: each candidate's output (NaN-poisoned) is checked twice against a float32 reference
(relative error < 1e-2), then cuBLAS, the target policy's own Triton kernel for the shape
(``matmul_triton``) and every passing candidate are timed in interleaved rounds with
bench/timing.py (GPU time, L2 flushed); the table gives TFLOP/s and the median ratio to cuBLAS
(> 1: faster).  JSON to $OUT/sweep_matmul.json when $OUT is set.  The candidate lists below are the
ones behind the h200 policy's small bucket (bench/RESULTS.md; that run timed with do_bench).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", nargs="*", help="MxNxK shapes (default: those with a candidate list below)")
    p.add_argument("--candidates", nargs="*", help="candidates for every shape (default: the shape's list)")
    p.add_argument("--rounds", type=int, default=4, help="interleaved timing rounds")
    p.add_argument("--hw", default=None, help="hardware spec name (default: detect the device)")
    p.add_argument("--cpu-smoke", action="store_true", help="tiny fp16 shapes in the interpreter")
    return p.parse_args()


ARGS = parse()
if ARGS.cpu_smoke:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402

from bench.timing import cpu_ms, gpu_ms, interleaved, rel_err  # noqa: E402
from generated import dispatch  # noqa: E402
from generated import matmul as mm  # noqa: E402
from policy_runtime import matmul as rt  # noqa: E402  (the kernel bodies and launch rules)

DEVICE = "cpu" if ARGS.cpu_smoke else "cuda"
DTYPE = torch.float16 if ARGS.cpu_smoke else torch.bfloat16

# Candidate lists per shape (the 2026-11-30 H200 exploration, bench/results/h200_explore1_*.json).
CANDIDATES = {
    (5120, 512, 2048): [
        "grp:64x128x64:w4s3",
        "grp:64x128x64:w4s4",
        "grp:128x64x64:w4s3",
        "grp:128x128x64:w4s3",
        "grp:128x128x64:w4s3:sk2",
        "grp:128x256x64:w8s3:sk2",
        "grp:64x256x64:w4s3",
        "grp:64x64x64:w4s4",
        "tma:128x128x64:w8s4:pSM",
        "tma:128x128x64:w4s3:p264:epi2",
        "tma:64x128x64:w4s4:p264",
        "tma:128x256x64:w8s3:p80",
        "tma:256x128x64:w8s3:p80",
    ],
    (128, 4096, 4096): [
        "grp:64x64x128:w4s3:sk2",
        "grp:128x64x128:w4s3:sk2",
        "grp:128x64x128:w4s4:sk2",
        "grp:128x64x64:w4s6:sk2",
        "grp:128x128x64:w8s4:sk4",
        "grp:128x128x128:w8s3:sk4",
        "grp:64x128x128:w4s3:sk2",
        "sm:128x64x128:w4s3:sk2",
        "sm:128x64x64:w4s5:sk2",
        "tma:64x64x128:w4s4:pSM",
        "tma:128x64x64:w4s5:pSM",
    ],
    (5120, 2048, 2048): [
        "tma:128x128x64:w8s5:pSM:fl:g16",
        "tma:128x256x64:w8s4:pSM:fl:epi2:g16",
        "tma:128x256x64:w8s4:pSM:fl:epi2:g16:sk4",
        "tma:128x128x64:w4s3:p264:epi2",
        "grp:128x128x64:w8s4",
        "grp:128x256x64:w8s3",
    ],
}
SMOKE_SHAPES = [(33, 72, 48), (130, 96, 304), (5, 200, 72)]  # rows of 16-byte multiples: TMA-describable
SMOKE_CANDIDATES = [
    "grp:32x32x32:w4s1",
    "grp:32x64x32:w4s2:sk2:g4",
    "sm:16x32x64:w4s2:sk2",
    "tma:32x32x32:w4s2:pSM:fl:epi2",
    "tma:32x32x32:w4s2:p4:sk4:g2",  # 6 tiles of (33, 72): a wave of 4, the last 2 split 2 ways
]


class BadCandidate(ValueError):
    pass


_CAND = re.compile(r"^(grp|sm|tma):(\d+)x(\d+)x(\d+):w(\d+)s(\d+)((?::[a-z]+\w*)*)$")


def parse_candidate(text: str, sm_count: int) -> dict:
    m = _CAND.match(text)
    if not m:
        raise BadCandidate(f"bad candidate {text!r} (see --help for the syntax)")
    kind, bm, bn, bk, w, s, rest = m.groups()
    c = dict(kind=kind, BM=int(bm), BN=int(bn), BK=int(bk), W=int(w), S=int(s), SK=1, G=8, P=sm_count, FL=False, EPI=1)
    for opt in filter(None, rest.split(":")):
        if opt.startswith("sk") and opt[2:].isdigit():
            c["SK"] = int(opt[2:])
        elif opt.startswith("g") and opt[1:].isdigit():
            c["G"] = int(opt[1:])
        elif opt == "pSM":
            c["P"] = sm_count
        elif opt.startswith("p") and opt[1:].isdigit():
            c["P"] = int(opt[1:])
        elif opt == "fl":
            c["FL"] = True
        elif opt == "epi2":
            c["EPI"] = 2
        else:
            raise BadCandidate(f"unknown option {opt!r} in {text!r}")
    return c


def launcher(c: dict, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor):
    """A no-argument launch of candidate ``c`` computing out = a @ b (buffers made here)."""
    M, K = a.shape
    N = b.shape[1]
    prec = "ieee" if a.dtype == torch.float32 else "tf32"
    if c["kind"] == "tma":
        if any(rt._tma_layout(t) != (False, t.stride(0)) for t in (a, b, out)):
            raise ValueError("operands TMA cannot describe (row strides must be multiples of 16 bytes)")
        tiles = triton.cdiv(M, c["BM"]) * triton.cdiv(N, c["BN"])
        # The matmul launcher's own split rule, on a record with this candidate's constants.
        rule = SimpleNamespace(kind="tma_persistent", split_k=c["SK"], num_programs=c["P"])
        splits, last = rt._splits(rule, tiles), rt._split_tiles(rule, tiles)
        ws = torch.zeros(max(last * splits * c["BM"] * c["BN"], 1), dtype=torch.float32, device=a.device)
        cnt = torch.zeros(max(last, 1), dtype=torch.int32, device=a.device)
        grid = (min(c["P"], tiles * splits),)
        return lambda: rt._tma_persistent[grid](
            a, b, out, ws, cnt, M, N, K, splits, a.stride(0), b.stride(0), out.stride(0), A_TRANS=False,
            B_TRANS=False, BLOCK_M=c["BM"], BLOCK_N=c["BN"], BLOCK_K=c["BK"], GROUP_M=c["G"],
            SPLIT_K=c["SK"], NUM_PROGS=c["P"], EPILOGUE_SUBTILE=c["EPI"], FLATTEN=c["FL"], DOT_PREC=prec,
            num_warps=c["W"], num_stages=c["S"],
        )  # fmt: skip
    gm, gn = triton.cdiv(M, c["BM"]), triton.cdiv(N, c["BN"])
    ws, cnt = out, out  # unused without split-K
    if c["SK"] > 1:  # fp32 partials and self-resetting counters, as the launcher (rt) allocates them
        ws = torch.zeros(gm * gn * c["SK"] * c["BM"] * c["BN"], dtype=torch.float32, device=a.device)
        cnt = torch.zeros(gm * gn, dtype=torch.int32, device=a.device)
    strides = (a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1))
    if c["kind"] == "sm":
        return lambda: rt._small_m[(gn, c["SK"], gm)](
            a, b, out, ws, cnt, M, N, K, *strides, BLOCK_M=c["BM"], BLOCK_N=c["BN"], BLOCK_K=c["BK"],
            SPLIT_K=c["SK"], STAGES=c["S"], DOT_PREC=prec, num_warps=c["W"], num_stages=c["S"],
        )  # fmt: skip
    return lambda: rt._grouped[(gm * gn, c["SK"])](
        a, b, out, ws, cnt, M, N, K, *strides, EVEN_K=K % c["BK"] == 0, BLOCK_M=c["BM"], BLOCK_N=c["BN"],
        BLOCK_K=c["BK"], GROUP_M=c["G"], SPLIT_K=c["SK"], DOT_PREC=prec, num_warps=c["W"], num_stages=c["S"],
    )  # fmt: skip


def sweep_shape(M: int, N: int, K: int, names: list[str], hw: str, sm_count: int) -> dict:
    torch.manual_seed(0)
    a = torch.randn(M, K, device=DEVICE, dtype=torch.float32).to(DTYPE)
    b = torch.randn(K, N, device=DEVICE, dtype=torch.float32).to(DTYPE)
    ref = a.float() @ b.float()
    bucket = mm.select(M, N, K, dtype=DTYPE, hw=hw, device=a.device)
    methods = {
        "cublas": lambda: torch.matmul(a, b),
        f"policy ({bucket.triton.name})": lambda: mm.matmul_triton(a, b, hw=hw),
    }
    result = {"shape": [M, N, K], "bucket": bucket.name, "failed": {}}
    for name in names:
        out = torch.full((M, N), float("nan"), device=DEVICE, dtype=DTYPE)
        try:
            run = launcher(parse_candidate(name, sm_count), a, b, out)
            errs = []
            for _ in range(2):  # a second run catches state left behind (split-K counters)
                out.fill_(float("nan"))
                run()
                errs.append(rel_err(out, ref))
            if not all(math.isfinite(e) and e < 1e-2 for e in errs):
                result["failed"][name] = f"relative error {errs}"
                continue
            methods[name] = run
        except Exception as e:  # noqa: BLE001 - a config that does not compile or fit is a result
            result["failed"][name] = f"{type(e).__name__}: {str(e)[:300]}"
    timer = cpu_ms if ARGS.cpu_smoke else gpu_ms
    timed = interleaved(methods, 1 if ARGS.cpu_smoke else ARGS.rounds, "cublas", timer)
    flops = 2.0 * M * N * K
    result["timed"] = {n: {"tflops": flops / t["ms"] / 1e9, **t} for n, t in timed.items()}
    print(f"\n{M}x{N}x{K} (policy bucket {bucket.name}); ratio = cuBLAS time / candidate time")
    for n, t in sorted(result["timed"].items(), key=lambda kv: -kv[1]["ratio"]):
        print(f"  {n:44s} {t['tflops']:8.1f} TF/s  {t['ms'] * 1e3:9.1f} us  {t['ratio']:.3f}x", flush=True)
    for n, why in result["failed"].items():
        print(f"  {n:44s} FAILED: {why}", flush=True)
    return result


def main() -> int:
    hw = dispatch.target_name(ARGS.hw)
    sm_count = dispatch.HARDWARE[hw].sm_count
    if not ARGS.cpu_smoke:
        triton.set_allocator(rt._descriptor_scratch)  # the descriptor scratch the launcher sets per launch
    shapes = SMOKE_SHAPES if ARGS.cpu_smoke else list(CANDIDATES)
    if ARGS.shapes:
        shapes = [tuple(int(x) for x in s.split("x")) for s in ARGS.shapes]
    meta = {"target": hw, "torch": torch.__version__, "triton": triton.__version__, "device": DEVICE}
    if not ARGS.cpu_smoke:
        meta["device"] = torch.cuda.get_device_name()
    print(json.dumps(meta))
    plan = [(s, ARGS.candidates or (SMOKE_CANDIDATES if ARGS.cpu_smoke else CANDIDATES.get(s, []))) for s in shapes]
    try:  # every candidate parses before anything runs
        for _, names in plan:
            for name in names:
                parse_candidate(name, sm_count)
    except BadCandidate as e:
        print(f"sweep_matmul: {e}", file=sys.stderr)
        return 2
    results = [sweep_shape(*shape, names, hw, sm_count) for shape, names in plan]
    out = os.environ.get("OUT")
    if out:
        Path(out, "sweep_matmul.json").write_text(json.dumps({"meta": meta, "shapes": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
