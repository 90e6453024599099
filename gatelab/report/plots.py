"""The figures, shaped like the paper's: each function writes one PNG and returns its path. `gatelab table` draws them
over a sweep's groups; `run_plot_writers` draws the same figures for one run, as that run's MLflow artifacts.

Figures are drawn on `matplotlib.figure.Figure` objects with the Agg canvas, never through pyplot: no global figure
state, no display needed, safe beside other code that uses pyplot. Empty inputs give a figure saying "no data".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullLocator, PercentFormatter

FIGSIZE = (8.0, 5.0)  # inches
DPI = 120  # so every PNG is 960 x 600 pixels
DELTA_LABEL = "Δ vs baseline"


def _figure(title: str) -> tuple[Figure, object]:
    figure = Figure(figsize=FIGSIZE, dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    axes.set_title(title)
    return figure, axes


def _save(figure: Figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png", dpi=DPI)
    return path


def _no_data(figure: Figure, axes, path: str | Path, why: str = "no data") -> Path:
    axes.set_xticks([])
    axes.set_yticks([])
    axes.text(0.5, 0.5, why, ha="center", va="center", fontsize=16, color="0.4", transform=axes.transAxes)
    return _save(figure, path)


def _finite(values: Sequence[float]) -> np.ndarray:
    """Floats with inf/-inf as NaN, so matplotlib leaves a gap instead of stretching an axis to infinity."""
    array = np.asarray(list(values), dtype=float)
    array[~np.isfinite(array)] = np.nan
    return array


def _legend(axes, count: int) -> None:
    if count:
        axes.legend(fontsize="small", ncols=1 if count <= 8 else 2, frameon=False)


def plot_delta_vs_paper(our_delta: Mapping[str, float], paper_delta: Mapping[str, float], path: str | Path,
                        metric: str = "Avg PPL", unit: str = "") -> Path:
    """Our change against baseline beside the paper's, one annotated point per variant both have; on the diagonal
    the two agree, in the lower-left and upper-right quadrants they agree in direction. `unit` (e.g. "%") is the
    changes' unit, named on the axes."""
    label = f"{DELTA_LABEL} ({unit})" if unit else DELTA_LABEL
    figure, axes = _figure(f"{metric}: {label}, ours against the paper's")
    axes.set_xlabel(f"paper: {label}")
    axes.set_ylabel(f"ours: {label}")
    pairs = {k: (float(paper_delta[k]), float(our_delta[k])) for k in our_delta if k in paper_delta
             and math.isfinite(float(paper_delta[k])) and math.isfinite(float(our_delta[k]))}
    if not pairs:
        return _no_data(figure, axes, path, "no data: no variant has both our and the paper's Δ")
    xs, ys = np.array([p[0] for p in pairs.values()]), np.array([p[1] for p in pairs.values()])
    low, high = float(min(xs.min(), ys.min(), 0.0)), float(max(xs.max(), ys.max(), 0.0))
    pad = 0.08 * (high - low) or 1.0
    low, high = low - pad, high + pad
    axes.plot([low, high], [low, high], color="0.55", linestyle="--", linewidth=1, label="y = x (same change)")
    axes.axhline(0.0, color="0.75", linewidth=0.8)
    axes.axvline(0.0, color="0.75", linewidth=0.8)
    axes.scatter(xs, ys, s=36, color="tab:blue", zorder=3, label="variant")
    for name, (x, y) in pairs.items():
        axes.annotate(name, (x, y), xytext=(4, 4), textcoords="offset points", fontsize=8)
    axes.set_xlim(low, high)
    axes.set_ylim(low, high)
    axes.set_aspect("equal", adjustable="box")
    axes.legend(fontsize="small", loc="upper left", frameon=False)
    return _save(figure, path)


def plot_first_token_attention(per_variant: Mapping[str, Sequence[float]], path: str | Path) -> Path:
    """Per layer, the share of attention that goes to the first token (the attention sink), one line per variant:
    the paper's Figure 2."""
    figure, axes = _figure("Attention to the first token per layer")
    axes.set_xlabel("layer")
    axes.set_ylabel("share of attention on the first token")
    lines = {name: _finite(values) for name, values in per_variant.items() if len(values)}
    if not lines:
        return _no_data(figure, axes, path)
    for name, shares in lines.items():
        axes.plot(np.arange(len(shares)), shares, marker="o", markersize=3, label=name)
    layers = max(len(s) for s in lines.values())
    axes.set_xticks(range(layers) if layers <= 32 else range(0, layers, math.ceil(layers / 16)))
    axes.set_ylim(bottom=0.0)
    axes.yaxis.set_major_formatter(PercentFormatter(1.0))
    axes.grid(alpha=0.3)
    _legend(axes, len(lines))
    return _save(figure, path)


def plot_gate_histograms(per_variant: Mapping[str, Sequence[float]], path: str | Path) -> Path:
    """Gate scores' distribution per variant: bin counts over [0, 1] (20 bins), shown as shares of all scores in
    step plots: the paper's Figure 3."""
    figure, axes = _figure("Gate score distribution")
    axes.set_xlabel("gate score")
    axes.set_ylabel("share of gate scores")
    steps = {}
    for name, counts in per_variant.items():
        counts = np.nan_to_num(_finite(counts))
        if counts.size and counts.sum() > 0:
            steps[name] = counts / counts.sum()
    if not steps:
        return _no_data(figure, axes, path)
    for name, shares in steps.items():
        axes.stairs(shares, np.linspace(0.0, 1.0, len(shares) + 1), label=name, linewidth=1.5)
    axes.set_xlim(0.0, 1.0)
    axes.set_ylim(bottom=0.0)
    axes.yaxis.set_major_formatter(PercentFormatter(1.0))
    axes.grid(alpha=0.3)
    _legend(axes, len(steps))
    return _save(figure, path)


def plot_loss_curves(curves: Mapping[str, tuple[Sequence[int], Sequence[float], Sequence[int]]],
                     path: str | Path) -> Path:
    """Training loss per variant, (steps, losses, spike steps) each, loss spikes marked as dots: the paper's
    Figure 1 (right)."""
    figure, axes = _figure("Training loss (dots: loss spikes)")
    axes.set_xlabel("step")
    axes.set_ylabel("training loss")
    drawn = 0
    for name, (steps, losses, spikes) in curves.items():
        steps, losses = np.asarray(list(steps), dtype=float), _finite(losses)
        if not steps.size or steps.size != losses.size:
            continue
        order = np.argsort(steps, kind="stable")
        steps, losses = steps[order], losses[order]
        spikes = np.asarray(sorted(spikes), dtype=float)
        (line,) = axes.plot(steps, losses, linewidth=1.2, label=f"{name} ({len(spikes)} spikes)")
        if spikes.size:
            known = ~np.isnan(losses)
            at = np.interp(spikes, steps[known], losses[known]) if known.any() else np.full(spikes.size, np.nan)
            axes.scatter(spikes, at, s=28, color=line.get_color(), edgecolors="black", linewidths=0.5, zorder=3)
        drawn += 1
    if not drawn:
        return _no_data(figure, axes, path)
    axes.grid(alpha=0.3)
    _legend(axes, drawn)
    return _save(figure, path)


def plot_context_length(per_variant: Mapping[str, Mapping[int, float]], train_len: int, path: str | Path) -> Path:
    """Perplexity against evaluation context length (multiplier x train_len, log2 axis), one line per variant:
    how each variant extrapolates beyond its training length (the paper's Table 5)."""
    figure, axes = _figure(f"Perplexity by context length (trained on {train_len} tokens)")
    axes.set_xlabel("context length (tokens, log2 scale)")
    axes.set_ylabel("perplexity")
    lines = {}
    for name, by_multiplier in per_variant.items():
        points = sorted((float(m) * train_len, float(v)) for m, v in by_multiplier.items())
        if points:
            lines[name] = (np.array([p[0] for p in points]), _finite([p[1] for p in points]))
    if not lines or train_len <= 0:
        return _no_data(figure, axes, path)
    for name, (lengths, ppl) in lines.items():
        axes.plot(lengths, ppl, marker="o", markersize=4, label=name)
    axes.axvline(train_len, color="0.5", linestyle=":", linewidth=1, label="training length")
    axes.set_xscale("log", base=2)
    ticks = sorted({float(x) for lengths, _ in lines.values() for x in lengths})
    axes.xaxis.set_major_locator(FixedLocator(ticks))
    axes.xaxis.set_minor_locator(NullLocator())
    axes.set_xticklabels([f"{x:g}" for x in ticks])
    values = np.concatenate([ppl for _, ppl in lines.values()])
    values = values[~np.isnan(values)]
    if values.size and values.min() > 0 and values.max() / values.min() > 10:
        axes.set_yscale("log")
        axes.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        axes.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        axes.set_ylabel("perplexity (log scale)")
    axes.grid(alpha=0.3, which="both")
    _legend(axes, len(lines) + 1)
    return _save(figure, path)


def run_plot_writers(label: str, loss_history: tuple[Sequence[int], Sequence[float]], spikes: Sequence[int],
                     first_token_share: Sequence[float], f_attn: float,
                     gate_histogram: Mapping[str, Any] | None = None) -> dict[str, Callable[[Path], Path]]:
    """One run's figures by artifact file name, each a writer of that PNG: its loss curve with its spikes, its
    first-token attention per layer, and (for a gated model) its gate scores per gate position, all layers summed."""
    steps, losses = loss_history
    writers: dict[str, Callable[[Path], Path]] = {
        "loss_curve.png": lambda path: plot_loss_curves({label: (steps, losses, spikes)}, path),
        "first_token_attention.png": lambda path: plot_first_token_attention(
            {f"{label} (F-Attn {f_attn:.3f})": first_token_share}, path),
    }
    if gate_histogram:
        writers["gate_score_histogram.png"] = lambda path: plot_gate_histograms(
            {f"{label} {position}": np.sum(per_layer, axis=0) for position, per_layer in gate_histogram.items()}, path)
    return writers


def plot_gap_to_baseline(curves: Mapping[str, tuple[Sequence[int], Sequence[float], Sequence[float], Sequence[float]]],
                         path: str | Path) -> Path:
    """Each variant's val/loss minus the baseline's against the training step, (steps, mean gaps, interval lows,
    interval highs) each: a line with its seed spread shaded (a NaN bound, one seed, leaves no band). Below the zero
    line the variant is ahead; whether the gap grows, holds or closes as the models train is the question (issue 17)."""
    figure, axes = _figure("Gap to baseline during training (band: 95% t-interval over seeds)")
    axes.set_xlabel("step")
    axes.set_ylabel("val/loss minus baseline (nats)")
    drawn = 0
    for name, (steps, means, lows, highs) in curves.items():
        steps, means = np.asarray(list(steps), dtype=float), _finite(means)
        if not steps.size or steps.size != means.size:
            continue
        (line,) = axes.plot(steps, means, marker="o", markersize=3, linewidth=1.4, label=name)
        axes.fill_between(steps, _finite(lows), _finite(highs), color=line.get_color(), alpha=0.18, linewidth=0)
        drawn += 1
    if not drawn:
        return _no_data(figure, axes, path)
    axes.axhline(0.0, color="0.3", linewidth=0.9, linestyle="--", label="baseline")
    axes.grid(alpha=0.3)
    _legend(axes, drawn + 1)
    return _save(figure, path)


def plot_loss_vs_lr(curves: Mapping[str, tuple[Sequence[float], Sequence[float], Sequence[float]]],
                    diverged_rates: Mapping[str, Sequence[float]], init_loss: Mapping[str, float],
                    path: str | Path) -> Path:
    """Final loss against learning rate (log axis), one line per variant, (rates, mean final losses, sds) each with
    the sd as error bars; each diverged run an 'x' at its variant's loss at init (dotted): Wortsman et al. 2023's
    loss-against-rate curves, a flatter and wider basin being the more stable variant."""
    figure, axes = _figure("Final loss against learning rate (x: a diverged run, at the loss at init)")
    axes.set_xlabel("learning rate (log scale)")
    axes.set_ylabel("final val/loss (nats)")
    rates_seen: set[float] = set()
    drawn = 0
    for name, (rates, means, sds) in curves.items():
        rates, means = np.asarray(list(rates), dtype=float), _finite(means)
        if not rates.size or rates.size != means.size or (np.isnan(means).all() and not diverged_rates.get(name)):
            continue
        container = axes.errorbar(rates, means, yerr=np.nan_to_num(_finite(sds)), marker="o", markersize=4,
                                  capsize=3, linewidth=1.4, label=name)
        color = container.lines[0].get_color()
        crashed = np.asarray(list(diverged_rates.get(name, [])), dtype=float)
        if crashed.size:  # nudged sideways per variant (3% of a rate), else every variant's x at a rate coincides
            nudge = 1.03 ** (drawn - (len(curves) - 1) / 2.0)
            axes.scatter(crashed * nudge, np.full(crashed.size, init_loss.get(name, np.nan)), marker="x", s=60,
                         color=color, zorder=3)
        rates_seen.update(float(r) for r in rates)
        drawn += 1
    if not drawn:
        return _no_data(figure, axes, path)
    for level in sorted({float(v) for v in init_loss.values() if math.isfinite(float(v))}):
        axes.axhline(level, color="0.5", linewidth=0.9, linestyle=":")
    axes.set_xscale("log")
    ticks = sorted(rates_seen)
    axes.xaxis.set_major_locator(FixedLocator(ticks))
    axes.xaxis.set_minor_locator(NullLocator())
    axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axes.grid(alpha=0.3)
    _legend(axes, drawn)
    return _save(figure, path)
