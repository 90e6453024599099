"""The sweep's ledger and work queue: an Optuna study with one enqueued trial per RunSpec.

Workers `ask()` the study for the next waiting trial, so no two workers take the same run: Optuna pops a waiting
trial with a compare-and-set on its state (a row lock in PostgreSQL, the journal's lock in the embedded file).
States map onto trials: pending = WAITING, running = RUNNING (worker, start time and a heartbeat in user attributes),
finished and diverged = COMPLETE (the status in a user attribute; diverged runs are final), failed = FAIL. A run whose
worker died stops beating; the first worker to notice marks it FAIL (only one can: a finished trial cannot be set
again) and re-enqueues it, and the run then resumes from its checkpoint into the same MLflow run.

A worker's claim on a run is a `Claim`: the run's hash, cell number and label as the ledger stores them, and the Optuna
trial it stands for, which only the ledger touches. A claim is fenced: `lease(claim)` gives the training code a token
(the trial number) and asks the ledger whether the trial is still RUNNING, so a worker that was paused past the grace
period learns that its run was taken over and stops without writing; it never tells the ledger anything about that
trial again.

The ledger's storage (a journal file, or an RDB URL) is opened and checked in gatelab.sweep.ledger_storage; the lines
that tell a user what to run next are gatelab.sweep.next_commands.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import socket
import threading
import time
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import optuna
from optuna.exceptions import StorageInternalError, UpdateFinishedTrialError
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy.exc import SQLAlchemyError

from gatelab import host
from gatelab.errors import GatelabError, redact
from gatelab.sweep.ledger_storage import (
    default_storage,
    ledger_exists,
    open_storage,
    storage_use_failure,
    tracking_stores,
)
from gatelab.tracking import STATUS_TAG

SLURM_TASK = "gatelab.slurm_task"
WORKER_LOG = "gatelab.worker_log"
CELLS_FAILED = 1  # the exit code of `gatelab sweep run` and `sweep worker` when a cell ended failed
HASH = "gatelab.hash"
HEARTBEAT = "gatelab.heartbeat"
ATTEMPT = "gatelab.attempt"
optuna.logging.set_verbosity(optuna.logging.WARNING)


@dataclass(frozen=True)
class RunState:
    """One RunSpec as the ledger sees it (the newest trial of its hash that counts)."""

    hash: str
    index: int
    label: str
    status: str  # pending / running / finished / diverged / failed
    attempts: int  # begun and counted against the retries: a run given back (interrupted, a dead store) is not
    worker: str | None = None
    since: float | None = None
    mlflow_run_id: str | None = None
    diverged_step: int | None = None
    error: str | None = None
    value: float | None = None
    slurm_task: str | None = None  # the Slurm task ("123_4") of a running run's worker
    log: str | None = None  # that worker's log


@dataclass(frozen=True)
class Claim:
    """One run a worker took from the ledger (`SweepLedger.claim`), handed back to the ledger to beat on, finish, fail
    or release it. The fields are the trial's user attributes as the ledger stores them."""

    hash: str  # the RunSpec's content hash
    index: int  # its cell: the # column of `gatelab sweep status`
    label: str
    attempt: int  # 1 for a run's first try; a retry after a failure counts up
    number: int  # the Optuna trial's number: a takeover of the same run is a newer trial
    trial: optuna.Trial = field(repr=False, compare=False)  # for the ledger's writes only

    @classmethod
    def of(cls, trial: optuna.Trial, frozen: FrozenTrial) -> Claim:
        attrs = frozen.user_attrs
        return cls(attrs[HASH], attrs["gatelab.index"], attrs["gatelab.label"], attrs.get(ATTEMPT, 1), trial.number,
                   trial)


@dataclass(frozen=True)
class RunningTrial:
    """A run being trained somewhere, as a waiting worker reports it."""

    number: int  # the Optuna trial's
    index: int
    label: str
    worker: str
    silent_s: float  # since its worker's last heartbeat


@dataclass
class TrialLease:
    """A worker's claim on one trial, as the training code's `gatelab.train.ownership.Lease`: the token is the trial
    number (a takeover is a newer trial), lost once the trial is no longer RUNNING."""

    ledger: SweepLedger
    claim: Claim
    token: str
    holder: str
    check_every_s: float

    def lost(self) -> str | None:
        if self.ledger.still_claimed(self.claim):
            return None
        digest = frozen_trial(self.ledger.study, self.claim.trial).user_attrs.get(HASH)
        return self.ledger.running_worker(digest, newer_than=self.claim.number) or "the ledger"


def _why_not_reset(state: RunState) -> str:
    cell = f"cell {state.index} ({state.label}) is {state.status}"
    if state.status == "running":
        return (f"{cell} on {state.worker}: a reset would train it twice; stop that worker first (its run is taken "
                "over once its heartbeat stops)")
    if state.status in ("finished", "diverged"):
        return (f"{cell} in MLflow run {state.mlflow_run_id}: that is its result, never trained twice (a re-queued "
                "run would only be found done again); change the seed or the config for a new run")
    if state.status == "pending":
        return f"{cell}: it is already in the queue"
    return f"{cell}: `gatelab sweep run` puts it in the queue"


def _last_line(text: str | None) -> str | None:
    lines = (text or "").strip().splitlines()
    return lines[-1] if lines else None


def _trial_storage(study: optuna.Study, trial: optuna.Trial | FrozenTrial) -> tuple[BaseStorage, int]:
    """The storage of `study` and the id of `trial` in it, for the writes Optuna's public API does not offer: marking
    another worker's dead trial FAIL, beating from a helper thread, reading back a trial already told."""
    return study._storage, trial._trial_id


def set_trial_attr(study: optuna.Study, trial: optuna.Trial | FrozenTrial, key: str, value) -> None:
    storage, trial_id = _trial_storage(study, trial)
    storage.set_trial_user_attr(trial_id, key, value)


def set_trial_state(study: optuna.Study, trial: optuna.Trial | FrozenTrial, state: TrialState) -> bool:
    """Whether this call moved the trial to `state`; raises UpdateFinishedTrialError where it had finished already."""
    storage, trial_id = _trial_storage(study, trial)
    return storage.set_trial_state_values(trial_id, state)


def frozen_trial(study: optuna.Study, trial: optuna.Trial) -> FrozenTrial:
    storage, trial_id = _trial_storage(study, trial)
    return storage.get_trial(trial_id)


def _reported(method):
    """The ledger method, with a failure of its storage (a database gone, a journal made unreadable or unwritable
    under it) as one GatelabError naming the storage, its password hidden, and the fix."""
    @functools.wraps(method)
    def reported(self: SweepLedger, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except (SQLAlchemyError, StorageInternalError, OSError) as error:  # Optuna's wraps SQLAlchemy's
            raise GatelabError(storage_use_failure(self.storage_uri, error.__cause__ or error)) from None

    return reported


def worker_identity() -> str:
    """host:pid, and the Slurm task where the worker is one ("host:pid slurm 123_4")."""
    task = host.slurm_task_id()
    return f"{socket.gethostname()}:{os.getpid()}" + (f" slurm {task}" if task else "")


def slurm_attrs() -> tuple[tuple[str, str], ...]:
    """What a claim records of a Slurm worker: its task and its log, for `gatelab sweep status`."""
    task, log = host.slurm_task_id(), os.environ.get(host.SLURM_LOG_ENV)
    return tuple((key, value) for key, value in ((SLURM_TASK, task), (WORKER_LOG, log)) if value)


class NoLedgerYet(GatelabError):
    """A read-only look at a sweep whose study the storage does not hold: nothing has run yet."""


class SweepLedger:
    """The Optuna study of one sweep, seen as a queue of RunSpecs keyed by their content hash. A `read_only` ledger
    (`gatelab sweep status`, tables) only reads: it must exist already, and nothing is written to its storage."""

    def __init__(self, storage: str, sweep_name: str, heartbeat_s: float = 10.0, grace_s: float = 60.0,
                 tracking_uris: Collection[str] = (), read_only: bool = False):
        self.storage_uri, self.read_only = storage, read_only
        self.study = self._open_study(sweep_name, tracking_uris)
        self.heartbeat_s, self.grace_s = heartbeat_s, grace_s
        self.worker = worker_identity()

    @_reported
    def _open_study(self, sweep_name: str, tracking_uris: Collection[str]) -> optuna.Study:
        storage = open_storage(self.storage_uri, tracking_uris, read_only=self.read_only)
        try:  # loaded first: Optuna's create_study appends a line to a journal even where the study exists
            return optuna.load_study(study_name=sweep_name, storage=storage)
        except KeyError:
            if self.read_only:
                raise NoLedgerYet(f"sweep {sweep_name} has no ledger in {redact(self.storage_uri)}: nothing has "
                                   "run yet (pass --storage or --runs-dir if it lives elsewhere)") from None
        return optuna.create_study(study_name=sweep_name, storage=storage, load_if_exists=True, direction="minimize")

    @_reported
    def trials(self) -> list[FrozenTrial]:
        return self.study.get_trials(deepcopy=False)

    @_reported
    def enqueue_missing(self, specs: Sequence) -> int:
        """Add a waiting trial for each spec the study has never seen; returns how many were added."""
        known = {t.user_attrs.get(HASH) for t in self.trials()}
        added = 0
        for spec in specs:
            if spec.hash not in known:
                self.study.enqueue_trial({}, user_attrs={HASH: spec.hash, "gatelab.index": spec.index,
                                                         "gatelab.label": spec.label(), ATTEMPT: 1})
                added += 1
        return added

    def _requeue(self, trial: FrozenTrial, attempt: int) -> None:
        attrs = {k: trial.user_attrs[k] for k in (HASH, "gatelab.index", "gatelab.label")}
        self.study.enqueue_trial({}, user_attrs={**attrs, ATTEMPT: attempt})

    def _stale(self, trial: FrozenTrial, now: float) -> bool:
        if trial.state != TrialState.RUNNING:
            return False
        # A worker killed between Optuna's ask and its first beat leaves no heartbeat: its start time stands in.
        last_heard = trial.user_attrs.get(HEARTBEAT) or trial.datetime_start.timestamp()
        return now - last_heard > self.grace_s

    @_reported
    def fail_stale(self) -> list[str]:
        """Mark running trials whose heartbeat stopped as failed and put their runs back in the queue."""
        requeued = []
        for trial in self.trials():
            if not self._stale(trial, time.time()):
                continue
            storage, trial_id = _trial_storage(self.study, trial)
            if not self._stale(storage.get_trial(trial_id), time.time()):
                continue  # it beat again since the list was read: its worker is alive
            try:
                set_trial_attr(self.study, trial, "gatelab.error", "worker stopped beating")
                if not set_trial_state(self.study, trial, TrialState.FAIL):
                    continue
            except UpdateFinishedTrialError:
                continue  # another worker got there first
            self._requeue(trial, trial.user_attrs.get(ATTEMPT, 1))  # a dead worker is not the run's fault
            requeued.append(trial.user_attrs.get(HASH))
        return requeued

    @_reported
    def running(self) -> list[RunningTrial]:
        """The runs RUNNING on some worker, with how long since each was last heard from."""
        now = time.time()
        return [RunningTrial(trial.number, trial.user_attrs.get("gatelab.index", -1),
                             trial.user_attrs.get("gatelab.label", "?"), trial.user_attrs.get("gatelab.worker", "?"),
                             now - (trial.user_attrs.get(HEARTBEAT) or trial.datetime_start.timestamp()))
                for trial in self.trials() if trial.state == TrialState.RUNNING]

    def _blocked(self, claimed: FrozenTrial) -> bool:
        """A second trial of the same hash (two workers enqueued at once): the older or finished one wins."""
        digest = claimed.user_attrs.get(HASH)
        for other in self.trials():
            if other.number == claimed.number or other.user_attrs.get(HASH) != digest:
                continue
            if other.state == TrialState.COMPLETE:
                return True
            if other.state in (TrialState.RUNNING, TrialState.WAITING) and other.number < claimed.number:
                return True
        return False

    @_reported
    def claim(self, skip: Collection[str] = ()) -> Claim | None:
        """The next waiting run, now RUNNING for this worker; None when nothing is waiting but the runs in `skip`
        (hashes this worker found being trained by another process a moment ago)."""
        while any(t.state == TrialState.WAITING and t.user_attrs.get(HASH) not in skip for t in self.trials()):
            trial = self.study.ask()
            frozen = frozen_trial(self.study, trial)
            if HASH not in frozen.user_attrs:  # nothing was waiting after all: Optuna made a fresh trial
                set_trial_attr(self.study, trial, "gatelab.noop", True)
                self.study.tell(trial, state=TrialState.FAIL)
                return None
            if self._blocked(frozen):
                set_trial_attr(self.study, trial, "gatelab.noop", True)
                self.study.tell(trial, state=TrialState.FAIL)
                continue
            claim = Claim.of(trial, frozen)
            if claim.hash in skip:  # to the back of the queue, behind the runs this worker can train
                self.release(claim, "skipped: being trained by another process")
                continue
            for key, value in ((HEARTBEAT, time.time()), ("gatelab.worker", self.worker),
                               ("gatelab.started", time.time()), *slurm_attrs()):
                trial.set_user_attr(key, value)
            return claim
        return None

    def unfinished(self) -> bool:
        """Whether any run may still need work: waiting or running somewhere."""
        return any(t.state in (TrialState.WAITING, TrialState.RUNNING) for t in self.trials())

    def lease(self, claim: Claim) -> TrialLease:
        return TrialLease(self, claim, token=str(claim.number), holder=self.worker, check_every_s=self.heartbeat_s)

    @_reported
    def still_claimed(self, claim: Claim) -> bool:
        """Whether the claimed trial is still RUNNING, i.e. no other worker gave up on it (`fail_stale`)."""
        return frozen_trial(self.study, claim.trial).state == TrialState.RUNNING

    def running_worker(self, digest: str, newer_than: int) -> str | None:
        """The worker of a RUNNING trial of this run newer than trial `newer_than`: the one that took it over."""
        takers = [t for t in self.trials() if t.user_attrs.get(HASH) == digest and t.number > newer_than
                  and t.state == TrialState.RUNNING]
        return takers[-1].user_attrs.get("gatelab.worker") if takers else None

    @contextlib.contextmanager
    def heartbeat(self, claim: Claim) -> Iterator[None]:
        """Beat on the claimed trial until the block ends, or until it is no longer this worker's: a beat on a trial
        that was taken over must not make it look alive (nor add to a journal that another worker now owns)."""
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(self.heartbeat_s):
                with contextlib.suppress(Exception):  # a missed beat is retried; grace covers several
                    if not self.still_claimed(claim):
                        return
                    set_trial_attr(self.study, claim.trial, HEARTBEAT, time.time())

        thread = threading.Thread(target=beat, daemon=True, name="gatelab-heartbeat")
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    @_reported
    def finish(self, claim: Claim, status: str, run_id: str, value: float | None,
               diverged_step: int | None = None) -> None:
        trial = claim.trial
        trial.set_user_attr(STATUS_TAG, status)
        trial.set_user_attr("gatelab.mlflow_run_id", run_id)
        if diverged_step is not None:
            trial.set_user_attr("gatelab.diverged_step", diverged_step)
        finite = value is not None and math.isfinite(value)
        self.study.tell(trial, float(value) if finite else float("inf"))

    @_reported
    def fail(self, claim: Claim, error: str, retries: int) -> bool:
        """Record a failed run; re-enqueue it while attempts remain. Returns whether it was re-enqueued."""
        trial = claim.trial
        trial.set_user_attr("gatelab.error", redact(error)[-2000:])  # redacted whole: a cut URL would escape it
        self.study.tell(trial, state=TrialState.FAIL)
        frozen = frozen_trial(self.study, trial)
        attempt = frozen.user_attrs.get(ATTEMPT, 1)
        if attempt <= retries:
            self._requeue(frozen, attempt + 1)
            return True
        return False

    @_reported
    def release(self, claim: Claim, reason: str = "interrupted") -> None:
        """A run this worker gives back untrained or cut short (Ctrl-C): back in the queue, not counted as an
        attempt."""
        set_trial_attr(self.study, claim.trial, "gatelab.error", reason)
        self.study.tell(claim.trial, state=TrialState.FAIL)
        frozen = frozen_trial(self.study, claim.trial)
        self._requeue(frozen, frozen.user_attrs.get(ATTEMPT, 1))

    @_reported
    def reset(self, specs: Sequence, cells: Collection[int] = (), failed: bool = False) -> list[RunState]:
        """Put failed cells back in the queue with fresh attempts: every failed one with `failed`, plus those named
        by index in `cells`. A named cell that is not failed is refused, the whole call with it, before any change:
        a running one would be trained twice, and a finished or diverged one is a result (its worker would find it
        in MLflow and train nothing). Returns the cells re-queued."""
        states = self.states(specs)
        by_index = {state.index: state for state in states}
        unknown = sorted(set(cells) - by_index.keys())
        if unknown:
            raise GatelabError(f"--cell {unknown[0]}: this sweep's cells are {min(by_index)} to {max(by_index)} "
                               "(the # column of `gatelab sweep status`)")
        refused = [by_index[index] for index in sorted(set(cells)) if by_index[index].status != "failed"]
        if refused:
            raise GatelabError("; ".join(_why_not_reset(state) for state in refused))
        chosen = [state for state in states if state.index in cells or (failed and state.status == "failed")]
        newest = {}
        for trial in self.trials():
            if not trial.user_attrs.get("gatelab.noop"):
                newest[trial.user_attrs.get(HASH)] = trial  # trials come in number order: the last one wins
        for state in chosen:
            self._requeue(newest[state.hash], attempt=1)
        return chosen

    def states(self, specs: Sequence) -> list[RunState]:
        """One row per spec: the newest real trial of its hash decides its status."""
        by_hash: dict[str, list[FrozenTrial]] = {}
        for trial in self.trials():
            if HASH in trial.user_attrs and not trial.user_attrs.get("gatelab.noop"):
                by_hash.setdefault(trial.user_attrs[HASH], []).append(trial)
        rows = []
        for spec in specs:
            trials = sorted(by_hash.get(spec.hash, []), key=lambda t: t.number)
            done = [t for t in trials if t.state == TrialState.COMPLETE]
            live = [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
            chosen = done[0] if done else (live[0] if live else (trials[-1] if trials else None))
            if chosen is None:
                rows.append(RunState(spec.hash, spec.index, spec.label(), "not enqueued", 0))
                continue
            # ATTEMPT numbers a trial's attempt; a waiting trial's has not begun (attempts only grow until a reset)
            attempts = chosen.user_attrs.get(ATTEMPT, 1) - (chosen.state == TrialState.WAITING)
            status = {TrialState.WAITING: "pending", TrialState.RUNNING: "running",
                      TrialState.FAIL: "failed"}.get(chosen.state, chosen.user_attrs.get(STATUS_TAG, "finished"))
            rows.append(RunState(
                spec.hash, spec.index, spec.label(), status, attempts,
                worker=chosen.user_attrs.get("gatelab.worker") if status == "running" else None,
                since=chosen.user_attrs.get("gatelab.started"),
                mlflow_run_id=chosen.user_attrs.get("gatelab.mlflow_run_id"),
                diverged_step=chosen.user_attrs.get("gatelab.diverged_step"),
                error=_last_line(chosen.user_attrs.get("gatelab.error")) if status == "failed" else None,
                value=chosen.value if chosen.state == TrialState.COMPLETE else None,
                slurm_task=chosen.user_attrs.get(SLURM_TASK) if status == "running" else None,
                log=chosen.user_attrs.get(WORKER_LOG) if status == "running" else None,
            ))
        return rows


def waiting(states: Sequence[RunState]) -> int:
    """How many of a sweep's runs wait for a worker, by cell (a cell with two waiting trials counts once)."""
    return sum(state.status in ("pending", "not enqueued") for state in states)


def ledger_states(storage: str | None, runs_dir: Path, sweep_name: str, specs: Sequence) -> list[RunState]:
    """The ledger's view of each spec, read only: where no ledger exists yet none is made, and nothing is written."""
    storage = storage or default_storage(runs_dir, sweep_name)
    not_started = [RunState(spec.hash, spec.index, spec.label(), "not started", 0) for spec in specs]
    if not ledger_exists(storage, sweep_name):
        return not_started
    try:
        return SweepLedger(storage, sweep_name, read_only=True).states(specs)
    except NoLedgerYet:  # a ledger file shared with other sweeps that holds no study of this one yet
        return not_started


def open_ledger(sweep, specs, storage: str | None, tracking_uri: str | None, runs_dir: Path,
                heartbeat_s: float = 10.0, grace_s: float = 60.0) -> SweepLedger:
    """The sweep's ledger, holding every spec; storage that cannot be a ledger is refused here, before any training."""
    ledger = SweepLedger(storage or default_storage(runs_dir, sweep.name), sweep.name, heartbeat_s, grace_s,
                         tracking_uris=tracking_stores(specs, tracking_uri, runs_dir))
    ledger.enqueue_missing(specs)
    return ledger
