"""Where workers run: in this process, as local processes pinned to a share of the cores or to one GPU each (GPUs
shared in turn where workers outnumber them), or as a Slurm job array through submitit (whose local executor serves
for tests). The ledger does the coordination.

Local CPU workers get disjoint cores, and the cores of a worker that has nothing left to train go to the workers still
training: small runs side by side on one core each train faster together than one at a time on all the cores (a
small model's step does not scale across cores), but when the last run of a sweep trains alone on its one core, the
idle cores throw that gain away. Each local worker lists itself in a folder while it has work (`LocalWorkerRegistry`);
the runs re-read it every few steps (`gatelab.sweep.worker.ShareFreedCores`) and widen to their share of freed cores.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gatelab import host
from gatelab.errors import GatelabError
from gatelab.host import available_cores
from gatelab.interrupts import Interrupted, raise_on_signals
from gatelab.progress import is_verbose
from gatelab.sweep.next_commands import LAUNCHER_SAYS_ENV, USER_COMMAND_ENV, user_command
from gatelab.sweep.queue import CELLS_FAILED
from gatelab.workspace import Workspace

REGISTRY_ENV = "GATELAB_LOCAL_WORKERS"  # the folder in which this launch's local workers list themselves
POOL_ENV = "GATELAB_SWEEP_CORES"  # every core the launch was given, e.g. "0,1,2,3"
HOME_ENV = "GATELAB_WORKER_CORES"  # this worker's own share of them, e.g. "2,3"


def worker_command(sweep: Path, *, experiment: Path | None, workspace: Workspace, threads: int | None,
                   heartbeat_s: float, grace_s: float, claim_until: float | None = None) -> list[str]:
    """`gatelab sweep worker` with the launch's workspace as its flags (`workspace.storage` named: a worker needs its
    ledger spelled out), and the launch's timeout as the seconds left of it now."""
    command = [sys.executable, "-m", "gatelab", "sweep", "worker", str(sweep), "--storage", workspace.storage,
               "--runs-dir", str(workspace.runs_dir), "--heartbeat", str(heartbeat_s), "--grace", str(grace_s)]
    if experiment is not None:
        command += ["--experiment", str(experiment)]
    if workspace.tracking_uri:
        command += ["--tracking-uri", workspace.tracking_uri]
    if threads:
        command += ["--threads", str(threads)]
    if claim_until is not None:
        command += ["--timeout", f"{max(0.0, claim_until - time.time()):.1f}"]
    if is_verbose():  # the environment reaches local workers anyway; a Slurm job's may not
        command += ["--verbose"]
    return command


def split_cores(cores: Sequence[int], parts: int) -> list[list[int]]:
    """`parts` disjoint runs of consecutive cores, sizes differing by at most one; with fewer cores than parts the
    last parts are empty."""
    size, extra = divmod(len(cores), parts)
    shares, start = [], 0
    for part in range(parts):
        end = start + size + (part < extra)
        shares.append(list(cores[start:end]))
        start = end
    return shares


def assign_cores(cores: Sequence[int], n_workers: int) -> list[list[int]]:
    """Each local worker's own cores: disjoint where there are enough, else one core each, taken in turn."""
    if n_workers > len(cores):
        return [[cores[index % len(cores)]] for index in range(n_workers)]
    return split_cores(cores, n_workers)


def share_of_cores(pool: Sequence[int], pid: int, live: Mapping[int, Sequence[int]]) -> list[int]:
    """Worker `pid`'s cores now: its own (`live[pid]`) plus an even share of the pool's cores that no live worker owns.

    Every worker computes the same split from the same registry (shares go by pid order), so the shares stay disjoint.
    A worker not in `live` (idle, or not listed yet) gets [] here: it keeps its own cores.
    """
    if pid not in live:
        return []
    owned = {core for cores in live.values() for core in cores}
    free = [core for core in pool if core not in owned]
    extra = split_cores(free, len(live))[sorted(live).index(pid)]
    return sorted(set(live[pid]) | set(extra))


def _alive(pid: int) -> bool:
    """Whether `pid` is a running process; a zombie (exited, not yet reaped by its launcher) is not."""
    if host.has_proc():
        fields = host.process_stat(pid)
        return fields is not None and fields[0] not in ("Z", "X")  # field 3: the state
    try:  # no /proc (macOS): ask the kernel
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class LocalWorkerRegistry:
    """The local workers of one launch that have work: one file per worker, named by its pid, holding its own cores.

    A worker enters while it trains or may claim a run and leaves when the ledger has nothing for it; an entry whose
    process died (SIGKILL, OOM) is ignored. Reading it is one listdir and one /proc read per worker, cheap enough to do
    every few training steps, and it never touches the ledger.
    """

    def __init__(self, folder: Path):
        self.folder = Path(folder)

    def enter(self, pid: int, cores: Sequence[int]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        staged = self.folder / f".{pid}.tmp"  # written aside and renamed, so a reader never sees half an entry
        staged.write_text(",".join(map(str, cores)) + "\n")
        os.replace(staged, self.folder / str(pid))

    def leave(self, pid: int) -> None:
        (self.folder / str(pid)).unlink(missing_ok=True)

    def live(self) -> dict[int, list[int]]:
        """pid -> own cores, for every entry whose process is still running."""
        try:
            names = os.listdir(self.folder)
        except FileNotFoundError:
            return {}
        workers = {}
        for name in names:
            if not name.isdigit() or not _alive(int(name)):
                continue
            try:
                workers[int(name)] = parse_cores((self.folder / name).read_text())
            except (FileNotFoundError, ValueError):  # left or rewritten between listdir and read
                continue
        return workers


def parse_cores(text: str) -> list[int]:
    return [int(core) for core in text.strip().split(",") if core]


@dataclass
class LocalShare:
    """What a worker started by `run_local_workers` knows about the cores: its own, the launch's, and the registry."""

    registry: LocalWorkerRegistry
    pool: list[int]
    home: list[int]
    pid: int

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> LocalShare | None:
        """None for a worker not started by `run_local_workers` (another machine's, a Slurm task, a GPU worker)."""
        if not all(environ.get(key) for key in (REGISTRY_ENV, POOL_ENV, HOME_ENV)):
            return None
        return cls(LocalWorkerRegistry(Path(environ[REGISTRY_ENV])), parse_cores(environ[POOL_ENV]),
                   parse_cores(environ[HOME_ENV]), os.getpid())

    def enter(self) -> None:
        self.registry.enter(self.pid, self.home)

    def leave(self) -> None:
        self.registry.leave(self.pid)

    def cores_now(self) -> list[int]:
        return share_of_cores(self.pool, self.pid, self.registry.live()) or self.home


def run_local_workers(n_workers: int, **worker_args) -> int:
    """N worker processes, each with one GPU (`gatelab.devices.worker_gpus`) or without GPUs a disjoint share of this
    process's cores; Ctrl-C or SIGTERM is forwarded to every worker, which puts its run back in the queue, then
    `Interrupted` is raised here. Returns the highest exit code of the workers (1: a cell failed).
    """
    from gatelab.devices import worker_gpus  # torch: only a local launch needs it

    gpus = worker_gpus(n_workers)
    on_gpus = bool(gpus.per_worker)
    if on_gpus:
        print(gpus.launch_line(), file=sys.stderr, flush=True)
    pool = available_cores()
    homes = assign_cores(pool, n_workers)
    registry = None
    if not on_gpus:
        from gatelab.sweep.spec import load_sweep

        name = load_sweep(worker_args["sweep"], worker_args.get("experiment")).name
        # One folder per launch: two launches (or two machines sharing the runs dir) never count each other's workers.
        registry = LocalWorkerRegistry(Path(worker_args["workspace"].runs_dir) / name / "local-workers"
                                       / f"{socket.gethostname()}-{os.getpid()}")
    processes = []
    with raise_on_signals():
        try:
            for index in range(n_workers):
                env = {**os.environ, **launcher_env(says_resume=True)}
                if on_gpus:
                    env.update(gpus.env(index))
                    command = worker_command(threads=None, **worker_args)
                else:
                    env.update({REGISTRY_ENV: str(registry.folder.resolve()), POOL_ENV: ",".join(map(str, pool)),
                                HOME_ENV: ",".join(map(str, homes[index]))})
                    command = worker_command(threads=len(homes[index]), **worker_args)
                processes.append(subprocess.Popen(command, env=env))
                if registry is not None:  # listed from the start, so an early worker never takes a late one's cores
                    registry.enter(processes[-1].pid, homes[index])
            codes = [process.wait() for process in processes]
        except Interrupted as interrupted:  # a terminal's Ctrl-C reaches the workers too; SIGTERM (kill) does not
            for process in processes:
                if process.poll() is None:
                    process.send_signal(interrupted.signum)
            for process in processes:
                process.wait()  # while each puts its run back; a second signal is ignored meanwhile
            raise
        finally:
            if registry is not None:
                shutil.rmtree(registry.folder, ignore_errors=True)
    return max(codes)


def launcher_env(says_resume: bool) -> dict[str, str]:
    """What a launched worker is told about its launch: the command the user ran, for its resume line, and whether
    the launcher prints that line itself (it waits for its workers), so that Ctrl-C gives exactly one."""
    return {USER_COMMAND_ENV: user_command(), LAUNCHER_SAYS_ENV: "1" if says_resume else "0"}


def _submitit_worker(command: list[str], env: dict[str, str]) -> int:
    return subprocess.run(command, check=False, env={**os.environ, **env}).returncode


def submit_workers(n_workers: int, *, folder: Path, **worker_args) -> list[str]:
    """N workers as a job array of submitit's local executor, waited for: the Slurm path's shape without a Slurm
    (`gatelab.sweep.slurm` submits to a real one)."""
    import submitit

    executor = submitit.AutoExecutor(folder=str(folder), cluster="local")
    executor.update_parameters(timeout_min=24 * 60)
    command = worker_command(threads=None, **worker_args)
    jobs = executor.map_array(_submitit_worker, [command] * n_workers, [launcher_env(says_resume=True)] * n_workers)
    failed = [job.job_id for job in jobs if job.result() not in (0, CELLS_FAILED)]  # failed cells: the ledger says
    if failed:
        raise GatelabError(f"workers {', '.join(failed)} exited with an error; their logs are in {folder}")
    return [job.job_id for job in jobs]
