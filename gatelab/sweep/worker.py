"""A sweep worker: claim the next run from the ledger, train it, record the outcome; repeat until none is left.

Many runs share one process, so Lightning and torch are imported once (6-9 s a process here). Any number of workers,
on any number of machines, can work on one sweep: the ledger hands each run to exactly one of them.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from gatelab.sweep.queue import HASH, SweepLedger, default_storage
from gatelab.sweep.spec import expand, load_sweep


@dataclass
class WorkerReport:
    finished: list[str] = field(default_factory=list)
    diverged: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def work(sweep_path: Path, experiment: Path | None = None, storage: str | None = None, tracking_uri: str | None = None,
         runs_dir: Path = Path("runs"), threads: int | None = None, heartbeat_s: float = 10.0, grace_s: float = 60.0,
         log=print, progress: bool = False) -> WorkerReport:
    """Work until no run of the sweep is left; `progress` shows each run's progress bar (one worker in a terminal)."""
    sweep = load_sweep(sweep_path, experiment)
    specs = expand(sweep)
    by_hash = {spec.hash: spec for spec in specs}
    ledger = SweepLedger(storage or default_storage(runs_dir, sweep.name), sweep.name, heartbeat_s, grace_s)
    ledger.enqueue_missing(specs)
    if threads:
        import torch

        torch.set_num_threads(threads)
    from gatelab.train.run import run  # Lightning is imported once per worker, here

    report = WorkerReport()
    while True:
        for digest in ledger.fail_stale():
            log(f"re-queued {by_hash[digest].label() if digest in by_hash else digest}: its worker stopped beating")
        trial = ledger.claim()
        if trial is None:
            if not ledger.unfinished():
                return report
            time.sleep(min(heartbeat_s, 5.0))  # runs still going elsewhere; one may need taking over
            continue
        spec = by_hash.get(trial.user_attrs[HASH])
        if spec is None:
            ledger.fail(trial, f"run {trial.user_attrs[HASH]} is no longer in {sweep_path}", retries=0)
            continue
        log(f"[{ledger.worker}] run {spec.index}: {spec.label()}")
        with ledger.heartbeat(trial):
            try:
                result = run(spec.experiment, tracking_uri=tracking_uri, runs_dir=runs_dir, quiet=not progress, log=log)
            except KeyboardInterrupt:
                ledger.release(trial)
                raise
            except Exception:  # a failed run is recorded and retried; the worker goes on with the next
                error = traceback.format_exc()
                retried = ledger.fail(trial, error, sweep.retries)
                log(f"run {spec.index} failed ({error.strip().splitlines()[-1]}); "
                    + ("re-queued" if retried else f"no retries left after {sweep.retries}"))
                if not retried:
                    report.failed.append(spec.hash)
                continue
        ledger.finish(trial, result.status, result.run_id, result.metrics.get("ppl/avg"), result.diverged_step)
        getattr(report, result.status).append(spec.hash)
        log(f"run {spec.index} {result.status}: MLflow run {result.run_id}")
