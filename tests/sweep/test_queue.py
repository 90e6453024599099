"""The ledger as a queue: every run handed out once, stale runs taken over, failures retried, states reported."""

from __future__ import annotations

import time
import uuid
from types import SimpleNamespace

import optuna
import pytest

from gatelab.sweep.queue import HEARTBEAT, SweepLedger, ledger_states, set_trial_attr
from tests.helpers import POSTGRES_URL, postgres_reason


def _specs(n: int) -> list:
    return [SimpleNamespace(hash=f"h{i}", index=i, label=lambda i=i: f"cell {i}") for i in range(n)]


@pytest.fixture(params=["journal", "postgresql"])
def storage(request, tmp_path):
    if request.param == "journal":
        return str(tmp_path / "ledger.journal")
    reason = postgres_reason()
    if reason:
        pytest.skip(reason)
    return POSTGRES_URL


def _ledger(storage: str, **kwargs) -> SweepLedger:
    return SweepLedger(storage, f"test-{uuid.uuid4().hex[:8]}", **kwargs)


def test_each_run_is_claimed_once_and_enqueue_is_idempotent(storage):
    ledger, specs = _ledger(storage), _specs(3)
    assert ledger.enqueue_missing(specs) == 3 and ledger.enqueue_missing(specs) == 0
    claimed = [ledger.claim() for _ in range(3)]
    assert sorted(t.user_attrs["gatelab.hash"] for t in claimed) == ["h0", "h1", "h2"]
    assert ledger.claim() is None
    ledger.finish(claimed[0], "finished", "run-a", 12.5)
    ledger.finish(claimed[1], "diverged", "run-b", None, diverged_step=7)
    states = {s.hash: s for s in ledger.states(specs)}
    assert states["h0"].status == "finished" and states["h0"].value == 12.5 and states["h0"].mlflow_run_id == "run-a"
    assert states["h1"].status == "diverged" and states["h1"].diverged_step == 7
    assert states["h2"].status == "running" and states["h2"].worker == ledger.worker
    assert ledger.unfinished()


def test_a_run_whose_worker_stopped_beating_is_requeued_once(storage):
    ledger, specs = _ledger(storage, grace_s=1.0), _specs(1)
    ledger.enqueue_missing(specs)
    trial = ledger.claim()
    set_trial_attr(ledger.study, trial, HEARTBEAT, time.time() - 10)
    other = SweepLedger(storage, ledger.study.study_name, grace_s=1.0)
    assert ledger.fail_stale() == ["h0"]
    assert other.fail_stale() == []  # already taken over: never twice
    again = other.claim()
    assert again.user_attrs["gatelab.hash"] == "h0" and other.claim() is None
    assert [s.status for s in other.states(specs)] == ["running"]


def test_a_failed_run_is_retried_then_reported(storage):
    ledger, specs = _ledger(storage), _specs(1)
    ledger.enqueue_missing(specs)
    assert ledger.fail(ledger.claim(), "Traceback...\nValueError: boom", retries=1) is True
    assert ledger.fail(ledger.claim(), "Traceback...\nValueError: boom again", retries=1) is False
    assert ledger.claim() is None
    state = ledger.states(specs)[0]
    assert state.status == "failed" and state.attempts == 2 and state.error == "ValueError: boom again"


def test_a_duplicate_trial_of_one_run_is_skipped(storage):
    ledger, specs = _ledger(storage), _specs(1)
    ledger.enqueue_missing(specs)
    ledger.study.enqueue_trial({}, user_attrs={"gatelab.hash": "h0", "gatelab.index": 0, "gatelab.label": "cell 0",
                                               "gatelab.attempt": 1})  # as if a second worker enqueued at once
    first = ledger.claim()
    assert ledger.claim() is None  # the younger twin is skipped while the older one is running
    ledger.finish(first, "finished", "run", 1.0)
    assert len([t for t in ledger.trials() if t.state == optuna.trial.TrialState.COMPLETE]) == 1


def test_status_without_a_ledger_creates_none(tmp_path):
    states = ledger_states(None, tmp_path / "runs", "absent", _specs(2))
    assert [s.status for s in states] == ["not started", "not started"]
    assert not (tmp_path / "runs").exists()
