"""The sweep's ledger and work queue: an Optuna study with one enqueued trial per RunSpec.

Workers `ask()` the study for the next waiting trial, so no two workers take the same run: Optuna pops a waiting
trial with a compare-and-set on its state (a row lock in PostgreSQL, the journal's lock in the embedded file).
States map onto trials: pending = WAITING, running = RUNNING (worker, start time and a heartbeat in user attributes),
finished and diverged = COMPLETE (the status in a user attribute; diverged runs are final), failed = FAIL. A run whose
worker died stops beating; the first worker to notice marks it FAIL (only one can: a finished trial cannot be set
again) and re-enqueues it, and the run then resumes from its checkpoint into the same MLflow run.

Embedded default: an Optuna journal file under `runs/<sweep>/`, not the MLflow database (the two clash on one SQLite
file). Shared mode: any Optuna RDB URL, e.g. PostgreSQL.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial, TrialState

from gatelab.errors import GatelabError, redact
from gatelab.tracking import STATUS_TAG

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
    attempts: int
    worker: str | None = None
    since: float | None = None
    mlflow_run_id: str | None = None
    diverged_step: int | None = None
    error: str | None = None
    value: float | None = None


def _last_line(text: str | None) -> str | None:
    lines = (text or "").strip().splitlines()
    return lines[-1] if lines else None


def _trial_storage(study: optuna.Study, trial: optuna.Trial | FrozenTrial) -> tuple[BaseStorage, int]:
    """The storage of `study` and the id of `trial` in it, for the writes Optuna's public API does not offer.

    Through the public API only the process that asked for a trial can tell it or set its attributes (`optuna.Trial`),
    and a `FrozenTrial` is read-only. The ledger must also mark another worker's dead trial FAIL, beat on its own trial
    from a helper thread, and read back a trial it has told; those go to the storage directly, by trial id, here only.
    """
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


def default_storage(runs_dir: Path, sweep_name: str) -> str:
    return str((runs_dir / sweep_name / "ledger.journal").resolve())


def open_storage(storage: str) -> BaseStorage:
    """A journal file path, or an RDB URL (postgresql://, sqlite:///...)."""
    if "://" in storage:
        try:
            return RDBStorage(storage, engine_kwargs={"pool_pre_ping": True})
        except Exception as error:  # SQLAlchemy raises many kinds; the message must not show a password
            raise GatelabError(f"ledger storage {redact(storage)}: cannot connect ({type(error).__name__})") from None
    Path(storage).parent.mkdir(parents=True, exist_ok=True)
    return JournalStorage(JournalFileBackend(storage))


class SweepLedger:
    """The Optuna study of one sweep, seen as a queue of RunSpecs keyed by their content hash."""

    def __init__(self, storage: str, sweep_name: str, heartbeat_s: float = 10.0, grace_s: float = 60.0):
        self.storage_uri = storage
        self.study = optuna.create_study(study_name=sweep_name, storage=open_storage(storage), load_if_exists=True,
                                         direction="minimize")
        self.heartbeat_s, self.grace_s = heartbeat_s, grace_s
        self.worker = f"{socket.gethostname()}:{os.getpid()}"

    def trials(self) -> list[FrozenTrial]:
        return self.study.get_trials(deepcopy=False)

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

    def _requeue(self, trial: FrozenTrial, count_attempt: bool) -> None:
        attrs = {k: trial.user_attrs[k] for k in (HASH, "gatelab.index", "gatelab.label")}
        attrs[ATTEMPT] = trial.user_attrs.get(ATTEMPT, 1) + (1 if count_attempt else 0)
        self.study.enqueue_trial({}, user_attrs=attrs)

    def fail_stale(self) -> list[str]:
        """Mark running trials whose heartbeat stopped as failed and put their runs back in the queue."""
        requeued = []
        now = time.time()
        for trial in self.trials():
            if trial.state == TrialState.RUNNING and now - trial.user_attrs.get(HEARTBEAT, now) > self.grace_s:
                try:
                    set_trial_attr(self.study, trial, "gatelab.error", "worker stopped beating")
                    if not set_trial_state(self.study, trial, TrialState.FAIL):
                        continue
                except UpdateFinishedTrialError:
                    continue  # another worker got there first
                self._requeue(trial, count_attempt=False)  # a dead worker is not the run's fault
                requeued.append(trial.user_attrs.get(HASH))
        return requeued

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

    def claim(self) -> optuna.Trial | None:
        """The next waiting run, now RUNNING for this worker; None when nothing is waiting."""
        while any(t.state == TrialState.WAITING for t in self.trials()):
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
            for key, value in ((HEARTBEAT, time.time()), ("gatelab.worker", self.worker),
                               ("gatelab.started", time.time())):
                trial.set_user_attr(key, value)
            return trial
        return None

    def unfinished(self) -> bool:
        """Whether any run may still need work: waiting or running somewhere."""
        return any(t.state in (TrialState.WAITING, TrialState.RUNNING) for t in self.trials())

    @contextlib.contextmanager
    def heartbeat(self, trial: optuna.Trial) -> Iterator[None]:
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(self.heartbeat_s):
                with contextlib.suppress(Exception):  # a missed beat is retried; grace covers several
                    set_trial_attr(self.study, trial, HEARTBEAT, time.time())

        thread = threading.Thread(target=beat, daemon=True, name="gatelab-heartbeat")
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def finish(self, trial: optuna.Trial, status: str, run_id: str, value: float | None,
               diverged_step: int | None = None) -> None:
        trial.set_user_attr(STATUS_TAG, status)
        trial.set_user_attr("gatelab.mlflow_run_id", run_id)
        if diverged_step is not None:
            trial.set_user_attr("gatelab.diverged_step", diverged_step)
        finite = value is not None and math.isfinite(value)
        self.study.tell(trial, float(value) if finite else float("inf"))

    def fail(self, trial: optuna.Trial, error: str, retries: int) -> bool:
        """Record a failed run; re-enqueue it while attempts remain. Returns whether it was re-enqueued."""
        trial.set_user_attr("gatelab.error", error[-2000:])
        self.study.tell(trial, state=TrialState.FAIL)
        frozen = frozen_trial(self.study, trial)
        if frozen.user_attrs.get(ATTEMPT, 1) <= retries:
            self._requeue(frozen, count_attempt=True)
            return True
        return False

    def release(self, trial: optuna.Trial) -> None:
        """An interrupted run (Ctrl-C): back in the queue, not counted as an attempt."""
        set_trial_attr(self.study, trial, "gatelab.error", "interrupted")
        self.study.tell(trial, state=TrialState.FAIL)
        self._requeue(frozen_trial(self.study, trial), count_attempt=False)

    def states(self, specs: Sequence) -> list[RunState]:
        """One row per spec: the newest real trial of its hash decides its status."""
        by_hash: dict[str, list[FrozenTrial]] = {}
        for trial in self.trials():
            if HASH in trial.user_attrs and not trial.user_attrs.get("gatelab.noop"):
                by_hash.setdefault(trial.user_attrs[HASH], []).append(trial)
        rows = []
        for spec in specs:
            trials = sorted(by_hash.get(spec.hash, []), key=lambda t: t.number)
            attempts = max((t.user_attrs.get(ATTEMPT, 1) for t in trials), default=0)
            done = [t for t in trials if t.state == TrialState.COMPLETE]
            live = [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
            chosen = done[0] if done else (live[0] if live else (trials[-1] if trials else None))
            if chosen is None:
                rows.append(RunState(spec.hash, spec.index, spec.label(), "not enqueued", 0))
                continue
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
            ))
        return rows


def ledger_states(storage: str | None, runs_dir: Path, sweep_name: str, specs: Sequence) -> list[RunState]:
    """The ledger's view of each spec, without creating a ledger where none exists yet."""
    storage = storage or default_storage(runs_dir, sweep_name)
    exists = True
    if "://" not in storage:
        exists = Path(storage).exists()
    else:
        exists = sweep_name in {s.study_name for s in optuna.get_all_study_summaries(open_storage(storage))}
    if not exists:
        return [RunState(spec.hash, spec.index, spec.label(), "not started", 0) for spec in specs]
    return SweepLedger(storage, sweep_name).states(specs)
