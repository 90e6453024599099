"""Token streams, seed-ordered training windows, held-out evaluation windows and a unigram baseline.

Each split of each domain is tokenized once into shards (`gatelab.data.shards`), every document framed by BOS and EOS
(a foreign tokenizer's own, see `load_foreign_tokenizer`). A split records its text's checksum and the framing ids: a
rebuilt corpus, another tokenizer or other framing never reuses stale tokens.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer
from torch.utils.data import Dataset

from gatelab.config import EvalBudget, EvalConfig
from gatelab.data.corpora import SPLITS, CorpusManifest, DataError, Log
from gatelab.data.shards import (
    SHARD_BYTES,
    LoadedSplit,
    Progress,
    SplitShards,
    id_count,
    load_split,
    write_manifest,
    write_split,
)
from gatelab.data.tokenizer import bos_id, bytes_per_token, eos_id, tokenizer_fingerprint


@dataclass(frozen=True)
class TokenSplit:
    """One domain's split as a token stream: document i is ``tokens[doc_starts[i]:doc_starts[i + 1]]``.

    `tokens` is a `shards.TokenStream` for a prepared corpus, or an array for one made in memory; both slice like an
    array. `unigram_counts` (token counts of the split) is None where it has not been counted.
    """

    domain: str
    split: str
    tokens: np.ndarray
    doc_starts: np.ndarray  # int64, n_docs + 1 entries, the last is len(tokens)
    doc_ids: Sequence[str]
    unigram_counts: np.ndarray | None = field(default=None, compare=False)

    def document(self, index: int) -> np.ndarray:
        return self.tokens[int(self.doc_starts[index]) : int(self.doc_starts[index + 1])]

    def counts(self, vocab_size: int) -> np.ndarray:
        """Token counts of the split, `vocab_size` entries (counted here when the split was made in memory)."""
        if self.unigram_counts is not None:
            return self.unigram_counts[:vocab_size]
        return np.bincount(np.asarray(self.tokens, dtype=np.int64), minlength=vocab_size)[:vocab_size]


@dataclass(frozen=True)
class TokenCorpus:
    """Every tokenized split of the chosen domains, under one tokenizer."""

    directory: Path
    vocab_size: int
    bos_id: int
    eos_id: int
    splits: dict[tuple[str, str], TokenSplit]
    # Set where every document is a whole training window of this many tokens (a synthetic task's sequences):
    # `train_dataset` then cuts windows at document starts. None for text, whose documents are packed.
    window_tokens: int | None = None

    @property
    def domains(self) -> list[str]:
        return list(dict.fromkeys(domain for domain, _ in self.splits))

    def get(self, domain: str, split: str) -> TokenSplit:
        try:
            return self.splits[(domain, split)]
        except KeyError:
            raise DataError(
                f"{self.directory}: no tokens for {domain}/{split}; tokenized domains are {', '.join(self.domains)}, "
                f"splits {', '.join(SPLITS)}"
            ) from None

    def tokens(self, domain: str, split: str) -> np.ndarray:
        return self.get(domain, split).tokens


def split_folder(directory: Path, domain: str, split: str) -> Path:
    return directory / f"{domain}.{split}"


def cached_split_tokens(directory: Path, domain: str, split: str, source_sha256: str) -> int | None:
    """The token count of a whole split made from this text (any framing), else None: for the plan's budget."""
    record = SplitShards.read(split_folder(directory, domain, split) / "split.json")
    return record.tokens if record is not None and record.source_sha256 == source_sha256 else None


def _as_split(domain: str, split: str, loaded: LoadedSplit) -> TokenSplit:
    return TokenSplit(domain, split, loaded.tokens, loaded.doc_starts, loaded.doc_ids, loaded.unigram_counts)


def tokenize_corpus(
    manifest: CorpusManifest, tokenizer: Tokenizer, domains: Sequence[str] | None = None, log: Log = print,
    framing: tuple[int, int] | None = None, shard_bytes: int = SHARD_BYTES, progress: Progress | None = None,
    sources: dict | None = None, warn: Log | None = None,
) -> TokenCorpus:
    """Tokenize both splits of each domain (default: every prepared domain) into shards once; later calls read them
    in place, and a killed prepare keeps its finished shards. `framing`: the (BOS, EOS) ids around each document,
    default the trained BPE's. `warn` names a split's damaged file even where `log` is silenced.
    """
    framing = (bos_id(tokenizer), eos_id(tokenizer)) if framing is None else framing
    chosen = list(manifest.available_domains if domains is None else domains)
    fingerprint = tokenizer_fingerprint(tokenizer)
    directory = manifest.data_dir / "tokens" / fingerprint
    directory.mkdir(parents=True, exist_ok=True)
    progress = progress or Progress()
    progress.start(sum((manifest.data_dir / getattr(manifest.record(d), s).path).stat().st_size
                       for d in chosen for s in SPLITS))
    splits: dict[tuple[str, str], TokenSplit] = {}
    records: dict[tuple[str, str], SplitShards] = {}
    wrote = False
    for domain in chosen:
        for split in SPLITS:
            source = getattr(manifest.record(domain), split)
            folder = split_folder(directory, domain, split)
            loaded = load_split(folder, source.sha256, framing, warn or log)
            if loaded is None:
                log(f"tokenizing {domain}/{split} into {folder}")
                started = time.perf_counter()
                loaded = write_split(tokenizer, manifest.data_dir / source.path, source.sha256, folder, framing,
                                     shard_bytes, progress, log)
                seconds = time.perf_counter() - started
                log(f"  {loaded.record.documents:,} documents, {loaded.record.tokens:,} tokens in "
                    f"{len(loaded.record.shards)} shard(s), {seconds:.1f} s "
                    f"({loaded.record.tokens / max(seconds, 1e-9):,.0f} tokens/s)")
                wrote = True
            else:
                progress.advance(loaded.record.documents, loaded.record.tokens,
                                 (manifest.data_dir / source.path).stat().st_size)
            splits[(domain, split)] = _as_split(domain, split, loaded)
            records[(domain, split)] = loaded.record
    if wrote or not (directory / "manifest.json").is_file():
        # Every chosen split, also those a killed prepare finished before this call resumed it.
        if sources is None:
            sources = {name: {"version": rec.version, "sha256": {a.file: a.sha256 for a in rec.artifacts}}
                       for name, rec in manifest.sources.items()}
        write_manifest(directory, fingerprint, id_count(tokenizer), framing, sources, records)
    log(
        "tokens: "
        + ", ".join(f"{d} {len(splits[(d, 'train')].tokens):,}/{len(splits[(d, 'heldout')].tokens):,}" for d in chosen)
        + " (train/heldout)"
    )
    return TokenCorpus(directory, id_count(tokenizer), *framing, splits)


class PackedDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Fixed-length training windows over per-domain token streams, in an order fixed by the seed alone.

    Window k of a domain is ``tokens[k * stride : k * stride + seq_len + 1]`` and never crosses into another domain;
    stride `seq_len + 1` cuts a stream of whole sequences (as the synthetic tasks write) into disjoint windows. The
    order is ``numpy.random.default_rng(seed)``'s permutation per epoch over domains in sorted name order, so it does
    not depend on the global RNG state, the caller's domain order or the DataLoader workers: use ``shuffle=False``.
    """

    def __init__(self, streams: Mapping[str, np.ndarray], seq_len: int, seed: int, epochs: int = 1,
                 stride: int | None = None) -> None:
        self.stride = seq_len if stride is None else stride
        if seq_len < 1 or epochs < 1 or self.stride < 1:
            raise DataError(f"seq_len ({seq_len}), epochs ({epochs}) and stride ({stride}) must be at least 1")
        self.seq_len = seq_len
        self.domains = sorted(streams)
        self._streams = [streams[d] for d in self.domains]
        counts = [max(0, (len(s) - seq_len - 1) // self.stride + 1) for s in self._streams]
        if sum(counts) == 0:
            sizes = ", ".join(f"{d}: {len(s)}" for d, s in zip(self.domains, self._streams, strict=True))
            raise DataError(f"no window of {seq_len + 1} tokens fits in the training streams ({sizes} tokens)")
        self._bounds = np.cumsum([0, *counts])
        rng = np.random.default_rng(seed)
        self._order = np.concatenate([rng.permutation(self._bounds[-1]) for _ in range(epochs)])

    def __len__(self) -> int:
        return len(self._order)

    def _locate(self, index: int) -> tuple[int, int]:
        window = int(self._order[index])
        domain = int(np.searchsorted(self._bounds, window, side="right")) - 1
        return domain, (window - int(self._bounds[domain])) * self.stride

    def domain_of(self, index: int) -> str:
        """The domain that item `index` comes from, for per-domain analyses such as routing statistics."""
        return self.domains[self._locate(index)[0]]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        domain, start = self._locate(index)
        chunk = torch.from_numpy(self._streams[domain][start : start + self.seq_len + 1].astype(np.int64))
        return chunk[:-1], chunk[1:]


def train_dataset(
    corpus: TokenCorpus, seq_len: int, seed: int, domains: Sequence[str] | None = None, epochs: int = 1
) -> PackedDataset:
    """The training windows of the chosen domains (default: all tokenized ones); a corpus of whole windows
    (`window_tokens`) is cut at its document starts, so no window spans two documents."""
    chosen = corpus.domains if domains is None else list(domains)
    if corpus.window_tokens is not None and corpus.window_tokens != seq_len + 1:
        raise DataError(f"{corpus.directory}: its documents are windows of {corpus.window_tokens} tokens, not "
                        f"seq_len + 1 = {seq_len + 1}; build the corpus for this seq_len")
    return PackedDataset({d: corpus.tokens(d, "train") for d in chosen}, seq_len, seed, epochs, corpus.window_tokens)


def check_windows(corpus: TokenCorpus, domains: Sequence[str], seq_len: int) -> None:
    """A DataError naming `data.seq_len` unless the training text holds a window of ``seq_len + 1`` tokens and every
    domain's held-out text holds one (what training and evaluation will cut), so a run fails before it starts."""
    width = seq_len + 1
    train = {d: len(corpus.tokens(d, "train")) for d in domains}
    heldout = {d: len(corpus.tokens(d, "heldout")) for d in domains}
    if corpus.window_tokens is None and max(train.values(), default=0) < width:
        raise DataError(f"data.seq_len {seq_len}: the training text holds no window of {width} tokens ("
                        + ", ".join(f"{d}: {n:,}" for d, n in train.items())
                        + " tokens); lower data.seq_len or add text to the corpus")
    short = {d: n for d, n in heldout.items() if n < width}
    if short:
        raise DataError(f"data.seq_len {seq_len}: the held-out text of {', '.join(short)} holds no window of {width} "
                        "tokens (" + ", ".join(f"{d}: {n:,}" for d, n in short.items()) + " tokens); lower "
                        "data.seq_len, add text, or leave the domain out of data.domains")


def heldout_windows(corpus: TokenCorpus, domain: str, seq_len: int, max_windows: int) -> np.ndarray:
    """Up to `max_windows` non-overlapping held-out windows of ``seq_len + 1`` tokens, int64 ``(n, seq_len + 1)``.

    Past the cap, evenly spaced ones, so the sample spans all held-out documents instead of the first few.
    """
    tokens = corpus.tokens(domain, "heldout")
    width = seq_len + 1
    available = len(tokens) // width
    if available == 0 or max_windows < 1:
        raise DataError(
            f"{domain}: {len(tokens)} held-out tokens hold no window of {width}; lower seq_len or add held-out text"
        )
    picks = np.unique(np.linspace(0, available - 1, min(max_windows, available)).round().astype(np.int64))
    return np.stack([np.asarray(tokens[i * width : (i + 1) * width], dtype=np.int64) for i in picks])


def evaluation_windows(corpus: TokenCorpus, domains: Sequence[str], evaluation: EvalConfig, seq_len: int,
                       tokenizer: Tokenizer | None) -> dict[str, np.ndarray]:
    """The held-out windows the end-of-run scores read, by domain: those of `evaluation.budget` (`budget_windows`),
    or without one `heldout_windows`' max_windows_per_domain."""
    budget = evaluation.budget
    if budget is None:
        return {d: heldout_windows(corpus, d, seq_len, evaluation.max_windows_per_domain) for d in domains}
    token_bytes = bytes_per_token(tokenizer) if budget.bytes is not None and tokenizer is not None else None
    return {d: budget_windows(corpus, d, seq_len, budget, token_bytes) for d in domains}


def budget_windows(corpus: TokenCorpus, domain: str, seq_len: int, budget: EvalBudget,
                   token_bytes: np.ndarray | None = None) -> np.ndarray:
    """The held-out text `budget` names, from the split's start, packed into consecutive windows of ``seq_len + 1``
    tokens, int64 ``(n, seq_len + 1)``; a tail shorter than a window is dropped. `token_bytes` (`bytes_per_token`'s
    table) counts a bytes budget. Unlike `heldout_windows`' spread, the same documents or bytes under any tokenizer."""
    held = corpus.get(domain, "heldout")
    width = seq_len + 1
    end = budget_tokens(held, budget, token_bytes)
    if end < width:
        raise DataError(f"eval.budget {budget.name}: {domain}'s held-out text within it is {end} tokens, less than "
                        f"one window of data.seq_len + 1 = {width}; raise eval.budget.{budget.unit} or lower "
                        "data.seq_len")
    count = end // width
    return np.asarray(held.tokens[: count * width], dtype=np.int64).reshape(count, width)


BUDGET_CHUNK_TOKENS = 1 << 20  # a bytes budget is counted this many tokens at a time, not over a whole large split


def budget_tokens(held: TokenSplit, budget: EvalBudget, token_bytes: np.ndarray | None) -> int:
    """How many of the split's first tokens the budget holds (all of them where it holds more)."""
    if budget.documents is not None:
        return int(held.doc_starts[min(budget.documents, len(held.doc_starts) - 1)])
    if budget.tokens is not None:
        return min(budget.tokens, len(held.tokens))
    if token_bytes is None:
        raise DataError(f"eval.budget {budget.name}: the tokenizer is not byte-level (or there is none), so its "
                        "tokens' bytes are not fixed and a bytes budget cannot be counted; use eval.budget.documents, "
                        "the same text under any tokenizer")
    counted = 0
    for start in range(0, len(held.tokens), BUDGET_CHUNK_TOKENS):
        chunk = np.asarray(held.tokens[start : start + BUDGET_CHUNK_TOKENS], dtype=np.int64)
        cumulative = counted + np.cumsum(token_bytes[chunk])
        within = int(np.searchsorted(cumulative, budget.bytes, side="right"))
        if within < len(chunk):
            return start + within
        counted = int(cumulative[-1])
    return len(held.tokens)


def long_context_windows(
    corpus: TokenCorpus,
    domain: str,
    seq_len: int,
    multipliers: Sequence[int] = (1, 2, 4, 8),
    max_docs: int = 16,
) -> dict[int, np.ndarray]:
    """Prefixes of long held-out documents for evaluating at 1x/2x/4x/8x the training length.

    Only documents with at least ``max(multipliers) * seq_len + 1`` tokens are used (the first `max_docs` by id),
    and the same documents appear at every length, so losses across lengths compare like with like. Returns
    ``{m: int64 array (n_docs, m * seq_len + 1)}``; each row is the document's start, beginning with ``<|bos|>``.
    """
    if not multipliers or min(multipliers) < 1:
        raise DataError(f"multipliers {list(multipliers)}: give positive integers such as 1, 2, 4, 8")
    held = corpus.get(domain, "heldout")
    needed = max(multipliers) * seq_len + 1
    lengths = np.diff(held.doc_starts)
    chosen = [i for i in range(len(held.doc_ids)) if lengths[i] >= needed][:max_docs]
    if not chosen:
        longest = int(lengths.max()) if len(lengths) else 0
        raise DataError(
            f"{domain}: no held-out document has {needed} tokens (longest {longest}); "
            f"use a domain with long documents such as 'speeches', or lower seq_len or the multipliers"
        )
    return {
        m: np.stack([np.asarray(held.document(i)[: m * seq_len + 1], dtype=np.int64) for i in chosen])
        for m in sorted(set(multipliers))
    }


def domain_with_long_documents(corpus: TokenCorpus, domains: Sequence[str], min_tokens: int) -> str | None:
    """The domain with the most held-out documents of at least `min_tokens` tokens (the first by name on a tie), or
    None where no document is that long: where long-context evaluation has the most to average over."""
    counts = {d: int((np.diff(corpus.get(d, "heldout").doc_starts) >= min_tokens).sum()) for d in sorted(domains)}
    best = max(counts, key=lambda d: counts[d], default=None)
    return best if best is not None and counts[best] > 0 else None


def unigram_perplexity(train_counts: np.ndarray, heldout_counts: np.ndarray) -> float:
    """Perplexity on the held-out tokens of an add-one smoothed unigram model of the training tokens, from the two
    splits' token counts: the floor a language model must clear (a trained one reaches at most half of it)."""
    heldout = np.asarray(heldout_counts, dtype=np.float64)
    if heldout.sum() == 0:
        raise DataError("unigram_perplexity needs at least one held-out token")
    if len(heldout) != len(train_counts):
        raise DataError(f"unigram_perplexity: counts over {len(train_counts)} and {len(heldout)} ids; count both "
                        "splits over the same vocabulary")
    smoothed = np.asarray(train_counts, dtype=np.float64) + 1.0
    log_probs = np.log(smoothed / smoothed.sum())
    return math.exp(-float(heldout @ log_probs) / float(heldout.sum()))
