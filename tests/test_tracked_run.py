"""gatelab.tracked_run's TrackedRun against a real SQLite MLflow store: which MLflow run a run opens, what it writes,
when it writes nothing, and a store that goes away mid-run."""

from __future__ import annotations

import pytest

from gatelab import tracked_run, tracking
from gatelab.errors import GatelabError
from tests.helpers import REPO, open_tracked_run, sqlite_uri


def test_a_run_cut_off_during_evaluation_is_superseded_not_left_finished(tmp_path):
    runs = tmp_path / "runs"
    first = open_tracked_run(runs)
    first.logger.finalize("success")  # what Lightning does at the end of `fit`, before gatelab's evaluation
    # ... and the process is killed during evaluation: the run is FINISHED in MLflow but its outcome was never tagged.
    assert tracked_run.TrackedRun(sqlite_uri(runs), runs, "micro", "hash-1").recorded_outcome() is None

    second = open_tracked_run(runs)  # another machine, no checkpoint: trains again from step 0 in a new MLflow run
    second.end("finished")
    assert second.run_id != first.run_id
    old = first.client.get_run(first.run_id)
    assert old.info.status == "KILLED" and old.data.tags[tracking.STATUS_TAG] == "superseded"
    frame = tracking.RunStore(sqlite_uri(runs), runs).sweep_runs("micro")
    assert list(frame.loc[frame["status"] == "FINISHED", "run_id"]) == [second.run_id]
    assert tracked_run.TrackedRun(sqlite_uri(runs), runs, "micro", "hash-1").recorded_outcome()[0] == "finished"


def test_an_ended_run_is_never_superseded(tmp_path):
    runs = tmp_path / "runs"
    first = open_tracked_run(runs)
    first.end("diverged")
    again = tracked_run.TrackedRun(sqlite_uri(runs), runs, "micro", "hash-1")
    assert again.run_id == first.run_id and again.recorded_outcome()[0] == "diverged"


def test_a_run_a_user_superseded_is_never_reopened(tmp_path):
    """Trained again, even from a checkpoint, it gets a new MLflow run: reopening the old one would tag it running
    and undo `gatelab sweep supersede`."""
    runs = tmp_path / "runs"
    first = open_tracked_run(runs)
    first.end("finished")
    tracking.RunStore(sqlite_uri(runs), runs).supersede("micro", "trained before the data fix", [first.run_id])
    again = open_tracked_run(runs, resuming=True)
    assert again.run_id != first.run_id
    assert first.client.get_run(first.run_id).data.tags[tracking.STATUS_TAG] == "superseded"


def test_a_resumed_run_continues_the_same_mlflow_run(tmp_path):
    runs = tmp_path / "runs"
    first = open_tracked_run(runs)  # killed mid-training: RUNNING, with a checkpoint on disk
    resumed = open_tracked_run(runs, resuming=True)
    assert resumed.run_id == first.run_id
    assert first.client.get_run(first.run_id).info.status == "RUNNING"


def test_parameters_and_configs_never_hold_a_password(tmp_path):
    runs = tmp_path / "runs"
    tracked = open_tracked_run(runs)
    secret_uri = "postgresql://gatelab:hunter2@db.internal/runs"
    tracked.log_start({"tracking.uri": secret_uri}, {"config/experiment.yaml": f"tracking:\n  uri: {secret_uri}\n"})
    tracked.set_tags({"note": secret_uri})
    run = tracked.client.get_run(tracked.run_id)
    assert run.data.params["tracking.uri"] == "postgresql://gatelab:***@db.internal/runs"
    assert "hunter2" not in run.data.tags["note"]
    assert "hunter2" not in tracked.client.download_artifacts(tracked.run_id, "config/experiment.yaml", str(tmp_path))


def test_a_run_taken_over_by_another_process_gets_no_write(tmp_path):
    runs = tmp_path / "runs"
    tracked = open_tracked_run(runs)
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
    first = open_tracked_run(runs)
    first.logger.finalize("failed")  # what Lightning does on any exception inside `fit`: the status is gatelab's
    assert first.client.get_run(first.run_id).info.status == "RUNNING"
    first.close_interrupted()
    run = first.client.get_run(first.run_id)
    assert (run.info.status, run.data.tags[tracking.STATUS_TAG]) == ("KILLED", "interrupted")

    resumed = open_tracked_run(runs, resuming=True)
    run = resumed.client.get_run(resumed.run_id)
    assert resumed.run_id == first.run_id
    assert (run.info.status, run.data.tags[tracking.STATUS_TAG]) == ("RUNNING", "running")
    resumed.close_failed()
    run = resumed.client.get_run(resumed.run_id)
    assert (run.info.status, run.data.tags[tracking.STATUS_TAG]) == ("FAILED", "failed")


def test_logged_metrics_are_sent_in_batches_of_at_most_1000_in_order(tmp_path):
    runs = tmp_path / "runs"
    tracked = open_tracked_run(runs)
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


# What the evaluation's recording does on a real full disk: the artifact folder on a 16 KiB tmpfs, mounted in a user and
# mount namespace of its own (tests/data/test_prepare.py's helpers), the database beside it with room.
FULL_DISK_SCRIPT = """
import os, sys
from pathlib import Path
from gatelab.errors import failure_message
from tests.helpers import open_tracked_run

runs = Path(sys.argv[1])
tracked = open_tracked_run(runs)
try:
    tracked.log_artifacts({"probes.json": lambda path: path.write_bytes(os.urandom(200_000))}, "eval")
except OSError as error:
    print(failure_message(error))
"""


def test_a_full_disk_while_the_evaluation_is_recorded_names_the_file_its_mount_and_the_room(tmp_path):
    import shlex
    import sys

    from tests.data.test_prepare import _unshare_works, in_namespace

    if not _unshare_works():
        pytest.skip("needs `unshare --user --map-root-user --mount` (user namespaces) to mount a small tmpfs")
    artifacts = tmp_path / "runs" / "mlartifacts"
    artifacts.mkdir(parents=True)
    script = tmp_path / "full.py"
    script.write_text(FULL_DISK_SCRIPT)
    run = shlex.join([sys.executable, str(script), str(tmp_path / "runs")])
    done = in_namespace(f"mount -t tmpfs -o size=16k tmpfs {shlex.quote(str(artifacts))} && "
                        f"PYTHONPATH={shlex.quote(str(REPO))} {run}", tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    message = done.stdout.strip().splitlines()[-1]
    assert message.startswith("the disk holding ") and message.endswith("is full: free space and run the same command "
                                                                        "again; what was recorded is kept"), message
    assert f"{artifacts}/" in message and "/eval/probes.json" in message  # the file being written
    assert f"(the file system mounted at {artifacts}: " in message and " free)" in message  # its mount, its room
