"""The paper's claims, each checked on the runs of a sweep: our figure, its spread, p and q, the minimum detectable
effect and a verdict, one row per claim (`gatelab claims`).

The claims are data (sweeps/claims/tiny.yaml, read by gatelab.report.claims_file): which sweep, which groups of runs,
which metric, which way the paper says it goes, the paper's figure, and when this scale can test it at all. This
module turns each claim into a row. Every tested row has a p-value; the p-values of the whole table are corrected
together (Benjamini-Hochberg) and the verdicts are decided on the q-values. `VERDICT_RULES`, printed under the table,
states every rule; `summary` writes the paragraph that results/tiny/README.md opens with from the same table.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from gatelab.eval import INIT_SCALE_METRIC
from gatelab.paper import missing_note
from gatelab.report.claims_file import (
    AXIS_RULES,
    UNIFORM_FIRST_TOKEN,
    Claim,
    Kind,
    PaperGain,
    TestableIf,
    architecture,
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
PAPER_SIZE_EXCLUDED = f"{FAILS} (the paper's size excluded)"
CONFOUNDED = "init-scale confounded"
NOT_TESTABLE, TRUE_BY_CONSTRUCTION = "not testable at this scale", "true by construction"
DESCRIPTIVE, NOT_RUN = "descriptive (not tested)", "not run"
NOT_ADDRESSED = "not addressed"
# The ratio of two groups' mean INIT_SCALE_METRIC beyond which they start at different scales: the first pass's gains
# tracked it.
INIT_SCALE_RATIO = (0.8, 1.25)
MATCHED, DIFFERS, NOT_LOGGED = "matched", "differs", "not logged"
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


def _sparsity_over_mean_gate(metrics: Mapping[str, float]) -> float:
    """App. A.3: the share of gated SDPA output values below 1e-2, minus that share of the ungated output scaled by
    the layer's mean gate score (the paper's control: as small on average, but not input-dependent)."""
    return metrics.get("probe/sparsity_gated_output_below_0.01", math.nan) - \
        metrics.get("probe/sparsity_control_output_below_0.01", math.nan)


DERIVED: dict[str, Callable[[Mapping[str, float]], float]] = {
    "long_context_growth": _long_context, "ln_ppl": _ln_ppl, "sparsity_over_mean_gate": _sparsity_over_mean_gate}

# Loss spikes (metric loss_spikes), counted against the baseline's own noise: on the logged train/loss after warmup,
# a spike is a rise from one logged value to the next above SPIKE_SIGMAS times the noise of such steps in the baseline
# runs of the same sweep (1.4826 x their median absolute deviation: the spikes themselves barely move it). Gaussian
# noise crosses 4 sigma once in 30,000 steps, so a baseline with spikes has rises its noise does not explain.
SPIKE_SIGMAS = 4.0
LOSS_SPIKES = "loss_spikes"


def _rises(steps: Sequence[int], losses: Sequence[float], warmup: int) -> np.ndarray:
    kept = np.array([loss for step, loss in zip(steps, losses, strict=True) if step >= warmup], dtype=float)
    return np.diff(kept) if kept.size > 1 else np.zeros(0)


def _spike_rule(records: Sequence[RunRecord]) -> str:
    measured = next((r.metrics for r in records if f"{LOSS_SPIKES}_threshold" in r.metrics), None)
    if measured is None:
        return "loss spikes not counted: no baseline run logged train/loss"
    return (f"a spike: a rise of the logged train/loss above {measured[f'{LOSS_SPIKES}_threshold']:.3g} nats from one "
            f"logged step to the next after warmup, {SPIKE_SIGMAS:g} x the baseline runs' noise of such rises "
            f"({measured[f'{LOSS_SPIKES}_noise']:.3g} nats, 1.4826 x MAD)")


def count_loss_spikes(records: Sequence[RunRecord], history: Callable[[str], tuple[Sequence[int], Sequence[float]]]
                      ) -> None:
    """Put each finished run's `loss_spikes` in its metrics, with the threshold and the noise it came from (above);
    `history(run_id)` gives a run's logged (steps, train/loss). Without baseline runs nothing is counted."""
    finished = [r for r in records if r.status == "finished" and r.run_id]
    rises = {r.run_id: _rises(*history(r.run_id), r.spec.experiment.train.warmup_steps) for r in finished}
    baseline = [rises[r.run_id] for r in finished if r.spec.experiment.variant == "baseline"]
    pooled = np.concatenate(baseline) if baseline else np.zeros(0)
    if pooled.size < 2:
        return
    noise = 1.4826 * float(np.median(np.abs(pooled - np.median(pooled))))
    threshold = SPIKE_SIGMAS * noise
    for record in finished:
        record.metrics[LOSS_SPIKES] = float((rises[record.run_id] > threshold).sum())
        record.metrics[f"{LOSS_SPIKES}_threshold"], record.metrics[f"{LOSS_SPIKES}_noise"] = threshold, noise


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
    """A row's figures before the table's correction: its cells, its p-value (None: not tested), how its verdict
    follows from the row's q-value, and (direction rows) whether its groups start at one init scale."""

    cells: dict[str, str]
    p_value: float | None = None
    decide: Callable[[float | None], str] = lambda q: INCONCLUSIVE
    notes: list[str] = field(default_factory=list)
    scale: str = ""  # direction rows: MATCHED, DIFFERS or NOT_LOGGED (`_init_scale`)


@dataclass(frozen=True)
class PaperEffect:
    """The paper's relative perplexity effect for a row, (a - b) / b of each of its row pairs, and the model (dense or
    MoE) the figures are from."""

    effects: tuple[float, ...]
    model: str | None  # "dense", "moe"; None where the table mixes both (or names none)
    source: str  # the table, in words: "Table 2"


def _row_labels(table: str) -> tuple[str, dict[str, str]]:
    """The tables of a SWEEP_TABLES key in words ("Table 2") and {id: the paper's row label, "(8)"}."""
    from gatelab.paper import SWEEP_TABLES, TABLES, read_rows

    names = SWEEP_TABLES.get(table, ())
    labels = {r["id"]: r.get("row") or r["id"] for t in names for r in read_rows(t) or []}
    return " and ".join(TABLES[t].name for t in names), labels


def _paper_figure(claim: Claim) -> tuple[str, PaperEffect | None]:
    """The paper's figure for the claim, and its relative effect for perplexity comparisons (None otherwise)."""
    from gatelab.paper import model_kinds

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
    if claim.kind == "rank" or (len(ids) < 2 and not figure.pairs):
        return "", None
    pairs = [(a, b) for a, b in figure.pairs or [(ids[0], ids[1])] if present(a) and present(b)]
    if not pairs:
        return "", None
    effects = tuple((float(values[a]) - float(values[b])) / float(values[b]) for a, b in pairs)
    kinds, (source, labels) = model_kinds(figure.table), _row_labels(figure.table)
    effect = PaperEffect(effects, next(iter(kinds)) if len(kinds) == 1 else None, source) \
        if figure.column == "ppl" else None
    if figure.pairs is None:
        a, b = float(values[pairs[0][0]]), float(values[pairs[0][1]])
        return f"{a:g} vs {b:g}" + (f" ({100 * effects[0]:+.1f}%)" if effect else ""), effect
    rows = ", ".join(f"{labels.get(a, a)} vs {labels.get(b, b)}" for a, b in pairs)
    return f"{_span(effects)} ({source} rows {rows})", effect


def _span(effects: Sequence[float]) -> str:
    """The paper's relative effects as a range, smallest to largest in size: "-0.8% to -3.6%" ("-1.3%" for one)."""
    low, high = sorted(effects, key=abs)[0], sorted(effects, key=abs)[-1]
    return f"{100 * low:+.1f}%" if low == high else f"{100 * low:+.1f}% to {100 * high:+.1f}%"


def _relative(metric: str) -> bool:
    return metric.startswith("ppl/")


def _inconclusive(sign: float, expected: float) -> str:
    """Inconclusive, with the way the figures point."""
    way = "the paper's direction" if sign == expected else "the other way" if sign == -expected else "no difference"
    return f"{INCONCLUSIVE} ({way})"


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
    relative = _relative(claim.metric) and claim.kind == "direction" and math.isfinite(mean_b) and mean_b != 0
    factor, unit = (100.0 / abs(mean_b), "%") if relative else (1.0, unit)
    expected = -1.0 if claim.direction == "lower" else 1.0
    interval = result.interval
    shown = "" if interval is None else \
        f"; 95% CI {interval[0] * factor:+.3g}{unit} to {interval[1] * factor:+.3g}{unit}"
    cells = {"ours": f"{_fmt(result.delta * factor)}{unit} ({_fmt(mean_a, 4)} vs {_fmt(mean_b, 4)}){shown}",
             "spread (sd)": f"{_fmt(result.sd and result.sd * factor)}{unit}", "n": str(len(seeds)),
             "test": result.test if result.p_value is not None else f"{result.test}: {result.reason or ''}",
             "r (seeds)": _fmt(result.correlation, 2),
             "MDE": f"{_fmt(result.mde and result.mde * factor)}{unit}" if result.mde else ""}
    effects = paper.effects if paper is not None and relative else ()

    def decide(q: float | None) -> str:
        if q is not None and q < ALPHA:
            return HOLDS if np.sign(result.delta) == expected else f"{FAILS} (significant, the other way)"
        if effects and interval is not None and _excludes((interval[0] / abs(mean_b), interval[1] / abs(mean_b)),
                                                          effects, expected):
            return PAPER_SIZE_EXCLUDED
        return _inconclusive(float(np.sign(result.delta)), expected)

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
        before = by_seed(records, _with(group, low), claim.metric)
        after = by_seed(records, _with(group, high), claim.metric)
        change[group] = {s: after[s] - before[s] for s in shared_seeds(before, after)}
    return _two_groups(claim, change[claim.a], change[claim.b or ""], None, unit=" nats")


def paper_gain(gain: PaperGain) -> float:
    """The paper's relative perplexity gain (ids[0] - ids[1]) / ids[1]; NaN where its file or a figure is missing."""
    values = paper_reference(gain.table)["ppl"]
    a, b = (float(values[i]) if i in values.index and pd.notna(values[i]) else math.nan for i in gain.ids)
    return (a - b) / b


def _margin(claim: Claim) -> tuple[float, str]:
    """The closeness margin relative to group b's mean, from the paper or stated, and how it was made."""
    margin = claim.margin
    if margin.paper_gain is None:
        return float(margin.relative), f"stated, +-{100 * margin.relative:.3g}% of {claim.b}'s mean: {margin.reason}"
    gain = paper_gain(margin.paper_gain)
    source, labels = _row_labels(margin.paper_gain.table)
    a, b = (labels.get(i, i) for i in margin.paper_gain.ids)
    return margin.fraction * abs(gain), (f"{margin.fraction:g} x the paper's gain of {source} row {a} over {b} "
                                         f"({100 * gain:+.2f}%), relative to {claim.b}'s mean")


def _closeness_claim(claim: Claim, records: Sequence[RunRecord], paper: PaperEffect | None) -> Outcome:
    """closeness: TOST of a - b within +-margin (the paper's, relative to b's mean), paired by seed."""
    a, b = by_seed(records, claim.a, claim.metric), by_seed(records, claim.b or "", claim.metric)
    seeds = shared_seeds(a, b)
    mean_a = float(np.mean([a[s] for s in seeds])) if seeds else math.nan
    mean_b = float(np.mean([b[s] for s in seeds])) if seeds else math.nan
    relative_margin, made = _margin(claim)
    margin = relative_margin * abs(mean_b)
    paired = compare_shared_seeds(a, b)
    result = tost([a[s] for s in seeds], [b[s] for s in seeds], margin, paired=True)
    scale, unit = (100.0 / abs(mean_b), "%") if _relative(claim.metric) and seeds and mean_b else (1.0, "")
    interval = "" if result.interval is None else \
        f"; 95% CI {result.interval[0] * scale:+.3g}{unit} to {result.interval[1] * scale:+.3g}{unit}"
    cells = {"ours": f"{_fmt(result.delta * scale)}{unit} ({_fmt(mean_a, 4)} vs {_fmt(mean_b, 4)}){interval}; "
                     f"margin +-{_fmt(margin * scale)}{unit}",
             "spread (sd)": f"{_fmt(paired.sd and paired.sd * scale)}{unit}", "n": str(len(seeds)),
             "test": f"TOST, {result.test}" + ("" if result.p_value is not None else f": {result.reason}"),
             "r (seeds)": _fmt(paired.correlation, 2), "MDE": ""}

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
    cells = {"ours": _fmt(mean), "spread (sd)": _fmt(sd), "n": str(n), "test": "one-sample t", "r (seeds)": "",
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
        return _inconclusive(1.0 if claimed_side else -1.0, 1.0)

    return Outcome(cells, float(test.pvalue), decide)


def _rank_ids(claim: Claim) -> list[str]:
    if not claim.only_gated:
        return list(claim.rank_ids)
    from gatelab.variants import VARIANTS

    def gated(group: str) -> bool:
        variant = VARIANTS.get(parse_group(group)[0])
        return variant is not None and any(gate.kind == "gate" for gate in variant.gates)

    return [g for g in claim.rank_ids if gated(g)]


def _rank_claim(claim: Claim, records: Sequence[RunRecord], paper: PaperEffect | None) -> Outcome:
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
             "test": "Kendall tau" + ("" if p is not None else f": {agreement['reason']}"), "r (seeds)": "",
             "MDE": ""}

    def decide(q: float | None) -> str:
        if q is not None and q < ALPHA and tau is not None:
            return HOLDS if tau > 0 else FAILS
        return INCONCLUSIVE if tau is None else _inconclusive(float(np.sign(tau)), 1.0)

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


def _lr_sensitivity_claim(claim: Claim, records: Sequence[RunRecord], paper: PaperEffect | None) -> Outcome:
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


def _stable_rate_claim(claim: Claim, records: Sequence[RunRecord], paper: PaperEffect | None) -> Outcome:
    """stable rate: the highest value of the axis at which every ended run of the group trained; shown, not tested."""
    highest = {}
    for group in (claim.a, claim.b or ""):
        runs = _axis_runs(records, group, claim.axis or "")
        init_loss = _init_loss(runs)
        stable = [v for v, members in runs.items() if all(_stable(r, claim.metric, init_loss) for r in members)]
        highest[group] = max(stable) if stable else math.nan
    a, b = highest[claim.a], highest[claim.b or ""]
    cells = {"ours": f"{_fmt(a)} vs {_fmt(b)}", "spread (sd)": "", "n": "", "test": "none (descriptive)",
             "r (seeds)": "", "MDE": ""}
    shown = "higher" if a > b else "lower" if a < b else "the same"
    return Outcome(cells, None, lambda q: f"{DESCRIPTIVE}: {shown}")


def _no_figures(test: str = "") -> dict[str, str]:
    """The figure cells of a row without runs to read."""
    return dict.fromkeys(("ours", "spread (sd)", "n", "r (seeds)", "MDE"), "") | {"test": test}


def _not_addressed_claim(claim: Claim, records: Sequence[RunRecord], paper: PaperEffect | None) -> Outcome:
    """A claim no sweep tests: no figures, no test, the note says what is missing."""
    return Outcome(_no_figures("none (no runs)"), None, lambda q: NOT_ADDRESSED, [claim.why])


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


def _matching_effect(claim: Claim, effect: PaperEffect | None, records: Sequence[RunRecord]
                     ) -> tuple[PaperEffect | None, str]:
    """The paper's effect where it is from the sweep's own kind of model (dense or MoE), and a note saying which
    figure the row's interval is compared with, or that none is."""
    if effect is None or claim.kind != "direction" or not _relative(claim.metric):
        return None, ""
    models = {architecture(r.spec.experiment.model) for r in records}
    model = next(iter(models)) if len(models) == 1 else "/".join(sorted(models))
    if effect.model == model:
        return effect, f"95% CI compared with the paper's {model} effect ({effect.source}): {_span(effect.effects)}"
    return None, (f"the paper's figure is its {effect.model or 'mixed'} model's, the sweep's is {model}: no size to "
                  "compare the interval with")


def _init_scale(claim: Claim, records: Sequence[RunRecord]) -> tuple[str, str]:
    """Whether groups a and b start at one scale of the attention output (INIT_SCALE_METRIC's group means within
    INIT_SCALE_RATIO): MATCHED, DIFFERS or NOT_LOGGED, and a note."""
    means = {}
    for group in (claim.a, claim.b or ""):
        values = [v for v in by_seed(records, group, INIT_SCALE_METRIC).values() if math.isfinite(v)]
        means[group] = float(np.mean(values)) if values else math.nan
    unlogged = [g for g, m in means.items() if not math.isfinite(m)]
    if unlogged:
        return NOT_LOGGED, (f"init scale not logged ({INIT_SCALE_METRIC} absent on the runs of "
                            f"{', '.join(unlogged)}): the init-scale rule could not be applied")
    mean_a, mean_b = means[claim.a], means[claim.b or ""]
    ratio = mean_a / mean_b if mean_b else math.inf
    low, high = INIT_SCALE_RATIO
    inside = low <= ratio <= high
    return (MATCHED if inside else DIFFERS), (f"init scale ({INIT_SCALE_METRIC}) {mean_a:.3g} vs {mean_b:.3g}, "
                                              f"ratio {ratio:.3g}, {'inside' if inside else 'outside'} "
                                              f"[{low:g}, {high:g}]")


def _not_run(test: str, why: str) -> str:
    """The test column of a row shown but not tested: the test its kind fixes, and why it did not run."""
    name = test.split(":")[0].strip()
    if name.startswith("none ("):  # no test to begin with (a descriptive row): only the reason is added
        return f"{name[:-1]}; {why})"
    return f"{name} (not run: {why})" if name else f"none ({why})"


def evaluate_claim(claim: Claim, records: Sequence[RunRecord] | None) -> tuple[dict[str, str], Outcome]:
    """One row of the claims table before the correction: its fixed cells, and the outcome of its test."""
    paper_text, effect = _paper_figure(claim)
    if claim.kind == "not addressed":
        row = {"claim": claim.claim, "sweep": "-", "comparison": "-", "metric": "-", "paper": paper_text}
        return row, CHECKS[claim.kind](claim, (), None)
    row = {"claim": claim.claim, "sweep": claim.sweep, "comparison": _comparison(claim), "metric": claim.metric,
           "paper": paper_text}
    if not records:
        return row, Outcome(_no_figures(), None, lambda q: NOT_RUN, [claim.why])
    missing = _missing(claim, records)
    if missing:
        return row, Outcome(_no_figures(), None, lambda q: NOT_RUN, [*missing, claim.why])
    effect, compared = _matching_effect(claim, effect, records)
    outcome = CHECKS[claim.kind](claim, records, effect)
    if claim.metric == LOSS_SPIKES:
        outcome.notes.append(_spike_rule(records))
    diverged = sum(r.status == "diverged" for r in _runs_read(claim, records))
    if diverged:
        outcome.notes.append(f"{diverged} diverged run(s) counted as uniform prediction"
                             if not math.isnan(worst_value(records[0], claim.metric))
                             else f"{diverged} diverged run(s) have no {claim.metric} and are left out")
    # Figures shown, not tested: the column still names the row's test, fixed by its kind, with why it did not run.
    untested = outcome.cells | {"r (seeds)": "", "MDE": ""}
    if claim.true_by_construction:
        notes = [claim.true_by_construction, *outcome.notes, claim.why]
        untested["test"] = _not_run(outcome.cells["test"], "true by construction")
        return row, Outcome(untested, None, lambda q: TRUE_BY_CONSTRUCTION, notes)
    checked = [(rule, *_rule_holds(rule, records)) for rule in claim.testable_if]
    failed = [(rule, text) for rule, passed, text in checked if not passed]
    if failed:
        reasons = [f"not testable: {rule.reason} ({text})" for rule, text in failed]
        untested["test"] = _not_run(outcome.cells["test"], "not testable")
        return row, Outcome(untested, None, lambda q: NOT_TESTABLE, [*reasons, *outcome.notes, claim.why])
    if claim.kind == "direction":
        outcome.scale, scale_note = _init_scale(claim, records)
        outcome.notes += [compared, scale_note]
    outcome.notes = [f"testable: {text}" for _, _, text in checked] + outcome.notes + [claim.why]
    return row, outcome


def _verdicts(claims: Sequence[Claim], outcomes: Sequence[Outcome], q_values: Sequence[float | None]
              ) -> list[tuple[str, list[str]]]:
    """Each row's verdict from its q, then the init-scale rule: a row that would hold while its groups start at
    different scales is init-scale confounded, unless it names a scale-matched control row and that row holds (a
    control names no control of its own, so its verdict is final after the first pass)."""
    first: list[tuple[str, list[str]]] = []
    for claim, outcome, q in zip(claims, outcomes, q_values, strict=True):
        verdict = outcome.decide(q)
        if verdict == HOLDS and outcome.scale == DIFFERS and claim.scale_control is None:
            first.append((CONFOUNDED, ["no scale-matched control row (scale_control)"]))
        else:
            first.append((verdict, []))
    by_claim = {claim.claim: verdict for claim, (verdict, _) in zip(claims, first, strict=True)}
    final = []
    for claim, outcome, (verdict, notes) in zip(claims, outcomes, first, strict=True):
        if verdict == HOLDS and outcome.scale == DIFFERS and claim.scale_control is not None:
            control = by_claim.get(claim.scale_control, "not in this table")
            verdict = HOLDS if control == HOLDS else CONFOUNDED
            notes = [f"the scale-matched control row \"{claim.scale_control}\": {control}"]
        final.append((verdict, notes))
    return final


def claims_table(records_by_sweep: Mapping[str, Sequence[RunRecord]], claims: Sequence[Claim]) -> pd.DataFrame:
    """Every claim, in order, with p and the table's Benjamini-Hochberg q over the rows with a p-value; a claim whose
    sweep is not given is marked "not run"."""
    evaluated = [evaluate_claim(claim, records_by_sweep.get(claim.sweep)) for claim in claims]
    q_values = benjamini_hochberg([outcome.p_value for _, outcome in evaluated])
    verdicts = _verdicts(claims, [outcome for _, outcome in evaluated], q_values)
    rows = []
    for (row, outcome), q, (verdict, notes) in zip(evaluated, q_values, verdicts, strict=True):
        rows.append(row | outcome.cells | {"p": _p(outcome.p_value), "q": _p(q), "verdict": verdict,
                                           "note": "; ".join(n for n in [*outcome.notes, *notes] if n)})
    return pd.DataFrame(rows, columns=COLUMNS)


def kinds() -> tuple[str, ...]:
    import typing

    return typing.get_args(Kind)


VERDICT_RULES = [
    "Seeds and test: a row compares two groups over the seeds both ended (shared seeds), and its means are over those "
    "seeds. Every sweep crosses its variants with the same seeds, and runs of one seed share data order and "
    "initialisation (common random numbers): the design pairs them, so every two-group row's test is the paired "
    "t-test (column test), fixed before any run and whatever the values. Welch's test would serve only groups without "
    "seed pairs; no sweep here has such groups, so no row uses it. Fewer than two shared seeds: no test. Column r "
    "(Pearson's r of the two groups over the shared seeds) describes the pairing and chooses nothing. Perplexity "
    "differences and their 95% intervals are % of the second group's mean.",
    "Multiple comparisons: p (two-sided) of every tested row is corrected across the whole table by "
    "Benjamini-Hochberg (column q); verdicts are decided on q < 0.05. Rows without a p-value are not in the family.",
    "Direction (paired t): holds at q < 0.05 the paper's way; does not hold at q < 0.05 the other way; for "
    "perplexity, does not hold (the paper's size excluded) when the 95% interval of our relative difference lies "
    "wholly on the near side of every effect the paper reports for the sweep's kind of model (Table 2 for a dense "
    "sweep, Tables 1, 3 and 4 for an MoE one; the paper column gives the figure and the note says which one the "
    "interval is compared with), and never where the paper has no figure for that kind of model; otherwise "
    "inconclusive at this scale, with the way our figures point (the paper's direction, or the other way). The MDE "
    "(80% power at p < 0.05) describes the test and decides nothing. Change (paired t on each seed's change of the "
    "metric between two settings): the same, without the paper's size.",
    f"Init scale: a direction row that would hold, whose two groups' mean {INIT_SCALE_METRIC} (the attention "
    f"sublayer's output RMS at step 0, mean over layers) are in a ratio outside [{INIT_SCALE_RATIO[0]:g}, "
    f"{INIT_SCALE_RATIO[1]:g}], is init-scale confounded (its test figures shown), unless it names a scale-matched "
    "control row (a direction row about the same group against one that starts at its scale) and that row holds. "
    "Where the runs do not log the metric the rule cannot be applied, and the row's note says so.",
    "Closeness (TOST, paired t; also where the paper reports no difference): two one-sided tests of the difference "
    "within +-margin. Margins come from the paper, never from our runs: a fraction (half) of the paper's own "
    "perplexity gain on the sweep's kind of model, or a stated relative margin with its reason, as a share of the "
    "second group's mean (the note names it); holds at q < 0.05, does not hold when the 95% interval lies beyond the "
    "margin, otherwise inconclusive.",
    "Level (one-sample t): the mean against the level; holds at q < 0.05 on the claimed side, does not hold at "
    "q < 0.05 on the other. Rank (Kendall tau): our means against the paper's, holds at q < 0.05 with tau > 0; "
    f"also within the gated rows only, with a 95% bootstrap interval over seeds ({BOOTSTRAP_RESAMPLES} resamples, "
    "fixed seed).",
    "LR sensitivity (Wortsman et al. 2023; paired t): per seed, the mean over the grid of rates of min(final "
    "val/loss, ln vocab) minus its lowest; compared like a change. Stable rate: the highest rate at which no run "
    "diverged or ended at or above ln vocab; descriptive, not tested.",
    "Diverged runs count in both groups, as the worst value: the loss (ln vocab) or perplexity (vocab) of uniform "
    "prediction; a probe has no worst value, so its diverged runs are left out and counted in the note.",
    "Not testable at this scale: a condition the claim needs did not arise in these runs (no attention sink, no "
    "massive activation, gate scores not moved from init, no instability at any rate); the row's note states the rule, "
    "its threshold and what was measured. Such rows, rows true by construction (shown with the reason) and "
    "descriptive rows get no p-value, are not in the Benjamini-Hochberg family, and count neither for nor against "
    "the paper.",
    "Not addressed: a claim of the paper no sweep here tests (what is missing is in the note); shown so that the "
    "table's silence is not read as support, and outside the count and the correction.",
    f"Loss spikes (metric {LOSS_SPIKES}): counted per run on the logged train/loss after warmup, a spike being a rise "
    f"between logged steps above {SPIKE_SIGMAS:g} x the noise of such rises in the same sweep's baseline runs "
    "(1.4826 x their median absolute deviation); compared like any metric. App. A.3 sparsity (metric "
    "sparsity_over_mean_gate): the share of gated SDPA output values below 1e-2 minus that of the ungated output "
    "scaled by the layer's mean gate score, per run.",
    "Paper: Qiu et al. 2025 (arXiv 2505.06708), Tables 1-4, numbers in results/paper/; its models are 15B MoE / 1.7B "
    "dense on 400B tokens or more, so compare directions, not magnitudes.",
]


# --- the summary: the first paragraph of results/tiny/README.md, from the table ---------------------------------------

# The paper's dense models: 1.7B parameters on 400B to 3.5T tokens (Table 2's blocks).
PAPER_DENSE_PARAMETERS, PAPER_DENSE_TOKENS = 1.7e9, (400e9, 3.5e12)


def tokens_per_parameter(records_by_sweep: Mapping[str, Sequence[RunRecord]]) -> list[tuple[str, float]]:
    """(sweep, training tokens per parameter of its baseline: max_steps x batch_size x seq_len over the baseline's
    parameter count) for each sweep with runs and a resolved vocabulary."""
    from gatelab.model.params import count_parameters, resolve_model

    regimes = []
    for sweep, records in records_by_sweep.items():
        first = next((r for r in records if r.spec.experiment.variant == "baseline"), records[0] if records else None)
        if first is None or _vocab_size(first) is None:
            continue
        experiment = first.spec.experiment
        tokens = experiment.train.max_steps * experiment.train.batch_size * experiment.data.seq_len
        regimes.append((sweep, tokens / count_parameters(resolve_model(experiment))))
    return regimes


def _count(verdicts: Sequence[str], label: str) -> int:
    return sum(v == label or v.startswith((f"{label} ", f"{label}:")) for v in verdicts)


def _claims_list(table: pd.DataFrame, label: str, with_q: bool = True) -> str:
    """The rows with a verdict, as "claim (sweep, q Q, how)", q as the table prints it (never rounded again)."""
    items = []
    for _, row in table.iterrows():
        if row["verdict"] == label or row["verdict"].startswith(f"{label} ("):
            how = row["verdict"][len(label):].strip(" ()")
            items.append(f"{row['claim']} ({row['sweep']}, q {row['q']}{', ' + how if how else ''})" if with_q
                         else row["claim"])
    return "; ".join(items) or "none"


def summary(table: pd.DataFrame, regimes: Sequence[tuple[str, float]] = ()) -> str:
    """The first paragraph of results/tiny/README.md, made from the claims table (`claims_table`) and the regimes'
    tokens per parameter (`tokens_per_parameter`), so that its counts and q-values cannot drift from the table."""
    verdicts = list(table["verdict"])
    count = {label: _count(verdicts, label) for label in (HOLDS, FAILS, CONFOUNDED, INCONCLUSIVE, NOT_TESTABLE,
                                                          TRUE_BY_CONSTRUCTION, DESCRIPTIVE, NOT_RUN, NOT_ADDRESSED)}
    ways = [sum(v == _inconclusive(sign, 1.0) for v in verdicts) for sign in (1.0, -1.0)]
    low, high = (t / PAPER_DENSE_PARAMETERS for t in PAPER_DENSE_TOKENS)
    scale = ", ".join(f"{sweep} {value:,.3g}" for sweep, value in regimes)
    lines = [
        f"The claims table tests the paper's claims on runs of {len(set(table['sweep']) - {'-'})} sweeps at tiny "
        "scale"
        + (f" (training tokens a parameter: {scale}; the paper's dense models see {low:,.0f} to {high:,.0f})"
           if regimes else "") + ".",
        f"Of its {len(table)} rows, {int((table['p'] != '').sum())} have a test (a p-value each, corrected together "
        f"by Benjamini-Hochberg). Verdicts: {HOLDS} {count[HOLDS]}; {FAILS} {count[FAILS]}; {CONFOUNDED} "
        f"{count[CONFOUNDED]}; {INCONCLUSIVE} {count[INCONCLUSIVE]} ({ways[0]} pointing the paper's way, {ways[1]} "
        f"the other way, {count[INCONCLUSIVE] - sum(ways)} with no direction to point).",
        f"Counting neither for nor against the paper: {NOT_TESTABLE} {count[NOT_TESTABLE]} (a condition the claim "
        f"needs did not arise); {TRUE_BY_CONSTRUCTION} {count[TRUE_BY_CONSTRUCTION]}; descriptive "
        f"{count[DESCRIPTIVE]}; {NOT_RUN} {count[NOT_RUN]}; {NOT_ADDRESSED} {count[NOT_ADDRESSED]} (claims of the "
        f"paper no sweep here tests: {_claims_list(table, NOT_ADDRESSED, with_q=False)}).",
        f"Holding: {_claims_list(table, HOLDS)}.",
        f"Not holding: {_claims_list(table, FAILS)}.",
        "At this scale the runs can say which way a change moves perplexity and the probes, and whether the paper's "
        "effect is excluded; they cannot say how large the paper's gains are at its scale, nor test what needs a "
        "trained model's attention sink or massive activations where the not-testable rows say none formed.",
    ]
    if regimes:
        most, value = max(regimes, key=lambda regime: regime[1])
        lines.append(f"The most trained regime here, {most} at {value:,.3g} tokens a parameter, is {low / value:,.2g} "
                     "times short of the paper's least-trained dense model.")
    return " ".join(lines) + "\n"


SUMMARY_START = ("<!-- summary: made by `gatelab claims` from the claims table (summary.md); edits here are "
                 "overwritten -->")
SUMMARY_END = "<!-- end of summary -->"


def replace_summary(readme: Path, paragraph: str) -> bool:
    """Put `paragraph` between the README's summary markers (SUMMARY_START, SUMMARY_END); False, the README left as
    it is, where it has none. The rest of the README is hand-written: it is replaced whole (a staged copy renamed over
    it), so a command killed half-way leaves the old README or the new one, never half of it."""
    text = readme.read_text(encoding="utf-8")
    start, end = text.find(SUMMARY_START), text.find(SUMMARY_END)
    if start < 0 or end < start:
        return False
    staged = readme.with_name(f".{readme.name}.{os.getpid()}.tmp")
    staged.write_text(f"{text[:start]}{SUMMARY_START}\n{paragraph.strip()}\n{text[end:]}", encoding="utf-8")
    os.replace(staged, readme)
    return True


def write_claims(records: Mapping[str, Sequence[RunRecord]], claims: Sequence[Claim], out_dir: Path,
                 formats: Sequence[str], command: str | None = None, log=print) -> list[Path]:
    """The claims table of the runs (`records`, by sweep name), written as `claims.<format>` under `out_dir`, and
    with Markdown its summary paragraph as `summary.md` (`summary`); prints each claim's verdict."""
    from gatelab.report.export import ReportTable, export_report
    from gatelab.report.tables import data_stamp

    frame = claims_table(records, claims)
    missing = dict.fromkeys(note for c in claims for note in missing_note(c.paper.table))  # one note per file
    table = ReportTable("The paper's claims at tiny scale", frame, VERDICT_RULES + list(missing))
    written = export_report([table], [], out_dir, formats, "claims", command=command,
                            stamp=data_stamp([r for rs in records.values() for r in rs]))
    if "md" in formats:  # the README's first paragraph, from the same table
        paragraph = summary(frame, tokens_per_parameter(records))
        written.append(Path(out_dir) / "summary.md")
        written[-1].write_text(paragraph, encoding="utf-8")
        readme = Path(out_dir) / "README.md"
        if readme.exists() and replace_summary(readme, paragraph):
            written.append(readme)
    log(frame[["claim", "ours", "p", "q", "verdict"]].to_string(index=False))
    return written
