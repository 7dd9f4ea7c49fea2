"""Each model's features as dispatch records (issue 36 items 1 and 6): AttentionFeatures and
MoERouting from the model specs, the records a call with features runs, the warm-up they drive,
and the build's refusal of a tile that cannot hold a model's features."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch

from generated import attention as at
from generated import dispatch as D
from kernel_cases import DEVICE, seeded  # noqa: F401  (autouse fixture: a fixed seed per test)
from policy_runtime.attention import ops as rt
from test_attention_features import attend_ref, i32, rnd, specializations

ATT = at._ATTENTION
OFF = dict(sliding_window=0, softcap=0.0, alibi=False, sinks=False)
# What specs/models/*.toml say (their [CFG] and [CARD] sources), as data.
ATTENTION = {
    "gemma2_9b": dict(OFF, sliding_window=4096, softcap=50.0),
    "gpt_oss_20b": dict(OFF, sliding_window=128, sinks=True),
    "deepseek_v3": OFF,
    "llama31_8b": OFF,
    "qwen36": OFF,
}
PLAIN = dict(scoring="softmax", score_bias=False, num_expert_group=1, topk_group=1, routed_scaling_factor=1.0)
ROUTING = {
    "deepseek_v3": dict(
        scoring="sigmoid", score_bias=True, num_expert_group=8, topk_group=4, routed_scaling_factor=2.5,
        activation="silu", grouped=True,
    ),
    "gpt_oss_20b": dict(PLAIN, activation="swigluoai", grouped=False),
    "qwen36": dict(PLAIN, activation="silu", grouped=False),
}  # fmt: skip


@pytest.mark.parametrize("model", sorted(ATTENTION))
def test_each_models_attention_record_shows_exactly_its_features(model):
    for target in D.HARDWARE:
        record = D.dispatch_kernel_config("attention_features", target, model)
        assert dataclasses.asdict(record) == ATTENTION[model], (model, target)
        assert at._FEATURES[model][target] is record


@pytest.mark.parametrize("model", sorted(ATTENTION))
def test_each_models_routing_record_shows_its_router_and_activation(model):
    if model not in ROUTING:  # a dense model has no routing record
        with pytest.raises(KeyError, match=model):
            D.dispatch_kernel_config("moe_routing", "h200", model)
        return
    for target in D.HARDWARE:
        assert dataclasses.asdict(D.dispatch_kernel_config("moe_routing", target, model)) == ROUTING[model]


@pytest.mark.parametrize(
    "head_dim, uses, model",
    [
        (256, (), "qwen36"),  # no features: the tile's own model
        (256, ("window", "softcap"), "gemma2_9b"),
        (256, ("softcap",), "gemma2_9b"),  # gemma2's global layers
        (200, ("window",), "gemma2_9b"),  # another head_dim of the 256 tile
        (256, ("alibi",), "qwen36"),  # no model of the tile uses ALiBi: the tile's records
        (256, ("window", "alibi"), "qwen36"),
        (64, ("window", "sinks"), "gpt_oss_20b"),
        (128, ("window",), "llama31_8b"),
    ],
)
def test_a_call_with_features_runs_the_records_of_a_model_that_uses_them(head_dim, uses, model):
    sel = at.select(torch.bfloat16, head_dim, hw="h200", uses=uses)
    assert sel.model == model
    assert sel.config is D.dispatch_kernel_config("attention_bf16", "h200", model)
    assert sel.features is D.dispatch_kernel_config("attention_features", "h200", model)


def test_a_call_whose_features_no_model_uses_still_runs(monkeypatch):
    """ALiBi and a soft-cap at head_dim 48: no model's record has them (the 64 tile's model uses
    a window and sinks); the call runs the tile's records, its specialization compiled there."""
    launched = []
    monkeypatch.setattr(rt._launch, "launch_kernel", _recording(rt._launch.launch_kernel, launched))
    n, H, Hkv, D_ = 19, 4, 2, 48
    q, k, v = rnd(n, H, D_), rnd(n, Hkv, D_), rnd(n, Hkv, D_)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625], device=DEVICE)
    out = at.prefill_attention(q, k, v, i32([0, n]), i32([0, n]), n, n, softcap=5.0, alibi_slopes=slopes, hw="h200")
    ref = attend_ref(q, k, v, causal=True, scale=1 / math.sqrt(D_), softcap=5.0, alibi=slopes)
    assert torch.allclose(out.double().cpu(), ref, atol=2e-4, rtol=2e-4)
    assert launched == [at.select(torch.float32, 64, hw="h200").prefill.kernel]


def _recording(launch, into):
    def run(kernel, grid, *args, **kwargs):
        into.append(kernel)
        return launch(kernel, grid, *args, **kwargs)

    return run


def test_warm_up_compiles_the_specializations_the_records_enable(monkeypatch):
    """gemma2's record (window and soft-cap) warms its global layers' soft-capped kernels and its
    local layers' windowed ones; llama's (none) the plain ones only; a record that says ALiBi
    (llama's, replaced here) warms ALiBi's: warm-up reads the record, not a list of its own."""
    from policy_runtime.warmup import engine as W

    def plan():
        models = ["gemma2_9b", "llama31_8b"]
        return specializations(W.plan(["generated.attention"], "h200", dtypes=["bfloat16"], models=models))

    # Prefill over a 16-bit paged cache too; h200 has e4m3fn: each feature set also over an fp8 KV cache.
    ops = ("prefill", "prefill paged", "decode", "prefill fp8 KV", "decode fp8 KV")
    both = lambda *sets: {(op, s) for op in ops for s in sets}  # noqa: E731
    seen = plan()
    assert seen == {
        "gemma2_9b": both((False, True, False, False), (True, True, False, False)),
        "llama31_8b": both((False, False, False, False)),
    }
    llama = dict(ATT.features["llama31_8b"])
    llama["h200"] = dataclasses.replace(llama["h200"], alibi=True)
    monkeypatch.setitem(ATT.features, "llama31_8b", llama)
    assert plan()["llama31_8b"] == both((False, False, True, False))


def _tight(tmp_path, regs, model_toml):
    """A copy of the specs with a100's registers at ``regs`` and one more model.  The a100: its
    tiles follow the base rule (h200 has a policy of its own), and without wgmma its Q tile counts."""
    import shutil

    from conftest import REPO

    root = tmp_path / "proj"
    shutil.copytree(REPO / "specs", root / "specs")
    a100 = root / "specs/hardware/a100.toml"
    text = a100.read_text()
    a100.write_text(re.sub(r"max_registers_per_thread = 255", f"max_registers_per_thread = {regs}", text))
    (root / "specs/models/probe.toml").write_text(model_toml)
    # The probe alone (at 80 registers the other models' 256-wide tiles would not fit either),
    # and only the attention family.
    for other in ("deepseek_v3", "gemma2_9b", "gpt_oss_20b", "llama31_8b", "qwen36"):
        (root / f"specs/models/{other}.toml").unlink()
    project = root / "specs/project.toml"
    project.write_text(project.read_text().replace('default_model = "qwen36"', 'default_model = "probe"'))
    for name in ("moe", "scaled_mm", "matmul", "cache", "transform"):
        (root / f"specs/kernels/{name}.toml").unlink()
        (root / f"specs/modules/{name}.toml").unlink()
    return root


PROBE = """#:schema ../../schemas/model.schema.json
display_name = "probe"
head_dim = {head_dim}
num_heads = 8
num_kv_heads = 2
hidden_size = 1024
intermediate_size = 4096
max_seq_len = 4096
{features}
"""


@pytest.mark.parametrize(
    "head_dim, features, regs, refused",
    [
        # 16 rows at 4 warps, tile width 256: 32 + 51 + 3 row vectors = 86 registers; a window's
        # two bounds, ALiBi's and the sinks' rows make 90.
        (256, "", 88, None),
        (256, "sliding_window = 512\nalibi = true\nattention_sinks = true", 88, 90),
        # head_dim 136 runs the 256-wide tile: 86, where 128-wide needs 32 + 27 + 3 = 62.
        (128, "", 80, None),
        (136, "", 80, 86),
    ],
)
def test_a_tile_that_cannot_hold_a_models_features_is_refused_at_build(tmp_path, head_dim, features, regs, refused):
    pytest.importorskip("pydantic", reason="the build needs pydantic (the compiler's dependency)")
    from conftest import run_cli

    root = _tight(tmp_path, regs, PROBE.format(head_dim=head_dim, features=features))
    result = run_cli("--root", str(root), "check")
    if refused is None:
        assert result.code == 1, result.err  # valid specs: generated/ is only missing
        return
    assert result.code == 2 and "Traceback" not in result.err, result.err
    line = next(line for line in result.err.splitlines() if "prefill_regs" in line)
    assert "specs/kernels/attention.toml:" in line and "model probe" in line and "a100" in line, line
    assert "attention.base.triton_block_n" in line, line
    assert f"prefill_regs = {refused} > hw.max_registers_per_thread = {regs}" in line, line
