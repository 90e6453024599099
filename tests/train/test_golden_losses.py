"""Golden losses: the first 20 training losses of tiny's baseline and g1_elem_sig on fixed data, checked to a
tolerance, so that any change to the step (model, init, loss, optimizer, clipping, schedule) shows at once, as
torchtitan keeps loss curves under tests/assets/losses/.

The step is gatelab's own (GatedLM's training loss, AdamW groups and schedule, its gradient clipping), in fp32 and
eager on one thread, on tiny's model at its batch of 16 rows but 64-token windows of seeded random tokens with a
learnable rule, so it runs in seconds. A change that is meant to move the losses rewrites the file:

    GATELAB_WRITE_GOLDEN=1 python -m pytest -q tests/train/test_golden_losses.py

and the diff of tests/assets/losses/tiny.json goes with the change that explains it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from gatelab.data.resolve import load_experiment
from gatelab.model import resolve_model
from gatelab.train.module import GatedLM

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "assets" / "losses" / "tiny.json"
STEPS, SEQ_LEN = 20, 64
# fp32 on one thread; matmul blocking differs between CPUs (AVX2, AVX512, AMX), which moves the 20th loss by ~1e-6
# relative: far below what any change to the step moves it by (a changed init or loss moves the first one).
RELATIVE_TOLERANCE = 1e-4


def _losses(variant: str) -> list[float]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train(variant)
    finally:
        torch.set_num_threads(threads)


def _train(variant: str) -> list[float]:
    experiment = load_experiment(REPO / "experiments" / "tiny.yaml",
                                 [f"variant={variant}", "train.precision=32-true", "train.compile=false",
                                  f"data.seq_len={SEQ_LEN}"])
    torch.manual_seed(0)
    lm = GatedLM(experiment, resolve_model(experiment))
    optimizers = lm.configure_optimizers()
    optimizer, schedule = optimizers["optimizer"], optimizers["lr_scheduler"]["scheduler"]
    lm.log = lambda *args, **kwargs: None  # no trainer to log to
    generator = torch.Generator().manual_seed(1234)
    vocab, rows = experiment.model.vocab_size, experiment.train.batch_size
    losses = []
    for _ in range(STEPS):
        input_ids_BT = torch.randint(0, vocab, (rows, SEQ_LEN), generator=generator)
        targets_BT = (5 * input_ids_BT + 11) % vocab  # learnable: the curve falls, so a flat one would show
        loss, total, _ = lm.training_loss(input_ids_BT, targets_BT)
        total.backward()
        lm.configure_gradient_clipping(optimizer, experiment.train.grad_clip, "norm")
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


@pytest.fixture(scope="module")
def golden() -> dict[str, list[float]]:
    if os.environ.get("GATELAB_WRITE_GOLDEN"):
        GOLDEN.write_text(json.dumps({variant: _losses(variant) for variant in ("baseline", "g1_elem_sig")},
                                     indent=1) + "\n")
    return json.loads(GOLDEN.read_text())


@pytest.mark.parametrize("variant", ["baseline", "g1_elem_sig"])
def test_the_first_20_losses_of_tiny_are_the_golden_ones(golden, variant):
    losses = _losses(variant)
    assert len(golden[variant]) == STEPS
    assert losses[-1] < losses[0] - 0.05  # it learns on these batches (tiny warms up over 30 steps)
    for step, (loss, expected) in enumerate(zip(losses, golden[variant]), 1):
        assert loss == pytest.approx(expected, rel=RELATIVE_TOLERANCE), f"step {step}: {loss} against {expected}"


def test_the_golden_variants_differ():
    """The gate changes the curve: a check that both curves are not the same one written twice."""
    golden = json.loads(GOLDEN.read_text())
    assert golden["baseline"][0] != golden["g1_elem_sig"][0]
