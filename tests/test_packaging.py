"""`pip install .` (not editable) gives a working codegen: the wheel carries the templates and the
runtime, and builds a copy of this repository's spec tree into the same bytes."""

import os
import shutil
import subprocess
import sys
import zipfile

from conftest import REPO, snapshot


def test_the_wheel_carries_templates_and_runtime_and_builds_this_tree(tmp_path):
    dist = tmp_path / "dist"
    command = [sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps", "-q", "-w", str(dist)]
    # With the environment's setuptools when it can build wheels (no download), else pip's isolated build.
    proc = subprocess.run(command + ["--no-build-isolation"], capture_output=True, text=True)
    if proc.returncode != 0:
        proc = subprocess.run(command, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    (wheel,) = dist.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for template in sorted((REPO / "templates").iterdir()):
        if template.suffix in (".j2", ".py"):
            assert f"codegen_templates/{template.name}" in names, template.name
    assert "policy_runtime/detect.py" in names and "codegen/cli.py" in names

    site = tmp_path / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    root = tmp_path / "copy"
    shutil.copytree(REPO / "specs", root / "specs")
    env = dict(os.environ, PYTHONPATH=str(site))
    where = subprocess.run(
        [
            sys.executable,
            "-c",
            "import codegen, codegen.render as r; print(codegen.__file__); print(r.packaged_templates())",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert where.returncode == 0, where.stderr
    assert all(line.startswith(str(site)) for line in where.stdout.split()), where.stdout
    build = subprocess.run(
        [sys.executable, "-m", "codegen", "--root", str(root), "build"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stderr
    built = {k: v[0] for k, v in snapshot(root / "generated").items()}
    assert built == {k: v[0] for k, v in snapshot(REPO / "generated").items()}
