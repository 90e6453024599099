"""One run's figures and the drawing kit write real PNGs of the figure size, a "no data" figure for empty inputs."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from gatelab.eval.plots import (
    DPI,
    FIGSIZE,
    plot_first_token_attention,
    plot_gate_histograms,
    plot_loss_curves,
    run_plot_writers,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SIZE = (round(FIGSIZE[0] * DPI), round(FIGSIZE[1] * DPI))  # width, height in pixels


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def distinct_colours(path: Path) -> int:
    from matplotlib.image import imread

    pixels = (imread(path)[..., :3] * 255).round().astype(np.uint8).reshape(-1, 3)
    return len(np.unique(pixels, axis=0))


def loss_history():
    steps = list(range(0, 500, 5))
    losses = list(6 * np.exp(-np.arange(100) / 25) + 2)
    losses[40] += 1.5
    return steps, losses


PLOTS = {
    "first_token": lambda p: plot_first_token_attention({"baseline": [0.1, 0.5, 0.6, 0.4],
                                                         "g1": [0.05, 0.04, 0.0, 0.03]}, p),
    "gate_histograms": lambda p: plot_gate_histograms({"g1": list(np.exp(-np.arange(20) / 3)), "g2": [5] * 20}, p),
    "loss_curves": lambda p: plot_loss_curves({"baseline": (*loss_history(), [200]),
                                               "g1": (*loss_history(), [])}, p),
}
EMPTY = {
    "first_token": lambda p: plot_first_token_attention({}, p),
    "gate_histograms": lambda p: plot_gate_histograms({"g1": [0] * 20}, p),
    "loss_curves": lambda p: plot_loss_curves({}, p),
}


def assert_drawn(draw, target) -> None:
    """`draw(target)` writes a PNG of the figure size there with something drawn on it."""
    assert draw(target) == target and target.stat().st_size > 10_000
    assert png_size(target) == SIZE
    assert distinct_colours(target) > 50  # lines, text antialiasing, colours: not a blank canvas


def assert_no_data(draw, target) -> None:
    """`draw(target)` writes a figure-sized PNG that says there is no data."""
    written = draw(target)
    assert png_size(written) == SIZE
    assert distinct_colours(written) > 2  # the "no data" text is drawn


@pytest.mark.parametrize("kind", sorted(PLOTS))
def test_each_plot_writes_a_png_of_the_figure_size(tmp_path, kind):
    assert_drawn(PLOTS[kind], tmp_path / "sub" / f"{kind}.png")


@pytest.mark.parametrize("kind", sorted(EMPTY))
def test_empty_inputs_give_a_no_data_figure(tmp_path, kind):
    assert_no_data(EMPTY[kind], tmp_path / f"{kind}.png")


def test_run_plot_writers_draw_one_runs_figures(tmp_path):
    steps, losses = loss_history()
    writers = run_plot_writers("g1_elem_sig", (steps, losses), [200], [0.1, 0.05, 0.02], 0.057,
                               {"g1": [[1.0] * 20, list(np.exp(-np.arange(20) / 3))]})
    assert sorted(writers) == ["first_token_attention.png", "gate_score_histogram.png", "loss_curve.png"]
    for name, write in writers.items():
        write(tmp_path / name)
        assert png_size(tmp_path / name) == SIZE and distinct_colours(tmp_path / name) > 50
    assert "gate_score_histogram.png" not in run_plot_writers("baseline", (steps, losses), [], [0.4], 0.4, {})
