"""A sweep's workers as Slurm array tasks, through submitit, and the launcher that keeps enough of them alive.

Who owns which signal. Slurm warns a task `slurm.signal_delay_s` before its time limit (and some clusters before a
preemption) with USR2: submitit's handler, in the task's own process, owns it. It calls `SlurmTask.checkpoint`, which
sends SIGTERM to the task's worker, waits while the worker puts its run back in the ledger (the run's checkpoint is on
disk), then has submitit requeue the task: the requeued task's new worker claims from the ledger, so the run resumes
from its checkpoint there or on any other worker. The worker ignores USR1 and USR2 (Lightning's own Slurm requeue is
off: `gatelab.train.run.slurm_plugins`); SIGTERM, which Slurm sends on `scancel`, `scontrol requeue`, a preemption or
the time limit itself, makes it put its run back at once, as anywhere else.

A task that Slurm ends without requeueing it (cancelled, timed out past `max_requeues`, a node failure, a preemption
under PreemptMode=CANCEL) leaves its cells to the others; the launcher, while it waits, and any later `gatelab sweep
run --executor slurm` submit fresh tasks until `--workers` of them are alive or there are no more cells left than
tasks. The array jobs a sweep submitted are listed in `runs/<sweep>/submitit/jobs.txt`.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gatelab.errors import GatelabError
from gatelab.host import SLURM_LOG_ENV, slurm_task_id
from gatelab.interrupts import leave_slurm_warnings_to_the_task
from gatelab.sweep.queue import CELLS_FAILED
from gatelab.sweep.sweep_file import SlurmSettings

# In a step of one task per device: the folder where rank 0's worker publishes each run's command for the other ranks
RANKS_ENV = "GATELAB_SLURM_RANKS"
JOBS_FILE = "jobs.txt"
# Slurm's job states in which a task is still coming or going (squeue lists these); any other means it ended
LIVE_STATES = {"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "COMPLETING",
               "SUSPENDED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD"}
SLURM_ANSWER_S = 60.0  # how long a Slurm command may take to answer before it counts as failed
INTERRUPTED_CODES = (128 + signal.SIGINT, 128 + signal.SIGTERM)


class SlurmTask:
    """One array task: `gatelab sweep worker` as a child process, with submitit's checkpoint hook (see the module's
    docstring). Checkpointable by duck typing: submitit calls `checkpoint` on USR2 and requeues what it returns."""

    def __init__(self, command: Sequence[str], env: dict[str, str], stop_wait_s: float = 120.0):
        self.command, self.env, self.stop_wait_s = list(command), dict(env), stop_wait_s
        self.child: subprocess.Popen | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "child": None}  # pickled for the requeue: the process is this task's alone

    def __call__(self) -> int:
        env = {**os.environ, **self.env}
        log = _own_log()
        if log is not None:
            env[SLURM_LOG_ENV] = str(log)
        ranks = _ranks_folder(log)
        if ranks is not None and int(os.environ.get("SLURM_PROCID", "0")) != 0:
            return follow_rank_zero(ranks)
        if ranks is not None:
            ranks.mkdir(parents=True, exist_ok=True)
            env[RANKS_ENV] = str(ranks)
        try:
            self.child = subprocess.Popen(self.command, env=env, preexec_fn=leave_slurm_warnings_to_the_task)
            code = self._wait()
        finally:
            if ranks is not None:
                (ranks / "done").touch()  # the other ranks stop following
        # a worker that crashed shows as a FAILED task, which stops the launch; one killed by a signal (negative: the
        # OOM killer, a preemption) or stopped by SIGTERM leaves its cells to the others and a fresh task
        if code > CELLS_FAILED and code not in INTERRUPTED_CODES:
            raise RuntimeError(f"the sweep worker exited with code {code}; its message is above")
        return code

    def _wait(self) -> int:
        # polled, not wait()ed: submitit's USR2 handler runs here and must be able to reap the child itself
        while (code := self.child.poll()) is None:
            time.sleep(0.5)
        return code

    def checkpoint(self):
        """Slurm's warning: the worker puts its run back (SIGTERM), then this task is requeued as new."""
        import submitit

        child = self.child
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + self.stop_wait_s
            while child.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
        return submitit.helpers.DelayedSubmission(SlurmTask(self.command, self.env, self.stop_wait_s))


def _ranks_folder(log: Path | None) -> Path | None:
    """Where a step of several tasks (one per device) passes runs from rank 0 to the others, this start of the task
    its own (a requeued task starts afresh); None for a task of one."""
    if log is None or int(os.environ.get("SLURM_NTASKS", "1")) < 2:
        return None
    return log.parent / f"{slurm_task_id()}.restart{os.environ.get('SLURM_RESTART_COUNT', '0')}.ranks"


def publish_to_ranks(command: Sequence[str]) -> None:
    """Rank 0's worker, before it trains a run on several devices: the other ranks of its Slurm step start the same
    `gatelab train` command, and Lightning's Slurm environment joins them into one DDP run. Nothing outside such a
    step."""
    folder = os.environ.get(RANKS_ENV)
    if not folder:
        return
    number = len(list(Path(folder).glob("run-*.json")))
    published = Path(folder) / f"run-{number:05d}.json"
    temporary = published.with_suffix(".tmp")
    temporary.write_text(json.dumps({"command": list(command)}))
    temporary.replace(published)


def follow_rank_zero(folder: Path, poll_s: float = 0.5) -> int:
    """Ranks 1..N-1 of a step: start each command rank 0 publishes, in order, until rank 0's worker is done."""
    number = 0
    while True:
        published = folder / f"run-{number:05d}.json"
        if published.is_file():
            command = json.loads(published.read_text())["command"]
            # rank 0 records how the run ended; Slurm's warning signal reaches every process of the step, and only
            # rank 0's task acts on it
            subprocess.run(command, env=os.environ.copy(), check=False, preexec_fn=leave_slurm_warnings_to_the_task)
            number += 1
        elif (folder / "done").exists():
            return 0
        else:
            time.sleep(poll_s)


def _own_log() -> Path | None:
    try:
        import submitit

        return submitit.JobEnvironment().paths.stdout
    except (RuntimeError, KeyError):  # not in a submitit job
        return None


def sbatch_parameters(settings: SlurmSettings, *, name: str, n_workers: int, devices: int = 1, nodes: int = 1
                      ) -> dict:
    """The submitit parameters of one submission: gatelab's own, then the sweep's extra sbatch lines. A run on
    several devices is one task per device (and per node), each with a GPU where the workers have any."""
    gpus = max(settings.gpus_per_worker, devices) if settings.gpus_per_worker else 0
    return {"timeout_min": settings.time_min, "slurm_array_parallelism": n_workers, "name": name,
            "gpus_per_node": gpus, "cpus_per_task": settings.cpus_per_worker, "nodes": nodes,
            "tasks_per_node": devices, "slurm_signal_delay_s": settings.signal_delay_s,
            "slurm_additional_parameters": {key.replace("-", "_"): value for key, value in settings.sbatch.items()},
            "slurm_setup": list(settings.setup), **({"slurm_partition": settings.partition} if settings.partition
                                                      else {})}


@dataclass
class SlurmArray:
    """The Slurm tasks of one sweep's launches, past and present: submits more and reads what became of them."""

    folder: Path  # runs/<sweep>/submitit: submitit's scripts, pickles and logs, and jobs.txt
    settings: SlurmSettings = field(default_factory=SlurmSettings)
    name: str = "gatelab"
    devices: int = 1  # per node: the runs' train.devices, one task each
    nodes: int = 1  # the runs' train.num_nodes
    run: Callable[..., subprocess.CompletedProcess] = subprocess.run

    def check_reachable(self) -> None:
        """Before any submission: Slurm's commands are here, its controller answers, and the partition asked for
        exists; else one message saying which and the fix."""
        if shutil.which("sbatch") is None or shutil.which("squeue") is None:
            raise GatelabError("--executor slurm: Slurm's sbatch and squeue are not on this machine's PATH; run the "
                               "command on a Slurm login node, or use --executor local (or submitit-local)")
        listed = ask(self.run, ["sinfo", "--noheader", "--format", "%R"])
        if listed.returncode != 0:
            said = " ".join(listed.stderr.split())[-300:]
            raise GatelabError(f"--executor slurm: Slurm does not answer (sinfo: {said or listed.returncode}); check "
                               "that slurmctld runs and that SLURM_CONF names its slurm.conf")
        partitions = sorted(set(listed.stdout.split()))
        if self.settings.partition and partitions and self.settings.partition not in partitions:
            raise GatelabError(f"slurm.partition (or --slurm-partition) {self.settings.partition!r} is not a "
                               f"partition of this cluster; it has {', '.join(partitions)}")

    def job_ids(self) -> list[str]:
        jobs = self.folder / JOBS_FILE
        return jobs.read_text().split() if jobs.is_file() else []

    def submit(self, n_tasks: int, command: Sequence[str], env: dict[str, str]) -> list[str]:
        """`n_tasks` more workers; the tasks' ids ("123_0" ...), their array job listed in jobs.txt."""
        import submitit

        executor = submitit.AutoExecutor(folder=str(self.folder), cluster="slurm",
                                         slurm_max_num_timeout=self.settings.max_requeues)
        executor.update_parameters(**sbatch_parameters(self.settings, name=self.name, n_workers=n_tasks,
                                                       devices=self.devices, nodes=self.nodes))
        try:
            jobs = executor.submit_array([SlurmTask(command, env) for _ in range(n_tasks)])
        except (subprocess.CalledProcessError, submitit.core.utils.FailedJobError) as error:
            raise GatelabError(f"sbatch refused the workers: {_said(error)}; check the sweep's slurm keys "
                               "(partition, sbatch, setup) and the --slurm-* options") from None
        ids = [job.job_id for job in jobs]
        listed = set(self.job_ids())
        with (self.folder / JOBS_FILE).open("a") as jobs_file:
            jobs_file.write("".join(f"{job}\n" for job in sorted({task.split("_")[0] for task in ids} - listed)))
        return ids

    def live_tasks(self) -> list[str]:
        """The tasks of this sweep's jobs that Slurm still has pending or running (one id per array task)."""
        return [task for task, state in self._squeue(self.job_ids()) if state in LIVE_STATES]

    def _squeue(self, jobs: Sequence[str]) -> list[tuple[str, str]]:
        """(task, state) for each task of `jobs` that Slurm lists (pending, running, or just ended)."""
        if not jobs:
            return []
        found = ask(self.run, ["squeue", "--noheader", "--array", "--jobs", ",".join(jobs), "--format", "%i %T"])
        if found.returncode != 0:
            if "Invalid job id" in found.stderr:  # every job listed has left Slurm's memory: none is alive
                return []
            raise GatelabError(f"Slurm's squeue failed ({' '.join(found.stderr.split())[-300:] or found.returncode}); "
                               "the tasks already submitted go on: run the same command again once Slurm answers")
        rows = (line.split() for line in found.stdout.splitlines())
        return [(row[0], row[1]) for row in rows if len(row) == 2]

    def cancel_pending(self, say: Callable[[str], object]) -> None:
        """With no cell left: cancel this sweep's tasks still waiting to start (a requeued task waits out Slurm's
        BeginTime), which would only start to find nothing to do. Running ones end by themselves."""
        jobs = self.job_ids()
        pending = [task for task, state in self._squeue(jobs) if state in ("PENDING", "REQUEUED", "REQUEUE_HOLD")]
        if pending:
            ask(self.run, ["scancel", "--state", "PENDING", *jobs])
            say(f"cancelled Slurm task{'s' * (len(pending) > 1)} {', '.join(pending)}: still waiting to start, "
                "with no cell left for them")

    def endings(self) -> dict[str, TaskEnding]:
        """Each task of this sweep's jobs that Slurm still remembers: its state and why (sacct where the cluster keeps
        accounting, else scontrol, which remembers a job for MinJobAge after it ends)."""
        jobs = self.job_ids()
        if not jobs:
            return {}
        return sacct_endings(jobs, self.run) or scontrol_endings(jobs, self.run)

    def log_of(self, task: str) -> Path:
        """Rank 0's log of a task, as submitit names it (the path its worker records, `_own_log`)."""
        import submitit

        return submitit.core.utils.JobPaths(self.folder, job_id=task, task_id=0).stdout


@dataclass(frozen=True)
class TaskEnding:
    task: str  # "123_4"
    state: str  # Slurm's: RUNNING, COMPLETED, CANCELLED, TIMEOUT, PREEMPTED, NODE_FAIL, OUT_OF_MEMORY, FAILED ...
    reason: str  # Slurm's reason, or the exit code where that says more
    restarts: int = 0


def sacct_endings(jobs: Sequence[str], run) -> dict[str, TaskEnding]:
    """From sacct, one row per task (allocations only); {} where the cluster keeps no accounting."""
    found = ask(run, ["sacct", "--noheader", "--parsable2", "--allocations", "--jobs", ",".join(jobs),
                      "--format", "JobID,State,Reason,ExitCode,Restarts"])
    if found.returncode != 0:
        return {}
    endings = {}
    for line in found.stdout.splitlines():
        fields = line.split("|")
        if len(fields) < 5 or "[" in fields[0]:  # a pending array's summary row names no task
            continue
        task, state, reason, exit_code, restarts = fields[:5]
        state = state.split()[0]  # "CANCELLED by 0"
        endings[task] = TaskEnding(task, state, _reason(reason, exit_code), int(restarts or 0))
    return endings


def scontrol_endings(jobs: Sequence[str], run) -> dict[str, TaskEnding]:
    endings = {}
    for job in jobs:
        found = ask(run, ["scontrol", "--oneliner", "show", "job", job])
        if found.returncode != 0:
            continue  # forgotten (MinJobAge passed)
        for line in found.stdout.splitlines():
            fields = dict(part.split("=", 1) for part in shlex.split(line) if "=" in part)
            if fields.get("ArrayTaskId", "").isdigit():
                task = f"{fields['ArrayJobId']}_{fields['ArrayTaskId']}"
            elif "ArrayTaskId" not in fields:
                task = fields.get("JobId", job)
            else:
                continue  # the still-pending rest of an array, e.g. ArrayTaskId=3-5
            endings[task] = TaskEnding(task, fields.get("JobState", "?"),
                                       _reason(fields.get("Reason", "None"), fields.get("ExitCode", "0:0")),
                                       int(fields.get("Restarts", "0") or 0))
    return endings


def ask(run, command: list[str], timeout_s: float = SLURM_ANSWER_S) -> subprocess.CompletedProcess:
    """A Slurm command's answer; a command missing here or a controller that does not answer in `timeout_s` is a
    failed answer saying so (returncode 127 or 124), never an exception."""
    try:
        return run(command, capture_output=True, text=True, check=False, timeout=timeout_s)
    except FileNotFoundError:
        return subprocess.CompletedProcess(command, 127, "", f"{command[0]} is not on this machine's PATH")
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(command, 124, "", f"{command[0]} had no answer in {timeout_s:.0f} s")


def _reason(reason: str, exit_code: str) -> str:
    if reason and reason != "None":
        return reason
    code, _, by_signal = exit_code.partition(":")
    if by_signal and by_signal != "0":
        return f"signal {by_signal}"
    return f"exit code {code}" if code and code != "0" else ""


def _said(error: Exception) -> str:
    output = getattr(error, "stderr", None) or getattr(error, "output", None) or str(error)
    if isinstance(output, bytes):
        output = output.decode(errors="replace")
    return " ".join(str(output).split())[:400]


# A launch submits at most this many tasks per cell and worker beyond its first, so that a cluster that ends every
# task at once (a set-up line that fails, a partition that preempts all) is a message, not an endless stream of jobs.
TOP_UPS_PER_CELL = 3
UNANSWERED_LOOKS = 10  # squeue failing this many looks in a row stops a waiting launch


def keep_workers(array: SlurmArray, *, workers: int, cells_left: Callable[[], int], command: Sequence[str],
                 env: dict[str, str], say: Callable[[str], object], poll_s: float, wait: bool) -> list[str]:
    """Top this sweep's live Slurm tasks up to `workers`, or to the cells left where fewer; while `wait`, look again
    every `poll_s` seconds until no cell is left. The tasks submitted."""
    submitted: list[str] = []
    seen_live: set[str] = set()
    unanswered = 0
    cap = workers * (1 + TOP_UPS_PER_CELL) + TOP_UPS_PER_CELL * max(cells_left(), 1)
    while True:
        left = cells_left()
        if left == 0:
            if wait:
                array.cancel_pending(say)
            return submitted
        try:
            live = array.live_tasks()
            unanswered = 0
        except GatelabError as error:  # a controller restarting: look again, for a while
            unanswered += 1
            if not wait or unanswered >= UNANSWERED_LOOKS:
                raise
            say(f"{error}; looking again in {poll_s:.0f} s")
            time.sleep(poll_s)
            continue
        ended = seen_live - set(live)
        if ended:
            _say_endings(array, sorted(ended), say)
        wanted = min(workers, left)
        if len(live) < wanted:
            if len(submitted) + wanted - len(live) > cap:
                raise GatelabError(f"{len(submitted)} Slurm tasks were submitted and ended with cells still left; "
                                   f"see why in their logs under {array.folder} (gatelab sweep status names them)")
            more = array.submit(wanted - len(live), command, env)
            submitted += more
            say(f"submitted Slurm task{'s' * (len(more) > 1)} {', '.join(more)} ({len(live)} alive, {left} cell"
                f"{'s' * (left > 1)} left); logs in {array.folder}")
            live += more
        seen_live = set(live)
        if not wait:
            return submitted
        time.sleep(poll_s)


def _say_endings(array: SlurmArray, tasks: Sequence[str], say: Callable[[str], object]) -> None:
    """Say how tasks this launch saw alive ended; a task that failed (its worker crashed) stops the launch."""
    endings = array.endings()
    for task in tasks:
        ending = endings.get(task)
        why = f"{ending.state}{f' ({ending.reason})' if ending.reason else ''}" if ending else "gone from squeue"
        say(f"Slurm task {task} ended: {why}; log {array.log_of(task)}")
        if ending is not None and ending.state == "FAILED":
            raise GatelabError(f"Slurm task {task} failed ({ending.reason or 'see its log'}): its worker's message "
                               f"is in {array.log_of(task)}; fix the cause and run the same command again (cells "
                               "left are still in the queue)")


def slurm_task_rows(folder: Path, run=subprocess.run) -> list[dict[str, str]]:
    """For `gatelab sweep status`: each Slurm task of the sweep's launches that Slurm still remembers, with its state,
    why it ended and its log; [] where the sweep never went to Slurm or Slurm cannot be asked."""
    array = SlurmArray(folder=folder, run=run)
    if not array.job_ids():
        return []
    endings = array.endings()  # {} where this machine has no Slurm commands or Slurm does not answer
    return [{"task": task, "state": ending.state, "why": ending.reason, "restarts": str(ending.restarts),
             "log": str(array.log_of(task))} for task, ending in sorted(endings.items(), key=lambda kv: _order(kv[0]))]


def _order(task: str) -> tuple[int, int]:
    job, _, index = task.partition("_")
    return (int(job) if job.isdigit() else 0, int(index) if index.isdigit() else -1)
