"""Plots write real PNGs; exports write md/csv/latex/html; the HTML page renders in headless Chromium."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gatelab.report.export import ReportTable, export_report
from gatelab.report.plots import plot_context_length, plot_delta_vs_paper
from tests.eval.test_plots import assert_drawn, assert_no_data, png_size

CHROMIUM = Path("/usr/bin/chromium")


class TableRows(HTMLParser):
    """Every table's rows, by table id: the cell texts of each <tr> (header row included)."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.images: list[str] = []
        self._table: str | None = None
        self._row: list[str] | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table":
            self._table = attrs.get("id") or f"table{len(self.tables)}"
            self.tables[self._table] = []
        elif tag == "tr" and self._table is not None:
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []
        elif tag == "img":
            self.images.append(attrs.get("src", ""))

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.tables[self._table].append(self._row)
            self._row = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def parse(html_text: str) -> TableRows:
    parser = TableRows()
    parser.feed(html_text)
    return parser


# -- plots ---------------------------------------------------------------------------------------------------------

PLOTS = {
    "delta_vs_paper": lambda p: plot_delta_vs_paper({"baseline": 0.0, "g1_sdpa_elem_sig": -0.21, "g2": 0.05},
                                                    {"baseline": 0.0, "g1_sdpa_elem_sig": -0.27, "g3": 0.1}, p),
    "context_length": lambda p: plot_context_length({"baseline": {1: 12.0, 2: 30.0, 4: 400.0},
                                                     "g1": {1: 11.5, 2: 13.0, 4: 20.0}}, 256, p),
}
EMPTY = {
    "delta_vs_paper": lambda p: plot_delta_vs_paper({}, {"g1": 0.2}, p),
    "context_length": lambda p: plot_context_length({"g1": {}}, 256, p),
}


@pytest.mark.parametrize("kind", sorted(PLOTS))
def test_each_plot_writes_a_png_of_the_figure_size(tmp_path, kind):
    assert_drawn(PLOTS[kind], tmp_path / "sub" / f"{kind}.png")


@pytest.mark.parametrize("kind", sorted(EMPTY))
def test_empty_inputs_give_a_no_data_figure(tmp_path, kind):
    assert_no_data(EMPTY[kind], tmp_path / f"{kind}.png")


# -- exports -------------------------------------------------------------------------------------------------------

def _tables() -> list[ReportTable]:
    main = pd.DataFrame({
        "variant": ["baseline", "g1_sdpa_elem_sig", "g2_value_head_sig"],
        "runs": ["3 finished", "3 finished", "2 finished, 1 diverged@120"],
        "ppl/avg (mean ± std (n))": ["18.120 ± 0.040 (3)", "17.610 ± 0.050 (3)", "17.990 ± 0.210 (2)"],
        "Δ vs baseline": ["", "-0.510", "-0.130"],
        "p": ["", "<0.001", "0.31"],
        "paper Avg PPL": ["6.026", "5.761", "5.820"],
    })
    probes = pd.DataFrame({"F-Attn": ["0.467", "0.048"], "gate mean": ["", "0.116"]},
                          index=pd.Index(["baseline", "g1_sdpa_elem_sig"], name="variant"))
    return [ReportTable("tiny: Avg PPL by variant", main,
                        ["Significance: Welch t-test & paired t-test of each row (α = 0.05).",
                         "Rank agreement with the paper on Avg PPL: Kendall's tau 1.000 (n = 3)."]),
            ReportTable("Attention sink & gates", probes, ["F-Attn: share of attention on the first token."])]


def _expected_rows(table: ReportTable) -> list[list[str]]:
    frame = table.frame if isinstance(table.frame.index, pd.RangeIndex) else table.frame.reset_index()
    return [list(map(str, frame.columns))] + [list(map(str, row)) for row in frame.itertuples(index=False)]


@pytest.fixture
def report(tmp_path):
    plots = [PLOTS["context_length"](tmp_path / "plots" / "context_length.png"),  # lines: visible in a screenshot
             PLOTS["delta_vs_paper"](tmp_path / "plots" / "delta_vs_paper.png")]
    out = tmp_path / "out"
    written = export_report(_tables(), plots, out, ["md", "csv", "latex", "html"], "tiny",
                            command="gatelab table sweeps/tiny.yaml --format md,csv,latex,html")
    return out, written, plots


def test_exports_write_every_format(report):
    out, written, _ = report
    assert [p.name for p in written] == ["tiny.md", "tiny.csv", "tiny_attention_sink_gates.csv", "tiny.tex",
                                         "tiny.html"]
    assert all(p.parent == out and p.stat().st_size > 0 for p in written)

    markdown = (out / "tiny.md").read_text()
    assert "| variant" in markdown and "| g1_sdpa_elem_sig" in markdown and "17.610 ± 0.050 (3)" in markdown
    assert "-0.510" in markdown and "6.026" in markdown  # formatted strings kept as they are, not re-parsed
    assert "- Rank agreement with the paper on Avg PPL: Kendall's tau 1.000 (n = 3)." in markdown
    assert "![delta vs paper](../plots/delta_vs_paper.png)" in markdown
    assert "gatelab table sweeps/tiny.yaml" in markdown

    for table, name in zip(_tables(), ["tiny.csv", "tiny_attention_sink_gates.csv"]):
        back = pd.read_csv(out / name, dtype=str, keep_default_na=False)
        assert [list(back.columns)] + back.values.tolist() == _expected_rows(table)

    latex = (out / "tiny.tex").read_text()
    assert r"\begin{tabular}" in latex and r"\toprule" in latex and latex.count(r"\begin{table}") == 2
    assert r"g1\_sdpa\_elem\_sig" in latex and r"$\Delta$ vs baseline" in latex and r"$\pm$" in latex
    assert r"Welch t-test \& paired" in latex and r"\textless{}0.001" in latex
    assert r"\includegraphics[width=\linewidth]{../plots/context_length.png}" in latex
    assert not re.search(r"[^\x00-\x7f]", latex.split(r"\begin{document}")[1])  # pdflatex-safe: no raw Unicode


@pytest.mark.skipif(shutil.which("pdflatex") is None, reason="pdflatex is not installed (texlive-latex-recommended)")
def test_latex_compiles_with_pdflatex(report):
    out, _, _ = report
    wide = pd.DataFrame({f"metric number {i} with a long name": ["1.000 ± 0.100 (3)"] * 2 for i in range(12)})
    export_report([*_tables(), ReportTable("wide: 100% of ~ ^ # $", wide, ["\\ { } _"])],
                  sorted((out.parent / "plots").glob("*.png")), out, ["latex"], "wide")
    compiled = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "wide.tex"], cwd=out,
                              capture_output=True, text=True, timeout=120)
    assert compiled.returncode == 0, compiled.stdout[-3000:]
    assert (out / "wide.pdf").stat().st_size > 10_000 and "Overfull" not in compiled.stdout


def test_html_is_one_self_contained_page_with_every_row(report):
    out, _, plots = report
    page = (out / "tiny.html").read_text()
    parsed = parse(page)
    assert set(parsed.tables) == {"table-tiny_avg_ppl_by_variant", "table-attention_sink_gates"}
    for table, rows in zip(_tables(), parsed.tables.values()):
        assert rows == _expected_rows(table)
    assert len(parsed.images) == len(plots)
    assert all(src.startswith("data:image/png;base64,") for src in parsed.images)
    assert "<script" not in page and "http://" not in page and "https://" not in page  # nothing to fetch or run
    assert "&lt;0.001" in page and "gatelab table sweeps/tiny.yaml" in page
    assert re.search(r"Generated <time>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC</time>", page)
    for note in ("Significance: Welch t-test &amp; paired t-test", "F-Attn: share of attention on the first token."):
        assert note in page


def test_unknown_format_names_the_valid_ones(tmp_path):
    with pytest.raises(ValueError, match=r"'docx'.*valid formats: md, csv, latex, html"):
        export_report(_tables(), [], tmp_path / "out", ["md", "docx"], "tiny")
    assert not (tmp_path / "out").exists()  # nothing written before the check
    with pytest.raises(ValueError, match="no report format"):
        export_report(_tables(), [], tmp_path / "out", [], "tiny")


# -- headless Chromium -----------------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def chromium() -> str:
    """A headless Chromium, or a skip that says how to get one: tests never install system packages themselves."""
    found = shutil.which("chromium") or (str(CHROMIUM) if CHROMIUM.exists() else None)
    if not found:
        pytest.skip("no headless browser: install Debian's chromium (`apt-get install --no-install-recommends "
                    "chromium`, the README's optional test set-up step) to render the HTML report")
    return found


def _chromium(binary: str, profile: Path, *args: str) -> subprocess.CompletedProcess:
    command = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--disable-dev-shm-usage", "--hide-scrollbars", f"--user-data-dir={profile}",
               "--enable-logging=stderr", "--v=0", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def _console_errors(log: str) -> list[str]:
    pattern = re.compile(r"Uncaught|console error|CONSOLE.*error|Failed to load resource|net::ERR_", re.IGNORECASE)
    return [line for line in log.splitlines() if pattern.search(line)]


@pytest.mark.slow
def test_html_report_renders_in_headless_chromium(report, chromium, tmp_path):
    out, _, _ = report
    url = (out / "tiny.html").resolve().as_uri()

    # The console check can see errors at all: a page whose script throws is reported.
    broken = tmp_path / "broken.html"
    broken.write_text("<!DOCTYPE html><html><body><script>undefinedFunction();</script></body></html>")
    control = _chromium(chromium, tmp_path / "profile-control", "--dump-dom", broken.as_uri())
    assert _console_errors(control.stderr), "chromium's log shows no console errors even for a throwing page:\n" \
        + control.stderr[-2000:]

    dumped = _chromium(chromium, tmp_path / "profile-dom", "--dump-dom", url)
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    assert not _console_errors(dumped.stderr), dumped.stderr[-2000:]
    dom = parse(dumped.stdout)
    for table, rows in zip(_tables(), dom.tables.values()):
        assert rows == _expected_rows(table)
    assert len(dom.images) == 2 and all(src.startswith("data:image/png;base64,") for src in dom.images)

    screenshot = out / "screenshot.png"
    shot = _chromium(chromium, tmp_path / "profile-shot", f"--screenshot={screenshot}", "--window-size=1200,2000",
                     url)
    assert shot.returncode == 0 and screenshot.exists(), shot.stderr[-2000:]
    assert not _console_errors(shot.stderr), shot.stderr[-2000:]
    assert png_size(screenshot) == (1200, 2000)
    from matplotlib.image import imread

    pixels = (imread(screenshot)[..., :3] * 255).round().astype(np.uint8)
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 100  # text, table, plot: not a blank page
    colours = {tuple(c) for c in np.unique(pixels.reshape(-1, 3), axis=0)}
    assert (0xEE, 0xF2, 0xF7) in colours  # the table's header cells are painted
    tab_blue, tab_orange = np.array([31, 119, 180]), np.array([255, 127, 14])
    for colour in (tab_blue, tab_orange):  # the plot's lines are on screen
        assert (np.abs(pixels.astype(int) - colour).sum(axis=-1) < 12).sum() > 100
    keep = os.environ.get("GATELAB_KEEP_SCREENSHOT")
    if keep:
        shutil.copy(screenshot, keep)


def test_a_variant_has_one_colour_in_every_figure_of_a_report(tmp_path, monkeypatch):
    """The gate-score histogram has no baseline: drawn with matplotlib's own cycle, its first variant took the colour
    the baseline has in every other figure."""
    import gatelab.eval.plots as kit
    import gatelab.report.plots as report_plots
    from gatelab.eval.plots import VariantColours, plot_first_token_attention, plot_gate_histograms

    drawn = []
    for module in (kit, report_plots):
        monkeypatch.setattr(module, "save_png", lambda figure, path: drawn.append(figure.axes[0]) or Path(path))
    colours = VariantColours()
    for group in ("baseline", "g1_elem_sig", "g2_elem_sig"):
        colours[group]
    plot_first_token_attention({"baseline": [0.5, 0.6], "g1_elem_sig": [0.1, 0.2], "g2_elem_sig": [0.3, 0.1]},
                               tmp_path / "a.png", colours)
    plot_gate_histograms({"g1_elem_sig": [1, 2, 3], "g2_elem_sig": [3, 2, 1]}, tmp_path / "b.png", colours)
    plot_context_length({"g2_elem_sig": {1: 10.0, 2: 12.0}}, 64, tmp_path / "c.png", colours)
    from matplotlib.colors import to_hex

    lines = {line.get_label(): to_hex(line.get_color()) for line in drawn[0].lines}
    stairs = {patch.get_label(): to_hex(patch.get_edgecolor()) for patch in drawn[1].patches}
    context = {line.get_label(): to_hex(line.get_color()) for line in drawn[2].lines if line.get_label() in colours}
    assert len(set(lines.values())) == 3
    assert stairs == {name: lines[name] for name in ("g1_elem_sig", "g2_elem_sig")}
    assert context == {"g2_elem_sig": lines["g2_elem_sig"]}
