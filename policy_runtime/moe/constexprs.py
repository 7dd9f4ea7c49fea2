"""The ``tl.constexpr`` values a ``moe_launch`` record gives fused MoE's kernel bodies.

One mapping for both places that launch a record's kernels: templates/moe/context.py (run by
the compiler) bakes these values into generated/moe.py's wrappers, and policy_runtime/moe/tune.py
binds them to the same bodies when ``codegen tune`` runs a candidate record, so the tuner times
the kernel the build would generate.  Plain Python (no torch, no triton), so that the compiler
can import it; the bodies themselves are in policy_runtime/moe/ops.py.
"""

from __future__ import annotations

from typing import Any, Mapping

# The side of a scale block (DeepSeek-V3's 1x128 activations, 128x128 weights), as scaled_mm's.
from ..scaled_mm.constexprs import SCALE_BLOCK


def body_constants(record: Mapping[str, Any], dtype_bytes: int) -> dict[str, tuple[str, dict[str, Any]]]:
    """``{"up": (body, constants), "down": (body, constants)}`` for one record: the name of the
    body in policy_runtime/moe/ops.py each kernel calls, and its constants in the order the generated
    wrapper passes them."""
    kind = record["kernel"]
    # tl.dot's input precision: fp32 operands in full precision (Triton's default rounds them to
    # tf32); for 16-bit operands Triton's default, which changes nothing.
    prec = "ieee" if dtype_bytes == 4 else "tf32"
    up_tile = dict(BLOCK_N=record["block_size_n"], BLOCK_K=record["block_size_k"])
    down_tile = dict(BLOCK_N=record["down_block_size_n"], BLOCK_K=record["down_block_size_k"])
    if kind == "grouped":
        rows = dict(BLOCK_M=record["block_size_m"])
        group = dict(GROUP_M=record["group_size_m"], DOT_PREC=prec)
        up = dict(rows, **up_tile, **group)
        down = dict(rows, **down_tile, **group, FUSE_SUM=record["fuse_sum"])
    elif kind == "gemv":
        up = dict(up_tile, DOT_PREC=prec)
        down = dict(down_tile, DOT_PREC=prec)
    else:  # simt: no tensor cores, so no dot precision; its loops' pipelining depth
        up = dict(up_tile, STAGES=record["num_stages"])
        down = dict(down_tile, STAGES=record["down_num_stages"])
    return {"up": (f"{kind}_up_body", up), "down": (f"{kind}_down_body", down)}


def fp8_body_constants(record: Mapping[str, Any]) -> dict[str, tuple[str, dict[str, Any]]]:
    """As ``body_constants``, for a ``moe_fp8_launch`` record: the bodies in
    policy_runtime/moe/fp8.py its kernels call and their constants."""
    kind = record["kernel"]
    up_tile = dict(BLOCK_N=record["block_size_n"], BLOCK_K=record["block_size_k"])
    down_tile = dict(BLOCK_N=record["down_block_size_n"], BLOCK_K=record["down_block_size_k"])
    if kind == "grouped":
        rows = dict(BLOCK_M=record["block_size_m"])
        group = dict(GROUP_M=record["group_size_m"])
        up = dict(rows, **up_tile, **group, SCALE_BLOCK=SCALE_BLOCK)
        down = dict(
            rows, **down_tile, **group, FUSE_SUM=record["fuse_sum"], SCALE_BLOCK=SCALE_BLOCK,
            SPLIT_K=record["down_split_k"],
        )  # fmt: skip
    else:  # simt: its loops' pipelining depth
        up = dict(up_tile, STAGES=record["num_stages"], SCALE_BLOCK=SCALE_BLOCK)
        down = dict(down_tile, STAGES=record["down_num_stages"], SCALE_BLOCK=SCALE_BLOCK)
    return {"up": (f"fp8_{kind}_up_body", up), "down": (f"fp8_{kind}_down_body", down)}
