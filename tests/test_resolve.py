"""Chaining, rule evaluation, per-target validation and collapse, on small spec trees."""

from pathlib import Path

import pytest

from codegen import load, resolve
from codegen.errors import SpecErrors

from conftest import hw_toml, make_tree

TILE = """
[tile]
record = "TileConfig"
doc = "A test config."
models = ["m"]
variants = {{ tile = {{ dtype_bytes = 2 }} }}

[tile.fields]
block = {{ type = "int", doc = "rows" }}
stages = {{ type = "int", doc = "pipeline depth" }}

[tile.derived]
smem_bytes = "block * model.head_dim * dtype_bytes * stages"

[[tile.checks]]
name = "fits shared memory"
rule = "smem_bytes <= hw.max_shared_memory_per_block_optin"
message = "needs {{smem_bytes:,}} B; {{hw.name}} allows {{hw.max_shared_memory_per_block_optin:,}} B"

{policies}
"""


def policy(vendor, min_arch, block, stages=1, max_arch=None):
    extra = f"\nmax_arch = {max_arch}" if max_arch is not None else ""
    return f"""
[[tile.policy]]
vendor = "{vendor}"
min_arch = {min_arch}{extra}
block = {block}
stages = {stages}
"""


SMALL = 101376  # 8.6/8.9/12.x opt-in shared memory per block
LARGE = 232448  # 9.0/10.0


def resolve_tree(tmp_path: Path, hardware: dict, policies: str, kernel: str = TILE):
    make_tree(tmp_path, hardware, {"tile": kernel.format(policies=policies)})
    return resolve.resolve(load.load(tmp_path))


def lead(inst, vr=None) -> str:
    """An instantiation's vendor and lowest arch (``inst`` or the suffix of one of ``vr``'s); its
    name is the vendor and a digest of its values, with no arch."""
    if isinstance(inst, str):
        (inst,) = [i for i in vr.instantiations if i.suffix == inst]
    vendor, digest = inst.suffix.rsplit("_", 1)
    assert vendor == inst.vendor and len(digest) == 6 and int(digest, 16) >= 0, inst.suffix
    return f"{inst.vendor}{inst.arch}"


def by_target(res):
    (vr,) = res.variants
    return vr, {t: dict(r.record) for t, r in vr.resolved.items()}


def test_chaining_takes_largest_threshold_not_above_arch(tmp_path):
    hardware = {n: hw_toml("nvidia", a, optin=LARGE) for n, a in [("p80", 80), ("p86", 86), ("p90", 90), ("p100", 100)]}
    res = resolve_tree(tmp_path, hardware, policy("nvidia", 80, 16) + policy("nvidia", 90, 32))
    vr, values = by_target(res)
    assert {t: v["block"] for t, v in values.items()} == {"p80": 16, "p86": 16, "p90": 32, "p100": 32}
    assert vr.resolved["p100"].policy.label == "nvidia>=90"


def test_vendors_never_mix(tmp_path):
    hardware = {"ilu": hw_toml("iluvatar", 100, optin=LARGE), "nv": hw_toml("nvidia", 100, optin=LARGE)}
    res = resolve_tree(tmp_path, hardware, policy("iluvatar", 100, 16) + policy("nvidia", 80, 32))
    vr, values = by_target(res)
    assert values["ilu"]["block"] == 16 and values["nv"]["block"] == 32
    # Even with equal values the two vendors keep separate instantiations.
    res = resolve_tree(tmp_path, hardware, policy("iluvatar", 100, 16) + policy("nvidia", 80, 16))
    vr, _ = by_target(res)
    assert [i.suffix.rsplit("_", 1)[0] for i in vr.instantiations] == ["iluvatar", "nvidia"]


def test_below_every_threshold_is_an_error_naming_target_and_thresholds(tmp_path):
    hardware = {"old": hw_toml("nvidia", 75, optin=65536), "new": hw_toml("nvidia", 90, optin=LARGE)}
    with pytest.raises(SpecErrors) as exc:
        resolve_tree(tmp_path, hardware, policy("nvidia", 80, 16))
    (p,) = exc.value.problems
    text = p.render()
    assert p.file == "specs/kernels/tile.toml"
    assert "target old" in text and "arch 75 is below every nvidia threshold (80)" in text


def test_base_policy_serves_targets_below_every_threshold(tmp_path):
    hardware = {"old": hw_toml("nvidia", 75, optin=65536), "new": hw_toml("nvidia", 90, optin=LARGE)}
    base = "\n[tile.base]\nblock = 8\nstages = 1\n"
    res = resolve_tree(tmp_path, hardware, policy("nvidia", 80, 16) + base)
    vr, values = by_target(res)
    assert values == {"old": {"block": 8, "stages": 1}, "new": {"block": 16, "stages": 1}}
    assert vr.resolved["old"].policy.label == "base"


def test_max_arch_stops_chaining(tmp_path):
    hardware = {"p90": hw_toml("nvidia", 90, optin=LARGE), "p100": hw_toml("nvidia", 100, optin=LARGE)}
    with pytest.raises(SpecErrors) as exc:
        resolve_tree(tmp_path, hardware, policy("nvidia", 90, 32, max_arch=90))
    assert "target p100" in str(exc.value) and "stops at max_arch 90" in str(exc.value)
    base = "\n[tile.base]\nblock = 8\nstages = 1\n"
    _, values = by_target(resolve_tree(tmp_path, hardware, policy("nvidia", 90, 32, max_arch=90) + base))
    assert values["p90"]["block"] == 32 and values["p100"]["block"] == 8


def test_policy_from_80_overflowing_an_89_is_an_error_naming_both(tmp_path):
    hardware = {"p80": hw_toml("nvidia", 80, optin=166912), "p89": hw_toml("nvidia", 89, optin=SMALL, per_sm=102400)}
    # 128 rows x 256 x 2 B x 2 stages = 131,072 B: fits the 80's 166,912 B, not the 89's 101,376 B.
    with pytest.raises(SpecErrors) as exc:
        resolve_tree(tmp_path, hardware, policy("nvidia", 80, 128, stages=2))
    (p,) = exc.value.problems
    text = p.render()
    assert p.file == "specs/kernels/tile.toml" and p.line is not None
    assert "policy nvidia>=80 on target p89" in text and "specs/hardware/p89.toml" in text
    assert "needs 131,072 B; p89 allows 101,376 B" in text
    assert "smem_bytes = 131,072 > hw.max_shared_memory_per_block_optin = 101,376" in text
    assert "p80" not in text.replace("specs/hardware/p89", "")


def test_non_adjacent_equal_policies_collapse_to_lowest_arch(tmp_path):
    # 2 stages x 256 x 2 B per row: 128 rows (131,072 B) on 80/90/100, 64 rows on 86/89/120 (101,376 B):
    # equal by value, not neighbours.
    hardware = {
        "p80": hw_toml("nvidia", 80, optin=166912),
        "p86": hw_toml("nvidia", 86, optin=SMALL, per_sm=102400),
        "p89": hw_toml("nvidia", 89, optin=SMALL, per_sm=102400),
        "p90": hw_toml("nvidia", 90, optin=LARGE),
        "p100": hw_toml("nvidia", 100, optin=LARGE),
        "p120": hw_toml("nvidia", 120, optin=SMALL, per_sm=102400),
    }
    rule = """
[[tile.policy]]
vendor = "nvidia"
min_arch = 80
block = { largest = [128, 64, 32], where = "block * model.head_dim * dtype_bytes * stages <= hw.max_shared_memory_per_block_optin" }
stages = 2
"""
    vr, values = by_target(resolve_tree(tmp_path, hardware, rule))
    assert {t: v["block"] for t, v in values.items()} == {
        "p80": 128,
        "p86": 64,
        "p89": 64,
        "p90": 128,
        "p100": 128,
        "p120": 64,
    }
    groups = {lead(i): i.targets for i in vr.instantiations}
    assert groups == {"nvidia80": ("p80", "p90", "p100"), "nvidia86": ("p86", "p89", "p120")}
    assert lead(vr.target_instantiation["p120"], vr) == "nvidia86"


def test_equal_records_from_different_policies_collapse(tmp_path):
    hardware = {n: hw_toml("nvidia", a, optin=LARGE) for n, a in [("p80", 80), ("p90", 90), ("p100", 100)]}
    res = resolve_tree(
        tmp_path, hardware, policy("nvidia", 80, 16) + policy("nvidia", 90, 32) + policy("nvidia", 100, 16)
    )
    vr, _ = by_target(res)
    groups = {lead(i): (i.targets, i.policies) for i in vr.instantiations}
    assert groups == {
        "nvidia80": (("p80", "p100"), ("nvidia>=80", "nvidia>=100")),
        "nvidia90": (("p90",), ("nvidia>=90",)),
    }


def test_same_lowest_arch_groups_get_distinct_names(tmp_path):
    hardware = {"big": hw_toml("nvidia", 90, optin=LARGE), "small": hw_toml("nvidia", 90, optin=SMALL, per_sm=102400)}
    rule = """
[[tile.policy]]
vendor = "nvidia"
min_arch = 90
block = { largest = [128, 64, 32], where = "block * model.head_dim * dtype_bytes * stages <= hw.max_shared_memory_per_block_optin" }
stages = 2
"""
    vr, _ = by_target(resolve_tree(tmp_path, hardware, rule))
    names = {vr.target_instantiation["big"], vr.target_instantiation["small"]}
    assert len(names) == 2 and {lead(n, vr) for n in names} == {"nvidia90"}


def test_rule_with_no_satisfying_candidate_is_an_error(tmp_path):
    hardware = {"tiny": hw_toml("nvidia", 80, optin=49152, per_sm=49152)}
    rule = """
[[tile.policy]]
vendor = "nvidia"
min_arch = 80
block = { largest = [256, 128], where = "block * model.head_dim * dtype_bytes * stages <= hw.max_shared_memory_per_block_optin" }
stages = 1
"""
    with pytest.raises(SpecErrors) as exc:
        resolve_tree(tmp_path, hardware, rule)
    text = str(exc.value)
    assert "specs/kernels/tile.toml:" in text and "tile.policy[0].block" in text
    assert "no candidate for 'block' in [256, 128]" in text
    assert (
        "block * model.head_dim * dtype_bytes * stages = 65,536 > hw.max_shared_memory_per_block_optin = 49,152" in text
    )


def test_rules_evaluate_in_dependency_order_and_cycles_are_errors(tmp_path):
    hardware = {"p80": hw_toml("nvidia", 80, optin=LARGE)}
    ok = """
[[tile.policy]]
vendor = "nvidia"
min_arch = 80
block = { expr = "stages * 16" }
stages = { expr = "2 if hw.async_copy else 1" }
"""
    _, values = by_target(resolve_tree(tmp_path, hardware, ok))
    assert values["p80"] == {"block": 32, "stages": 2}
    cycle = ok.replace('"2 if hw.async_copy else 1"', '"block // 16"')
    with pytest.raises(SpecErrors, match="cycle: block -> stages -> block"):
        resolve_tree(tmp_path, hardware, cycle)


def test_rule_result_type_is_checked(tmp_path):
    hardware = {"p80": hw_toml("nvidia", 80, optin=LARGE)}
    bad = policy("nvidia", 80, 16).replace("block = 16", 'block = { expr = "hw.sm_count / 3" }')
    with pytest.raises(SpecErrors, match="gave a float; the field is int"):
        resolve_tree(tmp_path, hardware, bad)


RATIO_TILE = TILE.replace(
    'stages = {{ type = "int"', 'ratio = {{ type = "float", doc = "a float field" }}\nstages = {{ type = "int"'
)


def test_a_float_field_must_be_finite(tmp_path):
    """Generated Python has no literal for nan or inf: a literal is rejected at load, a rule
    result (1e308 * 10 is inf) when resolved, both at the value's key."""
    hardware = {"p80": hw_toml("nvidia", 80, optin=LARGE)}
    with pytest.raises(SpecErrors) as exc:
        resolve_tree(tmp_path, hardware, policy("nvidia", 80, 16) + "ratio = nan\n", RATIO_TILE)
    (p,) = exc.value.problems
    assert p.keypath == ("tile", "policy", 0, "ratio") and "nan and inf are not allowed" in p.rule
    with pytest.raises(SpecErrors) as exc:
        resolve_tree(tmp_path, hardware, policy("nvidia", 80, 16) + 'ratio = { expr = "1e308 * 10" }\n', RATIO_TILE)
    (p,) = exc.value.problems
    assert p.keypath == ("tile", "policy", 0, "ratio") and p.line is not None
    assert "rule for 'ratio' gave inf; a field's value must be finite" in p.rule
    _, values = by_target(resolve_tree(tmp_path, hardware, policy("nvidia", 80, 16) + "ratio = 0.5\n", RATIO_TILE))
    assert values["p80"]["ratio"] == 0.5


def test_rules_see_exactly_the_attributes_load_accepts(tmp_path):
    """One definition of what ``hw.*`` and ``model.*`` hold: a rule reading anything else
    (such as a display name) is rejected at load, with its key, rather than failing later."""
    hardware = {"p80": hw_toml("nvidia", 80, optin=LARGE)}
    for attr in ("hw.display_name", "model.display_name", "hw.device_names"):
        bad = policy("nvidia", 80, 16).replace("block = 16", f'block = {{ expr = "16 if {attr} else 8" }}')
        make_tree(tmp_path, hardware, {"tile": TILE.format(policies=bad)})
        with pytest.raises(SpecErrors) as exc:
            load.load(tmp_path)
        (p,) = exc.value.problems
        assert p.keypath == ("tile", "policy", 0, "block", "expr")
        assert f"'{attr}' is not a" in p.rule


def extends_tile(name: str, dtype_bytes: int) -> str:
    """A config that extends TILE's ``tile`` and sets only its identity."""
    return f"""
[{name}]
record = "{name.title()}Config"
doc = "Extends tile."
extends = "tile"
variants = {{ {name} = {{ dtype_bytes = {dtype_bytes} }} }}
"""


def test_extends_inherits_unset_keys_and_keeps_set_ones(tmp_path):
    """A config with ``extends`` takes the parent's fields, derived values, checks and policies
    (here from another file); a key it sets itself replaces the inherited one whole."""
    hardware = {"a100": hw_toml("nvidia", 80, optin=LARGE), "h100": hw_toml("nvidia", 90, optin=LARGE)}
    child = extends_tile("copy", 4) + extends_tile("own", 2) + policy("nvidia", 80, 16).replace("tile.", "own.")
    parent = TILE.format(policies=policy("nvidia", 80, 64, stages=2) + policy("nvidia", 90, 32, stages=3))
    make_tree(tmp_path, hardware, {"tile": parent, "zchild": child})
    res = resolve.resolve(load.load(tmp_path))
    got = {vr.variant: {t: dict(r.record) for t, r in vr.resolved.items()} for vr in res.variants}
    assert got["copy"] == got["tile"] == {"a100": {"block": 64, "stages": 2}, "h100": {"block": 32, "stages": 3}}
    assert got["own"] == {"a100": {"block": 16, "stages": 1}, "h100": {"block": 16, "stages": 1}}
    tree = load.load(tmp_path)
    copy = tree.config("copy")
    # The inherited check runs with the child's parameters, and locates itself in the parent's file.
    assert [c.spec.name for c in copy.checks] == ["fits shared memory"]
    assert copy.source.paths == ("specs/kernels/tile.toml", "specs/kernels/zchild.toml")
    assert copy.source.where(copy.policies[0].keypath).startswith("specs/kernels/tile.toml:")
    assert (
        tree.config("own").source.where(tree.config("own").policies[0].keypath).startswith("specs/kernels/zchild.toml:")
    )


def test_inherited_check_uses_the_childs_parameters(tmp_path):
    """The parent's policy fits with 2-byte elements (64 x 256 x 2 B = 32 KiB); a child resolving
    it for 8-byte ones (128 KiB > 99 KiB) fails the inherited check, reported at the parent's
    policy and naming the child."""
    hardware = {"a100": hw_toml("nvidia", 80, optin=SMALL)}
    parent = TILE.format(policies=policy("nvidia", 80, 64, stages=1))
    child = extends_tile("wide", 8)
    make_tree(tmp_path, hardware, {"tile": parent, "wide": child})
    with pytest.raises(SpecErrors) as exc:
        resolve.resolve(load.load(tmp_path))
    (p,) = exc.value.problems
    assert p.file == "specs/kernels/tile.toml" and p.keypath[:2] == ("tile", "policy")
    assert "fails check 'fits shared memory'" in p.rule and "(inherited by wide)" in p.rule


def test_extends_chains_take_each_key_from_the_nearest_definer(tmp_path):
    """c extends b extends tile: b sets its own policies, so c takes b's policies and tile's
    fields and checks."""
    hardware = {"a100": hw_toml("nvidia", 80, optin=LARGE)}
    parent = TILE.format(policies=policy("nvidia", 80, 64, stages=2))
    middle = extends_tile("b", 2) + policy("nvidia", 80, 32).replace("tile.", "b.")
    last = extends_tile("c", 2).replace('extends = "tile"', 'extends = "b"')
    make_tree(tmp_path, hardware, {"tile": parent, "b": middle, "c": last})
    res = resolve.resolve(load.load(tmp_path))
    got = {vr.variant: dict(vr.resolved["a100"].record) for vr in res.variants}
    assert got == {"tile": {"block": 64, "stages": 2}, "b": {"block": 32, "stages": 1}, "c": {"block": 32, "stages": 1}}
    c = load.load(tmp_path).config("c")
    assert c.source.where(c.policies[0].keypath).startswith("specs/kernels/b.toml:")
    assert c.source.paths == ("specs/kernels/b.toml", "specs/kernels/c.toml", "specs/kernels/tile.toml")


CHAINED = """
[c]
record = "C"
doc = "chaining test"
models = ["m"]
variants = {{ c = {{ dtype_bytes = 2 }} }}

[c.fields]
block = {{ type = "int", doc = "rows" }}
stages = {{ type = "int", doc = "depth" }}
waves = {{ type = "int", doc = "programs", default = {{ expr = "hw.sm_count * 2" }} }}

[c.derived]
smem_bytes = "block * model.head_dim * dtype_bytes * stages"

{policies}
"""


def chained(tmp_path, hardware, policies):
    make_tree(tmp_path, hardware, {"c": CHAINED.format(policies=policies)})
    return by_target(resolve.resolve(load.load(tmp_path)))


def test_a_policy_states_only_what_differs_from_the_policy_it_chains_from(tmp_path):
    hardware = {"a": hw_toml("nvidia", 80, optin=LARGE), "h": hw_toml("nvidia", 90, optin=LARGE)}
    _, values = chained(
        tmp_path,
        hardware,
        """
[c.base]
block = 16
stages = 1
[[c.policy]]
vendor = "nvidia"
min_arch = 80
stages = 2
[[c.policy]]
vendor = "nvidia"
min_arch = 90
block = 64
""",
    )
    # 90 chains from 80 (stages 2), which chains from base (block 16); waves is the field default.
    assert values["a"] == {"block": 16, "stages": 2, "waves": 200}
    assert values["h"] == {"block": 64, "stages": 2, "waves": 200}


def test_a_pick_may_read_a_derived_value_of_the_candidate(tmp_path):
    hardware = {"big": hw_toml("nvidia", 90, optin=LARGE), "small": hw_toml("nvidia", 86, optin=SMALL, per_sm=102400)}
    _, values = chained(
        tmp_path,
        hardware,
        """
[[c.policy]]
vendor = "nvidia"
min_arch = 80
stages = 2
block = { largest = [256, 128, 64], where = "smem_bytes <= hw.max_shared_memory_per_block_optin" }
""",
    )
    # 2 stages x 256 x 2 B per row: 128 rows fit 227 KB (131,072 B; 256 rows need 262,144), 64 fit 99 KB.
    assert values["big"]["block"] == 128 and values["small"]["block"] == 64


def test_a_policy_may_be_limited_to_named_targets(tmp_path):
    hardware = {
        "h100": hw_toml("nvidia", 90, optin=LARGE),
        "h200": hw_toml("nvidia", 90, optin=LARGE, device_names='["H200X"]'),
    }
    vr, values = chained(
        tmp_path,
        hardware,
        """
[[c.policy]]
vendor = "nvidia"
min_arch = 90
block = 32
stages = 2
[[c.policy]]
vendor = "nvidia"
min_arch = 90
targets = ["h200"]
note = "tuned on the H200"
block = 64
""",
    )
    assert values["h100"]["block"] == 32 and values["h200"] == {"block": 64, "stages": 2, "waves": 200}
    assert vr.resolved["h200"].policy.label == "nvidia>=90[h200]"


def test_a_target_list_names_parts_of_the_policys_vendor(tmp_path):
    hardware = {"h": hw_toml("nvidia", 90, optin=LARGE), "i": hw_toml("iluvatar", 100, optin=LARGE)}
    make_tree(
        tmp_path,
        hardware,
        {
            "c": CHAINED.format(
                policies='[c.base]\nblock = 1\nstages = 1\n[[c.policy]]\nvendor = "nvidia"\nmin_arch = 90\n'
                'targets = ["i", "nope"]\nblock = 2\n'
            )
        },
    )
    with pytest.raises(SpecErrors) as exc:
        load.load(tmp_path)
    text = str(exc.value)
    assert "c.policy[0].targets[0]: target is a iluvatar part; this policy is for nvidia (got 'i')" in text
    assert "c.policy[0].targets[1]: no such hardware spec" in text


def test_a_field_no_policy_in_the_chain_sets_is_an_error_naming_the_target(tmp_path):
    hardware = {"h": hw_toml("nvidia", 90, optin=LARGE)}
    make_tree(
        tmp_path,
        hardware,
        {"c": CHAINED.format(policies='[[c.policy]]\nvendor = "nvidia"\nmin_arch = 80\nblock = 8\n')},
    )
    with pytest.raises(SpecErrors) as exc:
        resolve.resolve(load.load(tmp_path))
    text = str(exc.value)
    assert "policy nvidia>=80 on target h" in text and "no value for field(s) stages of C" in text


def test_the_records_between_stages_are_frozen_all_the_way_down():
    """Every record the load and resolve stages pass on holds only immutable values: frozen
    dataclasses, frozen pydantic specs, tuples, FrozenMaps, scalars (a rule's parsed syntax tree
    aside, which the rule module owns and never changes)."""
    import ast
    import dataclasses

    from pydantic import BaseModel

    from codegen import pipeline
    from codegen.records import FrozenMap

    from conftest import REPO

    res = pipeline.run(REPO, until="tree_to_resolution")
    seen: set[int] = set()

    def walk(value, where):
        if id(value) in seen or isinstance(value, (str, int, float, bool, type(None), Path, ast.AST)):
            return
        seen.add(id(value))
        assert not isinstance(value, (dict, list, set, bytearray)), where
        if dataclasses.is_dataclass(value):
            assert type(value).__dataclass_params__.frozen, where
            for f in dataclasses.fields(value):
                walk(getattr(value, f.name), f"{where}.{f.name}")
        elif isinstance(value, BaseModel):
            assert value.model_config.get("frozen"), where
            for name in type(value).model_fields:
                walk(getattr(value, name), f"{where}.{name}")
        elif isinstance(value, FrozenMap):
            for k, v in value.items():
                walk(v, f"{where}[{k!r}]")
        elif isinstance(value, (tuple, frozenset)):
            for i, v in enumerate(value):
                walk(v, f"{where}[{i}]")
        else:
            raise AssertionError(f"{where}: unexpected {type(value).__name__}")

    walk(res, "resolution")
    assert len(seen) > 1000
