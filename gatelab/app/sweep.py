"""`gatelab sweep worker`, `reset`, `status` and `supersede`, and how a sweep command ends: a sweep's ledger read,
changed or worked through, or its MLflow runs set aside (`gatelab sweep run` is gatelab.app.sweep_run, `plan`
gatelab.app.plan)."""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path

from rich.table import Table
from typer import echo

from gatelab.app import quiet_noise, stdout_console
from gatelab.errors import GatelabError
from gatelab.interrupts import Interrupted, raise_on_signals
from gatelab.metrics import PPL_AVG
from gatelab.store_uris import missing_local_store, read_only_store
from gatelab.tracking import SUPERSEDED, RunStore, Supersession
from gatelab.workspace import Workspace


def interrupted_exit(interrupted) -> int:
    """A sweep command stopped by Ctrl-C or SIGTERM: what to run to resume, and the shell's exit code (130, 143)."""
    from gatelab.sweep.next_commands import interrupted_line

    line = None if interrupted.said else interrupted_line(interrupted)
    if line:  # none in a worker whose launcher prints it
        echo(line, err=True)
    return interrupted.exit_code


def cells_failed_exit(failed_line: str | None) -> int:
    """1 (CELLS_FAILED), naming the failed cells and the reset command, where any cell of the sweep failed; else 0."""
    from gatelab.sweep.queue import CELLS_FAILED

    if failed_line:
        echo(failed_line, err=True)
        return CELLS_FAILED
    return 0


def worker(sweep: Path, *, experiment: Path | None, workspace: Workspace, threads: int | None, heartbeat: float,
           grace: float, verbose: bool, timeout: float | None = None) -> int:
    """Work through the sweep's shared ledger until no run is left (or none may start: `timeout`); the exit code."""
    quiet_noise(verbose)
    claim_until = None if timeout is None else time.time() + timeout
    from gatelab.sweep.next_commands import failed_cells_line

    try:
        with raise_on_signals():  # from the start: Ctrl-C during the imports of torch is no traceback either
            from gatelab.sweep.worker import work

            report = work(sweep, experiment=experiment, workspace=workspace, threads=threads, heartbeat_s=heartbeat,
                          grace_s=grace, claim_until=claim_until)
            failed = failed_cells_line(sweep, experiment=experiment, storage=workspace.storage,
                                       runs_dir=workspace.runs_dir)
    except Interrupted as interrupted:
        return interrupted_exit(interrupted)
    echo(f"worker done: {len(report.finished)} finished, {len(report.diverged)} diverged, {len(report.failed)} failed")
    return cells_failed_exit(failed)


def reset(sweep: Path, *, cells: list[int], failed: bool, experiment: Path | None, workspace: Workspace) -> None:
    """Put the failed cells named (or every failed cell) back in the queue, and say which."""
    from gatelab.sweep.ledger_storage import default_storage, ledger_exists, shown_storage, tracking_stores
    from gatelab.sweep.queue import SweepLedger
    from gatelab.sweep.spec import expand, load_sweep

    if not cells and not failed:
        raise GatelabError("say which cells to reset: --failed (every failed cell) or --cell N (repeatable)")
    plan = load_sweep(sweep, experiment)
    specs = expand(plan)
    storage = workspace.storage or default_storage(workspace.runs_dir, plan.name)
    stores = tracking_stores(specs, tracking_uri=workspace.tracking_uri, runs_dir=workspace.runs_dir)
    if not ledger_exists(storage, plan.name, stores):
        raise GatelabError(f"sweep {plan.name} has no ledger in {shown_storage(storage)}: nothing has run yet (pass "
                           "--storage or --runs-dir if it lives elsewhere)")
    requeued = SweepLedger(storage, plan.name, tracking_uris=stores).reset(specs, cells, failed)
    for state in requeued:
        echo(f"cell {state.index} ({state.label}): failed after {state.attempts} attempt(s) -> pending, "
             "attempts counted afresh")
    echo(f"re-queued {len(requeued)} cell(s)" + (f"; train them with: gatelab sweep run {sweep}" if requeued
                                                 else ": no cell had failed"))


def supersede(sweep: Path, *, run_ids: list[str], experiment_name: str | None, reason: str,
              workspace: Workspace) -> None:
    """Set aside the sweep's runs `run_ids`, or every run of the experiment `experiment_name`, for `reason`
    (RunStore.supersede checks them all first), and say what changed."""
    from gatelab.sweep.spec import load_sweep

    if bool(run_ids) == bool(experiment_name):
        raise GatelabError("say which runs to supersede: --run RUN_ID (repeatable; `gatelab sweep status` lists the "
                           "sweep's) or --experiment-name NAME (every run of that MLflow experiment), not both")
    sweep_name = load_sweep(sweep).name  # read even with --experiment-name: a wrong file is said, not ignored
    name = experiment_name or sweep_name
    uri = workspace.store(create=False)
    missing = missing_local_store(uri)  # opening a missing store would create an empty one
    if missing:
        raise GatelabError(missing)
    read_only = read_only_store(uri)
    if read_only:
        raise GatelabError(f"{read_only}: superseding writes tags to its runs; make it writable (chmod u+w) first")
    done = RunStore(uri, workspace.runs_dir).supersede(name, reason, run_ids)
    for run in done:
        echo(_supersession_line(run))
    changed = sum(run.changed for run in done)
    if not done:
        echo(f"experiment '{name}' has no runs: nothing changed")
    elif not changed:
        echo(f"nothing changed: the {len(done)} run(s) were already superseded for this reason")
    else:
        echo(f"{changed} run(s) of experiment '{name}' changed"
             + (f", {len(done) - changed} already superseded for this reason" if len(done) > changed else "")
             + "; gatelab table and gatelab claims no longer read them")


def _supersession_line(run: Supersession) -> str:
    shown = f"run {run.run_id}" + (f" ({run.run_name})" if run.run_name else "")
    if not run.changed:
        return f"{shown}: already superseded ({run.reason}), unchanged"
    if run.was == SUPERSEDED:
        return f"{shown}: already superseded, reason now '{run.reason}' (was '{run.old_reason or 'none given'}')"
    return f"{shown}: {run.was or 'no gatelab status'} -> superseded ({run.reason})"


def print_status(sweep: Path, *, experiment: Path | None, workspace: Workspace, as_json: bool) -> None:
    """Counts and one row per run of the sweep's ledger, as a table or as JSON."""
    from gatelab.sweep.ledger_storage import default_storage, torn_tail_note
    from gatelab.sweep.queue import ledger_states
    from gatelab.sweep.spec import expand, load_sweep

    plan = load_sweep(sweep, experiment)
    specs = expand(plan)
    storage = workspace.storage or default_storage(workspace.runs_dir, plan.name)
    # read only: status never writes to the ledger
    states = ledger_states(storage, runs_dir=workspace.runs_dir, sweep_name=plan.name, specs=specs)
    note = torn_tail_note(storage)
    if note:
        echo(note, err=True)
    counts = Counter(state.status for state in states)
    from gatelab.sweep.slurm import slurm_task_rows

    tasks = slurm_task_rows(workspace.runs_dir / plan.name / "submitit")
    if as_json:
        echo(json.dumps({"sweep": plan.name, "counts": dict(counts), "runs": [asdict(s) for s in states],
                         **({"slurm_tasks": tasks} if tasks else {})}, indent=2))
        return
    table = Table(box=None, title=f"sweep {plan.name}: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    for column in ("#", "run", "status", "detail", "attempts", "MLflow run"):
        table.add_column(column)
    for state in states:
        table.add_row(str(state.index), state.label, state.status, _detail(state), str(state.attempts),
                      state.mlflow_run_id or "")
    stdout_console().print(table)
    if tasks:
        slurm = Table(box=None, title="Slurm tasks (sacct, or scontrol for recent ones)")
        for column in ("task", "state", "why", "restarts", "log"):
            slurm.add_column(column)
        for task in tasks:
            slurm.add_row(*task.values())
        stdout_console().print(slurm)


def _detail(state) -> str:
    if state.status == "running":
        return (f"on {state.worker} for {time.time() - (state.since or time.time()):.0f} s"
                + (f"; log {state.log}" if state.log else ""))
    if state.status == "diverged":
        return f"at step {state.diverged_step}"
    if state.status == "failed":
        return state.error or ""
    if state.status == "finished" and state.value is not None:
        return f"{PPL_AVG} {state.value:.3f}"
    return ""
