"""Each row of the committed claims table (results/tiny/claims.csv) against its own figures: the rule the row names
must follow from the row's q, interval, init ratio, regime and note, and q from p corrected within the row's section
(issue 43). A verdict that says more than its figures fails here."""

from __future__ import annotations

import math
import re

import pandas as pd
import pytest

from gatelab.report import claims as C
from gatelab.report import claims_checks as K
from gatelab.report import claims_rules as rules
from gatelab.report.claims_file import load_claims
from gatelab.report.stats import benjamini_hochberg
from tests.helpers import REPO

NUMBER = r"[+-]?\d+(?:\.\d+)?(?:e[+-]?\d+)?"


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    return pd.read_csv(REPO / "results" / "tiny" / "claims.csv", dtype=str, keep_default_na=False)


@pytest.fixture(scope="module")
def claims() -> dict:
    return {claim.claim: claim for claim in load_claims(REPO / "sweeps" / "claims" / "tiny.yaml")}


def _float(cell: str) -> float | None:
    try:
        return float(cell.rstrip("x"))
    except ValueError:
        return None


def _interval(ours: str) -> tuple[float, float] | None:
    found = re.search(rf"95% CI ({NUMBER})%? to ({NUMBER})%?", ours)
    return None if found is None else (float(found.group(1)), float(found.group(2)))


def _margin(ours: str) -> float | None:
    found = re.search(rf"margin \+-({NUMBER})%?", ours)
    return None if found is None else float(found.group(1))


def _paper_effects(paper: str) -> list[float]:
    """The paper's relative effects in % as the paper column prints them: "-0.8% to -3.6% (...)" or "a vs b (-1.0%)"."""
    head = paper.split(" (Table")[0] if " to " in paper.split(" (")[0] else paper
    return [float(x) for x in re.findall(rf"({NUMBER})%", head)]


def _commensurate(regime: str) -> bool:
    ratio = _float(regime)
    return ratio is not None and 1 / rules.COMMENSURATE <= ratio <= rules.COMMENSURATE


def _init_inside(cell: str) -> bool:
    ratio = _float(cell)
    return ratio is None or C.INIT_SCALE_RATIO[0] <= ratio <= C.INIT_SCALE_RATIO[1]


def check_row(row: pd.Series, claim, verdict_of: dict[str, str]) -> list[str]:
    """What in the row's figures contradicts its verdict or its named rule."""
    rule, verdict, q = row["rule"], row["verdict"], _float(row["q"])
    interval, problems = _interval(row["ours"]), []
    want = lambda ok, why: problems.append(why) if not ok else None  # noqa: E731
    if rule == rules.RULE_INIT_SCALE:
        want(verdict == C.CONFOUNDED and not _init_inside(row["init ratio"]), "confounded needs a ratio outside")
    elif rule == rules.RULE_SCALE_CONTROL:
        control = claim.scale_control
        want(verdict == C.HOLDS and q is not None and q < K.ALPHA, "a control rescues only a row that would hold")
        want(verdict_of.get(control) == C.HOLDS, f"its control row {control!r} must hold")
    elif rule == rules.RULE_REGIME:
        want(verdict == C.NOT_TESTABLE and not _commensurate(row["regime"]), "regime rule needs a regime outside")
        want(claim.kind != "closeness" or row["p"] == "", "a closeness outside the regime is not tested")
    elif rule == rules.RULE_POSITIVE_CONTROL:
        want(verdict == C.NOT_TESTABLE and row["p"] == "" and "not significantly beyond" in row["note"],
             "the positive control must be shown within the margin")
    elif rule == rules.RULE_PRECONDITION:
        want(verdict == C.NOT_TESTABLE and row["p"] == "" and "not testable:" in row["note"],
             "a failed precondition is named in the note")
    elif rule == rules.RULE_WHOLE_SAMPLE:
        ended = re.fullmatch(r"none \((\d+) of (\d+) runs ended\)", row["test"])
        want(verdict == C.NOT_RUN and row["section"] == "confirmatory" and row["p"] == row["ours"] == "",
             "a confirmatory row waiting for its runs shows no figure")
        want(ended is not None and 0 < int(ended[1]) < int(ended[2]), "the whole-sample rule needs runs still to end")
    elif rule in (rules.RULE_TEST, rules.RULE_NO_DECISION, rules.RULE_SIZE, rules.RULE_MARGIN):
        want(_init_inside(row["init ratio"]), "a test's verdict needs groups at one init scale (or none logged)")
        if rule == rules.RULE_TEST:
            want(q is not None and q < K.ALPHA, "a test's verdict needs q < 0.05")
            if claim.kind == "closeness":
                want(verdict == C.HOLDS and (_commensurate(row["regime"]) or claim.margin.paper_gain is None),
                     "a closeness holds only inside the regime")
        elif rule == rules.RULE_NO_DECISION:
            want(q is None or q >= K.ALPHA, "no decision needs q >= 0.05")
            want(verdict.startswith(C.INCONCLUSIVE), "no decision is inconclusive")
        elif rule == rules.RULE_SIZE:
            effects = _paper_effects(row["paper"])
            want(verdict == C.PAPER_SIZE_EXCLUDED and q is not None and q >= K.ALPHA, "size needs no significance")
            want(_commensurate(row["regime"]), "a size is read only inside the regime")
            near = max(effects) if claim.direction == "lower" else min(effects)
            want(interval is not None and effects and (interval[0] > near if claim.direction == "lower"
                                                      else interval[1] < near), "the interval must exclude the paper")
        else:
            margin = _margin(row["ours"])
            want(interval is not None and margin is not None and (interval[0] > margin or interval[1] < -margin),
                 "the interval must lie beyond the margin")
    else:
        want(rule == rules.rule_of(verdict), f"rule {rule!r} is not the rule of {verdict!r}")
    return problems


def test_every_committed_row_s_verdict_follows_from_its_own_figures_by_the_rule_it_names(table, claims):
    assert len(table) >= 100 and set(table["rule"]) >= {rules.RULE_TEST, rules.RULE_INIT_SCALE, rules.RULE_REGIME,
                                                        rules.RULE_PRECONDITION, rules.RULE_NO_DECISION}
    verdict_of = dict(zip(table["claim"], table["verdict"], strict=True))
    wrong = {row["claim"]: problems for _, row in table.iterrows()
             if (problems := check_row(row, claims[row["claim"]], verdict_of))}
    assert wrong == {}


def test_q_is_p_corrected_within_the_row_s_section(table):
    for section, (_, method) in rules.SECTIONS.items():
        rows = table[table["section"] == section]
        p_values = [_float(p) for p in rows["p"]]
        q_values = rules.holm(p_values) if method == "holm" else benjamini_hochberg(p_values)
        for printed, q in zip(rows["q"], q_values, strict=True):
            # p is printed to 3 significant figures, so q is recomputed to within that rounding
            assert (printed == "") == (q is None) and (q is None or math.isclose(float(printed), q, rel_tol=0.02))


def test_a_row_that_says_more_than_its_figures_is_caught(table, claims):
    verdict_of = dict(zip(table["claim"], table["verdict"], strict=True))
    confounded = table[table["rule"] == rules.RULE_INIT_SCALE].iloc[0].copy()
    confounded["verdict"], confounded["rule"] = C.HOLDS, rules.RULE_TEST  # a confounded row passed off as holding
    assert check_row(confounded, claims[confounded["claim"]], verdict_of)
    outside = table[table["rule"] == rules.RULE_REGIME].iloc[0].copy()
    outside["regime"] = "1x"  # a regime that would have allowed the size
    assert check_row(outside, claims[outside["claim"]], verdict_of)
