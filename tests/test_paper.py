"""The paper's numbers ship with the package, match results/paper/ byte for byte, and one registry names their
columns."""

from __future__ import annotations

import pytest

from gatelab import paper
from gatelab.errors import GatelabError
from gatelab.sweep.spec import load_sweep
from tests.helpers import REPO, write_sweep

RESULTS = REPO / "results" / "paper"
SHIPPED = sorted([t.file for t in paper.TABLES.values()] + [paper.CATALOGUE])


@pytest.mark.parametrize("name", SHIPPED)
def test_package_copy_is_identical_to_results_paper(name, monkeypatch):
    monkeypatch.delenv(paper.PAPER_DIR_ENV, raising=False)
    assert paper.paper_file(name).read_bytes() == (RESULTS / name).read_bytes(), name


def test_every_csv_under_results_paper_ships_with_the_package(monkeypatch):
    monkeypatch.delenv(paper.PAPER_DIR_ENV, raising=False)
    assert sorted(p.name for p in RESULTS.glob("*.csv")) == SHIPPED
    assert sorted(p.name for p in paper.paper_dir().iterdir() if p.name.endswith(".csv")) == SHIPPED


def test_registry_columns_exist_in_their_tables(monkeypatch):
    monkeypatch.delenv(paper.PAPER_DIR_ENV, raising=False)
    for key, table in paper.TABLES.items():
        rows = paper.read_rows(key)
        assert rows, table.file
        for column in filter(None, (table.ppl, table.added, *table.probes)):
            assert column in rows[0], (key, column)
        if table.ppl:
            assert "id" in rows[0], key


def test_sweep_paper_keys_name_registered_tables_and_others_are_refused(tmp_path):
    assert {t for tables in paper.SWEEP_TABLES.values() for t in tables} <= set(paper.TABLES)
    with pytest.raises(GatelabError,
                       match=r"s.yaml(.|\n)*paper: Input should be 'table1'.*'table1-3-4' \(got 'table9'\)"):
        load_sweep(write_sweep(tmp_path, {"name": "s", "experiment": "../presets/micro.yaml",
                                          "grid": {"variant": ["baseline"]}, "paper": "table9"}))


def test_reference_merges_tables_and_reads_table4_probes_and_benchmarks(monkeypatch):
    monkeypatch.delenv(paper.PAPER_DIR_ENV, raising=False)
    reference = paper.reference("table1-3-4")
    assert list(reference.columns) == ["ppl", "Hellaswag", "MMLU", "GSM8k", "C-eval", "Gate Score", "M-Act", "F-Attn"]
    assert reference.loc["baseline", "Hellaswag"] == pytest.approx(73.07)
    assert set(paper.reference("table2").columns) == {"ppl", *paper.TABLES["table2"].benchmarks}
    assert reference.loc["g1_elem_sig", "ppl"] == pytest.approx(5.761)
    assert reference.loc["baseline", "F-Attn"] == pytest.approx(0.467)
    assert paper.added_params("table6")["baseline"] is None and paper.added_params("table2") is None


def test_a_missing_folder_is_a_note_not_a_silent_gap(tmp_path, monkeypatch):
    monkeypatch.setenv(paper.PAPER_DIR_ENV, str(tmp_path))
    assert list(paper.reference("table1").columns) == ["ppl"] and paper.reference("table1").empty
    assert paper.added_params("table1") is None
    (note,) = paper.missing_note("table1")
    assert "table1" in note and str(tmp_path / "paper_table1_moe.csv") in note and "missing" in note
    assert paper.missing_note("table1-3-4") and len(paper.missing_note("table1-3-4")) == 3


@pytest.mark.parametrize("damage, why", [(b"garbage\xff,,\n", "not readable as UTF-8"),
                                         (b"name,Avg PPL\nbaseline,6.0\n", "no column 'id'"),
                                         (b"id,Avg PPL\n\"baseline,6.0\n", "not a readable CSV")])
def test_a_damaged_paper_file_is_one_error_naming_it_and_the_fix(tmp_path, monkeypatch, damage, why):
    monkeypatch.delenv(paper.PAPER_DIR_ENV, raising=False)
    for name in SHIPPED:
        (tmp_path / name).write_bytes(paper.paper_file(name).read_bytes())
    (tmp_path / paper.TABLES["table1"].file).write_bytes(damage)
    monkeypatch.setenv(paper.PAPER_DIR_ENV, str(tmp_path))
    with pytest.raises(GatelabError, match=rf"{paper.TABLES['table1'].file}: {why}.*unset \$GATELAB_PAPER_DIR"):
        paper.reference("table1")
    if why.startswith("not readable"):  # the plan's added-parameter column reads the same file as rows
        with pytest.raises(GatelabError, match=why):
            paper.added_params("table1")
