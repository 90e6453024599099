"""`gatelab train` under Lightning DDP: two CPU processes (gloo) train the curve one process trains, into one run.

The same micro experiment runs as one process and as two DDP ranks with the same global batch (each rank takes half of
it), each into its own runs directory; the real command runs in a subprocess, so Lightning's launcher re-runs it for
rank 1 exactly as it would for a user. Then torchrun starts both ranks at once (as srun would) on the finished run:
rank 0 finds it done in MLflow and both ranks must leave without training or hanging. A diverging run must stop both
ranks at the same step. FSDP is refused on CPU (Lightning runs it on CUDA only), so no test here trains with it.
"""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import mlflow
import pytest
import torch.distributed

from tests.helpers import made_once, sqlite_uri, train_cli, write_micro_experiment

pytestmark = [
    pytest.mark.slow,  # every test here trains 2-process DDP runs in subprocesses
    pytest.mark.skipif(not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
                       reason="this torch has no gloo backend for CPU DDP"),
]

STEPS = 8
# Global batch 4: 2 windows per rank under DDP. Validation every 4 steps and a checkpoint every 4 steps run under DDP
# too; threads=1 so the two ranks share 2 cores without oversubscribing them.
TRAIN = {"max_steps": STEPS, "batch_size": 4, "warmup_steps": 2, "lr": 1e-2, "checkpoint_every": 4, "threads": 1,
         "accelerator": "cpu"}
DDP = ["--set", "train.devices=2", "--set", "train.strategy=ddp"]


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """Runs directories of the same experiment trained by one process and by two DDP ranks (trained once a session:
    the tests only read them)."""
    stored = made_once(tmp_path_factory, "ddp", _train_single_and_ddp)
    return {key: value if key == "ddp_stdout" else Path(value) for key, value in stored.items()}


def _train_single_and_ddp(folder: Path) -> dict:
    experiment = write_micro_experiment(folder, **TRAIN)
    # Side by side: each command spends most of its time importing on one core (rank 1 starts only when rank 0 fits).
    single = train_cli(experiment, folder / "single", "--set", "eval.every_n_steps=4", wait=False)
    ddp = train_cli(experiment, folder / "ddp", "--set", "eval.every_n_steps=4", *DDP, wait=False)
    with ThreadPoolExecutor(2) as pool:  # both pipes drained at once: neither command can block on a full one
        single_stdout, ddp_stdout = pool.map(lambda process: process.communicate(timeout=600)[0], (single, ddp))
    assert single.returncode == 0, single_stdout
    assert ddp.returncode == 0, ddp_stdout
    return {"experiment": str(experiment), "single": str(folder / "single"), "ddp": str(folder / "ddp"),
            "ddp_stdout": ddp_stdout}


@pytest.mark.parametrize("strategy", ["ddp_spawn", "fsdp"])
def test_a_strategy_that_cannot_run_here_is_refused_before_any_work(tmp_path, strategy):
    from gatelab.data.resolve import load_experiment
    from gatelab.errors import GatelabError
    from gatelab.train.run import run

    experiment = load_experiment(write_micro_experiment(tmp_path, **TRAIN),
                                 [f"train.strategy={strategy}", "train.devices=2"])
    with pytest.raises(GatelabError, match=f"train.strategy: '{strategy}'"):
        run(experiment, runs_dir=tmp_path / "runs", quiet=True)
    assert not (tmp_path / "runs").exists()


def _only_run(runs):
    client = mlflow.MlflowClient(sqlite_uri(runs))
    found = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(found) == 1, [r.info.run_id for r in found]
    return client, found[0]


def _history(client, run, metric: str) -> dict[int, float]:
    points = client.get_metric_history(run.info.run_id, metric)
    steps = [m.step for m in points]
    assert len(steps) == len(set(steps)), f"{metric} logged twice at a step: {sorted(steps)}"
    return {m.step: m.value for m in points}


def test_two_ranks_train_the_curve_one_process_trains(stores):
    single_client, single = _only_run(stores["single"])
    ddp_client, ddp = _only_run(stores["ddp"])
    assert ddp.data.params["train.devices"] == "2" and ddp.data.params["train.strategy"] == "ddp"
    one, two = _history(single_client, single, "train/loss"), _history(ddp_client, ddp, "train/loss")
    assert sorted(one) == sorted(two) == list(range(STEPS))
    difference = max(abs(one[step] - two[step]) for step in one)
    assert difference <= 1e-4, (difference, one, two)
    assert one[STEPS - 1] < one[0] - 0.05  # the curve moves, so a wrong gradient or data slice would show
    # Gradients are averaged over ranks before clipping and the optimizer step: the same norms as one process.
    one, two = _history(single_client, single, "train/grad_norm"), _history(ddp_client, ddp, "train/grad_norm")
    assert all(abs(one[step] - two[step]) <= 1e-4 * one[step] for step in one), (one, two)


def test_rank_zero_alone_records_one_finished_run(stores):
    client, run = _only_run(stores["ddp"])
    assert run.info.status == "FINISHED" and run.data.tags["gatelab.status"] == "finished"
    for metric in ("ppl/avg", "unigram_ppl/avg", "probe/f_attn"):
        assert len(_history(client, run, metric)) == 1, metric
    assert list(_history(client, run, "ppl/avg")) == [STEPS]
    assert {a.path for a in client.list_artifacts(run.info.run_id, "config")} == {
        "config/experiment.yaml", "config/model_resolved.yaml"}
    # Both ranks report the same run: rank 1 learns its id from rank 0, without opening the store.
    assert stores["ddp_stdout"].count(f"finished: MLflow run {run.info.run_id} ") == 2, stores["ddp_stdout"]
    _, single = _only_run(stores["single"])
    assert abs(run.data.metrics["ppl/avg"] - single.data.metrics["ppl/avg"]) <= 1e-4 * single.data.metrics["ppl/avg"]


def test_validation_loss_is_over_every_rank(stores):
    """Lightning gives each rank half of the held-out windows; val/loss must average over both halves."""
    single_client, single = _only_run(stores["single"])
    ddp_client, ddp = _only_run(stores["ddp"])
    one, two = _history(single_client, single, "val/loss"), _history(ddp_client, ddp, "val/loss")
    assert sorted(one) == sorted(two) and len(one) == STEPS // 4
    assert all(abs(one[step] - two[step]) <= 1e-4 for step in one), (one, two)


def test_a_finished_run_started_by_torchrun_ends_on_every_rank_without_training(stores):
    """Ranks that torchrun (or srun) starts all run `run()` from the beginning: when rank 0 finds the run done in
    MLflow it cannot simply return, or rank 1 would wait for it in the process group forever."""
    runs = stores["ddp"]
    client, before = _only_run(runs)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "-m", "gatelab", "train", str(stores["experiment"]), "--quiet", "--runs-dir", str(runs),
               "--set", "eval.every_n_steps=4", *DDP]
    result = subprocess.run(command, cwd=runs.parent, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count(f"finished: MLflow run {before.info.run_id} ") == 2, result.stdout + result.stderr
    client, after = _only_run(runs)
    assert after.info.run_id == before.info.run_id and after.info.status == "FINISHED"
    assert len(_history(client, after, "train/loss")) == STEPS and len(_history(client, after, "ppl/avg")) == 1


def test_a_diverging_run_stops_every_rank_at_the_same_step(tmp_path):
    """The stability monitor of each rank reads the loss synced over ranks, so all of them stop at the same step; a
    rank that went on training would wait for the others in its next all-reduce, and the command would never end."""
    runs = tmp_path / "runs"
    experiment = write_micro_experiment(tmp_path, **{**TRAIN, "lr": 10.0, "max_steps": 200, "warmup_steps": 0,
                                                     "grad_clip": 0.0})
    result = train_cli(experiment, runs, *DDP)
    assert result.returncode == 0, result.stdout + result.stderr
    _, run = _only_run(runs)
    assert run.data.tags["gatelab.status"] == "diverged" and run.data.metrics["diverged_step"] < 200
    step = int(run.data.metrics["diverged_step"])
    assert result.stdout.count(f"diverged at step {step}\n") == 2, result.stdout  # each rank's own report
