#!/usr/bin/env python3
"""Benchmark and correctness check of the generated memory-bound kernels on one GPU (H200).

    python bench/membound.py                   # full run, 200 s budget (incl. torch.compile)
    python bench/membound.py --budget-s 120    # tighter: optional parts are skipped first
    python bench/membound.py --cpu-smoke --hw h200   # tiny fp16 shapes, TRITON_INTERPRET=1, CPU

Kernels from generated/transform.py and generated/cache.py, references from
bench/reference_ops.py.  Phases, each guarded (an error is recorded, the run goes on): versions
and target; correctness of every op against its reference, twice; a 512 MiB device copy; per
case ours and eager as GPU time (bench/timing.py), large cases against a same-size copy (RoPE
also a copy of the bytes it touches), 1-token cases' host time; torch.compile at the large
sizes in alternating rounds.  A markdown table last; JSON to $OUT/membound.json (or --json).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
import statistics
import sys
import time
import traceback

from smoke import smoke_setup


def _parse():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget-s", type=float, default=200.0, help="soft budget (default 200 s)")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny fp16 shapes, CPU interpreter")
    ap.add_argument("--hw", default=None, help="hardware spec name (default: detect the GPU)")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile baselines")
    ap.add_argument("--smoke-compile", action="store_true", help="--cpu-smoke: try torch.compile")
    ap.add_argument("--json", default=None, help="JSON path (default $OUT/membound.json)")
    return ap.parse_args()


ARGS = _parse()
SMOKE = smoke_setup(ARGS)  # before torch and Triton are imported

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import generated.cache as C  # noqa: E402
import generated.dispatch as D  # noqa: E402
import generated.transform as T  # noqa: E402
from bench import reference_ops as R  # noqa: E402
from bench.runlog import RunLog  # noqa: E402
from bench.timing import cpu_ms, gpu_ms  # noqa: E402
from policy_runtime.cache import ops as cache_runtime  # noqa: E402
from policy_runtime.transform import ops as transform_runtime  # noqa: E402
from policy_runtime.report import quiet_on_closed_pipe  # noqa: E402

DEV = "cpu" if SMOKE else "cuda"
DT = torch.float16 if SMOKE else torch.bfloat16
HW = ARGS.hw
EPS = 1e-6
DO_COMPILE = not ARGS.no_compile and (not SMOKE or ARGS.smoke_compile)
KERNELS = ("rms_norm", "silu_and_mul", "rotary_embedding", "reshape_and_cache", "copy_blocks")
RES = {"meta": {}, "correctness": [], "copy": {}, "cases": {}, "skipped": [], "errors": []}
RUN = RunLog("membound", RES, smoke=SMOKE, json_arg=ARGS.json)
elapsed, log, sync, release, write_json = RUN.elapsed, RUN.log, RUN.sync, RUN.release, RUN.write
_COPY_SAME: dict = {}
_COMPILES = [0]
COMPILE_ROUNDS = 5


@triton.jit
def _pattern_copy_kernel(src, dst, n_heads, HEAD_SIZE: tl.constexpr, ROT: tl.constexpr, BLOCK_H: tl.constexpr):
    # Program (token, block of heads): copies dims [0, ROT) of each head of a [tokens, heads,
    # HEAD_SIZE] tensor, i.e. the bytes a RoPE launch reads and writes, with no arithmetic.
    blocks = tl.cdiv(n_heads, BLOCK_H)
    tok = tl.program_id(0) // blocks
    h = (tl.program_id(0) % blocks) * BLOCK_H + tl.arange(0, BLOCK_H)
    offs = tok.to(tl.int64) * n_heads * HEAD_SIZE + (h * HEAD_SIZE)[:, None] + tl.arange(0, ROT)[None, :]
    m = (h < n_heads)[:, None]
    tl.store(dst + offs, tl.load(src + offs, mask=m), mask=m)


def pattern_copy_fn(tokens, heads, head_size, rot):
    """A launch copying the first ``rot`` dims of every head (16 heads a program, 2 warps:
    the fastest of 4-64 heads and 1-4 warps on the H200)."""
    src = rnd(tokens, heads, head_size)
    dst = torch.empty_like(src)
    grid = (tokens * triton.cdiv(heads, 16),)
    return lambda: _pattern_copy_kernel[grid](src, dst, heads, head_size, rot, 16, num_warps=2)


def left():
    return ARGS.budget_s - elapsed()


def record_error(where, e):
    tb = traceback.format_exc()
    RES["errors"].append({"where": where, "error": f"{type(e).__name__}: {e}", "traceback": tb[-4000:]})
    log(f"ERROR in {where}: {type(e).__name__}: {str(e)[:500]}")


def bench_ms(fn, large=True):
    """Median GPU ms, L2 flushed before each run, the host's launch time off the clock
    (bench/timing.py: do_bench counted launch gaps in the 1-token rows); CPU smoke: one timed call."""
    if SMOKE:
        fn()
        return cpu_ms(fn)
    return gpu_ms(fn, reps=100 if large else 50)


def host_us(fns, n=None, rounds=6):
    """Per function: (host us/call, wall us/call) over n back-to-back calls, host = until the last
    call returned, wall = until the GPU finished; median over rounds that alternate the order of
    the functions (host speed drifts: rms_norm at 1 token took 28.7, 44.6 and 62.7 us a call in
    three H200 runs minutes apart).  Also the median per-round ratio of the first function's host time to the second's.
    """
    n = n or (3 if SMOKE else 200)
    for fn in fns:
        for _ in range(3):
            fn()
    sync()
    hs, ws = [[] for _ in fns], [[] for _ in fns]
    for r in range(1 if SMOKE else rounds):
        for i in range(len(fns)) if r % 2 == 0 else reversed(range(len(fns))):
            sync()
            t0 = time.perf_counter()
            for _ in range(n):
                fns[i]()
            t1 = time.perf_counter()
            sync()
            t2 = time.perf_counter()
            hs[i].append((t1 - t0) / n * 1e6)
            ws[i].append((t2 - t0) / n * 1e6)
    per_fn = [(round(statistics.median(h), 2), round(statistics.median(w), 2)) for h, w in zip(hs, ws)]
    ratio = statistics.median(a / b for a, b in zip(hs[0], hs[1]))
    return per_fn, round(ratio, 3)


def tbps(nbytes, ms):
    return nbytes / (ms * 1e-3) / 1e12 if ms else None


def rnd(*shape, dtype=None, scale=1.0):
    return torch.randn(*shape, device=DEV, dtype=torch.float32).mul_(scale).to(dtype or DT)


def cos_sin_cache(max_pos, rot):
    """A real RoPE cache [max_pos, rot] (cos || sin, base 10000): repeated in-place rotations
    while timing keep the values' magnitude."""
    inv_freq = 1.0 / 10000 ** (torch.arange(0, rot, 2, device=DEV, dtype=torch.float32) / rot)
    freqs = torch.outer(torch.arange(max_pos, device=DEV, dtype=torch.float32), inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(DT)


# ----------------------------------------------------------------------------------------------
# 1. meta


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
        budget_s=ARGS.budget_s,
        argv=sys.argv[1:],
    )
    if SMOKE:
        m["device"] = "cpu (TRITON_INTERPRET=1)"
    else:
        idx = torch.cuda.current_device()
        p = torch.cuda.get_device_properties(idx)
        m.update(
            device=p.name,
            cc=f"{p.major}.{p.minor}",
            sm_count=p.multi_processor_count,
            mem_gib=round(p.total_memory / 2**30, 1),
        )
    target = D.target_name(HW)
    m["target"] = target
    m["records"] = {k: dataclasses.asdict(D.dispatch_kernel_config(k, target)) for k in KERNELS}
    log(
        f"{m['date']}  python {m['python']}  torch {torch.__version__}  triton {triton.__version__}"
        f"  cuda {torch.version.cuda}"
    )
    log(
        f"device {m['device']}"
        + ("" if SMOKE else f"  cc {m['cc']}  SMs {m['sm_count']}  {m['mem_gib']} GiB")
        + f"  -> target {target!r}"
        + (" (--hw)" if HW else " (detected)")
    )
    for k, rec in m["records"].items():
        log(f"launch record {k:18s} {rec}")


# ----------------------------------------------------------------------------------------------
# 2. correctness


def _cmp(a, b, exact):
    """(ok, max_abs_err) over every element; NaN patterns must match.  On the tensors' device:
    the timed-size checks compare up to a few GB."""
    if exact and a.dtype == b.dtype and a.shape == b.shape:
        # Bit for bit (uninitialised cache memory may hold NaN patterns; they must match too).
        same = torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
        return same, 0.0 if same else float("inf")
    a32, b32 = a.detach().float(), b.detach().float()
    if a32.shape != b32.shape:
        return False, float("inf")
    na, nb = torch.isnan(a32), torch.isnan(b32)
    if not torch.equal(na, nb):
        return False, float("nan")
    a32, b32 = a32.masked_fill(na, 0), b32.masked_fill(nb, 0)
    diff = (a32 - b32).abs()
    err = diff.max().item() if diff.numel() else 0.0
    if exact:
        return bool(torch.equal(a32, b32)), err
    tol = 2e-3 if DT == torch.float16 else 1.6e-2
    return bool((diff <= tol + tol * b32.abs()).all()), err


def _corr(name, pairs):
    ok, worst = True, 0.0
    for a, b, exact in pairs:
        o, e = _cmp(a, b, exact)
        ok &= o
        worst = max(worst, e) if e == e else float("nan")
    RES["correctness"].append({"check": name, "ok": ok, "max_abs_err": worst})
    log(f"correctness {name:44s} {'OK  ' if ok else 'FAIL'} max_abs_err={worst:.3g}")


def _guard(where, fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        record_error(where, e)


def phase_correctness():
    nan = float("nan")
    T_, H, KH, HS = (5, 4, 2, 32) if SMOKE else (333, 32, 8, 128)
    sizes = [(5, 96), (3, 40)] if SMOKE else [(333, 4096), (3, 1000)]
    for t, h in sizes:
        for res in (False, True):

            def rms(t=t, h=h, res=res):
                pairs = []
                for _ in range(2):  # 1st call compiles, 2nd reuses the plan (fresh buffers)
                    x, w = rnd(t, h, scale=3), rnd(h)
                    if res:
                        r = rnd(t, h)
                        o, z = T.rms_norm(x, w, EPS, residual=r, hw=HW)
                        ro, rz = R.fused_add_rms_norm_ref(x, r, w, EPS)
                        pairs += [(z, rz, True), (o, ro, False)]
                    else:
                        pairs.append((T.rms_norm(x, w, EPS, hw=HW), R.rms_norm_ref(x, w, EPS), False))
                _corr(f"rms_norm{'+res' if res else ''} T={t} h={h}", pairs)

            _guard(f"correctness rms_norm {t}x{h} res={res}", rms)

        def silu(t=t, h=h):
            pairs = []
            for _ in range(2):
                x = rnd(t, 2 * h, scale=4)
                pairs.append((T.silu_and_mul(x, hw=HW), R.silu_and_mul_ref(x), False))
            _corr(f"silu_and_mul T={t} d={h}", pairs)

        _guard(f"correctness silu_and_mul {t}x{h}", silu)
    for rot, neox, with_key in ((HS, True, True), (HS // 2, True, True), (HS, False, False), (HS // 2, False, True)):

        def rope(rot=rot, neox=neox, with_key=with_key):
            pairs = []
            for _ in range(2):
                pos = torch.randint(0, 4096, (T_,), device=DEV)
                cs = cos_sin_cache(4096, rot)
                q, k = rnd(T_, H * HS), rnd(T_, KH * HS)
                rq, rk = q.clone(), k.clone()
                T.rotary_embedding(pos, q, k if with_key else None, cs, HS, neox, hw=HW)
                R.rotary_embedding_ref(pos, rq, rk if with_key else None, cs, HS, neox)
                pairs += [(q, rq, False), (k, rk, not with_key)]
            _corr(f"rotary rot={rot} neox={neox} key={with_key}", pairs)

        _guard(f"correctness rotary rot={rot} neox={neox}", rope)

    def rc():
        pairs = []
        bs, nb = (4, 8) if SMOKE else (16, 64)
        for _ in range(2):
            key, val = rnd(T_ + 3, KH, HS), rnd(T_ + 3, KH, HS)
            kc = torch.full((nb, bs, KH, HS), nan, device=DEV, dtype=DT)
            vc = torch.full((nb, bs, KH, HS), nan, device=DEV, dtype=DT)
            slots = torch.randperm(nb * bs, device=DEV)[:T_]
            slots[::7] = -1
            rkc, rvc = kc.clone(), vc.clone()
            C.reshape_and_cache(key, val, kc, vc, slots, hw=HW)
            R.reshape_and_cache_ref(key, val, rkc, rvc, slots)
            pairs += [(kc, rkc, True), (vc, rvc, True)]
        _corr(f"reshape_and_cache T={T_} with slot -1", pairs)

    _guard("correctness reshape_and_cache", rc)

    def cb():
        pairs = []
        L, nb, bs = 4, 32, (4 if SMOKE else 16)
        for _ in range(2):
            kcs = [rnd(nb, bs, KH, HS) for _ in range(L)]
            vcs = [rnd(nb, bs, KH, HS) for _ in range(L)]
            bm = torch.stack([torch.randperm(16)[:5], 16 + torch.randperm(16)[:5]], 1).to(DEV)
            rk, rv = [c.clone() for c in kcs], [c.clone() for c in vcs]
            C.copy_blocks(kcs, vcs, bm, hw=HW)
            R.copy_blocks_ref(rk, rv, bm)
            pairs += [(a, b, True) for a, b in zip(kcs + vcs, rk + rv)]
        _corr(f"copy_blocks layers={L} pairs=5", pairs)

    _guard("correctness copy_blocks", cb)

    def swap():
        bm = torch.tensor([[1, 7], [5, 0], [2, 3]])
        pairs = []
        for src_dev, dst_dev in ((DEV, "cpu"), ("cpu", DEV)):
            src = rnd(8, 4, KH, HS).to(src_dev)
            dst = rnd(9, 4, KH, HS).to(dst_dev)
            ref = dst.cpu().clone()
            C.swap_blocks(src, dst, bm)
            R.swap_blocks_ref(src.cpu(), ref, bm)
            pairs.append((dst.cpu(), ref, True))  # _cmp compares on one device
        _corr("swap_blocks gpu->cpu, cpu->gpu", pairs)

    _guard("correctness swap_blocks", swap)
    n_ok = sum(c["ok"] for c in RES["correctness"])
    log(f"correctness: {n_ok}/{len(RES['correctness'])} OK")


# ----------------------------------------------------------------------------------------------
# 3. copy bandwidth


def copy_tbps(nbytes):
    """Bandwidth of a plain device copy moving ``nbytes`` (read + written), memoised."""
    if nbytes not in _COPY_SAME:
        n = max(1, nbytes // (2 * (torch.finfo(DT).bits // 8)))  # elements of each buffer
        src = rnd(n)
        dst = torch.empty_like(src)
        ms = bench_ms(lambda: dst.copy_(src))
        moved = 2 * n * src.element_size()
        _COPY_SAME[nbytes] = {"bytes": moved, "us": round(ms * 1e3, 2), "tbps": tbps(moved, ms)}
        del src, dst
        release()
    return _COPY_SAME[nbytes]


def phase_copy():
    nbytes = (1 << 18) if SMOKE else (1 << 30)  # 512 MiB read + 512 MiB written
    RES["copy"] = copy_tbps(nbytes)
    c = RES["copy"]
    log(f"device copy: {c['bytes'] / 2**20:.0f} MiB moved in {c['us']:.1f} us -> {c['tbps']:.3f} TB/s")


# ----------------------------------------------------------------------------------------------
# 4. cases


def _plan(fn, *args):
    """Launch plan summary (private helpers of policy_runtime; informational only)."""
    try:
        p = fn(*args)
        name = getattr(p.kernel, "__name__", None) or p.kernel.fn.__name__
        return {"kernel": name, "grid": p.grid, "consts": list(p.consts), "num_warps": p.num_warps}
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}"}


def same_effect(ours_fn, ref_fn, args, exact=False):
    """Run ours and the reference on separate copies of ``args`` (tensors, and lists of tensors,
    cloned) and pair what each returned and every argument tensor, for _corr: the in-place ops
    are checked on what they wrote, untouched elements included."""

    def copies():
        return [
            [t.clone() for t in a] if isinstance(a, list) else (a.clone() if torch.is_tensor(a) else a) for a in args
        ]

    def tensors(x):
        if torch.is_tensor(x):
            return [x]
        if isinstance(x, (list, tuple)):
            return [t for item in x for t in tensors(item)]
        return []

    a1, a2 = copies(), copies()
    got, want = ours_fn(*a1), ref_fn(*a2)
    return [(x, y, exact) for x, y in zip(tensors(got) + tensors(a1), tensors(want) + tensors(a2))]


def make_cases(target):
    """Case dicts: name, kernel, decode, prio (torch.compile order), setup() -> env."""
    es = torch.finfo(DT).bits // 8
    rec = {k: D.dispatch_kernel_config(k, target) for k in KERNELS}
    if SMOKE:
        # One token (decode) and four (a "large" case: one program a row in the interpreter).
        sizes, rope_T, cb = [(1, 64), (4, 64), (4, 128)], [1, 4], [(1, 2), (4, 2)]
        H, KH, HS, BS = 4, 2, 32, 4
    else:
        sizes, rope_T, cb = [(1, 4096), (16384, 4096), (16384, 8192)], [1, 16384], [(4, 32), (1024, 32)]
        H, KH, HS, BS = 32, 8, 128, 16
    cases = []
    for tok, h in sizes:
        for res in (False, True):

            def setup(tok=tok, h=h, res=res):
                x, w = rnd(tok, h), rnd(h)
                r = rnd(tok, h) if res else None
                return dict(
                    ours=lambda: T.rms_norm(x, w, EPS, residual=r, hw=HW),
                    eager=lambda: R.rms_norm_ref(x, w, EPS, r),
                    ref=(R.rms_norm_ref, (x, w, EPS, r)),
                    check=lambda: same_effect(
                        lambda *a: T.rms_norm(*a[:3], residual=a[3], hw=HW), R.rms_norm_ref, [x, w, EPS, r]
                    ),
                    bytes=(4 if res else 2) * tok * h * es + h * es,
                    plan=_plan(transform_runtime.plan_rms_norm, tok, h, es, res, rec["rms_norm"]),
                )

            name = f"rms_norm{'+res' if res else ''} T={tok} h={h}"
            cases.append(dict(name=name, kernel="rms_norm", decode=tok == 1, setup=setup, prio=1))
    for tok, d in sizes:

        def setup(tok=tok, d=d):
            x = rnd(tok, 2 * d)
            return dict(
                ours=lambda: T.silu_and_mul(x, hw=HW),
                eager=lambda: R.silu_and_mul_ref(x),
                ref=(R.silu_and_mul_ref, (x,)),
                check=lambda: same_effect(lambda x: T.silu_and_mul(x, hw=HW), R.silu_and_mul_ref, [x]),
                bytes=3 * tok * d * es,
                plan=_plan(transform_runtime.plan_silu_and_mul, tok, d, es, rec["silu_and_mul"]),
            )

        name = f"silu_and_mul T={tok} d={d}"
        cases.append(dict(name=name, kernel="silu_and_mul", decode=tok == 1, setup=setup, prio=1))
    max_pos = 64 if SMOKE else 8192
    for tok in rope_T:
        for rot, neox in [(HS, True), (HS // 2, True)] + ([(HS, False)] if tok > 1 else []):

            def setup(tok=tok, rot=rot, neox=neox):
                pos = torch.randint(0, max_pos, (tok,), device=DEV)
                cs = cos_sin_cache(max_pos, rot)
                q, k = rnd(tok, H * HS), rnd(tok, KH * HS)
                args = (pos, q, k, cs, HS, neox)
                return dict(
                    ours=lambda: T.rotary_embedding(*args, hw=HW),
                    eager=lambda: R.rotary_embedding_ref(*args),
                    ref=(R.rotary_embedding_ref, args),
                    check=lambda: same_effect(
                        lambda *a: T.rotary_embedding(*a, hw=HW), R.rotary_embedding_ref, list(args)
                    ),
                    bytes=2 * tok * (H + KH) * rot * es + tok * 8 + tok * rot * es,
                    plan=_plan(
                        transform_runtime.plan_rotary_embedding, tok, H, KH, rot, HS, neox, es, rec["rotary_embedding"]
                    ),
                    pattern=(
                        None if tok == 1 else (pattern_copy_fn(tok, H + KH, HS, rot), 2 * tok * (H + KH) * rot * es)
                    ),
                )

            name = f"rope {'neox' if neox else 'gptj'} rot={rot} T={tok}"
            cases.append(
                dict(name=name, kernel="rotary_embedding", decode=tok == 1, setup=setup, prio=2 if neox else 3)
            )
    # The cache ops at a decode and a prefill size with 8 KV heads (GQA), and at the prefill size
    # with 32 KV heads (kv hidden 4096, as the (16384, 4096) size of the other ops).
    for tok, kh in [(t, KH) for t in rope_T] + [(rope_T[-1], 2 * KH if SMOKE else 32)]:

        def setup(tok=tok, KH=kh):
            nb = tok // BS + 64
            key, val = rnd(tok, KH, HS), rnd(tok, KH, HS)
            kc = torch.empty(nb, BS, KH, HS, device=DEV, dtype=DT)
            vc = torch.empty_like(kc)
            slots = torch.randperm(nb * BS, device=DEV)[:tok]
            args = (key, val, kc, vc, slots)
            return dict(
                ours=lambda: C.reshape_and_cache(*args, hw=HW),
                eager=lambda: R.reshape_and_cache_ref(*args),
                ref=(R.reshape_and_cache_nomask_ref, args),
                check=lambda: same_effect(
                    lambda *a: C.reshape_and_cache(*a, hw=HW), R.reshape_and_cache_ref, list(args), exact=True
                ),
                bytes=4 * tok * KH * HS * es + 8 * tok,
                plan=_plan(cache_runtime.plan_reshape_and_cache, tok, KH * HS, HS, es, rec["reshape_and_cache"]),
            )

        name = f"reshape_and_cache T={tok} kv={kh}x{HS} bs={BS}"
        cases.append(dict(name=name, kernel="reshape_and_cache", decode=tok == 1, setup=setup, prio=2))
    for n, layers in cb:

        def setup(n=n, layers=layers):
            nb = 2 * max(n, 16)
            kcs = [torch.empty(nb, BS, KH, HS, device=DEV, dtype=DT) for _ in range(layers)]
            vcs = [torch.empty(nb, BS, KH, HS, device=DEV, dtype=DT) for _ in range(layers)]
            half = nb // 2
            bm = torch.stack([torch.randperm(half)[:n], half + torch.randperm(half)[:n]], 1).to(DEV)
            block = BS * KH * HS
            return dict(
                ours=lambda: C.copy_blocks(kcs, vcs, bm, hw=HW),
                eager=lambda: R.copy_blocks_ref(kcs, vcs, bm),
                ref=(R.copy_blocks_ref, (kcs, vcs, bm)),
                check=lambda: same_effect(
                    lambda *a: C.copy_blocks(*a, hw=HW), R.copy_blocks_ref, [kcs, vcs, bm], exact=True
                ),
                bytes=2 * 2 * layers * n * block * es + 16 * n,
                plan=_plan(cache_runtime.plan_copy_blocks, n, 2 * layers, block, 16 // es, es, rec["copy_blocks"]),
            )

        name = f"copy_blocks pairs={n} layers={layers}"
        cases.append(dict(name=name, kernel="copy_blocks", decode=n <= 8, setup=setup, prio=3))
    return cases


def _entry(case):
    return RES["cases"].setdefault(case["name"], {"kernel": case["kernel"], "decode": case["decode"]})


def phase_cases(cases):
    full_copy = RES["copy"].get("tbps")
    for case in cases:
        if left() < 15:
            RES["skipped"].append(f"case {case['name']} (budget)")
            continue
        e = _entry(case)
        try:
            env = case["setup"]()
            e["bytes"] = env["bytes"]
            e["plan"] = env["plan"]
            env["ours"]()  # compile
            sync()
            # Correct at the size it is timed at (the benchmarked instantiation, not only the
            # correctness phase's sizes): ours against the reference on copies of the inputs.
            _corr(f"{case['name']} (timed size)", env.pop("check")())
            release()
            ms = bench_ms(env["ours"], large=not case["decode"])
            e["ours_us"] = round(ms * 1e3, 2)
            e["ours_tbps"] = tbps(env["bytes"], ms)
            if full_copy:
                e["ours_frac_copy"] = e["ours_tbps"] / full_copy
            ms_e = bench_ms(env["eager"], large=not case["decode"])
            e["eager_us"] = round(ms_e * 1e3, 2)
            e["eager_tbps"] = tbps(env["bytes"], ms_e)
            msg = (
                f"{case['name']:40s} ours {e['ours_us']:9.2f} us {e['ours_tbps']:6.3f} TB/s"
                f" | eager {e['eager_us']:9.2f} us"
            )
            if case["decode"]:
                ((e["host_ours_us"], e["wall_ours_us"]), (e["host_eager_us"], e["wall_eager_us"])), ratio = host_us(
                    (env["ours"], env["eager"])
                )
                e["host_ours_over_eager"] = ratio
                msg += f" | host us/call ours {e['host_ours_us']} eager {e['host_eager_us']} (ours/eager {ratio})"
            pattern = None if case["decode"] else env.get("pattern")
            del env
            release()
            if not case["decode"]:
                same = copy_tbps(e["bytes"])
                e["copy_same_us"], e["copy_same_tbps"] = same["us"], same["tbps"]
                e["ours_frac_copy_same"] = e["ours_tbps"] / same["tbps"]
                msg += f" | same-size copy {same['tbps']:.3f} TB/s"
                if pattern is not None:
                    fn, moved = pattern
                    fn()
                    ms_p = bench_ms(fn)
                    e["pattern_copy_tbps"] = tbps(moved, ms_p)
                    e["ours_frac_pattern"] = e["ours_tbps"] / e["pattern_copy_tbps"]
                    msg += f" | same-pattern copy {e['pattern_copy_tbps']:.3f} TB/s"
                    del pattern, fn
            log(msg)
        except Exception as ex:  # noqa: BLE001
            record_error(f"case {case['name']}", ex)
        release()
    write_json()


# ----------------------------------------------------------------------------------------------
# 5. torch.compile


def phase_compile(cases, prio):
    if not DO_COMPILE:
        return
    try:
        import torch._dynamo as dynamo

        for attr in (
            "cache_size_limit",
            "recompile_limit",
            "accumulated_cache_size_limit",
            "accumulated_recompile_limit",
        ):
            if hasattr(dynamo.config, attr):
                setattr(dynamo.config, attr, max(getattr(dynamo.config, attr), 256))
    except Exception:  # noqa: BLE001
        pass
    for case in cases:
        if case["decode"] or case["prio"] != prio:
            continue
        need = 45 if _COMPILES[0] == 0 else 20
        if left() < need:
            RES["skipped"].append(f"compile {case['name']} (budget: {left():.0f} s left)")
            log(f"skip torch.compile {case['name']} (budget)")
            continue
        e = _entry(case)
        try:
            env = case["setup"]()
            fn, args = env["ref"]
            # The CPU smoke run checks this phase's wiring (dynamo traces the reference), not
            # inductor's C++ code generation, which on a cold cache cost it about a minute.
            cf = torch.compile(fn, dynamic=False, **({"backend": "eager"} if SMOKE else {}))
            t = time.perf_counter()
            cf(*args)
            sync()
            e["compile_s"] = round(time.perf_counter() - t, 1)
            _COMPILES[0] += 1
            # Ours and compiled in alternating order, round by round: the two are often within
            # 1-2% of each other, about the run-to-run spread of one timing.
            pair = {"ours": env["ours"], "compile": lambda: cf(*args)}
            ms_c, ratios = [], []
            for r in range(1 if SMOKE else COMPILE_ROUNDS):
                t = {k: bench_ms(pair[k]) for k in (("ours", "compile") if r % 2 == 0 else ("compile", "ours"))}
                ms_c.append(t["compile"])
                ratios.append(t["compile"] / t["ours"])
            ms = statistics.median(ms_c)
            e["compile_us"] = round(ms * 1e3, 2)
            e["compile_tbps"] = tbps(env["bytes"], ms)
            e["ours_vs_compile"] = statistics.median(ratios)
            e["ours_vs_compile_rounds"] = [round(x, 3) for x in ratios]
            log(
                f"{case['name']:40s} torch.compile {e['compile_us']:9.2f} us "
                f"{e['compile_tbps']:6.3f} TB/s (compile {e['compile_s']} s); ours / compile per round "
                f"{e['ours_vs_compile_rounds']}"
            )
            env = cf = pair = None  # drop the buffers and the compiled graph before the next case
        except Exception as ex:  # noqa: BLE001
            record_error(f"compile {case['name']}", ex)
        release()
        write_json()


# ----------------------------------------------------------------------------------------------
# table


def print_table(cases):
    def f(v, p=3):
        return f"{v:.{p}f}" if isinstance(v, (int, float)) else "-"

    copy = RES["copy"].get("tbps")
    m = RES["meta"]
    print()
    print(
        f"{m.get('device')} (target {m.get('target')}), torch {m.get('torch')}, triton {m.get('triton')}, "
        f"{m.get('dtype')}, {m.get('date')}; device copy {f(copy)} TB/s (bytes read + written)"
    )
    print()
    print(
        "| case | ours us | ours TB/s | % copy | % same-size copy | % same-pattern copy | eager TB/s "
        "| compile TB/s | ours / compile | host us/call ours / eager (per-round ratio) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for case in cases:
        e = RES["cases"].get(case["name"])
        if not e or "ours_us" not in e:
            print(f"| {case['name']} | not measured | | | | | | | | |")
            continue
        frac = e.get("ours_frac_copy")
        same = e.get("ours_frac_copy_same")
        pat = e.get("ours_frac_pattern")
        host = ""
        if case["decode"] and "host_ours_us" in e:
            host = f"{e['host_ours_us']} / {e['host_eager_us']} ({e['host_ours_over_eager']:.2f}x)"
        print(
            f"| {case['name']} | {f(e['ours_us'], 1)} | {f(e.get('ours_tbps'))} "
            f"| {f(frac * 100 if frac else None, 1)} | {f(same * 100 if same else None, 1)} "
            f"| {f(pat * 100 if pat else None, 1)} | {f(e.get('eager_tbps'))} | {f(e.get('compile_tbps'))} | {f(e.get('ours_vs_compile'), 2)} | {host} |"
        )
    bad = [c["check"] for c in RES["correctness"] if not c["ok"]]
    print()
    print(
        f"correctness: {len(RES['correctness']) - len(bad)}/{len(RES['correctness'])} OK"
        + (f"; FAILED: {bad}" if bad else "")
    )
    if RES["errors"]:
        print(f"errors: {len(RES['errors'])}: " + "; ".join(e["where"] for e in RES["errors"]))
    if RES["skipped"]:
        print("skipped: " + "; ".join(RES["skipped"]))
    print(f"total {elapsed():.0f} s" + (f"; JSON: {RUN.path()}" if RUN.path() else ""))


def main():
    if not SMOKE and not torch.cuda.is_available():
        print("CUDA is not available; use --cpu-smoke --hw NAME for a CPU run", file=sys.stderr)
        return 2
    _guard("meta", phase_meta)
    write_json()
    _guard("correctness", phase_correctness)
    write_json()
    _guard("copy", phase_copy)
    write_json()
    cases = []
    try:
        cases = make_cases(D.target_name(HW))
    except Exception as e:  # noqa: BLE001
        record_error("cases", e)
    phase_cases(cases)
    for prio in (1, 2, 3):
        phase_compile(cases, prio)
    write_json()
    print_table(cases)
    return 0 if all(c["ok"] for c in RES["correctness"]) and not RES["errors"] else 1


if __name__ == "__main__":
    sys.exit(quiet_on_closed_pipe(main))
