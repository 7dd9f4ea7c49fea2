"""JSON Schemas of the spec files: every spec file names its schema and passes it; a bad file fails
it; `codegen check` keeps the schemas current like generated/."""

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


@pytest.mark.parametrize("rel", SPEC_FILES)
def test_every_spec_file_names_its_schema_and_passes_it(rel):
    text = (REPO / rel).read_text()
    first = text.split("\n", 1)[0]
    expected = os.path.relpath(REPO / schema_for(rel), (REPO / rel).parent)
    assert first == f"#:schema {expected}", rel
    schema = _schema(rel)
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(tomllib.loads(text), schema, cls=jsonschema.Draft202012Validator)


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
