"""code: the running Python's standard-library ``.py`` files, one document a file; nothing to download."""

from __future__ import annotations

import hashlib
import platform
import sysconfig
from pathlib import Path

from gatelab.data.documents import Artifact, DataError, Document
from gatelab.data.sources.base import Fetched, Source

# Generated tables (codec maps, pydoc topic strings) and tests would make the code domain repetitive boilerplate.
_STDLIB_SKIP_DIRS = frozenset(
    {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "encodings", "pydoc_data"}
)
_STDLIB_MAX_BYTES = 200_000


def stdlib_files(stdlib: Path | None = None) -> list[Path]:
    """The standard library's .py files used as the code domain: sorted, without tests, generated tables or
    files over 200 kB."""
    root = Path(stdlib or sysconfig.get_paths()["stdlib"])
    return sorted(
        p
        for p in root.rglob("*.py")
        if not _STDLIB_SKIP_DIRS.intersection(p.relative_to(root).parts[:-1])
        and p.is_file()
        and p.stat().st_size <= _STDLIB_MAX_BYTES
    )


def fetch(data_dir: Path) -> Fetched:
    root = Path(sysconfig.get_paths()["stdlib"])
    digest = hashlib.sha256()
    docs = []
    for path in stdlib_files(root):
        rel = path.relative_to(root).as_posix()
        raw = path.read_bytes()
        digest.update(rel.encode() + b"\0" + hashlib.sha256(raw).digest())
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            continue  # a few test fixtures use legacy encodings on purpose; they are not representative code
        if text.strip():
            docs.append(Document(f"python-stdlib/{rel}", text, {"path": rel}))
    if not docs:
        raise DataError(f"{root}: no .py files found in the Python standard library")
    return Fetched(platform.python_version(), (Artifact(str(root), digest.hexdigest()),), {"code": docs})


SOURCE = Source("python-stdlib", ("code",), fetch, "install a Python with its standard library sources")
