"""Counting a run's training tokens without building anything: exact from the token cache, estimated from the manifest,
unknown before `gatelab data prepare`, exact for the generated Bigram-Backcopy corpus; and the warning above one
pass."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from gatelab.config import DataConfig, ExperimentConfig
from gatelab.data import budget
from gatelab.data.budget import PREPARE_HINT, CorpusCounter, repeat_warning
from gatelab.data.corpora import CorpusManifest, domains_from_files
from gatelab.data.datasets import tokenize_corpus
from gatelab.data.prepare import load_data
from gatelab.data.synthetic import DOMAIN as BIGRAM_BACKCOPY
from gatelab.data.tokenizer import load_or_train_tokenizer
from tests.helpers import DENSE

VOCAB = 300
DOMAINS = ["left", "right"]


def _quiet(*_: object) -> None:
    pass


@pytest.fixture
def prepared(tmp_path: Path) -> tuple[DataConfig, int]:
    """Two user domains prepared and tokenized at VOCAB in tmp_path/data; their config and training-token count."""
    rng = random.Random(0)
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu"]
    files: dict[str, list[str]] = {}
    for domain in DOMAINS:
        for i in range(12):
            path = tmp_path / "in" / domain / f"{i:02d}.txt"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"{domain} {i}: " + " ".join(rng.choice(words) for _ in range(120)), encoding="utf-8")
            files.setdefault(domain, []).append(str(path))
    manifest = domains_from_files(files, tmp_path / "data", log=_quiet)
    corpus = tokenize_corpus(manifest, load_or_train_tokenizer(manifest, VOCAB, log=_quiet), log=_quiet)
    data = DataConfig(domains=DOMAINS, data_dir=str(tmp_path / "data"), user_files=files, seq_len=16)
    return data, sum(len(corpus.tokens(domain, "train")) for domain in DOMAINS)


def test_the_token_cache_gives_the_exact_count(prepared):
    data, train_tokens = prepared
    count = CorpusCounter()(data, VOCAB)
    assert (count.tokens, count.how) == (train_tokens, "exact")
    assert count.passes(2 * train_tokens) == 2


def test_without_this_tokenizer_the_count_is_an_estimate_from_the_nearest_cache(prepared):
    data, train_tokens = prepared
    count = CorpusCounter()(data, 320)  # no tokenizer of 320; the 300 cache is nearer than the measured 512
    assert count.how == "estimate" and "token cache" in count.note
    assert count.tokens == pytest.approx(train_tokens, rel=0.1)


@pytest.mark.parametrize("damage", ["corrupt", "missing", "stale"])
def test_a_damaged_sidecar_falls_back_to_the_estimate(prepared, damage):
    data, _ = prepared
    sidecar = next(Path(data.data_dir, "tokens").glob("*/left.train/split.json"))
    if damage == "corrupt":
        sidecar.write_text("{not json", encoding="utf-8")
    elif damage == "missing":
        sidecar.unlink()
    else:  # written for other text than the manifest's
        sidecar.write_text(sidecar.read_text().replace('"source_sha256": "', '"source_sha256": "0'), encoding="utf-8")
    count = CorpusCounter()(data, VOCAB)
    # The right domain's ratio comes from its cache, the left's from the figures measured on the built-in corpora.
    assert count.how == "estimate" and count.tokens > 0
    assert "vocab-" in count.note and "built-in corpora as a stand-in at vocab 512" in count.note


def test_the_measured_ratios_stand_in_when_nothing_is_cached(prepared):
    data, _ = prepared
    for path in Path(data.data_dir, "tokens").glob("*/*/split.json"):
        path.unlink()
    count = CorpusCounter()(data, 16384)
    assert count.how == "estimate" and "built-in corpora as a stand-in at vocab 16384" in count.note
    manifest = CorpusManifest.load(Path(data.data_dir))
    records = [manifest.domains[domain].train for domain in DOMAINS]
    chars_per_token = budget.MEASURED_CHARS_PER_TOKEN[16384]["all"]
    assert count.tokens == sum(round(r.chars / chars_per_token) + 2 * r.documents for r in records)


def test_unprepared_corpora_are_not_counted(tmp_path):
    count = CorpusCounter()(DataConfig(data_dir=str(tmp_path / "empty")), 4096)
    assert (count.tokens, count.how) == (None, "unknown") and PREPARE_HINT in count.note
    assert count.passes(1000) is None
    assert not (tmp_path / "empty").exists()  # counting creates nothing


def test_a_domain_missing_from_the_manifest_is_not_counted(prepared):
    data, _ = prepared
    count = CorpusCounter()(data.model_copy(update={"domains": [*DOMAINS, "elsewhere"]}), VOCAB)
    assert count.how == "unknown" and "elsewhere not prepared" in count.note


def test_the_bigram_backcopy_corpus_is_counted_exactly():
    experiment = ExperimentConfig(**{**DENSE, "data": {"task": "bigram_backcopy", "seq_len": 16,
                                                       "bigram_backcopy": {"train_sequences": 40}}})
    count = CorpusCounter()(experiment.data, experiment.model.vocab_size)
    assert (count.tokens, count.how) == (40 * 17, "exact")
    _, corpus, domains = load_data(experiment, log=_quiet, warn=_quiet)
    assert len(corpus.tokens(BIGRAM_BACKCOPY, "train")) == count.tokens and domains == [BIGRAM_BACKCOPY]


def test_counts_are_cached_per_data_config_and_vocabulary(prepared, monkeypatch):
    data, _ = prepared
    loads = []
    real_load = budget.CorpusManifest.load
    monkeypatch.setattr(budget.CorpusManifest, "load", lambda root: loads.append(root) or real_load(root))
    count = CorpusCounter()
    first = [count(data, VOCAB) for _ in range(100)]
    count(data, 320)
    assert len(loads) == 1 and all(c is first[0] for c in first)


def test_the_warning_names_the_factor_above_one_pass_only():
    data = DataConfig()
    assert repeat_warning("this run", data, 1000, 1000, 100) is None
    assert repeat_warning("this run", data, 999, 1000, 100) is None
    assert repeat_warning("this run", data, 1000, None, 100) is None
    message = repeat_warning("runs 0-2", data, 160_000, 1000, 100)
    assert message.startswith("runs 0-2 would pass over their corpus 160x")
    assert "data.user_files" in message and "train.max_steps to 10 for one pass" in message
    assert "about 1.5x" in repeat_warning("run 3", data, 1500, 1000, 100, estimated=True)
    tiny_corpus = repeat_warning("runs 0-14", data, 419 * 10**9, 6_490_000, 4 * 10**6)  # the paper's run, our data
    assert "max_steps to 1 " not in tiny_corpus and "far too small for this model" in tiny_corpus


def test_training_warns_at_its_start_with_the_exact_count(prepared):
    data, train_tokens = prepared
    tokens_per_step = 4 * data.seq_len
    steps = train_tokens // tokens_per_step  # just under one pass, then three passes
    for max_steps, warned in ((steps, False), (3 * steps + 3, True)):
        experiment = ExperimentConfig(**{**DENSE, "model": {**DENSE["model"], "vocab_size": VOCAB},
                                         "data": data.model_dump(), "train": {"max_steps": max_steps, "batch_size": 4}})
        warnings: list[str] = []
        load_data(experiment, log=_quiet, warn=warnings.append)
        assert bool(warnings) is warned, warnings
    assert warnings[0].startswith("warning: this run would pass over its corpus 3") and "one pass" in warnings[0]


def test_the_warning_says_how_to_add_data_to_each_kind_of_source():
    builtin = repeat_warning("this run", DataConfig(), 2_000, 1_000, 100)
    files_data = DataConfig.model_validate({"source": "files", "files": {"paths": ["x/*.parquet"]}})
    files = repeat_warning("this run", files_data, 2_000, 1_000, 100)
    assert "data.user_files" in builtin and "data.files.paths" in files and "data.user_files" not in files
    assert "lower train.max_steps to 10 for one pass" in files
