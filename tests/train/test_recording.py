"""What a run records in MLflow (gatelab.train.recording): each loss spike once at its own step, and the evaluation of
a finished run on the device it trained on."""

from __future__ import annotations

import pytest

from tests.helpers import train_in_process, write_micro_experiment


def test_a_spike_between_logging_steps_is_logged_at_its_own_step_once(tmp_path):
    """train/loss reaches MLflow every log_every steps; the monitor checks every step, and its spikes are what the run
    logs as train/spike, so a spike on an unlogged step is still found and counted."""
    from types import SimpleNamespace

    import torch

    from gatelab.store_uris import default_tracking_uri
    from gatelab.tracked_run import TrackedRun
    from gatelab.tracking import RunStore
    from gatelab.train.module import StabilityMonitor
    from gatelab.train.recording import log_spikes

    log_every = 4
    losses = [2.0] * 30
    losses[13], losses[22] = 2.5, 2.6  # neither step is a multiple of log_every
    monitor = StabilityMonitor(warmup=2, beta=0.98, margin=0.15, factor=3.0)
    trainer = SimpleNamespace(global_step=0, callback_metrics={}, log_every_n_steps=log_every, should_stop=False)
    module = SimpleNamespace(log=lambda *args, **kwargs: None)
    for step, loss in enumerate(losses):
        trainer.global_step = step + 1
        trainer.callback_metrics["train/loss"] = torch.tensor(loss)
        monitor.on_train_batch_end(trainer, module, None, None, step)
    monitor.on_train_end(trainer, module)
    assert monitor.spikes == [13, 22] and monitor.diverged_step is None

    uri = default_tracking_uri(tmp_path)
    tracked = TrackedRun(uri, tmp_path, "spikes", "0123abcd")
    tracked.open(resuming=False, tags={}, run_name="spikes")
    log_spikes(tracked, monitor, resuming=False)
    log_spikes(tracked, monitor, resuming=True)  # a resumed run that had logged them before it was cut off
    tracked.log_series("train/loss", list(range(0, 30, log_every)), losses[::log_every])  # what Lightning logs
    tracked.log_metrics({"train/spikes_total": float(len(monitor.spikes))}, step=30)  # what the evaluation logs
    tracked.end("finished")
    store = RunStore(uri, tmp_path)
    steps, values = store.metric_history(tracked.run_id, "train/spike")
    assert steps == monitor.spikes and values == pytest.approx([2.5, 2.6])

    # `gatelab table`'s loss-curve plot marks the same spikes, at their own steps, though neither step was logged.
    from gatelab.report.report import _loss_curves
    from gatelab.report.tables import RunRecord

    spec = SimpleNamespace(settings=lambda: {}, experiment=SimpleNamespace(variant="baseline"))
    record = RunRecord(spec, "finished", tracked.run_id, {"train/spikes_total": float(len(monitor.spikes))})
    logged_steps, _, report_spikes = _loss_curves([record], store)["baseline"]
    assert 13 not in logged_steps and 22 not in logged_steps
    assert report_spikes == [13, 22] == monitor.spikes
    assert len(report_spikes) == record.metrics["train/spikes_total"]


def test_a_finished_run_evaluates_on_the_device_it_trained_on(tmp_path, monkeypatch):
    """Lightning moves the module back to the CPU when `fit` ends: the run asks `evaluation_device` for the device it
    trained on (its strategy's root device) and evaluates there. On this CPU-only machine both are the CPU; with CUDA
    stood in for by the chooser's answer, the model would go wherever that answer says (tests/train/test_gpu.py runs
    it for real on a GPU)."""
    import torch

    from gatelab.devices import evaluation_device
    from gatelab.eval.metrics import model_device
    from gatelab.train import evaluate as evaluate_module
    from gatelab.train import recording

    asked, evaluated_on = [], []

    def chooser(requested, accelerator):
        asked.append((requested, accelerator))
        return evaluation_device(requested, accelerator)

    real_evaluate = evaluate_module.evaluate

    def spy(model, *args, **kwargs):
        evaluated_on.append(model_device(model))
        return real_evaluate(model, *args, **kwargs)

    monkeypatch.setattr(recording, "evaluation_device", chooser)
    monkeypatch.setattr(evaluate_module, "evaluate", spy)
    experiment = write_micro_experiment(tmp_path, max_steps=4, checkpoint_every=4)
    assert train_in_process(experiment, tmp_path / "runs", "eval.every_n_steps=null").status == "finished"
    assert asked == [(torch.device("cpu"), "auto")]  # the trainer's root device and train.accelerator
    assert evaluated_on == [torch.device("cpu")]
