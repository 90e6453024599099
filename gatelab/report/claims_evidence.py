"""What a claim's row weighs (gatelab.report.claims): each run's value of a metric (derived metrics, loss spikes, the
worst value a diverged run counts as), a group's runs by seed or over an axis, and the paper's figure for the claim."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from gatelab.metrics import LONG_PPL, LONG_PPL_BEYOND_TRAIN, SPARSITY, TRAIN_LOSS, VAL_LOSS
from gatelab.paper import SWEEP_TABLES, TABLES, model_kinds, read_rows
from gatelab.report.claims_file import Claim, PaperGain, group_name, parse_group
from gatelab.report.tables import ENDED, PPL, RunRecord, paper_reference

# --- what a run measured ----------------------------------------------------------------------------------------------


def _long_context(metrics: Mapping[str, float]) -> float:
    """ln of how much perplexity grows from the training length to the positions beyond it at 8x."""
    beyond, at_length = LONG_PPL_BEYOND_TRAIN.format(multiplier=8), LONG_PPL.format(multiplier=1)
    if beyond not in metrics or at_length not in metrics:
        return math.nan
    return math.log(metrics[beyond] / metrics[at_length])


def _ln_ppl(metrics: Mapping[str, float]) -> float:
    value = metrics.get(PPL, math.nan)
    return math.log(value) if value > 0 else math.nan


def _sparsity_over_mean_gate(metrics: Mapping[str, float]) -> float:
    """App. A.3: the share of gated SDPA output values below 1e-2, minus that share of the ungated output scaled by
    the layer's mean gate score (the paper's control: as small on average, but not input-dependent)."""
    gated, control = (SPARSITY.format(measure=f"{output}_output_below_0.01") for output in ("gated", "control"))
    return metrics.get(gated, math.nan) - metrics.get(control, math.nan)


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


def spike_rule(records: Sequence[RunRecord]) -> str:
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


def vocab_size(record: RunRecord) -> int | None:
    size = record.spec.experiment.model.vocab_size
    return size if isinstance(size, int) else None


def worst_value(record: RunRecord, metric: str) -> float:
    """What a diverged run counts as: the loss or perplexity of uniform prediction over the vocabulary (what a model
    that learned nothing scores, and the cap of the learning-rate sensitivity); NaN for metrics with no worst value
    (the probes), whose diverged runs are then left out and counted in the row's note."""
    vocab = vocab_size(record)
    if vocab is None:
        return math.nan
    if metric.startswith("ppl/"):
        return float(vocab)
    if metric in (VAL_LOSS, TRAIN_LOSS, "ln_ppl"):
        return math.log(vocab)
    return math.nan


def run_value(record: RunRecord, metric: str) -> float:
    if record.status == "diverged":
        return worst_value(record, metric)
    value = DERIVED[metric](record.metrics) if metric in DERIVED else float(record.metrics.get(metric, math.nan))
    return value if math.isfinite(value) else worst_value(record, metric)


def by_seed(records: Sequence[RunRecord], group: str, metric: str) -> dict[int, float]:
    """{seed: value} of a group's ended runs: a finished run's metric, a diverged run's `worst_value` (NaN where the
    metric has none). Runs in other states (missing, running, failed) are left out."""
    return {r.spec.experiment.seed: run_value(r, metric) for r in records
            if r.group == group and r.status in ENDED}


def axis_runs(records: Sequence[RunRecord], group: str, axis: str) -> dict[float, list[RunRecord]]:
    """{value of `axis`: the ended runs of `group` (a group without `axis`) at that value}, by value."""
    variant, settings = parse_group(group)
    runs: dict[float, list[RunRecord]] = {}
    for r in records:
        rest = {k: v for k, v in r.spec.settings().items() if k != axis}
        if (r.spec.experiment.variant == variant and axis in r.spec.settings() and rest == settings
                and r.status in ENDED):
            runs.setdefault(r.spec.settings()[axis], []).append(r)
    return dict(sorted(runs.items()))


def with_settings(group: str, more: Mapping[str, object]) -> str:
    """The group with more settings: ('g1_elem_sig', {'train.lr': 0.008}) -> 'g1_elem_sig train.lr=0.008'."""
    variant, settings = parse_group(group)
    return group_name(variant, {**settings, **more})


# --- the paper's figure -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PaperEffect:
    """The paper's relative perplexity effect for a row, (a - b) / b of each of its row pairs, and the model (dense or
    MoE) the figures are from."""

    effects: tuple[float, ...]
    model: str | None  # "dense", "moe"; None where the table mixes both (or names none)
    source: str  # the table, in words: "Table 2"


def row_labels(table: str) -> tuple[str, dict[str, str]]:
    """The tables of a SWEEP_TABLES key in words ("Table 2") and {id: the paper's row label, "(8)"}."""
    names = SWEEP_TABLES.get(table, ())
    labels = {r["id"]: r.get("row") or r["id"] for t in names for r in read_rows(t) or []}
    return " and ".join(TABLES[t].name for t in names), labels


def paper_figure(claim: Claim) -> tuple[str, PaperEffect | None]:
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
    if claim.kind == "rank" or (len(ids) < 2 and not figure.pairs):
        return "", None
    pairs = [(a, b) for a, b in figure.pairs or [(ids[0], ids[1])] if present(a) and present(b)]
    if not pairs:
        return "", None
    effects = tuple((float(values[a]) - float(values[b])) / float(values[b]) for a, b in pairs)
    kinds, (source, labels) = model_kinds(figure.table), row_labels(figure.table)
    effect = PaperEffect(effects, next(iter(kinds)) if len(kinds) == 1 else None, source) \
        if figure.column == "ppl" else None
    if figure.pairs is None:
        a, b = float(values[pairs[0][0]]), float(values[pairs[0][1]])
        return f"{a:g} vs {b:g}" + (f" ({100 * effects[0]:+.1f}%)" if effect else ""), effect
    rows = ", ".join(f"{labels.get(a, a)} vs {labels.get(b, b)}" for a, b in pairs)
    return f"{effect_span(effects)} ({source} rows {rows})", effect


def effect_span(effects: Sequence[float]) -> str:
    """The paper's relative effects as a range, smallest to largest in size: "-0.8% to -3.6%" ("-1.3%" for one)."""
    low, high = sorted(effects, key=abs)[0], sorted(effects, key=abs)[-1]
    return f"{100 * low:+.1f}%" if low == high else f"{100 * low:+.1f}% to {100 * high:+.1f}%"


def paper_gain(gain: PaperGain) -> float:
    """The paper's relative perplexity gain (ids[0] - ids[1]) / ids[1]; NaN where its file or a figure is missing."""
    values = paper_reference(gain.table)["ppl"]
    a, b = (float(values[i]) if i in values.index and pd.notna(values[i]) else math.nan for i in gain.ids)
    return (a - b) / b
