"""ruff, with the configuration in pyproject.toml ([tool.ruff]: pycodestyle, pyflakes, sorted imports, lines of at most
120 characters), finds nothing in gatelab/ or tests/."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import REPO


def test_ruff_finds_nothing_under_the_committed_configuration():
    pytest.importorskip("ruff", reason="ruff is not installed: `pip install -e \".[test]\"` brings it")
    checked = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "gatelab", "tests"], cwd=REPO,
                             capture_output=True, text=True, timeout=300)
    assert checked.returncode == 0, checked.stdout[-5000:] + checked.stderr[-2000:]
