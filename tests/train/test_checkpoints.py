"""Checkpoints are whole or absent; one that does not load is set aside and the run starts again, once."""

from __future__ import annotations

import errno
import os
import signal
import time
from pathlib import Path

import mlflow
import pytest
import torch

from gatelab.errors import exit_code, failure_message
from gatelab.train import checkpoints
from gatelab.train.checkpoints import DurableCheckpointIO, ThisRun, remove_unfinished_writes, set_aside_unless_resumable
from tests.helpers import gatelab_cli, sqlite_uri, train_cli, train_in_process, write_micro_experiment


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


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs Linux's /dev/full, a file whose every write fails")
def test_a_full_disk_while_writing_a_checkpoint_is_an_error_naming_the_checkpoint(tmp_path, monkeypatch):
    # torch.save turns the file's OSError into a RuntimeError naming neither ("unexpected pos 704 vs 598"). The
    # temporary file is made /dev/full, where every write fails with ENOSPC, as on a full disk.
    path = tmp_path / "checkpoints" / "last.ckpt"
    path.parent.mkdir()
    monkeypatch.setattr(checkpoints.time, "monotonic_ns", lambda: 7)
    staged = path.with_name(f".last.ckpt.{os.getpid()}.7.tmp")
    staged.symlink_to("/dev/full")
    with pytest.raises(OSError) as raised:
        DurableCheckpointIO().save_checkpoint({"w": torch.ones(100_000)}, path)
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(path)
    assert not staged.exists() and list(path.parent.iterdir()) == []
    message = failure_message(raised.value)
    assert str(path) in message and "is full" in message and "file system mounted at /" in message
    assert exit_code(raised.value) == 2


@pytest.fixture(scope="module")
def micro_run():
    """The micro experiment's ThisRun and a checkpoint state that resumes it (its weights as the model has them)."""
    import tempfile

    from gatelab.data.identity import spec_hash
    from gatelab.data.resolve import load_experiment
    from gatelab.model import build_model, resolve_model

    with tempfile.TemporaryDirectory() as folder:
        experiment = load_experiment(write_micro_experiment(Path(folder)), [])
    model_config = resolve_model(experiment)
    run = ThisRun.of(spec_hash(experiment), model_config)
    weights = {f"model.{name}": tensor for name, tensor in build_model(model_config).state_dict().items()}
    state = {"pytorch-lightning_version": "2.6.0", "global_step": 4, "epoch": 0, "state_dict": weights, "loops": {},
             "optimizer_states": [{}], "gatelab": {"experiment": experiment.model_dump(mode="json")}}
    return run, state, experiment


def _changed(state: dict, **changes) -> dict:
    return {**state, **changes}


def _other_runs(state: dict, experiment) -> dict:
    other = experiment.model_copy(update={"seed": experiment.seed + 1}).model_dump(mode="json")
    return _changed(state, gatelab={"experiment": other})


@pytest.mark.parametrize("damage, said", [
    (lambda path, state, experiment: path.write_bytes(path.read_bytes()[:500]), "does not load"),
    (lambda path, state, experiment: torch.save({"a": 1}, path), "is not a gatelab checkpoint"),
    (lambda path, state, experiment: torch.save([1, 2, 3], path), "is not a checkpoint (it holds a list)"),
    (lambda path, state, experiment: torch.save({k: v for k, v in state.items() if k != "loops"}, path), "'loops'"),
    (lambda path, state, experiment: torch.save(_other_runs(state, experiment), path), "is another run's"),
    (lambda path, state, experiment: torch.save(_changed(state, gatelab={}), path), "spec hash unknown"),
    (lambda path, state, experiment: torch.save(
        _changed(state, state_dict={**state["state_dict"], "model.embed.weight": torch.ones(3, 3)}), path),
     "do not fit this model (model.embed.weight)"),
    (lambda path, state, experiment: torch.save(_changed(state, state_dict={"x": torch.ones(1)}), path),
     "do not fit this model"),
    (lambda path, state, experiment: (path.unlink(), path.mkdir()), "does not load"),
])
def test_a_checkpoint_that_cannot_resume_this_run_is_moved_aside_with_one_line(tmp_path, micro_run, damage, said):
    run, state, experiment = micro_run
    path = tmp_path / "last.ckpt"
    torch.save(state, path)
    assert set_aside_unless_resumable(path, run, print)  # this run's own: resumed
    assert checkpoints.recorded_precision(path, run) is None  # written before gatelab recorded it
    damage(path, state, experiment)
    lines = []
    assert not set_aside_unless_resumable(path, run, lines.append)
    assert not path.exists() and len(list(tmp_path.glob("last.ckpt.*-*"))) == 1
    assert len(lines) == 1 and str(path) in lines[0] and said in lines[0] and "step 0" in lines[0], lines
    assert not set_aside_unless_resumable(path, run, lines.append)  # no checkpoint: a fresh start, nothing said
    assert len(lines) == 1


def test_another_runs_checkpoint_does_not_choose_the_precision(tmp_path, micro_run):
    run, state, experiment = micro_run
    path = tmp_path / "last.ckpt"
    torch.save(_changed(_other_runs(state, experiment), gatelab={**_other_runs(state, experiment)["gatelab"],
                                                                 "precision": "bf16-mixed"}), path)
    assert checkpoints.recorded_precision(path, run) is None
    torch.save(_changed(state, gatelab={**state["gatelab"], "precision": "bf16-mixed"}), path)
    assert checkpoints.recorded_precision(path, run) == "bf16-mixed"


def test_two_checkpoints_set_aside_in_the_same_second_are_both_kept(tmp_path, micro_run):
    run, _, _ = micro_run
    path = tmp_path / "last.ckpt"
    for content in (b"first", b"second"):
        path.write_bytes(content)
        set_aside_unless_resumable(path, run, lambda line: None)
    assert sorted(p.read_bytes() for p in tmp_path.glob("last.ckpt.unreadable-*")) == [b"first", b"second"]


def test_the_unfinished_writes_of_a_killed_process_are_removed_with_one_line(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    leftovers = [run_dir / "checkpoints" / ".last.ckpt.123.456.tmp", run_dir / "checkpoints" / ".last.ckpt.7.8.tmp",
                 run_dir / ".unsent-metrics.jsonl.123.tmp"]
    kept = [run_dir / "checkpoints" / "last.ckpt", run_dir / "owner.lock", run_dir / "unsent-metrics.jsonl"]
    for path in leftovers + kept:
        path.write_bytes(b"x")
    lines = []
    remove_unfinished_writes(run_dir, lines.append)
    assert not any(path.exists() for path in leftovers) and all(path.exists() for path in kept)
    assert len(lines) == 1 and str(run_dir) in lines[0] and ".last.ckpt.123.456.tmp" in lines[0], lines
    remove_unfinished_writes(run_dir, lines.append)
    assert len(lines) == 1  # nothing left: nothing said


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
    from gatelab.data.identity import spec_hash
    from gatelab.data.resolve import load_experiment
    from gatelab.model import resolve_model

    config = load_experiment(experiment, ["train.precision=32-true", "eval.blimp=false", "eval.every_n_steps=null"])
    run = ThisRun.of(spec_hash(config), resolve_model(config))
    assert checkpoints.recorded_precision(checkpoint, run) == "32-true"
    assert checkpoints.recorded_precision(tmp_path / "absent.ckpt", run) is None
    checkpoint.write_bytes(checkpoint.read_bytes()[:500])
    assert checkpoints.recorded_precision(checkpoint, run) is None  # unreadable: set aside later, with its own message


def test_a_run_resumes_in_the_precision_it_began_in_where_auto_now_resolves_otherwise(tmp_path, monkeypatch):
    """A run begun in bf16-mixed (a machine with fast bf16) and resumed where `auto` is fp32 keeps bf16, and says so."""
    from gatelab.data.resolve import load_experiment
    from gatelab.train import run as run_module

    experiment = load_experiment(write_micro_experiment(tmp_path, max_steps=2, checkpoint_every=2),
                                 ["train.precision=auto", "eval.blimp=false", "eval.every_n_steps=null"])
    monkeypatch.setattr(run_module, "resolve_precision", lambda *args, **kwargs: "32-true")
    monkeypatch.setattr(run_module, "recorded_precision", lambda checkpoint, run: "bf16-mixed")
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


# --- the same command again, after a stop or a foreign file -----------------------------------------------------------

def _mlflow_runs(runs):
    client = mlflow.MlflowClient(sqlite_uri(runs))
    return client, client.search_runs([client.get_experiment_by_name("micro").experiment_id])


@pytest.mark.slow
def test_a_foreign_checkpoint_and_a_killed_write_are_set_aside_and_the_run_trains_from_step_0(tmp_path):
    """A last.ckpt torch loads that is no Lightning checkpoint ended every re-run in KeyError
    'pytorch-lightning_version'; the temporary file of a checkpoint write cut by SIGKILL stayed for ever."""
    experiment = write_micro_experiment(tmp_path, max_steps=8, checkpoint_every=4)
    runs = tmp_path / "runs"
    first = train_cli(experiment, runs, "--seed", "5", "--set", "train.max_steps=6")  # makes runs/, another run
    assert first.returncode == 0, first.stdout + first.stderr
    from gatelab.data.identity import spec_hash
    from gatelab.data.resolve import load_experiment

    config = load_experiment(experiment, [])
    run_dir = runs / "micro" / f"{config.variant}-s{config.seed}-{spec_hash(config)}"
    (run_dir / "checkpoints").mkdir(parents=True)
    torch.save({"a": 1}, run_dir / "checkpoints" / "last.ckpt")
    (run_dir / "checkpoints" / ".last.ckpt.4242.17.tmp").write_bytes(b"half a checkpoint")
    result = train_cli(experiment, runs)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert f"checkpoint {run_dir / 'checkpoints' / 'last.ckpt'} is not a gatelab checkpoint" in result.stdout
    assert "removed 1 unfinished write(s)" in result.stdout and "Traceback" not in output
    assert sorted(p.name.split("-")[0] for p in (run_dir / "checkpoints").iterdir()) == ["last.ckpt",
                                                                                         "last.ckpt.not"]
    client, found = _mlflow_runs(runs)
    assert sorted(r.info.status for r in found) == ["FINISHED", "FINISHED"]


@pytest.mark.slow
def test_ctrl_c_before_the_first_checkpoint_leaves_one_mlflow_run_after_the_same_command(tmp_path, monkeypatch):
    """The re-run trains from step 0 in the MLflow run the stopped one opened (it was left KILLED beside a second
    one); the points the stopped one logged are kept, each step once."""
    experiment = write_micro_experiment(tmp_path, max_steps=300, checkpoint_every=1000, log_every=1)
    runs = tmp_path / "runs"
    monkeypatch.setenv("GATELAB_PROGRESS_EVERY", "0.01")  # a line a step: the test stops it after its first steps
    process = gatelab_cli("train", str(experiment), "--runs-dir", str(runs), cwd=tmp_path, wait=False)
    for line in process.stdout:
        if line.startswith("step 3/"):
            break
    process.send_signal(signal.SIGINT)
    output = process.communicate(timeout=120)[0]
    assert process.returncode == 130, output
    client, [stopped] = _mlflow_runs(runs)
    assert stopped.info.status == "KILLED" and not list(runs.glob("micro/*/checkpoints/last.ckpt"))
    logged = [m.step for m in client.get_metric_history(stopped.info.run_id, "train/loss")]
    monkeypatch.delenv("GATELAB_PROGRESS_EVERY")
    result = train_cli(experiment, runs, "--set", "train.max_steps=300")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"continuing MLflow run {stopped.info.run_id} from step 0" in result.stdout
    client, [done] = _mlflow_runs(runs)
    assert done.info.run_id == stopped.info.run_id and done.info.status == "FINISHED"
    history = client.get_metric_history(done.info.run_id, "train/loss")
    assert sorted(m.step for m in history) == list(range(300)) and logged and len(logged) < 300
