"""Local workers: a GPU each, in turn from the user's CUDA_VISIBLE_DEVICES; else disjoint cores from the parent's
affinity mask, and the registry of the workers that still have work."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from gatelab.interrupts import Interrupted
from gatelab.sweep import executor
from gatelab.sweep.executor import (
    HOME_ENV,
    POOL_ENV,
    REGISTRY_ENV,
    LocalShare,
    LocalWorkerRegistry,
    assign_cores,
    share_of_cores,
)
from gatelab.workspace import Workspace
from tests.helpers import REPO, see_gpus


@pytest.mark.parametrize("cores,n_workers", [
    ([0, 1], 2), ([0, 1], 1), (list(range(8)), 3), ([2, 3, 5, 7, 11], 2), (list(range(16)), 16),
])
def test_each_worker_gets_a_disjoint_even_share_of_the_cores(cores, n_workers):
    homes = assign_cores(cores, n_workers)
    assert len(homes) == n_workers
    assert sorted(core for home in homes for core in home) == cores  # every core used once
    assert max(map(len, homes)) - min(map(len, homes)) <= 1


def test_more_workers_than_cores_share_one_core_each_in_turn():
    assert assign_cores([4, 5], 5) == [[4], [5], [4], [5], [4]]


def test_the_cores_of_idle_workers_go_to_the_live_ones_without_overlap():
    pool = list(range(8))
    homes = dict(zip([30, 10, 20, 40], assign_cores(pool, 4)))
    assert share_of_cores(pool, 10, homes) == homes[10]  # nobody idle: own cores only
    live = {pid: homes[pid] for pid in (10, 30, 40)}  # 20 went idle: its two cores are split between the others
    shares = {pid: share_of_cores(pool, pid, live) for pid in live}
    assert sorted(core for cores in shares.values() for core in cores) == pool
    assert all(set(homes[pid]) <= set(cores) for pid, cores in shares.items())
    assert share_of_cores(pool, 10, {10: homes[10]}) == pool  # the last one takes them all
    assert share_of_cores(pool, 20, live) == []  # an idle worker is told nothing: it keeps its own


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()  # reaped: the pid names no process now
    return process.pid


def test_the_registry_lists_live_workers_and_ignores_dead_and_zombie_ones(tmp_path):
    registry = LocalWorkerRegistry(tmp_path / "local-workers")
    assert registry.live() == {}  # no folder yet
    registry.enter(os.getpid(), [0, 1])
    registry.enter(_dead_pid(), [2])  # a worker SIGKILLed before it could leave
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])  # exited, not yet reaped by its launcher
    registry.enter(zombie.pid, [3])
    (registry.folder / "notes.txt").write_text("not a worker")
    if Path("/proc").is_dir():
        deadline = time.time() + 30
        while Path(f"/proc/{zombie.pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
            assert time.time() < deadline
            time.sleep(0.01)
        assert registry.live() == {os.getpid(): [0, 1]}
    zombie.wait()
    assert registry.live() == {os.getpid(): [0, 1]}
    registry.leave(os.getpid())
    registry.leave(os.getpid())  # leaving twice is fine (idle, then exit)
    assert registry.live() == {}


def test_a_worker_knows_its_share_only_when_run_local_workers_started_it(tmp_path):
    assert LocalShare.from_env({}) is None
    share = LocalShare.from_env({REGISTRY_ENV: str(tmp_path), POOL_ENV: "0,1,2,3", HOME_ENV: "2,3"})
    assert (share.pool, share.home, share.pid) == ([0, 1, 2, 3], [2, 3], os.getpid())
    assert share.cores_now() == [2, 3]  # not entered: its own cores
    share.enter()
    assert share.cores_now() == [0, 1, 2, 3]  # alone in the registry: every core of the launch


class _FakeProcess:
    started: list[_FakeProcess] = []

    def __init__(self, command, env):
        self.command, self.env, self.pid = command, env, 100000 + len(self.started)
        self.registry = Path(env[REGISTRY_ENV])
        self.started.append(self)

    def wait(self) -> int:
        assert (self.registry / str(self.pid)).read_text() == self.env[HOME_ENV] + "\n"  # listed by the launcher
        return 0


def test_cpu_workers_get_disjoint_cores_of_the_parents_mask_and_their_folder_goes_at_the_end(tmp_path, monkeypatch):
    (tmp_path / "sweep.yaml").write_text(f"name: pinned\nexperiment: {REPO / 'experiments' / 'tiny.yaml'}\n"
                                         "grid: {variant: [baseline]}\n")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(executor, "available_cores", lambda: [4, 5, 6, 7, 9])  # e.g. under taskset -c 4-7,9
    monkeypatch.setattr(executor.subprocess, "Popen", _FakeProcess)
    _FakeProcess.started = []
    code = executor.run_local_workers(2, sweep=tmp_path / "sweep.yaml", experiment=None, heartbeat_s=1.0, grace_s=5.0,
                                      workspace=Workspace(runs_dir=tmp_path / "runs", storage="ledger.journal"))
    assert code == 0
    first, second = _FakeProcess.started
    assert (first.env[HOME_ENV], second.env[HOME_ENV]) == ("4,5,6", "7,9")
    assert first.env[POOL_ENV] == second.env[POOL_ENV] == "4,5,6,7,9"
    assert first.command[-2:] == ["--threads", "3"] and second.command[-2:] == ["--threads", "2"]
    assert first.registry.parent == tmp_path / "runs" / "pinned" / "local-workers"
    assert not first.registry.exists()


class _GpuWorker:
    started: list[_GpuWorker] = []

    def __init__(self, command, env):
        self.command, self.env, self.pid = command, env, 200000 + len(self.started)
        self.started.append(self)

    def wait(self) -> int:
        return 0


@pytest.mark.parametrize("visible,count,given,line", [
    ("4,5,6,7", 4, ["4", "5", "6", "7"], "4 workers on 4 GPUs (CUDA_VISIBLE_DEVICES=4,5,6,7): one a GPU"),
    ("4,5", 2, ["4", "5", "4", "5"], "4 workers on 2 GPUs (CUDA_VISIBLE_DEVICES=4,5): 2 a GPU"),
    ("GPU-8f3a0c2e,MIG-3c4d5e6f", 2, ["GPU-8f3a0c2e", "MIG-3c4d5e6f"] * 2,
     "4 workers on 2 GPUs (CUDA_VISIBLE_DEVICES=GPU-8f3a0c2e,MIG-3c4d5e6f): 2 a GPU"),
    (None, 3, ["0", "1", "2", "0"], "4 workers on 3 GPUs (GPUs 0,1,2): 2 on GPU 0; 1 on GPUs 1,2"),
], ids=["indices", "shared-indices", "uuids", "torch-sees"])
def test_gpu_workers_take_the_users_gpus_in_turn_and_the_launch_says_how_many_share_one(tmp_path, monkeypatch, capsys,
                                                                                        visible, count, given, line):
    """CUDA_VISIBLE_DEVICES=4,5,6,7 trained on 0-3, and four workers on two GPUs shared cores instead (or, where the
    workers saw the GPUs anyway, all trained on GPU 0)."""
    (tmp_path / "sweep.yaml").write_text(f"name: on-gpus\nexperiment: {REPO / 'experiments' / 'tiny.yaml'}\n"
                                         "grid: {variant: [baseline]}\n")
    see_gpus(monkeypatch, visible, count)
    monkeypatch.setattr(executor.subprocess, "Popen", _GpuWorker)
    _GpuWorker.started = []
    code = executor.run_local_workers(4, sweep=tmp_path / "sweep.yaml", experiment=None, heartbeat_s=1.0, grace_s=5.0,
                                      workspace=Workspace(runs_dir=tmp_path / "runs", storage="ledger.journal"))
    assert code == 0
    assert [worker.env.get("CUDA_VISIBLE_DEVICES") for worker in _GpuWorker.started] == given
    assert not any(REGISTRY_ENV in worker.env or "--threads" in worker.command for worker in _GpuWorker.started)
    assert capsys.readouterr().err.splitlines() == [line]
    assert not (tmp_path / "runs").exists()  # no core registry for GPU workers


@pytest.mark.parametrize("visible", ["", "-1"], ids=["empty", "minus-one"])
def test_with_every_gpu_hidden_workers_share_the_cores_and_keep_the_users_setting(tmp_path, monkeypatch, capsys,
                                                                                  visible):
    (tmp_path / "sweep.yaml").write_text(f"name: hidden\nexperiment: {REPO / 'experiments' / 'tiny.yaml'}\n"
                                         "grid: {variant: [baseline]}\n")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)  # what CUDA counts under "" and -1
    monkeypatch.setattr(executor, "available_cores", lambda: [0, 1, 2, 3])
    monkeypatch.setattr(executor.subprocess, "Popen", _FakeProcess)
    _FakeProcess.started = []
    executor.run_local_workers(2, sweep=tmp_path / "sweep.yaml", experiment=None, heartbeat_s=1.0, grace_s=5.0,
                               workspace=Workspace(runs_dir=tmp_path / "runs", storage="ledger.journal"))
    assert [(w.env["CUDA_VISIBLE_DEVICES"], w.env[HOME_ENV]) for w in _FakeProcess.started] == [(visible, "0,1"),
                                                                                                (visible, "2,3")]
    assert capsys.readouterr().err == ""


_SIGNALLED_WORKER = """
import os, pathlib, signal, sys, time
folder = pathlib.Path(sys.argv[1])
def stop(signum, frame):
    (folder / f"{os.getpid()}.got").write_text(str(signum))
    sys.exit(128 + signum)
signal.signal(signal.SIGINT, stop)
signal.signal(signal.SIGTERM, stop)
(folder / f"{os.getpid()}.ready").write_text("")
time.sleep(60)
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_to_the_launcher_reaches_every_worker_and_ends_it_as_interrupted(tmp_path, monkeypatch, signum):
    """SIGTERM (kill, a scheduler) reaches the launcher only: it must pass it on, wait for the workers to put their
    runs back, and end as interrupted."""
    (tmp_path / "sweep.yaml").write_text(f"name: signalled\nexperiment: {REPO / 'experiments' / 'tiny.yaml'}\n"
                                         "grid: {variant: [baseline]}\n")
    monkeypatch.setattr(executor, "worker_command", lambda **_: [sys.executable, "-c", _SIGNALLED_WORKER,
                                                                 str(tmp_path)])

    def signal_once_both_listen() -> None:
        deadline = time.time() + 60
        while len(list(tmp_path.glob("*.ready"))) < 2 and time.time() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signum)

    threading.Thread(target=signal_once_both_listen, daemon=True).start()
    with pytest.raises(Interrupted) as raised:
        executor.run_local_workers(2, sweep=tmp_path / "sweep.yaml", experiment=None, heartbeat_s=1.0, grace_s=5.0,
                                   workspace=Workspace(runs_dir=tmp_path / "runs", storage="ledger.journal"))
    assert raised.value.exit_code == 128 + signum
    assert sorted(path.read_text() for path in tmp_path.glob("*.got")) == [str(int(signum))] * 2
