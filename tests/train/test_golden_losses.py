"""Golden losses: the first 20 training losses of tiny's baseline and g1_elem_sig on fixed data, checked to a
tolerance, so that any change to the step (model, init, loss, optimizer, clipping, schedule) shows at once, as
torchtitan keeps loss curves under tests/assets/losses/.

The step is gatelab's own (GatedLM's training loss, AdamW groups and schedule, its gradient clipping), in fp32 and
eager on one thread, on tiny's model at its batch of 16 rows but 64-token windows of seeded random tokens with a
learnable rule, so it runs in seconds. The golden check runs it as a run does, through Lightning's Trainer (`fit` for
20 steps, gatelab's clipping at train.grad_clip); a unit test drives the same step by hand, outside the Trainer,
against the same figures. The committed figures were written by that loop (7541dd1); the Trainer's losses agree with
them to 1.2e-7 relative (Lightning 2.6.6), so where only the Trainer's check fails, Lightning's loop moved, not the
step. A change that is meant to move the losses rewrites the file, from the Trainer:

    GATELAB_WRITE_GOLDEN=1 python -m pytest -q tests/train/test_golden_losses.py

and the diff of tests/assets/losses/tiny.json goes with the change that explains it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import lightning as L
import pytest
import torch

from gatelab.config import ExperimentConfig
from gatelab.data.resolve import load_experiment
from gatelab.model import resolve_model
from gatelab.train.module import GatedLM

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "assets" / "losses" / "tiny.json"
VARIANTS = ("baseline", "g1_elem_sig")
STEPS, SEQ_LEN = 20, 64
# fp32 on one thread; matmul blocking differs between CPUs (AVX2, AVX512, AMX), which moves the 20th loss by ~1e-6
# relative: far below what any change to the step moves it by (a changed init or loss moves the first one).
RELATIVE_TOLERANCE = 1e-4


def _on_one_thread(train: Callable[[str], list[float]], variant: str) -> list[float]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return train(variant)
    finally:
        torch.set_num_threads(threads)


def _module(variant: str) -> tuple[ExperimentConfig, GatedLM]:
    experiment = load_experiment(REPO / "experiments" / "tiny.yaml",
                                 [f"variant={variant}", "train.precision=32-true", "train.compile=false",
                                  f"data.seq_len={SEQ_LEN}"])
    torch.manual_seed(0)
    return experiment, GatedLM(experiment, resolve_model(experiment))


def _batches(experiment: ExperimentConfig) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1234)
    vocab, rows = experiment.model.vocab_size, experiment.train.batch_size
    batches = []
    for _ in range(STEPS):
        input_ids_BT = torch.randint(0, vocab, (rows, SEQ_LEN), generator=generator)
        targets_BT = (5 * input_ids_BT + 11) % vocab  # learnable: the curve falls, so a flat one would show
        batches.append((input_ids_BT, targets_BT))
    return batches


def _through_the_trainer(variant: str) -> list[float]:
    """`fit` for STEPS steps, with the settings of gatelab.train.run.build_trainer that the step reads: the precision,
    the clipping value (GatedLM.configure_gradient_clipping clips), no sanity validation. train.max_steps stays tiny's
    300, as the schedule's length."""
    experiment, lm = _module(variant)
    losses = []

    class KeepLosses(L.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            losses.append(outputs["loss"].item())

    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=STEPS, precision="32-true",
                        gradient_clip_val=experiment.train.grad_clip, logger=False, callbacks=[KeepLosses()],
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, limit_val_batches=0)
    trainer.fit(lm, train_dataloaders=torch.utils.data.DataLoader(_batches(experiment), batch_size=None))
    assert trainer.global_step == STEPS
    return losses


def _by_hand(variant: str) -> list[float]:
    """The step outside Lightning: GatedLM's loss, clipping, optimizer and schedule, called in the Trainer's order."""
    experiment, lm = _module(variant)
    optimizers = lm.configure_optimizers()
    optimizer, schedule = optimizers["optimizer"], optimizers["lr_scheduler"]["scheduler"]
    lm.log = lambda *args, **kwargs: None  # no trainer to log to
    losses = []
    for input_ids_BT, targets_BT in _batches(experiment):
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
        GOLDEN.write_text(json.dumps({variant: _on_one_thread(_through_the_trainer, variant) for variant in VARIANTS},
                                     indent=1) + "\n")
    return json.loads(GOLDEN.read_text())


def _assert_golden(losses: list[float], expected_losses: list[float]) -> None:
    assert len(losses) == len(expected_losses) == STEPS
    assert losses[-1] < losses[0] - 0.05  # it learns on these batches (tiny warms up over 30 steps)
    for step, (loss, expected) in enumerate(zip(losses, expected_losses), 1):
        assert loss == pytest.approx(expected, rel=RELATIVE_TOLERANCE), f"step {step}: {loss} against {expected}"


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_first_20_losses_of_tiny_through_lightning_s_trainer_are_the_golden_ones(golden, variant):
    _assert_golden(_on_one_thread(_through_the_trainer, variant), golden[variant])


def test_the_step_driven_by_hand_gives_the_trainer_s_golden_losses(golden):
    """One variant is enough here: the hand-driven loop checks the step apart from Lightning's loop."""
    _assert_golden(_on_one_thread(_by_hand, "baseline"), golden["baseline"])


def test_the_golden_variants_differ():
    """The gate changes the curve: a check that both curves are not the same one written twice."""
    golden = json.loads(GOLDEN.read_text())
    assert golden["baseline"][0] != golden["g1_elem_sig"][0]
