"""Context of templates/matmul/module.py.j2 (the matmul family's context file, run by the compiler).

From the generic context (codegen/context.py) of the bucketed ``matmul`` config: one Triton
kernel per distinct kernel config (named after its constants, so a name never moves when a
target or bucket is added elsewhere), each target's buckets in order with the kernel that serves
them, and the dtype tables.  A TMA kernel gets a pointer-kernel fallback with the same tiles, for
operands TMA cannot describe.
"""

from __future__ import annotations

from typing import Any

from codegen.context import bucketed_policies, keyword_arguments, literal
from policy_runtime.matmul.constexprs import body_constants, fallback_record

# The record field that chooses who serves a bucket; every other field of [matmul.fields] is a
# Triton kernel's constant.
BACKEND_FIELD = "backend"
# Who serves a bucket's calls, per backend (the comment above the bucket).
SERVED_BY = {
    "triton": "Triton",
    "library": "vendor library",
    "triton_in_graphs": "Triton in CUDA graphs, vendor library eagerly",
}


def kernel_name(tag: str, c: dict[str, Any]) -> str:
    """``_mm_16bit_grouped_64x64x64_g8_w4_s12_sk2x132``: the kernel's constants, spelt out."""
    name = f"_mm_{tag}_{c['kernel']}_{c['block_m']}x{c['block_n']}x{c['block_k']}_g{c['group_m']}"
    name += f"_w{c['num_warps']}_s{c['num_stages']}"
    if c["split_k"] > 1 or c["num_programs"]:
        name += f"_sk{c['split_k']}x{c['num_programs']}"
    if c["flatten"]:
        name += "_flat"
    if c["epilogue_subtile"] > 1:
        name += f"_epi{c['epilogue_subtile']}"
    return name


def kernel_summary(c: dict[str, Any]) -> str:
    """One line for the comment above a specialized kernel: its structure and constants."""
    parts = [
        f"{c['kernel']} {c['block_m']}x{c['block_n']}x{c['block_k']}",
        f"{c['num_warps']} warps",
        f"{c['num_stages']} stage{'s' if c['num_stages'] > 1 else ''}",
    ]
    if c["split_k"] > 1:
        if c["kernel"] == "tma_persistent":
            parts.append(f"the last partial wave of {c['num_programs']} split in K up to {c['split_k']} ways")
        else:
            parts.append(f"split-K up to {c['split_k']} within a {c['num_programs']}-program wave")
    if c["flatten"]:
        parts.append("flattened")
    if c["epilogue_subtile"] > 1:
        parts.append("split epilogue")
    return ", ".join(parts) + "."


def share_tables(policies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Policies of one variant with the same bucket names and bounds share one table: the one that
    the others differ from least is written out, and each other that differs in at most half of
    them (a part's amends of its arch's policy) lists only the buckets where it differs, the runs of equal buckets as slices of the shared table (``*_BASE[1:8]``), and selects
    through the shared selector.  The order puts every shared table before those reading it."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for p in policies:
        layout = (p["variant"], tuple((b["name"], b["condition"]) for b in p["buckets"]))
        groups.setdefault(layout, []).append(p)
    for p in policies:
        p.update(base=None, parts=None, shared=False, amended=[])
    for group in groups.values():
        if len(group) < 2:
            continue

        def differing(p: dict[str, Any], base: dict[str, Any]) -> list[int]:
            return [i for i, (b, s) in enumerate(zip(p["buckets"], base["buckets"])) if b != s]

        base = min(group, key=lambda b: sum(len(differing(p, b)) for p in group))
        for p in group:
            diff = differing(p, base)
            if p is base or 2 * len(diff) > len(p["buckets"]):  # mostly its own: written out
                continue
            base["shared"] = True
            p["base"] = base["name"]
            p["amended"] = [p["buckets"][i]["name"] for i in diff]
            parts: list[dict[str, Any]] = []
            for i, b in enumerate(p["buckets"]):
                if i in diff:
                    parts.append({"bucket": b, "start": None})
                elif parts and parts[-1]["start"] is not None:
                    parts[-1]["stop"] = i + 1
                    parts[-1]["names"].append(b["name"])
                else:
                    parts.append({"bucket": None, "start": i, "stop": i + 1, "names": [b["name"]]})
            p["parts"] = parts
    return sorted(policies, key=lambda p: p["base"] is not None)


def context(ctx: dict[str, Any]) -> dict[str, Any]:
    kernel_fields = [name for name, _, _ in ctx["configs"]["matmul"]["fields"] if name != BACKEND_FIELD]
    kernels: dict[str, dict[str, Any]] = {}

    def kernel_for(tag: str, dtype_bytes: int, consts: dict[str, Any], user: str) -> str:
        name = kernel_name(tag, consts)
        entry = kernels.get(name)
        if entry is None:
            # The body and the constants its wrapper passes (shared with codegen tune's harness,
            # policy_runtime/matmul/tune.py).
            body, constants = body_constants(consts, dtype_bytes)
            entry = kernels[name] = {
                "name": name,
                "kind": consts["kernel"],
                "c": consts,
                "body": body,
                "constants": keyword_arguments(constants),
                "summary": kernel_summary(consts),
                "users": [],
                "fallback": None,
            }
        entry["users"].append(user)
        if consts["kernel"] == "tma_persistent":
            fb = fallback_record(consts)
            entry["fallback"] = kernel_for(tag, dtype_bytes, fb, f"{user} (non-TMA operands)")
        return name

    def bucket_kernel(tag: str, variant: dict[str, Any], user: str, bucket: dict[str, Any]) -> tuple[str, dict]:
        rec = bucket["record"]
        consts = {f: rec[f] for f in kernel_fields}
        kname = kernel_for(tag, variant["params"]["dtype_bytes"], consts, user)
        return kname, {
            "library": rec["backend"] == "library",
            "eager_library": rec["backend"] == "triton_in_graphs",
            "served_by": SERVED_BY[rec["backend"]],
        }

    policies, tables = bucketed_policies(ctx["configs"]["matmul"], bucket_kernel)
    policies = share_tables(policies)
    # Pointer kernels first, so a TMA kernel's record can name its fallback.
    ordered = sorted(kernels.values(), key=lambda k: (k["kind"] == "tma_persistent", k["name"]))
    for k in ordered:
        named = {"name": k["name"], "kind": k["kind"], "fallback": k["fallback"]}
        k["literal"] = {field: literal(value) for field, value in {**k["c"], **named}.items()}
    # The kernel bodies the module imports: those some bucket's kernels call.
    bodies = sorted({k["body"] for k in ordered})
    return {"kernels": ordered, "bodies": bodies, "policies": policies, "tables": tables}
