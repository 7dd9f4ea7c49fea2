"""README's commands are the ones CI runs."""

import re

from conftest import REPO


def _commands(text: str) -> list[str]:
    return re.findall(r"```sh\n(.+?)\n```", text, re.S)


def test_ci_runs_the_readme_test_command_and_check():
    readme = (REPO / "README.md").read_text()
    build_cmd, test_cmd = _commands(readme)[:2]
    assert "pytest" in test_cmd and "codegen build" in build_cmd
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert test_cmd in ci
    assert any(line.strip().endswith("-m codegen check") for line in ci)


def test_the_github_workflow_and_the_pre_commit_hooks_run_the_same_commands():
    readme = (REPO / "README.md").read_text()
    _, test_cmd = _commands(readme)[:2]
    workflow = (REPO / ".github" / "workflows" / "ci.yml").read_text()
    assert f"run: {test_cmd}" in workflow
    assert "run: .venv/bin/python -m codegen check" in workflow
    hooks = (REPO / ".pre-commit-hooks.yaml").read_text()
    assert "entry: codegen check" in hooks and "entry: codegen build" in hooks
    assert ".pre-commit-hooks.yaml" in readme and ".github/workflows/ci.yml" in readme
