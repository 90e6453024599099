"""The registry against the paper: every row has a variant, and added parameters match the paper's column."""

from __future__ import annotations

import csv

import pytest

from gatelab.config import load_experiment
from gatelab.model import added_parameters
from gatelab.variants import VARIANTS
from tests.conftest import REPO

PAPER = REPO / "results" / "paper"


def _rows(name: str) -> list[dict[str, str]]:
    with open(PAPER / name, newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.mark.parametrize("table", ["paper_table1_moe.csv", "paper_table3_nonlinearity.csv",
                                   "paper_table4_sparsity_sink.csv", "paper_table6_switchhead.csv"])
def test_every_paper_row_is_a_registered_variant(table):
    for row in _rows(table):
        assert row["id"] in VARIANTS, row["id"]
        number = table.split("_")[1]
        assert any(r.table == number and r.row == row["row"].split()[0] for r in VARIANTS[row["id"]].paper_rows), row


MOE = load_experiment(REPO / "experiments" / "paper-moe-15b.yaml")


@pytest.mark.parametrize("row", [r for r in _rows("paper_table1_moe.csv") if r["row"] not in ("(1)", "(4)")],
                         ids=lambda r: r["id"])
def test_added_parameters_match_table1_within_2_percent(row):
    _, added = added_parameters(MOE, row["id"])
    paper = float(row["Added (M)"]) * 1e6
    assert abs(added - paper) / paper < 0.02, (row["id"], added / 1e6, paper / 1e6)


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
