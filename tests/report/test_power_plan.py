"""The seed count of a confirmatory sweep (gatelab.report.power_plan): the rule on pilots whose answer is known, and
the committed pages beside the sweeps as the module writes them from the committed store."""

from __future__ import annotations

import hashlib
import math
import re
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
import yaml

from gatelab.errors import GatelabError
from gatelab.paper import DENSE_G1_PAIRS
from gatelab.report.power_plan import (
    CLAIMS,
    PaperPair,
    claims_inputs,
    main,
    paper_pairs,
    plan_seeds,
    render,
    write_plan,
)
from gatelab.report.stats import seeds_needed
from gatelab.sweep import spec
from gatelab.sweep.spec import load_sweep
from gatelab.tracking import RunStore
from gatelab.workspace import Workspace
from tests.helpers import REPO

COMMITTED_STORE = REPO / "results" / "tiny" / "mlflow-store.tar.xz"

# Paired differences -1, 0, +1 around a baseline of 10: sd exactly 1, baseline mean exactly 10.
BASELINE = {0: 10.0, 1: 10.0, 2: 10.0}
GATED = {0: 9.0, 1: 10.0, 2: 11.0}
TEN_PERCENT = [PaperPair("g", "b", 9.0, 10.0)]  # the paper's effect -10%: half of it at a mean of 10 is 0.5


def _plan(pairs, family_size=1, **changes):
    return plan_seeds(GATED, BASELINE, pairs, family_size=family_size, pilot="pilot", a="g1_elem_sig", b="baseline",
                      **changes)


def test_half_a_ten_percent_effect_at_sd_one_is_cohens_34_pairs():
    # Half of -10% of 10 is 0.5 = d 0.5 at sd 1: a paired t-test at alpha 0.05 and power 0.8 needs 34 pairs.
    plan = _plan(TEN_PERCENT)
    assert (plan.sd, plan.baseline_mean, plan.target) == (pytest.approx(1.0), 10.0, pytest.approx(0.5))
    assert plan.seeds_for_power == plan.seeds_needed == 34


def test_the_family_divides_alpha():
    plan = _plan(TEN_PERCENT, family_size=9)
    assert plan.level == pytest.approx(0.05 / 9)
    assert plan.seeds_needed == seeds_needed(0.5, 1.0, paired=True, alpha=0.05 / 9) > 34


def test_the_floor_of_14_applies_when_power_needs_fewer():
    plan = _plan([PaperPair("g", "b", 5.0, 10.0)])  # half of -50% of 10: 2.5 sd
    assert plan.seeds_for_power < 14 and plan.seeds_needed == 14


def test_the_paper_effect_is_the_mean_of_its_pairs():
    plan = _plan([*TEN_PERCENT, PaperPair("g2", "b2", 7.0, 10.0)])
    assert plan.paper_effect == pytest.approx(-0.2) and plan.target == pytest.approx(1.0)


def test_only_seeds_finite_on_both_sides_pair():
    plan = plan_seeds({**GATED, 3: math.nan, 4: 12.0}, {**BASELINE, 3: 10.0}, TEN_PERCENT,
                      family_size=1, pilot="pilot", a="g1_elem_sig", b="baseline")
    assert plan.seeds == (0, 1, 2) and plan.seeds_needed == 34


@pytest.mark.parametrize(("gated", "expected"), [({0: 9.0}, "1 seed(s)"), ({0: 9.0, 1: 9.0, 2: 9.0}, "paired sd of 0")])
def test_a_pilot_without_a_spread_is_one_error(gated, expected):
    with pytest.raises(GatelabError, match=re.escape(expected)):
        plan_seeds(gated, BASELINE, TEN_PERCENT, family_size=1, pilot="pilot", a="g1_elem_sig",
                   b="baseline")


@pytest.mark.parametrize(("declared", "verdict"), [(range(34), "enough"), (range(37, 70), "not enough: 1 short of 34")])
def test_the_page_says_whether_the_declared_seeds_are_enough(declared, verdict):
    page = render(_plan(TEN_PERCENT), "sweeps/x.yaml", list(declared), "python -m gatelab.report.power_plan",
                  "from 6 ended runs")
    span = f"{min(declared)}-{max(declared)}"
    assert page.endswith(f"sweeps/x.yaml declares {len(declared)} seeds ({span}) of g1_elem_sig and baseline: "
                         f"{verdict}\n")


@pytest.mark.parametrize("sweep", ["repro-matched", "repro-matched-confirm"])
def test_the_paper_pairs_and_the_family_are_the_claims_files(sweep, monkeypatch):
    monkeypatch.chdir(REPO)
    claims = yaml.safe_load(CLAIMS.read_text())["claims"]
    (row,) = [c for c in claims if c.get("sweep") == sweep and (c.get("a"), c.get("b")) == ("g1_elem_sig", "baseline")]
    inputs = claims_inputs(CLAIMS, load_sweep(Path(f"sweeps/{sweep}.yaml")))
    assert inputs.table == row["paper"]["table"] == "table2"
    assert inputs.pairs == tuple(map(tuple, row["paper"]["pairs"])) == DENSE_G1_PAIRS  # the ladder table's too
    # A row added to the confirmatory family makes Holm's first step stricter: the plan counts the file's rows.
    assert inputs.family_size == sum(c.get("section") == "confirmatory" for c in claims) == 9
    effect = np.mean([pair.effect for pair in paper_pairs(inputs.table, inputs.pairs)])
    assert effect == pytest.approx(-0.018566, abs=1e-6)


def test_a_claims_file_without_the_sweeps_g1_row_is_one_error(tmp_path, monkeypatch):
    # A copy of the checkout's sweeps and presets, since a claims file reads the sweeps beside it.
    for folder in ("sweeps", "experiments"):
        shutil.copytree(REPO / folder, tmp_path / folder)
    monkeypatch.chdir(tmp_path)
    claims = yaml.safe_load(CLAIMS.read_text())
    claims["claims"] = [c for c in claims["claims"] if c.get("sweep") != "repro-matched"]
    CLAIMS.write_text(yaml.safe_dump(claims, sort_keys=False))
    with pytest.raises(GatelabError, match="0 rows compare g1_elem_sig with baseline on sweep repro-matched"):
        claims_inputs(CLAIMS, load_sweep(Path("sweeps/repro-matched.yaml")))


@pytest.fixture(scope="module")
def committed_runs(tmp_path_factory) -> Path:
    """The committed store, extracted and made read-only: the plan only reads it."""
    folder = tmp_path_factory.mktemp("committed")
    with tarfile.open(COMMITTED_STORE) as archive:
        archive.extractall(folder, filter="data")
    for path in folder.rglob("*"):
        path.chmod(path.stat().st_mode & ~0o222)
    return folder / "runs"


def _tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(("sweep", "pilot"), [("repro-matched", "repro-trained-long"),
                                              ("repro-matched-confirm", "repro-matched")])
def test_the_committed_page_is_what_the_committed_store_gives(sweep, pilot, committed_runs, tmp_path, monkeypatch):
    if RunStore(Workspace(runs_dir=committed_runs).store(create=False), committed_runs,
                read_only=True).sweep_runs(pilot).empty:
        pytest.skip(f"{COMMITTED_STORE.relative_to(REPO)} holds no runs of {pilot} yet: commit the store that does")
    before = _tree(committed_runs)
    monkeypatch.chdir(REPO)  # the page names the sweep as the command line does: sweeps/NAME.yaml
    out = tmp_path / "page.md"
    assert main([f"sweeps/{sweep}.yaml", "--pilot", pilot, "--runs-dir", str(committed_runs), "--out", str(out)]) == 0
    assert out.read_bytes() == (REPO / "sweeps" / f"{sweep}.power.md").read_bytes()
    assert _tree(committed_runs) == before


def test_a_bad_pilot_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    # Loading a sweep says how far it is after 5 s without a word, a clock shared with the tests before this one in
    # the process: under load that line came before the error (a flaky exact comparison). Silence it here.
    monkeypatch.setattr(spec, "PROGRESS_AFTER_S", math.inf)
    assert main(["sweeps/repro-matched.yaml", "--pilot", "no-such-sweep",
                 "--runs-dir", str(tmp_path), "--out", str(tmp_path / "page.md")]) == 2
    assert capsys.readouterr().err == ("error: --pilot no-such-sweep: no sweep file sweeps/no-such-sweep.yaml; name "
                                       "a sweep of sweeps/\n")
    assert not (tmp_path / "page.md").exists()


def test_a_usage_error_is_typers_message_and_exit_2(capsys):
    assert main(["sweeps/repro-matched.yaml", "--pilot", "repro-matched", "--family-size", "9"]) == 2
    assert "No such option: --family-size" in capsys.readouterr().err


def test_a_pilot_scored_on_two_budgets_is_refused(tmp_path, monkeypatch, committed_runs):
    from gatelab.report import tables
    from tests.report.test_budgets import _records, _variant_on_bytes

    monkeypatch.chdir(REPO)
    monkeypatch.setattr(tables, "collect_runs", lambda *args, **kwargs: _records(tmp_path, _variant_on_bytes))
    with pytest.raises(GatelabError, match="pilot repro-trained-long: not comparable: scored on different evaluation "
                                           "budgets"):
        write_plan(Path("sweeps/repro-matched.yaml"), "repro-trained-long", committed_runs, tmp_path / "page.md")
    assert not (tmp_path / "page.md").exists()
