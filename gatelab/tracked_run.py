"""One gatelab run's MLflow run (`TrackedRun`): found again by its spec hash, opened, fed metrics through a queue,
tagged with its outcome and closed, also when the process is on its way out."""

from __future__ import annotations

import contextlib
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gatelab.errors import GatelabError, first_line, naming_full_disk, redact
from gatelab.store_checks import SERVER_SCHEMES, check_store, describe_store_failure
from gatelab.tracking import (
    SPEC_HASH_TAG,
    STATUS_TAG,
    SUPERSEDED,
    RunStore,
    artifact_root,
    code_version,
    lightning_logger,
    package_versions,
    reports_store_errors,
)

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

    from gatelab.metric_outbox import MetricOutbox, QueuedMLFlowLogger

CLOSE_TIMEOUT_S = 15.0  # close_interrupted / close_failed give up after this: the process is on its way out


def always_allowed() -> bool:
    return True


class TrackedRun:
    """The MLflow run of one gatelab run (one spec hash), from finding it again to its last tag; the training process
    opens it on rank 0 only.

    An ended run (finished or diverged) is a result, never trained twice. A run resumed from its checkpoint logs into
    the same MLflow run. One that must start again from step 0 (its checkpoint is lost, or it started on another
    machine) gets a new MLflow run, and the old one, if it was cut off RUNNING, is closed as KILLED.

    Metrics are queued and sent by a thread; `flush` waits for them, and keeps them in `unsent_path` if the store does
    not take them (the next `open` sends them). Once `writes_allowed()` is False (set it to the run's ownership check;
    the sending thread calls it too), nothing more is written to the run.
    """

    def __init__(self, uri: str, runs_dir: Path, experiment_name: str, spec_hash: str,
                 unsent_path: Path | None = None) -> None:
        check_store(uri)
        self.store = RunStore(uri, runs_dir)
        self.experiment_name, self.spec_hash, self.unsent_path = experiment_name, spec_hash, unsent_path
        self.writes_allowed: Callable[[], bool] = always_allowed
        self.run_id = self.store.find_run(experiment_name, spec_hash)
        self.logger: QueuedMLFlowLogger | None = None

    @property
    def client(self) -> MlflowClient:
        return self.store.client

    @property
    def uri(self) -> str:
        return self.store.uri

    @reports_store_errors
    def recorded_outcome(self) -> tuple[str, dict[str, float]] | None:
        """(status, metrics) if MLflow records the run as ended, finished or diverged; None if it has to be trained."""
        if self.run_id is None:
            return None
        recorded = self.client.get_run(self.run_id)
        outcome = recorded.data.tags.get(STATUS_TAG)
        if recorded.info.status != "FINISHED" or outcome not in ("finished", "diverged"):
            return None
        return outcome, dict(recorded.data.metrics)

    @reports_store_errors
    def open(self, resuming: bool, tags: dict[str, str], run_name: str) -> QueuedMLFlowLogger:
        """The Lightning logger of the run: the found run when `resuming`, else a new one tagged with the spec hash,
        status `running`, the code and package versions, and `tags`. First sends the points an earlier process kept in
        `unsent_path`."""
        self._send_unsent()
        if self.run_id is not None and not resuming:
            self._supersede()
        elif self.run_id is not None:
            self._reopen()
        tags = {SPEC_HASH_TAG: self.spec_hash, STATUS_TAG: "running", **code_version(), **package_versions(), **tags}
        self.logger = lightning_logger(self.experiment_name, self.uri, self.run_id,
                                       {name: redact(str(value)) for name, value in tags.items()}, run_name)
        self.logger.writes_allowed = lambda: self.writes_allowed()
        self.logger.unsent_path = self.unsent_path
        if resuming:
            self.logger.logged_through = {}
        self.run_id = self.logger.run_id
        return self.logger

    def _send_unsent(self) -> None:
        if self.unsent_path is None or not self.unsent_path.exists():
            return
        from mlflow.exceptions import MlflowException

        from gatelab.metric_outbox import read_unsent, send_now

        try:
            kept = read_unsent(self.unsent_path)
        except (ValueError, KeyError, TypeError) as error:
            raise GatelabError(f"{self.unsent_path} is not a file of unsent metric points ({error}): move it away "
                               "(its points are then not sent) and run the same command again") from error
        for run_id, metrics in kept.items():
            try:
                send_now(self.client, run_id, metrics)
            except MlflowException as error:
                if error.error_code not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                    raise  # the store itself failed: store_errors says so, and the file waits for the next run
                raise GatelabError(f"{redact(self.uri)} refuses the {len(metrics)} metric points kept in "
                                   f"{self.unsent_path} for MLflow run {run_id} ({first_line(error)}): remove the "
                                   "file to drop them, then run the same command again") from error
        self.unsent_path.unlink()

    def _supersede(self) -> None:
        # Cut off before its outcome was tagged: still RUNNING if training was cut, or FINISHED by the end-of-fit
        # finalize of a gatelab before the queued logger, if the cut came during evaluation. Either way it is no result.
        cut_off = self.client.get_run(self.run_id)
        status, outcome = cut_off.info.status, cut_off.data.tags.get(STATUS_TAG)
        if status == "RUNNING" or (status == "FINISHED" and outcome == "running"):
            self.client.set_tag(self.run_id, STATUS_TAG, SUPERSEDED)
            self.client.set_terminated(self.run_id, "KILLED")
        self.run_id = None

    def _reopen(self) -> None:
        """A resumed run shows as training again, however an earlier process closed it (failed, interrupted)."""
        run = self.client.get_run(self.run_id)
        if run.info.status != "RUNNING":
            self.client.update_run(self.run_id, status="RUNNING")
        if run.data.tags.get(STATUS_TAG) != "running":
            self.client.set_tag(self.run_id, STATUS_TAG, "running")

    @reports_store_errors
    def log_start(self, params: dict[str, Any], texts: dict[str, str]) -> None:
        """What a fresh start records once: the parameters (each cut to MLflow's 500 characters) and text artifacts by
        artifact path, passwords redacted (a `tracking.uri` may hold one)."""
        if not self.writes_allowed():
            return
        self.logger.log_hyperparams({k: redact(str(v))[:500] for k, v in params.items()})
        root = artifact_root(self.client.get_run(self.run_id).info.artifact_uri)
        for path, text in texts.items():
            with naming_full_disk(f"{root}{path}"):
                self.client.log_text(self.run_id, redact(text), path)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.log_points((name, value, step) for name, value in metrics.items())

    def log_series(self, name: str, steps: list[int], values: list[float]) -> None:
        """One metric at several steps (each spike of a run as `train/spike`, at its step)."""
        self.log_points((name, value, step) for step, value in zip(steps, values))

    def log_points(self, points: Iterable[tuple[str, float, int]]) -> None:
        """Queue (name, value, step) points behind the training metrics; `flush` waits until they are sent."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.logger.outbox.put(Metric(name, float(value), now, step) for name, value, step in points)

    @reports_store_errors
    def log_artifacts(self, writers: dict[str, Any], folder: str) -> None:
        """Each `writers[name](path)` writes a file, logged as artifact `folder/name`."""
        if not self.writes_allowed():
            return
        root = artifact_root(self.client.get_run(self.run_id).info.artifact_uri)
        with tempfile.TemporaryDirectory() as local:
            for name, write in writers.items():
                path = Path(local) / name
                with naming_full_disk(path):  # the temporary folder's disk (TMPDIR)
                    write(path)
                with naming_full_disk(f"{root}{folder}/{name}"):
                    self.client.log_artifact(self.run_id, str(path), folder)

    def metric_history(self, name: str) -> tuple[list[int], list[float]]:
        """(steps, values) of one metric, every queued point of it sent first."""
        self.flush()
        return self.store.metric_history(self.run_id, name)

    @reports_store_errors
    def set_tags(self, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        if self.writes_allowed():
            self.client.log_batch(self.run_id, tags=[RunTag(k, redact(str(v))) for k, v in tags.items()])

    def flush(self, timeout_s: float = 60) -> None:
        """Send every queued point. Where the store has not taken them within timeout_s, keep them in `unsent_path`
        (the next `open` sends them) and raise GatelabError saying so."""
        outbox = self._outbox()
        if outbox is None or outbox.drain(timeout_s):
            return
        unsent = outbox.give_up()
        if not unsent or outbox.stopped:
            return
        if self.unsent_path is None:
            kept = f"{unsent} metric points were not sent"
        else:
            kept = f"{unsent} metric points wait in {self.unsent_path} and are sent when you run the same command again"
        kind = "server" if urllib.parse.urlparse(self.uri).scheme in SERVER_SCHEMES else "store"
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(outbox.failing_since or time.time()))
        what = describe_store_failure(self.uri, outbox.last_failure) if outbox.last_failure else outbox.last_error
        state = "unreachable" if kind == "server" else "failing"
        raise GatelabError(f"tracking {kind} {redact(self.uri)} {state} since {since} ({what}): "
                           f"training reached step {outbox.last_step} and its checkpoint is kept; {kept}")

    def _outbox(self) -> MetricOutbox | None:
        return self.logger.outbox if self.logger is not None else None

    @reports_store_errors
    def end(self, status: str) -> None:
        """Send every queued point, tag the outcome (finished / diverged / pruned) and close the run as FINISHED."""
        if not self.writes_allowed():
            return
        self.flush()
        self.client.set_tag(self.run_id, STATUS_TAG, status)
        self.client.set_terminated(self.run_id, "FINISHED")

    def close_interrupted(self) -> None:
        """Tag the run interrupted and close it KILLED (Ctrl-C, SIGTERM): best effort, see `_close`."""
        self._close("interrupted", "KILLED")

    def close_failed(self) -> None:
        """Tag the run failed and close it FAILED: best effort, see `_close`."""
        self._close("failed", "FAILED")

    def _close(self, outcome: str, status: str) -> None:
        """Flush, tag and close within CLOSE_TIMEOUT_S, never raising: the process is on its way out over another
        error, which is the one to report. A store that is down leaves the run RUNNING, which the next `open` resumes
        or supersedes, and the queued points in `unsent_path`."""
        if self.run_id is None or not self.writes_allowed():
            return

        def close() -> None:
            try:
                with contextlib.suppress(GatelabError):  # the points then wait in unsent_path
                    self.flush(CLOSE_TIMEOUT_S / 2)
                self.client.set_tag(self.run_id, STATUS_TAG, outcome)
                self.client.set_terminated(self.run_id, status)
            except Exception:  # MLflow, requests, SQLAlchemy, OSError: the store or the disk is down, see above
                pass

        closer = threading.Thread(target=close, name="mlflow-close", daemon=True)
        closer.start()
        closer.join(CLOSE_TIMEOUT_S)
