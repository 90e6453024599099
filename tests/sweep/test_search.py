"""Optuna searches: a suggestion that is no valid run fails its trial without training, a sampler that keeps
proposing them ends the search with one message instead of spinning, and a micro search minimises bits per byte."""

from __future__ import annotations

import pytest

from gatelab.errors import GatelabError
from gatelab.metrics import BPB_AVG
from gatelab.sweep import search as search_module
from gatelab.sweep.ledger_storage import open_storage
from gatelab.sweep.spec import load_sweep
from gatelab.workspace import Workspace
from tests.helpers import MICRO, sqlite_uri, write_sweep


def test_a_suggestion_that_is_no_valid_run_fails_without_training_and_the_search_stops(tmp_path, monkeypatch):
    sweep = load_sweep(write_sweep(tmp_path, {"search": {
        "params": {"train.lr": {"type": "float", "low": 1.0e-3, "high": 1.0e-2}}, "n_trials": 2}}))

    def invalid(spec, values):
        raise GatelabError(f"sweep t, cell {spec.index}: train.lr {values['train.lr']:g} is no valid run")

    def must_not_train(*args, **kwargs):
        raise AssertionError("an invalid trial was trained")

    monkeypatch.setattr(search_module, "with_values", invalid)
    monkeypatch.setattr("gatelab.train.run.run", must_not_train)
    said = []
    with pytest.raises(GatelabError, match=f"{search_module.MAX_INVALID_TRIALS} suggested trials were no valid run"):
        search_module.run_search(sweep, sweep.runs, log=said.append, workspace=Workspace(
            runs_dir=tmp_path / "runs", storage=str(tmp_path / "ledger.journal")))
    assert sum("is no valid run, failed without training" in line for line in said) == \
        search_module.MAX_INVALID_TRIALS


def test_a_search_minimises_bits_per_byte(tmp_path):
    """`metric: bpb/avg` is a search objective: each trial's value is its run's logged bits per byte."""
    import mlflow
    import optuna

    micro = {**MICRO, "train": {**MICRO["train"], "max_steps": 4, "checkpoint_every": 4},
             "eval": {**MICRO["eval"], "every_n_steps": None, "blimp": False, "long_context_multipliers": [1]}}
    sweep = load_sweep(write_sweep(tmp_path, {"search": {
        "params": {"train.lr": {"type": "float", "low": 1.0e-3, "high": 1.0e-2}}, "n_trials": 2, "metric": BPB_AVG,
        "pruner": "none"}}, preset=micro))
    workspace = Workspace(runs_dir=tmp_path / "runs", storage=str(tmp_path / "ledger.journal"))
    (spec,) = sweep.runs
    best = search_module.run_search(sweep, sweep.runs, log=lambda *args: None, workspace=workspace)

    study = optuna.load_study(study_name=search_module.study_name(sweep.name, spec),
                              storage=open_storage(workspace.storage))
    trials = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    client = mlflow.MlflowClient(sqlite_uri(workspace.runs_dir))
    logged = [client.get_run(t.user_attrs["gatelab.mlflow_run_id"]).data.metrics[BPB_AVG] for t in trials]
    assert [t.value for t in trials] == logged and len(logged) == 2 and all(0 < bpb < 16 for bpb in logged)
    assert best[spec.hash]["value"] == min(logged)
