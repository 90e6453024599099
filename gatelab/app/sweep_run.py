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


def run_sweep(sweep: Path, experiment: Path | None, storage: str | None, tracking_uri: str | None, runs_dir: Path,
              verbose: bool, launch: Launch) -> int:
    """Run the sweep, then print its ledger and what to run next; the exit code (1 where a cell failed, the signal's
    where one stopped it)."""
    quiet_noise(verbose)
    from gatelab.interrupts import Interrupted, raise_on_signals
    from gatelab.sweep.queue import default_storage, failed_cells_line, tracking_stores

    try:
        with raise_on_signals():  # from the start: Ctrl-C during the imports of torch is no traceback either
            plan, specs, storage = _open(sweep, experiment, storage, tracking_uri, runs_dir, launch.workers)
            if not _launch(plan, specs, sweep, experiment, storage, tracking_uri, runs_dir, launch):
                return 0  # Slurm has the workers now: `gatelab sweep status` follows them
    except Interrupted as interrupted:
        return interrupted_exit(interrupted)
    print_status(sweep, experiment, storage, runs_dir, as_json=False)
    from gatelab.progress import closing_lines

    for line in closing_lines(sweep, plan.name, tracking_stores(specs, tracking_uri, runs_dir), runs_dir, experiment,
                              tracking_uri, None if storage == default_storage(runs_dir, plan.name) else storage):
        echo(line)
    return cells_failed_exit(failed_cells_line(sweep, experiment, storage, runs_dir))


def _open(sweep: Path, experiment: Path | None, storage: str | None, tracking_uri: str | None, runs_dir: Path,
          workers: int):
    """The sweep, its runs (every cell validated before any ledger, MLflow or training work) and its ledger; prints
    the runs and their estimated time."""
    from gatelab.sweep.queue import default_storage, shown_storage
    from gatelab.sweep.spec import expand, load_sweep

    plan = load_sweep(sweep, experiment)
    specs = expand(plan)
    storage = storage or default_storage(runs_dir, plan.name)
    echo(f"sweep {plan.name}: {len(specs)} runs; ledger {shown_storage(storage)}")
    from gatelab.sweep.plan import sweep_run_estimate

    for line in sweep_run_estimate(plan, specs, storage, tracking_uri, runs_dir, workers):
        echo(line)
    return plan, specs, storage


def _launch(plan, specs, sweep: Path, experiment: Path | None, storage: str, tracking_uri: str | None, runs_dir: Path,
            launch: Launch) -> bool:
    """Train the sweep's runs; False where the workers were handed to Slurm and this process is done."""
    if plan.search is not None:
        from gatelab.sweep.search import run_search

        run_search(plan, specs, storage=storage, tracking_uri=tracking_uri, runs_dir=runs_dir)
        return True
    if launch.executor == "local" and launch.workers == 1:
        from gatelab.sweep.worker import work

        work(sweep, experiment, storage, tracking_uri, runs_dir, heartbeat_s=launch.heartbeat, grace_s=launch.grace,
             progress=sys.stdout.isatty())
        return True
    from gatelab.sweep.queue import open_ledger
    from gatelab.tracking import default_tracking_uri, prepare_store

    open_ledger(plan, specs, storage, tracking_uri, runs_dir)  # a bad ledger: one message, not N
    worker_uri = tracking_uri or default_tracking_uri(runs_dir)
    prepare_store(worker_uri)
    worker_args = dict(sweep=sweep, experiment=experiment, storage=storage, tracking_uri=worker_uri,
                       runs_dir=runs_dir, heartbeat_s=launch.heartbeat, grace_s=launch.grace)
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
    jobs = submit_workers(launch.workers, cluster, runs_dir / plan.name / "submitit", launch.slurm(),
                          wait=cluster == "local", **worker_args)
    echo(f"submitted workers {', '.join(jobs)}")
    if cluster == "slurm":
        echo(f"follow them with: gatelab sweep status {sweep}")
        return False
    return True
