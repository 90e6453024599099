"""Read-only commands (`gatelab ui`, `table`, `claims`, `sweep plan`) as a user runs them: over a store and a ledger
made read-only (chmod -w) they leave every byte as it was and create nothing; with no store they say so, exit 2, and
create nothing either. `table` writes its report to --out, and logs it to MLflow only where the store is writable."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest
from mlflow.entities import Metric

from gatelab import tracking
from gatelab.app.claims import make_claims
from gatelab.app.report import make_report
from gatelab.errors import GatelabError
from gatelab.report import ui
from gatelab.sweep.queue import open_ledger
from gatelab.sweep.spec import expand, load_sweep
from gatelab.workspace import Workspace
from tests.helpers import REPO, gatelab_cli, sqlite_uri, write_sweep


def _tree(folder: Path) -> dict[str, str]:
    """Every file under `folder` by its sha256: what a read-only command must leave as it was."""
    return {str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(folder.rglob("*")) if path.is_file()}


def _chmod_tree(folder: Path, writable: bool) -> None:
    for path in [folder, *folder.rglob("*")]:
        mode = path.stat().st_mode
        path.chmod(mode | 0o200 if writable else mode & ~0o222)


@pytest.fixture
def read_only_store(tmp_path):
    """A sweep with one finished run in its store and a ledger, everything under runs/ made read-only."""
    sweep_path = write_sweep(tmp_path, {"grid": {"variant": ["baseline", "g1_elem_sig"]}})
    runs = tmp_path / "runs"
    runs.mkdir()
    sweep = load_sweep(sweep_path)
    open_ledger(sweep, expand(sweep), None, None, runs)
    store = tracking.RunStore(sqlite_uri(runs), runs)
    run = store.client.create_run(store.experiment_id(sweep.name), tags={
        tracking.SPEC_HASH_TAG: sweep.runs[0].hash, tracking.STATUS_TAG: "finished", tracking.VARIANT_TAG: "baseline"})
    store.client.log_batch(run.info.run_id, metrics=[Metric("ppl/avg", 30.0, int(time.time() * 1000), 10)])
    store.client.set_terminated(run.info.run_id, "FINISHED")
    _chmod_tree(runs, writable=False)
    yield sweep_path, runs
    _chmod_tree(runs, writable=True)


def test_table_over_a_read_only_store_changes_nothing_and_says_the_report_is_not_logged(read_only_store, tmp_path):
    sweep_path, runs = read_only_store
    before = _tree(runs)
    said = []
    written = make_report(sweep_path, experiment=None, formats=["csv", "md"], out_dir=tmp_path / "out",
                          workspace=Workspace(runs_dir=runs), log=said.append)
    assert written and all(path.is_relative_to(tmp_path / "out") for path in written)
    assert _tree(runs) == before, "the store and the ledger are byte for byte as they were"
    assert any(line.startswith("not logged to MLflow: ") and "read-only" in line for line in said)


def test_claims_ui_and_plan_over_a_read_only_store_change_nothing(read_only_store, tmp_path):
    sweep_path, runs = read_only_store
    before = _tree(runs)
    claims = tmp_path / "claims.yaml"
    claims.write_text((REPO / "sweeps" / "claims" / "tiny.yaml").read_text())
    with pytest.raises(GatelabError):  # the shipped claims name the shipped sweeps, not this one: read, then refused
        make_claims([sweep_path], out_dir=tmp_path / "claims-out", formats=["md"], workspace=Workspace(runs_dir=runs),
                    claims_path=claims)
    page, pages = ui.landing_pages(sqlite_uri(runs), "http://127.0.0.1:5123/", sweep_name="t")
    assert [name for name, _ in pages] == ["t"] and page == pages[0][1]
    done = gatelab_cli("sweep", "plan", str(sweep_path), "--runs-dir", str(runs), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert _tree(runs) == before


def test_an_experiment_without_gatelabs_view_is_linked_without_it_and_not_tagged(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    store = tracking.RunStore(sqlite_uri(runs), runs)
    experiment = store.client.create_experiment("made-elsewhere")  # not by gatelab: no landing tags
    store.client.create_run(experiment)
    _chmod_tree(runs, writable=False)
    try:
        before = _tree(runs)
        page, _ = ui.landing_pages(sqlite_uri(runs), "http://127.0.0.1:5123/")
        assert page.endswith(f"#/experiments/{experiment}/runs?workflowType=machine_learning")
        assert _tree(runs) == before
    finally:
        _chmod_tree(runs, writable=True)
    assert tracking.KEY_METRICS_VIEW not in str(store.client.get_experiment(experiment).tags)


# `claims` with no store marks every claim not run and makes no store: tests/test_cli.py.
@pytest.mark.parametrize("command", [("ui",), ("table", "SWEEP")])
def test_with_no_store_a_read_only_command_says_so_exits_2_and_creates_nothing(tmp_path, command):
    sweep_path = write_sweep(tmp_path, {})
    claims = tmp_path / "claims.yaml"
    claims.write_text("claims: []\n")
    work = tmp_path / "empty"
    work.mkdir()
    args = [{"SWEEP": str(sweep_path), "CLAIMS": str(claims)}.get(arg, arg) for arg in command]
    done = gatelab_cli(*args, cwd=work)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"no MLflow store at {work / 'runs' / 'mlflow.db'}" in done.stderr and "--tracking-uri" in done.stderr
    assert "Traceback" not in done.stderr and list(work.iterdir()) == []
