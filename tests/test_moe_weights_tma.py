"""The grouped MoE GEMMs' expert weights through TMA descriptors (the records' ``weights_tma``).

A moe_launch or moe_fp8_launch record with ``weights_tma`` (h200's 16-bit ``prefill`` and FP8
``prefill_large`` buckets) has its grouped kernels read w1 and w2 tiles through a Triton
``TensorDescriptor`` over the rows of all experts wherever the weights' layout allows it (K
contiguous, 16-byte aligned base and rows, experts a whole number of rows apart, stride 0
included, as warm-up passes one expert for all); any other layout, and gpt-oss's interleaved w1,
take the pointer loads of the same kernel.  A descriptor's tile of an expert's last rows may read
the next expert's rows (or zeros past the last): those columns are never stored.  Both paths must
give the same bytes.  Runs in the interpreter (fp16, fp32, FP8 per tensor): it executes
descriptor loads; on a GPU, bf16 and block scales too.
"""

from __future__ import annotations

import pytest
import torch

from generated import dispatch
from generated import moe as M
from kernel_cases import DEVICE, GPU, routing, seeded  # noqa: F401  (autouse fixture: a fixed seed per test)
from policy_runtime import call_cache
from policy_runtime.moe import ops as rt
from test_moe_fp8 import quant_weights

FP8 = torch.float8_e4m3fn
DTYPES = [torch.float16] + ([torch.bfloat16] if GPU else [])


@pytest.fixture
def made(monkeypatch):
    """Every weights_arg answer of the calls (flag per call of it), and a switch that makes it
    refuse descriptors (the pointer path of the same kernels)."""
    seen: list[bool] = []
    state = {"off": False}
    real = rt.weights_arg

    def spy(w, block_n, block_k, tma):
        arg, flag = real(w, block_n, block_k, tma and not state["off"])
        seen.append(flag)
        return arg, flag

    monkeypatch.setattr(rt, "weights_arg", spy)  # both families' KernelPair.weight_args call it
    return seen, state


def both_paths(made, call):
    """(TMA result, pointer result, flags of the TMA call)."""
    seen, state = made
    call_cache.clear_all()
    tma = call()
    flags = list(seen)
    seen.clear()
    state["off"] = True
    call_cache.clear_all()
    ptr = call()
    state["off"] = False
    assert seen == [False, False]
    return tma, ptr, flags


def test_the_records_say_where_weights_go_through_tma():
    """h200's 16-bit prefill bucket and FP8 prefill_large ask for TMA weights, smaller buckets do
    not, and every record that asks is a grouped kernel on a part whose hardware spec has TMA (the
    configs' check refuses any other at build time)."""
    assert M.select(4096, 768, dtype=torch.bfloat16, hw="h200").variant.weights_tma
    assert M.select(4096, 768, dtype=FP8, hw="h200").variant.weights_tma
    assert not M.select(16, 768, dtype=torch.bfloat16, hw="h200").variant.weights_tma
    assert not M.select(2048, 768, dtype=FP8, hw="h200").variant.weights_tma  # 64-row prefill tiles
    assert not M.select(4096, 768, dtype=torch.float32, hw="h200").variant.weights_tma
    assert not M.select(4096, 768, dtype=torch.bfloat16, hw="a100").variant.weights_tma
    seen = 0
    for target, hw in dispatch.HARDWARE.items():
        for dtype in (torch.bfloat16, torch.float32) + (() if target in M.UNSERVED_FP8 else (FP8,)):
            for T in (1, 16, 256, 2048, 4096, 8192):
                v = M.select(T, 768, dtype=dtype, hw=target).variant
                if v.weights_tma:
                    assert hw.tma and v.kind == "grouped", (target, dtype, T)
                    assert v.name.endswith("_wtma")
                    seen += 1
    assert seen > 0


@pytest.mark.parametrize("dtype", DTYPES, ids=[str(d).removeprefix("torch.") for d in DTYPES])
@pytest.mark.parametrize("H, I", [(64, 96), (72, 40)], ids=["even", "ragged-K"])
def test_tma_and_pointer_loads_give_the_same_bytes(made, dtype, H, I):
    """fused_moe on h200's prefill bucket: a descriptor for w1 and w2, and the same bytes as the
    pointer loads of the same kernels; ragged K (72 and 40: not whole 64-wide steps) is zero-filled
    by the descriptor past the rows' end, masked by the pointer loads."""
    E, k, T = 4, 2, 37
    x = torch.randn(T, H, device=DEVICE).to(dtype)
    w1 = (torch.randn(E, 2 * I, H, device=DEVICE) / H**0.5).to(dtype)
    w2 = (torch.randn(E, H, I, device=DEVICE) / I**0.5).to(dtype)
    weights, ids = (t.to(DEVICE) for t in routing(T, E, k))
    bucket = M.select(4096, I, dtype=dtype, hw="h200")
    assert bucket.variant.weights_tma
    tma, ptr, flags = both_paths(made, lambda: M._MOE.fused_moe(x, w1, w2, weights, ids, "silu", None, "h200",
                                                               bucket.variant))  # fmt: skip
    assert flags == [True, True]
    assert torch.equal(tma, ptr)
    want = _reference(x, w1, w2, weights, ids, I)
    assert ((tma.double().cpu() - want).norm() / want.norm()).item() < 2e-2


def _reference(x, w1, w2, weights, ids, I):
    x, w1, w2 = x.double().cpu(), w1.double().cpu(), w2.double().cpu()
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j, e in enumerate(ids[t].tolist()):
            h = w1[e] @ x[t]
            out[t] += weights[t, j].item() * (w2[e] @ (torch.nn.functional.silu(h[:I]) * h[I:]))
    return out


SCALINGS = ["tensor"] + (["block"] if GPU else [])  # block scales: 128-wide H and I, slow in the interpreter


@pytest.mark.parametrize("scaling", SCALINGS)
def test_fp8_tma_and_pointer_loads_give_the_same_bytes(made, scaling):
    """fused_moe_fp8 on h200's prefill_large bucket, both paths, the same bytes."""
    block = scaling == "block"
    E, k, T = 3, 2, 29
    H, I = (256, 128) if block else (80, 48)
    x = torch.randn(T, H, device=DEVICE).to(torch.float16)
    w1q, w1s = quant_weights(torch.randn(E, 2 * I, H) / H**0.5, block)
    w2q, w2s = quant_weights(torch.randn(E, H, I) / I**0.5, block)
    w1q, w1s, w2q, w2s = (t.to(DEVICE) for t in (w1q, w1s, w2q, w2s))
    weights, ids = (t.to(DEVICE) for t in routing(T, E, k))
    v = M.select(4096, I, dtype=FP8, hw="h200").variant
    assert v.weights_tma

    def call():
        return M._MOE_FP8.fused_moe_fp8(x, w1q, w2q, weights, ids, w1_scale=w1s, w2_scale=w2s,
                                        block_shape=[128, 128] if block else None, variant=v)  # fmt: skip

    tma, ptr, flags = both_paths(made, call)
    assert flags == [True, True]
    assert torch.equal(tma, ptr) and torch.isfinite(tma.float()).all()


def test_layouts_a_descriptor_cannot_read_take_pointer_loads():
    """weights_arg gives the tensor itself (the kernel's pointer loads) for K not contiguous, a
    base or row not 16-byte aligned, experts not a whole number of rows apart, or a record that
    does not ask; a descriptor for packed, row-padded and stride-0 (one expert for all) weights,
    over as many rows as the last expert ends at."""
    w = torch.randn(3, 32, 64, device=DEVICE).to(torch.float16)

    def flag(t, tma=True):
        return rt.weights_arg(t, 16, 32, tma)[1]

    assert flag(w) and not flag(w, tma=False)
    assert not flag(w.transpose(1, 2).contiguous().transpose(1, 2))  # K strided
    assert not flag(torch.randn(3 * 32 * 64 + 1, device=DEVICE).half()[1:].view(3, 32, 64))  # base
    assert not flag(torch.randn(3, 32, 65, device=DEVICE).half()[:, :, :64])  # 130-byte rows
    assert not flag(torch.randn(3, 33 * 64 + 8, device=DEVICE).half()[:, : 32 * 64].view(3, 32, 64))
    padded = torch.randn(3, 32, 72, device=DEVICE).half()[:, :, :64]  # 144-byte rows: aligned
    one = w[:1].expand(3, 32, 64)  # stride 0
    for t, rows in ((w, 96), (padded, 96), (one, 32)):
        desc, ok = rt.weights_arg(t, 16, 32, True)
        assert ok and list(desc.shape) == [rows, 64] and list(desc.block_shape) == [16, 32], t.stride()


def test_stride_zero_experts_read_the_one_expert(made):
    """Warm-up's layout (one expert's weights at expert stride 0) through a descriptor: the same
    result as those weights repeated in memory."""
    E, k, T, H, I = 4, 2, 21, 64, 96
    x = torch.randn(T, H, device=DEVICE).half()
    w1 = (torch.randn(1, 2 * I, H, device=DEVICE) / 8).half()
    w2 = (torch.randn(1, H, I, device=DEVICE) / 8).half()
    weights, ids = (t.to(DEVICE) for t in routing(T, E, k))
    v = M.select(4096, I, dtype=torch.float16, hw="h200").variant
    seen, _ = made
    call_cache.clear_all()
    broadcast = M._MOE.fused_moe(x, w1.expand(E, -1, -1), w2.expand(E, -1, -1), weights, ids, "silu", None, "h200", v)
    assert seen == [True, True]
    copied = M._MOE.fused_moe(x, w1.repeat(E, 1, 1), w2.repeat(E, 1, 1), weights, ids, "silu", None, "h200", v)
    assert seen == [True, True, True, True]
    assert torch.equal(broadcast, copied)


def test_a_record_asking_tma_weights_on_a_part_without_tma_is_a_spec_error(project):
    """weights_tma on Ampere's 16-bit prefill bucket (the a100 and a10 have no TMA): the build
    stops with exit 2, the spec file, the record and the check's rule, no traceback, and
    generated/ as it was."""
    pytest.importorskip("jinja2", reason="the compiler's dependencies (a GPU machine runs the kernels only)")
    pytest.importorskip("pydantic", reason="the compiler's dependencies (a GPU machine runs the kernels only)")
    from conftest import run_cli, snapshot

    spec = project / "specs/kernels/moe.toml"
    text = spec.read_text()
    ampere = 'block_size_k = { expr = "128 // dtype_bytes" }\n\n[[moe_launch.policy.bucket]]\nname = "prefill"\nblock_size_m = 64\n'
    assert text.count(ampere) == 1
    spec.write_text(text.replace(ampere, ampere + "weights_tma = true\n"))
    before = snapshot(project / "generated")
    result = run_cli("--root", str(project), "build")
    assert result.code == 2 and "Traceback" not in result.err, result
    assert "specs/kernels/moe.toml" in result.err and "weights_tma" in result.err, result.err
    assert "TMA loads of the weights need a grouped kernel on a part with TMA" in result.err, result.err
    assert "a100" in result.err, result.err
    assert snapshot(project / "generated") == before


def test_expert_parallel_calls_read_their_local_experts_through_descriptors(made):
    """With an expert_map (3 of 6 experts on this rank) the descriptors span the local experts'
    weights only, and the call gives the pointer loads' bytes."""
    E, k, T, H, I = 6, 2, 30, 64, 96
    x = torch.randn(T, H, device=DEVICE).half()
    w1 = (torch.randn(3, 2 * I, H, device=DEVICE) / 8).half()
    w2 = (torch.randn(3, H, I, device=DEVICE) / 8).half()
    weights, ids = (t.to(DEVICE) for t in routing(T, E, k))
    emap = torch.tensor([0, -1, 1, -1, 2, -1], dtype=torch.int32, device=DEVICE)
    v = M.select(4096, I, dtype=torch.float16, hw="h200").variant

    def call():
        return M._MOE.fused_moe(x, w1, w2, weights, ids, "silu", None, "h200", v, expert_map=emap)

    tma, ptr, flags = both_paths(made, call)
    assert flags == [True, True]
    assert torch.equal(tma, ptr) and tma.abs().sum() > 0
