"""JSON Schemas of the spec files: every spec file names its schema and passes it; a bad file fails
it; `codegen check` keeps the schemas current like generated/."""

import functools
import json
import os
import tomllib

import jsonschema
import pytest

from codegen.schema import schema_for
from conftest import REPO, run_cli

SPEC_FILES = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "specs").rglob("*.toml"))


def _schema(rel: str) -> dict:
    return json.loads((REPO / schema_for(rel)).read_text())


@functools.lru_cache(maxsize=None)
def _validator(schema_path: str) -> jsonschema.Draft202012Validator:
    """A checked schema's validator, made once per schema (the spec files of a kind share one)."""
    schema = json.loads((REPO / schema_path).read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize("rel", SPEC_FILES)
def test_every_spec_file_names_its_schema_and_passes_it(rel):
    text = (REPO / rel).read_text()
    first = text.split("\n", 1)[0]
    expected = os.path.relpath(REPO / schema_for(rel), (REPO / rel).parent)
    assert first == f"#:schema {expected}", rel
    _validator(str(schema_for(rel))).validate(tomllib.loads(text))


@pytest.mark.parametrize(
    "rel, old, new, fragment",
    [
        ("specs/hardware/h200.toml", "warp_size = 32", 'warp_size = "32"', "'32' is not of type 'integer'"),
        ("specs/hardware/h200.toml", "sm_count = 132", "sm_cout = 132", "Additional properties are not allowed"),
        ("specs/kernels/matmul.toml", "block_m = 128\n", "blok_m = 128\n", "'blok_m' was unexpected"),
        (
            "specs/kernels/matmul.toml",
            'kernel = "grouped"',
            'kernel = "groupd"',
            "'groupd' is not valid under any of the given schemas",
        ),
        ("specs/kernels/transform.toml", "num_warps = {", "num_warps = { exp = 1, ", "'exp' was unexpected"),
        (
            "specs/models/qwen36.toml",
            "head_dim = 256",
            "head_dim = -256",
            "-256 is less than or equal to the minimum of 0",
        ),
    ],
    ids=["string for int", "misspelt key", "unknown field in a bucket", "not a choice", "bad rule", "negative"],
)
def test_a_bad_spec_file_fails_its_schema(rel, old, new, fragment):
    text = (REPO / rel).read_text()
    assert old in text
    bad = tomllib.loads(text.replace(old, new, 1))
    with pytest.raises(jsonschema.ValidationError) as exc:
        jsonschema.validate(bad, _schema(rel), cls=jsonschema.Draft202012Validator)
    assert fragment in str(exc.value) or any(fragment in str(e) for e in (exc.value.context or []))


def test_check_keeps_the_schemas_current(project):
    assert run_cli("--root", str(project), "check").code == 0
    cache = project / "specs/kernels/cache.toml"
    cache.write_text(
        cache.read_text().replace(
            'copy_block_size = { type = "int", doc = "', 'copy_block_size = { type = "int", doc = "Now: '
        )
    )
    result = run_cli("--root", str(project), "check")
    assert result.code == 1 and "stale: schemas/kernels/cache.schema.json" in result.out
    assert run_cli("--root", str(project), "schema").code == 0
    (project / "schemas/notes.json").write_text("{}\n")  # not ours: left alone
    assert "schemas/ is up to date" in run_cli("--root", str(project), "check").out
    assert (project / "schemas/notes.json").exists()


def test_check_trusts_the_schema_cache_only_for_the_bytes_it_recorded(project, tmp_path, monkeypatch):
    """`check` skips rendering the schemas when a cache entry for the same inputs records their
    hashes; a hand-edited schema is still stale, and so is one that changed inputs make old."""
    from codegen import schema

    monkeypatch.setenv("CODEGEN_CACHE_DIR", str(tmp_path / "cache"))
    assert run_cli("--root", str(project), "check").code == 0  # no entry: renders, records it
    assert len(list((tmp_path / "cache" / "schemas").glob("*.json"))) == 1

    def no_render(tree_inputs):
        raise AssertionError("rendered the schemas despite the cache entry")

    with monkeypatch.context() as m:
        m.setattr(schema, "render_inputs", no_render)
        assert run_cli("--root", str(project), "check").code == 0  # the entry proves them current
    path = project / "schemas/kernels/matmul.schema.json"
    path.write_text(path.read_text().replace('"type": "integer"', '"type": "number"', 1))
    result = run_cli("--root", str(project), "check")
    assert result.code == 1 and "stale: schemas/kernels/matmul.schema.json" in result.out
    diff = result.out.splitlines()
    assert any(line.startswith("-") and '"type": "number"' in line for line in diff)
    assert any(line.startswith("+") and '"type": "integer"' in line for line in diff)
    assert run_cli("--root", str(project), "schema").code == 0
    assert run_cli("--root", str(project), "check").code == 0
    # An entry that disagrees with a file is no verdict: the schemas are rendered and compared
    # byte for byte (current here), and the entry is written again.
    (entry,) = (tmp_path / "cache" / "schemas").glob("*.json")
    hashes = json.loads(entry.read_text())
    good, hashes["schemas/vendor.schema.json"] = hashes["schemas/vendor.schema.json"], "0" * 64
    entry.write_text(json.dumps(hashes))
    assert run_cli("--root", str(project), "check").code == 0
    assert json.loads(entry.read_text())["schemas/vendor.schema.json"] == good


def test_the_schema_cache_covers_what_the_schemas_read(project):
    """Every input the schemas depend on changes the cache key: a field's type, doc and choices
    and a config's bucket dimensions (rendered with and without each change, compared)."""
    from codegen import load, schema

    tree = load.load(project)
    base = schema.inputs(tree)
    key = schema.inputs_digest(base)
    stem, configs = next((s, c) for s, c in base.items() if any(dims for _, dims in c.values()))
    name, (fields, dims) = next((n, c) for n, c in configs.items() if c[1])
    fname, field = fields[0]
    changes = [
        field._replace(type="float" if field.type != "float" else "int"),
        field._replace(doc=field.doc + " (more)"),
        field._replace(choices=(1, 2)),
    ]
    variants = [((fname, f),) + fields[1:] for f in changes]
    trees = [dict(base, **{stem: dict(configs, **{name: (v, dims)})}) for v in variants]
    trees.append(dict(base, **{stem: dict(configs, **{name: (fields, dims[:-1])})}))
    rendered = schema.render_inputs(base)
    for changed in trees:
        assert schema.inputs_digest(changed) != key
        assert schema.render_inputs(changed) != rendered  # the key changed because the bytes do
