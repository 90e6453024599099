"""Facts about this process and this machine, read in one place: Linux's /proc, and the checkout gatelab runs from.

Every reader degrades where /proc is missing (macOS): the caller gets None, False or a portable fallback.
"""

from __future__ import annotations

import inspect
import os
import platform
import re
import shutil
import socket
import sys
import time
from pathlib import Path

import gatelab

SLURM_LOG_ENV = "GATELAB_SLURM_LOG"  # a Slurm task's worker is told where its log is, for `gatelab sweep status`


def slurm_task_id() -> str | None:
    """This process's Slurm task as `squeue` names it ("123_4" in an array, else "123"); None outside Slurm."""
    array_job, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array_job and task:
        return f"{array_job}_{task}"
    return os.environ.get("SLURM_JOB_ID")


def repo_root() -> Path:
    """The checkout with experiments/ and sweeps/: the folder above the gatelab package in an editable install; in a
    wheel install (site-packages holds neither) the working directory where it is such a checkout, else
    site-packages. A GPU machine's `pip install CHECKOUT` is a wheel install run from the checkout: without the
    fallback, `gatelab bench` asked for site-packages/sweeps/paper-table1.yaml there."""
    above_package = Path(__file__).resolve().parents[1]
    if not (above_package / "experiments").is_dir() and _is_checkout(Path.cwd()):
        return Path.cwd().resolve()
    return above_package


def _is_checkout(folder: Path) -> bool:
    return (folder / "experiments").is_dir() and (folder / "sweeps").is_dir() and (folder / "pyproject.toml").is_file()


def process_stat(pid: int | str = "self") -> list[str] | None:
    """Fields 3 onwards of /proc/<pid>/stat (state, ppid, pgrp, ...): field N is at index N - 3. None if the process is
    gone or there is no /proc. The name (field 2) may itself hold ")", so the split is after the last one."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def has_proc() -> bool:
    return Path("/proc/self/stat").exists()


def live_pids() -> list[int]:
    """Every process id /proc lists; [] without /proc."""
    try:
        return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return []


def thread_ids() -> list[int]:
    """The threads of this process (Linux applies CPU affinity per thread); [] without /proc."""
    try:
        return [int(task) for task in os.listdir("/proc/self/task")]
    except OSError:
        return []


def seconds_since_start() -> float:
    """Wall seconds since this program first imported gatelab (`gatelab.STARTED`): the imports, set-up and whatever
    else it did before now, without what the process ran before it became this Python program."""
    return time.perf_counter() - gatelab.STARTED


def peak_rss_gb() -> float:
    """This process's largest resident set so far, in GB.

    Linux's VmHWM, not getrusage's ru_maxrss: ru_maxrss survives execve, so a run started by a large process (a
    bench, a notebook) would report its parent's size, not its own.
    """
    try:
        status = Path("/proc/self/status").read_text()
        return int(status.split("VmHWM:")[1].split()[0]) * 1024 / 1e9  # kB
    except (OSError, IndexError, ValueError):  # no /proc (macOS): ru_maxrss, in bytes there
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e9


def lock_holders(path: Path) -> list[int]:
    """The PIDs holding a lock (flock or POSIX) on the file `path`, as /proc/locks lists them; [] where none does,
    the file is gone or there is no /proc. Processes waiting for the lock (the lines marked `->`) are left out."""
    try:
        stat = os.stat(path)
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return []
    device = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    holders = []
    for line in lines:
        fields = line.split()
        if len(fields) >= 6 and fields[1] != "->" and fields[5] == device and fields[4].isdigit():
            holders.append(int(fields[4]))
    return holders


def is_stopped(pid: int) -> bool:
    """Whether process `pid` is stopped (SIGSTOP, Ctrl-Z) or traced: it holds what it holds until it is continued."""
    fields = process_stat(pid)
    return bool(fields) and fields[0] in ("T", "t")


def cpu_info() -> str:
    """/proc/cpuinfo's text; "" where there is none."""
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def cpu_model() -> str:
    """The CPU's model name ("Intel(R) Xeon(R) Processor"), or what the platform says where /proc/cpuinfo has none."""
    names = re.findall(r"^model name\s*:\s*(.+)$", cpu_info(), re.M)
    return names[0].strip() if names else platform.processor() or platform.machine() or "unknown CPU"


def available_cores() -> list[int]:
    """The cores this process may run on: its affinity mask (taskset, Slurm, a container), not os.cpu_count()."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # no affinity API (macOS): every core
        return list(range(os.cpu_count() or 1))


def machine_name() -> str:
    """This machine as a run's host tag records it: the host name, the CPU model and the available cores. A host name
    alone does not tell machines apart (containers and VMs are often all "vm" or "localhost"), and `time/step_s` from
    two CPUs under one name would be compared as one machine's."""
    name = f"{socket.gethostname()} ({cpu_model()}, {len(available_cores())} cores)"
    return name.replace("'", "")  # the plan's MLflow search quotes it


def cpu_has_fast_bf16() -> bool:
    """Whether this CPU runs bf16 matmuls faster than fp32 ones, so that bf16 autocast pays: with AMX tiles, or with
    AVX512-BF16 on an AMD CPU (an EPYC's tiny step: 517 ms eager in bf16 against 634 ms in fp32). An Intel CPU with
    AVX512-BF16 but no AMX runs its bf16 GEMMs at about half its fp32 rate (a Xeon whose VM hides AMX: the compiled tiny
    step took 602 ms in bf16 against 351 ms in fp32; results/bench/README.md). Elsewhere bf16 is emulated."""
    info = cpu_info()
    flags_line = re.search(r"^flags\s*:(.*)$", info, re.M)
    flags = set(flags_line[1].split()) if flags_line else set()
    return "amx_bf16" in flags or ("avx512_bf16" in flags and "AuthenticAMD" in info)


def cuda_has_native_bf16() -> bool:
    """Whether the current CUDA device computes in bf16 itself (compute capability 8.0 on, Ampere; ROCm's GPUs).
    `torch.cuda.is_bf16_supported()` also says yes where CUDA emulates bf16 in fp32 (V100, T4), slower than fp16 there;
    its `including_emulation` argument leaves emulation out, and where a torch lacks it, compute capability decides."""
    import torch

    if "including_emulation" in inspect.signature(torch.cuda.is_bf16_supported).parameters:
        return torch.cuda.is_bf16_supported(including_emulation=False)
    return bool(torch.version.hip) or torch.cuda.get_device_capability()[0] >= 8


def resolve_precision(precision: str, accelerator: str, moe: bool = False) -> str:
    """`train.precision` as Lightning takes it; `auto`: on a GPU bf16 mixed where bf16 is native, else fp16 mixed
    (`cuda_has_native_bf16`); on a CPU with fast bf16, mixed bf16 for dense models and fp32 for MoE ones, whose routing
    and small expert matmuls run slower in bf16 there (tiny-moe's plain step: 585 against 1393 ms on an AMX Xeon, 710
    against 905 ms on an AVX512-BF16 EPYC, results/bench/); fp32 on other CPUs, where bf16 is emulated."""
    if precision != "auto":
        return precision
    import torch  # here: the rest of this module is read by commands that answer before torch loads

    if torch.cuda.is_available() and accelerator in ("auto", "gpu", "cuda"):
        return "bf16-mixed" if cuda_has_native_bf16() else "16-mixed"
    return "bf16-mixed" if cpu_has_fast_bf16() and not moe else "32-true"


def cannot_compile(accelerator: str) -> str | None:
    """Why `train.compile` cannot work in this process, or None. On the CPU inductor builds C++ at run time, and a
    laptop without a compiler would fail at the first step: the run trains eager instead, saying so. Here, not in
    gatelab.train.compiling, so that `gatelab config show` asks without importing Lightning."""
    import torch

    if torch.cuda.is_available() and accelerator in ("auto", "gpu", "cuda"):
        return None  # CUDA builds of torch bring Triton, inductor's GPU compiler
    if sys.platform == "win32":
        return "torch.compile does not build for the CPU on Windows here"
    if not any(name and shutil.which(name) for name in (os.environ.get("CXX"), "g++", "c++", "clang++")):
        return "no C++ compiler on PATH (torch.compile builds C++ for the CPU: install g++ or clang++, or set CXX)"
    return None
