"""`gatelab sweep supersede`: it tags the runs named (or every run of an experiment) superseded with the reason and the
status they had, changes nothing more when run again, and refuses bad input with one message and exit code 2 before
any tag is written. The runs are made in a real SQLite store without training."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from gatelab import tracking
from gatelab.cli import app
from gatelab.sweep.spec import expand, load_sweep
from tests.helpers import sqlite_uri, write_sweep

REASON = "trained before the tokenizer fix"


@pytest.fixture
def store(tmp_path):
    """Sweep t's two runs (finished, diverged), and a renamed copy of older runs in the experiment t-old (one finished,
    one superseded by gatelab itself, with no reason). Returns the sweep file, the runs folder and the run ids."""
    sweep_path = write_sweep(tmp_path, {"grid": {"variant": ["baseline", "g1_elem_sig"]}})
    runs = tmp_path / "runs"
    runs.mkdir()
    run_store = tracking.RunStore(sqlite_uri(runs), runs)
    ids = {}
    for name, (experiment, status, spec) in {
        "finished": ("t", "finished", 0), "diverged": ("t", "diverged", 1),
        "old": ("t-old", "finished", 0), "old cut off": ("t-old", "superseded", 1),
    }.items():
        tags = {tracking.SPEC_HASH_TAG: expand(load_sweep(sweep_path))[spec].hash, tracking.STATUS_TAG: status,
                tracking.RUN_NAME_TAG: name}
        ids[name] = run_store.client.create_run(run_store.experiment_id(experiment), tags=tags).info.run_id
        run_store.client.set_terminated(ids[name], "KILLED" if status == "superseded" else "FINISHED")
    return sweep_path, runs, ids


def supersede(sweep_path, runs, *args: str):
    return CliRunner().invoke(app, ["sweep", "supersede", str(sweep_path), "--runs-dir", str(runs), *args])


def all_tags(runs) -> dict[str, dict[str, str]]:
    client = tracking.client(sqlite_uri(runs))
    found = client.search_runs([e.experiment_id for e in client.search_experiments()])
    return {run.info.run_id: run.data.tags for run in found}


def test_the_runs_named_get_the_reason_and_their_old_status_and_a_rerun_changes_nothing(store):
    sweep_path, runs, ids = store
    done = supersede(sweep_path, runs, "--run", ids["finished"], "--run", ids["diverged"], "--reason", REASON)
    assert done.exit_code == 0, done.output
    assert f"run {ids['finished']} (finished): finished -> superseded ({REASON})" in done.output
    assert "2 run(s) of experiment 't' changed; gatelab table and gatelab claims no longer read them" in done.output
    tags = all_tags(runs)
    for name, was in (("finished", "finished"), ("diverged", "diverged")):
        assert tags[ids[name]][tracking.STATUS_TAG] == tracking.SUPERSEDED
        assert tags[ids[name]][tracking.SUPERSEDED_REASON_TAG] == REASON
        assert tags[ids[name]][tracking.SUPERSEDED_FROM_TAG] == was
    assert tags[ids["old"]][tracking.STATUS_TAG] == "finished"  # another experiment's run is left alone
    client = tracking.client(sqlite_uri(runs))
    assert client.get_run(ids["finished"]).info.status == "FINISHED"  # MLflow's own record stays

    again = supersede(sweep_path, runs, "--run", ids["finished"], "--run", ids["diverged"], "--reason", REASON)
    assert again.exit_code == 0, again.output
    assert f"run {ids['finished']} (finished): already superseded ({REASON}), unchanged" in again.output
    assert "nothing changed: the 2 run(s) were already superseded for this reason" in again.output
    assert all_tags(runs) == tags


def test_an_experiment_name_supersedes_every_run_of_it_once(store):
    sweep_path, runs, ids = store
    done = supersede(sweep_path, runs, "--experiment-name", "t-old", "--reason", REASON)
    assert done.exit_code == 0, done.output
    assert f"run {ids['old cut off']} (old cut off): already superseded, reason now '{REASON}' (was 'none given')" \
        in done.output
    tags = all_tags(runs)
    assert tags[ids["old"]][tracking.SUPERSEDED_FROM_TAG] == "finished"
    assert tracking.SUPERSEDED_FROM_TAG not in tags[ids["old cut off"]]  # gatelab kept no earlier status there
    assert all(tags[ids[name]][tracking.SUPERSEDED_REASON_TAG] == REASON for name in ("old", "old cut off"))
    assert tags[ids["finished"]][tracking.STATUS_TAG] == "finished"

    again = supersede(sweep_path, runs, "--experiment-name", "t-old", "--reason", REASON)
    assert again.exit_code == 0 and "nothing changed: the 2 run(s) were already superseded" in again.output
    assert all_tags(runs) == tags


@pytest.mark.parametrize("args, named", [
    (["--run", "finished", "--run", "no-such-run"], ["no MLflow run 'no-such-run' in", "check the id"]),
    (["--run", "finished", "--run", "old"], ["MLflow run 'old' is a run of experiment 't-old', not of 't'",
                                             "`gatelab sweep status` lists them"]),
    (["--experiment-name", "t-ld"], ["no MLflow experiment 't-ld' in", "(did you mean t-old?)",
                                     "its experiments: Default, t, t-old", "Check the name"]),
    (["--run", "finished", "--reason", "  "], ["the reason is empty", '--reason "']),
    ([], ["say which runs to supersede: --run RUN_ID", "or --experiment-name NAME"]),
    (["--run", "finished", "--experiment-name", "t-old"], ["say which runs to supersede", "not both"]),
], ids=["unknown-run", "run-of-another-experiment", "unknown-experiment", "empty-reason", "no-runs", "both"])
def test_bad_input_is_one_message_exit_2_and_changes_nothing(store, args, named):
    sweep_path, runs, ids = store
    before = all_tags(runs)
    args = [ids.get(arg, arg) for arg in args]
    named = [text.replace("'finished'", f"'{ids['finished']}'").replace("'old'", f"'{ids['old']}'") for text in named]
    if "--reason" not in args:
        args += ["--reason", REASON]
    done = supersede(sweep_path, runs, *args)
    assert done.exit_code == 2, done.output
    assert done.output.startswith("error: ") and "Traceback" not in done.output
    assert all(text in " ".join(done.output.split()) for text in named), done.output
    assert all_tags(runs) == before
