"""The ledger as a queue: every run handed out once, stale runs taken over, failures retried, states reported."""

from __future__ import annotations

import time
import uuid

import optuna
import pytest

from gatelab.errors import GatelabError
from gatelab.sweep.queue import HEARTBEAT, SweepLedger, ledger_states, set_trial_attr
from tests.helpers import POSTGRES_URL, ledger_specs, postgres_reason


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
    ledger, specs = _ledger(storage), ledger_specs(3)
    assert ledger.enqueue_missing(specs) == 3 and ledger.enqueue_missing(specs) == 0
    claimed = [ledger.claim() for _ in range(3)]
    assert sorted(claim.hash for claim in claimed) == ["h0", "h1", "h2"]
    assert ledger.claim() is None
    ledger.finish(claimed[0], "finished", "run-a", 12.5)
    ledger.finish(claimed[1], "diverged", "run-b", None, diverged_step=7)
    states = {s.hash: s for s in ledger.states(specs)}
    assert states["h0"].status == "finished" and states["h0"].value == 12.5 and states["h0"].mlflow_run_id == "run-a"
    assert states["h1"].status == "diverged" and states["h1"].diverged_step == 7
    assert states["h2"].status == "running" and states["h2"].worker == ledger.worker
    assert ledger.unfinished()


def test_a_run_whose_worker_stopped_beating_is_requeued_once(storage):
    ledger, specs = _ledger(storage, grace_s=1.0), ledger_specs(1)
    ledger.enqueue_missing(specs)
    claim = ledger.claim()
    set_trial_attr(ledger.study, claim.trial, HEARTBEAT, time.time() - 10)
    other = SweepLedger(storage, ledger.study.study_name, grace_s=1.0)
    assert ledger.fail_stale() == ["h0"]
    assert other.fail_stale() == []  # already taken over: never twice
    again = other.claim()
    assert again.hash == "h0" and other.claim() is None
    assert [s.status for s in other.states(specs)] == ["running"]


def test_a_claim_carries_the_runs_stored_attributes_and_the_storage_keeps_its_keys(storage):
    """The worker reads a `Claim`; the trials underneath keep the user attributes existing ledgers hold."""
    ledger, specs = _ledger(storage), ledger_specs(1)
    ledger.enqueue_missing(specs)
    claim = ledger.claim()
    assert (claim.hash, claim.index, claim.label, claim.attempt) == ("h0", 0, "cell 0", 1)
    stored = next(t for t in ledger.trials() if t.number == claim.number)
    assert stored.state == optuna.trial.TrialState.RUNNING
    assert set(stored.user_attrs) == {"gatelab.hash", "gatelab.index", "gatelab.label", "gatelab.attempt", HEARTBEAT,
                                      "gatelab.worker", "gatelab.started"}
    assert ledger.fail(claim, "ValueError: boom", retries=1) is True
    retried = ledger.claim()
    assert (retried.hash, retried.attempt) == ("h0", 2) and retried.number > claim.number and retried != claim


def test_a_failed_run_is_retried_then_reported(storage):
    ledger, specs = _ledger(storage), ledger_specs(1)
    ledger.enqueue_missing(specs)
    assert (ledger.states(specs)[0].status, ledger.states(specs)[0].attempts) == ("pending", 0)  # never claimed
    assert ledger.fail(ledger.claim(), "Traceback...\nValueError: boom", retries=1) is True
    assert (ledger.states(specs)[0].status, ledger.states(specs)[0].attempts) == ("pending", 1)
    assert ledger.fail(ledger.claim(), "Traceback...\nValueError: boom again", retries=1) is False
    assert ledger.claim() is None
    state = ledger.states(specs)[0]
    assert state.status == "failed" and state.attempts == 2 and state.error == "ValueError: boom again"


def test_a_duplicate_trial_of_one_run_is_skipped(storage):
    ledger, specs = _ledger(storage), ledger_specs(1)
    ledger.enqueue_missing(specs)
    ledger.study.enqueue_trial({}, user_attrs={"gatelab.hash": "h0", "gatelab.index": 0, "gatelab.label": "cell 0",
                                               "gatelab.attempt": 1})  # as if a second worker enqueued at once
    first = ledger.claim()
    assert ledger.claim() is None  # the younger twin is skipped while the older one is running
    ledger.finish(first, "finished", "run", 1.0)
    assert len([t for t in ledger.trials() if t.state == optuna.trial.TrialState.COMPLETE]) == 1


def test_status_without_a_ledger_creates_none(tmp_path):
    states = ledger_states(None, tmp_path / "runs", "absent", ledger_specs(2))
    assert [s.status for s in states] == ["not started", "not started"]
    assert not (tmp_path / "runs").exists()


def test_a_taken_over_worker_loses_its_lease_and_its_heartbeat_stops_writing(storage):
    ledger, specs = _ledger(storage, heartbeat_s=0.05, grace_s=1.0), ledger_specs(1)
    ledger.enqueue_missing(specs)
    paused = ledger.claim()
    lease = ledger.lease(paused)
    assert lease.lost() is None and lease.holder == ledger.worker
    set_trial_attr(ledger.study, paused.trial, HEARTBEAT, time.time() - 10)  # paused past the grace period
    taker = SweepLedger(storage, ledger.study.study_name, grace_s=1.0)
    taker.worker = "other-host:4242"
    assert taker.fail_stale() == ["h0"]
    assert lease.lost() == "the ledger"  # given up on, not claimed again yet
    again = taker.claim()
    assert lease.lost() == "other-host:4242" and taker.lease(again).token != lease.token
    with ledger.heartbeat(paused):  # the paused worker wakes up: its beats must not touch the failed trial
        time.sleep(0.3)
    mine = next(t for t in ledger.trials() if t.number == paused.number)
    assert mine.state == optuna.trial.TrialState.FAIL and mine.user_attrs[HEARTBEAT] < time.time() - 5


def test_a_run_claimed_but_never_beaten_on_is_taken_over(storage):
    """A worker killed between Optuna's ask and its first heartbeat left a RUNNING trial without one."""
    ledger, specs = _ledger(storage, grace_s=0.2), ledger_specs(1)
    ledger.enqueue_missing(specs)
    ledger.study.ask()  # the claim as far as Optuna got
    time.sleep(0.4)
    assert ledger.fail_stale() == ["h0"]
    assert ledger.claim().hash == "h0"


def test_a_run_being_trained_elsewhere_goes_to_the_back_of_the_queue(storage):
    ledger, specs = _ledger(storage), ledger_specs(2)
    ledger.enqueue_missing(specs)
    assert ledger.claim(skip={"h0"}).hash == "h1"
    assert ledger.claim(skip={"h0"}) is None  # only the skipped run waits
    assert ledger.claim().hash == "h0"


def test_reset_requeues_failed_cells_with_fresh_attempts_and_refuses_the_others(storage):
    ledger, specs = _ledger(storage), ledger_specs(4)
    ledger.enqueue_missing(specs)
    claimed = {claim.hash: claim for claim in (ledger.claim() for _ in range(4))}
    ledger.fail(claimed["h0"], "ValueError: boom", retries=0)
    ledger.fail(claimed["h1"], "ValueError: boom", retries=0)
    ledger.finish(claimed["h2"], "finished", "run-c", 3.0)  # h3 stays running
    for cells, fragment in (([2], "MLflow run run-c"), ([3], "train it twice"), ([9], "0 to 3")):
        with pytest.raises(GatelabError, match=fragment):
            ledger.reset(specs, cells=cells)
    assert [s.status for s in ledger.states(specs)] == ["failed", "failed", "finished", "running"]
    assert [s.index for s in ledger.reset(specs, cells=[1])] == [1]
    assert [s.index for s in ledger.reset(specs, failed=True)] == [0]
    states = ledger.states(specs)
    assert [(s.status, s.attempts) for s in states[:2]] == [("pending", 0), ("pending", 0)]
    retried = ledger.claim()
    assert ledger.fail(retried, "ValueError: again", retries=1) is True  # attempts start again: a retry is left


def test_a_stored_traceback_never_holds_a_password(storage):
    ledger, specs = _ledger(storage), ledger_specs(1)
    ledger.enqueue_missing(specs)
    secret = "postgresql://gatelab:hunter2@db.example:5432/ledger"
    tail = "x" * (2000 - len("hunter2@db.example:5432/ledger\n"))  # the 2,000-character cut starts at the password
    error = f"Traceback ...\nOperationalError: cannot reach {secret}\n{tail}"
    ledger.fail(ledger.claim(), error, retries=0)
    assert not any("hunter2" in str(t.user_attrs.get("gatelab.error")) for t in ledger.trials())
