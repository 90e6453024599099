"""scripture: the King James Bible, one document a chapter, from Debian's ``bible-kjv`` and ``bible-kjv-text``.

Needs `apt-get` (with package lists that know the two packages) unless both .deb files are already in sources/,
and `dpkg-deb` always, to unpack them.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

from gatelab.data.documents import DataError, Document
from gatelab.data.sources.base import Fetched, Source, apt_deb, artifact, damaged_artifact, run_tool

PACKAGES = ("bible-kjv", "bible-kjv-text")
_KJV_VERSE = re.compile(r"(\d?[A-Za-z]+)(\d+):(\d+) (.*)")


def kjv_chapters(dump: str) -> list[Document]:
    """One document per chapter from ``bible -f`` output (one ``Ge1:1 text`` line per verse), verses on lines."""
    chapters: dict[tuple[str, int], list[str]] = {}
    books: list[str] = []
    for line in dump.splitlines():
        match = _KJV_VERSE.fullmatch(line.strip())
        if match is None:
            continue
        book, chapter = match.group(1), int(match.group(2))
        if book not in books:
            books.append(book)
        chapters.setdefault((book, chapter), []).append(match.group(4))
    return [
        Document(
            f"kjv/{books.index(book) + 1:02d}-{book}/{chapter:03d}",
            "\n".join(verses),
            {"book": book, "chapter": str(chapter)},
        )
        for (book, chapter), verses in chapters.items()
    ]


def _dpkg_deb(option: str, deb: Path, *args: str, cwd: Path) -> str:
    """`dpkg-deb option deb args...`; a .deb it cannot read is named as a damaged file in sources/."""
    try:
        return run_tool(["dpkg-deb", option, str(deb), *args], cwd)
    except DataError as exc:
        if isinstance(exc.__cause__, (FileNotFoundError, subprocess.TimeoutExpired)):  # no dpkg-deb, or it hung
            raise
        raise damaged_artifact(f"dpkg-deb cannot read it ({exc})", deb) from None


def fetch(data_dir: Path) -> Fetched:
    debs = [apt_deb(p, data_dir) for p in PACKAGES]
    version = _dpkg_deb("-f", debs[1], "Version", cwd=data_dir).strip()
    with tempfile.TemporaryDirectory() as tmp:
        for deb in debs:
            _dpkg_deb("-x", deb, tmp, cwd=data_dir)
        # The text is in the program's own compressed format; its `bible` binary dumps it. -f turns off
        # pretty-printing (one "Ge1:1 text" line per verse); cwd + "-p ." finds bible.data without a system install.
        lib = Path(tmp) / "usr" / "lib"
        try:
            dump = run_tool([str(Path(tmp) / "usr" / "bin" / "bible"), "-f", "-p", ".", "Gen1:1-Rev22:21"], lib)
        except DataError as exc:
            raise damaged_artifact(f"the `bible` program they hold fails ({exc})", *debs) from None
    docs = kjv_chapters(dump)
    if len(docs) < 1000:
        raise damaged_artifact(f"`bible` printed {len(docs)} chapters from them, expected 1189", *debs)
    return Fetched(version, tuple(artifact(d, data_dir) for d in debs), {"scripture": docs})


SOURCE = Source(
    "kjv", ("scripture",), fetch, f"apt-get update && cd {{sources}} && apt-get download {' '.join(PACKAGES)}"
)
