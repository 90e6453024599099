"""A real MLflow server killed and restarted (same port, same backend store) while a run logs to it: training never
waits on it, no metric point is lost or stored twice, and an outage that outlasts the run is one message."""

from __future__ import annotations

import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from gatelab import tracked_run, tracking
from gatelab.errors import GatelabError
from tests.helpers import MlflowServer

pytestmark = pytest.mark.slow


@pytest.fixture
def server(tmp_path):
    server = MlflowServer(tmp_path)
    server.start()
    yield server
    if server.process.poll() is None:
        server.kill()


CHECKPOINT = SimpleNamespace(save_top_k=0)  # what ModelCheckpoint hands the logger after it saved (log_model off)


def _log(logger, steps: range, pause_s: float = 0.0) -> float:
    """Log train/loss at each step; returns the slowest log_metrics call, in seconds."""
    slowest = 0.0
    for step in steps:
        started = time.monotonic()
        logger.log_metrics({"train/loss": 1.0 / (step + 1)}, step=step)
        slowest = max(slowest, time.monotonic() - started)
        time.sleep(pause_s)
    return slowest


def _history(tracked: tracked_run.TrackedRun) -> list[int]:
    return [metric.step for metric in tracked.client.get_metric_history(tracked.run_id, "train/loss")]


def test_metrics_logged_through_a_server_restart_arrive_once_in_order_without_blocking(tmp_path, server):
    tracked = tracked_run.TrackedRun(server.url, tmp_path, "outage", "hash-1", unsent_path=tmp_path / "unsent.jsonl")
    logger = tracked.open(False, {}, run_name="outage")
    _log(logger, range(0, 20), pause_s=0.02)
    server.kill()
    slowest_while_down = _log(logger, range(20, 60), pause_s=0.1)  # the sender fails and retries meanwhile
    logger.after_save_checkpoint(CHECKPOINT)
    assert (tmp_path / "unsent.jsonl").exists()
    server.start()
    _log(logger, range(60, 80), pause_s=0.02)
    tracked.flush(timeout_s=60)
    assert slowest_while_down < 0.1
    assert _history(tracked) == list(range(80))  # every point once, in logging order
    assert not (tmp_path / "unsent.jsonl").exists()  # it held only points sent since


def test_an_outage_at_the_end_keeps_the_metrics_for_the_next_run_which_sends_them_once(tmp_path, server):
    unsent = tmp_path / "run" / "unsent-metrics.jsonl"
    unsent.parent.mkdir()
    tracked = tracked_run.TrackedRun(server.url, tmp_path, "outage", "hash-1", unsent_path=unsent)
    logger = tracked.open(False, {}, run_name="outage")
    _log(logger, range(0, 10))
    tracked.flush(timeout_s=60)
    server.kill()
    _log(logger, range(10, 30))

    started = time.monotonic()
    with pytest.raises(GatelabError) as raised:
        tracked.flush(timeout_s=3)
    assert time.monotonic() - started < 4
    message = str(raised.value)
    for text in (f"tracking server {server.url} unreachable since", "training reached step 29",
                 f"20 metric points wait in {unsent}", "run the same command again"):
        assert text in message, message
    assert len(unsent.read_text().splitlines()) == 20

    started = time.monotonic()
    tracked.close_failed()  # the server is still down: gives up in bounded time, and raises nothing
    assert time.monotonic() - started < tracked_run.CLOSE_TIMEOUT_S + 2

    server.start()
    resumed = tracked_run.TrackedRun(server.url, tmp_path, "outage", "hash-1", unsent_path=unsent)
    resumed.open(True, {}, run_name="outage")
    assert resumed.run_id == tracked.run_id and not unsent.exists()
    assert _history(resumed) == list(range(30))
    assert resumed.client.get_run(resumed.run_id).info.status == "RUNNING"


KILLED_DURING_AN_OUTAGE = """
import sys
from pathlib import Path
from types import SimpleNamespace

from gatelab import tracked_run

url, folder = sys.argv[1], Path(sys.argv[2])
tracked = tracked_run.TrackedRun(url, folder, "outage", "hash-1", unsent_path=folder / "unsent.jsonl")
logger = tracked.open(False, {}, run_name="outage")
for step in range(30):
    if step == 10:
        tracked.flush()
        print("sent", flush=True)
        sys.stdin.readline()  # the server is killed meanwhile
    logger.log_metrics({"train/loss": 1.0 / (step + 1)}, step=step)
logger.after_save_checkpoint(SimpleNamespace(save_top_k=0))
logger.log_metrics({"train/loss": 0.0}, step=30)  # Lightning logs the step a checkpoint covers after saving it
print("checkpointed", flush=True)
sys.stdin.readline()  # killed here
"""


def test_a_process_killed_during_an_outage_loses_no_point_of_the_steps_its_checkpoint_covers(tmp_path, server):
    process = subprocess.Popen([sys.executable, "-c", KILLED_DURING_AN_OUTAGE, server.url, str(tmp_path)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "sent"
        server.kill()
        process.stdin.write("\n")
        process.stdin.flush()
        assert process.stdout.readline().strip() == "checkpointed"
    finally:
        process.kill()
        process.wait()
    unsent = tmp_path / "unsent.jsonl"
    assert len(unsent.read_text().splitlines()) == 21

    server.start()
    resumed = tracked_run.TrackedRun(server.url, tmp_path, "outage", "hash-1", unsent_path=unsent)
    resumed.open(True, {}, run_name="outage")
    assert _history(resumed) == list(range(31)) and not unsent.exists()


def test_gatelab_train_finishes_with_every_metric_once_through_a_server_outage(tmp_path, server):
    from mlflow.tracking import MlflowClient

    from tests.helpers import train_cli, write_micro_experiment

    training = train_cli(write_micro_experiment(tmp_path, max_steps=400, checkpoint_every=100),
                         tmp_path / "runs", "--tracking-uri", server.url, wait=False)
    client = MlflowClient(server.url)
    deadline = time.time() + 300
    while time.time() < deadline and training.poll() is None and not _training_metrics_arrived(client):
        time.sleep(0.5)
    assert training.poll() is None, "training ended before the server could be killed"
    server.kill()  # mid-run: training goes on, its metrics queue up
    time.sleep(3)
    server.start()
    stdout, stderr = training.communicate(timeout=600)
    assert training.returncode == 0, stdout + stderr
    [run] = client.search_runs([client.get_experiment_by_name("micro").experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags[tracking.STATUS_TAG] == "finished"
    steps = [metric.step for metric in client.get_metric_history(run.info.run_id, "train/loss")]
    assert steps == list(range(steps[0], 400))  # every step once, none lost in the outage


def _training_metrics_arrived(client) -> bool:
    experiment = client.get_experiment_by_name("micro")
    runs = client.search_runs([experiment.experiment_id]) if experiment else []
    return bool(runs) and "train/loss" in runs[0].data.metrics
