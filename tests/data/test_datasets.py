"""Token datasets: document framing, caching, seed-fixed window order, evaluation windows, unigram baseline; each on
user files and on a `files` source read back from several shards a split."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch.utils.data import DataLoader

from gatelab.config import DataConfig, EvalBudget, EvalConfig
from gatelab.data import datasets as dsmod
from gatelab.data.corpora import CorpusManifest, DataError, domains_from_files
from gatelab.data.datasets import (
    PackedDataset,
    TokenCorpus,
    budget_tokens,
    budget_windows,
    evaluation_windows,
    heldout_windows,
    long_context_windows,
    tokenize_corpus,
    train_dataset,
    unigram_perplexity,
)
from gatelab.data.external import prepare_source
from gatelab.data.shards import SHARD_BYTES, TokenStream
from gatelab.data.tokenizer import bytes_per_token, load_or_train_tokenizer

SEQ = 16


@pytest.fixture(params=["user_files", "files"])
def setup(tmp_path: Path, request: pytest.FixtureRequest) -> tuple[CorpusManifest, TokenCorpus]:
    """Two domains of generated text, as user files (one document a file, one shard a split) or as a `files` source
    (a parquet file with a domain column, tokenized into shards of 2 KiB of text, so windows cross shards)."""
    rng = random.Random(0)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    files: dict[str, list[Path]] = {}
    records = []
    for domain in ("left", "right"):
        for i in range(24):
            path = tmp_path / "in" / domain / f"{i:02d}.txt"
            path.parent.mkdir(parents=True, exist_ok=True)
            # Every few documents is long, so long-context windows exist at 8 x SEQ tokens.
            n_words = 400 if i % 3 == 0 else 40
            text = " ".join(rng.choice(words) for _ in range(n_words))
            path.write_text(f"{domain} {i}: {text} <|eos|> literal", encoding="utf-8")
            files.setdefault(domain, []).append(path)
            records.append({"id": f"{domain}/{i:02d}", "text": path.read_text(encoding="utf-8"), "side": domain})
    if request.param == "user_files":
        manifest = domains_from_files(files, tmp_path / "data", log=lambda _: None)
        shard_bytes = SHARD_BYTES
    else:
        pq.write_table(pa.Table.from_pylist(records), tmp_path / "in.parquet")
        data = DataConfig.model_validate({"source": "files", "data_dir": str(tmp_path / "data"), "files": {
            "paths": [str(tmp_path / "in.parquet")], "id_field": "id", "domain_field": "side"}})
        manifest = prepare_source(data, log=lambda _: None)
        shard_bytes = 2048
    tok = load_or_train_tokenizer(manifest, 300, log=lambda _: None)
    corpus = tokenize_corpus(manifest, tok, log=lambda _: None, shard_bytes=shard_bytes)
    if request.param == "files":
        assert len(corpus.tokens("left", "train").paths) > 3  # several shards a split
    return manifest, corpus


def test_documents_are_framed_and_decode_back(setup: tuple[CorpusManifest, TokenCorpus]) -> None:
    manifest, corpus = setup
    tok = load_or_train_tokenizer(manifest, 300, log=lambda _: None)
    for domain in ("left", "right"):
        for split in ("train", "heldout"):
            part = corpus.get(domain, split)
            docs = list(manifest.documents(domain, split))
            assert part.tokens.dtype == np.uint16
            assert list(part.doc_ids) == [d.id for d in docs]
            tokens = np.asarray(part.tokens)
            assert int((tokens == corpus.bos_id).sum()) == len(docs)
            assert int((tokens == corpus.eos_id).sum()) == len(docs)
            for i, doc in enumerate(docs):
                ids = part.document(i)
                assert ids[0] == corpus.bos_id and ids[-1] == corpus.eos_id
                # "<|eos|>" written inside a document stays text, never a boundary.
                assert tok.decode(ids[1:-1].tolist()) == doc.text


def test_tokens_are_cached(setup: tuple[CorpusManifest, TokenCorpus], monkeypatch: pytest.MonkeyPatch) -> None:
    manifest, corpus = setup
    tok = load_or_train_tokenizer(manifest, 300, log=lambda _: None)

    def no_encoding(*_: object) -> None:
        raise AssertionError("cached token files should have been memory-mapped, not re-encoded")

    monkeypatch.setattr(dsmod, "write_split", no_encoding)
    again = tokenize_corpus(manifest, tok, log=lambda _: None)
    assert isinstance(again.tokens("left", "train"), TokenStream)
    assert np.array_equal(np.asarray(again.tokens("left", "train")), np.asarray(corpus.tokens("left", "train")))


def _items(dataset: PackedDataset) -> list[tuple[list[int], list[int]]]:
    return [(x.tolist(), y.tolist()) for x, y in (dataset[i] for i in range(len(dataset)))]


def test_windows_follow_the_seed_only(setup: tuple[CorpusManifest, TokenCorpus]) -> None:
    _, corpus = setup
    torch.manual_seed(1)
    np.random.seed(1)
    a = _items(train_dataset(corpus, SEQ, seed=7))
    torch.manual_seed(2)
    np.random.seed(2)
    reordered = {d: corpus.tokens(d, "train") for d in ("right", "left")}
    b = _items(PackedDataset(reordered, SEQ, seed=7))
    c = _items(train_dataset(corpus, SEQ, seed=8))
    assert a == b
    assert a != c and sorted(a) == sorted(c)  # same windows, another order
    for x, y in a:
        assert len(x) == len(y) == SEQ and x[1:] == y[:-1]


def test_a_stride_of_seq_len_plus_one_gives_disjoint_windows() -> None:
    stream = np.arange(3 * (SEQ + 1) + SEQ, dtype=np.int64)  # three whole windows and a partial one
    windows = _items(PackedDataset({"a": stream}, SEQ, seed=0, stride=SEQ + 1))
    starts = sorted(x[0] for x, _ in windows)
    assert starts == [0, SEQ + 1, 2 * (SEQ + 1)] and all(y[-1] == x[0] + SEQ for x, y in windows)
    assert len(PackedDataset({"a": stream}, SEQ, seed=0)) == (len(stream) - 1) // SEQ  # the default stride: seq_len


def test_batches_and_epochs(setup: tuple[CorpusManifest, TokenCorpus]) -> None:
    _, corpus = setup
    one = train_dataset(corpus, SEQ, seed=3)
    batches = [x for x, _ in DataLoader(one, batch_size=4, shuffle=False)]
    again = [x for x, _ in DataLoader(train_dataset(corpus, SEQ, seed=3), batch_size=4, shuffle=False)]
    assert all(torch.equal(p, q) for p, q in zip(batches, again, strict=True))
    assert batches[0].dtype == torch.int64 and batches[0].shape == (4, SEQ)

    two = train_dataset(corpus, SEQ, seed=3, epochs=2)
    assert len(two) == 2 * len(one)
    first, second = _items(two)[: len(one)], _items(two)[len(one) :]
    assert first == _items(one) and sorted(first) == sorted(second) and first != second
    left = corpus.tokens("left", "train")
    n_left = (len(left) - 1) // SEQ
    assert sum(one.domain_of(i) == "left" for i in range(len(one))) == n_left


def test_heldout_windows(setup: tuple[CorpusManifest, TokenCorpus]) -> None:
    _, corpus = setup
    held = corpus.tokens("left", "heldout")
    all_windows = heldout_windows(corpus, "left", SEQ, max_windows=10**6)
    assert all_windows.shape == (len(held) // (SEQ + 1), SEQ + 1)
    assert np.array_equal(all_windows.reshape(-1), held[: all_windows.size])  # contiguous, non-overlapping
    capped = heldout_windows(corpus, "left", SEQ, max_windows=3)
    assert capped.shape == (3, SEQ + 1) and capped.dtype == np.int64
    assert np.array_equal(capped[0], all_windows[0]) and np.array_equal(capped[-1], all_windows[-1])
    with pytest.raises(DataError, match="no window"):
        heldout_windows(corpus, "left", 10**7, max_windows=3)


def test_without_a_budget_the_evaluation_reads_exactly_the_spread_windows_of_before(setup) -> None:
    manifest, corpus = setup
    tok = load_or_train_tokenizer(manifest, 300, log=lambda _: None)
    windows = evaluation_windows(corpus, ["left", "right"], EvalConfig(max_windows_per_domain=3), SEQ, tok)
    for domain in ("left", "right"):
        assert np.array_equal(windows[domain], heldout_windows(corpus, domain, SEQ, max_windows=3))


def _budget_text(manifest: CorpusManifest, vocab_size: int, budget: EvalBudget) -> tuple[bytes, np.ndarray]:
    """The held-out text of `left` that `budget` holds under a BPE of `vocab_size` (special tokens dropped), and its
    windows."""
    tok = load_or_train_tokenizer(manifest, vocab_size, log=lambda _: None)
    corpus = tokenize_corpus(manifest, tok, log=lambda _: None)
    held = corpus.get("left", "heldout")
    end = budget_tokens(held, budget, bytes_per_token(tok))
    windows = evaluation_windows(corpus, ["left"], EvalConfig(budget=budget), SEQ, tok)["left"]
    assert np.array_equal(windows.reshape(-1), held.tokens[: windows.size]) and end - windows.size < SEQ + 1
    return tok.decode(np.asarray(held.tokens[:end]).tolist()).encode("utf-8"), windows


def test_a_documents_or_bytes_budget_is_the_same_text_under_two_tokenizers(setup) -> None:
    manifest, _ = setup
    documents = EvalBudget(documents=1)  # of the 2 held-out ones
    small, small_windows = _budget_text(manifest, 300, documents)
    large, large_windows = _budget_text(manifest, 400, documents)
    assert small == large and len(small_windows) != len(large_windows)  # one text, other tokens
    assert small == next(manifest.documents("left", "heldout")).text.encode("utf-8")
    bytes_budget = EvalBudget(bytes=700)
    small, _ = _budget_text(manifest, 300, bytes_budget)
    large, _ = _budget_text(manifest, 400, bytes_budget)
    shorter, longer = sorted((small, large), key=len)
    assert longer.startswith(shorter) and 700 - 40 < len(shorter) <= len(longer) <= 700  # up to a token short


def test_a_budget_the_text_cannot_fill_or_count_names_its_key(setup) -> None:
    _, corpus = setup
    with pytest.raises(DataError, match=r"eval.budget tokens=5: left's held-out text within it is 5 tokens"):
        budget_windows(corpus, "left", SEQ, EvalBudget(tokens=5))
    with pytest.raises(DataError, match="not byte-level.*use eval.budget.documents"):
        budget_windows(corpus, "left", SEQ, EvalBudget(bytes=10_000), token_bytes=None)
    whole = budget_windows(corpus, "left", SEQ, EvalBudget(documents=10**6))  # more than there is: all of it
    assert len(whole) == len(corpus.tokens("left", "heldout")) // (SEQ + 1)


def test_long_context_windows(setup: tuple[CorpusManifest, TokenCorpus]) -> None:
    _, corpus = setup
    windows = long_context_windows(corpus, "left", SEQ, max_docs=4)
    assert sorted(windows) == [1, 2, 4, 8]
    n_docs = len(windows[1])
    assert n_docs >= 1
    for m, arr in windows.items():
        assert arr.shape == (n_docs, m * SEQ + 1)
        assert np.all(arr[:, 0] == corpus.bos_id)
        assert np.array_equal(arr, windows[8][:, : m * SEQ + 1])  # the same documents at every length
    with pytest.raises(DataError, match="no held-out document"):
        long_context_windows(corpus, "left", 10**5)


def test_unigram_perplexity() -> None:
    rng = np.random.default_rng(0)
    vocab = 500

    def counts(tokens: np.ndarray) -> np.ndarray:
        return np.bincount(tokens, minlength=vocab)

    uniform = unigram_perplexity(counts(rng.integers(0, vocab, 500_000)), counts(rng.integers(0, vocab, 50_000)))
    assert uniform == pytest.approx(vocab, rel=0.02)
    skewed_train, skewed_held = rng.zipf(1.5, 200_000) % vocab, rng.zipf(1.5, 20_000) % vocab
    skewed = unigram_perplexity(counts(skewed_train), counts(skewed_held))
    assert skewed < vocab / 4
    # The counts' formula is the mean log-probability of the held-out tokens, token by token.
    smoothed = counts(skewed_train) + 1.0
    assert skewed == pytest.approx(np.exp(-np.log(smoothed / smoothed.sum())[skewed_held].mean()), rel=1e-12)
    with pytest.raises(DataError, match="same vocabulary"):
        unigram_perplexity(counts(np.array([0, 1])), np.bincount([vocab], minlength=vocab + 1))
    with pytest.raises(DataError, match="at least one held-out token"):
        unigram_perplexity(counts(np.array([0, 1])), np.zeros(vocab))
