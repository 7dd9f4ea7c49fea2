"""Adding a target never renames a generated symbol whose values did not change.

The trees are rendered in memory (load, resolve, render: the source black would format, not
formatted), since the names are fixed before formatting; the committed generated/ shows that the
symbols read from that source are those of the formatted files."""

import re
import shutil

from conftest import REPO

from codegen import pipeline

# Module-level names bound to values (not the per-target constants NAME = HARDWARE["name"]).
SYMBOL = re.compile(r"^(_?[A-Za-z][A-Za-z0-9_]*) = (?!HARDWARE\[)", re.M)
KERNEL = re.compile(r"^def (_mm_[a-z0-9_]+)\(", re.M)


MODULES = ("dispatch.py", "matmul.py", "transform.py", "cache.py")


def _rendered(root) -> dict[str, str]:
    """Every generated file's source as build would hand it to black."""
    return {path: f.source for path, f in pipeline.run(root).files.items()}


def _symbols_of(texts: dict[str, str]) -> dict[str, set[str]]:
    return {name: set(SYMBOL.findall(texts[name])) | set(KERNEL.findall(texts[name])) for name in MODULES}


def _symbols(root) -> dict[str, set[str]]:
    return _symbols_of(_rendered(root))


def _names_target(dispatch: str, target: str) -> bool:
    """dispatch.py's tables have a key for ``target`` (either quote: black normalizes them)."""
    return f'"{target}": ' in dispatch or f"'{target}': " in dispatch


def test_the_rendered_source_has_the_formatted_files_symbols():
    committed = {name: (REPO / "generated" / name).read_text() for name in MODULES}
    assert _symbols(REPO) == _symbols_of(committed)


def _copy(tmp_path, name):
    root = tmp_path / name
    shutil.copytree(REPO / "specs", root / "specs")
    return root


def _h200_like(part="h200", **changes) -> str:
    text = (REPO / f"specs/hardware/{part}.toml").read_text()
    for key, value in changes.items():
        text = re.sub(rf"^{key} = .*$", f"{key} = {value}", text, count=1, flags=re.M)
    return text


def test_adding_targets_renames_nothing_whose_values_did_not_change(tmp_path):
    before = _symbols(REPO)
    cases = {
        # Same arch as h200, other SM count: new groups wherever a rule reads sm_count.
        "h200_cut.toml": _h200_like(sm_count=114, device_names='["H200 CUT"]'),
        # Same values as h200: joins its groups.
        "h200_twin.toml": _h200_like(device_names='["H200 TWIN"]'),
        # A new arch above every NVIDIA spec.
        "next.toml": _h200_like(arch=130, device_names='["NEXT"]'),
        # Two parts in one build (one build less for the suite): an arch below every NVIDIA spec
        # (Turing, sm_75: no async copy), served by base policies, which joins groups whose lowest
        # arch was 80 and becomes their lowest; and a gfx90a part (arch 910) below the MI300X (942),
        # joining AMD's groups.
        "t4ish.toml": _h200_like("a10", arch=75, device_names='["T4ISH"]', async_copy="false"),
    }
    extra = {"t4ish.toml": {"mi250x.toml": _h200_like("mi300x", arch=910, device_names='["MI250X"]')}}
    for file, text in cases.items():
        root = _copy(tmp_path, file.removesuffix(".toml"))
        (root / "specs/hardware" / file).write_text(text)
        for other, other_text in extra.get(file, {}).items():
            (root / "specs/hardware" / other).write_text(other_text)
        texts = _rendered(root)
        after = _symbols_of(texts)
        for module, names in before.items():
            lost = names - after[module]
            assert not lost, (file, module, sorted(lost)[:5])
        if file == "h200_cut.toml":
            # Rules that read sm_count give it records of its own, under new names.
            assert any(after[m] - before[m] for m in before), file
        elif file == "t4ish.toml":
            # The lower archs lead existing groups now: the comments say so, the names stay.
            text = texts["dispatch.py"]
            for lowest in ("nvidia 75", "amd 910"):
                assert f"; lowest arch {lowest}." in text, lowest
            assert _names_target(text, "mi250x")
        elif file == "next.toml":
            # The new arch's records equal existing ones (the nvidia>=120 policy's, with h200's
            # shared memory) and join their groups, but for the fp8 decode tiles: their Hopper
            # policy stops at sm_90 (max_arch), so the new part takes the base's records with
            # h200's values, which no target of the committed specs has.
            new = {m: after[m] - before[m] for m in before}
            assert all(not names for m, names in new.items() if m != "dispatch.py"), new
            assert new["dispatch.py"] and all(
                re.fullmatch(r"DECODE_D(128|256)_FP8_NVIDIA_[0-9A-F]{6}", n) for n in new["dispatch.py"]
            ), new["dispatch.py"]
        else:
            # h200's twin joins h200's groups: no new name at all.
            assert after == before, file
        target = file.removesuffix(".toml")
        assert _names_target(texts["dispatch.py"], target)


def test_a_symbol_changes_name_when_its_own_values_change(tmp_path):
    before = _symbols(REPO)["dispatch.py"]
    changed = _copy(tmp_path, "changed")
    cache = changed / "specs/kernels/cache.toml"
    cache.write_text(
        cache.read_text().replace("min(256, hw.max_threads_per_block)", "min(128, hw.max_threads_per_block)")
    )
    after = _symbols(changed)["dispatch.py"]
    assert {s for s in before - after if s.startswith("CACHE_")}
    assert not {s for s in before - after if not s.startswith("CACHE_")}


def test_adding_a_field_with_a_default_renames_nothing(tmp_path):
    """A record field added with a literal default that every policy keeps leaves every name as
    it was (the digest leaves fields at their literal defaults out); a policy that sets it to
    another value renames that record's instantiations alone."""
    before = _symbols(REPO)
    root = _copy(tmp_path, "field")
    spec = root / "specs/kernels/cache.toml"
    text = spec.read_text()
    fields = re.search(r"^\[([a-z_]+)\.fields\]\n", text, re.M)
    assert fields, "cache.toml declares a record's fields"
    config = fields.group(1)
    added = 'probe_flag = { type = "bool", default = false, doc = "A field added for the test." }\n'
    text = text[: fields.end()] + added + text[fields.end() :]
    spec.write_text(text)
    after = _symbols(root)
    assert after == before
    # Set on the config's base (every target of the record): its names change, no other record's.
    base = re.search(rf"^\[{config}\.base\]\n", text, re.M)
    assert base, f"{config} has a base policy"
    spec.write_text(text[: base.end()] + "probe_flag = true\n" + text[base.end() :])
    moved = _symbols(root)["dispatch.py"]
    gone = before["dispatch.py"] - moved
    assert gone and moved - before["dispatch.py"]
    assert all(re.fullmatch(r"CACHE_[A-Z]+_[0-9A-F]{6}", s) for s in gone), sorted(gone)[:5]
