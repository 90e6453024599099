"""What this process and machine say of themselves (/proc, sysfs, the load average), and writing a file whole."""

from __future__ import annotations

import os
from pathlib import Path


def atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def status_kb(key: str) -> float | None:
    """A field of /proc/self/status (VmRSS, VmHWM, RssAnon, ...) in kB; None without it."""
    try:
        text = Path("/proc/self/status").read_text()
        return float(text.split(f"{key}:")[1].split()[0])
    except (OSError, IndexError, ValueError):
        return None


def smaps_rollup() -> dict[str, int]:
    """/proc/self/smaps_rollup in kB; {} without it."""
    try:
        lines = Path("/proc/self/smaps_rollup").read_text().splitlines()
    except OSError:
        return {}
    values = {}
    for line in lines:
        parts = line.split()
        if len(parts) == 3 and parts[2] == "kB":
            values[parts[0].rstrip(":")] = int(parts[1])
    return values


def read_ahead_kb(path: Path) -> int | None:
    """The read-ahead of the block device holding `path`, from sysfs; None where it cannot be found."""
    try:
        device = os.stat(path).st_dev
        block = Path(f"/sys/dev/block/{os.major(device)}:{os.minor(device)}")
        for candidate in (block / "queue" / "read_ahead_kb", block / ".." / "queue" / "read_ahead_kb"):
            if candidate.exists():
                return int(candidate.read_text())
    except (OSError, ValueError):
        pass
    return None
