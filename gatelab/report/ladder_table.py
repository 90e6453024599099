"""A ladder sweep's arms against the baseline's fitted law (`gatelab table`, issue 44): one row per variant with its
compute multiplier at the largest rung (gatelab.report.ladder.fit_ladder), its wall-clock multiplier (that times the
tokens-a-second ratio at the largest rung) and the law's alpha, and the plot of every arm's ladder.

A sweep is a ladder sweep where its runs carry a `rung` setting (gatelab.sweep.ladder). An arm is a variant with its
settings other than rung; its baseline is the baseline arm of the same settings. A rung's compute is a run's training
FLOPs as `gatelab sweep plan` counts them (each arm its own: a gate's parameters cost it FLOPs), its loss ln of the
table's perplexity metric (ppl/avg), the cross-entropy in nats.

A multiplier is a statement of size, so the claims table's regime rule (gatelab.report.claims_rules) decides whether
it is read: each baseline arm's regime is its G1 arm (g1_elem_sig, the paper's Table 2 row) against it at the largest
rung, over the paper's mean dense G1 effect, as a claims file's `regime_reference` row on the sweep would give it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from gatelab.paper import DENSE_G1_PAIRS, DENSE_G1_TABLE
from gatelab.paper import DENSE_G1_VARIANT as REFERENCE_VARIANT
from gatelab.report.budgets import BUDGET_FIX, not_comparable
from gatelab.report.claims_evidence import paper_figure
from gatelab.report.claims_file import Claim, PaperFigure, architecture, group_name
from gatelab.report.claims_rules import COMMENSURATE, NOT_TESTABLE, Regime, regime
from gatelab.report.export import ReportTable
from gatelab.report.ladder import LadderFit, fit_ladder, wall_clock_multiplier
from gatelab.report.plots import plot_ladder
from gatelab.report.step_cost import NOT_COMPARABLE, step_cost
from gatelab.report.tables import PPL, RunRecord
from gatelab.sweep.ladder import RUNG

UNIT = "FLOPs"
MULTIPLIER = "compute multiplier [95%]"
WALL_CLOCK = "wall-clock multiplier"
REGIME, SIZE_READ = "regime", "size read"
LADDER_COLUMNS = ("variant", "rungs", "largest rung", MULTIPLIER, WALL_CLOCK, REGIME, SIZE_READ, "alpha",
                  "alpha source")
PLOT_NAME = "ladder.png"


def is_ladder(records: Sequence[RunRecord]) -> bool:
    return any(RUNG in record.spec.settings() for record in records)


def _arm_settings(record: RunRecord) -> dict:
    return {key: value for key, value in record.spec.settings().items() if key != RUNG}


def arm_name(record: RunRecord, variant: str | None = None) -> str:
    """The arm's name: the variant (or `variant`) and its settings other than rung."""
    return group_name(variant or record.spec.experiment.variant, _arm_settings(record))


def ladder_points(records: Sequence[RunRecord], metric: str = PPL) -> tuple[dict, dict]:
    """({arm: {rung compute: [each finished seed's ln(metric)]}}, {arm: {rung compute: rung name}}), arms in the
    sweep's order."""
    from gatelab.sweep.flops import run_training_flops  # torch: only for a ladder sweep's report

    points: dict[str, dict[float, list[float]]] = {}
    rungs: dict[str, dict[float, str]] = {}
    for record in records:
        compute = run_training_flops(record.spec.experiment)
        rungs.setdefault(arm_name(record), {})[compute] = record.spec.settings()[RUNG]
        arm = points.setdefault(arm_name(record), {})
        value = record.metrics.get(metric)
        if record.status == "finished" and value is not None and math.isfinite(value) and value > 0:
            arm.setdefault(compute, []).append(math.log(value))
    return points, rungs


def multiplier_cell(fit: LadderFit) -> str:
    if not fit.testable:
        return f"not testable: {fit.why_not}"
    low, high = fit.interval
    return f"{fit.multiplier:.3f} [{low:.3f}, {high:.3f}]"


def _wall_clock_cell(fit: LadderFit, variant: list[RunRecord], baseline: list[RunRecord]) -> str:
    """The compute multiplier times 1 / the step-time ratio at the largest rung (equal tokens a step in a rung)."""
    if not fit.testable:
        return "n/a: the compute multiplier is not testable"
    cost = step_cost(variant, baseline)
    if cost.ratio is None:
        return f"{NOT_COMPARABLE}: {cost.why_not}"
    if not math.isfinite(cost.ratio.ratio):
        return f"{NOT_COMPARABLE}: {cost.ratio.reason}"
    step_interval = cost.ratio.interval
    wall = wall_clock_multiplier(fit.multiplier, 1 / cost.ratio.ratio, fit.interval,
                                 None if step_interval is None else (1 / step_interval[1], 1 / step_interval[0]))
    if wall.interval is None:
        return f"{wall.multiplier:.3f} (no interval: {cost.ratio.reason})"
    return f"{wall.multiplier:.3f} [{wall.interval[0]:.3f}, {wall.interval[1]:.3f}]"


@dataclass(frozen=True)
class LadderArm:
    """A variant arm's fit against the baseline arm of its settings, and the rung its multiplier is read at."""

    arm: str
    variant: str
    baseline: str
    fit: LadderFit
    largest_rung: str  # '' where the arm has no finished rung


def reference_regime(records: Sequence[RunRecord], baseline: str, rung: str, sweep_name: str) -> Regime:
    """The regime the `baseline` arm's G1 arm sets: G1 against it at `rung` (the largest), its relative ppl/avg change
    over the paper's mean dense G1 effect (`claims_rules.regime`, with the Table 2 pairs of the claims rows)."""
    settings = next(_arm_settings(r) for r in records if arm_name(r) == baseline)
    reference = group_name(REFERENCE_VARIANT, settings)
    if not any(arm_name(r) == reference for r in records):
        return Regime(None, f"no reference: the sweep has no {reference} arm (G1, the paper's Table 2 row) beside "
                            f"{baseline}, so no size can be compared with the paper's")
    at_rung = {**settings, RUNG: rung}
    claim = Claim(claim=f"{REFERENCE_VARIANT} against baseline at the largest rung, {rung}", sweep=sweep_name,
                  kind="direction", direction="lower", a=group_name(REFERENCE_VARIANT, at_rung),
                  b=group_name("baseline", at_rung), regime_reference=True,
                  paper=PaperFigure(table=DENSE_G1_TABLE, pairs=list(DENSE_G1_PAIRS)))
    effect = paper_figure(claim)[1]
    models = {architecture(r.spec.experiment.model) for r in records}
    return regime(claim, records, effect if effect is not None and {effect.model} == models else None)


def _size_cell(fit: LadderFit, reference: Regime) -> str:
    if not fit.testable:
        return "n/a: no multiplier to read"
    return f"may be read: {reference.text}" if reference.commensurate else f"{NOT_TESTABLE}: {reference.text}"


def ladder_rows(records: Sequence[RunRecord], metric: str = PPL,
                sweep_name: str = "the sweep") -> tuple[pd.DataFrame, dict, dict[str, LadderArm]]:
    """The ladder table's frame, the points by arm and each variant arm's fit."""
    points, rung_names = ladder_points(records, metric)
    members: dict[tuple[str, str], list[RunRecord]] = {}
    for record in records:
        members.setdefault((arm_name(record), record.spec.settings()[RUNG]), []).append(record)
    baselines = {arm_name(record): arm_name(record, "baseline") for record in records}
    variants = {arm_name(record): record.spec.experiment.variant for record in records}
    regimes = {baseline: reference_regime(records, baseline, rung_names[baseline][max(rung_names[baseline])],
                                          sweep_name) for baseline in set(baselines.values()) if baseline in rung_names}
    lines, arms = [], {}
    for arm, baseline in baselines.items():
        if arm == baseline:
            continue
        apart = not_comparable(r for (name, _), runs in members.items() if name in (arm, baseline) for r in runs)
        if apart is not None:  # the law is fitted on every rung of both arms: all of them on one budget
            lines.append({"variant": arm, "rungs": "", "largest rung": "", MULTIPLIER: apart, WALL_CLOCK: "n/a",
                          "alpha": "", "alpha source": ""})
            continue
        fit = fit_ladder(points.get(baseline, {}), points.get(arm, {}), unit=UNIT)
        fitted = math.isfinite(fit.alpha)
        reference = regimes.get(baseline, Regime(None, f"the sweep has no runs of {baseline}"))
        largest = rung_names[arm].get(fit.largest_compute, "")
        arms[arm] = LadderArm(arm, variants[arm], baseline, fit, largest)
        used = [rung_names[arm][compute] for compute in sorted(points.get(arm, {}))]
        lines.append({
            "variant": arm, "rungs": f"{len(used)} ({', '.join(used)})" if used else "0",
            "largest rung": f"{largest} ({fit.largest_compute:.3g} {UNIT})" if largest else "",
            MULTIPLIER: multiplier_cell(fit),
            WALL_CLOCK: _wall_clock_cell(fit, members.get((arm, largest), []), members.get((baseline, largest), [])),
            REGIME: reference.cell(), SIZE_READ: _size_cell(fit, reference),
            "alpha": f"{fit.alpha:.3f}" if fitted else "", "alpha source": fit.alpha_source if fitted else ""})
    return pd.DataFrame(lines, columns=list(LADDER_COLUMNS)), points, arms


def ladder_notes(metric: str = PPL) -> list[str]:
    return [
        f"{MULTIPLIER}: the baseline's compute that reaches the variant's loss, over the variant's compute, read off "
        "the baseline's law L(C) = L_inf + A C^-alpha (each arm its own A, L_inf and alpha the baseline's), so the "
        "same at every rung; shown at the largest rung. Above 1 the variant reaches the baseline's loss with less "
        f"compute. Loss: ln({metric}), each seed's cross-entropy in nats; compute: each run's training {UNIT} as "
        "`gatelab sweep plan` counts them. In brackets the seed bootstrap's 95% interval.",
        "Identifiability: the baseline fits one parameter fewer than it has rungs. 4 rungs or more fit L_inf, alpha "
        "and A; 3 rungs fix alpha to Chinchilla's and fit L_inf and A; fewer, or a baseline whose mean loss does not "
        "fall from rung to rung, is not testable (the cell says why). Each variant needs 3 rungs, and a bootstrap 2 "
        "seeds a rung.",
        f"{WALL_CLOCK}: the compute multiplier times the variant's tokens a second over the baseline's at the largest "
        "rung (1 over that rung's step-time ratio; every variant of a rung trains the same tokens a step), where both "
        "arms' step times compare.",
        "A multiplier is a statement of size: the claims table's regime rule (gatelab.report.claims_rules) reads "
        f"sizes only where the sweep's G1 effect is within {COMMENSURATE:g}x of the paper's, either way, and this "
        f"table applies it to both multipliers of a row. Column {REGIME}: {REFERENCE_VARIANT} (G1, the paper's Table 2 "
        "row) against the row's baseline at the largest rung, its relative ppl/avg change (mean over the shared "
        "seeds) over the mean of the paper's dense G1 effects (Table 2's four blocks, the pairs of the claims rows); "
        f"column {SIZE_READ}: \"may be read\" inside [1/{COMMENSURATE:g}, {COMMENSURATE:g}], else \"{NOT_TESTABLE}\" "
        "(the figures are shown, not read as a size), with why; a sweep without a "
        f"{REFERENCE_VARIANT} arm has no reference, and no size is read.",
    ]


def ladder_report(records: Sequence[RunRecord], sweep_name: str, out: Path, colours,
                  metric: str = PPL) -> tuple[list[ReportTable], list[Path], list[LadderArm]]:
    """The ladder table and its plot (the first baseline's arms), as `regime_reports` gives its own, and each variant
    arm's fit; nothing where the sweep has no rungs."""
    if not is_ladder(records):
        return [], [], []
    frame, points, arms = ladder_rows(records, metric, sweep_name)
    baseline = next((arm_name(r, "baseline") for r in records), "baseline")
    drawn = {arm: entry.fit for arm, entry in arms.items() if entry.baseline == baseline}
    path = plot_ladder({arm: points[arm] for arm in [baseline, *drawn] if arm in points}, drawn, out / PLOT_NAME,
                       baseline=baseline, unit=UNIT, colours=colours, loss_label=f"final ln({metric}) (nats)")
    apart = frame.loc[frame[MULTIPLIER].str.startswith(NOT_COMPARABLE), "variant"].tolist()
    notes = ladder_notes(metric) + ([f"{BUDGET_FIX} Not compared here: {', '.join(apart)}."] if apart else [])
    table = ReportTable(f"{sweep_name}: each variant's compute multiplier over the ladder", frame, notes,
                        key="ladder")
    return [table], [path], list(arms.values())
