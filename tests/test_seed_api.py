"""generated.dispatch can replace the hand-written seed (muh_cc_dispatch.py, found by tests/seeds.py:
$CODEGEN_SEEDS_DIR, else ../shared/seeds/ beside the checkout): every public name of the seed, with
its signature and, for the default target and model, its values.

The seed is imported here only to compare; the project never imports it at run time.  Tests that
compare with it skip when it is absent; the facts about the seed that need no comparison (its
values, as data) run everywhere."""

import dataclasses
import importlib.util
import inspect
import subprocess
import sys

import pytest

from conftest import REPO
from seeds import seed_file

SEED = "muh_cc_dispatch.py"


@pytest.fixture(scope="module")
def seed():
    spec = importlib.util.spec_from_file_location("muh_cc_dispatch_seed", seed_file(SEED))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


@pytest.fixture
def D(monkeypatch):
    """generated.dispatch on a machine without a device (the seed's setting): no hw means the
    default target."""
    import generated.dispatch as D
    import policy_runtime.detect as detect

    monkeypatch.setattr(detect, "_device_available", lambda: False)
    monkeypatch.setattr(D._DETECTOR, "forced", None)
    return D


def _public(seed):
    imported = {"dataclass", "field", "Dict", "Optional", "Any", "math"}
    return sorted(n for n in vars(seed) if not n.startswith("_") and n not in imported)


def test_every_public_name_of_the_seed_exists(seed, D):
    missing = [n for n in _public(seed) if not hasattr(D, n)]
    assert not missing


def test_functions_take_the_seeds_parameters_in_order(seed, D):
    for name in _public(seed):
        theirs = getattr(seed, name)
        if not inspect.isfunction(theirs):
            continue
        ours = inspect.signature(getattr(D, name)).parameters
        seed_params = inspect.signature(theirs).parameters
        assert list(ours)[: len(seed_params)] == list(seed_params), name
        for p, q in zip(seed_params.values(), ours.values()):
            # A parameter with a default in the seed has one here (and is not required).
            assert (p.default is inspect.Parameter.empty) == (q.default is inspect.Parameter.empty), (name, p.name)
        assert all(q.default is not inspect.Parameter.empty for q in list(ours.values())[len(seed_params) :]), name


def _same(ours, theirs):
    return dataclasses.asdict(ours) == dataclasses.asdict(theirs) and type(ours).__name__ == type(theirs).__name__


def test_constants_are_the_default_targets_and_models(seed, D):
    for name in ("ATTENTION_FP16", "ATTENTION_BF16", "MOE_CONFIG", "TRANSFORM_CONFIG", "CACHE_CONFIG"):
        assert _same(getattr(D, name), getattr(seed, name)), name
    for name in _public(seed):
        if name.startswith("QWEN36_"):
            assert getattr(D, name) == getattr(seed, name), name
    for field in dataclasses.fields(seed.BI_V100):
        assert getattr(D.BI_V100, field.name) == getattr(seed.BI_V100, field.name), field.name
    assert D.BI_V100.bandwidth_per_sm_gbps == seed.BI_V100.bandwidth_per_sm_gbps
    assert D.BI_V100.bytes_in_flight == seed.BI_V100.bytes_in_flight


def test_dispatch_without_hw_and_with_the_seeds_records(seed, D):
    for name in seed._CONFIGS:
        theirs = seed.dispatch_kernel_config(name)
        assert _same(D.dispatch_kernel_config(name), theirs), name
        assert _same(D.dispatch_kernel_config(name, seed.BI_V100), theirs), name
        assert _same(D.dispatch_kernel_config(name, D.BI_V100), theirs), name
    with pytest.raises(KeyError, match="Unknown kernel"):
        D.dispatch_kernel_config("attn")


def test_selectors_look_up_the_model_whose_parameters_match(seed, D):
    args = dict(dtype_size=2, head_dim=256, max_seq_len=100000, num_kv_heads=4)
    assert _same(D.select_attention_config(seed.BI_V100, **args), seed.select_attention_config(seed.BI_V100, **args))
    assert _same(D.select_attention_config("bi_v100", 2, 256, 100000, 4), seed.ATTENTION_FP16)
    moe = dict(num_experts=256, top_k=8, hidden_size=3584, intermediate_size=18944)
    assert _same(D.select_moe_config(seed.BI_V100, **moe), seed.select_moe_config(seed.BI_V100, **moe))


def test_selectors_give_other_models_records_and_name_the_known_ones(D):
    # Another model's parameters give that model's record (no rule runs: the record was resolved at build).
    llama = D.select_attention_config("h200", dtype_size=2, head_dim=128, max_seq_len=131072, num_kv_heads=8)
    assert llama == D.dispatch_kernel_config("attention", "h200", model="llama31_8b")
    # Dimensions of no spec'd model are computed by the rules (tests/test_selectors.py covers the
    # grid): on the H200, 128 rows * 128 (the tile's width) * 2 B * 2 (K, V) * 3 stages = 196,608 B
    # fit its 227 KB.
    other = D.select_attention_config("h200", 2, 96, 4096, 2)
    assert (other.triton_block_n, other.triton_num_warps, other.triton_num_stages) == (128, 8, 3)
    assert other.pytorch_decode_threshold == 2**31 - 16  # no fallback: every length on the kernels


def test_helpers_default_their_limits_from_the_default_target(seed, D):
    assert D.check_smem(256, 4, 2) == seed.check_smem(256, 4, 2)
    assert D.check_smem(1024, 32, 2) == seed.check_smem(1024, 32, 2)
    assert D.grid_even_share(50000 // 16, tile_size=1024) == seed.grid_even_share(50000 // 16, tile_size=1024)
    assert D.grid_even_share(10**6, 64) == seed.grid_even_share(10**6, 64)


def test_helpers_give_the_seeds_values(D):
    # The seed's own results for these calls (muh_cc_dispatch.py on the BI-V100: 48 KB, 16 SMs), as data.
    assert D.check_smem(256, 4, 2) == {"tile_bytes": 2048, "fits": True, "utilization": 2048 / 49152, "max_items": 96}
    assert D.check_smem(1024, 32, 2) == {
        "tile_bytes": 65536,
        "fits": False,
        "utilization": 65536 / 49152,
        "max_items": 24,
    }
    assert D.grid_even_share(50000 // 16, tile_size=1024) == {
        "grid_size": 4,
        "total_tiles": 4,
        "avg_tiles_per_block": 1,
        "big_shares": 0,
        "tile_size": 1024,
    }
    assert D.grid_even_share(10**6, 64) == {
        "grid_size": 80,
        "total_tiles": 15625,
        "avg_tiles_per_block": 195,
        "big_shares": 25,
        "tile_size": 64,
    }


def test_records_construct_as_the_seeds_do(seed, D):
    assert D.HardwareCapability() == D.HARDWARE["bi_v100"]
    assert D.HardwareCapability().sm_count == seed.HardwareCapability().sm_count
    custom = D.HardwareCapability(vendor="iluvatar", arch_version=100, sm_count=16)
    assert custom == D.BI_V100
    assert _same(D.AttentionConfig(), seed.AttentionConfig())
    assert _same(D.TransformConfig(), seed.TransformConfig())
    assert _same(D.CacheConfig(), seed.CacheConfig())
    # Documented difference: the seed's MoEConfig class defaults block_size_m to 64, while its own
    # MOE_CONFIG (and so the default target's record, which the generated class defaults to) has 32.
    assert dataclasses.replace(D.MoEConfig(), block_size_m=64) == D.MoEConfig(**dataclasses.asdict(seed.MoEConfig()))
    assert D.MoEConfig() == D.MOE_CONFIG


def test_a_record_unlike_every_spec_warns_and_uses_its_arch(seed, D):
    odd = seed.HardwareCapability(sm_count=20)
    with pytest.warns(RuntimeWarning, match="matches no spec exactly; using 'bi_v100'.*sm_count 20 \\(spec: 16\\)"):
        assert D.dispatch_kernel_config("cache", odd) == D.CACHE_CONFIG
    with pytest.raises(KeyError, match="no hardware spec for vendor 'iluvatar' arch 200"):
        D.dispatch_kernel_config("cache", seed.HardwareCapability(arch_version=200))


def _main_output():
    env = {"KERNEL_POLICY_TARGET": "", "PATH": ""}
    return subprocess.run([sys.executable, "-m", "generated.dispatch"], cwd=REPO, capture_output=True, text=True, env=env)


def test_main_prints_the_default_targets_figures():
    ours = _main_output()
    assert ours.returncode == 0, ours.stderr
    # The seed's BI-V100 line, as data.
    assert "SMs: 16, SMEM: 48KB, BW: 900GB/s, BW/SM: 56.2GB/s" in ours.stdout


def test_main_prints_the_seeds_tables(seed):
    ours = _main_output()
    theirs = subprocess.run([sys.executable, seed.__file__], capture_output=True, text=True)
    assert ours.returncode == 0 and theirs.returncode == 0, ours.stderr + theirs.stderr

    def blocks(text):
        out, name = {}, None
        for line in text.splitlines():
            if line.startswith("[") and line.endswith("]"):
                name = line[1:-1]
                out[name] = []
            elif name and line.startswith("  "):
                out[name].append(line)
            else:
                name = None
        return out

    mine, seeds = blocks(ours.stdout), blocks(theirs.stdout)
    assert seeds and all(mine[n] == seeds[n] for n in seeds)
    grid = lambda t: t[t.index("GridEvenShare") :]
    assert grid(ours.stdout) == grid(theirs.stdout)
