"""codegen explain, show --json and the list of targets no measured policy serves."""

import json

import pytest


from conftest import run_cli


def test_explain_a_pick_lists_each_candidate_with_its_condition():
    # h100: the base rule's pick (h200 has tiles of its own, measured).
    result = run_cli("explain", "attention", "triton_block_n", "--hw", "h100")
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert lines[0].startswith(
        "attention_fp16.triton_block_n on h100 (nvidia 90, specs/hardware/h100.toml), model qwen36"
    )
    assert lines[1].startswith("  served by nvidia>=80 (specs/kernels/attention.toml:")
    assert lines[2] == "  chains from base"
    assert (
        "triton_block_n = 64: the first of [128, 64, 32, 16] for which 'kv_smem_bytes <= "
        "hw.max_shared_memory_per_block_optin and prefill_regs <= hw.max_registers_per_thread'" in lines[3]
    )
    assert lines[4] == "    128: fails: kv_smem_bytes = 262,144 > hw.max_shared_memory_per_block_optin = 232,448"
    assert lines[5] == "    64: holds  <- chosen"
    assert (
        "  check 'kv tiles fit shared memory': passes (kv_smem_bytes = 131,072 <= hw.max_shared_memory_per_block_optin = 232,448)"
        in lines
    )
    # Another model, another answer: head_dim 128 lets 128 rows fit.
    llama = run_cli("explain", "attention", "triton_block_n", "--hw", "h100", "--model", "llama31_8b").out
    assert "    128: holds  <- chosen" in llama


def test_explain_names_untuned_policies_rules_and_buckets():
    out = run_cli("explain", "matmul_16bit", "num_programs", "--hw", "b200").out
    assert "served by nvidia>=100" in out and "tuned = false: not measured on this part" in out
    assert "chains from nvidia>=90 -> nvidia>=80 -> base" in out
    assert "  bucket decode (m<=16):" in out
    assert "num_programs = 148: rule 'hw.sm_count if kernel == 'tma_persistent' or split_k > 1 else 0'" in out


def test_explain_refuses_unknown_names_with_exit_2():
    for argv, fragment in [
        (("explain", "attn", "x", "--hw", "h200"), "unknown config or variant 'attn'"),
        (("explain", "attention", "nope", "--hw", "h200"), "AttentionConfig has no field 'nope'"),
        (("explain", "attention", "triton_block_n", "--hw", "h300"), "unknown hardware 'h300'"),
        (
            ("explain", "moe", "block_size_m", "--hw", "h200", "--model", "llama31_8b"),
            "resolved for models deepseek_v3, gpt_oss_20b, qwen36, not 'llama31_8b'",
        ),
        (("explain", "atention", "x", "--hw", "h200"), "did you mean 'attention'?"),
        (("explain", "moe", "block_sise_m", "--hw", "h200"), "did you mean 'block_size_m'?"),
        (("explain", "moe", "block_size_m", "--hw", "H200"), "unknown hardware 'H200' (--hw); known: a10, a100, b200"),
        # a config no model changes still refuses a model that does not exist (as dispatch_kernel_config does)
        (("explain", "rms_norm", "tile_bytes", "--hw", "h200", "--model", "qwen"), "unknown model 'qwen' (--model)"),
    ]:
        result = run_cli(*argv)
        assert result.code == 2 and fragment in result.err, (argv, result)
        assert result.out == "" and "Traceback" not in result.err


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (("show", "--sources", "--hw", "h2000"), "unknown hardware 'h2000' (--hw)"),
        (("show", "--sources", "moe"), "--sources lists hardware figures; it takes no kernel name"),
        (("show", "--json", "--hw", "h2000"), "did you mean 'h200'?"),
        (("show", "--json", "mo"), "unknown kernel 'mo'"),
    ],
)
def test_show_checks_every_name_its_options_give(argv, fragment):
    result = run_cli(*argv)
    assert result.code == 2 and fragment in result.err and result.out == "", result


def test_show_json_honours_the_kernel_and_hw():
    data = json.loads(run_cli("show", "--json", "moe_launch_16bit", "--hw", "h200").out)
    assert list(data["hardware"]) == ["h200"]
    assert {c: list(v["variants"]) for c, v in data["configs"].items()} == {"moe_launch": ["moe_launch_16bit"]}
    assert list(data["configs"]["moe_launch"]["variants"]["moe_launch_16bit"]["models"][""]) == ["h200"]
    whole = json.loads(run_cli("show", "--json").out)
    part = whole["configs"]["moe_launch"]["variants"]["moe_launch_16bit"]["models"][""]["h200"]
    assert data["configs"]["moe_launch"]["variants"]["moe_launch_16bit"]["models"][""]["h200"] == part


def test_build_and_show_name_the_targets_no_measured_policy_serves(project):
    out = run_cli("--root", str(project), "build").out
    line = next(l for l in out.splitlines() if l.startswith("matmul: "))
    assert "bi_v100 (iluvatar>=100, tuned = false)" in line and "b200 (nvidia>=100, tuned = false)" in line
    assert "mi300x (base)" in line and "h200" not in line
    assert "attention: not measured on mi300x (base)" in run_cli("--root", str(project), "show").out


def test_show_json_is_the_resolved_tree():
    result = run_cli("show", "--json")
    assert result.code == 0
    data = json.loads(result.out)
    h200 = data["configs"]["attention"]["variants"]["attention_fp16"]["models"]["qwen36"]["h200"]
    assert h200["record"]["triton_block_n"] == 64 and h200["policy"] == "nvidia>=90[h200]"
    assert h200["record"]["triton_block_m"] == 128
    buckets = data["configs"]["matmul"]["variants"]["matmul_16bit"]["models"][""]["h200"]["buckets"]
    assert [b["name"] for b in buckets][:2] == ["decode_wide", "decode"]
    assert data["default_target"] == "bi_v100" and data["hardware"]["mi300x"]["arch"] == 942
