"""How each kind of claim is tested (`CHECKS`): a direction, a closeness, a level, a change, a rank, a learning-rate
sensitivity, a stable rate, a ladder's multiplier, each turned into a row's figures, its p-value and how its verdict
follows from its q (an `Outcome`). gatelab.report.claims decides when a claim can be tested at all, and the verdicts."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from gatelab.report.claims_evidence import (
    PaperEffect,
    axis_runs,
    by_seed,
    paper_gain,
    row_labels,
    run_value,
    vocab_size,
    with_settings,
)
from gatelab.report.claims_file import (
    Claim,
    parse_group,
    parse_settings,
)
from gatelab.report.claims_ladder import read_multiplier
from gatelab.report.claims_rules import (
    DESCRIPTIVE,
    FAILS,
    HOLDS,
    INCONCLUSIVE,
    NOT_ADDRESSED,
    PAPER_SIZE_EXCLUDED,
    RULE_INTERVAL,
    RULE_LADDER,
    Regime,
    inconclusive,
)
from gatelab.report.stats import (
    compare_shared_seeds,
    lr_sensitivity,
    mean_std,
    rank_agreement,
    rank_agreement_interval,
    shared_seeds,
    tost,
)
from gatelab.report.tables import RunRecord, paper_reference

# The ratio of two groups' mean INIT_SCALE beyond which they start at different scales: the first pass's gains
# tracked it.
INIT_SCALE_RATIO = (0.8, 1.25)
MATCHED, DIFFERS, NOT_LOGGED = "matched", "differs", "not logged"
ALPHA = 0.05
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0  # a fixed numpy Generator seed: the table made twice from one store is the same, byte for byte
COLUMNS = ["section", "claim", "sweep", "comparison", "metric", "paper", "ours", "spread (sd)", "n", "test",
           "r (seeds)", "p", "q", "MDE", "init ratio", "regime", "verdict", "rule", "note"]


# --- formatting -------------------------------------------------------------------------------------------------------


def fmt(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.{digits}g}"


def p_cell(value: float | None) -> str:
    return "" if value is None else fmt(value)


# --- one row ----------------------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """A row's figures before the table's correction: its cells, its p-value (None: not tested), how its verdict
    follows from the row's q-value, and (direction rows) whether its groups start at one init scale."""

    cells: dict[str, str]
    p_value: float | None = None
    decide: Callable[[float | None], str] = lambda q: INCONCLUSIVE
    notes: list[str] = field(default_factory=list)
    scale: str = ""  # two-group rows: MATCHED, DIFFERS or NOT_LOGGED (`_init_scale`)
    init_ratio: float | None = None  # group a's mean init scale over b's
    rule: str | None = None  # set where a rule before the test decided the verdict (a precondition, the regime)
    test_rule: str | None = None  # the rule of the row's own test where no q-value decides it (an interval)
    regime: Regime | None = None  # the sweep's, where the row makes a statement of size


def relative_metric(metric: str) -> bool:
    return metric.startswith("ppl/")


def _excludes(interval: tuple[float, float], effects: Sequence[float], expected: float) -> bool:
    """Whether an interval lies wholly on the far side, from the claimed direction, of every one of the paper's
    effects: our effect is then smaller than the paper's smallest, or the other way."""
    return interval[0] > max(effects) if expected < 0 else interval[1] < min(effects)


def _two_groups(claim: Claim, a: Mapping[int, float], b: Mapping[int, float], paper: PaperEffect | None,
                unit: str = "") -> Outcome:
    """Group a against group b over their shared seeds (`compare_shared_seeds`: paired t), in the claim's direction;
    `paper`: the paper's effect for the sweep's own model (dense or MoE), or None."""
    result = compare_shared_seeds(a, b)
    seeds = shared_seeds(a, b)
    mean_a = float(np.mean([a[s] for s in seeds])) if seeds else math.nan
    mean_b = float(np.mean([b[s] for s in seeds])) if seeds else math.nan
    relative = relative_metric(claim.metric) and claim.kind == "direction" and math.isfinite(mean_b) and mean_b != 0
    factor, unit = (100.0 / abs(mean_b), "%") if relative else (1.0, unit)
    expected = -1.0 if claim.direction == "lower" else 1.0
    interval = result.interval
    shown = "" if interval is None else \
        f"; 95% CI {interval[0] * factor:+.3g}{unit} to {interval[1] * factor:+.3g}{unit}"
    cells = {"ours": f"{fmt(result.delta * factor)}{unit} ({fmt(mean_a, 4)} vs {fmt(mean_b, 4)}){shown}",
             "spread (sd)": f"{fmt(result.sd and result.sd * factor)}{unit}", "n": str(len(seeds)),
             "test": result.test if result.p_value is not None else f"{result.test}: {result.reason or ''}",
             "r (seeds)": fmt(result.correlation, 2),
             "MDE": f"{fmt(result.mde and result.mde * factor)}{unit}" if result.mde else ""}
    effects = paper.effects if paper is not None and relative else ()

    def decide(q: float | None) -> str:
        if q is not None and q < ALPHA:
            return HOLDS if np.sign(result.delta) == expected else f"{FAILS} (significant, the other way)"
        if effects and interval is not None and _excludes((interval[0] / abs(mean_b), interval[1] / abs(mean_b)),
                                                          effects, expected):
            return PAPER_SIZE_EXCLUDED
        return inconclusive(float(np.sign(result.delta)), expected)

    return Outcome(cells, result.p_value, decide)


def _direction_claim(claim: Claim, records: Sequence[RunRecord], paper: PaperEffect | None) -> Outcome:
    """direction: group a lower (higher) than group b."""
    a, b = by_seed(records, claim.a, claim.metric), by_seed(records, claim.b or "", claim.metric)
    return _two_groups(claim, a, b, paper)


def _change_claim(claim: Claim, records: Sequence[RunRecord], paper: PaperEffect | None) -> Outcome:
    """change: per seed, the change of the metric from setting[0] to setting[1], group a against group b."""
    low, high = (parse_settings(s) for s in claim.setting or ())
    change = {}
    for group in (claim.a, claim.b or ""):
        before = by_seed(records, with_settings(group, low), claim.metric)
        after = by_seed(records, with_settings(group, high), claim.metric)
        change[group] = {s: after[s] - before[s] for s in shared_seeds(before, after)}
    return _two_groups(claim, change[claim.a], change[claim.b or ""], None, unit=" nats")


def margin_of(claim: Claim) -> tuple[float, str]:
    """The closeness margin relative to group b's mean, from the paper's gap for the pair or stated, and how it was
    made."""
    margin = claim.margin
    if margin.paper_gain is None:
        return float(margin.relative), f"stated, +-{100 * margin.relative:.3g}% of {claim.b}'s mean: {margin.reason}"
    gain = paper_gain(margin.paper_gain)
    source, labels = row_labels(margin.paper_gain.table)
    a, b = (labels.get(i, i) for i in margin.paper_gain.ids)
    return margin.fraction * abs(gain), (f"{margin.fraction:g} x the paper's own gap for the pair, {source} row {a} "
                                         f"against {b} ({100 * gain:+.2f}%), relative to {claim.b}'s mean")


def positive_control(claim: Claim, records: Sequence[RunRecord], relative_margin: float) -> tuple[bool, str]:
    """Whether a stated margin's positive control (two groups of the sweep) moves the metric by more than the margin,
    significantly (paired t, p < 0.05): else the sweep shows no difference the margin could tell from closeness."""
    a, b = (by_seed(records, group, claim.metric) for group in claim.margin.positive_control)
    seeds = shared_seeds(a, b)
    if len(seeds) < 2:
        return False, "positive control: fewer than two shared seeds"
    mean_b = float(np.mean([b[s] for s in seeds]))
    result = compare_shared_seeds(a, b)
    effect = result.delta / abs(mean_b)
    moved = abs(effect) > relative_margin and result.p_value is not None and result.p_value < ALPHA
    pair = " against ".join(claim.margin.positive_control)
    return moved, (f"positive control {pair}: {100 * effect:+.3g}% (p {fmt(result.p_value)}), "
                   f"{'beyond' if moved else 'not significantly beyond'} the margin +-{100 * relative_margin:.3g}%")


def _closeness_claim(claim: Claim, records: Sequence[RunRecord], paper: PaperEffect | None) -> Outcome:
    """closeness: TOST of a - b within +-margin (the paper's, relative to b's mean), paired by seed."""
    a, b = by_seed(records, claim.a, claim.metric), by_seed(records, claim.b or "", claim.metric)
    seeds = shared_seeds(a, b)
    mean_a = float(np.mean([a[s] for s in seeds])) if seeds else math.nan
    mean_b = float(np.mean([b[s] for s in seeds])) if seeds else math.nan
    relative_margin, made = margin_of(claim)
    margin = relative_margin * abs(mean_b)
    paired = compare_shared_seeds(a, b)
    result = tost([a[s] for s in seeds], [b[s] for s in seeds], margin, paired=True)
    scale, unit = (100.0 / abs(mean_b), "%") if relative_metric(claim.metric) and seeds and mean_b else (1.0, "")
    interval = "" if result.interval is None else \
        f"; 95% CI {result.interval[0] * scale:+.3g}{unit} to {result.interval[1] * scale:+.3g}{unit}"
    cells = {"ours": f"{fmt(result.delta * scale)}{unit} ({fmt(mean_a, 4)} vs {fmt(mean_b, 4)}){interval}; "
                     f"margin +-{fmt(margin * scale)}{unit}",
             "spread (sd)": f"{fmt(paired.sd and paired.sd * scale)}{unit}", "n": str(len(seeds)),
             "test": f"TOST, {result.test}" + ("" if result.p_value is not None else f": {result.reason}"),
             "r (seeds)": fmt(paired.correlation, 2), "MDE": ""}

    def decide(q: float | None) -> str:
        if q is not None and q < ALPHA:
            return HOLDS
        if result.interval is not None and (result.interval[0] > margin or result.interval[1] < -margin):
            return f"{FAILS} (apart by more than the margin)"
        return INCONCLUSIVE

    return Outcome(cells, result.p_value, decide, [f"margin: {made}"])


def _level_claim(claim: Claim, records: Sequence[RunRecord], paper: PaperEffect | None) -> Outcome:
    """level: the mean of group a against the claimed level, one-sample t-test (two-sided)."""
    values = np.array([v for v in by_seed(records, claim.a, claim.metric).values() if math.isfinite(v)])
    mean, sd, n = mean_std(values)
    cells = {"ours": fmt(mean), "spread (sd)": fmt(sd), "n": str(n), "test": "one-sample t", "r (seeds)": "",
             "MDE": ""}
    if n < 2 or sd is None or sd == 0.0:
        cells["test"] = "one-sample t: " + ("fewer than two seeds" if n < 2 else "zero variance")
        return Outcome(cells, None, lambda q: INCONCLUSIVE)
    test = scipy_stats.ttest_1samp(values, claim.level)
    low, high = test.confidence_interval(1 - ALPHA)
    cells["ours"] = f"{mean:.3g} (95% CI {low:.3g} to {high:.3g})"
    claimed_side = mean < claim.level if claim.direction == "lower" else mean > claim.level

    def decide(q: float | None) -> str:
        if q is not None and q < ALPHA:
            return HOLDS if claimed_side else FAILS
        return inconclusive(1.0 if claimed_side else -1.0, 1.0)

    return Outcome(cells, float(test.pvalue), decide)


def rank_ids(claim: Claim) -> list[str]:
    if not claim.only_gated:
        return list(claim.rank_ids)
    from gatelab.variants import VARIANTS

    def gated(group: str) -> bool:
        variant = VARIANTS.get(parse_group(group)[0])
        return variant is not None and any(gate.kind == "gate" for gate in variant.gates)

    return [g for g in claim.rank_ids if gated(g)]


def _rank_claim(claim: Claim, records: Sequence[RunRecord], paper: PaperEffect | None) -> Outcome:
    """rank: Kendall's tau of our group means against the paper's column, with a bootstrap interval over seeds."""
    ids = rank_ids(claim)
    values = {g: by_seed(records, g, claim.metric) for g in ids}
    ours = {parse_group(g)[0]: mean_std(v.values())[0] for g, v in values.items()}
    reference = paper_reference(claim.paper.table)
    column = reference[claim.paper.column] if claim.paper.column in reference.columns else pd.Series(dtype=float)
    paper = {v: float(column[v]) for v in ours if v in column.index and pd.notna(column[v])}
    agreement = rank_agreement({k: v for k, v in ours.items() if math.isfinite(v)}, paper)
    tau, p = agreement["tau"], agreement["p_value"]
    interval = rank_agreement_interval({parse_group(g)[0]: v for g, v in values.items()}, paper,
                                       BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED)
    ci = "" if interval is None else f" (95% bootstrap CI over seeds {interval[0]:+.2f} to {interval[1]:+.2f})"
    cells = {"ours": f"Kendall's tau {fmt(tau)}{ci}", "spread (sd)": "", "n": str(agreement["n"]),
             "test": "Kendall tau" + ("" if p is not None else f": {agreement['reason']}"), "r (seeds)": "",
             "MDE": ""}

    def decide(q: float | None) -> str:
        if q is not None and q < ALPHA and tau is not None:
            return HOLDS if tau > 0 else FAILS
        return INCONCLUSIVE if tau is None else inconclusive(float(np.sign(tau)), 1.0)

    return Outcome(cells, p, decide, [f"{len(ids)} variants: {', '.join(parse_group(g)[0] for g in ids)}"]
                   if claim.only_gated else [])


def _init_loss(runs: Mapping[float, list[RunRecord]]) -> float:
    """ln(vocabulary size): the loss of uniform prediction, which a N(0, 0.02) initialisation gives to ~0.01 nats."""
    vocab = next((vocab_size(r) for rs in runs.values() for r in rs if vocab_size(r)), None)
    return math.log(vocab) if vocab else math.nan


def _sensitivity_by_seed(records: Sequence[RunRecord], group: str, axis: str, metric: str) -> dict[int, float]:
    """{seed: LR sensitivity over the axis} for the seeds that ended at every value of the axis."""
    runs = axis_runs(records, group, axis)
    init_loss = _init_loss(runs)
    losses: dict[int, dict[float, float]] = {}
    for value, members in runs.items():
        for r in members:
            losses.setdefault(r.spec.experiment.seed, {})[value] = run_value(r, metric)
    return {seed: lr_sensitivity(by_value, init_loss) for seed, by_value in sorted(losses.items())
            if len(by_value) == len(runs)}


def _lr_sensitivity_claim(claim: Claim, records: Sequence[RunRecord], paper: PaperEffect | None) -> Outcome:
    """lr sensitivity: per seed, Wortsman et al.'s LR sensitivity over the axis, group a against group b."""
    a = _sensitivity_by_seed(records, claim.a, claim.axis or "", claim.metric)
    b = _sensitivity_by_seed(records, claim.b or "", claim.axis or "", claim.metric)
    outcome = _two_groups(claim, a, b, None, unit=" nats")
    rates = axis_runs(records, claim.a, claim.axis or "")
    outcome.notes.append(f"{len(rates)} values of {claim.axis}: {', '.join(f'{v:g}' for v in rates)}")
    return outcome


def _stable(run: RunRecord, metric: str, init_loss: float) -> bool:
    """A run trained without diverging: not stopped as diverged, and its final loss finite and below uniform."""
    value = float(run.metrics.get(metric, math.nan))
    return run.status == "finished" and math.isfinite(value) and value < init_loss


def _stable_rate_claim(claim: Claim, records: Sequence[RunRecord], paper: PaperEffect | None) -> Outcome:
    """stable rate: the highest value of the axis at which every ended run of the group trained; shown, not tested."""
    highest = {}
    for group in (claim.a, claim.b or ""):
        runs = axis_runs(records, group, claim.axis or "")
        init_loss = _init_loss(runs)
        stable = [v for v, members in runs.items() if all(_stable(r, claim.metric, init_loss) for r in members)]
        highest[group] = max(stable) if stable else math.nan
    a, b = highest[claim.a], highest[claim.b or ""]
    cells = {"ours": f"{fmt(a)} vs {fmt(b)}", "spread (sd)": "", "n": "", "test": "none (descriptive)",
             "r (seeds)": "", "MDE": ""}
    shown = "higher" if a > b else "lower" if a < b else "the same"
    return Outcome(cells, None, lambda q: f"{DESCRIPTIVE}: {shown}")


def no_figures(test: str = "") -> dict[str, str]:
    """The figure cells of a row without runs to read."""
    return dict.fromkeys(("ours", "spread (sd)", "n", "r (seeds)", "MDE"), "") | {"test": test}


def _not_addressed_claim(claim: Claim, records: Sequence[RunRecord], paper: PaperEffect | None) -> Outcome:
    """A claim no sweep tests: no figures, no test, the note says what is missing."""
    return Outcome(no_figures("none (no runs)"), None, lambda q: NOT_ADDRESSED, [claim.why])


def _multiplier_claim(claim: Claim, records: Sequence[RunRecord], paper: PaperEffect | None) -> Outcome:
    """multiplier: a ladder's compute multiplier, decided by its bootstrap interval (gatelab.report.claims_ladder)."""
    reading = read_multiplier(claim, records)
    return Outcome(reading.cells, None, lambda q: reading.verdict, reading.notes,
                   rule=None if reading.testable else RULE_LADDER, test_rule=RULE_INTERVAL)


# How each kind of claim is tested: (claim, its sweep's records, the paper's relative effect for the sweep's model) ->
# the row's outcome.
CHECKS: dict[str, Callable[[Claim, Sequence[RunRecord], PaperEffect | None], Outcome]] = {
    "not addressed": _not_addressed_claim,
    "direction": _direction_claim,
    "closeness": _closeness_claim,
    "level": _level_claim,
    "change": _change_claim,
    "rank": _rank_claim,
    "lr sensitivity": _lr_sensitivity_claim,
    "stable rate": _stable_rate_claim,
    "multiplier": _multiplier_claim,
}
