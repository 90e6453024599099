"""Everything that talks to MLflow, as a small run store. Embedded default: a SQLite store and an artifact folder
under `runs/`.

MLflow 3 refuses the old `./mlruns` file store, so the default is `sqlite:///runs/mlflow.db`. A `--tracking-uri
http://host:port` to a real `mlflow server` works the same. Optuna keeps its own files: the two clash on one SQLite
file. mlflow is imported inside the functions that use it: `redact` and the tag names cost no MLflow import.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gatelab.errors import GatelabError, redact  # redact re-exported: callers that log a tracking URI find it here
from gatelab.host import repo_root

if TYPE_CHECKING:
    import pandas as pd
    from lightning.pytorch.loggers import MLFlowLogger
    from mlflow.tracking import MlflowClient

# The tags gatelab writes on its runs, named once.
SPEC_HASH_TAG = "gatelab.spec_hash"
STATUS_TAG = "gatelab.status"  # running / finished / diverged / pruned / failed / superseded
REPORT_TAG = "gatelab.report"  # the sweep-level run that holds `gatelab table`'s files
VARIANT_TAG, SEED_TAG, EXPERIMENT_TAG = "variant", "seed", "experiment"
RUN_NAME_TAG = "mlflow.runName"


def default_tracking_uri(runs_dir: Path) -> str:
    """SQLite under runs/, waiting up to a minute for a lock: several local workers write to it at once."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(runs_dir / 'mlflow.db').resolve()}?timeout=60"


def sqlite_file(uri: str) -> Path | None:
    """The database file of a `sqlite:///` tracking URI (relative or absolute), None for any other store."""
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri.removeprefix("sqlite:///").split("?", 1)[0])


def missing_local_store(uri: str) -> str | None:
    """Why a SQLite store that is only to be read holds nothing (its file does not exist), else None: reading one would
    create it, empty, and answer "no such run"."""
    path = sqlite_file(uri)
    if path is not None and not path.is_file():
        return f"no MLflow store at {path}: train or run a sweep first, or pass --runs-dir or --tracking-uri"
    return None


def client(uri: str) -> MlflowClient:
    from mlflow.tracking import MlflowClient

    return MlflowClient(uri)


def prepare_store(uri: str) -> None:
    """Create (and migrate) the tracking store once, before several workers open it: concurrent first opens of one
    SQLite file race in MLflow's schema migrations."""
    client(uri).search_experiments(max_results=1)


class RunStore:
    """One MLflow tracking store seen as gatelab's runs: find them, read them back, log a report beside them."""

    def __init__(self, uri: str, runs_dir: Path = Path("runs")) -> None:
        self.uri, self.runs_dir = uri, runs_dir
        self.client = client(uri)

    def experiment_id(self, name: str) -> str:
        """The experiment of this name, created (with its artifacts under runs_dir for a local store) if missing."""
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        artifacts = None
        if not self.uri.startswith(("http://", "https://")):  # a server chooses its own artifact store
            artifacts = (self.runs_dir / "mlartifacts").resolve().as_uri()
        return self.client.create_experiment(name, artifact_location=artifacts)

    def find_run(self, experiment_name: str, spec_hash: str) -> str | None:
        """The newest MLflow run of this spec hash, so a resumed run continues the same MLflow run."""
        runs = self.client.search_runs([self.experiment_id(experiment_name)],
                                       filter_string=f"tags.`{SPEC_HASH_TAG}` = '{spec_hash}'",
                                       order_by=["attributes.start_time DESC"], max_results=1)
        return runs[0].info.run_id if runs else None

    def sweep_runs(self, experiment_name: str) -> pd.DataFrame:
        """Every gatelab run of an experiment, newest first, as `mlflow.search_runs` lays it out: run_id, status,
        start_time, end_time (UTC timestamps), one `metrics.<name>` column per metric and one `tags.<name>` per tag.
        Empty where the experiment does not exist yet. Read through this store's client, never MLflow's global URI."""
        import pandas as pd

        experiment = self.client.get_experiment_by_name(experiment_name)
        rows: list[dict[str, Any]] = []
        if experiment is not None:
            token = None
            while True:
                page = self.client.search_runs([experiment.experiment_id],
                                               filter_string=f"tags.`{SPEC_HASH_TAG}` != ''",
                                               order_by=["attributes.start_time DESC"], page_token=token)
                rows += [_run_row(run) for run in page]
                token = page.token
                if not token:
                    break
        frame = pd.DataFrame(rows)
        for column in ("start_time", "end_time"):
            if column in frame:
                frame[column] = pd.to_datetime(frame[column], unit="ms", utc=True)
        return frame

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
            local = download_artifacts(run_id=run_id, artifact_path=path, tracking_uri=self.uri)
        except Exception:  # MLflow raises many kinds for a missing file or an unreachable artifact store
            return None
        return Path(local).read_text()

    def artifact_json(self, run_id: str, path: str) -> Any | None:
        """A JSON artifact of a run, parsed; None where the artifact store cannot give it."""
        import json

        text = self.artifact_text(run_id, path)
        return None if text is None else json.loads(text)

    def artifact_location(self, run_id: str) -> str:
        """Where the run's experiment keeps artifacts ('' where the store does not say)."""
        experiment = self.client.get_run(run_id).info.experiment_id
        return self.client.get_experiment(experiment).artifact_location or ""

    def finished_run_metrics(self, prefixes: tuple[str, ...]) -> list[dict[str, float]]:
        """For every run of every experiment that gatelab recorded as finished, its metrics whose names start with one
        of `prefixes`."""
        experiments = [e.experiment_id for e in self.client.search_experiments()]
        runs = self.client.search_runs(experiments, f"tags.`{STATUS_TAG}` = 'finished'")
        return [{k: v for k, v in run.data.metrics.items() if k.startswith(prefixes)} for run in runs]

    def run_tags(self, run_id: str) -> dict[str, str]:
        """The run's tags; a run id the store does not have is one error naming it."""
        from mlflow.exceptions import MlflowException

        try:
            return dict(self.client.get_run(run_id).data.tags)
        except MlflowException:
            raise GatelabError(f"no MLflow run '{run_id}' in {redact(self.uri)}: check the id (the MLflow UI, or "
                               "`gatelab sweep status`), or pass --tracking-uri for another store") from None

    def log_scores(self, run_id: str, metrics: dict[str, float], tags: dict[str, str], paths: Iterable[Path],
                   folder: str) -> None:
        """Scores of an ended run (benchmarks scored after training): metrics, the files as artifacts under `folder`,
        then `tags`, last, so a tag is never there without what it vouches for."""
        from mlflow.entities import Metric, RunTag

        now = int(time.time() * 1000)
        self.client.log_batch(run_id, metrics=[Metric(k, v, now, 0) for k, v in metrics.items()])
        for path in paths:
            self.client.log_artifact(run_id, str(path), folder)
        self.client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])

    def log_report(self, experiment_name: str, paths: Iterable[Path]) -> str:
        """The files of a report as artifacts of one sweep-level run (tagged REPORT_TAG, kept out of the training
        runs' tables), so the report opens from the MLflow UI too. Returns that run's id."""
        experiment = self.experiment_id(experiment_name)
        found = self.client.search_runs([experiment], filter_string=f"tags.`{REPORT_TAG}` = 'true'", max_results=1)
        run_id = found[0].info.run_id if found else self.client.create_run(
            experiment, tags={REPORT_TAG: "true", RUN_NAME_TAG: f"{experiment_name} report"}).info.run_id
        for path in paths:
            self.client.log_artifact(run_id, str(path), "report")
        self.client.set_terminated(run_id, "FINISHED")
        return run_id


def lightning_logger(experiment_name: str, uri: str, run_id: str | None = None, tags: dict[str, str] | None = None,
                     run_name: str | None = None) -> MLFlowLogger:
    """Lightning's MLflow logger: a new run of the experiment (tagged `tags`), or the existing run `run_id`."""
    from lightning.pytorch.loggers import MLFlowLogger

    return MLFlowLogger(experiment_name=experiment_name, tracking_uri=uri, run_id=run_id, tags=tags, run_name=run_name)


class TrackedRun:
    """The MLflow run of one gatelab run (one spec hash), from finding it again to its last tag; the training process
    opens it on rank 0 only.

    An ended run (finished or diverged) is a result, never trained twice. A run resumed from its checkpoint logs into
    the same MLflow run. One that must start again from step 0 (its checkpoint is lost, or it started on another
    machine) gets a new MLflow run, and the old one, if it was cut off RUNNING, is closed as KILLED.
    """

    def __init__(self, uri: str, runs_dir: Path, experiment_name: str, spec_hash: str) -> None:
        self.store = RunStore(uri, runs_dir)
        self.experiment_name, self.spec_hash = experiment_name, spec_hash
        self.run_id = self.store.find_run(experiment_name, spec_hash)
        self.logger: MLFlowLogger | None = None

    @property
    def client(self) -> MlflowClient:
        return self.store.client

    def recorded_outcome(self) -> tuple[str, dict[str, float]] | None:
        """(status, metrics) if MLflow records the run as ended, finished or diverged; None if it has to be trained."""
        if self.run_id is None:
            return None
        recorded = self.client.get_run(self.run_id)
        outcome = recorded.data.tags.get(STATUS_TAG)
        if recorded.info.status != "FINISHED" or outcome not in ("finished", "diverged"):
            return None
        return outcome, dict(recorded.data.metrics)

    def open(self, resuming: bool, tags: dict[str, str], run_name: str) -> MLFlowLogger:
        """The Lightning logger of the run: the found run when `resuming`, else a new one tagged with the spec hash,
        status `running`, the code and package versions, and `tags`."""
        if self.run_id is not None and not resuming:
            # Cut off before its outcome was tagged: still RUNNING if training was cut, already FINISHED if the cut
            # came after Lightning's own end-of-fit finalize, during evaluation. Either way it is no result.
            cut_off = self.client.get_run(self.run_id)
            status, outcome = cut_off.info.status, cut_off.data.tags.get(STATUS_TAG)
            if status == "RUNNING" or (status == "FINISHED" and outcome == "running"):
                self.client.set_tag(self.run_id, STATUS_TAG, "superseded")
                self.client.set_terminated(self.run_id, "KILLED")
            self.run_id = None
        tags = {SPEC_HASH_TAG: self.spec_hash, STATUS_TAG: "running", **code_version(), **package_versions(), **tags}
        self.logger = lightning_logger(self.experiment_name, self.store.uri, self.run_id, tags, run_name)
        self.run_id = self.logger.run_id
        return self.logger

    def log_start(self, params: dict[str, Any], texts: dict[str, str]) -> None:
        """What a fresh start records once: the parameters (each cut to MLflow's 500 characters) and text artifacts by
        artifact path."""
        self.logger.log_hyperparams({k: str(v)[:500] for k, v in params.items()})
        for path, text in texts.items():
            self.client.log_text(self.run_id, text, path)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        for name, value in metrics.items():
            self.client.log_metric(self.run_id, name, value, step=step)

    def log_series(self, name: str, steps: list[int], values: list[float]) -> None:
        """One metric at several steps (each spike of a run as `train/spike`, at its step)."""
        for step, value in zip(steps, values):
            self.client.log_metric(self.run_id, name, value, step=step)

    def log_artifacts(self, writers: dict[str, Any], folder: str) -> None:
        """Each `writers[name](path)` writes a file, logged as artifact `folder/name`."""
        import tempfile

        with tempfile.TemporaryDirectory() as local:
            for name, write in writers.items():
                path = Path(local) / name
                write(path)
                self.client.log_artifact(self.run_id, str(path), folder)

    def metric_history(self, name: str) -> tuple[list[int], list[float]]:
        return self.store.metric_history(self.run_id, name)

    def set_tags(self, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in tags.items()])

    def end(self, status: str) -> None:
        """Tag the outcome (finished / diverged / pruned) and close the run as FINISHED."""
        self.client.set_tag(self.run_id, STATUS_TAG, status)
        self.logger.finalize("success")


def _run_row(run) -> dict[str, Any]:
    row: dict[str, Any] = {"run_id": run.info.run_id, "status": run.info.status,
                           "start_time": run.info.start_time, "end_time": run.info.end_time}
    row.update({f"metrics.{k}": v for k, v in run.data.metrics.items()})
    row.update({f"tags.{k}": v for k, v in run.data.tags.items()})
    return row


def code_version() -> dict[str, str]:
    """The git commit and dirty flag of the gatelab checkout, when there is one."""
    root = repo_root()
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return {"gatelab.git_commit": "unknown", "gatelab.git_dirty": "unknown"}
    if commit.returncode:
        return {"gatelab.git_commit": "unknown", "gatelab.git_dirty": "unknown"}
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

