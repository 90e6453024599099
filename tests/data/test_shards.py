"""Token shards (gatelab.data.shards): `TokenStream` reads a split's shards as one array; a `files` corpus prepared into
several shards a split matches a direct `tokenizers` encode (counts, tokens, sha256s in the manifest); a killed prepare
resumes byte-identically; a changed shard size, changed text or damaged shard is remade; a corpus too small for one
window is one message naming data.seq_len; `gatelab data prepare` reports tokens/s and caches."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from gatelab.config import ExperimentConfig
from gatelab.data import shards
from gatelab.data.corpora import CorpusManifest
from gatelab.data.documents import DataError
from gatelab.data.prepare import load_data
from gatelab.data.resolve import experiment_from_dict
from gatelab.data.shards import Progress, SplitShards, TokenStream, load_split
from tests.helpers import MICRO, REPO, gatelab_cli

BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"  # the Llama 3 names: load_foreign_tokenizer finds both
GENRES = ("letters", "poems")
WORDS = ["river", "stone", "lantern", "quiet", "harbour", "orchard", "signal", "meadow", "copper", "window", "the",
         "of", "and", "a", "to", "in", "was", "under", "over", "naïve", "café", "—", "“quoted”", "déjà", "vu", "42",
         "1907"]
QUIET = {"log": lambda *_: None, "warn": lambda *_: None}


# --- a corpus, a tokenizer and an experiment, made here -------------------------------------------------------------


def text(seed: int, words: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choices(WORDS, k=words)) + "."


def rows(n: int, words: int = 60) -> list[dict[str, str]]:
    """n documents in two genres, deterministic: ids doc-00000.., lengths varying around `words` words."""
    return [{"id": f"doc-{i:05d}", "text": f"Document {i}. " + text(i, words + (i * 7) % words),
             "genre": GENRES[i % 2], "year": str(1900 + i % 100)} for i in range(n)]


def write_parquet(path: Path, records: list[dict[str, str]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(records), path)
    return path


def train_tokenizer(path: Path, vocab_size: int = 320) -> Path:
    """A small byte-level BPE whose BOS and EOS are distinct added tokens, saved as a tokenizer.json."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[BOS, EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([text(i, 200) for i in range(50)], trainer=trainer)
    path.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path))
    return path


def data_settings(corpus: Path, tokenizer: Path, data_dir: Path, **changes) -> dict:
    return {"source": "files", "domains": [], "data_dir": str(data_dir), "tokenizer": str(tokenizer), "seq_len": 16,
            "files": {"paths": [str(corpus / "*.parquet")], "id_field": "id", "domain_field": "genre"}, **changes}


def experiment(corpus: Path, tokenizer: Path, data_dir: Path, **changes) -> ExperimentConfig:
    return experiment_from_dict({**MICRO, "data": data_settings(corpus, tokenizer, data_dir, **changes)}, "test")


def write_preset(path: Path, corpus: Path, tokenizer: Path, data_dir: Path, **changes) -> Path:
    path.write_text(yaml.safe_dump({**MICRO, "data": data_settings(corpus, tokenizer, data_dir, **changes)}))
    return path


def token_dir(data_dir: Path) -> Path:
    """<data_dir>/external/files-<key>/tokens/<fingerprint>: the one token folder a prepare made."""
    found = sorted(data_dir.glob("external/*/tokens/*/"))
    assert len(found) == 1, f"expected one token folder under {data_dir}, found {found}"
    return found[0]


def corpus_manifest(data_dir: Path) -> CorpusManifest:
    found = sorted(data_dir.glob("external/*/manifest.json"))
    assert len(found) == 1, found
    return CorpusManifest.load(found[0].parent)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def shard_digests(data_dir: Path) -> dict[str, str]:
    """{domain.split/shard-k.bin: sha256} of every shard under the data directory's token folder."""
    tokens = token_dir(data_dir)
    return {str(p.relative_to(tokens)): sha256(p) for p in sorted(tokens.glob("*/shard-*.bin"))}


def direct_encoding(tokenizer: Path, texts: list[str]) -> list[list[int]]:
    """What the shards should hold, by `tokenizers` alone: the encoder reads special-token text as plain text."""
    encoder = Tokenizer.from_file(str(tokenizer))
    encoder.encode_special_tokens = True
    return [e.ids for e in encoder.encode_batch(texts, add_special_tokens=False)]


def framed(tokenizer: Path, texts: list[str]) -> np.ndarray:
    loaded = Tokenizer.from_file(str(tokenizer))
    bos, eos = loaded.token_to_id(BOS), loaded.token_to_id(EOS)
    return np.asarray([t for ids in direct_encoding(tokenizer, texts) for t in (bos, *ids, eos)], dtype=np.int64)


def stream_values(corpus) -> dict[tuple[str, str], np.ndarray]:
    return {key: np.asarray(split.tokens, dtype=np.int64).copy() for key, split in corpus.splits.items()}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Path:
    return train_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json")


@pytest.fixture
def small_corpus(tmp_path: Path) -> Path:
    """About 60 KB of text in two genres, with a few documents longer than two 5 KiB shards (so some shards hold no
    document start), special-token text inside a document, and non-ASCII text."""
    records = rows(160)
    for i in (3, 8, 13):
        records[i]["text"] = text(1000 + i, 3000)  # ~ 20 KB each
    records[5]["text"] = f"an {EOS} inside {BOS} the text, naïve — “quoted”"
    write_parquet(tmp_path / "corpus" / "part-0.parquet", records[:90])
    write_parquet(tmp_path / "corpus" / "part-1.parquet", records[90:])
    return tmp_path / "corpus"


SMALL_SHARDS = 0.005  # MiB: 5,242 bytes of JSONL a shard


# --- TokenStream ----------------------------------------------------------------------------------------------------


def write_shards(folder: Path, lengths: list[int], dtype: str, seed: int = 0) -> tuple[list[Path], np.ndarray]:
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths, parts = [], []
    for k, length in enumerate(lengths):
        part = rng.integers(0, np.iinfo(dtype).max, size=length, dtype=np.int64).astype(dtype)
        paths.append(folder / f"shard-{k:05d}.bin")
        paths[-1].write_bytes(part.tobytes())
        parts.append(part)
    return paths, np.concatenate(parts)


@pytest.mark.parametrize("dtype", ["uint16", "uint32"])
def test_token_stream_reads_like_the_concatenation_of_its_shards(tmp_path: Path, dtype: str) -> None:
    lengths = [0, 5, 0, 17, 1, 0, 30, 2, 0]  # empty shards first, between and last
    paths, whole = write_shards(tmp_path, lengths, dtype)
    stream = TokenStream(paths, lengths, dtype)
    n = len(whole)
    assert len(stream) == stream.size == n == 55
    for start in range(-n - 3, n + 4):
        for stop in [*range(-n - 3, n + 4), None]:
            got = stream[start:stop]
            assert got.dtype == np.dtype(dtype)
            np.testing.assert_array_equal(got, whole[start:stop], err_msg=f"[{start}:{stop}]")
    np.testing.assert_array_equal(stream[:], whole)
    for i in range(-n, n):
        assert stream[i] == whole[i], i
        assert stream[np.int64(i)] == whole[i]
    for outside in (n, n + 1, -n - 1):
        with pytest.raises(IndexError):
            stream[outside]
    with pytest.raises(IndexError, match="step 1"):
        stream[::2]
    as_array = np.asarray(stream)
    assert as_array.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(as_array, whole)
    np.testing.assert_array_equal(np.asarray(stream, dtype=np.int64), whole.astype(np.int64))
    np.testing.assert_array_equal(np.concatenate(list(stream.chunks(size=4))), whole)


def test_an_empty_token_stream(tmp_path: Path) -> None:
    paths, _ = write_shards(tmp_path, [0, 0], "uint16")
    stream = TokenStream(paths, [0, 0], "uint16")
    assert len(stream) == 0 and stream[0:10].shape == (0,) and np.asarray(stream).shape == (0,)
    with pytest.raises(IndexError):
        stream[0]


def test_a_pickled_token_stream_holds_paths_not_tokens(tmp_path: Path) -> None:
    lengths = [100_000, 0, 70_000, 130_000]
    paths, whole = write_shards(tmp_path, lengths, "uint16", seed=1)
    stream = TokenStream(paths, lengths, "uint16")
    np.testing.assert_array_equal(stream[99_990:170_010], whole[99_990:170_010])  # every non-empty shard opened
    assert [fd is not None for fd in stream._files] == [n > 0 for n in lengths]
    payload = pickle.dumps(stream)
    assert len(payload) < 0.01 * whole.nbytes, f"{len(payload):,} bytes pickled for {whole.nbytes:,} of tokens"
    copy = pickle.loads(payload)
    assert len(copy) == len(whole)
    np.testing.assert_array_equal(np.asarray(copy), whole)
    np.testing.assert_array_equal(copy[99_998:170_003], whole[99_998:170_003])
    assert copy[-1] == whole[-1] and copy[123_456] == whole[123_456]
    np.testing.assert_array_equal(stream[:50], whole[:50])  # the original still reads after pickling


def test_reading_maps_no_shard_into_memory(tmp_path: Path) -> None:
    """Windows are positioned reads: no shard is mapped, so the page cache, not the process, holds what was read."""
    lengths = [50_000, 80_000]
    paths, whole = write_shards(tmp_path, lengths, "uint16", seed=2)
    stream = TokenStream(paths, lengths, "uint16")
    for start in range(0, len(whole) - 300, 997):
        np.testing.assert_array_equal(stream[start : start + 257], whole[start : start + 257])
    maps = Path("/proc/self/maps").read_text()
    assert not any(str(p) in maps for p in paths)


# --- a files corpus prepared into shards ----------------------------------------------------------------------------


def test_manifest_counts_and_digests_match_a_direct_encode(tmp_path: Path, small_corpus: Path, tokenizer: Path) -> None:
    data_dir = tmp_path / "data"
    _, corpus, domains = load_data(experiment(small_corpus, tokenizer, data_dir, shard_mb=SMALL_SHARDS), **QUIET)
    assert domains == list(GENRES)
    tokens = token_dir(data_dir)
    assert tokens == corpus.directory
    manifest = json.loads((tokens / "manifest.json").read_text())
    documents = corpus_manifest(data_dir)
    bos, eos = corpus.bos_id, corpus.eos_id
    loaded = Tokenizer.from_file(str(tokenizer))
    assert (bos, eos) == (loaded.token_to_id(BOS), loaded.token_to_id(EOS)) and bos != eos
    assert manifest["tokenizer"] == {"fingerprint": tokens.name, "ids": loaded.get_vocab_size(), "bos_id": bos,
                                     "eos_id": eos}
    assert sorted(manifest["splits"]) == [f"{d}/{s}" for d in GENRES for s in ("heldout", "train")]
    empty_shards = 0
    for domain in GENRES:
        for split in ("train", "heldout"):
            docs = list(documents.documents(domain, split))
            texts = [d.text for d in docs]
            encoded = direct_encoding(tokenizer, texts)
            record = manifest["splits"][f"{domain}/{split}"]
            assert record["documents"] == len(docs) == sum(s["documents"] for s in record["shards"])
            assert record["tokens"] == sum(len(ids) + 2 for ids in encoded)  # + <bos> and <eos>
            assert record["tokens"] == sum(s["tokens"] for s in record["shards"])
            if split == "train":
                assert len(record["shards"]) >= 3, f"{domain}/{split}: {len(record['shards'])} shard(s)"
            for shard in record["shards"]:
                path = tokens / f"{domain}.{split}" / shard["file"]
                assert sha256(path) == shard["sha256"], path
                assert path.stat().st_size == shard["tokens"] * 2  # uint16 for a 320-id vocabulary
                empty_shards += shard["documents"] == 0
            # The stream itself: each document framed <bos> text <eos>, in the split file's order, ids alongside.
            got = corpus.get(domain, split)
            np.testing.assert_array_equal(np.asarray(got.tokens, dtype=np.int64), framed(tokenizer, texts))
            assert list(got.doc_ids) == [d.id for d in docs]
            np.testing.assert_array_equal(np.diff(got.doc_starts), [len(ids) + 2 for ids in encoded])
            np.testing.assert_array_equal(got.counts(loaded.get_vocab_size()),
                                          np.bincount(framed(tokenizer, texts), minlength=loaded.get_vocab_size()))
    assert empty_shards > 0  # the long documents leave shards in which no document starts
    # Special-token text inside a document is text: never a framing id in the middle of a document.
    where = next((s, list(s.doc_ids).index("doc-00005")) for s in corpus.splits.values() if "doc-00005" in s.doc_ids)
    inside = np.asarray(where[0].document(where[1]), dtype=np.int64)
    assert inside[0] == bos and inside[-1] == eos and bos not in inside[1:-1] and eos not in inside[1:-1]


class Interrupt(Exception):
    pass


class InterruptMidSplit(Progress):
    """Raises (as a kill would end a prepare) inside a shard, once some split is whole and a later one has a finished
    shard: the state a SIGKILL leaves, made deterministic."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir

    def advance(self, documents: int, tokens: int, bytes_: int) -> None:
        folders = [p for p in self.data_dir.glob("external/*/tokens/*/*.*") if p.is_dir()]
        whole = [f for f in folders if (f / "split.json").exists()]
        partial = [f for f in folders if not (f / "split.json").exists() and any(f.glob("shard-*.json"))]
        if whole and partial:
            raise Interrupt(f"{partial[0].name} interrupted")


def test_an_interrupted_prepare_keeps_its_shards_and_ends_identical(tmp_path: Path, small_corpus: Path,
                                                                    tokenizer: Path) -> None:
    config = experiment(small_corpus, tokenizer, tmp_path / "data", shard_mb=SMALL_SHARDS)
    with pytest.raises(Interrupt):
        load_data(config, progress=InterruptMidSplit(tmp_path / "data"), **QUIET)
    tokens = token_dir(tmp_path / "data")
    [interrupted] = interrupted_splits(tmp_path / "data")
    finished_before = {p.name: p.stat().st_mtime_ns for p in interrupted.glob("shard-*.bin")
                       if p.with_suffix(".json").exists()}
    logs: list[str] = []
    load_data(config, log=logs.append, warn=logs.append)
    assert any(f"{interrupted.name}: kept {len(finished_before)} of" in line for line in logs), logs
    assert {p.name: p.stat().st_mtime_ns for p in interrupted.glob("shard-*.bin")
            if p.name in finished_before} == finished_before  # kept, not rewritten
    load_data(experiment(small_corpus, tokenizer, tmp_path / "reference", shard_mb=SMALL_SHARDS), **QUIET)
    assert shard_digests(tmp_path / "data") == shard_digests(tmp_path / "reference")
    for folder in (f for f in token_dir(tmp_path / "reference").iterdir() if f.is_dir()):
        assert (tokens / folder.name / "split.json").read_text() == (folder / "split.json").read_text()


def test_the_manifest_after_an_interrupted_prepare_lists_every_split(tmp_path: Path, small_corpus: Path,
                                                                      tokenizer: Path) -> None:
    config = experiment(small_corpus, tokenizer, tmp_path / "data", shard_mb=SMALL_SHARDS)
    with pytest.raises(Interrupt):
        load_data(config, progress=InterruptMidSplit(tmp_path / "data"), **QUIET)
    load_data(config, **QUIET)
    manifest = json.loads((token_dir(tmp_path / "data") / "manifest.json").read_text())
    assert sorted(manifest["splits"]) == [f"{d}/{s}" for d in GENRES for s in ("heldout", "train")]


def test_a_changed_shard_size_reads_a_finished_split_as_it_is(tmp_path: Path, small_corpus: Path,
                                                               tokenizer: Path) -> None:
    """data.shard_mb applies when a split is made: a finished split's tokens are the same at any shard size."""
    data_dir = tmp_path / "data"
    _, first, _ = load_data(experiment(small_corpus, tokenizer, data_dir, shard_mb=SMALL_SHARDS), **QUIET)
    folder = token_dir(data_dir) / "letters.train"
    record_a = SplitShards.read(folder / "split.json")
    assert record_a.shard_bytes == int(SMALL_SHARDS * (1 << 20)) and len(record_a.shards) >= 3
    logs: list[str] = []
    _, second, _ = load_data(experiment(small_corpus, tokenizer, data_dir, shard_mb=3 * SMALL_SHARDS),
                             log=logs.append, warn=logs.append)
    assert SplitShards.read(folder / "split.json") == record_a
    assert not any(line.startswith("tokenizing") for line in logs), logs
    before, after = stream_values(first), stream_values(second)
    assert before.keys() == after.keys() and all(np.array_equal(before[k], after[k]) for k in before)


def truncate(path: Path, keep: int) -> None:
    with path.open("r+b") as f:
        f.truncate(keep)


@pytest.mark.parametrize("suffix, keep", [
    ("bin", lambda size: size - 2),
    ("npy", lambda size: size // 2),
    ("npy", lambda size: 0),
    ("ids", lambda size: size // 2),
], ids=["bin-truncated", "npy-truncated", "npy-empty", "ids-truncated"])
def test_a_damaged_shard_is_remade(tmp_path: Path, small_corpus: Path, tokenizer: Path, suffix: str, keep) -> None:
    data_dir = tmp_path / "data"
    config = experiment(small_corpus, tokenizer, data_dir, shard_mb=SMALL_SHARDS)
    _, corpus, _ = load_data(config, **QUIET)
    before = stream_values(corpus)
    folder = token_dir(data_dir) / "poems.train"
    record = SplitShards.read(folder / "split.json")
    framing = (record.bos_id, record.eos_id)
    assert load_split(folder, record.source_sha256, framing) is not None
    damaged = (folder / max(record.shards, key=lambda s: s.tokens).file).with_suffix(f".{suffix}")
    digest = sha256(damaged)
    truncate(damaged, keep(damaged.stat().st_size))
    assert load_split(folder, record.source_sha256, framing) is None
    logs: list[str] = []
    _, again, _ = load_data(config, log=logs.append, warn=logs.append)
    said = [line for line in logs if line.endswith("(damaged since it was written); remaking it")]
    assert len(said) == 1 and said[0].startswith(f"{damaged.with_suffix('.bin' if suffix == 'bin' else '.npy')}"), logs
    assert any(line.startswith("tokenizing poems/train") for line in logs), logs
    assert not any(line.startswith("tokenizing letters/") for line in logs), logs  # only the damaged split
    n = len(record.shards)
    assert f"poems.train: kept {n - 1} of {n} shards an interrupted prepare had finished" in logs  # only that shard
    assert sha256(damaged) == digest
    assert load_split(folder, record.source_sha256, framing) is not None
    for key in before:
        np.testing.assert_array_equal(stream_values(again)[key], before[key])


@pytest.mark.parametrize("name", ["bin", "npy", "ids", "unigram.npy"])
def test_a_deleted_shard_file_is_remade_saying_so_where_the_log_is_silenced(tmp_path: Path, small_corpus: Path,
                                                                           tokenizer: Path, name: str) -> None:
    """A `shard-00000.bin` deleted from the data directory is remade, in one line that `gatelab train --quiet` shows
    too (it goes to `warn`, not to the silenced `log`)."""
    config = experiment(small_corpus, tokenizer, tmp_path / "data", shard_mb=SMALL_SHARDS)
    _, corpus, _ = load_data(config, **QUIET)
    before = stream_values(corpus)
    folder = token_dir(tmp_path / "data") / "poems.train"
    deleted = folder / ("unigram.npy" if name == "unigram.npy" else f"shard-00000.{name}")
    digest = sha256(deleted)
    deleted.unlink()
    warnings: list[str] = []
    _, again, _ = load_data(config, log=lambda *_: None, warn=warnings.append)
    assert warnings == [f"{deleted}: missing (deleted since it was written); remaking it"]
    assert sha256(deleted) == digest
    assert all(np.array_equal(stream_values(again)[key], before[key]) for key in before)


def test_a_shard_deleted_while_a_run_reads_its_data_is_one_error_naming_it(tmp_path: Path) -> None:
    paths, _ = write_shards(tmp_path, [10, 10], "uint16")
    stream = TokenStream(paths, [10, 10], "uint16")
    assert len(stream[0:5]) == 5  # the first shard is open now; the second is opened when first read
    paths[1].unlink()
    with pytest.raises(DataError) as raised:
        stream[12:14]
    assert (str(raised.value).startswith(f"{paths[1]}: token shard missing")
            and "same command again" in str(raised.value))


def overwrite_in_place(path: Path, keep_mtime: bool) -> None:
    """Junk over 16 bytes near the end of the file (past an .npy header, before its last value), its size unchanged
    (newlines too, so an .ids file keeps its count of lines); with `keep_mtime`, its modification time put back, as
    `cp -p` or `touch -r` would."""
    stat = path.stat()
    raw = bytearray(path.read_bytes())
    for i in range(max(len(raw) - 24, 0), len(raw) - 8):
        if raw[i] != ord("\n"):
            raw[i] = ord("x") if raw[i] != ord("x") else ord("y")
    path.write_bytes(bytes(raw))
    if keep_mtime:
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def damaged_log(logs: list[str], path: Path) -> bool:
    return f"{path}: not the sha256 recorded for it (damaged since it was written); remaking it" in logs


@pytest.mark.parametrize("name", ["bin", "npy", "ids", "unigram.npy"])
def test_same_size_junk_in_a_small_split_is_found_and_remade(tmp_path: Path, small_corpus: Path, tokenizer: Path,
                                                             name: str) -> None:
    """A small split is hashed on every load: junk of the same size, under the same mtime, is found before training."""
    config = experiment(small_corpus, tokenizer, tmp_path / "data", shard_mb=SMALL_SHARDS)
    _, corpus, _ = load_data(config, **QUIET)
    before = stream_values(corpus)
    folder = token_dir(tmp_path / "data") / "poems.train"
    fullest = max(SplitShards.read(folder / "split.json").shards, key=lambda shard: shard.documents)
    damaged = folder / ("unigram.npy" if name == "unigram.npy" else Path(fullest.file).with_suffix(f".{name}"))
    digest = sha256(damaged)
    overwrite_in_place(damaged, keep_mtime=True)
    logs: list[str] = []
    _, again, _ = load_data(config, log=logs.append, warn=logs.append)
    assert damaged_log(logs, damaged), logs
    assert sha256(damaged) == digest
    assert all(np.array_equal(stream_values(again)[key], before[key]) for key in before)
    np.testing.assert_array_equal(again.get("poems", "train").unigram_counts, corpus.get("poems", "train").counts(320))


def test_a_large_split_is_hashed_only_where_a_file_changed(tmp_path: Path, small_corpus: Path, tokenizer: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shards, "HASH_ALWAYS_BELOW_BYTES", 0)  # every split is "large"
    hashed: list[str] = []
    real_sha256 = shards.sha256_file
    monkeypatch.setattr(shards, "sha256_file", lambda path: hashed.append(path.name) or real_sha256(path))
    config = experiment(small_corpus, tokenizer, tmp_path / "data", shard_mb=SMALL_SHARDS)
    _, corpus, _ = load_data(config, **QUIET)
    before = stream_values(corpus)
    folder = token_dir(tmp_path / "data") / "poems.train"
    hashed.clear()
    load_data(config, **QUIET)
    assert hashed == []  # sizes and mtimes as stamped: nothing to hash

    damaged = folder / max(SplitShards.read(folder / "split.json").shards, key=lambda shard: shard.tokens).file
    overwrite_in_place(damaged, keep_mtime=False)
    logs: list[str] = []
    _, again, _ = load_data(config, log=logs.append, warn=logs.append)
    assert damaged_log(logs, damaged), logs
    assert all(np.array_equal(stream_values(again)[key], before[key]) for key in before)

    (folder / "stamps.json").unlink()  # a split made before stamps: hashed once, then stamped
    hashed.clear()
    load_data(config, **QUIET)
    assert sorted(hashed) == sorted(p.name for p in folder.iterdir() if p.suffix in (".bin", ".npy", ".ids"))
    hashed.clear()
    load_data(config, **QUIET)
    assert hashed == []


def test_a_damaged_shard_an_interrupted_prepare_finished_is_remade(tmp_path: Path, small_corpus: Path,
                                                                    tokenizer: Path) -> None:
    config = experiment(small_corpus, tokenizer, tmp_path / "data", shard_mb=SMALL_SHARDS)
    with pytest.raises(Interrupt):
        load_data(config, progress=InterruptMidSplit(tmp_path / "data"), **QUIET)
    [interrupted] = interrupted_splits(tmp_path / "data")
    finished = sorted(p.with_suffix(".bin") for p in interrupted.glob("shard-*.json"))
    overwrite_in_place(max(finished, key=lambda path: path.stat().st_size), keep_mtime=True)
    logs: list[str] = []
    load_data(config, log=logs.append, warn=logs.append)
    assert any(f"{interrupted.name}: kept {len(finished) - 1} of" in line for line in logs), logs
    load_data(experiment(small_corpus, tokenizer, tmp_path / "reference", shard_mb=SMALL_SHARDS), **QUIET)
    assert shard_digests(tmp_path / "data") == shard_digests(tmp_path / "reference")


# --- a corpus too small for one window ------------------------------------------------------------------------------


@pytest.fixture
def tiny_corpus(tmp_path: Path) -> Path:
    records = [{"id": f"t-{i:02d}", "text": f"word {i}", "genre": GENRES[i % 2]} for i in range(30)]
    return write_parquet(tmp_path / "tiny" / "part-0.parquet", records).parent


@pytest.mark.parametrize("seq_len, start", [
    (512, "data.seq_len 512: the training text holds no window of 513 tokens ("),
    (50, "data.seq_len 50: the held-out text of letters, poems holds no window of 51 tokens ("),
], ids=["train", "heldout"])
def test_text_too_small_for_seq_len_is_one_message(tmp_path: Path, tiny_corpus: Path, tokenizer: Path, seq_len: int,
                                                   start: str) -> None:
    config = experiment(tiny_corpus, tokenizer, tmp_path / "data", seq_len=seq_len)
    with pytest.raises(DataError) as caught:
        load_data(config, **QUIET)
    message = str(caught.value)
    assert message.startswith(start) and "\n" not in message, message
    assert "lower data.seq_len" in message
    _, corpus, domains = load_data(config.model_copy(update={"data": config.data.model_copy(update={"seq_len": 8})}),
                                   **QUIET)  # the same text, a window that fits: no error
    assert domains == list(GENRES) and len(corpus.tokens("letters", "heldout")) < 51 <= len(
        corpus.tokens("letters", "train"))


@pytest.mark.slow
def test_cli_train_on_too_little_text_exits_2_before_a_run_folder(tmp_path: Path, tiny_corpus: Path,
                                                                   tokenizer: Path) -> None:
    preset = write_preset(tmp_path / "tiny.yaml", tiny_corpus, tokenizer, tmp_path / "data", seq_len=512)
    runs = tmp_path / "runs"
    result = gatelab_cli("train", str(preset), "--quiet", "--runs-dir", str(runs), cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: data.seq_len 512: the training text holds no window"), lines
    assert not runs.exists(), sorted(p.relative_to(runs) for p in runs.rglob("*"))  # no run folder, no MLflow store


# --- gatelab data prepare, as a user runs it ------------------------------------------------------------------------


@pytest.mark.slow
def test_cli_prepare_reports_tokens_per_second_then_caches(tmp_path: Path, small_corpus: Path,
                                                           tokenizer: Path) -> None:
    preset = write_preset(tmp_path / "files.yaml", small_corpus, tokenizer, tmp_path / "elsewhere")
    data_dir = tmp_path / "data"
    first = gatelab_cli("data", "prepare", str(preset), "--set", f"data.shard_mb={SMALL_SHARDS}",
                        "--data-dir", str(data_dir), cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    assert not (tmp_path / "elsewhere").exists()  # --data-dir wins over the preset's
    rates = [line for line in first.stdout.splitlines() if line.rstrip().endswith("tokens/s)")]
    assert len(rates) == 4, first.stdout  # one a split: letters and poems, train and heldout
    assert sum(line.startswith("tokenizing ") for line in first.stdout.splitlines()) == 4, first.stdout
    stamps = {p: p.stat().st_mtime_ns for p in token_dir(data_dir).rglob("*") if p.is_file()}
    assert any(p.name == "shard-00002.bin" for p in stamps)

    second = gatelab_cli("data", "prepare", str(preset), "--set", f"data.shard_mb={SMALL_SHARDS}",
                         "--data-dir", str(data_dir), cwd=tmp_path)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "tokenizing" not in second.stdout and "tokens/s" not in second.stdout, second.stdout
    assert "tokens: letters" in second.stdout  # the cached streams are still reported
    assert {p: p.stat().st_mtime_ns for p in token_dir(data_dir).rglob("*") if p.is_file()} == stamps


def big_corpus(folder: Path, megabytes: float) -> Path:
    """Deterministic text, about `megabytes` MB in one parquet file, one genre (one long training split first)."""
    records, size, i = [], 0, 0
    while size < megabytes * 1e6:
        body = text(i, 150)
        records.append({"id": f"big-{i:06d}", "text": body, "genre": "letters"})
        size += len(body)
        i += 1
    return write_parquet(folder / "part-0.parquet", records).parent


def prepare_command(preset: Path, data_dir: Path) -> list[str]:
    return [sys.executable, "-m", "gatelab", "data", "prepare", str(preset), "--data-dir", str(data_dir)]


def interrupted_splits(data_dir: Path, shards: int = 1) -> list[Path]:
    """Split folders with `shards` finished shards or more but no split.json: a prepare is (or was) inside them."""
    return [f for f in data_dir.glob("external/*/tokens/*/*.*")
            if f.is_dir() and not (f / "split.json").exists() and len(list(f.glob("shard-*.json"))) >= shards]


@pytest.mark.slow
def test_sigkilled_prepare_resumes_byte_identical(tmp_path: Path, tokenizer: Path) -> None:
    corpus = big_corpus(tmp_path / "big", megabytes=4)
    preset = write_preset(tmp_path / "big.yaml", corpus, tokenizer, tmp_path / "unused", shard_mb=0.02)
    data_dir = tmp_path / "data"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    killed_log = tmp_path / "killed.log"
    with killed_log.open("w") as out:
        process = subprocess.Popen(prepare_command(preset, data_dir), cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                   env=env)
        deadline = time.monotonic() + 300
        try:
            while not interrupted_splits(data_dir, shards=8):  # of about 200 in the training split
                if process.poll() is not None:
                    pytest.fail(f"prepare ended (exit {process.returncode}) before shards were seen mid-split: the "
                                f"kill came too late; grow the corpus. Output:\n{killed_log.read_text()}")
                if time.monotonic() > deadline:
                    pytest.fail(f"no split with 8 finished shards in 300 s. Output:\n{killed_log.read_text()}")
                time.sleep(0.005)
            process.send_signal(signal.SIGKILL)
        finally:
            process.kill()
            process.wait()
    assert process.returncode == -signal.SIGKILL
    left = interrupted_splits(data_dir)
    if not left:
        pytest.fail("the SIGKILL landed after the split was finished (no split left with finished shards and no "
                    "split.json): the test would pass vacuously; grow the corpus")
    finished = len(list(left[0].glob("shard-*.json")))

    resumed = subprocess.run(prepare_command(preset, data_dir), cwd=REPO, capture_output=True, text=True, env=env,
                             timeout=600, check=False)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    kept = [line for line in resumed.stdout.splitlines() if "kept" in line]
    assert kept and kept[0].startswith(f"{left[0].name}: kept "), resumed.stdout
    assert int(kept[0].split("kept ")[1].split()[0]) == finished  # every shard finished before the kill, no other
    assert (left[0] / "split.json").exists()

    logs: list[str] = []  # an uninterrupted prepare of the same corpus, here, into another data directory
    load_data(experiment(corpus, tokenizer, tmp_path / "reference", shard_mb=0.02), log=logs.append,
              warn=logs.append)
    assert not any("kept" in line for line in logs), logs
    resumed_digests, reference_digests = shard_digests(data_dir), shard_digests(tmp_path / "reference")
    assert len(reference_digests) > 100  # 4 MB of text in shards of 0.02 MiB
    assert resumed_digests == reference_digests
