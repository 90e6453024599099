"""Everything that talks to MLflow, as a small run store. Embedded default: a SQLite store and an artifact folder
under `runs/`.

MLflow 3 refuses the old `./mlruns` file store, so the default is `sqlite:///runs/mlflow.db`. A `--tracking-uri
http://host:port` to a real `mlflow server` works the same. Optuna keeps its own files: the two clash on one SQLite
file. mlflow is imported inside the functions that use it: `redact` and the tag names cost no MLflow import.

A store that cannot be used is one GatelabError naming it and the fix: before training (`check_store`), and from any
RunStore or TrackedRun call (`store_errors`). During training a tracking outage costs no time: metrics are queued and
sent by a thread (gatelab.metric_outbox), and kept on disk for the next run of the same command if it lasts.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import os
import re
import sqlite3
import subprocess
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gatelab.errors import (  # redact re-exported: callers that log a tracking URI find it here
    GatelabError,
    first_line,
    redact,
)
from gatelab.host import repo_root
from gatelab.metrics import KEY_METRICS, PPL_AVG  # KEY_METRICS re-exported: the view's columns, from the catalogue

if TYPE_CHECKING:
    import pandas as pd
    from mlflow.tracking import MlflowClient

    from gatelab.metric_outbox import MetricOutbox, QueuedMLFlowLogger

# The tags gatelab writes on its runs, named once.
SPEC_HASH_TAG = "gatelab.spec_hash"
STATUS_TAG = "gatelab.status"  # running / finished / diverged / pruned / failed / superseded
REPORT_TAG = "gatelab.report"  # the sweep-level run that holds `gatelab table`'s files
VARIANT_TAG, SEED_TAG, EXPERIMENT_TAG = "variant", "seed", "experiment"
RUN_NAME_TAG = "mlflow.runName"
REPORTS_OF_TAG = "gatelab.reports_of"  # on the experiment "<sweep> reports": the sweep whose report runs it holds

# What the MLflow UI opens on. Its JavaScript reads the experiment tag `mlflow.experimentKind` (no Python constant
# names it); "custom_model_development" is its training view, the runs table, where a missing tag lands on the GenAI
# overview. MLflow 3.17's UI takes the kind from its GenAI / Model training switch instead (the URL's `workflowType`,
# see gatelab.report.ui), so gatelab sets both.
EXPERIMENT_KIND_TAG, TRAINING_KIND = "mlflow.experimentKind", "custom_model_development"
# A saved view of the runs table, as the UI's "Views" menu writes it: the experiment tag `mlflow.sharedViewState.<key>`
# holding {name, createdAt, updatedAt, state}, `state` the JSON of the table's sort and columns. The UI opens it from
# the URL's `viewStateShareKey=<key>` and lists it under Views.
SAVED_VIEW_TAG_PREFIX = "mlflow.sharedViewState."
KEY_METRICS_VIEW = "gatelab-key-metrics"

# Bounds on every MLflow HTTP request of a gatelab process, where the user set none: with MLflow's own (7 retries with
# exponential backoff, a 120 s timeout) `--tracking-uri http://127.0.0.1:9` kept a run waiting 267 s.
HTTP_REQUEST_BOUNDS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                       "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
CHECK_TIMEOUT_S = 4.0  # each request of the pre-flight check of a server or database
# How long the pre-flight check waits for another process's lock on a SQLite store: as long as MLflow's own writes
# wait (timeout=60 in gatelab's SQLite URIs). At 5 s, a sweep's second worker on a loaded machine (2 cores, two
# other CPU-bound processes) found the store busy and failed a run that would have gone through.
SQLITE_LOCK_WAIT_S = 60.0
CLOSE_TIMEOUT_S = 15.0  # close_interrupted / close_failed give up after this: the process is on its way out
VALID_STORES = ("sqlite:///relative/path/mlflow.db or sqlite:////absolute/path/mlflow.db, http(s)://host:port (an "
                "`mlflow server`), postgresql://user@host/db, mysql://user@host/db, mssql://user@host/db, databricks")
_SERVER_SCHEMES = ("http", "https")
_DATABASE_SCHEMES = ("postgresql", "mysql", "mssql")
_HOSTED_SCHEMES = ("databricks", "databricks-uc", "uc")  # checked by their own clients; "databricks" alone is a URI too


DEFAULT_STORE_FILE = "mlflow.db"  # the embedded store's database, in the runs folder


def default_tracking_uri(runs_dir: Path, create: bool = True, *, as_written: bool = False) -> str:
    """The embedded store, the only place its URI is spelled: SQLite under runs/, waiting up to a minute for a lock
    (several local workers write to it at once). `create` makes runs/ (the store's folder) too. `as_written` keeps
    runs_dir as the user gave it (a relative folder stays relative, as a message names it) and adds no lock wait."""
    if create:
        runs_dir.mkdir(parents=True, exist_ok=True)
    if as_written:
        return f"sqlite:///{runs_dir / DEFAULT_STORE_FILE}"
    return f"sqlite:///{(runs_dir / DEFAULT_STORE_FILE).resolve()}?timeout=60"


def run_tracking_uri(tracking_uri: str | None, experiment, runs_dir: Path, create: bool = True) -> str:
    """The store a run records in: --tracking-uri, else the experiment's `tracking.uri`, else the embedded default."""
    return tracking_uri or experiment.tracking.uri or default_tracking_uri(runs_dir, create)


def sqlite_file(uri: str) -> Path | None:
    """The database file of a `sqlite:///` (or `sqlite+driver:///`) tracking URI, relative or absolute; None for any
    other store."""
    file_uri = re.match(r"sqlite(\+\w+)?:///", uri)
    if file_uri is None:
        return None
    return Path(uri[file_uri.end():].split("?", 1)[0])


def missing_local_store(uri: str) -> str | None:
    """Why a SQLite store that is only to be read holds nothing (its file does not exist), else None: reading one would
    create it, empty, and answer "no such run"."""
    path = sqlite_file(uri)
    if path is not None and not path.is_file():
        return f"no MLflow store at {path}: train or run a sweep first, or pass --runs-dir or --tracking-uri"
    return None


def read_only_store(uri: str) -> str | None:
    """Why a local SQLite store must only be read, else None: its file or folder has no write permission (the mode
    bits are honoured even for root, who could write anyway: `chmod -w` is how a user says "do not write here")."""
    path = sqlite_file(uri)
    if path is None or not path.is_file():
        return None
    for where in (path, path.resolve().parent):
        if not where.stat().st_mode & 0o222 or not os.access(where, os.W_OK):
            return f"{where} is read-only"
    return None


def always_allowed() -> bool:
    return True


def reports_experiment(experiment_name: str) -> str:
    """The experiment that holds a sweep's report run, apart from its training runs (their table and charts)."""
    return f"{experiment_name} reports"


def key_metrics_view(now_ms: int | None = None) -> str:
    """The saved view KEY_METRICS_VIEW: the runs table sorted by ppl/avg (lowest first), its columns the key metrics
    of the catalogue (gatelab.metrics; a metric no run has is no column) and the run's gatelab status. The value of
    its SAVED_VIEW_TAG_PREFIX tag."""
    import json

    columns = [f"metrics.`{name}`" for name in KEY_METRICS] + [f"tags.`{STATUS_TAG}`"]
    state = {"orderByKey": f"metrics.`{PPL_AVG}`", "orderByAsc": True, "selectedColumns": columns,
             "columnOrder": columns}
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    return json.dumps({"name": "gatelab: key metrics", "createdAt": now_ms, "updatedAt": now_ms,
                       "state": json.dumps(state)})


def landing_tags() -> dict[str, str]:
    """The experiment tags that make the MLflow UI open an experiment on its training runs, in gatelab's view."""
    return {EXPERIMENT_KIND_TAG: TRAINING_KIND, SAVED_VIEW_TAG_PREFIX + KEY_METRICS_VIEW: key_metrics_view()}


def bound_http_requests() -> None:
    for name, value in HTTP_REQUEST_BOUNDS.items():
        os.environ.setdefault(name, value)


def client(uri: str) -> MlflowClient:
    from mlflow.tracking import MlflowClient

    bound_http_requests()
    return MlflowClient(uri)


def prepare_store(uri: str) -> None:
    """Check the tracking store, then create (and migrate) it once, before several workers open it: concurrent first
    opens of one SQLite file race in MLflow's schema migrations."""
    check_store(uri)
    with store_errors(uri):
        client(uri).search_experiments(max_results=1)


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
    elif scheme in _SERVER_SCHEMES:
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
    ("database or disk is full", "its disk is full"),
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
    if urllib.parse.urlparse(uri).scheme in _SERVER_SCHEMES and _innermost(error, "requests") is not None:
        return f"the server {_unanswered(_innermost(error, 'requests'))}"
    driver = _innermost(error, "sqlite3") or _innermost(error, "psycopg") or _innermost(error, "pymysql")
    said = first_line(driver or error)
    said = re.sub(r"^\((\w+\.)*\w+\)\s*", "", said)  # SQLAlchemy's "(sqlite3.OperationalError) " prefix
    if path is not None:
        return next((meaning for text, meaning in _SQLITE_MEANINGS if text in said.lower()), said)
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
    if scheme in _SERVER_SCHEMES:
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


def _reported(method):
    """The method, with the failures of `self.uri`'s store as GatelabErrors (store_errors)."""
    @functools.wraps(method)
    def reported(self, *args, **kwargs):
        with store_errors(self.uri):
            return method(self, *args, **kwargs)
    return reported


class RunStore:
    """One MLflow tracking store seen as gatelab's runs: find them, read them back, log a report beside them."""

    def __init__(self, uri: str, runs_dir: Path = Path("runs"), read_only: bool = False) -> None:
        """`read_only`: only read (gatelab ui, table on a read-only store): no experiment is created or tagged and no
        report logged."""
        self.uri, self.runs_dir, self.read_only = uri, runs_dir, read_only
        with store_errors(uri):
            self.client = client(uri)

    @_reported
    def experiment_id(self, name: str, tags: dict[str, str] | None = None) -> str:
        """The experiment of this name, created (with its artifacts under runs_dir for a local store, and `tags`) if
        missing. Either way it carries landing_tags(), so the MLflow UI opens it on its runs."""
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            self.ensure_landing_tags(found)
            return found.experiment_id
        artifacts = None
        if not self.uri.startswith(("http://", "https://")):  # a server chooses its own artifact store
            artifacts = (self.runs_dir / "mlartifacts").resolve().as_uri()
        return self.client.create_experiment(name, artifact_location=artifacts, tags={**landing_tags(), **(tags or {})})

    def ensure_landing_tags(self, experiment) -> None:
        """Add the landing tags an experiment lacks (one made before gatelab set them, or by someone else); a tag it
        has, even changed from the UI (an updated saved view), is kept. A read-only store is left as it is."""
        if self.read_only:
            return
        for key, value in landing_tags().items():
            if key not in experiment.tags:
                self.client.set_experiment_tag(experiment.experiment_id, key, value)

    def browsable_experiments(self) -> list[tuple[str, str]]:
        """(name, id) of every active experiment with runs, report experiments aside, oldest first; each gets its
        landing tags (unless the store is read-only)."""
        return [(name, experiment_id) for name, experiment_id, _ in self.browsable_experiment_views()]

    @_reported
    def browsable_experiment_views(self) -> list[tuple[str, str, bool]]:
        """browsable_experiments with whether each has gatelab's saved view of the runs table (always, unless the
        store is read-only: then only where gatelab set it when it made the experiment)."""
        found = []
        for experiment in self.client.search_experiments(order_by=["creation_time ASC"]):
            if REPORTS_OF_TAG in experiment.tags:
                continue
            if not self.client.search_runs([experiment.experiment_id], max_results=1):
                continue  # MLflow's empty "Default", or an experiment whose first run has not started
            self.ensure_landing_tags(experiment)
            has_view = not self.read_only or SAVED_VIEW_TAG_PREFIX + KEY_METRICS_VIEW in experiment.tags
            found.append((experiment.name, experiment.experiment_id, has_view))
        return found

    @_reported
    def find_run(self, experiment_name: str, spec_hash: str) -> str | None:
        """The newest MLflow run of this spec hash, so a resumed run continues the same MLflow run."""
        runs = self.client.search_runs([self.experiment_id(experiment_name)],
                                       filter_string=f"tags.`{SPEC_HASH_TAG}` = '{spec_hash}'",
                                       order_by=["attributes.start_time DESC"], max_results=1)
        return runs[0].info.run_id if runs else None

    @_reported
    def sweep_runs(self, experiment_name: str) -> pd.DataFrame:
        """Every gatelab run of an experiment, newest first, as `mlflow.search_runs` lays it out: run_id, status,
        start_time, end_time (UTC timestamps), one `metrics.<name>` column per metric and one `tags.<name>` per tag.
        Empty where the experiment does not exist yet. Read through this store's client, never MLflow's global URI."""
        import pandas as pd

        experiment = self.client.get_experiment_by_name(experiment_name)
        rows: list[dict[str, Any]] = []
        if experiment is not None:
            token = None
            while True:
                page = self.client.search_runs([experiment.experiment_id],
                                               filter_string=f"tags.`{SPEC_HASH_TAG}` != ''",
                                               order_by=["attributes.start_time DESC"], page_token=token)
                rows += [_run_row(run) for run in page]
                token = page.token
                if not token:
                    break
        frame = pd.DataFrame(rows)
        for column in ("start_time", "end_time"):
            if column in frame:
                frame[column] = pd.to_datetime(frame[column], unit="ms", utc=True)
        return frame

    @_reported
    def metric_history(self, run_id: str, name: str) -> tuple[list[int], list[float]]:
        """(steps, values) of one metric of one run, in step order."""
        history = sorted(self.client.get_metric_history(run_id, name), key=lambda m: m.step)
        return [m.step for m in history], [m.value for m in history]

    def artifact_text(self, run_id: str, path: str) -> str | None:
        """A text artifact of a run; None where the artifact store cannot give it (a missing plot, never a failed
        report)."""
        from mlflow.artifacts import download_artifacts

        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one bar per small file is noise
        try:
            local = download_artifacts(run_id=run_id, artifact_path=path, tracking_uri=self.uri)
        except Exception:  # MLflow raises many kinds for a missing file or an unreachable artifact store
            return None
        return Path(local).read_text()

    def artifact_json(self, run_id: str, path: str) -> Any | None:
        """A JSON artifact of a run, parsed; None where the artifact store cannot give it."""
        import json

        text = self.artifact_text(run_id, path)
        return None if text is None else json.loads(text)

    @_reported
    def artifact_location(self, run_id: str) -> str:
        """Where the run's experiment keeps artifacts ('' where the store does not say)."""
        experiment = self.client.get_run(run_id).info.experiment_id
        return self.client.get_experiment(experiment).artifact_location or ""

    @_reported
    def finished_run_metrics(self, prefixes: tuple[str, ...], seed: int | None = None) -> list[dict[str, float]]:
        """For every run of every experiment that gatelab recorded as finished (of one seed), its metrics whose names
        start with one of `prefixes`."""
        experiments = [e.experiment_id for e in self.client.search_experiments()]
        query = f"tags.`{STATUS_TAG}` = 'finished'" + (f" AND tags.`{SEED_TAG}` = '{seed}'" if seed is not None else "")
        runs = self.client.search_runs(experiments, query)
        return [{k: v for k, v in run.data.metrics.items() if k.startswith(prefixes)} for run in runs]

    @_reported
    def run_tags(self, run_id: str) -> dict[str, str]:
        """The run's tags; a run id the store does not have is one error naming it."""
        from mlflow.exceptions import MlflowException

        try:
            return dict(self.client.get_run(run_id).data.tags)
        except MlflowException as error:
            if error.error_code not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                raise  # the store itself failed: store_errors says so
            raise GatelabError(f"no MLflow run '{run_id}' in {redact(self.uri)}: check the id (the MLflow UI, or "
                               "`gatelab sweep status`), or pass --tracking-uri for another store") from None

    @_reported
    def log_scores(self, run_id: str, metrics: dict[str, float], tags: dict[str, str], paths: Iterable[Path],
                   folder: str) -> None:
        """Scores of an ended run (benchmarks scored after training): metrics, the files as artifacts under `folder`,
        then `tags`, last, so a tag is never there without what it vouches for."""
        from mlflow.entities import Metric, RunTag

        now = int(time.time() * 1000)
        self.client.log_batch(run_id, metrics=[Metric(k, v, now, 0) for k, v in metrics.items()])
        for path in paths:
            self.client.log_artifact(run_id, str(path), folder)
        self.client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])

    @_reported
    def log_report(self, experiment_name: str, paths: Iterable[Path]) -> str | None:
        """The files of a report as artifacts of one sweep-level run (tagged REPORT_TAG), so the report opens from the
        MLflow UI too. The run lives in the experiment reports_experiment(experiment_name), so the training runs'
        table and charts hold training runs only. Returns that run's id; None on a read-only store (nothing logged)."""
        if self.read_only:
            return None
        experiment = self.experiment_id(reports_experiment(experiment_name), {REPORTS_OF_TAG: experiment_name})
        found = self.client.search_runs([experiment], filter_string=f"tags.`{REPORT_TAG}` = 'true'", max_results=1)
        run_id = found[0].info.run_id if found else self.client.create_run(
            experiment, tags={REPORT_TAG: "true", RUN_NAME_TAG: f"{experiment_name} report"}).info.run_id
        for path in paths:
            self.client.log_artifact(run_id, str(path), "report")
        self.client.set_terminated(run_id, "FINISHED")
        self._retire_report_runs_among_training_runs(experiment_name)
        return run_id

    def _retire_report_runs_among_training_runs(self, experiment_name: str) -> None:
        """A gatelab before the reports experiment logged the report among the training runs: once its files are in
        the new report run, that one is deleted (MLflow's soft delete: the UI's "State: Deleted" still shows it)."""
        training = self.client.get_experiment_by_name(experiment_name)
        if training is None:
            return
        for run in self.client.search_runs([training.experiment_id], filter_string=f"tags.`{REPORT_TAG}` = 'true'"):
            self.client.delete_run(run.info.run_id)


def lightning_logger(experiment_name: str, uri: str, run_id: str | None = None, tags: dict[str, str] | None = None,
                     run_name: str | None = None) -> QueuedMLFlowLogger:
    """Lightning's MLflow logger, its metrics queued (see gatelab.metric_outbox): a new run of the experiment (tagged
    `tags`), or the existing run `run_id`."""
    from gatelab.metric_outbox import QueuedMLFlowLogger

    bound_http_requests()
    return QueuedMLFlowLogger(experiment_name=experiment_name, tracking_uri=uri, run_id=run_id, tags=tags,
                              run_name=run_name)


class TrackedRun:
    """The MLflow run of one gatelab run (one spec hash), from finding it again to its last tag; the training process
    opens it on rank 0 only.

    An ended run (finished or diverged) is a result, never trained twice. A run resumed from its checkpoint logs into
    the same MLflow run. One that must start again from step 0 (its checkpoint is lost, or it started on another
    machine) gets a new MLflow run, and the old one, if it was cut off RUNNING, is closed as KILLED.

    Metrics are queued and sent by a thread; `flush` waits for them, and keeps them in `unsent_path` if the store does
    not take them (the next `open` sends them). Once `writes_allowed()` is False (set it to the run's ownership check;
    the sending thread calls it too), nothing more is written to the run.
    """

    def __init__(self, uri: str, runs_dir: Path, experiment_name: str, spec_hash: str,
                 unsent_path: Path | None = None) -> None:
        check_store(uri)
        self.store = RunStore(uri, runs_dir)
        self.experiment_name, self.spec_hash, self.unsent_path = experiment_name, spec_hash, unsent_path
        self.writes_allowed: Callable[[], bool] = always_allowed
        self.run_id = self.store.find_run(experiment_name, spec_hash)
        self.logger: QueuedMLFlowLogger | None = None

    @property
    def client(self) -> MlflowClient:
        return self.store.client

    @property
    def uri(self) -> str:
        return self.store.uri

    @_reported
    def recorded_outcome(self) -> tuple[str, dict[str, float]] | None:
        """(status, metrics) if MLflow records the run as ended, finished or diverged; None if it has to be trained."""
        if self.run_id is None:
            return None
        recorded = self.client.get_run(self.run_id)
        outcome = recorded.data.tags.get(STATUS_TAG)
        if recorded.info.status != "FINISHED" or outcome not in ("finished", "diverged"):
            return None
        return outcome, dict(recorded.data.metrics)

    @_reported
    def open(self, resuming: bool, tags: dict[str, str], run_name: str) -> QueuedMLFlowLogger:
        """The Lightning logger of the run: the found run when `resuming`, else a new one tagged with the spec hash,
        status `running`, the code and package versions, and `tags`. First sends the points an earlier process kept in
        `unsent_path`."""
        self._send_unsent()
        if self.run_id is not None and not resuming:
            self._supersede()
        elif self.run_id is not None:
            self._reopen()
        tags = {SPEC_HASH_TAG: self.spec_hash, STATUS_TAG: "running", **code_version(), **package_versions(), **tags}
        self.logger = lightning_logger(self.experiment_name, self.uri, self.run_id,
                                       {name: redact(str(value)) for name, value in tags.items()}, run_name)
        self.logger.writes_allowed = lambda: self.writes_allowed()
        self.logger.unsent_path = self.unsent_path
        if resuming:
            self.logger.logged_through = {}
        self.run_id = self.logger.run_id
        return self.logger

    def _send_unsent(self) -> None:
        if self.unsent_path is None or not self.unsent_path.exists():
            return
        from mlflow.exceptions import MlflowException

        from gatelab.metric_outbox import read_unsent, send_now

        try:
            kept = read_unsent(self.unsent_path)
        except (ValueError, KeyError, TypeError) as error:
            raise GatelabError(f"{self.unsent_path} is not a file of unsent metric points ({error}): move it away "
                               "(its points are then not sent) and run the same command again") from error
        for run_id, metrics in kept.items():
            try:
                send_now(self.client, run_id, metrics)
            except MlflowException as error:
                if error.error_code not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                    raise  # the store itself failed: store_errors says so, and the file waits for the next run
                raise GatelabError(f"{redact(self.uri)} refuses the {len(metrics)} metric points kept in "
                                   f"{self.unsent_path} for MLflow run {run_id} ({first_line(error)}): remove the "
                                   "file to drop them, then run the same command again") from error
        self.unsent_path.unlink()

    def _supersede(self) -> None:
        # Cut off before its outcome was tagged: still RUNNING if training was cut, or FINISHED by the end-of-fit
        # finalize of a gatelab before the queued logger, if the cut came during evaluation. Either way it is no result.
        cut_off = self.client.get_run(self.run_id)
        status, outcome = cut_off.info.status, cut_off.data.tags.get(STATUS_TAG)
        if status == "RUNNING" or (status == "FINISHED" and outcome == "running"):
            self.client.set_tag(self.run_id, STATUS_TAG, "superseded")
            self.client.set_terminated(self.run_id, "KILLED")
        self.run_id = None

    def _reopen(self) -> None:
        """A resumed run shows as training again, however an earlier process closed it (failed, interrupted)."""
        run = self.client.get_run(self.run_id)
        if run.info.status != "RUNNING":
            self.client.update_run(self.run_id, status="RUNNING")
        if run.data.tags.get(STATUS_TAG) != "running":
            self.client.set_tag(self.run_id, STATUS_TAG, "running")

    @_reported
    def log_start(self, params: dict[str, Any], texts: dict[str, str]) -> None:
        """What a fresh start records once: the parameters (each cut to MLflow's 500 characters) and text artifacts by
        artifact path, passwords redacted (a `tracking.uri` may hold one)."""
        if not self.writes_allowed():
            return
        self.logger.log_hyperparams({k: redact(str(v))[:500] for k, v in params.items()})
        for path, text in texts.items():
            self.client.log_text(self.run_id, redact(text), path)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.log_points((name, value, step) for name, value in metrics.items())

    def log_series(self, name: str, steps: list[int], values: list[float]) -> None:
        """One metric at several steps (each spike of a run as `train/spike`, at its step)."""
        self.log_points((name, value, step) for step, value in zip(steps, values))

    def log_points(self, points: Iterable[tuple[str, float, int]]) -> None:
        """Queue (name, value, step) points behind the training metrics; `flush` waits until they are sent."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.logger.outbox.put(Metric(name, float(value), now, step) for name, value, step in points)

    @_reported
    def log_artifacts(self, writers: dict[str, Any], folder: str) -> None:
        """Each `writers[name](path)` writes a file, logged as artifact `folder/name`."""
        if not self.writes_allowed():
            return
        with tempfile.TemporaryDirectory() as local:
            for name, write in writers.items():
                path = Path(local) / name
                write(path)
                self.client.log_artifact(self.run_id, str(path), folder)

    def metric_history(self, name: str) -> tuple[list[int], list[float]]:
        """(steps, values) of one metric, every queued point of it sent first."""
        self.flush()
        return self.store.metric_history(self.run_id, name)

    @_reported
    def set_tags(self, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        if self.writes_allowed():
            self.client.log_batch(self.run_id, tags=[RunTag(k, redact(str(v))) for k, v in tags.items()])

    def flush(self, timeout_s: float = 60) -> None:
        """Send every queued point. Where the store has not taken them within timeout_s, keep them in `unsent_path`
        (the next `open` sends them) and raise GatelabError saying so."""
        outbox = self._outbox()
        if outbox is None or outbox.drain(timeout_s):
            return
        unsent = outbox.give_up()
        if not unsent or outbox.stopped:
            return
        if self.unsent_path is None:
            kept = f"{unsent} metric points were not sent"
        else:
            kept = f"{unsent} metric points wait in {self.unsent_path} and are sent when you run the same command again"
        kind = "server" if urllib.parse.urlparse(self.uri).scheme in _SERVER_SCHEMES else "store"
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(outbox.failing_since or time.time()))
        what = describe_store_failure(self.uri, outbox.last_failure) if outbox.last_failure else outbox.last_error
        state = "unreachable" if kind == "server" else "failing"
        raise GatelabError(f"tracking {kind} {redact(self.uri)} {state} since {since} ({what}): "
                           f"training reached step {outbox.last_step} and its checkpoint is kept; {kept}")

    def _outbox(self) -> MetricOutbox | None:
        return self.logger.outbox if self.logger is not None else None

    @_reported
    def end(self, status: str) -> None:
        """Send every queued point, tag the outcome (finished / diverged / pruned) and close the run as FINISHED."""
        if not self.writes_allowed():
            return
        self.flush()
        self.client.set_tag(self.run_id, STATUS_TAG, status)
        self.client.set_terminated(self.run_id, "FINISHED")

    def close_interrupted(self) -> None:
        """Tag the run interrupted and close it KILLED (Ctrl-C, SIGTERM): best effort, see `_close`."""
        self._close("interrupted", "KILLED")

    def close_failed(self) -> None:
        """Tag the run failed and close it FAILED: best effort, see `_close`."""
        self._close("failed", "FAILED")

    def _close(self, outcome: str, status: str) -> None:
        """Flush, tag and close within CLOSE_TIMEOUT_S, never raising: the process is on its way out over another
        error, which is the one to report. A store that is down leaves the run RUNNING, which the next `open` resumes
        or supersedes, and the queued points in `unsent_path`."""
        if self.run_id is None or not self.writes_allowed():
            return

        def close() -> None:
            try:
                with contextlib.suppress(GatelabError):  # the points then wait in unsent_path
                    self.flush(CLOSE_TIMEOUT_S / 2)
                self.client.set_tag(self.run_id, STATUS_TAG, outcome)
                self.client.set_terminated(self.run_id, status)
            except Exception:  # MLflow, requests, SQLAlchemy, OSError: the store or the disk is down, see above
                pass

        closer = threading.Thread(target=close, name="mlflow-close", daemon=True)
        closer.start()
        closer.join(CLOSE_TIMEOUT_S)


def _run_row(run) -> dict[str, Any]:
    row: dict[str, Any] = {"run_id": run.info.run_id, "status": run.info.status,
                           "start_time": run.info.start_time, "end_time": run.info.end_time}
    row.update({f"metrics.{k}": v for k, v in run.data.metrics.items()})
    row.update({f"tags.{k}": v for k, v in run.data.tags.items()})
    return row


def code_version() -> dict[str, str]:
    """The git commit and dirty flag of the gatelab checkout, when there is one."""
    root = repo_root()
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return {"gatelab.git_commit": "unknown", "gatelab.git_dirty": "unknown"}
    if commit.returncode:
        return {"gatelab.git_commit": "unknown", "gatelab.git_dirty": "unknown"}
    return {"gatelab.git_commit": commit.stdout.strip(), "gatelab.git_dirty": str(bool(dirty.stdout.strip())).lower()}


def package_versions() -> dict[str, str]:
    names = ("gatelab", "torch", "lightning", "mlflow", "optuna", "tokenizers", "numpy")
    versions = {}
    for name in names:
        try:
            versions[f"version.{name}"] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[f"version.{name}"] = "absent"
    return versions

