"""Where the hand-written seed files are, for the tests that compare with them.

``$CODEGEN_SEEDS_DIR`` when set (CI sets it: a seed missing there fails the tests that need it),
else ``../shared/seeds/`` beside the checkout.  Without either, those tests skip and say why;
the seed's values that other tests rely on are written in the tests as data (test_parity.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import REPO

SEEDS_ENV_VAR = "CODEGEN_SEEDS_DIR"


def seed_file(name: str) -> Path:
    """The seed file ``name``; skips the calling test when there is no seed folder configured
    and none beside the checkout, fails when the configured folder lacks it."""
    configured = os.environ.get(SEEDS_ENV_VAR)
    folder = Path(configured) if configured else REPO.parent / "shared" / "seeds"
    path = folder / name
    if not path.is_file():
        if configured:
            pytest.fail(f"{SEEDS_ENV_VAR}={configured} does not hold the seed {name}")
        pytest.skip(f"the seed {name} is not at {folder} (set {SEEDS_ENV_VAR} to its folder to compare with it)")
    return path
