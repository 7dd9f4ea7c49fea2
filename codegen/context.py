"""Resolution -> template data: the generic context every generated module's template sees.

Templates print; this module decides what they print, as plain data (strings already escaped
for their place, values already as Python literals).  It knows no kernel family: a family's
template reads the configs its module spec declares (``specs/modules/<name>.toml``), and a
family that needs more than these tables computes it in a context file beside its template
(``ModuleSpec.context``), from this data.

The context of a module (every name below is a template variable):

``header``     the marker line naming the module's spec files.
``module``     ``{"name", "path", "doc"}`` of the module being rendered.
``modules``    ``[{"name", "doc"}]`` of every generated module (for generated/__init__.py).
``hardware``   ``[{"name", "source", "vendor", "arch", "values": [(field, literal)]}]`` in
               (vendor, arch, name) order; ``hw_fields``: ``[(field, type, comment)]`` of the
               generated HardwareCapability (from the hardware spec model).
``vendors``    ``[{"name", "display_name", "arch_from", "name_words", "default", "hip"}]``.
``device_names``, ``by_arch``  detection tables (``detection_tables``).
``configs``    config name -> ``Config`` data (below): the configs the module reads
               (every config for the dispatch module).

A config: ``name``, ``record`` (class name), ``doc``, ``source`` (the file of its fields),
``bucketed``, ``dims`` (bucket dimensions), ``fields`` (``[(name, type, comment)]``),
``variants`` (variant name -> variant data, sorted), ``files`` (spec files it draws on).

A variant: ``name``, ``params`` (dict), ``params_text`` (``"dtype_bytes=2"``), ``names`` (the
variant and its aliases), ``n_targets``, ``instantiations`` (list, below) and ``table``
(``[(target, symbol)]`` by target name).

An instantiation (targets of one vendor whose resolved values are equal): ``symbol``
(``VARIANT_VENDORARCH_DIGEST``, stable while its values are), ``suffix``, ``origin`` (the
policies and lines it came from), ``targets`` (``"a100 (80), h100 (90)"``), ``target_names``,
``values`` (``[(field, literal)]``, plain configs) / ``record`` (``{field: value}``), and for
bucketed configs ``buckets``: ``[{"index", "name", "note", "bounds": [(dim, "min"|"max",
value)], "record": {field: value}, "values": [(field, literal)]}]``.
"""

from __future__ import annotations

from typing import Any

from .records import SpecTree
from .models import HW_RECORD_FIELDS, is_control, is_line_break
from .records import Instantiation, Resolution, VariantResolution


def comment_text(text: str) -> str:
    """``text`` safe to print after ``#``: line breaks and control characters other than tab are
    shown as escapes, everything else as it is.  load.py admits no such characters
    (models.text_problem); this is the second line of defence."""
    return "".join(repr(ch)[1:-1] if is_line_break(ch) or is_control(ch) else ch for ch in text)


def docstring_text(text: str) -> str:
    """``text`` safe to print inside a triple-quoted docstring: one line, its backslashes
    doubled and its triple quotes broken up."""
    return comment_text(text.replace("\\", "\\\\")).replace('"""', '\\"\\"\\"')


def symbol(variant: str, inst: Instantiation) -> str:
    """Module-level name of one instantiation: ATTENTION_FP16_NVIDIA80_3FA2C1."""
    return f"{variant}_{inst.suffix}".upper()


def target_list(tree: SpecTree, targets: tuple[str, ...]) -> str:
    archs = {hw.name: hw.spec.arch for hw in tree.hardware}
    return ", ".join(f"{t} ({archs[t]})" for t in targets)


def policy_origin(vr: VariantResolution, inst: Instantiation) -> str:
    """Where an instantiation's values came from: policy labels and their lines."""
    src = vr.config.source
    seen = []
    for target in inst.targets:
        pol = vr.resolved[target].policy
        text = f"{pol.label} ({src.where(pol.keypath)})"
        if text not in seen:
            seen.append(text)
    return "; ".join(seen)


def hardware_data(tree: SpecTree) -> list[dict[str, Any]]:
    out = []
    for hw in tree.hardware:
        flat = hw.spec.model_dump()
        flat.update(flat.pop("features"))
        flat["name"] = hw.name
        flat["device_names"] = tuple(flat["device_names"])
        values = [(field, repr(flat[attr])) for attr, field, _, _ in HW_RECORD_FIELDS]
        out.append(
            {"name": hw.name, "source": hw.source.path, "vendor": hw.spec.vendor, "arch": hw.spec.arch, "values": values}
        )
    return out


def vendor_data(tree: SpecTree) -> list[dict[str, Any]]:
    return [
        {
            "name": v.name,
            "source": v.source.path,
            "display_name": v.spec.display_name,
            "arch_from": v.spec.arch_from,
            "name_words": v.spec.name_words,
            "default": v.spec.default,
            "hip": v.spec.hip,
        }
        for v in sorted(tree.vendors.values(), key=lambda v: v.name)
    ]


def config_files(tree: SpecTree, name: str) -> tuple[str, ...]:
    """The spec files a config draws on: its own (and inherited) files and its model's."""
    cfg = tree.config(name)
    paths = set(cfg.source.paths)
    if cfg.model:
        paths.add(tree.models[cfg.model].source.path)
    return tuple(sorted(paths))


def _instantiation(tree: SpecTree, vr: VariantResolution, inst: Instantiation) -> dict[str, Any]:
    data: dict[str, Any] = {
        "symbol": symbol(vr.variant, inst),
        "suffix": inst.suffix,
        "vendor": inst.vendor,
        "arch": inst.arch,
        "origin": policy_origin(vr, inst),
        "targets": target_list(tree, inst.targets),
        "target_names": inst.targets,
    }
    if inst.value.record is not None:
        data["record"] = dict(inst.value.record)
        data["values"] = [(k, repr(v)) for k, v in inst.value.record]
    if inst.value.buckets is not None:
        data["buckets"] = [
            {
                "index": i,
                "name": b.name,
                "note": comment_text(b.note),
                "bounds": [(x.dim, x.kind, x.value) for x in b.bounds],
                "record": dict(b.record),
                "values": [(k, repr(v)) for k, v in b.record],
            }
            for i, b in enumerate(inst.value.buckets)
        ]
    return data


def config_data(resolution: Resolution, name: str) -> dict[str, Any]:
    tree = resolution.tree
    cfg = tree.config(name)
    variants = {}
    for vr in resolution.for_config(name):
        insts = [_instantiation(tree, vr, inst) for inst in vr.instantiations]
        by_suffix = {i["suffix"]: i["symbol"] for i in insts}
        variants[vr.variant] = {
            "name": vr.variant,
            "params": dict(vr.params),
            "params_text": ", ".join(f"{k}={v!r}" for k, v in sorted(vr.params.items())),
            "names": [vr.variant] + sorted(a for a, v in cfg.aliases.items() if v == vr.variant),
            "n_targets": len(vr.resolved),
            "instantiations": insts,
            "table": [(t, by_suffix[vr.target_instantiation[t]]) for t in sorted(vr.target_instantiation)],
        }
    return {
        "name": cfg.name,
        "record": cfg.record,
        "doc": docstring_text(cfg.doc),
        "source": cfg.source.origin((cfg.name, "fields"))[0].path,  # the inherited fields' file
        "bucketed": cfg.bucketed,
        "dims": cfg.dims or (),
        "fields": [(n, f.type, comment_text(f.doc)) for n, f in cfg.fields.items()],
        "variants": variants,
        "files": config_files(tree, name),
    }


def detection_tables(tree: SpecTree) -> dict[str, Any]:
    """``device_names``: (pattern, spec name), longest first; ``by_arch``: ((vendor, arch), the
    first spec name of that arch in (vendor, arch, name) order)."""
    by_arch: dict[tuple[str, int], str] = {}
    for hw in tree.hardware:
        by_arch.setdefault((hw.spec.vendor, hw.spec.arch), hw.name)
    names = sorted(((dn, hw.name) for hw in tree.hardware for dn in hw.spec.device_names), key=lambda x: (-len(x[0]), x[0]))
    return {"device_names": names, "by_arch": sorted(by_arch.items())}


def base_context(resolution: Resolution, configs: tuple[str, ...]) -> dict[str, Any]:
    """Everything but ``header`` and ``module``: the same for every module but ``configs``."""
    tree = resolution.tree
    return {
        **detection_tables(tree),
        "hardware": hardware_data(tree),
        "hw_fields": [(field, pytype, comment_text(doc)) for _, field, pytype, doc in HW_RECORD_FIELDS],
        "vendors": vendor_data(tree),
        "configs": {name: config_data(resolution, name) for name in configs},
        "modules": [{"name": m.name, "doc": comment_text(m.spec.doc)} for m in tree.modules],
    }
