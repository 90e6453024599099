"""Who may write a run: one process at a time, and a process that has lost the run stops before it writes again.

Two guards, because each misses a case the other catches:
- A lock on `<run folder>/owner.lock`, held while the process trains, with `owner.json` beside it naming the holder.
  A second `gatelab train` of the same spec finds it held and says who holds it. The kernel drops the lock when the
  holder dies, so a killed run is never locked out.
- A sweep worker also holds a lease from the ledger (`Lease`). A stopped process (SIGSTOP, a frozen VM, a network
  partition) still holds its lock, so the ledger decides: after the grace period another worker takes the run over,
  writes its own lease token into owner.json and trains without the lock. The stopped process, once it runs again,
  sees before its next step (and before any checkpoint or metric) that owner.json names another token, or that the
  ledger took its lease, and stops without writing (`RunTakenOver`).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

import lightning as L


class Lease(Protocol):
    """A sweep worker's claim on one run, from the ledger."""

    token: str  # unique to this claim: a takeover claims anew and gets another token
    holder: str  # the worker, e.g. "host:pid"
    check_every_s: float  # how often the training thread asks the ledger (a paused process asks on waking)

    def lost(self) -> str | None:
        """None while the ledger still gives this process the run; else who took it over, for a message."""


@dataclass
class Owner:
    host: str
    pid: int
    token: str | None  # the lease token of a sweep worker; None for `gatelab train`
    since: float

    def describe(self) -> str:
        who = f"PID {self.pid} on host {self.host}"
        return who + (f" (sweep lease {self.token})" if self.token else "")


class RunInProgress(Exception):
    """Another process is training this run now."""

    def __init__(self, run_dir: Path, owner: Owner) -> None:
        self.run_dir, self.owner = run_dir, owner
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(owner.since))
        super().__init__(f"{run_dir.name} is being trained by {owner.describe()} since {since}; not training it "
                         "twice. Follow it in the MLflow UI, or run the same command again once it has ended "
                         "(it then resumes or reports the result)")


class RunTakenOver(Exception):
    """This process's claim on the run was taken over while it could not show it was alive."""

    def __init__(self, run_dir: Path, by: str) -> None:
        self.run_dir, self.by = run_dir, by
        super().__init__(f"{run_dir.name} was taken over by {by} while this process was not heard from; stopped "
                         "without writing to its checkpoint or its MLflow run")


class RunOwnership:
    """The guards of one run folder for one process; `acquire` before anything is written, `check` before each step
    and each write, `release` at the end."""

    def __init__(self, run_dir: Path, lease: Lease | None = None) -> None:
        self.run_dir, self.lease = run_dir, lease
        self.lock_path, self.record_path = run_dir / "owner.lock", run_dir / "owner.json"
        self._lock_file = None
        self._lease_checked = time.monotonic()
        self.me = Owner(socket.gethostname(), os.getpid(), lease.token if lease else None, time.time())

    def recorded_owner(self) -> Owner | None:
        try:
            return Owner(**json.loads(self.record_path.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def acquire(self) -> None:
        """Take the run, or raise RunInProgress naming who has it. A sweep worker with a lease takes it over from a
        holder the ledger gave up on (that holder stops at its next check, seeing another token here)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._lock_file = open(self.lock_path, "a")
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            locked = True
        except OSError as error:
            if error.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            locked = False
        holder = self.recorded_owner()
        taking_over = self.lease is not None and holder is not None and holder.token is not None
        if not locked and not taking_over:
            self._close()
            raise RunInProgress(self.run_dir, holder or Owner("?", 0, None, time.time()))
        self._write(self.me)

    def _write(self, owner: Owner) -> None:
        staged = self.record_path.with_name(f".owner.{os.getpid()}.tmp")
        staged.write_text(json.dumps(asdict(owner)))
        os.replace(staged, self.record_path)

    def check(self) -> None:
        """Raise RunTakenOver if another process now owns the run. Cheap enough for every step: one small file read,
        plus a ledger query every `lease.check_every_s` seconds (at once after a pause longer than that)."""
        holder = self.recorded_owner()
        if holder is not None and (holder.pid, holder.host, holder.token) != (self.me.pid, self.me.host, self.me.token):
            raise RunTakenOver(self.run_dir, holder.describe())
        if self.lease is not None and time.monotonic() - self._lease_checked >= self.lease.check_every_s:
            by = self.lease.lost()
            if by is not None:
                raise RunTakenOver(self.run_dir, by)
            self._lease_checked = time.monotonic()

    def held(self) -> bool:
        try:
            self.check()
        except RunTakenOver:
            return False
        return True

    def release(self) -> None:
        if self.held():
            self.record_path.unlink(missing_ok=True)
        self._close()

    def _close(self) -> None:
        if self._lock_file is not None:
            self._lock_file.close()  # drops the lock
            self._lock_file = None


class OwnershipFence(L.Callback):
    """Checks the run is still this process's before every step and at the end of every step, which comes before
    Lightning's checkpoint save and its metric logging of that step (checkpoint callbacks run last)."""

    def __init__(self, ownership: RunOwnership) -> None:
        self.ownership = ownership

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        self.ownership.check()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        self.ownership.check()
