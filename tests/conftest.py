"""Shared fixtures. Shared helpers (paths, micro configs, subprocess runners) live in tests/helpers.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

# The suite runs as 4 xdist workers on 2 cores: a worker, or a gatelab process it starts, on torch's default of a thread
# a core would oversubscribe them (OpenMP threads spin while they wait). A test about threads sets its own.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)


@pytest.fixture
def token_ids() -> torch.Tensor:
    return torch.randint(0, 61, (2, 10), generator=torch.Generator().manual_seed(0))


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") and not torch.cuda.is_available():
        pytest.skip(f"needs a CUDA GPU: torch {torch.__version__} sees none (torch.cuda.is_available() is False)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules with the most end-to-end (slow) tests first, each module's tests together and in order: pytest-xdist
    hands out tests in this order, so the long ones start early and the short ones fill the workers' last minutes
    instead of one worker finishing a long test alone. Work stealing can still split a module across workers: a
    costly module fixture that must be made once uses tests.helpers.made_once."""
    slow_tests: dict[Path, int] = {}
    for item in items:
        slow_tests[item.path] = slow_tests.get(item.path, 0) + bool(item.get_closest_marker("slow"))
    items.sort(key=lambda item: -slow_tests[item.path])  # sort is stable: the order within a module stays
