"""Token shards: one split of one domain tokenized into files of token ids, made once, resumably, read in place.

Layout, under ``<data_dir>/tokens/<tokenizer fingerprint>/``::

    <domain>.<split>/shard-00000.bin    token ids, raw uint16 (vocabulary <= 65,536 ids) or uint32
    <domain>.<split>/shard-00000.npy    int64 document starts within the shard, n_docs + 1 entries
    <domain>.<split>/shard-00000.ids    the shard's document ids, one JSON string a line
    <domain>.<split>/shard-00000.json   the shard's record, written last: its presence says the shard is whole
    <domain>.<split>/unigram.npy        token counts of the split (the unigram baseline needs no pass over the tokens)
    <domain>.<split>/split.json         the split's record: source checksum, framing, every shard's record
    <domain>.<split>/stamps.json        each file's size, mtime_ns and sha256 when written: see `_checksum_damage`
    manifest.json                       every whole split under this tokenizer, with the sources they came from

Shard k holds the documents whose lines start in bytes ``[k * shard_bytes, (k + 1) * shard_bytes)`` of the split's
JSONL file, so a shard is a function of the split file alone: shards are made independently, and a prepare that was
killed keeps the shards it finished and makes only the rest, byte-identical to an uninterrupted prepare. The shards of a
split, concatenated in order, are its token stream (`TokenStream`); a window may cross from one shard into the next.

Every document is stored as ``<bos> text <eos>`` with the framing ids the caller gives (see `datasets`), so documents
stay separated and a window can start at a document boundary.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import suppress
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from gatelab.data.documents import DataError, Document, Log, replacing, sha256_file

FORMAT = 2
SHARD_BYTES = 64 << 20  # of JSONL text: about 16M tokens of English a shard
STAMPS = "stamps.json"
# A split's files are checked against their sha256 on every load when its tokens take fewer bytes than this (well
# under a second of hashing), else only when a file's size or mtime differs from its stamp: hashing gigabytes on every
# start is what the stamp saves. A small split is hashed anyway because size and mtime miss a same-size overwrite
# within the file system's mtime granularity, or one whose mtime was put back (cp -p, rsync -t, touch -r).
HASH_ALWAYS_BELOW_BYTES = 64 << 20
_ENCODE_BATCH_DOCS = 256
_COUNT_CHUNK = 1 << 24  # tokens per bincount when counting a split's unigrams


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 halves disk and memory for vocabularies up to 65,536 ids; larger ones need uint32."""
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def id_count(tokenizer: Tokenizer) -> int:
    """The largest id + 1: a foreign tokenizer's added tokens may sit beyond its base vocabulary."""
    return max(tokenizer.get_vocab_size(), max(tokenizer.get_vocab(with_added_tokens=True).values()) + 1)


@dataclass(frozen=True)
class ShardRecord:
    file: str  # the .bin, relative to the split's folder
    first_byte: int  # the byte range of the split's JSONL file it was made from
    end_byte: int
    documents: int
    tokens: int
    sha256: str  # of the .bin


@dataclass(frozen=True)
class SplitShards:
    """A split's record (split.json): what it was made from and its shards, in order."""

    source_sha256: str
    bos_id: int
    eos_id: int
    dtype: str
    shard_bytes: int
    shards: tuple[ShardRecord, ...]

    @property
    def documents(self) -> int:
        return sum(s.documents for s in self.shards)

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.shards)

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, **asdict(self), "documents": self.documents, "tokens": self.tokens},
                          indent=1)

    @classmethod
    def read(cls, path: Path) -> SplitShards | None:
        """The record in `path`, or None when absent, damaged or of another format (the split is then remade)."""
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            if raw.pop("format") != FORMAT:
                return None
            raw.pop("documents"), raw.pop("tokens")
            raw["shards"] = tuple(ShardRecord(**s) for s in raw["shards"])
            return cls(**raw)
        except (OSError, ValueError, KeyError, TypeError):
            return None


class TokenStream:
    """A split's shards as one read-only sequence of token ids: ``len(stream)``, ``stream[a:b]`` (a numpy array, also
    across a shard boundary), ``stream[i]``.

    Reads are positioned reads (`os.pread`) of just the bytes asked for, not a memory map: a mapped shard's pages count
    in the process's resident memory, and the kernel's readahead and fault-around map tens of kilobytes around each
    random window (measured: +0.85 GB of resident file pages in 40 steps over a 2 GB corpus, results/bench/data.md),
    so resident memory would grow with the corpus. Read this way it does not: the page cache keeps the hot pages
    without charging them to the process. Pickling keeps the paths and drops the open files: a DataLoader worker
    process reopens them rather than receiving a copy of the corpus.
    """

    def __init__(self, paths: Sequence[Path], lengths: Sequence[int], dtype: np.dtype | str) -> None:
        self.paths, self.dtype = [Path(p) for p in paths], np.dtype(dtype)
        self.starts = np.cumsum([0, *lengths]).astype(np.int64)
        self._files: list[int | None] = [None] * len(self.paths)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_files": [None] * len(self.paths)}

    def __del__(self) -> None:
        for fd in getattr(self, "_files", []):
            if fd is not None:
                os.close(fd)

    def __len__(self) -> int:
        return int(self.starts[-1])

    @property
    def size(self) -> int:
        return len(self)

    def _pread(self, k: int, first: int, stop: int) -> np.ndarray:
        """Tokens [first, stop) of shard k."""
        if self._files[k] is None:
            try:
                self._files[k] = os.open(self.paths[k], os.O_RDONLY)
            except FileNotFoundError:
                raise DataError(f"{self.paths[k]}: token shard missing (deleted while this run read its data); run the "
                                "same command again: the shard is remade and the run resumes from its last "
                                "checkpoint") from None
        itemsize = self.dtype.itemsize
        data = os.pread(self._files[k], (stop - first) * itemsize, first * itemsize)
        if len(data) != (stop - first) * itemsize:
            raise DataError(f"{self.paths[k]}: shorter than its record (a damaged shard); run `gatelab data prepare "
                            "PRESET` to remake it")
        return np.frombuffer(data, dtype=self.dtype)

    def __getitem__(self, index):
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                raise IndexError("a TokenStream slices with step 1 only")
            return self._read(start, max(start, stop))
        position = int(index) + (len(self) if int(index) < 0 else 0)
        if not 0 <= position < len(self):
            raise IndexError(f"token {index} is outside a stream of {len(self)}")
        return self._read(position, position + 1)[0]

    def _read(self, start: int, stop: int) -> np.ndarray:
        k = max(int(np.searchsorted(self.starts, start, side="right")) - 1, 0)
        pieces = []
        while start < stop and k < len(self.paths):
            offset, end = int(self.starts[k]), min(stop, int(self.starts[k + 1]))
            if end > start:
                pieces.append(self._pread(k, start - offset, end - offset))
                start = end
            k += 1
        if not pieces:
            return np.zeros(0, dtype=self.dtype)
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        whole = self._read(0, len(self))
        return whole if dtype is None else whole.astype(dtype)

    def chunks(self, size: int = _COUNT_CHUNK) -> Iterator[np.ndarray]:
        for k in range(len(self.paths)):
            length = int(self.starts[k + 1] - self.starts[k])
            for first in range(0, length, size):
                yield self._pread(k, first, min(first + size, length))


class DocumentIds(Sequence[str]):
    """A split's document ids, read from the shards' .ids files on first use (training never needs them)."""

    def __init__(self, paths: Sequence[Path], expected: int) -> None:
        self.paths, self.expected, self._ids = list(paths), expected, None

    def _load(self) -> list[str]:
        if self._ids is None:
            try:
                ids = [json.loads(line) for p in self.paths for line in p.read_text(encoding="utf-8").splitlines()]
            except (OSError, ValueError) as exc:
                raise DataError(f"{self.paths[0].parent}: unreadable document ids ({exc}); delete the folder and "
                                "prepare again") from None
            if len(ids) != self.expected:
                raise DataError(f"{self.paths[0].parent}: {len(ids)} document ids for {self.expected} documents (a "
                                "damaged .ids file); delete the folder and prepare again")
            self._ids = ids
        return self._ids

    def __len__(self) -> int:
        return len(self._load())

    def __getitem__(self, index):
        return self._load()[index]


@dataclass(frozen=True)
class LoadedSplit:
    record: SplitShards
    tokens: TokenStream
    doc_starts: np.ndarray  # int64, n_docs + 1 entries over the whole split
    doc_ids: DocumentIds
    unigram_counts: np.ndarray


def _shard_paths(folder: Path, k: int) -> dict[str, Path]:
    stem = folder / f"shard-{k:05d}"
    return {suffix: stem.with_suffix(f".{suffix}") for suffix in ("bin", "npy", "ids", "json")}


def _doc_starts(folder: Path, k: int, shard: ShardRecord) -> np.ndarray | None:
    """Shard k's document starts, or None when its .npy or .ids file is damaged or does not match the shard's record."""
    try:
        starts = np.load(_shard_paths(folder, k)["npy"])
    except FileNotFoundError:
        raise  # named as missing by `load_split`
    except (OSError, ValueError, EOFError):
        return None
    whole = (starts.ndim == 1 and len(starts) == shard.documents + 1 and starts[0] == 0 and starts[-1] == shard.tokens
             and _shard_paths(folder, k)["ids"].read_bytes().count(b"\n") == shard.documents)  # one id a line
    return starts if whole else None


def load_split(folder: Path, source_sha256: str, framing: tuple[int, int], log: Log = print) -> LoadedSplit | None:
    """The split in `folder` when it is whole, unchanged since it was written and made from this text with this
    framing, else None; a split whose files were damaged or deleted after it was written is named in one `log` line
    (the caller remakes it, holding the data directory's lock)."""
    record = SplitShards.read(folder / "split.json")
    if record is None or record.source_sha256 != source_sha256 or (record.bos_id, record.eos_id) != framing:
        return None
    try:
        starts = [_doc_starts(folder, k, s) for k, s in enumerate(record.shards)]
        counts = np.load(folder / "unigram.npy")
        damage = _damage(folder, record, starts)
        damage = damage and f"{damage} (damaged since it was written)"
    except FileNotFoundError as exc:
        damage = f"{exc.filename or folder}: missing (deleted since it was written)"
    except (OSError, ValueError, EOFError) as exc:  # EOFError: np.load of an empty file
        damage = f"{folder}: unreadable ({exc}) (damaged since it was written)"
    if damage is not None:
        log(f"{damage}; remaking it")
        return None
    offsets = np.cumsum([0, *(s.tokens for s in record.shards)])
    doc_starts = np.concatenate([[0], *(part[1:] + offsets[k] for k, part in enumerate(starts))]).astype(np.int64)
    stream = TokenStream([folder / s.file for s in record.shards], [s.tokens for s in record.shards], record.dtype)
    ids = DocumentIds([_shard_paths(folder, k)["ids"] for k in range(len(record.shards))], record.documents)
    return LoadedSplit(record, stream, doc_starts, ids, counts)


# --- checksums ------------------------------------------------------------------------------------------------------


def _split_files(folder: Path, record: SplitShards) -> dict[str, str | None]:
    """{file name: the sha256 its record holds (a shard's .bin), or None (its stamp's is the reference)}."""
    files: dict[str, str | None] = {}
    for k, shard in enumerate(record.shards):
        paths = _shard_paths(folder, k)
        files |= {paths["bin"].name: shard.sha256, paths["npy"].name: None, paths["ids"].name: None}
    return files | {"unigram.npy": None}


def _read_stamps(folder: Path) -> dict[str, list]:
    try:
        stamps = json.loads((folder / STAMPS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return stamps if isinstance(stamps, dict) else {}


def _stamp(path: Path, sha256: str) -> list:
    stat = path.stat()
    return [stat.st_size, stat.st_mtime_ns, sha256]


def _damage(folder: Path, record: SplitShards, starts: list[np.ndarray | None]) -> str | None:
    """What is wrong with the first file of the split that is not as its record says, or None."""
    itemsize = np.dtype(record.dtype).itemsize
    for shard, shard_starts in zip(record.shards, starts, strict=True):
        tokens = folder / shard.file
        if tokens.stat().st_size != shard.tokens * itemsize:
            return f"{tokens}: {tokens.stat().st_size:,} bytes, not the {shard.tokens * itemsize:,} of its record"
        if shard_starts is None:
            return (f"{tokens.with_suffix('.npy')}, {tokens.with_suffix('.ids').name}: not the {shard.documents:,} "
                    "documents of its record")
    return _checksum_damage(folder, record)


def _checksum_damage(folder: Path, record: SplitShards) -> str | None:
    """The first file of the split whose sha256 is not the one recorded when it was written, or None.

    A file is hashed when the split is small (HASH_ALWAYS_BELOW_BYTES says why) or its size or mtime differs from its
    stamp. One without a stamp (a split from before stamps, whose .npy and .ids have no checksum yet) is taken as it is
    and stamped. New stamps are saved where the folder is writable; a read-only cache is hashed again next time.
    """
    stamps = _read_stamps(folder)
    small = record.tokens * np.dtype(record.dtype).itemsize < HASH_ALWAYS_BELOW_BYTES
    checked = {}
    for name, recorded in _split_files(folder, record).items():
        stamp = stamps.get(name)
        stamped = isinstance(stamp, list) and len(stamp) == 3
        now = _stamp(folder / name, stamp[2] if stamped else "")
        if stamped and not small and now == stamp:
            checked[name] = stamp
            continue
        expected = recorded or (stamp[2] if stamped else None)
        digest = sha256_file(folder / name)
        if expected is not None and digest != expected:
            return f"{folder / name}: not the sha256 recorded for it"
        checked[name] = [*now[:2], digest]
    if checked != stamps:
        with suppress(OSError):  # a read-only cache: correct without the stamps, only slower to check
            _atomic_bytes(folder / STAMPS, lambda f: f.write(json.dumps(checked).encode()))
    return None


# --- writing --------------------------------------------------------------------------------------------------------


def _atomic_bytes(path: Path, write: Callable[[object], None]) -> None:
    with replacing(path) as tmp, tmp.open("wb") as f:
        write(f)


def _lines(path: Path, first_byte: int, end_byte: int) -> Iterator[tuple[int, bytes]]:
    """(line number within the range, line) for each line that starts in ``[first_byte, end_byte)``."""
    with path.open("rb") as f:
        f.seek(max(first_byte - 1, 0))
        if first_byte > 0 and f.read(1) != b"\n":
            f.readline()  # the line in progress at first_byte belongs to the shard before
        position = f.tell()
        for number, line in enumerate(iter(f.readline, b"")):
            if position >= end_byte:
                return
            position += len(line)
            yield number, line


def _batches(path: Path, first_byte: int, end_byte: int) -> Iterator[tuple[list[Document], int]]:
    """Documents of the byte range in batches, each with the bytes of JSONL it covered."""
    batch, covered = [], 0
    for number, line in _lines(path, first_byte, end_byte):
        batch.append(Document.from_json(line, f"{path}: line {number + 1} after byte {first_byte}"))
        covered += len(line)
        if len(batch) == _ENCODE_BATCH_DOCS:
            yield batch, covered
            batch, covered = [], 0
    if batch:
        yield batch, covered


class Progress:
    """What `tokenize_corpus` reports as it goes; this one reports nothing (see `prepare.BarProgress` for a bar)."""

    def start(self, total_bytes: int) -> None:
        """`total_bytes` of JSONL text are to be covered, by encoding or by shards already made."""

    def advance(self, documents: int, tokens: int, bytes_: int) -> None:
        """A batch of documents was encoded (or a finished shard or split kept)."""


def _write_shard(encoder: Tokenizer, source: Path, folder: Path, k: int, shard_bytes: int, framing: tuple[int, int],
                 dtype: np.dtype, progress: Progress) -> ShardRecord:
    paths = _shard_paths(folder, k)
    first, end = k * shard_bytes, min((k + 1) * shard_bytes, source.stat().st_size)
    bos, eos = framing
    digest, ids, starts = hashlib.sha256(), [], [0]

    def write_tokens(out) -> None:
        for batch, covered in _batches(source, first, end):
            ids.extend(d.id for d in batch)
            # `Encoding.ids` builds a new list on every access: take each once.
            token_ids = [e.ids for e in encoder.encode_batch([d.text for d in batch], add_special_tokens=False)]
            lengths = np.fromiter((len(t) + 2 for t in token_ids), dtype=np.int64, count=len(token_ids))
            ends = np.cumsum(lengths)
            block = np.empty(int(ends[-1]), dtype=dtype)
            block[ends - lengths], block[ends - 1] = bos, eos
            for doc_tokens, stop in zip(token_ids, ends, strict=True):
                block[stop - len(doc_tokens) - 1 : stop - 1] = doc_tokens
            data = block.tobytes()
            digest.update(data)
            out.write(data)
            starts.extend((ends + starts[-1]).tolist())
            progress.advance(len(batch), len(block), covered)

    _atomic_bytes(paths["bin"], write_tokens)
    _atomic_bytes(paths["npy"], lambda f: np.save(f, np.asarray(starts, dtype=np.int64)))
    _atomic_bytes(paths["ids"], lambda f: f.write("".join(json.dumps(i) + "\n" for i in ids).encode()))
    record = ShardRecord(paths["bin"].name, first, end, len(ids), starts[-1], digest.hexdigest())
    _atomic_bytes(paths["json"], lambda f: f.write(json.dumps(asdict(record)).encode()))  # last: the shard is whole
    return record


def _finished_shard(folder: Path, k: int, shard_bytes: int, itemsize: int, stamps: dict[str, list]
                    ) -> ShardRecord | None:
    """Shard k as an earlier prepare left it, if it finished it and its files still have their sha256 (`write_split`
    has removed the shards of other text, framing or shard size). Always hashed: remaking a shard costs far more."""
    paths = _shard_paths(folder, k)
    try:
        record = ShardRecord(**json.loads(paths["json"].read_text(encoding="utf-8")))
        whole = (record.first_byte == k * shard_bytes and paths["bin"].stat().st_size == record.tokens * itemsize
                 and _doc_starts(folder, k, record) is not None and sha256_file(paths["bin"]) == record.sha256
                 and all(_matches_stamp(paths[suffix], stamps) for suffix in ("npy", "ids")))
    except (OSError, ValueError, TypeError):
        return None
    return record if whole else None


def _matches_stamp(path: Path, stamps: dict[str, list]) -> bool:
    """False only when the file's stamp has a sha256 and the file's is another."""
    stamp = stamps.get(path.name)
    return not (isinstance(stamp, list) and len(stamp) == 3) or sha256_file(path) == stamp[2]


def write_split(tokenizer: Tokenizer, source: Path, source_sha256: str, folder: Path, framing: tuple[int, int],
                shard_bytes: int = SHARD_BYTES, progress: Progress | None = None, log: Log = print) -> LoadedSplit:
    """Tokenize the JSONL split file `source` into shards in `folder`, keeping the shards an interrupted prepare of the
    same text, framing and shard size finished; return the whole split."""
    progress = progress or Progress()
    dtype = token_dtype(id_count(tokenizer))
    # A copy that reads "<|eos|>" written inside a document as plain text, so text can never forge a boundary.
    encoder = Tokenizer.from_str(tokenizer.to_str())
    encoder.encode_special_tokens = True
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "split.json").unlink(missing_ok=True)  # the split is not whole until it is rewritten below
    started = {"source_sha256": source_sha256, "framing": list(framing), "shard_bytes": shard_bytes}
    previous = None
    try:
        previous = json.loads((folder / "started.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        pass
    for partial in folder.glob("*.tmp"):  # a killed prepare's unfinished file (the caller holds the data dir's lock)
        partial.unlink()
    if previous != started:
        for stale in folder.glob("shard-*"):
            stale.unlink()
        _atomic_bytes(folder / "started.json", lambda f: f.write(json.dumps(started).encode()))
    n_shards = max(1, -(-source.stat().st_size // shard_bytes))
    stamps = _read_stamps(folder)
    shards, kept = [], 0
    for k in range(n_shards):
        record = _finished_shard(folder, k, shard_bytes, dtype.itemsize, stamps)
        if record is not None:
            kept += 1
            progress.advance(record.documents, record.tokens, record.end_byte - record.first_byte)
        else:
            record = _write_shard(encoder, source, folder, k, shard_bytes, framing, dtype, progress)
        shards.append(record)
    if kept:
        log(f"{folder.name}: kept {kept} of {n_shards} shards an interrupted prepare had finished")
    stream = TokenStream([folder / s.file for s in shards], [s.tokens for s in shards], dtype)
    counts = np.zeros(id_count(tokenizer), dtype=np.int64)
    for chunk in stream.chunks():
        counts += np.bincount(chunk, minlength=len(counts))[: len(counts)]
    _atomic_bytes(folder / "unigram.npy", lambda f: np.save(f, counts))
    record = SplitShards(source_sha256, framing[0], framing[1], dtype.name, shard_bytes, tuple(shards))
    stamps = {name: _stamp(folder / name, recorded or sha256_file(folder / name))
              for name, recorded in _split_files(folder, record).items()}
    _atomic_bytes(folder / STAMPS, lambda f: f.write(json.dumps(stamps).encode()))
    _atomic_bytes(folder / "split.json", lambda f: f.write(record.to_json().encode()))
    loaded = load_split(folder, source_sha256, framing, log)
    if loaded is None:
        raise DataError(f"{folder}: the shards just written do not read back; check the disk (df -h {folder})")
    return loaded


def write_manifest(directory: Path, tokenizer_fingerprint: str, tokenizer_ids: int, framing: tuple[int, int],
                   sources: dict, splits: dict[tuple[str, str], SplitShards]) -> None:
    """The folder's manifest.json: the tokenizer, the sources, and every split's documents, tokens and shards (with
    their sha256), merged with the splits an earlier prepare recorded here."""
    path = directory / "manifest.json"
    try:
        recorded = json.loads(path.read_text(encoding="utf-8")).get("splits", {})
    except (OSError, ValueError, AttributeError):
        recorded = {}
    for (domain, split), record in splits.items():
        recorded[f"{domain}/{split}"] = json.loads(record.to_json())
    manifest = {"format": FORMAT, "tokenizer": {"fingerprint": tokenizer_fingerprint, "ids": tokenizer_ids,
                                                 "bos_id": framing[0], "eos_id": framing[1]},
                "sources": sources, "splits": dict(sorted(recorded.items()))}
    _atomic_bytes(path, lambda f: f.write(json.dumps(manifest, indent=1).encode()))
