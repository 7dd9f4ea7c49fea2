"""The ``tl.constexpr`` values a ``matmul`` record gives the matmul kernel bodies, and the pointer
kernel a TMA kernel falls back to.

One mapping for both places that launch a record's kernel: templates/matmul/context.py (run by
the compiler) bakes these values into generated/matmul.py's wrappers, and
policy_runtime/matmul/tune.py binds them to the same bodies when ``codegen tune`` runs a candidate
record, so the tuner times the kernel the build would generate.  Plain Python (no torch, no
triton), so that the compiler can import it; the bodies themselves are in policy_runtime/matmul/ops.py.
"""

from __future__ import annotations

from typing import Any, Mapping


def body_constants(record: Mapping[str, Any], dtype_bytes: int) -> tuple[str, dict[str, Any]]:
    """The name of the body in policy_runtime/matmul/ops.py a record's kernel calls, and its constants
    in the order the generated wrapper passes them."""
    kind = record["kernel"]
    # tl.dot's input precision: fp32 operands in full precision (Triton's default rounds them to
    # tf32); for 16-bit operands Triton's default, which changes nothing.
    prec = "ieee" if dtype_bytes == 4 else "tf32"
    tiles = dict(BLOCK_M=record["block_m"], BLOCK_N=record["block_n"], BLOCK_K=record["block_k"])
    if kind == "grouped":
        return "grouped_body", dict(tiles, GROUP_M=record["group_m"], SPLIT_K=record["split_k"], DOT_PREC=prec)
    if kind == "small_m":
        return "small_m_body", dict(tiles, SPLIT_K=record["split_k"], STAGES=record["num_stages"], DOT_PREC=prec)
    return "tma_persistent_body", dict(
        tiles,
        GROUP_M=record["group_m"],
        SPLIT_K=record["split_k"],
        NUM_PROGS=record["num_programs"],
        EPILOGUE_SUBTILE=record["epilogue_subtile"],
        FLATTEN=record["flatten"],
        DOT_PREC=prec,
    )


def fallback_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """The pointer kernel (``grouped``, same tiles) that serves a ``tma_persistent`` record's calls
    whose operands TMA cannot describe.  A split-K fallback splits its one wave of tiles as far as
    the grouped kernel does."""
    return dict(
        record,
        kernel="grouped",
        flatten=False,
        epilogue_subtile=1,
        num_programs=record["num_programs"] if record["split_k"] > 1 else 0,
    )
