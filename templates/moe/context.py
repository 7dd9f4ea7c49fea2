"""Context of templates/moe/module.py.j2 (the fused-MoE family's context file, run by the compiler).

From the generic context (codegen/context.py) of the bucketed ``moe_launch`` config: one pair of
Triton kernels (up and down GEMM) per distinct kernel config, named after its constants (so a
name never moves when a target or bucket is added elsewhere), each target's buckets in order
with the kernels that serve them, and the dtype tables.
"""

from __future__ import annotations

from typing import Any

from codegen.context import bucketed_policies, keyword_arguments, literal
from policy_runtime.moe.constexprs import body_constants, fp8_body_constants


def _down_differs(c: dict[str, Any]) -> bool:
    return (c["down_block_size_n"], c["down_block_size_k"], c["down_num_warps"], c["down_num_stages"]) != (
        c["block_size_n"],
        c["block_size_k"],
        c["num_warps"],
        c["num_stages"],
    )


def kernel_name(tag: str, c: dict[str, Any]) -> str:
    """``_moe_16bit_grouped_16x64x64_g1_w4_s3_sum``: the kernels' constants, spelt out (the up and
    down kernels add ``_up`` and ``_down``); a down GEMM with its own tile adds
    ``_down4x128_w4`` (and ``_s2`` where its pipelining depth is its own), an FP8 down GEMM's K
    split ``_split4``, chained launches ``_pdl``, weights through TMA descriptors ``_wtma``."""
    name = f"_moe_{tag}_{c['kernel']}_{c['block_size_m']}x{c['block_size_n']}x{c['block_size_k']}"
    name += f"_g{c['group_size_m']}_w{c['num_warps']}_s{c['num_stages']}"
    if c["fuse_sum"]:
        name += "_sum"
    if _down_differs(c):
        name += f"_down{c['down_block_size_n']}x{c['down_block_size_k']}_w{c['down_num_warps']}"
        if c["down_num_stages"] != c["num_stages"]:
            name += f"_s{c['down_num_stages']}"
    if c.get("down_split_k", 1) != 1:
        name += f"_split{c['down_split_k']}"
    if c["chained"]:
        name += "_pdl"
    if c.get("weights_tma"):
        name += "_wtma"
    return name


def kernel_summary(c: dict[str, Any]) -> str:
    """One line for the comment above a kernel pair: its structure and constants."""
    if c["kernel"] == "gemv":
        parts = [
            f"gemv: one routed row a program in 16-row tiles, {c['block_size_n']} columns, K steps of {c['block_size_k']}"
        ]
    elif c["kernel"] == "simt":
        parts = [
            f"simt: one routed row a program on the CUDA cores, {c['block_size_n']}x{c['block_size_k']} slabs",
            f"one token a program in the down GEMM, {c['down_block_size_n']} rows of every expert"
            f" {c['down_block_size_k']} columns at a time",
        ]
    else:
        parts = [
            f"grouped {c['block_size_m']}x{c['block_size_n']}x{c['block_size_k']} tiles of aligned expert blocks",
            f"groups of {c['group_size_m']} row blocks",
        ]
    parts += [f"{c['num_warps']} warps", f"{c['num_stages']} stage{'s' if c['num_stages'] > 1 else ''}"]
    down_tile = (c["down_block_size_n"], c["down_block_size_k"])
    if c["kernel"] != "simt" and down_tile != (c["block_size_n"], c["block_size_k"]):
        parts.append(f"down GEMM {c['down_block_size_n']}x{c['down_block_size_k']} tiles")
    if c["down_num_warps"] != c["num_warps"]:
        parts.append(f"{c['down_num_warps']} warps in the down GEMM")
    if c["down_num_stages"] != c["num_stages"]:
        parts.append(f"{c['down_num_stages']} stage{'s' if c['down_num_stages'] > 1 else ''} in the down GEMM")
    if c.get("down_split_k", 1) != 1:
        parts.append(f"the down GEMM's K in {c['down_split_k']} runs")
    if c["chained"]:
        parts.append("chained by programmatic dependent launch")
    if c.get("weights_tma"):
        parts.append("weights through TMA descriptors where a call allows")
    if c["kernel"] == "grouped":
        parts.append("weighted sum by fp32 atomics" if c["fuse_sum"] else "weighted rows summed by a reduce")
    else:
        parts.append("weighted sum in the down kernel")
    return ", ".join(parts) + "."


def context(ctx: dict[str, Any]) -> dict[str, Any]:
    # Every field of a moe_launch record ([moe_launch.fields]) is a kernel constant.
    kernel_fields = [name for name, _, _ in ctx["configs"]["moe_launch"]["fields"]]
    kernels: dict[str, dict[str, Any]] = {}

    def kernel_for(tag: str, variant: dict[str, Any], user: str, bucket: dict[str, Any]) -> tuple[str, dict]:
        consts = {f: bucket["record"][f] for f in kernel_fields}
        kname = kernel_name(tag, consts)
        entry = kernels.setdefault(
            kname,
            {
                "name": kname,
                "kind": consts["kernel"],
                "c": consts,
                # Each kernel's body and the constants its wrapper passes (shared with
                # codegen tune's harness, policy_runtime/moe/tune.py).
                "bodies": body_constants(consts, variant["params"]["dtype_bytes"]),
                "summary": kernel_summary(consts),
                "users": [],
            },
        )
        entry["users"].append(user)
        return kname, {}

    policies, tables = bucketed_policies(ctx["configs"]["moe_launch"], kernel_for)
    ordered = sorted(kernels.values(), key=lambda k: k["name"])
    # The kernel bodies the module imports: those some bucket's kernels call.
    bodies = sorted({body for k in ordered for body, _ in k["bodies"].values()})
    for k in ordered:
        k["literal"] = {field: literal(value) for field, value in {**k["c"], "name": k["name"]}.items()}
        for part, (body, constants) in k["bodies"].items():
            k[f"{part}_body"] = body
            k[f"{part}_constants"] = keyword_arguments(constants)
    return {
        "kernels": ordered,
        "bodies": bodies,
        "policies": policies,
        "tables": tables,
        **fp8_context(ctx["configs"]["moe_fp8_launch"]),
        # Each model's MoERouting (the default variant, per model and target): warm-up's routers.
        "routing_tables": [
            {"model": e["model"], "table": e["table"]}
            for e in ctx["configs"]["moe_routing"]["variants"]["moe_routing"]["by_model"]
        ],
    }


def fp8_kernel_name(tag: str, c: dict[str, Any]) -> str:
    """``_moe_e4m3_grouped_64x128x128_g8_w4_s3``: as ``kernel_name``, for an FP8 record."""
    return kernel_name(tag, {**c, "chained": False})


def fp8_summary(c: dict[str, Any]) -> str:
    """One line for the comment above an FP8 kernel pair."""
    if c["kernel"] == "simt":
        parts = [
            f"e4m3 simt: one routed row a program on the CUDA cores, {c['block_size_n']}x{c['block_size_k']} slabs",
            f"one token a program in the down GEMM, {c['down_block_size_n']}x{c['down_block_size_k']}"
            f" slabs of all its experts a step",
            f"{c['num_warps']} warps",
            f"{c['num_stages']} stage{'s' if c['num_stages'] > 1 else ''}",
        ]
        if (c["down_num_warps"], c["down_num_stages"]) != (c["num_warps"], c["num_stages"]):
            parts.append(f"{c['down_num_warps']} warps, {c['down_num_stages']} stages in the down GEMM")
        return ", ".join(parts) + "."
    return "e4m3 " + kernel_summary({**c, "chained": False})


def fp8_context(config: dict[str, Any]) -> dict[str, Any]:
    """The FP8 kernels (``fp8_kernels``), their bodies, policies and tables, and the targets not
    served (they lack the feature the config requires)."""
    # Every field of a moe_fp8_launch record ([moe_fp8_launch.fields]) is a kernel constant.
    fp8_fields = [name for name, _, _ in config["fields"]]
    kernels: dict[str, dict[str, Any]] = {}

    def kernel_for(tag: str, variant: dict[str, Any], user: str, bucket: dict[str, Any]) -> tuple[str, dict]:
        consts = {f: bucket["record"][f] for f in fp8_fields}
        kname = fp8_kernel_name(tag, consts)
        entry = kernels.setdefault(
            kname,
            {"name": kname, "kind": consts["kernel"], "c": consts, "summary": fp8_summary(consts), "users": []},
        )
        entry["users"].append(user)
        return kname, {}

    policies, tables = bucketed_policies(config, kernel_for)
    ordered = sorted(kernels.values(), key=lambda k: k["name"])
    for k in ordered:
        k["literal"] = {field: literal(value) for field, value in {**k["c"], "name": k["name"]}.items()}
        for part, (body, constants) in fp8_body_constants(k["c"]).items():
            k[f"{part}_body"] = body
            k[f"{part}_constants"] = keyword_arguments(constants)
    unserved = {target: missing for v in config["variants"].values() for target, missing in v["unserved"]}
    return {
        "fp8_kernels": ordered,
        "fp8_bodies": sorted({body for k in ordered for body in (k["up_body"], k["down_body"])}),
        "fp8_policies": policies,
        "fp8_tables": tables,
        "fp8_unserved": sorted(unserved.items()),
    }
