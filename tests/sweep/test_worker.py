"""A local worker's run widens to the cores a peer leaves behind, in the training hook, without training anything."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from gatelab.sweep.executor import LocalShare, LocalWorkerRegistry, available_cores
from gatelab.sweep.worker import ShareFreedCores

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
