"""Where an MLflow run store lives: the embedded default (a SQLite file under `runs/`), the store a run records
in, and the database file of a SQLite URI, missing or read-only. Nothing here imports MLflow."""

from __future__ import annotations

import os
import re
from pathlib import Path

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
