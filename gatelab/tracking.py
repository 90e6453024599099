"""Everything that talks to MLflow, as a small run store. Embedded default: a SQLite store and an artifact folder
under `runs/`.

MLflow 3 refuses the old `./mlruns` file store, so the default is `sqlite:///runs/mlflow.db`. A `--tracking-uri
http://host:port` to a real `mlflow server` works the same. Optuna keeps its own files: the two clash on one SQLite
file. mlflow is imported inside the functions that use it: `redact` and the tag names cost no MLflow import.

A store that cannot be used is one GatelabError naming it and the fix: before training (`check_store`), and from any
RunStore or TrackedRun call (`store_errors`); both live in gatelab.store_checks, the store's URIs in
gatelab.store_uris, and this module re-exports them. One run's MLflow run is gatelab.tracked_run's TrackedRun. During
training a tracking outage costs no time: metrics are queued and sent by a thread (gatelab.metric_outbox), and kept on
disk for the next run of the same command if it lasts.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import importlib.metadata
import json
import os
import subprocess
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gatelab.errors import GatelabError, naming_full_disk, redact
from gatelab.host import repo_root
from gatelab.metrics import KEY_METRICS, PPL_AVG
from gatelab.store_checks import check_store, store_errors
from gatelab.store_uris import sqlite_file

if TYPE_CHECKING:
    import pandas as pd
    from mlflow.entities import Experiment, Run
    from mlflow.tracking import MlflowClient

    from gatelab.metric_outbox import QueuedMLFlowLogger

# The tags gatelab writes on its runs, named once.
SPEC_HASH_TAG = "gatelab.spec_hash"
STATUS_TAG = "gatelab.status"  # running / finished / diverged / pruned / failed / superseded
# A superseded run stays in the store but no report reads it (`gatelab table`, `claims`, `eval`): a run cut off and
# trained again, or one a user set aside with `gatelab sweep supersede`, which records why and the status it had.
SUPERSEDED = "superseded"
SUPERSEDED_REASON_TAG = "gatelab.superseded_reason"
SUPERSEDED_FROM_TAG = "gatelab.superseded_from"
REPORT_TAG = "gatelab.report"  # the sweep-level run that holds `gatelab table`'s files
VARIANT_TAG, SEED_TAG, EXPERIMENT_TAG = "variant", "seed", "experiment"
RUN_NAME_TAG = "mlflow.runName"
REPORTS_OF_TAG = "gatelab.reports_of"  # on the experiment "<sweep> reports": the sweep whose report runs it holds
COMPARISONS_OF_TAG = "gatelab.comparisons_of"  # on "<sweep> comparisons": the sweep whose table's comparisons it holds
# An experiment tagged with one of these holds runs made from a sweep's runs, never training runs: the UI's landing
# pages and the lists of a store's experiments leave it out.
DERIVED_EXPERIMENT_TAGS = (REPORTS_OF_TAG, COMPARISONS_OF_TAG)
COMPARISON_KEY_TAG = "gatelab.comparison.key"  # which row of which table a comparison run is: stable across reruns
TOTAL_PARAMS_PARAM = "model.total_params"  # the parameter count a run logs as it starts (gatelab.train.recording)
RESOLVED_PRECISION_PARAM = "resolved.train.precision"  # the precision it trained in (auto resolved)
# The held-out text its end-of-run scores read (EvalConfig.budget_name, e.g. "windows=64x256" or "bytes=1000000"); a run
# recorded before this param is read as its own config's default (gatelab.report.budgets).
EVAL_BUDGET_PARAM = "resolved.eval.budget"

# What the MLflow UI opens on: the runs table, where a missing tag lands on the GenAI overview. MLflow 3.17's UI reads
# the URL's `workflowType` instead (see gatelab.report.ui), so gatelab sets both.
EXPERIMENT_KIND_TAG, TRAINING_KIND = "mlflow.experimentKind", "custom_model_development"
# A saved view of the runs table, as the UI's "Views" menu writes it: the experiment tag `mlflow.sharedViewState.<key>`
# holding {name, createdAt, updatedAt, state}, `state` the JSON of the table's sort and columns. The UI opens it from
# the URL's `viewStateShareKey=<key>` and lists it under Views.
SAVED_VIEW_TAG_PREFIX = "mlflow.sharedViewState."
KEY_METRICS_VIEW = "gatelab-key-metrics"

# Bounds on every MLflow HTTP request of a gatelab process, where the user set none: with MLflow's own (7 retries with
# exponential backoff, a 120 s timeout) `--tracking-uri http://127.0.0.1:9` kept a run waiting 267 s.
HTTP_REQUEST_BOUNDS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                       "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


def reports_experiment(experiment_name: str) -> str:
    """The experiment that holds a sweep's report run, apart from its training runs (their table and charts)."""
    return f"{experiment_name} reports"


def comparisons_experiment(experiment_name: str) -> str:
    """The experiment that holds one run per comparison of a sweep's table (gatelab.report.comparison_runs)."""
    return f"{experiment_name} comparisons"


def holds_training_runs(experiment: Experiment) -> bool:
    return not any(tag in experiment.tags for tag in DERIVED_EXPERIMENT_TAGS)


def key_metrics_view(now_ms: int | None = None) -> str:
    """The saved view KEY_METRICS_VIEW: the runs table sorted by ppl/avg (lowest first), its columns the key metrics
    of the catalogue (gatelab.metrics; a metric no run has is no column) and the run's gatelab status. The value of
    its SAVED_VIEW_TAG_PREFIX tag."""
    columns = [f"metrics.`{name}`" for name in KEY_METRICS] + [f"tags.`{STATUS_TAG}`"]
    state = {"orderByKey": f"metrics.`{PPL_AVG}`", "orderByAsc": True, "selectedColumns": columns,
             "columnOrder": columns}
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    return json.dumps({"name": "gatelab: key metrics", "createdAt": now_ms, "updatedAt": now_ms,
                       "state": json.dumps(state)})


def landing_tags() -> dict[str, str]:
    """The experiment tags that make the MLflow UI open an experiment on its training runs, in gatelab's view."""
    return {EXPERIMENT_KIND_TAG: TRAINING_KIND, SAVED_VIEW_TAG_PREFIX + KEY_METRICS_VIEW: key_metrics_view()}


def bound_http_requests() -> None:
    for name, value in HTTP_REQUEST_BOUNDS.items():
        os.environ.setdefault(name, value)


def client(uri: str) -> MlflowClient:
    from mlflow.tracking import MlflowClient

    bound_http_requests()
    return MlflowClient(uri)


def prepare_store(uri: str) -> None:
    """Check the tracking store, then create (and migrate) it once, before several workers open it: concurrent first
    opens of one SQLite file race in MLflow's schema migrations."""
    check_store(uri)
    with store_errors(uri):
        client(uri).search_experiments(max_results=1)


def reports_store_errors(method):
    """The method, with the failures of `self.uri`'s store as GatelabErrors (store_errors)."""
    @functools.wraps(method)
    def reported(self, *args, **kwargs):
        with store_errors(self.uri):
            return method(self, *args, **kwargs)
    return reported


class RunStore:
    """One MLflow tracking store seen as gatelab's runs: find them, read them back, log a report beside them."""

    def __init__(self, uri: str, runs_dir: Path = Path("runs"), read_only: bool = False) -> None:
        """`read_only`: only read (gatelab ui, table on a read-only store): no experiment is created or tagged and no
        report logged."""
        self.uri, self.runs_dir, self.read_only = uri, runs_dir, read_only
        with store_errors(uri):
            self.client = client(uri)

    @reports_store_errors
    def experiment_id(self, name: str, tags: dict[str, str] | None = None) -> str:
        """The experiment of this name, created (with its artifacts under runs_dir for a local store, and `tags`) if
        missing. Either way it carries landing_tags(), so the MLflow UI opens it on its runs."""
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            self.ensure_landing_tags(found)
            return found.experiment_id
        artifacts = None
        if not self.uri.startswith(("http://", "https://")):  # a server chooses its own artifact store
            artifacts = (self.runs_dir / "mlartifacts").resolve().as_uri()
        try:
            return self.client.create_experiment(name, artifact_location=artifacts,
                                                 tags={**landing_tags(), **(tags or {})})
        except Exception:  # another process made it between the lookup and here (workers starting at once)
            found = self.client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    def ensure_landing_tags(self, experiment) -> None:
        """Add the landing tags an experiment lacks (one made before gatelab set them, or by someone else); a tag it
        has, even changed from the UI (an updated saved view), is kept. A read-only store is left as it is."""
        if self.read_only:
            return
        for key, value in landing_tags().items():
            if key not in experiment.tags:
                self.client.set_experiment_tag(experiment.experiment_id, key, value)

    def browsable_experiments(self) -> list[tuple[str, str]]:
        """(name, id) of every active experiment with runs, report and comparison experiments aside, oldest first;
        each gets its landing tags (unless the store is read-only)."""
        return [(name, experiment_id) for name, experiment_id, _ in self.browsable_experiment_views()]

    @reports_store_errors
    def browsable_experiment_views(self) -> list[tuple[str, str, bool]]:
        """browsable_experiments with whether each has gatelab's saved view of the runs table (always, unless the
        store is read-only: then only where gatelab set it when it made the experiment)."""
        found = []
        for experiment in self.client.search_experiments(order_by=["creation_time ASC"]):
            if not holds_training_runs(experiment):
                continue
            if not self.client.search_runs([experiment.experiment_id], max_results=1):
                continue  # MLflow's empty "Default", or an experiment whose first run has not started
            self.ensure_landing_tags(experiment)
            has_view = not self.read_only or SAVED_VIEW_TAG_PREFIX + KEY_METRICS_VIEW in experiment.tags
            found.append((experiment.name, experiment.experiment_id, has_view))
        return found

    @reports_store_errors
    def find_run(self, experiment_name: str, spec_hash: str) -> str | None:
        """The newest MLflow run of this spec hash, so a resumed run continues the same MLflow run. A superseded run is
        never continued: reopening it would tag it running again and undo what set it aside."""
        runs = self._runs(self.experiment_id(experiment_name), f"tags.`{SPEC_HASH_TAG}` = '{spec_hash}'")
        return next((run.info.run_id for run in runs if not _superseded(run)), None)

    @reports_store_errors
    def sweep_runs(self, experiment_name: str) -> pd.DataFrame:
        """Every gatelab run of an experiment that is not superseded, newest first, as `mlflow.search_runs` lays it
        out: run_id, status, start_time, end_time (UTC timestamps), one `metrics.<name>` column per metric and one
        `tags.<name>` per tag, and of the params only `params.<EVAL_BUDGET_PARAM>` (None where a run has none).
        Empty where the experiment does not exist yet. Read through this store's client, never MLflow's global URI.
        Every report reads its runs here, so a superseded run is read by none."""
        import pandas as pd

        experiment = self.client.get_experiment_by_name(experiment_name)
        rows: list[dict[str, Any]] = []
        if experiment is not None:
            rows = [_run_row(run) for run in self._runs(experiment.experiment_id, f"tags.`{SPEC_HASH_TAG}` != ''")
                    if not _superseded(run)]
        frame = pd.DataFrame(rows)
        for column in ("start_time", "end_time"):
            if column in frame:
                frame[column] = pd.to_datetime(frame[column], unit="ms", utc=True)
        return frame

    def _runs(self, experiment_id: str, filter_string: str = "") -> Iterator[Run]:
        """The experiment's runs that match `filter_string` (MLflow's trash aside), newest first, a page at a time."""
        token = None
        while True:
            page = self.client.search_runs([experiment_id], filter_string=filter_string,
                                           order_by=["attributes.start_time DESC"], page_token=token)
            yield from page
            token = page.token
            if not token:
                return

    @reports_store_errors
    def supersede(self, experiment_name: str, reason: str, run_ids: Sequence[str] = ()) -> list[Supersession]:
        """Set runs aside for `reason`: the runs `run_ids` of the experiment, or without ids every run of it. Every
        run is checked before any tag is written, so one bad id changes nothing. Each gets STATUS_TAG superseded,
        SUPERSEDED_REASON_TAG, and SUPERSEDED_FROM_TAG with the status it had (its MLflow status, metrics and artifacts
        stay: nothing recorded is lost). A run already superseded for this reason is left as it is."""
        from mlflow.entities import RunTag

        reason = reason.strip()
        if not reason:
            raise GatelabError('the reason is empty: say why the runs are set aside, e.g. --reason "trained before '
                               'the tokenizer fix"')
        experiment = self._named_experiment(experiment_name)
        if run_ids:
            runs = [self._run_of(experiment, run_id) for run_id in dict.fromkeys(run_ids)]
        else:
            runs = list(self._runs(experiment.experiment_id))
        done = []
        for run in runs:
            tags = run.data.tags
            was = tags.get(STATUS_TAG, "")
            wanted = {SUPERSEDED_REASON_TAG: reason, STATUS_TAG: SUPERSEDED}
            if was and was != SUPERSEDED:
                wanted = {SUPERSEDED_FROM_TAG: was, **wanted}
            changed = [RunTag(key, value) for key, value in wanted.items() if tags.get(key) != value]
            if changed:
                self.client.log_batch(run.info.run_id, tags=changed)
            done.append(Supersession(run.info.run_id, tags.get(RUN_NAME_TAG, ""), was,
                                     tags.get(SUPERSEDED_REASON_TAG), reason))
        return done

    def _named_experiment(self, name: str) -> Experiment:
        """The experiment of this name; a name the store lacks is one error naming it and the store's experiments."""
        found = self.client.get_experiment_by_name(name)
        if found is not None and found.lifecycle_stage == "active":
            return found
        names = sorted(e.name for e in self.client.search_experiments() if holds_training_runs(e))
        close = difflib.get_close_matches(name, names, n=1)
        raise GatelabError(f"no MLflow experiment '{name}' in {redact(self.uri)}"
                           + (f" (did you mean {close[0]}?)" if close else "")
                           + f"; its experiments: {', '.join(names) or 'none'}. Check the name (the MLflow UI lists "
                           "them), or pass --tracking-uri or --runs-dir for another store")

    def _run_of(self, experiment: Experiment, run_id: str) -> Run:
        """The run `run_id`, which must be a run of `experiment` not in MLflow's trash (MLflow refuses tags there)."""
        run = self.run(run_id)
        if run.info.experiment_id != experiment.experiment_id:
            other = self.client.get_experiment(run.info.experiment_id).name
            raise GatelabError(f"MLflow run '{run_id}' is a run of experiment '{other}', not of '{experiment.name}': "
                               f"give the ids of runs of '{experiment.name}' (`gatelab sweep status` lists them)")
        if run.info.lifecycle_stage != "active":
            raise GatelabError(f"MLflow run '{run_id}' is deleted, so no report reads it: leave it out, or restore it "
                               "(the MLflow UI, State: Deleted) first")
        return run

    @reports_store_errors
    def metric_history(self, run_id: str, name: str) -> tuple[list[int], list[float]]:
        """(steps, values) of one metric of one run, in step order."""
        history = sorted(self.client.get_metric_history(run_id, name), key=lambda m: m.step)
        return [m.step for m in history], [m.value for m in history]

    def artifact_text(self, run_id: str, path: str) -> str | None:
        """A text artifact of a run; None where the artifact store cannot give it (a missing plot, never a failed
        report)."""
        from mlflow.artifacts import download_artifacts

        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one bar per small file is noise
        try:
            local = Path(download_artifacts(run_id=run_id, artifact_path=path, tracking_uri=self.uri))
        except Exception:  # MLflow raises many kinds for a missing file or an unreachable artifact store
            local = self._beside_the_database(run_id, path)
        return None if local is None else local.read_text()

    def _beside_the_database(self, run_id: str, path: str) -> Path | None:
        """The artifact in the artifact folder beside a SQLite store's database: a local store keeps absolute artifact
        URIs, so one extracted or moved to another folder (results/tiny's committed store) holds them only here."""
        database = sqlite_file(self.uri)
        local = None if database is None else database.parent / "mlartifacts" / run_id / "artifacts" / path
        return local if local is not None and local.is_file() else None

    def artifact_json(self, run_id: str, path: str) -> Any | None:
        """A JSON artifact of a run, parsed; None where the artifact store cannot give it."""
        text = self.artifact_text(run_id, path)
        return None if text is None else json.loads(text)

    @reports_store_errors
    def artifact_location(self, run_id: str) -> str:
        """Where the run's experiment keeps artifacts ('' where the store does not say)."""
        experiment = self.client.get_run(run_id).info.experiment_id
        return self.client.get_experiment(experiment).artifact_location or ""

    @reports_store_errors
    def finished_run_metrics(self, prefixes: tuple[str, ...], seed: int | None = None) -> list[dict[str, float]]:
        """For every run of every experiment that gatelab recorded as finished (of one seed), its metrics whose names
        start with one of `prefixes`."""
        experiments = [e.experiment_id for e in self.client.search_experiments()]
        query = f"tags.`{STATUS_TAG}` = 'finished'" + (f" AND tags.`{SEED_TAG}` = '{seed}'" if seed is not None else "")
        runs = self.client.search_runs(experiments, query)
        return [{k: v for k, v in run.data.metrics.items() if k.startswith(prefixes)} for run in runs]

    def run_data(self, run_id: str):
        """The run's tags, params and metrics (MLflow's RunData); a run id the store lacks is one error naming it."""
        return self.run(run_id).data

    @reports_store_errors
    def run(self, run_id: str) -> Run:
        """The MLflow run; a run id the store lacks is one error naming it."""
        from mlflow.exceptions import MlflowException

        try:
            return self.client.get_run(run_id)
        except MlflowException as error:
            if error.error_code not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                raise  # the store itself failed: store_errors says so
            raise GatelabError(f"no MLflow run '{run_id}' in {redact(self.uri)}: check the id (the MLflow UI, or "
                               "`gatelab sweep status`), or pass --tracking-uri for another store") from None

    @reports_store_errors
    def log_scores(self, run_id: str, metrics: dict[str, float], tags: dict[str, str], paths: Iterable[Path],
                   folder: str) -> None:
        """Scores of an ended run (benchmarks scored after training): metrics, the files as artifacts under `folder`,
        then `tags`, last, so a tag is never there without what it vouches for."""
        from mlflow.entities import Metric, RunTag

        now = int(time.time() * 1000)
        self.client.log_batch(run_id, metrics=[Metric(k, v, now, 0) for k, v in metrics.items()])
        root = artifact_root(self.client.get_run(run_id).info.artifact_uri)
        for path in paths:
            with naming_full_disk(f"{root}{folder}/{Path(path).name}"):
                self.client.log_artifact(run_id, str(path), folder)
        self.client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])

    @reports_store_errors
    def log_report(self, experiment_name: str, paths: Iterable[Path]) -> str | None:
        """The files of a report as artifacts of one sweep-level run (tagged REPORT_TAG), so the report opens from the
        MLflow UI too. The run lives in the experiment reports_experiment(experiment_name), so the training runs'
        table and charts hold training runs only. Returns that run's id; None on a read-only store (nothing logged)."""
        if self.read_only:
            return None
        experiment = self.experiment_id(reports_experiment(experiment_name), {REPORTS_OF_TAG: experiment_name})
        found = self.client.search_runs([experiment], filter_string=f"tags.`{REPORT_TAG}` = 'true'", max_results=1)
        run = found[0] if found else self.client.create_run(
            experiment, tags={REPORT_TAG: "true", RUN_NAME_TAG: f"{experiment_name} report"})
        run_id, root = run.info.run_id, artifact_root(run.info.artifact_uri)
        for path in paths:
            with naming_full_disk(f"{root}report/{Path(path).name}"):
                self.client.log_artifact(run_id, str(path), "report")
        self.client.set_terminated(run_id, "FINISHED")
        self._retire_report_runs_among_training_runs(experiment_name)
        return run_id

    def _retire_report_runs_among_training_runs(self, experiment_name: str) -> None:
        """A gatelab before the reports experiment logged the report among the training runs: once its files are in
        the new report run, that one is deleted (MLflow's soft delete: the UI's "State: Deleted" still shows it)."""
        training = self.client.get_experiment_by_name(experiment_name)
        if training is None:
            return
        for run in self.client.search_runs([training.experiment_id], filter_string=f"tags.`{REPORT_TAG}` = 'true'"):
            self.client.delete_run(run.info.run_id)

    @reports_store_errors
    def log_comparisons(self, experiment_name: str, comparisons: Sequence[ComparisonRun]) -> list[str]:
        """One run per comparison in the experiment comparisons_experiment(experiment_name), found again by its key
        (COMPARISON_KEY_TAG), so that each key has one active run however often the table is made. MLflow never
        changes a logged param: a run whose params (what was compared) or metric names differ from the comparison's
        is deleted (MLflow's soft delete) for a new one; one that matches gets the new metric values and tags. Runs
        of keys no longer in `comparisons` are deleted too. Returns the runs' ids; [] on a read-only store, and no
        experiment made for no comparisons."""
        from mlflow.entities import Metric, Param, RunTag

        name = comparisons_experiment(experiment_name)
        if self.read_only or (not comparisons and self.client.get_experiment_by_name(name) is None):
            return []
        experiment = self.experiment_id(name, {COMPARISONS_OF_TAG: experiment_name})
        logged: dict[str, list[Run]] = {}
        for run in self._runs(experiment):
            logged.setdefault(run.data.tags.get(COMPARISON_KEY_TAG, ""), []).append(run)
        run_ids, now = [], int(time.time() * 1000)
        for comparison in comparisons:
            earlier = logged.pop(comparison.key, [])
            kept = earlier[0] if len(earlier) == 1 and comparison.matches(earlier[0]) else None
            if kept is None:
                for run in earlier:
                    self.client.delete_run(run.info.run_id)
                made = self.client.create_run(experiment, tags={RUN_NAME_TAG: comparison.name})
                run_id, root = made.info.run_id, artifact_root(made.info.artifact_uri)
                self.client.log_batch(run_id, params=[Param(k, v) for k, v in comparison.params.items()])
            else:
                run_id, root = kept.info.run_id, artifact_root(kept.info.artifact_uri)
            before = {} if kept is None else kept.data.metrics
            self.client.log_batch(run_id, metrics=[Metric(k, v, now, 0) for k, v in comparison.metrics.items()
                                                   if before.get(k) != v],
                                  tags=[RunTag(k, v) for k, v in {**comparison.tags,
                                                                  COMPARISON_KEY_TAG: comparison.key}.items()])
            with naming_full_disk(f"{root}comparison.json"):
                self.client.log_dict(run_id, comparison.details, "comparison.json")
            self.client.set_terminated(run_id, "FINISHED")
            run_ids.append(run_id)
        for stale in logged.values():
            for run in stale:
                self.client.delete_run(run.info.run_id)
        return run_ids


def artifact_root(artifact_uri: str | None) -> str:
    """A run's artifact root (its `info.artifact_uri`) with a trailing '/': a path for a local artifact store (what a
    full disk's message names, with its file system), else the URI."""
    import urllib.parse

    root = artifact_uri or ""
    if root.startswith("file:"):
        root = urllib.parse.unquote(urllib.parse.urlparse(root).path)
    return f"{root.rstrip('/')}/"


def lightning_logger(experiment_name: str, uri: str, run_id: str | None = None, tags: dict[str, str] | None = None,
                     run_name: str | None = None) -> QueuedMLFlowLogger:
    """Lightning's MLflow logger, its metrics queued (see gatelab.metric_outbox): a new run of the experiment (tagged
    `tags`), or the existing run `run_id`."""
    from gatelab.metric_outbox import QueuedMLFlowLogger

    bound_http_requests()
    return QueuedMLFlowLogger(experiment_name=experiment_name, tracking_uri=uri, run_id=run_id, tags=tags,
                              run_name=run_name)


@dataclass(frozen=True)
class ComparisonRun:
    """One row of a sweep's table as its own MLflow run (RunStore.log_comparisons): `params` say what was compared
    and never change on a run, `metrics` and `tags` what came of it; `details` is logged as comparison.json."""

    key: str
    name: str
    params: dict[str, str]
    metrics: dict[str, float]
    tags: dict[str, str]
    details: dict[str, Any]

    def matches(self, run: Run) -> bool:
        """Whether `run` logged these params and these metrics' names, so that it can take these values."""
        return run.data.params == self.params and set(run.data.metrics) == set(self.metrics)


@dataclass(frozen=True)
class Supersession:
    """One run RunStore.supersede set aside, and what it was before."""

    run_id: str
    run_name: str
    was: str  # its STATUS_TAG before: "superseded" where it already was, "" where it had none
    old_reason: str | None  # its SUPERSEDED_REASON_TAG before
    reason: str

    @property
    def changed(self) -> bool:
        return self.was != SUPERSEDED or self.old_reason != self.reason


def _superseded(run: Run) -> bool:
    return run.data.tags.get(STATUS_TAG) == SUPERSEDED


def _run_row(run) -> dict[str, Any]:
    row: dict[str, Any] = {"run_id": run.info.run_id, "status": run.info.status,
                           "start_time": run.info.start_time, "end_time": run.info.end_time}
    row.update({f"metrics.{k}": v for k, v in run.data.metrics.items()})
    row.update({f"tags.{k}": v for k, v in run.data.tags.items()})
    # The one param a report reads (every config key is a param: a hundred columns no report wants).
    row[f"params.{EVAL_BUDGET_PARAM}"] = run.data.params.get(EVAL_BUDGET_PARAM)
    return row


CODE_HASH_TAG = "gatelab.code_sha256"


@functools.cache
def code_hash() -> str:
    """sha256 over the installed gatelab package's .py and .yaml files (relative path and bytes, sorted): the code
    that ran, whatever git says of the tree it came from (a copied checkout can carry another commit's metadata)."""
    package = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(p for p in package.rglob("*") if p.suffix in (".py", ".yaml") and "__pycache__" not in p.parts):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def code_version() -> dict[str, str]:
    """The git commit and dirty flag of the gatelab checkout, when there is one, and the package's content hash: each
    read once a process, as the code it loaded is, so a worker's later runs do not name commits made while it works."""
    return {**_git_version(), CODE_HASH_TAG: code_hash()}


@functools.cache
def _git_version() -> dict[str, str]:
    unknown = {"gatelab.git_commit": "unknown", "gatelab.git_dirty": "unknown"}
    root = repo_root()
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return unknown
    if commit.returncode:
        return unknown
    return {"gatelab.git_commit": commit.stdout.strip(), "gatelab.git_dirty": str(bool(dirty.stdout.strip())).lower()}


def package_versions() -> dict[str, str]:
    names = ("gatelab", "torch", "lightning", "mlflow", "optuna", "tokenizers", "numpy")
    versions = {}
    for name in names:
        try:
            versions[f"version.{name}"] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[f"version.{name}"] = "absent"
    return versions
