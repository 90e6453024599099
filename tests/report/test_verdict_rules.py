"""Each rule of VERDICT_RULES (gatelab.report.claims_report) on synthetic groups whose figures are known, including the
audit's cases (issue 34): the test chosen from r, "does not hold" from the MDE and the MoE figure on a dense row,
margins from our own runs, gains that track the attention output's init scale, and prose numbers that drift from the
table."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
from scipy import stats

from gatelab.errors import GatelabError
from gatelab.report import claims as C
from gatelab.report import claims_checks as K
from gatelab.report import claims_report as R
from gatelab.report.claims_file import Claim, load_claims
from gatelab.report.stats import benjamini_hochberg
from tests.helpers import REPO
from tests.report.test_claims import CLAIMS_FILE, MOE, TRAINED, _records, _row

T_CRIT_DF2 = 4.302652729749464  # the two-sided 95% t quantile at 2 df: three seeds
SHARED = {0: -5.0, 1: 0.0, 2: 5.0}  # every group's seed effect (common random numbers); mean 0, so b's mean is 100
G1_TRAINED = "G1 lowers Avg PPL in the trained regime (20 tokens a parameter)"
OPROJ_CONTROL = ("G1's gain is not the init scale's: G1 beats the baseline with W_O initialised at half the std "
                 "(trained)")


@pytest.fixture(scope="module")
def claims() -> dict[str, Claim]:
    return {claim.claim: claim for claim in load_claims(CLAIMS_FILE)}


def _differences(mean: float, low: float, high: float) -> dict[int, float]:
    """Three seeds' paired differences whose mean is `mean` and whose 95% t-interval is `low` to `high`."""
    spread = (high - low) / 2 * math.sqrt(3) / T_CRIT_DF2  # the sd of (-s, 0, s) is s
    return {seed: mean + spread * step for seed, step in zip((0, 1, 2), (-1.0, 0.0, 1.0), strict=True)}


def _paired_runs(sweep: str, b: str, others: dict[str, dict[int, float]], scale=None) -> list:
    """Runs of `sweep`: group b (and every group not in `others`) at 100 + the seed's shared effect, each group of
    `others` at that plus its difference for the seed; `scale` {variant: init/attn_output_rms} where logged."""
    def value(variant, settings, seed):
        metrics = {"ppl/avg": 100.0 + SHARED[seed] + others.get(variant, {}).get(seed, 0.0)}
        if scale is not None:
            metrics[C.INIT_SCALE] = scale.get(variant, 1.0)
        return metrics

    return _records(sweep, value)


# --- 1. the design's paired test, whatever r ---------------------------------------------------------------------


def test_a_negative_r_still_gets_the_paired_test(claims):
    # G1 moves against the baseline over the seeds (r < 0): the first pass chose Welch here, after looking at r
    records = _paired_runs(TRAINED, "baseline", {"g1_elem_sig": {0: 8.0, 1: -2.0, 2: -12.0}})
    row = _row(C.claims_table({TRAINED: records}, [claims[G1_TRAINED]]), G1_TRAINED)
    assert float(row["r (seeds)"]) < 0 and row["test"] == "paired t"
    assert float(row["p"]) == pytest.approx(float(stats.ttest_rel([103.0, 98.0, 93.0], [95.0, 100.0, 105.0]).pvalue),
                                            rel=1e-2)
    assert any("paired t-test" in rule and "chooses nothing" in rule for rule in R.VERDICT_RULES)


# --- 2. "does not hold" only when the interval excludes the paper's effect for the sweep's kind of model ----------


def test_the_trained_g1_row_is_inconclusive_in_the_papers_direction(claims):
    # The audit's row: -1.64%, 95% CI -3.77% to +0.49%; every dense Table 2 effect (-0.8% to -3.6%) is inside it
    records = _paired_runs(TRAINED, "baseline", {"g1_elem_sig": _differences(-1.64, -3.77, 0.49)})
    row = _row(C.claims_table({TRAINED: records}, [claims[G1_TRAINED]]), G1_TRAINED)
    assert row["ours"].startswith("-1.64% (98.36 vs 100); 95% CI -3.77% to +0.49%")
    assert row["paper"] == "-0.8% to -3.6% (Table 2 rows (2) vs (1), (4) vs (3), (8) vs (5), (13) vs (11))"
    assert float(row["q"]) >= 0.05 and row["verdict"] == f"{C.INCONCLUSIVE} (the paper's direction)"
    assert "95% CI compared with the paper's dense effect (Table 2): -0.8% to -3.6%" in row["note"]
    assert row["MDE"].endswith("%")  # still shown, as a description


def test_an_interval_that_excludes_the_papers_effect_does_not_hold_where_the_regime_matches_the_papers(claims):
    # the sweep's reference (G1 against the baseline, -1.64%) is 0.88x the paper's mean dense effect (-1.86%): sizes
    # can be read, and G1 against the widened baseline (-0.1%, 95% CI -0.22% to +0.02%) excludes every paper effect
    widened = "G1 beats a parameter-matched baseline (the FFN widened by the gate's parameters)"
    reference = "G1 lowers Avg PPL in the trained regime (41 tokens a parameter, 6 seeds)"
    wobble = {0: -1.0, 1: 0.0, 2: 1.0, 3: -1.0, 4: 0.0, 5: 1.0}

    def value(variant, settings, seed):
        baseline = 100.0 + 5.0 * (seed - 2.5)
        g1 = baseline - 1.64 + 0.5 * wobble[seed]
        return {"ppl/avg": {"g1_elem_sig": g1, "ref_ffn_g1match": g1 + 0.1 + 0.15 * wobble[seed]}.get(variant,
                                                                                                      baseline)}

    records = _records("repro-trained-long", value)
    frame = C.claims_table({"repro-trained-long": records}, [claims[reference], claims[widened]])
    row = _row(frame, widened)
    assert row["ours"].startswith("-0.1") and float(row["q"]) >= 0.05
    assert row["verdict"] == C.PAPER_SIZE_EXCLUDED and row["rule"] == "size: interval beyond the paper's effects"
    assert row["regime"] == "0.883x" and "inside [1/4, 4]" in row["note"]  # -1.64% of 100 against -1.857%
    # the same row where the sweep's reference is 20 times short of the paper's: no size is read
    records = _paired_runs(TRAINED, "baseline", {"g1_elem_sig": _differences(-0.1, -0.22, 0.02)})
    row = _row(C.claims_table({TRAINED: records}, [claims[G1_TRAINED]]), G1_TRAINED)
    assert float(row["q"]) >= 0.05 and row["verdict"] == C.NOT_TESTABLE
    assert row["rule"] == "regime: reference effect vs the paper's" and row["regime"] == "0.0539x"
    # the other way, and not significant: inconclusive, pointing the other way (its interval holds 0)
    records = _paired_runs(TRAINED, "baseline", {"g1_elem_sig": _differences(0.5, -1.0, 2.0)})
    row = _row(C.claims_table({TRAINED: records}, [claims[G1_TRAINED]]), G1_TRAINED)
    assert row["verdict"] == f"{C.INCONCLUSIVE} (the other way)"
    # significant the other way at q < 0.05 still does not hold
    records = _paired_runs(TRAINED, "baseline", {"g1_elem_sig": _differences(3.0, 2.9, 3.1)})
    row = _row(C.claims_table({TRAINED: records}, [claims[G1_TRAINED]]), G1_TRAINED)
    assert row["verdict"] == f"{C.FAILS} (significant, the other way)"


def test_a_dense_row_with_the_papers_moe_figure_never_says_the_papers_size(claims):
    # G1 against G2 on the dense trained sweep: the paper's figure (-1.0%) is its MoE model's, and the interval
    # (-0.22% to +0.02%) excludes it; with no dense figure that says nothing
    claim = claims["G1 beats G2 (trained)"]
    records = _paired_runs(TRAINED, "g2_elem_sig", {"g1_elem_sig": _differences(-0.1, -0.22, 0.02)})
    row = _row(C.claims_table({TRAINED: records}, [claim]), claim.claim)
    assert row["paper"] == "5.761 vs 5.82 (-1.0%)"
    assert row["verdict"] == f"{C.INCONCLUSIVE} (the paper's direction)"
    assert "the paper's figure is its moe model's, the sweep's is dense: no size to compare" in row["note"]


# --- 3. equivalence margins from the paper ------------------------------------------------------------------------


def test_closeness_margins_come_from_the_papers_own_gap_for_the_pair(claims):
    # Headwise against elementwise (MoE): twice Table 1's own gap for the pair, 5.792 against 5.761 (+0.54%), so that
    # the paper's own result sits at half the margin; read where the sweep's G1 effect is the paper's size (-4.4%)
    claim = claims["Headwise is close to elementwise (MoE)"]
    reference = claims["G1 elementwise sigmoid lowers Avg PPL (MoE)"]
    g1 = {"g1_elem_sig": _differences(-4.4, -5.0, -3.8)}

    def verdict(head: dict[int, float]) -> dict:
        others = g1 | {"g1_head_sig": {s: g1["g1_elem_sig"][s] + head[s] for s in head}}
        return _row(C.claims_table({MOE: _paired_runs(MOE, "baseline", others)}, [reference, claim]), claim.claim)

    row = verdict(_differences(-7.6, -10.5, -4.7))
    assert "margin +-1.08%" in row["ours"] and row["test"] == "TOST, paired t"
    assert "margin: 2 x the paper's own gap for the pair, Table 1 row (10) against (5) (+0.54%)" in row["note"]
    assert row["verdict"] == f"{C.FAILS} (apart by more than the margin)"
    assert row["rule"] == "margin: interval beyond it"
    assert verdict(_differences(0.1, 0.05, 0.15))["verdict"] == C.HOLDS
    # the dense margin: twice Table 2's 48-layer headwise-elementwise gap (7.370 against 7.288), +-2.25%: the paper's
    # own +1.13% is inside it, where half its G1 gain (+-0.896%) was not
    dense = claims["Headwise is close to elementwise (dense)"]
    assert K.margin_of(dense)[0] == pytest.approx(2 * (7.370 - 7.288) / 7.288)


def _claims_file(tmp_path: Path, entry: str) -> Path:
    """A claims file of one closeness row on a copy of repro-core.yaml (dense)."""
    sweeps = tmp_path / "sweeps"
    (sweeps / "claims").mkdir(parents=True)
    text = (REPO / "sweeps" / "repro-core.yaml").read_text()
    (sweeps / "repro-core.yaml").write_text(
        text.replace("experiment: ../experiments/tiny.yaml", f"experiment: {REPO / 'experiments' / 'tiny.yaml'}"))
    path = sweeps / "claims" / "x.yaml"
    path.write_text("claims:\n  - claim: Headwise is close\n    sweep: repro-core\n    kind: closeness\n"
                    "    a: g1_head_sig train.lr=0.002\n    b: g1_elem_sig train.lr=0.002\n" + entry)
    return path


@pytest.mark.parametrize("margin, message", [
    ("{fraction: 0.5, gain: [g1_elem_sig train.lr=0.002, baseline train.lr=0.002]}",
     "margin.gain (a gain measured on our own runs) is gone: margins come from the paper"),
    ("{fraction: 0.5, paper_gain: {table: table1, ids: [g1_elem_sig, baseline]}}",
     "margin.paper_gain: the paper's table1 is its moe model's, and sweep repro-core trains dense models"),
    ("{relative: 0.01}", "a margin is either {fraction: F, paper_gain: {table: T, ids: [A, B]}} or {relative: R, "
                         "reason: WHY, positive_control: [A, B]}"),
    ("{relative: 0.01, reason: r}", "a stated margin needs positive_control: [A, B]"),
    ("{fraction: 0.5, paper_gain: {table: table2, ids: [dense48_400b_g1_elem_sig_lr4e-3, "
     "dense48_400b_baseline_lr4e-3]}}", "is not the claim's own pair"),
], ids=["from-our-runs", "moe-figure-on-a-dense-sweep", "stated-without-a-reason", "stated-without-a-control",
        "another-comparisons-gap"])
def test_a_margin_not_from_the_paper_is_refused(tmp_path, margin, message):
    with pytest.raises(GatelabError) as error:
        load_claims(_claims_file(tmp_path, f"    margin: {margin}\n"))
    assert message in str(error.value)


def test_a_stated_margin_carries_its_reason(tmp_path):
    [claim] = load_claims(_claims_file(
        tmp_path, "    margin: {relative: 0.01, reason: a stated 1%, positive_control: [g1_elem_sig train.lr=0.002, "
                  "baseline train.lr=0.002]}\n"))
    assert K.margin_of(claim) == (0.01, "stated, +-1% of g1_elem_sig train.lr=0.002's mean: a stated 1%")


# --- 4. init-scale confounded --------------------------------------------------------------------------------------


def test_groups_at_different_init_scales_are_confounded_without_a_control(claims):
    claim = claims[G1_TRAINED].model_copy(update={"scale_control": None})
    gain = {"g1_elem_sig": _differences(-5.0, -5.5, -4.5)}
    records = _paired_runs(TRAINED, "baseline", gain, scale={"g1_elem_sig": 0.5, "baseline": 1.0})
    row = _row(C.claims_table({TRAINED: records}, [claim]), claim.claim)
    assert row["verdict"] == C.CONFOUNDED and float(row["q"]) < 0.05 and row["ours"].startswith("-5%")
    assert "init scale (init/attn_output_rms) 0.5 vs 1, ratio 0.5, outside [0.8, 1.25]" in row["note"]
    assert "no scale-matched control row (scale_control)" in row["note"]
    records = _paired_runs(TRAINED, "baseline", gain, scale={"g1_elem_sig": 1.0, "baseline": 1.0})
    row = _row(C.claims_table({TRAINED: records}, [claim]), claim.claim)
    assert row["verdict"] == C.HOLDS and "ratio 1, inside [0.8, 1.25]" in row["note"]


def test_a_scale_matched_control_row_decides_a_row_at_different_scales(claims):
    rows = [claims[G1_TRAINED], claims[OPROJ_CONTROL]]
    scale = {"g1_elem_sig": 0.5, "ctrl_oproj_init_0p5": 0.5, "baseline": 1.0}
    beats_control = {"g1_elem_sig": _differences(-5.0, -5.5, -4.5), "ctrl_oproj_init_0p5": {0: -1.0, 1: -1.0, 2: -1.0}}
    frame = C.claims_table({TRAINED: _paired_runs(TRAINED, "baseline", beats_control, scale)}, rows)
    assert _row(frame, OPROJ_CONTROL)["verdict"] == C.HOLDS  # G1 and the control start at one scale
    row = _row(frame, G1_TRAINED)
    assert row["verdict"] == C.HOLDS and f"the scale-matched control row \"{OPROJ_CONTROL}\": holds" in row["note"]
    # the control gains as much as G1: G1's gain over the baseline is the init scale's, as far as these runs say
    same_as_control = {"g1_elem_sig": _differences(-5.0, -5.5, -4.5), "ctrl_oproj_init_0p5": _differences(-5.0, -5.5,
                                                                                                           -4.5)}
    frame = C.claims_table({TRAINED: _paired_runs(TRAINED, "baseline", same_as_control, scale)}, rows)
    assert _row(frame, OPROJ_CONTROL)["verdict"].startswith(C.INCONCLUSIVE)
    assert _row(frame, G1_TRAINED)["verdict"] == C.CONFOUNDED


def test_without_the_init_scale_the_rule_is_not_applied_and_the_note_says_so(claims):
    records = _paired_runs(TRAINED, "baseline", {"g1_elem_sig": _differences(-5.0, -5.5, -4.5)})
    row = _row(C.claims_table({TRAINED: records}, [claims[G1_TRAINED]]), G1_TRAINED)
    assert row["verdict"] == C.HOLDS
    assert ("init scale not logged (init/attn_output_rms absent on the runs of g1_elem_sig, baseline): the "
            "init-scale rule could not be applied") in row["note"]


def test_a_scale_control_must_name_a_row_about_the_same_group(tmp_path):
    path = _claims_file(tmp_path, "    margin: {relative: 0.01, reason: r, positive_control: [g1_elem_sig "
                                  "train.lr=0.002, baseline train.lr=0.002]}\n")
    closeness = "  - claim: Headwise is close\n"
    gains = ("  - claim: G1 gains\n    kind: direction\n    direction: lower\n    sweep: repro-core\n"
             "    a: g1_elem_sig train.lr=0.002\n    b: baseline train.lr=0.002\n"
             "    scale_control: Headwise is close\n")
    path.write_text(path.read_text().replace(closeness, gains + closeness))
    with pytest.raises(GatelabError, match="scale_control: 'Headwise is close' is not a direction row of repro-core "
                                           "about g1_elem_sig train.lr=0.002"):
        load_claims(path)


# --- 5. rows true by construction are neither counted nor corrected ----------------------------------------------


def test_rows_true_by_construction_stay_out_of_the_count_and_the_correction(claims):
    rows = [claims[c] for c in ("Gate score is higher for g1_elem_nssig", "Gate score is higher for g1_elem_sig_shared",
                                "G1 beats G2 (MoE)", "The G1 gate score is sparse (mean below 0.25)")]

    def value(variant, settings, seed):
        gate = {"g1_elem_sig": 0.12, "g1_elem_nssig": 0.7, "g1_elem_sig_shared": 0.3}.get(variant, 0.3)
        jitter = {"g1_elem_sig": 0.002 * seed**2, "g1_elem_sig_shared": 0.001 * seed}.get(variant, 0.0)
        return {"ppl/avg": 100.0 + SHARED[seed] + (variant == "g2_elem_sig") * (1.0 + 0.1 * seed),
                "probe/gate_score_mean": gate + jitter}

    records = {MOE: _records(MOE, value)}
    frame = C.claims_table(records, rows)
    built = _row(frame, rows[0].claim)
    assert (built["verdict"] == C.TRUE_BY_CONSTRUCTION and built["p"] == built["q"] == ""
            and built["test"] == "paired t (not run: true by construction)")
    p_values = [C.evaluate_claim(claim, records[MOE])[1].p_value for claim in rows]
    assert p_values[0] is None and all(p is not None for p in p_values[1:])
    expected = benjamini_hochberg(p_values[1:])  # the family is the three tested rows
    assert list(frame["q"][1:]) == [K.p_cell(q) for q in expected]
    text = R.summary(frame)
    assert "Exploratory: the paper's claims, written after their data: 4 rows, 3 tested (Benjamini-Hochberg over " \
           "them)" in text and "holds 3;" in text and "true by construction 1" in text
    assert rows[0].claim not in text


# --- issue 34's rows for every variant run: not addressed --------------------------------------------------------


def test_a_claim_not_addressed_is_listed_without_a_test_and_outside_the_correction(claims):
    missing = [c for c in claims.values() if c.kind == "not addressed"]
    assert any("Table 5" in c.claim for c in missing) and any("Table 6" in c.claim for c in missing)
    tested = claims[G1_TRAINED]
    records = _paired_runs(TRAINED, "baseline", {"g1_elem_sig": _differences(-3.0, -4.0, -2.0)})
    frame = C.claims_table({TRAINED: records}, [tested, *missing])
    rows = frame[frame["verdict"] == C.NOT_ADDRESSED]
    assert len(rows) == len(missing) and (rows["p"] == "").all() and (rows["sweep"] == "-").all()
    assert all(row["note"] for _, row in rows.iterrows())  # what is missing, from the row's why
    # the tested row's q is its own p: the not-addressed rows are not in the family
    tested_row = _row(frame, G1_TRAINED)
    assert float(tested_row["q"]) == pytest.approx(float(tested_row["p"]), rel=1e-3)


@pytest.mark.parametrize("entry", ["sweep: repro-trained\n    kind: not addressed\n    why: none run",
                                   "kind: not addressed"])
def test_a_claim_not_addressed_names_no_sweep_and_says_why(tmp_path, entry):
    from tests.report.test_claims import _claims_file

    with pytest.raises(GatelabError, match="not addressed names no sweep and says why"):
        load_claims(_claims_file(tmp_path, f"  - claim: nothing here\n    {entry}\n"))


def test_every_row_of_the_shipped_table_names_its_test():
    table = pd.read_csv(REPO / "results" / "tiny" / "claims.csv", keep_default_na=False)
    assert (table["test"] != "").all()
    tested = table[table["p"] != ""]
    assert set(tested["test"]) <= {"paired t", "TOST, paired t", "one-sample t", "Kendall tau"}  # fixed by kind
    assert not tested["test"].str.contains("Welch").any()


# --- 5. issue 43: the init-scale rule both ways, the regime, shared preconditions, sections --------------------------

HEAD_TRAINED = "Headwise is close to elementwise (trained)"


def test_a_significant_row_against_the_paper_at_init_ratio_6_is_confounded(claims):
    claim = claims[G1_TRAINED].model_copy(update={"scale_control": None})
    worse = {"g1_elem_sig": _differences(5.0, 4.5, 5.5)}
    row = _row(C.claims_table({TRAINED: _paired_runs(TRAINED, "baseline", worse, scale={"g1_elem_sig": 6.0})},
                              [claim]), claim.claim)
    assert float(row["q"]) < 0.05 and row["init ratio"] == "6"
    assert row["verdict"] == C.CONFOUNDED and row["rule"] == "init scale: groups start apart"
    assert "the test alone: does not hold (significant, the other way)" in row["note"]


def _trained_with_reference(g1_effect: float, head: dict[int, float], scale=None) -> list:
    """repro-trained's runs: G1 `g1_effect` % from the baseline (the sweep's reference), headwise `head` from G1."""
    g1 = _differences(g1_effect, g1_effect - 0.3, g1_effect + 0.3)
    others = {"g1_elem_sig": g1, "g1_head_sig": {s: g1[s] + head[s] for s in head}}
    return _paired_runs(TRAINED, "baseline", others, scale=scale)


def test_a_closeness_row_at_init_ratio_0_05_is_confounded(claims):
    rows = [claims[G1_TRAINED], claims[HEAD_TRAINED]]
    scale = {"g1_head_sig": 0.05, "g1_elem_sig": 1.0, "baseline": 1.0}
    for head in (_differences(0.1, 0.05, 0.15), _differences(5.0, 4.8, 5.2)):  # close, then apart
        row = _row(C.claims_table({TRAINED: _trained_with_reference(-1.8, head, scale)}, rows), HEAD_TRAINED)
        assert row["init ratio"] == "0.05" and row["regime"] == "0.97x"
        assert row["verdict"] == C.CONFOUNDED and row["rule"] == "init scale: groups start apart"


def test_a_closeness_row_whose_sweep_moves_8_times_the_papers_effect_is_not_testable(claims):
    rows = [claims[G1_TRAINED], claims[HEAD_TRAINED]]
    close = _differences(0.1, 0.05, 0.15)
    row = _row(C.claims_table({TRAINED: _trained_with_reference(-14.9, close)}, rows), HEAD_TRAINED)
    assert row["verdict"] == C.NOT_TESTABLE and row["rule"] == "regime: reference effect vs the paper's"
    assert row["regime"] == "8.03x" and row["p"] == row["q"] == ""  # not tested: outside the family
    assert "outside [1/4, 4]" in row["note"]
    # at the paper's size the same figures hold
    row = _row(C.claims_table({TRAINED: _trained_with_reference(-1.8, close)}, rows), HEAD_TRAINED)
    assert row["verdict"] == C.HOLDS and row["rule"] == "test: q < 0.05"


def test_two_rows_sharing_a_precondition_that_did_not_arise_are_both_not_testable(tmp_path):
    path = _claims_file(tmp_path, "    margin: {relative: 0.01, reason: r, positive_control: [g1_elem_sig "
                                  "train.lr=0.002, baseline train.lr=0.002]}\n    testable_if: [a sink forms]\n")
    text = path.read_text().replace("claims:\n", "preconditions:\n  a sink forms: {rule: above, group: baseline "
                                    "train.lr=0.002, metric: probe/f_attn, level: 0.3, reason: no sink}\nclaims:\n")
    path.write_text(text + "  - claim: G1 gains\n    sweep: repro-core\n    kind: direction\n    direction: lower\n"
                           "    a: g1_elem_sig train.lr=0.002\n    b: baseline train.lr=0.002\n"
                           "    testable_if: [a sink forms]\n")
    rows = load_claims(path)
    assert [rule.name for row in rows for rule in row.testable_if] == ["a sink forms", "a sink forms"]
    from tests.report.test_claims import CORE

    records = _records(CORE, lambda variant, settings, seed: {"ppl/avg": 100.0 + seed + (variant == "baseline"),
                                                               "probe/f_attn": 0.1})
    frame = C.claims_table({CORE: records}, rows)
    assert list(frame["verdict"]) == [C.NOT_TESTABLE] * 2 and set(frame["rule"]) == {"precondition: did not arise"}
    assert all("precondition \"a sink forms\" (not met): baseline train.lr=0.002 probe/f_attn 0.1" in note
               for note in frame["note"])
    with pytest.raises(GatelabError, match="no precondition 'a sink form'"):
        path.write_text(text.replace("testable_if: [a sink forms]", "testable_if: [a sink form]"))
        load_claims(path)


def test_each_section_is_corrected_on_its_own_the_confirmatory_one_by_holm(claims):
    confirmatory = [c for c in claims.values() if c.section == "confirmatory" and c.sweep == "repro-trained-long"]
    assert len(confirmatory) == 7
    p_values = [0.001, 0.01, 0.02, 0.03, 0.04, 0.2, 0.5]
    other = claims["G1 beats G2 (trained)"]
    assert other.section == "exploratory"
    from gatelab.report import claims_rules

    q = claims_rules.corrected([*confirmatory, other], [*p_values, 0.04])
    assert q[:7] == pytest.approx([min(1.0, p) for p in (0.007, 0.06, 0.1, 0.12, 0.12, 0.4, 0.5)])  # Holm's steps
    assert q[7] == pytest.approx(0.04)  # a family of one: its own p, not pulled into the confirmatory one
    assert q[:7] != pytest.approx(benjamini_hochberg(p_values))


def test_an_unmatched_row_is_read_beside_the_matched_one(claims, tmp_path):
    unmatched = claims["G1 lowers Avg PPL in the trained regime (41 tokens a parameter, 6 seeds)"]
    matched = claims[unmatched.beside]
    assert matched.section == "confirmatory" and "narrowed" in matched.claim
    records = _records("repro-trained-long", lambda variant, settings, seed: {
        "ppl/avg": 100.0 + seed - (3.0 + 0.1 * (seed % 2)) * (variant == "g1_elem_sig")})
    frame = C.claims_table({"repro-trained-long": records}, [unmatched, matched])
    row = _row(frame, unmatched.claim)
    assert row["verdict"] == C.HOLDS and f"read beside \"{matched.claim}\": {C.NOT_RUN}" in row["note"]
    assert f"beside \"{matched.claim}\": {C.NOT_RUN})" in R.summary(frame)
    with pytest.raises(GatelabError, match="beside: no row 'G1 lowers'"):
        path = _claims_file(tmp_path, "    margin: {relative: 0.01, reason: r, positive_control: [g1_elem_sig "
                                      "train.lr=0.002, baseline train.lr=0.002]}\n    beside: G1 lowers\n")
        load_claims(path)


def test_a_confirmatory_row_is_read_only_on_its_whole_sample_and_an_exploratory_one_on_what_has_ended(claims):
    """A sweep run in parts (--timeout) leaves a confirmatory row half-read: no figure, no p, no verdict until every
    run it declared has ended, so no interim look can stop it early; an exploratory row reads what has ended."""
    confirmatory = claims["G1 lowers Avg PPL against the parameter-matched baseline (the gated FFN narrowed, Table 2's "
                          "design)"]
    exploratory = claims["G1 lowers Avg PPL against the parameter-matched baseline (repro-matched, run before its row)"]
    assert confirmatory.section == "confirmatory" and exploratory.section != "confirmatory"

    def value(variant, settings, seed):
        gain = 0.4 + 0.05 * (seed % 3)  # about 2% of 20, the paper's size, with a spread
        return {"ppl/avg": 20.0 + 0.1 * (seed % 5) - gain * (variant == "g1_elem_sig")}

    def part(seeds_ended: int):
        return lambda spec: "finished" if spec.experiment.seed < seeds_ended else "pending"

    halfway = {sweep: _records(sweep, value, part(37 + 20 if sweep.endswith("confirm") else 20))
               for sweep in (confirmatory.sweep, exploratory.sweep)}
    frame = C.claims_table(halfway, [confirmatory, exploratory])
    row = _row(frame, confirmatory.claim)
    declared = sum(r.group in ("g1_elem_sig", "baseline") for r in halfway[confirmatory.sweep])
    assert row["verdict"] == C.NOT_RUN and row["rule"] == C.RULE_WHOLE_SAMPLE and row["p"] == row["ours"] == ""
    assert row["test"] == f"none (40 of {declared} runs ended)" and "no interim look" in row["note"]
    assert _row(frame, exploratory.claim)["verdict"] == C.HOLDS  # 20 of its 37 seeds: read as they are

    whole = {confirmatory.sweep: _records(confirmatory.sweep, value)}
    assert _row(C.claims_table(whole, [confirmatory]), confirmatory.claim)["verdict"] == C.HOLDS
