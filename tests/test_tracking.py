"""The run store (gatelab.tracking's RunStore and prepare_store) against a real SQLite MLflow store. What a run writes
is tests/test_tracked_run.py; the store's checks and failure messages, tests/test_store_checks.py."""

from __future__ import annotations

import time

import pytest

from gatelab import tracked_run, tracking
from gatelab.errors import GatelabError, redact
from gatelab.report.ui import find_free_port
from gatelab.store_checks import check_store
from gatelab.store_uris import default_tracking_uri
from tests.helpers import open_tracked_run, sqlite_uri


def test_sweep_runs_lays_out_metrics_and_tags_like_search_runs(tmp_path):
    runs = tmp_path / "runs"
    tracked = open_tracked_run(runs)
    tracked.log_metrics({"ppl/avg": 12.5}, step=3)
    tracked.end("finished")
    frame = tracking.RunStore(sqlite_uri(runs), runs).sweep_runs("micro")
    row = frame.iloc[0]
    assert row["metrics.ppl/avg"] == 12.5 and row[f"tags.{tracking.SPEC_HASH_TAG}"] == "hash-1"
    assert row[f"tags.{tracking.STATUS_TAG}"] == "finished" and str(row["end_time"].tz) == "UTC"
    assert tracking.RunStore(sqlite_uri(runs), runs).sweep_runs("no-such-experiment").empty
    assert redact("postgresql://user:hunter2@host/db") == "postgresql://user:***@host/db"


def test_prepare_store_checks_the_store_first(tmp_path):
    with pytest.raises(GatelabError, match="not a SQLite file URI"):
        tracking.prepare_store("sqlite://x.db")
    check_store(sqlite_uri(tmp_path))  # a new store in an existing folder is fine, and not made yet
    assert not (tmp_path / "mlflow.db").exists()


def test_an_unreachable_server_is_not_reported_as_a_missing_run():
    store = tracking.RunStore(f"http://127.0.0.1:{find_free_port()}")
    started = time.monotonic()
    with pytest.raises(GatelabError) as raised:
        store.run_data("0123456789abcdef0123456789abcdef")
    assert time.monotonic() - started < 20  # two quick retries, not MLflow's default seven over minutes
    assert "no MLflow run" not in str(raised.value) and "mlflow server" in str(raised.value)


def test_finished_run_metrics_can_be_read_for_one_seed(tmp_path):
    """`gatelab bench` reads the second of two runs in one folder (seed 1) as its one real run."""
    uri = default_tracking_uri(tmp_path)
    for seed, eval_s in ((0, 1.0), (1, 17.0)):
        tracked = tracked_run.TrackedRun(uri, tmp_path, "bench", f"hash{seed}")
        tracked.open(resuming=False, tags={tracking.SEED_TAG: str(seed)}, run_name=f"s{seed}")
        tracked.log_metrics({"time/eval_s": eval_s, "ppl/avg": 3.0}, step=1)
        tracked.end("finished")
    store = tracking.RunStore(uri, tmp_path)
    assert sorted(m["time/eval_s"] for m in store.finished_run_metrics(("time/",))) == [1.0, 17.0]
    assert store.finished_run_metrics(("time/",), seed=1) == [{"time/eval_s": 17.0}]


def test_a_local_store_moved_to_another_folder_still_gives_its_artifacts(tmp_path):
    """A local store's artifact URIs are absolute: extracted elsewhere (results/tiny's committed store in another
    checkout), its artifacts are read from the folder beside its database."""
    runs = tmp_path / "runs"
    tracked = open_tracked_run(runs)
    tracked.end("finished")
    tracking.RunStore(sqlite_uri(runs), runs).client.log_text(tracked.run_id, '{"f_attn": 0.5}', "probes/probes.json")
    moved = runs.rename(tmp_path / "elsewhere")
    store = tracking.RunStore(sqlite_uri(moved), moved)
    assert store.artifact_json(tracked.run_id, "probes/probes.json") == {"f_attn": 0.5}
    assert store.artifact_text(tracked.run_id, "probes/missing.json") is None


def test_a_run_records_a_hash_of_the_code_that_ran_which_changes_with_any_source_file(tmp_path, monkeypatch):
    # repro-trained-long's runs said git commit 2782a76 (dirty) although they ran f8520fa's tree: the commit of a copied
    # checkout's metadata is not the code; the package's content is
    from gatelab import tracking

    assert tracking.code_version()[tracking.CODE_HASH_TAG] == tracking.code_hash()
    package = tmp_path / "gatelab"
    (package / "model").mkdir(parents=True)
    (package / "model" / "gate.py").write_text("SCALE = 1\n")
    (package / "__pycache__").mkdir()
    monkeypatch.setattr(tracking, "__file__", str(package / "tracking.py"))

    def fresh_hash() -> str:
        tracking.code_hash.cache_clear()
        return tracking.code_hash()

    try:
        first = fresh_hash()
        (package / "__pycache__" / "gate.cpython-312.pyc").write_bytes(b"compiled")
        assert fresh_hash() == first  # compiled files are not the code
        (package / "model" / "gate.py").write_text("SCALE = 2\n")
        changed = fresh_hash()
        assert changed != first
        (package / "model" / "gate.py").rename(package / "gate.py")  # the same bytes at another path
        assert fresh_hash() != changed
    finally:
        tracking.code_hash.cache_clear()


def test_two_workers_creating_one_experiment_at_once_both_get_it(tmp_path):
    """Two sweep workers started together both look the experiment up, find none, and create it: the second's create
    fails on MLflow's unique name (as run 1 of repro-matched-confirm's first launch did) and must take the first's."""
    uri = sqlite_uri(tmp_path)
    store, other = tracking.RunStore(uri, tmp_path), tracking.RunStore(uri, tmp_path)
    looked_up = store.client.get_experiment_by_name
    calls = []

    def not_there_yet(name):  # the first lookup runs before the other worker's create lands
        calls.append(name)
        return None if len(calls) == 1 else looked_up(name)

    store.client.get_experiment_by_name = not_there_yet
    first = other.experiment_id("sweep-x")
    assert store.experiment_id("sweep-x") == first
    assert len(calls) == 2  # it did try to create, and read the other's back
    assert [e.name for e in other.client.search_experiments() if e.name == "sweep-x"] == ["sweep-x"]


def test_a_failed_experiment_create_that_is_no_race_still_fails(tmp_path):
    store = tracking.RunStore(sqlite_uri(tmp_path), tmp_path)

    def broken(*args, **kwargs):
        from mlflow.exceptions import MlflowException

        raise MlflowException("disk I/O error")

    store.client.create_experiment = broken
    with pytest.raises(GatelabError, match="the disk failed to read or write it"):
        store.experiment_id("sweep-y")


def test_a_process_records_the_commit_it_started_from_not_one_made_while_it_works(tmp_path, monkeypatch):
    """repro-matched-confirm's first part: two workers loaded dc4fa6a's code (every run's code hash says so), and their
    runs named nine commits, each the HEAD when the run began, as the session went on committing."""
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                              capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    (tmp_path / "a.txt").write_text("1")
    git("add", "a.txt")
    git("commit", "-qm", "first")
    first = git("rev-parse", "HEAD")
    monkeypatch.setattr(tracking, "repo_root", lambda: tmp_path)
    tracking._git_version.cache_clear()
    try:
        assert tracking.code_version()["gatelab.git_commit"] == first
        (tmp_path / "a.txt").write_text("2")
        git("commit", "-qam", "second, while the worker trains")
        assert git("rev-parse", "HEAD") != first
        assert tracking.code_version()["gatelab.git_commit"] == first
        assert tracking.code_version()["gatelab.git_dirty"] == "false"
    finally:
        tracking._git_version.cache_clear()


def test_a_worker_reads_its_code_version_before_it_claims_a_run(tmp_path, monkeypatch):
    from gatelab.sweep import worker as worker_module
    from gatelab.sweep.queue import SweepLedger
    from gatelab.train import run as training
    from gatelab.workspace import Workspace
    from tests.helpers import write_sweep

    order = []
    monkeypatch.setattr(training, "code_version", lambda: order.append("code version"))
    claim = SweepLedger.claim
    monkeypatch.setattr(SweepLedger, "claim", lambda self, *a, **k: order.append("claim") or claim(self, *a, **k))

    monkeypatch.setattr(training, "run", lambda experiment, **_: order.append("run") or training.RunResult(
        "finished", "mlflow-run", "hash", {"ppl/avg": 2.0}))
    sweep = write_sweep(tmp_path, {"grid": {"variant": ["baseline"]}})
    worker_module.work(sweep, workspace=Workspace(runs_dir=tmp_path / "runs"), log=lambda _: None)
    assert order[:3] == ["code version", "claim", "run"] and order.count("code version") == 1
