"""`gatelab train`: one run, trained and evaluated, tracked in MLflow; the same command again resumes it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from typer import echo

from gatelab.app import quiet_noise
from gatelab.errors import redact
from gatelab.interrupts import Interrupted
from gatelab.metrics import KEY_METRICS
from gatelab.store_uris import default_tracking_uri
from gatelab.workspace import Workspace


def checked_config(experiment: Path, *, overrides: list[str]):
    """The run's config and its resolved model, its file, keys and variant checked before Lightning is imported (5 s):
    a typo is answered at once. Shape errors of the variant surface here too, before any data or training work."""
    from gatelab.data.resolve import load_experiment
    from gatelab.model import resolve_model

    config = load_experiment(experiment, overrides)

    return config, resolve_model(config)


def command_overrides(set_: Sequence[str], *, variant: str | None = None, seed: int | None = None) -> list[str]:
    """The overrides `gatelab train` (and `gatelab config show`) resolve the experiment with: --set's, then the keys
    --variant and --seed set."""
    return [*set_, *([f"variant={variant}"] if variant else []), *([f"seed={seed}"] if seed is not None else [])]


def train(experiment: Path, *, variant: str | None, seed: int | None, set_: list[str], workspace: Workspace,
          quiet: bool, verbose: bool) -> int:
    """Train the run and print its outcome; the exit code (that of the signal that interrupted it, else 0)."""
    quiet_noise(verbose)

    config, model_config = checked_config(experiment, overrides=command_overrides(set_, variant=variant, seed=seed))
    from gatelab.config import setting_warnings

    for warning in setting_warnings(config):
        echo(warning, err=True)
    from gatelab.train.ownership import RunInProgress
    from gatelab.train.run import run

    try:
        result = run(config, tracking_uri=workspace.tracking_uri, runs_dir=workspace.runs_dir, quiet=quiet,
                     model_config=model_config)
    except RunInProgress as busy:  # not a failure: the run is being made, by another process
        echo(str(busy))
        return 0
    except Interrupted as interrupted:
        echo(f"interrupted ({interrupted}): the MLflow run is closed as KILLED and its last checkpoint kept; run the "
             "same command again to resume", err=True)
        return interrupted.exit_code
    where = redact(workspace.tracking_uri or config.tracking.uri
                   or default_tracking_uri(workspace.runs_dir, create=False, as_written=True))
    echo(f"{result.status}: MLflow run {result.run_id} in {where}")
    if result.status == "diverged":
        echo(f"diverged at step {result.diverged_step}")
        return 0
    for name in KEY_METRICS:
        if name in result.metrics:
            echo(f"  {name:24s} {result.metrics[name]:.4f}")
    return 0
