"""Context of templates/scaled_mm/module.py.j2 (the scaled_mm family's context file, run by the compiler).

From the generic context (codegen/context.py) of the bucketed ``scaled_mm`` config: one Triton
kernel per distinct tile config (named after its constants, so a name never moves when a target or
bucket is added elsewhere), each served target's buckets in order with the kernel that serves them,
and the targets not served (they lack a hardware feature the config requires).
"""

from __future__ import annotations

from typing import Any

from codegen.context import bucketed_policies, keyword_arguments, literal
from policy_runtime.scaled_mm.constexprs import body_constants


def kernel_name(tag: str, c: dict[str, Any]) -> str:
    """``_smm_e4m3_128x256x128_g8_w8_s4``: the kernel's constants, spelt out."""
    return (
        f"_smm_{tag}_{c['block_m']}x{c['block_n']}x{c['block_k']}_g{c['group_m']}"
        f"_w{c['num_warps']}_s{c['num_stages']}"
    )


def context(ctx: dict[str, Any]) -> dict[str, Any]:
    config = ctx["configs"]["scaled_mm"]
    # Every field of a scaled_mm record ([scaled_mm.fields]) is a kernel constant.
    kernel_fields = [name for name, _, _ in config["fields"]]
    kernels: dict[str, dict[str, Any]] = {}

    def kernel_for(tag: str, variant: dict[str, Any], user: str, bucket: dict[str, Any]) -> tuple[str, dict]:
        consts = {f: bucket["record"][f] for f in kernel_fields}
        kname = kernel_name(tag, consts)
        entry = kernels.setdefault(
            kname,
            {
                "name": kname,
                "summary": (
                    f"{consts['block_m']}x{consts['block_n']}x{consts['block_k']} FP8 tiles, "
                    f"{consts['num_warps']} warps, {consts['num_stages']} stages"
                ),
                "body": body_constants(consts)[0],
                "constants": keyword_arguments(body_constants(consts)[1]),
                "literal": {f: literal(v) for f, v in {**consts, "name": kname}.items()},
                "users": [],
            },
        )
        entry["users"].append(user)
        return kname, {}

    policies, tables = bucketed_policies(config, kernel_for)
    unserved = {target: missing for variant in config["variants"].values() for target, missing in variant["unserved"]}
    # The variant a call with 128-block scales runs (its `block_scales` parameter set); the other
    # serves per-tensor and row/column scales.
    by_scaling = {bool(v["params"]["block_scales"]): name for name, v in config["variants"].items()}
    return {
        "outer_variant": by_scaling[False],
        "block_variant": by_scaling[True],
        "kernels": [kernels[k] for k in sorted(kernels)],
        "bodies": sorted({k["body"] for k in kernels.values()}),
        "policies": policies,
        "tables": tables,
        "unserved": sorted(unserved.items()),
    }
