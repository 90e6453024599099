"""How a run shows its progress: a plain line at a steady pace (`StepProgress`, which also measures the seconds a
step, and the steady-state step that `time/step_s` records: `steady_step_s`), or Lightning's bar over the run's steps
(`StepBar`), with the run's other lines above it (`above_the_bar`)."""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable

import lightning as L
from lightning.pytorch.callbacks import TQDMProgressBar

from gatelab.metrics import TRAIN_LOSS
from gatelab.progress import DEFAULT_EVERY_S, format_duration, step_time

# The warm-up a steady-state step leaves out: torch.compile's first steps (tens of seconds) and the allocator's and
# the data loader's first ones. A tenth of the session's steps, and at least 5 (compile can take two steps: one for
# the graph, one for a recompile on the second shape it sees).
WARMUP_SHARE, MIN_WARMUP_STEPS = 0.1, 5


def warmup_steps(steps: int) -> int:
    return max(MIN_WARMUP_STEPS, math.ceil(WARMUP_SHARE * steps))


def steady_step_s(step_seconds: list[float]) -> float | None:
    """The median of the step times after the warm-up (`warmup_steps`); a session no longer than its warm-up has no
    steady state, so the median of all its steps (a median still ignores the one compile step of a few). A median,
    not a mean: one step held up by the host (a checkpoint write, another process) moves it not at all."""
    if not step_seconds:
        return None
    steady = step_seconds[warmup_steps(len(step_seconds)):]
    return statistics.median(steady or step_seconds)


class StepProgress(L.Callback):
    """Measures a run's seconds a training step (from the first step of this session: a resumed run counts only what
    it trains now) and, where `every_s` is set, logs a plain line at least that often:
    `step 80/150, loss 5.43, 1.1 s a step, 1 min 17 s left`. Hooks run on every rank; only rank 0 speaks.

    It also keeps each training batch's own seconds, from `on_train_batch_start` to `on_train_batch_end`: Lightning
    runs validation (eval.every_n_steps) and fetches the next batch outside that span, so `steady_step_s` holds
    neither. The line's rate stays the session's wall time a step, which is what the time left depends on."""

    def __init__(self, log: Callable[[str], object] = print, every_s: float | None = DEFAULT_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        # `say`, not `log`: Lightning sets every callback's `log` to the module's `self.log` (callback_connector)
        self.say, self.every_s, self.clock = log, every_s, clock
        self.first_step = 0
        self.started = self.last_line = 0.0
        self.steps = 0
        self.train_s = 0.0
        self.step_seconds: list[float] = []  # each batch of this session, start to end
        self.tokens_per_step = 0  # every rank's input tokens in one batch
        self._batch_started: float | None = None

    @property
    def seconds_per_step(self) -> float | None:
        return self.train_s / self.steps if self.steps else None

    @property
    def steady_step_s(self) -> float | None:
        return steady_step_s(self.step_seconds)

    @property
    def steady_tokens_per_s(self) -> float | None:
        step_s = self.steady_step_s
        return self.tokens_per_step / step_s if step_s and self.tokens_per_step else None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        self.tokens_per_step = batch[0].numel() * trainer.world_size
        self._batch_started = self.clock()

    def on_train_start(self, trainer, pl_module) -> None:
        self.first_step = trainer.global_step
        self.started = self.last_line = self.clock()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        now = self.clock()
        if self._batch_started is not None:
            self.step_seconds.append(now - self._batch_started)
            self._batch_started = None
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
