"""The paper's claims, each checked on the runs of a sweep: our figure, its spread, p and q, the minimum detectable
effect and a verdict, one row per claim (`gatelab claims`).

The claims are data (sweeps/claims/tiny.yaml, read by gatelab.report.claims_file): which sweep, which groups of runs,
which metric, which way the paper says it goes, the paper's figure, and when this scale can test it at all. This
module turns each claim into a row. Every tested row has a p-value; the p-values of the whole table are corrected
together (Benjamini-Hochberg) and the verdicts are decided on the q-values. `VERDICT_RULES`, printed under the table,
states every rule.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from gatelab.paper import missing_note
from gatelab.report.claims_file import (
    AXIS_RULES,
    UNIFORM_FIRST_TOKEN,
    Claim,
    Kind,
    TestableIf,
    group_name,
    parse_group,
    parse_settings,
)
from gatelab.report.stats import (
    benjamini_hochberg,
    compare_shared_seeds,
    lr_sensitivity,
    mean_std,
    rank_agreement,
    rank_agreement_interval,
    shared_seeds,
    tost,
)
from gatelab.report.tables import PPL, RunRecord, paper_reference

HOLDS, FAILS, INCONCLUSIVE = "holds", "does not hold", "inconclusive at this scale"
NOT_TESTABLE, TRUE_BY_CONSTRUCTION = "not testable at this scale", "true by construction"
DESCRIPTIVE, NOT_RUN = "descriptive (not tested)", "not run"
ALPHA = 0.05
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0  # a fixed numpy Generator seed: the table made twice from one store is the same, byte for byte
COLUMNS = ["claim", "sweep", "comparison", "metric", "paper", "ours", "spread (sd)", "n", "test", "r (seeds)", "p",
           "q", "MDE", "verdict", "note"]


# --- what a run measured ----------------------------------------------------------------------------------------------


def _long_context(metrics: Mapping[str, float]) -> float:
    """ln of how much perplexity grows from the training length to the positions beyond it at 8x."""
    if "long_ppl_beyond_train/x8" not in metrics or "long_ppl/x1" not in metrics:
        return math.nan
    return math.log(metrics["long_ppl_beyond_train/x8"] / metrics["long_ppl/x1"])


def _ln_ppl(metrics: Mapping[str, float]) -> float:
    value = metrics.get(PPL, math.nan)
    return math.log(value) if value > 0 else math.nan


DERIVED: dict[str, Callable[[Mapping[str, float]], float]] = {"long_context_growth": _long_context, "ln_ppl": _ln_ppl}


def _vocab_size(record: RunRecord) -> int | None:
    size = record.spec.experiment.model.vocab_size
    return size if isinstance(size, int) else None


def worst_value(record: RunRecord, metric: str) -> float:
    """What a diverged run counts as: the loss or perplexity of uniform prediction over the vocabulary (what a model
    that learned nothing scores, and the cap of the learning-rate sensitivity); NaN for metrics with no worst value
    (the probes), whose diverged runs are then left out and counted in the row's note."""
    vocab = _vocab_size(record)
    if vocab is None:
        return math.nan
    if metric.startswith("ppl/"):
        return float(vocab)
    if metric in ("val/loss", "train/loss", "ln_ppl"):
        return math.log(vocab)
    return math.nan


def _value(record: RunRecord, metric: str) -> float:
    if record.status == "diverged":
        return worst_value(record, metric)
    value = DERIVED[metric](record.metrics) if metric in DERIVED else float(record.metrics.get(metric, math.nan))
    return value if math.isfinite(value) else worst_value(record, metric)


def by_seed(records: Sequence[RunRecord], group: str, metric: str) -> dict[int, float]:
    """{seed: value} of a group's ended runs: a finished run's metric, a diverged run's `worst_value` (NaN where the
    metric has none). Runs in other states (missing, running, failed) are left out."""
    return {r.spec.experiment.seed: _value(r, metric) for r in records
            if r.group == group and r.status in ("finished", "diverged")}


def _axis_runs(records: Sequence[RunRecord], group: str, axis: str) -> dict[float, list[RunRecord]]:
    """{value of `axis`: the ended runs of `group` (a group without `axis`) at that value}, by value."""
    variant, settings = parse_group(group)
    runs: dict[float, list[RunRecord]] = {}
    for r in records:
        rest = {k: v for k, v in r.spec.settings().items() if k != axis}
        if (r.spec.experiment.variant == variant and axis in r.spec.settings() and rest == settings
                and r.status in ("finished", "diverged")):
            runs.setdefault(r.spec.settings()[axis], []).append(r)
    return dict(sorted(runs.items()))


def _with(group: str, more: Mapping[str, object]) -> str:
    """The group with more settings: ('g1_elem_sig', {'train.lr': 0.008}) -> 'g1_elem_sig train.lr=0.008'."""
    variant, settings = parse_group(group)
    return group_name(variant, {**settings, **more})


def uniform_first_token_share(seq_len: int) -> float:
    """F-Attn of attention spread evenly over the causal prefix: query i (1..T-1; query 0 is left out, as the probe
    does) puts 1/(i+1) on token 0, so the mean is (H_T - 1)/(T - 1), H_T the T-th harmonic number."""
    return (sum(1.0 / k for k in range(1, seq_len + 1)) - 1.0) / (seq_len - 1)


# --- formatting -------------------------------------------------------------------------------------------------------


def _fmt(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.{digits}g}"


def _p(value: float | None) -> str:
    return "" if value is None else _fmt(value)


# --- one row ----------------------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """A row's figures before the table's correction: its cells, its p-value (None: not tested) and how its verdict
    follows from the row's q-value."""

    cells: dict[str, str]
    p_value: float | None = None
    decide: Callable[[float | None], str] = lambda q: INCONCLUSIVE
    notes: list[str] = field(default_factory=list)


def _paper_figure(claim: Claim) -> tuple[str, float | None]:
    """The paper's figure for the claim, and its relative effect for perplexity comparisons (None otherwise)."""
    figure = claim.paper
    if figure.text or figure.table is None:
        return figure.text, None
    reference = paper_reference(figure.table)
    if figure.column not in reference.columns:
        return "", None
    values = reference[figure.column]
    ids = figure.ids or [parse_group(g)[0] for g in (claim.a, claim.b or "")]
    present = lambda i: i in values.index and pd.notna(values[i])  # noqa: E731
    if claim.kind == "level":
        return (f"{values[ids[0]]:g}" if present(ids[0]) else ""), None
    if claim.kind == "rank" or len(ids) < 2 or not (present(ids[0]) and present(ids[1])):
        return "", None
    a, b = float(values[ids[0]]), float(values[ids[1]])
    relative = (a - b) / b if figure.column == "ppl" else None
    return f"{a:g} vs {b:g}" + (f" ({100 * relative:+.1f}%)" if relative is not None else ""), relative


def _relative(metric: str) -> bool:
    return metric.startswith("ppl/")


def _two_groups(claim: Claim, a: Mapping[int, float], b: Mapping[int, float], paper_relative: float | None,
                unit: str = "") -> Outcome:
    """Group a against group b over their shared seeds (`compare_shared_seeds`), in the claim's direction."""
    result = compare_shared_seeds(a, b)
    seeds = shared_seeds(a, b)
    mean_a = float(np.mean([a[s] for s in seeds])) if seeds else math.nan
    mean_b = float(np.mean([b[s] for s in seeds])) if seeds else math.nan
    relative = _relative(claim.metric) and claim.kind == "direction" and math.isfinite(mean_b) and mean_b != 0
    factor, unit = (100.0 / abs(mean_b), "%") if relative else (1.0, unit)
    expected = -1.0 if claim.direction == "lower" else 1.0
    cells = {"ours": f"{_fmt(result.delta * factor)}{unit} ({_fmt(mean_a, 4)} vs {_fmt(mean_b, 4)})",
             "spread (sd)": f"{_fmt(result.sd and result.sd * factor)}{unit}", "n": str(len(seeds)),
             "test": result.test if result.p_value is not None else (result.reason or ""),
             "r (seeds)": _fmt(result.correlation, 2),
             "MDE": f"{_fmt(result.mde and result.mde * factor)}{unit}" if result.mde else ""}

    def decide(q: float | None) -> str:
        if q is not None and q < ALPHA:
            return HOLDS if np.sign(result.delta) == expected else f"{FAILS} (significant, the other way)"
        if (paper_relative is not None and relative and result.mde is not None
                and result.mde / abs(mean_b) < abs(paper_relative)):
            return f"{FAILS} (an effect of the paper's size would have been seen)"
        return INCONCLUSIVE

    return Outcome(cells, result.p_value, decide)


def _direction_claim(claim: Claim, records: Sequence[RunRecord], paper_relative: float | None) -> Outcome:
    """direction: group a lower (higher) than group b."""
    a, b = by_seed(records, claim.a, claim.metric), by_seed(records, claim.b or "", claim.metric)
    return _two_groups(claim, a, b, paper_relative)


def _change_claim(claim: Claim, records: Sequence[RunRecord], paper_relative: float | None) -> Outcome:
    """change: per seed, the change of the metric from setting[0] to setting[1], group a against group b."""
    low, high = (parse_settings(s) for s in claim.setting or ())
    change = {}
    for group in (claim.a, claim.b or ""):
        before = by_seed(records, _with(group, low), claim.metric)
        after = by_seed(records, _with(group, high), claim.metric)
        change[group] = {s: after[s] - before[s] for s in shared_seeds(before, after)}
    return _two_groups(claim, change[claim.a], change[claim.b or ""], None, unit=" nats")


def _margin(claim: Claim, records: Sequence[RunRecord]) -> tuple[float, str]:
    """The closeness margin: `fraction` of the gain's mean over the gain groups' shared seeds, and how it was made."""
    gain_a, gain_b = claim.margin.gain
    a, b = by_seed(records, gain_a, claim.metric), by_seed(records, gain_b, claim.metric)
    seeds = shared_seeds(a, b)
    gain = abs(float(np.mean([a[s] - b[s] for s in seeds]))) if seeds else math.nan
    return claim.margin.fraction * gain, f"{claim.margin.fraction:g} x the gain of {gain_a} over {gain_b}"


def _closeness_claim(claim: Claim, records: Sequence[RunRecord], paper_relative: float | None) -> Outcome:
    """closeness: TOST of a - b within +-margin, paired where pairing helps (as direction claims), else Welch."""
    a, b = by_seed(records, claim.a, claim.metric), by_seed(records, claim.b or "", claim.metric)
    seeds = shared_seeds(a, b)
    margin, made = _margin(claim, records)
    paired = compare_shared_seeds(a, b)
    result = tost([a[s] for s in seeds], [b[s] for s in seeds], margin, paired.test == "paired t")
    mean_b = float(np.mean([b[s] for s in seeds])) if seeds else math.nan
    scale, unit = (100.0 / abs(mean_b), "%") if _relative(claim.metric) and seeds and mean_b else (1.0, "")
    mean_a = float(np.mean([a[s] for s in seeds])) if seeds else math.nan
    interval = "" if result.interval is None else \
        f"; 95% CI {result.interval[0] * scale:+.3g}{unit} to {result.interval[1] * scale:+.3g}{unit}"
    cells = {"ours": f"{_fmt(result.delta * scale)}{unit} ({_fmt(mean_a, 4)} vs {_fmt(mean_b, 4)}){interval}; "
                     f"margin +-{_fmt(margin * scale)}{unit}",
             "spread (sd)": f"{_fmt(paired.sd and paired.sd * scale)}{unit}", "n": str(len(seeds)),
             "test": f"TOST, {result.test}" if result.p_value is not None else (result.reason or ""),
             "r (seeds)": _fmt(paired.correlation, 2), "MDE": ""}

    def decide(q: float | None) -> str:
        if q is not None and q < ALPHA:
            return HOLDS
        if result.interval is not None and (result.interval[0] > margin or result.interval[1] < -margin):
            return f"{FAILS} (apart by more than the margin)"
        return INCONCLUSIVE

    return Outcome(cells, result.p_value, decide, [f"margin: {made}"])


def _level_claim(claim: Claim, records: Sequence[RunRecord], paper_relative: float | None) -> Outcome:
    """level: the mean of group a against the claimed level, one-sample t-test (two-sided)."""
    values = np.array([v for v in by_seed(records, claim.a, claim.metric).values() if math.isfinite(v)])
    mean, sd, n = mean_std(values)
    cells = {"ours": _fmt(mean), "spread (sd)": _fmt(sd), "n": str(n), "test": "one-sample t", "r (seeds)": "",
             "MDE": ""}
    if n < 2 or sd is None or sd == 0.0:
        cells["test"] = "fewer than two seeds" if n < 2 else "zero variance"
        return Outcome(cells, None, lambda q: INCONCLUSIVE)
    test = scipy_stats.ttest_1samp(values, claim.level)
    low, high = test.confidence_interval(1 - ALPHA)
    cells["ours"] = f"{mean:.3g} (95% CI {low:.3g} to {high:.3g})"
    claimed_side = mean < claim.level if claim.direction == "lower" else mean > claim.level

    def decide(q: float | None) -> str:
        if q is not None and q < ALPHA:
            return HOLDS if claimed_side else FAILS
        return INCONCLUSIVE

    return Outcome(cells, float(test.pvalue), decide)


def _rank_ids(claim: Claim) -> list[str]:
    if not claim.only_gated:
        return list(claim.rank_ids)
    from gatelab.variants import VARIANTS

    def gated(group: str) -> bool:
        variant = VARIANTS.get(parse_group(group)[0])
        return variant is not None and any(gate.kind == "gate" for gate in variant.gates)

    return [g for g in claim.rank_ids if gated(g)]


def _rank_claim(claim: Claim, records: Sequence[RunRecord], paper_relative: float | None) -> Outcome:
    """rank: Kendall's tau of our group means against the paper's column, with a bootstrap interval over seeds."""
    ids = _rank_ids(claim)
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
    cells = {"ours": f"Kendall's tau {_fmt(tau)}{ci}", "spread (sd)": "", "n": str(agreement["n"]),
             "test": "Kendall tau" if p is not None else (agreement["reason"] or ""), "r (seeds)": "", "MDE": ""}

    def decide(q: float | None) -> str:
        if q is not None and q < ALPHA and tau is not None:
            return HOLDS if tau > 0 else FAILS
        return INCONCLUSIVE

    return Outcome(cells, p, decide, [f"{len(ids)} variants: {', '.join(parse_group(g)[0] for g in ids)}"]
                   if claim.only_gated else [])


def _init_loss(runs: Mapping[float, list[RunRecord]]) -> float:
    """ln(vocabulary size): the loss of uniform prediction, which a N(0, 0.02) initialisation gives to ~0.01 nats."""
    vocab = next((_vocab_size(r) for rs in runs.values() for r in rs if _vocab_size(r)), None)
    return math.log(vocab) if vocab else math.nan


def _sensitivity_by_seed(records: Sequence[RunRecord], group: str, axis: str, metric: str) -> dict[int, float]:
    """{seed: LR sensitivity over the axis} for the seeds that ended at every value of the axis."""
    runs = _axis_runs(records, group, axis)
    init_loss = _init_loss(runs)
    losses: dict[int, dict[float, float]] = {}
    for value, members in runs.items():
        for r in members:
            losses.setdefault(r.spec.experiment.seed, {})[value] = _value(r, metric)
    return {seed: lr_sensitivity(by_value, init_loss) for seed, by_value in sorted(losses.items())
            if len(by_value) == len(runs)}


def _lr_sensitivity_claim(claim: Claim, records: Sequence[RunRecord], paper_relative: float | None) -> Outcome:
    """lr sensitivity: per seed, Wortsman et al.'s LR sensitivity over the axis, group a against group b."""
    a = _sensitivity_by_seed(records, claim.a, claim.axis or "", claim.metric)
    b = _sensitivity_by_seed(records, claim.b or "", claim.axis or "", claim.metric)
    outcome = _two_groups(claim, a, b, None, unit=" nats")
    rates = _axis_runs(records, claim.a, claim.axis or "")
    outcome.notes.append(f"{len(rates)} values of {claim.axis}: {', '.join(f'{v:g}' for v in rates)}")
    return outcome


def _stable(run: RunRecord, metric: str, init_loss: float) -> bool:
    """A run trained without diverging: not stopped as diverged, and its final loss finite and below uniform."""
    value = float(run.metrics.get(metric, math.nan))
    return run.status == "finished" and math.isfinite(value) and value < init_loss


def _stable_rate_claim(claim: Claim, records: Sequence[RunRecord], paper_relative: float | None) -> Outcome:
    """stable rate: the highest value of the axis at which every ended run of the group trained; shown, not tested."""
    highest = {}
    for group in (claim.a, claim.b or ""):
        runs = _axis_runs(records, group, claim.axis or "")
        init_loss = _init_loss(runs)
        stable = [v for v, members in runs.items() if all(_stable(r, claim.metric, init_loss) for r in members)]
        highest[group] = max(stable) if stable else math.nan
    a, b = highest[claim.a], highest[claim.b or ""]
    cells = {"ours": f"{_fmt(a)} vs {_fmt(b)}", "spread (sd)": "", "n": "", "test": "", "r (seeds)": "", "MDE": ""}
    shown = "higher" if a > b else "lower" if a < b else "the same"
    return Outcome(cells, None, lambda q: f"{DESCRIPTIVE}: {shown}")


# How each kind of claim is tested: (claim, its sweep's records, the paper's relative effect) -> the row's outcome.
CHECKS: dict[str, Callable[[Claim, Sequence[RunRecord], float | None], Outcome]] = {
    "direction": _direction_claim,
    "closeness": _closeness_claim,
    "level": _level_claim,
    "change": _change_claim,
    "rank": _rank_claim,
    "lr sensitivity": _lr_sensitivity_claim,
    "stable rate": _stable_rate_claim,
}


# --- when a claim can be tested here ----------------------------------------------------------------------------------


def _rule_holds(rule: TestableIf, records: Sequence[RunRecord]) -> tuple[bool, str]:
    """Whether a testable_if rule holds on the runs, and the rule with what was measured, in words."""
    if rule.rule == "diverges":
        runs = _axis_runs(records, rule.group, rule.axis or "")
        diverged = sorted(v for v, rs in runs.items() if any(r.status == "diverged" for r in rs))
        where = f" (at {rule.axis}={', '.join(f'{v:g}' for v in diverged)})" if diverged else ""
        return bool(diverged), f"{rule.group}: diverged at {len(diverged)} of {len(runs)} {rule.axis} values{where}"
    if rule.rule == "unstable":
        runs = _axis_runs(records, rule.group, rule.axis or "")
        diverged = sum(r.status == "diverged" for rs in runs.values() for r in rs)
        finite = {v: [x for x in (_value(r, rule.metric) for r in rs) if math.isfinite(x)] for v, rs in runs.items()}
        means = {v: float(np.mean(xs)) for v, xs in finite.items() if xs}
        if not means:
            return diverged > 0, f"{rule.group} over {rule.axis}: no {rule.metric} (diverged runs: {diverged})"
        best = min(means, key=lambda v: means[v])
        rises = [means[v] - means[best] for v in means if v > best]
        above = f"above it {rule.metric} rises by at most {max(rises):.3g}" if rises else "no value above it"
        text = (f"{rule.group}: lowest mean {rule.metric} at {rule.axis}={best:g}, {above}; {diverged} diverged run(s) "
                f"(rule: a rise > {rule.by:g} or a diverged run)")
        return diverged > 0 or max(rises, default=0.0) > (rule.by or 0.0), text
    values = [v for v in by_seed(records, rule.group, rule.metric).values() if math.isfinite(v)]
    mean = float(np.mean(values)) if values else math.nan
    if rule.rule == "moved":
        moved = abs(mean - (rule.start or 0.0))
        return moved > (rule.by or 0.0), (f"{rule.group} {rule.metric} {mean:.3g}, {moved:.3g} from its initial "
                                           f"{rule.start:g} (rule: > {rule.by:g})")
    level, named = rule.level, f"{rule.level:g}" if isinstance(rule.level, float | int) else ""
    if rule.level == UNIFORM_FIRST_TOKEN:
        seq_len = next(r.spec.experiment.data.seq_len for r in records if r.group == rule.group)
        level = uniform_first_token_share(seq_len)
        named = f"uniform causal attention's {level:.3g} at {seq_len} tokens"
    passed = mean > level if rule.rule == "above" else mean < level
    return passed, f"{rule.group} {rule.metric} {mean:.3g} (rule: {rule.rule} {named})"


def _groups(claim: Claim, records: Sequence[RunRecord]) -> list[str]:
    """The groups of runs a claim reads, as RunRecord.group names them (an axis claim's are read by `_axis_runs`)."""
    groups = list(_rank_ids(claim)) if claim.kind == "rank" else [g for g in (claim.a, claim.b) if g]
    if claim.kind in ("lr sensitivity", "stable rate"):
        groups = []  # read over the axis: see _axis_runs
    if claim.kind == "change":
        groups = [_with(g, parse_settings(s)) for g in groups for s in claim.setting or ()]
    if claim.margin is not None:
        groups += list(claim.margin.gain)
    return list(dict.fromkeys(groups))


def _runs_read(claim: Claim, records: Sequence[RunRecord]) -> list[RunRecord]:
    """The runs a claim's test reads (not its testable_if rules')."""
    if claim.kind in ("lr sensitivity", "stable rate"):
        return [r for g in (claim.a, claim.b or "") for rs in _axis_runs(records, g, claim.axis or "").values()
                for r in rs]
    groups = set(_groups(claim, records))
    return [r for r in records if r.group in groups]


def _missing(claim: Claim, records: Sequence[RunRecord]) -> list[str]:
    """What a claim reads and the runs lack, in words: groups without ended runs, metrics without a value."""
    def measured(group: str, metric: str) -> bool:
        return any(math.isfinite(v) for v in by_seed(records, group, metric).values())

    reads = [(g, claim.metric) for g in _groups(claim, records)]
    reads += [(rule.group, rule.metric) for rule in claim.testable_if if rule.rule not in AXIS_RULES]
    unrun = [g for g, _ in reads if not by_seed(records, g, claim.metric)]
    axis_groups = [(g, claim.axis) for g in (claim.a, claim.b) if g and claim.kind in ("lr sensitivity", "stable rate")]
    axis_groups += [(rule.group, rule.axis) for rule in claim.testable_if if rule.rule in AXIS_RULES]
    unrun += [f"{g} over {axis}" for g, axis in axis_groups if not _axis_runs(records, g, axis or "")]
    unmeasured = [f"no {metric} in the runs of {g}" for g, metric in reads
                  if g not in unrun and not measured(g, metric)]
    return ([f"no ended runs of {', '.join(dict.fromkeys(unrun))}"] if unrun else []) + list(dict.fromkeys(unmeasured))


def _comparison(claim: Claim) -> str:
    if claim.kind == "rank":
        return f"{len(_rank_ids(claim))} variants" + (" with a gate" if claim.only_gated else "")
    if claim.kind == "change":
        return f"{claim.a} vs {claim.b}, {' -> '.join(claim.setting or ())}"
    if claim.kind in ("lr sensitivity", "stable rate"):
        return f"{claim.a} vs {claim.b}, over {claim.axis}"
    return claim.a if claim.b is None else f"{claim.a} vs {claim.b}"


def evaluate_claim(claim: Claim, records: Sequence[RunRecord] | None) -> tuple[dict[str, str], Outcome]:
    """One row of the claims table before the correction: its fixed cells, and the outcome of its test."""
    paper_text, paper_relative = _paper_figure(claim)
    row = {"claim": claim.claim, "sweep": claim.sweep, "comparison": _comparison(claim), "metric": claim.metric,
           "paper": paper_text}
    empty = dict.fromkeys(("ours", "spread (sd)", "n", "test", "r (seeds)", "MDE"), "")
    if not records:
        return row, Outcome(empty, None, lambda q: NOT_RUN, [claim.why])
    missing = _missing(claim, records)
    if missing:
        return row, Outcome(empty, None, lambda q: NOT_RUN, [*missing, claim.why])
    outcome = CHECKS[claim.kind](claim, records, paper_relative)
    diverged = sum(r.status == "diverged" for r in _runs_read(claim, records))
    if diverged:
        outcome.notes.append(f"{diverged} diverged run(s) counted as uniform prediction"
                             if not math.isnan(worst_value(records[0], claim.metric))
                             else f"{diverged} diverged run(s) have no {claim.metric} and are left out")
    untested = outcome.cells | {"test": "", "r (seeds)": "", "MDE": ""}  # figures shown, no test
    if claim.true_by_construction:
        notes = [claim.true_by_construction, *outcome.notes, claim.why]
        return row, Outcome(untested, None, lambda q: TRUE_BY_CONSTRUCTION, notes)
    checked = [(rule, *_rule_holds(rule, records)) for rule in claim.testable_if]
    failed = [(rule, text) for rule, passed, text in checked if not passed]
    if failed:
        reasons = [f"not testable: {rule.reason} ({text})" for rule, text in failed]
        return row, Outcome(untested, None, lambda q: NOT_TESTABLE, [*reasons, *outcome.notes, claim.why])
    outcome.notes = [f"testable: {text}" for _, _, text in checked] + outcome.notes + [claim.why]
    return row, outcome


def claims_table(records_by_sweep: Mapping[str, Sequence[RunRecord]], claims: Sequence[Claim]) -> pd.DataFrame:
    """Every claim, in order, with p and the table's Benjamini-Hochberg q; a claim whose sweep is not given is marked
    "not run"."""
    evaluated = [evaluate_claim(claim, records_by_sweep.get(claim.sweep)) for claim in claims]
    q_values = benjamini_hochberg([outcome.p_value for _, outcome in evaluated])
    rows = []
    for (row, outcome), q in zip(evaluated, q_values, strict=True):
        rows.append(row | outcome.cells | {"p": _p(outcome.p_value), "q": _p(q), "verdict": outcome.decide(q),
                                           "note": "; ".join(n for n in outcome.notes if n)})
    return pd.DataFrame(rows, columns=COLUMNS)


def kinds() -> tuple[str, ...]:
    import typing

    return typing.get_args(Kind)


VERDICT_RULES = [
    "Seeds: a row compares two groups over the seeds both ended (shared seeds), and its means are over those seeds. "
    "Runs of one seed share data order and initialisation, but pairing helps only where the two groups move together: "
    "the paired t-test is used when Pearson's r of the groups over the shared seeds (column r) is > 0, Welch's t-test "
    "on the same values otherwise. Perplexity differences are % of the second group's mean.",
    "Multiple comparisons: p (two-sided) of every tested row is corrected across the whole table by "
    "Benjamini-Hochberg (column q); verdicts are decided on q < 0.05.",
    "Direction: holds at q < 0.05 the paper's way; does not hold at q < 0.05 the other way or, for perplexity, when "
    "the minimum detectable effect (MDE, 80% power at p < 0.05) is below the paper's own relative effect; otherwise "
    "inconclusive at this scale. Change: the same, on each seed's change of the metric between two settings.",
    "Closeness (also where the paper reports no difference): two one-sided tests (TOST) of the difference within "
    "+-margin, the margin stated in the row (a fraction of a gain measured in the same sweep); holds at q < 0.05, does "
    "not hold when the 95% interval of the difference lies beyond the margin, otherwise inconclusive.",
    "Level: one-sample t-test of the mean against the level; holds at q < 0.05 on the claimed side, does not hold at "
    "q < 0.05 on the other. Rank: Kendall's tau of our means against the paper's, holds at q < 0.05 with tau > 0; "
    f"also within the gated rows only, with a 95% bootstrap interval over seeds ({BOOTSTRAP_RESAMPLES} resamples, "
    "fixed seed).",
    "LR sensitivity (Wortsman et al. 2023): per seed, the mean over the grid of rates of min(final val/loss, ln vocab) "
    "minus its lowest; compared like a direction. Stable rate: the highest rate at which no run diverged or ended at "
    "or above ln vocab; descriptive, not tested.",
    "Diverged runs count in both groups, as the worst value: the loss (ln vocab) or perplexity (vocab) of uniform "
    "prediction; a probe has no worst value, so its diverged runs are left out and counted in the note.",
    "Not testable at this scale: a condition the claim needs did not arise in these runs (no attention sink, no "
    "massive activation, gate scores not moved from init, no instability at any rate); the row's note states the rule, "
    "its threshold and what was measured. Such rows, rows true by construction (shown with the reason) and "
    "descriptive rows get no p-value and count neither for nor against the paper.",
    "Paper: Qiu et al. 2025 (arXiv 2505.06708), Tables 1-4, numbers in results/paper/; its models are 15B MoE / 1.7B "
    "dense on 400B tokens, so compare directions, not magnitudes.",
]


def write_claims(records: Mapping[str, Sequence[RunRecord]], claims: Sequence[Claim], out_dir: Path,
                 formats: Sequence[str], command: str | None = None, log=print) -> list[Path]:
    """The claims table of the runs (`records`, by sweep name), written as `claims.<format>` under `out_dir`; prints
    each claim's verdict."""
    from gatelab.report.export import ReportTable, export_report
    from gatelab.report.tables import data_stamp

    frame = claims_table(records, claims)
    missing = dict.fromkeys(note for c in claims for note in missing_note(c.paper.table))  # one note per file
    table = ReportTable("The paper's claims at tiny scale", frame, VERDICT_RULES + list(missing))
    written = export_report([table], [], out_dir, formats, "claims", command=command,
                            stamp=data_stamp([r for rs in records.values() for r in rs]))
    log(frame[["claim", "ours", "p", "q", "verdict"]].to_string(index=False))
    return written
