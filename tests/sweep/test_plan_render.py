"""How `gatelab sweep plan` shows its rows: the table (rich, or aligned text when long), the totals and estimate
lines under it, and the corpus warnings."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from gatelab.progress import format_duration
from gatelab.sweep.plan import plan_rows, plan_totals
from gatelab.sweep.plan_render import corpus_warnings, estimate_lines, render_plan
from gatelab.sweep.spec import expand, load_sweep
from tests.helpers import MOE, write_sweep
from tests.sweep.test_plan import _bigram_sweep, _gpu


@pytest.fixture(autouse=True)
def _no_gpu(monkeypatch):
    """Plans here are a CPU's: the same figures on a machine that has a GPU."""
    _gpu(monkeypatch, None)


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


def test_the_json_total_is_the_wall_time_the_estimate_prints(tmp_path):
    """`gatelab sweep plan --json` gives what one worker takes, imports once included, as the printed estimate does."""
    rows = plan_rows(expand(load_sweep(write_sweep(tmp_path, {"grid": {"variant": ["baseline", "g1_elem_sig"]}}))))
    totals = plan_totals(rows)
    assert totals["wall_s"] == pytest.approx(rows[0]["seconds"] + rows[1]["seconds"] + rows[0]["import_s"])
    assert estimate_lines(rows)[0].startswith(f"estimate: roughly {format_duration(totals['wall_s'])} for 2 run(s)")


def test_a_long_plan_prints_every_run_as_aligned_text(tmp_path, monkeypatch):
    """Above RICH_TABLE_ROWS rows the table is plain text (rich took 2 ms a row): the same columns and cells."""
    from gatelab.sweep import plan_render

    sweep = load_sweep(write_sweep(tmp_path, {"grid": {"variant": ["baseline", "g1_head_sig"], "seed": [0, 1, 2]}}))
    rows = plan_rows(expand(sweep))
    monkeypatch.setattr(plan_render, "RICH_TABLE_ROWS", 2)
    out = io.StringIO()
    render_plan(rows, title="t", console=Console(file=out, width=200))
    lines = out.getvalue().splitlines()
    assert lines[0] == "t" and lines[1].split()[:3] == ["#", "variant", "seed"]
    assert [line.split()[1] for line in lines[2:8]] == ["baseline"] * 3 + ["g1_head_sig"] * 3
    assert len({line.index("variant") for line in lines[1:2]}) == 1 and "6 runs" in out.getvalue()
    widths = {len(line) for line in lines[1:8]}
    assert len(widths) == 1, "every row as wide as the header: the columns line up"
