"""Where a command's runs live: the runs folder, the MLflow store and the sweep's ledger, as the command line names
them (`--runs-dir`, `--tracking-uri`, `--storage`). Built once in gatelab.cli and handed down by keyword, so that no
function takes the three by position (their order had drifted between callers)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from gatelab.store_uris import default_tracking_uri


@dataclass(frozen=True)
class Workspace:
    runs_dir: Path = Path("runs")  # checkpoints, the default ledger and the default MLflow store
    tracking_uri: str | None = None  # None: the experiment's `tracking.uri`, else the embedded store under runs_dir
    storage: str | None = None  # the sweep's ledger; None: the journal under runs_dir (gatelab.sweep.ledger_storage)

    def store(self, create: bool = True) -> str:
        """The MLflow store a command reads: --tracking-uri, else the embedded one under runs_dir (made only where
        `create`)."""
        return self.tracking_uri or default_tracking_uri(self.runs_dir, create)

    def with_storage(self, storage: str | None) -> Workspace:
        return replace(self, storage=storage)
