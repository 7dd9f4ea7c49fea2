#!/usr/bin/env python3
"""Host cost of an eager call of every public entry point against a bare launch of the same Triton
kernels with the same arguments (issue 33: an eager call should cost about a launch).

    python3 bench/host_cost.py                          # on a GPU (~30 s)
    python3 bench/host_cost.py --cpu-smoke --hw h200 [--noop-launch] [--profile NAME]

One call per entry point (a tiny problem: a loop measures the host) records its launches (kernel,
grid, arguments); then interleaved rounds time ITERS eager calls, ITERS replays through Triton's
``JITFunction.run`` ("bare": binding, key, cache lookup, launch), and on a GPU ITERS calls of the
compiled kernels' launchers with all that worked out once ("direct", policy_runtime/direct.py's
``replay``: the floor of a cached launch path), and ITERS eager calls with that cache off
(``POLICY_RUNTIME_DIRECT_LAUNCH=0``'s path); synchronized only around each loop, the median over
rounds per call.  Also
``matmul_triton`` against ``torch.matmul`` at 1x4096x4096.  ``--noop-launch`` replaces launches by
no-ops (the wrapper alone, on the CPU); ``--profile NAME`` cProfiles NAME's eager loop.  JSON to
$OUT/host_cost.json (or --json PATH).
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import io
import os
import platform
import pstats
import statistics
import sys
import time
import traceback
from pathlib import Path

from smoke import smoke_setup

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu-smoke", action="store_true", help="tiny fp16 problems in the interpreter")
    p.add_argument("--hw", default=None, help="hardware spec name (default: detect the device)")
    p.add_argument("--iters", type=int, default=None, help="calls per loop (default 2000; smoke 2; noop 2000)")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 7; smoke 1)")
    p.add_argument("--noop-launch", action="store_true", help="launches are no-ops: the wrapper alone")
    p.add_argument("--profile", default=None, help="cProfile this entry point's eager loop")
    p.add_argument("--only", nargs="*", default=None, help="entry points to run (default: all)")
    p.add_argument("--json", default=None, help="JSON path (default $OUT/host_cost.json)")
    return p.parse_args()


ARGS = parse()
SMOKE = smoke_setup(ARGS)  # before torch and Triton are imported

import torch  # noqa: E402
import triton  # noqa: E402

from bench.runlog import RunLog  # noqa: E402
from policy_runtime import direct as DIRECT  # noqa: E402
from generated import attention as AT  # noqa: E402
from generated import cache as C  # noqa: E402
from generated import matmul as MM  # noqa: E402
from generated import moe as MOE  # noqa: E402
from generated import scaled_mm as SMM  # noqa: E402
from generated import transform as TR  # noqa: E402
from generated.dispatch import target_name  # noqa: E402
from policy_runtime.report import quiet_on_closed_pipe  # noqa: E402

if SMOKE:
    torch.set_num_threads(1)  # a CPU loop of tiny ops: no intra-op threads spinning beside it
DEV = "cpu" if SMOKE else "cuda"
DT = torch.float16 if SMOKE else torch.bfloat16
HW = ARGS.hw
ITERS = ARGS.iters or (2000 if (ARGS.noop_launch or not SMOKE) else 2)
ROUNDS = ARGS.rounds or (1 if SMOKE and not ARGS.noop_launch else 7)
LIMIT_US = 5.0
RES: dict = {"meta": {}, "entries": [], "matmul_eager": None, "errors": []}
RUN = RunLog("host_cost", RES, smoke=SMOKE, json_arg=ARGS.json)
log, write_json = RUN.log, RUN.write

# ---------------------------------------------------------------------------------------
# Recording launches


def _launcher_class():
    if SMOKE:
        from triton.runtime.interpreter import InterpretedFunction

        return InterpretedFunction
    return triton.runtime.jit.JITFunction


LAUNCHER = _launcher_class()
REAL_RUN = LAUNCHER.run
_RECORD: list = []
_MODE = {"record": False, "noop": False}


def _run(self, *args, grid, warmup, **kwargs):
    if _MODE["record"] and not warmup:
        _RECORD.append((self, grid, args, dict(kwargs)))
    if _MODE["noop"] and not warmup:
        return None
    return REAL_RUN(self, *args, grid=grid, warmup=warmup, **kwargs)


LAUNCHER.run = _run


def record(fn) -> list:
    """The launches one call of fn makes (it runs them too, unless --noop-launch), with the
    direct-launch cache off: every launch through Triton's launcher, where it is recorded."""
    _RECORD.clear()
    _MODE["record"] = True
    try:
        with DIRECT.enabled(False):
            fn()
    finally:
        _MODE["record"] = False
    return list(_RECORD)


def bare(launches):
    """Replays of the recorded launches through Triton's own launcher, nothing else."""

    def run():
        for kernel, grid, args, kwargs in launches:
            _run(kernel, *args, grid=grid, warmup=False, **kwargs)

    return run


def direct(launches):
    """The floor under the bare launch: each recorded launch's compiled kernel called through its
    driver launcher directly (policy_runtime/direct.py's ``replay``, the call its cache makes on a
    hit, without the key or the lookup).  Valid only while the arguments stay the same objects
    (they do in the loop).  GPU only."""
    steps = [DIRECT.replay(kernel, grid, args, kwargs) for kernel, grid, args, kwargs in launches]

    def run():
        for step in steps:
            step()

    return run


def uncached(fn):
    """An eager call with the direct-launch cache off (every launch through JITFunction.run)."""

    def run():
        with DIRECT.enabled(False):
            fn()

    return run


# ---------------------------------------------------------------------------------------
# Timing


def sync():
    if not SMOKE:
        torch.cuda.synchronize()


def loop_us(fn, iters) -> float:
    sync()
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - t) / iters * 1e6


def timed(methods: dict, iters: int, rounds: int) -> dict:
    """Per method: the median over rounds of its loop's us per call (and, as "<name> min", the
    fastest round: on a shared host the least disturbed); the methods interleaved, each round in
    another order."""
    names = list(methods)
    for fn in methods.values():  # warm: a first call's one-off costs off the clock
        fn()
    times: dict = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for n in order:
            times[n].append(loop_us(methods[n], iters))
    return {**{n: statistics.median(t) for n, t in times.items()}, **{f"{n} min": min(t) for n, t in times.items()}}


# ---------------------------------------------------------------------------------------
# The entry points on tiny problems


def rnd(*shape, dtype=None):
    return torch.randn(*shape, device=DEV).to(dtype or DT)


def entries() -> dict:
    """name -> a closure making one eager call of the entry point on a tiny problem."""
    e = {}
    a, b = rnd(1, 64), rnd(64, 64)
    out = torch.empty(1, 64, device=DEV, dtype=DT)
    e["matmul_triton"] = lambda: MM.matmul_triton(a, b, out=out, hw=HW)
    e["matmul"] = lambda: MM.matmul(a, b, out=out, hw=HW)

    x, w, res = rnd(4, 256), rnd(256), rnd(4, 256)
    e["rms_norm"] = lambda: TR.rms_norm(x, w, 1e-6, hw=HW)
    e["rms_norm (residual)"] = lambda: TR.rms_norm(x, w, 1e-6, residual=res, hw=HW)
    gu = rnd(4, 512)
    e["silu_and_mul"] = lambda: TR.silu_and_mul(gu, hw=HW)
    e["gelu_tanh_and_mul"] = lambda: TR.gelu_tanh_and_mul(gu, hw=HW)
    e["swigluoai_and_mul"] = lambda: TR.swigluoai_and_mul(gu, hw=HW)
    e["mul_and_silu"] = lambda: TR.mul_and_silu(gu, hw=HW)
    H, KH, hs = 4, 2, 64
    pos = torch.arange(4, device=DEV)
    q, k = rnd(4, H * hs), rnd(4, KH * hs)
    cos_sin = rnd(16, hs, dtype=torch.float32)
    e["rotary_embedding"] = lambda: TR.rotary_embedding(pos, q, k, cos_sin, hs, True, hw=HW)

    nb, bs = 8, 16
    kc, vc = rnd(nb, bs, KH, hs), rnd(nb, bs, KH, hs)
    key, value = rnd(4, KH, hs), rnd(4, KH, hs)
    slots = torch.arange(4, device=DEV, dtype=torch.int64)
    e["reshape_and_cache"] = lambda: C.reshape_and_cache(key, value, kc, vc, slots, hw=HW)
    kcs, vcs = [rnd(nb, bs, KH, hs) for _ in range(2)], [rnd(nb, bs, KH, hs) for _ in range(2)]
    mapping = torch.tensor([[0, 4], [1, 5]], device=DEV, dtype=torch.int64)
    e["copy_blocks"] = lambda: C.copy_blocks(kcs, vcs, mapping, hw=HW)
    swap_map = torch.tensor([[0, 3], [2, 5]], dtype=torch.int64)  # on the CPU, as vLLM's
    e["swap_blocks"] = lambda: C.swap_blocks(kcs[0], kcs[1], swap_map)

    n = 8
    pq, pk, pv = rnd(n, H, hs), rnd(n, KH, hs), rnd(n, KH, hs)
    cu = torch.tensor([0, n], device=DEV, dtype=torch.int32)
    pout = torch.empty_like(pq)
    e["prefill_attention"] = lambda: AT.prefill_attention(pq, pk, pv, cu, cu, n, n, out=pout, hw=HW)
    dq = rnd(2, H, hs)
    table = torch.arange(4, device=DEV, dtype=torch.int32).view(2, 2)
    lens = torch.tensor([20, 9], device=DEV, dtype=torch.int32)
    dout = torch.empty_like(dq)
    e["decode_attention"] = lambda: AT.decode_attention(dq, kc, vc, table, lens, out=dout, hw=HW)

    E, Hd, inter, topk = 8, 64, 32, 2
    mx = rnd(1, Hd)
    w1, w2 = rnd(E, 2 * inter, Hd), rnd(E, Hd, inter)
    logits = torch.randn(1, E, device=DEV)
    # The routing made by torch, not by topk_softmax: under --noop-launch no kernel writes it.
    weights, ids = torch.topk(torch.softmax(logits, dim=-1), topk)
    weights, ids = weights / weights.sum(dim=-1, keepdim=True), ids.to(torch.int32)
    mout = torch.empty_like(mx)
    e["topk_softmax"] = lambda: MOE.topk_softmax(logits, topk, True)
    e["fused_moe"] = lambda: MOE.fused_moe(mx, w1, w2, weights, ids, out=mout, hw=HW)
    bias = torch.randn(E, device=DEV)
    e["grouped_topk"] = lambda: MOE.grouped_topk(
        logits, topk, True, scoring_func="sigmoid", e_score_correction_bias=bias, num_expert_group=2, topk_group=1
    )
    ids16 = torch.randint(0, E, (16, topk), device=DEV, dtype=torch.int32)
    e["moe_align_block_size"] = lambda: MOE.moe_align_block_size(ids16, 16, E)
    if HW not in MOE.UNSERVED_FP8:
        # w8a8 FP8 on one token (the activations quantized in the call): 128-block and per-tensor
        # scales; one 128-wide block of H and I (the block scales' least).
        fH = fI = 128
        fp8 = torch.float8_e4m3fn
        f1 = rnd(E, 2 * fI, fH, dtype=torch.float32).to(fp8)
        f2 = rnd(E, fH, fI, dtype=torch.float32).to(fp8)
        fx, ones = rnd(1, fH), lambda *shape: torch.ones(*shape, device=DEV)
        fout = torch.empty_like(fx)
        b1, b2, s1, s2 = ones(E, 2, 1), ones(E, 1, 1), ones(E), ones(E)
        e["fused_moe_fp8 (block)"] = lambda: MOE.fused_moe_fp8(
            fx, f1, f2, weights, ids, w1_scale=b1, w2_scale=b2, block_shape=[128, 128], out=fout, hw=HW
        )
        e["fused_moe_fp8 (tensor)"] = lambda: MOE.fused_moe_fp8(
            fx, f1, f2, weights, ids, w1_scale=s1, w2_scale=s2, out=fout, hw=HW
        )
    if HW not in SMM.UNSERVED:
        # FP8 matmul, 128 x 128 x 256 (two 128-deep scale blocks, so block scales are not read as
        # per-row ones): per-tensor and 128-block scales; b a transposed view, as cuBLASLt takes it.
        fp8 = torch.float8_e4m3fn
        sa_, sb_ = rnd(128, 256, dtype=torch.float32).to(fp8), rnd(128, 256, dtype=torch.float32).to(fp8).t()
        smm_out = torch.empty(128, 128, device=DEV, dtype=DT)
        one = torch.ones((), device=DEV)
        ba, bb = torch.ones(128, 2, device=DEV), torch.ones(2, 1, device=DEV)
        e["scaled_mm (tensor)"] = lambda: SMM.scaled_mm(sa_, sb_, one, one, out_dtype=DT, out=smm_out, hw=HW)
        e["scaled_mm (block)"] = lambda: SMM.scaled_mm(sa_, sb_, ba, bb, out_dtype=DT, out=smm_out, hw=HW)
    if ARGS.only:
        unknown = set(ARGS.only) - set(e)
        if unknown:
            sys.exit(f"--only: unknown entry points {sorted(unknown)}; known: {sorted(e)}")
        e = {k: v for k, v in e.items() if k in ARGS.only}
    return e


def measure(name, fn) -> dict:
    launches = record(fn)
    row = {
        "entry": name,
        "launches": len(launches),
        "kernels": [
            getattr(k, "__name__", None) or getattr(getattr(k, "fn", None), "__name__", "?") for k, *_ in launches
        ],
    }
    if not launches:
        row["eager_us"] = timed({"eager": fn}, ITERS, ROUNDS)["eager"]
        row["note"] = "no Triton launch on this call (a vendor or PyTorch path): timed alone"
        return row
    methods = {"eager": fn, "bare": bare(launches), "eager, cache off": uncached(fn)}
    if not SMOKE and not ARGS.noop_launch:
        try:
            methods["direct"] = direct(launches)
        except Exception as e:  # noqa: BLE001
            row["direct_error"] = f"{type(e).__name__}: {str(e)[:300]}"
    t = timed(methods, ITERS, ROUNDS)
    if "direct" in t:
        row["direct_us"] = t["direct"]
    row.update(eager_us=t["eager"], bare_us=t["bare"], over_bare_us=t["eager"] - t["bare"])
    row["eager_cache_off_us"] = t["eager, cache off"]
    row.update(eager_min_us=t["eager min"], bare_min_us=t["bare min"], over_bare_min_us=t["eager min"] - t["bare min"])
    row["within_limit"] = row["over_bare_us"] <= LIMIT_US
    return row


def matmul_eager() -> dict:
    """matmul_triton against torch.matmul at 1x4096x4096 (a tiny stand-in in the smoke run),
    eager loops, and the bare launch of matmul_triton's kernels."""
    M, N, K = (1, 40, 64) if SMOKE else (1, 4096, 4096)
    a, b = rnd(M, K), rnd(K, N)
    out = torch.empty(M, N, device=DEV, dtype=DT)
    ours = lambda: MM.matmul_triton(a, b, out=out, hw=HW)  # noqa: E731
    launches = record(ours)
    methods = {
        "matmul_triton": ours,
        "torch.matmul": lambda: torch.matmul(a, b, out=out),
        "bare": bare(launches),
        "matmul_triton, cache off": uncached(ours),
    }
    if not SMOKE and not ARGS.noop_launch:
        try:
            methods["direct"] = direct(launches)
        except Exception as e:  # noqa: BLE001
            log(f"direct launch left out: {type(e).__name__}: {str(e)[:300]}")
    t = timed(methods, max(2, ITERS // 4), ROUNDS)
    row = {"shape": [M, N, K], "bucket": MM.select(M, N, K, dtype=DT, hw=HW, device=torch.device(DEV)).name}
    row.update({f"{k.replace(' min', '_min')}_us": v for k, v in t.items()})
    row["ours_vs_torch"] = t["torch.matmul"] / t["matmul_triton"]  # > 1: ours faster
    return row


def profile(name, fn) -> None:
    fn()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(ITERS):
        fn()
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
    print(s.getvalue())


def main() -> int:
    hw = target_name(HW, torch.device(DEV))
    RES["meta"].update(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        python=platform.python_version(),
        torch=torch.__version__,
        triton=triton.__version__,
        device="cpu (TRITON_INTERPRET=1)" if SMOKE else torch.cuda.get_device_name(),
        target=hw,
        iters=ITERS,
        rounds=ROUNDS,
        noop_launch=ARGS.noop_launch,
        limit_us=LIMIT_US,
    )
    log(f"{RES['meta']}")
    _MODE["noop"] = ARGS.noop_launch
    es = entries()
    if ARGS.profile:
        if ARGS.profile not in es:
            sys.exit(f"--profile: unknown entry point {ARGS.profile!r}; known: {sorted(es)}")
        profile(ARGS.profile, es[ARGS.profile])
        return 0
    for name, fn in es.items():
        try:
            row = measure(name, fn)
            RES["entries"].append(row)
            if "bare_us" in row:
                log(
                    f"{name:22s} {row['launches']} launch(es): eager {row['eager_us']:8.2f} us/call, bare"
                    f" {row['bare_us']:8.2f}, over bare {row['over_bare_us']:7.2f} us"
                    f" (cache off: eager {row['eager_cache_off_us']:8.2f})"
                    f" ({'within' if row['within_limit'] else 'PAST'} {LIMIT_US} us)"
                )
            else:
                log(f"{name:22s} eager {row['eager_us']:8.2f} us/call: {row['note']}")
        except Exception as e:  # noqa: BLE001
            RES["errors"].append(
                {"entry": name, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
            )
            log(f"ERROR {name}: {type(e).__name__}: {str(e)[:300]}")
        write_json()
    if not ARGS.only or "matmul_triton" in ARGS.only:
        try:
            RES["matmul_eager"] = m = matmul_eager()
            log(
                f"eager loop at {tuple(m['shape'])} ({m['bucket']}): matmul_triton {m['matmul_triton_us']:.2f} us/call,"
                f" torch.matmul {m['torch.matmul_us']:.2f}, bare launch {m['bare_us']:.2f}"
                + (f", direct launch {m['direct_us']:.2f}" if "direct_us" in m else "")
                + ";"
                f" matmul_triton {m['ours_vs_torch']:.2f}x torch.matmul (target >= 0.95x)"
            )
        except Exception as e:  # noqa: BLE001
            RES["errors"].append(
                {
                    "entry": "matmul eager",
                    "error": f"{type(e).__name__}: {e}",
                    "traceback": traceback.format_exc()[-3000:],
                }
            )
            log(f"ERROR matmul eager: {type(e).__name__}: {str(e)[:300]}")
    print(
        "\n| entry point | launches | eager us/call | bare launch us/call | over bare us | (fastest rounds: eager, bare,"
        " over) | direct launch us/call | eager, cache off us/call |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in RES["entries"]:
        fmt = lambda k: f"{r[k]:.2f}" if k in r else "-"  # noqa: E731
        print(
            f"| {r['entry']} | {r['launches']} | {fmt('eager_us')} | {fmt('bare_us')} | {fmt('over_bare_us')}"
            f" | {fmt('eager_min_us')}, {fmt('bare_min_us')}, {fmt('over_bare_min_us')} | {fmt('direct_us')}"
            f" | {fmt('eager_cache_off_us')} |"
        )
    past = [r["entry"] for r in RES["entries"] if r.get("within_limit") is False]
    log(
        f"{len(RES['entries'])} entry points, {len(RES['errors'])} errors; past {LIMIT_US} us over bare: {past or 'none'}"
    )
    write_json()
    return 1 if RES["errors"] else 0


if __name__ == "__main__":
    sys.exit(quiet_on_closed_pipe(main))
