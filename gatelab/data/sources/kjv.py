"""scripture: the King James Bible, one document a chapter, from Debian's ``bible-kjv`` and ``bible-kjv-text``.

Needs `apt-get` (with package lists that know the two packages) unless both .deb files are already in sources/,
and `dpkg-deb` always, to unpack them.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from gatelab.data.documents import DataError, Document
from gatelab.data.sources.base import Fetched, Source, apt_deb, artifact, run_tool

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


def fetch(data_dir: Path) -> Fetched:
    debs = [apt_deb(p, data_dir) for p in PACKAGES]
    version = run_tool(["dpkg-deb", "-f", str(debs[1]), "Version"], data_dir).strip()
    with tempfile.TemporaryDirectory() as tmp:
        for deb in debs:
            run_tool(["dpkg-deb", "-x", str(deb), tmp], data_dir)
        # The text is in the program's own compressed format; its `bible` binary dumps it. -f turns off
        # pretty-printing (one "Ge1:1 text" line per verse); cwd + "-p ." finds bible.data without a system install.
        lib = Path(tmp) / "usr" / "lib"
        dump = run_tool([str(Path(tmp) / "usr" / "bin" / "bible"), "-f", "-p", ".", "Gen1:1-Rev22:21"], lib)
    docs = kjv_chapters(dump)
    if len(docs) < 1000:
        raise DataError(f"`bible` from {debs[0].name} printed {len(docs)} chapters, expected 1189")
    return Fetched(version, tuple(artifact(d, data_dir) for d in debs), {"scripture": docs})


SOURCE = Source(
    "kjv", ("scripture",), fetch, f"apt-get update && cd {{sources}} && apt-get download {' '.join(PACKAGES)}"
)
