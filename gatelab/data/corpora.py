"""The shared machinery behind the corpora: splitting documents into train and held-out, the manifest, the cache.

The sources themselves, one module each, are in `gatelab.data.sources` (its docstring has the table of domains and
where their text comes from, and says why a module per source); `prepare_corpora` fetches them in the order of
`SOURCES`, and `domains_from_files` adds the user's own text files as further domains.

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
import re
import shlex
import subprocess
import tarfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gatelab.data.documents import (
    Artifact,
    DataError,
    Document,
    Log,
    refused_write,
    replacing,
    sha256_file,
    writes_into,
)
from gatelab.data.sources import SOURCES

FORMAT_VERSION = 1
SPLITS = ("train", "heldout")
DOMAINS = ("speeches", "fiction", "nonfiction", "scripture", "code")
HELDOUT_FRACTION = 0.075
MIN_HELDOUT_DOCS = 2
# Salt for the split hash: changing it reshuffles every split, so it is versioned with the file format.
_SPLIT_SALT = "gatelab-split-v1"


# --- splits ---------------------------------------------------------------------------------------------------------


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

    def is_valid(self, domain: str) -> bool:
        """True when the domain was built and both split files are present with the recorded checksums."""
        return domain in self.domains and self.damaged_split(domain) is None

    def damaged_split(self, domain: str) -> Path | None:
        """The first split file of a built domain that is gone or not the one recorded (edited, truncated), else
        None."""
        for split in (self.domains[domain].train, self.domains[domain].heldout):
            path = self.data_dir / split.path
            if not path.is_file() or sha256_file(path) != split.sha256:
                return path
        return None

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


# --- building -------------------------------------------------------------------------------------------------------


def default_data_dir() -> Path:
    """$GATELAB_DATA_DIR, else the platform cache folder ($XDG_CACHE_HOME or ~/.cache) + gatelab/data."""
    if os.environ.get("GATELAB_DATA_DIR"):
        return Path(os.environ["GATELAB_DATA_DIR"]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache).expanduser() / "gatelab" / "data"


def atomic_write_text(path: Path, text: str) -> None:
    """Write via a temporary file and rename (`replacing`), so no half file ever has a valid name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with replacing(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


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


class DomainWriter:
    """`_write_domain` for a stream too big to hold: each document goes to its split file as it comes.

    Differences from `split_documents`: the split files keep the stream's order (sorting needs every document at once),
    and memory grows with the number of documents (an 8-byte digest of each id and text), not with their text; too few
    held out, and `close` moves the lowest-hashing training documents over in a second pass.
    """

    def __init__(self, folder: Path, domain: str, heldout_fraction: float = HELDOUT_FRACTION,
                 min_heldout: int = MIN_HELDOUT_DOCS) -> None:
        self.folder, self.domain = folder, domain
        self.heldout_fraction, self.min_heldout = heldout_fraction, min_heldout
        folder.mkdir(parents=True, exist_ok=True)
        self._paths = {split: folder / f"{split}.jsonl.{os.getpid()}.tmp" for split in SPLITS}
        self._files = {split: path.open("w", encoding="utf-8") for split, path in self._paths.items()}
        self._ids: set[bytes] = set()
        self._texts: set[bytes] = set()
        self._lowest_train: list[tuple[float, str]] = []  # the min_heldout lowest-scoring training ids, for close()
        self.counts = {split: [0, 0] for split in SPLITS}  # documents, chars

    def add(self, doc: Document) -> None:
        """Write one document to its split; a text seen before (under any id) is skipped, a repeated id is an error."""
        text_digest = hashlib.sha256(doc.text.encode()).digest()[:8]
        if text_digest in self._texts:
            return
        id_digest = hashlib.sha256(doc.id.encode()).digest()[:8]
        if id_digest in self._ids:
            raise DataError(f"document id {doc.id!r} appears twice; every document id in a domain must be unique")
        self._texts.add(text_digest)
        self._ids.add(id_digest)
        score = heldout_score(doc.id)
        split = "heldout" if score < self.heldout_fraction else "train"
        if split == "train":
            self._lowest_train = sorted([*self._lowest_train, (score, doc.id)])[: self.min_heldout]
        self._files[split].write(doc.to_json() + "\n")
        self.counts[split][0] += 1
        self.counts[split][1] += len(doc.text)

    def close(self, data_dir: Path, sources: Sequence[str]) -> DomainRecord:
        """Finish both split files under their names in `folder` and return the domain's record (paths relative to
        `data_dir`)."""
        for f in self._files.values():
            f.close()
        total = self.counts["train"][0] + self.counts["heldout"][0]
        if total < self.min_heldout + 1:
            self.abort()
            raise DataError(f"domain {self.domain!r} from {', '.join(sources)}: only {total} distinct document(s); a "
                            f"domain needs at least {self.min_heldout + 1} ({self.min_heldout} held out, at least 1 "
                            "for training)")
        short = self.min_heldout - self.counts["heldout"][0]
        if short > 0:
            self._move_to_heldout({doc_id for _, doc_id in self._lowest_train[:short]})
        records = {}
        for split, tmp in self._paths.items():
            final = self.folder / f"{split}.jsonl"
            os.replace(tmp, final)
            documents, chars = self.counts[split]
            records[split] = SplitRecord(final.relative_to(data_dir).as_posix(), documents, chars, sha256_file(final))
        return DomainRecord(tuple(sources), records["train"], records["heldout"])

    def _move_to_heldout(self, ids: set[str]) -> None:
        kept = self._paths["train"].with_name(self._paths["train"].name + ".kept")
        with self._paths["train"].open(encoding="utf-8") as src, kept.open("w", encoding="utf-8") as train, \
                self._paths["heldout"].open("a", encoding="utf-8") as heldout:
            for lineno, line in enumerate(src, 1):
                doc = Document.from_json(line, f"{src.name}:{lineno}")
                moving = doc.id in ids
                (heldout if moving else train).write(line)
                for split, sign in (("heldout", 1), ("train", -1)):
                    if moving:
                        self.counts[split][0] += sign
                        self.counts[split][1] += sign * len(doc.text)
        os.replace(kept, self._paths["train"])

    def abort(self) -> None:
        for split, f in self._files.items():
            f.close()
            self._paths[split].unlink(missing_ok=True)


# What a failed fetch can raise: missing tools, network or disk trouble, and malformed archives.
_FETCH_ERRORS = (OSError, subprocess.SubprocessError, tarfile.TarError, ValueError, KeyError, IndexError, DataError)


def prepare_corpora(
    data_dir: Path | str | None = None, domains: Sequence[str] | None = None, log: Log = print
) -> CorpusManifest:
    """Fetch, split and cache the requested built-in domains (default: all of `DOMAINS`); return the manifest.

    A source that cannot be fetched is reported with the command that gets it by hand and its domains recorded as
    missing, for the next call to try again; a domain is built only from all of its sources, so its content never
    silently changes between machines.
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
    with writes_into(root):
        _build_domains(root, manifest, stale, log)
    log(manifest.summary())
    return manifest


def _build_domains(root: Path, manifest: CorpusManifest, stale: list[str], log: Log) -> None:
    """Fetch the sources of the `stale` domains and write them, or record them as missing; save the manifest."""
    log(f"preparing {', '.join(stale)} in {root}")
    damaged = {d: manifest.damaged_split(d) for d in stale if d in manifest.domains}
    for path in damaged.values():
        log(f"{path}: not the sha256 recorded in {manifest.path} (damaged since it was built); rebuilding it")
    documents: dict[str, list[Document]] = {d: [] for d in stale}
    failures: dict[str, list[tuple[str, str, str]]] = {}
    for source in SOURCES.values():
        if not set(source.domains) & set(stale):
            continue
        command = source.command.format(sources=shlex.quote(str(root / "sources")))
        try:
            fetched = source.fetch(root)
        except _FETCH_ERRORS as exc:
            refused = refused_write(exc, root) if isinstance(exc, OSError) else None
            if refused is not None:  # no source can be written: one error about the folder, not a missing domain
                raise refused from None
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
            reason = "; ".join(f"{n}: {r}" for n, r in zip(names, reasons, strict=True))
            if damaged.get(domain) is not None:
                reason = f"{damaged[domain]} was damaged since it was built and cannot be rebuilt: {reason}"
            manifest.missing[domain] = MissingRecord(names, reason, " && ".join(commands))
            continue
        names = tuple(s.name for s in SOURCES.values() if domain in s.domains)
        manifest.domains[domain] = _write_domain(root, domain, documents[domain], names)
        manifest.missing.pop(domain, None)
    manifest.save()


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
