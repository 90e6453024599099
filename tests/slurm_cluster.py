"""A real one-node Slurm on this host for the tests: Debian's slurm-wlm and munge, installed where they are missing and
this is root with apt-get, started in a temporary folder with its own ports, munge socket and state, stopped after.

Each pytest-xdist worker that asks for one gets its own (ports, spool and munge socket differ), so tests never share
a controller. `.ci/run` installs the packages and sets GATELAB_REQUIRE_SLURM=1: a Slurm test that would skip then
fails instead.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

REQUIRE_ENV = "GATELAB_REQUIRE_SLURM"
DAEMONS = ("slurmctld", "slurmd", "munged")
PACKAGES = ("slurm-wlm", "munge")


@dataclass
class LocalSlurm:
    folder: Path
    env: dict[str, str]  # SLURM_CONF and the PATH its commands need

    def run(self, *command: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(command, env={**os.environ, **self.env}, capture_output=True, text=True, check=check,
                              timeout=60)

    def states(self, job: str) -> dict[str, str]:
        """Each task of `job` squeue lists, with its state."""
        listed = self.run("squeue", "--noheader", "--array", "--jobs", job, "--format", "%i %T", check=False)
        return dict(line.split() for line in listed.stdout.splitlines() if len(line.split()) == 2)


def unavailable_reason() -> str | None:
    """Why a local Slurm cannot be had here, after installing it where that is possible; None where it can."""
    if all(shutil.which(daemon) or Path("/usr/sbin", daemon).exists() for daemon in DAEMONS):
        return None
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return "Slurm (slurmctld, slurmd, munged) is not installed, and installing it needs root and apt-get"
    installed = subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES],
                               capture_output=True, text=True, timeout=600)
    if installed.returncode != 0:
        return f"apt-get install {' '.join(PACKAGES)} failed: {installed.stderr.strip()[-300:]}"
    return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _daemon(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def start(folder: Path) -> LocalSlurm:
    """Munge, slurmctld and slurmd in `folder`, up and the node idle; raises RuntimeError naming the log if not."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o755)
    munge = folder / "munge"
    munge.mkdir()
    shutil.chown(munge, "munge", "munge")
    socket_path = munge / "munge.socket"
    subprocess.run(["runuser", "-u", "munge", "--", _daemon("munged"), f"--socket={socket_path}",
                    f"--pid-file={munge / 'munged.pid'}", f"--log-file={munge / 'munged.log'}",
                    f"--seed-file={munge / 'munged.seed'}"], check=True, capture_output=True, timeout=30)
    host = socket.gethostname().split(".")[0]
    for sub in ("state", "spool", "log"):
        (folder / sub).mkdir()
    conf = folder / "slurm.conf"
    conf.write_text(f"""ClusterName=gatelab-test
SlurmctldHost={host}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={socket_path}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=1,sched_min_interval=200000
StateSaveLocation={folder / 'state'}
SlurmdSpoolDir={folder / 'spool'}
SlurmctldPidFile={folder / 'slurmctld.pid'}
SlurmdPidFile={folder / 'slurmd.pid'}
SlurmctldLogFile={folder / 'log' / 'slurmctld.log'}
SlurmdLogFile={folder / 'log' / 'slurmd.log'}
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
KillWait=10
MinJobAge=900
NodeName={host} CPUs=8 RealMemory=8000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
    cluster = LocalSlurm(folder, {"SLURM_CONF": str(conf)})
    env = {**os.environ, **cluster.env}
    subprocess.run([_daemon("slurmctld"), "-f", str(conf)], env=env, check=True, capture_output=True, timeout=30)
    subprocess.run([_daemon("slurmd"), "-f", str(conf)], env=env, check=True, capture_output=True, timeout=30)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        nodes = cluster.run("sinfo", "--noheader", "--format", "%T", check=False)
        if nodes.returncode == 0 and nodes.stdout.strip() == "idle":
            return cluster
        time.sleep(0.5)
    stop(cluster)
    raise RuntimeError(f"the local Slurm did not come up in 60 s: see {folder / 'log'}")


def stop(cluster: LocalSlurm) -> None:
    """Every job cancelled and gone, the daemons stopped, then any process still carrying this cluster's SLURM_CONF
    killed: a job step whose slurmd stopped first would otherwise live on as an orphan."""
    cluster.run("scancel", "--full", "--me", check=False)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and cluster.run("squeue", "--noheader", check=False).stdout.strip():
        time.sleep(0.5)
    for pid_file in (cluster.folder / "slurmd.pid", cluster.folder / "slurmctld.pid",
                     cluster.folder / "munge" / "munged.pid"):
        try:
            os.kill(int(pid_file.read_text().split()[0]), signal.SIGTERM)
        except (OSError, ValueError, IndexError):
            continue
    time.sleep(1)
    for pid in _carrying(f"SLURM_CONF={cluster.env['SLURM_CONF']}".encode()):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue


def _carrying(variable: bytes) -> list[int]:
    """Every other process whose environment holds `variable` (NAME=value)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if variable in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found
