"""The project is type-checked: mypy over codegen/ (the compiler), policy_runtime/ (the
hand-written runtime) and generated/ (what the compiler writes), with pyproject.toml's [tool.mypy]
settings.  A wrong annotation in the code users import misleads every IDE and type checker of a
project that calls these kernels; in the compiler it hides the None a path forgot."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import REPO

pytest.importorskip("mypy", reason="mypy comes with the test extra (pip install -e '.[test]')")


def test_the_compiler_the_runtime_and_the_generated_modules_type_check(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "mypy"), "codegen", "policy_runtime", "generated"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "Success: no issues found" in proc.stdout
