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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import lightning as L
import torch

from gatelab import host
from gatelab.config_files import to_yaml
from gatelab.data.identity import spec_hash
from gatelab.errors import GatelabError, redact
from gatelab.interrupts import Interrupted, ignore_signals, leave_slurm_warnings_to_the_task, raise_on_signals
from gatelab.metrics import PPL_AVG
from gatelab.progress import RunCosts, is_verbose, sweep_progress_line, sweep_time_left
from gatelab.store_checks import StoreBusy, check_store
from gatelab.store_uris import sqlite_file
from gatelab.sweep.executor import LocalShare
from gatelab.sweep.ledger_storage import tracking_stores
from gatelab.sweep.queue import Claim, SweepLedger, open_ledger, waiting
from gatelab.sweep.spec import RunSpec, Sweep, expand, load_sweep
from gatelab.train.ownership import RunInProgress, RunTakenOver
from gatelab.workspace import Workspace

if TYPE_CHECKING:  # the training code is imported once per worker, in `work`
    from gatelab.train.result import RunResult


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


def run_in_child(experiment, *, tracking_uri: str | None, runs_dir: Path):
    """Train a run on several devices through `gatelab train` in a child process, and read its outcome from MLflow.

    Lightning's launcher starts ranks 1..N-1 by re-running the command line of the process that calls `fit`: in a
    worker that line is `gatelab sweep worker`, whose copies would claim other runs of the ledger. The child's line is
    `gatelab train` of this run's resolved config, which every rank can re-run.
    """
    from gatelab.train.recording import recorded_result

    folder = runs_dir / experiment.name / "launch"
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / f"{experiment.variant}-s{experiment.seed}-{spec_hash(experiment)}.yaml"
    config.write_text(to_yaml(experiment))
    command = [sys.executable, "-m", "gatelab", "train", str(config), "--quiet", "--runs-dir", str(runs_dir)]
    command += ["--verbose"] if is_verbose() else []
    if tracking_uri:
        command += ["--tracking-uri", tracking_uri]
    from gatelab.sweep.slurm import publish_to_ranks

    publish_to_ranks(command)  # in a Slurm step of one task per device, its other ranks start the same command
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


def work(sweep_path: Path, *, experiment: Path | None = None, workspace: Workspace = Workspace(),
         threads: int | None = None, heartbeat_s: float = 10.0, grace_s: float = 60.0, log=print,
         progress: bool = False, claim_until: float | None = None) -> WorkerReport:
    """Work until no run of the sweep is left, or until `claim_until` (a time.time()) has passed: no run is claimed
    after it, and the one under way finishes (Optuna's `timeout`). Each run says what it does through `log`, prefixed
    with this worker and the run's number; `progress` shows Lightning's bar (one worker in a terminal), else a plain
    line every GATELAB_PROGRESS_EVERY seconds. After each run, a line with the sweep's runs done and its time left."""
    sweep = load_sweep(sweep_path, experiment)
    specs = expand(sweep)
    tracking_uri, runs_dir = workspace.tracking_uri, workspace.runs_dir
    # before the ledger is touched: a broken set-up fails no cell
    problem = setup_problem(specs, tracking_uri=tracking_uri, runs_dir=runs_dir)
    if problem:
        raise GatelabError(f"{problem} (this worker claimed no run: the sweep's ledger is as it was)")
    ledger = open_ledger(sweep, specs, storage=workspace.storage, tracking_uri=tracking_uri, runs_dir=runs_dir,
                         heartbeat_s=heartbeat_s, grace_s=grace_s)
    share = LocalShare.from_env()  # only the CPU workers of `gatelab sweep run --workers N` share cores
    if share is not None:
        share.enter()
        use_cores(share.home)
    elif threads:
        torch.set_num_threads(threads)
    from gatelab.train.run import load_training_code, run  # the training code is imported once per worker, here

    load_training_code()  # every run of this worker records the code loaded here, whatever the tree becomes

    worker = SweepWorker(sweep_path=sweep_path, sweep=sweep, specs=specs, ledger=ledger, share=share, run=run,
                         tracking_uri=tracking_uri, runs_dir=runs_dir, grace_s=grace_s, log=log, progress=progress)
    leave_slurm_warnings_to_the_task()
    with raise_on_signals():  # a signal between runs is the same exception as one inside `run`
        try:
            while True:
                if claim_until is not None and time.time() >= claim_until:
                    worker.say_timeout()
                    return worker.report
                claim = worker.claim_next()
                if claim is not None:
                    worker.work_on(claim)
                    continue
                if share is not None:
                    share.leave()  # nothing to train: the runs still going take this worker's cores
                if not ledger.unfinished():
                    return worker.report
                worker.say_what_it_waits_for()
                time.sleep(min(heartbeat_s, 5.0))  # runs still going elsewhere; one may need taking over
        finally:
            if share is not None:
                share.leave()


def setup_problem(specs: Sequence[RunSpec], *, tracking_uri: str | None, runs_dir: Path) -> str | None:
    """What is wrong with this worker's own set-up, where something is: an MLflow store its runs record to that
    cannot be used (a dead server, a bad URI). It is no cell's fault: checked before a claim, and again after a run
    fails, so that one worker with a bad `--tracking-uri` does not mark every cell it claims failed."""
    for uri in sorted(tracking_stores(specs, tracking_uri=tracking_uri, runs_dir=runs_dir)):
        path = sqlite_file(uri)
        if path is not None and not path.parent.is_dir():
            continue  # the embedded store under runs/, made with the first run
        try:
            check_store(uri)
        except StoreBusy:
            continue  # another worker holds its lock, perhaps paused: busy, not broken
        except GatelabError as error:
            return str(error)
    return None


@dataclass
class SweepWorker:
    """One worker process's hold on a sweep, across its runs: the ledger it claims from, the training function, where
    runs are recorded, and what it has learnt so far (its report, its runs' costs, runs busy elsewhere)."""

    sweep_path: Path
    sweep: Sweep
    specs: list[RunSpec]
    ledger: SweepLedger
    share: LocalShare | None  # this worker's cores, among the sweep's local CPU workers
    run: Callable[..., RunResult]  # gatelab.train.run.run
    tracking_uri: str | None
    runs_dir: Path
    grace_s: float
    log: Callable[[str], object]
    progress: bool  # Lightning's bar, not plain lines
    report: WorkerReport = field(default_factory=WorkerReport)
    costs: RunCosts = field(default_factory=RunCosts)  # what this worker's runs cost, for the sweep's time left
    # Runs this worker found being trained by another process, by hash: not tried again before then.
    busy_until: dict[str, float] = field(default_factory=dict)
    waited_on: frozenset[int] = frozenset()  # the trials it last said it waits for, so each wait is said once
    by_hash: dict[str, RunSpec] = field(init=False)
    steps_by_hash: dict[str, int] = field(init=False)  # for the sweep's time left

    def __post_init__(self) -> None:
        self.by_hash = {spec.hash: spec for spec in self.specs}
        self.steps_by_hash = {spec.hash: spec.experiment.train.max_steps for spec in self.specs}

    def claim_next(self) -> Claim | None:
        """Put runs whose worker stopped beating back in the queue, then claim the next run this worker may train."""
        for digest in self.ledger.fail_stale():
            self.log(f"re-queued {self.by_hash[digest].label() if digest in self.by_hash else digest}: its worker "
                     "stopped beating")
        now = time.time()
        return self.ledger.claim(skip={digest for digest, until in self.busy_until.items() if until > now})

    def work_on(self, claim: Claim) -> None:
        """Train a claimed run; on Ctrl-C or SIGTERM, put it back in the queue before the signal ends the worker."""
        try:
            spec = self.by_hash.get(claim.hash)
            if spec is None:
                self.ledger.fail(claim, f"run {claim.hash} is no longer in {self.sweep_path}", retries=0)
                return
            self.train(spec, claim)
        except Interrupted:
            ignore_signals()  # while the run goes back to the queue
            if self.ledger.still_claimed(claim):  # not if it had ended, or was taken over, before the signal
                self.ledger.release(claim)
                self.log(f"[{self.ledger.worker}] run {claim.index}: interrupted; back in the queue")
            raise

    def train(self, spec: RunSpec, claim: Claim) -> None:
        """Train one claimed run and tell the ledger how it ended; nothing, where another worker took it over."""
        me = f"[{self.ledger.worker}] run {spec.index}"
        self.log(f"{me}: {spec.label()}")
        callbacks = self.core_callbacks(spec)
        started = time.monotonic()
        with self.ledger.heartbeat(claim):
            result = self.attempt(spec, claim, me, callbacks)
        if result is not None:
            self.record(spec, claim, result, me, started)

    def core_callbacks(self, spec: RunSpec) -> tuple[L.Callback, ...]:
        """Among local CPU workers: this worker's cores now, and a callback that widens them as peers go idle."""
        if self.share is None:
            return ()
        self.share.enter()
        if spec.experiment.train.threads:  # a run with train.threads sets its own
            return ()
        resize = ShareFreedCores(self.share)
        resize.apply()
        return (resize,)

    def attempt(self, spec: RunSpec, claim: Claim, me: str, callbacks: tuple) -> RunResult | None:
        """The run's result; None where it was taken over, is being trained elsewhere, or failed (each told the
        ledger as it needs: a failure is recorded and retried, and the worker goes on with the next run)."""
        said = lambda message: self.log(f"{me}: {message}")  # noqa: E731  the run's own lines, named in a shared log
        try:
            if launches_ranks(spec.experiment):
                return run_in_child(spec.experiment, tracking_uri=self.tracking_uri, runs_dir=self.runs_dir)
            return self.run(spec.experiment, tracking_uri=self.tracking_uri, runs_dir=self.runs_dir, log=said,
                            bar=self.progress, extra_callbacks=callbacks, lease=self.ledger.lease(claim))
        except RunTakenOver as taken:  # the trial is the other worker's now: not a word to the ledger about it
            self.log(f"{me}: taken over by {taken.by}; stopped without writing")
        except RunInProgress as busy:
            self.ledger.release(claim, f"being trained by {busy.owner.describe()}")
            self.busy_until[spec.hash] = time.time() + self.grace_s
            self.log(f"{me}: being trained by {busy.owner.describe()} outside this sweep; back in the queue, "
                     f"tried again in {self.grace_s:.0f} s")
        except Exception:  # a failed run is recorded and retried; the worker goes on with the next
            error = traceback.format_exc()
            problem = setup_problem([spec], tracking_uri=self.tracking_uri, runs_dir=self.runs_dir)
            if problem:  # the worker's fault, not the run's: back in the queue untouched, and this worker stops
                self.ledger.release(claim, f"worker set-up failed: {problem}")
                raise GatelabError(f"{problem} (run {spec.index} is back in the queue, its attempts as they were; "
                                   "this worker stopped)") from None
            retried = self.ledger.fail(claim, error, self.sweep.retries)  # stored redacted
            self.log(f"{me} failed ({redact(error.strip().splitlines()[-1])}); "
                     + ("re-queued" if retried else f"no retries left after {self.sweep.retries}"))
            if not retried:
                self.report.failed.append(spec.hash)
        return None

    def say_timeout(self) -> None:
        """Past the launch's timeout: how many runs this worker leaves to a later launch."""
        left = waiting(self.ledger.states(self.specs))
        self.log(f"[{self.ledger.worker}] timeout: this worker starts no new run; {left} left waiting for a later "
                 "launch (the same command goes on with them)")

    def say_what_it_waits_for(self) -> None:
        """With nothing to claim while runs go on elsewhere: which runs it waits for, and how long at most before it
        takes over one whose worker has stopped beating (a SIGKILLed worker's run waits out --grace). Said once per
        set of runs."""
        running = self.ledger.running()
        numbers = frozenset(run.number for run in running)
        soonest = max(running, key=lambda run: run.silent_s, default=None)
        if soonest is None or numbers == self.waited_on or self.grace_s - soonest.silent_s <= 5:
            return  # nothing new, or a take-over within seconds: not worth a line
        self.waited_on = numbers
        runs = ", ".join(f"{run.index} ({run.label}) on {run.worker}, last heard {run.silent_s:.0f} s ago"
                         for run in running)
        self.log(f"[{self.ledger.worker}] nothing left to claim; waiting for run{'s' * (len(running) > 1)} {runs}. "
                 f"A run whose worker stays silent for {self.grace_s:.0f} s (--grace) is taken over: the soonest in "
                 f"{max(0.0, self.grace_s - soonest.silent_s):.0f} s, unless its worker beats again first")

    def record(self, spec: RunSpec, claim: Claim, result: RunResult, me: str, started: float) -> None:
        """Tell the ledger how the run ended, and say where the sweep stands."""
        self.ledger.finish(claim, result.status, result.run_id, result.metrics.get(PPL_AVG), result.diverged_step)
        getattr(self.report, result.status).append(spec.hash)
        self.log(f"{me} {result.status}: MLflow run {result.run_id}")
        self.costs.record(time.monotonic() - started, result.trained_steps, result.train_s)
        states = self.ledger.states(self.specs)
        self.log(sweep_progress_line(self.sweep.name, states,
                                     sweep_time_left(states, self.steps_by_hash, self.costs, self.ledger.worker),
                                     self.costs))
