"""The registry against the paper: every row has a variant, and added parameters match the paper's column."""

from __future__ import annotations

import pytest

from gatelab import paper
from gatelab.data.resolve import load_experiment
from gatelab.model import added_parameters
from gatelab.variants import VARIANTS, PaperRow
from tests.helpers import REPO


def _rows(table: str) -> list[dict[str, str]]:
    rows = paper.read_rows(table)
    assert rows, f"{paper.TABLES[table].file} is missing"
    return rows


@pytest.mark.parametrize("table", ["table1", "table3", "table4", "table6"])
def test_every_paper_row_is_a_registered_variant(table):
    for row in _rows(table):
        assert row["id"] in VARIANTS, row["id"]
        assert any(r.table == table and r.row == row["row"].split()[0] for r in VARIANTS[row["id"]].paper_rows), row


def test_paper_rows_name_a_table_of_the_paper_registry():
    assert {r.table for v in VARIANTS.values() for r in v.paper_rows} <= set(paper.TABLES)
    with pytest.raises(ValueError, match="table7"):
        PaperRow("table7", "(1)")


MOE = load_experiment(REPO / "experiments" / "paper-moe-15b.yaml")


@pytest.mark.parametrize("row", [r for r in _rows("table1") if r["row"] not in ("(1)", "(4)")],
                         ids=lambda r: r["id"])
def test_added_parameters_match_table1_within_2_percent(row):
    _, added = added_parameters(MOE, row["id"])
    expected = float(row[paper.TABLES["table1"].added]) * 1e6
    assert abs(added - expected) / expected < 0.02, (row["id"], added / 1e6, expected / 1e6)


def test_ref_add4experts_is_the_documented_choice():
    _, added = added_parameters(MOE, "ref_add4experts")
    assert added == 4 * 3 * 2048 * 768 * 24 + 24 * 4 * 2048  # 4 experts and their router columns, every layer
    assert "453M" in VARIANTS["ref_add4experts"].note


def test_dense_1p7b_gate_costs():
    dense = load_experiment(REPO / "experiments" / "paper-dense-1.7b.yaml")
    assert abs(added_parameters(dense, "g1_elem_sig")[1] - 117.4e6) < 0.05e6
    assert abs(added_parameters(dense, "g1_head_sig")[1] - 0.92e6) < 0.005e6


def test_match_params_narrows_the_ffn_to_the_baseline_count():
    dense = load_experiment(REPO / "experiments" / "paper-dense-1.7b.yaml", ["model.match_params=true"])
    total, added = added_parameters(dense, "g1_elem_sig")
    assert abs(added) <= 3 * 2048 * 28  # within one FFN column per layer
    assert total < added_parameters(load_experiment(REPO / "experiments" / "paper-dense-1.7b.yaml"), "g1_elem_sig")[0]
