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

Embedded default: an Optuna journal file under `runs/<sweep>/`, not the MLflow database (the two clash on one SQLite
file). Shared mode: any Optuna RDB URL, e.g. PostgreSQL. Storage that cannot serve as a ledger is refused before any
training, with one message naming it (password hidden) and the fix.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import re
import shlex
import socket
import sys
import threading
import time
import urllib.parse
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import optuna
from optuna.exceptions import StorageInternalError, UpdateFinishedTrialError
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy.exc import SQLAlchemyError

from gatelab.errors import GatelabError, redact
from gatelab.interrupts import Interrupted
from gatelab.tracking import STATUS_TAG, run_tracking_uri, sqlite_file

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
    attempts: int
    worker: str | None = None
    since: float | None = None
    mlflow_run_id: str | None = None
    diverged_step: int | None = None
    error: str | None = None
    value: float | None = None


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


MLFLOW_TABLES = {"experiments", "runs", "metrics"}
STORAGE_FORMS = "a journal file path, sqlite:///path/to/ledger.db or postgresql://user@host:port/database"


def tracking_stores(specs: Iterable, tracking_uri: str | None, runs_dir: Path) -> set[str]:
    """The MLflow store of each spec's run, picked as `gatelab.train.run` picks it: the ledger must not be one."""
    return {run_tracking_uri(tracking_uri, spec.experiment, runs_dir, create=False) for spec in specs}


def open_storage(storage: str, tracking_uris: Collection[str] = (), read_only: bool = False) -> BaseStorage:
    """A journal file path, or an RDB URL (postgresql://, sqlite:///...); refused with a GatelabError naming the
    storage and the fix where it cannot be a ledger, e.g. one of the MLflow stores in `tracking_uris`. `read_only`
    storage is only read: no file, table or lock is made (`ledger_exists` says first whether there is a ledger)."""
    if "://" in storage:
        url = _database_url(storage)
        _check_database(storage, url, tracking_uris)
        try:
            return RDBStorage(storage, engine_kwargs=_engine_kwargs(url), skip_table_creation=read_only)
        except Exception as error:  # checked above; what is left is rare, and its text may hold the URL
            raise GatelabError(f"{_named(storage)}: {_hidden(_first_line(error), storage)}") from None
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:(?!//)", storage):
        raise GatelabError(f"{_named(storage)} looks like a URL without '//': valid forms are "
                           f"{STORAGE_FORMS} (write ./{shown_storage(storage)} for a file of that name)")
    return _open_journal(Path(storage), tracking_uris, read_only)


def _named(storage: str) -> str:
    """How every ledger message names the storage: the option that set it, and its value with the password hidden."""
    return f"ledger storage --storage {shown_storage(storage)}"


def shown_storage(storage: str) -> str:
    """`storage` as printed: redacted, and where it is a URL missing its '//' (which `redact` does not take for one),
    with everything between its user name and its last '@' hidden too."""
    text = redact(storage)
    if "://" in storage or "@" not in storage:
        return text
    userinfo, host = text.rsplit("@", 1)
    parts = userinfo.split(":")
    if len(parts) < 2:
        return text  # a path with an '@' in it, no password
    return ":".join(parts[:2] if len(parts) > 2 else parts[:1]) + ":***@" + host


def _first_line(error: BaseException) -> str:
    text = str(getattr(error, "orig", None) or error).strip()
    return redact(text.splitlines()[0] if text else type(error).__name__)


def _hidden(text: str, storage: str) -> str:
    """`text` without the password of `storage`, also where `redact` would keep it (a short or all-digit password,
    which it cannot tell from a port or a count without its URL beside it)."""
    if "://" not in storage:
        return text
    from sqlalchemy.engine import make_url

    try:
        password = make_url(storage).password
    except Exception:  # unreadable: `_database_url` refused it, quoting nothing of it
        return redact(text)
    if password and len(str(password)) >= 4:
        text = text.replace(str(password), "***").replace(urllib.parse.quote(str(password), safe=""), "***")
    return redact(text)


def _open_journal(path: Path, tracking_uris: Collection[str], read_only: bool) -> JournalStorage:
    if path.is_dir():
        raise GatelabError(f"{_named(str(path))} is a directory: give a file in it (e.g. {path / 'ledger.journal'}), "
                           "or leave --storage out for the default runs/<sweep>/ledger.journal")
    tracked = {file.resolve() for file in map(sqlite_file, tracking_uris) if file is not None}
    if path.resolve() in tracked or _is_sqlite(path):
        raise GatelabError(f"{_named(str(path))} is a SQLite database"
                           f"{' (the MLflow store)' * (path.resolve() in tracked)}"
                           ", not a ledger journal: Optuna would write into it. Give a file of its own, or leave "
                           "--storage out for the default runs/<sweep>/ledger.journal")
    try:
        if not read_only:
            path.parent.mkdir(parents=True, exist_ok=True)
        return JournalStorage(LedgerJournal(str(path), read_only=read_only))
    except OSError as error:
        verb = "read" if read_only else "create or write"
        raise GatelabError(f"{_named(str(path))}: cannot {verb} it ({error.strerror}): give a path in a folder "
                           "you can write to, or change its permissions") from None


def _is_sqlite(path: Path) -> bool:
    try:
        with path.open("rb") as file:
            return file.read(16) == b"SQLite format 3\x00"
    except OSError:
        return False


# A database server that accepts connections but never answers (a wrong port, a stuck server) is given up on after
# this long; a connection still pending after WAIT_NOTE_AFTER_S says what it waits for.
LEDGER_CONNECT_TIMEOUT_S = 10
WAIT_NOTE_AFTER_S = 2.0
PERCENT_ENCODE = ("percent-encode the special characters of the user name and password (@ as %40, : as %3A, / as "
                  "%2F, % as %25; python3 -c \"import urllib.parse; print(urllib.parse.quote(input(), safe=''))\" "
                  "prints a password so encoded)")


def _database_url(storage: str):
    """The storage's SQLAlchemy URL; refused, quoting nothing of it but its redacted form, where it cannot be read as
    one. A raw '@' in the password is refused first: SQLAlchemy splits the URL at it and would read the password's
    tail as the host and port, and quote it in its errors."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    authority = storage.split("://", 1)[1].split("?", 1)[0]
    if authority.count("@") > 1:
        raise GatelabError(f"{_named(storage)}: its user name or password holds a raw '@', so the URL cannot be "
                           f"split into user, password and host; {PERCENT_ENCODE}")
    try:
        return make_url(storage)
    except ArgumentError:
        problem = "is not a database URL"
    except ValueError:  # int() of the port
        problem = "has a port that is not a number (a raw ':' or '/' in the password also ends up there)"
    raise GatelabError(f"{_named(storage)} {problem}; valid forms are {STORAGE_FORMS}; {PERCENT_ENCODE}") from None


def _engine_kwargs(url) -> dict:
    """SQLAlchemy engine options for the ledger: the driver's connect time-out (libpq's and PyMySQL's
    `connect_timeout` cover the whole handshake, so a server that accepts and never answers ends too), and a check
    of pooled connections before use (a server restarted mid-sweep)."""
    if url.get_backend_name() in ("postgresql", "mysql", "mariadb"):
        return {"pool_pre_ping": True, "connect_args": {"connect_timeout": LEDGER_CONNECT_TIMEOUT_S}}
    return {"pool_pre_ping": True}


@contextlib.contextmanager
def _announced_wait(what: str) -> Iterator[None]:
    """Say on stderr what is being waited for, once the wait has lasted WAIT_NOTE_AFTER_S."""
    note = threading.Timer(WAIT_NOTE_AFTER_S, lambda: print(f"waiting for {what}", file=sys.stderr, flush=True))
    note.daemon = True
    note.start()
    try:
        yield
    finally:
        note.cancel()


def _check_database(storage: str, url, tracking_uris: Collection[str]) -> set[str]:
    """Connect once before Optuna creates its tables: a clear message for what cannot be reached, and never Optuna's
    tables inside an MLflow database (both keep an `alembic_version` table). Returns the database's tables."""
    import sqlalchemy

    if url.get_backend_name() == "sqlite":
        _check_sqlite_url(storage, url.database)
    if any(_same_database(storage, uri) for uri in tracking_uris):
        raise GatelabError(f"{_named(storage)} is the MLflow tracking database: give the ledger a database of "
                           "its own, or leave --storage out for the default runs/<sweep>/ledger.journal")
    where = f"{url.host or 'localhost'}" + (f":{url.port}" if url.port else "")
    try:
        engine = sqlalchemy.create_engine(storage, **_engine_kwargs(url))
        try:
            with _announced_wait(f"the ledger database at {where} to answer (--storage {redact(storage)}), up to "
                                 f"{LEDGER_CONNECT_TIMEOUT_S} s"), engine.connect() as connection:
                tables = set(sqlalchemy.inspect(connection).get_table_names())
        finally:
            engine.dispose()
    except Exception as error:  # SQLAlchemy and the drivers raise many kinds; each gets its own fix
        raise GatelabError(f"{_named(storage)}: {_hidden(_connection_problem(error, url), storage)}") from None
    if MLFLOW_TABLES <= tables:
        raise GatelabError(f"{_named(storage)} holds an MLflow tracking store: give the ledger a database of its "
                           "own, or leave --storage out for the default runs/<sweep>/ledger.journal")
    return tables


def _check_sqlite_url(storage: str, database: str | None) -> None:
    if not storage.startswith("sqlite:///") or database in (None, "", ":memory:"):
        raise GatelabError(f"{_named(storage)} is not a SQLite file (each process would get a ledger of its "
                           "own): write sqlite:///relative/path.db or sqlite:////absolute/path.db")
    path = Path(database)
    if path.is_dir():
        raise GatelabError(f"{_named(storage)} is a directory: name a file in it, e.g. "
                           f"sqlite:///{path / 'ledger.db'}")
    if not path.parent.is_dir():
        raise GatelabError(f"{_named(storage)}: folder {path.parent} does not exist: create it, or fix the path")


def _same_database(storage: str, tracking_uri: str) -> bool:
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    ledger_file, tracking_file = sqlite_file(storage), sqlite_file(tracking_uri)
    if ledger_file is not None or tracking_file is not None:
        return (ledger_file is not None and tracking_file is not None
                and ledger_file.resolve() == tracking_file.resolve())
    try:
        ledger, tracked = make_url(storage), make_url(tracking_uri)
    except (ArgumentError, ValueError):  # an MLflow file store, or a port that is not a number: not a database
        return False
    return (ledger.get_backend_name(), ledger.host, ledger.port, ledger.database) == \
        (tracked.get_backend_name(), tracked.host, tracked.port, tracked.database)


def _connection_problem(error: Exception, url) -> str:
    """What failed and what to do, from SQLAlchemy's and the driver's error."""
    from sqlalchemy.exc import NoSuchModuleError

    if isinstance(error, NoSuchModuleError):
        return f"unknown scheme {url.drivername!r}; valid forms are {STORAGE_FORMS}"
    if isinstance(error, ImportError):
        return (f"no driver for {url.drivername!r} is installed ({_first_line(error)}): install it, or use "
                f"{STORAGE_FORMS}")
    text = _first_line(error)
    where = f"{url.host or 'localhost'}" + (f":{url.port}" if url.port else "")
    if "timeout" in text.lower() or "timed out" in text.lower():
        return (f"the server at {where} did not answer within {LEDGER_CONNECT_TIMEOUT_S} s ({text}): check the host "
                "and port (PostgreSQL listens on 5432 by default), and that the server there is a database server "
                "that is not stuck")
    if "does not exist" in text and "database" in text:
        return (f"database {url.database!r} does not exist on the server at {where}: create it (e.g. createdb -h "
                f"{url.host or 'localhost'} {url.database}) or name an existing one")
    if "authentication failed" in text or ("role" in text and "does not exist" in text) or "password" in text:
        return (f"the server at {where} refused user {url.username!r} ({text.split('FATAL:')[-1].strip()}): "
                f"check the user name and password ({PERCENT_ENCODE})")
    if url.get_backend_name() == "sqlite":
        return f"cannot open the SQLite file {url.database} ({text}): check the path and its permissions"
    return (f"cannot reach a database server at {where} ({text.split('failed:')[-1].strip()}): check the host and "
            "port, and that the server runs there and accepts TCP connections")


class LedgerJournal(JournalFileBackend):
    """Optuna's journal file, whose read errors name the file, the line and the way out instead of a bare
    JSONDecodeError, which is never silently recreated empty once it was removed under a running worker, and whose
    torn last line (a process killed mid-write) is set aside before the next entry is appended, so it never joins it.
    Opened `read_only`, it makes no file and no lock, and refuses to append."""

    def __init__(self, file_path: str, read_only: bool = False) -> None:
        self.read_only = read_only
        if not read_only:
            super().__init__(file_path)
            return
        if not os.path.isfile(file_path):  # Optuna's own __init__ would create it
            raise GatelabError(f"ledger {file_path} does not exist")
        self._file_path, self._lock, self._log_number_offset = file_path, None, {0: 0}

    def read_logs(self, log_number_from: int) -> Iterator[dict]:
        self._require_file()
        try:
            for log in super().read_logs(log_number_from):
                if not isinstance(log, dict) or "op_code" not in log:
                    raise ValueError("not a journal entry")
                yield log
        except ValueError:  # json.JSONDecodeError, or Optuna's "Invalid log format."
            raise GatelabError(self._junk_message()) from None

    def append_logs(self, logs: list[dict]) -> None:
        if self.read_only:  # a read-only command reached a write: refused, the journal as it was
            raise GatelabError(f"ledger {self._file_path}: this command only reads the ledger, and writes nothing to "
                               "it")
        self._require_file()
        entries = "".join(json.dumps(log, separators=(",", ":")) + "\n" for log in logs).encode("utf-8")
        # Optuna's append, with the torn tail set aside under the same lock. A lock left by a process killed while
        # writing is taken after Optuna's 30 s without change: said at once, not after Optuna's 10 s warning.
        with _announced_wait(f"the ledger's lock {self._file_path}.lock, held by another process (one killed while "
                             "writing leaves it: taken over once it has not changed for 30 s)"):
            self._lock.acquire()
        try:
            self._set_aside_torn_tail()
            with open(self._file_path, "ab") as journal:
                journal.write(entries)
                journal.flush()
                os.fsync(journal.fileno())
        finally:
            self._lock.release()

    def _set_aside_torn_tail(self) -> None:
        """Under the journal's lock no gatelab process is writing, so a last line without its newline is a write that
        a killed process left cut short: no reader took it as an entry (Optuna skips it). Appending after it would
        join the next entry to it, and every reader would then stop at that line; so it goes to <journal>.torn and the
        journal is cut back to its last whole line."""
        with open(self._file_path, "r+b") as journal:
            torn_at = _torn_tail_start(journal)
            if torn_at is None:
                return
            journal.seek(torn_at)
            torn = journal.read()
            with open(self._file_path + ".torn", "ab") as aside:
                aside.write(torn + b"\n")
                aside.flush()
                os.fsync(aside.fileno())
            journal.truncate(torn_at)
            journal.flush()
            os.fsync(journal.fileno())
        print(f"ledger {self._file_path}: its last line was a torn write ({len(torn)} bytes that a process killed "
              f"while writing left), never read as an entry; moved to {self._file_path}.torn", file=sys.stderr)

    def _require_file(self) -> None:
        if not os.path.exists(self._file_path):
            raise GatelabError(f"ledger {self._file_path} was removed while this worker used it: its queue is gone, "
                               "so this worker stops. Run `gatelab sweep run` again to start a new ledger (runs "
                               "already finished are found in MLflow and not trained again)")

    def _junk_message(self) -> str:
        number, line = _first_junk_line(Path(self._file_path))
        joined = line.rfind('{"op_code"')
        if line.startswith('{"op_code"') and joined > 0:  # a torn write, with a whole entry appended after it
            return (f"ledger {self._file_path}: line {number} is a torn write (a process killed while writing the "
                    f"ledger) with the next entry joined to it by a writer that did not set it aside (Optuna itself, "
                    f"or an earlier gatelab). Keep the entry and drop the torn bytes (`sed -i.bak "
                    f"'{number}s/^.*{{\"op_code\"/{{\"op_code\"/' {self._file_path}` keeps the original as .bak), "
                    "then run the command again")
        return (f"ledger {self._file_path}: line {number} is not a ledger entry ({line[:60]!r}); something other "
                "than gatelab wrote to the file (gatelab's own torn writes are set aside, never left in the middle). "
                f"Move that line out of it (e.g. `sed -i.bak '{number}d' {self._file_path}` keeps the original as "
                ".bak), then run the command again")


def _torn_tail_start(journal) -> int | None:
    """The offset where the open journal's torn last line begins; None where it ends with a newline."""
    size = journal.seek(0, os.SEEK_END)
    if size == 0:
        return None
    journal.seek(size - 1)
    if journal.read(1) == b"\n":
        return None
    end = size
    while end > 0:  # back, block by block, to the newline before the torn line
        start = max(0, end - 65536)
        journal.seek(start)
        newline = journal.read(end - start).rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        end = start
    return 0


def torn_tail_note(storage: str) -> str | None:
    """A line for a journal ledger that ends in a torn write, which a read-only command leaves as it is; else None."""
    path = Path(storage)
    if "://" in storage or not path.is_file():
        return None
    try:
        with path.open("rb") as journal:
            torn_at = _torn_tail_start(journal)
            size = journal.seek(0, os.SEEK_END)
    except OSError:
        return None
    if torn_at is None:
        return None
    return (f"note: ledger {path} ends in a torn write ({size - torn_at} bytes that a process killed while writing "
            "left); no reader takes it as an entry, and the next `gatelab sweep run`, `worker` or `reset` moves it to "
            f"{path}.torn")


def _first_junk_line(path: Path) -> tuple[int, str]:
    """The number and text of the first line that is not a whole journal entry (the last line, if all are)."""
    number, text = 0, ""
    with path.open("rb") as file:
        for number, raw in enumerate(file, start=1):
            text = raw.decode("utf-8", errors="replace")
            try:
                entry = json.loads(text)
            except ValueError:
                entry = None
            if not raw.endswith(b"\n") or not isinstance(entry, dict) or "op_code" not in entry:
                return number, text.rstrip("\n")
    return number, text.rstrip("\n")


def _reported(method):
    """The ledger method, with a failure of its storage (a database gone, a journal made unreadable or unwritable
    under it) as one GatelabError naming the storage, its password hidden, and the fix."""
    @functools.wraps(method)
    def reported(self: SweepLedger, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except (SQLAlchemyError, StorageInternalError, OSError) as error:  # Optuna's wraps SQLAlchemy's
            raise GatelabError(_use_failure(self.storage_uri, error.__cause__ or error)) from None

    return reported


def _use_failure(storage: str, error: BaseException) -> str:
    if isinstance(error, OSError):
        what = f"{error.strerror or type(error).__name__}" + (f": {error.filename}" if error.filename else "")
        fix = "check that the file and its folder are there, readable and writable, and that the disk has room"
    elif storage.startswith("sqlite:"):
        what = _first_line(error)
        fix = "check that the SQLite file is the ledger's own, whole, readable and writable"
    else:
        what = _first_line(error)
        fix = "check that the database server runs and accepts connections"
    return (f"{_named(storage)} failed ({_hidden(what, storage)}): {fix}, then run the same command again (what the "
            "ledger holds is kept, and an interrupted run is taken over from its checkpoint)")


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
        self.worker = f"{socket.gethostname()}:{os.getpid()}"

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
                               ("gatelab.started", time.time())):
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
            attempts = chosen.user_attrs.get(ATTEMPT, 1)  # attempts only grow along a run's trials, until a reset
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


def ledger_exists(storage: str, sweep_name: str, tracking_uris: Collection[str] = ()) -> bool:
    """Whether the sweep has a ledger in `storage`, found without creating one or writing anything."""
    if "://" not in storage:
        return Path(storage).is_file()
    if "studies" not in _check_database(storage, _database_url(storage), tracking_uris):
        return False  # no Optuna tables: asking Optuna would create them
    return sweep_name in {s.study_name for s in optuna.get_all_study_summaries(
        open_storage(storage, tracking_uris, read_only=True), include_best_trial=False)}


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


def failed_cells_line(sweep_path: Path, experiment: Path | None, storage: str | None, runs_dir: Path) -> str | None:
    """One line naming the sweep's failed cells and the command that re-queues them; None when no cell failed."""
    from gatelab.sweep.spec import expand, load_sweep

    sweep = load_sweep(sweep_path, experiment)
    failed = [state for state in ledger_states(storage, runs_dir, sweep.name, expand(sweep))
              if state.status == "failed"]
    if not failed:
        return None
    command = ["gatelab", "sweep", "reset", str(sweep_path), "--failed"]
    command += ["--experiment", str(experiment)] if experiment else []
    command += ["--storage", shown_storage(storage)] if storage else []
    command += ["--runs-dir", str(runs_dir)] if runs_dir != Path("runs") else []
    cells = ", ".join(f"{state.index} ({state.label})" for state in failed)
    return (f"failed: cell{'s' * (len(failed) > 1)} {cells} (why: gatelab sweep status); once the cause is fixed, "
            f"re-queue {'them' if len(failed) > 1 else 'it'} with: {shlex.join(command)}")


# The command a user ran, set by `gatelab sweep run` in the environment of the workers it starts: their resume line
# names it, not the internal `gatelab sweep worker` command.
USER_COMMAND_ENV = "GATELAB_USER_COMMAND"
# Set where the launcher prints the resume line itself (local worker processes, submitit's local executor): a worker
# so started prints none.
LAUNCHER_SAYS_ENV = "GATELAB_LAUNCHER_SAYS_RESUME"


def user_command() -> str:
    """The command line the user typed (its passwords hidden): this process's, or its launcher's."""
    return os.environ.get(USER_COMMAND_ENV) or redact(shlex.join(["gatelab", *sys.argv[1:]]))


def interrupted_line(interrupted: Interrupted) -> str | None:
    """What to run to go on after Ctrl-C or SIGTERM: the command the user ran (its password hidden); None in a worker
    whose launcher says it."""
    if os.environ.get(LAUNCHER_SAYS_ENV) == "1":
        return None
    return (f"interrupted by {interrupted}: the run in progress is back in the queue; resume with: "
            f"{user_command()}")
