"""Metrics on their way to an MLflow run, sent by a background thread so that a slow or unreachable tracking store
never holds up training; and the Lightning logger that feeds them.

A batch the store does not take stays at the head of the queue and is tried again every RETRY_EVERY_S seconds, so
nothing is dropped and the order is kept. Sending a batch again after a lost answer stores nothing twice: MLflow's SQL
stores key a metric point by (run, key, timestamp, step, value) and skip a repeat, and a point's timestamp is fixed
when it is queued.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from lightning.fabric.utilities.logger import _add_prefix
from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from gatelab.errors import first_line

SEND_BATCH = 1000  # the most metrics MLflow's log_batch takes in one call
RETRY_EVERY_S = 2.0
IDLE_S = 5.0  # how long the sending thread waits for more metrics before it ends (the next metric starts another)


def always_allowed() -> bool:
    return True


class MetricOutbox:
    """The queue of one MLflow run's metric points, in logging order, and the thread that empties it.

    `writes_allowed` is asked before each send (from the sending thread): once it says False, everything queued is
    dropped and nothing more is sent, so a process whose run was taken over never writes to it again.

    `unsent_path` keeps on disk what the store has not taken: the points queued at each checkpoint (`save_queued`), so a
    process killed during an outage loses none logged before its checkpoint, and all of them when the outbox gives up.
    Once everything is sent, a file that held only points sent since is removed.
    """

    def __init__(self, client: MlflowClient, run_id: str, writes_allowed: Callable[[], bool] = always_allowed,
                 unsent_path: Path | None = None) -> None:
        self.client, self.run_id, self.writes_allowed, self.unsent_path = client, run_id, writes_allowed, unsent_path
        self.failing_since: float | None = None  # wall time of the first failed send since the last good one
        self.last_error = ""
        self.last_failure: BaseException | None = None  # the error itself, for gatelab.tracking to say in plain words
        self.last_step = 0
        self._queued: list[Metric] = []
        self._taken = 0  # bumped by give_up and stop, so a send under way then removes nothing it did not send
        self._on_disk = 0  # how many points at the head of the queue unsent_path holds already
        self._saved = False  # unsent_path holds points of this outbox ...
        self._saved_unsent = False  # ... some of which it never sent
        self._stopped = False
        self._sender: threading.Thread | None = None
        self._changed = threading.Condition()
        self._retry_now = threading.Event()

    def put(self, metrics: Iterable[Metric]) -> None:
        """Queue the points and return at once."""
        metrics = list(metrics)
        with self._changed:
            if self._stopped or not metrics:
                return
            self._queued += metrics
            self.last_step = max(self.last_step, *(metric.step for metric in metrics))
            if self._sender is None:
                self._sender = threading.Thread(target=self._send_while_queued, name="mlflow-metrics", daemon=True)
                self._sender.start()
            self._changed.notify_all()

    def drain(self, timeout_s: float) -> bool:
        """Wait until the store has taken every queued point; False if it has not within timeout_s."""
        deadline = time.monotonic() + timeout_s
        self._retry_now.set()
        with self._changed:
            while self._queued:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._changed.wait(remaining)
            if self._saved and not self._saved_unsent and not self._stopped:
                self.unsent_path.unlink(missing_ok=True)
                self._saved = False
        return True

    def save_queued(self) -> None:
        """Add the queued points that unsent_path lacks to it. One sent later is sent again from the file by the next
        process, and stored once (see the module's docstring)."""
        with self._changed:
            fresh = self._queued[self._on_disk:]
            if self.unsent_path is None or self._stopped or not fresh:
                return
            keep_unsent(self.unsent_path, self.run_id, fresh)
            self._on_disk, self._saved = len(self._queued), True

    def give_up(self) -> int:
        """Stop trying to send what is queued: keep it in unsent_path (where there is one) and empty the queue.
        Returns how many points that was."""
        with self._changed:
            count = len(self._queued)
            self.save_queued()
            self._saved_unsent = self._saved
            self._queued, self._on_disk = [], 0
            self._taken += 1
            return count

    def stop(self) -> None:
        """Drop what is queued and send nothing more."""
        with self._changed:
            self._stopped = True
            self._queued, self._on_disk = [], 0
            self._taken += 1
            self._changed.notify_all()

    @property
    def stopped(self) -> bool:
        return self._stopped

    def _send_while_queued(self) -> None:
        while True:
            with self._changed:
                if not self._queued:
                    self._changed.wait(IDLE_S)
                if not self._queued:
                    self._sender = None
                    return
                batch, taken = self._queued[:SEND_BATCH], self._taken
            try:
                allowed = self.writes_allowed()
            except Exception as error:  # an ownership check that cannot answer now is asked again before the next try
                self._failed(error)
                continue
            if not allowed:
                self.stop()
                continue
            try:
                self.client.log_batch(self.run_id, metrics=batch)
            except Exception as error:  # MLflow, requests and SQLAlchemy each raise their own kinds
                self._failed(error)
                continue
            with self._changed:
                if taken == self._taken:
                    del self._queued[:len(batch)]
                    self._on_disk = max(0, self._on_disk - len(batch))
                self.failing_since = None
                self._changed.notify_all()

    def _failed(self, error: Exception) -> None:
        with self._changed:
            self.failing_since = self.failing_since or time.time()
            self.last_error = first_line(error)
            self.last_failure = error
            self._changed.notify_all()
        self._retry_now.wait(RETRY_EVERY_S)
        self._retry_now.clear()


class QueuedMLFlowLogger(MLFlowLogger):
    """Differences from MLFlowLogger: `log_metrics` only queues the metrics (its `outbox` sends them, and keeps what
    it has not sent in `unsent_path` at each checkpoint); nothing is written once `writes_allowed()` is False; and
    `finalize` leaves the run's status alone, because the run ends after gatelab's evaluation (TrackedRun.end,
    close_interrupted, close_failed), not when Lightning's `fit` returns or fails."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.writes_allowed: Callable[[], bool] = always_allowed
        self.unsent_path: Path | None = None
        # A resumed run re-trains the steps between its last checkpoint and the cut; the points the cut-off process
        # logged for them are kept and not logged twice. None: a fresh run, nothing to skip.
        self.logged_through: dict[str, int] | None = None
        # Lightning saves a step's checkpoint before it logs that step's metrics: those points are kept on disk at
        # once, as the resumed run does not train that step again.
        self._keep_next_put = False
        self._outbox: MetricOutbox | None = None

    @property
    def outbox(self) -> MetricOutbox:
        if self._outbox is None:
            self._outbox = MetricOutbox(self.experiment, self.run_id, lambda: self.writes_allowed(), self.unsent_path)
        return self._outbox

    def after_save_checkpoint(self, checkpoint_callback) -> None:
        super().after_save_checkpoint(checkpoint_callback)
        self.outbox.save_queued()
        self._keep_next_put = True

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        timestamp_ms = int(time.time() * 1000)
        self.outbox.put(Metric(_metric_name(name), float(value), timestamp_ms, step or 0)
                        for name, value in _add_prefix(metrics, self._prefix, self.LOGGER_JOIN_CHAR).items()
                        if not isinstance(value, str) and (step or 0) > self._last_logged_step(_metric_name(name)))
        if self._keep_next_put:
            self._keep_next_put = False
            self.outbox.save_queued()

    def _last_logged_step(self, name: str) -> int:
        """The last step the run already has a point of `name` at (-1: none, or a fresh run), read once a name."""
        if self.logged_through is None:
            return -1
        if name not in self.logged_through:
            try:
                self.logged_through[name] = max((m.step for m in self.experiment.get_metric_history(self.run_id, name)),
                                                default=-1)
            except Exception:  # the store is unreachable: log the point (a repeat beats a gap)
                return -1
        return self.logged_through[name]

    @rank_zero_only
    def log_hyperparams(self, params) -> None:
        if self.writes_allowed():
            super().log_hyperparams(params)

    @rank_zero_only
    def finalize(self, status: str = "success") -> None:
        pass


def _metric_name(name: str) -> str:
    """The name as MLFlowLogger sends it: MLflow allows only these special characters."""
    return re.sub("[^a-zA-Z0-9_/. -]+", "", name)


# --- points kept on disk while the store is unreachable -------------------------------------------------------------


def keep_unsent(path: Path, run_id: str, metrics: list[Metric]) -> None:
    """Append the points to `path` (JSON lines, one per point, each naming its run), atomically: a crash leaves the
    old file or the new one, never half a line."""
    lines = "".join(json.dumps({"run_id": run_id, "key": m.key, "value": m.value, "timestamp": m.timestamp,
                                "step": m.step}) + "\n" for m in metrics)
    before = path.read_text() if path.exists() else ""
    staged = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(staged, "w") as file:
        file.write(before + lines)
        file.flush()
        os.fsync(file.fileno())
    os.replace(staged, path)


def read_unsent(path: Path) -> dict[str, list[Metric]]:
    """The points kept in `path`, by run, in the order they were logged; ValueError for a line that is not one."""
    by_run: dict[str, list[Metric]] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            point = json.loads(line)
            by_run.setdefault(point["run_id"], []).append(
                Metric(point["key"], float(point["value"]), int(point["timestamp"]), int(point["step"])))
    return by_run


def send_now(client: MlflowClient, run_id: str, metrics: list[Metric]) -> None:
    for start in range(0, len(metrics), SEND_BATCH):
        client.log_batch(run_id, metrics=metrics[start:start + SEND_BATCH])
