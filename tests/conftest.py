"""Shared fixtures. Shared helpers (paths, micro configs, subprocess runners) live in tests/helpers.py."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def token_ids() -> torch.Tensor:
    return torch.randint(0, 61, (2, 10), generator=torch.Generator().manual_seed(0))
