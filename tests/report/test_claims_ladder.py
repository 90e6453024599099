"""Claims rows of kind multiplier (gatelab.report.claims_ladder): a ladder's compute multiplier decided by its
bootstrap interval against 1, read only in a commensurate regime, not testable with why where the ladder fits no law;
and sweeps/claims/ladder.yaml, apart from the claims of tiny.yaml. The ladders are tests/report/test_ladder_table.py's:
the variant is the baseline at 1.3x compute, G1's effect at the largest rung a chosen multiple of the paper's."""

from __future__ import annotations

import pytest

from gatelab.errors import GatelabError
from gatelab.paper import DENSE_G1_PAIRS
from gatelab.report.claims import claims_table
from gatelab.report.claims_file import load_claims
from gatelab.report.claims_ladder import MULTIPLIER_RULE, interval_verdict
from gatelab.report.claims_report import VERDICT_RULES, write_claims
from gatelab.report.claims_rules import (
    FAILS,
    HOLDS,
    NOT_TESTABLE,
    RULE_INTERVAL,
    RULE_LADDER,
    RULE_REGIME,
    inconclusive,
)
from gatelab.report.ladder_table import REGIME, ladder_rows
from tests.helpers import REPO
from tests.report.test_ladder_table import RUNGS, TRUE_MULTIPLIER, _sweep, scaled_records

REFERENCE = """\
  - claim: G1 at the largest rung
    sweep: t
    regime_reference: true
    kind: direction
    direction: lower
    a: g1_elem_sig rung=r4
    b: baseline rung=r4
    paper: {table: table2, pairs: [[dense28_400b_g1_elem_sig, dense28_400b_baseline],
                                   [dense28_3p5t_g1_elem_sig, dense28_3p5t_baseline],
                                   [dense48_400b_g1_elem_sig_lr4e-3, dense48_400b_baseline_lr4e-3],
                                   [dense48_1t_g1_elem_sig_lr5.3e-3, dense48_1t_baseline_lr5.3e-3]]}
"""
MULTIPLIER = """\
  - claim: G1's compute multiplier is above 1
    sweep: t
    kind: multiplier
    direction: higher
    a: g1_elem_sig
    b: baseline
"""


def _claims(tmp_path, rows: str):
    _sweep(tmp_path)
    path = tmp_path / "sweeps" / "claims" / "ladder.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(f"claims:\n{rows}")
    return load_claims(path)


def _multiplier_row(tmp_path, g1_over_paper: float, rows: str = REFERENCE + MULTIPLIER, rungs: int = 4) -> dict:
    claims = _claims(tmp_path, rows)
    records = scaled_records(tmp_path, g1_over_paper, rungs=rungs)
    table = claims_table({"t": records}, claims)
    row = table[table["claim"] == "G1's compute multiplier is above 1"].iloc[0].to_dict()
    if "regime_reference" in rows and rungs == len(RUNGS):  # the ladder table reads the same regime
        assert ladder_rows(records, sweep_name="t")[0][REGIME].tolist() == [row["regime"]]
    return row


def test_a_variant_at_1_3x_compute_in_a_commensurate_regime_holds_by_its_interval(tmp_path):
    row = _multiplier_row(tmp_path, 1.0)
    assert (row["verdict"], row["rule"], row["p"], row["q"]) == (HOLDS, RULE_INTERVAL, "", "")
    assert float(row["ours"].split("x ")[0]) == pytest.approx(TRUE_MULTIPLIER, rel=0.05)
    assert row["ours"].endswith("FLOPs)") and "at rung r4" in row["ours"] and row["n"] == "4 rungs"
    assert row["comparison"] == "g1_elem_sig vs baseline, over rung" and row["section"] == "exploratory"
    assert float(row["regime"].rstrip("x")) == pytest.approx(1.0, rel=0.1) and "inside [1/4, 4]" in row["note"]


def test_the_same_multiplier_with_g1_at_8x_the_papers_effect_is_not_testable_by_the_regime_rule(tmp_path):
    row = _multiplier_row(tmp_path, 8.0)
    assert (row["verdict"], row["rule"]) == (NOT_TESTABLE, RULE_REGIME)
    assert row["note"].startswith("not testable: a compute multiplier is a statement of size; regime of t:")
    assert "outside [1/4, 4]" in row["note"] and float(row["regime"].rstrip("x")) == pytest.approx(8.0, rel=0.1)
    assert float(row["ours"].split("x ")[0]) == pytest.approx(TRUE_MULTIPLIER, rel=0.05)  # figures still shown
    assert row["test"].endswith("(not run: not testable)")


def test_a_sweep_without_a_reference_row_reads_no_multiplier(tmp_path):
    row = _multiplier_row(tmp_path, 1.0, rows=MULTIPLIER)
    assert (row["verdict"], row["rule"], row["regime"]) == (NOT_TESTABLE, RULE_REGIME, "n/a")
    assert "no reference row in this sweep" in row["note"]


def test_too_few_rungs_is_not_testable_and_says_why(tmp_path):
    row = _multiplier_row(tmp_path, 1.0, rungs=2)
    assert (row["verdict"], row["rule"], row["ours"]) == (NOT_TESTABLE, RULE_LADDER, "n/a")
    assert row["note"].startswith("not testable: the baseline arm has 2 rungs with a finite loss: a ladder needs 3")


@pytest.mark.parametrize("interval, multiplier, direction, verdict", [
    ((1.1, 1.4), 1.3, "higher", HOLDS),
    ((0.7, 0.9), 0.8, "higher", f"{FAILS} (the interval on the other side of 1)"),
    ((0.95, 1.2), 1.05, "higher", inconclusive(1.0, 1.0)),
    ((0.8, 1.02), 0.9, "higher", inconclusive(-1.0, 1.0)),
    ((0.7, 0.9), 0.8, "lower", HOLDS),
])
def test_the_interval_against_1_gives_the_verdict(interval, multiplier, direction, verdict):
    assert interval_verdict(interval, multiplier, direction) == verdict


@pytest.mark.parametrize("extra, problem", [
    ("    metric: ln_ppl\n", "a multiplier claim reads a ladder over its rung (give no axis) and a perplexity metric"),
    ("    axis: seed\n", "a multiplier claim reads a ladder over its rung"),
])
def test_a_multiplier_row_reads_perplexity_over_the_rung(tmp_path, extra, problem):
    with pytest.raises(GatelabError, match="invalid claims file") as error:
        _claims(tmp_path, MULTIPLIER + extra)
    assert problem in str(error.value)


def test_a_multiplier_on_a_sweep_without_a_ladder_is_refused_naming_the_rung(tmp_path):
    path = REPO / "sweeps" / "claims" / "tiny.yaml"
    rows = MULTIPLIER.replace("sweep: t", "sweep: repro-core")
    claims_path = tmp_path / "sweeps" / "claims" / "x.yaml"
    claims_path.parent.mkdir(parents=True)
    claims_path.write_text(f"claims:\n{rows}")
    (tmp_path / "sweeps" / "repro-core.yaml").write_text((path.parent.parent / "repro-core.yaml").read_text()
                                                         .replace("../experiments/", f"{REPO}/experiments/"))
    with pytest.raises(GatelabError, match="'rung' is not swept in repro-core"):
        load_claims(claims_path)


def test_the_ladder_claims_file_loads_with_its_own_reference_and_exploratory_rows():
    claims = load_claims(REPO / "sweeps" / "claims" / "ladder.yaml")
    assert {c.sweep for c in claims} == {"ladder-g1"} and {c.section for c in claims} == {"exploratory"}
    [reference] = [c for c in claims if c.regime_reference]
    assert tuple(map(tuple, reference.paper.pairs)) == DENSE_G1_PAIRS
    assert {(c.a, c.direction) for c in claims if c.kind == "multiplier"} == {("g1_elem_sig", "higher"),
                                                                             ("g1_head_sig", "higher")}


def test_the_multiplier_rule_is_printed_only_under_a_table_with_a_multiplier_row(tmp_path):
    assert MULTIPLIER_RULE not in VERDICT_RULES
    for rows, printed in ((REFERENCE + MULTIPLIER, True), (REFERENCE, False)):
        out = tmp_path / f"out-{printed}"
        write_claims({"t": scaled_records(tmp_path, 1.0)}, _claims(tmp_path, rows), out, ["md"], log=lambda _: None,
                     logged_parameters=lambda run_id: None)
        assert ("Multiplier (a ladder sweep" in (out / "claims.md").read_text()) == printed
