"""`gatelab sweep run`: every unfinished run of a sweep, by the executor asked for: this process (one local worker),
local worker processes, an Optuna search, or submitit (a Slurm job array, or its local executor)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from typer import echo

from gatelab.app import quiet_noise
from gatelab.app.sweep import cells_failed_exit, interrupted_exit, print_status
from gatelab.errors import GatelabError
from gatelab.interrupts import Interrupted, raise_on_signals
from gatelab.progress import closing_lines
from gatelab.tracking import prepare_store
from gatelab.workspace import Workspace

EXECUTORS = ("local", "slurm", "submitit-local")


@dataclass(frozen=True)
class Launch:
    """How the sweep's workers are started and what they are told."""

    executor: str = "local"
    workers: int = 1
    heartbeat: float = 10.0  # seconds between a worker's heartbeats
    grace: float = 60.0  # seconds without a heartbeat before a run is taken over
    slurm_partition: str | None = None
    slurm_gpus: int = 1  # per worker
    slurm_time_min: int = 24 * 60  # per worker

    def slurm(self) -> dict:
        return {"partition": self.slurm_partition, "gpus": self.slurm_gpus, "time_min": self.slurm_time_min}


def run_sweep(sweep: Path, *, experiment: Path | None, workspace: Workspace, verbose: bool, launch: Launch) -> int:
    """Run the sweep, then print its ledger and what to run next; the exit code (1 where a cell failed, the signal's
    where one stopped it)."""
    quiet_noise(verbose)
    from gatelab.sweep.ledger_storage import default_storage, tracking_stores
    from gatelab.sweep.next_commands import failed_cells_line

    try:
        with raise_on_signals():  # from the start: Ctrl-C during the imports of torch is no traceback either
            plan, specs, opened = _open(sweep, experiment=experiment, workspace=workspace, workers=launch.workers)
            if not _launch(plan, specs, sweep, experiment=experiment, workspace=opened, launch=launch):
                return 0  # Slurm has the workers now: `gatelab sweep status` follows them
    except Interrupted as interrupted:
        return interrupted_exit(interrupted)
    print_status(sweep, experiment=experiment, workspace=opened, as_json=False)

    runs_dir, tracking_uri, storage = opened.runs_dir, opened.tracking_uri, opened.storage
    stores = tracking_stores(specs, tracking_uri=tracking_uri, runs_dir=runs_dir)
    for line in closing_lines(sweep, sweep_name=plan.name, stores=stores, runs_dir=runs_dir, experiment=experiment,
                              tracking_uri=tracking_uri,
                              storage=None if storage == default_storage(runs_dir, plan.name) else storage):
        echo(line)
    return cells_failed_exit(failed_cells_line(sweep, experiment=experiment, storage=storage, runs_dir=runs_dir))


def _open(sweep: Path, *, experiment: Path | None, workspace: Workspace, workers: int):
    """The sweep, its runs (every cell validated before any ledger, MLflow or training work) and the workspace with
    its ledger named; prints the runs and their estimated time."""
    from gatelab.sweep.ledger_storage import default_storage, shown_storage
    from gatelab.sweep.spec import expand, load_sweep

    plan = load_sweep(sweep, experiment)
    specs = expand(plan)
    workspace = workspace.with_storage(workspace.storage or default_storage(workspace.runs_dir, plan.name))
    echo(f"sweep {plan.name}: {len(specs)} runs; ledger {shown_storage(workspace.storage)}")
    from gatelab.sweep.plan_render import sweep_run_estimate

    for line in sweep_run_estimate(plan, specs, storage=workspace.storage, tracking_uri=workspace.tracking_uri,
                                   runs_dir=workspace.runs_dir, workers=workers):
        echo(line)
    return plan, specs, workspace


def _launch(plan, specs, sweep: Path, *, experiment: Path | None, workspace: Workspace, launch: Launch) -> bool:
    """Train the sweep's runs (the workspace names their ledger); False where the workers were handed to Slurm and
    this process is done."""
    if plan.search is not None:
        from gatelab.sweep.search import run_search

        run_search(plan, specs, workspace=workspace)
        return True
    if launch.executor == "local" and launch.workers == 1:
        from gatelab.sweep.worker import work

        work(sweep, experiment=experiment, workspace=workspace, heartbeat_s=launch.heartbeat, grace_s=launch.grace,
             progress=sys.stdout.isatty())
        return True
    from gatelab.sweep.queue import open_ledger

    runs_dir = workspace.runs_dir
    # a bad ledger: one message, not N
    open_ledger(plan, specs, storage=workspace.storage, tracking_uri=workspace.tracking_uri, runs_dir=runs_dir)
    workers_workspace = Workspace(runs_dir=runs_dir, tracking_uri=workspace.store(), storage=workspace.storage)
    prepare_store(workers_workspace.tracking_uri)
    worker_args = dict(sweep=sweep, experiment=experiment, workspace=workers_workspace, heartbeat_s=launch.heartbeat,
                       grace_s=launch.grace)
    if launch.executor == "local":
        from gatelab.sweep.executor import run_local_workers
        from gatelab.sweep.queue import CELLS_FAILED

        code = run_local_workers(launch.workers, **worker_args)
        if code > CELLS_FAILED:
            raise GatelabError(f"a worker exited with code {code}; its message is above")
        return True
    if launch.executor not in EXECUTORS:
        raise GatelabError(f"--executor {launch.executor!r}: valid executors are local, slurm, submitit-local")
    from gatelab.sweep.executor import submit_workers

    cluster = "slurm" if launch.executor == "slurm" else "local"
    jobs = submit_workers(launch.workers, cluster=cluster, folder=runs_dir / plan.name / "submitit",
                          slurm=launch.slurm(), wait=cluster == "local", **worker_args)
    echo(f"submitted workers {', '.join(jobs)}")
    if cluster == "slurm":
        echo(f"follow them with: gatelab sweep status {sweep}")
        return False
    return True
