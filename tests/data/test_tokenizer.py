"""Tokenizer: lossless round trip, special ids, training on the training split only, cache by content hash."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from gatelab.data import tokenizer as tokmod
from gatelab.data.corpora import CorpusManifest, DataError, domains_from_files
from gatelab.data.tokenizer import (
    BOS,
    EOS,
    PAD,
    bos_id,
    eos_id,
    load_or_train_tokenizer,
    pad_id,
    tokenizer_fingerprint,
    tokenizer_key,
    training_texts,
)

VOCAB = 320


def write_domain(root: Path, domain: str, words: list[str], n_docs: int, seed: int) -> list[Path]:
    rng = random.Random(seed)
    paths = []
    for i in range(n_docs):
        path = root / domain / f"doc{i:03d}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = (" ".join(rng.choice(words) for _ in range(12)) + "." for _ in range(20 + i))
        path.write_text(f"{domain} document {i}\n" + "\n".join(lines), encoding="utf-8")
        paths.append(path)
    return paths


@pytest.fixture
def manifest(tmp_path: Path) -> CorpusManifest:
    prose = "the whale sea ship captain night naïve café — “quoted” words".split()
    code = "def return self if else for in None import class lambda ( ) : = +".split()
    files = {
        "prose": write_domain(tmp_path / "in", "prose", prose, 20, 1),
        "snippets": write_domain(tmp_path / "in", "snippets", code, 20, 2),
    }
    return domains_from_files(files, tmp_path / "data", log=lambda _: None)


def test_round_trip_and_special_ids(manifest: CorpusManifest) -> None:
    tok = load_or_train_tokenizer(manifest, VOCAB, log=lambda _: None)
    assert tok.get_vocab_size() == VOCAB
    assert (bos_id(tok), eos_id(tok), pad_id(tok)) == tuple(tok.token_to_id(t) for t in (BOS, EOS, PAD))
    assert len({bos_id(tok), eos_id(tok), pad_id(tok)}) == 3
    for text in ["the whale\n\tdef f(x): return x", "naïve café — “日本語” 🐋", "  leading spaces\r\n"]:
        assert tok.decode(tok.encode(text).ids) == text
    # Merges were learned: frequent words take fewer tokens than their bytes.
    assert len(tok.encode("the whale").ids) < len(b"the whale")


def test_second_call_loads_from_cache(manifest: CorpusManifest, monkeypatch: pytest.MonkeyPatch) -> None:
    logs: list[str] = []
    first = load_or_train_tokenizer(manifest, VOCAB, log=logs.append)
    key = tokenizer_key(manifest, VOCAB, manifest.available_domains)
    assert (manifest.data_dir / "tokenizers" / key / "tokenizer.json").is_file()

    def no_training(*_: object) -> None:
        raise AssertionError("the cached tokenizer should have been loaded, not trained")

    monkeypatch.setattr(tokmod, "_train_tokenizer", no_training)
    second = load_or_train_tokenizer(manifest, VOCAB, log=logs.append)
    assert tokenizer_fingerprint(second) == tokenizer_fingerprint(first)
    assert "loaded" in logs[-1]


def test_cache_key_follows_vocab_domains_and_settings(manifest: CorpusManifest) -> None:
    domains = manifest.available_domains
    base = tokenizer_key(manifest, VOCAB, domains)
    assert base == tokenizer_key(manifest, VOCAB, list(reversed(domains)))
    assert base != tokenizer_key(manifest, VOCAB + 1, domains)
    assert base != tokenizer_key(manifest, VOCAB, ["prose"])
    assert base != tokenizer_key(manifest, VOCAB, domains, max_chars_per_domain=1000)


def test_training_reads_only_the_training_split(manifest: CorpusManifest) -> None:
    texts = list(training_texts(manifest, manifest.available_domains, max_chars_per_domain=10**9))
    train_texts = {d.text for domain in manifest.available_domains for d in manifest.documents(domain, "train")}
    heldout_texts = {d.text for domain in manifest.available_domains for d in manifest.documents(domain, "heldout")}
    assert set(texts) == train_texts and not set(texts) & heldout_texts
    capped = list(training_texts(manifest, ["prose"], max_chars_per_domain=500))
    assert sum(map(len, capped)) == 500


def test_vocab_size_too_small_is_a_clean_error(manifest: CorpusManifest) -> None:
    with pytest.raises(DataError, match="vocab_size 100"):
        load_or_train_tokenizer(manifest, 100)
