"""Superseded runs are never read by a report: a cell's finished run is read even where a superseded run of the same
spec hash is newer, in `collect_runs`, `gatelab table` and `gatelab claims` alike; a cell whose only run is superseded
is missing. The runs are made in a real SQLite store without training."""

from __future__ import annotations

import csv

import pytest
from mlflow.entities import Metric

from gatelab import tracking
from gatelab.app.claims import make_claims
from gatelab.app.report import make_report
from gatelab.report.tables import collect_runs
from gatelab.sweep.spec import expand, load_sweep
from gatelab.workspace import Workspace
from tests.helpers import sqlite_uri, write_sweep

GOOD_PPL, BUGGED_PPL = 30.0, 99.0
LEVEL_CLAIM = """claims:
  - claim: baseline perplexity is below 100
    sweep: t
    kind: level
    direction: lower
    a: baseline
    level: 100
"""


def _finished_run(store: tracking.RunStore, spec, ppl: float, start_ms: int) -> str:
    run = store.client.create_run(store.experiment_id("t"), start_time=start_ms, tags={
        tracking.SPEC_HASH_TAG: spec.hash, tracking.STATUS_TAG: "finished",
        tracking.VARIANT_TAG: spec.experiment.variant})
    store.client.log_batch(run.info.run_id, metrics=[Metric("ppl/avg", ppl, start_ms, 10)])
    store.client.set_terminated(run.info.run_id, "FINISHED", end_time=start_ms + 1000)
    return run.info.run_id


@pytest.fixture(params=["superseded newer", "superseded older"])
def store_with_a_superseded_run(tmp_path, request):
    """Sweep t (baseline and g1_elem_sig, seed 0): baseline has a finished run and a superseded one of a bugged
    build; g1_elem_sig only a superseded one."""
    sweep_path = write_sweep(tmp_path, {"grid": {"variant": ["baseline", "g1_elem_sig"]}})
    (tmp_path / "sweeps" / "claims").mkdir()
    (tmp_path / "sweeps" / "claims" / "level.yaml").write_text(LEVEL_CLAIM)
    runs = tmp_path / "runs"
    runs.mkdir()
    store = tracking.RunStore(sqlite_uri(runs), runs)
    baseline, gated = expand(load_sweep(sweep_path))
    good_start, bugged_start = (1_000_000, 2_000_000) if request.param == "superseded newer" else (2_000_000, 1_000_000)
    good = _finished_run(store, baseline, GOOD_PPL, good_start)
    bugged = [_finished_run(store, baseline, BUGGED_PPL, bugged_start), _finished_run(store, gated, BUGGED_PPL, 0)]
    store.supersede("t", "trained before the tokenizer fix", bugged)
    return sweep_path, runs, store, good


def test_collect_runs_reads_the_finished_run_and_never_the_superseded_one(store_with_a_superseded_run):
    sweep_path, _, store, good = store_with_a_superseded_run
    baseline, gated = collect_runs(expand(load_sweep(sweep_path)), store, "t")
    assert (baseline.run_id, baseline.status, baseline.metrics["ppl/avg"]) == (good, "finished", GOOD_PPL)
    assert (gated.run_id, gated.status, gated.metrics) == (None, "missing", {})


def test_table_and_claims_read_the_finished_run_only(store_with_a_superseded_run, tmp_path):
    sweep_path, runs, _, _ = store_with_a_superseded_run
    workspace = Workspace(runs_dir=runs)
    make_report(sweep_path, experiment=None, formats=["csv"], out_dir=tmp_path / "table", workspace=workspace,
                log=lambda line: None)
    rows = {row["variant"]: row for row in csv.DictReader((tmp_path / "table" / "t.csv").open())}
    ppl = next(column for column in rows["baseline"] if column.startswith("ppl/avg"))
    assert (rows["baseline"]["runs"], rows["baseline"][ppl]) == ("1 finished", "30.000 (1)")
    assert (rows["g1_elem_sig"]["runs"], rows["g1_elem_sig"][ppl]) == ("1 missing", "missing")

    make_claims([sweep_path], out_dir=tmp_path / "claims", formats=["csv"], workspace=workspace,
                claims_path=tmp_path / "sweeps" / "claims" / "level.yaml", log=lambda line: None)
    [claim] = list(csv.DictReader((tmp_path / "claims" / "claims.csv").open()))
    assert (claim["ours"], claim["n"]) == ("30", "1")
