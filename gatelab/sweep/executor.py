"""Where workers run: in this process, as local processes pinned to a share of the cores or to one GPU each, or as a
Slurm job array through submitit (whose local executor serves for tests). The ledger does the coordination."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from gatelab.errors import GatelabError


def worker_command(sweep: Path, experiment: Path | None, storage: str, tracking_uri: str | None, runs_dir: Path,
                   threads: int | None, heartbeat_s: float, grace_s: float) -> list[str]:
    command = [sys.executable, "-m", "gatelab", "sweep", "worker", str(sweep), "--storage", storage,
               "--runs-dir", str(runs_dir), "--heartbeat", str(heartbeat_s), "--grace", str(grace_s)]
    if experiment is not None:
        command += ["--experiment", str(experiment)]
    if tracking_uri:
        command += ["--tracking-uri", tracking_uri]
    if threads:
        command += ["--threads", str(threads)]
    return command


def gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # no usable torch/CUDA: plan for CPUs
        return 0


def run_local_workers(n_workers: int, **worker_args) -> int:
    """N worker processes; each gets one GPU (CUDA_VISIBLE_DEVICES) where there are enough, else cores/N threads.

    Ctrl-C reaches every worker, which puts its run back in the queue before it exits.
    """
    gpus = gpu_count()
    threads = max(1, (os.cpu_count() or 1) // n_workers) if gpus < n_workers else None
    processes = []
    for index in range(n_workers):
        env = dict(os.environ)
        if gpus >= n_workers:
            env["CUDA_VISIBLE_DEVICES"] = str(index)
        processes.append(subprocess.Popen(worker_command(threads=threads, **worker_args), env=env))
    try:
        codes = [process.wait() for process in processes]
    except KeyboardInterrupt:
        for process in processes:
            process.send_signal(signal.SIGINT)
        codes = [process.wait() for process in processes]
    return max(codes)


def _submitit_worker(command: list[str]) -> int:
    return subprocess.run(command, check=False).returncode


def submit_workers(n_workers: int, cluster: str, folder: Path, slurm: dict, wait: bool, **worker_args) -> list[str]:
    """A job array of N workers through submitit: `cluster` is 'slurm', or 'local' to run them here."""
    import submitit

    executor = submitit.AutoExecutor(folder=str(folder), cluster=cluster)
    parameters = {"timeout_min": slurm.get("time_min", 24 * 60)}
    if cluster == "slurm":
        parameters.update({"slurm_array_parallelism": n_workers, "gpus_per_node": slurm.get("gpus", 0),
                           "cpus_per_task": slurm.get("cpus", 4)})
        if slurm.get("partition"):
            parameters["slurm_partition"] = slurm["partition"]
    executor.update_parameters(**parameters)
    command = worker_command(threads=slurm.get("threads"), **worker_args)
    jobs = executor.map_array(_submitit_worker, [command] * n_workers)
    if wait:
        failed = [job.job_id for job in jobs if job.result() != 0]
        if failed:
            raise GatelabError(f"workers {', '.join(failed)} exited with an error; their logs are in {folder}")
    return [job.job_id for job in jobs]
