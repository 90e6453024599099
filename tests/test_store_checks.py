"""gatelab.store_checks against real stores: every unusable store is one message naming it and the fix, before
training (`check_store`) and from any call after (`store_errors`, `describe_store_failure`)."""

from __future__ import annotations

import http.server
import importlib.util
import os
import re
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gatelab import store_checks, tracked_run
from gatelab.errors import GatelabError, redact
from gatelab.report.ui import find_free_port
from gatelab.store_checks import check_store, describe_store_failure
from tests.helpers import sqlite_uri

# --- the pre-flight check: every unusable store is one message, in seconds ------------------------------------------

def _hold_exclusive_lock(database: Path) -> subprocess.Popen:
    """Another process that holds SQLite's exclusive lock on `database` until killed."""
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sqlite3, time\n"
        f"c = sqlite3.connect({str(database)!r}, isolation_level=None)\n"
        "c.execute('BEGIN EXCLUSIVE'); print('locked', flush=True); time.sleep(60)")],
        stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    return holder


def _refused(uri: str, *expected: str) -> str:
    """check_store's message for `uri`, which must name the URI and each `expected` text, and come within seconds."""
    started = time.monotonic()
    with pytest.raises(GatelabError) as raised:
        check_store(uri)
    assert time.monotonic() - started < 10
    message = str(raised.value)
    assert redact(uri) in message and all(text in message for text in expected), message
    return message


class _NotMLflow(http.server.BaseHTTPRequestHandler):
    """A web server that is no MLflow server: /health answers 200 (as many services' do), the API 404."""

    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
        self.wfile.write(b"OK")

    def do_POST(self):
        self.send_response(404)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def not_mlflow_server():
    server = http.server.HTTPServer(("127.0.0.1", 0), _NotMLflow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_server_that_refuses_the_connection_is_one_message_naming_it_in_seconds():
    message = _refused(f"http://admin:hunter2@127.0.0.1:{find_free_port()}", "cannot be reached", "mlflow server")
    assert "hunter2" not in message


def test_a_server_that_never_answers_is_one_message_in_seconds():
    with socket.socket() as silent:  # accepts connections (the kernel's backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        _refused(f"http://127.0.0.1:{silent.getsockname()[1]}", "did not answer within")


def test_a_web_server_that_is_not_mlflow_is_named_as_such(not_mlflow_server):
    _refused(not_mlflow_server, "/api/2.0/mlflow/experiments/search", "HTTP 404", "check the host and port")


@pytest.mark.parametrize("uri", ["sqlite://x.db", "sqlite:relative.db", "sqlite:/x.db", "sqlite:///", "sqlite://"])
def test_a_malformed_sqlite_uri_says_how_to_write_one(uri):
    _refused(uri, "not a SQLite file URI", "sqlite:////absolute/path/mlflow.db")


def test_a_sqlite_store_in_a_missing_folder_is_not_created_there(tmp_path):
    folder = tmp_path / "typo" / "runs"
    _refused(f"sqlite:///{folder / 'mlflow.db'}", f"{folder} does not exist", "mkdir -p")
    assert not (tmp_path / "typo").exists()


def test_a_sqlite_store_in_a_read_only_folder_says_so(tmp_path):
    folder = tmp_path / "read-only"
    folder.mkdir(mode=0o500)
    if os.access(folder, os.W_OK):  # root writes anywhere but in the kernel's own folders
        folder = Path("/sys")
    _refused(f"sqlite:///{folder / 'mlflow.db'}", f"{folder} is not writable")


def test_a_file_that_is_no_sqlite_database_is_named(tmp_path):
    junk = tmp_path / "mlflow.db"
    junk.write_bytes(os.urandom(4096))
    _refused(f"sqlite:///{junk}", f"{junk} is not a SQLite database")


def test_a_sqlite_store_locked_by_another_process_names_the_file(tmp_path, monkeypatch):
    monkeypatch.setattr(store_checks, "SQLITE_LOCK_WAIT_S", 1.0)
    database = tmp_path / "mlflow.db"
    sqlite3.connect(database).execute("CREATE TABLE experiments (x)").connection.close()
    holder = _hold_exclusive_lock(database)
    try:
        _refused(f"sqlite:///{database}?timeout=60", f"{database} is locked by another process", "more than 1 s")
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("uri, expected", [
    ("foo://bar", "unknown scheme 'foo:'"),
    ("postgres://u:hunter2@db/x", "unknown scheme 'postgres:'"),  # SQLAlchemy's name is postgresql
    ("runs/mlflow.db", "sqlite:///runs/mlflow.db"),
    ("file:///tmp/mlruns", "sqlite:////tmp/mlruns/mlflow.db"),
])
def test_an_unknown_scheme_lists_the_valid_ones(uri, expected):
    message = _refused(uri, expected, "http(s)://host:port", "postgresql://")
    assert "hunter2" not in message


def test_a_raw_at_in_a_password_is_named_without_the_password():
    message = _refused("postgresql://postgres:hunter@2secret@127.0.0.1:5432/runs", "raw '@'", "%40")
    assert "hunter" not in message and "2secret" not in message


def test_a_database_server_that_does_not_answer_is_one_message_without_its_password():
    message = _refused(f"postgresql+psycopg://gatelab:hunter2@127.0.0.1:{find_free_port()}/runs", "cannot connect")
    assert "hunter2" not in message


@pytest.mark.skipif(importlib.util.find_spec("MySQLdb") is not None, reason="mysqlclient is installed here")
def test_a_database_uri_whose_driver_is_missing_names_the_package():
    _refused("mysql://gatelab@127.0.0.1:3306/runs", "needs the Python package 'MySQLdb'", "pip install")


# --- a store failure from any call is one message naming the store ---------------------------------------------------

def test_a_sqlite_file_of_another_program_is_named(tmp_path):
    database = tmp_path / "mlflow.db"  # an Optuna ledger, say: it keeps its schema version where MLflow keeps its own
    with sqlite3.connect(database) as connection:
        connection.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
        connection.execute("CREATE TABLE studies (study_id INTEGER)")
    _refused(f"sqlite:///{database}", "holds another program's tables (alembic_version, studies)")


def test_a_store_that_fails_after_the_check_is_one_message_naming_it(tmp_path):
    tracked = tracked_run.TrackedRun(sqlite_uri(tmp_path), tmp_path, "micro", "hash-1")
    (tmp_path / "mlflow.db").write_bytes(os.urandom(8192))  # the file is damaged after the pre-flight check
    with pytest.raises(GatelabError, match=re.escape(f"MLflow tracking store {sqlite_uri(tmp_path)} failed: ") +
                       ".*" + re.escape(f"; check {tmp_path / 'mlflow.db'}")):
        tracked.open(False, {}, run_name="baseline-s0")


def test_store_failures_are_said_without_the_orms_wrapping(tmp_path):
    import sqlalchemy

    database = tmp_path / "mlflow.db"
    database.write_bytes(b"")
    uri = sqlite_uri(tmp_path)
    wrapped = sqlalchemy.exc.OperationalError("UPDATE tags ...", {}, sqlite3.OperationalError("database is locked"))
    assert describe_store_failure(uri, wrapped) == "another process holds its lock"
    database.chmod(0o444)
    try:
        assert describe_store_failure(uri, wrapped) == f"its database file {database} is read-only" \
            or os.geteuid() == 0
    finally:
        database.chmod(0o644)
    postgres = "postgresql://dave:pw@127.0.0.1/db"
    refused = sqlalchemy.exc.OperationalError("SELECT 1", {}, RuntimeError("connection refused"))
    assert describe_store_failure(postgres, refused) == "connection refused"
