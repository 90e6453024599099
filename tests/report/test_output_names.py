"""`gatelab table`'s output (issue 18): a folder of the user's own by default, short file names, a README.md made with
the tables, the paper table of the sweep's model kind, changes in %, no test on one seed, an HTML page that fits a
laptop screen."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import yaml

from gatelab import paper
from gatelab.app import report as app_report
from gatelab.errors import GatelabError
from gatelab.report import report as R
from gatelab.report import tables
from gatelab.report.export import GENERATED_MARK, ReportTable, export_report
from gatelab.report.tables import ONE_SEED_TEST, RunRecord, build_comparison, comparison_title
from gatelab.sweep.spec import expand, load_sweep
from gatelab.variants import VARIANTS
from gatelab.workspace import Workspace
from tests.helpers import REPO

QUICKSTART = REPO / "sweeps" / "quickstart.yaml"
GAIN = {"baseline": 0.0, "g1_elem_sig": -0.30, "g1_head_sig": -0.29}  # relative change of ppl/avg against baseline
DOMAINS = ("code", "fiction", "nonfiction", "scripture", "speeches")


def _metrics(variant: str, seed: int) -> dict[str, float]:
    """quickstart-shaped metrics: ppl/avg, five domains, four context lengths and the probes (24 table columns)."""
    ppl = 420.0 * (1 + GAIN[variant]) + 3.0 * seed + (0.4 * seed * seed if variant != "baseline" else 0.0)
    metrics = {"ppl/avg": ppl, **{f"ppl/{d}": ppl * (0.8 + 0.1 * i) for i, d in enumerate(DOMAINS)},
               **{f"long_ppl/x{m}": ppl * (1 + 0.02 * m) for m in (1, 2, 4, 8)},
               "probe/m_act": 15.0 if variant == "baseline" else 4.0, "probe/f_attn": 0.013}
    if variant != "baseline":
        metrics["probe/gate_score_mean"] = 0.4
    return metrics


def _records(sweep: Path, status=lambda spec: "finished") -> list[RunRecord]:
    """One run per cell of `sweep`, with _metrics."""
    return [RunRecord(s, status(s), f"run-{s.index}", _metrics(s.experiment.variant, s.experiment.seed),
                      ended="2026-11-22 07:20:00 UTC") for s in expand(load_sweep(sweep))]


def _sweep_copy(tmp_path: Path, seeds=(0,), experiment: Path | None = None, paper_key: str | None = "table2") -> Path:
    """sweeps/quickstart.yaml with other seeds, preset or paper table, written under tmp_path."""
    definition = yaml.safe_load(QUICKSTART.read_text())
    definition["grid"]["seed"] = list(seeds)
    definition["experiment"] = str(experiment or (QUICKSTART.parent / definition["experiment"]).resolve())
    definition["paper"] = paper_key
    if paper_key is None:
        del definition["paper"]
    path = tmp_path / "quickstart.yaml"
    path.write_text(yaml.safe_dump(definition))
    return path


class _Store:
    """Stands in for RunStore: no histories or artifacts, and the report's upload is recorded."""

    logged: list[Path] = []

    def __init__(self, *args, **kwargs) -> None:
        pass

    def metric_history(self, run_id, name):
        return [], []

    def artifact_json(self, run_id, path):
        return None

    def log_report(self, name, paths):
        _Store.logged = list(paths)
        return "report-run"

    read_only = False  # the comparison runs are made, then dropped: gatelab.report.comparison_runs tests them

    def run_data(self, run_id):
        return SimpleNamespace(params={})

    def log_comparisons(self, name, comparisons):
        return [comparison.key for comparison in comparisons]


@pytest.fixture
def fake_store(monkeypatch):
    def use(records: list[RunRecord]) -> None:
        monkeypatch.setattr(app_report, "RunStore", _Store)  # the names gatelab.app.report calls
        monkeypatch.setattr(app_report, "missing_local_store", lambda uri: None)  # the stand-in store is there
        monkeypatch.setattr(tables, "collect_runs", lambda *args, **kwargs: records)
    return use


def _make(sweep: Path, runs_dir: Path, out: Path | None = None, formats=("md", "csv", "latex", "html"),
          command: str | None = None) -> list[Path]:
    return app_report.make_report(sweep, experiment=None, formats=list(formats), out_dir=out,
                                  workspace=Workspace(runs_dir=runs_dir), log=lambda *a: None, command=command)


# -- where and under which names ------------------------------------------------------------------------------------

def test_the_default_folder_is_runs_reports_sweep_and_git_ignores_it(tmp_path, fake_store):
    fake_store(_records(QUICKSTART))
    runs = tmp_path / "runs"
    written = _make(QUICKSTART, runs)
    out = runs / "reports" / "quickstart"
    assert {p.parent for p in written} == {out}
    assert [p.name for p in written if p.suffix != ".png"] == ["README.md", "quickstart.csv", "quickstart_arms.csv",
                                                               "quickstart_seeds.csv", "quickstart.tex",
                                                               "quickstart.html"]
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in written)
    assert _Store.logged == written  # the same files go to MLflow
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    # In the checkout, the default folder (runs/ under the repository) is one git ignores: results/ stays clean.
    ignored = subprocess.run(["git", "check-ignore", "-q", "runs/reports/quickstart/README.md"], cwd=REPO)
    assert ignored.returncode == 0


def test_an_explicit_out_is_honoured(tmp_path, fake_store):
    fake_store(_records(QUICKSTART))
    out = tmp_path / "elsewhere"
    written = _make(QUICKSTART, tmp_path / "runs", out, formats=["csv", "md"])
    assert [p.name for p in written if p.suffix != ".png"] == ["quickstart.csv", "quickstart_arms.csv",
                                                               "quickstart_seeds.csv", "README.md"]
    assert {p.parent for p in written} == {out} and not (tmp_path / "runs" / "reports").exists()


def test_further_tables_are_named_by_their_key_and_claims_keep_claims_md(tmp_path):
    frame = pd.DataFrame({"variant": ["baseline"], "x": ["1"]})
    tables = [ReportTable("a long title: ppl/avg by variant, beside the paper's Table 2", frame, key="main"),
              ReportTable("s: val/loss gap to baseline by training step", frame, key="gap"),
              ReportTable("another gap table", frame, key="gap"),
              ReportTable("a table without a key", frame)]
    written = export_report(tables, [], tmp_path / "t", ["csv"], "sweep")
    assert [p.name for p in written] == ["sweep.csv", "sweep_gap.csv", "sweep_gap_2.csv",
                                         "sweep_a_table_without_a_key.csv"]
    # gatelab claims: one table, Markdown under its own name (results/tiny/README.md is a hand-written summary)
    claims = export_report([ReportTable("The paper's claims at tiny scale", frame)], [], tmp_path / "c",
                           ["md", "csv", "latex", "html"], "claims")
    assert [p.name for p in claims] == ["claims.md", "claims.csv", "claims.tex", "claims.html"]


def test_a_hand_written_readme_is_refused_before_anything_is_written(tmp_path, fake_store):
    fake_store(_records(QUICKSTART))
    out = tmp_path / "reference"
    out.mkdir()
    (out / "README.md").write_text("# Quick-start results\n\nWritten by hand.\n")
    with pytest.raises(GatelabError, match=r"README.md: written by hand .*move it away, or name another folder"):
        _make(QUICKSTART, tmp_path / "runs", out)
    assert sorted(p.name for p in out.iterdir()) == ["README.md"]
    (out / "README.md").unlink()
    first = _make(QUICKSTART, tmp_path / "runs", out)
    assert (out / "README.md").read_text().startswith(GENERATED_MARK)
    again = _make(QUICKSTART, tmp_path / "runs", out)  # a README.md gatelab wrote is made again, byte for byte
    assert first == again


# -- the README -----------------------------------------------------------------------------------------------------

def test_the_readme_holds_the_command_tables_notes_closeness_and_plots(tmp_path, fake_store):
    fake_store(_records(QUICKSTART))
    command = "gatelab table sweeps/quickstart.yaml --out results/quickstart"
    _make(QUICKSTART, tmp_path / "runs", tmp_path / "out", command=command)
    readme = (tmp_path / "out" / "README.md").read_text()
    assert f"by `{command}`" in readme
    assert ("## quickstart: ppl/avg by variant (dense model), beside the paper's Table 2 (dense 1.7B, 48 layers"
            in readme)
    assert "| g1_head_sig" in readme and "- Paper columns: Qiu et al. 2025, Table 2" in readme
    assert "![delta vs paper](delta_vs_paper.png)" in readme
    closeness = readme.split("## How close your numbers should be")[1].split("## Plots")[0]
    for where, figures in R.CROSS_MACHINE_PPL:  # every measurement, with where it was made
        assert f"{' / '.join(f'{v:.1f}' for v in figures)} on {where}" in " ".join(closeness.split())
    baselines = [figures[0] for _, figures in R.CROSS_MACHINE_PPL]
    assert f"baseline {min(baselines):.1f} to {max(baselines):.1f}" in " ".join(closeness.split())
    assert "CPU kernels" in closeness and "compare the differences between variants" in closeness
    assert "This sweep has one seed" in closeness
    html = (tmp_path / "out" / "quickstart.html").read_text()
    assert "How close your numbers should be" in html and "CPU kernels" in html


def test_with_seeds_the_readme_gives_each_rows_measured_spread(tmp_path, fake_store):
    sweep = _sweep_copy(tmp_path, seeds=(0, 1, 2))
    records = _records(sweep)
    fake_store(records)
    _make(sweep, tmp_path / "runs")
    readme = (tmp_path / "runs" / "reports" / "quickstart" / "README.md").read_text()
    closeness = readme.split("## How close your numbers should be")[1]
    for variant in GAIN:
        values = [r.metrics["ppl/avg"] for r in records if r.spec.experiment.variant == variant]
        std = np.std(values, ddof=1)
        assert f"{variant} {std:.3f} ({100 * std / np.mean(values):.2f}% of its mean, 3 seeds)" in closeness
    assert "one seed" not in closeness


def test_seeds_in_the_grid_without_two_finished_runs_say_so(tmp_path):
    assert "This sweep has one seed" in R.seed_spread_text(_records(QUICKSTART))
    sweep = _sweep_copy(tmp_path, seeds=(0, 1))
    unfinished = _records(sweep, status=lambda spec: "finished" if spec.experiment.seed == 0 else "running")
    assert "This sweep has 2 seeds, but no row has two finished runs yet" in R.seed_spread_text(unfinished)
    partly = _records(sweep, status=lambda spec: "running" if spec.experiment.variant == "g1_head_sig" and
                      spec.experiment.seed == 1 else "finished")
    text = R.seed_spread_text(partly)
    assert "baseline " in text and "Fewer than two finished seeds, so no spread: g1_head_sig." in text


# -- which paper table ----------------------------------------------------------------------------------------------

def _paper_ppl_by_row(table: str) -> dict[str, float]:
    column = paper.TABLES[table].ppl
    return {row["row"]: float(row[column]) for row in paper.read_rows(table) if row[column] != "-"}


def test_a_dense_sweep_is_set_beside_table2s_block_of_its_variants():
    records = _records(QUICKSTART)
    assert load_sweep(QUICKSTART).paper == "table2"
    result = build_comparison(records, "table2")
    frame = result.frame.set_index("variant")
    by_row = _paper_ppl_by_row("table2")
    for variant, row in {"baseline": "(5)", "g1_elem_sig": "(8)", "g1_head_sig": "(9)"}.items():
        assert frame.loc[variant, "paper Avg PPL"] == f"{by_row[row]:.3f}"
    assert frame.loc["g1_elem_sig", "paper Δ"] == f"{by_row['(8)'] - by_row['(5)']:+.3f}"
    assert not any(note.startswith("Model kind differs") for note in result.notes)
    assert any("Table 2 rows (5), (8), (9) as baseline, g1_elem_sig, g1_head_sig" in note for note in result.notes)
    assert result.agreement["rank"]["n"] == 3  # the ranking now has the paper's dense rows to compare with
    title = comparison_title("quickstart", records, "table2")
    assert title == ("quickstart: ppl/avg by variant (dense model), beside the paper's Table 2 (dense 1.7B, 48 layers, "
                     "400B tokens, max LR 4e-3)")


def test_table2s_rows_for_each_variant_are_that_variants_rows_in_the_registry():
    rows = {row["id"]: row["row"] for row in paper.read_rows("table2")}
    for variant, paper_id in paper.TABLES["table2"].variant_rows:
        assert paper_id in rows, paper_id
        assert any(r.table == "table2" and r.row == rows[paper_id] for r in VARIANTS[variant].paper_rows), variant
    # claims name Table 2's rows by the table's own ids: that reading is unchanged
    assert "dense48_400b_baseline_lr4e-3" in paper.reference("table2").index


def test_a_dense_sweep_beside_the_moe_table_says_so(tmp_path):
    records = _records(_sweep_copy(tmp_path, paper_key="table1"))
    result = build_comparison(records, "table1")
    (note,) = [n for n in result.notes if n.startswith("Model kind differs")]
    assert "trains dense models" in note and "Table 1 (MoE 15A2B, 400B tokens) is of MoE models" in note
    assert "name paper: table2" in note
    assert comparison_title("quickstart", records, "table1").endswith("(dense model), beside the paper's Table 1 "
                                                                      "(MoE 15A2B, 400B tokens)")


def test_an_moe_sweep_beside_the_dense_table_says_so(tmp_path):
    records = _records(_sweep_copy(tmp_path, experiment=REPO / "experiments" / "tiny-moe.yaml"))
    result = build_comparison(records, "table2")
    (note,) = [n for n in result.notes if n.startswith("Model kind differs")]
    assert "trains MoE models" in note and "is of dense models" in note and "table1 or" in note
    assert "(MoE model), beside the paper's Table 2" in comparison_title("s", records, "table2")
    assert not any(n.startswith("Model kind") for n in build_comparison(records, "table1-3-4").notes)


# -- the comparison's columns ---------------------------------------------------------------------------------------

def test_changes_are_also_given_in_percent_of_the_baseline(tmp_path):
    records = _records(_sweep_copy(tmp_path, seeds=(0, 1, 2)))
    result = build_comparison(records, "table2")
    frame = result.frame.set_index("variant")
    columns = list(result.frame.columns)
    assert columns[columns.index("Δ vs baseline") + 1] == "Δ (%)"
    assert columns[columns.index("paper Δ") + 1] == "paper Δ (%)"
    ppl = {v: [r.metrics["ppl/avg"] for r in records if r.spec.experiment.variant == v] for v in GAIN}
    for variant in ("g1_elem_sig", "g1_head_sig"):
        expected = 100 * (np.mean(ppl[variant]) - np.mean(ppl["baseline"])) / np.mean(ppl["baseline"])
        assert frame.loc[variant, "Δ (%)"] == f"{expected:+.2f}"
        assert result.numbers.loc[variant, "delta_percent"] == pytest.approx(expected)
    by_row = _paper_ppl_by_row("table2")
    assert frame.loc["g1_elem_sig", "paper Δ (%)"] == f"{100 * (by_row['(8)'] / by_row['(5)'] - 1):+.2f}"
    assert frame.loc["baseline", "Δ (%)"] == "" and frame.loc["baseline", "paper Δ (%)"] == ""


def test_one_seed_rows_have_no_test_and_no_p(tmp_path):
    result = build_comparison(_records(QUICKSTART), "table2")
    frame = result.frame.set_index("variant")
    assert (frame.loc[["g1_elem_sig", "g1_head_sig"], "test"] == ONE_SEED_TEST).all()
    assert (frame.loc[["g1_elem_sig", "g1_head_sig"], "p"] == "").all()
    assert not any(note.startswith("Significance") for note in result.notes)
    assert any(note.startswith(f"Test '{ONE_SEED_TEST}'") for note in result.notes)
    seeded = build_comparison(_records(_sweep_copy(tmp_path, seeds=(0, 1, 2))), "table2")
    tested = seeded.frame.set_index("variant")
    assert tested.loc["g1_elem_sig", "test"] == "paired t" and re.fullmatch(r"[\d.e-]+", tested.loc["g1_elem_sig", "p"])
    assert any(note.startswith("Significance: paired t") for note in seeded.notes)
    assert not any(note.startswith(f"Test '{ONE_SEED_TEST}'") for note in seeded.notes)


def test_the_help_names_the_default_folder():
    import typer

    from gatelab.cli import app

    table = typer.main.get_command(app).commands["table"]
    (out,) = [p for p in table.params if p.name == "out"]
    assert "default: <runs dir>/reports/<sweep name>" in out.help and out.default is None


# -- the HTML page on a laptop screen -------------------------------------------------------------------------------

WIDTH_PROBE = ("<script>document.querySelectorAll('details').forEach(d => d.open = true);"
               "const root = document.documentElement;"
               "const wraps = [...document.querySelectorAll('.table-wrap')].map(e => e.scrollWidth - e.clientWidth);"
               "document.body.setAttribute('data-overflow', [root.scrollWidth - root.clientWidth, ...wraps].join(' '));"
               "</script>")


def _overflow(chromium: str, page: Path, tmp_path: Path, width: int) -> list[int]:
    """How many pixels the page, then each table's wrapper, is wider than what shows at `width` (details opened)."""
    probed = tmp_path / f"probed-{page.name}"
    probed.write_text(page.read_text().replace("</body>", WIDTH_PROBE + "</body>"))
    shown = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                            f"--user-data-dir={tmp_path / 'profile'}", f"--window-size={width},900", "--dump-dom",
                            probed.as_uri()], capture_output=True, text=True, timeout=120)
    found = re.search(r'data-overflow="([-\d ]+)"', shown.stdout)
    assert found, shown.stderr[-2000:]
    return [int(x) for x in found.group(1).split()]


@pytest.fixture(scope="module")
def chromium() -> str:
    found = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
    if not found:
        pytest.skip("no headless browser: `apt-get install --no-install-recommends chromium` to measure the page")
    return found


@pytest.mark.slow
def test_the_html_page_fits_a_1400_pixel_screen(tmp_path, fake_store, chromium):
    fake_store(_records(_sweep_copy(tmp_path, seeds=(0, 1, 2))))
    _make(tmp_path / "quickstart.yaml", tmp_path / "runs", tmp_path / "out")
    page = tmp_path / "out" / "quickstart.html"
    # A claims-shaped table: 15 text columns with long ids and metric names, none of them secondary.
    words = "g1_elem_sig_shared probe/m_act_share_layers_max_at_first_token repro-lr-sensitivity 0.00107 (significant,"
    claims = pd.DataFrame({f"column {i}": [" ".join(words.split()[: 1 + i % 5])] * 4 for i in range(15)})
    wide = export_report([ReportTable("claims", claims)], [], tmp_path / "claims", ["html"], "claims")[0]
    for shown in (page, wide):
        assert all(x <= 0 for x in _overflow(chromium, shown, tmp_path, 1400)), shown.name
    # the check can fail: the same pages overflow a narrow window
    assert any(x > 0 for x in _overflow(chromium, page, tmp_path, 500))
    # every column is on the page once: the main ones in the table, the others folded under it
    text = page.read_text().replace("<wbr>", "")
    for column in ("ppl/avg (mean ± std (n))", "Δ (%)", "paper Δ (%)", "ppl/code", "long_ppl/x8", "probe/m_act"):
        assert text.count(f">{column}</th>") == 1, column
    main, folded = text.split('<details class="more-columns">')
    assert ">paper Δ (%)</th>" in main and ">ppl/code</th>" in folded


def test_the_delta_plot_says_its_axes_are_in_percent(tmp_path, fake_store, monkeypatch):
    from gatelab.report import plots

    drawn, save = {}, plots.save_png

    def keep(figure, path):
        drawn[Path(path).name] = figure
        return save(figure, path)

    monkeypatch.setattr(plots, "save_png", keep)
    fake_store(_records(QUICKSTART))
    _make(QUICKSTART, tmp_path / "runs", formats=["csv"])
    (axes,) = drawn["delta_vs_paper.png"].axes
    assert axes.get_xlabel() == "paper: Δ vs baseline (%)" and axes.get_ylabel() == "ours: Δ vs baseline (%)"
    assert len(axes.collections[0].get_offsets()) == 3  # baseline and both gates, beside Table 2's rows
