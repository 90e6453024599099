"""What runs and sweeps say while they work (gatelab.progress): the pace of plain progress lines, the time a sweep has
left, the block that ends it, the time estimate of a plan, and the noise they keep quiet. A run's own progress lines
(StepProgress) are tests/train/test_step_progress.py."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from gatelab.errors import GatelabError
from gatelab.progress import (
    RunCosts,
    closing_lines,
    format_duration,
    progress_every_s,
    silence_noise,
    sweep_progress_line,
    sweep_time_left,
)
from gatelab.sweep.queue import RunState
from tests.helpers import REPO, write_sweep


def test_the_interval_comes_from_the_environment_and_a_bad_one_is_one_message(monkeypatch):
    monkeypatch.delenv("GATELAB_PROGRESS_EVERY", raising=False)
    assert progress_every_s() == 30
    monkeypatch.setenv("GATELAB_PROGRESS_EVERY", "5")
    assert progress_every_s() == 5
    for bad in ("soon", "0", "-3"):
        monkeypatch.setenv("GATELAB_PROGRESS_EVERY", bad)
        with pytest.raises(GatelabError, match="GATELAB_PROGRESS_EVERY"):
            progress_every_s()


@pytest.mark.parametrize("seconds, text", [(0.4, "0 s"), (45, "45 s"), (77, "1 min 17 s"), (120, "2 min"),
                                           (1500, "25 min"), (7500, "2 h 5 min"), (3 * 86400, "3.0 days"),
                                           (400 * 86400, "1.1 years"), (16302772.3 * 86400, "44,635 years")])
def test_durations_read_as_a_person_would_say_them(seconds, text):
    assert format_duration(seconds) == text


def state(index: int, status: str, worker: str | None = None, since: float | None = None) -> RunState:
    return RunState(f"h{index}", index, f"run{index}", status, 1, worker=worker, since=since)


def test_time_left_prices_every_run_not_done_at_this_workers_rate():
    costs = RunCosts()
    costs.record(wall_s=130, steps=100, train_s=100)  # 1 s a step, 30 s around it
    costs.record(wall_s=320, steps=100, train_s=300)  # 3 s a step, 20 s around it
    assert costs.run_seconds(100) == pytest.approx(2.0 * 100 + 25)
    steps = {f"h{i}": 100 for i in range(4)}
    states = [state(0, "finished"), state(1, "diverged"), state(2, "pending"), state(3, "pending")]
    assert sweep_time_left(states, steps, costs, "me", now=0) == pytest.approx(2 * 225)
    # Another worker has been at run 3 for 100 s: 125 s of it are left, and two workers share the rest.
    states[3] = state(3, "running", worker="other", since=0)
    assert sweep_time_left(states, steps, costs, "me", now=100) == pytest.approx(max((225 + 125) / 2, 225))
    assert sweep_time_left([state(0, "finished"), state(1, "failed")], steps, costs, "me") == 0


def test_time_left_is_unknown_until_this_worker_has_measured_a_run():
    costs = RunCosts()
    costs.record(wall_s=12, steps=0, train_s=0)  # found already recorded: nothing trained here
    assert sweep_time_left([state(0, "pending")], {"h0": 100}, costs, "me") is None
    line = sweep_progress_line("quick", [state(0, "finished"), state(1, "pending")], None, costs)
    assert line == "sweep quick: 1/2 runs done (1 finished)"


def test_the_sweep_line_says_runs_done_and_how_the_time_left_was_estimated():
    costs = RunCosts()
    costs.record(wall_s=190, steps=150, train_s=165)
    states = [state(0, "finished"), state(1, "failed"), state(2, "pending")]
    line = sweep_progress_line("quick", states, sweep_time_left(states, {"h2": 150}, costs, "me"), costs)
    assert line == ("sweep quick: 2/3 runs done (1 finished, 1 failed), about 3 min 10 s left (estimate: 1.1 s a step "
                    "and 25 s of start-up and evaluation a run, as measured by this worker over 1 run(s))")
    states[2] = state(2, "running", worker="other", since=0)  # at it for longer than a run took here
    line = sweep_progress_line("quick", states, sweep_time_left(states, {"h2": 150}, costs, "me", now=1000), costs)
    assert line == "sweep quick: 2/3 runs done (1 finished, 1 failed), 1 still running (past this worker's estimate)"


def test_the_closing_block_names_the_store_and_the_next_commands():
    lines = closing_lines(Path("sweeps/quickstart.yaml"), "quickstart", ["sqlite:////x/runs/mlflow.db?timeout=60"],
                          Path("runs"))
    assert lines == [
        "results: MLflow store /x/runs/mlflow.db (SQLite); checkpoints under runs/",
        "next:",
        "  gatelab table sweeps/quickstart.yaml         # tables and plots, into runs/reports/quickstart/",
        "  gatelab ui sweeps/quickstart.yaml            # the runs in the MLflow UI, at http://127.0.0.1:5000",
        "  gatelab sweep status sweeps/quickstart.yaml  # the ledger: one row per run",
    ]


def test_the_closing_commands_carry_the_options_the_sweep_ran_with_and_no_password():
    lines = closing_lines(Path("s.yaml"), "s", ["http://admin:TopSecret@host:5000"], Path("/tmp/my runs"),
                          experiment=Path("experiments/small.yaml"), tracking_uri="http://admin:TopSecret@host:5000")
    text = "\n".join(lines)
    assert "TopSecret" not in text and "http://admin:***@host:5000" in lines[0]
    table = next(line for line in lines if "gatelab table" in line)
    assert table.startswith("  gatelab table s.yaml --experiment experiments/small.yaml --tracking-uri "
                            "'http://admin:***@host:5000' --runs-dir '/tmp/my runs'")  # quoted for the shell
    assert table.endswith("into /tmp/my runs/reports/s/")
    status = next(line for line in lines if "sweep status" in line)
    assert "--runs-dir '/tmp/my runs'" in status and "--tracking-uri" not in status  # status has no such option


@pytest.fixture
def restored_logging_levels():
    names = ("lightning", "lightning.pytorch", "lightning.fabric")
    levels = {name: logging.getLogger(name).level for name in names}
    for name in names:  # as Lightning's __init__ leaves them, whatever an earlier test in this process did
        logging.getLogger(name).setLevel(logging.INFO)
    yield names
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


def _warn_from(module: str, category: type[Warning], message: str = "noise") -> None:
    warnings.warn_explicit(message, category, f"{module.replace('.', '/')}.py", 1, module=module)


@pytest.mark.parametrize("verbose", [False, True])
def test_noise_is_dropped_and_gatelabs_own_warnings_kept(monkeypatch, restored_logging_levels, verbose):
    if verbose:
        monkeypatch.setenv("GATELAB_VERBOSE", "1")
    else:
        monkeypatch.delenv("GATELAB_VERBOSE", raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        silence_noise()
        _warn_from("lightning.pytorch.utilities._pytree", FutureWarning, "`isinstance(treespec, LeafSpec)`")
        _warn_from("mlflow.utils", DeprecationWarning)
        _warn_from("lightning.pytorch.trainer", UserWarning, "a real problem")
        _warn_from("gatelab.sweep.plan", DeprecationWarning, "gatelab's own")
        _warn_from("gatelab", FutureWarning, "gatelab's own too")
    kept = [str(w.message) for w in caught]
    quiet = ["a real problem", "gatelab's own", "gatelab's own too"]
    assert kept == (["`isinstance(treespec, LeafSpec)`", "noise"] + quiet if verbose else quiet)
    assert all(logging.getLogger(name).isEnabledFor(logging.INFO) == verbose for name in restored_logging_levels)


@pytest.mark.parametrize("srun", [False, True], ids=["plain host", "host with srun"])
def test_lightning_says_nothing_about_devices_or_tips_once_silenced(tmp_path, srun):
    """The real Trainer, in a fresh process: its banners are INFO logs under names Lightning may change. On a host with
    Slurm's `srun` on the PATH (here a stand-in script) Lightning also suggests running under it (issue 45)."""
    script = ("import lightning as L\nfrom gatelab.progress import silence_noise\nsilence_noise()\n"
              "L.Trainer(accelerator='cpu', precision='bf16-mixed', logger=False, enable_progress_bar=False)\n"
              "print('built')\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("GATELAB_VERBOSE", None)
    for name in ("SLURM_NTASKS", "SLURM_JOB_NAME"):  # not inside a Slurm job: the hint's own condition
        env.pop(name, None)
    # a plain host: no folder of the PATH with an srun (this host may have a real Slurm)
    env["PATH"] = os.pathsep.join(folder for folder in env["PATH"].split(os.pathsep)
                                  if not os.access(os.path.join(folder, "srun"), os.X_OK))
    if srun:
        (tmp_path / "srun").write_text("#!/bin/sh\nexit 0\n")
        (tmp_path / "srun").chmod(0o755)
        env["PATH"] = f"{tmp_path}{os.pathsep}{env['PATH']}"
    quiet = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout == "built\n" and quiet.stderr == ""
    loud = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**env, "GATELAB_VERBOSE": "1"}, timeout=120)
    assert "GPU available" in loud.stderr and "bfloat16" in loud.stderr  # what --verbose brings back
    assert ("`srun` command is available" in loud.stderr) == srun  # the stand-in is what Lightning would have seen


@pytest.mark.parametrize("verbose", [False, True])
def test_lightnings_data_loader_worker_advice_is_dropped(monkeypatch, verbose):
    """A GPU host has 16 cores a device, where Lightning's own check advises workers for every loader with fewer than
    two (these 2-core machines never see it): its real check, on such a pretend host."""
    from lightning.pytorch.trainer.connectors import data_connector
    from torch.utils.data import DataLoader, TensorDataset

    monkeypatch.setattr(data_connector, "suggested_max_num_workers", lambda devices: 15)
    monkeypatch.setenv("GATELAB_VERBOSE", "1") if verbose else monkeypatch.delenv("GATELAB_VERBOSE", raising=False)
    loader = DataLoader(TensorDataset(torch.zeros(4, 2)), batch_size=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        silence_noise()
        for name in ("val_dataloader", "train_dataloader"):
            data_connector._worker_check(SimpleNamespace(num_devices=1), loader, name)
    advice = [str(w.message) for w in caught if "does not have many workers" in str(w.message)]
    assert len(advice) == (2 if verbose else 0), advice  # --verbose shows it: the check itself still fires


# --- the time estimate of `gatelab sweep plan` and of the start of `gatelab sweep run` ---------------------------

def _measured(experiment, variant: str, step_s: float, overhead_s: float):
    from gatelab.config import flatten
    from gatelab.sweep.plan import MeasuredRun, eval_settings, step_shape

    return MeasuredRun(step_shape(flatten(experiment)), variant, step_s, overhead_s,
                       evaluation=eval_settings(flatten(experiment)))


def test_a_run_of_the_same_shape_measured_here_prices_the_plan(tmp_path):
    from gatelab.sweep.plan import plan_rows
    from gatelab.sweep.plan_render import estimate_lines
    from gatelab.sweep.spec import expand, load_sweep

    specs = expand(load_sweep(write_sweep(tmp_path, {"grid": {"variant": ["baseline", "g1_elem_sig"]}})))
    experiment = specs[0].experiment
    other_shape = experiment.model_copy(update={"train": experiment.train.model_copy(update={"batch_size": 64})})
    measured = [_measured(experiment, "baseline", 0.5, 20.0), _measured(experiment, "baseline", 0.7, 40.0),
                _measured(experiment, "g2_elem_sig", 9.0, 99.0),  # same shape, another variant
                _measured(other_shape, "g1_elem_sig", 50.0, 500.0)]  # another shape: never used
    baseline, gated = plan_rows(specs, measured=measured)
    steps = experiment.train.max_steps
    assert baseline["basis"] == "measured" and baseline["seconds"] == pytest.approx(0.6 * steps + 30.0)  # medians
    # No g1_elem_sig run of this shape: every variant of the shape counts.
    assert gated["basis"] == "measured" and gated["seconds"] == pytest.approx(0.7 * steps + 40.0)
    lines = estimate_lines([baseline, gated], workers=1)
    assert lines[0].startswith("estimate: about ") and "for 2 run(s)" in lines[0]
    assert lines[1].startswith("  measured on this machine (2 of 2 runs): ") and "the median of 3 earlier" in lines[1]
    assert "FLOP/s" not in "\n".join(lines)


def test_without_measurements_the_estimate_says_it_is_a_rough_guess_from_flops(tmp_path, monkeypatch):
    from gatelab.sweep.plan import CPU_FLOPS, plan_rows
    from gatelab.sweep.plan_render import estimate_lines

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the CPU's default, also on a GPU machine
    from gatelab.sweep.spec import expand, load_sweep

    rows = plan_rows(expand(load_sweep(write_sweep(tmp_path, {"grid": {"variant": ["baseline", "g1_elem_sig"]}}))))
    assert {row["basis"] for row in rows} == {"flops"}
    assert rows[0]["train_s"] == pytest.approx(rows[0]["flops"] / CPU_FLOPS)
    assert rows[0]["seconds"] == pytest.approx(rows[0]["train_s"] + rows[0]["setup_s"] + rows[0]["eval_s"])
    lines = estimate_lines(rows, workers=2)
    assert lines[0].startswith("estimate: roughly ") and "on 2 workers" in lines[0]  # a FLOPs guess, not a bound
    assert lines[1].startswith("  a rough guess (2 of 2 runs): training FLOPs")
    assert lines[2].startswith("  around training (2 of 2 runs): ")  # start-up and evaluation are in it


def _timed_runs(tmp_path, runs: list[tuple[str, str, float]]):
    """A store holding one run of the default sweep's first cell per (host tag, status, time/step_s), with the params
    and metrics a real run records; returns its URI and the cell's experiment."""
    from gatelab import tracking
    from gatelab.config import flatten
    from gatelab.progress import HOST_TAG
    from gatelab.sweep.plan import STEP_SHAPE
    from gatelab.sweep.spec import expand, load_sweep

    experiment = expand(load_sweep(write_sweep(tmp_path, {})))[0].experiment
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracking.prepare_store(uri)
    client = tracking.client(uri)
    experiment_id = client.create_experiment(experiment.name)
    params = {key: str(value) for key, value in flatten(experiment).items()}  # as TrackedRun.log_start logs them
    for host, status, step_s in runs:
        run = client.create_run(experiment_id, tags={HOST_TAG: host, tracking.STATUS_TAG: status})
        for key in ("variant", *STEP_SHAPE):
            client.log_param(run.info.run_id, key, params[key])
        for name, value in (("time/step_s", step_s), ("time/setup_s", 4.0), ("time/eval_s", 6.0)):
            client.log_metric(run.info.run_id, name, value)
    return uri, experiment


def test_measured_runs_are_read_back_from_the_store_for_this_machine_only(tmp_path):
    """The params, tags and metrics a real run records are the ones the plan looks for."""
    from gatelab.config import flatten
    from gatelab.sweep.plan import measured_runs, step_shape

    assert measured_runs(f"sqlite:///{tmp_path / 'mlflow.db'}") == []  # no store: nothing, and none made
    assert not (tmp_path / "mlflow.db").exists()
    uri, experiment = _timed_runs(tmp_path, [("here", "finished", 0.8), ("elsewhere", "finished", 0.1),
                                             ("here", "failed", 5.0)])
    [found] = measured_runs(uri, host="here")
    assert (found.seconds_per_step, found.overhead_s, found.variant) == (0.8, 10.0, "baseline")
    assert found.shape == step_shape(flatten(experiment))  # what plan_rows compares each cell with


def test_a_run_tagged_with_the_host_name_alone_is_not_this_machines(tmp_path):
    """Runs recorded before the host tag named the CPU say only the host name, which other machines share (every VM
    here is "vm"): the plan prices this machine's cells by runs tagged with this machine's CPU and cores only."""
    import socket

    from gatelab.host import machine_name
    from gatelab.sweep.plan import measured_runs

    uri, _ = _timed_runs(tmp_path, [(machine_name(), "finished", 0.8), (socket.gethostname(), "finished", 0.1)])
    assert [found.seconds_per_step for found in measured_runs(uri)] == [0.8]


def test_verbose_reaches_every_worker_through_its_command_line(monkeypatch):
    from typer.testing import CliRunner

    from gatelab.cli import app
    from gatelab.sweep.executor import worker_command
    from gatelab.workspace import Workspace

    arguments = dict(sweep=Path("s.yaml"), experiment=None, workspace=Workspace(storage="ledger.journal"), threads=1,
                     heartbeat_s=10.0, grace_s=60.0)
    monkeypatch.delenv("GATELAB_VERBOSE", raising=False)
    assert "--verbose" not in worker_command(**arguments)
    monkeypatch.setenv("GATELAB_VERBOSE", "1")  # what `gatelab sweep run --verbose` sets for itself
    command = worker_command(**arguments)
    assert command[command.index("worker") - 2:command.index("worker") + 1] == ["gatelab", "sweep", "worker"]
    assert command[-1] == "--verbose"
    for words in (["sweep", "worker"], ["sweep", "run"], ["train"]):  # each command takes the flag it passes down
        assert "--verbose" in CliRunner().invoke(app, [*words, "--help"]).output
