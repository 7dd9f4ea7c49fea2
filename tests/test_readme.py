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
