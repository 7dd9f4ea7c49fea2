"""bench/host_cost.py's CPU paths: every public entry point's launches are recorded and replayed
as bare launches (with launches as no-ops: the wrapper alone), and with real launches in Triton's
interpreter the replay runs the very kernel the entry point ran (same output)."""

import json
import os
import subprocess
import sys

from conftest import REPO

ENTRIES = {
    "matmul_triton", "matmul", "rms_norm", "rms_norm (residual)", "silu_and_mul", "rotary_embedding",
    "reshape_and_cache", "copy_blocks", "prefill_attention", "decode_attention", "topk_softmax", "fused_moe",
    "moe_align_block_size", "fused_moe_fp8 (block)", "fused_moe_fp8 (tensor)", "grouped_topk",
    "scaled_mm (tensor)", "scaled_mm (block)", "gelu_tanh_and_mul", "swigluoai_and_mul", "mul_and_silu",
    "swap_blocks",
}  # fmt: skip
# Names of generated modules' __all__ that are no entry point a model calls per step (policy
# tables, selectors, warm-up).
NOT_CALLS = {
    "buckets",
    "select",
    "warmup",
    "VARIANTS",
    "VARIANTS_FP8",
    "UNSERVED",
    "UNSERVED_FP8",
    "register_native_decode",
}


def run_host_cost(tmp_path, *args):
    env = dict(os.environ, TRITON_INTERPRET="1", OUT=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "host_cost.py"), "--cpu-smoke", "--hw", "h200", *args],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout, json.loads((tmp_path / "host_cost.json").read_text())


def test_every_entry_point_is_measured_against_its_bare_launches(tmp_path):
    out, res = run_host_cost(tmp_path, "--noop-launch", "--iters", "20", "--rounds", "1")
    rows = {r["entry"]: r for r in res["entries"]}
    assert set(rows) == ENTRIES and res["errors"] == []
    for name, r in rows.items():
        if name in ("matmul", "swap_blocks"):  # h200's vendor path for a tiny matmul; torch copies
            assert r["launches"] == 0 and "no Triton launch" in r["note"]
            continue
        assert r["launches"] >= 1 and len(r["kernels"]) == r["launches"], r
        assert r["eager_us"] > 0 and r["bare_us"] > 0 and "within_limit" in r
    assert rows["fused_moe"]["launches"] >= 2  # up and down GEMMs
    for scaling in ("block", "tensor"):  # two quantizations, up and down GEMMs (h200: one token is simt)
        assert rows[f"fused_moe_fp8 ({scaling})"]["launches"] >= 4
    m = res["matmul_eager"]
    assert m["matmul_triton_us"] > 0 and m["torch.matmul_us"] > 0 and m["bare_us"] > 0
    assert "| entry point | launches |" in out


def test_the_rows_cover_every_public_entry_point():
    """A new public function of a generated kernel module gets a row (or this test names it)."""
    import importlib

    names = set()
    for module in ("matmul", "transform", "cache", "attention", "moe", "scaled_mm"):
        mod = importlib.import_module(f"generated.{module}")
        names |= {n for n in mod.__all__ if n not in NOT_CALLS and not n.isupper() and callable(getattr(mod, n))}
    measured = {e.split(" (")[0] for e in ENTRIES}
    assert names - measured == set(), f"entry points without a host-cost row: {sorted(names - measured)}"


def test_bare_replay_runs_the_same_kernel(tmp_path):
    """In the interpreter (real launches): the replayed launch of silu_and_mul rewrites its
    recorded output with the same values."""
    code = f"""
import sys, torch
sys.argv = ["host_cost.py", "--cpu-smoke", "--hw", "h200"]
sys.path.insert(0, {str(REPO)!r})
sys.path.insert(0, {str(REPO / "bench")!r})
import host_cost as hc
from generated import transform as TR
x = torch.randn(3, 64).half()
launches = hc.record(lambda: TR.silu_and_mul(x, hw="h200"))
assert len(launches) == 1
out = [a for a in launches[0][2] if isinstance(a, torch.Tensor) and a.shape == (3, 32)][0]
want = out.clone()
out.fill_(float("nan"))
hc.bare(launches)()
assert torch.equal(out, want), (out, want)
print("replayed ok")
"""
    env = dict(os.environ, TRITON_INTERPRET="1", OUT=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
    assert proc.returncode == 0 and "replayed ok" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]
