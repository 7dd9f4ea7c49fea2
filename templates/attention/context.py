"""Context of templates/attention/module.py.j2 (the attention family's context file, run by the compiler).

From the generic context (codegen/context.py) of the per-model ``attention`` config
(AttentionConfig: prefill tiles, decode thresholds, native flags) and the per-head_dim
``attention_launch`` config (AttentionLaunch: decode tiles): one Triton kernel per distinct
prefill tile and per distinct decode tile (named after their constants, so a name never moves
when a target is added elsewhere), one policy object per AttentionConfig instantiation and dtype,
one decode object per AttentionLaunch instantiation, the tables by dtype, model or head_dim and
target, which model's records serve each head_dim, and each model's AttentionFeatures
(``attention_features``) by target.  The same for the decode kernels over an FP8 KV cache
(``attention_launch_fp8``, AttentionLaunchFp8: a kernel per record and query class) and the
targets that config does not serve.
"""

from __future__ import annotations

from typing import Any

# Call dtype -> (the AttentionConfig variant whose records serve it, the kernels' element class).
# fp32 calls (accepted for the CPU tests) use the fp16 records with fp32 kernels.
DTYPES = (
    ("float16", "attention_fp16", "16bit"),
    ("bfloat16", "attention_bf16", "16bit"),
    ("float32", "attention_fp16", "fp32"),
)
CLASS_OF_BYTES = {2: "16bit", 4: "fp32"}


def prefill_tile(record: dict[str, Any], dtype_class: str) -> dict[str, Any]:
    """The prefill kernel's constants for an AttentionConfig record.  fp32 inputs take half as many
    key rows (at least 16): the same K/V bytes as the 16-bit tile, which the config's checks
    validate (``the fp32 prefill tile fits shared memory``)."""
    block_n = record["triton_block_n"]
    if dtype_class == "fp32":
        block_n = max(16, block_n // 2)
    return {
        "block_m": record["triton_block_m"],
        "block_n": block_n,
        "num_warps": record["triton_num_warps"],
        "num_stages": record["triton_num_stages"],
    }


def prefill_name(dtype_class: str, c: dict[str, Any]) -> str:
    """``_prefill_16bit_64x64_w8_s2``: the kernel's constants, spelt out."""
    return f"_prefill_{dtype_class}_{c['block_m']}x{c['block_n']}_w{c['num_warps']}_s{c['num_stages']}"


def decode_name(dtype_class: str, c: dict[str, Any]) -> str:
    """``_decode_16bit_n32_w4_s3``."""
    return f"_decode_{dtype_class}_n{c['block_n']}_w{c['num_warps']}_s{c['num_stages']}"


def context(ctx: dict[str, Any]) -> dict[str, Any]:
    att = ctx["configs"]["attention"]
    lch = ctx["configs"]["attention_launch"]
    head_dim_of = {m["name"]: int(dict(m["dims"])["head_dim"]) for m in ctx["models"] if m["name"] in att["models"]}

    kernels: dict[str, dict[str, Any]] = {}

    def kernel(kind: str, dtype_class: str, consts: dict[str, Any], user: str) -> str:
        name = (prefill_name if kind == "prefill" else decode_name)(dtype_class, consts)
        entry = kernels.setdefault(
            name,
            {
                "name": name,
                "kind": kind,
                "dtype_class": dtype_class,
                "c": consts,
                "dot_prec": "ieee" if dtype_class == "fp32" else "tf32",
                "users": [],
            },
        )
        if user not in entry["users"]:
            entry["users"].append(user)
        return name

    # Prefill: a policy per AttentionConfig instantiation and call dtype.
    policies = []
    policy_tables = []
    for dtype, variant_name, dtype_class in DTYPES:
        variant = att["variants"][variant_name]
        by_model = []
        for entry in variant["by_model"]:
            names = {}
            for inst in entry["instantiations"]:
                tag = dtype.replace("float", "fp").replace("bfp", "bf").upper()  # FP16, BF16, FP32
                pname = f"_POLICY_{tag}_{entry['model'].upper()}_{inst['suffix'].upper()}"
                consts = prefill_tile(inst["record"], dtype_class)
                user = f"{'fp16/bf16' if dtype_class == '16bit' else 'fp32'} {entry['model']} on {', '.join(inst['target_names'])}"
                kname = kernel("prefill", dtype_class, consts, user)
                policies.append(
                    {
                        "name": pname,
                        "dtype": dtype,
                        "variant": variant_name,
                        "model": entry["model"],
                        "record": inst["symbol"],
                        "kernel": kname,
                        "origin": inst["origin"],
                        "targets": inst["targets"],
                    }
                )
                names[inst["symbol"]] = pname
            by_model.append({"model": entry["model"], "table": [(t, names[s]) for t, s in entry["table"]]})
        policy_tables.append({"dtype": dtype, "variant": variant_name, "by_model": by_model})

    # Decode: an object per AttentionLaunch instantiation.
    decodes = []
    decode_tables: dict[str, list[dict[str, Any]]] = {}
    served = set()
    for variant in lch["variants"].values():
        dtype_class = CLASS_OF_BYTES[variant["params"]["dtype_bytes"]]
        head_dim = variant["params"]["head_dim"]
        served.add(head_dim)
        names = {}
        for inst in variant["instantiations"]:
            rec = inst["record"]
            consts = {"block_n": rec["block_n"], "num_warps": rec["num_warps"], "num_stages": rec["num_stages"]}
            user = f"head_dim {head_dim} on {', '.join(inst['target_names'])}"
            kname = kernel("decode", dtype_class, consts, user)
            dname = f"_{inst['symbol']}"
            decodes.append(
                {
                    "name": dname,
                    "variant": variant["name"],
                    "record": inst["symbol"],
                    "kernel": kname,
                    "origin": inst["origin"],
                    "targets": inst["targets"],
                }
            )
            names[inst["symbol"]] = dname
        decode_tables.setdefault(dtype_class, []).append(
            {
                "head_dim": head_dim,
                "variant": variant["name"],
                "table": [(t, names[s]) for t, s in variant["table"]],
            }
        )
    for tables in decode_tables.values():
        tables.sort(key=lambda t: t["head_dim"])

    # Decode over an FP8 KV cache: per AttentionLaunchFp8 instantiation, a decode object per query
    # class (fp16/bf16 queries, and fp32 ones for the CPU tests) whose kernel converts the tiles.
    lch8 = ctx["configs"]["attention_launch_fp8"]
    fp8_decodes = []
    fp8_tables: dict[str, list[dict[str, Any]]] = {}
    fp8_unserved: dict[str, str] = {}
    for variant in lch8["variants"].values():
        head_dim = variant["params"]["head_dim"]
        fp8_unserved.update(variant["unserved"])
        for dtype_class in ("16bit", "fp32"):
            names = {}
            for inst in variant["instantiations"]:
                rec = inst["record"]
                consts = {"block_n": rec["block_n"], "num_warps": rec["num_warps"], "num_stages": rec["num_stages"]}
                user = f"fp8 KV head_dim {head_dim} on {', '.join(inst['target_names'])}"
                kname = kernel("decode", dtype_class, consts, user)
                dname = f"_{inst['symbol']}_{dtype_class.upper()}"
                fp8_decodes.append(
                    {
                        "name": dname,
                        "variant": variant["name"],
                        "dtype_class": dtype_class,
                        "record": inst["symbol"],
                        "kernel": kname,
                        "origin": inst["origin"],
                        "targets": inst["targets"],
                    }
                )
                names[inst["symbol"]] = dname
            fp8_tables.setdefault(dtype_class, []).append(
                {
                    "head_dim": head_dim,
                    "variant": variant["name"],
                    "table": [(t, names[s]) for t, s in variant["table"]],
                }
            )
    for tables in fp8_tables.values():
        tables.sort(key=lambda t: t["head_dim"])

    # The records of the model with the smallest head_dim that is at least the call's serve it:
    # their shared-memory checks were made for that head_dim, so they hold for a smaller one.
    # Among models of one head_dim, the project's default model, then the first by name: a model
    # added beside it does not move the default model's calls to other records.
    default = ctx.get("default_model")
    model_of_head_dim = []
    for head_dim in sorted(served):
        fits = sorted((hd, m != default, m) for m, hd in head_dim_of.items() if hd >= head_dim)
        if fits:
            model_of_head_dim.append((head_dim, fits[0][2]))

    # Each model's AttentionFeatures (the default variant, per model and target) and the flags
    # that name the kernel constants it enables: the records calls with features choose by.
    feat = ctx["configs"]["attention_features"]
    features_tables = []
    for entry in feat["variants"]["attention_features"]["by_model"]:
        features_tables.append({"model": entry["model"], "table": entry["table"]})

    ordered = sorted(kernels.values(), key=lambda k: (k["kind"] != "prefill", k["name"]))
    return {
        "features_tables": features_tables,
        "kernels": ordered,
        "policies": policies,
        "policy_tables": policy_tables,
        "decodes": decodes,
        "decode_tables": sorted(decode_tables.items()),
        "fp8_decodes": fp8_decodes,
        "fp8_tables": sorted(fp8_tables.items()),
        "fp8_unserved": sorted(fp8_unserved.items()),
        "model_of_head_dim": model_of_head_dim,
        "head_dim_models": sorted(head_dim_of.items()),
    }
