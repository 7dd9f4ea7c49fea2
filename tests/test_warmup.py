"""Ahead-of-time warm-up (policy_runtime/warmup/), checked on the CPU in Triton's interpreter.

The interpreter compiles nothing, so what is checked here is what can be without a GPU: that the
compile-only scope runs no kernel and leaves every output as it was; that the drivers make one
representative call per bucket, instantiation and launch plan of a target (against the generated
tables, for several targets); that the calls of other shapes in the same buckets (a new M, token
count, length: a server's first requests) launch nothing whose specialization key, as Triton's own
binder computes it, the warm-up did not compile; the command line's arguments and errors; the
grouping of launches into kernels and the worker processes.  bench/warmup.py checks the GPU side
(compile counts and first-call times in fresh processes).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import threading

import pytest
import torch

import generated
from conftest import REPO
from generated import attention as at
from generated import cache as cache_ops
from generated import dispatch
from generated import matmul as mm
from generated import moe
from generated import transform as transform_ops
from policy_runtime.cache import ops as rt_cache
from policy_runtime import launch
from policy_runtime.transform import ops as rt_transform
from policy_runtime.moe.ops import TOPK_ONE_ROW_MAX_T
from policy_runtime.warmup import engine as W
from policy_runtime.matmul.warmup import MatmulDriver
from policy_runtime.warmup import calls as warmup_calls
from policy_runtime.warmup import cli as warmup_cli

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's side; bench/warmup.py on a GPU")

MODULES = [f"generated.{m}" for m in generated.KERNEL_MODULES]
TARGETS = ("h200", "bi_v100", "a100")
_PLANS: dict = {}


def planned(target: str, pick: str = "first", **options) -> W.Plan:
    key = (target, pick, tuple(sorted(options.items())))
    if key not in _PLANS:
        _PLANS[key] = W.plan(MODULES, target, pick=pick, **options)
    return _PLANS[key]


class Recorder:
    def __init__(self):
        self.kernels = []

    def __call__(self, kernel, grid, args, kwargs):
        self.kernels.append(kernel.__name__)


# ----------------------------------------------------------------------------------------------
# The compile-only scope


def test_compile_only_scope_runs_no_kernel_and_leaves_outputs_alone():
    bf16 = torch.bfloat16
    sentinel = 7.0
    a, b = torch.randn(40, 64), torch.randn(64, 48)
    out = torch.full((40, 48), sentinel)
    query, key = torch.randn(3, 2 * 16), torch.randn(3, 16)
    q0, k0 = query.clone(), key.clone()
    kv = torch.randn(3, 2, 8)
    kc, vc = torch.full((4, 2, 2, 8), sentinel), torch.full((4, 2, 2, 8), sentinel)
    pq, pk = torch.randn(10, 4, 64), torch.randn(10, 2, 64)
    cu = torch.tensor([0, 10], dtype=torch.int32)
    p_out = torch.full((10, 4, 64), sentinel)
    d_out = torch.full((2, 4, 64), sentinel)
    cache = torch.randn(2, 16, 2, 64)
    table, lens = torch.zeros((2, 1), dtype=torch.int32), torch.tensor([5, 9], dtype=torch.int32)
    x, w1, w2 = (
        torch.randn(4, 32, dtype=bf16),
        torch.randn(8, 2 * 16, 32, dtype=bf16),
        torch.randn(8, 32, 16, dtype=bf16),
    )
    weights, ids = torch.rand(4, 2), torch.zeros((4, 2), dtype=torch.int32)
    m_out = torch.full((4, 32), sentinel, dtype=bf16)
    calls = {
        "matmul": lambda: mm.matmul_triton(a, b, out=out, hw="h200"),
        "rotary": lambda: transform_ops.rotary_embedding(
            torch.zeros(3, dtype=torch.int64), query, key, torch.ones(4, 16), 16, True, hw="h200"
        ),
        "reshape_and_cache": lambda: cache_ops.reshape_and_cache(kv, kv, kc, vc, torch.tensor([0, 3, 5]), hw="h200"),
        "copy_blocks": lambda: cache_ops.copy_blocks([kc], [vc], torch.tensor([[0, 1]]), hw="h200"),
        "prefill": lambda: at.prefill_attention(pq, pk, pk, cu, cu, 10, 10, out=p_out, hw="h200"),
        "decode": lambda: at.decode_attention(pq[:2], cache, cache, table, lens, out=d_out, hw="h200"),
        # Every bucket of the target: gemv, grouped with the fused sum (fp32 atomics), grouped
        # with the reduce kernel.
        **{
            f"fused_moe T={t}": (
                lambda t=t: moe.fused_moe(
                    x[:t].expand(t, 32) if t <= 4 else x.repeat(t // 4 + 1, 1)[:t],
                    w1,
                    w2,
                    weights[:1].expand(t, 2),
                    ids[:1].expand(t, 2),
                    out=torch.full((t, 32), sentinel, dtype=bf16) if t > 4 else m_out[:t],
                    hw="h200",
                )
            )
            for t in (1, 16, 40, 600)
        },
        "topk_softmax": lambda: moe.topk_softmax(torch.randn(3, 8), 2, True),
    }
    for name, call in calls.items():
        recorder = Recorder()
        with launch.compile_only(recorder):
            result = call()
        assert recorder.kernels, name
        if name.startswith("fused_moe"):
            assert torch.all(result == sentinel), name
    for t in (out, kc, vc, p_out, d_out, m_out):
        assert torch.all(t == sentinel)
    assert torch.equal(query, q0) and torch.equal(key, k0)
    # Outside the scope the same call runs.
    mm.matmul_triton(a, b, out=out, hw="h200")
    torch.testing.assert_close(out, a @ b, rtol=1e-4, atol=1e-4)


def test_compile_only_scope_is_this_threads_alone():
    seen = {}
    with launch.compile_only(Recorder()):
        assert launch.compiling()
        worker = threading.Thread(target=lambda: seen.setdefault("other thread", launch.compiling()))
        worker.start()
        worker.join()
    assert seen == {"other thread": False}
    assert not launch.compiling() and launch._SCOPES == 0


def test_the_memory_bound_launch_path_hands_its_plan_to_the_scope():
    x = torch.randn(5, 64)
    recorder = Recorder()
    with launch.compile_only(recorder):
        transform_ops.silu_and_mul(x, hw="h200")
        transform_ops.rms_norm(x, torch.ones(64), 1e-6, hw="h200")
    assert recorder.kernels == ["_silu_and_mul_kernel", "_rms_norm_kernel"]


# ----------------------------------------------------------------------------------------------
# The drivers' calls: one per bucket, instantiation and launch plan


def launched(plan: W.Plan, module: str, *covers: str) -> set[str]:
    return {
        name
        for call, per_call in zip(plan.calls, plan.launches)
        if call.module == f"generated.{module}" and call.covers[: len(covers)] == covers
        for name, _ in per_call
    }


@pytest.mark.parametrize("target", TARGETS)
def test_matmul_calls_cover_every_bucket_in_both_layouts(target):
    plan = planned(target)
    # (MoE notes the buckets its models' expert shapes do not reach: the MoE test below; scaled_mm
    # the targets it does not serve: tests/test_scaled_mm.py.)
    assert not plan.failed and not [n for n in plan.notes if not n.startswith(("moe ", "scaled_mm: not served on "))]
    for dtype, torch_dtype in (("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        buckets = mm.buckets(target, torch_dtype)
        covered = [c.covers[2:5] for c in plan.calls if c.module == "generated.matmul" and c.covers[3] == dtype]
        assert sorted(set(covered)) == sorted((b.name, dtype, layout) for b in buckets for layout in MatmulDriver.LAYOUTS)
        for call in (c for c in plan.calls if c.module == "generated.matmul" and c.covers[3] == dtype):
            _, _, M, N, K, _ = call.args
            bucket = mm.select(M, N, K, dtype=torch_dtype, hw=target)
            # Each call stands for the argument class of (N, K) it names (tests/test_warmup_classes.py).
            assert bucket.name == call.covers[2]
            assert call.covers[5] == MatmulDriver.describe_class(MatmulDriver.arg_class(M, N, K, bucket.triton))
            names = launched(plan, "matmul", *call.covers)
            fallback = bucket.triton.fallback
            assert names == {bucket.triton.name} or (fallback is not None and names == {fallback.name}), names


@pytest.mark.parametrize("target", TARGETS)
def test_attention_calls_compile_each_models_prefill_decode_and_merge(target):
    plan = planned(target)
    for model, dims in dispatch.MODEL_DIMS.items():
        for dtype, torch_dtype in (("bfloat16", torch.bfloat16), ("float16", torch.float16)):
            sel = at.select(torch_dtype, dims["head_dim"], hw=target)
            assert launched(plan, "attention", "prefill", model, dtype) == {sel.prefill.name}
            assert launched(plan, "attention", "decode", model, dtype) == {sel.decode.name, "_merge"}
            causal = {c.covers[3] for c in plan.calls if c.covers[:3] == ("prefill", model, dtype)}
            assert causal == {"causal", "full"}
            # Over an fp8 KV cache (targets with e4m3fn): its decode tiles and the paged prefill.
            fp8_decode = launched(plan, "attention", "decode fp8 KV", model, dtype)
            fp8_prefill = launched(plan, "attention", "prefill fp8 KV", model, dtype)
            if target in at.FP8_UNSERVED:
                assert fp8_decode == fp8_prefill == set()
            else:
                sel8 = at.select(torch_dtype, dims["head_dim"], hw=target, kv_fp8=True)
                assert fp8_decode == {sel8.decode.name, "_merge"} and fp8_prefill == {sel.prefill.name}


@pytest.mark.parametrize("target", TARGETS)
def test_moe_calls_cover_every_bucket_of_each_model_with_experts(target):
    experts = [m for m, d in dispatch.MODEL_DIMS.items() if d.get("num_experts")]
    assert experts == ["deepseek_v3", "gpt_oss_20b", "qwen36"]
    # qwen36's calls alone: the buckets its expert shape reaches and the notes of those it does not.
    plan = planned(target, models=("qwen36",))
    buckets = moe.buckets(target, torch.bfloat16)
    # The buckets qwen36's expert shape reaches, each covered once; the rest (another shape's, such
    # as h200's wide decode bucket) each noted and not compiled.
    inter = dispatch.MODEL_DIMS["qwen36"]["moe_intermediate_size"]
    counts = sorted({2**j + d for j in range(17) for d in (-1, 0, 1)} - {0})
    reached = {moe.select(t, inter, hw=target).name for t in counts}
    covered = [c.covers[3] for c in plan.calls if c.covers[:3] == ("fused_moe", "qwen36", "bfloat16")]
    # Each bucket once, with the activation of qwen36's MoERouting record (silu).
    acts = [c.covers[5] for c in plan.calls if c.covers[:3] == ("fused_moe", "qwen36", "bfloat16")]
    assert acts == [a for b in buckets if b.name in reached for a in ("silu",)]
    assert list(dict.fromkeys(covered)) == [b.name for b in buckets if b.name in reached]
    unreached = {b.name for b in buckets} - reached
    noted = [n for n in plan.notes if n.startswith(f"moe {target} ")]
    assert {n.split()[2] for n in noted} == unreached
    assert len(noted) == 2 * len(unreached)  # one a dtype (bfloat16, float16)
    assert all(f"qwen36's expert intermediate size {inter}" in n for n in noted)
    if target == "h200":
        assert unreached == {"decode_one_wide", "medium_wide"}
    top_k = dispatch.MODEL_DIMS["qwen36"]["top_k"]
    for b in (b for b in buckets if b.name in reached):
        v = b.variant
        expected = {v.up.__name__, v.down.__name__}
        if v.kind == "grouped":
            expected |= {"_align_count", "_align_offsets", "_align_scatter"}
            if not v.fuse_sum and top_k > 1:
                expected.add("sum_rows")
        assert launched(plan, "moe", "fused_moe", "qwen36", "bfloat16", b.name) == expected
    assert launched(plan, "moe", "topk_softmax") == {"_topk_softmax_kernel"}
    # The router's two launch shapes (a token a program, tiles of tokens): each its own compile.
    paths = {
        c.covers[4]: k
        for c, k in zip(plan.calls, plan.launches)
        if c.covers[:3] == ("topk_softmax", "qwen36", "bfloat16") and c.covers[3] == "renormalize"
    }
    assert set(paths) == {"one row", "tiles"} and paths["one row"] != paths["tiles"]
    assert not any(c.covers[1] == "llama31_8b" for c in plan.calls if c.module == "generated.moe")


@pytest.mark.parametrize("target", ["h200", "mi300x"])
def test_moe_routers_follow_the_routing_record_and_cover_float32_logits(target):
    """Issue 36: the routers warm-up compiles are the model's MoERouting record's (scoring, bias,
    groups, scaling; grouped_topk alone where the record says grouped), for the warmed dtype and
    for float32 logits (issue 35: a float32 router's first call after warm-up compiled)."""
    plan = planned(target, models=("qwen36", "deepseek_v3"), dtypes=("bfloat16",))
    routers = {(c.covers[1], c.op, *c.args[1:]) for c in plan.calls if c.op in ("topk_softmax", "grouped_topk")}
    for model in ("qwen36", "deepseek_v3"):
        rec = dispatch.dispatch_kernel_config("moe_routing", target, model)
        dims = dispatch.MODEL_DIMS[model]
        E, k = dims["num_experts"], dims["top_k"]
        want = set()
        for dtype in ("bfloat16", "float32"):
            for T in (1, TOPK_ONE_ROW_MAX_T + 1):
                for renorm in (True, False):
                    if rec.grouped:
                        want.add(("grouped_topk", dtype, T, E, k, renorm, rec.scoring, rec.score_bias,
                                  rec.num_expert_group, rec.topk_group, rec.routed_scaling_factor))  # fmt: skip
                    else:
                        want.add(("topk_softmax", dtype, T, E, k, renorm))
        assert {r[1:] for r in routers if r[0] == model} == want, model
    deepseek = dispatch.dispatch_kernel_config("moe_routing", target, "deepseek_v3")
    assert deepseek.grouped and deepseek.scoring == "sigmoid" and deepseek.score_bias


def plan_keys(planner, *rest, max_tokens):
    return {warmup_calls._plan_key(planner(n, *rest)) for n in range(1, max_tokens + 1)}


@pytest.mark.parametrize("target", ("h200", "bi_v100"))
def test_memory_bound_calls_cover_every_launch_plan_over_token_counts(target):
    """One call per distinct plan (kernel, constants, warps, block counts) over every token count
    up to max_tokens, checked against the planners themselves."""
    max_tokens = 2048
    plan = planned(target, max_tokens=max_tokens)
    tr, ca = transform_ops._KERNELS.launch, cache_ops._KERNELS.launch
    for model, d in dispatch.MODEL_DIMS.items():
        hd, nq, nk, hidden, inter = (
            d["head_dim"],
            d["num_heads"],
            d["num_kv_heads"],
            d["hidden_size"],
            d["intermediate_size"],
        )
        for dtype in ("bfloat16", "float16"):
            esize = 2
            expected = {
                ("rms_norm", "plain"): plan_keys(
                    rt_transform.plan_rms_norm, hidden, esize, False, tr["rms_norm"][target], max_tokens=max_tokens
                ),
                ("rms_norm", "residual"): plan_keys(
                    rt_transform.plan_rms_norm, hidden, esize, True, tr["rms_norm"][target], max_tokens=max_tokens
                ),
                ("silu_and_mul",): plan_keys(
                    rt_transform.plan_silu_and_mul, inter, esize, tr["silu_and_mul"][target], max_tokens=max_tokens
                ),
                ("rotary_embedding", "neox"): plan_keys(
                    rt_transform.plan_rotary_embedding,
                    *(nq, nk, hd, hd, True, esize, tr["rotary_embedding"][target]),
                    max_tokens=max_tokens,
                ),
                ("reshape_and_cache",): plan_keys(
                    rt_cache.plan_reshape_and_cache,
                    *(nk * hd, hd, esize, ca["reshape_and_cache"][target]),
                    max_tokens=max_tokens,
                ),
                ("copy_blocks",): plan_keys(
                    rt_cache.plan_copy_blocks,
                    *(2, 16 * nk * hd, 8, esize, ca["copy_blocks"][target]),
                    max_tokens=max_tokens,
                ),
            }
            for (op, *variant), keys in expected.items():
                # covers: (op, model, dtype, *variant, argument class, plan)
                texts = [
                    c.covers[-2:]
                    for c in plan.calls
                    if c.covers[0] == op and c.covers[1:3] == (model, dtype) and list(c.covers[3:-2]) == variant
                ]
                # A plan an earlier model's call of the same shape covers (llama31_8b's
                # intermediate size is gemma2_9b's) is not called again for this one.
                shared = [
                    c.covers[-1]
                    for c in plan.calls
                    if c.covers[0] == op and c.covers[2] == dtype and list(c.covers[3:-2]) == variant
                ]
                # Every plan of a token count up to max_tokens has its call (larger counts, sampled,
                # may add plans), and no plan has two in one argument class.
                assert {warmup_calls.plan_text(k) for k in keys} <= set(shared), (model, dtype, op)
                assert len(texts) == len(set(texts)), (model, dtype, op)


@pytest.mark.parametrize("target", ("h200", "bi_v100"))
def test_calls_of_other_shapes_launch_only_what_warm_up_compiled(target):
    """After warm-up, a server's first calls (another M in each matmul bucket, another token count
    in each plan and MoE bucket, other lengths and batch sizes) launch only kernels whose
    specialization key (Triton's own binder's, on the CPU) the warm-up compiled."""
    first, other = planned(target), planned(target, pick="other")
    assert [c.covers for c in first.calls] == [c.covers for c in other.calls]
    changed = sum(1 for a, b in zip(first.calls, other.calls) if a.args != b.args)
    assert changed >= 0.9 * len(first.calls)
    assert other.keys() <= first.keys()
    assert sum(map(len, other.launches)) == sum(map(len, first.launches))
    # The check has teeth: a dtype the warm-up was not asked for (float32) is a new key.
    for bucket in mm.buckets(target, torch.bfloat16):
        call = next(c for c in first.calls if c.covers[1:5] == ("matmul_16bit", bucket.name, "bfloat16", "b row-major"))
        hw, dtype, M, N, K, layout = call.args
        other_dtype = W.Call(call.module, call.op, (hw, "float32", M, N, K, layout), call.covers)
        ((name, key),) = W._run_call(other_dtype, torch.device("cpu")).launches
        assert key not in first.keys()


# ----------------------------------------------------------------------------------------------
# Launches grouped into kernels; worker processes


def test_launches_with_one_key_are_one_kernel_heaviest_first():
    calls = [W.Call("m", "x", (i,), ("x",), weight=w) for i, w in enumerate((1, 3, 1))]
    launches = [[("k1", "A"), ("k2", "B")], [("k3", "C"), ("k1", "A")], [("k2", "B")]]
    units = W._units(calls, launches)
    assert [(u.kernel, u.launches, u.weight) for u in units] == [
        ("k1", ((0, 0), (1, 1)), 3),
        ("k3", ((1, 0),), 3),
        ("k2", ((0, 1), (2, 0)), 1),
    ]


def test_h200_plan_counts():
    plan = planned("h200")
    by_module = {}
    for u in plan.units:
        by_module[u.module] = by_module.get(u.module, 0) + 1
    # matmul: each distinct kernel of a dtype's buckets (buckets may share one), in 2 B layouts,
    # in each argument class of N and K (tests/test_warmup_classes.py): more than that.
    kernels = sum(len({b.triton.name for b in mm.buckets("h200", d)}) for d in (torch.bfloat16, torch.float16))
    assert by_module["generated.matmul"] > 2 * kernels
    # attention, per dtype: each of 5 models' prefill (causal and not), decode and merge in its
    # global layers' features (20), less the merge gemma2_9b shares with qwen36 (head_dim 256,
    # merge has no features), plus the merge's second launch shape at head_dims 64, 128 and 256
    # (3; deepseek_v3's 128 heads at 192 reach only the wide one, even at one sequence), the
    # windowed sets of gemma2_9b and gpt_oss_20b (prefill causal and not, decode: 6); and over
    # an fp8 KV cache, in each of those 7 feature sets, the decode kernel and the paged causal
    # prefill (14; the merge is the same kernel); and the causal prefill over a paged 16-bit cache
    # in each (7).  One layout class of q/k/v each: every model's head_dim is a multiple of 16
    # (tests/test_warmup_classes_kernels.py).
    assert by_module["generated.attention"] == 2 * (5 * 4 - 1 + 3 + 2 * 3 + 7 * 2 + 7)
    assert len({u.key for u in plan.units}) == len(plan.units)


def test_worker_processes_compile_their_share(tmp_path):
    plan = W.plan(["generated.transform"], "h200", dtypes=["bf16"], models=["llama31_8b"])
    got = {}
    W._compile_in_workers(plan.units, plan.calls, 2, str(tmp_path), lambda i, r: got.setdefault(i, r))
    assert sorted(got) == list(range(len(plan.units)))
    for i, results in got.items():
        assert [r.kernel for r in results] == [plan.units[i].kernel] * len(plan.units[i].launches)
        assert all(r.error is None for r in results)


# ----------------------------------------------------------------------------------------------
# The entry points and the report


def test_module_and_package_warmup_report():
    report = transform_ops.warmup("h200", workers=0, dtypes=["bf16"])
    assert report.modules == ("generated.transform",) and report.interpreter and report.ok
    assert len(report.kernels) == len(W.plan(["generated.transform"], "h200", dtypes=["bf16"]).units)
    text = str(report)
    assert "warm-up of h200 (bfloat16" in text and "planned" in text and report.cache_dir in text
    data = report.to_json()
    assert data["kernels"] == len(report.kernels) and data["by_module"] == {"transform": len(report.kernels)}
    full = generated.warmup("bi_v100", workers=0, dtypes=[torch.float16], models=["qwen36"])
    # Every module but scaled_mm, which the BI-V100 (no FP8) does not serve.
    assert set(full.by_module()) == set(generated.KERNEL_MODULES) - {"scaled_mm"} and full.ok
    assert full.dtypes == ("float16",) and full.models == ("qwen36",)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--hw", "nope"], "unknown --hw 'nope'; known: a10, a100"),
        (["--hw", "h200", "--dtypes", "int8"], "unknown dtype 'int8'; expected bfloat16, float16, float32"),
        (["--hw", "h200", "--modules", "nope"], "unknown module 'nope'; known: attention, cache, matmul, moe"),
        (
            ["--hw", "h200", "--models", "gpt2"],
            "unknown model 'gpt2'; known: deepseek_v3, gemma2_9b, gpt_oss_20b, llama31_8b, qwen36",
        ),
        (["--hw", "h200", "--package", "no_such_package"], "cannot import the generated package 'no_such_package'"),
    ],
)
def test_command_line_errors_exit_2(argv, message, capsys):
    assert warmup_cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m policy_runtime.warmup: error: ") and message in err, err


def test_command_line_plan_and_json(tmp_path, capsys):
    assert warmup_cli.main(["--hw", "h200", "--modules", "cache", "--dtypes", "fp16", "--plan"]) == 0
    out = capsys.readouterr().out
    assert "cache: reshape_and_cache llama31_8b float16" in out and out.rstrip().endswith("kernels")
    path = tmp_path / "report.json"
    argv = ["--hw", "h200", "--modules", "transform,cache", "--dtypes", "bf16", "--json", str(path), "--no-progress"]
    assert warmup_cli.main(argv) == 0
    assert "warm-up of h200 (bfloat16" in capsys.readouterr().out
    data = json.loads(path.read_text())
    assert data["modules"] == ["generated.transform", "generated.cache"] and data["failed"] == 0


# The checks that need a fresh process share one child (torch and triton imported once):
# importing every kernel module leaves warm-up unimported, then ``python -m policy_runtime.warmup``
# (runpy, as -m runs it) refuses a bad option.
_FRESH_PROCESS = """
import runpy, sys
import generated.matmul, generated.transform, generated.cache, generated.attention, generated.moe
print('policy_runtime.warmup' in sys.modules, flush=True)
sys.argv = ['python -m policy_runtime.warmup', '--hw', 'h200', '--workers', 'two']
runpy.run_module('policy_runtime.warmup', run_name='__main__', alter_sys=True)
"""


def test_importing_the_kernel_modules_does_not_import_warm_up_and_its_entry_point_refuses_a_bad_option():
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", _FRESH_PROCESS], cwd=REPO, env=env, capture_output=True, text=True)
    # Warm-up is for deployment scripts: a serving process that never calls it does not pay its import.
    assert proc.stdout.splitlines()[0] == "False", proc.stdout + proc.stderr
    assert proc.returncode == 2 and "--workers: invalid int value: 'two'" in proc.stderr, proc.stderr


def test_without_a_gpu_and_the_interpreter_warmup_says_so(monkeypatch, capsys):
    monkeypatch.setattr(launch, "INTERPRET", False)
    with pytest.raises(RuntimeError, match="there is none"):
        generated.warmup("h200")
    assert warmup_cli.main(["--hw", "h200"]) == 2
    assert "there is none" in capsys.readouterr().err


def test_model_dims_are_the_model_specs():
    assert dispatch.MODEL_DIMS["qwen36"]["num_experts"] == dispatch.QWEN36_NUM_EXPERTS
    assert dispatch.MODEL_DIMS["llama31_8b"]["hidden_size"] == dispatch.LLAMA31_8B_HIDDEN_SIZE
    assert tuple(dispatch.MODEL_DIMS) == tuple(dispatch.MODELS)


def _constexpr_globals(path) -> list[str]:
    """Module-level names ``path`` binds to a Triton constexpr (``X = tl.constexpr(...)``, or
    annotated ``X: tl.constexpr = ...``)."""
    def is_constexpr(node) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "constexpr" or (
            isinstance(node, ast.Name) and node.id == "constexpr"
        )

    found = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and is_constexpr(node.value.func):
            found += [f"{path.name}: {ast.unparse(t)}" for t in node.targets]
        elif isinstance(node, ast.AnnAssign) and is_constexpr(node.annotation):
            found.append(f"{path.name}: {ast.unparse(node.target)}")
    return found


def test_no_kernel_module_defines_a_constexpr_global(tmp_path):
    """Triton 3.6 adds a kernel's transitive constexpr globals to its cache key only where the
    callee that reads one had its own key taken first: the key of a kernel then depends on which
    kernels the process compiled before it.  A constexpr global in fp8's rounding made the fresh
    process after warm-up compile the FP8 MoE up kernels again (tests/test_moe_fp8_gpu.py, on the
    H200).  The runtime and generated/ choose such things in Python (a function bound by name)
    or pass them as constexpr arguments."""
    paths = sorted([*(REPO / "policy_runtime").rglob("*.py"), *(REPO / "generated").glob("*.py")])
    assert len(paths) > 20
    assert [name for path in paths for name in _constexpr_globals(path)] == []
    # The check sees the forms it guards against.
    probe = tmp_path / "probe.py"
    probe.write_text("import triton.language as tl\nX = tl.constexpr(True)\nY: tl.constexpr = 3\nZ = 4\n")
    assert _constexpr_globals(probe) == ["probe.py: X", "probe.py: Y"]

