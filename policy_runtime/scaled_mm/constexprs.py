"""The ``tl.constexpr`` values a ``scaled_mm`` record gives the scaled-matmul kernel body.

One mapping for both places that launch a record's kernel: templates/scaled_mm/context.py (run by
the compiler) bakes these values into generated/scaled_mm.py's wrappers, and
policy_runtime/scaled_mm/tune.py binds them to the same body when ``codegen tune`` runs a candidate
record.  Plain Python (no torch, no triton), so that the compiler can import it; the body itself is
in policy_runtime/scaled_mm/ops.py.
"""

from __future__ import annotations

from typing import Any, Mapping

# The side of a scale block: 1x128 of A, 128x128 of B (DeepSeek-V3's block FP8).
SCALE_BLOCK = 128


def body_constants(record: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The name of the body in policy_runtime/scaled_mm/ops.py a record's kernel calls, and its
    constants in the order the generated wrapper passes them."""
    return "scaled_grouped_body", dict(
        BLOCK_M=record["block_m"],
        BLOCK_N=record["block_n"],
        BLOCK_K=record["block_k"],
        GROUP_M=record["group_m"],
        SCALE_BLOCK=SCALE_BLOCK,
    )
