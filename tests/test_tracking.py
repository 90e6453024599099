"""The run store and the tracked-run handle against a real SQLite MLflow store."""

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

from gatelab import store_checks, tracked_run, tracking
from gatelab.errors import GatelabError
from gatelab.report.ui import find_free_port
from tests.helpers import sqlite_uri


def _open(runs, resuming: bool = False) -> tracked_run.TrackedRun:
    runs.mkdir(exist_ok=True)
    tracked = tracked_run.TrackedRun(sqlite_uri(runs), runs, "micro", "hash-1")
    tracked.open(resuming, {tracking.VARIANT_TAG: "baseline"}, run_name="baseline-s0")
    return tracked


def test_a_run_cut_off_during_evaluation_is_superseded_not_left_finished(tmp_path):
    runs = tmp_path / "runs"
    first = _open(runs)
    first.logger.finalize("success")  # what Lightning does at the end of `fit`, before gatelab's evaluation
    # ... and the process is killed during evaluation: the run is FINISHED in MLflow but its outcome was never tagged.
    assert tracked_run.TrackedRun(sqlite_uri(runs), runs, "micro", "hash-1").recorded_outcome() is None

    second = _open(runs)  # another machine, no checkpoint: trains again from step 0 in a new MLflow run
    second.end("finished")
    assert second.run_id != first.run_id
    old = first.client.get_run(first.run_id)
    assert old.info.status == "KILLED" and old.data.tags[tracking.STATUS_TAG] == "superseded"
    frame = tracking.RunStore(sqlite_uri(runs), runs).sweep_runs("micro")
    assert list(frame.loc[frame["status"] == "FINISHED", "run_id"]) == [second.run_id]
    assert tracked_run.TrackedRun(sqlite_uri(runs), runs, "micro", "hash-1").recorded_outcome()[0] == "finished"


def test_an_ended_run_is_never_superseded(tmp_path):
    runs = tmp_path / "runs"
    first = _open(runs)
    first.end("diverged")
    again = tracked_run.TrackedRun(sqlite_uri(runs), runs, "micro", "hash-1")
    assert again.run_id == first.run_id and again.recorded_outcome()[0] == "diverged"


def test_a_resumed_run_continues_the_same_mlflow_run(tmp_path):
    runs = tmp_path / "runs"
    first = _open(runs)  # killed mid-training: RUNNING, with a checkpoint on disk
    resumed = _open(runs, resuming=True)
    assert resumed.run_id == first.run_id
    assert first.client.get_run(first.run_id).info.status == "RUNNING"


def test_sweep_runs_lays_out_metrics_and_tags_like_search_runs(tmp_path):
    runs = tmp_path / "runs"
    tracked = _open(runs)
    tracked.log_metrics({"ppl/avg": 12.5}, step=3)
    tracked.end("finished")
    frame = tracking.RunStore(sqlite_uri(runs), runs).sweep_runs("micro")
    row = frame.iloc[0]
    assert row["metrics.ppl/avg"] == 12.5 and row[f"tags.{tracking.SPEC_HASH_TAG}"] == "hash-1"
    assert row[f"tags.{tracking.STATUS_TAG}"] == "finished" and str(row["end_time"].tz) == "UTC"
    assert tracking.RunStore(sqlite_uri(runs), runs).sweep_runs("no-such-experiment").empty
    assert tracking.redact("postgresql://user:hunter2@host/db") == "postgresql://user:***@host/db"


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
        tracking.check_store(uri)
    assert time.monotonic() - started < 10
    message = str(raised.value)
    assert tracking.redact(uri) in message and all(text in message for text in expected), message
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


def test_prepare_store_checks_the_store_first(tmp_path):
    with pytest.raises(GatelabError, match="not a SQLite file URI"):
        tracking.prepare_store("sqlite://x.db")
    tracking.check_store(sqlite_uri(tmp_path))  # a new store in an existing folder is fine, and not made yet
    assert not (tmp_path / "mlflow.db").exists()


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


def test_an_unreachable_server_is_not_reported_as_a_missing_run():
    store = tracking.RunStore(f"http://127.0.0.1:{find_free_port()}")
    started = time.monotonic()
    with pytest.raises(GatelabError) as raised:
        store.run_tags("0123456789abcdef0123456789abcdef")
    assert time.monotonic() - started < 20  # two quick retries, not MLflow's default seven over minutes
    assert "no MLflow run" not in str(raised.value) and "mlflow server" in str(raised.value)


# --- what a run writes, and when it writes nothing -------------------------------------------------------------------

def test_parameters_and_configs_never_hold_a_password(tmp_path):
    runs = tmp_path / "runs"
    tracked = _open(runs)
    secret_uri = "postgresql://gatelab:hunter2@db.internal/runs"
    tracked.log_start({"tracking.uri": secret_uri}, {"config/experiment.yaml": f"tracking:\n  uri: {secret_uri}\n"})
    tracked.set_tags({"note": secret_uri})
    run = tracked.client.get_run(tracked.run_id)
    assert run.data.params["tracking.uri"] == "postgresql://gatelab:***@db.internal/runs"
    assert "hunter2" not in run.data.tags["note"]
    assert "hunter2" not in tracked.client.download_artifacts(tracked.run_id, "config/experiment.yaml", str(tmp_path))


def test_a_run_taken_over_by_another_process_gets_no_write(tmp_path):
    runs = tmp_path / "runs"
    tracked = _open(runs)
    tracked.logger.log_metrics({"train/loss": 3.0}, step=1)
    tracked.flush()
    before = tracked.client.get_run(tracked.run_id)
    tracked.writes_allowed = lambda: False
    tracked.logger.log_metrics({"train/loss": 2.0}, step=2)
    tracked.log_metrics({"ppl/avg": 9.0}, step=2)
    tracked.set_tags({"extra": "x"})
    tracked.log_artifacts({"a.txt": lambda path: path.write_text("a")}, "eval")
    tracked.end("finished")
    tracked.close_failed()
    tracked.flush()
    after = tracked.client.get_run(tracked.run_id)
    assert after.info.status == "RUNNING" and after.data.tags == before.data.tags
    assert after.data.metrics == {"train/loss": 3.0} and not tracked.client.list_artifacts(tracked.run_id, "eval")


def test_interrupted_and_failed_runs_are_closed_so_and_shown_running_again_when_resumed(tmp_path):
    runs = tmp_path / "runs"
    first = _open(runs)
    first.logger.finalize("failed")  # what Lightning does on any exception inside `fit`: the status is gatelab's
    assert first.client.get_run(first.run_id).info.status == "RUNNING"
    first.close_interrupted()
    run = first.client.get_run(first.run_id)
    assert (run.info.status, run.data.tags[tracking.STATUS_TAG]) == ("KILLED", "interrupted")

    resumed = _open(runs, resuming=True)
    run = resumed.client.get_run(resumed.run_id)
    assert resumed.run_id == first.run_id
    assert (run.info.status, run.data.tags[tracking.STATUS_TAG]) == ("RUNNING", "running")
    resumed.close_failed()
    run = resumed.client.get_run(resumed.run_id)
    assert (run.info.status, run.data.tags[tracking.STATUS_TAG]) == ("FAILED", "failed")


def test_logged_metrics_are_sent_in_batches_of_at_most_1000_in_order(tmp_path):
    runs = tmp_path / "runs"
    tracked = _open(runs)
    client = tracked.logger.experiment
    batch_sizes = []
    send = client.log_batch

    def counted(run_id, metrics=(), **kwargs):
        batch_sizes.append(len(metrics))
        return send(run_id, metrics=metrics, **kwargs)

    client.log_batch = counted
    for step in range(2500):
        tracked.logger.log_metrics({"train/loss": 1.0 / (step + 1)}, step=step)
    tracked.log_series("train/spike", [3, 7], [2.5, 2.6])
    tracked.end("finished")
    assert sum(batch_sizes) == 2502 and max(batch_sizes) <= 1000 and len(batch_sizes) < 2500
    steps, values = tracked.metric_history("train/loss")
    assert steps == list(range(2500)) and values[-1] == pytest.approx(1 / 2500)
    assert tracked.metric_history("train/spike") == ([3, 7], [2.5, 2.6])


def test_finished_run_metrics_can_be_read_for_one_seed(tmp_path):
    """`gatelab bench` reads the second of two runs in one folder (seed 1) as its one real run."""
    uri = tracking.default_tracking_uri(tmp_path)
    for seed, eval_s in ((0, 1.0), (1, 17.0)):
        tracked = tracked_run.TrackedRun(uri, tmp_path, "bench", f"hash{seed}")
        tracked.open(resuming=False, tags={tracking.SEED_TAG: str(seed)}, run_name=f"s{seed}")
        tracked.log_metrics({"time/eval_s": eval_s, "ppl/avg": 3.0}, step=1)
        tracked.end("finished")
    store = tracking.RunStore(uri, tmp_path)
    assert sorted(m["time/eval_s"] for m in store.finished_run_metrics(("time/",))) == [1.0, 17.0]
    assert store.finished_run_metrics(("time/",), seed=1) == [{"time/eval_s": 17.0}]


# --- a store that goes away mid-run ---------------------------------------------------------------------------------


def test_a_sqlite_store_deleted_mid_run_is_named_in_plain_words(tmp_path):
    unsent = tmp_path / "unsent-metrics.jsonl"
    tracked = tracked_run.TrackedRun(sqlite_uri(tmp_path), tmp_path, "micro", "hash-1", unsent_path=unsent)
    tracked.open(False, {}, run_name="baseline-s0")
    tracked.log_metrics({"train/loss": 1.0}, 1)
    tracked.flush(timeout_s=30)
    (tmp_path / "mlflow.db").unlink()
    tracked.log_metrics({"train/loss": 0.5}, 2)
    with pytest.raises(GatelabError) as raised:
        tracked.flush(timeout_s=3)
    message = str(raised.value)
    assert f"its database file {tmp_path / 'mlflow.db'} no longer exists (deleted or moved)" in message
    assert f"1 metric points wait in {unsent}" in message
    for internal in ("autoflush", "sqlite3.", "SQL:", "sqlalche.me", "OperationalError"):
        assert internal not in message
    with pytest.raises(GatelabError) as raised:
        tracked.end("finished")
    assert "no longer exists" in str(raised.value) and "autoflush" not in str(raised.value)
    assert not (tmp_path / "mlflow.db").exists(), "nothing recreates an empty store in its place"


def test_store_failures_are_said_without_the_orms_wrapping(tmp_path):
    import sqlalchemy

    database = tmp_path / "mlflow.db"
    database.write_bytes(b"")
    uri = sqlite_uri(tmp_path)
    wrapped = sqlalchemy.exc.OperationalError("UPDATE tags ...", {}, sqlite3.OperationalError("database is locked"))
    assert tracking.describe_store_failure(uri, wrapped) == "another process holds its lock"
    database.chmod(0o444)
    try:
        assert tracking.describe_store_failure(uri, wrapped) == f"its database file {database} is read-only" \
            or os.geteuid() == 0
    finally:
        database.chmod(0o644)
    postgres = "postgresql://dave:pw@127.0.0.1/db"
    refused = sqlalchemy.exc.OperationalError("SELECT 1", {}, RuntimeError("connection refused"))
    assert tracking.describe_store_failure(postgres, refused) == "connection refused"
