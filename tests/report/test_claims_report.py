"""`gatelab claims` in words and files: the paragraph that results/tiny/README.md opens with counts the table, prints
its q-values as the table does, and is written beside the table and between the README's markers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gatelab.model.params import count_parameters, resolve_model
from gatelab.report import claims as C
from gatelab.report import claims_report as R
from gatelab.report.claims_file import load_claims
from tests.report.test_claims import CLAIMS_FILE, TRAINED
from tests.report.test_verdict_rules import G1_TRAINED, _differences, _paired_runs


def _table(verdicts: list[tuple[str, str, str]], sections: list[str] | None = None) -> pd.DataFrame:
    sections = sections or ["exploratory"] * len(verdicts)
    return pd.DataFrame([{"section": section, "claim": f"claim {i}", "sweep": "s", "p": p, "q": q, "verdict": v,
                          "regime": "", "note": ""} for i, ((v, p, q), section) in enumerate(zip(verdicts, sections))])


def test_the_summary_counts_each_section_apart_and_prints_its_q_values_as_the_table_does():
    table = _table([(C.HOLDS, "0.0021", "0.0148"), (C.HOLDS, "0.003", "0.0205"),
                    (C.PAPER_SIZE_EXCLUDED, "0.1", "0.165"),
                    (f"{C.INCONCLUSIVE} (the paper's direction)", "0.2", "0.241"),
                    (f"{C.INCONCLUSIVE} (the other way)", "0.5", "0.6"), (C.CONFOUNDED, "0.001", "0.01"),
                    (C.NOT_TESTABLE, "", ""), (C.TRUE_BY_CONSTRUCTION, "", ""), (f"{C.DESCRIPTIVE}: higher", "", ""),
                    (C.NOT_RUN, "", "")],
                   ["confirmatory", "exploratory", "exploratory", "exploratory", "exploratory", "other paper",
                    "exploratory", "exploratory", "exploratory", "confirmatory"])
    text = R.summary(table, [("repro-core", 0.468), ("repro-trained", 20.39)])
    assert "training tokens a parameter, then what else sets the regime apart: repro-core 0.468; repro-trained " \
           "20.4; the paper's dense models see 235 to 2,059" in text
    assert ("Confirmatory: declared before the runs they read: 2 rows, 1 tested (Holm over them). Verdicts: holds 1; "
            "does not hold 0; init-scale confounded 0; inconclusive at this scale 0 (0 pointing the claim's way, 0 the "
            "other way, 0 with no direction to point); counting neither way: not run 1. Holding: claim 0 (s, q "
            "0.0148). Not holding: none.") in text  # q as the table prints it, never rounded again
    assert ("Exploratory: the paper's claims, written after their data: 7 rows, 4 tested (Benjamini-Hochberg over "
            "them). Verdicts: holds 1; does not hold 1; init-scale confounded 0; inconclusive at this scale 2 (1 "
            "pointing the claim's way, 1 the other way, 0 with no direction to point); counting neither way: not "
            "testable at this scale 1; true by construction 1; descriptive (not tested) 1.") in text
    assert "Not holding: claim 2 (s, q 0.165, the paper's size excluded)." in text
    assert "Other papers' claims: 1 row, 1 tested (Benjamini-Hochberg over them). Verdicts: holds 0; does not hold " \
           "0; init-scale confounded 1;" in text
    assert "sizes (closeness, the paper's size excluded) only where G1's effect is within 4x of the paper's: in no " \
           "sweep here" in text
    assert text.endswith("\n") and "\n" not in text[:-1]  # one paragraph


def test_gatelab_claims_writes_the_summary_beside_the_table(tmp_path):
    records = {TRAINED: _paired_runs(TRAINED, "baseline", {"g1_elem_sig": _differences(-1.64, -3.77, 0.49)})}
    rows = [claim for claim in load_claims(CLAIMS_FILE) if claim.claim == G1_TRAINED]
    # each run's parameter count as training logs it (model.total_params); the gated variants' are larger
    logged = {r.run_id: count_parameters(resolve_model(r.spec.experiment)) for r in records[TRAINED]}.get
    written = R.write_claims(records, rows, tmp_path, ["md"], log=lambda *_: None, logged_parameters=logged)
    assert [p.name for p in written] == ["claims.md", "summary.md"]
    regimes = R.tokens_per_parameter(records, logged)
    assert regimes == [(TRAINED, pytest.approx(1800 * 16 * 128 / 180_768))]  # 20.4, as the issue measured
    assert R.tokens_per_parameter(records, lambda run_id: None) == []  # no run logged a count: no regime to state
    assert written[1].read_text() == R.summary(C.claims_table(records, rows), regimes,
                                               R.run_setups(records, lambda run_id: None))
    assert np.isclose(regimes[0][1], 20.39, atol=0.01)


def test_gatelab_claims_puts_the_summary_between_the_readmes_markers(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# title\n\n{R.SUMMARY_START}\nold words\n{R.SUMMARY_END}\n\nhand-written prose\n")
    assert R.replace_summary(readme, "The new paragraph.\n")
    assert readme.read_text() == (f"# title\n\n{R.SUMMARY_START}\nThe new paragraph.\n{R.SUMMARY_END}\n\n"
                                  "hand-written prose\n")
    plain = tmp_path / "PLAIN.md"
    plain.write_text("no markers\n")
    assert not R.replace_summary(plain, "x") and plain.read_text() == "no markers\n"
