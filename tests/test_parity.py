"""Parity with the hand-written seed (shared/seeds/muh_cc_dispatch.py) for bi_v100.

The expected values are the seed's, written here as data; the project never
imports the seed.
"""

import pytest

from generated import dispatch

SEED_CONFIGS = {
    "attention": (
        "AttentionConfig",
        dict(
            triton_block_m=32,
            triton_block_n=32,
            triton_num_warps=4,
            triton_num_stages=1,
            partition_size=512,
            v1_v2_threshold=8192,
            pytorch_decode_threshold=32768,
            pytorch_max_tile_blocks=1024,
            use_native_v1=True,
            use_native_v2=False,
        ),
    ),
    "moe": ("MoEConfig", dict(block_size_m=32, block_size_n=64, block_size_k=32, group_size_m=8)),
    "transform": ("TransformConfig", dict(bytes_in_flight=65536, max_smem_per_block=49152)),
    "cache": ("CacheConfig", dict(copy_block_size=256)),
}
SEED_CONFIGS["attention_fp16"] = SEED_CONFIGS["attention"]
SEED_CONFIGS["attention_bf16"] = SEED_CONFIGS["attention"]

SEED_HARDWARE = dict(
    vendor="iluvatar",
    arch_version=100,
    warp_size=32,
    max_threads_per_block=1024,
    max_shared_memory_per_block=49152,
    max_registers_per_thread=255,
    l2_cache_size_bytes=6 * 1024 * 1024,
    memory_bandwidth_gbps=900,
    sm_count=16,
    bandwidth_per_sm_gbps=56.25,
    bytes_in_flight=65536,
)


@pytest.mark.parametrize("kernel", sorted(SEED_CONFIGS))
@pytest.mark.parametrize("hw", ["bi_v100", "hardware-record"])
def test_bi_v100_configs_match_seed(kernel, hw):
    hw_arg = dispatch.HARDWARE["bi_v100"] if hw == "hardware-record" else hw
    record = dispatch.dispatch_kernel_config(kernel, hw_arg)
    class_name, fields = SEED_CONFIGS[kernel]
    assert type(record).__name__ == class_name
    # Same field names, in the seed's order, and the same values and types.
    assert list(record.__dataclass_fields__) == list(fields)
    for name, value in fields.items():
        got = getattr(record, name)
        assert got == value and type(got) is type(value), name


def test_records_are_frozen():
    record = dispatch.dispatch_kernel_config("moe", "bi_v100")
    with pytest.raises(Exception):
        record.block_size_m = 1  # type: ignore[misc]


def test_bi_v100_hardware_matches_seed():
    hw = dispatch.HARDWARE["bi_v100"]
    for name, value in SEED_HARDWARE.items():
        assert getattr(hw, name) == value, name
    assert hw.at_least("iluvatar", 100) and not hw.at_least("iluvatar", 101)
    assert not hw.at_least("nvidia", 80)  # arch numbers never compare across vendors


def test_unknown_kernel_lists_available():
    with pytest.raises(KeyError) as exc:
        dispatch.dispatch_kernel_config("attn", "bi_v100")
    message = str(exc.value)
    for name in ("attention", "attention_bf16", "attention_fp16", "moe", "transform", "cache"):
        assert repr(name) in message


def test_unknown_hardware():
    with pytest.raises(KeyError, match="bi_v200"):
        dispatch.dispatch_kernel_config("moe", "bi_v200")


@pytest.mark.parametrize(
    "args, expected",
    [
        ((256, 4, 2, 49152), dict(tile_bytes=2048, fits=True, utilization=0.041666666666666664, max_items=96)),
        ((1024, 32, 2, 49152), dict(tile_bytes=65536, fits=False, utilization=1.3333333333333333, max_items=24)),
        ((0, 4, 2, 49152), dict(tile_bytes=0, fits=True, utilization=0.0, max_items=0)),
        ((128, 1, 4, 0), dict(tile_bytes=512, fits=False, utilization=0, max_items=0)),
    ],
)
def test_check_smem_matches_seed(args, expected):
    assert dispatch.check_smem(*args) == expected


@pytest.mark.parametrize(
    "args, expected",
    [
        ((3125, 1024, 16), dict(grid_size=4, total_tiles=4, avg_tiles_per_block=1, big_shares=0, tile_size=1024)),
        (
            (1_000_000, 256, 16),
            dict(grid_size=80, total_tiles=3907, avg_tiles_per_block=48, big_shares=67, tile_size=256),
        ),
        ((1000, 3, 4, 2), dict(grid_size=8, total_tiles=334, avg_tiles_per_block=41, big_shares=6, tile_size=3)),
        ((1000, 10, 132, 1), dict(grid_size=100, total_tiles=100, avg_tiles_per_block=1, big_shares=0, tile_size=10)),
        ((0, 256, 16), dict(grid_size=0, total_tiles=0)),
        ((100, 0, 16), dict(grid_size=0, total_tiles=0)),
    ],
)
def test_grid_even_share_matches_seed(args, expected):
    assert dispatch.grid_even_share(*args) == expected
