"""The shipped sweeps, run for real: smoke (every registered variant) and lr-stability (an Optuna search)."""

from __future__ import annotations

import mlflow
import optuna
import pytest
import yaml

from gatelab.sweep.ledger_storage import open_storage
from gatelab.variants import VARIANTS
from tests.helpers import MICRO, REPO, gatelab_cli


@pytest.mark.slow
def test_smoke_sweep_trains_and_evaluates_every_registered_variant(tmp_path):
    runs = tmp_path / "runs"
    result = gatelab_cli("sweep", "run", str(REPO / "sweeps" / "smoke.yaml"), "--runs-dir", str(runs), "--workers", "2",
                      cwd=tmp_path)  # two local workers share one SQLite MLflow store and one journal ledger
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    mlflow.set_tracking_uri(f"sqlite:///{runs / 'mlflow.db'}")
    frame = mlflow.search_runs(experiment_names=["smoke"])
    assert sorted(frame[frame["status"] == "FINISHED"]["tags.variant"]) == sorted(VARIANTS)
    assert frame["metrics.ppl/avg"].notna().all() and frame["metrics.probe/f_attn"].notna().all()
    assert list((runs / "smoke" / "local-workers").iterdir()) == []  # the workers' registry goes with the launch


@pytest.mark.slow
def test_lr_stability_search_prunes_trials_visibly_in_optuna_and_mlflow(tmp_path):
    micro = {**MICRO, "eval": {**MICRO["eval"], "blimp_path": None}}
    preset = tmp_path / "micro.yaml"
    preset.write_text(yaml.safe_dump(micro))
    runs = tmp_path / "runs"
    result = gatelab_cli("sweep", "run", str(REPO / "sweeps" / "lr-stability.yaml"), "--experiment", str(preset),
                      "--runs-dir", str(runs), cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    storage = open_storage(str(runs / "lr-stability" / "ledger.journal"))
    studies = [s for s in optuna.get_all_study_summaries(storage) if ".search." in s.study_name]
    assert len(studies) == 2  # one per grid cell: baseline and g1_elem_sig
    trials = [t for s in studies for t in optuna.load_study(study_name=s.study_name, storage=storage).get_trials()]
    pruned = [t for t in trials if t.state == optuna.trial.TrialState.PRUNED]
    assert pruned and len([t for t in trials if t.state.is_finished()]) >= 12
    mlflow.set_tracking_uri(f"sqlite:///{runs / 'mlflow.db'}")
    frame = mlflow.search_runs(experiment_names=["lr-stability"])
    pruned_runs = frame[frame["tags.gatelab.status"] == "pruned"]
    assert len(pruned_runs) == len(pruned) and (pruned_runs["status"] == "FINISHED").all()  # pruned is not a crash
    assert {t.user_attrs["gatelab.mlflow_run_id"] for t in pruned} == set(pruned_runs["run_id"])
    assert set(pruned_runs["tags.optuna.trial"]) == {str(t.number) for t in pruned}  # each trial named in MLflow
