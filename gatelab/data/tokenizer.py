"""A byte-level BPE tokenizer trained locally on the training splits, cached by what it was trained on.

Byte-level BPE encodes any text (code, old spellings, em dashes) without an unknown token, and training it here
keeps the whole pipeline offline. The cache key hashes the training split checksums, the vocabulary size and every
training setting, so a changed corpus or setting trains a new tokenizer instead of reusing a stale one.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Sequence

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from gatelab.data.corpora import CorpusManifest, DataError, Log, heldout_score

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
SPECIAL_TOKENS = (BOS, EOS, PAD)
# 256 byte symbols and the special tokens are always in the vocabulary; BPE merges need room beyond them.
MIN_VOCAB_SIZE = 256 + len(SPECIAL_TOKENS) + 1
MAX_VOCAB_SIZE = 2**32 - 1
# 2 M characters a domain trains an 8k-32k vocabulary in well under 20 s on 2 cores; more changes merges little.
DEFAULT_MAX_CHARS_PER_DOMAIN = 2_000_000
MIN_FREQUENCY = 2
_TOKENIZER_FORMAT = 1


def _settings(vocab_size: int, max_chars_per_domain: int) -> dict[str, object]:
    return {
        "format": _TOKENIZER_FORMAT,
        "model": "bpe",
        "pre_tokenizer": "byte_level(add_prefix_space=False)",
        "special_tokens": list(SPECIAL_TOKENS),
        "min_frequency": MIN_FREQUENCY,
        "vocab_size": vocab_size,
        "max_chars_per_domain": max_chars_per_domain,
    }


def tokenizer_key(
    manifest: CorpusManifest,
    vocab_size: int,
    domains: Sequence[str],
    max_chars_per_domain: int = DEFAULT_MAX_CHARS_PER_DOMAIN,
) -> str:
    """The cache key: a hash of the training splits' checksums, the vocabulary size and the settings."""
    payload = {
        "train_sha256": {d: manifest.record(d).train.sha256 for d in sorted(domains)},
        "settings": _settings(vocab_size, max_chars_per_domain),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def training_texts(manifest: CorpusManifest, domains: Sequence[str], max_chars_per_domain: int) -> Iterator[str]:
    """Training-split documents, at most `max_chars_per_domain` characters a domain (the last one truncated).

    Documents come in a fixed pseudo-random order (by id hash) so the cap samples a domain evenly rather than,
    say, only the earliest SOTU addresses; held-out text is never read.
    """
    for domain in domains:
        docs = sorted(manifest.documents(domain, "train"), key=lambda d: heldout_score("tokenizer:" + d.id))
        budget = max_chars_per_domain
        for doc in docs:
            if budget <= 0:
                break
            yield doc.text[:budget]
            budget -= len(doc.text)


def _train_tokenizer(texts: Iterator[str], vocab_size: int) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=MIN_FREQUENCY,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def load_or_train_tokenizer(
    manifest: CorpusManifest,
    vocab_size: int,
    domains: Sequence[str] | None = None,
    max_chars_per_domain: int = DEFAULT_MAX_CHARS_PER_DOMAIN,
    log: Log = print,
) -> Tokenizer:
    """The tokenizer for these training splits and settings: loaded from the cache, else trained and cached.

    `domains` defaults to every prepared domain, so all domains share one vocabulary. The file is
    ``<data_dir>/tokenizers/<key>/tokenizer.json``. The vocabulary may come out smaller than `vocab_size` when the
    text has fewer distinct merges.
    """
    if not MIN_VOCAB_SIZE <= vocab_size <= MAX_VOCAB_SIZE:
        raise DataError(f"vocab_size {vocab_size}: a byte-level BPE needs {MIN_VOCAB_SIZE}..{MAX_VOCAB_SIZE}")
    chosen = list(manifest.available_domains if domains is None else domains)
    if not chosen:
        raise DataError(f"{manifest.path}: no prepared domains to train a tokenizer on; run prepare first")
    key = tokenizer_key(manifest, vocab_size, chosen, max_chars_per_domain)
    path = manifest.data_dir / "tokenizers" / key / "tokenizer.json"
    if path.is_file():
        log(f"tokenizer {key} loaded from {path}")
        return Tokenizer.from_file(str(path))
    log(f"training a {vocab_size}-token byte-level BPE on {', '.join(chosen)} (key {key})")
    tokenizer = _train_tokenizer(training_texts(manifest, chosen, max_chars_per_domain), vocab_size)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # one per process: concurrent writers never collide
    tokenizer.save(str(tmp))
    tmp.replace(path)
    # Return the saved file's tokenizer so a fresh run and a cached one are the very same object state.
    return Tokenizer.from_file(str(path))


def special_id(tokenizer: Tokenizer, token: str) -> int:
    token_id = tokenizer.token_to_id(token)
    if token_id is None:
        raise DataError(f"tokenizer has no {token!r} token; train it with load_or_train_tokenizer")
    return token_id


def bos_id(tokenizer: Tokenizer) -> int:
    return special_id(tokenizer, BOS)


def eos_id(tokenizer: Tokenizer) -> int:
    return special_id(tokenizer, EOS)


def pad_id(tokenizer: Tokenizer) -> int:
    return special_id(tokenizer, PAD)


def tokenizer_fingerprint(tokenizer: Tokenizer) -> str:
    """A hash of the tokenizer's full serialized state: token caches built with it are keyed by this."""
    return hashlib.sha256(tokenizer.to_str().encode()).hexdigest()[:16]
