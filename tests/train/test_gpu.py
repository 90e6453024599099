"""On a CUDA GPU: a short run trains and evaluates there, a run cut off there resumes there to the same result, and
bf16 training and the GPU evaluation's TF32 agree with fp32. Marked `gpu` (`python -m pytest -m gpu`): each skips,
saying why, where torch sees no CUDA device (tests/conftest.py), so these CPU machines only collect them.
"""

from __future__ import annotations

import math

import lightning as L
import mlflow
import pytest
import torch

from gatelab.interrupts import Interrupted
from tests.helpers import sqlite_uri, train_in_process, write_micro_experiment

pytestmark = pytest.mark.gpu

ON_THE_GPU = ("train.accelerator=gpu",)


def _run_row(runs):
    """(a client of the runs folder's store, its one MLflow run)."""
    client = mlflow.MlflowClient(sqlite_uri(runs))
    experiment = client.get_experiment_by_name("micro")
    (found,) = client.search_runs([experiment.experiment_id])
    return client, found


def test_a_short_run_trains_and_evaluates_on_the_gpu(tmp_path, monkeypatch):
    from gatelab.eval.metrics import model_device
    from gatelab.train import evaluate as evaluate_module

    evaluated_on = []
    real_evaluate = evaluate_module.evaluate

    def spy(model, *args, **kwargs):
        evaluated_on.append(model_device(model))
        return real_evaluate(model, *args, **kwargs)

    monkeypatch.setattr(evaluate_module, "evaluate", spy)
    tf32_before = torch.backends.cuda.matmul.allow_tf32
    runs = tmp_path / "runs"
    result = train_in_process(write_micro_experiment(tmp_path), runs, *ON_THE_GPU, "train.precision=bf16-mixed")
    assert result.status == "finished"
    assert [device.type for device in evaluated_on] == ["cuda"]  # not the CPU Lightning's teardown left it on
    assert torch.backends.cuda.matmul.allow_tf32 == tf32_before  # the evaluation put the process's setting back
    _, run = _run_row(runs)
    assert run.data.tags["gatelab.device"] == torch.cuda.get_device_name(0)
    assert run.data.params["resolved.train.precision"] == "bf16-mixed"
    metrics = run.data.metrics
    assert math.isfinite(metrics["ppl/avg"]) and math.isfinite(metrics["probe/f_attn"])
    assert 0 < metrics["memory/peak_gpu_train_gb"] <= metrics["memory/peak_gpu_gb"]


class _CutOffAfter(L.Callback):
    """Stops the run as a Ctrl-C would (gatelab.interrupts), after `step` steps."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            raise Interrupted(2)


def test_a_run_cut_off_on_the_gpu_resumes_there_to_the_same_result(tmp_path):
    from gatelab.data.resolve import load_experiment
    from gatelab.train.run import run

    experiment = write_micro_experiment(tmp_path, max_steps=16, checkpoint_every=4)
    overrides = [*ON_THE_GPU, "train.precision=32-true"]
    reference = train_in_process(experiment, tmp_path / "reference", *overrides)
    runs = tmp_path / "runs"
    with pytest.raises(Interrupted):
        run(load_experiment(experiment, overrides), runs_dir=runs, quiet=True, extra_callbacks=(_CutOffAfter(10),))
    resumed = train_in_process(experiment, runs, *overrides)  # from the checkpoint of step 8
    assert resumed.status == "finished" and resumed.trained_steps == 8
    client, found = _run_row(runs)
    assert found.info.status == "FINISHED"
    steps = sorted(m.step for m in client.get_metric_history(found.info.run_id, "train/loss"))
    assert steps == list(range(16))  # steps 8 and 9, trained twice, recorded once
    for metric in ("ppl/avg", "icl/induction", "probe/f_attn"):
        # cuBLAS picks the same kernels for the same shapes; the attention backward may add in another order
        assert resumed.metrics[metric] == pytest.approx(reference.metrics[metric], rel=1e-3, abs=1e-6), metric


def test_bf16_training_and_tf32_evaluation_agree_with_fp32(tmp_path):
    from gatelab.data.datasets import heldout_windows
    from gatelab.data.prepare import load_data
    from gatelab.data.resolve import load_experiment
    from gatelab.devices import evaluation_precision
    from gatelab.eval.metrics import perplexity

    experiment = write_micro_experiment(tmp_path, max_steps=16)
    fp32 = train_in_process(experiment, tmp_path / "fp32", *ON_THE_GPU, "train.precision=32-true")
    bf16 = train_in_process(experiment, tmp_path / "bf16", *ON_THE_GPU, "train.precision=bf16-mixed")
    losses = {}
    for name in ("fp32", "bf16"):
        client, found = _run_row(tmp_path / name)
        losses[name] = [m.value for m in sorted(client.get_metric_history(found.info.run_id, "train/loss"),
                                                 key=lambda m: m.step)]
    assert len(losses["fp32"]) == len(losses["bf16"]) == 16
    worst = max(abs(a - b) / a for a, b in zip(losses["fp32"], losses["bf16"]))
    assert worst < 0.02, f"bf16-mixed training's loss left fp32's by {worst:.2%} within 16 steps"
    assert bf16.metrics["ppl/avg"] == pytest.approx(fp32.metrics["ppl/avg"], rel=0.05)

    # The fp32 run's trained weights scored three ways: strict fp32, the evaluation's TF32 products, bf16 autocast.
    from gatelab.eval.checkpoint import load_checkpoint
    from gatelab.model import build_model, resolve_model

    loaded = load_experiment(experiment, list(ON_THE_GPU))
    (checkpoint,) = (tmp_path / "fp32").glob("micro/*/checkpoints/last.ckpt")
    model = build_model(resolve_model(loaded), seed=loaded.seed)
    model.load_state_dict(load_checkpoint(checkpoint)[1])
    model = model.cuda().eval()
    _, corpus, domains = load_data(loaded, log=lambda *_: None, warn=lambda *_: None)
    windows = torch.cat([torch.from_numpy(heldout_windows(corpus, d, loaded.data.seq_len, 8)) for d in domains])
    strict = perplexity(model, windows, 8)
    with evaluation_precision(torch.device("cuda")):
        tf32 = perplexity(model, windows, 8)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        autocast = perplexity(model, windows, 8)
    print(f"ppl: fp32 {strict:.6f}, TF32 {tf32:.6f} ({tf32 / strict - 1:+.2e}), bf16 autocast {autocast:.6f} "
          f"({autocast / strict - 1:+.2e})")
    assert tf32 == pytest.approx(strict, rel=1e-3)  # the gated variants' differences are about 1e-2


class _NoSyncInSteps(L.Callback):
    """Turns torch's CUDA sync debug mode to "error" for training steps `first` to `last`: any read of a GPU value
    back to the host in them (an .item(), a bool of a tensor, a nonzero) raises with its traceback."""

    def __init__(self, first: int, last: int) -> None:
        self.first, self.last, self.checked = first, last, 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.first <= batch_idx <= self.last:
            torch.cuda.synchronize()  # before the mode: what earlier steps queued is no part of this one
            torch.cuda.set_sync_debug_mode("error")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if torch.cuda.get_sync_debug_mode():
            torch.cuda.set_sync_debug_mode("default")
            self.checked += 1


@pytest.mark.parametrize("compile_mode", [None, "default", "reduce-overhead"])
def test_a_training_step_on_the_gpu_never_waits_for_the_gpu_between_logging_steps(tmp_path, compile_mode):
    """Issue 31: no host synchronisation in the step (Lightning's loop, gatelab's module, clipping, fused AdamW, the
    stability monitor), eager, compiled, and compiled with CUDA graphs."""
    from gatelab.bench.steps import random_windows
    from gatelab.data.resolve import load_experiment
    from gatelab.model import resolve_model
    from gatelab.train.module import GatedLM, StabilityMonitor, TextData

    experiment = load_experiment(write_micro_experiment(tmp_path, precision="bf16-mixed", accelerator="gpu",
                                                        compile=compile_mode is not None,
                                                        compile_mode=compile_mode or "default", grad_clip=1.0))
    train = experiment.train
    watcher = _NoSyncInSteps(3, 6)
    trainer = L.Trainer(max_steps=8, accelerator="gpu", devices=1, precision="bf16-mixed", gradient_clip_val=1.0,
                        log_every_n_steps=100, callbacks=[StabilityMonitor.from_config(train), watcher], logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, limit_val_batches=0, default_root_dir=tmp_path)
    windows = random_windows(experiment.model.vocab_size, experiment.data.seq_len, tokens=1 << 14)
    try:
        trainer.fit(GatedLM(experiment, resolve_model(experiment)),
                    datamodule=TextData(windows, train.batch_size, steps_per_epoch=8))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert trainer.global_step == 8 and watcher.checked == 4
