"""gatelab.devices: where a model evaluates, decided on a CPU-only machine with CUDA's answers stood in for."""

from __future__ import annotations

import logging

import pytest
import torch

from gatelab.devices import evaluation_batch_size, evaluation_device


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

