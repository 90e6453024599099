"""`gatelab sweep run`: every unfinished run of a sweep, by the executor asked for: this process (one local worker),
local worker processes, an Optuna search, or submitit (a Slurm job array, or its local executor)."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError
from typer import echo

from gatelab.app import quiet_noise
from gatelab.app.sweep import cells_failed_exit, interrupted_exit, print_status
from gatelab.config import format_validation_error
from gatelab.errors import GatelabError
from gatelab.interrupts import Interrupted, raise_on_signals
from gatelab.progress import closing_lines
from gatelab.sweep.sweep_file import SlurmSettings
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
    # the command line's --slurm-* options as given (`over_slurm_keys`' arguments), over the sweep file's `slurm` keys
    slurm: dict = field(default_factory=dict)
    wait: bool = True  # a Slurm launch waits for its tasks, topping them up; else it submits and returns
    timeout: float | None = None  # seconds after which no run starts (Optuna's timeout); runs under way finish

    def slurm_settings(self, sweep_file) -> SlurmSettings:
        """The sweep file's `slurm` keys with the command line's over them, checked as one."""
        given = sweep_file.slurm.model_dump() if sweep_file.slurm is not None else {}
        try:
            return SlurmSettings.model_validate(over_slurm_keys(given, **self.slurm) if self.slurm else given)
        except ValidationError as error:
            raise GatelabError(format_validation_error(error, "the sweep's slurm keys and the --slurm-* options",
                                                       SlurmSettings)) from None


def over_slurm_keys(given: dict, *, partition: str | None, gpus: int | None, time_min: int | None,
                    sbatch: list[str], setup: list[str]) -> dict:
    """The sweep file's `slurm` keys with the command line's --slurm-* options over them: an option given replaces
    its key, --slurm-sbatch adds to (or replaces one of) the file's sbatch options, --slurm-setup lines run after the
    file's."""
    scalars = {"partition": partition, "gpus_per_worker": gpus, "time_min": time_min}
    pairs = {}
    for option in sbatch:
        name, equals, value = option.partition("=")
        if not equals or not name.strip().lstrip("-"):
            raise GatelabError(f"--slurm-sbatch {option!r}: write NAME=VALUE, e.g. --slurm-sbatch account=lab")
        pairs[name.strip().lstrip("-")] = value
    return {**given, **{key: value for key, value in scalars.items() if value is not None},
            "sbatch": {**given.get("sbatch", {}), **pairs}, "setup": [*given.get("setup", []), *setup]}


def run_sweep(sweep: Path, *, experiment: Path | None, workspace: Workspace, verbose: bool, launch: Launch) -> int:
    """Run the sweep, then print its ledger and what to run next; the exit code (1 where a cell failed, the signal's
    where one stopped it)."""
    quiet_noise(verbose)
    from gatelab.sweep.ledger_storage import default_storage, tracking_stores
    from gatelab.sweep.next_commands import failed_cells_line

    claim_until = None if launch.timeout is None else time.time() + launch.timeout
    if launch.timeout is not None and launch.executor == "slurm":
        raise GatelabError("--timeout is for local workers (--executor local or submitit-local): on Slurm, each "
                           "task's time is slurm.time_min (--slurm-time-min), and a task past it is requeued")
    try:
        with raise_on_signals():  # from the start: Ctrl-C during the imports of torch is no traceback either
            plan, specs, opened = _open(sweep, experiment=experiment, workspace=workspace, workers=launch.workers)
            if not _launch(plan, specs, sweep, experiment=experiment, workspace=opened, launch=launch,
                           claim_until=claim_until):
                return 0  # Slurm has the workers now: `gatelab sweep status` follows them
    except Interrupted as interrupted:
        return interrupted_exit(interrupted)
    print_status(sweep, experiment=experiment, workspace=opened, as_json=False)
    runs_dir, tracking_uri, storage = opened.runs_dir, opened.tracking_uri, opened.storage
    if launch.timeout is not None:
        _say_what_the_timeout_left(specs, plan.name, opened)

    stores = tracking_stores(specs, tracking_uri=tracking_uri, runs_dir=runs_dir)
    for line in closing_lines(sweep, sweep_name=plan.name, stores=stores, runs_dir=runs_dir, experiment=experiment,
                              tracking_uri=tracking_uri,
                              storage=None if storage == default_storage(runs_dir, plan.name) else storage):
        echo(line)
    return cells_failed_exit(failed_cells_line(sweep, experiment=experiment, storage=storage, runs_dir=runs_dir))


def _say_what_the_timeout_left(specs, sweep_name: str, workspace: Workspace) -> None:
    """After a launch with --timeout: how many runs it left waiting, and the command that goes on with them."""
    from gatelab.sweep.next_commands import user_command
    from gatelab.sweep.queue import ledger_states, waiting

    left = waiting(ledger_states(workspace.storage, runs_dir=workspace.runs_dir, sweep_name=sweep_name, specs=specs))
    if left:
        echo(f"--timeout: {left} run{'s' * (left != 1)} left waiting; go on with: {user_command()}")


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


def _launch(plan, specs, sweep: Path, *, experiment: Path | None, workspace: Workspace, launch: Launch,
            claim_until: float | None = None) -> bool:
    """Train the sweep's runs (the workspace names their ledger), none started after `claim_until`; False where the
    workers were handed to Slurm and this process is done."""
    if plan.search is not None:
        from gatelab.sweep.search import run_search

        run_search(plan, specs, workspace=workspace, claim_until=claim_until)
        return True
    if launch.executor == "local" and launch.workers == 1:
        from gatelab.sweep.worker import work

        work(sweep, experiment=experiment, workspace=workspace, heartbeat_s=launch.heartbeat, grace_s=launch.grace,
             progress=sys.stdout.isatty(), claim_until=claim_until)
        return True
    from gatelab.sweep.queue import open_ledger

    runs_dir = workspace.runs_dir
    # a bad ledger: one message, not N
    open_ledger(plan, specs, storage=workspace.storage, tracking_uri=workspace.tracking_uri, runs_dir=runs_dir)
    workers_workspace = Workspace(runs_dir=runs_dir, tracking_uri=workspace.store(), storage=workspace.storage)
    prepare_store(workers_workspace.tracking_uri)
    worker_args = dict(sweep=sweep, experiment=experiment, workspace=workers_workspace, heartbeat_s=launch.heartbeat,
                       grace_s=launch.grace, claim_until=claim_until)
    if launch.executor == "local":
        from gatelab.sweep.executor import run_local_workers
        from gatelab.sweep.queue import CELLS_FAILED

        code = run_local_workers(launch.workers, **worker_args)
        if code > CELLS_FAILED:
            raise GatelabError(f"a worker exited with code {code}; its message is above")
        return True
    if launch.executor not in EXECUTORS:
        raise GatelabError(f"--executor {launch.executor!r}: valid executors are local, slurm, submitit-local")
    if launch.executor == "slurm":
        return _launch_on_slurm(plan, specs, workspace=workers_workspace, launch=launch, worker_args=worker_args)
    from gatelab.sweep.executor import submit_workers

    jobs = submit_workers(launch.workers, folder=runs_dir / plan.name / "submitit", **worker_args)
    echo(f"submitted workers {', '.join(jobs)}")
    return True


def _one_shape(specs) -> tuple[int, int]:
    """The devices and nodes every run of the sweep trains on: an array asks Slurm for one shape of task."""
    shapes = {(spec.experiment.train.devices, spec.experiment.train.num_nodes) for spec in specs}
    if len(shapes) > 1 or any(devices == "auto" for devices, _ in shapes):
        shown = ", ".join(f"train.devices={d} train.num_nodes={n}" for d, n in sorted(shapes, key=str))
        raise GatelabError(f"--executor slurm: the sweep's runs ask for {shown}; a Slurm array starts every worker "
                           "with one number of tasks (one per device), so give every run one whole number of "
                           "train.devices and train.num_nodes, or split the sweep")
    return shapes.pop()


def _launch_on_slurm(plan, specs, *, workspace: Workspace, launch: Launch, worker_args: dict) -> bool:
    """Keep `--workers` Slurm tasks alive while cells are left (see gatelab.sweep.slurm); False where it only
    submitted them (--no-wait)."""
    from gatelab.sweep.executor import launcher_env, worker_command
    from gatelab.sweep.queue import ledger_states
    from gatelab.sweep.slurm import SlurmArray, keep_workers

    settings = launch.slurm_settings(plan.file)
    devices, nodes = _one_shape(specs)
    array = SlurmArray(folder=(workspace.runs_dir / plan.name / "submitit").resolve(), settings=settings,
                       name=f"gatelab-{plan.name}", devices=devices, nodes=nodes)

    def cells_left() -> int:
        states = ledger_states(workspace.storage, runs_dir=workspace.runs_dir, sweep_name=plan.name, specs=specs)
        return sum(state.status in ("pending", "running", "not enqueued") for state in states)

    array.check_reachable()
    command = worker_command(threads=settings.cpus_per_worker, **worker_args)
    try:
        keep_workers(array, workers=launch.workers, cells_left=cells_left, command=command,
                     env=launcher_env(says_resume=launch.wait), say=echo, poll_s=max(launch.heartbeat, 1.0),
                     wait=launch.wait)
    except Interrupted as interrupted:
        jobs = array.job_ids()
        live = array.live_tasks()
        echo(f"stopped waiting; the sweep's {len(live)} Slurm task{'s' * (len(live) != 1)} go on"
             + (f" ({', '.join(live)}): cancel them with: scancel {' '.join(jobs)}" if live else "")
             + f". Follow them with: gatelab sweep status {worker_args['sweep']}; the same command waits for them "
             "again and tops them up", err=True)
        raise Interrupted(interrupted.signum, said=True) from None
    if not launch.wait:
        echo(f"follow them with: gatelab sweep status {worker_args['sweep']}")
        return False
    return True
