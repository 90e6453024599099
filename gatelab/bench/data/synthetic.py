"""Part 2's corpus: about 1e9 synthetic tokens written once (cached) in the exact layout of `gatelab.data.shards`
(uint16 shards with their .npy/.ids/.json, unigram.npy, split.json, manifest.json), documents of 2,048-8,192 tokens
drawn from a Zipf-like unigram distribution, read back as a `TokenCorpus` through `shards.load_split`."""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import numpy as np

from gatelab.bench.data.system import atomic_write
from gatelab.data.datasets import TokenCorpus, TokenSplit
from gatelab.data.shards import SHARD_BYTES, ShardRecord, SplitShards, load_split, write_manifest
from gatelab.errors import GatelabError

Log = Callable[[str], None]

SYNTH_DOMAIN = "synth"
SYNTH_FORMAT = 1
SYNTH_FRAMING = (0, 1)  # <|bos|>, <|eos|> of gatelab's trained BPE; id 2 (<|pad|>) never appears in text
SYNTH_SPEC_FILE = "synthetic.json"  # written last: the corpus is whole
_WRITE_CHUNK_TOKENS = 1 << 22  # tokens generated and written at a time (8 MiB of uint16)


def _skewed_table(vocab: int, first_id: int = 3, exponent: float = 1.0) -> np.ndarray:
    """65,536 entries of ids in [first_id, vocab): a uniform uint16 indexes it to draw a Zipf-like token."""
    ranks = np.arange(1, vocab - first_id + 1, dtype=np.float64)
    cdf = np.cumsum(1 / (ranks + 2.7) ** exponent)
    cdf /= cdf[-1]
    picks = np.searchsorted(cdf, (np.arange(1 << 16) + 0.5) / (1 << 16))
    return (first_id + np.minimum(picks, len(ranks) - 1)).astype(np.uint16)


def _doc_lengths(rng: np.random.Generator, total: int, low: int = 2048, high: int = 8192) -> np.ndarray:
    """Document lengths (framing included) of `low`..`high` tokens summing to `total` exactly."""
    lengths = rng.integers(low, high + 1, size=total // low + 2)
    ends = np.cumsum(lengths)
    count = int(np.searchsorted(ends, total)) + 1
    lengths = lengths[:count].copy()
    lengths[-1] = total - (int(ends[count - 2]) if count > 1 else 0)
    if lengths[-1] < 3 and count > 1:  # too short to hold <bos> x <eos>: folded into the one before
        lengths[-2] += lengths[-1]
        lengths = lengths[:-1]
    return lengths.astype(np.int64)


def _write_synthetic_split(folder: Path, split: str, tokens: int, spec: dict, source_sha256: str, log: Log):
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    vocab, framing = spec["vocab"], SYNTH_FRAMING
    rng = np.random.default_rng([spec["seed"], 0 if split == "train" else 1])
    table = _skewed_table(vocab)
    counts = np.zeros(vocab, dtype=np.int64)
    n_shards = max(1, math.ceil(tokens / spec["shard_tokens"]))
    per_shard = math.ceil(tokens / n_shards)
    records, doc_number, started = [], 0, time.perf_counter()
    for k in range(n_shards):
        lengths = _doc_lengths(rng, min(per_shard, tokens - k * per_shard))
        ends = np.cumsum(lengths)
        stem = folder / f"shard-{k:05d}"
        digest = hashlib.sha256()
        with stem.with_suffix(".bin.tmp").open("wb") as out:
            first_doc = 0
            while first_doc < len(lengths):  # whole documents, about _WRITE_CHUNK_TOKENS at a time
                base = int(ends[first_doc - 1]) if first_doc else 0
                last_doc = max(first_doc + 1, int(np.searchsorted(ends, base + _WRITE_CHUNK_TOKENS, side="right")))
                chunk_ends = ends[first_doc:last_doc] - base
                block = table[rng.integers(0, 1 << 16, size=int(chunk_ends[-1]), dtype=np.uint16)]
                block[chunk_ends - lengths[first_doc:last_doc]], block[chunk_ends - 1] = framing
                digest.update(block)
                out.write(memoryview(block))
                counts += np.bincount(block, minlength=vocab)[:vocab]
                first_doc = last_doc
        os.replace(stem.with_suffix(".bin.tmp"), stem.with_suffix(".bin"))
        starts = np.concatenate([[0], ends]).astype(np.int64)
        npy_tmp = stem.with_suffix(".npy.tmp")
        with npy_tmp.open("wb") as f:
            np.save(f, starts)
        os.replace(npy_tmp, stem.with_suffix(".npy"))
        ids = "".join(json.dumps(f"{SYNTH_DOMAIN}-{split}-{doc_number + i:09d}") + "\n" for i in range(len(lengths)))
        atomic_write(stem.with_suffix(".ids"), ids.encode())
        doc_number += len(lengths)
        record = ShardRecord(f"shard-{k:05d}.bin", k * SHARD_BYTES, (k + 1) * SHARD_BYTES, len(lengths),
                             int(ends[-1]), digest.hexdigest())
        atomic_write(stem.with_suffix(".json"), json.dumps(asdict(record)).encode())  # last: the shard is whole
        records.append(record)
        if n_shards > 4 and (k + 1) % max(1, n_shards // 8) == 0:
            done = sum(r.tokens for r in records)
            log(f"  {split}: {k + 1}/{n_shards} shards, {done:,} tokens, "
                f"{done / (time.perf_counter() - started):,.0f} tokens/s written")
    buffer = folder / "unigram.npy.tmp"
    with buffer.open("wb") as f:
        np.save(f, counts)
    os.replace(buffer, folder / "unigram.npy")
    shards = SplitShards(source_sha256, *framing, "uint16", SHARD_BYTES, tuple(records))
    atomic_write(folder / "split.json", shards.to_json().encode())
    return shards


def synthetic_spec(tokens: int, heldout_tokens: int, vocab: int = 4096, seed: int = 0,
                   shard_tokens: int = 1 << 24) -> dict:
    return {"format": SYNTH_FORMAT, "tokens": tokens, "heldout_tokens": heldout_tokens, "vocab": vocab, "seed": seed,
            "shard_tokens": shard_tokens, "doc_tokens": [2048, 8192], "distribution": "zipf(1.0, +2.7) over ids 3.."}


def _split_sha(spec: dict, split: str) -> str:
    return hashlib.sha256(json.dumps({**spec, "split": split}, sort_keys=True).encode()).hexdigest()


def load_synthetic(folder: Path):
    """The synthetic corpus in `folder` as a `TokenCorpus` (memory-mapped), or None unless it is whole."""
    try:
        spec = json.loads((folder / SYNTH_SPEC_FILE).read_text())
    except (OSError, ValueError):
        return None
    splits = {}
    for split, tokens in (("train", spec["tokens"]), ("heldout", spec["heldout_tokens"])):
        loaded = load_split(folder / f"{SYNTH_DOMAIN}.{split}", _split_sha(spec, split), SYNTH_FRAMING)
        if loaded is None or loaded.record.tokens != tokens:
            return None
        splits[(SYNTH_DOMAIN, split)] = TokenSplit(SYNTH_DOMAIN, split, loaded.tokens, loaded.doc_starts,
                                                   loaded.doc_ids, loaded.unigram_counts)
    return TokenCorpus(folder, spec["vocab"], *SYNTH_FRAMING, splits)


def write_synthetic(folder: Path, spec: dict, log: Log = print) -> dict:
    """The synthetic corpus of `spec` in `folder`, written unless it is there and whole; what it took."""
    try:
        if json.loads((folder / SYNTH_SPEC_FILE).read_text()) == spec and load_synthetic(folder) is not None:
            return {"cached": True, "seconds": 0.0}
    except (OSError, ValueError):
        pass
    need = 2 * (spec["tokens"] + spec["heldout_tokens"])
    folder.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(folder).free
    if free < need * 1.2 + (1 << 30):
        raise GatelabError(f"{folder}: {free / 1e9:.1f} GB free, the synthetic corpus needs {need / 1e9:.1f} GB; "
                           "give --scratch a folder on a bigger disk")
    (folder / SYNTH_SPEC_FILE).unlink(missing_ok=True)
    log(f"writing a synthetic corpus of {spec['tokens']:,} tokens ({need / 1e9:.2f} GB, uint16) in {folder}")
    started = time.perf_counter()
    records = {}
    for split, tokens in (("train", spec["tokens"]), ("heldout", spec["heldout_tokens"])):
        records[(SYNTH_DOMAIN, split)] = _write_synthetic_split(folder / f"{SYNTH_DOMAIN}.{split}", split, tokens,
                                                                spec, _split_sha(spec, split), log)
    write_manifest(folder, "synthetic", spec["vocab"], SYNTH_FRAMING,
                   {"synthetic": {"version": json.dumps(spec, sort_keys=True), "artifacts": []}}, records)
    atomic_write(folder / SYNTH_SPEC_FILE, json.dumps(spec, sort_keys=True).encode())
    seconds = time.perf_counter() - started
    log(f"  written in {seconds:.1f} s ({need / 1e6 / seconds:,.0f} MB/s)")
    return {"cached": False, "seconds": seconds}


def shard_paths(corpus) -> list[Path]:
    """The shard files of every split of a corpus read through `TokenStream`s."""
    return [Path(p) for split in corpus.splits.values() for p in getattr(split.tokens, "paths", [])]
