"""A variant's cost beside its effect (gatelab.report.step_cost): the step-time ratio to baseline with its interval in
the main table, "not comparable" where the arms ran on other hosts or devices or carry no such tags, the per-arm table,
and every seed's value in <sweep>_seeds.csv. Runs are RunRecords, or real runs in a SQLite store made without
training."""

from __future__ import annotations

import csv
import re

import pytest
from mlflow.entities import Metric

from gatelab import tracking
from gatelab.app.report import make_report
from gatelab.progress import DEVICE_TAG, HOST_TAG
from gatelab.report.tables import RunRecord, build_comparison
from gatelab.sweep.spec import expand, load_sweep
from gatelab.workspace import Workspace
from tests.helpers import sqlite_uri, write_sweep

SEEDS = [0, 1, 2, 3]
# Each seed's baseline step time, and the variant's as a multiple of it: 1.2x give or take a little per seed
BASELINE_STEP_S = {0: 0.100, 1: 0.110, 2: 0.095, 3: 0.105}
VARIANT_FACTOR = {0: 1.19, 1: 1.21, 2: 1.20, 3: 1.22}


def _sweep(tmp_path):
    return write_sweep(tmp_path, {"grid": {"variant": ["baseline", "g1_elem_sig"], "seed": SEEDS}})


def _step_s(spec) -> float:
    seed = spec.experiment.seed
    return BASELINE_STEP_S[seed] * (VARIANT_FACTOR[seed] if spec.experiment.variant != "baseline" else 1.0)


def _timed(spec) -> dict[str, float]:
    """A run's metrics as runs since issue 44 record them: the steady-state step and the wall step beside it."""
    return {"ppl/avg": 20.0 + spec.experiment.seed, "time/step_s": _step_s(spec), "time/wall_step_s": 2 * _step_s(spec)}


def _records(tmp_path, where=lambda spec: ("vm", "NVIDIA H100"), metrics=_timed) -> list[RunRecord]:
    return [RunRecord(spec, "finished", f"run-{spec.index}", metrics(spec), None, None, *where(spec))
            for spec in expand(load_sweep(_sweep(tmp_path)))]


def _ratio_cell(records) -> tuple[str, list[str]]:
    result = build_comparison(records, None)
    return result.frame.set_index("variant").loc["g1_elem_sig", "step-time ratio"], result.notes


def test_the_step_time_ratio_of_a_variant_1_2x_the_baseline_is_1_2_with_an_interval_around_it(tmp_path):
    cell, notes = _ratio_cell(_records(tmp_path))
    ratio, low, high = map(float, re.fullmatch(r"(\S+) \[(\S+), (\S+)\]", cell).groups())
    assert ratio == pytest.approx(1.2, abs=0.01) and low < 1.2 < high and high - low < 0.1
    assert any(note.startswith("step-time ratio: ") for note in notes)
    assert not any("not comparable" in note for note in notes)
    baseline = build_comparison(_records(tmp_path), None).frame.set_index("variant").loc["baseline"]
    assert baseline["step-time ratio"] == ""


@pytest.mark.parametrize(("where", "why"), [
    (lambda spec: ("vm", "NVIDIA H100") if spec.experiment.variant == "baseline" else ("other", "NVIDIA H100"),
     "runs on 2 hosts (other, vm)"),
    (lambda spec: ("vm", "NVIDIA H100" if spec.experiment.seed else "NVIDIA H200"),
     "runs on 2 devices (NVIDIA H100, NVIDIA H200)"),
    (lambda spec: (None, None) if spec.experiment.seed == 3 else ("vm", "cpu"),
     f"runs without {HOST_TAG}/{DEVICE_TAG} tags"),
])
def test_other_hosts_or_devices_or_missing_tags_are_not_comparable(tmp_path, where, why):
    cell, notes = _ratio_cell(_records(tmp_path, where))
    assert cell == "not comparable"
    assert any(note.startswith("step-time ratio not comparable for g1_elem_sig: " + why) for note in notes), notes


def test_step_times_recorded_before_the_steady_state_step_are_not_comparable(tmp_path):
    # time/step_s was the session's mean step (compile and validation in it) until runs logged time/wall_step_s beside
    old = lambda spec: {"ppl/avg": 20.0 + spec.experiment.seed, "time/step_s": _step_s(spec)}  # noqa: E731
    cell, notes = _ratio_cell(_records(tmp_path, metrics=old))
    assert cell == "not comparable"
    assert any("the session's mean step, compile and validation included" in note for note in notes), notes


def _finished_run(store: tracking.RunStore, spec, metrics: dict[str, float], tags: dict[str, str]) -> None:
    run = store.client.create_run(store.experiment_id("t"), start_time=1_000, tags={
        tracking.SPEC_HASH_TAG: spec.hash, tracking.STATUS_TAG: "finished",
        tracking.VARIANT_TAG: spec.experiment.variant, **tags})
    store.client.log_batch(run.info.run_id, metrics=[Metric(k, v, 1_000, 10) for k, v in metrics.items()])
    store.client.set_terminated(run.info.run_id, "FINISHED", end_time=2_000)


def test_the_report_reads_the_tags_and_writes_each_arm_and_every_seeds_value(tmp_path):
    sweep_path = _sweep(tmp_path)
    runs = tmp_path / "runs"
    runs.mkdir()
    store = tracking.RunStore(sqlite_uri(runs), runs)
    specs = expand(load_sweep(sweep_path))
    for spec in specs:
        _finished_run(store, spec, _timed(spec), {HOST_TAG: "vm", DEVICE_TAG: "cpu"})
    out = tmp_path / "table"
    make_report(sweep_path, experiment=None, formats=["csv"], out_dir=out, workspace=Workspace(runs_dir=runs),
                log=lambda line: None)

    main = {row["variant"]: row for row in csv.DictReader((out / "t.csv").open())}
    assert main["g1_elem_sig"]["step-time ratio"].startswith("1.2")  # the tags came through collect_runs
    arms = {(row["variant"], row["metric"]): row for row in csv.DictReader((out / "t_arms.csv").open())}
    assert set(arms) == {(v, m) for v in ("baseline", "g1_elem_sig") for m in ("ppl/avg", "time/step_s")}
    assert arms[("baseline", "time/step_s")]["n"] == "4" and arms[("baseline", "time/step_s")]["p"] == ""
    assert float(arms[("g1_elem_sig", "time/step_s")]["Δ vs baseline"]) == pytest.approx(0.0208, abs=1e-3)
    assert float(arms[("g1_elem_sig", "time/step_s")]["p"]) < 0.001
    assert arms[("g1_elem_sig", "ppl/avg")]["p"].startswith("n/a")  # no difference at all: nothing to test

    seeds = list(csv.DictReader((out / "t_seeds.csv").open()))
    assert len(seeds) == len(specs) * 2
    values = {(row["variant"], int(row["seed"]), row["metric"]): float(row["value"]) for row in seeds}
    for spec in specs:
        assert values[(spec.experiment.variant, spec.experiment.seed, "time/step_s")] == pytest.approx(_step_s(spec))
        assert values[(spec.experiment.variant, spec.experiment.seed, "ppl/avg")] == 20.0 + spec.experiment.seed
