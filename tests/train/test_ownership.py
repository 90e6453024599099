"""One process at a time trains a run: the run folder's lock, and a sweep lease that another worker takes over."""

from __future__ import annotations

import os
import signal
import time

import mlflow
import pytest

from gatelab.train.ownership import RunInProgress, RunOwnership, RunTakenOver
from tests.helpers import sqlite_uri, train_cli, write_micro_experiment


class FakeLease:
    def __init__(self, token: str, lost_to: str | None = None, check_every_s: float = 0.0) -> None:
        self.token, self.holder, self.lost_to, self.check_every_s = token, f"host:{token}", lost_to, check_every_s

    def lost(self) -> str | None:
        return self.lost_to


def test_a_second_process_finds_the_run_held_and_is_told_by_whom(tmp_path):
    first, second = RunOwnership(tmp_path / "run"), RunOwnership(tmp_path / "run")
    first.acquire()
    with pytest.raises(RunInProgress, match=f"PID {os.getpid()} on host"):
        second.acquire()  # flock conflicts between two open files, even in one process
    first.release()
    second.acquire()  # released: free to take
    second.release()


def test_a_lease_holder_takes_over_a_stale_worker_which_then_stops(tmp_path):
    stale, successor = RunOwnership(tmp_path / "run", FakeLease("7")), RunOwnership(tmp_path / "run", FakeLease("9"))
    stale.acquire()
    stale.check()
    successor.acquire()  # the ledger gave the run to another worker: the stale one still holds its lock
    with pytest.raises(RunTakenOver, match="sweep lease 9"):
        stale.check()
    assert not stale.held() and successor.held()
    stale.release()  # the stale worker's clean-up leaves the successor's record alone
    assert successor.held()


def test_a_standalone_train_is_never_taken_over_by_a_lease(tmp_path):
    standalone = RunOwnership(tmp_path / "run")
    standalone.acquire()
    with pytest.raises(RunInProgress):
        RunOwnership(tmp_path / "run", FakeLease("3")).acquire()
    standalone.release()


def test_the_ledger_is_asked_after_a_pause_longer_than_its_interval(tmp_path):
    lease = FakeLease("4", check_every_s=0.2)
    ownership = RunOwnership(tmp_path / "run", lease)
    ownership.acquire()
    lease.lost_to = "worker host:99"
    ownership.check()  # within the interval: only the folder's record is read
    time.sleep(0.25)  # a pause (SIGSTOP) longer than the interval: the next check asks the ledger
    with pytest.raises(RunTakenOver, match="worker host:99"):
        ownership.check()


@pytest.mark.slow
def test_two_identical_train_commands_leave_one_mlflow_run(tmp_path):
    experiment = write_micro_experiment(tmp_path, max_steps=120, log_every=10)
    runs = tmp_path / "runs"
    first = train_cli(experiment, runs, wait=False)
    deadline = time.time() + 120
    while time.time() < deadline and not list(runs.glob("micro/*/owner.json")):
        time.sleep(0.05)
    # Paused while the second command starts (its imports take longer than the first's 120 micro steps): a stopped
    # process still holds the run's lock, as a busy one does
    os.kill(first.pid, signal.SIGSTOP)
    try:
        second = train_cli(experiment, runs)
    finally:
        os.kill(first.pid, signal.SIGCONT)
    assert first.wait(timeout=600) == 0, first.stdout.read()
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"being trained by PID {first.pid}" in second.stdout, second.stdout
    assert "Traceback" not in second.stdout + second.stderr
    client = mlflow.MlflowClient(sqlite_uri(runs))
    found = client.search_runs([client.get_experiment_by_name("micro").experiment_id])
    assert [run.info.status for run in found] == ["FINISHED"]
    assert len(client.get_metric_history(found[0].info.run_id, "train/loss")) == 12
