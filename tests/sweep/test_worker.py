"""A local worker's run widens to the cores a peer leaves behind, in the training hook, without training anything."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from gatelab.sweep.executor import LocalShare, LocalWorkerRegistry, available_cores
from gatelab.sweep.worker import ShareFreedCores
from gatelab.workspace import Workspace

needs_two_cores = pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(available_cores()) < 2,
                                     reason="needs CPU affinity and two cores")


@pytest.fixture
def restored_threads():
    """The hook changes this process's thread count and every thread's affinity: put both back afterwards."""
    threads, cores = torch.get_num_threads(), available_cores()
    yield cores[:2]
    torch.set_num_threads(threads)
    for task in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(task), cores)
        except (ProcessLookupError, FileNotFoundError):
            continue


def _thread_affinities() -> set[frozenset[int]]:
    found = set()
    for task in os.listdir("/proc/self/task"):
        try:
            found.add(frozenset(os.sched_getaffinity(int(task))))
        except (ProcessLookupError, FileNotFoundError):
            continue
    return found


def _step(callback: ShareFreedCores, step: int) -> None:
    callback.on_train_batch_start(SimpleNamespace(global_step=step), None, None, step)


@needs_two_cores
@pytest.mark.parametrize("peer_ends", ["leaves", "is killed"])
def test_the_hook_widens_threads_and_affinity_when_a_peer_stops(tmp_path, restored_threads, peer_ends):
    mine, theirs = restored_threads
    peer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        registry = LocalWorkerRegistry(tmp_path / "local-workers")
        share = LocalShare(registry, pool=[mine, theirs], home=[mine], pid=os.getpid())
        share.enter()
        registry.enter(peer.pid, [theirs])
        callback = ShareFreedCores(share, every_n_steps=5)
        _step(callback, 0)
        assert torch.get_num_threads() == 1 and _thread_affinities() == {frozenset([mine])}

        if peer_ends == "leaves":
            registry.leave(peer.pid)  # nothing left for it to claim
        else:
            peer.kill()  # its entry stays behind
            peer.wait()
        _step(callback, 3)  # between checks: nothing changes yet
        assert torch.get_num_threads() == 1
        _step(callback, 5)
        assert torch.get_num_threads() == 2 and _thread_affinities() == {frozenset([mine, theirs])}

        again = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            registry.enter(again.pid, [theirs])  # a worker takes a run over: back to this worker's own core
            _step(callback, 10)
            assert torch.get_num_threads() == 1 and _thread_affinities() == {frozenset([mine])}
        finally:
            again.kill()
            again.wait()
    finally:
        peer.kill()
        peer.wait()


def test_a_run_that_gatelab_train_is_training_goes_back_to_the_queue_without_costing_an_attempt(tmp_path, monkeypatch):
    from gatelab.sweep.queue import ledger_states
    from gatelab.sweep.spec import expand, load_sweep
    from gatelab.sweep.worker import work
    from gatelab.train import run as training
    from gatelab.train.ownership import Owner, RunInProgress
    from tests.helpers import write_sweep

    sweep = write_sweep(tmp_path, {"grid": {"variant": ["baseline"]}, "retries": 0})
    calls = []

    def run(experiment, **_):
        calls.append(time.time())
        if len(calls) == 1:  # `gatelab train` of the same spec holds the run folder
            raise RunInProgress(tmp_path / "run", Owner("host", 123, None, time.time()))
        return training.RunResult("finished", "mlflow-run", "hash", {"ppl/avg": 2.0})

    monkeypatch.setattr(training, "run", run)
    lines = []
    report = work(sweep, workspace=Workspace(runs_dir=tmp_path / "runs"), heartbeat_s=0.1, grace_s=0.5,
                  log=lines.append)
    assert len(calls) == 2 and calls[1] - calls[0] >= 0.5  # tried again once the grace period had passed
    assert [line for line in lines if "PID 123 on host host" in line and "back in the queue" in line] == [lines[1]]
    assert len(report.finished) == 1 and not report.failed
    plan = load_sweep(sweep)
    [state] = ledger_states(None, tmp_path / "runs", plan.name, expand(plan))
    assert (state.status, state.attempts) == ("finished", 1)


def _closed_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_worker_whose_tracking_store_is_dead_stops_before_it_claims_or_writes_anything(tmp_path, monkeypatch):
    """One worker with a dead --tracking-uri marked every cell it claimed failed within 18 s before."""
    from gatelab.errors import GatelabError
    from gatelab.sweep.worker import work
    from gatelab.train import run as training
    from tests.helpers import write_sweep

    sweep = write_sweep(tmp_path, {"grid": {"variant": ["baseline", "g1_elem_sig"]}})
    trained = []
    monkeypatch.setattr(training, "run", lambda experiment, **_: trained.append(experiment))
    storage = tmp_path / "shared" / "ledger.journal"
    uri = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(GatelabError) as raised:
        work(sweep, workspace=Workspace(runs_dir=tmp_path / "runs", tracking_uri=uri, storage=str(storage)),
             log=lambda line: None)
    assert uri in str(raised.value) and "claimed no run" in str(raised.value)
    assert not trained and not storage.exists() and not (tmp_path / "runs").exists()


class _FakeTrackingServer:
    """Answers as an MLflow server does to gatelab's pre-flight check (/health, then a search), until stopped."""

    def __init__(self) -> None:
        import http.server
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b'{"experiments": []}')

            do_GET = do_POST = _answer

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.uri = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_tracking_store_that_dies_mid_sweep_stops_the_worker_and_costs_the_run_no_attempt(tmp_path, monkeypatch):
    from gatelab.errors import GatelabError
    from gatelab.sweep.queue import ledger_states
    from gatelab.sweep.spec import expand, load_sweep
    from gatelab.sweep.worker import work
    from gatelab.train import run as training
    from tests.helpers import write_sweep

    sweep = write_sweep(tmp_path, {"grid": {"variant": ["baseline", "g1_elem_sig"]}, "retries": 0})
    server = _FakeTrackingServer()
    calls = []

    def run(experiment, **_):
        calls.append(experiment.variant)
        if len(calls) == 1:
            server.stop()  # the store dies once the first run is recorded
            return training.RunResult("finished", "mlflow-run", "hash", {"ppl/avg": 2.0})
        raise RuntimeError("MLflow: connection refused")  # what the run meets: no fault of its own

    monkeypatch.setattr(training, "run", run)
    with pytest.raises(GatelabError) as raised:
        work(sweep, workspace=Workspace(runs_dir=tmp_path / "runs", tracking_uri=server.uri), log=lambda line: None)
    assert server.uri in str(raised.value) and "back in the queue" in str(raised.value)
    plan = load_sweep(sweep)
    states = ledger_states(None, tmp_path / "runs", plan.name, expand(plan))
    # the second run was given back (the store died), which costs no attempt
    assert [(state.status, state.attempts) for state in states] == [("finished", 1), ("pending", 0)]


def test_a_worker_with_nothing_to_claim_says_which_runs_it_waits_for_and_how_long(tmp_path):
    """A SIGKILLed worker's run is taken over only once it has been silent for --grace (60 s): said, not sat out."""
    from gatelab.sweep.queue import open_ledger
    from gatelab.sweep.spec import expand, load_sweep
    from gatelab.sweep.worker import SweepWorker
    from tests.helpers import write_sweep

    sweep_path = write_sweep(tmp_path, {"grid": {"variant": ["baseline"]}})
    sweep = load_sweep(sweep_path)
    specs = expand(sweep)
    ledger = open_ledger(sweep, specs, None, None, tmp_path / "runs", grace_s=60)
    ledger.claim()  # as a worker that was then killed left it: running, beating no more
    lines = []
    worker = SweepWorker(sweep_path=sweep_path, sweep=sweep, specs=specs, ledger=ledger, share=None, run=None,
                         tracking_uri=None, runs_dir=tmp_path / "runs", grace_s=60, log=lines.append, progress=False)
    worker.say_what_it_waits_for()
    worker.say_what_it_waits_for()  # the same wait: said once
    [line] = lines
    assert f"run 0 ({specs[0].label()}) on {ledger.worker}" in line and "60 s (--grace)" in line, line
    assert "taken over" in line and " s, unless" in line, line


@pytest.mark.parametrize("timeout_s", [0.0, 0.3])
def test_past_its_timeout_a_worker_starts_no_run_and_finishes_the_one_under_way(tmp_path, monkeypatch, timeout_s):
    """--timeout (Optuna's): a run that started before it trains to its end; no run starts after it, and the rest
    wait in the ledger for the same command, untouched."""
    from gatelab.sweep.queue import ledger_states
    from gatelab.sweep.spec import expand, load_sweep
    from gatelab.sweep.worker import work
    from gatelab.train import run as training
    from tests.helpers import write_sweep

    sweep = write_sweep(tmp_path, {"grid": {"variant": ["baseline"], "seed": [0, 1, 2]}})
    ended = []

    def run(experiment, **_):
        time.sleep(0.6)  # past the timeout, which does not stop it
        ended.append(experiment.seed)
        return training.RunResult("finished", f"mlflow-{experiment.seed}", "hash", {"ppl/avg": 2.0})

    monkeypatch.setattr(training, "run", run)
    lines = []
    report = work(sweep, workspace=Workspace(runs_dir=tmp_path / "runs"), heartbeat_s=0.1, grace_s=5,
                  log=lines.append, claim_until=time.time() + timeout_s)
    started = 0 if timeout_s == 0 else 1
    assert ended == [0] * started and len(report.finished) == started
    plan = load_sweep(sweep)
    states = ledger_states(None, tmp_path / "runs", plan.name, expand(plan))
    assert [state.status for state in states] == ["finished"] * started + ["pending"] * (3 - started)
    assert any(f"timeout: this worker starts no new run; {3 - started} left waiting" in line for line in lines), lines


def test_local_workers_are_given_what_is_left_of_the_launch_timeout():
    from gatelab.sweep.executor import worker_command

    command = worker_command(Path("s.yaml"), experiment=None, workspace=Workspace(storage="x.journal"), threads=1,
                             heartbeat_s=10, grace_s=60, claim_until=time.time() + 100)
    assert 99 <= float(command[command.index("--timeout") + 1]) <= 100
    assert "--timeout" not in worker_command(Path("s.yaml"), experiment=None, workspace=Workspace(storage="x.journal"),
                                             threads=1, heartbeat_s=10, grace_s=60)
