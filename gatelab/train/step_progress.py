"""How a run shows its progress: a plain line at a steady pace (`StepProgress`, which also measures the seconds a
step), or Lightning's bar over the run's steps (`StepBar`), with the run's other lines above it (`above_the_bar`)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import lightning as L
from lightning.pytorch.callbacks import TQDMProgressBar

from gatelab.metrics import TRAIN_LOSS
from gatelab.progress import DEFAULT_EVERY_S, format_duration, step_time


class StepProgress(L.Callback):
    """Measures a run's seconds a training step (from the first step of this session: a resumed run counts only what
    it trains now) and, where `every_s` is set, logs a plain line at least that often:
    `step 80/150, loss 5.43, 1.1 s a step, 1 min 17 s left`. Hooks run on every rank; only rank 0 speaks."""

    def __init__(self, log: Callable[[str], object] = print, every_s: float | None = DEFAULT_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        # `say`, not `log`: Lightning sets every callback's `log` to the module's `self.log` (callback_connector)
        self.say, self.every_s, self.clock = log, every_s, clock
        self.first_step = 0
        self.started = self.last_line = 0.0
        self.steps = 0
        self.train_s = 0.0

    @property
    def seconds_per_step(self) -> float | None:
        return self.train_s / self.steps if self.steps else None

    def on_train_start(self, trainer, pl_module) -> None:
        self.first_step = trainer.global_step
        self.started = self.last_line = self.clock()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        now = self.clock()
        self.steps, self.train_s = trainer.global_step - self.first_step, now - self.started
        if self.every_s is None or now - self.last_line < self.every_s or trainer.global_rank:
            return
        self.last_line = now
        self.say(self.line(trainer.global_step, trainer.max_steps, trainer.callback_metrics.get(TRAIN_LOSS)))

    def on_train_end(self, trainer, pl_module) -> None:
        if self.every_s is not None and self.steps and not trainer.global_rank:
            self.say(f"trained {self.steps} steps in {format_duration(self.train_s)} "
                     f"({step_time(self.seconds_per_step)})")

    def line(self, step: int, max_steps: int, loss=None) -> str:
        parts = [f"step {step}/{max_steps}"]
        if loss is not None:
            parts.append(f"loss {float(loss):.3f}")
        rate = self.seconds_per_step
        if rate is not None:
            parts += [step_time(rate), f"{format_duration(rate * max(0, max_steps - step))} left"]
        return ", ".join(parts)


class StepBar(TQDMProgressBar):
    """Lightning's bar over the run's steps, `step/max_steps` (Lightning's counts an epoch's batches: `0/?` on a
    stream), redrawn every step (every 10 left a minute without output at 6 s a step; tqdm itself redraws at most ten
    times a second), without `v_num` (a logger's version: gatelab's Trainer has none, so it meant nothing)."""

    def __init__(self) -> None:
        super().__init__(refresh_rate=1)

    def on_train_epoch_start(self, trainer, *args) -> None:
        super().on_train_epoch_start(trainer, *args)
        bar = self.train_progress_bar
        # resumed: from there
        bar.total, bar.initial, bar.n = trainer.max_steps, trainer.global_step, trainer.global_step
        bar.set_description("training")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if self.train_progress_bar is not None and not self.train_progress_bar.disable:
            self.train_progress_bar.n = trainer.global_step
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))  # redraws the bar

    def get_metrics(self, trainer, pl_module) -> dict:
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        return metrics


def above_the_bar(log: Callable[[str], object]) -> Callable[[str], object]:
    """`log` for a run that shows a bar: each line goes above the bar (tqdm clears it, then draws it again below),
    not onto the bar's own line, where "compiled in ..." was glued and each line left a copy of the bar behind."""
    def say(line: str) -> None:
        from tqdm import tqdm

        with tqdm.external_write_mode(file=sys.stdout):
            log(line)
    return say
