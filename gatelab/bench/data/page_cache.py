"""Files in and out of the page cache: read them in, drop them, ask how much of them is there, copy them as a prepare
writes them."""

from __future__ import annotations

import ctypes
import mmap as mmap_module
import os
import shutil
import time
from pathlib import Path

import numpy as np

from gatelab.errors import GatelabError


def warm_page_cache(paths: list[Path]) -> float:
    """Read every file once (plain reads, no mapping), so its pages are in the page cache; seconds taken."""
    started = time.perf_counter()
    for path in paths:
        with path.open("rb", buffering=0) as f:
            while f.read(1 << 23):
                pass
    return time.perf_counter() - started


def evict_page_cache(paths: list[Path]) -> bool:
    """Ask the kernel to drop these files' pages from the page cache (written back first); False where it cannot.
    Pages some process has mapped stay: `resident_fraction` tells what was dropped."""
    if not hasattr(os, "posix_fadvise"):
        return False
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return True


def resident_fraction(paths: list[Path]) -> float | None:
    """The share of these files' pages in the page cache (mincore(2) on a fresh mapping); None where it cannot tell."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    except (OSError, AttributeError):
        return None
    page = mmap_module.PAGESIZE
    resident = total = 0
    for path in paths:
        size = path.stat().st_size
        if not size:
            continue
        pages = -(-size // page)
        fd = os.open(path, os.O_RDONLY)
        try:
            address = libc.mmap(None, size, mmap_module.PROT_READ, mmap_module.MAP_SHARED, fd, 0)
            if address in (None, ctypes.c_void_p(-1).value):
                return None
            try:
                vector = (ctypes.c_ubyte * pages)()
                if libc.mincore(address, size, vector) != 0:
                    return None
                resident += int(np.frombuffer(vector, dtype=np.uint8).__and__(1).sum())
                total += pages
            finally:
                libc.munmap(address, size)
        finally:
            os.close(fd)
    return resident / total if total else None


def fresh_copy(folder: Path, target: Path) -> float:
    """Copy a corpus folder with 8 MiB writes, as a prepare writes its shards, so the copy's pages sit in the page cache
    as writing leaves them; seconds taken."""
    need = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    target.parent.mkdir(parents=True, exist_ok=True)
    if shutil.disk_usage(target.parent).free < need * 1.2 + (1 << 30):
        raise GatelabError(f"{target.parent}: too little free disk for a {need / 1e9:.1f} GB copy of the corpus")
    started = time.perf_counter()
    shutil.rmtree(target, ignore_errors=True)
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            destination = target / path.relative_to(folder)
            destination.parent.mkdir(parents=True, exist_ok=True)
            with path.open("rb") as f, destination.open("wb") as out:
                while chunk := f.read(8 << 20):
                    out.write(chunk)
    return time.perf_counter() - started
