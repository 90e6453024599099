"""Where an MLflow run store lives (gatelab.store_uris): the embedded default, the store a run records in, and the
database file of a SQLite URI, missing or read-only."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from gatelab.store_uris import default_tracking_uri, missing_local_store, read_only_store, run_tracking_uri, sqlite_file


def test_the_embedded_store_is_a_sqlite_file_in_the_runs_folder(tmp_path):
    runs = tmp_path / "runs"
    assert default_tracking_uri(runs, create=False) == f"sqlite:///{runs.resolve() / 'mlflow.db'}?timeout=60"
    assert not runs.exists()  # made only where asked
    assert default_tracking_uri(Path("runs"), create=False, as_written=True) == "sqlite:///runs/mlflow.db"
    default_tracking_uri(runs)
    assert runs.is_dir()


def test_a_run_records_in_the_option_else_the_experiment_s_store_else_the_embedded_one(tmp_path):
    experiment = SimpleNamespace(tracking=SimpleNamespace(uri="http://host:5000"))
    assert run_tracking_uri("sqlite:///x.db", experiment, tmp_path) == "sqlite:///x.db"
    assert run_tracking_uri(None, experiment, tmp_path) == "http://host:5000"
    experiment.tracking.uri = None
    assert run_tracking_uri(None, experiment, tmp_path) == default_tracking_uri(tmp_path)


def test_the_database_file_of_a_sqlite_uri_missing_or_read_only(tmp_path):
    assert sqlite_file("sqlite:///runs/mlflow.db?timeout=60") == Path("runs/mlflow.db")
    assert sqlite_file("sqlite+pysqlite:////abs/mlflow.db") == Path("/abs/mlflow.db")
    assert sqlite_file("http://host:5000") is None and sqlite_file("sqlite://x.db") is None
    database = tmp_path / "mlflow.db"
    uri = f"sqlite:///{database}"
    assert missing_local_store(uri).startswith(f"no MLflow store at {database}")
    assert read_only_store(uri) is None  # nothing there to protect
    database.write_bytes(b"")
    assert missing_local_store(uri) is None and read_only_store(uri) is None
    database.chmod(0o444)
    try:
        assert read_only_store(uri) == f"{database} is read-only"  # the mode bits, even for root
    finally:
        database.chmod(0o644)
    assert missing_local_store("http://host:5000") is None and read_only_store("http://host:5000") is None
