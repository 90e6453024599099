"""The figures of a sweep's report, shaped like the paper's: each function writes one PNG and returns its path. The
drawing kit, and one run's figures `gatelab table` draws beside them, are in `gatelab.eval.plots`."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullLocator

from gatelab.eval.plots import (
    VariantColours,
    colour_of,
    finite_or_nan,
    new_figure,
    save_no_data,
    save_png,
    save_with_legend,
)
from gatelab.report.ladder import LadderFit, Rungs, scaling_law

DELTA_LABEL = "Δ vs baseline"


def plot_delta_vs_paper(our_delta: Mapping[str, float], paper_delta: Mapping[str, float], path: str | Path,
                        metric: str = "Avg PPL", unit: str = "") -> Path:
    """Our change against baseline beside the paper's, one annotated point per variant both have; on the diagonal
    the two agree, in the lower-left and upper-right quadrants they agree in direction. `unit` (e.g. "%") is the
    changes' unit, named on the axes."""
    label = f"{DELTA_LABEL} ({unit})" if unit else DELTA_LABEL
    figure, axes = new_figure(f"{metric}: {label}, ours against the paper's", f"paper: {label}", f"ours: {label}")
    pairs = {k: (float(paper_delta[k]), float(our_delta[k])) for k in our_delta if k in paper_delta
             and math.isfinite(float(paper_delta[k])) and math.isfinite(float(our_delta[k]))}
    if not pairs:
        return save_no_data(figure, axes, path, "no data: no variant has both our and the paper's Δ")
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
    return save_png(figure, path)


def plot_context_length(per_variant: Mapping[str, Mapping[int, float]], train_len: int, path: str | Path,
                        colours: Mapping[str, str] | None = None) -> Path:
    """Perplexity against evaluation context length (multiplier x train_len, log2 axis), one line per variant:
    how each variant extrapolates beyond its training length (the paper's Table 5)."""
    figure, axes = new_figure(f"Perplexity by context length (trained on {train_len} tokens)",
                              "context length (tokens, log2 scale)", "perplexity")
    lines = {}
    for name, by_multiplier in per_variant.items():
        points = sorted((float(m) * train_len, float(v)) for m, v in by_multiplier.items())
        if points:
            lines[name] = (np.array([p[0] for p in points]), finite_or_nan([p[1] for p in points]))
    if not lines or train_len <= 0:
        return save_no_data(figure, axes, path)
    for name, (lengths, ppl) in lines.items():
        axes.plot(lengths, ppl, marker="o", markersize=4, label=name, color=colour_of(colours, name))
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
    return save_with_legend(figure, axes, path, len(lines) + 1, grid="both")


def plot_gap_to_baseline(curves: Mapping[str, tuple[Sequence[int], Sequence[float], Sequence[float], Sequence[float]]],
                         path: str | Path, colours: Mapping[str, str] | None = None) -> Path:
    """Each variant's val/loss minus the baseline's against the training step, (steps, mean gaps, interval lows,
    interval highs) each: a line with its seed spread shaded (a NaN bound, one seed, leaves no band). Below the zero
    line the variant is ahead; whether the gap grows, holds or closes as the models train is the question (issue 17)."""
    figure, axes = new_figure("Gap to baseline during training (band: 95% t-interval over seeds)",
                              "step", "val/loss minus baseline (nats)")
    drawn = 0
    for name, (steps, means, lows, highs) in curves.items():
        steps, means = np.asarray(list(steps), dtype=float), finite_or_nan(means)
        if not steps.size or steps.size != means.size:
            continue
        (line,) = axes.plot(steps, means, marker="o", markersize=3, linewidth=1.4, label=name,
                            color=colour_of(colours, name))
        axes.fill_between(steps, finite_or_nan(lows), finite_or_nan(highs), color=line.get_color(), alpha=0.18,
                          linewidth=0)
        drawn += 1
    if not drawn:
        return save_no_data(figure, axes, path)
    axes.axhline(0.0, color="0.3", linewidth=0.9, linestyle="--", label="baseline")
    return save_with_legend(figure, axes, path, drawn + 1)


def plot_loss_vs_lr(curves: Mapping[str, tuple[Sequence[float], Sequence[float], Sequence[float]]],
                    diverged_rates: Mapping[str, Sequence[float]], init_loss: Mapping[str, float],
                    path: str | Path, colours: Mapping[str, str] | None = None) -> Path:
    """Final loss against learning rate (log axis), one line per variant, (rates, mean final losses, sds) each with
    the sd as error bars; each diverged run an 'x' at its variant's loss at init (dotted): Wortsman et al. 2023's
    loss-against-rate curves, a flatter and wider basin being the more stable variant."""
    figure, axes = new_figure("Final loss against learning rate (x: a diverged run, at the loss at init)",
                              "learning rate (log scale)", "final val/loss (nats)")
    rates_seen: set[float] = set()
    drawn = 0
    for name, (rates, means, sds) in curves.items():
        rates, means = np.asarray(list(rates), dtype=float), finite_or_nan(means)
        if not rates.size or rates.size != means.size or (np.isnan(means).all() and not diverged_rates.get(name)):
            continue
        container = axes.errorbar(rates, means, yerr=np.nan_to_num(finite_or_nan(sds)), marker="o", markersize=4,
                                  capsize=3, linewidth=1.4, label=name, color=colour_of(colours, name))
        color = container.lines[0].get_color()
        crashed = np.asarray(list(diverged_rates.get(name, [])), dtype=float)
        if crashed.size:  # nudged sideways per variant (3% of a rate), else every variant's x at a rate coincides
            nudge = 1.03 ** (drawn - (len(curves) - 1) / 2.0)
            axes.scatter(crashed * nudge, np.full(crashed.size, init_loss.get(name, np.nan)), marker="x", s=60,
                         color=color, zorder=3)
        rates_seen.update(float(r) for r in rates)
        drawn += 1
    if not drawn:
        return save_no_data(figure, axes, path)
    for level in sorted({float(v) for v in init_loss.values() if math.isfinite(float(v))}):
        axes.axhline(level, color="0.5", linewidth=0.9, linestyle=":")
    axes.set_xscale("log")
    ticks = sorted(rates_seen)
    axes.xaxis.set_major_locator(FixedLocator(ticks))
    axes.xaxis.set_minor_locator(NullLocator())
    axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    return save_with_legend(figure, axes, path, drawn)


def _law_label(name: str, fit: LadderFit) -> str:
    if not fit.testable:
        return f"{name}: its own A (multiplier not testable)"
    low, high = fit.interval
    return f"{name}: its own A, worth {fit.multiplier:.2f}x the baseline's compute [{low:.2f}, {high:.2f}]"


def plot_ladder(points_by_arm: Mapping[str, Rungs], fits: Mapping[str, LadderFit], path: str | Path,
                baseline: str = "baseline", unit: str = "FLOPs", colours: Mapping[str, str] | None = None,
                loss_label: str = "final val/loss (nats)") -> Path:
    """Final loss against compute (log axis) over a ladder of model sizes: each seed's loss at each rung a point, and
    each arm's fitted law L = L_inf + A C^-alpha a line, in the arm's colour. `fits` are `fit_ladder`'s results by
    variant; the baseline's line comes from the first with a law (all share the baseline's), each variant's from its
    own, labelled with its compute multiplier and interval. `loss_label` names the loss the points are."""
    figure, axes = new_figure("Loss against compute over the ladder, and each arm's fitted law",
                              f"compute ({unit}, log scale)", loss_label)
    colours = colours if colours is not None else VariantColours()
    seen: list[float] = []
    drawn = 0
    for name, rungs in points_by_arm.items():
        pairs = [(float(c), float(v)) for c, losses in rungs.items() for v in losses if math.isfinite(float(v))]
        if pairs:
            axes.scatter(*zip(*pairs), s=16, alpha=0.7, color=colour_of(colours, name), label=f"{name}: each seed")
            seen += [c for c, _ in pairs]
            drawn += 1
    if not drawn:
        return save_no_data(figure, axes, path)
    grid = np.geomspace(min(seen), max(seen), 200)
    with_law = [fit for fit in fits.values() if math.isfinite(fit.baseline_scale)]
    if with_law:
        law = with_law[0]
        axes.plot(grid, scaling_law(grid, law.irreducible_loss, law.baseline_scale, law.alpha), linewidth=1.4,
                  color=colour_of(colours, baseline),
                  label=f"{baseline}: L = {law.irreducible_loss:.3g} + A C^-{law.alpha:.3g}")
        drawn += 1
    for name, fit in fits.items():
        if fit.variant_scale > 0:  # NaN where no law was fitted; not above 0 where the variant is below L_inf
            axes.plot(grid, scaling_law(grid, fit.irreducible_loss, fit.variant_scale, fit.alpha), linewidth=1.4,
                      linestyle="--", color=colour_of(colours, name), label=_law_label(name, fit))
            drawn += 1
    axes.set_xscale("log")
    return save_with_legend(figure, axes, path, drawn, grid="both")
