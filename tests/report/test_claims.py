"""The claims table: the shipped claims file loads and refuses what its sweeps do not run, and each kind of claim
reaches each verdict from runs whose differences are known."""

from __future__ import annotations

import math
from pathlib import Path
from typing import get_args

import numpy as np
import pytest
from scipy import stats

from gatelab.errors import GatelabError
from gatelab.report import claims as C
from gatelab.report.claims_file import Claim, Kind, load_claims
from gatelab.report.claims_report import VERDICT_RULES
from gatelab.report.export import ReportTable, export_report
from gatelab.report.tables import RunRecord
from gatelab.sweep.spec import expand, load_sweep
from tests.helpers import REPO

CLAIMS_FILE = REPO / "sweeps" / "claims" / "tiny.yaml"
CORE, MOE, SINK, TRAINED, LR = "repro-core", "repro-table1-3-4", "repro-sink", "repro-trained", "repro-lr-sensitivity"


@pytest.fixture(scope="module")
def claims() -> list[Claim]:
    return load_claims(CLAIMS_FILE)


def _records(sweep: str, value, status=lambda spec: "finished") -> list[RunRecord]:
    """One run per cell of a shipped sweep, its metrics from `value(variant, settings, seed)`."""
    records = []
    for spec in expand(load_sweep(REPO / "sweeps" / f"{sweep}.yaml")):
        state = status(spec)
        metrics = {} if state == "diverged" else value(spec.experiment.variant, spec.settings(), spec.experiment.seed)
        records.append(RunRecord(spec, state, f"run-{spec.index}", metrics, ended="2026-01-01 00:00:00 UTC"))
    return [r for r in records if r.status != "drop"]


def _noise(seed: int, salt: str) -> float:
    return float(np.random.default_rng([seed, sum(map(ord, salt))]).normal())


def _row(frame, claim: str) -> dict:
    rows = frame[frame["claim"] == claim]
    assert len(rows) == 1, claim
    return rows.iloc[0].to_dict()


# --- the claims file -------------------------------------------------------------------------------------------------


def test_the_shipped_claims_file_names_real_sweeps_groups_and_kinds(claims):
    assert len(claims) >= 50
    ladder = load_claims(CLAIMS_FILE.with_name("ladder.yaml"))  # the ladder's multipliers: a file of their own
    assert {c.kind for c in claims} | {c.kind for c in ladder} == set(get_args(Kind)) == set(C.CHECKS)
    sweeps = {c.sweep for c in claims}
    assert sweeps == {CORE, MOE, SINK, TRAINED, LR, "repro-sink-free", "repro-trained-long", "repro-matched",
                      "repro-matched-confirm",
                      None}  # None: not addressed
    assert all(c.why for c in claims if c.sweep is None) and {c.kind for c in claims if c.sweep is None} == {
        "not addressed"}
    by_text = {c.claim: c for c in claims}
    control = by_text["G1 beats the constant x0.5 of the SDPA output (repro-trained's control, not the paper's for "
                      "input dependence)"]
    assert (control.sweep, control.a, control.b) == (TRAINED, "g1_elem_sig", "ctrl_scale_0p5")
    assert control.direction == "lower"
    # groups are spelled as RunRecord.group spells them, whatever the file wrote (true -> True)
    sensitivity = by_text["The gate lowers LR sensitivity (without QK-norm)"]
    assert sensitivity.a == "g1_elem_sig model.qk_norm=False" and sensitivity.axis == "train.lr"
    # the paper's "no difference" is a closeness claim; the tautologies are marked
    assert by_text["Multiplicative and additive SiLU gates are close (the paper: no difference)"].kind == "closeness"
    assert by_text["Gate score is higher for g1_elem_nssig"].true_by_construction
    assert by_text["Gate score is higher for g1_inputindep_sig"].true_by_construction
    # beyond the paper (issue 33): each do-nothing mechanism against the baseline on sink rate, kurtosis and W8A8
    sink_free = [c for c in claims if c.sweep == "repro-sink-free"]
    assert {c.metric for c in sink_free} >= {"probe/sink_rate", "probe/kurtosis_max", "eval/w8a8_ppl_ratio"}
    assert {c.b for c in sink_free} == {"baseline"}


def _claims_file(tmp_path: Path, entry: str) -> Path:
    """A claims file with one entry, in a folder beside a copy of repro-core.yaml (its preset named absolutely)."""
    sweeps = tmp_path / "sweeps"
    (sweeps / "claims").mkdir(parents=True)
    text = (REPO / "sweeps" / "repro-core.yaml").read_text()
    (sweeps / "repro-core.yaml").write_text(
        text.replace("experiment: ../experiments/tiny.yaml", f"experiment: {REPO / 'experiments' / 'tiny.yaml'}"))
    path = sweeps / "claims" / "x.yaml"
    path.write_text("claims:\n  - claim: G1 lowers Avg PPL\n    kind: direction\n    direction: lower\n" + entry)
    return path


@pytest.mark.parametrize("entry, named", [
    ("    sweep: repro-cor\n    a: g1_elem_sig train.lr=0.002\n    b: baseline train.lr=0.002\n",
     ["sweep: 'repro-cor' is not a sweep in", "did you mean repro-core?", "its sweeps: repro-core"]),
    ("    sweep: repro-core\n    a: g1_elem_sgi train.lr=0.002\n    b: baseline train.lr=0.002\n",
     ["a: variant 'g1_elem_sgi' is not in sweep repro-core (did you mean g1_elem_sig?)",
      "its variants: baseline, g1_elem_sig, g1_head_sig, g2_elem_sig, g5_elem_sig"]),
    ("    sweep: repro-core\n    a: g1_elem_sig train.lr=0.003\n    b: baseline train.lr=0.002\n",
     ["a: train.lr=0.003 is not in sweep repro-core's grid", "its values of train.lr: 0.002, 0.008"]),
], ids=["sweep", "variant", "learning-rate"])
def test_a_misspelled_sweep_variant_or_rate_is_one_error_naming_it(tmp_path, entry, named):
    path = _claims_file(tmp_path, entry)
    with pytest.raises(GatelabError) as error:
        load_claims(path)
    message = str(error.value)
    assert message.startswith(f"{path}: invalid claims file\n")
    assert 'claims[0] "G1 lowers Avg PPL"' in message
    assert all(name in message for name in named), message
    assert message.count("\n") == 1  # one problem, one line


def test_a_rate_written_another_way_is_the_sweeps_rate(tmp_path):
    entry = "    sweep: repro-core\n    a: g1_elem_sig train.lr=2e-3\n    b: baseline train.lr=2.0e-3\n"
    path = _claims_file(tmp_path, entry)
    [claim] = load_claims(path)
    assert (claim.a, claim.b) == ("g1_elem_sig train.lr=0.002", "baseline train.lr=0.002")


def test_a_group_without_the_sweeps_setting_is_refused(tmp_path):
    path = _claims_file(tmp_path, "    sweep: repro-core\n    a: g1_elem_sig\n    b: baseline train.lr=0.002\n")
    with pytest.raises(GatelabError, match="sweep repro-core has no runs of 'g1_elem_sig'; its groups of g1_elem_sig: "
                                           "g1_elem_sig train.lr=0.002, g1_elem_sig train.lr=0.008"):
        load_claims(path)


def test_a_paper_row_the_paper_lacks_is_refused(tmp_path):
    entry = ("    sweep: repro-core\n    a: g1_elem_sig train.lr=0.002\n    b: baseline train.lr=0.002\n"
             "    paper: {table: table2}\n")
    with pytest.raises(GatelabError, match="the paper's table2 has no row 'g1_elem_sig'"):
        load_claims(_claims_file(tmp_path, entry))


# --- verdicts --------------------------------------------------------------------------------------------------------


def test_a_real_gain_holds_a_reversed_one_does_not_and_noise_is_inconclusive(claims):
    # per-seed noise shared by every variant (common random numbers), plus a small variant-specific jitter
    def ppl(variant, settings, seed):
        effect = {"g1_elem_sig": -20.0, "g5_elem_sig": +20.0, "g2_elem_sig": -1.0}.get(variant, 0.0)
        return {"ppl/avg": 300 + 30 * _noise(seed, "shared") + effect + 0.5 * _noise(seed, variant)}

    frame = C.claims_table({CORE: _records(CORE, ppl)}, claims)
    gain = _row(frame, "G1 elementwise sigmoid lowers Avg PPL (dense)")
    assert gain["verdict"] == C.HOLDS and gain["n"] == "5" and gain["test"] == "paired t"
    assert float(gain["r (seeds)"]) > 0 and float(gain["p"]) <= float(gain["q"]) < 0.05
    assert gain["ours"].startswith("-") and gain["ours"].split()[0].endswith("%")
    assert _row(frame, "G2 beats G5 (dense)")["verdict"] == C.HOLDS
    assert _row(frame, "G1 beats G2 (dense)")["verdict"] == C.HOLDS
    # the MoE rows were not given a sweep: marked, not computed, no p
    moe = _row(frame, "G1 elementwise sigmoid lowers Avg PPL (MoE)")
    assert moe["verdict"] == C.NOT_RUN and moe["p"] == moe["q"] == ""

    def opposite(variant, settings, seed):
        effect = {"g1_elem_sig": +20.0}.get(variant, 0.0)
        return {"ppl/avg": 300 + 30 * _noise(seed, "shared") + effect + 0.5 * _noise(seed, variant)}

    frame = C.claims_table({CORE: _records(CORE, opposite)}, claims)
    assert _row(frame, "G1 elementwise sigmoid lowers Avg PPL (dense)")["verdict"].startswith(C.FAILS)

    def noisy(variant, settings, seed):  # no effect, noise far above the paper's 1.3% gain: cannot tell
        return {"ppl/avg": 300 + 30 * _noise(seed, variant + str(settings))}

    frame = C.claims_table({CORE: _records(CORE, noisy)}, claims)
    row = _row(frame, "G1 elementwise sigmoid lowers Avg PPL (dense)")
    assert float(row["q"]) >= 0.05 and row["verdict"].startswith(C.INCONCLUSIVE)  # seeded: always this draw

    def tight(variant, settings, seed):  # no effect, noise so small that the interval excludes the paper's gain
        return {"ppl/avg": 300 + 30 * _noise(seed, "shared") + 0.01 * _noise(seed, variant)}

    frame = C.claims_table({CORE: _records(CORE, tight)}, claims)
    # the interval excludes the paper's gain, but the row is its sweep's reference: an effect that small against the
    # paper's says the regime is not the paper's, so no size is read (the interval-excludes rule: test_verdict_rules)
    tight_row = _row(frame, "G1 elementwise sigmoid lowers Avg PPL (dense)")
    assert tight_row["verdict"] == C.NOT_TESTABLE and tight_row["rule"].startswith("regime")
    assert "the test alone: does not hold (the paper's size excluded)" in tight_row["note"]


def test_verdicts_are_decided_on_q_not_p(claims):
    # G1's per-seed differences from baseline: p = 0.0226 alone (paired t, df 4); the table's other rows are noise,
    # so Benjamini-Hochberg lifts its q above 0.05 and the row is not called.
    differences = {0: -12.0, 1: -2.0, 2: -8.0, 3: -1.0, 4: -9.0}
    expected_p = float(stats.ttest_1samp(list(differences.values()), 0.0).pvalue)

    def ppl(variant, settings, seed):
        base = 300 + 30 * _noise(seed, "shared")
        if variant == "baseline":
            return {"ppl/avg": base}
        if variant == "g1_elem_sig":
            return {"ppl/avg": base + differences[seed]}
        return {"ppl/avg": base + 8 * _noise(seed, variant + str(settings))}

    frame = C.claims_table({CORE: _records(CORE, ppl)}, claims)
    row = _row(frame, "G1 elementwise sigmoid lowers Avg PPL (dense)")
    assert row["test"] == "paired t" and float(row["p"]) == pytest.approx(expected_p, rel=1e-2)
    assert float(row["p"]) < 0.05 <= float(row["q"])
    assert row["verdict"] == f"{C.INCONCLUSIVE} (the paper's direction)"


def test_row_means_are_over_the_seeds_both_groups_ended():
    # g1 ended seeds 0, 1, 2; the baseline only 0 and 1. Seed 2's 1000 must reach neither the mean nor the test.
    values = {("g1_elem_sig", 0): 100.0, ("g1_elem_sig", 1): 110.0, ("g1_elem_sig", 2): 1000.0,
              ("baseline", 0): 120.0, ("baseline", 1): 125.0}
    records = _records(TRAINED, lambda v, s, seed: {"ppl/avg": values.get((v, seed), 200.0)},
                       lambda spec: "missing" if (spec.experiment.variant, spec.experiment.seed) == ("baseline", 2)
                       else "finished")
    claim = next(c for c in load_claims(CLAIMS_FILE) if c.claim.startswith("G1 lowers Avg PPL in the trained"))
    frame = C.claims_table({TRAINED: records}, [claim])
    row = _row(frame, claim.claim)
    assert row["n"] == "2" and "(105 vs 122.5)" in row["ours"]
    assert row["ours"].startswith(f"{100 * (105 - 122.5) / 122.5:.3g}%")
    assert row["test"] == "paired t" and row["r (seeds)"] == "1"  # two seeds moving together: r = 1
    # the same groups moving apart over the seeds (r = -1): still the paired test, which the design fixes (the
    # first pass chose Welch here, after looking at r)
    values[("baseline", 1)] = 115.0
    frame = C.claims_table({TRAINED: _records(TRAINED, lambda v, s, seed: {"ppl/avg": values.get((v, seed), 200.0)},
                                              lambda spec: "drop" if (spec.experiment.variant,
                                                                      spec.experiment.seed) == ("baseline", 2)
                                              else "finished")}, [claim])
    row = _row(frame, claim.claim)
    assert row["test"] == "paired t" and row["r (seeds)"] == "-1" and "(105 vs 117.5)" in row["ours"]
    assert float(row["p"]) == pytest.approx(float(stats.ttest_rel([100.0, 110.0], [120.0, 115.0]).pvalue), rel=1e-2)


def test_close_is_an_equivalence_test_with_the_margin_stated(claims):
    def ppl(variant, settings, seed, head_gap):
        effect = {"g1_elem_sig": -20.0, "g1_head_sig": -20.0 + head_gap}.get(variant, 0.0)
        return {"ppl/avg": 300 + 30 * _noise(seed, "shared") + effect + 0.2 * _noise(seed, variant)}

    claim = "Headwise is close to elementwise (dense)"
    close = _row(C.claims_table({CORE: _records(CORE, lambda v, s, seed: ppl(v, s, seed, 1.0))}, claims), claim)
    far = _row(C.claims_table({CORE: _records(CORE, lambda v, s, seed: ppl(v, s, seed, 15.0))}, claims), claim)
    assert close["verdict"] == C.HOLDS and close["test"].startswith("TOST") and float(close["q"]) < 0.05
    assert "margin +-2.25%" in close["ours"]  # twice the paper's own gap for the pair, 7.370 against 7.288 (Table 2)
    assert "margin: 2 x the paper's own gap for the pair, Table 2 row (9) against (8) (+1.13%)" in close["note"]
    assert far["verdict"] == f"{C.FAILS} (apart by more than the margin)"


def test_learning_rate_tolerance_counts_divergence_in_both_groups(claims):
    claim = "The gated model tolerates 4x the learning rate better than the baseline"

    def ppl(variant, settings, seed):
        hurt = 1.5 if settings["train.lr"] == 0.008 and variant == "baseline" else 1.0
        noise = 1 + 0.001 * _noise(seed, variant + str(settings))
        return {"ppl/avg": (300 + 30 * _noise(seed, "shared")) * hurt * noise}

    frame = C.claims_table({CORE: _records(CORE, ppl)}, claims)
    row = _row(frame, claim)
    # the rule reads each rate's own seeds (5 at the base rate, 3 at 4x): the rise is ln 1.5 = 0.405 plus seed noise
    assert row["verdict"] == C.HOLDS and row["note"].startswith(
        "testable: precondition \"the baseline is unstable at 4x the base rate\" (met): baseline: lowest mean ln_ppl "
        "at train.lr=0.002, above it ln_ppl rises by at most 0.4")
    assert _row(frame, "4x the learning rate hurts the baseline")["verdict"] == C.HOLDS

    def diverge(spec):
        high = spec.settings()["train.lr"] == 0.008
        return "diverged" if high and spec.experiment.variant == "baseline" else "finished"

    frame = C.claims_table({CORE: _records(CORE, lambda v, s, seed: {"ppl/avg": 300.0 + seed}, diverge)}, claims)
    row = _row(frame, claim)
    # a diverged baseline run counts as uniform prediction (ppl 2048), not as missing: its change is ln(2048 / 300)
    assert row["verdict"] == C.HOLDS and row["n"] == "3"
    assert "3 diverged run(s) counted as uniform prediction" in row["note"]
    assert f"vs {math.log(2048 / 301):.4g})" in row["ours"]

    flat = C.claims_table({CORE: _records(CORE, lambda v, s, seed: {"ppl/avg": 300.0 + seed + (v == "baseline")})},
                          claims)
    row = _row(flat, claim)
    assert row["verdict"] == C.NOT_TESTABLE and row["p"] == row["q"] == ""
    assert row["note"].startswith("not testable: the baseline is not unstable at 4x the base rate (precondition "
                                  "\"the baseline is unstable at 4x the base rate\" (not met): baseline: lowest")
    # the row beside it needs the same instability and answers it the same, once
    hurts = _row(flat, "4x the learning rate hurts the baseline")
    assert hurts["verdict"] == C.NOT_TESTABLE and hurts["rule"] == row["rule"] == "precondition: did not arise"


def test_a_sink_claim_is_not_testable_without_a_sink(claims):
    def probes(f_attn_baseline):
        def value(variant, settings, seed):
            f_attn = f_attn_baseline if variant == "baseline" else 0.5 * f_attn_baseline
            return {"ppl/avg": 300.0, "probe/f_attn": f_attn + 0.001 * _noise(seed, variant),
                    "probe/m_act_share_layers_max_at_first_token": 0.0, "probe/m_act": 5.0 + _noise(seed, variant)}
        return value

    claim = "F-Attn (first-token attention) falls with the G1 gate (MoE)"
    uniform = C.uniform_first_token_share(128)
    assert uniform == pytest.approx((sum(1 / k for k in range(1, 129)) - 1) / 127) and 0.0348 < uniform < 0.0350
    row = _row(C.claims_table({MOE: _records(MOE, probes(0.02))}, claims), claim)
    assert row["verdict"] == C.NOT_TESTABLE and row["p"] == ""
    assert ("not testable: no attention sink formed in the baseline (precondition \"a sink forms in the baseline\" "
            "(not met): baseline probe/f_attn 0.0194 ") in row["note"]
    assert "uniform causal attention's 0.0349 at 128 tokens" in row["note"]
    row = _row(C.claims_table({MOE: _records(MOE, probes(0.3))}, claims), claim)
    assert row["verdict"] == C.HOLDS and row["note"].startswith(
        "testable: precondition \"a sink forms in the baseline\" (met): baseline probe/f_attn 0.299 (rule: above")
    m_act = _row(C.claims_table({MOE: _records(MOE, probes(0.3))}, claims),
                 "M-Act (massive activations) falls with the G1 gate (MoE)")
    assert m_act["verdict"] == C.NOT_TESTABLE and "no massive activation" in m_act["note"]


PAPER_PPL = {"baseline": 6.026, "ref_kv8": 5.979, "ref_q48": 5.953, "ref_add4experts": 5.964, "g1_elem_sig": 5.761,
             "g2_elem_sig": 5.820, "g3_elem_sig": 6.016, "g4_elem_sig": 5.981, "g5_elem_sig": 6.017,
             "g1_head_sig": 5.792, "g2_head_sig": 5.808, "g1_elem_sig_shared": 5.801,
             "g2_elem_sig_shared": 5.867, "g1_elem_silu_add": 5.821, "g1_elem_silu": 5.822}


def test_levels_ranks_and_rows_true_by_construction(claims):
    def like_paper(variant, settings, seed):
        gate = {"g1_elem_sig": 0.12, "g1_elem_nssig": 0.7}.get(variant, 0.3)
        return {"ppl/avg": 50 * PAPER_PPL.get(variant, 6.0) + 0.01 * _noise(seed, variant),
                "probe/gate_score_mean": gate + 0.01 * _noise(seed, variant)}

    frame = C.claims_table({MOE: _records(MOE, like_paper)}, claims)
    rank = _row(frame, "Our Table 1 ranks the variants like the paper's (Avg PPL)")
    assert rank["verdict"] == C.HOLDS and rank["n"] == "15"
    assert "95% bootstrap CI over seeds +1.00 to +1.00" in rank["ours"]
    gated = _row(frame, "... and within the gated rows only (Avg PPL)")
    assert gated["verdict"] == C.HOLDS and gated["n"] == "11" and gated["comparison"] == "11 variants with a gate"
    assert _row(frame, "The G1 gate score is sparse (mean below 0.25)")["verdict"] == C.HOLDS
    nssig = _row(frame, "Gate score is higher for g1_elem_nssig")
    assert (nssig["verdict"] == C.TRUE_BY_CONSTRUCTION and nssig["p"] == nssig["q"] == ""
            and nssig["test"] == "paired t (not run: true by construction)")
    assert nssig["note"].startswith("NS-sigmoid (0.5 + 0.5 sigmoid) is bounded below by 0.5")

    def backwards(variant, settings, seed):
        return {"ppl/avg": -50 * PAPER_PPL.get(variant, 6.0) + 1000 + 0.01 * _noise(seed, variant),
                "probe/gate_score_mean": 0.7 + 0.01 * _noise(seed, variant)}

    frame = C.claims_table({MOE: _records(MOE, backwards)}, claims)
    assert _row(frame, "Our Table 1 ranks the variants like the paper's (Avg PPL)")["verdict"] == C.FAILS
    assert _row(frame, "The G1 gate score is sparse (mean below 0.25)")["verdict"] == C.FAILS

    def unmoved(variant, settings, seed):
        return {"ppl/avg": 300.0 + seed, "probe/gate_score_mean": 0.45 + 0.01 * _noise(seed, variant)}

    row = _row(C.claims_table({MOE: _records(MOE, unmoved)}, claims), "The G1 gate score is sparse (mean below 0.25)")
    assert row["verdict"] == C.NOT_TESTABLE and "from its initial 0.5 (rule: > 0.1)" in row["note"]


def test_learning_rate_sensitivity_and_the_highest_stable_rate(claims):
    # Final val/loss by rate 1e-3 .. 3.2e-2. Without QK-norm the baseline diverges at 3.2e-2 (counts as the loss at
    # init, ln vocab) and its loss at 1.6e-2 moves with the seed; the gate trains everywhere. With QK-norm both are
    # flat past 4e-3.
    init = math.log(expand(load_sweep(REPO / "sweeps" / f"{LR}.yaml"))[0].experiment.model.vocab_size)
    curves = {("baseline", False): [5.0, 4.6, 4.4, 4.5, 5.5, None],
              ("g1_elem_sig", False): [5.0, 4.6, 4.4, 4.4, 4.5, 4.8],
              ("baseline", True): [5.0, 4.6, 4.4, 4.42, 4.45, 4.4],
              ("g1_elem_sig", True): [5.0, 4.6, 4.4, 4.4, 4.4, 4.4]}
    rates = [1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2]

    def loss(variant, settings, seed):
        value = curves[(variant, settings["model.qk_norm"])][rates.index(settings["train.lr"])]
        jitter = (0.1 * seed if variant == "baseline" else 0.05 * seed) if settings["train.lr"] == 1.6e-2 else 0.0
        return {"val/loss": value + jitter}

    def diverge(spec):
        settings = spec.settings()
        curve = curves[(spec.experiment.variant, settings["model.qk_norm"])]
        return "diverged" if curve[rates.index(settings["train.lr"])] is None else "finished"

    frame = C.claims_table({LR: _records(LR, loss, diverge)}, claims)
    row = _row(frame, "The gate lowers LR sensitivity (without QK-norm)")
    baseline = [(5.0 + 4.6 + 4.4 + 4.5 + 5.5 + 0.1 * s + init) / 6 - 4.4 for s in (0, 1)]
    gated = [(5.0 + 4.6 + 4.4 + 4.4 + 4.5 + 0.05 * s + 4.8) / 6 - 4.4 for s in (0, 1)]
    assert f"({np.mean(gated):.4g} vs {np.mean(baseline):.4g})" in row["ours"] and row["n"] == "2"
    assert row["test"] == "paired t" and row["p"] != ""  # tested: the baseline diverged somewhere
    assert "2 diverged run(s) counted as uniform prediction" in row["note"]
    with_norm = _row(frame, "The gate lowers LR sensitivity (with QK-norm)")
    assert with_norm["verdict"] == C.NOT_TESTABLE and "not unstable at any rate" in with_norm["note"]
    stable = _row(frame, "The highest stable rate is higher with the gate (without QK-norm)")
    assert stable["ours"] == "0.032 vs 0.016" and stable["verdict"] == f"{C.DESCRIPTIVE}: higher" and stable["p"] == ""


def test_the_highest_stable_rate_is_not_testable_where_no_baseline_run_diverged(claims):
    # Every rate trains for both groups (the baseline's loss still rises past 4e-3): the highest stable rate is the
    # grid's top for both, which says nothing about the paper's claim.
    def loss(variant, settings, seed):
        rise = {1e-3: 0.6, 2e-3: 0.2, 4e-3: 0.0, 8e-3: 0.1, 1.6e-2: 0.3, 3.2e-2: 0.5}[settings["train.lr"]]
        return {"val/loss": 4.0 + rise * (1.0 if variant == "baseline" else 0.2) + 0.01 * seed}

    stable = _row(C.claims_table({LR: _records(LR, loss)}, claims),
                  "The highest stable rate is higher with the gate (without QK-norm)")
    assert stable["verdict"] == C.NOT_TESTABLE and stable["p"] == ""
    assert "no baseline run diverged" in stable["note"] and "diverged at 0 of 6 train.lr values" in stable["note"]


def test_the_table_made_twice_from_the_same_runs_is_identical(claims, tmp_path):
    def ppl(variant, settings, seed):
        return {"ppl/avg": 300 + 30 * _noise(seed, variant), "probe/gate_score_mean": 0.3 + 0.05 * _noise(seed, "g"),
                "probe/f_attn": 0.03 + 0.01 * _noise(seed, variant)}

    records = {MOE: _records(MOE, ppl), SINK: _records(SINK, ppl)}
    first, second = C.claims_table(records, claims), C.claims_table(records, claims)
    assert first.equals(second)
    written = []
    for name in ("first", "second"):
        table = ReportTable("The paper's claims at tiny scale", C.claims_table(records, claims), VERDICT_RULES)
        written.append(export_report([table], [], tmp_path / name, ["md", "csv", "latex", "html"], "claims",
                                     command="gatelab claims", stamp="from 1 ended run"))
    assert [p.read_bytes() for p in written[0]] == [p.read_bytes() for p in written[1]]


def test_every_claim_without_its_sweep_is_marked_not_run(claims):
    frame = C.claims_table({}, claims)
    addressed = frame["sweep"] != "-"  # a claim no sweep tests is "not addressed" with or without runs
    assert (frame[addressed]["verdict"] == C.NOT_RUN).all() and (frame["q"] == "").all()
    assert (frame[~addressed]["verdict"] == C.NOT_ADDRESSED).all()
    assert list(frame.columns) == C.COLUMNS


def test_a_missing_paper_file_is_a_note_under_the_main_table(tmp_path, monkeypatch):
    from gatelab.report.tables import build_comparison

    records = _records(CORE, lambda v, s, seed: {"ppl/avg": 100.0 + seed + (v == "baseline")})
    assert not any("missing" in note for note in build_comparison(records, "table1").notes)
    monkeypatch.setenv("GATELAB_PAPER_DIR", str(tmp_path))
    result = build_comparison(records, "table1")
    assert (result.frame["paper Avg PPL"] == "").all()
    assert any("paper_table1_moe.csv is missing" in note for note in result.notes)
