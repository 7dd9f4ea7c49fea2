"""Several models per spec tree: configs resolved per model, a default model and target."""

import os
import subprocess
import sys

import pytest

from conftest import REPO, hw_toml, make_tree, run_cli
from generated import dispatch


def test_attention_differs_per_model_where_the_smem_rule_says_so():
    llama = dispatch.dispatch_kernel_config("attention", "h200", model="llama31_8b")
    qwen = dispatch.dispatch_kernel_config("attention", "h200", model="qwen36")
    # 2 stages of K and V tiles: 128 rows x 128 x 2 B x 2 x 2 = 131,072 B fit 227 KB; at head_dim 256
    # 128 rows need 262,144 B, so 64.
    assert (llama.triton_block_n, qwen.triton_block_n) == (128, 64)
    assert dispatch.dispatch_kernel_config("attention", "h200") == qwen  # the default model
    assert dispatch.DEFAULT_MODEL == "qwen36"
    assert set(dispatch.MODELS) == {"deepseek_v3", "gemma2_9b", "gpt_oss_20b", "llama31_8b", "qwen36"}
    # DeepSeek-V3's head_dim 192 runs 256-wide tiles (padded): its smem rule counts 256 columns, so
    # 64 rows as at 256 (128 rows of 192 columns, 196,608 B, would fit and overflow the real tile).
    assert dispatch.dispatch_kernel_config("attention", "h200", model="deepseek_v3").triton_block_n == 64


def test_a_config_for_some_models_refuses_the_others():
    with pytest.raises(KeyError, match="'moe' is not resolved for model 'llama31_8b'; it serves \\['deepseek_v3', 'gpt_oss_20b', 'qwen36'\\]"):
        dispatch.dispatch_kernel_config("moe", "h200", model="llama31_8b")
    with pytest.raises(KeyError, match="Unknown model: 'gpt2'"):
        dispatch.dispatch_kernel_config("cache", "h200", model="gpt2")
    # A config that reads no model serves every model alike.
    assert dispatch.dispatch_kernel_config("cache", "h200", model="llama31_8b") == dispatch.dispatch_kernel_config(
        "cache", "h200"
    )


DENSE = """display_name = "dense"
head_dim = 128
num_heads = 32
num_kv_heads = 8
hidden_size = 4096
intermediate_size = 14336
max_seq_len = 8192
"""
MOE = DENSE.replace('"dense"', '"moe"') + "num_experts = 64\ntop_k = 4\nmax_num_seqs = 8\n"
EXPERTS = """
[experts]
record = "ExpertsConfig"
doc = "reads the expert count"

[experts.fields]
block = { type = "int", doc = "rows" }

[experts.base]
block = { expr = "16 if model.num_experts > 32 else 64" }
"""


def test_a_model_without_the_fields_a_config_reads_is_not_served_and_named_once(tmp_path):
    root = make_tree(tmp_path, {"h": hw_toml("nvidia", 90)}, {"experts": EXPERTS}, models={"dense": DENSE, "big": MOE})
    (root / "specs" / "project.toml").write_text('default_model = "big"\n')
    result = run_cli("--root", str(root), "build")
    assert result.code == 0, result
    assert [l for l in result.out.splitlines() if "dense" in l] == ["experts: not served for dense: no num_experts"]
    assert "ExpertsConfig" in (root / "generated/dispatch.py").read_text()
    # Naming it in the config's models list is one error naming model, file and field.
    (root / "specs/kernels/experts.toml").write_text(
        EXPERTS.replace('doc = "reads the expert count"', 'doc = "x"\nmodels = ["big", "dense"]')
    )
    result = run_cli("--root", str(root), "build")
    assert result.code == 2 and "Traceback" not in result.err, result
    (line,) = [l for l in result.err.splitlines() if "dense" in l]
    assert "experts.models[1]: model dense (specs/models/dense.toml) has no num_experts" in line


@pytest.mark.parametrize(
    "text, fragment",
    [
        (DENSE + "num_experts = 8\n", "specs/models/dense.toml: <top level>: num_experts and top_k go together"),
        (DENSE.replace("num_heads = 32", "num_heads = 30"), "num_heads (30) must be a multiple of num_kv_heads (8)"),
        (DENSE.replace("head_dim = 128\n", ""), "specs/models/dense.toml: head_dim: required key is missing"),
        (DENSE + "layers = 32\n", "specs/models/dense.toml:8: layers: unknown key"),
    ],
    ids=["experts without top_k", "heads", "missing core field", "unknown key"],
)
def test_bad_model_specs_are_spec_errors(tmp_path, text, fragment):
    root = make_tree(
        tmp_path,
        {"h": hw_toml("nvidia", 90)},
        {"experts": EXPERTS.replace("model.num_experts > 32", "1 > 0")},
        models={"dense": text},
    )
    result = run_cli("--root", str(root), "build")
    assert result.code == 2 and "Traceback" not in result.err, result
    assert fragment in result.err


def test_a_tree_with_several_models_names_its_default(tmp_path):
    root = make_tree(tmp_path, {"h": hw_toml("nvidia", 90)}, {"experts": EXPERTS}, models={"dense": DENSE, "big": MOE})
    result = run_cli("--root", str(root), "build")
    assert result.code == 2
    assert "the tree has 2 models (big, dense): name the default one" in result.err


def test_show_lists_models_and_the_default_target():
    out = run_cli("show").out
    assert "  qwen36 (default): Qwen3.6-35B-A3B (specs/models/qwen36.toml); configs: attention, attention_features, moe, moe_routing" in out
    assert "  llama31_8b: Llama-3.1-8B (specs/models/llama31_8b.toml); configs: attention, attention_features" in out
    assert "default target: bi_v100" in out


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    full = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=full, capture_output=True, text=True)


def test_no_hw_means_the_forced_target_then_the_device_then_the_default():
    code = (
        "import policy_runtime.detect as d; d._device_available = lambda: False\n"
        "import generated.dispatch as D\n"
        "print(D.dispatch_kernel_config('attention').triton_block_n, D.target_name())"
    )
    plain = _python(code, KERNEL_POLICY_TARGET="")
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.split() == ["32", "bi_v100"]  # the default target, with no device
    forced = _python(code, KERNEL_POLICY_TARGET="h200")
    assert forced.returncode == 0, forced.stderr
    assert forced.stdout.split() == ["64", "h200"]
    bad = _python(code, KERNEL_POLICY_TARGET="h300")
    assert bad.returncode != 0 and "KERNEL_POLICY_TARGET='h300' names no hardware spec" in bad.stderr


def test_without_a_default_target_and_a_device_the_error_stays_clear(tmp_path):
    root = make_tree(
        tmp_path / "t", {"h": hw_toml("nvidia", 90)}, {"experts": EXPERTS.replace("model.num_experts > 32", "1 > 0")}
    )
    assert run_cli("--root", str(root), "build").code == 0
    code = (
        "import sys; sys.path.insert(0, '.')\n"
        "import policy_runtime.detect as d; d._device_available = lambda: False\n"
        "from generated.dispatch import dispatch_kernel_config\n"
        "dispatch_kernel_config('experts')"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO), KERNEL_POLICY_TARGET="")
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True)
    assert proc.returncode != 0
    assert "no GPU device is available; pass hw='<spec name>'" in proc.stderr
