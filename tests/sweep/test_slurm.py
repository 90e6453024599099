"""`gatelab sweep run --executor slurm` on a real Slurm started for these tests (tests/slurm_cluster.py): every way
Slurm ends a task (requeue, scancel, its time limit) still ends with every cell trained once, resumed from its
checkpoint; the launcher tops the array up, Ctrl-C leaves it running and says so, and `sweep status` names the tasks."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import mlflow
import pytest
import yaml

from tests import slurm_cluster
from tests.helpers import MICRO, MICRO_SWEEP_VARIANTS, sqlite_uri

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def local_slurm():
    reason = slurm_cluster.unavailable_reason()
    if reason is not None:
        if os.environ.get(slurm_cluster.REQUIRE_ENV) == "1":
            pytest.fail(f"{slurm_cluster.REQUIRE_ENV}=1 but no local Slurm: {reason}")
        pytest.skip(reason)
    # not under pytest's 0700 tmp folder: munged runs as the munge user and must reach its socket's folder
    folder = Path(tempfile.mkdtemp(prefix="gatelab-slurm-"))
    folder.chmod(0o755)
    cluster = slurm_cluster.start(folder / "cluster")
    yield cluster
    slurm_cluster.stop(cluster)
    shutil.rmtree(folder, ignore_errors=True)


def _sweep(folder: Path, name: str, *, seeds: list[int], max_steps: int, slurm: dict) -> Path:
    preset = {**MICRO, "train": {**MICRO["train"], "max_steps": max_steps, "checkpoint_every": max_steps // 10,
                                 "log_every": 25},
              "eval": {**MICRO["eval"], "every_n_steps": None, "blimp": False}}
    (folder / "micro.yaml").write_text(yaml.safe_dump(preset))
    sweep = {"name": name, "experiment": "micro.yaml", "grid": {"variant": MICRO_SWEEP_VARIANTS, "seed": seeds},
             "slurm": {"cpus_per_worker": 1, "gpus_per_worker": 0, "time_min": 10, **slurm}}
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep))
    return path


def _launch(cluster, sweep: Path, *extra: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "gatelab", "sweep", "run", str(sweep), "--executor", "slurm", "--runs-dir",
               "runs", "--heartbeat", "1", "--grace", "15", *extra]
    return subprocess.Popen(command, cwd=sweep.parent, env={**os.environ, **cluster.env}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _status(cluster, sweep: Path) -> dict:
    shown = subprocess.run([sys.executable, "-m", "gatelab", "sweep", "status", str(sweep), "--runs-dir", "runs",
                            "--json"], cwd=sweep.parent, env={**os.environ, **cluster.env}, capture_output=True,
                           text=True, timeout=120)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    return json.loads(shown.stdout)


def _until(predicate, launcher: subprocess.Popen, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        assert launcher.poll() is None, f"the launcher ended before {what}:\n{launcher.stdout.read()}"
        time.sleep(1)
    raise AssertionError(f"not within {seconds} s: {what}")


def _every_cell_once(runs: Path, name: str, cells: int) -> dict[str, str]:
    """Exactly one finished MLflow run a cell (any other only superseded), no training step logged twice; each cell's
    run id by its spec hash."""
    mlflow.set_tracking_uri(sqlite_uri(runs))
    frame = mlflow.search_runs(experiment_names=[name])
    finished = frame[frame["tags.gatelab.status"] == "finished"]
    assert len(finished) == cells and finished["tags.gatelab.spec_hash"].is_unique, frame.to_string()
    assert set(frame["tags.gatelab.status"]) <= {"finished", "superseded"}, frame["tags.gatelab.status"].tolist()
    client = mlflow.MlflowClient()
    for run_id in finished["run_id"]:
        steps = [point.step for point in client.get_metric_history(run_id, "train/loss")]
        assert steps and len(steps) == len(set(steps)), f"run {run_id} logged a step twice: {sorted(steps)}"
    return dict(zip(finished["tags.gatelab.spec_hash"], finished["run_id"]))


def test_six_cells_survive_a_requeue_a_scancel_and_a_time_limit(local_slurm, tmp_path):
    """6 cells on 3 array tasks: once each task trains a cell past a checkpoint, one is requeued (scontrol requeue),
    one cancelled (scancel) and one given a 1-minute time limit (USR2 20 s before it). The waiting launcher tops the
    array up; every cell finishes once, the interrupted ones resumed from their checkpoints."""
    sweep = _sweep(tmp_path, "slurm-acceptance", seeds=[0, 1], max_steps=1500,
                   slurm={"signal_delay_s": 20, "sbatch": {"comment": "gatelab-acceptance"},
                          "setup": ["echo set-up line ran"]})
    # cell 0, claimed first, is long enough that Slurm's warning comes mid-cell on the task given the time limit:
    # slurmctld checks limits every 30 s, so the warning comes up to 30 s after the limit is set
    config = yaml.safe_load(sweep.read_text())
    config["grid"] = {}
    config["include"] = [{"variant": "baseline", "seed": 9, "train.max_steps": 6000}] + [
        {"variant": variant, "seed": seed} for seed in (0, 1) for variant in MICRO_SWEEP_VARIANTS][:6 - 1]
    sweep.write_text(yaml.safe_dump(config))
    runs = tmp_path / "runs"
    launcher = _launch(local_slurm, sweep, "--workers", "3")
    checkpointed = lambda run: any(runs.glob(f"slurm-acceptance/*{run['hash']}*/checkpoints/last.ckpt"))  # noqa: E731

    def three_running_past_a_checkpoint():
        running = [run for run in _status(local_slurm, sweep)["runs"] if run["status"] == "running"]
        return running if len(running) == 3 and all(map(checkpointed, running)) else None

    running = _until(three_running_past_a_checkpoint, launcher, 150, "3 cells running past a checkpoint")
    # each running cell names its worker's Slurm task and log
    tasks = {run["index"]: run["slurm_task"] for run in running}
    assert len(set(tasks.values())) == 3 and all(Path(run["log"]).is_file() for run in running), running
    long_cell = next(run["index"] for run in running if run["label"].startswith("baseline s9"))
    timed = tasks.pop(long_cell)
    requeued, cancelled = sorted(tasks.values())
    array_job = requeued.split("_")[0]
    shown = local_slurm.run("scontrol", "--oneliner", "show", "job", requeued).stdout
    assert "Comment=gatelab-acceptance" in shown  # the sweep file's extra sbatch line
    assert "set-up line ran" in (tmp_path / "runs" / "slurm-acceptance" / "submitit" / f"{requeued}_0_log.out"
                                 ).read_text() or "set-up line ran" in Path(running[0]["log"]).read_text()
    local_slurm.run("scontrol", "requeue", requeued)
    local_slurm.run("scancel", cancelled)
    local_slurm.run("scontrol", "update", f"JobId={timed}", "TimeLimit=1")

    output, _ = launcher.communicate(timeout=300)
    assert launcher.returncode == 0, output
    assert f"Slurm task {cancelled} ended: CANCELLED" in output  # and a fresh task was submitted for it
    assert output.count("submitted Slurm task") >= 2, output
    run_ids = _every_cell_once(runs, "slurm-acceptance", cells=6)
    logs = "".join(path.read_text() for path in (runs / "slurm-acceptance" / "submitit").glob("*_log.*"))
    resumed = {line.split("resuming ")[1].split()[0] for line in logs.splitlines() if "resuming " in line}
    interrupted = {run["hash"] for run in running}
    # the three interrupted cells went on from their checkpoints
    assert {digest for digest in interrupted if any(digest in folder for folder in resumed)} == interrupted, logs
    assert all(run_id in logs for run_id in run_ids.values())
    ended = {row["task"]: row for row in _status(local_slurm, sweep).get("slurm_tasks", [])}
    assert ended[cancelled]["state"] == "CANCELLED", ended
    assert int(ended[requeued]["restarts"]) >= 1 and int(ended[timed]["restarts"]) + (
        ended[timed]["state"] == "TIMEOUT") >= 1, ended
    assert array_job in (runs / "slurm-acceptance" / "submitit" / "jobs.txt").read_text()


def test_ctrl_c_leaves_the_array_running_and_the_same_command_waits_for_it_again(local_slurm, tmp_path):
    sweep = _sweep(tmp_path, "slurm-ctrl-c", seeds=[0], max_steps=300, slurm={})
    runs = tmp_path / "runs"
    launcher = _launch(local_slurm, sweep, "--workers", "2")
    _until(lambda: (runs / "slurm-ctrl-c" / "submitit" / "jobs.txt").is_file(), launcher, 60, "a submission")
    launcher.send_signal(signal.SIGINT)
    output, _ = launcher.communicate(timeout=60)
    assert launcher.returncode == 130, output
    job = (runs / "slurm-ctrl-c" / "submitit" / "jobs.txt").read_text().split()[0]
    assert "Slurm tasks go on" in output and f"scancel {job}" in output, output
    assert "Traceback" not in output
    assert local_slurm.states(job), "the array was cancelled"
    again = _launch(local_slurm, sweep, "--workers", "2")
    output, _ = again.communicate(timeout=240)
    assert again.returncode == 0, output
    assert "submitted Slurm task" not in output  # it waited for the tasks still alive instead of adding more
    _every_cell_once(runs, "slurm-ctrl-c", cells=3)


def test_a_run_on_two_devices_is_one_slurm_task_per_device_joined_by_lightning(local_slurm, tmp_path):
    """train.devices: 2 under Slurm: each array task is 2 Slurm tasks; rank 0's worker claims the run and the other
    rank starts the same `gatelab train`, which Lightning's Slurm environment joins into one DDP run (gloo on CPU)."""
    sweep = _sweep(tmp_path, "slurm-ddp", seeds=[0], max_steps=60, slurm={})
    config = yaml.safe_load(sweep.read_text())
    config["grid"]["variant"] = ["baseline", "g1_head_sig"]
    config["overrides"] = {"train.devices": 2, "train.strategy": "ddp", "train.accelerator": "cpu"}
    sweep.write_text(yaml.safe_dump(config))
    launcher = _launch(local_slurm, sweep, "--workers", "1")
    output, _ = launcher.communicate(timeout=240)
    assert launcher.returncode == 0, output
    runs = tmp_path / "runs"
    run_ids = _every_cell_once(runs, "slurm-ddp", cells=2)
    frame = mlflow.search_runs(experiment_names=["slurm-ddp"])
    assert set(frame["params.train.devices"]) == {"2"}
    submission = next((runs / "slurm-ddp" / "submitit").glob("*_submission.sh")).read_text()
    assert "#SBATCH --ntasks-per-node=2" in submission
    # rank 1 trained both runs beside rank 0 (without it rank 0's DDP would wait forever), into rank 0's MLflow runs
    rank1 = "".join(path.read_text() for path in (runs / "slurm-ddp" / "submitit").glob("*_1_log.out"))
    assert all(f"finished: MLflow run {run_id}" in rank1 for run_id in run_ids.values()), rank1


def test_cells_of_different_device_counts_are_refused_before_any_submission(local_slurm, tmp_path):
    sweep = _sweep(tmp_path, "slurm-mixed", seeds=[0], max_steps=20, slurm={})
    config = yaml.safe_load(sweep.read_text())
    config["include"] = [{"variant": "baseline", "seed": 5, "train.devices": 2, "train.strategy": "ddp"}]
    sweep.write_text(yaml.safe_dump(config))
    launcher = _launch(local_slurm, sweep)
    output, _ = launcher.communicate(timeout=120)
    assert launcher.returncode == 2 and "one number of tasks" in output and "Traceback" not in output, output
    assert not (tmp_path / "runs" / "slurm-mixed" / "submitit" / "jobs.txt").exists()
