"""A byte-level BPE tokenizer trained locally on the training splits, cached by what it was trained on; or a foreign
tokenizer (a tokenizer.json file, a Hugging Face name) that `data.tokenizer` names, with its document framing tokens.

Byte-level BPE encodes any text (code, old spellings, em dashes) without an unknown token, and training it here
keeps the whole pipeline offline. The cache key hashes the training split checksums, the vocabulary size and every
training setting, so a changed corpus or setting trains a new tokenizer instead of reusing a stale one.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from gatelab.data.corpora import CorpusManifest, DataError, Log, atomic_write_text, heldout_score
from gatelab.data.hub import hub_unreachable

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

    `domains` defaults to every prepared domain, so all domains share one vocabulary, which may come out smaller than
    `vocab_size` when the text has fewer distinct merges.
    """
    if not MIN_VOCAB_SIZE <= vocab_size <= MAX_VOCAB_SIZE:
        raise DataError(f"vocab_size {vocab_size}: a byte-level BPE needs {MIN_VOCAB_SIZE}..{MAX_VOCAB_SIZE}")
    chosen = list(manifest.available_domains if domains is None else domains)
    if not chosen:
        raise DataError(f"{manifest.path}: no prepared domains to train a tokenizer on; run prepare first")
    key = tokenizer_key(manifest, vocab_size, chosen, max_chars_per_domain)
    path = manifest.data_dir / "tokenizers" / key / "tokenizer.json"
    cached = _cached_tokenizer(path, log)
    if cached is not None:
        log(f"tokenizer {key} loaded from {path}")
        return cached
    log(f"training a {vocab_size}-token byte-level BPE on {', '.join(chosen)} (key {key})")
    text = _train_tokenizer(training_texts(manifest, chosen, max_chars_per_domain), vocab_size).to_str(pretty=True)
    # The checksum first, so a tokenizer.json never goes without one. The text is what Tokenizer.save writes, but
    # written here a refused write is an OSError naming the file.
    atomic_write_text(_checksum_path(path), _sha256_text(text))
    atomic_write_text(path, text)
    # Return the saved text's tokenizer so a fresh run and a cached one are the very same object state.
    return Tokenizer.from_str(text)


def _checksum_path(path: Path) -> Path:
    return path.with_name("tokenizer.sha256")


def _sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _cached_tokenizer(path: Path, log: Log) -> Tokenizer | None:
    """The tokenizer cached at `path`, or None where there is none or it was damaged after it was trained (its
    sha256 is not the recorded one, or it does not load): the caller trains it again, as it would have been."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        log(f"{path}: unreadable ({exc}); training it again")
        return None
    try:
        recorded = _checksum_path(path).read_text(encoding="utf-8").strip()
    except OSError:
        recorded = None  # cached before checksums were recorded: loaded if it loads, and its checksum recorded
    if recorded is not None and recorded != _sha256_text(text):
        log(f"{path}: its sha256 is not the one recorded when it was trained (damaged since); training it again")
        return None
    try:
        tokenizer = Tokenizer.from_str(text)
    except Exception as exc:  # noqa: BLE001  the tokenizers library raises bare Exception on a bad file
        log(f"{path}: not a tokenizer the tokenizers library can load ({_first_line(exc)}); training it again")
        return None
    if recorded is None:
        with suppress(OSError):  # a read-only cache: checked by loading alone
            atomic_write_text(_checksum_path(path), _sha256_text(text))
    return tokenizer


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


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


def bytes_per_token(tokenizer: Tokenizer) -> np.ndarray | None:
    """The UTF-8 bytes each token id stands for, by id (0 for a special token such as BOS/EOS), for bits per byte; None
    for a tokenizer that is not byte-level, whose runs log no bits per byte.

    A byte-level BPE's token is a fixed byte sequence, one character of the byte-level alphabet a byte, so its length
    is its bytes. Decoding a single token would not do: a token that holds half of a multi-byte character decodes to
    U+FFFD. A SentencePiece-style tokenizer (byte fallback, a prefix space stripped on decoding) has tokens whose
    bytes depend on their neighbours, so it gets no table rather than a wrong one (as does a ByteLevel-decoded
    vocabulary with a token outside the byte-level alphabet).
    """
    if not isinstance(tokenizer.decoder, decoders.ByteLevel):
        return None
    alphabet = set(pre_tokenizers.ByteLevel.alphabet())
    added = tokenizer.get_added_tokens_decoder()
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    table = np.zeros(max(vocab.values()) + 1, dtype=np.int64)
    for token, token_id in vocab.items():
        if token_id in added:  # matched on the raw text, not mapped through the alphabet
            table[token_id] = 0 if added[token_id].special else len(token.encode("utf-8"))
        elif set(token) <= alphabet:
            table[token_id] = len(token)
        else:
            return None
    return table


def tokenizer_fingerprint(tokenizer: Tokenizer) -> str:
    """A hash of the tokenizer's full serialized state: token caches built with it are keyed by this."""
    return hashlib.sha256(tokenizer.to_str().encode()).hexdigest()[:16]


# --- a tokenizer that is not trained here: a tokenizer.json file, or a Hugging Face tokenizer by name ----------------

# `data.tokenizer`'s default: the byte-level BPE above, trained to `model.vocab_size`.
TRAINED_BPE = "bpe"
# Documents are framed `<bos> text <eos>`. A foreign tokenizer's names for those tokens, in the order they are tried:
# GPT-2 and Qwen have only `<|endoftext|>` (their pretraining separates documents with it alone, so it serves as
# both), Llama 3 `<|begin_of_text|>`/`<|end_of_text|>`, Llama 2 and Mistral `<s>`/`</s>`.
BOS_CANDIDATES = ("<|begin_of_text|>", "<s>", "<|bos|>", BOS)
EOS_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<|eos|>", EOS)
_HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


@dataclass(frozen=True)
class ForeignTokenizer:
    """A tokenizer `data.tokenizer` names, loaded, with what a run needs of it besides the encoder itself."""

    tokenizer: Tokenizer
    identity: str  # what the spec hash records: "sha256:<hex>" of a file's bytes, or the Hub name
    vocab_size: int  # the largest id + 1 (added tokens included), which the embedding must cover
    bos: str
    eos: str

    @property
    def bos_id(self) -> int:
        return self.tokenizer.token_to_id(self.bos)

    @property
    def eos_id(self) -> int:
        return self.tokenizer.token_to_id(self.eos)


def is_hub_name(spec: str) -> bool:
    """`Qwen/Qwen3-0.6B` names a Hub tokenizer; an existing file, a name ending in .json or starting like a path does
    not."""
    if spec.endswith(".json") or spec.startswith(("/", "~", ".")) or Path(spec).expanduser().exists():
        return False
    return _HUB_NAME.fullmatch(spec) is not None


def _hub_file(name: str) -> Path:
    fix = (f"download https://huggingface.co/{name}/resolve/main/tokenizer.json on a machine with network and set "
           "data.tokenizer: /path/to/tokenizer.json")
    try:
        from huggingface_hub import hf_hub_download

        try:  # a copy in the local Hugging Face cache needs no network
            return Path(hf_hub_download(name, "tokenizer.json", local_files_only=True))
        except Exception:  # noqa: BLE001  not cached: ask the Hub, if it can be reached at all
            pass
        unreachable = hub_unreachable()
        if unreachable is None:
            return Path(hf_hub_download(name, "tokenizer.json", etag_timeout=5))
        reason = f"the Hub is unreachable ({unreachable}) and the file is not in the local Hugging Face cache"
    except ImportError:
        reason = "huggingface_hub is not installed"
    except Exception as exc:  # noqa: BLE001  unknown repo, no tokenizer.json, a dropped connection: one answer
        reason = type(exc).__name__
    raise DataError(f"data.tokenizer: {name}: cannot fetch its tokenizer.json from the Hugging Face Hub ({reason}); "
                    f"{fix}")


_LOADED: dict[tuple[str, ...], tuple[Tokenizer, str, int]] = {}


def _load_file(path: Path, spec: str) -> tuple[Tokenizer, str, int]:
    """(tokenizer, sha256 of the file's bytes, its vocabulary size: the largest id + 1), cached by path, size and
    modification time: configs load it often (a sweep plan once a cell), and get_vocab builds a dict of every token
    (0.2 s for Qwen's 151k, which made a 500-cell plan take minutes)."""
    if not path.is_file():
        raise DataError(f"data.tokenizer: {spec}: no such file; give `bpe`, the path of a tokenizer.json, or a Hugging "
                        "Face name such as Qwen/Qwen3-0.6B")
    stat = path.stat()
    key = (str(path.resolve()), str(stat.st_size), str(stat.st_mtime_ns))
    if key not in _LOADED:
        raw = path.read_bytes()
        try:
            tokenizer = Tokenizer.from_str(raw.decode("utf-8"))
        except Exception as exc:  # noqa: BLE001  the tokenizers library raises bare Exception on a bad file
            raise DataError(f"data.tokenizer: {spec}: not a tokenizer.json the tokenizers library can load "
                            f"({_first_line(exc)})") from None
        vocab_size = max(tokenizer.get_vocab(with_added_tokens=True).values()) + 1
        _LOADED[key] = (tokenizer, hashlib.sha256(raw).hexdigest(), vocab_size)
    return _LOADED[key]


def _framing_token(tokenizer: Tokenizer, spec: str, key: str, given: str | None,
                   candidates: tuple[str, ...]) -> str | None:
    if given is not None:
        if tokenizer.token_to_id(given) is None:
            raise DataError(f"data.{key}: {given!r} is not a token of data.tokenizer {spec}")
        return given
    return next((token for token in candidates if tokenizer.token_to_id(token) is not None), None)


def load_foreign_tokenizer(spec: str, bos_token: str | None = None, eos_token: str | None = None) -> ForeignTokenizer:
    """The tokenizer of a `data.tokenizer` file path or Hub name, with its framing tokens: `eos_token` (default: the
    first of EOS_CANDIDATES it has) and `bos_token` (default: the first of BOS_CANDIDATES, else the EOS token)."""
    hub = is_hub_name(spec)
    tokenizer, sha256, vocab_size = _load_file(_hub_file(spec) if hub else Path(spec).expanduser(), spec)
    eos = _framing_token(tokenizer, spec, "eos_token", eos_token, EOS_CANDIDATES)
    if eos is None:
        raise DataError(f"data.tokenizer: {spec} has none of the end-of-document tokens {', '.join(EOS_CANDIDATES)}; "
                        "name its own with data.eos_token (and data.bos_token if it has one)")
    bos = _framing_token(tokenizer, spec, "bos_token", bos_token, BOS_CANDIDATES) or eos
    return ForeignTokenizer(tokenizer, spec if hub else f"sha256:{sha256}", vocab_size, bos, eos)
