"""A run that cannot fit is refused before anything is allocated, prepared or opened."""

from __future__ import annotations

import resource

import pytest

from gatelab.data.resolve import load_experiment
from gatelab.errors import GatelabError
from gatelab.model import resolve_model
from gatelab.train import memory
from tests.helpers import REPO, sqlite_uri, train_cli, write_micro_experiment

GB = 10**9


@pytest.mark.parametrize("override, key", [("model.vocab_size=100000000", "model.vocab_size"),
                                           ("data.seq_len=1000000000", "data.seq_len")])
def test_a_run_too_large_for_the_machine_is_refused_with_its_bound(tmp_path, monkeypatch, override, key):
    monkeypatch.setattr(memory, "available_bytes", lambda experiment: (24 * GB, "this machine's 24.0 GB"))
    experiment = load_experiment(write_micro_experiment(tmp_path), [override])
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(GatelabError, match=rf"needs at least [\d,.]+ GB.*more than this machine's 24.0 GB.*{key}"):
        memory.check_fits(experiment, resolve_model(experiment))
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 200_000  # kB: nothing was allocated


def test_the_bound_counts_weights_optimizer_and_logits():
    experiment = load_experiment(REPO / "experiments" / "tiny.yaml")
    bound = memory.memory_bound(experiment, resolve_model(experiment))
    assert bound.weights_and_optimizer == 16 * bound.parameters
    batch, seq, vocab = experiment.train.batch_size, experiment.data.seq_len, experiment.model.vocab_size
    assert bound.training_activations >= 8 * batch * seq * vocab
    assert bound.total < 4 * GB  # the quick start fits a laptop


@pytest.mark.parametrize("preset", sorted((REPO / "experiments").glob("tiny*.yaml")), ids=lambda p: p.stem)
def test_the_cpu_presets_are_not_refused_here(preset):
    experiment = load_experiment(preset)
    memory.check_fits(experiment, resolve_model(experiment))


@pytest.mark.slow
def test_a_refused_run_leaves_no_run_folder_and_no_mlflow_run(tmp_path):
    runs = tmp_path / "runs"
    result = train_cli(write_micro_experiment(tmp_path), runs, "--set", "model.vocab_size=100000000")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "model.vocab_size" in result.stderr and "Traceback" not in result.stdout + result.stderr
    assert not runs.exists() or not (runs / "mlflow.db").exists() or _no_runs(sqlite_uri(runs))
    assert not (runs / "micro").exists()


def _no_runs(uri: str) -> bool:
    import mlflow

    client = mlflow.MlflowClient(uri)
    return not client.search_runs([e.experiment_id for e in client.search_experiments()])
