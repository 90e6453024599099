"""Everything that talks to MLflow. Embedded default: a SQLite store and an artifact folder under `runs/`.

MLflow 3 refuses the old `./mlruns` file store, so the default is `sqlite:///runs/mlflow.db`. A `--tracking-uri
http://host:port` to a real `mlflow server` works the same. Optuna keeps its own files: the two clash on one SQLite file.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
from pathlib import Path

import mlflow
from mlflow.tracking import MlflowClient

SPEC_HASH_TAG = "gatelab.spec_hash"
STATUS_TAG = "gatelab.status"  # running / finished / diverged / failed


def default_tracking_uri(runs_dir: Path) -> str:
    """SQLite under runs/, waiting up to a minute for a lock: several local workers write to it at once."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(runs_dir / 'mlflow.db').resolve()}?timeout=60"


def prepare_store(uri: str) -> None:
    """Create (and migrate) the tracking store once, before several workers open it: concurrent first opens of one
    SQLite file race in MLflow's schema migrations."""
    MlflowClient(uri).search_experiments(max_results=1)


def redact(uri: str) -> str:
    """A URI with any password replaced, for logs and tags."""
    return re.sub(r"(//[^:/@]+:)[^@]+@", r"\1***@", uri)


def experiment_id(client: MlflowClient, name: str, runs_dir: Path) -> str:
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    artifacts = None
    if not client.tracking_uri.startswith(("http://", "https://")):  # a server chooses its own artifact store
        artifacts = (runs_dir / "mlartifacts").resolve().as_uri()
    return client.create_experiment(name, artifact_location=artifacts)


def find_run(client: MlflowClient, experiment: str, spec_hash: str) -> str | None:
    """The newest MLflow run of this spec hash, so a resumed run continues the same MLflow run."""
    runs = client.search_runs([experiment], filter_string=f"tags.`{SPEC_HASH_TAG}` = '{spec_hash}'",
                              order_by=["attributes.start_time DESC"], max_results=1)
    return runs[0].info.run_id if runs else None


def code_version() -> dict[str, str]:
    """The git commit and dirty flag of the gatelab checkout, when there is one."""
    root = Path(__file__).resolve().parents[1]
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


__all__ = ["MlflowClient", "mlflow", "default_tracking_uri", "prepare_store", "redact", "experiment_id", "find_run", "code_version",
           "package_versions", "SPEC_HASH_TAG", "STATUS_TAG"]
