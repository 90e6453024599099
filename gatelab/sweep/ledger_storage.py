"""Where a sweep's ledger is kept, and the checks before Optuna touches it: an Optuna journal file (the embedded
default, under `runs/<sweep>/`), or an Optuna RDB URL (shared mode, e.g. PostgreSQL).

The journal is not the MLflow database: the two clash on one SQLite file. Storage that cannot serve as a ledger is
refused before any training, with one message naming it (password hidden) and the fix; the journal's read errors name
the line and the way out, and a torn last line is set aside under the journal's lock before the next append.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import sys
import threading
import time
import urllib.parse
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend

from gatelab.errors import GatelabError, redact
from gatelab.store_uris import run_tracking_uri, sqlite_file


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
            return _rdb_storage(storage, url, read_only)
        except Exception as error:  # checked above; what is left is rare, and its text may hold the URL
            raise GatelabError(f"{_named(storage)}: {_hidden(_first_line(error), storage)}") from None
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:(?!//)", storage):
        raise GatelabError(f"{_named(storage)} looks like a URL without '//': valid forms are "
                           f"{STORAGE_FORMS} (write ./{shown_storage(storage)} for a file of that name)")
    return _open_journal(Path(storage), tracking_uris, read_only)


SCHEMA_RACE_TRIES = 5
# The SQLSTATEs of two creates of one table at once on PostgreSQL: unique_violation (pg_type's name index, the one
# seen), duplicate_table, duplicate_object. Any other (42501, no privilege) is answered at once.
SCHEMA_RACE_STATES = frozenset({"23505", "42P07", "42710"})


def _rdb_storage(storage: str, url, read_only: bool) -> RDBStorage:
    """Optuna's RDBStorage. Workers started together on a new database (one per machine, a Slurm array) race to make
    its tables, and PostgreSQL refuses all but one ("duplicate key value violates unique constraint
    pg_type_typname_nsp_index"): the others open it again a moment later, when the tables are there."""
    from sqlalchemy.exc import IntegrityError, ProgrammingError

    for attempt in range(SCHEMA_RACE_TRIES - 1):
        try:
            return RDBStorage(storage, engine_kwargs=_engine_kwargs(url), skip_table_creation=read_only)
        except (IntegrityError, ProgrammingError) as error:
            if not _schema_race(error):
                raise
            time.sleep(0.2 + random.random() * (attempt + 1))
    return RDBStorage(storage, engine_kwargs=_engine_kwargs(url), skip_table_creation=read_only)  # its error is said


def _schema_race(error: Exception) -> bool:
    """Whether a failed open may be the schema race: a PostgreSQL state in SCHEMA_RACE_STATES, or a driver's error
    that names no state (MySQL's: tried again, as before)."""
    driver_error = getattr(error, "orig", None)
    state = getattr(driver_error, "sqlstate", None) or getattr(driver_error, "pgcode", None)
    return state is None or state in SCHEMA_RACE_STATES


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
        """Under the journal's lock a last line no reader takes as an entry (a killed process's cut-short write, or a
        whole line of other text), which Optuna skips as the last line; the next entry appended after it would stop
        every reader there, so it goes to <journal>.torn and the journal is cut back to its last entry."""
        with open(self._file_path, "r+b") as journal:
            tail = _unreadable_tail(journal)
            if tail is None:
                return
            journal.seek(tail.start)
            torn = journal.read().rstrip(b"\n")
            with open(self._file_path + ".torn", "ab") as aside:
                aside.write(torn + b"\n")
                aside.flush()
                os.fsync(aside.fileno())
            journal.truncate(tail.start)
            journal.flush()
            os.fsync(journal.fileno())
        print(f"ledger {self._file_path}: its last line, {tail.kind} ({len(torn)} bytes), was never read as an "
              f"entry; moved to {self._file_path}.torn", file=sys.stderr)

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


@dataclass(frozen=True)
class UnreadableTail:
    """A journal's last line that no reader takes as an entry: where it starts, and what it is, in words."""

    start: int
    kind: str


TORN_WRITE = "a torn write (what a process killed while writing leaves)"
OTHER_TEXT = "text that is not a ledger entry (something other than gatelab wrote it)"


def _unreadable_tail(journal) -> UnreadableTail | None:
    """The open journal's last line where no reader takes it as an entry: cut short (no newline), or whole but not a
    journal entry; None where it is an entry (or the journal is empty)."""
    size = journal.seek(0, os.SEEK_END)
    if size == 0:
        return None
    journal.seek(size - 1)
    whole = journal.read(1) == b"\n"
    end = size - 1 if whole else size
    start = 0
    while end > 0:  # back, block by block, to the newline before the last line
        block_start = max(0, end - 65536)
        journal.seek(block_start)
        newline = journal.read(end - block_start).rfind(b"\n")
        if newline >= 0:
            start = block_start + newline + 1
            break
        end = block_start
    if not whole:
        return UnreadableTail(start, TORN_WRITE)
    journal.seek(start)
    try:
        entry = json.loads(journal.read(size - start))
    except ValueError:
        entry = None
    return None if isinstance(entry, dict) and "op_code" in entry else UnreadableTail(start, OTHER_TEXT)


def torn_tail_note(storage: str) -> str | None:
    """A line for a journal ledger whose last line no reader takes as an entry (a torn write, or other text), which a
    read-only command leaves as it is and skips; else None."""
    path = Path(storage)
    if "://" in storage or not path.is_file():
        return None
    try:
        with path.open("rb") as journal:
            tail = _unreadable_tail(journal)
            size = journal.seek(0, os.SEEK_END)
    except OSError:
        return None
    if tail is None:
        return None
    return (f"note: ledger {path} ends in {tail.kind}, {size - tail.start} bytes that no reader takes as an entry: "
            "skipped here, and the next `gatelab sweep run`, `worker` or `reset` moves it to "
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


def storage_use_failure(storage: str, error: BaseException) -> str:
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


def ledger_exists(storage: str, sweep_name: str, tracking_uris: Collection[str] = ()) -> bool:
    """Whether the sweep has a ledger in `storage`, found without creating one or writing anything."""
    if "://" not in storage:
        return Path(storage).is_file()
    if "studies" not in _check_database(storage, _database_url(storage), tracking_uris):
        return False  # no Optuna tables: asking Optuna would create them
    return sweep_name in {s.study_name for s in optuna.get_all_study_summaries(
        open_storage(storage, tracking_uris, read_only=True), include_best_trial=False)}
