"""Where a run's wall time and memory went, as the `time/*` and `memory/*` metrics it records."""

from __future__ import annotations

import time

import lightning as L
import torch

from gatelab import host
from gatelab import metrics as catalogue
from gatelab.tracked_run import TrackedRun
from gatelab.train.compiling import CompileReport
from gatelab.train.step_progress import StepProgress

_first_run_of_process = True


class PhaseClock:
    """Where a run's wall time went, as `time/*` metrics: `import_s` from the program's start (its first import of
    gatelab) to its first `run()` (0 for its later runs: a sweep worker imports once), then `setup_s` (data,
    tokenizer, model, MLflow), `train_s` (`fit`) and `eval_s` (the final evaluation and its artifacts),
    each from the end of the one before.

    A resumed run records the session that ended it, so the seconds of one killed before the end are not counted.
    """

    def __init__(self) -> None:
        global _first_run_of_process
        self.seconds: dict[str, float] = {}
        self.seconds[catalogue.IMPORT_S] = host.seconds_since_start() if _first_run_of_process else 0.0
        _first_run_of_process = False
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.reset_peak_memory_stats()  # a sweep worker's GPU peak is each run's own, not its largest run's
        self._since = time.perf_counter()

    def phase_ended(self, metric: str) -> None:
        now = time.perf_counter()
        self.seconds[metric] = now - self._since
        self._since = now

    def training_ended(self, trainer: L.Trainer) -> None:
        """`train_s`; `step_s`, the steady-state seconds of a training step this session (StepProgress: no compile,
        warm-up or validation), which `gatelab table` compares between variants, with `steady_tokens_per_s`; and
        `wall_step_s`, all of training over its steps, which `gatelab sweep plan` reads back to estimate the next sweep
        of the same shape on this machine (HOST_TAG)."""
        self.phase_ended(catalogue.TRAIN_S)
        steps = next(c for c in trainer.callbacks if isinstance(c, StepProgress))
        if steps.steady_step_s is not None:
            self.seconds[catalogue.STEP_S] = steps.steady_step_s
        if steps.seconds_per_step is not None:
            self.seconds[catalogue.WALL_STEP_S] = steps.seconds_per_step
        if steps.steady_tokens_per_s is not None:
            self.seconds[catalogue.STEADY_TOKENS_PER_S] = steps.steady_tokens_per_s
        compiled = next((c for c in trainer.callbacks if isinstance(c, CompileReport)), None)
        if compiled is not None and compiled.compile_s is not None:
            self.seconds[catalogue.COMPILE_S] = compiled.compile_s
        if (peak := peak_gpu_gb()) is not None:
            # Training's own peak: `memory/peak_gpu_gb`, read at the end, also holds the evaluation's batches.
            self.seconds[catalogue.PEAK_GPU_TRAIN_GB] = peak

    def log(self, tracked: TrackedRun, step: int) -> None:
        tracked.log_metrics(self.seconds | peak_memory(), step)


def peak_memory() -> dict[str, float]:
    """`memory/peak_rss_gb`: this process's largest resident set so far (a sweep worker's, over its runs until now;
    see `host.peak_rss_gb`); `memory/peak_gpu_gb`: the most CUDA memory torch held during this run (training and
    evaluation), where there is a GPU."""
    memory = {catalogue.PEAK_RSS_GB: host.peak_rss_gb()}
    if (peak := peak_gpu_gb()) is not None:
        memory[catalogue.PEAK_GPU_GB] = peak
    return memory


def peak_gpu_gb() -> float | None:
    """The most CUDA memory torch held since the last reset, in GB; None where CUDA was never used here."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.max_memory_allocated() / 1e9
    return None
