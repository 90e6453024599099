"""The tracked files fit the copy of the checkout that travels to a lent GPU machine (issue 41).

That copy is capped (64 MiB with what a run carries beside it: a virtual environment, a data bundle), so the tracked
files keep to 16 MiB. Most of them are results/: a new committed result that passes the limit fails here, with the
largest files named, rather than on the device machine.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import REPO

LIMIT_BYTES = 16 * 2**20


def tracked_sizes(root: Path) -> dict[str, int] | None:
    """Bytes of each file git tracks under `root` as it is on disk (`git ls-files -z`, then the files' sizes, as
    `du -b` counts them); a tracked file deleted from the tree counts nothing. None where `root` is no git checkout."""
    listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], capture_output=True)
    if listed.returncode != 0:
        return None
    sizes = {}
    for name in listed.stdout.decode("utf-8", "surrogateescape").split("\0"):
        path = root / name
        if name and (path.is_file() or path.is_symlink()):
            sizes[name] = path.lstat().st_size
    return sizes


def _over_limit(sizes: dict[str, int]) -> str:
    total = sum(sizes.values())
    largest = sorted(sizes.items(), key=lambda item: -item[1])[:8]
    return (f"the tracked files are {total:,} bytes ({total / 2**20:.2f} MiB), over the {LIMIT_BYTES:,} bytes (16 MiB) "
            "that the device copy of the checkout allows; the largest: "
            + ", ".join(f"{name} {size / 2**20:.2f} MiB" for name, size in largest)
            + ". Compress or drop what no command reads (results/tiny/README.md says how the store was packed).")


def test_tracked_files_fit_the_device_copy():
    if shutil.which("git") is None:
        pytest.skip("git is not installed: the tracked files cannot be listed")
    sizes = tracked_sizes(REPO)
    if sizes is None:
        pytest.skip(f"{REPO} is not a git checkout (a copy without .git): no tracked files to measure")
    assert sum(sizes.values()) <= LIMIT_BYTES, _over_limit(sizes)


def test_tracked_sizes_counts_only_tracked_files(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    assert tracked_sizes(tmp_path) is None
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "store.tar.xz").write_bytes(b"x" * 3000)
    (tmp_path / "gone.md").write_text("deleted after it was added")
    (tmp_path / "untracked.png").write_bytes(b"y" * 5000)
    subprocess.run(["git", "-C", str(tmp_path), "add", "store.tar.xz", "gone.md"], check=True)
    (tmp_path / "gone.md").unlink()
    assert tracked_sizes(tmp_path) == {"store.tar.xz": 3000}
    message = _over_limit({"results/tiny/mlflow-store.tar.gz": 9_770_967, "README.md": 40_000})
    assert "9,810,967 bytes" in message and message.index("mlflow-store") < message.index("README.md")
