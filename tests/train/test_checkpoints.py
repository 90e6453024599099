"""Checkpoints are whole or absent; one that does not load is set aside and the run starts again, once."""

from __future__ import annotations

import errno
import signal
import time

import mlflow
import pytest
import torch

from gatelab.train import checkpoints
from gatelab.train.checkpoints import DurableCheckpointIO, set_aside_if_unreadable
from tests.helpers import sqlite_uri, train_cli, train_in_process, write_micro_experiment


def test_a_write_that_fails_leaves_the_previous_checkpoint_and_no_partial_file(tmp_path, monkeypatch):
    path = tmp_path / "checkpoints" / "last.ckpt"
    DurableCheckpointIO().save_checkpoint({"step": 1, "w": torch.ones(3)}, path)

    def disk_full(obj, file):
        file.write(b"half a checkpoint")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoints.torch, "save", disk_full)
    with pytest.raises(OSError):
        DurableCheckpointIO().save_checkpoint({"step": 2}, path)
    assert torch.load(path, weights_only=False)["step"] == 1
    assert [p.name for p in path.parent.iterdir()] == ["last.ckpt"]


def test_during_fit_a_checkpoint_is_published_only_after_its_step_metrics_were_logged(tmp_path):
    # Lightning saves a step's checkpoint before it logs that step's metrics: a checkpoint visible in between would let
    # a kill lose those points, since the resumed run starts after that step.
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.demos.boring_classes import BoringModel
    from lightning.pytorch.loggers.logger import Logger

    class StepsLogged(Logger):
        name, version = "steps", 0
        steps: list[int] = []

        def log_metrics(self, metrics, step=None):
            self.steps.append(step)

        def log_hyperparams(self, params, *args, **kwargs):
            pass

    class Logging(BoringModel):
        def training_step(self, batch, batch_idx):
            out = super().training_step(batch, batch_idx)
            self.log("train/loss", out["loss"])
            return out

    checkpoint_io, logger, published = DurableCheckpointIO(), StepsLogged(), []
    publish = checkpoint_io.publish

    def recording_publish():
        published.append((trainer.global_step, list(logger.steps)))
        publish()

    checkpoint_io.publish = recording_publish
    trainer = L.Trainer(max_steps=12, logger=logger, log_every_n_steps=1, enable_progress_bar=False,
                        enable_model_summary=False, limit_val_batches=0, plugins=[checkpoint_io],
                        callbacks=[checkpoints.PublishAfterStepMetrics(checkpoint_io),
                                   ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=5, save_last=True,
                                                   save_top_k=0)])
    trainer.fit(Logging())
    assert [step for step, _ in published] == [5, 10]  # at the start of the step after each checkpoint
    for step, logged in published:
        assert step - 1 in logged  # the step the checkpoint covers was logged before the checkpoint got its name
    assert torch.load(tmp_path / "last.ckpt", weights_only=False)["global_step"] == 10
    assert not list(tmp_path.glob(".*.tmp"))


def test_an_unreadable_checkpoint_is_moved_aside_with_one_line(tmp_path):
    path = tmp_path / "last.ckpt"
    torch.save({"w": torch.ones(1000)}, path)
    assert set_aside_if_unreadable(path, print)
    path.write_bytes(path.read_bytes()[:500])  # truncated, as by a full disk or a copy cut short
    lines = []
    assert not set_aside_if_unreadable(path, lines.append)
    assert not path.exists() and len(list(tmp_path.glob("last.ckpt.unreadable-*"))) == 1
    assert len(lines) == 1 and str(path) in lines[0] and "step 0" in lines[0]
    assert not set_aside_if_unreadable(path, lines.append)  # no checkpoint: a fresh start, nothing said


def _train_until_a_checkpoint(experiment, runs):
    process = train_cli(experiment, runs, wait=False)
    deadline = time.time() + 300
    while time.time() < deadline and process.poll() is None and not list(runs.glob("micro/*/checkpoints/last.ckpt")):
        time.sleep(0.05)
    assert process.poll() is None, "the run ended before the test could stop it: " + process.stdout.read()
    return process


@pytest.mark.slow
def test_a_truncated_checkpoint_restarts_the_run_from_scratch_into_a_new_mlflow_run(tmp_path):
    experiment = write_micro_experiment(tmp_path, max_steps=200, checkpoint_every=20, log_every=10)
    runs = tmp_path / "runs"
    process = _train_until_a_checkpoint(experiment, runs)
    process.send_signal(signal.SIGKILL)
    process.wait()
    checkpoint = next(runs.glob("micro/*/checkpoints/last.ckpt"))
    checkpoint.write_bytes(checkpoint.read_bytes()[:1000])
    result = train_cli(experiment, runs)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "does not load" in result.stdout and "Traceback" not in result.stdout + result.stderr
    client = mlflow.MlflowClient(sqlite_uri(runs))
    found = client.search_runs([client.get_experiment_by_name("micro").experiment_id])
    assert sorted(run.info.status for run in found) == ["FINISHED", "KILLED"]  # the cut-off attempt is superseded
    finished = next(run for run in found if run.info.status == "FINISHED")
    assert [m.step for m in client.get_metric_history(finished.info.run_id, "train/loss")] == list(range(9, 200, 10))


@pytest.mark.slow
def test_a_signal_stops_the_run_as_killed_and_the_same_command_resumes_it(tmp_path):
    """SIGTERM, as Slurm and launchers send it. Ctrl-C (SIGINT) takes the same handler (gatelab.interrupts): its exit
    code is checked in tests/sweep/test_executor.py and a `gatelab sweep run` stopped by it in test_sweep_run.py."""
    signum, code = signal.SIGTERM, 143
    experiment = write_micro_experiment(tmp_path, max_steps=300, checkpoint_every=20, log_every=10)
    runs = tmp_path / "runs"
    process = _train_until_a_checkpoint(experiment, runs)
    process.send_signal(signum)
    output = process.communicate(timeout=120)[0]
    assert process.returncode == code, output
    assert "run the same command again to resume" in output and "Traceback" not in output
    client = mlflow.MlflowClient(sqlite_uri(runs))
    [stopped] = client.search_runs([client.get_experiment_by_name("micro").experiment_id])
    assert stopped.info.status == "KILLED" and stopped.data.tags["gatelab.status"] == "interrupted"
    assert not list(runs.glob("micro/*/owner.json"))  # the run is free for the next command
    resumed = train_cli(experiment, runs)
    assert resumed.returncode == 0 and "resuming" in resumed.stdout, resumed.stdout + resumed.stderr
    [done] = client.search_runs([client.get_experiment_by_name("micro").experiment_id])
    assert done.info.run_id == stopped.info.run_id and done.info.status == "FINISHED"


# --- the precision a run trained in ---------------------------------------------------------------------------------

@pytest.mark.parametrize("fast_bf16, ffn, expected", [(True, "dense", "bf16-mixed"), (True, "moe", "32-true"),
                                                      (False, "dense", "32-true"), (False, "moe", "32-true")])
def test_auto_precision_on_a_cpu_is_bf16_only_for_dense_models_with_fast_bf16(monkeypatch, fast_bf16, ffn, expected):
    from gatelab import host

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(host, "cpu_has_fast_bf16", lambda: fast_bf16)
    assert host.resolve_precision("auto", "auto", moe=ffn == "moe") == expected
    assert host.resolve_precision("bf16-mixed", "cpu", moe=ffn == "moe") == "bf16-mixed"  # as the user set it


def test_a_checkpoint_records_the_precision_its_run_trained_in(tmp_path):
    experiment = write_micro_experiment(tmp_path, max_steps=2, checkpoint_every=2)
    train_in_process(experiment, tmp_path / "runs", "train.precision=32-true", "eval.blimp=false",
                     "eval.every_n_steps=null")
    [checkpoint] = (tmp_path / "runs").glob("micro/*/checkpoints/last.ckpt")
    assert checkpoints.recorded_precision(checkpoint) == "32-true"
    assert checkpoints.recorded_precision(tmp_path / "absent.ckpt") is None
    checkpoint.write_bytes(checkpoint.read_bytes()[:500])
    assert checkpoints.recorded_precision(checkpoint) is None  # unreadable: set aside later, with its own message
    torch.save({"gatelab": {"experiment": {}}}, checkpoint)  # written before gatelab recorded the precision
    assert checkpoints.recorded_precision(checkpoint) is None


def test_a_run_resumes_in_the_precision_it_began_in_where_auto_now_resolves_otherwise(tmp_path, monkeypatch):
    """A run begun in bf16-mixed (a machine with fast bf16) and resumed where `auto` is fp32 keeps bf16, and says so."""
    from gatelab.data.resolve import load_experiment
    from gatelab.train import run as run_module

    experiment = load_experiment(write_micro_experiment(tmp_path, max_steps=2, checkpoint_every=2),
                                 ["train.precision=auto", "eval.blimp=false", "eval.every_n_steps=null"])
    monkeypatch.setattr(run_module, "resolve_precision", lambda *args, **kwargs: "32-true")
    monkeypatch.setattr(run_module, "recorded_precision", lambda checkpoint: "bf16-mixed")
    built, lines = [], []
    build = run_module.build_trainer
    monkeypatch.setattr(run_module, "build_trainer", lambda *args: built.append(args[-1]) or build(*args))
    run_module.run(experiment, runs_dir=tmp_path / "runs", log=lines.append)
    assert built == ["bf16-mixed"]
    assert "train.precision auto: resuming in bf16-mixed, the precision this run began in (here auto is 32-true)" \
        in lines
    client = mlflow.MlflowClient(sqlite_uri(tmp_path / "runs"))
    [recorded] = client.search_runs([client.get_experiment_by_name("micro").experiment_id])
    assert recorded.data.params["resolved.train.precision"] == "bf16-mixed"  # what it trained in, not what auto says
