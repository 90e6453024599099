"""gatelab.devices: where a model evaluates and which GPU each local worker gets, decided on a CPU-only machine with
CUDA's answers stood in for."""

from __future__ import annotations

import logging

import pytest
import torch

from gatelab.devices import assign_gpus, evaluation_batch_size, evaluation_device


@pytest.fixture
def one_gpu(monkeypatch):
    """This process sees one CUDA device (cuda:0), and no Apple GPU."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)


def test_a_run_evaluates_on_the_device_it_trained_on(one_gpu):
    # Lightning's root device of a run on the GPU, and of one on the CPU (accelerator cpu on a GPU machine)
    assert evaluation_device(torch.device("cuda", 0), "gpu") == torch.device("cuda", 0)
    assert evaluation_device(torch.device("cpu"), "auto") == torch.device("cpu")


@pytest.mark.parametrize("accelerator", ["auto", "gpu", "cuda"])
def test_without_a_device_named_the_runs_accelerator_takes_the_gpu(one_gpu, accelerator):
    assert evaluation_device(None, accelerator) == torch.device("cuda", 0)


def test_accelerator_cpu_stays_on_the_cpu_where_there_is_a_gpu(one_gpu):
    assert evaluation_device(None, "cpu") == torch.device("cpu")


@pytest.mark.parametrize("accelerator", ["auto", "gpu", "cuda", "mps", "cpu"])
def test_without_a_gpu_every_accelerator_evaluates_on_the_cpu(no_gpu, accelerator):
    assert evaluation_device(None, accelerator) == torch.device("cpu")


@pytest.mark.parametrize("asked", ["cuda", "cuda:0", "mps"])
def test_a_device_this_machine_lacks_falls_back_with_a_warning(no_gpu, caplog, asked):
    """lm-eval's command line asks for cuda:0 unless told otherwise: on a CPU machine that still scores, and says so."""
    with caplog.at_level(logging.WARNING, logger="gatelab.devices"):
        assert evaluation_device(asked, "auto") == torch.device("cpu")
    assert asked in caplog.text and "cpu" in caplog.text


def test_a_gpu_index_beyond_the_machines_falls_back_to_its_own_gpu(one_gpu, caplog):
    with caplog.at_level(logging.WARNING, logger="gatelab.devices"):
        assert evaluation_device("cuda:3", "gpu") == torch.device("cuda", 0)
    assert "cuda:3" in caplog.text


def test_evaluation_batches_change_only_off_the_cpu():
    assert evaluation_batch_size(16, 64, torch.device("cpu")) == 16  # a CPU keeps eval.batch_size
    assert evaluation_batch_size(32, 64, torch.device("cuda", 0)) == 64  # a GPU takes at least the training batch
    assert evaluation_batch_size(128, 64, torch.device("cuda", 0)) == 128


def test_short_sequences_fill_a_gpu_batch_by_tokens_and_keep_the_cpus_rows():
    from gatelab.devices import rows_for_length

    assert rows_for_length(16, 1024, 20, torch.device("cpu")) == 16
    assert rows_for_length(16, 1024, 32, torch.device("cuda", 0)) == 512  # 16 x 1024 tokens
    assert rows_for_length(16, 1024, 1024, torch.device("cuda", 0)) == 16
    assert rows_for_length(16, 1024, 4096, torch.device("cuda", 0)) == 16  # never fewer than configured



@pytest.mark.parametrize("visible,count,per_worker,line", [
    ("4,5", 2, ("4", "5", "4", "5"), "4 workers on 2 GPUs (CUDA_VISIBLE_DEVICES=4,5): 2 a GPU"),
    ("GPU-8f3a0c2e-1b4d-4e5f-9a6b-7c8d9e0f1a2b,GPU-0d1e2f3a-4b5c-6d7e-8f9a-0b1c2d3e4f5a", 2,
     ("GPU-8f3a0c2e-1b4d-4e5f-9a6b-7c8d9e0f1a2b", "GPU-0d1e2f3a-4b5c-6d7e-8f9a-0b1c2d3e4f5a") * 2,
     "4 workers on 2 GPUs (CUDA_VISIBLE_DEVICES=GPU-8f3a0c2e-1b4d-4e5f-9a6b-7c8d9e0f1a2b,"
     "GPU-0d1e2f3a-4b5c-6d7e-8f9a-0b1c2d3e4f5a): 2 a GPU"),
    # a process enumerates one MIG instance however many the variable names: the count must not shorten the list
    ("MIG-1a2b,MIG-3c4d", 1, ("MIG-1a2b", "MIG-3c4d", "MIG-1a2b", "MIG-3c4d"),
     "4 workers on 2 GPUs (CUDA_VISIBLE_DEVICES=MIG-1a2b,MIG-3c4d): 2 a GPU"),
    ("6,7,-1,3", 2, ("6", "7", "6", "7"), "4 workers on 2 GPUs (CUDA_VISIBLE_DEVICES=6,7,-1,3): 2 a GPU"),
    (None, 3, ("0", "1", "2", "0"), "4 workers on 3 GPUs (GPUs 0,1,2): 2 on GPU 0; 1 on GPUs 1,2"),
    (None, 8, ("0", "1", "2", "3"), "4 workers on 4 of 8 GPUs (GPUs 0,1,2,3): one a GPU"),
], ids=["indices", "uuids", "mig", "cut-at-invalid", "torch-round-robin", "fewer-workers"])
def test_workers_take_the_users_gpus_as_given_in_turn(visible, count, per_worker, line):
    gpus = assign_gpus(4, visible, count)
    assert gpus.per_worker == per_worker
    assert [gpus.env(index) for index in range(4)] == [{"CUDA_VISIBLE_DEVICES": gpu} for gpu in per_worker]
    assert gpus.launch_line() == line


@pytest.mark.parametrize("visible,count", [("", 0), ("-1", 0), (None, 0), ("0,1", 0), ("-1", 2), ("", 2)],
                         ids=["empty", "minus-one", "unset-no-cuda", "set-no-cuda", "minus-one-stand-in",
                              "empty-stand-in"])
def test_without_a_visible_gpu_workers_get_none_and_the_launch_says_nothing(visible, count):
    gpus = assign_gpus(3, visible, count)
    assert (gpus.per_worker, gpus.env(0), gpus.launch_line()) == ((), {}, None)
