"""What the corpora, their sources and the token datasets share: a Document, the Artifact it came from, DataError,
and `writes_into`, which turns the data directory refusing a write into one DataError."""

from __future__ import annotations

import errno
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from gatelab.errors import GatelabError

Log = Callable[[str], None]


class DataError(GatelabError):
    """A data problem the user can fix: the message names the file, what is wrong and what would be valid."""


@dataclass(frozen=True)
class Document:
    """One unit of text that is never split across train and held-out."""

    id: str
    text: str
    meta: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"id": self.id, "text": self.text, "meta": self.meta}, ensure_ascii=False)

    @classmethod
    def from_json(cls, line: str, where: str) -> Document:
        try:
            obj = json.loads(line)
            return cls(id=str(obj["id"]), text=str(obj["text"]), meta=dict(obj.get("meta", {})))
        except (ValueError, KeyError, TypeError) as exc:
            raise DataError(
                f"{where}: not a document line ({exc}); expected JSON with 'id', 'text' and 'meta'. "
                "Delete the data directory's corpora/ folder and prepare again."
            ) from exc


@dataclass(frozen=True)
class Artifact:
    """A downloaded file (relative to the data directory) or a local input (absolute path), with its sha256."""

    file: str
    sha256: str


@contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A temporary name beside `path` to write, renamed onto `path` when the block ends, so an interrupted write never
    leaves a half file under a valid name, nor a failed one (a full disk) a half temporary file; a write error names
    `path`."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # one per process: concurrent writers never collide
    try:
        yield tmp
        os.replace(tmp, path)
    except OSError as exc:
        discard(tmp)
        if exc.filename is None:  # write() fails naming no file
            raise OSError(exc.errno, exc.strerror, str(path)) from None
        raise
    except BaseException:
        discard(tmp)
        raise


def discard(path: Path) -> None:
    """Remove what a failed write left; where the folder refuses that too (read-only), nothing was left to remove."""
    with suppress(OSError):
        path.unlink()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# The data directory refusing a write: its file system is read-only, it is not this user's, or its disk is full.
_REFUSED = {errno.EROFS: "read-only file system", errno.EACCES: "permission denied",
            errno.EPERM: "operation not permitted"}
_FULL = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded"}


def refused_write(exc: OSError, data_dir: Path) -> DataError | None:
    """The one message for `exc` when it is `data_dir` refusing a write (naming the folder and the fix), else None.

    A permission error on a file outside the data directory (a user's own text file, a tool) is another problem.
    """
    data_dir = data_dir.absolute()
    where = Path(exc.filename).absolute() if exc.filename else data_dir
    if exc.errno in _FULL:
        fix = (f"free space there (df -h {data_dir}) or set $GATELAB_DATA_DIR (or data.data_dir) to a folder on a "
               "disk with room")
        return DataError(f"data directory {data_dir}: cannot write {where} ({_FULL[exc.errno]}); {fix}")
    inside = where == data_dir or data_dir in where.parents or where in data_dir.parents
    if exc.errno in _REFUSED and (exc.errno == errno.EROFS or inside):
        return DataError(f"data directory {data_dir}: cannot write {where} ({_REFUSED[exc.errno]}); set "
                         "$GATELAB_DATA_DIR (or data.data_dir) to a writable folder, or prepare the data where this "
                         "one is writable (`gatelab data prepare PRESET`)")
    return None


@contextmanager
def writes_into(data_dir: Path) -> Iterator[None]:
    """Raises `refused_write`'s DataError in place of the OSError of a write the data directory refuses."""
    try:
        yield
    except OSError as exc:
        error = refused_write(exc, data_dir)
        if error is None:
            raise
        raise error from None
