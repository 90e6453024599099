"""Whether an MLflow store can be used, said in words a user can act on: the pre-flight check before any training
(`check_store`), and any later failure of MLflow, requests, SQLAlchemy or sqlite3 as one GatelabError naming the store
and the fix (`store_errors`, `describe_store_failure`)."""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
import tempfile
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

from gatelab.errors import GatelabError, file_system_of, first_line, redact
from gatelab.store_uris import DEFAULT_STORE_FILE, sqlite_file

CHECK_TIMEOUT_S = 4.0  # each request of the pre-flight check of a server or database
# How long the pre-flight check waits for another process's lock on a SQLite store: as long as MLflow's own writes
# wait (timeout=60 in gatelab's SQLite URIs). At 5 s, a sweep's second worker on a loaded machine (2 cores, two
# other CPU-bound processes) found the store busy and failed a run that would have gone through.
SQLITE_LOCK_WAIT_S = 60.0
VALID_STORES = ("sqlite:///relative/path/mlflow.db or sqlite:////absolute/path/mlflow.db, http(s)://host:port (an "
                "`mlflow server`), postgresql://user@host/db, mysql://user@host/db, mssql://user@host/db, databricks")
SERVER_SCHEMES = ("http", "https")
_DATABASE_SCHEMES = ("postgresql", "mysql", "mssql")
_HOSTED_SCHEMES = ("databricks", "databricks-uc", "uc")  # checked by their own clients; "databricks" alone is a URI too


class StoreBusy(GatelabError):
    """A SQLite store whose write lock another process has held for longer than the check waits: the store is there
    and sound, only busy (a paused worker can hold it for minutes); an error before a command's first run, not a
    reason for a sweep worker to stop (MLflow's own connections wait out the lock)."""


def check_store(uri: str) -> None:
    """Raise GatelabError, within seconds and before any training, naming the URI and the fix, where the tracking
    store at `uri` cannot be used: a server that does not answer as MLflow does; a SQLite URI that is malformed, or
    whose folder is missing or read-only, or whose file is no SQLite database or is locked; a database server that
    cannot be reached; an unknown scheme."""
    scheme = urllib.parse.urlparse(uri).scheme.split("+")[0].lower()
    if uri in _HOSTED_SCHEMES or scheme in _HOSTED_SCHEMES:
        return
    if urllib.parse.urlparse(uri).netloc.count("@") > 1:
        raise GatelabError(f"tracking URI '{redact(uri)}': its password holds a raw '@', which ends it early; write "
                           "each '@' in it as %40")
    if scheme == "sqlite":
        _check_sqlite(uri)
    elif scheme in SERVER_SCHEMES:
        _check_server(uri)
    elif scheme in _DATABASE_SCHEMES:
        _check_database(uri, scheme)
    else:
        raise GatelabError(_unknown_scheme(uri, scheme))


def _unknown_scheme(uri: str, scheme: str) -> str:
    if scheme in ("", "file"):
        path = urllib.parse.urlparse(uri).path if scheme else uri
        database = path if path.endswith(".db") else f"{path.rstrip('/')}/{DEFAULT_STORE_FILE}"
        return (f"tracking URI '{redact(uri)}' names a folder store, which MLflow 3 no longer writes: for a SQLite "
                f"file there write sqlite:///{database} (valid stores: {VALID_STORES})")
    return f"tracking URI '{redact(uri)}': unknown scheme '{scheme}:'; use one of {VALID_STORES}"


def _check_sqlite(uri: str) -> None:
    path = sqlite_file(uri)
    where = f"tracking store {redact(uri)}"
    if path is None or not path.name:
        raise GatelabError(f"tracking URI '{redact(uri)}' is not a SQLite file URI: write "
                           "sqlite:///relative/path/mlflow.db or sqlite:////absolute/path/mlflow.db (three slashes, "
                           "then the path)")
    if path.is_dir():
        raise GatelabError(f"{where}: {path} is a folder, not a database file; "
                           f"write sqlite:///{path / DEFAULT_STORE_FILE}")
    folder = path.parent
    if not folder.is_dir():
        raise GatelabError(f"{where}: its folder {folder} does not exist; create it (mkdir -p {folder}) or fix the "
                           "path in the URI")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        raise GatelabError(f"{where}: its folder {folder} is not writable ({error.strerror}), and SQLite writes its "
                           "journal there; choose a writable folder or change its permissions") from error
    if path.exists():
        _check_sqlite_file(where, path)


def _check_sqlite_file(where: str, path: Path) -> None:
    """Take the write lock for a moment, as MLflow will (this reads the file's header and waits out a writer), and
    look for MLflow's tables beside any others."""
    connection = None
    try:
        connection = sqlite3.connect(path, timeout=SQLITE_LOCK_WAIT_S)
        connection.execute("BEGIN IMMEDIATE")
        connection.rollback()
        tables = {name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.OperationalError as error:
        if "locked" in str(error):
            raise StoreBusy(f"{where}: {path} is locked by another process, which has held it for more than "
                               f"{SQLITE_LOCK_WAIT_S:g} s; let it finish or stop it (fuser {path} names it), or pass "
                               "another --tracking-uri") from error
        raise GatelabError(f"{where}: {path} cannot be written as a SQLite database ({error}); check the file's "
                           "permissions, or pass another --tracking-uri") from error
    except sqlite3.DatabaseError as error:
        raise GatelabError(f"{where}: {path} is not a SQLite database ({error}); point the URI at MLflow's database "
                           "file, or move this file away and run again to start a new store") from error
    finally:
        if connection is not None:
            connection.close()
    if tables and "experiments" not in tables:
        raise GatelabError(f"{where}: {path} holds another program's tables ({', '.join(sorted(tables)[:5])}), not "
                           "MLflow's (an Optuna ledger and MLflow clash on one file); give MLflow a file of its own")


def _check_server(uri: str) -> None:
    """GET /health, then the cheapest API call, each once, with a short timeout."""
    from mlflow.exceptions import MlflowException
    from mlflow.utils.credentials import get_default_host_creds
    from mlflow.utils.rest_utils import http_request

    where = f"tracking server {redact(uri)}"
    credentials = get_default_host_creds(uri.rstrip("/"))
    for method, endpoint, body in (("GET", "/health", None),
                                   ("POST", "/api/2.0/mlflow/experiments/search", {"max_results": 1})):
        try:
            response = http_request(credentials, endpoint, method, max_retries=0, backoff_factor=0,
                                    backoff_jitter=0, timeout=CHECK_TIMEOUT_S, json=body)
        except MlflowException as error:
            raise GatelabError(f"{where} {_unanswered(error)}: start it (mlflow server --host HOST --port PORT "
                               "--backend-store-uri sqlite:///mlflow.db) or pass the right --tracking-uri (or "
                               "tracking.uri in the experiment file), then run the same command again") from error
        if response.status_code in (401, 403):
            raise GatelabError(f"{where} refused the request (HTTP {response.status_code}): set "
                               "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, or MLFLOW_TRACKING_TOKEN")
        if response.status_code != 200 or (body is not None and not _is_json(response)):
            raise GatelabError(f"{where} answers {method} {endpoint} with HTTP {response.status_code}, which an MLflow "
                               "tracking server does not: check the host and port (`mlflow server` listens on 5000 "
                               "by default)")


def _unanswered(error: BaseException) -> str:
    import requests

    cause = error.__cause__ or error.__context__
    if isinstance(cause, requests.exceptions.Timeout) or "timed out" in str(cause):
        return f"did not answer within {CHECK_TIMEOUT_S:g} s"
    if isinstance(cause, requests.exceptions.SSLError):
        return ("refused TLS (check its certificate: MLFLOW_TRACKING_SERVER_CERT_PATH names a CA bundle, "
                "MLFLOW_TRACKING_INSECURE_TLS=true skips the check)")
    if isinstance(cause, requests.exceptions.ConnectionError):
        return "cannot be reached (nothing listens there, or the host name does not resolve)"
    return f"failed ({first_line(error)})"


def _is_json(response) -> bool:
    try:
        response.json()
    except ValueError:
        return False
    return True


def _check_database(uri: str, scheme: str) -> None:
    import sqlalchemy

    where = f"tracking database {redact(uri)}"
    timeout = {"connect_timeout": int(CHECK_TIMEOUT_S)} if scheme in ("postgresql", "mysql") else {}
    try:
        engine = sqlalchemy.create_engine(uri, connect_args=timeout)
    except ModuleNotFoundError as missing:
        raise GatelabError(f"{where} needs the Python package '{missing.name}', its database driver: pip install it, "
                           "or name an installed driver in the scheme (postgresql+psycopg://...)") from missing
    except sqlalchemy.exc.ArgumentError as error:
        raise GatelabError(f"{where} is not a database URL ({first_line(error)}); write "
                           f"{scheme}://user:password@host:port/database") from error
    try:
        with engine.connect():
            pass
    except sqlalchemy.exc.SQLAlchemyError as error:
        raise GatelabError(f"{where}: cannot connect ({first_line(error)}); check that the database server runs, "
                           "and the host, port, database name and credentials in the URI") from error
    finally:
        engine.dispose()


# What SQLite's own messages mean to someone who did not write the query (sqlite3 says them under SQLAlchemy's and
# MLflow's wrappers, whose first lines are about sessions and autoflush).
_SQLITE_MEANINGS = (
    ("readonly database", "it can no longer be written (the file was deleted, replaced or made read-only)"),
    ("unable to open database file", "its file cannot be opened (deleted, moved, or its folder is gone)"),
    ("disk i/o error", "the disk failed to read or write it"),
    ("database or disk is full", "its disk is full"),  # then the file system's mount and room (file_system_of)
    ("database is locked", "another process holds its lock"),
    ("malformed", "its file is damaged"),
    ("no such table", "the file is no longer MLflow's database (a table is missing)"),
)


def describe_store_failure(uri: str, error: BaseException | None) -> str:
    """What happened to the store at `uri`, in plain words, for a failure of any library in between: a SQLite file
    that is gone or read-only is named as such; a server's failure says whether it answered; a database's, what its
    driver said (the innermost error, not the ORM's wrapping)."""
    path = sqlite_file(uri)
    if path is not None and not path.exists():
        return f"its database file {path} no longer exists (deleted or moved)"
    if path is not None and not os.access(path, os.W_OK):
        return f"its database file {path} is read-only"
    if error is None:
        return "it failed"
    if urllib.parse.urlparse(uri).scheme in SERVER_SCHEMES and _innermost(error, "requests") is not None:
        return f"the server {_unanswered(_innermost(error, 'requests'))}"
    driver = _innermost(error, "sqlite3") or _innermost(error, "psycopg") or _innermost(error, "pymysql")
    said = first_line(driver or error)
    said = re.sub(r"^\((\w+\.)*\w+\)\s*", "", said)  # SQLAlchemy's "(sqlite3.OperationalError) " prefix
    if path is not None:
        meaning = next((meaning for text, meaning in _SQLITE_MEANINGS if text in said.lower()), said)
        return meaning + (file_system_of(path) if "disk is full" in said.lower() else "")
    return said


def _innermost(error: BaseException, module: str) -> BaseException | None:
    """The innermost error in `error`'s chain (causes, contexts, SQLAlchemy's `orig`) raised by `module`'s code."""
    found, seen = None, set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if type(error).__module__.split(".")[0] == module:
            found = error
        error = getattr(error, "orig", None) or error.__cause__ or error.__context__
    return found


def _store_failure(uri: str, error: BaseException) -> str:
    """One line for a failure of the store at `uri`: what it said, and the fix for that kind of store."""
    scheme = urllib.parse.urlparse(uri).scheme
    path = sqlite_file(uri)
    if scheme in SERVER_SCHEMES:
        fix = (f"check that its `mlflow server` runs and answers ({redact(uri.rstrip('/'))}/health), or pass another "
               "--tracking-uri; then run the same command again")
    elif path is not None:
        fix = (f"check {path}: MLflow's SQLite database, writable, not held by another process; or pass another "
               "--tracking-uri")
    else:
        fix = ("check that the store runs, and the host, database and credentials in the URI; or pass another "
               "--tracking-uri")
    return f"MLflow tracking store {redact(uri)} failed: {describe_store_failure(uri, error)}; {fix}"


@contextlib.contextmanager
def store_errors(uri: str) -> Iterator[None]:
    """MLflow, requests, SQLAlchemy, sqlite3 and alembic failures of the store as one GatelabError naming it and the
    fix."""
    import alembic.util.exc
    import requests
    import sqlalchemy
    from mlflow.exceptions import MlflowException

    try:
        yield
    except (MlflowException, requests.RequestException, sqlalchemy.exc.SQLAlchemyError, sqlite3.Error,
            alembic.util.exc.CommandError) as error:  # alembic: a schema MLflow cannot migrate (a newer MLflow's)
        raise GatelabError(_store_failure(uri, error)) from error
