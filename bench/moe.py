#!/usr/bin/env python3
"""Benchmark generated/moe.py (fused MoE) against torch's grouped GEMM on one GPU (H200).

    python3 bench/moe.py                         # the H200 run (well under 5 minutes)
    python3 bench/moe.py --cpu-smoke --hw h200   # tiny fp16 shapes in Triton's interpreter

Shapes (bf16, renormalized top-k from fp32 logits): qwen36 (specs/models/qwen36.toml), e128
(Qwen3-30B-A3B: 128 experts, hidden 2048, intermediate 768, top-8), mixtral (8 x 14336, top-2)
and dsv2lite (64 x 1408, top-6), at T = 1 to 8192 (--quick: 1, 16, 256, 2048, 8192).  Methods on
the same logits: ours (topk_softmax + fused_moe), vLLM's Triton fused MoE with the config vLLM
picks (bench/peers.py; left out without the peer file), grouped (softmax/top-k, argsort,
torch._grouped_mm twice), and at T >= 4096 cuBLAS on one expert's GEMMs; where the bucket aligns
rows (grouped kernels), moe_align_block_size alone, a part of ours.  Each is checked
against an fp32 reference (relative error < 2e-2), then timed (bench/timing.py) in interleaved
rounds: time, the activated experts' weight bytes a second as a fraction of a device copy,
TFLOP/s.  At T <= 16 also as CUDA-graph replays, and per layer of a STEP_LAYERS-layer decode
step in one graph.  JSON to $OUT/moe.json (or --json PATH) after every case.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import tomllib
import traceback
from pathlib import Path

from smoke import smoke_setup

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


QUICK_TOKENS = [1, 16, 256, 2048, 8192]


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu-smoke", action="store_true", help="tiny fp16 shapes in the interpreter")
    p.add_argument("--hw", default=None, help="hardware spec name (default: detect the device)")
    p.add_argument("--rounds", type=int, default=4, help="interleaved rounds per case (default 4)")
    p.add_argument("--budget-s", type=float, default=240.0, help="soft budget: later cases are skipped past it")
    p.add_argument("--json", default=None, help="JSON path (default $OUT/moe.json)")
    p.add_argument("--quick", action="store_true", help=f"fewer token counts: {QUICK_TOKENS}")
    p.add_argument("--models", nargs="+", default=None, help="only these shapes (qwen36, e128, mixtral, dsv2lite)")
    p.add_argument("--tokens", nargs="+", type=int, default=None, help="only these token counts")
    return p.parse_args()


ARGS = parse()
SMOKE = smoke_setup(ARGS)  # before torch and Triton are imported

import torch  # noqa: E402
import triton  # noqa: E402

from bench import peers  # noqa: E402
from bench.runlog import RunLog  # noqa: E402
from bench.timing import captured, cpu_ms, gpu_ms, interleaved, rel_err  # noqa: E402
from generated import moe as M  # noqa: E402
from generated.dispatch import target_name  # noqa: E402
from policy_runtime.report import quiet_on_closed_pipe  # noqa: E402

DEV = "cpu" if SMOKE else "cuda"
DT = torch.float16 if SMOKE else torch.bfloat16
# The smoke run: one token count per bucket of h200 at the qwen36 stand-in's 32 intermediate columns
# (decode_one, decode, small, medium, prefill), each the cheapest in the interpreter (the router runs
# a program per token up to 64 tokens, and one per 64 tokens past that).
TOKENS = [1, 2, 5, 65, 513] if SMOKE else QUICK_TOKENS if ARGS.quick else [1, 4, 16, 64, 256, 1024, 4096, 8192]
if ARGS.tokens:
    TOKENS = ARGS.tokens
# The smoke run's e128 stand-in (past 512 intermediate columns, the interpreter's slowest shape)
# runs only T = 1, the wide decode bucket: the qwen36 stand-in covers every other bucket, through
# the same code of this script.
SMOKE_SKIP = {("e128", t) for t in TOKENS if t != 1}
# The smoke run times the vLLM peer (slow in the interpreter) only here: its naive expert
# assignment (T * k * 4 <= E) at one token, its aligned one at 5.
SMOKE_PEER = {("qwen36", 1), ("qwen36", 5)}
# ... and the decode step (the same code at every shape) at the qwen36 stand-in's one token only.
SMOKE_STEP = {("qwen36", 1)}
PREFILL = 16 if SMOKE else 4096  # T from which the cuBLAS comparison runs
GRAPH_T_MAX = 16  # decode (the issue's T <= 16): ours and grouped also timed as CUDA graph replays (GPU only)
STEP_LAYERS = 2 if SMOKE else 8  # layers of the decode step timed at T <= GRAPH_T_MAX
TOL = 2e-2
RES: dict = {"meta": {}, "copy": {}, "shapes": {}, "cases": [], "errors": [], "skipped": []}
RUN = RunLog("moe", RES, smoke=SMOKE, json_arg=ARGS.json)
log, sync, write_json = RUN.log, RUN.sync, RUN.write


VLLM, PEER_NOTE = peers.load()


def bench_ms(fn) -> float:
    return cpu_ms(fn) if SMOKE else gpu_ms(fn, reps=50)


# ---------------------------------------------------------------------------------------
# Shapes


def shapes() -> dict[str, dict]:
    spec = tomllib.loads((ROOT / "specs" / "models" / "qwen36.toml").read_text())
    if SMOKE:
        return {
            # 8 experts: vLLM's naive expert assignment still serves one token (T * k * 4 <= E).
            "qwen36": dict(E=8, H=64, I=32, k=2, note="smoke: a tiny stand-in for the qwen36 shape"),
            # Past 512 intermediate columns, as e128's 768: the wide decode bucket at one token.
            "e128": dict(E=8, H=32, I=520, k=2, note="smoke: a tiny stand-in for the e128 shape"),
        }
    return {
        "qwen36": dict(
            E=spec["num_experts"],
            H=spec["hidden_size"],
            I=spec["moe_intermediate_size"],
            k=spec["top_k"],
            note=(
                f"{spec['display_name']} from specs/models/qwen36.toml: hidden_size {spec['hidden_size']} (the spec's"
                " seed figure; the model card gives 2048), moe_intermediate_size"
                f" {spec['moe_intermediate_size']} (the card's), {spec['num_experts']} experts, top-{spec['top_k']}"
            ),
        ),
        "e128": dict(
            E=128, H=2048, I=768, k=8,
            note="Qwen3-30B-A3B's experts: 128, hidden 2048, expert intermediate 768, top-8 (vLLM has a tuned H200 config)",
        ),
        "mixtral": dict(
            E=8, H=4096, I=14336, k=2,
            note="Mixtral-8x7B: 8 experts, hidden 4096, expert intermediate 14336, top-2 (vLLM has a tuned H200 config)",
        ),
        "dsv2lite": dict(
            E=64, H=2048, I=1408, k=6,
            note="DeepSeek-V2-Lite's routed experts: 64, hidden 2048, expert intermediate 1408, top-6 (vLLM: its default config)",
        ),
    }  # fmt: skip


# ---------------------------------------------------------------------------------------
# Methods


def has_grouped_mm() -> bool:
    """torch._grouped_mm exists and runs here on a 2-D x 3-D problem with an empty group."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    try:
        a = torch.randn(24, 32, device=DEV).to(DT)
        b = torch.randn(3, 48, 32, device=DEV).to(DT).transpose(1, 2)
        offs = torch.tensor([8, 8, 24], dtype=torch.int32, device=DEV)
        got = torch._grouped_mm(a, b, offs=offs)
        want = torch.cat([a[:8] @ b[0], a[8:] @ b[2]])
        return rel_err(got, want.float()) < 1e-2
    except Exception as e:  # noqa: BLE001
        log(f"torch._grouped_mm unusable here ({type(e).__name__}: {str(e)[:200]}): per-expert loop instead")
        return False


def torch_route(logits, k):
    """torch's router: softmax in fp32, top-k, renormalized."""
    weights, ids = torch.softmax(logits, dim=-1, dtype=torch.float32).topk(k, dim=-1)
    return weights / weights.sum(-1, keepdim=True), ids


def grouped_fn(x, w1, w2, logits, k, use_grouped_mm):
    """torch's own routed MoE: softmax top-k, stable sort by expert, grouped GEMMs, weighted sum."""
    T, H = x.shape
    E, two_i, _ = w1.shape
    inter = two_i // 2
    w1t, w2t = w1.transpose(1, 2), w2.transpose(1, 2)  # [E, H, 2I], [E, I, H]: column-major B

    def run():
        weights, ids = torch_route(logits, k)
        flat = ids.flatten()
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=E)
        rows = x[order // k]
        if use_grouped_mm:
            offs = counts.cumsum(0).to(torch.int32)
            gu = torch._grouped_mm(rows, w1t, offs=offs)
        else:
            ends = counts.cumsum(0).tolist()
            gu = torch.cat([rows[s:e] @ w1t[g] for g, (s, e) in enumerate(zip([0] + ends[:-1], ends))])
        h = torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]
        if use_grouped_mm:
            y = torch._grouped_mm(h, w2t, offs=offs)
        else:
            y = torch.cat([h[s:e] @ w2t[g] for g, (s, e) in enumerate(zip([0] + ends[:-1], ends))])
        y = y * weights.flatten()[order, None].to(y.dtype)
        unsorted = torch.empty_like(y).index_copy_(0, order, y)
        return unsorted.view(T, k, H).sum(1)

    return run


def reference(x, w1, w2, weights, ids) -> torch.Tensor:
    """fp32, expert by expert, on the given routing."""
    xf = x.float()
    inter = w2.shape[2]
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    ids_cpu = ids.cpu()
    for e in ids_cpu.unique().tolist():
        t, j = (ids_cpu == e).nonzero(as_tuple=True)
        t, j = t.to(x.device), j.to(x.device)
        gu = xf[t] @ w1[e].float().T
        h = torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]
        out.index_add_(0, t, weights[t, j, None].float() * (h @ w2[e].float().T))
    return out


# ---------------------------------------------------------------------------------------
# Phases


def phase_meta(hw) -> None:
    m = RES["meta"]
    m.update(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        python=platform.python_version(),
        torch=torch.__version__,
        triton=triton.__version__,
        cuda=torch.version.cuda,
        smoke=SMOKE,
        dtype=str(DT),
        argv=sys.argv[1:],
        target=hw,
    )
    if SMOKE:
        m["device"] = "cpu (TRITON_INTERPRET=1)"
    else:
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        m.update(device=p.name, cc=f"{p.major}.{p.minor}", sm_count=p.multi_processor_count)
    log(
        f"{m['date']}  python {m['python']}  torch {torch.__version__}  triton {triton.__version__}  cuda {torch.version.cuda}"
    )
    log(f"device {m['device']} -> target {hw!r}" + (" (--hw)" if ARGS.hw else " (detected)"))
    for b in M.buckets(hw, DT, DEV):
        v = b.variant
        log(f"bucket {b.name:15s} {v.name}")


def phase_copy() -> None:
    n = (1 << 17) if SMOKE else (1 << 28)  # elements of 2 bytes: 512 MiB read + 512 MiB written
    src = torch.randn(n, device=DEV).to(DT)
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src))
    moved = 2 * n * src.element_size()
    RES["copy"] = {"bytes": moved, "us": round(ms * 1e3, 2), "tbps": moved / (ms * 1e-3) / 1e12}
    log(f"device copy: {moved / 2**20:.0f} MiB moved in {ms * 1e3:.1f} us -> {RES['copy']['tbps']:.3f} TB/s")


def check(name, got, ref, case) -> None:
    err = rel_err(got, ref)
    case.setdefault("errors_vs_ref", {})[name] = err
    if not err < TOL:
        raise AssertionError(f"{name}: relative error {err:.3e} against the fp32 reference (limit {TOL})")


def measure(shape_name, s, T, use_grouped_mm, hw) -> dict:
    E, H, inter, k = s["E"], s["H"], s["I"], s["k"]
    x, w1, w2, logits = layer_inputs(T, E, H, inter, torch.Generator(device=DEV).manual_seed(T))
    bucket = M.select(T, inter, dtype=DT, hw=hw, device=DEV)
    case = {"shape": shape_name, "T": T, "bucket": bucket.name, "kernels": bucket.variant.name}

    def ours():
        weights, ids = M.topk_softmax(logits, k, True)
        return M.fused_moe(x, w1, w2, weights, ids, hw=hw)

    base = grouped_fn(x, w1, w2, logits, k, use_grouped_mm)
    # Correct first, each against the reference on its own routing (the two routers agree but
    # for probabilities that round equal, which they may order differently).
    weights, ids = M.topk_softmax(logits, k, True)
    ours_ref = reference(x, w1, w2, weights, ids)
    check("ours", ours(), ours_ref, case)
    tw, ti = torch_route(logits, k)
    grouped_ref = reference(x, w1, w2, tw, ti)
    case["grouped_method"] = "torch._grouped_mm" if use_grouped_mm else "per-expert torch.matmul loop"
    try:
        check("grouped", base(), grouped_ref, case)
    except Exception as e:  # noqa: BLE001
        if not use_grouped_mm:
            raise
        # A routing torch._grouped_mm refuses or gets wrong: the loop, and the reason, recorded.
        case["grouped_method"] = f"per-expert torch.matmul loop (torch._grouped_mm: {type(e).__name__}: {str(e)[:200]})"
        log(f"{shape_name} T={T}: {case['grouped_method']}")
        base = grouped_fn(x, w1, w2, logits, k, False)
        check("grouped", base(), grouped_ref, case)
    case["tokens_routed_differently"] = int((ids.long().sort(-1).values != ti.sort(-1).values).any(-1).sum())
    methods = {"ours": ours, "grouped": base}
    if bucket.variant.kind == "grouped":
        # The alignment alone (moe_align_block_size at the bucket's row block): part of ours.
        methods["align"] = lambda: M.moe_align_block_size(ids, bucket.variant.block_m, E)
    if VLLM is not None and (not SMOKE or (shape_name, T) in SMOKE_PEER):
        peer = VLLM.VllmMoE(w1, w2, k, T, device_name=VLLM.device_name())
        case["vllm_config"] = f"{peer.config_source}: {peer.config}"

        def vllm():
            weights, ids = M.topk_softmax(logits, k, True)
            return peer(x, weights, ids)

        check("vllm", vllm(), ours_ref, case)  # the same router as ours: the same routing
        methods["vllm"] = vllm
    m_e = max(1, T * k // E)  # rows an expert gets on average
    if T >= PREFILL:
        a_e = torch.randn(m_e, H, device=DEV).to(DT)
        h_e = torch.randn(m_e, inter, device=DEV).to(DT)
        a_all = torch.randn(T * k, H, device=DEV).to(DT)
        h_all = torch.randn(T * k, inter, device=DEV).to(DT)

        def cublas_expert():
            return torch.matmul(a_e, w1[0].T), torch.matmul(h_e, w2[0].T)

        def cublas_dense():
            return torch.matmul(a_all, w1[0].T), torch.matmul(h_all, w2[0].T)

        for name, fn, a, h in (
            ("cublas_expert", cublas_expert, a_e, h_e),
            ("cublas_dense", cublas_dense, a_all, h_all),
        ):
            up, down = fn()
            check(name, torch.cat([up.flatten(), down.flatten()]),
                  torch.cat([(a.float() @ w1[0].float().T).flatten(), (h.float() @ w2[0].float().T).flatten()]), case)  # fmt: skip
            methods[name] = fn
    sync()
    timed = interleaved(methods, 1 if SMOKE else ARGS.rounds, "ours", bench_ms)
    ms = {n: t["ms"] for n, t in timed.items()}
    used = ids.unique().numel()
    weight_bytes = activated_bytes(ids, w2)
    flops = 6 * T * k * H * inter
    copy = RES["copy"]["tbps"]
    case.update(
        experts_used=used,
        weight_bytes=weight_bytes,
        ours_us=ms["ours"] * 1e3,
        ours_weight_tbps=weight_bytes / (ms["ours"] * 1e-3) / 1e12,
        ours_tflops=flops / (ms["ours"] * 1e-3) / 1e12,
        grouped_us=ms["grouped"] * 1e3,
        grouped_tflops=flops / (ms["grouped"] * 1e-3) / 1e12,
        # grouped time / ours, the median over rounds (interleaved's ratio is ours / grouped).
        ours_vs_grouped=1 / timed["grouped"]["ratio"],
    )
    if "align" in ms:
        case["align_us"] = ms["align"] * 1e3
    if "vllm" in ms:
        case["vllm_us"] = ms["vllm"] * 1e3
        case["ours_vs_vllm"] = 1 / timed["vllm"]["ratio"]  # vllm time / ours, median over rounds
    case["ours_weight_frac_copy"] = case["ours_weight_tbps"] / copy
    if not SMOKE and T <= GRAPH_T_MAX:
        # Decode as a server runs it: each method's launches captured once, timed as replays.
        replays = {}
        for name, ref in (("ours", ours_ref), ("grouped", grouped_ref), ("vllm", ours_ref)):
            if name not in methods:
                continue
            try:
                graph, got = captured(methods[name])
                got.fill_(float("nan"))  # every element must be written by the replay
                graph.replay()
                check(f"{name}_graph", got, ref, case)
                replays[name] = graph.replay
            except Exception as e:  # noqa: BLE001
                case.setdefault("graph_errors", {})[name] = f"{type(e).__name__}: {str(e)[:300]}"
                log(f"{shape_name} T={T}: {name} in a CUDA graph: {case['graph_errors'][name]}")
        if "ours" in replays:
            g_ms = {n: t["ms"] for n, t in interleaved(replays, ARGS.rounds, "ours", bench_ms).items()}
            case["ours_graph_us"] = g_ms["ours"] * 1e3
            case["ours_graph_weight_frac_copy"] = weight_bytes / (g_ms["ours"] * 1e-3) / 1e12 / copy
            for name in ("grouped", "vllm"):
                if name in g_ms:
                    case[f"{name}_graph_us"] = g_ms[name] * 1e3
    if T <= GRAPH_T_MAX and (not SMOKE or (shape_name, T) in SMOKE_STEP):  # (the interpreter: its time)
        try:
            step_ms = decode_step_ms(x, w1, w2, logits, k, hw, case)
            case["ours_step_layer_us"] = step_ms * 1e3 / STEP_LAYERS
            # Each layer reads its own experts' weights: the step's bytes over its time.
            case["ours_step_weight_frac_copy"] = case["step_weight_bytes"] / (step_ms * 1e-3) / 1e12 / copy
        except Exception as e:  # noqa: BLE001
            case["step_error"] = f"{type(e).__name__}: {str(e)[:300]}"
            log(f"{shape_name} T={T}: decode step: {case['step_error']}")
    for name, rows in (("cublas_expert", m_e), ("cublas_dense", T * k)):
        if name in ms:
            case[f"{name}_rows"] = rows
            case[f"{name}_tflops"] = 6 * rows * H * inter / (ms[name] * 1e-3) / 1e12
            case[f"ours_vs_{name}_tflops"] = case["ours_tflops"] / case[f"{name}_tflops"]
    return case


def layer_inputs(T, E, H, inter, g):
    """One MoE layer's random inputs, drawn from generator g: hidden states [T, H], w1 [E, 2I, H]
    and w2 [E, H, I] (scaled so that activations stay near unit size), fp32 logits [T, E]."""
    x = torch.randn(T, H, device=DEV, generator=g).to(DT)
    w1 = (torch.randn(E, 2 * inter, H, device=DEV, generator=g) / H**0.5).to(DT)
    w2 = (torch.randn(E, H, inter, device=DEV, generator=g) / inter**0.5).to(DT)
    return x, w1, w2, torch.randn(T, E, device=DEV, generator=g)


def activated_bytes(ids, w2) -> int:
    """The weight bytes a call reads: w1's and w2's rows of every expert some token routes to."""
    E, H, inter = w2.shape
    return ids.unique().numel() * 3 * H * inter * w2.element_size()


def decode_step_ms(x, w1, w2, logits, k, hw, case) -> float:
    """STEP_LAYERS MoE layers back to back as a decode step runs them (each starts when the one
    before it has ended: its router is a plain launch), each with its own input, weights and
    logits (layer 0 the case's), captured in one CUDA graph, checked against the eager run, and
    timed as replays (gpu_ms: L2 flushed before each).  (Each layer has its own input because
    without a model's norms and residuals a chain of layers' outputs would shrink to zero.)
    Records the step's weight bytes (each layer's activated experts) in case."""
    (T, H), (E, _, inter) = x.shape, w2.shape
    g = torch.Generator(device=DEV).manual_seed(1000 + T)
    layers = [(x, w1, w2, logits)] + [layer_inputs(T, E, H, inter, g) for _ in range(STEP_LAYERS - 1)]
    outs = [torch.empty_like(x) for _ in layers]

    def step():
        for (h, a, b, lg), out in zip(layers, outs):
            weights, ids = M.topk_softmax(lg, k, True)
            M.fused_moe(h, a, b, weights, ids, out=out, hw=hw)
        return outs

    want = torch.stack(step()).float()
    case["step_layers"] = STEP_LAYERS
    case["step_weight_bytes"] = sum(activated_bytes(M.topk_softmax(lg, k, True)[1], b) for _, _, b, lg in layers)
    if SMOKE:  # the interpreter: the eager run (no graphs on the CPU)
        return bench_ms(step)
    graph, got = captured(step)
    for out in got:
        out.fill_(float("nan"))  # every layer's output must be written by the replay
    graph.replay()
    err = rel_err(torch.stack(got), want)
    case["step_vs_eager"] = err
    if not err < 1e-3:
        raise AssertionError(f"the step's replay differs from its eager run: relative error {err:.3e}")
    return bench_ms(graph.replay)


def fmt(v, spec) -> str:
    return "-" if v is None else format(v, spec)


def table(cases) -> None:
    head = "| shape | T | bucket | ours us | of which alignment us | weights TB/s | of copy | ours TFLOP/s | grouped us | ours speedup | vLLM us | ours vs vLLM | in graphs: ours us | of copy | grouped us | vLLM us | decode step: us a layer | of copy | cuBLAS expert TFLOP/s | ours / cuBLAS expert | cuBLAS dense TFLOP/s |"
    print("\n" + head)
    print("|" + "---|" * (head.count("|") - 1))
    for c in cases:
        print(
            f"| {c['shape']} | {c['T']} | {c['bucket']} | {fmt(c.get('ours_us'), '.1f')} | {fmt(c.get('align_us'), '.1f')}"
            f" | {fmt(c.get('ours_weight_tbps'), '.3f')}"
            f" | {fmt(c.get('ours_weight_frac_copy'), '.2f')} | {fmt(c.get('ours_tflops'), '.1f')} | {fmt(c.get('grouped_us'), '.1f')}"
            f" | {fmt(c.get('ours_vs_grouped'), '.2f')}x | {fmt(c.get('vllm_us'), '.1f')} | {fmt(c.get('ours_vs_vllm'), '.2f')}x"
            f" | {fmt(c.get('ours_graph_us'), '.1f')}"
            f" | {fmt(c.get('ours_graph_weight_frac_copy'), '.2f')} | {fmt(c.get('grouped_graph_us'), '.1f')}"
            f" | {fmt(c.get('vllm_graph_us'), '.1f')}"
            f" | {fmt(c.get('ours_step_layer_us'), '.1f')} | {fmt(c.get('ours_step_weight_frac_copy'), '.2f')}"
            f" | {fmt(c.get('cublas_expert_tflops'), '.1f')}"
            f" | {fmt(c.get('ours_vs_cublas_expert_tflops'), '.2f')} | {fmt(c.get('cublas_dense_tflops'), '.1f')} |"
        )


def main() -> int:
    hw = target_name(ARGS.hw)
    phase_meta(hw)
    phase_copy()
    use_grouped_mm = has_grouped_mm()
    RES["meta"]["grouped_baseline"] = "torch._grouped_mm" if use_grouped_mm else "per-expert torch.matmul loop"
    log(f"grouped baseline: {RES['meta']['grouped_baseline']}")
    RES["meta"]["vllm_peer"] = PEER_NOTE or str(peers.path())
    log(f"vLLM peer: {RES['meta']['vllm_peer']}")
    for name, s in shapes().items():
        if ARGS.models and name not in ARGS.models:
            continue
        RES["shapes"][name] = s
        log(f"shape {name}: E={s['E']} H={s['H']} I={s['I']} top-{s['k']} ({s['note']})")
        for T in TOKENS:
            if SMOKE and (name, T) in SMOKE_SKIP:
                continue
            if not SMOKE and RUN.elapsed() > ARGS.budget_s:  # (the smoke run checks every case's wiring)
                RES["skipped"].append(f"{name} T={T} (budget)")
                log(f"skipped {name} T={T}: past the {ARGS.budget_s:.0f} s budget")
                continue
            try:
                case = measure(name, s, T, use_grouped_mm, hw)
                RES["cases"].append(case)
                log(
                    f"{name} T={T:5d} {case['bucket']:15s} ours {case['ours_us']:9.1f} us"
                    f" ({case['ours_weight_frac_copy']:.2f} of copy, {case['ours_tflops']:.1f} TFLOP/s"
                    + (f"; alignment {case['align_us']:.1f} us" if "align_us" in case else "")
                    + "),"
                    f" grouped {case['grouped_us']:9.1f} us, ours {case['ours_vs_grouped']:.2f}x"
                    + (f"; vLLM {case['vllm_us']:9.1f} us, ours {case['ours_vs_vllm']:.2f}x" if "vllm_us" in case else "")
                    + (
                        f"; graphs: ours {case['ours_graph_us']:.1f} us ({case['ours_graph_weight_frac_copy']:.2f} of copy)"
                        if "ours_graph_us" in case
                        else ""
                    )
                    + (
                        f"; decode step: {case['ours_step_layer_us']:.1f} us a layer"
                        f" ({case['ours_step_weight_frac_copy']:.2f} of copy)"
                        if "ours_step_layer_us" in case
                        else ""
                    )
                )
            except Exception as e:  # noqa: BLE001
                RES["errors"].append(
                    {
                        "case": f"{name} T={T}",
                        "error": f"{type(e).__name__}: {e}",
                        "traceback": traceback.format_exc()[-3000:],
                    }
                )
                log(f"ERROR {name} T={T}: {type(e).__name__}: {str(e)[:300]}")
            finally:
                if not SMOKE:
                    torch.cuda.empty_cache()
            write_json()
    table(RES["cases"])
    write_json()
    log(f"{len(RES['cases'])} cases, {len(RES['errors'])} errors, {len(RES['skipped'])} skipped")
    return 1 if RES["errors"] else 0


if __name__ == "__main__":
    sys.exit(quiet_on_closed_pipe(main))
