"""`pip install .` (not editable) gives a working codegen, used from outside this checkout.

The wheel is built from the checkout and installed into a fresh virtual environment; every command
then runs there from an unrelated directory, with no PYTHONPATH and nothing of the checkout on the
path.  The test asserts where codegen, its templates and policy_runtime were imported from, so an
editable install or the checkout leaking in fails it.  To stay cheap (no download, no second copy
of torch), the fresh environment sees the dependencies' own folders through a .pth file written
after the wheel is installed; a folder holding any of the project's packages is refused.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from conftest import REPO, snapshot

PACKAGES = ("codegen", "policy_runtime", "codegen_templates", "generated")
COMPILER_DEPS = ("jinja2", "markupsafe", "pydantic", "pydantic_core", "black", "tomlkit", "rich")
KERNEL_DEPS = ("torch", "triton", "numpy")
COMMANDS = ("build", "check", "schema", "show", "explain", "tune")


def _packages_in_checkout() -> list[str]:
    """Every package of the source tree, found by walking it (not by asking setuptools)."""
    out = []
    for top in ("codegen", "policy_runtime"):
        for init in sorted((REPO / top).rglob("__init__.py")):
            if "__pycache__" not in init.parts:
                out.append(init.parent.relative_to(REPO).as_posix())
    return out


def _dep_folders() -> list[Path]:
    """The folders the dependencies are imported from in this interpreter."""
    folders = []
    for name in COMPILER_DEPS + KERNEL_DEPS:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            continue
        folder = Path(spec.origin).resolve().parent.parent
        if folder not in folders:
            folders.append(folder)
    return folders


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(python, codegen script, environment, work dir): the wheel installed in a fresh venv."""
    tmp = tmp_path_factory.mktemp("wheel")
    dist = tmp / "dist"
    command = [sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps", "-q", "-w", str(dist)]
    # With the environment's setuptools when it can build wheels (no download), else pip's isolated build.
    proc = subprocess.run(command + ["--no-build-isolation"], capture_output=True, text=True)
    if proc.returncode != 0:
        proc = subprocess.run(command, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    (wheel,) = dist.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for package in _packages_in_checkout():
        assert f"{package}/__init__.py" in names, f"{package} is not in the wheel"
    for source in sorted((REPO / "codegen").rglob("*.py")) + sorted((REPO / "policy_runtime").rglob("*.py")):
        assert source.relative_to(REPO).as_posix() in names, source
    # PEP 561's marker: type checkers read the runtime's annotations from the installed package.
    assert "policy_runtime/py.typed" in names, "policy_runtime/py.typed is not in the wheel"
    for template in sorted((REPO / "templates").iterdir()):
        if template.suffix in (".j2", ".py"):
            assert f"codegen_templates/{template.name}" in names, template.name

    venv = tmp / "venv"
    proc = subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    bindir = venv / ("Scripts" if os.name == "nt" else "bin")
    python = bindir / ("python.exe" if os.name == "nt" else "python")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    # Only now (pip saw an empty environment): the dependencies' folders, none holding our packages.
    folders = _dep_folders()
    for folder in folders:
        assert folder != REPO and not any((folder / p).exists() for p in PACKAGES), folder
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], capture_output=True, text=True
    ).stdout.strip()
    (Path(purelib) / "_test_dependencies.pth").write_text("".join(f"{f}\n" for f in folders))

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    env["PYTHONNOUSERSITE"] = "1"
    work = tmp / "elsewhere"
    work.mkdir()
    where = subprocess.run(
        [
            str(python),
            "-c",
            "import sys, codegen, policy_runtime, codegen.render as r, codegen.tune.cli;"
            "print(codegen.__file__); print(policy_runtime.__file__); print(r.packaged_templates());"
            "print(repr(sys.path))",
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
    )
    assert where.returncode == 0, where.stderr
    lines = where.stdout.splitlines()
    assert all(Path(line).resolve().is_relative_to(venv.resolve()) for line in lines[:3]), where.stdout
    # Nothing of the checkout on the path: neither it nor a folder in it, except the dependency
    # folders added above (CI's venv lives in the checkout; none of them holds our packages).
    for entry in ast.literal_eval(lines[3]):
        if entry and Path(entry).resolve() not in folders:
            assert not Path(entry).resolve().is_relative_to(REPO.resolve()), (entry, lines[3])
    return python, bindir / "codegen", env, work


def _run(installed, *argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    python, script, env, work = installed
    return subprocess.run(
        [str(script), *argv], cwd=cwd or work, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL
    )


def test_every_command_prints_its_help(installed):
    top = _run(installed, "--help")
    assert top.returncode == 0 and "exit codes:" in top.stdout, top.stderr
    for command in COMMANDS:
        proc = _run(installed, command, "--help")
        assert proc.returncode == 0 and f"usage: codegen {command}" in proc.stdout, (command, proc.stderr)


def test_version_names_the_wheel_black_and_where_codegen_runs_from(installed):
    """What a bug report needs: the installed distribution's version (pyproject's), the black the
    generated bytes depend on, and the installed package's folder, not the checkout's."""
    import black
    import tomllib

    proc = _run(installed, "--version")
    want = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"codegen {want} (black {black.__version__}, Python "), proc.stdout
    where = Path(proc.stdout.strip().rpartition(" from ")[2])
    assert where.name == "codegen" and not where.resolve().is_relative_to(REPO.resolve()), proc.stdout


@pytest.fixture(scope="module")
def built(installed) -> Path:
    """A copy of this repository's specs/ in the unrelated directory, built by the installed codegen."""
    root = installed[3] / "copy"
    shutil.copytree(REPO / "specs", root / "specs")
    build = _run(installed, "--root", str(root), "build")
    assert build.returncode == 0, build.stderr
    return root


def test_build_check_show_explain_on_a_copy_of_the_specs(installed, built):
    root = built
    built = {k: v[0] for k, v in snapshot(root / "generated").items()}
    assert built == {k: v[0] for k, v in snapshot(REPO / "generated").items()}
    schemas = {k: v[0] for k, v in snapshot(root / "schemas").items()}
    assert schemas == {k: v[0] for k, v in snapshot(REPO / "schemas").items()}
    check = _run(installed, "--root", str(root), "check")
    assert check.returncode == 0, check.stderr + check.stdout
    # Without --root, a directory holding specs/ is the root.
    assert _run(installed, "check", cwd=root).returncode == 0

    shown = _run(installed, "--root", str(root), "show", "--json")
    assert shown.returncode == 0, shown.stderr
    tree = json.loads(shown.stdout)
    assert tree and "h200" in shown.stdout
    # The installed command ends quietly when its reader goes away (`codegen show | head`).
    python, script, env, work = installed
    read, write = os.pipe()
    os.close(read)
    try:
        closed = subprocess.run(
            [str(script), "--root", str(root), "show"], stdout=write, stderr=subprocess.PIPE, text=True, env=env
        )
    finally:
        os.close(write)
    assert closed.returncode == 141 and closed.stderr == "", closed.stderr
    explained = _run(installed, "--root", str(root), "explain", "attention", "triton_block_n", "--hw", "h200")
    assert explained.returncode == 0, explained.stderr
    assert explained.stdout.startswith("attention_fp16.triton_block_n on h200 (nvidia 90, specs/hardware/h200.toml)")


def test_the_generated_modules_import_from_the_copy_and_a_tune_plans(installed, built):
    python, _, env, work = installed
    root = built
    env = dict(env)
    # One process (each imports torch, seconds): whether torch and triton import in the installed
    # environment and torch sees a GPU (the interpreter where it does not, set before triton is
    # imported), then the generated modules from the copy.
    code = (
        "import os\n"
        "try:\n"
        "    import torch\n"
        "    os.environ.setdefault('TRITON_INTERPRET', '0' if torch.cuda.is_available() else '1')\n"
        "    import triton\n"
        "except ImportError as e:\n"
        "    print('no torch and triton:', e)\n"
        "    raise SystemExit(0)\n"
        "print(os.environ['TRITON_INTERPRET'])\n"
        "import generated, policy_runtime\n"
        "from generated import dispatch\n"
        "mods = [__import__('generated.' + m, fromlist=['_']) for m in generated.KERNEL_MODULES]\n"
        "print(generated.__file__); print(policy_runtime.__file__)\n"
        "print(sorted(m.__name__ for m in mods))\n"
        "print(dispatch.dispatch_kernel_config('moe', 'bi_v100'))\n"
    )
    proc = subprocess.run([str(python), "-c", code], cwd=root, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    if proc.stdout.startswith("no torch and triton:"):
        pytest.skip(f"{proc.stdout.strip()}: the generated modules and tune need them")
    interpret, *lines = proc.stdout.splitlines()
    env.setdefault("TRITON_INTERPRET", interpret)
    assert Path(lines[0]).resolve().is_relative_to(root.resolve()), lines[0]
    assert Path(lines[1]).resolve().is_relative_to(python.parent.parent.resolve()), lines[1]  # the venv
    # Every kernel module the copy's module specs declare.
    declared = sorted(p.stem for p in (root / "specs/modules").glob("*.toml"))
    assert "matmul" in declared and lines[2] == repr([f"generated.{m}" for m in declared])
    assert lines[3] == "MoEConfig(block_size_m=32, block_size_n=64, block_size_k=32, group_size_m=8)"

    # tune's plan-only mode (--dry-run: the spec diff, nothing written), one candidate, fp16 in the
    # interpreter when there is no GPU.
    before = snapshot(root / "specs")
    tune = subprocess.run(
        [str(python), "-m", "codegen", "--root", str(root), "tune", "matmul", "--hw", "h200",
         "--shapes", "33x72x48", "--dtype", "float16", "--space", "block_m=32", "block_n=32", "num_stages=2",
         "split_k=1", "--buckets", "small", "--quiet", "--dry-run"],
        cwd=work, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert tune.returncode == 0, tune.stderr + tune.stdout
    assert "1/1" in tune.stdout, tune.stdout
    assert snapshot(root / "specs") == before
