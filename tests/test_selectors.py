"""The seed-style selectors compute for any dimensions: the spec's rules, compiled into
generated/dispatch.py, agree with the build's records for every named model and target, and on
the BI-V100 with the seed's select_attention_config / select_moe_config over a grid that crosses
every branch of the seed.  Pure Python: no kernel runs."""

import dataclasses
import importlib.util
import itertools
import sys

import pytest

from conftest import REPO
from seeds import seed_file


@pytest.fixture(scope="module")
def seed():
    path = seed_file("muh_cc_dispatch.py")
    spec = importlib.util.spec_from_file_location("muh_cc_dispatch_seed_grid", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


@pytest.fixture
def D(monkeypatch):
    import generated.dispatch as D
    import policy_runtime.detect as detect

    monkeypatch.setattr(detect, "_device_available", lambda: False)
    monkeypatch.setattr(D._DETECTOR, "forced", None)
    return D


DTYPE_SIZES = (1, 2, 4)
HEAD_DIMS = (32, 64, 80, 96, 128, 192, 256, 384, 512)
SEQ_LENS = (1, 2048, 8192, 8193, 32768, 32769, 131072, 1 << 20)
KV_HEADS = (1, 2, 4, 8, 32, 128)
EXPERTS = (1, 8, 16, 60, 64, 128, 160, 256, 512)
TOP_K = (1, 2, 4, 6, 8, 16)
# (hidden_size, intermediate_size) of real models: Qwen3.6 (seed), Mixtral-8x7B, DeepSeek-V3,
# Qwen3-30B-A3B, Llama-3.1-8B, a small one.
MOE_DIMS = ((3584, 18944), (4096, 14336), (7168, 2048), (2048, 768), (4096, 14336), (1024, 512))


def _plain(record):
    return dataclasses.asdict(record)


def test_computed_records_equal_the_built_tables_for_every_model_and_target(D):
    """The compiled rules against the build's evaluation: every config with a selector, variant,
    model and target, the function the chain picks called with the model's dimensions."""
    import inspect

    from codegen.models import feature_default

    cases = 0
    for config, chain in (("attention", D._SELECT_ATTENTION_CONFIG_CHAIN), ("moe", D._SELECT_MOE_CONFIG_CHAIN)):
        # The config's variants (attention_fp16, ...), not the other configs named alike
        # (attention_features, moe_routing), whose records the chain does not compute.
        records = {"attention": D.AttentionConfig, "moe": D.MoEConfig}[config]
        variants = [
            k for k in D.kernel_names() if (k == config or k.startswith(config + "_"))
            and isinstance(D.dispatch_kernel_config(k, "h200", "qwen36"), records)
        ]  # fmt: skip
        for variant in variants:
            for model, dims in D.MODEL_DIMS.items():
                if model not in D._CONFIGS[variant]:
                    continue
                for target, hw in D.HARDWARE.items():
                    built = D.dispatch_kernel_config(variant, target, model)
                    function = chain.by_target[target]
                    assert function is chain.function(hw.vendor, hw.arch_version, target)
                    args = {}
                    for arg in list(inspect.signature(function).parameters)[1:]:
                        # A feature the model does not use (absent from MODEL_DIMS) is read at its
                        # "off" value (no window, False).
                        name = arg[len("model_"):]
                        args[arg] = dims.get(name, feature_default(name)) if arg.startswith("model_") else 2
                    assert function(hw, **args) == built, (variant, model, target)
                    cases += 1
    # attention, attention_fp16, attention_bf16 x 5 models + moe x the 3 with experts (qwen36,
    # gpt_oss_20b, deepseek_v3), on 10 targets.
    assert cases == (3 * 5 + 3) * 10


def _pow2_ceil(n: int) -> int:
    return 1 << (n - 1).bit_length()


def test_attention_on_bi_v100_equals_the_seed_on_a_grid_over_every_branch(D, seed):
    smem = seed.BI_V100.max_shared_memory_per_block
    agree = narrower = raised = 0
    for ds, hd, sl, kv in itertools.product(DTYPE_SIZES, HEAD_DIMS, SEQ_LENS, KV_HEADS):
        want = seed.select_attention_config(seed.BI_V100, ds, hd, sl, kv)
        # The kernel's K/V tile is as wide as the power of two at least head_dim (the seed counts
        # head_dim itself: at 192 and 384 its tile would overflow the kernel's shared memory).
        width = _pow2_ceil(hd)

        def fits(block_n):
            # The 16-bit record also runs fp32 prefill, staging max(16, block_n // 2) rows of 4 bytes.
            fp32 = ds != 2 or max(16, block_n // 2) * width * 4 * 2 <= smem
            return block_n * width * ds * 2 <= smem and fp32

        for hw in (D.BI_V100, seed.BI_V100, "bi_v100"):
            if fits(want.triton_block_n):
                got = D.select_attention_config(hw, ds, hd, sl, kv)
                assert _plain(got) == dataclasses.asdict(want), (ds, hd, sl, kv)
                agree += 1
            elif fits(16):
                # The seed's tile does not fit the kernel's: the largest that does, all else the seed's.
                got = _plain(D.select_attention_config(hw, ds, hd, sl, kv))
                block = max(b for b in (64, 32, 16) if b * width * ds * 2 <= smem)
                assert block < want.triton_block_n and fits(block), (ds, hd)
                assert got == dataclasses.asdict(want) | {"triton_block_n": block, "triton_block_m": block}
                narrower += 1
            else:
                with pytest.raises(ValueError, match="fails check '(kv tiles|the fp32 prefill tile) fit"):
                    D.select_attention_config(hw, ds, hd, sl, kv)
                raised += 1
    assert agree + narrower + raised == 3 * len(DTYPE_SIZES) * len(HEAD_DIMS) * len(SEQ_LENS) * len(KV_HEADS)
    # Equal to the seed at every power-of-two head_dim that fits 48 KB; a narrower tile at 192 and
    # 384 (where the seed's overflows the kernel's); raised where even 16 rows overflow the
    # kernel's 512-wide tile: head_dim 384 and 512 at 2 bytes (the fp32 tile) and at 4 bytes.
    assert agree > 0 and narrower > 0
    assert raised == 4 * len(SEQ_LENS) * len(KV_HEADS) * 3


def test_moe_on_bi_v100_equals_the_seed_on_a_grid_over_every_branch(D, seed):
    n = 0
    blocks = set()
    for e, k, (h, i) in itertools.product(EXPERTS, TOP_K, MOE_DIMS):
        if k > e:
            continue  # no model routes to more experts than it has
        want = seed.select_moe_config(seed.BI_V100, e, k, h, i)
        for hw in (D.BI_V100, seed.BI_V100, "bi_v100"):
            assert _plain(D.select_moe_config(hw, e, k, h, i)) == dataclasses.asdict(want), (e, k, h, i)
            n += 1
        blocks.add(want.block_size_m)
    assert n > 500
    # The seed's one branch (64 rows from top_k >= 64) is never taken at top-k <= 16; a call
    # beyond the grid crosses it.
    want = seed.select_moe_config(seed.BI_V100, 512, 64, 4096, 14336)
    assert want.block_size_m == 64 == D.select_moe_config(D.BI_V100, 512, 64, 4096, 14336).block_size_m
    assert blocks == {32}


def test_every_target_serves_the_grid(D):
    """A record or a ValueError naming the check for every input on every target; counted."""
    served = failed = 0
    for target in D.HARDWARE:
        for ds, hd, sl, kv in itertools.product(DTYPE_SIZES, HEAD_DIMS, (1, 131072), (1, 8)):
            try:
                rec = D.select_attention_config(target, ds, hd, sl, kv)
            except ValueError as exc:
                text = str(exc)
                assert ("fails check" in text and "allows" in text) or ("no candidate" in text and " = " in text), text
                failed += 1
            else:
                assert isinstance(rec, D.AttentionConfig)
                served += 1
        for e, k, (h, i) in itertools.product(EXPERTS, TOP_K, MOE_DIMS[:2]):
            if k <= e:
                assert isinstance(D.select_moe_config(target, e, k, h, i), D.MoEConfig)
    assert served > failed > 0


def test_a_failed_check_says_which_check_and_its_numbers(D):
    with pytest.raises(ValueError) as exc:
        D.select_attention_config("bi_v100", 4, 512, 4096, 8)
    text = str(exc.value)
    assert "fails check 'kv tiles fit shared memory'" in text
    assert "65,536 B" in text and "49,152 B" in text and "kv_smem_bytes = 65536" in text
    # Which smaller dimension would pass: head_dim 256 (32 rows * 256 * 4 B * 2 = 65,536: no,
    # 16 rows: 32,768), or 1-byte elements (32 rows * 512 * 2 = 32,768; 2 bytes fails the fp32 tile).
    assert text.endswith("; head_dim = 256, or dtype_size = 1 would pass"), text
    # A pick no candidate satisfies: the last candidate's numbers, and the hint.
    with pytest.raises(ValueError) as exc:
        D.select_attention_config("a10", 4, 512, 4096, 8)
    text = str(exc.value)
    assert "no candidate for 'triton_block_n' in [128, 64, 32, 16]" in text and "kv_smem_bytes = 131072" in text
    assert "head_dim = 256" in text and "would pass" in text


def test_a_hand_built_record_is_computed_from_its_own_figures(D, seed):
    # A seed-style record of a part no spec names: Iluvatar arch 110 with twice the shared memory.
    big = seed.HardwareCapability(arch_version=110, max_shared_memory_per_block=98304, sm_count=24)
    rec = D.select_attention_config(big, 2, 256, 100000, 4)
    # 64 rows fit its 96 KB (64 * 256 * 2 * 2) but not a thread's registers at the policy's 4
    # warps (the fp32 accumulator alone is 64 * 256 / 128 = 128 a thread; ~278 in all): 32 rows.
    assert rec.triton_block_n == 32 and rec.triton_num_warps == 4
    assert D.select_attention_config(big, 2, 128, 100000, 4).triton_block_n == 64  # ~182 registers
    assert D.select_attention_config(seed.BI_V100, 2, 256, 100000, 4).triton_block_n == 32
    # The generated class, an NVIDIA arch no spec has (sm_75), through the base policy.
    t4 = D.HardwareCapability(vendor="nvidia", arch_version=75, max_shared_memory_per_block=49152,
                              max_shared_memory_per_block_optin=65536, async_copy=False, sm_count=40)
    rec = D.select_attention_config(t4, 2, 128, 4096, 8)
    # 128 rows * 128 * 2 B * 2 (K and V) * 1 stage = 65,536 B: fits its 64 KB opt-in exactly.
    assert rec.triton_num_stages == 1 and rec.triton_block_n == 128 and rec.use_native_v1 is False


MIXTRAL = """#:schema ../../schemas/model.schema.json
display_name = "Mixtral-8x7B"
head_dim = 128
num_heads = 32
num_kv_heads = 8
hidden_size = 4096
intermediate_size = 14336
max_seq_len = 32768
num_experts = 8
top_k = 2
"""


def _specs(tmp_path):
    import shutil

    shutil.copytree(REPO / "specs", tmp_path / "specs")
    return tmp_path


def test_a_new_moe_model_is_served_without_a_models_list(tmp_path):
    from codegen import pipeline

    root = _specs(tmp_path)
    (root / "specs/models/mixtral_8x7b.toml").write_text(MIXTRAL)
    res = pipeline.run(root, until="tree_to_resolution")
    moe = {vr.model: vr for vr in res.for_config("moe")}
    import tomllib

    models = {p.stem: tomllib.loads(p.read_text()) for p in (REPO / "specs/models").glob("*.toml")}
    with_experts = {name for name, spec in models.items() if "num_experts" in spec}
    assert "qwen36" in with_experts and "llama31_8b" not in with_experts
    assert set(moe) == with_experts | {"mixtral_8x7b"}
    # Its record on the BI-V100 is the seed's for its dimensions (max_num_seqs: the default 1).
    rec = dict(moe["mixtral_8x7b"].resolved["bi_v100"].record)
    assert (rec["block_size_m"], rec["block_size_n"], rec["block_size_k"], rec["group_size_m"]) == (32, 64, 32, 8)
    assert {vr.model for vr in res.for_config("attention")} == set(models) | {"mixtral_8x7b"}


def test_a_dense_model_is_named_once_in_the_summary_or_once_as_an_error(tmp_path):
    from conftest import run_cli

    root = _specs(tmp_path)
    shown = run_cli("--root", str(root), "show")
    assert shown.code == 0
    # One line per config with experts (moe, moe_routing) and dense model (llama31_8b, gemma2_9b),
    # none per target.
    assert shown.out.count("not served for") == 4
    for config in ("moe", "moe_routing"):
        for model in ("llama31_8b", "gemma2_9b"):
            assert f"{config}: not served for {model}: no num_experts, top_k\n" in shown.out
    moe = root / "specs/kernels/moe.toml"
    moe.write_text(moe.read_text().replace('[moe]\nrecord = "MoEConfig"\n', '[moe]\nrecord = "MoEConfig"\nmodels = ["qwen36", "llama31_8b"]\n'))
    bad = run_cli("--root", str(root), "check")
    assert bad.code == 2
    lines = [line for line in bad.err.splitlines() if "llama31_8b" in line]
    assert len(lines) == 1, bad.err
    assert "moe.models[1]" in lines[0] and "has no num_experts, top_k" in lines[0] and len(lines[0]) < 300


def test_a_hand_built_record_of_a_vendor_no_spec_has_takes_the_base_policy(D, seed):
    # Figures it lacks (opt-in shared memory aside: its block limit) are the record class's
    # defaults; the base policy serves: 64 rows * 128 * 2 B * 2 * 1 stage fit 48 KB (128 rows do not).
    other = seed.HardwareCapability(vendor="newco", arch_version=1)
    rec = D.select_attention_config(other, 2, 128, 4096, 8)
    assert (rec.triton_block_n, rec.triton_num_warps, rec.use_native_v1) == (64, 8, False)
    assert D.select_moe_config(other, 8, 2, 4096, 14336) == D.MoEConfig(
        block_size_m=16, block_size_n=32, block_size_k=64, group_size_m=1
    )  # the base policy's decode tiles: 1 sequence <= 8 experts
