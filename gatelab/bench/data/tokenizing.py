"""Part 1 of `gatelab bench --data`: gatelab's prepare and its tokenize stage against a bare `encode_batch` loop over
the same real text, interleaved round after round; short back-to-back pairs on one slice; and where the tokenize
stage's time goes, `shards._write_shard`'s steps replayed one at a time."""

from __future__ import annotations

import gc
import hashlib
import json
import os
import re
import shutil
import statistics
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from gatelab.bench.data.report import Sizes
from gatelab.bench.data.system import atomic_write
from gatelab.config_files import read_yaml
from gatelab.data.corpora import CorpusManifest, default_data_dir
from gatelab.data.external import corpus_dir
from gatelab.data.prepare import load_data
from gatelab.data.resolve import experiment_from_dict
from gatelab.data.shards import _batches, write_split
from gatelab.data.tokenizer import _train_tokenizer
from gatelab.host import repo_root

Log = Callable[[str], None]

_BATCH_DOCS = 256  # documents per encode_batch call, as `shards._ENCODE_BATCH_DOCS`
_TOKENIZE_LINE = re.compile(r"([\d,]+) documents, ([\d,]+) tokens in (\d+) shard\(s\), "
                            r"([\d.]+) s \(([\d,]+) tokens/s\)")
TOKENIZER_SAMPLE_BYTES = 4_000_000


def real_texts(target_bytes: int, data_dir: Path | None = None) -> Iterator[tuple[str, str, str]]:
    """(source, id, text) of real text, `target_bytes` of UTF-8 in all: the built-in corpora already prepared in the
    data directory (nothing is fetched), then the running Python's standard-library .py files (site-packages and tests
    included), in sorted order."""
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
    atomic_write(record_path, json.dumps(record, indent=1).encode())
    return record


def make_tokenizer(folder: Path, parquet: list[Path], vocab: int, sample_bytes: int = TOKENIZER_SAMPLE_BYTES) -> Path:
    """A byte-level BPE of `vocab` tokens, gatelab's own trainer and settings, trained on the first `sample_bytes` of
    the corpus; saved once as tokenizer.json."""
    import pyarrow.parquet as pq

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


class TimedLog:
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


def files_experiment(parquet_glob: str, tokenizer: Path, data_dir: Path, vocab: int):
    """tiny.yaml reading the parquet shards through `data.source: files`, tokenized with `tokenizer`."""
    raw = read_yaml(repo_root() / "experiments" / "tiny.yaml")
    raw["model"]["vocab_size"] = vocab
    raw["data"] = {"source": "files", "files": {"paths": [parquet_glob], "id_field": "id", "text_field": "text",
                                                "domain": "text"},
                   "tokenizer": str(tokenizer), "data_dir": str(data_dir), "seq_len": raw["data"]["seq_len"]}
    return experiment_from_dict(raw, "tiny.yaml with data.source: files")


def gatelab_prepare(experiment, whole: bool) -> dict:
    """One `load_data`: with `whole`, from parquet (its source folder removed first), else the tokenize stage alone
    (only the token cache removed)."""
    root = corpus_dir(experiment.data)
    shutil.rmtree(root if whole else root / "tokens", ignore_errors=True)
    log = TimedLog()
    gc.collect()
    started, cpu = time.perf_counter(), time.process_time()
    _, corpus, domains = load_data(experiment, log=log, warn=log)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    stage = log.tokenize_stage()
    return {"whole": whole, "wall_s": wall, "cpu_s": cpu, "tokenize": stage, "root": str(root),
            "tokens_in_corpus": sum(len(s.tokens) for s in corpus.splits.values()), "domains": domains}


def corpus_texts(root: Path) -> list[str]:
    """Every document's text in the split files gatelab tokenized, in their order."""
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
    """Part 1: gatelab's whole prepare from parquet, then rounds of its tokenize stage and the bare loop; the pairs on
    one slice; the replayed stages of `_write_shard`."""
    folder = scratch / "text"
    corpus = write_text_corpus(folder / "parquet", sizes.text_mb, log)
    parquet = [folder / "parquet" / f for f in corpus["files"]]
    tokenizer_path = make_tokenizer(folder, parquet, sizes.vocab)
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    experiment = files_experiment(str(folder / "parquet" / "*.parquet"), tokenizer_path, folder / "data",
                                  max(sizes.vocab, tokenizer.get_vocab_size()))
    log(f"tokenize: {corpus['bytes'] / 1e6:.1f} MB of text ({corpus['documents']:,} documents), BPE of "
        f"{tokenizer.get_vocab_size()} tokens; gatelab's whole prepare from parquet")
    whole = gatelab_prepare(experiment, whole=True)
    texts = corpus_texts(Path(whole["root"]))
    gatelab_runs, bare_runs = tokenize_rounds(experiment, tokenizer, texts, whole, sizes.rounds, log)
    sources = {"mb_by_source": corpus["mb_by_source"], "parquet_files": len(parquet),
               "tokenizer": str(tokenizer_path), "vocab_size": tokenizer.get_vocab_size()}
    result = tokenize_figures(texts, sources, whole, gatelab_runs, bare_runs)
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


def tokenize_rounds(experiment, tokenizer, texts: list[str], whole: dict, rounds: int,
                    log: Log) -> tuple[list[dict], list[dict]]:
    """(gatelab's tokenize-stage runs, the whole prepare first; the bare loop's runs) of `rounds` rounds, the order
    alternating round by round: bare first, then gatelab first. One bare run where there are no rounds."""
    gatelab_runs, bare_runs = [whole], []
    for round_index in range(rounds):
        log(f"tokenize: round {round_index + 1}/{rounds}: bare encode_batch loop and gatelab's tokenize stage")
        if round_index % 2 == 0:
            bare_runs.append(bare_encode(tokenizer, texts))
        gatelab_runs.append(gatelab_prepare(experiment, whole=False))
        if round_index % 2 == 1:
            bare_runs.append(bare_encode(tokenizer, texts))
    if rounds == 0:
        bare_runs.append(bare_encode(tokenizer, texts))
    return gatelab_runs, bare_runs


def tokenize_figures(texts: list[str], sources: dict, whole: dict, gatelab_runs: list[dict],
                     bare_runs: list[dict]) -> dict:
    """Part 1's figures from its runs (`gatelab_runs` starts with the whole prepare's), after `sources`: what the
    text and the tokenizer were."""
    stage_rates = [r["tokenize"]["tokens"] / r["tokenize"]["seconds"] for r in gatelab_runs]
    # The same texts: the ratio of times, which is the ratio of text tokens/s (gatelab also writes 2 framing tokens a
    # document, which its logged rate counts).
    text_tokens = bare_runs[0]["tokens"]
    stage_s = statistics.median(r["tokenize"]["seconds"] for r in gatelab_runs)
    bare_s = statistics.median(r["seconds"] for r in bare_runs)
    stage_cpu = statistics.median(r["tokenize"]["cpu_s"] for r in gatelab_runs)
    bare_cpu = statistics.median(r["cpu_s"] for r in bare_runs)
    return {
        "text_mb": sum(len(t.encode()) for t in texts) / 1e6, "documents": len(texts), **sources,
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


def paired_tokenize(tokenizer, jsonl: Path, folder: Path, mb: float, pairs: int) -> dict:
    """gatelab's `shards.write_split` and the bare loop on the documents of the first `mb` MB of a split file, in
    `pairs` back-to-back pairs (alternating which goes first): each pair's two runs see nearly the same machine load."""
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
