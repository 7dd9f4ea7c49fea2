"""The benchmarks' CPU smoke modes: every phase of each script in bench/ runs on tiny shapes in
Triton's interpreter, so a change that breaks a benchmark fails here and not first on the GPU.  The
numbers printed are meaningless on a CPU; what is checked is that every phase ran and that every
correctness check inside the benchmarks passed.  Each script runs as its own __main__ in this
process (a fresh process would first spend seconds importing torch and Triton), isolated so that
it leaves nothing behind; the processes a benchmark starts by design (first calls, warm-up phases)
are still fresh processes."""

import contextlib
import io
import json
import os
import re
import runpy
import subprocess
import sys
import warnings

import pytest
import torch

from conftest import REPO

PEERS = REPO.parent / "shared" / "peers" / "vllm_triton.py"  # bench/peers.py's default
# Where this process runs Triton's interpreter (no GPU: conftest.py), a benchmark's smoke run runs
# here, without the torch and Triton imports of a fresh process; elsewhere in a child process.
IN_PROCESS = os.environ.get("TRITON_INTERPRET") == "1" and not torch.cuda.is_available()


@pytest.fixture
def bench(tmp_path, monkeypatch):
    """run(script, *args, code=0) -> its stdout: bench/<script> --cpu-smoke --hw h200 with $OUT =
    tmp_path, asserting its exit status."""

    def run(script: str, *args: str, code: int = 0) -> str:
        argv = [str(REPO / "bench" / script), "--cpu-smoke", "--hw", "h200", *args]
        if not IN_PROCESS:
            env = dict(os.environ, TRITON_INTERPRET="1", OUT=str(tmp_path))
            proc = subprocess.run(
                [sys.executable, *argv], capture_output=True, text=True, cwd=REPO, env=env, timeout=600
            )
            assert proc.returncode == code, proc.stdout[-3000:] + proc.stderr[-3000:]
            return proc.stdout
        monkeypatch.chdir(REPO)
        monkeypatch.setenv("OUT", str(tmp_path))
        with isolated(argv) as (got, out, err):
            runpy.run_path(argv[0], run_name="__main__")
        assert got[0] == code, out.getvalue()[-3000:] + err.getvalue()[-3000:]
        return out.getvalue()

    return run


_OWN_MODULES = ("generated", "policy_runtime")


@contextlib.contextmanager
def isolated(argv):
    """Run a benchmark's __main__ here as in a fresh process, and leave nothing of it behind:
    sys.argv, sys.path, os.environ, warnings filters, torch's threads, default dtype, grad mode and
    random state, and TorchDynamo's config and compiled code (membound.py's torch.compile) are
    restored; the bench's own modules (smoke, bench.*, the vLLM peer) forgotten; any global of
    generated.* and policy_runtime.* that it rebinds put back (decode_plans.py replaces
    ops.decode_plan, moe_fp8_accuracy.py the fp8 quantizer); the call caches and direct launches
    cleared before (a fresh process has none) and after.  Yields ([exit status], stdout, stderr)."""
    from policy_runtime import call_cache, direct

    saved_argv, saved_path, saved_env = sys.argv[:], sys.path[:], dict(os.environ)
    modules = set(sys.modules)
    owned = {name: dict(vars(m)) for name, m in list(sys.modules.items()) if name.split(".")[0] in _OWN_MODULES}
    threads, interop = torch.get_num_threads(), torch.get_num_interop_threads()
    dtype, grad, rng = torch.get_default_dtype(), torch.is_grad_enabled(), torch.random.get_rng_state()
    dynamo = sys.modules.get("torch._dynamo")
    dynamo_config = dynamo.config.get_config_copy() if dynamo is not None else None
    got, out, err = [0], io.StringIO(), io.StringIO()
    call_cache.clear_all()
    direct.clear()
    sys.argv = argv
    sys.path.insert(0, str(REPO / "bench"))  # as Python does for a script: its folder first
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                yield got, out, err
            except SystemExit as e:
                if isinstance(e.code, str):
                    print(e.code, file=sys.stderr)
                got[0] = 1 if isinstance(e.code, str) else (e.code or 0)
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        os.environ.clear()
        os.environ.update(saved_env)
        for name in set(sys.modules) - modules:
            if name in ("smoke", "bench", "vllm_triton_peer") or name.startswith("bench."):
                del sys.modules[name]
        for name, before in owned.items():
            now = vars(sys.modules[name]) if name in sys.modules else {}
            for key, value in before.items():
                if now.get(key, value) is not value:
                    now[key] = value
        call_cache.clear_all()
        direct.clear()
        if "torch._dynamo" in sys.modules:
            reset_dynamo(sys.modules["torch._dynamo"], dynamo_config)
        torch.set_num_threads(threads)
        if torch.get_num_interop_threads() != interop:  # (settable once per process: only if changed)
            torch.set_num_interop_threads(interop)
        torch.set_default_dtype(dtype)
        torch.set_grad_enabled(grad)
        torch.random.set_rng_state(rng)


def reset_dynamo(dynamo, before):
    """TorchDynamo's compiled code dropped and its config as it was (``before``), or at its
    defaults where the benchmark imported it first."""
    dynamo.reset()
    config = dynamo.config
    now = config.get_config_copy()
    if before is None:
        before = {k: config._config[k].default for k in now if not config._is_default(k)}
    config.load_config({k: v for k, v in before.items() if now.get(k) != v})


def test_matmul_bench_smoke(bench, tmp_path):
    # --repeats 0: no first-call children here; test_matmul_bench_first_call_only runs them (the
    # same first_call_latency, both methods in both Triton states) and test_first_call_repeats repeats.
    out = bench("matmul.py", "--repeats", "0")
    # One table row per smoke shape, each with its bucket and an error against float64.
    for shape in ("(33, 70, 48)", "(1, 40, 64)", "(8, 96, 32)"):
        row = next(line for line in out.splitlines() if line.startswith(f"| {shape} |"))
        err = float(row.rsplit("|", 2)[-2])
        assert err < 1e-3, row
    assert "geomean vs torch.matmul" in out
    assert re.search(r"eager loop us/call at \(16, 11008, 2048\): torch.matmul [\d.]+, matmul [\d.]+", out), out
    assert "first call" not in out
    result = json.loads((tmp_path / "matmul.json").read_text())
    assert [tuple(r["shape"]) for r in result["shapes"]] == [(33, 70, 48), (1, 40, 64), (8, 96, 32)]
    assert result["first_call"] == result["first_call_summary"] == []
    assert set(result["decode_eager_loop_us"]) == {"torch.matmul", "matmul", "matmul_triton", "torch.matmul (again)"}


def test_matmul_bench_first_call_only(bench, tmp_path):
    """--first-call-only: each method in each Triton state in its own fresh process (four children;
    bench/warmup.py's smoke runs the cold ones again).  Repeats are test_first_call_repeats'."""
    out = bench("matmul.py", "--first-call-only", "--repeats", "1")
    assert "| shape (M, N, K) |" not in out  # no throughput table: only the first calls
    for state in ("cold", "Triton already initialised"):
        assert re.search(rf"first call 33x70x48 \({state}\): generated [\d.]+ s, autotune [\d.]+ s", out), out
    result = json.loads((tmp_path / "matmul_first_call.json").read_text())
    assert [(r["repeat"], r["triton_initialised"]) for r in result["first_call"]] == [(0, False), (0, True)]
    for row in result["first_call"]:
        for method in ("generated", "autotune"):
            assert row[method]["first_s"] > 0 and row[method]["again_new_m_s"] > 0, row
    for entry in result["first_call_summary"]:
        assert len(entry["ratios"]) == 1 and entry["min"] <= entry["median"] <= entry["max"]


def test_first_call_repeats(monkeypatch, capsys):
    """bench/matmul.py's repeats, in this process: each repeat measures both methods in both Triton
    states, the methods' order alternating between repeats, and the summary spans the repeats.  The
    fresh processes that measure (first_call_process) are test_matmul_bench_first_call_only's."""
    import importlib.util

    monkeypatch.setattr(sys, "argv", ["matmul.py", "--cpu-smoke", "--hw", "h200", "--repeats", "2"])
    spec = importlib.util.spec_from_file_location("bench_matmul_under_test", REPO / "bench" / "matmul.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    calls = []

    def measured(hw, method, shape, again_m, warm):
        calls.append((method, warm))
        # generated / autotune: 0.5 in the first repeat, 0.25 in the second
        return {"first_s": 1.0 if method == "generated" else 2.0 + 2.0 * (len(calls) > 4), "again_new_m_s": 1e-3}

    monkeypatch.setattr(bench, "first_call_process", measured)
    rows = bench.first_call_latency("h200")
    assert calls == [
        ("generated", False), ("autotune", False), ("generated", True), ("autotune", True),
        ("autotune", False), ("generated", False), ("autotune", True), ("generated", True),
    ]  # fmt: skip
    assert [(r["repeat"], r["triton_initialised"]) for r in rows] == [(0, False), (0, True), (1, False), (1, True)]
    out = capsys.readouterr().out
    for state in ("cold", "Triton already initialised"):
        for rep in (1, 2):
            assert re.search(rf"first call 33x70x48 \({state}, repeat {rep}\): generated 1.00 s", out), out
    summary = bench.first_call_summary(rows)
    assert [(e["triton_initialised"], e["ratios"]) for e in summary] == [(False, [0.5, 0.25]), (True, [0.5, 0.25])]
    assert all((e["min"], e["median"], e["max"]) == (0.25, 0.375, 0.5) for e in summary)


def test_membound_bench_smoke(bench, tmp_path):
    out = bench("membound.py", "--smoke-compile")
    assert "correctness: 13/13 OK" in out  # the correctness phase's own sizes
    result = json.loads((tmp_path / "membound.json").read_text())
    assert result["errors"] == [] and result["skipped"] == []
    cases = result["cases"]
    # ... and every case again at the size it is timed at, before its timing.
    timed = [c["check"] for c in result["correctness"] if c["check"].endswith(" (timed size)")]
    assert sorted(timed) == sorted(f"{name} (timed size)" for name in cases)
    assert all(c["ok"] for c in result["correctness"])
    assert f"correctness: {13 + len(cases)}/{13 + len(cases)} OK" in out
    # Every case was timed; the large ones against a same-size copy and torch.compile, RoPE's also
    # against the copy of the same access pattern.
    assert all("ours_us" in e for e in cases.values()), sorted(k for k, e in cases.items() if "ours_us" not in e)
    large = {k: e for k, e in cases.items() if not e["decode"]}
    assert large and all("copy_same_tbps" in e and "ours_vs_compile" in e for e in large.values())
    rope = [e for k, e in large.items() if k.startswith("rope")]
    assert rope and all("pattern_copy_tbps" in e for e in rope)


def test_attention_bench_smoke(bench, tmp_path):
    """Every phase of bench/attention.py ran on its smoke shapes, each case checked before it was
    timed: prefill (causal and not, both head dims, equal and ragged batches) against SDPA, decode
    against SDPA and a copy, V1 against V2, the first call of new lengths, decode over an fp8 cache,
    and the windowed cases."""
    out = bench("attention.py")
    result = json.loads((tmp_path / "attention.json").read_text())
    assert result["errors"] == [] and result["skipped"] == []
    checks = result["correctness"]
    assert checks and all(c["ok"] for c in checks)
    assert f"correctness: {len(checks)}/{len(checks)} OK" in out
    prefill = result["prefill"]
    assert {(r["causal"], r["head_dim"], r["ragged"]) for r in prefill} == {
        (c, d, r) for c in (True, False) for d in (128, 256) for r in (False, True)
    }
    assert all(r["ours_tflops"] > 0 and r["ratio"] > 0 for r in prefill)
    peer_checks = [
        c
        for c in checks
        if c["check"].endswith(("(flex)", "(cudnn)", "(flex against ours)"))
        or re.search(r"\(vllm (fp8 )?\d+ splits\)$", c["check"])
    ]
    fp8 = result["fp8_decode"]  # two checks a case: the fp8 cache's and the bf16 cache's
    own = ("prefill", "decode", "v1_vs_v2", "window_prefill", "window_decode")
    assert sum(len(result[phase]) for phase in own) + 2 * len(fp8) == len(checks) - len(peer_checks)
    # The FP8-cache decode: both head dims, timed beside the bf16 cache, within e4m3's error of it.
    assert {(r["head_dim"], r["ragged"]) for r in fp8} == {(d, g) for d in (128, 256) for g in (False, True)}
    assert all(r["frac_copy"] > 0 and r["bf16_over_fp8"] > 0 and r["rel_err_vs_bf16_cache"] < 0.08 for r in fp8)
    if PEERS.is_file():
        assert [(r["head_dim"], r["batch"], r["ragged"]) for r in fp8 if "vllm_us" in r] == [(128, 2, False)]
    # Issue 36's windows: prefill (one with Gemma-2's soft-cap) against FlexAttention with the same
    # mask, decode as a fraction of a copy of the window's bytes.
    windowed = result["window_prefill"]
    assert {(r["head_dim"], r["softcap"]) for r in windowed} == {(128, 0.0), (256, 50.0)}
    assert all(r["ours_tflops"] > 0 and r["ours_vs_flex"] > 0 for r in windowed)
    assert {(r["head_dim"], r["softcap"]) for r in result["window_decode"]} == {(128, 0.0), (256, 50.0)}
    for r in result["window_decode"]:  # the bytes of the window (fp16 K and V), not of the context
        assert r["frac_copy"] > 0 and r["kv_bytes"] == 2 * r["batch"] * r["window"] * r["heads"][1] * r["head_dim"] * 2
    # The peers' columns at the smoke run's shortest prefill length: FlexAttention (cuDNN needs a
    # GPU: said so, not timed).
    first = [r for r in prefill if r["seq"] == 24]
    assert first and all(r["flex_tflops"] > 0 and r["ours_vs_flex"] > 0 for r in first)
    assert "needs a GPU" in result["peers"]["cudnn"] and not any("cudnn_ms" in r for r in prefill)
    decode = result["decode"]
    assert {r["path"].split()[0] for r in decode} == {"V1", "V2"}  # both paths at the smoke lengths
    assert all(0 < r["frac_copy"] for r in decode)
    assert all(r["ratio_vs_sdpa"] > 0 for r in decode if not r["ragged"])
    assert any(r["ragged"] for r in decode)
    vllm = [r for r in decode if "vllm_us" in r]
    if PEERS.is_file():  # the vLLM decode peer beside ours where the peer file is there
        assert {(r["batch"], r["context"], r["ragged"]) for r in vllm} == {(2, 100, True)}
        assert all(r["ratio_vs_vllm"] > 0 for r in vllm)
        # Issue 33's peer: the better of the vLLM kernel's split counts (the smoke run's 2 and 4).
        for r in vllm + [r for r in fp8 if "vllm_us" in r]:
            assert set(r["vllm_splits_us"]) == {"2", "4"} and r["vllm_us"] == min(r["vllm_splits_us"].values())
            assert r["vllm_splits_us"][str(r["vllm_splits"])] == r["vllm_us"]
    else:
        assert not vllm and "not found" in result["peers"]["vllm_decode"]
    assert all(r["v1_us"] > 0 and r["v2_us"] > 0 for r in result["v1_vs_v2"])
    assert len(result["first_call"]["prefill_ms"]) == len(result["first_call"]["decode_ms"]) == 2


def test_moe_bench_smoke(bench, tmp_path):
    """bench/moe.py on its smoke shapes: the qwen36 stand-in's token counts ran each bucket of the
    target (h200), the wide decode bucket at the e128 stand-in's one token, each method checked
    against the fp32 reference before it was timed, the cuBLAS comparison at the prefill sizes,
    the decode step (eager here) at one token of the qwen36 stand-in."""
    from generated import moe as M

    out = bench("moe.py")
    result = json.loads((tmp_path / "moe.json").read_text())
    assert result["errors"] == [] and result["skipped"] == []
    cases = result["cases"]
    assert sorted({(c["shape"], c["T"]) for c in cases}) == [("e128", 1)] + [("qwen36", t) for t in (1, 2, 5, 65, 513)]
    assert {c["bucket"] for c in cases} == {"decode_one", "decode_one_wide", "decode", "small", "medium", "prefill"}
    assert {c["shape"] for c in cases if c["bucket"] == "decode_one_wide"} == {"e128"}
    for c in cases:
        checked = set(c["errors_vs_ref"])
        assert {"ours", "grouped"} <= checked and all(e < 2e-2 for e in c["errors_vs_ref"].values()), c
        assert c["ours_us"] > 0 and c["grouped_us"] > 0 and 0 < c["ours_weight_frac_copy"]
        assert ("cublas_expert_tflops" in c) == ("cublas_expert" in checked) == (c["T"] >= 16)
        # The alignment timed alone where the bucket aligns rows (its grouped kernels).
        aligned = M.VARIANTS[c["kernels"]].kind == "grouped"
        assert ("align_us" in c) == aligned and (not aligned or 0 < c["align_us"]), c
        stepped = (c["shape"], c["T"]) == ("qwen36", 1)  # (every T <= 16 on a GPU)
        assert ("ours_step_layer_us" in c) == stepped and "step_error" not in c, c
        if stepped:
            assert c["step_layers"] == 2 and c["step_weight_bytes"] > c["weight_bytes"] > 0
            assert c["ours_step_layer_us"] > 0 and c["ours_step_weight_frac_copy"] > 0
    assert "6 cases, 0 errors, 0 skipped" in out
    assert sum("align_us" in c for c in cases) >= 2  # (small, medium and prefill align rows)
    peer = {(c["shape"], c["T"]) for c in cases if "vllm_us" in c}
    if PEERS.is_file():  # vLLM's fused MoE beside ours (the smoke run: two cases), checked first
        assert peer == {("qwen36", 1), ("qwen36", 5)}
        assert all(c["errors_vs_ref"]["vllm"] < 2e-2 and c["ours_vs_vllm"] > 0 for c in cases if "vllm_us" in c)
    else:
        assert not peer and "not found" in result["meta"]["vllm_peer"]
    assert "| shape | T | bucket |" in out


def test_warmup_bench_smoke(bench, tmp_path):
    """bench/warmup.py's phases in the interpreter, each in its fresh process: the warm-up, the calls
    of other shapes in every bucket and plan (their launch keys all planned by the warm-up, nothing
    compiled), the startup warm-up, and bench/matmul.py's first-call children for the comparison."""
    # One dtype: the script's wiring is the same for each, and the interpreter's bf16 is wrong anyway
    # (tests/test_warmup*.py plan both).
    out = bench("warmup.py", "--dtypes", "float16")
    result = json.loads((tmp_path / "warmup.json").read_text())
    assert result["errors"] == []
    (warm,) = result["warmup"]
    assert warm["report"]["kernels"] > 0 and warm["report"]["failed"] == 0 and warm["report"]["interpreter"]
    for phase in ("first_calls", "startup"):
        (run,) = result[phase]
        assert run["compilations"]["compiled"] == 0
        assert run["bucket_calls"] and all(c["keys_warmed"] for c in run["bucket_calls"])
        assert run["first_calls"][0]["first_s"] > 0
    assert result["startup"][0]["startup_kernels"] == warm["report"]["kernels"]
    (row,) = result["summary"]
    assert row["autotune_s"] > 0 and row["no_warmup_s"] > 0 and "after_warmup_vs_autotune" in row
    assert "zero compilations after warm-up: yes" in out


def test_round_order_puts_every_method_in_every_place():
    sys.path.insert(0, str(REPO))
    from bench.timing import round_order

    for n in (2, 3, 5):
        names = [f"m{i}" for i in range(n)]
        places = {(name, p): 0 for name in names for p in range(n)}
        for r in range(2 * n):
            order = round_order(names, r)
            assert sorted(order) == names
            for p, name in enumerate(order):
                places[name, p] += 1
        assert set(places.values()) == {2}, places


def test_scaled_mm_bench_smoke(bench, tmp_path):
    out = bench("scaled_mm.py")
    for shape in ("(40, 256, 256)", "(1, 128, 384)"):
        row = next(line for line in out.splitlines() if line.startswith(f"| {shape} |"))
        assert float(row.rsplit("max err", 1)[1].strip(" |")) < 1e-2, row
    assert "geomean vs torch._scaled_mm (all shapes): tensor" in out and "ERROR" not in out
    result = json.loads((tmp_path / "scaled_mm.json").read_text())
    assert result["errors"] == [] and len(result["rows"]) == 2
    for row in result["rows"]:
        assert set(row["ms"]) == {
            "ours tensor",
            "_scaled_mm tensor",
            "ours rowwise",
            "_scaled_mm rowwise",
            "ours block",
            "bf16 matmul",
        }


def test_scaled_mm_block_variants_smoke(bench):
    """Every block-scaling variant the H200 sweep times (bench/scaled_mm_block_variants.py) gives
    the fp32 result of the dequantized inputs in the interpreter (the script asserts 1e-5)."""
    out = bench("scaled_mm_block_variants.py")
    rows = [line for line in out.splitlines() if ": rel err " in line]
    assert len(rows) == 12 and all(float(r.rsplit(" ", 1)[1]) < 1e-5 for r in rows), out


def test_scaled_mm_tiles_smoke(bench):
    """bench/scaled_mm_tiles.py runs every record with each scaling it is timed with in the
    interpreter, each within 1e-2 of the fp64 reference (the script fails otherwise)."""
    out = bench("scaled_mm_tiles.py")
    rows = [line for line in out.splitlines() if " err " in line]
    assert len(rows) == 11 + 11 + 7 and "FAILED" not in out, out


@pytest.mark.parametrize("script", ["scaled_mm_block_variants.py", "decode_plans.py", "prefill_tma.py"])
def test_a_reader_that_closes_early_ends_the_run_quietly(script):
    """`bench/<script> | head -1`: the run ends with the shell's SIGPIPE status (141) and no
    traceback, as coreutils do (policy_runtime/report.py's quiet_on_closed_pipe around its main)."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "bench" / script), "--cpu-smoke", "--hw", "h200"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO, env=env,
    )  # fmt: skip
    first = proc.stdout.readline()
    proc.stdout.close()  # the reader goes away after one line, as head -1 does
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 141 and first, (first, err[-3000:])
    assert "Traceback" not in err and "BrokenPipeError" not in err, err[-3000:]


@pytest.mark.parametrize("records, count", [("prefill", 3), ("tma", 5)])
def test_moe_fp8_tiles_smoke(bench, records, count):
    """bench/moe_fp8_tiles.py runs each record of a set with both scalings in the interpreter, each
    agreeing with the policy's result (the script fails otherwise): the prefill tiles, and the tma
    set's weights read through descriptors.  The wide and down sets go through the same path; they
    are left out here for the suite's time."""
    out = bench("moe_fp8_tiles.py", "--set", records)
    rows = [line for line in out.splitlines() if "rel diff vs policy" in line]
    assert len(rows) == 2 * count and "FAILED" not in out, out


def test_moe_fp8_bench_smoke(bench, tmp_path):
    """bench/moe_fp8.py on its smoke shape: the simt decode bucket (T = 1, with the vLLM peer where
    its file is) and a grouped one (T = 17), every method checked before it was timed."""
    out = bench("moe_fp8.py")
    result = json.loads((tmp_path / "moe_fp8.json").read_text())
    assert result["errors"] == [] and "ERROR" not in out and "2 cases, 0 errors" in out
    rows = {r["T"]: r for r in result["rows"]}
    assert sorted(rows) == [1, 17] and rows[1]["bucket"] == "decode_one" and rows[17]["bucket"] == "small"
    for r in rows.values():
        assert {"fp8 block", "fp8 tensor", "bf16"} <= set(r["us"]) and r["fp8_block_vs_bf16"] > 0
        assert all(e < 8e-2 for e in r["errors"].values()) and r["errors"]["bf16"] < 2e-2, r
    assert rows[1]["fp8_block_bw_frac_copy"] > 0 and "fp8_block_bw_frac_copy" not in rows[17]
    if PEERS.is_file():
        assert "vllm block" in rows[1]["us"] and rows[1]["fp8_block_vs_vllm"] > 0


def test_attention_sweep_smoke(bench, tmp_path):
    """bench/attention_sweep.py on its smoke cases (a windowed prefill, an fp8 decode): every
    config checked against its reference and timed, the spec's config marked, a best per case."""
    bench("attention_sweep.py", "--only", "d=128 window|d=64 fp8", "--json", str(tmp_path / "s.json"))
    result = json.loads((tmp_path / "s.json").read_text())
    cases = result["prefill"] + result["decode"]
    assert [c["name"] for c in cases] == ["prefill d=128 window", "decode d=64 fp8"]
    for case in cases:
        assert case["configs"] and all(c["ok"] and c["rel_err"] < 2e-2 for c in case["configs"]), case
        assert "best" in case
    fp8 = result["decode"][0]["configs"]
    # The fp8 tiles with both conversions, the spec's own tile (fp16 conversion) marked once.
    assert {c["fp8_via_f16"] for c in fp8} == {True, False}
    assert sum(c["spec"] for c in fp8) == 1
    assert result["errors"] == [] and result["skipped"] == []


def test_decode_plans_and_moe_fp8_accuracy_smoke(bench, tmp_path):
    """bench/decode_plans.py: the policy's plan and each forced one checked against float32 (the
    fp8 case reaches V2 in several partition sizes); bench/moe_fp8_accuracy.py: per bucket, the
    output and the up GEMM's intermediate against float64, the interpreter's accumulation exact."""
    import re

    out = bench("decode_plans.py", "--stages", "2")
    rows = [line for line in out.splitlines() if " err " in line]
    assert rows and "WRONG" not in out
    assert all(float(re.search(r" err (\S+)", r).group(1)) < 1e-2 for r in rows)
    # A 300-token window of a 700-token fp8 cache: V1, and V2 in two 256-token partitions, each
    # with the h200 policy's head_dim-128 fp8 kernel (5 stages) and again with 2 stages forced.
    assert rows[0].startswith("fp8") and "window=300" in rows[0] and "policy" in rows[0]
    assert {re.search(r"(V1|V2 \d+ x \d+)", r).group(1) for r in rows} == {"V1", "V2 2 x 256"}
    stages = [re.search(r" stages (\d+) ", r).group(1) for r in rows]
    assert stages == ["5"] * (len(rows) // 2) + ["2"] * (len(rows) // 2), stages
    # Ragged lengths (each sequence its own float32 reference): V1, V2 for every sequence, and
    # V2 only past a V1 limit (the policy's plan at this size, 12 programs).
    out = bench("decode_plans.py", "--set", "ragged")
    rows = [line for line in out.splitlines() if " err " in line]
    assert rows and "WRONG" not in out and all("ragged" in r for r in rows)
    assert all(float(re.search(r" err (\S+)", r).group(1)) < 1e-2 for r in rows)
    splits = {re.search(r"(V1|V2 \d+ x \d+( over \d+)?) ", r).group(1) for r in rows}
    assert {"V1", "V2 3 x 256", "V2 6 x 128 over 512"} <= splits, splits
    # The vLLM comparison's cases: the policy's plan alone, under its depth and 4 stages forced.
    out = bench("decode_plans.py", "--set", "peers", "--stages", "4")
    rows = [line for line in out.splitlines() if " err " in line]
    assert len(rows) == 4 and "WRONG" not in out and all(" policy " in r for r in rows)
    from generated.dispatch import dispatch_kernel_config

    policy = str(dispatch_kernel_config("decode_d64_16bit", "h200").num_stages)
    assert policy != "4" and [re.search(r" stages (\d+) ", r).group(1) for r in rows] == [policy, "4"] * 2
    assert [r.split()[5] for r in rows] == ["equal", "equal", "ragged", "ragged"]
    out = bench("moe_fp8_accuracy.py")
    rows = [line for line in out.splitlines() if line.startswith("T=")]
    assert [r.split()[1] for r in rows] == ["40", "40"]
    assert all(float(re.search(r"out err (\S+)", r).group(1)) < 1e-2 for r in rows)
    differs = [float(m) for m in re.findall(r"differs from that rounding in (\S+)%", out)]
    assert len(differs) == 1 and all(d < 1.0 for d in differs)


def test_prefill_tma_smoke(bench, tmp_path):
    """bench/prefill_tma.py: each case's kernel with pointer loads and with TMA descriptors, both
    checked against SDPA (ragged, full and windowed batches); h200's record asks for TMA there."""
    bench("prefill_tma.py", "--json", str(tmp_path / "p.json"))
    result = json.loads((tmp_path / "p.json").read_text())
    assert len(result["cases"]) == 3
    for case in result["cases"]:
        assert case["policy_tma"] and case["public_err"] < 1e-2
        names = sorted(case["methods"])
        assert names == [f"{case['policy_kernel']} pointers", f"{case['policy_kernel']} tma"]
        assert all(m["err"] < 1e-2 for m in case["methods"].values()), case


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a Hopper-class GPU")
def test_decode_pdl_refuses_a_machine_without_pdl():
    """bench/decode_pdl.py times programmatic dependent launches, which only NVIDIA GPUs of compute
    capability 9.0 and later have: elsewhere it says so and exits 2, without a traceback."""
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "decode_pdl.py")], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 2, proc
    assert "needs an NVIDIA GPU of compute capability 9.0" in proc.stderr and "Traceback" not in proc.stderr


def _resolved(tmp_path, name, records):
    path = tmp_path / name
    path.write_text(json.dumps({"configs": {"c": {"variants": {"v": {"models": {"m": records}}}}}}))
    return str(path)


def test_compare_resolved_reports_each_difference_and_refuses_bad_input(tmp_path):
    """bench/compare_resolved.py: NEW / GONE / DIFF / NAME lines and exit 1 where two trees differ,
    0 where they agree; an unreadable input exits 2 naming the file and the problem, no traceback;
    `| head -1` ends it with 141 and no traceback."""
    script = [sys.executable, str(REPO / "bench" / "compare_resolved.py")]
    a = _resolved(tmp_path, "a.json", {"t1": {"x": 1, "instantiation": "nvidia_abc"}, "t2": {"x": 2}})
    b = _resolved(tmp_path, "b.json", {"t1": {"x": 3, "instantiation": "nvidia_abd"}, "t3": {"x": 2}})
    proc = subprocess.run([*script, a, b], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.splitlines() == [
        "DIFF ('c', 'v', 'm', 't1') {'x': (1, 3)}",
        "NAME ('c', 'v', 'm', 't1') nvidia_abc nvidia_abd",
        "GONE ('c', 'v', 'm', 't2')",
        "NEW ('c', 'v', 'm', 't3')",
        "1 records compared, 3 differ",
    ]
    same = subprocess.run([*script, a, a], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert same.returncode == 0 and same.stdout.splitlines() == ["2 records compared, 0 differ"], same.stderr
    (tmp_path / "cut.json").write_text('{"configs":')
    (tmp_path / "other.json").write_text('{"x": 1}')
    for bad, said in [
        (str(tmp_path / "missing.json"), "missing.json: No such file or directory"),
        (str(tmp_path / "cut.json"), "cut.json:1: not JSON"),
        (str(tmp_path / "other.json"), "other.json: not `codegen show --json` output (no 'configs')"),
    ]:
        proc = subprocess.run([*script, a, bad], capture_output=True, text=True, cwd=REPO, timeout=60)
        assert proc.returncode == 2 and said in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    # Enough lines to fill the pipe, read one of them.
    many = {f"t{i}": {"x": i} for i in range(20000)}
    big_a, big_b = _resolved(tmp_path, "big_a.json", many), _resolved(tmp_path, "big_b.json", {})
    proc = subprocess.Popen([*script, big_a, big_b], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
    first = proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141 and first.startswith(b"GONE"), (first, err[-2000:])
    assert "Traceback" not in err, err[-2000:]
