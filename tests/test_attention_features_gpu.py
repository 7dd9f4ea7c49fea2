"""The attention features in bf16 on a GPU (Triton's interpreter cannot do bf16 arithmetic, so the
CPU runs tests/test_attention_features.py in fp16 and fp32 only): each feature and all of them at
once, prefill and paged decode (V1, V2 partitions and the merge), head dims 64 to 256 and two
between the tiles, against the float64 references of tests/test_attention_features.py on the
device's own kernels.  Skipped without CUDA."""

from __future__ import annotations

import math

import pytest
import torch

from generated import attention as at
from kernel_cases import GPU, seeded  # noqa: F401  (autouse fixture: a fixed seed per test)
from test_attention_features import (
    ATT,
    FEATURES,
    H,
    decode_ref,
    i32,
    materialize,
    offsets,
    paged,
    prefill_ref,
    rnd,
    small_config,
    small_launch,
)

pytestmark = pytest.mark.skipif(not GPU, reason="bf16 attention kernels need a GPU (the interpreter cannot run bf16)")

BF16 = torch.bfloat16
# bf16 inputs (8 bits of mantissa) and bf16 output; fp32 scores and softmax state: the output's
# rounding (2**-8 of its largest value) and the inputs' rounding in the two products.
TOL = 2e-2


def close(got, ref):
    err = (got.double().cpu() - ref).abs().max().item()
    assert err <= TOL * max(1.0, ref.abs().max().item()), err


def fref(feat):
    return {"window": feat.get("window_size", (-1, -1)), "softcap": feat.get("softcap", 0.0),
            "alibi": feat.get("alibi_slopes"), "sinks": feat.get("sinks")}  # fmt: skip


def prefill(D, lq, lk, causal=True, Hq=H, Hkv=2, **feat):
    q, k, v = rnd(sum(lq), Hq, D, dtype=BF16), rnd(sum(lk), Hkv, D, dtype=BF16), rnd(sum(lk), Hkv, D, dtype=BF16)
    got = at.prefill_attention(q, k, v, i32(offsets(lq)), i32(offsets(lk)), max(lq), max(lk), causal=causal, **feat)
    close(got, prefill_ref(q, k, v, lq, lk, causal=causal, scale=1 / math.sqrt(D), **fref(feat)))


def decode(D, lens, Hq=H, Hkv=2, config=None, launch=None, **feat):
    kc, vc, table = paged(lens, 16, Hkv, D, BF16)
    query = rnd(len(lens), Hq, D, dtype=BF16)
    got = ATT.decode(query, kc, vc, table, i32(lens), config=config, launch=launch, **feat)
    close(got, decode_ref(query, kc, vc, table, lens, scale=1 / math.sqrt(D), **fref(feat)))


@pytest.mark.parametrize("name", sorted(FEATURES))
def test_prefill_each_feature_in_bf16(name):
    # Several key tiles (up to 128 rows on the H200), queries shorter than keys, an empty sequence.
    prefill(128, [5, 0, 300], [9, 0, 420], **materialize(FEATURES[name]))


@pytest.mark.parametrize("D", [64, 80, 128, 192, 256])
def test_prefill_every_feature_at_once_in_bf16(D):
    feat = materialize(dict(causal=True, window_size=(70, -1), softcap=30.0, alibi=True, sinks=True))
    prefill(D, [33, 257], [40, 257], **feat)


def test_prefill_gemma2_local_layer_in_bf16():
    # Gemma-2's local layer, scaled down: a window, soft-cap 50, 16 query and 8 KV heads at 256.
    prefill(256, [700], [700], Hq=16, Hkv=8, window_size=(255, 0), softcap=50.0)


@pytest.mark.parametrize("D", [64, 96, 128, 256])
def test_decode_every_feature_at_once_in_bf16(D):
    feat = materialize(dict(window_size=(200, 0), softcap=30.0, alibi=True, sinks=True))
    decode(D, [5, 333, 0, 1000], **feat)


def test_decode_window_and_features_on_v2_partitions_in_bf16():
    # Partitions of 32 tokens past 48 and the PyTorch path past 100, with every feature.
    feat = materialize(dict(window_size=(90, 0), softcap=30.0, alibi=True, sinks=True))
    decode(64, [300, 70, 40], config=small_config(), launch=small_launch(64, BF16), **feat)
