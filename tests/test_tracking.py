"""The run store and the tracked-run handle against a real SQLite MLflow store."""

from __future__ import annotations

from gatelab import tracking
from tests.helpers import sqlite_uri


def _open(runs, resuming: bool = False) -> tracking.TrackedRun:
    tracked = tracking.TrackedRun(sqlite_uri(runs), runs, "micro", "hash-1")
    tracked.open(resuming, {tracking.VARIANT_TAG: "baseline"}, run_name="baseline-s0")
    return tracked


def test_a_run_cut_off_during_evaluation_is_superseded_not_left_finished(tmp_path):
    runs = tmp_path / "runs"
    first = _open(runs)
    first.logger.finalize("success")  # what Lightning does at the end of `fit`, before gatelab's evaluation
    # ... and the process is killed during evaluation: the run is FINISHED in MLflow but its outcome was never tagged.
    assert tracking.TrackedRun(sqlite_uri(runs), runs, "micro", "hash-1").recorded_outcome() is None

    second = _open(runs)  # another machine, no checkpoint: trains again from step 0 in a new MLflow run
    second.end("finished")
    assert second.run_id != first.run_id
    old = first.client.get_run(first.run_id)
    assert old.info.status == "KILLED" and old.data.tags[tracking.STATUS_TAG] == "superseded"
    frame = tracking.RunStore(sqlite_uri(runs), runs).sweep_runs("micro")
    assert list(frame.loc[frame["status"] == "FINISHED", "run_id"]) == [second.run_id]
    assert tracking.TrackedRun(sqlite_uri(runs), runs, "micro", "hash-1").recorded_outcome()[0] == "finished"


def test_an_ended_run_is_never_superseded(tmp_path):
    runs = tmp_path / "runs"
    first = _open(runs)
    first.end("diverged")
    again = tracking.TrackedRun(sqlite_uri(runs), runs, "micro", "hash-1")
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
