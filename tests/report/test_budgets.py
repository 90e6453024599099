"""Cells scored on different evaluation budgets are never compared (gatelab.report.budgets, issue 44): not in the main
table's Δ, p and benchmark Δ, nor the per-arm table, the ladder's multiplier or a claim's test, each of which says
which budgets instead; runs recorded before the budget param read as their own config's windows. Runs are
RunRecords, or real runs in a SQLite store made without training."""

from __future__ import annotations

import dataclasses
import math

import pytest

from gatelab import tracking
from gatelab.config import EvalBudget
from gatelab.report import claims as C
from gatelab.report.budgets import BUDGET_FIX, not_comparable, run_budget
from gatelab.report.claims_file import load_claims
from gatelab.report.claims_rules import RULE_BUDGET
from gatelab.report.ladder_table import MULTIPLIER, WALL_CLOCK, ladder_rows
from gatelab.report.step_cost import arm_frame
from gatelab.report.tables import RunRecord, build_comparison, collect_runs
from gatelab.sweep.spec import expand, load_sweep
from tests.helpers import sqlite_uri, write_sweep
from tests.report import test_claims, test_ladder_table

SEEDS = [0, 1, 2, 3]
BYTES = "bytes=1000000"


def _metrics(spec) -> dict[str, float]:
    """The variant about 1 lower in ppl/avg and 0.05 higher in BLiMP than the baseline, seed by seed."""
    seed, gated = spec.experiment.seed, spec.experiment.variant != "baseline"
    return {"ppl/avg": 20.0 + seed - (1.0 + 0.01 * seed if gated else 0.0),
            "blimp/accuracy": 0.6 + 0.01 * seed + (0.05 + 0.001 * seed if gated else 0.0),
            "time/step_s": 0.1, "time/wall_step_s": 0.2}


def _records(tmp_path, budget_of=lambda spec: None) -> list[RunRecord]:
    sweep = write_sweep(tmp_path, {"grid": {"variant": ["baseline", "g1_elem_sig"], "seed": SEEDS}})
    return [RunRecord(spec, "finished", f"run-{spec.index}", _metrics(spec), None, None, "vm", "cpu", budget_of(spec))
            for spec in expand(load_sweep(sweep))]


def _windows(records) -> str:
    experiment = records[0].spec.experiment
    return f"windows={experiment.eval.max_windows_per_domain}x{experiment.data.seq_len}"


def _variant_on_bytes(spec) -> str | None:
    return BYTES if spec.experiment.variant != "baseline" else None


def test_runs_on_one_budget_are_compared(tmp_path):
    result = build_comparison(_records(tmp_path, lambda spec: BYTES), None)
    row = result.frame.set_index("variant").loc["g1_elem_sig"]
    assert float(row["Δ vs baseline"]) == pytest.approx(-1.015) and float(row["p"]) < 0.05
    assert row["blimp/accuracy Δ"].startswith("+0.05")
    assert not any(BUDGET_FIX in note for note in result.notes)


def test_two_cells_scored_on_different_budgets_are_never_compared(tmp_path):
    records = _records(tmp_path, _variant_on_bytes)  # the baseline's runs from before the param: the default
    result = build_comparison(records, None)
    row = result.frame.set_index("variant").loc["g1_elem_sig"]
    said = f"not comparable: scored on different evaluation budgets ({BYTES}: 4 runs vs {_windows(records)}: 4 runs)"
    assert row["Δ vs baseline"] == said
    assert row["p"] == row["Δ (%)"] == row["test"] == "n/a"
    assert row.get("blimp/accuracy Δ", "") == ""  # nor any benchmark score
    assert math.isnan(result.numbers.loc["g1_elem_sig", "delta"])
    assert f"{BUDGET_FIX} Not compared here: g1_elem_sig." in result.notes
    arms = arm_frame(records, "ppl/avg").set_index(["variant", "metric"])
    assert arms.loc[("g1_elem_sig", "ppl/avg"), "Δ vs baseline"] == said and arms.loc[("g1_elem_sig", "ppl/avg"),
                                                                                      "p"] == ""
    assert arms.loc[("g1_elem_sig", "time/step_s"), "Δ vs baseline"] != said  # training's step time: no budget


def test_one_seed_on_another_budget_keeps_its_whole_pair_apart(tmp_path):
    records = _records(tmp_path, lambda spec: BYTES if spec.experiment.seed == 3 else None)
    frame = build_comparison(records, None).frame.set_index("variant")
    assert frame.loc["g1_elem_sig", "Δ vs baseline"].endswith(f"({BYTES}: 2 runs vs {_windows(records)}: 6 runs)")
    assert frame.loc["baseline", "Δ vs baseline"].startswith("not comparable: ")  # its own seeds do not average


def test_a_run_without_the_param_reads_as_the_windows_of_its_own_config(tmp_path):
    [record, *_] = _records(tmp_path)
    experiment = record.spec.experiment
    now = experiment.model_copy(update={"eval": experiment.eval.model_copy(update={"budget": EvalBudget(bytes=1000)})})
    record.spec = dataclasses.replace(record.spec, experiment=now)  # the sweep file gained a budget since
    assert run_budget(record) == _windows([record])
    record.budget = BYTES
    assert run_budget(record) == BYTES and not_comparable([record]) is None


def test_a_claim_whose_runs_were_scored_on_different_budgets_is_not_testable(tmp_path):
    claims = load_claims(test_claims.CLAIMS_FILE)

    def ppl(variant, settings, seed):  # as test_claims' gains: G1 20 lower, seed by seed
        effect = {"g1_elem_sig": -20.0}.get(variant, 0.0)
        return {"ppl/avg": 300 + 30 * test_claims._noise(seed, "shared") + effect
                + 0.5 * test_claims._noise(seed, variant)}

    records = test_claims._records(test_claims.CORE, ppl)
    claim = "G1 elementwise sigmoid lowers Avg PPL (dense)"
    assert test_claims._row(C.claims_table({test_claims.CORE: records}, claims), claim)["verdict"] == C.HOLDS
    for record in records:
        record.budget = _variant_on_bytes(record.spec)
    row = test_claims._row(C.claims_table({test_claims.CORE: records}, claims), claim)
    assert row["verdict"] == C.NOT_TESTABLE and row["rule"] == RULE_BUDGET and row["p"] == ""
    assert f"not comparable: scored on different evaluation budgets ({BYTES}: " in row["note"]


def test_a_ladder_arm_on_another_budget_at_one_rung_gets_no_multiplier(tmp_path):
    records = test_ladder_table._records(tmp_path)
    [row] = ladder_rows(records)[0].to_dict("records")
    assert row[MULTIPLIER][0].isdigit()
    records[0].budget = BYTES  # one baseline run of the first rung
    [row] = ladder_rows(records)[0].to_dict("records")
    assert row[MULTIPLIER].startswith(f"not comparable: scored on different evaluation budgets ({BYTES}: 1 run vs ")
    assert row[WALL_CLOCK] == "n/a"


def test_the_report_reads_the_recorded_budget_param(tmp_path):
    sweep = write_sweep(tmp_path, {"grid": {"variant": ["baseline", "g1_elem_sig"], "seed": [0]}})
    runs = tmp_path / "runs"
    runs.mkdir()
    store = tracking.RunStore(sqlite_uri(runs), runs)
    specs = expand(load_sweep(sweep))
    for spec in specs:
        run = store.client.create_run(store.experiment_id("t"), start_time=1_000, tags={
            tracking.SPEC_HASH_TAG: spec.hash, tracking.STATUS_TAG: "finished"})
        if spec.experiment.variant != "baseline":
            store.client.log_param(run.info.run_id, tracking.EVAL_BUDGET_PARAM, BYTES)
        store.client.set_terminated(run.info.run_id, "FINISHED", end_time=2_000)
    budgets = {r.spec.experiment.variant: r.budget for r in collect_runs(specs, store, "t")}
    assert budgets == {"baseline": None, "g1_elem_sig": BYTES}
