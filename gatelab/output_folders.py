"""Checks of the folders a command will write (--out, --runs-dir), made before any work so that an hour of training
or scoring never ends on a folder that cannot be written."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from gatelab.errors import GatelabError


def require_folder(path: Path, option: str) -> None:
    """`path` is a folder, or can be made as one: neither it nor any folder above it is a file."""
    existing = _nearest_existing(path)
    if existing.is_dir():
        return
    if existing == path.absolute():
        raise GatelabError(f"{option} {path}: is a file, not a folder; name a folder (it is made if missing) or move "
                           "the file away")
    raise GatelabError(f"{option} {path}: {existing} is a file, so no folder can be made in it; name another folder")


def require_writable_folder(path: Path, option: str) -> None:
    """As `require_folder`, and this process can write there (in `path`, or where it would be made)."""
    require_folder(path, option)
    existing = _nearest_existing(path)
    if not _writable(existing):
        raise GatelabError(f"{option} {path}: {existing} is read-only; make it writable (chmod u+w {existing}) or "
                           "name another folder")


def _nearest_existing(path: Path) -> Path:
    absolute = path.absolute()
    return next(candidate for candidate in (absolute, *absolute.parents) if candidate.exists())


def _writable(folder: Path) -> bool:
    # root passes os.access on a folder with no write bit: a folder marked read-only is kept read-only for root too.
    return os.access(folder, os.W_OK | os.X_OK) and bool(stat.S_IMODE(folder.stat().st_mode) & 0o222)
