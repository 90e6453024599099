"""The training pieces that need no data download: the step-indexed batch stream and the learning-rate schedule."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gatelab.data.datasets import PackedDataset
from gatelab.errors import GatelabError
from gatelab.train.module import StepBatches, lr_at


def _windows() -> PackedDataset:
    return PackedDataset({"a": np.arange(1000, dtype=np.int64)}, seq_len=4, seed=0)


def test_batches_depend_only_on_the_step():
    stream = StepBatches(_windows(), batch_size=3, steps_per_epoch=5, start_step=lambda: 0)
    from_start = list(stream)
    resumed = list(StepBatches(_windows(), batch_size=3, steps_per_epoch=5, start_step=lambda: 2))
    assert len(from_start) == 5 and len(resumed) == 3  # the epoch ends at the next validation boundary
    for a, b in zip(from_start[2:], resumed):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_ddp_ranks_split_the_global_batch():
    whole = next(iter(StepBatches(_windows(), 4, 10, lambda: 3)))[0]
    parts = [next(iter(StepBatches(_windows(), 4, 10, lambda: 3, rank=r, world_size=2)))[0] for r in (0, 1)]
    assert torch.equal(torch.cat(parts), whole)
    with pytest.raises(GatelabError, match="must divide evenly over 3 processes"):
        StepBatches(_windows(), 4, 10, lambda: 0, world_size=3)


def test_warmup_then_cosine_to_the_floor():
    assert lr_at(0, 1.0, 0.1, warmup=10, total=110) == pytest.approx(0.1)
    assert lr_at(9, 1.0, 0.1, warmup=10, total=110) == pytest.approx(1.0)
    assert lr_at(60, 1.0, 0.1, warmup=10, total=110) == pytest.approx(0.55)
    assert lr_at(110, 1.0, 0.1, warmup=10, total=110) == pytest.approx(0.1)
