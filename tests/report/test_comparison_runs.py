"""Each comparison of `gatelab table` as an MLflow run of its own (gatelab.report.comparison_runs): in the experiment
"<sweep> comparisons", one run per variant and rung (and one per ladder arm) however often the table is made, a new
one where what was compared changed, nothing on a read-only store, the training runs untouched, and no landing page
for it. Runs are real runs in a SQLite store made without training."""

from __future__ import annotations

import json
import math
from pathlib import Path

import mlflow
import pytest
from mlflow.entities import Metric, Param, ViewType

from gatelab import tracking
from gatelab.app.report import make_report
from gatelab.progress import DEVICE_TAG, HOST_TAG
from gatelab.report import comparison_runs, ui
from gatelab.report.stats import PAIRED
from gatelab.sweep.flops import run_training_flops
from gatelab.sweep.spec import expand, load_sweep
from gatelab.workspace import Workspace
from tests.helpers import sqlite_uri, write_sweep

SEEDS = [0, 1]
RUNGS = {  # three widths of the micro preset: alpha fixed to Chinchilla's, L_inf and A fitted
    "r1": {"model.d_model": 16, "model.head_dim": 4, "model.ffn_hidden": 32},
    "r2": {"model.d_model": 32, "model.head_dim": 8, "model.ffn_hidden": 64},
    "r3": {"model.d_model": 64, "model.head_dim": 16, "model.ffn_hidden": 128},
}
COMPARISONS = "t comparisons"
BUDGET = "bytes=100000"  # what every run logged as its evaluation budget (tracking.EVAL_BUDGET_PARAM)


def _loss(spec, largest: float) -> float:
    """On a law with the variant worth 1.3x its compute, each seed a little off it."""
    compute = run_training_flops(spec.experiment) * (1.0 if spec.experiment.variant == "baseline" else 1.3)
    return 2.0 + (compute / largest) ** -0.3 + 0.003 * (spec.experiment.seed - 0.5) * (1 + spec.index % 3)


def _store(tmp_path: Path, ladder: bool = True) -> tuple[Path, Path, tracking.RunStore, dict[int, str]]:
    """A SQLite store with every run of the sweep finished; the sweep, the runs folder, the store and {spec index:
    run id}."""
    body = {"grid": {"variant": ["baseline", "g1_elem_sig"], "seed": SEEDS}}
    if ladder:
        body["ladder"] = {"rungs": RUNGS, "tokens": {"per_parameter": 20}}
    sweep_path = write_sweep(tmp_path, body)
    runs = tmp_path / "runs"
    runs.mkdir()
    store = tracking.RunStore(sqlite_uri(runs), runs)
    specs = expand(load_sweep(sweep_path))
    largest = max(run_training_flops(spec.experiment) for spec in specs)
    run_ids = {}
    for spec in specs:
        run = store.client.create_run(store.experiment_id("t"), start_time=spec.index, tags={
            tracking.SPEC_HASH_TAG: spec.hash, tracking.STATUS_TAG: "finished",
            tracking.VARIANT_TAG: spec.experiment.variant, HOST_TAG: "vm", DEVICE_TAG: "cpu"})
        step_s = 0.1 * (1.1 if spec.experiment.variant != "baseline" else 1.0) * (1 + 0.01 * spec.experiment.seed)
        metrics = {"ppl/avg": math.exp(_loss(spec, largest)), "time/step_s": step_s, "time/wall_step_s": 2 * step_s}
        params = [Param(tracking.EVAL_BUDGET_PARAM, BUDGET)]
        store.client.log_batch(run.info.run_id, metrics=[Metric(k, v, spec.index, 10) for k, v in metrics.items()],
                               params=params)
        store.client.set_terminated(run.info.run_id, "FINISHED", end_time=spec.index + 1000)
        run_ids[spec.index] = run.info.run_id
    return sweep_path, runs, store, run_ids


def _table(sweep_path: Path, runs: Path, tmp_path: Path) -> None:
    make_report(sweep_path, experiment=None, formats=["csv"], out_dir=tmp_path / "table",
                workspace=Workspace(runs_dir=runs), log=lambda line: None)


def _comparisons(runs: Path, view: str = "ACTIVE_ONLY"):
    """The comparisons experiment as the issue's acceptance reads it: `mlflow.search_runs`."""
    mlflow.set_tracking_uri(sqlite_uri(runs))
    return mlflow.search_runs(experiment_names=[COMPARISONS], run_view_type=getattr(ViewType, view))


def _training_runs(store: tracking.RunStore) -> dict[str, tuple[dict, dict, dict]]:
    experiment = store.client.get_experiment_by_name("t").experiment_id
    return {run.info.run_id: (run.data.tags, run.data.params, run.data.metrics)
            for run in store.client.search_runs([experiment])}


def test_each_variant_and_rung_is_one_run_with_what_was_compared_however_often_the_table_is_made(tmp_path):
    sweep_path, runs, store, run_ids = _store(tmp_path)
    specs = expand(load_sweep(sweep_path))
    training = _training_runs(store)

    _table(sweep_path, runs, tmp_path)
    first = _comparisons(runs)
    _table(sweep_path, runs, tmp_path)
    rows = _comparisons(runs)

    assert sorted(rows["run_id"]) == sorted(first["run_id"]), "the second table updates the same runs"
    assert len(_comparisons(runs, "DELETED_ONLY")) == 0
    main = rows[rows["params.table"] == "main"].set_index("params.rung")
    assert sorted(main.index) == ["r1", "r2", "r3"] and set(main["params.variant"]) == {"g1_elem_sig"}
    for rung, row in main.iterrows():
        ids = {variant: sorted(run_ids[s.index] for s in specs
                               if s.settings()["rung"] == rung and s.experiment.variant == variant)
               for variant in ("baseline", "g1_elem_sig")}
        assert row["params.variant_run_ids"] == ",".join(ids["g1_elem_sig"])
        assert row["params.baseline_run_ids"] == ",".join(ids["baseline"])
        assert row["params.baseline"] == f"baseline rung={rung}" and row["params.metric"] == "ppl/avg"
        assert row["params.eval_budget"] == BUDGET
        assert row["params.variant_seeds"] == "2" and row["metrics.delta"] < 0  # the variant reaches a lower loss
        assert row["metrics.step_time_ratio"] == pytest.approx(1.1, rel=0.01)
        assert row[f"tags.{comparison_runs.TEST_TAG}"] == PAIRED
        verdict = row[f"tags.{comparison_runs.VERDICT_TAG}"]
        assert verdict.startswith("Δ -") and ", p " in verdict
        assert row[f"tags.{tracking.COMPARISON_KEY_TAG}"] == f"main/g1_elem_sig rung={rung}"
    [ladder] = rows[rows["params.table"] == "ladder"].to_dict("records")
    assert ladder["params.group"] == "g1_elem_sig" and ladder["params.rung"] == "r3"
    assert ladder["params.baseline_run_ids"].count(",") == 5  # every rung's baseline runs: 3 rungs x 2 seeds
    assert ladder["metrics.compute_multiplier"] == pytest.approx(1.3, rel=0.1)
    assert ladder["metrics.compute_multiplier_low"] < ladder["metrics.compute_multiplier"] \
        < ladder["metrics.compute_multiplier_high"]
    assert ladder[f"tags.{comparison_runs.VERDICT_TAG}"].endswith(" at rung r3")
    details = json.loads(Path(mlflow.artifacts.download_artifacts(
        run_id=ladder["run_id"], artifact_path="comparison.json", tracking_uri=sqlite_uri(runs))).read_text())
    assert len(details["baseline_run_ids"]) == 6 and details["metrics"]["alpha"] == ladder["metrics.alpha"]

    assert _training_runs(store) == training, "no tag, param or metric of a training run changed"


def test_a_comparison_of_other_runs_replaces_its_run_and_the_rest_stay(tmp_path):
    sweep_path, runs, store, run_ids = _store(tmp_path)
    _table(sweep_path, runs, tmp_path)
    before = _comparisons(runs).set_index(f"tags.{tracking.COMPARISON_KEY_TAG}")["run_id"]
    variant_r1 = next(s for s in expand(load_sweep(sweep_path))
                      if s.experiment.variant != "baseline" and s.settings()["rung"] == "r1")
    store.supersede("t", "trained before a fix", [run_ids[variant_r1.index]])  # r1 and the ladder lose a run

    _table(sweep_path, runs, tmp_path)

    after = _comparisons(runs).set_index(f"tags.{tracking.COMPARISON_KEY_TAG}")
    assert sorted(after.index) == sorted(before.index), "one active run per variant and rung"
    changed = {key for key in before.index if after.loc[key, "run_id"] != before[key]}
    assert changed == {"main/g1_elem_sig rung=r1", "ladder/g1_elem_sig"}
    assert after.loc["main/g1_elem_sig rung=r1", "params.variant_seeds"] == "1"
    assert sorted(_comparisons(runs, "DELETED_ONLY")["run_id"]) == sorted(before[list(changed)])


def test_a_read_only_store_gets_no_comparisons_and_a_sweep_without_rungs_has_rung_none_and_no_landing_page(tmp_path):
    sweep_path, runs, store, _ = _store(tmp_path, ladder=False)
    training = store.client.get_experiment_by_name("t").experiment_id
    read_only = tracking.RunStore(sqlite_uri(runs), runs, read_only=True)
    assert comparison_runs.log_comparison_runs("t", [], [], [], read_only) == []
    (runs / "mlflow.db").chmod(0o444)  # how a user says "do not write here" (gatelab.store_uris.read_only_store)
    try:
        _table(sweep_path, runs, tmp_path)
    finally:
        (runs / "mlflow.db").chmod(0o644)
    assert store.client.get_experiment_by_name(COMPARISONS) is None

    _table(sweep_path, runs, tmp_path)
    [row] = _comparisons(runs).to_dict("records")
    assert (row["params.table"], row["params.group"], row["params.rung"]) == ("main", "g1_elem_sig", "none")
    experiment = store.client.get_experiment_by_name(COMPARISONS)
    assert experiment.tags[tracking.COMPARISONS_OF_TAG] == "t"
    assert store.browsable_experiments() == [("t", training)]
    assert [name for name, _ in ui.landing_pages(sqlite_uri(runs), "http://127.0.0.1:5000/")[1]] == ["t"]


def test_run_ids_too_long_for_a_param_are_named_in_the_json_only():
    many = [f"{index:032x}" for index in range(400)]  # 400 ids of 32 characters: over MLflow's 6000
    assert comparison_runs._ids_param(many) == "400 runs: see comparison.json"
    assert comparison_runs._ids_param(many[:3]) == ",".join(many[:3])
