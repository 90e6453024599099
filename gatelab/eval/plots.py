"""One run's figures, shaped like the paper's, and the drawing kit every gatelab figure uses: the end-of-run
evaluation (`gatelab.train.evaluate`) logs `run_plot_writers`'s PNGs as that run's MLflow artifacts, and a sweep's
report draws the same figures over its groups, and its own (`gatelab.report.plots`) with the same kit.

Figures are drawn on `matplotlib.figure.Figure` objects with the Agg canvas, never through pyplot: no global figure
state, no display needed, safe beside other code that uses pyplot. Empty inputs give a figure saying "no data".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from matplotlib.ticker import PercentFormatter

FIGSIZE = (8.0, 5.0)  # inches
DPI = 120  # so every PNG is 960 x 600 pixels


class VariantColours(dict):
    """One colour per variant across every figure of a report: a name's colour is fixed when it is first asked for
    (the report asks in the sweep's order), so a variant has the same colour in the gate-score histogram, which has
    no baseline, as in the plots that do. Missing: matplotlib's own cycle, plot by plot."""

    def __missing__(self, name: str) -> str:
        palette = [to_hex(c) for c in colormaps["tab10"].colors] + [to_hex(c) for c in colormaps["tab20"].colors[1::2]]
        self[name] = palette[len(self) % len(palette)]
        return self[name]


def colour_of(colours: Mapping[str, str] | None, name: str) -> str | None:
    return colours[name] if colours is not None else None


def new_figure(title: str, xlabel: str, ylabel: str) -> tuple[Figure, object]:
    figure = Figure(figsize=FIGSIZE, dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    axes.set(title=title, xlabel=xlabel, ylabel=ylabel)
    return figure, axes


def save_png(figure: Figure, path: str | Path) -> Path:
    """The figure as a 256-colour PNG: a line plot has few colours besides anti-aliasing, and the palette makes its
    file about a third of full colour's (results/ travels with every call to a GPU machine, under a size cap)."""
    from PIL import Image  # matplotlib's own dependency

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.set_dpi(DPI)
    figure.canvas.draw()
    rgb = Image.frombuffer("RGBA", figure.canvas.get_width_height(), figure.canvas.buffer_rgba()).convert("RGB")
    rgb.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(path, format="PNG", optimize=True)
    return path


def save_no_data(figure: Figure, axes, path: str | Path, why: str = "no data") -> Path:
    axes.set_xticks([])
    axes.set_yticks([])
    axes.text(0.5, 0.5, why, ha="center", va="center", fontsize=16, color="0.4", transform=axes.transAxes)
    return save_png(figure, path)


def finite_or_nan(values: Sequence[float]) -> np.ndarray:
    """Floats with inf/-inf as NaN, so matplotlib leaves a gap instead of stretching an axis to infinity."""
    array = np.asarray(list(values), dtype=float)
    array[~np.isfinite(array)] = np.nan
    return array


def save_with_legend(figure: Figure, axes, path: str | Path, count: int, grid: str = "major") -> Path:
    """The figure saved with a light grid on its `grid` ticks and a legend of its `count` entries, if any."""
    axes.grid(alpha=0.3, which=grid)
    if count:
        axes.legend(fontsize="small", ncols=1 if count <= 8 else 2, frameon=False)
    return save_png(figure, path)


def plot_first_token_attention(per_variant: Mapping[str, Sequence[float]], path: str | Path,
                               colours: Mapping[str, str] | None = None) -> Path:
    """Per layer, the share of attention that goes to the first token (the attention sink), one line per variant:
    the paper's Figure 2."""
    figure, axes = new_figure("Attention to the first token per layer",
                              "layer", "share of attention on the first token")
    lines = {name: finite_or_nan(values) for name, values in per_variant.items() if len(values)}
    if not lines:
        return save_no_data(figure, axes, path)
    for name, shares in lines.items():
        axes.plot(np.arange(len(shares)), shares, marker="o", markersize=3, label=name, color=colour_of(colours, name))
    layers = max(len(s) for s in lines.values())
    axes.set_xticks(range(layers) if layers <= 32 else range(0, layers, math.ceil(layers / 16)))
    axes.set_ylim(bottom=0.0)
    axes.yaxis.set_major_formatter(PercentFormatter(1.0))
    return save_with_legend(figure, axes, path, len(lines))


def plot_gate_histograms(per_variant: Mapping[str, Sequence[float]], path: str | Path,
                         colours: Mapping[str, str] | None = None) -> Path:
    """Gate scores' distribution per variant: bin counts over [0, 1] (20 bins), shown as shares of all scores in
    step plots: the paper's Figure 3."""
    figure, axes = new_figure("Gate score distribution", "gate score", "share of gate scores")
    steps = {}
    for name, counts in per_variant.items():
        counts = np.nan_to_num(finite_or_nan(counts))
        if counts.size and counts.sum() > 0:
            steps[name] = counts / counts.sum()
    if not steps:
        return save_no_data(figure, axes, path)
    for name, shares in steps.items():
        axes.stairs(shares, np.linspace(0.0, 1.0, len(shares) + 1), label=name, linewidth=1.5,
                    color=colour_of(colours, name))
    axes.set_xlim(0.0, 1.0)
    axes.set_ylim(bottom=0.0)
    axes.yaxis.set_major_formatter(PercentFormatter(1.0))
    return save_with_legend(figure, axes, path, len(steps))


def plot_loss_curves(curves: Mapping[str, tuple[Sequence[int], Sequence[float], Sequence[int]]],
                     path: str | Path, colours: Mapping[str, str] | None = None) -> Path:
    """Training loss per variant, (steps, losses, spike steps) each, loss spikes marked as dots: the paper's
    Figure 1 (right)."""
    figure, axes = new_figure("Training loss (dots: loss spikes)", "step", "training loss")
    drawn = 0
    for name, (steps, losses, spikes) in curves.items():
        steps, losses = np.asarray(list(steps), dtype=float), finite_or_nan(losses)
        if not steps.size or steps.size != losses.size:
            continue
        order = np.argsort(steps, kind="stable")
        steps, losses = steps[order], losses[order]
        spikes = np.asarray(sorted(spikes), dtype=float)
        (line,) = axes.plot(steps, losses, linewidth=1.2, label=f"{name} ({len(spikes)} spikes)",
                            color=colour_of(colours, name))
        if spikes.size:
            known = ~np.isnan(losses)
            at = np.interp(spikes, steps[known], losses[known]) if known.any() else np.full(spikes.size, np.nan)
            axes.scatter(spikes, at, s=28, color=line.get_color(), edgecolors="black", linewidths=0.5, zorder=3)
        drawn += 1
    if not drawn:
        return save_no_data(figure, axes, path)
    return save_with_legend(figure, axes, path, drawn)


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
