"""`gatelab bench --data`: what gatelab's data path costs, measured side by side with the bare alternative.

A benchmark, not a test: it prints figures and writes a markdown report; the targets are listed with the measured
figure and whether it holds, whatever the outcome.

1. Tokenizing. Real text (the prepared built-in corpora found in the data directory, then the running Python's own
   ``.py`` files until the size asked for) is written as parquet shards with ``id`` and ``text`` columns, and a
   byte-level BPE is trained on a sample of it into a tokenizer.json. gatelab's whole prepare (`prepare.load_data` with
   ``data.source: files`` and ``data.tokenizer: <that tokenizer.json>``: parquet rows to JSONL split files, then token
   shards) is timed, and so is its tokenize stage alone (`shards.write_split` of every split, timed by the lines
   `datasets.tokenize_corpus` logs around it). The bare rate is a ``Tokenizer.encode_batch`` loop (256 documents a
   batch, ``add_special_tokens=False``) over the very texts gatelab tokenized, read back into memory first. The bare
   loop and gatelab's tokenize stage (its token cache removed each time) are interleaved, round after round, in one
   process: this machine's speed drifts (other work shares its cores) by more than the difference measured.
2. Reading at scale. A synthetic corpus of about 1e9 tokens is written once (cached) in the exact layout of
   `gatelab.data.shards` (uint16 shards with their .npy/.ids/.json, unigram.npy, split.json, manifest.json), documents of
   2,048-8,192 tokens drawn from a Zipf-like unigram distribution, and read back as a `TokenCorpus` through
   `shards.load_split`. The windows/s that `StepBatches` delivers (directly, and through a DataLoader with 0 and 2
   worker processes; with the shards in the page cache, and evicted from it, checked with mincore) are set against
   the windows/s the tiny preset's model consumes when training in fp32 on this CPU. Then a short Lightning training
   (`TextData`, `GatedLM`, a `lightning.Trainer` without logger or checkpoints) runs in a child process per corpus and
   page-cache state (the 1e9-token corpus evicted, and a fresh copy of it as a prepare leaves it; a small corpus of the
   same form; the real tiny corpus where it is prepared), each reporting its own peak RSS (VmHWM).

Beside gatelab's reader the bench sets a memory-mapped one (`MemmapStream`, how `TokenStream` read before it took
positioned reads), in the loader table, in one peak-RSS child and in a probe of how many resident MB a random window
maps: on kernels that cache files in large folios and map a whole folio on a fault, a mapped window can cost up to
2 MB of RSS, so a mapping reader's RSS grows with the part of the corpus it has touched.

Part 1 also replays `shards._write_shard`'s steps one at a time (where the tokenize stage's time goes), and runs
`write_split` and the bare loop in short back-to-back pairs on a 3 MB slice, which see nearly the same machine load
where whole passes a minute apart do not.
"""

from __future__ import annotations

import gc
import hashlib
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from gatelab.errors import GatelabError

Log = Callable[[str], None]

SYNTH_DOMAIN = "synth"
SYNTH_FORMAT = 1
SYNTH_FRAMING = (0, 1)  # <|bos|>, <|eos|> of gatelab's trained BPE; id 2 (<|pad|>) never appears in text
SYNTH_SPEC_FILE = "synthetic.json"  # written last: the corpus is whole
_WRITE_CHUNK_TOKENS = 1 << 22  # tokens generated and written at a time (8 MiB of uint16)
_BATCH_DOCS = 256  # documents per encode_batch call, as `shards._ENCODE_BATCH_DOCS`
_TOKENIZE_LINE = re.compile(r"([\d,]+) documents, ([\d,]+) tokens in (\d+) shard\(s\), ([\d.]+) s \(([\d,]+) tokens/s\)")


@dataclass(frozen=True)
class Sizes:
    """How big each measurement is; `QUICK` is for tests and a first look."""

    text_mb: float = 32.0  # real text to tokenize
    vocab: int = 4096  # the BPE trained for part 1 (tiny.yaml's model.vocab_size)
    rounds: int = 3  # interleaved rounds of (bare loop, gatelab tokenize stage) after the first whole prepare
    paired_mb: float = 3.0  # then write_split and the bare loop on one slice of this size, alternated in pairs:
    pairs: int = 8  # short pairs see the same machine load, where a whole pass each does not
    large_tokens: int = 1_000_000_000
    small_tokens: int = 8_000_000
    heldout_tokens: int = 1_000_000
    shard_tokens: int = 1 << 24  # about 64 MiB of JSONL text, as gatelab's default data.shard_mb
    loader_batches: int = 400  # batches per warm loader measurement
    cold_batches: int = 150
    train_warmup: int = 2
    train_steps: int = 6
    rss_steps: int = 30
    tiny: bool = True  # also the real tiny corpus for the peak-RSS comparison


QUICK = Sizes(text_mb=1.0, rounds=1, paired_mb=0.3, pairs=2, large_tokens=16_000_000, small_tokens=2_000_000,
              heldout_tokens=200_000, shard_tokens=1 << 22, loader_batches=60, cold_batches=30, train_warmup=1,
              train_steps=2, rss_steps=4, tiny=False)


@dataclass
class DataBenchReport:
    machine: dict
    sizes: dict
    command: str = ""
    scratch: str = ""
    tokenize: dict = field(default_factory=dict)
    scale: dict = field(default_factory=dict)
    checks: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0


# --- helpers --------------------------------------------------------------------------------------------------------


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def _status_kb(key: str) -> float | None:
    try:
        text = Path("/proc/self/status").read_text()
        return float(text.split(f"{key}:")[1].split()[0])
    except (OSError, IndexError, ValueError):
        return None


# --- part 1: tokenizing ---------------------------------------------------------------------------------------------


def real_texts(target_bytes: int, data_dir: Path | None = None) -> Iterator[tuple[str, str, str]]:
    """(source, id, text) of real text, `target_bytes` of UTF-8 in all: the built-in corpora already prepared in the
    data directory (nothing is fetched), then the running Python's standard-library .py files (site-packages and tests
    included), in sorted order."""
    import sysconfig

    from gatelab.data.corpora import CorpusManifest, default_data_dir

    total = 0
    try:
        manifest = CorpusManifest.load(data_dir or default_data_dir())
        domains = [d for d in manifest.available_domains if manifest.is_valid(d)]
    except Exception:  # noqa: BLE001  no prepared corpora, or a damaged manifest: the stdlib alone will do
        manifest, domains = None, []
    for domain in domains:
        for split in ("train", "heldout"):
            for doc in manifest.documents(domain, split):
                if total >= target_bytes:
                    return
                total += len(doc.text.encode())
                yield domain, f"{domain}/{doc.id}", doc.text
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):
        if total >= target_bytes:
            return
        try:
            text = path.read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if text.strip():
            total += len(text.encode())
            yield "python .py files", f"py/{path.relative_to(root).as_posix()}", text


def write_text_corpus(folder: Path, target_mb: float, log: Log = print) -> dict:
    """Parquet shards (``id``, ``text``) of about `target_mb` MB of real text in `folder`, made once; their make-up."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    spec = {"format": 1, "target_mb": target_mb}
    record_path = folder / "corpus.json"
    try:
        record = json.loads(record_path.read_text())
        if record["spec"] == spec and all((folder / f).is_file() for f in record["files"]):
            return record
    except (OSError, ValueError, KeyError):
        pass
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    log(f"writing {target_mb:g} MB of real text as parquet shards in {folder}")
    files, ids, texts, pending, by_source, documents = [], [], [], 0, {}, 0

    def flush() -> None:
        nonlocal ids, texts, pending
        name = f"part-{len(files):04d}.parquet"
        pq.write_table(pa.table({"id": ids, "text": texts}), folder / name)
        files.append(name)
        ids, texts, pending = [], [], 0

    for source, doc_id, text in real_texts(int(target_mb * 1e6)):
        ids.append(doc_id)
        texts.append(text)
        size = len(text.encode())
        pending += size
        documents += 1
        by_source[source] = by_source.get(source, 0) + size
        if pending >= 8_000_000:
            flush()
    if ids:
        flush()
    record = {"spec": spec, "files": files, "documents": documents, "bytes": sum(by_source.values()),
              "mb_by_source": {k: round(v / 1e6, 2) for k, v in by_source.items()}}
    _atomic_write(record_path, json.dumps(record, indent=1).encode())
    return record


TOKENIZER_SAMPLE_BYTES = 4_000_000


def make_tokenizer(folder: Path, parquet: list[Path], vocab: int, sample_bytes: int = TOKENIZER_SAMPLE_BYTES) -> Path:
    """A byte-level BPE of `vocab` tokens, gatelab's own trainer and settings, trained on the first `sample_bytes` of
    the corpus; saved once as tokenizer.json."""
    import pyarrow.parquet as pq

    from gatelab.data.tokenizer import _train_tokenizer

    path = folder / f"bpe-{vocab}" / "tokenizer.json"
    if path.is_file():
        return path

    def sample() -> Iterator[str]:
        left = sample_bytes
        for file in parquet:
            for text in pq.read_table(file, columns=["text"]).column("text").to_pylist():
                if left <= 0:
                    return
                yield text[:left]
                left -= len(text)

    tokenizer = _train_tokenizer(sample(), vocab)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"tokenizer.{os.getpid()}.tmp")
    tokenizer.save(str(tmp))
    os.replace(tmp, path)
    return path


class _TimedLog:
    """Collects a prepare's log lines with the wall and CPU time (all threads) at which each was said."""

    def __init__(self) -> None:
        self.lines: list[tuple[float, float, str]] = []

    def __call__(self, message: str) -> None:
        self.lines.append((time.perf_counter(), time.process_time(), str(message)))

    def tokenize_stage(self) -> dict:
        """Wall and CPU seconds between each "tokenizing X into" line and the figures line after it (exactly the
        `write_split` call), summed over splits, with the documents and tokens those lines report."""
        seconds = cpu_s = documents = tokens = reported_s = 0.0
        splits = 0
        started = None
        for at, cpu, line in self.lines:
            if line.startswith("tokenizing "):
                started = (at, cpu)
            match = _TOKENIZE_LINE.search(line)
            if match and started is not None:
                seconds += at - started[0]
                cpu_s += cpu - started[1]
                documents += int(match[1].replace(",", ""))
                tokens += int(match[2].replace(",", ""))
                reported_s += float(match[4])
                splits += 1
                started = None
        return {"seconds": seconds, "cpu_s": cpu_s, "documents": int(documents), "tokens": int(tokens),
                "splits": splits, "logged_seconds": reported_s,
                "logged_lines": [line for _, _, line in self.lines if _TOKENIZE_LINE.search(line)]}


def _files_experiment(parquet_glob: str, tokenizer: Path, data_dir: Path, vocab: int):
    from gatelab.config import experiment_from_dict, read_yaml
    from gatelab.host import repo_root

    raw = read_yaml(repo_root() / "experiments" / "tiny.yaml")
    raw["model"]["vocab_size"] = vocab
    raw["data"] = {"source": "files", "files": {"paths": [parquet_glob], "id_field": "id", "text_field": "text",
                                                "domain": "text"},
                   "tokenizer": str(tokenizer), "data_dir": str(data_dir), "seq_len": raw["data"]["seq_len"]}
    return experiment_from_dict(raw, "tiny.yaml with data.source: files")


def gatelab_prepare(experiment, whole: bool) -> dict:
    """One `load_data`: with `whole`, from parquet (its source folder removed first), else the tokenize stage alone
    (only the token cache removed)."""
    from gatelab.data.external import corpus_dir
    from gatelab.data.prepare import load_data

    root = corpus_dir(experiment.data)
    shutil.rmtree(root if whole else root / "tokens", ignore_errors=True)
    log = _TimedLog()
    gc.collect()
    started, cpu = time.perf_counter(), time.process_time()
    _, corpus, domains = load_data(experiment, log=log, warn=log)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    stage = log.tokenize_stage()
    return {"whole": whole, "wall_s": wall, "cpu_s": cpu, "tokenize": stage, "root": str(root),
            "tokens_in_corpus": sum(len(s.tokens) for s in corpus.splits.values()), "domains": domains}


def corpus_texts(root: Path) -> list[str]:
    """Every document's text in the split files gatelab tokenized, in their order."""
    from gatelab.data.corpora import CorpusManifest

    manifest = CorpusManifest.load(root)
    return [doc.text for domain in manifest.available_domains for split in ("train", "heldout")
            for doc in manifest.documents(domain, split)]


def bare_encode(tokenizer, texts: list[str]) -> dict:
    """A plain `encode_batch` loop, 256 documents a batch, over texts already in memory."""
    gc.collect()
    started, cpu = time.perf_counter(), time.process_time()
    tokens = 0
    for first in range(0, len(texts), _BATCH_DOCS):
        tokens += sum(len(e) for e in tokenizer.encode_batch(texts[first:first + _BATCH_DOCS],
                                                             add_special_tokens=False))
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "cpu_s": time.process_time() - cpu, "tokens": tokens, "documents": len(texts)}


def tokenize_profile(tokenizer, jsonl: Path, max_bytes: int = 6_000_000) -> dict:
    """Seconds of each stage of `shards._write_shard`, replayed stage by stage on the documents in the first
    `max_bytes` of one split file: reading lines and parsing their JSON (gatelab's own reader), encoding, assembling the
    framed uint16 block (three `Encoding.ids` reads a document), sha256 and writing, and the unigram count."""
    import tempfile

    from tokenizers import Tokenizer

    from gatelab.data.shards import _batches

    encoder = Tokenizer.from_str(tokenizer.to_str())
    encoder.encode_special_tokens = True
    bos, eos = 0, 1
    times = dict.fromkeys(("read + JSON parse", "encode_batch", "numpy framing (Encoding.ids x3)",
                           "ids -> numpy, one read a document", "sha256 + write", "unigram count"), 0.0)
    tokens = 0
    clock = time.perf_counter
    end = min(jsonl.stat().st_size, max_bytes)
    batches = _batches(jsonl, 0, end)  # gatelab's own reader: lines, JSON, 256 documents a batch
    with tempfile.TemporaryFile() as out:
        digest = hashlib.sha256()
        while True:
            t0 = clock()
            batch = next(batches, (None, 0))[0]
            if batch is None:
                break
            t1 = clock()
            encodings = encoder.encode_batch([d.text for d in batch], add_special_tokens=False)
            t2 = clock()
            lengths = np.fromiter((len(e.ids) + 2 for e in encodings), dtype=np.int64, count=len(encodings))
            ends = np.cumsum(lengths)
            block = np.empty(int(ends[-1]), dtype=np.uint16)
            block[ends - lengths], block[ends - 1] = bos, eos
            for encoding, stop in zip(encodings, ends):
                block[stop - len(encoding.ids) - 1 : stop - 1] = encoding.ids
            t3 = clock()
            ids = [np.asarray(e.ids, dtype=np.uint16) for e in encodings]  # the alternative: one read a document
            t4 = clock()
            data = block.tobytes()
            digest.update(data)
            out.write(data)
            t5 = clock()
            np.bincount(block, minlength=4096)
            t6 = clock()
            del ids
            tokens += len(block)
            for name, seconds in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5)):
                times[name] += seconds
    return {"file": jsonl.name, "bytes": end, "tokens": tokens, "seconds": times}


def bench_tokenize(scratch: Path, sizes: Sizes, log: Log = print) -> dict:
    from tokenizers import Tokenizer

    folder = scratch / "text"
    corpus = write_text_corpus(folder / "parquet", sizes.text_mb, log)
    parquet = [folder / "parquet" / f for f in corpus["files"]]
    tokenizer_path = make_tokenizer(folder, parquet, sizes.vocab)
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    experiment = _files_experiment(str(folder / "parquet" / "*.parquet"), tokenizer_path, folder / "data",
                                   max(sizes.vocab, tokenizer.get_vocab_size()))
    log(f"tokenize: {corpus['bytes'] / 1e6:.1f} MB of text ({corpus['documents']:,} documents), BPE of "
        f"{tokenizer.get_vocab_size()} tokens; gatelab's whole prepare from parquet")
    whole = gatelab_prepare(experiment, whole=True)
    texts = corpus_texts(Path(whole["root"]))
    gatelab_runs, bare_runs = [whole], []
    for round_index in range(sizes.rounds):  # the order alternates round by round: bare first, then gatelab first
        log(f"tokenize: round {round_index + 1}/{sizes.rounds}: bare encode_batch loop and gatelab's tokenize stage")
        if round_index % 2 == 0:
            bare_runs.append(bare_encode(tokenizer, texts))
        gatelab_runs.append(gatelab_prepare(experiment, whole=False))
        if round_index % 2 == 1:
            bare_runs.append(bare_encode(tokenizer, texts))
    if sizes.rounds == 0:
        bare_runs.append(bare_encode(tokenizer, texts))

    text_bytes = sum(len(t.encode()) for t in texts)
    documents = len(texts)
    stage_rates = [r["tokenize"]["tokens"] / r["tokenize"]["seconds"] for r in gatelab_runs]
    # The same texts: the ratio of times, which is the ratio of text tokens/s (gatelab also writes 2 framing tokens a
    # document, which its logged rate counts).
    text_tokens = bare_runs[0]["tokens"]
    stage_s = statistics.median(r["tokenize"]["seconds"] for r in gatelab_runs)
    bare_s = statistics.median(r["seconds"] for r in bare_runs)
    stage_cpu = statistics.median(r["tokenize"]["cpu_s"] for r in gatelab_runs)
    bare_cpu = statistics.median(r["cpu_s"] for r in bare_runs)
    result = {
        "text_mb": text_bytes / 1e6, "documents": documents, "mb_by_source": corpus["mb_by_source"],
        "parquet_files": len(parquet), "tokenizer": str(tokenizer_path), "vocab_size": tokenizer.get_vocab_size(),
        "text_tokens": text_tokens, "framed_tokens": whole["tokenize"]["tokens"],
        "whole_prepare_s": whole["wall_s"], "whole_prepare_tokens_per_s": text_tokens / whole["wall_s"],
        "reading_parquet_to_jsonl_s": whole["wall_s"] - whole["tokenize"]["seconds"],
        "stage_s": [r["tokenize"]["seconds"] for r in gatelab_runs],
        "stage_logged_tokens_per_s": stage_rates,
        "bare_s": [r["seconds"] for r in bare_runs],
        "bare_cpu_per_wall": [r["cpu_s"] / r["seconds"] for r in bare_runs],
        "stage_cpu_per_wall": [r["tokenize"]["cpu_s"] / r["tokenize"]["seconds"] for r in gatelab_runs],
        "stage_cpu_s": [r["tokenize"]["cpu_s"] for r in gatelab_runs], "bare_cpu_s": [r["cpu_s"] for r in bare_runs],
        "cpu_ratio": bare_cpu / stage_cpu,
        "stage_text_tokens_per_s": text_tokens / stage_s, "bare_tokens_per_s": text_tokens / bare_s,
        "ratio": bare_s / stage_s,
        "ratio_by_round": [b["seconds"] / g["tokenize"]["seconds"] for b, g in zip(bare_runs, gatelab_runs[1:])],
        "median_ratio_of_rounds": statistics.median(
            b["seconds"] / g["tokenize"]["seconds"] for b, g in zip(bare_runs, gatelab_runs[1:] or gatelab_runs)),
        "whole_ratio": bare_s / whole["wall_s"],
        "logged_lines": whole["tokenize"]["logged_lines"],
    }
    log(f"tokenize: gatelab {result['stage_text_tokens_per_s']:,.0f} text tokens/s (tokenize stage, median of "
        f"{len(gatelab_runs)}), bare {result['bare_tokens_per_s']:,.0f} tokens/s (median of {len(bare_runs)}): "
        f"{result['ratio']:.2f}x (CPU time: {result['cpu_ratio']:.2f}x); whole prepare {whole['wall_s']:.1f} s "
        f"({result['whole_ratio']:.2f}x bare)")
    largest = max(Path(whole["root"]).glob("corpora/*/*.jsonl"), key=lambda p: p.stat().st_size)
    result["paired"] = paired_tokenize(tokenizer, largest, folder / "paired", sizes.paired_mb, sizes.pairs)
    log(f"tokenize: write_split / bare on {result['paired']['mb']:.1f} MB, {sizes.pairs} alternating pairs: median "
        f"ratio {result['paired']['median_ratio']:.2f}")
    # Where gatelab's tokenize time goes, replayed stage by stage on its largest split file.
    result["profile"] = tokenize_profile(tokenizer, largest)
    return result


def paired_tokenize(tokenizer, jsonl: Path, folder: Path, mb: float, pairs: int) -> dict:
    """gatelab's `shards.write_split` and the bare loop on the documents of the first `mb` MB of a split file, in
    `pairs` back-to-back pairs (alternating which goes first): each pair's two runs see nearly the same machine load."""
    from gatelab.data.shards import write_split

    lines, size = [], 0
    with jsonl.open("rb") as f:
        for line in f:
            lines.append(line)
            size += len(line)
            if size >= mb * 1e6:
                break
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / "slice.jsonl"
    source.write_bytes(b"".join(lines))
    texts = [json.loads(line)["text"] for line in lines]
    framing = (tokenizer.token_to_id("<|bos|>"), tokenizer.token_to_id("<|eos|>"))
    gatelab_s, bare_s, tokens = [], [], 0

    def gatelab_run() -> None:
        nonlocal tokens
        shutil.rmtree(folder / "shards", ignore_errors=True)
        gc.collect()
        started = time.perf_counter()
        tokens = write_split(tokenizer, source, "paired", folder / "shards", framing, log=lambda *_: None).record.tokens
        gatelab_s.append(time.perf_counter() - started)

    for index in range(pairs):
        if index % 2 == 0:
            bare_s.append(bare_encode(tokenizer, texts)["seconds"])
        gatelab_run()
        if index % 2 == 1:
            bare_s.append(bare_encode(tokenizer, texts)["seconds"])
    shutil.rmtree(folder, ignore_errors=True)
    ratios = [b / g for b, g in zip(bare_s, gatelab_s)]
    return {"mb": size / 1e6, "documents": len(texts), "framed_tokens": tokens, "pairs": pairs,
            "gatelab_s": gatelab_s, "bare_s": bare_s, "ratios": ratios, "median_ratio": statistics.median(ratios)}


# --- part 2: a synthetic corpus of 1e9 tokens, in gatelab's shard layout -------------------------------------------


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
    from gatelab.data.shards import SHARD_BYTES, ShardRecord, SplitShards

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
        _atomic_write(stem.with_suffix(".ids"), ids.encode())
        doc_number += len(lengths)
        record = ShardRecord(f"shard-{k:05d}.bin", k * SHARD_BYTES, (k + 1) * SHARD_BYTES, len(lengths),
                             int(ends[-1]), digest.hexdigest())
        _atomic_write(stem.with_suffix(".json"), json.dumps(asdict(record)).encode())  # last: the shard is whole
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
    _atomic_write(folder / "split.json", shards.to_json().encode())
    return shards


def synthetic_spec(tokens: int, heldout_tokens: int, vocab: int = 4096, seed: int = 0,
                   shard_tokens: int = 1 << 24) -> dict:
    return {"format": SYNTH_FORMAT, "tokens": tokens, "heldout_tokens": heldout_tokens, "vocab": vocab, "seed": seed,
            "shard_tokens": shard_tokens, "doc_tokens": [2048, 8192], "distribution": "zipf(1.0, +2.7) over ids 3.."}


def _split_sha(spec: dict, split: str) -> str:
    return hashlib.sha256(json.dumps({**spec, "split": split}, sort_keys=True).encode()).hexdigest()


def load_synthetic(folder: Path):
    """The synthetic corpus in `folder` as a `TokenCorpus` (memory-mapped), or None unless it is whole."""
    from gatelab.data.datasets import TokenCorpus, TokenSplit
    from gatelab.data.shards import load_split

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
    from gatelab.data.shards import write_manifest

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
    _atomic_write(folder / SYNTH_SPEC_FILE, json.dumps(spec, sort_keys=True).encode())
    seconds = time.perf_counter() - started
    log(f"  written in {seconds:.1f} s ({need / 1e6 / seconds:,.0f} MB/s)")
    return {"cached": False, "seconds": seconds}


# --- part 2a: loader throughput against training consumption --------------------------------------------------------


def _shard_paths(corpus) -> list[Path]:
    return [Path(p) for split in corpus.splits.values() for p in getattr(split.tokens, "paths", [])]


def warm_page_cache(paths: list[Path]) -> float:
    """Read every file once (plain reads, no mapping), so its pages are in the page cache; seconds taken."""
    started = time.perf_counter()
    for path in paths:
        with path.open("rb", buffering=0) as f:
            while f.read(1 << 23):
                pass
    return time.perf_counter() - started


def evict_page_cache(paths: list[Path]) -> bool:
    """Ask the kernel to drop these files' pages from the page cache (written back first); False where it cannot.
    Pages some process has mapped stay: `resident_fraction` tells what was dropped."""
    if not hasattr(os, "posix_fadvise"):
        return False
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return True


def resident_fraction(paths: list[Path]) -> float | None:
    """The share of these files' pages in the page cache (mincore(2) on a fresh mapping); None where it cannot tell."""
    import ctypes
    import mmap as mmap_module

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    except (OSError, AttributeError):
        return None
    page = mmap_module.PAGESIZE
    resident = total = 0
    for path in paths:
        size = path.stat().st_size
        if not size:
            continue
        pages = -(-size // page)
        fd = os.open(path, os.O_RDONLY)
        try:
            address = libc.mmap(None, size, mmap_module.PROT_READ, mmap_module.MAP_SHARED, fd, 0)
            if address in (None, ctypes.c_void_p(-1).value):
                return None
            try:
                vector = (ctypes.c_ubyte * pages)()
                if libc.mincore(address, size, vector) != 0:
                    return None
                resident += int(np.frombuffer(vector, dtype=np.uint8).__and__(1).sum())
                total += pages
            finally:
                libc.munmap(address, size)
        finally:
            os.close(fd)
    return resident / total if total else None


class MemmapStream:
    """A `TokenStream`'s shards read through memory maps (`np.memmap`, one a shard, opened on first use), as gatelab's
    `TokenStream` read them before it took positioned reads: the reader set beside gatelab's for comparison, not
    gatelab's own. Slices like a TokenStream (step 1)."""

    def __init__(self, stream) -> None:
        self.paths, self.starts, self.dtype = list(stream.paths), stream.starts, np.dtype(stream.dtype)
        self._maps: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, index: slice) -> np.ndarray:
        start, stop, _ = index.indices(len(self))
        pieces, k = [], int(np.searchsorted(self.starts, start, side="right")) - 1
        while start < stop:
            end = min(stop, int(self.starts[k + 1]))
            if k not in self._maps:
                self._maps[k] = np.memmap(self.paths[k], dtype=self.dtype, mode="r",
                                          shape=(int(self.starts[k + 1] - self.starts[k]),))
            offset = int(self.starts[k])
            pieces.append(self._maps[k][start - offset:end - offset])
            start, k = end, k + 1
        if not pieces:
            return np.zeros(0, dtype=self.dtype)
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)


def memmap_windows(corpus, seq_len: int, seed: int):
    """The corpus's training windows, in gatelab's order, over `MemmapStream`s."""
    from gatelab.data.datasets import PackedDataset

    return PackedDataset({d: MemmapStream(corpus.tokens(d, "train")) for d in corpus.domains}, seq_len, seed)


def maps_shards(corpus) -> bool | None:
    """Whether reading a window through gatelab's `TokenStream` leaves a shard mapped into this process (read off
    /proc/self/maps); None without /proc."""
    from gatelab.data.datasets import train_dataset

    windows = train_dataset(corpus, 16, 0)
    windows[0]
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    return any(str(path) in maps for path in _shard_paths(corpus))


def time_loader(windows, batch_size: int, batches: int, epoch: int, workers: int | None) -> dict:
    """Windows/s of `StepBatches` over steps ``[epoch * batches, (epoch + 1) * batches)``: called directly
    (`workers` None) or through a DataLoader as `TextData` builds it (batch_size=None, `workers` processes)."""
    import torch
    from torch.utils.data import DataLoader

    from gatelab.train.module import StepBatches

    stream = StepBatches(windows, batch_size, batches, epoch * batches)
    gc.collect()
    rss_before = _status_kb("VmRSS")
    started = time.perf_counter()
    first_at = None
    count = 0
    if workers is None:
        source: Iterator = (stream.batch(step) for step in range(epoch * batches, (epoch + 1) * batches))
    else:
        source = iter(DataLoader(stream, batch_size=None, num_workers=workers, pin_memory=False))
    for inputs, targets in source:
        assert inputs.shape == (batch_size, windows.seq_len) and inputs.dtype == torch.int64
        count += 1
        if first_at is None:
            first_at = time.perf_counter()
    ended = time.perf_counter()
    rss_after = _status_kb("VmRSS")
    steady = (count - 1) * batch_size / (ended - first_at) if count > 1 and ended > first_at else math.nan
    grown = (rss_after - rss_before) * 1024 / 1e6 if rss_before is not None and rss_after is not None else None
    return {"batches": count, "windows": count * batch_size, "seconds": ended - started,
            "first_batch_s": first_at - started, "windows_per_s": count * batch_size / (ended - started),
            "steady_windows_per_s": steady, "rss_growth_mb": grown}


def training_rate(sizes: Sizes, log: Log = print) -> dict:
    """Windows/s the tiny preset's model trains on in fp32 eager on this CPU: a plain forward/backward/AdamW loop
    (`bench.plain_step`), median step of `train_steps` after `train_warmup`."""
    from gatelab.bench import plain_step, time_interleaved
    from gatelab.config import load_experiment
    from gatelab.host import repo_root

    experiment = load_experiment(repo_root() / "experiments" / "tiny.yaml", ["train.precision=32-true"])
    step = plain_step(experiment, "32-true")
    times = time_interleaved({"tiny": step}, sizes.train_warmup, sizes.train_steps)["tiny"]
    step_s = statistics.median(times)
    batch = experiment.train.batch_size
    log(f"training: tiny fp32 plain loop {step_s * 1e3:.0f} ms a step of {batch} windows: "
        f"{batch / step_s:.1f} windows/s")
    return {"step_s": step_s, "steps": len(times), "batch_size": batch, "seq_len": experiment.data.seq_len,
            "windows_per_s": batch / step_s, "tokens_per_s": batch * experiment.data.seq_len / step_s}


GATELAB_READER, MEMMAP_READER = "gatelab TokenStream", "np.memmap (comparison)"


def bench_loader(folder: Path, sizes: Sizes, seq_len: int, batch_size: int, seed: int, log: Log = print) -> list[dict]:
    """Loader rows over the synthetic corpus in `folder`: with its shards in the page cache, then evicted from it
    (a fresh corpus object, so no mapping of this process holds pages back), each also with the memory-mapped
    comparison reader."""
    from gatelab.data.datasets import train_dataset

    rows, epoch = [], 0

    def measure(label: str, reader: str, cache: str, windows, workers: int | None, batches: int) -> None:
        nonlocal epoch
        epoch += 1
        row = {"loader": label, "reader": reader, "cache": cache,
               **time_loader(windows, batch_size, batches, epoch, workers)}
        rows.append(row)
        log(f"loader: {label}, {reader}, page cache {cache}: {row['windows_per_s']:,.0f} windows/s "
            f"(steady {row['steady_windows_per_s']:,.0f}, first batch {row['first_batch_s'] * 1e3:.0f} ms)")

    corpus = load_synthetic(folder)
    paths = _shard_paths(corpus)
    started = time.perf_counter()
    windows = train_dataset(corpus, seq_len, seed)
    build_s = time.perf_counter() - started
    warm_s = warm_page_cache(paths)
    resident = resident_fraction(paths)
    log(f"loader: {len(windows):,} windows of {seq_len + 1} tokens (PackedDataset built in {build_s:.2f} s); "
        f"shards read into the page cache in {warm_s:.1f} s ({_f(resident)} resident)")
    warm = f"warm ({resident:.0%} resident)" if resident is not None else "warm"
    for label, workers in (("StepBatches.batch", None), ("DataLoader, 0 workers", 0), ("DataLoader, 2 workers", 2)):
        measure(label, GATELAB_READER, warm, windows, workers, sizes.loader_batches)
    alternative = memmap_windows(corpus, seq_len, seed)
    measure("StepBatches.batch", MEMMAP_READER, warm, alternative, None, sizes.loader_batches)
    del windows, corpus, alternative
    gc.collect()

    for label, workers, reader in (("StepBatches.batch", None, GATELAB_READER), ("DataLoader, 2 workers", 2,
                                   GATELAB_READER), ("StepBatches.batch", None, MEMMAP_READER)):
        corpus = load_synthetic(folder)
        windows = (train_dataset(corpus, seq_len, seed) if reader == GATELAB_READER
                   else memmap_windows(corpus, seq_len, seed))
        evicted = evict_page_cache(paths)
        resident = resident_fraction(paths)
        cache = (f"evicted ({resident:.0%} resident)" if resident is not None else "evicted") if evicted else \
            "warm (eviction unavailable)"
        measure(label, reader, cache, windows, workers, sizes.cold_batches)
        del windows, corpus
        gc.collect()
    for row in rows:
        row["packed_dataset_build_s"] = build_s
    return rows


PROBE_PREAD = "not cached, read with os.pread (no mapping)"


def folio_probe(folder: Path, windows: int = 100) -> list[dict]:
    """How many MB of one shard 100 random windows bring into this process's RSS through a memory map, by how the
    file's pages came into the page cache: freshly written (as a prepare leaves them), read with plain reads, or not
    cached at all; and through os.pread. On kernels that cache file pages in large folios and map a whole folio on a
    fault, a window can map up to 2 MB."""
    source = min((folder / f"{SYNTH_DOMAIN}.train").glob("shard-*.bin"))
    copy = folder / "probe.bin.tmp"
    rows = []
    try:
        with source.open("rb") as f, copy.open("wb") as out:  # a fresh copy, written as a prepare writes
            while chunk := f.read(8 << 20):
                out.write(chunk)
        for state in ("freshly written", "read with plain reads", "not cached", PROBE_PREAD):
            if state == "read with plain reads":
                evict_page_cache([copy])
                warm_page_cache([copy])
            elif state in ("not cached", PROBE_PREAD):
                evict_page_cache([copy])
            rows.append({"state": state, **_probe_windows(copy, windows, pread=state == PROBE_PREAD)})
    finally:
        copy.unlink(missing_ok=True)
    return rows


def _probe_windows(path: Path, count: int, pread: bool) -> dict:
    size = path.stat().st_size // 2
    starts = np.random.default_rng(1).integers(0, size - 300, count)
    before = _rollup()
    started = time.perf_counter()
    if pread:
        fd = os.open(path, os.O_RDONLY)
        for s in starts:
            np.frombuffer(os.pread(fd, 257 * 2, int(s) * 2), dtype=np.uint16).astype(np.int64)
        os.close(fd)
    else:
        tokens = np.memmap(path, dtype=np.uint16, mode="r", shape=(size,))
        for s in starts:
            tokens[s:s + 257].astype(np.int64)
    seconds = time.perf_counter() - started
    after = _rollup()
    result = {"windows": count, "file_mb": path.stat().st_size / 1e6, "seconds": seconds,
              "rss_growth_mb": (after.get("Rss", 0) - before.get("Rss", 0)) / 1e3,
              "file_pmd_mapped_mb": (after.get("FilePmdMapped", 0) - before.get("FilePmdMapped", 0)) / 1e3}
    if not pread:
        del tokens
    return result


def _rollup() -> dict[str, int]:
    """/proc/self/smaps_rollup in kB; {} without it."""
    try:
        lines = Path("/proc/self/smaps_rollup").read_text().splitlines()
    except OSError:
        return {}
    values = {}
    for line in lines:
        parts = line.split()
        if len(parts) == 3 and parts[2] == "kB":
            values[parts[0].rstrip(":")] = int(parts[1])
    return values


# --- part 2b: peak RSS of a short Lightning training, one child process per corpus ---------------------------------


def _rss_child(kind: str, corpus_dir: str, steps: int) -> dict:
    """In the child: build the corpus, train tiny's model `steps` steps with Lightning, report peak RSS by stage.
    `kind`: tiny (the real corpus, through `load_data`), synthetic, or synthetic-memmap (its windows read by
    `MemmapStream`, the comparison reader)."""
    import warnings

    from gatelab.host import peak_rss_gb

    marks = {"after_imports": None}
    import lightning as L
    import torch  # noqa: F401

    from gatelab.bench import StepTimer
    from gatelab.config import load_experiment
    from gatelab.data.datasets import train_dataset
    from gatelab.host import repo_root
    from gatelab.model import resolve_model
    from gatelab.train.module import GatedLM, TextData
    from gatelab.progress import silence_noise

    silence_noise()
    warnings.filterwarnings("ignore")
    marks["after_imports"] = peak_rss_gb()
    experiment = load_experiment(repo_root() / "experiments" / "tiny.yaml",
                                 ["train.precision=32-true", f"train.max_steps={steps}"])
    if kind == "tiny":
        from gatelab.data.prepare import load_data

        _, corpus, domains = load_data(experiment, log=lambda *_: None, warn=lambda *_: None)
    else:
        corpus, domains = load_synthetic(Path(corpus_dir)), [SYNTH_DOMAIN]
        if corpus is None:
            raise GatelabError(f"{corpus_dir}: no whole synthetic corpus")
    corpus_tokens = sum(len(corpus.tokens(d, "train")) for d in domains)
    if kind == "synthetic-memmap":
        windows = memmap_windows(corpus, experiment.data.seq_len, experiment.seed)
    else:
        windows = train_dataset(corpus, experiment.data.seq_len, experiment.seed, domains)
    marks["after_corpus_and_windows"] = peak_rss_gb()
    L.seed_everything(experiment.seed, verbose=False)
    module = GatedLM(experiment, resolve_model(experiment))
    timer = StepTimer()
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, precision="32-true", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, limit_val_batches=0, use_distributed_sampler=False,
                        gradient_clip_val=experiment.train.grad_clip or None, callbacks=[timer],
                        default_root_dir=os.environ.get("TMPDIR", "/tmp"))
    trainer.fit(module, datamodule=TextData(windows, experiment.train.batch_size, steps))
    step_times = list(np.diff(timer.starts))[1:]
    rollup = _rollup()
    return {"kind": kind, "corpus": corpus_dir, "train_tokens": corpus_tokens, "windows": len(windows),
            "steps": trainer.global_step, "peak_rss_gb": peak_rss_gb(), "peak_rss_by_stage_gb": marks,
            "rss_anon_gb_at_end": (_status_kb("RssAnon") or math.nan) * 1024 / 1e9,
            "rss_file_gb_at_end": (_status_kb("RssFile") or math.nan) * 1024 / 1e9,
            "file_pmd_mapped_gb_at_end": rollup.get("FilePmdMapped", 0) * 1024 / 1e9,
            "median_step_s": statistics.median(step_times) if step_times else math.nan,
            "batch_size": experiment.train.batch_size}


def run_rss_child(kind: str, corpus_dir: str, steps: int, cache: str, timeout: float = 900) -> dict:
    """One child's report; `cache` names the state its corpus's page cache was put in before it started."""
    command = [sys.executable, "-m", "gatelab.bench_data", "rss", kind, corpus_dir, str(steps)]
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    if result.returncode != 0:
        raise GatelabError(f"`{' '.join(command)}` failed ({result.returncode}):\n{result.stderr[-3000:]}")
    report = json.loads(result.stdout.strip().splitlines()[-1])
    report["wall_s"] = time.perf_counter() - started
    report["cache"] = cache
    return report


def prepare_tiny(timeout: float) -> tuple[bool, str]:
    """Whether the real tiny corpus can be had (prepared, or prepared now in a child within `timeout`), and why not."""
    code = ("from gatelab.config import load_experiment; from gatelab.data.prepare import load_data; "
            "from gatelab.host import repo_root; "
            "load_data(load_experiment(repo_root() / 'experiments' / 'tiny.yaml'), log=lambda *_: None)")
    try:
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                                check=False)
    except subprocess.TimeoutExpired:
        return False, f"preparing it took over {timeout:.0f} s"
    if result.returncode != 0:
        return False, (result.stderr.strip().splitlines() or ["failed"])[-1][:300]
    return True, ""


# --- the bench ------------------------------------------------------------------------------------------------------


def default_scratch() -> Path:
    from gatelab.data.corpora import default_data_dir

    return default_data_dir().parent / "bench-data"


def bench_data(scratch: Path | None = None, sizes: Sizes = Sizes(), log: Log = print) -> DataBenchReport:
    from gatelab.bench import machine_facts
    from gatelab.config import load_experiment
    from gatelab.host import repo_root

    started = time.perf_counter()
    scratch = Path(scratch or default_scratch()).expanduser().resolve()
    scratch.mkdir(parents=True, exist_ok=True)
    report = DataBenchReport(machine=machine_facts(), sizes=asdict(sizes), scratch=str(scratch))
    report.machine["load_average_at_start"] = _load()
    report.machine["disk_free_gb_at_start"] = shutil.disk_usage(scratch).free / 1e9
    try:
        report.machine["kernel"] = os.uname().release
        report.machine["read_ahead_kb"] = _read_ahead_kb(scratch)
    except OSError:
        pass

    report.tokenize = bench_tokenize(scratch, sizes, log)

    tiny = load_experiment(repo_root() / "experiments" / "tiny.yaml")
    seq_len, batch_size, seed = tiny.data.seq_len, tiny.train.batch_size, tiny.seed
    large_dir = scratch / f"synthetic-{sizes.large_tokens}"
    small_dir = scratch / f"synthetic-{sizes.small_tokens}"
    writes = {}
    for folder, tokens in ((large_dir, sizes.large_tokens), (small_dir, sizes.small_tokens)):
        spec = synthetic_spec(tokens, sizes.heldout_tokens, tiny.model.vocab_size, 0, sizes.shard_tokens)
        writes[str(folder)] = write_synthetic(folder, spec, log)
    scale = report.scale
    large = load_synthetic(large_dir)
    train_split = large.get(SYNTH_DOMAIN, "train")
    large_paths = _shard_paths(large)
    scale["corpus"] = {"folder": str(large_dir), "train_tokens": len(train_split.tokens),
                       "documents": len(train_split.doc_starts) - 1, "shards": len(train_split.tokens.paths),
                       "bytes": sum(p.stat().st_size for p in large_paths),
                       "write": writes[str(large_dir)], "small_folder": str(small_dir),
                       "small_train_tokens": sizes.small_tokens}
    del large, train_split
    gc.collect()
    scale["gatelab_maps_shards"] = maps_shards(load_synthetic(large_dir))
    scale["loader"] = bench_loader(large_dir, sizes, seq_len, batch_size, seed, log)
    scale["folio_probe"] = folio_probe(large_dir)
    for row in scale["folio_probe"]:
        log(f"page cache probe: {row['windows']} random windows of a fresh shard copy, {row['state']}: RSS "
            f"+{row['rss_growth_mb']:.1f} MB")
    scale["training"] = training_rate(sizes, log)

    rss = []
    steps = sizes.rss_steps
    small_paths = _shard_paths(load_synthetic(small_dir))
    # The large corpus twice: its shards dropped from the page cache (a first run after a reboot), and a fresh copy
    # whose pages are in the page cache as its writing left them (a run right after its prepare).
    fresh_dir = scratch / f"{large_dir.name}-fresh-copy"
    try:
        for kind, folder, state in (("synthetic", large_dir, "evicted"), ("synthetic", fresh_dir, "freshly written"),
                                    ("synthetic-memmap", fresh_dir, "freshly written"),
                                    ("synthetic", small_dir, "warm")):
            if folder == fresh_dir and kind == "synthetic":  # copied anew: a killed run may have left half a copy
                copy_s = fresh_copy(large_dir, fresh_dir)
                log(f"peak RSS: copied the corpus to {fresh_dir} in {copy_s:.1f} s")
            paths = small_paths if folder == small_dir else _shard_paths(load_synthetic(folder))
            if state == "evicted":
                evict_page_cache(paths)
            elif state == "warm":
                warm_page_cache(paths)
            resident = resident_fraction(paths)
            cache = f"{state} ({resident:.0%} resident)" if resident is not None else state
            log(f"peak RSS: {steps} Lightning steps over {folder.name} ({kind}, page cache {cache}), in a child "
                "process")
            rss.append(run_rss_child(kind, str(folder), steps, cache))
    finally:
        shutil.rmtree(fresh_dir, ignore_errors=True)
    if sizes.tiny:
        log("peak RSS: the same over the real tiny corpus (prepared first if it is not)")
        available, why = prepare_tiny(timeout=600)
        if available:
            rss.append(run_rss_child("tiny", "experiments/tiny.yaml data", steps, "as the prepare left it"))
        else:
            report.notes.append(f"The real tiny corpus could not be prepared here ({why}); only the synthetic small "
                                "corpus stands for it.")
    for row in rss:
        log(f"peak RSS: {row['kind']} {row['train_tokens']:,} tokens ({row['cache']}): {row['peak_rss_gb']:.3f} GB "
            f"({row['median_step_s'] * 1e3:.0f} ms a step)")
    scale["rss"] = rss
    small = next(r for r in rss if r["kind"] == "synthetic" and r["train_tokens"] == sizes.small_tokens)
    tiny_row = next((r for r in rss if r["kind"] == "tiny"), None)
    for row in rss:
        row["difference_to_small_gb"] = row["peak_rss_gb"] - small["peak_rss_gb"]
        row["difference_to_tiny_gb"] = row["peak_rss_gb"] - tiny_row["peak_rss_gb"] if tiny_row else None
    gatelab_large = [r for r in rss if r["kind"] == "synthetic" and r["train_tokens"] == sizes.large_tokens]
    for row in rss:
        row["corpus"] = Path(row["corpus"]).name
    scale["rss_difference_gb"] = max(r["difference_to_small_gb"] for r in gatelab_large)
    if tiny_row:
        scale["rss_difference_to_tiny_gb"] = max(r["difference_to_tiny_gb"] for r in gatelab_large)

    # Consumption: the faster of the plain fp32 loop and the Lightning steps of the children (the stricter ratio).
    lightning_rates = [r["batch_size"] / r["median_step_s"] for r in rss if r["median_step_s"] > 0]
    consumed = max([scale["training"]["windows_per_s"], *lightning_rates])
    scale["consumed_windows_per_s"] = consumed
    scale["lightning_windows_per_s"] = lightning_rates
    for row in scale["loader"]:
        row["ratio_to_training"] = row["windows_per_s"] / consumed
    report.machine["load_average_at_end"] = _load()
    report.checks = checks(report)
    report.seconds = time.perf_counter() - started
    return report


def fresh_copy(folder: Path, target: Path) -> float:
    """Copy a corpus folder with 8 MiB writes, as a prepare writes its shards, so the copy's pages sit in the page cache
    as writing leaves them; seconds taken."""
    need = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    target.parent.mkdir(parents=True, exist_ok=True)
    if shutil.disk_usage(target.parent).free < need * 1.2 + (1 << 30):
        raise GatelabError(f"{target.parent}: too little free disk for a {need / 1e9:.1f} GB copy of the corpus")
    started = time.perf_counter()
    shutil.rmtree(target, ignore_errors=True)
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            destination = target / path.relative_to(folder)
            destination.parent.mkdir(parents=True, exist_ok=True)
            with path.open("rb") as f, destination.open("wb") as out:
                while chunk := f.read(8 << 20):
                    out.write(chunk)
    return time.perf_counter() - started


def _read_ahead_kb(path: Path) -> int | None:
    """The read-ahead of the block device holding `path`, from sysfs; None where it cannot be found."""
    try:
        device = os.stat(path).st_dev
        block = Path(f"/sys/dev/block/{os.major(device)}:{os.minor(device)}")
        for candidate in (block / "queue" / "read_ahead_kb", block / ".." / "queue" / "read_ahead_kb"):
            if candidate.exists():
                return int(candidate.read_text())
    except (OSError, ValueError):
        pass
    return None


def checks(report: DataBenchReport) -> list[dict]:
    rows = []

    def check(target: str, value: float | None, limit: float, at_most: bool, unit: str = "x") -> None:
        holds = None if value is None or not math.isfinite(value) else (value <= limit if at_most else value >= limit)
        rows.append({"target": target, "measured": value, "limit": limit, "at_most": at_most, "unit": unit,
                     "holds": holds})

    t = report.tokenize
    check("tokenize stage tokens/s / bare encode_batch tokens/s (whole corpus, medians of the runs)", t.get("ratio"),
          0.8, at_most=False)
    if t.get("paired"):
        check(f"the same, `write_split` and the bare loop in {t['paired']['pairs']} back-to-back pairs on "
              f"{t['paired']['mb']:.0f} MB (median of the pairs' ratios)", t["paired"]["median_ratio"], 0.8,
              at_most=False)
    scale = report.scale
    for row in scale.get("loader", []):
        if row["reader"] == GATELAB_READER:
            check(f"loader windows/s / training windows/s: {row['loader']}, page cache "
                  f"{row['cache'].split(' (')[0]}",
                  row.get("ratio_to_training"), 20.0, at_most=False)
    for row in scale.get("rss", []):
        if row["kind"] == "synthetic" and row["train_tokens"] == report.sizes["large_tokens"]:
            state, large = row["cache"].split(" (")[0], f"{row['train_tokens']:,}-token corpus"
            check(f"peak RSS, {large} (page cache {state}) - {report.sizes['small_tokens']:,}-token corpus (GB)",
                  row["difference_to_small_gb"], 0.3, at_most=True, unit="GB")
            if row.get("difference_to_tiny_gb") is not None:
                check(f"peak RSS, {large} (page cache {state}) - real tiny corpus (GB)",
                      row["difference_to_tiny_gb"], 0.3, at_most=True, unit="GB")
    return rows


# --- output ---------------------------------------------------------------------------------------------------------


def _f(value, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.{digits}g}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def to_markdown(report: DataBenchReport) -> str:
    m, t, s = report.machine, report.tokenize, report.scale
    lines = ["# gatelab data bench", "", f"`{report.command}`", "",
             f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']} ({m['torch_threads']} threads), GPU: "
             f"{m['gpu'] or 'none'}, Linux {m.get('kernel', '?')}, block-device read-ahead "
             f"{_f(m.get('read_ahead_kb'))} kB. Load average (1/5/15 min) {m['load_average_at_start']} at the start, "
             f"{m['load_average_at_end']} at the end: other work shares these cores, so single timings drift. "
             f"Scratch: `{report.scratch}`. Whole bench: {report.seconds:.0f} s.", "",
             "## Targets", "", "| target | measured | limit | holds |", "|---|---|---|---|"]
    for c in report.checks:
        holds = {True: "yes", False: "**no**", None: "not measured"}[c["holds"]]
        lines.append(f"| {c['target']} | {_f(c['measured'])} | {'≤' if c['at_most'] else '≥'} {c['limit']} | "
                     f"{holds} |")
    sources = ", ".join(f"{k} {v:g} MB" for k, v in t["mb_by_source"].items())
    lines += ["", "## 1. Tokenizing", "",
              f"{t['text_mb']:.1f} MB of real text, {t['documents']:,} documents ({sources}) in {t['parquet_files']} "
              f"parquet file(s) (`id`, `text`); a byte-level BPE of {t['vocab_size']:,} tokens trained here with "
              f"gatelab's trainer on the first {min(t['text_mb'], TOKENIZER_SAMPLE_BYTES / 1e6):.1f} MB "
              f"(`{t['tokenizer']}`), given as `data.tokenizer`. {t['text_tokens']:,} text tokens, "
              f"{t['framed_tokens']:,} with each document's `<|bos|>`/`<|eos|>`.", "",
              "| what | wall s (median) | text tokens/s | / bare | CPU s (median) | CPU / bare CPU |",
              "|---|---|---|---|---|---|",
              f"| gatelab whole prepare (`load_data`, `data.source: files`: parquet → JSONL splits → token shards) | "
              f"{t['whole_prepare_s']:.1f} | {_f(t['whole_prepare_tokens_per_s'])} | {t['whole_ratio']:.2f} | | |",
              f"| … of which parquet → JSONL split files (`prepare_source`), tokenizer load and checks | "
              f"{t['reading_parquet_to_jsonl_s']:.1f} | | | | |",
              f"| gatelab tokenize stage (`write_split` of every split), {len(t['stage_s'])} runs | "
              f"{statistics.median(t['stage_s']):.1f} | {_f(t['stage_text_tokens_per_s'])} | **{t['ratio']:.2f}** | "
              f"{statistics.median(t['stage_cpu_s']):.1f} | {1 / t['cpu_ratio']:.2f} |",
              f"| bare `encode_batch` loop, 256 docs a batch, texts in memory, {len(t['bare_s'])} runs | "
              f"{statistics.median(t['bare_s']):.1f} | {_f(t['bare_tokens_per_s'])} | 1 | "
              f"{statistics.median(t['bare_cpu_s']):.1f} | 1 |", "",
              f"Each run, in the order run (the first gatelab run is inside the whole prepare; then rounds alternate "
              f"which goes first): gatelab tokenize stage {', '.join(f'{x:.1f}' for x in t['stage_s'])} s (CPU/wall "
              f"{', '.join(f'{x:.2f}' for x in t['stage_cpu_per_wall'])}); bare loop "
              f"{', '.join(f'{x:.1f}' for x in t['bare_s'])} s (CPU/wall "
              f"{', '.join(f'{x:.2f}' for x in t['bare_cpu_per_wall'])}); 2.0 would be both cores busy. Ratio bare / "
              f"gatelab by round: {', '.join(f'{x:.2f}' for x in t['ratio_by_round'])}. gatelab's logged rates "
              f"(framing tokens counted): {', '.join(_f(x) for x in t['stage_logged_tokens_per_s'])} tokens/s.", "",
              f"Back-to-back pairs on the first {t['paired']['mb']:.1f} MB of the split file "
              f"({t['paired']['documents']:,} documents), gatelab's `write_split` (shards, sha256, unigram counts, "
              f"read-back) against the bare loop, alternating which goes first: gatelab "
              f"{', '.join(f'{x:.2f}' for x in t['paired']['gatelab_s'])} s; bare "
              f"{', '.join(f'{x:.2f}' for x in t['paired']['bare_s'])} s; ratios "
              f"{', '.join(f'{x:.2f}' for x in t['paired']['ratios'])}, median "
              f"**{t['paired']['median_ratio']:.2f}**.", "",
              "gatelab's own log lines, first prepare:", ""]
    lines += [f"    {line.strip()}" for line in t["logged_lines"]]
    p = t["profile"]
    alternative_step = "ids -> numpy, one read a document"
    total = sum(v for k, v in p["seconds"].items() if k != alternative_step)
    lines += ["", f"Where the tokenize stage's time goes: `_write_shard`'s steps replayed one at a time on the first "
              f"{p['bytes'] / 1e6:.1f} MB of `{p['file']}` ({p['tokens']:,} tokens), with gatelab's own reader "
              "(`shards._batches`); the row in italics is an alternative to the row above it, not in the total.", "",
              "| step | seconds | share |", "|---|---|---|"]
    for name, seconds in p["seconds"].items():
        alternative = name == alternative_step
        lines.append(f"| {f'*{name}*' if alternative else name} | {seconds:.3f} | "
                     f"{'' if alternative else f'{seconds / total:.1%}'} |")
    lines.append(f"| total | {total:.3f} | 100% |")

    c, tr, write = s["corpus"], s["training"], s["corpus"]["write"]
    lines += ["", "## 2. Reading at scale", "",
              f"Synthetic corpus in gatelab's shard layout: {c['train_tokens']:,} training tokens, "
              f"{c['documents']:,} documents of 2,048-8,192 tokens (the last of each shard cut to fit), {c['shards']} "
              f"uint16 shards, {c['bytes'] / 1e9:.2f} GB, `{c['folder']}` ("
              + ("cached from an earlier run" if write["cached"] else f"written in {write['seconds']:.0f} s") + "), "
              "read as a `TokenCorpus` through `shards.load_split`.", "",
              f"Training consumes (tiny's model, fp32, batch {tr['batch_size']} × {tr['seq_len']} tokens): plain loop "
              f"{tr['step_s'] * 1e3:.0f} ms a step = {tr['windows_per_s']:.1f} windows/s; Lightning steps in the "
              f"children below: {', '.join(f'{x:.1f}' for x in s['lightning_windows_per_s'])} windows/s. Ratios are "
              f"to the fastest, {s['consumed_windows_per_s']:.1f} windows/s.", "",
              "| loader | reader | page cache | batches | windows/s | steady windows/s | first batch (ms) | "
              "RSS growth (MB) | × training |", "|---|---|---|---|---|---|---|---|---|"]
    for row in s["loader"]:
        lines.append(f"| {row['loader']} | {row['reader']} | {row['cache']} | {row['batches']} | "
                     f"{_f(row['windows_per_s'])} | {_f(row['steady_windows_per_s'])} | "
                     f"{row['first_batch_s'] * 1e3:.0f} | {_f(row['rss_growth_mb'])} | "
                     f"{row['ratio_to_training']:,.0f} |")
    maps = {True: "leaves its shards mapped", False: "maps no shard", None: "n/a"}[s.get("gatelab_maps_shards")]
    lines += ["", f"`{GATELAB_READER}` is gatelab's own reader (read back from /proc/self/maps: it {maps}); "
              f"`{MEMMAP_READER}` is the same `PackedDataset` and `StepBatches` over `np.memmap`s of the shards (how "
              "`TokenStream` read them before it took positioned reads), set beside it for comparison. Rows marked "
              "evicted ran on a fresh corpus object after its shards were dropped from the "
              "page cache (`posix_fadvise(DONTNEED)`; the resident share is read back with `mincore`). Building the "
              f"`PackedDataset` (one epoch's window order): {s['loader'][0]['packed_dataset_build_s']:.2f} s.", "",
              "Peak RSS (VmHWM) of a short Lightning training of tiny's model (fp32, `TextData` + `GatedLM`, no "
              "logger or checkpoints), one child process per row:", "",
              "| corpus | reader | page cache before | train tokens | steps | peak RSS (GB) | − small (MB) | "
              "after imports | after corpus + windows | RssAnon at end | RssFile at end | of which 2 MB maps | "
              "step (ms) |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in s["rss"]:
        stage = r["peak_rss_by_stage_gb"]
        name = "real tiny corpus" if r["kind"] == "tiny" else f"synthetic {r['train_tokens']:,}"
        reader = MEMMAP_READER if r["kind"] == "synthetic-memmap" else GATELAB_READER
        lines.append(f"| {name} | {reader} | {r['cache']} | {r['train_tokens']:,} | {r['steps']} | "
                     f"{r['peak_rss_gb']:.3f} | {r['difference_to_small_gb'] * 1e3:+.0f} | "
                     f"{stage['after_imports']:.3f} | {stage['after_corpus_and_windows']:.3f} | "
                     f"{r['rss_anon_gb_at_end']:.3f} | {r['rss_file_gb_at_end']:.3f} | "
                     f"{r['file_pmd_mapped_gb_at_end']:.3f} | {r['median_step_s'] * 1e3:.0f} |")
    lines += ["", "\"Freshly written\" rows train on a fresh copy of the large corpus, written with 8 MiB writes "
              "just before, as `gatelab train` right after its prepare finds the shards. RssFile is file pages mapped "
              "into the process: the shared libraries (about 0.13 GB in every row) and the shards' pages a "
              "memory-mapping reader brought in; clean, shared and reclaimable, but counted in RSS and VmHWM. "
              "How much a window maps depends on how its pages came into the page cache (on kernels that cache files "
              "in large folios and map a whole folio on a fault, up to 2 MB a window): the probe below reads random "
              "windows of a fresh copy of one shard through a memory map, then through `os.pread`.", "",
              "| pages | windows | RSS growth (MB) | of which 2 MB maps (MB) | ms |", "|---|---|---|---|---|"]
    for row in s["folio_probe"]:
        lines.append(f"| {row['state']} | {row['windows']} | {row['rss_growth_mb']:.1f} | "
                     f"{row['file_pmd_mapped_mb']:.1f} | {row['seconds'] * 1e3:.0f} |")
    if report.notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in report.notes]
    return "\n".join(lines) + "\n"


def write(report: DataBenchReport, out: Path) -> list[Path]:
    """`out` a .md file (with a .json beside it), or a folder for data.md and data.json."""
    md = out if out.suffix == ".md" else out / "data.md"
    md.parent.mkdir(parents=True, exist_ok=True)
    md.write_text(to_markdown(report))
    js = md.with_suffix(".json")
    js.write_text(json.dumps(asdict(report), indent=2, default=str) + "\n")
    return [md, js]


def _main(argv: list[str]) -> None:
    if len(argv) == 4 and argv[0] == "rss":
        print(json.dumps(_rss_child(argv[1], argv[2], int(argv[3]))))
        return
    raise SystemExit("usage: python -m gatelab.bench_data rss KIND CORPUS_DIR STEPS (the bench's child process); "
                     "the bench itself is `gatelab bench --data`")


if __name__ == "__main__":
    _main(sys.argv[1:])
