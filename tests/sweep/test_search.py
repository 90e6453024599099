"""Optuna searches: a suggestion that is no valid run fails its trial without training, and a sampler that keeps
proposing them ends the search with one message instead of spinning."""

from __future__ import annotations

import pytest

from gatelab.errors import GatelabError
from gatelab.sweep import search as search_module
from gatelab.sweep.spec import load_sweep
from gatelab.workspace import Workspace
from tests.helpers import write_sweep


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
