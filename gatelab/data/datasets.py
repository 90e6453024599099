"""Token streams on disk, seed-ordered training windows, held-out evaluation windows and a unigram baseline.

Each split of each domain is tokenized once into ``<data_dir>/tokens/<tokenizer fingerprint>/<domain>.<split>.bin``
(raw uint16 when the vocabulary fits, else uint32, read back as a numpy memmap) with a sidecar
``<domain>.<split>.json`` holding document ids and offsets. Every document is stored as
``<|bos|> text <|eos|>`` (a foreign tokenizer's own framing tokens instead, see `load_foreign_tokenizer`), so documents
stay separated and a window can start at a document boundary. The sidecar records the split file's checksum and the
framing ids: a rebuilt corpus, another tokenizer or other framing never reuses stale tokens.
"""

from __future__ import annotations

import itertools
import json
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer
from torch.utils.data import Dataset

from gatelab.data.corpora import SPLITS, CorpusManifest, DataError, Document, Log, atomic_write_text
from gatelab.data.tokenizer import bos_id, eos_id, tokenizer_fingerprint

_TOKENS_FORMAT = 1
_ENCODE_BATCH_DOCS = 64


@dataclass(frozen=True)
class TokenSplit:
    """One domain's split as a token stream: document i is ``tokens[doc_starts[i]:doc_starts[i + 1]]``."""

    domain: str
    split: str
    tokens: np.ndarray
    doc_starts: np.ndarray  # int64, n_docs + 1 entries, the last is len(tokens)
    doc_ids: tuple[str, ...]

    def document(self, index: int) -> np.ndarray:
        return self.tokens[self.doc_starts[index] : self.doc_starts[index + 1]]


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


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 halves disk and memory for vocabularies up to 65,536 ids; larger ones need uint32."""
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def cached_split_meta(directory: Path, domain: str, split: str, source_sha256: str) -> dict | None:
    """The sidecar of a cached split (n_tokens, dtype, doc_starts, ...) when the split is whole and was made from this
    text, else None: absent, damaged, cut short, or tokenized from another version of the split file."""
    bin_path = directory / f"{domain}.{split}.bin"
    try:
        meta = json.loads((directory / f"{domain}.{split}.json").read_text(encoding="utf-8"))
        if (
            meta["format"] != _TOKENS_FORMAT
            or meta["source_sha256"] != source_sha256
            or not isinstance(meta["n_tokens"], int)
            or bin_path.stat().st_size != meta["n_tokens"] * np.dtype(meta["dtype"]).itemsize
        ):
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None  # a damaged sidecar is rebuilt like a missing one
    return meta


def _load_split(directory: Path, domain: str, split: str, source_sha256: str, framing: tuple[int, int]
                ) -> TokenSplit | None:
    """The cached split, or None when it is absent, incomplete or made from other text or framing."""
    meta = cached_split_meta(directory, domain, split, source_sha256)
    # Sidecars written before the ids were recorded framed with the trained BPE's <|bos|> and <|eos|>.
    if meta is None or (meta.get("bos_id", framing[0]), meta.get("eos_id", framing[1])) != framing:
        return None
    try:
        starts = np.asarray(meta["doc_starts"], dtype=np.int64)
        ids = tuple(meta["doc_ids"])
    except (ValueError, KeyError, TypeError):
        return None
    tokens = np.memmap(directory / f"{domain}.{split}.bin", dtype=np.dtype(meta["dtype"]), mode="r",
                       shape=(meta["n_tokens"],))
    return TokenSplit(domain, split, tokens, starts, ids)


def _batches(docs: Iterator[Document], size: int) -> Iterator[list[Document]]:
    while batch := list(itertools.islice(docs, size)):
        yield batch


def _encode_split(
    manifest: CorpusManifest, tokenizer: Tokenizer, directory: Path, domain: str, split: str, framing: tuple[int, int]
) -> TokenSplit:
    dtype = token_dtype(_id_count(tokenizer))
    bos, eos = framing
    # A copy that reads "<|eos|>" written inside a document as plain text, so text can never forge a boundary.
    encoder = Tokenizer.from_str(tokenizer.to_str())
    encoder.encode_special_tokens = True
    bin_path = directory / f"{domain}.{split}.bin"
    tmp = bin_path.with_name(f"{bin_path.name}.{os.getpid()}.tmp")  # one per process: concurrent writers never collide
    ids: list[str] = []
    starts = [0]
    with tmp.open("wb") as out:
        for batch in _batches(manifest.documents(domain, split), _ENCODE_BATCH_DOCS):
            ids.extend(d.id for d in batch)
            for enc in encoder.encode_batch([d.text for d in batch], add_special_tokens=False):
                doc = np.empty(len(enc.ids) + 2, dtype=dtype)
                doc[0], doc[1:-1], doc[-1] = bos, enc.ids, eos
                out.write(doc.tobytes())
                starts.append(starts[-1] + len(doc))
    os.replace(tmp, bin_path)
    meta = {
        "format": _TOKENS_FORMAT,
        "dtype": dtype.name,
        "n_tokens": starts[-1],
        "source_sha256": getattr(manifest.record(domain), split).sha256,
        "bos_id": bos,
        "eos_id": eos,
        "doc_ids": ids,
        "doc_starts": starts,
    }
    # The sidecar is written last: its presence with a matching size means the .bin is complete.
    atomic_write_text(directory / f"{domain}.{split}.json", json.dumps(meta))
    tokens = np.memmap(bin_path, dtype=dtype, mode="r", shape=(starts[-1],))
    return TokenSplit(domain, split, tokens, np.asarray(starts, dtype=np.int64), tuple(ids))


def _id_count(tokenizer: Tokenizer) -> int:
    """The largest id + 1: a foreign tokenizer's added tokens may sit beyond its base vocabulary."""
    return max(tokenizer.get_vocab_size(), max(tokenizer.get_vocab(with_added_tokens=True).values()) + 1)


def tokenize_corpus(
    manifest: CorpusManifest, tokenizer: Tokenizer, domains: Sequence[str] | None = None, log: Log = print,
    framing: tuple[int, int] | None = None,
) -> TokenCorpus:
    """Tokenize both splits of each domain (default: every prepared domain) once; later calls memory-map them.

    `framing` is the (BOS, EOS) ids that open and close each document; default the trained BPE's <|bos|> and <|eos|>.
    """
    framing = (bos_id(tokenizer), eos_id(tokenizer)) if framing is None else framing
    chosen = list(manifest.available_domains if domains is None else domains)
    directory = manifest.data_dir / "tokens" / tokenizer_fingerprint(tokenizer)
    directory.mkdir(parents=True, exist_ok=True)
    splits: dict[tuple[str, str], TokenSplit] = {}
    for domain in chosen:
        for split in SPLITS:
            cached = _load_split(directory, domain, split, getattr(manifest.record(domain), split).sha256, framing)
            if cached is None:
                log(f"tokenizing {domain}/{split} into {directory}")
                cached = _encode_split(manifest, tokenizer, directory, domain, split, framing)
            splits[(domain, split)] = cached
    log(
        "tokens: "
        + ", ".join(f"{d} {len(splits[(d, 'train')].tokens):,}/{len(splits[(d, 'heldout')].tokens):,}" for d in chosen)
        + " (train/heldout)"
    )
    return TokenCorpus(directory, _id_count(tokenizer), *framing, splits)


class PackedDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Fixed-length training windows over per-domain token streams, in an order fixed by the seed alone.

    Window k of a domain is ``tokens[k * stride : k * stride + seq_len + 1]``: `input_ids` is its first
    `seq_len` tokens, `targets` its last `seq_len`. Windows never cross from one domain into another. The default
    stride, `seq_len`, has neighbouring windows share one token; `seq_len + 1` cuts the stream into disjoint windows
    (a stream of whole sequences of that length, as the synthetic tasks write). The order of
    all windows is ``numpy.random.default_rng(seed)``'s permutation (one fresh permutation per epoch, drawn from
    the same generator), and domains are taken in sorted name order, so the same seed and data give the same
    batches in the same order whatever the global RNG state, the caller's domain order or the DataLoader workers;
    use it with ``shuffle=False``.
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


def heldout_windows(corpus: TokenCorpus, domain: str, seq_len: int, max_windows: int) -> np.ndarray:
    """Up to `max_windows` non-overlapping held-out windows of ``seq_len + 1`` tokens, int64 ``(n, seq_len + 1)``.

    When there are more windows than the cap, evenly spaced ones are taken, so the sample spans all held-out
    documents instead of the first few; the choice is deterministic.
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


def unigram_perplexity(train_tokens: np.ndarray, heldout_tokens: np.ndarray, vocab_size: int) -> float:
    """Perplexity of an add-one smoothed unigram model fitted on `train_tokens`, on `heldout_tokens`.

    The floor a language model must clear: a trained model should reach at most half of it.
    """
    heldout = np.asarray(heldout_tokens, dtype=np.int64)
    if heldout.size == 0:
        raise DataError("unigram_perplexity needs at least one held-out token")
    counts = np.bincount(np.asarray(train_tokens, dtype=np.int64), minlength=vocab_size).astype(np.float64) + 1.0
    if len(counts) > vocab_size or heldout.max() >= vocab_size:
        raise DataError(f"token ids reach {max(len(counts) - 1, int(heldout.max()))}, beyond vocab_size {vocab_size}")
    log_probs = np.log(counts / counts.sum())
    return math.exp(-float(log_probs[heldout].mean()))
