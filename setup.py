"""Packages are discovered, never listed by hand (a listed set once left out codegen/tune/ and
the installed command could not start): every package under codegen/ and policy_runtime/,
and the packaged templates (this repository's templates/, installed as codegen_templates;
pyproject.toml maps the folder and names its data files).  Everything else is in pyproject.toml."""

from setuptools import find_packages, setup

setup(
    packages=[
        *find_packages(include=["codegen", "codegen.*", "policy_runtime", "policy_runtime.*"]),
        *("codegen_templates" + p for p in ["", *("." + q for q in find_packages("templates"))]),
    ]
)
