"""`gatelab table` on a store made by real runs: finished, diverged, failed and missing runs each show as such."""

from __future__ import annotations

import csv
import re

import pytest
import yaml

from tests.helpers import gatelab_cli, write_micro_sweep


@pytest.mark.slow
def test_table_shows_finished_diverged_failed_and_missing_runs(tmp_path):
    sweep = write_micro_sweep(tmp_path, "mixed", max_steps=30, retries=0, paper="table1", include=[
        {"variant": "g1_head_sig", "seed": 0, "train.lr": 10.0, "train.warmup_steps": 0, "train.grad_clip": 0.0,
         "train.max_steps": 200},
        {"variant": "g2_elem_sig", "seed": 0, "data.domains": ["mine"],
         "data.user_files": {"mine": [str(tmp_path / "absent.txt")]}},
    ])
    runs = tmp_path / "runs"
    ran = gatelab_cli("sweep", "run", str(sweep), "--runs-dir", str(runs), cwd=tmp_path)
    assert ran.returncode == 1 and "failed: cell 4 " in ran.stderr, ran.stdout + ran.stderr  # a failed cell fails it
    definition = yaml.safe_load(sweep.read_text())
    definition["grid"]["variant"].append("g5_elem_sig")  # a cell added after the sweep ran: missing
    sweep.write_text(yaml.safe_dump(definition))

    out = tmp_path / "out"
    result = gatelab_cli("table", str(sweep), "--format", "md,csv,latex,html", "--out", str(out), "--runs-dir",
                      str(runs), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert {p.suffix for p in out.iterdir()} >= {".md", ".csv", ".tex", ".html", ".png"}
    rows = {row["variant"].split()[0]: row for row in csv.DictReader((out / "mixed.csv").open())}
    ppl = next(column for column in rows["baseline"] if column.startswith("ppl/avg"))
    assert rows["baseline"]["runs"] == "1 finished" and rows["baseline"][ppl].endswith("(1)")
    assert rows["g1_head_sig"]["runs"].startswith("1 diverged@") and rows["g1_head_sig"][ppl] == "diverged"
    assert rows["g2_elem_sig"]["runs"] == "1 failed" and rows["g2_elem_sig"][ppl] == "failed"
    assert rows["g5_elem_sig"]["runs"] == "1 missing" and rows["g5_elem_sig"][ppl] == "missing"
    # Real runs carry their host and device: one seed gives a step-time ratio without an interval
    assert re.fullmatch(r"\d+\.\d{3} \(1 shared seed: no interval\)", rows["g1_elem_sig"]["step-time ratio"])
    markdown = next(out.glob("*.md")).read_text()
    for text in ("diverged", "failed", "missing", "paper Avg PPL", "Δ vs baseline", "p"):
        assert text in markdown

    # Made again from the same store, every file is the same byte for byte (issue 7: results/ must be reproducible).
    first = {p.name: p.read_bytes() for p in out.iterdir()}
    again = gatelab_cli("table", str(sweep), "--format", "md,csv,latex,html", "--out", str(out), "--runs-dir",
                     str(runs), cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir()} == first
    assert re.search(r"Generated from \d ended runs, the last ended \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", markdown)


def test_benchmark_scores_get_a_paired_change_and_the_papers_columns(tmp_path):
    """lm-eval scores (and BLiMP) are columns with their change against baseline by the paired test, and the paper's
    benchmark columns stand beside them; a sweep without such scores shows no paper benchmark column."""
    from gatelab.report.tables import RunRecord, build_comparison
    from gatelab.sweep.spec import expand, load_sweep

    sweep = write_micro_sweep(tmp_path, "scores")
    definition = yaml.safe_load(sweep.read_text())
    definition["grid"]["seed"] = [0, 1, 2]
    sweep.write_text(yaml.safe_dump(definition))
    specs = expand(load_sweep(sweep))
    acc = "lm_eval/gatelab_blimp/acc"

    def record(spec, with_scores: bool) -> RunRecord:
        lift = {"baseline": 0.0, "g1_elem_sig": 0.05, "g1_head_sig": -0.01}[spec.experiment.variant]
        metrics = {"ppl/avg": 100.0 - 100 * lift + spec.experiment.seed}
        if with_scores:
            seed = spec.experiment.seed  # a per-seed effect shared by every variant, and a little noise of each
            noise = 0.0 if spec.experiment.variant == "baseline" else 0.002 * seed * seed
            metrics |= {acc: 0.6 + lift + 0.01 * seed + noise, f"{acc}/stderr": 0.02}
        return RunRecord(spec, "finished", f"run-{spec.index}", metrics)

    frame = build_comparison([record(s, True) for s in specs], "table1").frame.set_index("variant")
    assert frame.loc["baseline", acc] == "0.610 ± 0.010 (3)" and frame.loc["g1_elem_sig", acc].endswith("(3)")
    assert re.fullmatch(r"\+0\.05\d \(p 0\.0\d+\)", frame.loc["g1_elem_sig", f"{acc} Δ"])  # paired: seeds cancel
    assert re.fullmatch(r"-0\.00\d \(p 0\.\d+\)", frame.loc["g1_head_sig", f"{acc} Δ"])
    assert frame.loc["g1_elem_sig", "paper Hellaswag"] == "74.64" and f"{acc}/stderr" not in frame.columns
    plain = build_comparison([record(s, False) for s in specs], "table1").frame
    assert not any(c.startswith("paper Hellaswag") or c.startswith("lm_eval") for c in plain.columns)


def test_outlier_probes_are_columns_without_a_paper_column(tmp_path):
    """Sink rate, kurtosis, largest |activation| and the W8A8 perplexity stand beside the paper's probes, as ours only:
    the paper measured none of them. Per-layer values stay in MLflow, out of the table."""
    from gatelab.report.tables import OUTLIER_PROBES, RunRecord, build_comparison
    from gatelab.sweep.spec import expand, load_sweep

    specs = expand(load_sweep(write_micro_sweep(tmp_path, "outliers")))
    values = {"probe/sink_rate": 0.25, "probe/kurtosis_max": 3076.0, "probe/max_abs_activation": 735.0,
              "eval/w8a8_ppl": 21.18, "eval/w8a8_ppl_ratio": 1.337}

    def record(spec) -> RunRecord:
        metrics = {"ppl/avg": 15.84, "probe/f_attn": 0.4, "probe/sink_rate/layer0": 0.5, **values}
        return RunRecord(spec, "finished", f"run-{spec.index}", metrics)

    result = build_comparison([record(s) for s in specs], "table4")
    frame = result.frame.set_index("variant")
    assert list(OUTLIER_PROBES) == list(values)
    for name, value in values.items():
        assert frame.loc["baseline", name] == f"{value:.3f} (1)", name
        assert name in result.secondary and f"paper {name}" not in frame.columns
    assert "paper F-Attn" in frame.columns and "probe/sink_rate/layer0" not in frame.columns
    columns = list(frame.columns)
    assert columns.index("probe/f_attn") < columns.index("probe/sink_rate") < columns.index("eval/w8a8_ppl_ratio")
    old = build_comparison([RunRecord(s, "finished", "r", {"ppl/avg": 15.0}) for s in specs], "table4").frame
    assert not set(OUTLIER_PROBES) & set(old.columns)  # runs from before these probes show no empty columns
