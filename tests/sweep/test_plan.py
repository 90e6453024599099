"""`gatelab sweep plan`: parameters, paper columns, FLOPs and time per run, without allocating a weight."""

from __future__ import annotations

import csv
import io
import json
import time

import pytest
from rich.console import Console

from gatelab.sweep.plan import (
    CPU_FLOPS,
    GPU_FLOPS,
    cli_plan,
    corpus_warnings,
    plan_rows,
    plan_totals,
    render_plan,
)
from gatelab.sweep.spec import expand, load_sweep
from tests.helpers import MOE, REPO, SHIPPED_SWEEPS, write_sweep


@pytest.mark.parametrize("path", SHIPPED_SWEEPS, ids=lambda p: p.stem)
def test_every_shipped_sweep_plans(path, capsys):
    cli_plan(path, as_json=True)
    plan = json.loads(capsys.readouterr().out)
    assert len(plan["runs"]) == len(expand(load_sweep(path)))
    assert all(row["total_params"] > 0 and row["seconds"] > 0 for row in plan["runs"])


def test_paper_table1_at_paper_scale_matches_the_papers_added_parameters():
    start = time.perf_counter()
    sweep = load_sweep(REPO / "sweeps" / "paper-table1.yaml", REPO / "experiments" / "paper-moe-15b.yaml")
    rows = plan_rows(expand(sweep), paper=sweep.paper)
    elapsed = time.perf_counter() - start
    assert elapsed < 5, f"planning 15 paper-scale rows took {elapsed:.1f}s"
    assert len(rows) == 15
    with (REPO / "results" / "paper" / "paper_table1_moe.csv").open(newline="") as handle:
        paper = {row["row"]: row for row in csv.DictReader(handle)}
    for number, row in enumerate(rows, start=1):
        expected = paper[f"({number})"]
        assert row["variant"] == expected["id"] and row["paper_added_m"] == float(expected["Added (M)"])
        if number == 1:
            assert row["added_params"] == 0
        elif number != 4:  # row 4: the paper's 400M is not reproducible from its description (gatelab.variants)
            assert row["added_params"] / 1e6 == pytest.approx(row["paper_added_m"], rel=0.02), row["label"]
    assert 15.5e9 < rows[0]["total_params"] < 15.7e9  # "15A2B": 15B total ...
    assert 1.5e9 < rows[0]["active_params"] < 2.5e9  # ... about 2B activated


def test_plan_json_shape(tmp_path, capsys):
    path = write_sweep(tmp_path, {"grid": {"variant": ["baseline", "g1_elem_sig"], "train.lr": [1.0e-3, 2.0e-3]},
                                  "paper": "table1"})
    cli_plan(path, as_json=True)
    plan = json.loads(capsys.readouterr().out)
    assert {"runs", "totals"} <= set(plan)
    assert set(plan["totals"]) == {"runs", "tokens", "flops", "seconds", "hours"}
    row = plan["runs"][3]
    assert {"index", "label", "hash", "variant", "seed", "overrides", "total_params", "added_params", "active_params",
            "tokens", "flops", "flops_per_second", "seconds", "trials", "paper_added_m", "corpus_tokens", "corpus_count",
            "passes"} <= set(row)
    assert isinstance(plan["warnings"], list)
    assert (row["index"], row["variant"], row["seed"], row["overrides"]) == (3, "g1_elem_sig", 0, "train.lr=0.002")
    assert row["label"] == "g1_elem_sig s0 train.lr=0.002" and row["paper_added_m"] == 201
    assert plan["totals"]["runs"] == 4 and plan["totals"]["tokens"] == 4 * 10 * 2 * 16


def test_added_parameters_are_against_the_same_cell_as_baseline(tmp_path):
    path = write_sweep(tmp_path, {"grid": {"variant": ["baseline", "g1_elem_sig"], "model.n_layers": [1, 3]}})
    rows = plan_rows(expand(load_sweep(path)))
    gate = 32 * 4 * 8  # d_model x (q * d_k) per layer
    assert [row["added_params"] for row in rows] == [0, 0, 1 * gate, 3 * gate]


def test_flops_follow_the_documented_formula(tmp_path):
    dense = plan_rows(expand(load_sweep(write_sweep(tmp_path, {}))))[0]
    tokens = 10 * 2 * 16
    attention = 12 * 2 * 16 * 4 * 8  # 12 * n_layers * seq_len * n_heads * head_dim
    assert dense["active_params"] == dense["total_params"]  # tied: the one table is the output head
    assert dense["flops"] == 6 * dense["total_params"] * tokens + attention * tokens
    assert dense["seconds"] == pytest.approx(dense["flops"] / CPU_FLOPS)

    moe = plan_rows(expand(load_sweep(write_sweep(tmp_path, {"overrides": {"model.tie_embeddings": False}},
                                                  preset=MOE))))[0]
    inactive_experts = 2 * (4 - 2) * 3 * 32 * 16  # n_layers * (E - top_k) * SwiGLU weights of one expert
    assert moe["active_params"] == moe["total_params"] - 64 * 32 - inactive_experts
    assert moe["flops"] == 6 * moe["active_params"] * tokens + attention * tokens


def test_throughput_follows_the_accelerator_or_the_flag(tmp_path):
    gpu = write_sweep(tmp_path, {"overrides": {"train.accelerator": "gpu"}})
    assert plan_rows(expand(load_sweep(gpu)))[0]["flops_per_second"] == GPU_FLOPS
    row = plan_rows(expand(load_sweep(gpu)), flops_per_second=1e9)[0]
    assert row["seconds"] == pytest.approx(row["flops"] / 1e9)


def test_search_sweeps_count_every_trial(tmp_path):
    path = write_sweep(tmp_path, {"grid": {"variant": ["baseline", "g1_elem_sig"]}, "search": {
        "params": {"train.lr": {"type": "float", "low": 1.0e-4, "high": 1.0e-2, "log": True}}, "n_trials": 5}})
    sweep = load_sweep(path)
    rows = plan_rows(expand(sweep), trials=sweep.search.n_trials)
    totals = plan_totals(rows)
    assert totals["runs"] == 10 and totals["seconds"] == pytest.approx(5 * sum(r["seconds"] for r in rows))


def test_table6_has_its_paper_column(tmp_path):
    path = write_sweep(tmp_path, {"grid": {"variant": ["baseline", "switch_v_8top2"]}, "paper": "table6"})
    rows = plan_rows(expand(load_sweep(path)), paper="table6")
    assert [row["paper_added_m"] for row in rows] == [None, 25]


def test_a_missing_paper_file_drops_the_column(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GATELAB_PAPER_DIR", str(tmp_path / "nowhere"))
    path = write_sweep(tmp_path, {"grid": {"variant": ["baseline"]}, "paper": "table1"})
    rows = plan_rows(expand(load_sweep(path)), paper="table1")
    assert "paper_added_m" not in rows[0]
    cli_plan(path)
    out = capsys.readouterr().out
    assert "paper added" not in out
    assert "no paper column:" in out and "paper_table1_moe.csv is missing" in out


def test_table_rendering(tmp_path):
    path = write_sweep(tmp_path, {"grid": {"variant": ["baseline", "g1_head_sig"]}, "include": [{"seed": 0}],
                                  "paper": "table1"}, preset=MOE)
    sweep = load_sweep(path)
    out = io.StringIO()
    render_plan(plan_rows(expand(sweep), paper="table1"), title="t", notes=[str(d) for d in sweep.duplicates],
                console=Console(file=out, width=200))
    text = out.getvalue()
    assert "g1_head_sig" in text and "paper added" in text and "+1.6M" in text
    assert "2 runs" in text and "FLOP/s" in text
    assert "cell 2 {seed: 0} is the same run as cell 0" in text


def _bigram_sweep(tmp_path, train_sequences: int, max_steps: int, batch_size: int = 1):
    """Two runs on a generated corpus of train_sequences x 17 tokens, each training max_steps x batch_size x 16."""
    return write_sweep(tmp_path, {"grid": {"variant": ["baseline", "g1_elem_sig"]}, "overrides": {
        "data.task": "bigram_backcopy", "data.bigram_backcopy.train_sequences": train_sequences,
        "train.max_steps": max_steps, "train.batch_size": batch_size}})


def test_plan_json_says_what_each_run_will_see(tmp_path, capsys):
    cli_plan(_bigram_sweep(tmp_path, train_sequences=10, max_steps=17), as_json=True)
    plan = json.loads(capsys.readouterr().out)
    row = plan["runs"][0]
    assert (row["tokens"], row["corpus_tokens"], row["corpus_count"]) == (17 * 16, 10 * 17, "exact")
    assert row["passes"] == pytest.approx(1.6)
    assert plan["warnings"] == [("warning: runs 0-1 would pass over their corpus 1.6x (272 training tokens from 170): "
                                 "raise data.bigram_backcopy.train_sequences, or lower train.max_steps to 10 for one pass")]


def test_the_repeat_warning_appears_above_one_pass_only(tmp_path):
    def plan_text(train_sequences: int, max_steps: int) -> str:
        sweep = load_sweep(_bigram_sweep(tmp_path, train_sequences, max_steps))
        out = io.StringIO()
        rows = plan_rows(expand(sweep))
        render_plan(rows, notes=corpus_warnings(rows, expand(sweep)), console=Console(file=out, width=300))
        return out.getvalue()

    above = plan_text(train_sequences=16, max_steps=34)  # 34 x 16 tokens against 16 x 17: two passes
    assert "corpus" in above and "passes" in above
    assert "runs 0-1 would pass over their corpus 2x" in above and "lower train.max_steps to 17" in above
    at_one = plan_text(train_sequences=16, max_steps=17)  # 17 x 16 = 16 x 17: exactly one pass
    assert "would pass over" not in at_one and "warning" not in at_one


def test_unprepared_corpora_show_a_question_mark_and_how_to_count(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GATELAB_DATA_DIR", str(tmp_path / "no-data"))
    cli_plan(write_sweep(tmp_path, {"grid": {"variant": ["baseline"]}}))
    out = capsys.readouterr().out
    assert " ? " in out and "would pass" not in out
    assert "run `gatelab data prepare PRESET` to count the corpus" in " ".join(out.split())  # as the terminal wraps it
    cli_plan(write_sweep(tmp_path, {"grid": {"variant": ["baseline"]}}), as_json=True)
    row = json.loads(capsys.readouterr().out)["runs"][0]
    assert (row["corpus_tokens"], row["corpus_count"], row["passes"]) == (None, "unknown", None)
    assert not (tmp_path / "no-data").exists()
