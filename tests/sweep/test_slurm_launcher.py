"""The Slurm launcher's decisions without a Slurm: how it tops the array up, when it stops, what it reads from sacct and
scontrol, who owns Slurm's warning signal, and the sweep file's `slurm` keys. tests/sweep/test_slurm.py runs the same
paths on a real Slurm."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from gatelab import host
from gatelab.errors import GatelabError
from gatelab.sweep import slurm
from gatelab.sweep.queue import SLURM_TASK, WORKER_LOG, slurm_attrs, worker_identity
from gatelab.sweep.slurm import SlurmArray, SlurmTask, TaskEnding, keep_workers, sacct_endings, scontrol_endings
from tests.helpers import gatelab_cli, write_micro_sweep

SACCT = """\
123_0|CANCELLED by 0|None|0:15|0
123_1|TIMEOUT|None|0:0|2
123_2|OUT_OF_MEMORY|None|0:125|0
123_3|NODE_FAIL|None|1:0|0
123_4|PREEMPTED|None|0:0|1
123_5|RUNNING|None|0:0|0
123_[6-7]|PENDING|BeginTime|0:0|0
"""


def _ran(stdout: str = "", returncode: int = 0, stderr: str = ""):
    return lambda command, **_: subprocess.CompletedProcess(command, returncode, stdout, stderr)


def test_sacct_gives_each_task_its_state_and_why():
    endings = sacct_endings(["123"], _ran(SACCT))
    assert {task: (e.state, e.reason) for task, e in endings.items()} == {
        "123_0": ("CANCELLED", "signal 15"), "123_1": ("TIMEOUT", ""), "123_2": ("OUT_OF_MEMORY", "signal 125"),
        "123_3": ("NODE_FAIL", "exit code 1"), "123_4": ("PREEMPTED", ""), "123_5": ("RUNNING", "")}
    assert endings["123_1"].restarts == 2


def test_without_accounting_scontrol_says_how_recent_tasks_ended(tmp_path):
    shown = ("JobId=125 ArrayJobId=123 ArrayTaskId=1 JobName=gatelab-x JobState=TIMEOUT Reason=TimeLimit "
             "Restarts=1 ExitCode=0:0 Comment=a b\n"
             "JobId=123 ArrayJobId=123 ArrayTaskId=2-3 JobState=PENDING Reason=Priority Restarts=0 ExitCode=0:0\n")
    fake = {"sacct": _ran("", 1, "Slurm accounting storage is disabled"), "scontrol": _ran(shown)}
    array = SlurmArray(tmp_path, run=lambda command, **kw: fake[command[0]](command, **kw))
    (tmp_path / "jobs.txt").write_text("123\n")
    assert array.endings() == {"123_1": TaskEnding("123_1", "TIMEOUT", "TimeLimit", 1)}
    assert scontrol_endings(["999"], _ran("", 1)) == {}  # forgotten after MinJobAge: nothing, no error


class FakeArray(SlurmArray):
    """Slurm as a list of live tasks the test edits, and submissions it records."""

    def __init__(self, folder: Path, endings: dict[str, TaskEnding] | None = None, events: dict | None = None):
        super().__init__(folder)
        self.live: list[str] = []
        self.events, self.looks = events or {}, 0  # what Slurm does before the launcher's Nth look
        self.given_endings = endings or {}
        self.submitted: list[int] = []
        self.cancelled = False

    def live_tasks(self) -> list[str]:
        self.looks += 1
        self.events.get(self.looks, lambda: None)()
        return list(self.live)

    def submit(self, n_tasks, command, env) -> list[str]:
        new = [f"{len(self.submitted) + 1}_{index}" for index in range(n_tasks)]
        self.submitted.append(n_tasks)
        self.live += new
        return new

    def endings(self):
        return self.given_endings

    def cancel_pending(self, say) -> None:
        self.cancelled = True


def test_the_launcher_tops_up_to_its_workers_or_the_cells_left_and_stops_when_none_are(tmp_path):
    array, said = FakeArray(tmp_path), []
    array.events = {2: lambda: array.live.remove("1_1"), 3: array.live.clear}
    left = iter([5, 5, 5, 1, 0])  # its first look sizes the launch's cap
    keep_workers(array, workers=3, cells_left=lambda: next(left), command=["w"], env={}, say=said.append,
                 poll_s=0, wait=True)
    # 3 at first; one cancelled: 1 more; all gone with 1 cell left: 1 more; none left: pending ones cancelled
    assert array.submitted == [3, 1, 1] and array.cancelled
    assert any("Slurm task 1_1 ended: gone from squeue" in line for line in said)


def test_a_later_launch_counts_the_tasks_still_alive_and_no_wait_submits_once(tmp_path):
    array = FakeArray(tmp_path)
    array.live = ["7_0", "7_1"]
    keep_workers(array, workers=3, cells_left=lambda: 10, command=["w"], env={}, say=print, poll_s=0, wait=False)
    assert array.submitted == [1]


def test_a_failed_task_stops_the_launch_naming_its_log(tmp_path):
    array = FakeArray(tmp_path, {"1_0": TaskEnding("1_0", "FAILED", "exit code 1")})
    array.events = {2: lambda: array.live.remove("1_0")}
    with pytest.raises(GatelabError, match=r"Slurm task 1_0 failed .*1_0_0_log.out"):
        keep_workers(array, workers=1, cells_left=lambda: 2, command=["w"], env={}, say=print, poll_s=0, wait=True)
    assert array.submitted == [1]


def test_tasks_that_keep_ending_are_a_message_not_an_endless_stream_of_jobs(tmp_path):
    array = FakeArray(tmp_path)

    def cells_left():
        array.live.clear()  # every task ends at once, cancelled or preempted
        return 2

    with pytest.raises(GatelabError, match="submitted and ended with cells still left"):
        keep_workers(array, workers=2, cells_left=cells_left, command=["w"], env={}, say=lambda line: None,
                     poll_s=0, wait=True)
    assert sum(array.submitted) <= 2 * (1 + slurm.TOP_UPS_PER_CELL) + 2 * slurm.TOP_UPS_PER_CELL


def test_slurms_warning_makes_the_task_stop_its_worker_and_requeue_a_fresh_copy():
    """submitit calls checkpoint() on USR2: the worker gets SIGTERM (it puts its run back) and what is requeued is a
    picklable task with the same command."""
    code = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(143)); time.sleep(60)"
    task = SlurmTask([sys.executable, "-c", code], {"A": "1"})
    task.child = subprocess.Popen(task.command)
    time.sleep(0.5)
    started = time.monotonic()
    requeued = task.checkpoint()
    assert task.child.returncode == 143 and time.monotonic() - started < 30
    again = pickle.loads(pickle.dumps(requeued))
    assert isinstance(again.function, SlurmTask) and again.function.command == task.command
    assert again.function.child is None


def test_a_worker_started_by_a_task_ignores_slurms_warning_signals_from_its_first_instruction():
    code = ("import os, signal, time; os.kill(os.getpid(), signal.SIGUSR2); os.kill(os.getpid(), signal.SIGUSR1); "
            "time.sleep(0.2); print('alive')")
    task = SlurmTask([sys.executable, "-c", code], {})
    assert task() == 0  # the default action of USR2 would have killed it (-12)


def test_a_slurm_workers_identity_and_claim_name_its_task_and_log(monkeypatch):
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "41")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    monkeypatch.setenv("SLURM_JOB_ID", "44")
    monkeypatch.setenv(host.SLURM_LOG_ENV, "/runs/x/submitit/41_3_0_log.out")
    assert worker_identity().endswith(f":{os.getpid()} slurm 41_3")
    assert dict(slurm_attrs()) == {SLURM_TASK: "41_3", WORKER_LOG: "/runs/x/submitit/41_3_0_log.out"}
    monkeypatch.delenv("SLURM_ARRAY_TASK_ID")
    assert host.slurm_task_id() == "44"


def test_rank_zero_publishes_each_run_and_the_other_ranks_follow_until_done(tmp_path, monkeypatch):
    monkeypatch.setenv(slurm.RANKS_ENV, str(tmp_path))
    marker = tmp_path / "ran.txt"
    for word in ("one", "two"):
        slurm.publish_to_ranks([sys.executable, "-c", f"open({str(marker)!r}, 'a').write('{word} ')"])
    (tmp_path / "done").touch()
    assert slurm.follow_rank_zero(tmp_path, poll_s=0.01) == 0
    assert marker.read_text() == "one two "
    monkeypatch.delenv(slurm.RANKS_ENV)
    slurm.publish_to_ranks(["x"])  # outside a step of several tasks: nothing
    assert len(list(tmp_path.glob("run-*.json"))) == 2


@pytest.mark.parametrize("slurm_keys, named", [
    ({"sbatch": {"time": 5}}, "slurm.time_min"),
    ({"sbatch": {"--account": "lab"}}, "without dashes"),
    ({"signal_delay_s": 2}, "signal_delay_s"),
    ({"setup": "module load cuda"}, "setup"),
])
def test_bad_slurm_keys_are_one_message_naming_the_key_before_anything_runs(tmp_path, slurm_keys, named):
    sweep = write_micro_sweep(tmp_path, "badslurm", slurm=slurm_keys)
    result = gatelab_cli("sweep", "run", str(sweep), "--executor", "slurm", "--runs-dir", str(tmp_path / "runs"),
                         cwd=tmp_path)
    assert result.returncode == 2 and named in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert str(sweep) in result.stderr and "slurm" in result.stderr
    assert not (tmp_path / "runs" / "badslurm").exists()


def test_a_bad_slurm_sbatch_option_names_the_fix(tmp_path):
    sweep = write_micro_sweep(tmp_path, "badoption")
    result = gatelab_cli("sweep", "run", str(sweep), "--executor", "slurm", "--slurm-sbatch", "account",
                         "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert result.returncode == 2 and "--slurm-sbatch 'account': write NAME=VALUE" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_the_command_lines_slurm_options_go_over_the_sweep_files():
    from gatelab.app.sweep_run import Launch

    file = SimpleNamespace(slurm=yaml.safe_load("") or None)
    launch = Launch(executor="slurm", slurm=dict(partition="gpu", gpus=None, time_min=30, sbatch=["qos=high"],
                                                 setup=["module load cuda"]))
    settings = launch.slurm_settings(file)
    assert (settings.partition, settings.time_min, settings.gpus_per_worker) == ("gpu", 30, 1)
    assert settings.sbatch == {"qos": "high"} and settings.setup == ["module load cuda"]
    from gatelab.sweep.sweep_file import SlurmSettings

    file = SimpleNamespace(slurm=SlurmSettings(partition="cpu", sbatch={"account": "lab"}, setup=["a"]))
    settings = launch.slurm_settings(file)
    assert settings.partition == "gpu" and settings.sbatch == {"account": "lab", "qos": "high"}
    assert settings.setup == ["a", "module load cuda"]


def test_a_slurm_that_cannot_be_reached_or_a_partition_it_lacks_is_one_message_before_any_submission(
        tmp_path, monkeypatch):
    from gatelab.sweep.sweep_file import SlurmSettings

    monkeypatch.setattr(slurm.shutil, "which", lambda name: f"/usr/bin/{name}")
    down = SlurmArray(tmp_path, run=_ran("", 1, "sinfo: error: Unable to contact slurm controller (connect failure)"))
    with pytest.raises(GatelabError, match="Slurm does not answer .*Unable to contact slurm controller.*SLURM_CONF"):
        down.check_reachable()
    lacking = SlurmArray(tmp_path, SlurmSettings(partition="gpu"), run=_ran("debug\ncpu\n"))
    with pytest.raises(GatelabError, match="'gpu' is not a partition of this cluster; it has cpu, debug"):
        lacking.check_reachable()
    SlurmArray(tmp_path, SlurmSettings(partition="cpu"), run=_ran("debug\ncpu\n")).check_reachable()
    monkeypatch.setattr(slurm.shutil, "which", lambda name: None)
    with pytest.raises(GatelabError, match="not on this machine's PATH.*Slurm login node"):
        SlurmArray(tmp_path).check_reachable()


def test_a_waiting_launcher_rides_out_a_controller_that_stops_answering_for_a_while(tmp_path):
    array, said = FakeArray(tmp_path), []
    real_look = array.live_tasks
    silent = iter([True, True, False, True] + [True] * slurm.UNANSWERED_LOOKS)

    def look():
        if next(silent):
            raise GatelabError("Slurm's squeue failed (no answer in 60 s)")
        return real_look()

    array.live_tasks = look
    with pytest.raises(GatelabError, match="squeue failed"):
        keep_workers(array, workers=1, cells_left=lambda: 1, command=["w"], env={}, say=said.append, poll_s=0,
                     wait=True)
    assert array.submitted == [1]  # it went on after two silent looks, and stopped after UNANSWERED_LOOKS in a row
    assert sum("looking again" in line for line in said) == 2 + slurm.UNANSWERED_LOOKS - 1
