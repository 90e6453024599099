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


# issue 33: every way a head can learn to do nothing. Added parameters at paper scale, from the preset's shape.
M = MOE.model
BEYOND_THE_PAPER = {
    "sink_off_by_one": 0,
    "sink_learnable": M.n_heads * M.n_layers,  # one sink logit per query head (768)
    "sigmoid_attn": 0,
    "kv_bias": 2 * M.n_kv_heads * M.head_dim * M.n_layers,  # k_0 and v_0 per KV head (24,576)
    "softpick": 0,
    "g1_elem_softplus_fp32": M.n_heads * M.head_dim * M.d_model * M.n_layers,  # as g1_elem_sig (201M)
    "g1_elem_2sig_zeroinit": M.n_heads * M.head_dim * M.d_model * M.n_layers,
    "g1_elem_sig_fp32": M.n_heads * M.head_dim * M.d_model * M.n_layers,
}


@pytest.mark.parametrize("variant", sorted(BEYOND_THE_PAPER))
def test_added_parameters_of_the_variants_beyond_the_paper(variant):
    assert added_parameters(MOE, variant)[1] == BEYOND_THE_PAPER[variant]


def test_every_variant_cites_where_it_comes_from():
    for variant in VARIANTS.values():
        assert variant.citation().strip(), variant.id
        if not variant.paper_rows and "control" not in variant.summary:
            assert variant.reference, variant.id  # not from the paper: says whence


def test_gatelab_variants_lists_each_new_id_with_formula_parameters_and_reference():
    from gatelab.app.variants import variant_rows

    rows = {row["id"]: row for row in variant_rows(REPO / "experiments" / "paper-moe-15b.yaml")}
    for variant, added in BEYOND_THE_PAPER.items():
        row = rows[variant]
        assert row["formula"] == VARIANTS[variant].formula and row["reference"] == VARIANTS[variant].reference
        assert row["added_params"] == added
    assert rows["sink_learnable"]["axes"]["attention"] == "learnable_sink"
    assert rows["kv_bias"]["axes"]["attention"] == "softmax+kv_bias"
    assert rows["g1_elem_2sig_zeroinit"]["axes"]["activation"] == "two_sigmoid zero-init"


@pytest.mark.parametrize("preset", ["tiny.yaml", "small.yaml", "paper-dense-1.7b.yaml", "tiny-moe.yaml",
                                    "paper-moe-15b.yaml"])
def test_the_parameter_matched_baseline_has_g1s_parameters_within_one_ffn_column_a_layer(preset):
    experiment = load_experiment(REPO / "experiments" / preset)
    model = experiment.model
    matched, gated = added_parameters(experiment, "ref_ffn_g1match")[0], added_parameters(experiment, "g1_elem_sig")[0]
    assert added_parameters(experiment, "ref_ffn_g1match")[1] > 0
    experts = model.moe.n_experts if model.ffn == "moe" else 1  # MoE: one column of every expert
    assert abs(matched - gated) <= 3 * model.d_model * model.n_layers * experts
