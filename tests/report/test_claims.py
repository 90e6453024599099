"""The claims table: each kind of claim reaches each verdict from runs whose differences are known."""

from __future__ import annotations

import numpy as np
import pytest

from gatelab.report import claims as C
from gatelab.report.tables import RunRecord
from gatelab.sweep.spec import expand, load_sweep
from tests.helpers import REPO


def _records(sweep: str, value, status=lambda spec: "finished") -> list[RunRecord]:
    """One finished run per cell of a shipped sweep, its metrics from `value(variant, settings, seed)`."""
    records = []
    for spec in expand(load_sweep(REPO / "sweeps" / f"{sweep}.yaml")):
        metrics = value(spec.experiment.variant, spec.settings(), spec.experiment.seed)
        records.append(RunRecord(spec, status(spec), f"run-{spec.index}", metrics, ended="2026-01-01 00:00:00 UTC"))
    return records


def _noise(seed: int, salt: str) -> float:
    return float(np.random.default_rng([seed, sum(map(ord, salt))]).normal())


def _row(frame, claim: str) -> dict:
    rows = frame[frame["claim"] == claim]
    assert len(rows) == 1, claim
    return rows.iloc[0].to_dict()


def test_every_claim_reads_a_shipped_sweep_and_groups_that_exist():
    groups = {}
    for name in (C.CORE, C.MOE):
        groups[name] = {r.group for r in _records(name, lambda v, s, seed: {})}
    for claim in C.CLAIMS:
        assert (REPO / "sweeps" / f"{claim.sweep}.yaml").is_file(), claim.sweep
        if claim.sweep in groups:
            assert set(C._groups(claim)) <= groups[claim.sweep], claim.claim


def test_a_real_gain_holds_a_reversed_one_does_not_and_noise_is_inconclusive():
    # per-seed noise shared by every variant (common random numbers), plus a small variant-specific jitter
    def ppl(variant, settings, seed):
        effect = {"g1_elem_sig": -20.0, "g5_elem_sig": +20.0, "g2_elem_sig": -1.0}.get(variant, 0.0)
        return {"ppl/avg": 300 + 30 * _noise(seed, "shared") + effect + 0.5 * _noise(seed, variant)}

    frame = C.claims_table({C.CORE: _records(C.CORE, ppl)})
    gain = _row(frame, "G1 elementwise sigmoid lowers Avg PPL (dense)")
    assert gain["verdict"] == C.HOLDS and gain["n"] == "5" and float(gain["p"]) < 0.05
    assert gain["ours"].startswith("-") and gain["ours"].split()[0].endswith("%")
    assert _row(frame, "G2 beats G5 (dense)")["verdict"] == C.HOLDS
    assert _row(frame, "G1 beats G2 (dense)")["verdict"] == C.HOLDS
    # the MoE rows were not given a sweep: marked, not computed
    assert _row(frame, "G1 elementwise sigmoid lowers Avg PPL (MoE)")["verdict"] == C.NOT_RUN

    def opposite(variant, settings, seed):
        effect = {"g1_elem_sig": +20.0}.get(variant, 0.0)
        return {"ppl/avg": 300 + 30 * _noise(seed, "shared") + effect + 0.5 * _noise(seed, variant)}

    frame = C.claims_table({C.CORE: _records(C.CORE, opposite)})
    assert _row(frame, "G1 elementwise sigmoid lowers Avg PPL (dense)")["verdict"].startswith(C.FAILS)

    def noisy(variant, settings, seed):  # no effect, paired noise far above the paper's 1.3% gain: cannot tell
        return {"ppl/avg": 300 + 30 * _noise(seed, variant)}

    frame = C.claims_table({C.CORE: _records(C.CORE, noisy)})
    row = _row(frame, "G1 elementwise sigmoid lowers Avg PPL (dense)")
    assert float(row["p"]) >= 0.05 and row["verdict"] == C.INCONCLUSIVE  # the noise is seeded: always this draw

    def tight(variant, settings, seed):  # no effect, noise so small that the paper's gain would have shown
        return {"ppl/avg": 300 + 30 * _noise(seed, "shared") + 0.01 * _noise(seed, variant)}

    frame = C.claims_table({C.CORE: _records(C.CORE, tight)})
    assert _row(frame, "G1 elementwise sigmoid lowers Avg PPL (dense)")["verdict"] == \
        f"{C.FAILS} (an effect of the paper's size would have been seen)"


def test_close_uses_a_margin_from_the_g1_gain():
    def ppl(variant, settings, seed, head_gap):
        effect = {"g1_elem_sig": -20.0, "g1_head_sig": -20.0 + head_gap}.get(variant, 0.0)
        return {"ppl/avg": 300 + 30 * _noise(seed, "shared") + effect + 0.2 * _noise(seed, variant)}

    claim = "Headwise is close to elementwise (dense)"
    close = C.claims_table({C.CORE: _records(C.CORE, lambda v, s, seed: ppl(v, s, seed, 1.0))})
    far = C.claims_table({C.CORE: _records(C.CORE, lambda v, s, seed: ppl(v, s, seed, 15.0))})
    assert _row(close, claim)["verdict"] == C.HOLDS and "margin" in _row(close, claim)["ours"]
    assert _row(far, claim)["verdict"] == C.FAILS


def test_learning_rate_tolerance_counts_divergence_against_its_group():
    claim = "The gated model tolerates 4x the learning rate better than the baseline"

    def ppl(variant, settings, seed):
        hurt = 1.5 if settings["train.lr"] == 0.008 and variant == "baseline" else 1.0
        return {"ppl/avg": (300 + 30 * _noise(seed, "shared")) * hurt * (1 + 0.001 * _noise(seed, variant + str(settings)))}

    frame = C.claims_table({C.CORE: _records(C.CORE, ppl)})
    assert _row(frame, claim)["verdict"] == C.HOLDS
    assert _row(frame, "4x the learning rate hurts the baseline")["verdict"] == C.HOLDS

    def diverge(spec):
        high = spec.settings()["train.lr"] == 0.008
        return "diverged" if high and spec.experiment.variant == "baseline" else "finished"

    frame = C.claims_table({C.CORE: _records(C.CORE, lambda v, s, seed: {"ppl/avg": 300.0 + seed}, diverge)})
    row = _row(frame, claim)
    assert row["verdict"] == C.HOLDS and "3 baseline" in row["ours"]


def test_levels_and_ranks():
    paper_ppl = {"baseline": 6.026, "ref_kv8": 5.979, "ref_q48": 5.953, "ref_add4experts": 5.964, "g1_elem_sig": 5.761,
                 "g2_elem_sig": 5.820, "g3_elem_sig": 6.016, "g4_elem_sig": 5.981, "g5_elem_sig": 6.017,
                 "g1_head_sig": 5.792, "g2_head_sig": 5.808, "g1_elem_sig_shared": 5.801,
                 "g2_elem_sig_shared": 5.867, "g1_elem_silu_add": 5.821, "g1_elem_silu": 5.822}

    def like_paper(variant, settings, seed):
        gate = {"g1_elem_sig": 0.12, "g1_elem_nssig": 0.7}.get(variant, 0.3)
        return {"ppl/avg": 50 * paper_ppl.get(variant, 6.0) + 0.01 * _noise(seed, variant),
                "probe/gate_score_mean": gate + 0.01 * _noise(seed, variant)}

    frame = C.claims_table({C.MOE: _records(C.MOE, like_paper)})
    assert _row(frame, "Our Table 1 ranks the variants like the paper's (Avg PPL)")["verdict"] == C.HOLDS
    assert _row(frame, "The G1 gate score is sparse (mean below 0.25)")["verdict"] == C.HOLDS
    assert _row(frame, "Gate score is higher for g1_elem_nssig")["verdict"] == C.HOLDS

    def backwards(variant, settings, seed):
        return {"ppl/avg": -50 * paper_ppl.get(variant, 6.0) + 1000 + 0.01 * _noise(seed, variant),
                "probe/gate_score_mean": 0.6 + 0.01 * _noise(seed, variant)}

    frame = C.claims_table({C.MOE: _records(C.MOE, backwards)})
    assert _row(frame, "Our Table 1 ranks the variants like the paper's (Avg PPL)")["verdict"] == C.FAILS
    assert _row(frame, "The G1 gate score is sparse (mean below 0.25)")["verdict"] == C.FAILS


@pytest.mark.parametrize("claim", C.CLAIMS, ids=lambda c: c.claim[:40])
def test_every_claim_without_its_sweep_is_marked_not_run(claim):
    assert C.evaluate_claim(claim, None)["verdict"] == C.NOT_RUN


def test_every_kind_has_a_check_and_every_paper_table_is_registered():
    import typing

    from gatelab.paper import SWEEP_TABLES

    assert set(C.CHECKS) == set(typing.get_args(C.Kind))
    for claim in C.CLAIMS:
        assert claim.paper_table is None or claim.paper_table in SWEEP_TABLES, claim.claim


def test_a_missing_paper_file_is_a_note_under_the_main_table(tmp_path, monkeypatch):
    from gatelab.report.tables import build_comparison

    records = _records(C.CORE, lambda v, s, seed: {"ppl/avg": 100.0 + seed + (v == "baseline")})
    assert not any("missing" in note for note in build_comparison(records, "table1").notes)
    monkeypatch.setenv("GATELAB_PAPER_DIR", str(tmp_path))
    result = build_comparison(records, "table1")
    assert (result.frame["paper Avg PPL"] == "").all()
    assert any("paper_table1_moe.csv is missing" in note for note in result.notes)
