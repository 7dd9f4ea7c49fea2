#!/usr/bin/env python3
"""Paged decode's split plan and pipeline depth against its bandwidth (the h200 decode policy's
v1_min_programs, v2_min_programs and v2_max_partition, and the Hopper fp8 policy's num_stages, in
specs/kernels/attention.toml were chosen from this).

    python3 bench/decode_plans.py                 # on a GPU (~15 s)
    python3 bench/decode_plans.py --stages 3 5    # each plan again with the decode kernel's num_stages forced
    python3 bench/decode_plans.py --set ragged    # large batches, ragged and equal (the peers' decode cases)
    python3 bench/decode_plans.py --set peers --head-dims 64 --stages 2   # the vLLM comparison's cases, policy plans
    python3 bench/decode_plans.py --cpu-smoke --hw h200

For each case (16-bit and fp8 caches, windows), the policy's plan and forced ones (V1; V2 in
partitions of 256 to 2048 tokens), each checked against float32 on the same cache, then timed
eager and replayed from a CUDA graph (policy_runtime/timing.py's gpu_ms), as a fraction of a
device copy of as many bytes measured in the same run; a V2 plan's decode kernel also alone (its
merge launch dropped: what the merge costs is the difference).  Forcing replaces
policy_runtime.attention.ops.decode_plan for the call (the kernels are the policy's; the call caches are cleared between plans).
``--stages`` forces the policy kernel's num_stages at its launch (the same source and tile, another
software-pipelining depth), under the policy's plan and each forced one.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import decode_cases
from smoke import smoke_setup

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--cpu-smoke", action="store_true", help="tiny fp16 shapes, CPU interpreter (no timing)")
ap.add_argument("--hw", default=None, help="hardware spec name (default: detect the GPU)")
ap.add_argument("--stages", type=int, nargs="*", default=[], help="also time each plan with the decode kernel's num_stages forced to each of these")
ap.add_argument("--set", choices=("plans", "ragged", "peers"), default="plans",
                help="plans: the cases the split plans were chosen on; ragged: large batches whose lengths are "
                "bench/decode_cases.py's RAGGED fractions of the context, and equal batches of the same sizes; "
                "peers: bench/attention.py --quick's 16-bit decode cases (the vLLM comparison), the policy's "
                "plan only (with --stages, under each depth)")
ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128, 256], help="with --set peers: these head dims")
ap.add_argument("--lengths", choices=("both", "ragged", "equal"), default="both",
                help="with --set ragged: only its ragged or only its equal batches")
ARGS = ap.parse_args()
SMOKE = smoke_setup(ARGS)

import torch  # noqa: E402

from generated import attention as at  # noqa: E402
from generated.dispatch import target_name  # noqa: E402
from policy_runtime import call_cache  # noqa: E402
from policy_runtime import launch as _launch  # noqa: E402
from policy_runtime.attention import ops  # noqa: E402
from policy_runtime.report import quiet_on_closed_pipe  # noqa: E402
from policy_runtime.timing import captured, gpu_ms  # noqa: E402

DEV = "cpu" if SMOKE else "cuda"
DT = torch.float16 if SMOKE else torch.bfloat16
HW = target_name(ARGS.hw)
BS = 16
_POLICY_PLAN = ops.decode_plan
FORCED: list = []  # [] the policy's plan, ["v1"], or [partition tokens]
USED: list = []
STAGES: list = []  # [] the policy kernel's num_stages, or [forced num_stages]
LAUNCHED: list = []  # the num_stages of the last decode kernel launched
SEEN: set = set()  # the plans (plan_key) a case has run at this depth


class Repeat(Exception):
    """A forced plan that repeats one the case has run: raised by plan() before any launch, so
    the repeat costs no kernel run (it would print nothing)."""


def plan_key(p):
    return ("v1",) if p[2] == 1 else ("v2", p[1], p[0])


def plan(S, Hkv, bound, cfg, lcfg):
    if not FORCED:
        p = _POLICY_PLAN(S, Hkv, bound, cfg, lcfg)
    elif FORCED[0] == "v1":
        p = (1 << 30, cfg.partition_size, 1)
    else:
        # A partition (every sequence V2), or (v1_limit, partition): V1 up to v1_limit tokens.
        limit, ps = FORCED[0] if isinstance(FORCED[0], tuple) else (0, FORCED[0])
        parts = -(-bound // ps)
        p = (limit, ps, parts) if parts > 1 else (1 << 30, ps, 1)
    USED[:] = [p]
    if FORCED and plan_key(p) in SEEN:
        raise Repeat
    return p


ops.decode_plan = plan
_LAUNCH = _launch.launch_kernel


def launch(kernel, grid, *args, **kwargs):
    # The decode kernels (generated/attention.py's _decode_*) with STAGES' num_stages; others as called.
    if getattr(getattr(kernel, "fn", None), "__name__", "").startswith("_decode_"):
        if STAGES:
            kwargs["num_stages"] = STAGES[0]
        LAUNCHED[:] = [kwargs["num_stages"]]
    _LAUNCH(kernel, grid, *args, **kwargs)


_launch.launch_kernel = launch


def decode_only_ms(fn):
    """GPU ms of fn's decode kernel alone, replayed from a CUDA graph: fn's launches of the V2
    merge are dropped (its output is then not the attention: timing only), and the call caches
    are cleared before and after, so that no recorded plan keeps the drop."""
    real = _launch.launch_kernel

    def decode_only(kernel, grid, *args, **kwargs):
        if kernel is not ops._merge:
            real(kernel, grid, *args, **kwargs)

    _launch.launch_kernel = decode_only
    call_cache.clear_all()
    try:
        graph = captured(fn)[0]
    finally:
        _launch.launch_kernel = real
        call_cache.clear_all()
    return gpu_ms(graph.replay, reps=60)


def copy_frac(nbytes, ms):
    """Bytes read per second over a same-run device copy's (read + written bytes) per second."""
    size = min(nbytes, 2 << 30)
    src = torch.empty(size // 2, device=DEV, dtype=torch.int16).random_()
    dst = torch.empty_like(src)
    cms = gpu_ms(lambda: dst.copy_(src), reps=50)
    return (nbytes / (ms * 1e-3)) / (2 * size / (cms * 1e-3))


def case(D, H, Hkv, batch, ctx, window, fp8, ragged=None, policy_only=False):
    per = -(-ctx // BS)
    table = torch.randperm(batch * per, device=DEV).to(torch.int32).view(batch, per)
    kc = torch.randn(batch * per, BS, Hkv, D, device=DEV).to(DT)
    vc = torch.randn_like(kc)
    q = torch.randn(batch, H, D, device=DEV).to(DT)
    if ragged is not None:
        # The --set ragged and peers cases: decode_cases.RAGGED fractions of the context, or (False) all of it.
        lengths = decode_cases.lengths(batch, ctx, ragged)
        return ragged_case(D, H, Hkv, batch, ctx, lengths, table, kc, vc, q, policy_only)
    lens = torch.full((batch,), ctx, dtype=torch.int32, device=DEV)
    kw, scale = {}, 1.0
    if fp8:
        sc = torch.maximum(kc.abs().amax(), vc.abs().amax()).float().reshape(1) / 448
        kc, vc = (kc.float() / sc).to(torch.float8_e4m3fn), (vc.float() / sc).to(torch.float8_e4m3fn)
        kw, scale = dict(k_scale=sc, v_scale=sc), sc
    if window:
        kw["window_size"] = (window - 1, 0)
    span = min(ctx, window) if window else ctx
    # float32 reference over each sequence's last `span` tokens.
    toks = (table.long()[:, :, None] * BS + torch.arange(BS, device=DEV)).view(batch, -1)[:, ctx - span : ctx]
    kf = kc.view(-1, Hkv, D)[toks].float() * scale
    vf = vc.view(-1, Hkv, D)[toks].float() * scale
    g = H // Hkv
    s = torch.einsum("bhgd,bwhd->bhgw", q.float().view(batch, Hkv, g, D), kf) / math.sqrt(D)
    ref = torch.einsum("bhgw,bwhd->bhgd", torch.softmax(s, -1), vf).reshape(batch, H, D)
    del kf, vf, s
    out = torch.empty_like(q)
    nbytes = 2 * batch * span * Hkv * D * kc.element_size()
    name = f"{'fp8' if fp8 else '16-bit'} d={D} h={H}/{Hkv} batch={batch} ctx={ctx}" + (f" window={window}" if window else "")
    at_each_depth(lambda: plans(name, q, kc, vc, table, lens, out, kw, ref, nbytes))


def ragged_case(D, H, Hkv, batch, ctx, lengths, table, kc, vc, q, policy_only=False):
    # A 16-bit cache, no window: each sequence's float32 reference over its own length.
    lens = torch.tensor(lengths, dtype=torch.int32, device=DEV)
    g = H // Hkv
    ref = torch.empty(batch, H, D, device=DEV)
    for b, n in enumerate(lengths):
        toks = (table[b].long()[:, None] * BS + torch.arange(BS, device=DEV)).view(-1)[:n]
        kf, vf = kc.view(-1, Hkv, D)[toks].float(), vc.view(-1, Hkv, D)[toks].float()
        s = torch.einsum("hgd,whd->hgw", q[b].float().view(Hkv, g, D), kf) / math.sqrt(D)
        ref[b] = torch.einsum("hgw,whd->hgd", torch.softmax(s, -1), vf).reshape(H, D)
    out = torch.empty_like(q)
    nbytes = 2 * sum(lengths) * Hkv * D * kc.element_size()
    name = f"16-bit d={D} h={H}/{Hkv} batch={batch} ctx={ctx} {'ragged' if len(set(lengths)) > 1 else 'equal'}"
    # Also mixed plans: V1 up to half or three quarters of the context, V2 partitions beyond.
    mixed = tuple((int(ctx * f), ps) for f in (0.5, 0.75) for ps in (1024, 2048))
    only = (None,) if policy_only else None
    at_each_depth(lambda: plans(name, q, kc, vc, table, lens, out, {}, ref, nbytes, mixed, only))


def at_each_depth(run):
    # run() under the policy kernel's num_stages, then under each --stages depth forced.
    for stages in [None] + ARGS.stages:
        STAGES[:] = [] if stages is None else [stages]
        run()
    STAGES[:] = []


def plans(name, q, kc, vc, table, lens, out, kw, ref, nbytes, mixed=(), only=None):
    SEEN.clear()
    for forced in only or (None, "v1", 256, 512, 1024, 2048, 4096, *mixed):
        FORCED[:] = [] if forced is None else [forced]
        call_cache.clear_all()  # a recorded plan would replay the previous split

        def fn():
            at.decode_attention(q, kc, vc, table, lens, out=out, hw=HW, **kw)

        out.fill_(float("nan"))
        try:
            fn()
        except Repeat:
            continue
        err = ((out.float() - ref).norm() / ref.norm()).item()
        p = USED[0]
        SEEN.add(plan_key(p))
        what = "policy" if forced is None else f"forced {forced if not isinstance(forced, tuple) else 'mixed'}"
        split = "V1" if p[2] == 1 else f"V2 {p[2]} x {p[1]}" + (f" over {p[0]}" if p[0] else "")
        line = f"{name:52s} {what:12s} {split:14s} stages {LAUNCHED[0]} err {err:.1e}"
        if err > 1e-2:
            line += "  WRONG"
        elif not SMOKE:
            ms = gpu_ms(fn, reps=60)
            gms = gpu_ms(captured(fn)[0].replay, reps=60)
            line += f"  eager {ms * 1e3:7.1f} us ({copy_frac(nbytes, ms):.2f} of copy)  graph {gms * 1e3:7.1f} us ({copy_frac(nbytes, gms):.2f})"
            if p[2] > 1:
                dms = decode_only_ms(fn)
                line += f"  decode kernel alone {dms * 1e3:7.1f} us ({copy_frac(nbytes, dms):.2f})"
        print(line, flush=True)
    FORCED[:] = []


# (head_dim, heads, KV heads, batch, context, window, fp8[, ragged])
RAGGED_CASES = [
    (64, 4, 2, 6, 700, 0, False, True),
] if SMOKE else [
    (256, 16, 4, 256, 8192, 0, False, True), (256, 16, 2, 256, 8192, 0, False, True),
    (128, 32, 8, 256, 8192, 0, False, True), (128, 64, 8, 256, 8192, 0, False, True),
    (64, 16, 16, 256, 8192, 0, False, True), (256, 16, 2, 32, 32768, 0, False, True),
    # Equal lengths of the same sizes, and of the peers' 128 x 4k (the plans' cost without raggedness).
    (256, 16, 4, 256, 8192, 0, False, False), (128, 32, 8, 256, 8192, 0, False, False),
    (64, 16, 16, 256, 8192, 0, False, False),
    (256, 16, 4, 128, 4096, 0, False, False), (128, 32, 8, 128, 4096, 0, False, False),
    (64, 16, 16, 128, 4096, 0, False, False), (128, 32, 8, 256, 1024, 0, False, False),
]  # fmt: skip
# bench/attention.py --quick's decode cases: (head_dim, heads, KV heads) x (batch, context, ragged).
PEER_MODELS = [(64, 4, 4)] if SMOKE else decode_cases.MODELS
PEER_CASES = [(2, 300, False), (3, 500, True)] if SMOKE else decode_cases.CASES
CASES = [
    (128, 4, 2, 2, 700, 300, True),
] if SMOKE else [
    (128, 32, 8, 8, 32768, 4096, False), (128, 32, 8, 32, 32768, 4096, False),
    (128, 32, 8, 8, 8192, 0, True), (128, 32, 8, 32, 8192, 0, True), (128, 32, 8, 8, 32768, 0, True),
    (256, 16, 4, 8, 8192, 0, True), (128, 32, 8, 8, 8192, 0, False), (128, 32, 8, 64, 16384, 0, True),
    (128, 32, 8, 1, 32768, 0, True), (256, 16, 4, 32, 8192, 0, True),
]  # fmt: skip


def main() -> int:
    t0 = time.time()
    print(f"target {HW}; torch {torch.__version__}; device {torch.cuda.get_device_name() if not SMOKE else 'cpu'}; "
          f"forced stages {ARGS.stages or 'none'}")
    if ARGS.set == "peers":
        runs = [(D, H, Hkv, batch, ctx, 0, False, ragged, True) for D, H, Hkv in PEER_MODELS
                if SMOKE or D in ARGS.head_dims for batch, ctx, ragged in PEER_CASES]  # fmt: skip
    else:
        runs = [c for c in (RAGGED_CASES if ARGS.set == "ragged" else CASES)
                if len(c) <= 7 or ARGS.lengths == "both" or c[7] == (ARGS.lengths == "ragged")]  # fmt: skip
    for c in runs:
        case(*c)
    print(f"done in {time.time() - t0:.0f} s")
    return 0


sys.exit(quiet_on_closed_pipe(main))
