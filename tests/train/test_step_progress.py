"""A run's progress lines (gatelab.train.step_progress's StepProgress): a plain line at a steady pace with the step
rate and the time left, the seconds a step takes measured even where nothing is printed, and the steady-state step
(`time/step_s`) without the warm-up steps or validation, driven by a fake clock."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def fake_trainer(step: int, max_steps: int = 150, rank: int = 0, loss: float | None = 5.4321, world_size: int = 1):
    metrics = {} if loss is None else {"train/loss": loss}
    return SimpleNamespace(global_step=step, max_steps=max_steps, global_rank=rank, callback_metrics=metrics,
                           world_size=world_size)


def test_a_plain_line_comes_every_n_seconds_with_the_step_rate_and_the_time_left():
    from gatelab.train.step_progress import StepProgress

    clock, lines = FakeClock(), []
    progress = StepProgress(lines.append, every_s=30, clock=clock)
    progress.on_train_start(fake_trainer(0), None)
    for step in range(1, 81):  # 1 s a step: a line at 30 s and at 60 s, none in between
        clock.now += 1.0
        progress.on_train_batch_end(fake_trainer(step), None, None, None, step - 1)
    assert lines == ["step 30/150, loss 5.432, 1 s a step, 2 min left",
                     "step 60/150, loss 5.432, 1 s a step, 1 min 30 s left"]
    assert progress.seconds_per_step == pytest.approx(1.0) and progress.steps == 80
    progress.on_train_end(fake_trainer(80), None)
    assert lines[-1] == "trained 80 steps in 1 min 20 s (1 s a step)"


def test_a_slow_step_still_gets_its_line_and_a_resumed_run_counts_only_its_own_steps():
    from gatelab.train.step_progress import StepProgress

    clock, lines = FakeClock(), []
    progress = StepProgress(lines.append, every_s=30, clock=clock)
    progress.on_train_start(fake_trainer(100), None)  # resumed from a checkpoint at step 100
    clock.now += 45.0  # one step longer than the interval
    progress.on_train_batch_end(fake_trainer(101, loss=None), None, None, None, 0)
    assert lines == ["step 101/150, 45 s a step, 37 min left"]  # 49 steps x 45 s
    assert progress.steps == 1 and progress.seconds_per_step == pytest.approx(45.0)


def test_with_a_bar_or_on_other_ranks_it_measures_without_a_word():
    from gatelab.train.step_progress import StepProgress

    for every_s, rank in ((None, 0), (30, 1)):
        clock, lines = FakeClock(), []
        progress = StepProgress(lines.append, every_s=every_s, clock=clock)
        progress.on_train_start(fake_trainer(0, rank=rank), None)
        for step in range(1, 101):
            clock.now += 0.5
            progress.on_train_batch_end(fake_trainer(step, rank=rank), None, None, None, step - 1)
        progress.on_train_end(fake_trainer(100, rank=rank), None)
        assert lines == [] and progress.seconds_per_step == pytest.approx(0.5)


def test_the_steady_step_leaves_out_the_warm_up_and_validation():
    """Lightning's order, with a fake clock: batch start, the step, batch end, then validation (every 10 steps here)
    and the next batch's fetch, outside the timed span. The first 5 steps compile (30 s each)."""
    from gatelab.train.step_progress import StepProgress

    clock = FakeClock()
    progress = StepProgress(every_s=None, clock=clock)
    progress.on_train_start(fake_trainer(0, world_size=2), None)
    batch = (torch.zeros(4, 8, dtype=torch.long), torch.zeros(4, 8, dtype=torch.long))
    for step in range(1, 41):
        progress.on_train_batch_start(fake_trainer(step - 1, world_size=2), None, batch, step - 1)
        clock.now += 30.0 if step <= 5 else 1.0
        progress.on_train_batch_end(fake_trainer(step, world_size=2), None, None, batch, step - 1)
        clock.now += 20.0 if step % 10 == 0 else 0.1  # validation, then the next batch's fetch
    assert len(progress.step_seconds) == 40
    assert progress.steady_step_s == pytest.approx(1.0)
    assert progress.steady_tokens_per_s == pytest.approx(2 * 4 * 8 / 1.0)  # both ranks' tokens
    assert progress.seconds_per_step > 6  # the session's wall time a step keeps all of it, for the time left


@pytest.mark.parametrize(("step_seconds", "steady"), [
    ([100.0] * 5 + [1.0, 2.0, 3.0], 2.0),  # 8 steps: the first 5 left out (the median of all would be 51.5)
    ([50.0] * 10 + [1.0] * 45 + [2.0] * 45, 1.5),  # 100 steps: the first 10 (leaving 5 would give 2.0)
    ([30.0, 1.0, 1.0], 1.0),  # no longer than the warm-up: the median of all
    ([], None),
])
def test_the_warm_up_is_a_tenth_of_the_steps_and_at_least_five(step_seconds, steady):
    from gatelab.train.step_progress import steady_step_s, warmup_steps

    assert (warmup_steps(8), warmup_steps(100), warmup_steps(1000)) == (5, 10, 100)
    assert steady_step_s(step_seconds) == (None if steady is None else pytest.approx(steady))
