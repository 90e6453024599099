"""Two reports beyond the paper's tables (issue 17): how each variant's gap to the baseline moves as the models train
(`sweeps/repro-trained.yaml`), and final loss against the learning rate (`sweeps/repro-lr-sensitivity.yaml`, the way
Wortsman et al. 2023, arXiv 2309.14322, test small-scale instability).

Each is produced only where the sweep can answer it (val/loss logged at >= 3 steps; `train.lr` swept over >= 3 rates).
Everything is ordered, so a report made again from the same store is byte-identical.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd
import yaml
from scipy import stats

from gatelab.metrics import VAL_LOSS
from gatelab.report.export import ReportTable
from gatelab.report.plots import plot_gap_to_baseline, plot_loss_vs_lr
from gatelab.report.stats import lr_sensitivity
from gatelab.report.tables import RunRecord

LR_KEY = "train.lr"
MIN_HISTORY_POINTS = 3  # fewer logged steps than this draw no curve worth calling a trend
MIN_RATES = 3  # fewer rates than this are not a sweep of the learning rate
MAX_STEP_COLUMNS = 8
CONFIDENCE = 0.95

GAP_RULE = ("Trend rule, on each step's 95% t-interval of the paired gap over seeds: 'no gap' when the interval "
            "contains 0 at every logged step; 'vanishes' when it excludes 0 at some step but contains 0 at the last, "
            "where |last| < 0.5 |peak| ('unresolved' where the last step's gap is larger, yet its interval contains "
            "0); 'reverses' when at the last step it excludes 0 on the other side from the peak (the step with the "
            "largest |mean gap|); 'shrinks' when |last| < 0.5 |peak|; 'grows' when the last step is the peak and "
            "|last| > 1.5 |first|; else 'holds'. One seed gives no interval: 'one seed, not judged'.")


class MetricHistories(Protocol):
    """What these reports need of a RunStore (a fake in tests)."""

    def metric_history(self, run_id: str, name: str) -> tuple[Sequence[int], Sequence[float]]: ...


def _settings_text(settings: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(settings.items()))


def t_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """The two-sided t-interval of the mean of `values`; None for fewer than two values (no spread to scale by)."""
    if len(values) < 2:
        return None
    if np.ptp(values) == 0:  # scipy's interval is NaN without spread; the mean is then known exactly
        return float(values[0]), float(values[0])
    low, high = stats.ttest_1samp(values, 0.0).confidence_interval(confidence)  # as claims.py's level rows
    return float(low), float(high)


# -- the gap to the baseline against the training step --------------------------------------------------------------

@dataclass(frozen=True)
class GapPoint:
    """The paired-by-seed val/loss difference (variant minus baseline, nats) at one logged step."""

    step: int
    differences: tuple[float, ...]  # one per paired seed, in seed order

    @property
    def n(self) -> int:
        return len(self.differences)

    @property
    def mean(self) -> float:
        return float(np.mean(self.differences))

    @property
    def sd(self) -> float | None:
        return float(np.std(self.differences, ddof=1)) if self.n > 1 else None

    @property
    def interval(self) -> tuple[float, float] | None:
        return t_interval(self.differences)

    def excludes_zero(self) -> bool:
        interval = self.interval
        return interval is not None and (interval[0] > 0.0 or interval[1] < 0.0)


@dataclass(frozen=True)
class GapCurve:
    group: str  # the variant plus any other swept keys
    points: list[GapPoint]  # in step order

    @property
    def trend(self) -> str:
        return gap_trend(self.points)


def gap_trend(points: Sequence[GapPoint]) -> str:
    """Whether a gap grows, holds, shrinks, vanishes or reverses as the models train: GAP_RULE, in code."""
    if not points or points[-1].n < 2:
        return "one seed, not judged"
    if not any(point.excludes_zero() for point in points):
        return "no gap"
    first, last = points[0], points[-1]
    peak = max(points, key=lambda point: abs(point.mean))  # the earliest of equal peaks
    if not last.excludes_zero():
        # Too few seeds can leave a gap as large as its peak within noise: that is not a gap that went away.
        return "vanishes" if abs(last.mean) < 0.5 * abs(peak.mean) else "unresolved"
    if (last.mean > 0.0) != (peak.mean > 0.0):
        return "reverses"
    if abs(last.mean) < 0.5 * abs(peak.mean):
        return "shrinks"
    if abs(last.mean) >= abs(peak.mean) and abs(last.mean) > 1.5 * abs(first.mean):
        return "grows"
    return "holds"


def val_loss_histories(records: Sequence[RunRecord], store: MetricHistories) -> dict[tuple[str, int], dict[int, float]]:
    """(group, seed) -> {step: val/loss} of each finished run whose config logs val/loss during training.

    Finished runs only: a diverged run's curve stops at its divergence, and pairing the steps before it with the
    baseline would make the later steps an average over the runs that survived."""
    histories = {}
    for record in records:
        if record.status != "finished" or record.run_id is None or not record.spec.experiment.eval.every_n_steps:
            continue
        steps, values = store.metric_history(record.run_id, VAL_LOSS)
        points = {int(s): float(v) for s, v in zip(steps, values) if math.isfinite(float(v))}
        if points:
            histories[(record.group, record.spec.experiment.seed)] = points
    return histories


def gap_curves(records: Sequence[RunRecord], store: MetricHistories) -> list[GapCurve]:
    """Per non-baseline group, at each step where both it and the baseline of the same settings logged val/loss, the
    differences over the seeds both have (runs of one seed share data order and initialisation). Only groups with at
    least MIN_HISTORY_POINTS such steps; empty where the sweep logs no val/loss history."""
    histories = val_loss_histories(records, store)
    if not histories:
        return []
    curves = []
    for group, members in _groups(records).items():
        if members[0].spec.experiment.variant == "baseline":
            continue
        baseline_group = members[0].baseline_group
        seeds = sorted({r.spec.experiment.seed for r in members}, key=repr)
        paired = [(histories[(group, s)], histories[(baseline_group, s)]) for s in seeds
                  if (group, s) in histories and (baseline_group, s) in histories]
        steps = sorted({step for ours, base in paired for step in ours if step in base})
        points = [GapPoint(step, tuple(ours[step] - base[step] for ours, base in paired
                                       if step in ours and step in base)) for step in steps]
        if len(points) >= MIN_HISTORY_POINTS:
            curves.append(GapCurve(group, points))
    return curves


def shown_steps(steps: Sequence[int], at_most: int = MAX_STEP_COLUMNS) -> list[int]:
    """Every step if there are at most `at_most`, else `at_most` evenly spaced ones, the first and the last included."""
    steps = sorted(steps)
    if len(steps) <= at_most:
        return steps
    return [steps[i] for i in sorted({int(round(i)) for i in np.linspace(0, len(steps) - 1, at_most)})]


def _gap_cell(point: GapPoint | None, seeds: int) -> str:
    if point is None:
        return ""
    text = f"{point.mean:+.3f}" + (f" ± {point.sd:.3f}" if point.sd is not None else "")
    return text + (f" ({point.n})" if point.n != seeds else "")


def _gap_sentence(curve: GapCurve) -> str:
    first, last = curve.points[0], curve.points[-1]
    peak = max(curve.points, key=lambda point: abs(point.mean))
    interval = last.interval
    ci = f" (95% CI {interval[0]:+.3f} to {interval[1]:+.3f})" if interval is not None else ""
    return (f"{curve.group}: the gap is {first.mean:+.3f} nats at step {first.step}, peaks at {peak.mean:+.3f} at step "
            f"{peak.step} and is {last.mean:+.3f}{ci} at step {last.step} over {last.n} seeds: {curve.trend}.")


def gap_table(curves: Sequence[GapCurve], records: Sequence[RunRecord], sweep_name: str) -> ReportTable:
    """One row per group: the gap at up to MAX_STEP_COLUMNS steps (mean ± sd over paired seeds, nats), the last
    step's 95% t-interval and the trend; the notes give the rule and a sentence per group."""
    steps = shown_steps(sorted({point.step for curve in curves for point in curve.points}))
    lines = []
    for curve in curves:
        by_step = {point.step: point for point in curve.points}
        seeds = max(point.n for point in curve.points)
        line: dict[str, str] = {"variant": curve.group, "seeds": str(seeds)}
        for step in steps:
            line[f"step {step}"] = _gap_cell(by_step.get(step), seeds)
        interval = curve.points[-1].interval
        line["last step 95% CI"] = f"{interval[0]:+.3f} to {interval[1]:+.3f}" if interval is not None else "n/a"
        line["trend"] = curve.trend
        lines.append(line)
    notes = [f"val/loss of each variant minus the baseline of the same seed and settings, in nats (negative: the "
             f"variant is ahead), as mean ± sd over the paired seeds; '(n)' where fewer seeds pair at a step. "
             f"{len(steps)} of the logged steps are shown; the plot has them all.", GAP_RULE]
    notes += [_gap_sentence(curve) for curve in curves]
    notes += _baseline_notes(records, curves)
    unfinished = sorted({r.status for r in records if r.status != "finished"})
    if unfinished:
        count = sum(r.status != "finished" for r in records)
        notes.append(f"{count} run{'s' if count != 1 else ''} left out, not finished ({', '.join(unfinished)}).")
    return ReportTable(f"{sweep_name}: val/loss gap to baseline by training step", pd.DataFrame(lines), notes,
                       key="gap")


def _baseline_notes(records: Sequence[RunRecord], curves: Sequence[GapCurve]) -> list[str]:
    """Each compared baseline's own final val/loss, the scale the gaps are read against."""
    notes = []
    for group in dict.fromkeys(r.baseline_group for c in curves for r in records if r.group == c.group):
        finals = [r.metrics[VAL_LOSS] for r in records
                  if r.group == group and r.status == "finished" and VAL_LOSS in r.metrics]
        if finals:
            sd = f" ± {np.std(finals, ddof=1):.3f}" if len(finals) > 1 else ""
            notes.append(f"{group}: final val/loss {np.mean(finals):.3f}{sd} nats over {len(finals)} seeds.")
    return notes


# -- final loss against the learning rate ---------------------------------------------------------------------------

@dataclass
class RateCell:
    """The runs of one (variant, settings) group at one learning rate."""

    finished: dict[int, float] = field(default_factory=dict)  # seed -> final val/loss
    diverged: list[int] = field(default_factory=list)  # seeds
    other: list[str] = field(default_factory=list)  # statuses of runs neither finished with a val/loss nor diverged

    @property
    def runs(self) -> int:
        return len(self.finished) + len(self.diverged) + len(self.other)

    def final_losses(self, init_loss: float) -> dict[int, float]:
        """Seed -> final loss, a diverged run's at the loss at initialisation (it learned nothing it kept)."""
        return dict(sorted({**self.finished, **{seed: init_loss for seed in self.diverged}}.items()))


@dataclass
class LrRow:
    """One (variant, settings other than the rate) group over the learning-rate grid."""

    group: str
    init_loss: float  # ln(vocab_size): the loss of the uniform prediction an initialised model makes
    cells: dict[float, RateCell]  # rate -> its runs, rates ascending

    @property
    def sensitivity_by_seed(self) -> dict[int, float]:
        """Seed -> LR sensitivity, over the seeds with a final loss (or a divergence) at every rate."""
        if not math.isfinite(self.init_loss):  # no cap, and no value for a diverged run
            return {}
        finals = {rate: cell.final_losses(self.init_loss) for rate, cell in self.cells.items()}
        seeds = sorted(set.intersection(*(set(f) for f in finals.values()))) if finals else []
        return {seed: lr_sensitivity({rate: finals[rate][seed] for rate in self.cells}, self.init_loss)
                for seed in seeds}

    @property
    def best_rate(self) -> float | None:
        """The rate with the lowest mean final loss over its seeds (diverged runs at the loss at init)."""
        means = {rate: np.mean(list(cell.final_losses(self.init_loss).values()))
                 for rate, cell in self.cells.items() if cell.final_losses(self.init_loss)}
        return min(means, key=lambda rate: (means[rate], rate)) if means else None

    @property
    def highest_stable_rate(self) -> float | None:
        """The highest rate at which some seed finished and none diverged."""
        stable = [rate for rate, cell in self.cells.items() if cell.finished and not cell.diverged]
        return max(stable) if stable else None


def swept_rates(records: Sequence[RunRecord]) -> list[float]:
    return sorted({float(r.spec.settings()[LR_KEY]) for r in records if LR_KEY in r.spec.settings()})


def init_loss(record: RunRecord, store: Any = None) -> float:
    """ln(vocab_size) of the run's model: the cross-entropy of a uniform prediction, where training starts. With
    `model.vocab_size: auto` the size is the run's resolved config (its artifact); NaN where that cannot be read."""
    vocab = record.spec.experiment.model.vocab_size
    if vocab == "auto" and store is not None and record.run_id is not None:
        text = store.artifact_text(record.run_id, "config/model_resolved.yaml")
        vocab = (yaml.safe_load(text) or {}).get("vocab_size") if text else None
    return math.log(vocab) if isinstance(vocab, int) and vocab > 1 else math.nan


def lr_rows(records: Sequence[RunRecord], store: Any = None) -> list[LrRow]:
    """One LrRow per (variant, other settings) group, in the sweep's order; empty unless `train.lr` takes at least
    MIN_RATES values. A run's final loss is its final val/loss; a diverged run's is the loss at init."""
    rates = swept_rates(records)
    if len(rates) < MIN_RATES:
        return []
    rows: dict[str, LrRow] = {}
    for record in records:
        settings = {k: v for k, v in record.spec.settings().items() if k != LR_KEY}
        group = f"{record.spec.experiment.variant} {_settings_text(settings)}".strip()
        if group not in rows:
            rows[group] = LrRow(group, init_loss(record, store), {rate: RateCell() for rate in rates})
        cell = rows[group].cells[float(record.spec.settings()[LR_KEY])]
        seed = record.spec.experiment.seed
        final = record.metrics.get(VAL_LOSS)
        if record.status == "diverged":
            cell.diverged.append(seed)
        elif record.status == "finished" and final is not None and math.isfinite(final):
            cell.finished[seed] = float(final)
        else:
            cell.other.append(record.status if record.status != "finished" else "finished without val/loss")
    for row in rows.values():
        for cell in row.cells.values():
            cell.diverged.sort()
            cell.other.sort()
    return list(rows.values())


def _rate_cell(cell: RateCell) -> str:
    parts = []
    if cell.finished:
        values = list(cell.finished.values())
        parts.append(f"{np.mean(values):.3f}" + (f" ± {np.std(values, ddof=1):.3f}" if len(values) > 1 else ""))
    if cell.diverged:
        parts.append(f"diverged {len(cell.diverged)}/{cell.runs}")
    for status in dict.fromkeys(cell.other):
        parts.append(f"{cell.other.count(status)} {status}")
    return "; ".join(parts)


def _rate(rate: float | None) -> str:
    return "n/a" if rate is None else f"{rate:g}"


def lr_table(rows: Sequence[LrRow], sweep_name: str) -> ReportTable:
    """One row per group: final val/loss at each rate (mean ± sd over finished seeds), LR sensitivity (mean ± sd over
    seeds), the best rate and the highest rate at which no seed diverged."""
    rates = sorted({rate for row in rows for rate in row.cells})
    lines = []
    for row in rows:
        line: dict[str, str] = {"variant": row.group}
        for rate in rates:
            line[f"lr {rate:g}"] = _rate_cell(row.cells[rate])
        sensitivity = list(row.sensitivity_by_seed.values())
        if sensitivity:
            sd = f" ± {np.std(sensitivity, ddof=1):.3f}" if len(sensitivity) > 1 else ""
            line["LR sensitivity"] = f"{np.mean(sensitivity):.3f}{sd} ({len(sensitivity)})"
        else:
            line["LR sensitivity"] = "n/a"
        line["best lr"] = _rate(row.best_rate)
        line["highest stable lr"] = _rate(row.highest_stable_rate)
        lines.append(line)
    init = sorted({f"{row.init_loss:.3f}" for row in rows})
    notes = [
        "Cells: final val/loss in nats, mean ± sd over the seeds that finished; 'diverged k/n': k of the rate's n "
        "runs diverged (the run stopped when its loss turned non-finite or exploded).",
        "LR sensitivity (Wortsman et al. 2023, arXiv 2309.14322): per seed, the mean over the rates of min(final "
        "loss, loss at init) minus the lowest final loss, a diverged run's final loss being the loss at init "
        f"(ln vocab_size = {', '.join(init)} nats); then mean ± sd (seeds) over the seeds with a result at every "
        "rate. Lower: the variant's loss depends less on the rate.",
        "best lr: the rate with the lowest mean final loss (diverged runs at the loss at init); highest stable lr: "
        "the highest rate at which some seed finished and none diverged.",
    ]
    cells = [cell for row in rows for cell in row.cells.values()]
    if any(cell.finished for cell in cells) and not any(cell.diverged for cell in cells):
        notes.append("No run diverged at any rate: the grid does not reach the instability the paper's claim is about.")
    return ReportTable(f"{sweep_name}: final val/loss against learning rate", pd.DataFrame(lines), notes,
                       key="lr")


# -- wiring into `gatelab table` -------------------------------------------------------------------------------------

def regime_reports(records: Sequence[RunRecord], store: Any, sweep_name: str, out: Path,
                   colours: Mapping[str, str] | None = None) -> tuple[list[ReportTable], list[Path]]:
    """The tables and plots of whichever of the two reports the sweep can give; ([], []) for neither."""
    tables, plots = [], []
    curves = gap_curves(records, store)
    if curves:
        tables.append(gap_table(curves, records, sweep_name))
        plots.append(plot_gap_to_baseline(
            {c.group: ([p.step for p in c.points], [p.mean for p in c.points],
                       [p.interval[0] if p.interval else math.nan for p in c.points],
                       [p.interval[1] if p.interval else math.nan for p in c.points]) for c in curves},
            out / "gap_to_baseline.png", colours))
    rows = lr_rows(records, store)
    if rows:
        tables.append(lr_table(rows, sweep_name))
        plots.append(plot_loss_vs_lr(
            {row.group: (list(row.cells),
                         [np.mean(list(c.finished.values())) if c.finished else math.nan for c in row.cells.values()],
                         [np.std(list(c.finished.values()), ddof=1) if len(c.finished) > 1 else 0.0
                          for c in row.cells.values()]) for row in rows},
            {row.group: [rate for rate, cell in row.cells.items() for _ in cell.diverged] for row in rows},
            {row.group: row.init_loss for row in rows}, out / "loss_vs_lr.png", colours))
    return tables, plots


def _groups(records: Sequence[RunRecord]) -> dict[str, list[RunRecord]]:
    groups: dict[str, list[RunRecord]] = {}
    for record in records:
        groups.setdefault(record.group, []).append(record)
    return groups
