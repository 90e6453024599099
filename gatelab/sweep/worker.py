"""A sweep worker: claim the next run from the ledger, train it, record the outcome; repeat until none is left.

Many runs share one process, so Lightning and torch are imported once (seconds a process). Any number of workers,
on any number of machines, can work on one sweep: the ledger hands each run to exactly one of them, and a worker that
was paused past the grace period finds its run taken over and stops without writing. Ctrl-C or SIGTERM puts the run
back in the queue at once (`Interrupted`, exit code 130 or 143).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import lightning as L
import torch

from gatelab import host
from gatelab.config import spec_hash, to_yaml
from gatelab.errors import GatelabError, redact
from gatelab.interrupts import Interrupted, ignore_signals, raise_on_signals
from gatelab.progress import RunCosts, is_verbose, sweep_progress_line, sweep_time_left
from gatelab.sweep.executor import LocalShare
from gatelab.sweep.queue import HASH, open_ledger
from gatelab.sweep.spec import expand, load_sweep
from gatelab.train.ownership import RunInProgress, RunTakenOver


def use_cores(cores: Sequence[int]) -> None:
    """Train on exactly these cores: as many torch threads, and every thread of this process allowed on them only.

    Call it from the training thread: OpenMP keeps the thread count per calling thread. The affinity is set thread by
    thread because Linux applies sched_setaffinity to one thread, and OpenMP's pool threads already exist.
    """
    torch.set_num_threads(len(cores))
    if not hasattr(os, "sched_setaffinity"):
        return
    for task in host.thread_ids():
        try:
            os.sched_setaffinity(task, cores)
        except OSError:  # that thread ended meanwhile, or a cpuset took the core away: threads still apply
            continue


class ShareFreedCores(L.Callback):
    """Every `every_n_steps` training steps, resize this local worker to its share of the sweep's cores now: its own
    plus an even share of those whose workers have gone idle or exited (one listdir, no ledger query). Hooks run in
    the training thread, where the thread count must be set."""

    def __init__(self, share: LocalShare, every_n_steps: int = 5):
        self.share, self.every_n_steps = share, every_n_steps
        self.cores: list[int] | None = None

    def apply(self) -> None:
        cores = self.share.cores_now()
        if cores != self.cores:
            use_cores(cores)
            self.cores = cores

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        if trainer.global_step % self.every_n_steps == 0:
            self.apply()


def launches_ranks(experiment) -> bool:
    """Whether Lightning would start more processes for this run: DDP over several devices of this machine."""
    devices = experiment.train.devices
    if devices == "auto":
        return experiment.train.accelerator in ("auto", "gpu", "cuda") and torch.cuda.device_count() > 1
    return devices > 1


def run_in_child(experiment, tracking_uri: str | None, runs_dir: Path):
    """Train a run on several devices through `gatelab train` in a child process, and read its outcome from MLflow.

    Lightning's launcher starts ranks 1..N-1 by re-running the command line of the process that calls `fit`: in a
    worker that line is `gatelab sweep worker`, whose copies would claim other runs of the ledger. The child's line is
    `gatelab train` of this run's resolved config, which every rank can re-run.
    """
    from gatelab.train.run import recorded_result

    folder = runs_dir / experiment.name / "launch"
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / f"{experiment.variant}-s{experiment.seed}-{spec_hash(experiment)}.yaml"
    config.write_text(to_yaml(experiment))
    command = [sys.executable, "-m", "gatelab", "train", str(config), "--quiet", "--runs-dir", str(runs_dir)]
    command += ["--verbose"] if is_verbose() else []
    if tracking_uri:
        command += ["--tracking-uri", tracking_uri]
    child = subprocess.Popen(command)
    try:
        code = child.wait()
    except Interrupted as interrupted:  # SIGTERM reaches only this process; the child must put its run away too
        child.send_signal(interrupted.signum)
        child.wait()
        raise
    if code != 0:
        raise GatelabError(f"`gatelab train {config}` exited with {code}")
    result = recorded_result(experiment, tracking_uri, runs_dir)
    if result is None:
        raise GatelabError(f"`gatelab train {config}` ended without a finished or diverged run in MLflow")
    return result


@dataclass
class WorkerReport:
    finished: list[str] = field(default_factory=list)
    diverged: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def work(sweep_path: Path, experiment: Path | None = None, storage: str | None = None, tracking_uri: str | None = None,
         runs_dir: Path = Path("runs"), threads: int | None = None, heartbeat_s: float = 10.0, grace_s: float = 60.0,
         log=print, progress: bool = False) -> WorkerReport:
    """Work until no run of the sweep is left. Each run says what it does through `log`, prefixed with this worker
    and the run's number; `progress` shows Lightning's bar (one worker in a terminal), else a plain line every
    GATELAB_PROGRESS_EVERY seconds. After each run, a line with the sweep's runs done and its time left."""
    sweep = load_sweep(sweep_path, experiment)
    specs = expand(sweep)
    by_hash = {spec.hash: spec for spec in specs}
    ledger = open_ledger(sweep, specs, storage, tracking_uri, runs_dir, heartbeat_s, grace_s)
    share = LocalShare.from_env()  # only the CPU workers of `gatelab sweep run --workers N` share cores
    if share is not None:
        share.enter()
        use_cores(share.home)
    elif threads:
        torch.set_num_threads(threads)
    from gatelab.train.run import run  # the training code is imported once per worker, here

    report = WorkerReport()
    costs = RunCosts()  # what this worker's runs cost, for the sweep's time left
    steps_by_hash = {spec.hash: spec.experiment.train.max_steps for spec in specs}
    busy_until: dict[str, float] = {}  # runs found being trained by another process: not tried again before then

    def train(spec, trial) -> None:
        """Train one claimed run and tell the ledger how it ended; nothing, where another worker took it over."""
        me = f"[{ledger.worker}] run {spec.index}"
        log(f"{me}: {spec.label()}")
        said = lambda message: log(f"{me}: {message}")  # noqa: E731  the run's own lines, named in a shared log
        callbacks = ()
        if share is not None:
            share.enter()
            if not spec.experiment.train.threads:  # a run with train.threads sets its own
                resize = ShareFreedCores(share)
                resize.apply()
                callbacks = (resize,)
        started = time.monotonic()
        with ledger.heartbeat(trial):
            try:
                if launches_ranks(spec.experiment):
                    result = run_in_child(spec.experiment, tracking_uri, runs_dir)
                else:
                    result = run(spec.experiment, tracking_uri=tracking_uri, runs_dir=runs_dir, log=said,
                                 bar=progress, extra_callbacks=callbacks, lease=ledger.lease(trial))
            except RunTakenOver as taken:  # the trial is the other worker's now: not a word to the ledger about it
                log(f"{me}: taken over by {taken.by}; stopped without writing")
                return
            except RunInProgress as busy:
                ledger.release(trial, f"being trained by {busy.owner.describe()}")
                busy_until[spec.hash] = time.time() + grace_s
                log(f"{me}: being trained by {busy.owner.describe()} outside this sweep; back in the queue, "
                    f"tried again in {grace_s:.0f} s")
                return
            except Exception:  # a failed run is recorded and retried; the worker goes on with the next
                error = traceback.format_exc()
                retried = ledger.fail(trial, error, sweep.retries)  # stored redacted
                log(f"{me} failed ({redact(error.strip().splitlines()[-1])}); "
                    + ("re-queued" if retried else f"no retries left after {sweep.retries}"))
                if not retried:
                    report.failed.append(spec.hash)
                return
        ledger.finish(trial, result.status, result.run_id, result.metrics.get("ppl/avg"), result.diverged_step)
        getattr(report, result.status).append(spec.hash)
        log(f"{me} {result.status}: MLflow run {result.run_id}")
        costs.record(time.monotonic() - started, result.trained_steps, result.train_s)
        states = ledger.states(specs)
        log(sweep_progress_line(sweep.name, states, sweep_time_left(states, steps_by_hash, costs, ledger.worker),
                                costs))

    with raise_on_signals():  # a signal between runs is the same exception as one inside `run`
        try:
            while True:
                for digest in ledger.fail_stale():
                    log(f"re-queued {by_hash[digest].label() if digest in by_hash else digest}: its worker stopped "
                        "beating")
                now = time.time()
                trial = ledger.claim(skip={digest for digest, until in busy_until.items() if until > now})
                if trial is None:
                    if share is not None:
                        share.leave()  # nothing to train: the runs still going take this worker's cores
                    if not ledger.unfinished():
                        return report
                    time.sleep(min(heartbeat_s, 5.0))  # runs still going elsewhere; one may need taking over
                    continue
                try:
                    spec = by_hash.get(trial.user_attrs[HASH])
                    if spec is None:
                        ledger.fail(trial, f"run {trial.user_attrs[HASH]} is no longer in {sweep_path}", retries=0)
                        continue
                    train(spec, trial)
                except Interrupted:
                    ignore_signals()  # while the run goes back to the queue
                    if ledger.still_claimed(trial):  # not if it had ended, or was taken over, before the signal
                        ledger.release(trial)
                        log(f"[{ledger.worker}] run {trial.user_attrs['gatelab.index']}: interrupted; back in the "
                            "queue")
                    raise
        finally:
            if share is not None:
                share.leave()
