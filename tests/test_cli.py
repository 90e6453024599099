"""The `gatelab` command as a user runs it: real subprocesses, real exit codes, no tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import REPO


def gatelab(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gatelab", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=120)


@pytest.mark.slow
def test_variants_json_under_the_paper_moe():
    result = gatelab("variants", "--experiment", "experiments/paper-moe-15b.yaml", "--json")
    assert result.returncode == 0, result.stderr
    rows = {row["id"]: row for row in json.loads(result.stdout)}
    assert round(rows["g1_elem_sig"]["added_params"] / 1e6) == 201
    assert round(rows["g1_head_sig"]["added_params"] / 1e6, 1) == 1.6
    assert rows["baseline"]["added_params"] == 0


def test_variants_table_lists_every_variant():
    from gatelab.variants import VARIANTS

    result = gatelab("variants")
    assert result.returncode == 0
    assert all(variant in result.stdout for variant in VARIANTS)


def test_moe_only_variant_under_a_dense_preset_is_not_applicable():
    rows = json.loads(gatelab("variants", "--experiment", "experiments/tiny.yaml", "--json").stdout)
    row = next(r for r in rows if r["id"] == "ref_add4experts")
    assert row["added_params"] is None and "moe" in row["not_applicable"]


@pytest.mark.slow
def test_bad_input_is_one_message_and_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmodel: {vocab_size: 8, n_layers: 1, d_model: 8, n_heads: 3, n_kv_heads: 2, head_dim: 4,"
                   " ffn_hidden: 8, qk_nrom: true}\n")
    for args in (["variants", "--experiment", str(bad)], ["variants", "--experiment", "missing.yaml"]):
        result = gatelab(*args)
        assert result.returncode == 2
        assert "Traceback" not in result.stderr and "error:" in result.stderr
    result = gatelab("variants", "--experiment", str(bad))
    assert "qk_nrom: unknown key; did you mean 'qk_norm'" in result.stderr


@pytest.mark.slow
def test_claims_bad_input_writes_nothing(tmp_path):
    out = tmp_path / "claims"
    for args, message in ((["sweeps/missing.yaml"], "sweeps/missing.yaml: no such file"),
                          (["sweeps/repro-core.yaml", "--format", "pdf"], "valid formats: md, csv, latex, html")):
        result = gatelab("claims", *args, "--out", str(out), "--runs-dir", str(tmp_path / "runs"))
        assert result.returncode == 2 and "Traceback" not in result.stderr
        assert message in result.stderr
    assert not out.exists()


@pytest.mark.slow
def test_claims_of_a_sweep_with_no_runs_marks_every_claim_not_run(tmp_path):
    out = tmp_path / "claims"
    result = gatelab("claims", "sweeps/repro-sink.yaml", "--out", str(out), "--format", "md,csv",
                     "--runs-dir", str(tmp_path / "runs"))
    assert result.returncode == 0, result.stderr
    markdown = (out / "claims.md").read_text()
    assert "Generated from no ended runs" in markdown and "holds |" not in markdown
    assert markdown.count("| not run ") >= 40
