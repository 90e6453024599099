"""What a run and a sweep say while they work, and what they keep to themselves.

A run shows Lightning's bar where stdout is a terminal; anywhere else (a file, CI, nohup) a bar is one line rewritten
in place that a log never shows, so `gatelab.train.step_progress.StepProgress` prints a plain line every
`GATELAB_PROGRESS_EVERY` seconds (30) instead. A sweep adds a line after each run: runs done, and the time left from
this worker's measured step time.

Noise is what a user cannot act on: Lightning's accelerator banners and tips, and deprecation warnings that third-party
code raises about other third-party code. `silence_noise` drops them; `--verbose` (GATELAB_VERBOSE=1, inherited by
every worker and rank a command starts) keeps them. Warnings raised by gatelab's own code always show.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import statistics
import sys
import textwrap
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gatelab.errors import GatelabError, redact
from gatelab.store_uris import sqlite_file

VERBOSE_ENV = "GATELAB_VERBOSE"
EVERY_ENV = "GATELAB_PROGRESS_EVERY"
DEFAULT_EVERY_S = 30.0
DONE = ("finished", "diverged", "failed")  # ledger states that no worker will train again
HOST_TAG = "gatelab.host"  # on each MLflow run: the machine whose `time/step_s` it recorded (`host.machine_name`)
# ... and the device it trained on (`gatelab.devices.device_name`: "NVIDIA H200", "cpu"): one host may hold several
# kinds
DEVICE_TAG = "gatelab.device"


def set_verbose(verbose: bool) -> None:
    """--verbose: this process and every process it starts (sweep workers, `gatelab train` children, DDP ranks)."""
    if verbose:
        os.environ[VERBOSE_ENV] = "1"


def is_verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


def progress_every_s() -> float:
    """Seconds between two plain progress lines: GATELAB_PROGRESS_EVERY, else 30."""
    text = os.environ.get(EVERY_ENV, "")
    if not text:
        return DEFAULT_EVERY_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise GatelabError(f"{EVERY_ENV}={text!r}: not a number of seconds above 0; unset it for a line every "
                           f"{DEFAULT_EVERY_S:.0f} s")
    return seconds


class CommandClock:
    """When the running command last said something on stderr, for the progress lines that speak only after a silence
    (gatelab.sweep.spec.Progress). A command starts it (gatelab.app.run_command), so that a command run in a process
    that ran others before it (a test, a notebook) starts silent rather than inheriting their clock."""

    last_word: float | None = None

    @classmethod
    def start(cls) -> None:
        cls.last_word = time.monotonic()


def silence_noise() -> None:
    """Drop Lightning's info lines and third-party deprecation warnings, unless --verbose. Call it again after Lightning
    is imported: its package __init__ sets its loggers to INFO."""
    if is_verbose():
        return
    # "GPU available: False", "TPU available", "Using bfloat16 AMP", the litlogger tip, "`Trainer.fit` stopped": all
    # logged at INFO under these names; Lightning's warnings go through `warnings` and still show.
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # Deprecations that one library raises about another (Lightning on torch's LeafSpec, ...): nothing a gatelab user
    # can change. A warning attributed to gatelab's own modules is not matched, so gatelab's own still show.
    for category in (DeprecationWarning, PendingDeprecationWarning, FutureWarning):
        warnings.filterwarnings("ignore", category=category, module=r"(?!gatelab(\.|$))")
    # bf16 autocast hands nn.RMSNorm bf16 input with an fp32 weight; torch then takes its unfused path (a speed
    # matter, not a correctness one), and says so on every run.
    warnings.filterwarnings("ignore", message=r"Mismatch dtype between input and weight.*")
    # Lightning's advice on data-loader workers: the validation windows are in memory already, and the training
    # stream's workers (`data.loader_workers`) are not persistent: StepBatches starts at the trainer's step.
    warnings.filterwarnings("ignore", message=r".*does not have many workers which may be a bottleneck.*")
    warnings.filterwarnings("ignore", message=r"Consider setting `persistent_workers=True`.*")
    # On any host with Slurm's `srun` (a login node, a CI with a local Slurm) Lightning suggests prefixing the command
    # with it. gatelab starts its own workers (one process each, or an sbatch array task each), so the hint is noise.
    warnings.filterwarnings("ignore", message=r"The `srun` command is available on your system but is not used.*")


def terminal_columns() -> int | None:
    """The width output must fit where stdout is a terminal (its width, or COLUMNS where set); None for a pipe or a
    file, where a table keeps whole rows for whoever reads the log (COLUMNS is not read there: libraries and test
    runners set it to 80 for their own children)."""
    return shutil.get_terminal_size().columns if sys.stdout.isatty() else None


def fit_line(line: str, width: int | None) -> str:
    """A line of prose wrapped at word boundaries to `width` (paths and hyphenated keys kept whole); as it is where
    `width` is None (a pipe: `terminal_columns`)."""
    return line if width is None else textwrap.fill(line, width, break_long_words=False, break_on_hyphens=False)


def fit_columns(frame, width: int | None) -> tuple[str, list[str]]:
    """A DataFrame as text no wider than `width`: its leading columns (the key ones come first), and the names of the
    columns left out, which a caller points to in the files that hold them."""
    text = frame.to_string(index=False)
    if width is None or max(map(len, text.splitlines()), default=0) <= width:
        return text, []
    kept = 1
    while kept < len(frame.columns):
        wider = frame.iloc[:, :kept + 1].to_string(index=False)
        if max(map(len, wider.splitlines())) > width:
            break
        kept += 1
    return frame.iloc[:, :kept].to_string(index=False), [str(c) for c in frame.columns[kept:]]


def format_duration(seconds: float) -> str:
    """45 s, 1 min 17 s, 12 min, 2 h 5 min, 3.2 days, 44,636 years (a paper-scale run priced on a CPU: the plan's rows
    say `44,636y`, and its total must read as the same kind of number)."""
    seconds = max(0.0, seconds)
    if seconds < 59.5:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60) if seconds >= 600 else None
    if seconds < 600:
        whole, rest = divmod(round(seconds), 60)
        return f"{whole} min {rest} s" if rest else f"{whole} min"
    if minutes < 60:
        return f"{minutes} min"
    if seconds < 48 * 3600:
        hours, rest = divmod(minutes, 60)
        return f"{hours} h {rest} min" if rest else f"{hours} h"
    if seconds < 365 * 86400:
        return f"{seconds / 86400:.1f} days"
    years = seconds / (365.25 * 86400)
    return f"{years:.3g} years" if years < 1000 else f"{years:,.0f} years"


def step_time(seconds: float) -> str:
    return f"{seconds:.2g} s a step" if seconds < 10 else f"{seconds:.0f} s a step"


@dataclass
class RunCosts:
    """What the runs this worker trained cost: seconds a training step, and the seconds around training (process
    start, data, model, MLflow, evaluation) a run."""

    seconds_per_step: list[float] = field(default_factory=list)
    overhead_s: list[float] = field(default_factory=list)

    def record(self, wall_s: float, steps: int, train_s: float) -> None:
        if steps > 0 and train_s > 0:  # a run found already recorded, or trained in a child, measured nothing here
            self.seconds_per_step.append(train_s / steps)
            self.overhead_s.append(max(0.0, wall_s - train_s))

    def run_seconds(self, steps: int) -> float | None:
        """A run of `steps` steps: the mean step time so far times its steps, plus the mean time around training."""
        if not self.seconds_per_step:
            return None
        return statistics.fmean(self.seconds_per_step) * steps + statistics.fmean(self.overhead_s)

    def describe(self) -> str:
        return (f"{step_time(statistics.fmean(self.seconds_per_step))} and "
                f"{format_duration(statistics.fmean(self.overhead_s))} of start-up and evaluation a run, as "
                f"measured by this worker over {len(self.seconds_per_step)} run(s)")


def sweep_time_left(states: Sequence, steps_by_hash: Mapping[str, int], costs: RunCosts, worker: str,
                    now: float | None = None) -> float | None:
    """Seconds until the sweep's last run ends, from this worker's own costs; None before it has measured a run.

    A worker knows only its own runs: every run not yet done is priced at this worker's rate, and the total shared
    among the workers that hold a run now plus this one, never less than the longest single run left.
    """
    now = time.time() if now is None else now
    left = []
    for state in states:
        if state.status in DONE:
            continue
        seconds = costs.run_seconds(steps_by_hash[state.hash])
        if seconds is None:
            return None
        if state.status == "running" and state.since is not None:
            seconds = max(0.0, seconds - (now - state.since))
        left.append(seconds)
    if not left:
        return 0.0
    workers = len({state.worker for state in states if state.status == "running" and state.worker} | {worker})
    return max(sum(left) / workers, max(left))


def sweep_progress_line(name: str, states: Sequence, time_left: float | None, costs: RunCosts) -> str:
    """`sweep quickstart: 2/3 runs done (2 finished), about 2 min 40 s left (estimate: ...)`."""
    done = [state for state in states if state.status in DONE]
    counts = {status: sum(state.status == status for state in done) for status in DONE}
    line = f"sweep {name}: {len(done)}/{len(states)} runs done"
    if done:
        line += " (" + ", ".join(f"{n} {status}" for status, n in counts.items() if n) + ")"
    running = sum(state.status == "running" for state in states)
    if time_left is not None and len(done) < len(states):
        if time_left < 1 and running:  # running elsewhere for longer than this worker's runs took: no figure to give
            line += f", {running} still running (past this worker's estimate)"
        else:
            line += f", about {format_duration(time_left)} left (estimate: {costs.describe()})"
    return line


def _command(*words: str | Path | None) -> str:
    return shlex.join(str(word) for word in words if word is not None)


def closing_lines(sweep: Path, sweep_name: str, stores: Iterable[str], runs_dir: Path, experiment: Path | None = None,
                  tracking_uri: str | None = None, storage: str | None = None) -> list[str]:
    """The block that ends `gatelab sweep run`: where the results are, and the commands that come next (with the
    options this sweep was run with, so each reads the same store and ledger)."""
    default_runs = runs_dir == Path("runs")
    experiment_option = ("--experiment", experiment) if experiment is not None else (None, None)
    runs_option = (None, None) if default_runs else ("--runs-dir", runs_dir)
    tracking_option = ("--tracking-uri", redact(tracking_uri)) if tracking_uri else (None, None)
    storage_option = ("--storage", redact(storage)) if storage else (None, None)
    stores = sorted(f"{sqlite_file(store)} (SQLite)" if sqlite_file(store) else redact(store) for store in stores)
    lines = [f"results: MLflow {'stores' if len(stores) > 1 else 'store'} {', '.join(stores)}; checkpoints under "
             f"{runs_dir}/"]
    table = _command("gatelab", "table", sweep, *experiment_option, *tracking_option, *runs_option, *storage_option)
    ui = _command("gatelab", "ui", sweep, *tracking_option, *runs_option)
    status = _command("gatelab", "sweep", "status", sweep, *experiment_option, *storage_option, *runs_option)
    steps = [(table, f"tables and plots, into {runs_dir / 'reports' / sweep_name}/"),
             (ui, "the runs in the MLflow UI, at http://127.0.0.1:5000"),
             (status, "the ledger: one row per run")]
    width = max(len(command) for command, _ in steps)
    width = width if width <= 80 else 0  # long commands: no column, rather than one pushed far right
    return lines + ["next:"] + [f"  {command:{width}}  # {what}" for command, what in steps]
