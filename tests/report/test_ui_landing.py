"""Where the MLflow UI opens: gatelab's experiments carry the tags that make it the runs table in gatelab's saved view
(new and old stores), the report run lives apart from the training runs, `gatelab ui` prints the page to open, and
`--screenshot` draws it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

import pytest
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from gatelab import tracked_run, tracking
from gatelab.errors import GatelabError, redact
from gatelab.report import ui
from tests.helpers import REPO, sqlite_uri

VIEW_TAG = tracking.SAVED_VIEW_TAG_PREFIX + tracking.KEY_METRICS_VIEW


def _store(tmp_path: Path) -> tuple[tracking.RunStore, str]:
    runs = tmp_path / "runs"
    runs.mkdir(exist_ok=True)
    return tracking.RunStore(sqlite_uri(runs), runs), sqlite_uri(runs)


def _fake_run(store: tracking.RunStore, experiment: str, variant: str, ppl: float) -> str:
    """A finished training run as gatelab tags it, with a few final metrics; nothing is trained."""
    run = store.client.create_run(store.experiment_id(experiment), tags={
        tracking.SPEC_HASH_TAG: f"hash-{variant}", tracking.STATUS_TAG: "finished", tracking.VARIANT_TAG: variant,
        tracking.RUN_NAME_TAG: f"{variant}-s0"})
    now = int(time.time() * 1000)
    metrics = {"ppl/avg": ppl, "val/loss": 3.0, "probe/f_attn": 0.3, "probe/m_act": 100.0}
    store.client.log_batch(run.info.run_id, metrics=[Metric(k, v, now, 10) for k, v in metrics.items()])
    store.client.set_terminated(run.info.run_id, "FINISHED")
    return run.info.run_id


def _tags(uri: str, name: str) -> dict[str, str]:
    return MlflowClient(uri).get_experiment_by_name(name).tags


def test_a_new_experiment_opens_on_its_runs_in_the_key_metrics_view(tmp_path):
    store, uri = _store(tmp_path)
    store.experiment_id("sweep-a")
    tags = _tags(uri, "sweep-a")
    assert tags[tracking.EXPERIMENT_KIND_TAG] == "custom_model_development"
    view = json.loads(tags[VIEW_TAG])  # the envelope MLflow's Views menu writes and reads
    assert view["name"] == "gatelab: key metrics" and isinstance(view["createdAt"], int)
    state = json.loads(view["state"])
    assert state["orderByKey"] == "metrics.`ppl/avg`" and state["orderByAsc"] is True
    assert state["selectedColumns"][:2] == ["metrics.`ppl/avg`", "metrics.`val/loss`"]
    assert {"metrics.`probe/f_attn`", "metrics.`probe/m_act`", "metrics.`probe/gate_score_mean`",
            f"tags.`{tracking.STATUS_TAG}`"} <= set(state["selectedColumns"])
    assert len(tags[VIEW_TAG]) <= 20000  # MLflow's limit on an experiment tag's value


def test_an_old_experiment_gets_the_tags_when_gatelab_next_opens_it_and_keeps_a_changed_view(tmp_path):
    _, uri = _store(tmp_path)
    client = MlflowClient(uri)
    old = client.create_experiment("before-the-tags")  # as gatelab made it before: no tags
    client.create_experiment("edited")
    client.set_experiment_tag(client.get_experiment_by_name("edited").experiment_id, VIEW_TAG, "edited in the UI")
    assert tracking.EXPERIMENT_KIND_TAG not in _tags(uri, "before-the-tags")

    # The training path opens the experiment: TrackedRun looks up its run by spec hash.
    tracked_run.TrackedRun(uri, tmp_path / "runs", "before-the-tags", "hash-1")
    tags = _tags(uri, "before-the-tags")
    assert tags[tracking.EXPERIMENT_KIND_TAG] == "custom_model_development" and VIEW_TAG in tags
    assert client.get_experiment_by_name("before-the-tags").experiment_id == old

    tracking.RunStore(uri, tmp_path / "runs").experiment_id("edited")
    assert _tags(uri, "edited")[VIEW_TAG] == "edited in the UI"
    assert _tags(uri, "edited")[tracking.EXPERIMENT_KIND_TAG] == "custom_model_development"


def test_the_report_run_is_in_its_own_experiment_and_an_old_one_among_the_training_runs_is_retired(tmp_path):
    store, uri = _store(tmp_path)
    trained = [_fake_run(store, "sweep-a", variant, ppl) for variant, ppl in (("baseline", 30.0), ("gated", 27.0))]
    # A report run as gatelab logged it before: among the training runs.
    legacy = store.client.create_run(store.experiment_id("sweep-a"), tags={tracking.REPORT_TAG: "true"}).info.run_id
    page = tmp_path / "report.html"
    page.write_text("<html></html>")

    report = store.log_report("sweep-a", [page])

    reports = store.client.get_experiment_by_name(tracking.reports_experiment("sweep-a"))
    assert store.client.get_run(report).info.experiment_id == reports.experiment_id
    assert reports.tags[tracking.REPORTS_OF_TAG] == "sweep-a"
    assert store.client.list_artifacts(report, "report")[0].path == "report/report.html"
    assert store.client.get_run(legacy).info.lifecycle_stage == "deleted"
    training = store.client.get_experiment_by_name("sweep-a").experiment_id
    assert sorted(run.info.run_id for run in store.client.search_runs([training])) == sorted(trained)
    assert sorted(store.sweep_runs("sweep-a")["run_id"]) == sorted(trained)
    assert store.log_report("sweep-a", [page]) == report  # a second report goes to the same run

    assert store.browsable_experiments() == [("sweep-a", training)]  # no report experiment, no empty Default


def test_gatelab_ui_prints_the_runs_page_of_the_only_experiment(tmp_path):
    store, uri = _store(tmp_path)
    _fake_run(store, "sweep-a", "baseline", 30.0)
    experiment = store.client.get_experiment_by_name("sweep-a").experiment_id
    address = "http://127.0.0.1:5123/"

    page, pages = ui.landing_pages(uri, address)

    assert page == (f"{address}#/experiments/{experiment}/runs?workflowType=machine_learning"
                    f"&viewStateShareKey={tracking.KEY_METRICS_VIEW}")
    assert pages == [("sweep-a", page)]
    # gatelab's output redaction hides URL parameters named like a key (an API key), but not the UI's own.
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(page).fragment.split("?", 1)[1])
    assert query == {"workflowType": ["machine_learning"], "viewStateShareKey": [tracking.KEY_METRICS_VIEW]}
    assert redact(page) == page


def test_several_experiments_land_on_the_list_or_on_the_named_sweep(tmp_path):
    store, uri = _store(tmp_path)
    _fake_run(store, "sweep-a", "baseline", 30.0)
    _fake_run(store, "sweep-b", "baseline", 31.0)
    address = "http://127.0.0.1:5123/"

    page, pages = ui.landing_pages(uri, address)
    assert page == f"{address}#/experiments?workflowType=machine_learning"
    assert [name for name, _ in pages] == ["sweep-a", "sweep-b"]

    page, _ = ui.landing_pages(uri, address, sweep_name="sweep-b")
    assert page == dict(pages)["sweep-b"]
    page, _ = ui.landing_pages(uri, address, sweep_name="not-run-yet")
    assert page == f"{address}#/experiments?workflowType=machine_learning"


def test_a_store_not_made_yet_lands_on_the_list_and_is_not_created(tmp_path):
    database = tmp_path / "mlflow.db"
    page, pages = ui.landing_pages(f"sqlite:///{database}", "http://127.0.0.1:5123/")
    assert page.endswith("#/experiments?workflowType=machine_learning") and pages == []
    assert not database.exists()


def test_a_screenshot_without_chromium_is_one_message_before_anything_starts(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(GatelabError, match="--screenshot needs Chromium.*apt-get install chromium"):
        ui.serve_ui(f"sqlite:///{tmp_path / 'mlflow.db'}", port=ui.find_free_port(),
                    screenshot=tmp_path / "ui.png")
    assert not (tmp_path / "mlflow.db").exists()


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(not any(shutil.which(name) for name in ui.CHROMIUM_NAMES), reason="needs Chromium")
def test_gatelab_ui_screenshot_draws_the_runs_table_not_the_genai_overview(tmp_path):
    store, uri = _store(tmp_path)
    _fake_run(store, "sweep-a", "baseline", 30.0)
    _fake_run(store, "sweep-a", "gated", 27.0)
    port, picture = ui.find_free_port(), tmp_path / "ui.png"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}

    done = subprocess.run([sys.executable, "-m", "gatelab", "ui", "--tracking-uri", uri, "--port", str(port),
                           "--screenshot", str(picture)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=240)

    assert done.returncode == 0, done.stderr[-3000:]
    page, _ = ui.landing_pages(uri, f"http://127.0.0.1:{port}/")
    assert f"MLflow UI for {uri}: {page}\n" in done.stdout and f"wrote {picture}" in done.stdout
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and picture.stat().st_size > 20000
    assert str(port) not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout  # stopped


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(not any(shutil.which(name) for name in ui.CHROMIUM_NAMES), reason="needs Chromium")
def test_the_printed_page_shows_the_runs_sorted_by_ppl_with_the_key_metric_columns(tmp_path):
    """What the screenshot shows, read as text: Chromium's DOM of the printed page once the UI has drawn it."""
    store, uri = _store(tmp_path)
    _fake_run(store, "sweep-a", "baseline", 30.0)
    _fake_run(store, "sweep-a", "gated", 27.0)
    port = ui.find_free_port()
    log = (tmp_path / "server.log").open("w")
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--port",
                               str(port), "--workers", "1"], stdout=log, stderr=log, start_new_session=True,
                              env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    try:
        address = f"http://127.0.0.1:{port}/"
        ui._wait_until_up(server, address, threading.Event(), f"its log: {log.name}")
        page, _ = ui.landing_pages(uri, address)
        with tempfile.TemporaryDirectory() as profile:
            dom = subprocess.run(ui.headless_chromium(ui.find_chromium(), profile, "--dump-dom", page),
                                 capture_output=True, text=True, timeout=180).stdout
    finally:
        ui._stop_group(server)
        log.close()
    assert "gatelab: key metrics" in dom  # the saved view is the one shown
    for column in ("ppl/avg", "val/loss", "probe/f_attn", "probe/m_act"):
        assert f">{column}<" in dom, column
    assert dom.index("gated-s0") < dom.index("baseline-s0")  # sorted by ppl/avg, lowest first
    assert "Detect Issues" not in dom and "No data available" not in dom  # not the GenAI overview
