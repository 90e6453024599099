"""The trained regime's gap-to-baseline curves and the learning-rate sensitivity table, from hand-made runs whose
answers are known (issue 17); no model is trained."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from gatelab.report import regimes as R
from gatelab.report.export import export_report
from gatelab.report.tables import RunRecord
from gatelab.sweep.spec import expand, load_sweep
from tests.helpers import REPO

INIT = math.log(expand(load_sweep(REPO / "sweeps" / "repro-lr-sensitivity.yaml"))[0].experiment.model.vocab_size)
STEPS = list(range(200, 3201, 200))  # repro-trained logs val/loss every 200 of 3,200 steps: 16 points
JITTER = {0: -0.01, 1: 0.0, 2: +0.01}  # a seed's own deviation from its group's gap: sd 0.01 over three seeds


class FakeStore:
    """metric_history and artifact_text of a RunStore, from dicts."""

    def __init__(self, histories: dict[str, tuple[list[int], list[float]]], artifacts: dict | None = None):
        self.histories, self.artifacts = histories, artifacts or {}

    def metric_history(self, run_id: str, name: str) -> tuple[list[int], list[float]]:
        assert name == R.VAL_LOSS
        return self.histories.get(run_id, ([], []))

    def artifact_text(self, run_id: str, path: str) -> str | None:
        return self.artifacts.get((run_id, path))


def _records(sweep: str, status=lambda spec: "finished", metrics=lambda spec: {}) -> list[RunRecord]:
    return [RunRecord(spec, status(spec), f"run-{spec.index}", metrics(spec), ended="2026-01-01 00:00:00 UTC")
            for spec in expand(load_sweep(REPO / "sweeps" / f"{sweep}.yaml"))]


# The gap (variant minus baseline, nats) of each repro-trained variant at step index i of 16, before seed jitter.
GAPS = {
    "g1_elem_sig": lambda i: -0.2,  # the same at every step: holds
    "g1_head_sig": lambda i: -0.3 * (15 - i) / 15,  # closes to exactly 0 at the last step: vanishes
    "g2_elem_sig": lambda i: -0.05 - 0.25 * i / 15,  # -0.05 -> -0.30: grows
    "g5_elem_sig": lambda i: -0.4 + 0.3 * i / 15,  # -0.40 -> -0.10: shrinks
    "g1_elem_silu": lambda i: +0.2 - 0.3 * i / 15,  # +0.20 -> -0.10: reverses
}


def _trained(status=lambda spec: "finished") -> tuple[list[RunRecord], FakeStore]:
    records = _records("repro-trained", status)
    histories = {}
    for record in records:
        variant, seed = record.spec.experiment.variant, record.spec.experiment.seed
        baseline = [6.0 - 0.5 * i / 15 + 0.1 * seed for i in range(len(STEPS))]  # seeds differ more than gaps do
        if variant == "baseline":
            losses = baseline
        elif variant in GAPS:
            losses = [b + GAPS[variant](i) + JITTER[seed] for i, b in enumerate(baseline)]
        else:  # the controls: as good as the baseline, give or take the seed's jitter
            losses = [b + JITTER[seed] for b in baseline]
        histories[record.run_id] = (STEPS, losses)
        record.metrics[R.VAL_LOSS] = losses[-1]  # the final val/loss, as MLflow's latest value of the metric
    return records, FakeStore(histories)


def test_gap_curves_pair_by_seed_and_name_each_trend():
    records, store = _trained()
    curves = {c.group: c for c in R.gap_curves(records, store)}
    assert "baseline" not in curves and len(curves) == 8
    assert {g: curves[g].trend for g in GAPS} == {"g1_elem_sig": "holds", "g1_head_sig": "vanishes",
                                                  "g2_elem_sig": "grows", "g5_elem_sig": "shrinks",
                                                  "g1_elem_silu": "reverses"}
    assert curves["ctrl_scale_0p5"].trend == "no gap"
    first = curves["g1_elem_sig"].points[0]
    assert first.step == 200 and first.n == 3
    assert first.mean == pytest.approx(-0.2) and first.sd == pytest.approx(0.01)
    low, high = first.interval  # t(0.975, 2) = 4.303: half-width 4.303 * 0.01 / sqrt(3) = 0.02484
    assert (low, high) == pytest.approx((-0.22484, -0.17516), abs=1e-5)


def test_gap_table_shows_eight_steps_and_a_sentence_per_group():
    records, store = _trained()
    table = R.gap_table(R.gap_curves(records, store), records, "repro-trained")
    frame = table.frame.set_index("variant")
    assert [c for c in frame.columns if c.startswith("step ")] == \
        [f"step {s}" for s in (200, 600, 1000, 1400, 2000, 2400, 2800, 3200)]
    assert frame.loc["g1_elem_sig", "step 200"] == "-0.200 ± 0.010"
    assert frame.loc["g1_elem_sig", "seeds"] == "3"
    assert frame.loc["g1_head_sig", "step 3200"] == "+0.000 ± 0.010"
    assert frame.loc["g1_head_sig", "trend"] == "vanishes"
    assert frame.loc["g1_elem_sig", "last step 95% CI"] == "-0.225 to -0.175"
    assert R.GAP_RULE in table.notes
    assert any(n.startswith("g5_elem_sig: the gap is -0.400 nats at step 200, peaks at -0.400 at step 200 and is "
                            "-0.100") and n.endswith("over 3 seeds: shrinks.") for n in table.notes)
    assert "baseline: final val/loss 5.600 ± 0.100 nats over 3 seeds." in table.notes


def test_an_unfinished_run_leaves_its_seed_out_of_the_pairs():
    records, store = _trained(lambda spec: "diverged" if spec.experiment.variant == "g1_elem_sig"
                              and spec.experiment.seed == 2 else "finished")
    curve = next(c for c in R.gap_curves(records, store) if c.group == "g1_elem_sig")
    assert {p.n for p in curve.points} == {2}
    assert curve.points[0].mean == pytest.approx(-0.205)  # seeds 0 and 1: -0.21 and -0.20
    table = R.gap_table([curve], records, "repro-trained")
    assert table.frame.loc[0, "seeds"] == "2" and table.frame.loc[0, "step 200"] == "-0.205 ± 0.007"
    assert "1 run left out, not finished (diverged)." in table.notes


def test_no_gap_report_without_three_logged_points_or_a_baseline():
    records, store = _trained()
    short = FakeStore({run: (steps[-2:], losses[-2:]) for run, (steps, losses) in store.histories.items()})
    assert R.gap_curves(records, short) == []
    no_baseline = [r for r in records if r.spec.experiment.variant != "baseline"]
    assert R.gap_curves(no_baseline, store) == []


@pytest.mark.parametrize("count, shown", [(3, [0, 1, 2]), (8, list(range(8))), (16, [0, 2, 4, 6, 9, 11, 13, 15])])
def test_shown_steps_keep_first_and_last(count, shown):
    assert R.shown_steps(list(range(count))) == shown


# Final val/loss of repro-lr-sensitivity runs by (variant, qk_norm) at rates 1e-3 .. 3.2e-2; seed 1 adds 0.1.
BASE_CURVE = [5.0, 4.6, 4.4, 4.5, 4.9, 6.0]
RATES = [1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2]


def _lr_status(spec) -> str:
    variant, qk_norm, lr, seed = (spec.experiment.variant, spec.settings()["model.qk_norm"],
                                  spec.settings()["train.lr"], spec.experiment.seed)
    if variant == "baseline" and not qk_norm and lr == 3.2e-2 and seed == 1:
        return "diverged"
    if variant == "g1_elem_sig" and not qk_norm and lr >= 1.6e-2:
        return "diverged"
    if variant == "g1_elem_sig" and qk_norm and lr == 1e-3 and seed == 1:
        return "missing"
    return "finished"


def _lr_metrics(spec) -> dict:
    lr, seed = spec.settings()["train.lr"], spec.experiment.seed
    loss = BASE_CURVE[RATES.index(lr)] + 0.1 * seed
    if spec.experiment.variant == "baseline" and not spec.settings()["model.qk_norm"] and lr == 3.2e-2:
        loss = 8.0  # finished above the loss at init: counted at the loss at init
    return {R.VAL_LOSS: loss}


def _lr_rows() -> dict[str, R.LrRow]:
    return {row.group: row for row in R.lr_rows(_records("repro-lr-sensitivity", _lr_status, _lr_metrics))}


def test_lr_sensitivity_matches_the_hand_computed_figures():
    rows = _lr_rows()
    assert list(rows) == ["baseline model.qk_norm=True", "baseline model.qk_norm=False",
                          "g1_elem_sig model.qk_norm=True", "g1_elem_sig model.qk_norm=False"]
    clean = rows["baseline model.qk_norm=True"]
    assert clean.init_loss == pytest.approx(INIT)
    # seed 0: mean(5.0, 4.6, 4.4, 4.5, 4.9, 6.0) - 4.4 = 4.9 - 4.4; seed 1: 5.0 - 4.5
    assert clean.sensitivity_by_seed == pytest.approx({0: 0.5, 1: 0.5})
    assert clean.best_rate == 4e-3 and clean.highest_stable_rate == 3.2e-2
    unstable = rows["baseline model.qk_norm=False"]
    # seed 0 finished at 8.0 > the loss at init at the top rate, seed 1 diverged there: both count as that loss
    assert unstable.sensitivity_by_seed == pytest.approx({0: (23.4 + INIT) / 6 - 4.4, 1: (23.9 + INIT) / 6 - 4.5})
    assert unstable.highest_stable_rate == 1.6e-2  # the diverged seed at the top rate lowers it
    diverging = rows["g1_elem_sig model.qk_norm=False"]
    assert diverging.highest_stable_rate == 8e-3
    assert diverging.sensitivity_by_seed == pytest.approx({0: (18.5 + 2 * INIT) / 6 - 4.4,
                                                           1: (18.9 + 2 * INIT) / 6 - 4.5})
    # a missing run leaves its seed out of the sensitivity, never counted as anything
    assert rows["g1_elem_sig model.qk_norm=True"].sensitivity_by_seed == pytest.approx({0: 0.5})


def test_lr_table_cells_show_divergence_and_missing_runs():
    table = R.lr_table(list(_lr_rows().values()), "repro-lr-sensitivity")
    frame = table.frame.set_index("variant")
    assert [c for c in frame.columns if c.startswith("lr ")] == [f"lr {r:g}" for r in RATES]
    assert frame.loc["baseline model.qk_norm=True", "lr 0.004"] == "4.450 ± 0.071"
    assert frame.loc["baseline model.qk_norm=True", "LR sensitivity"] == "0.500 ± 0.000 (2)"
    assert frame.loc["baseline model.qk_norm=False", "lr 0.032"] == "8.000; diverged 1/2"
    assert frame.loc["baseline model.qk_norm=False", "highest stable lr"] == "0.016"
    assert frame.loc["g1_elem_sig model.qk_norm=False", "lr 0.016"] == "diverged 2/2"
    assert frame.loc["g1_elem_sig model.qk_norm=False", "highest stable lr"] == "0.008"
    assert frame.loc["g1_elem_sig model.qk_norm=True", "lr 0.001"] == "5.000; 1 missing"
    assert frame.loc["g1_elem_sig model.qk_norm=True", "LR sensitivity"] == "0.500 (1)"
    assert frame.loc["g1_elem_sig model.qk_norm=True", "best lr"] == "0.004"
    assert not any("No run diverged" in note for note in table.notes)
    stable = R.lr_rows(_records("repro-lr-sensitivity", metrics=_lr_metrics))
    assert "No run diverged at any rate" in R.lr_table(stable, "repro-lr-sensitivity").notes[-1]


def test_lr_report_needs_three_rates_and_reads_an_auto_vocabulary_from_the_run():
    assert R.lr_rows(_records("repro-trained")) == []  # one rate: no learning-rate sweep
    spec = SimpleNamespace(experiment=SimpleNamespace(model=SimpleNamespace(vocab_size="auto")))
    record = RunRecord(spec, "finished", "run-auto")
    store = FakeStore({}, {("run-auto", "config/model_resolved.yaml"): "vocab_size: 1024\nd_model: 64\n"})
    assert R.init_loss(record, store) == pytest.approx(math.log(1024))
    assert math.isnan(R.init_loss(record, FakeStore({})))


def test_both_plots_are_pngs_and_the_report_is_remade_byte_for_byte(tmp_path):
    trained, store = _trained()
    lr_records = _records("repro-lr-sensitivity", _lr_status, _lr_metrics)
    made = []
    for attempt in ("first", "again"):
        out = tmp_path / attempt
        tables, plots = R.regime_reports(trained, store, "repro-trained", out)
        lr_tables, lr_plots = R.regime_reports(lr_records, FakeStore({}), "repro-lr-sensitivity", out)
        assert [p.name for p in plots + lr_plots] == ["gap_to_baseline.png", "loss_vs_lr.png"]
        assert len(tables) == 1 and len(lr_tables) == 1
        for plot in plots + lr_plots:
            header = plot.read_bytes()[:24]
            assert header[:8] == b"\x89PNG\r\n\x1a\n"
            assert (int.from_bytes(header[16:20], "big"), int.from_bytes(header[20:24], "big")) == (960, 600)
        written = export_report(tables + lr_tables, plots + lr_plots, out, ["md", "csv", "latex", "html"], "regimes",
                                stamp="from 75 ended runs")
        made.append({p.relative_to(out).as_posix(): p.read_bytes() for p in out.iterdir()})
        latex = next(p for p in written if p.suffix == ".tex").read_text()
        assert "±" not in latex and r"$\pm$" in latex  # every symbol the tables use is spelled for pdflatex
    assert made[0] == made[1]
    assert len([name for name in made[0] if name.endswith(".csv")]) == 2


def test_a_gap_as_large_as_its_peak_but_within_noise_at_the_last_step_is_unresolved_not_vanished():
    """repro-trained's SiLU control: +0.10 nats behind at every step after the first, but 3 seeds spread so that the
    last step's interval reaches 0. Small and within noise is 'vanishes'; as large as its peak is not."""
    settled = R.GapPoint(200, (0.099, 0.100, 0.101))  # tight: excludes 0
    noisy_as_large = R.GapPoint(1800, (0.06, 0.10, 0.15))  # mean 0.103, sd 0.045: interval contains 0
    noisy_small = R.GapPoint(1800, (-0.03, 0.01, 0.05))
    assert noisy_as_large.excludes_zero() is False and noisy_small.excludes_zero() is False
    assert R.gap_trend([settled, noisy_as_large]) == "unresolved"
    assert R.gap_trend([settled, noisy_small]) == "vanishes"
