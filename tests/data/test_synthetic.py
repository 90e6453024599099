"""Bigram-Backcopy: the generated sequences obey the task's rules, the config guards it, and a tiny run logs `bb/*`."""

from __future__ import annotations

from pathlib import Path

import mlflow
import numpy as np
import pytest

from gatelab.config import BigramBackcopyConfig
from gatelab.data.corpora import DataError
from gatelab.data.datasets import heldout_windows, train_dataset
from gatelab.data.identity import spec_hash
from gatelab.data.resolve import load_experiment
from gatelab.data.synthetic import BOS, DOMAIN, EOS, FIRST_ORDINARY, BigramBackcopy
from gatelab.errors import GatelabError
from tests.helpers import REPO

SEQ, VOCAB = 24, 20
CONFIG = BigramBackcopyConfig(n_triggers=3, train_sequences=300, heldout_sequences=40, zipf_exponent=1.0)
PRESET = REPO / "experiments" / "sink-bb.yaml"


@pytest.fixture(scope="module")
def task() -> BigramBackcopy:
    return BigramBackcopy.from_config(CONFIG, VOCAB)


@pytest.fixture(scope="module")
def corpus(task):
    return task.corpus(SEQ)


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_every_sequence_obeys_the_rules(task, corpus, split):
    held = corpus.get(DOMAIN, split)
    n = CONFIG.train_sequences if split == "train" else CONFIG.heldout_sequences
    assert len(held.doc_ids) == n and np.array_equal(held.doc_starts, np.arange(n + 1) * (SEQ + 1))
    ids_SL = np.asarray(held.tokens, dtype=np.int64).reshape(n, SEQ + 1)
    assert (ids_SL[:, 0] == BOS).all() and (ids_SL[:, 1:] >= FIRST_ORDINARY).all() and not (ids_SL == EOS).any()
    trigger_SL = task.is_trigger_V[ids_SL]
    assert not trigger_SL[:, 1].any()  # x1 comes from the non-trigger tokens
    rows, positions = np.nonzero(trigger_SL[:, :-1])
    assert len(rows) > 0.1 * n  # Zipfian rows: the triggers are frequent
    assert np.array_equal(ids_SL[rows, positions + 1], ids_SL[rows, positions - 1])  # the backcopy
    bigram_rows, bigram_positions = np.nonzero(~trigger_SL[:, 1:-1])
    assert len(set(ids_SL[bigram_rows, bigram_positions + 2].tolist())) > VOCAB // 2  # the chain moves elsewhere


def test_triggers_are_the_most_probable_tokens_of_the_stationary_distribution(task):
    assert np.allclose(task.stationary_N @ task.transitions_NN, task.stationary_N)
    assert np.allclose(task.transitions_NN.sum(axis=1), 1)
    pi_by_id = task.stationary_N[task.trigger_ids - FIRST_ORDINARY]
    others = np.delete(task.stationary_N, task.trigger_ids - FIRST_ORDINARY)
    assert len(task.trigger_ids) == CONFIG.n_triggers and pi_by_id.min() > others.max()
    assert 0 < task.entropy_rate < np.log(VOCAB - FIRST_ORDINARY)


def test_windows_are_whole_sequences(corpus):
    windows = train_dataset(corpus, SEQ, seed=0)
    assert len(windows) == CONFIG.train_sequences
    inputs, targets = zip(*(windows[i] for i in range(len(windows))), strict=True)
    assert all(x[0] == BOS for x in inputs) and not any((y == BOS).any() for y in targets)
    held = heldout_windows(corpus, DOMAIN, SEQ, max_windows=1000)
    assert held.shape == (CONFIG.heldout_sequences, SEQ + 1)
    assert np.array_equal(held.reshape(-1), corpus.tokens(DOMAIN, "heldout"))
    with pytest.raises(DataError, match="windows of 25 tokens, not seq_len \\+ 1 = 17"):
        train_dataset(corpus, 16, seed=0)  # a corpus built for one seq_len refuses another


def test_the_data_seed_alone_decides_the_data(corpus):
    again = BigramBackcopy.from_config(CONFIG, VOCAB).corpus(SEQ)
    other = BigramBackcopy.from_config(CONFIG.model_copy(update={"data_seed": 1}), VOCAB).corpus(SEQ)
    more_train = BigramBackcopy.from_config(CONFIG.model_copy(update={"train_sequences": 50}), VOCAB).corpus(SEQ)
    for split in ("train", "heldout"):
        assert np.array_equal(again.tokens(DOMAIN, split), corpus.tokens(DOMAIN, split))
        assert not np.array_equal(other.tokens(DOMAIN, split), corpus.tokens(DOMAIN, split))
    assert np.array_equal(more_train.tokens(DOMAIN, "heldout"), corpus.tokens(DOMAIN, "heldout"))


def test_config_errors_name_the_key():
    with pytest.raises(GatelabError, match=r"model.vocab_size \(7\) is too small .* at least 8"):
        load_experiment(PRESET, ["model.vocab_size=7"])
    load_experiment(PRESET, ["model.vocab_size=8"])
    with pytest.raises(GatelabError, match=r"eval.blimp_path must be unset with data.task 'bigram_backcopy'"):
        load_experiment(PRESET, ["eval.blimp_path=/data/blimp"])
    with pytest.raises(GatelabError, match=r"data.task: Input should be 'text' or 'bigram_backcopy'"):
        load_experiment(PRESET, ["data.task=bigram"])


def test_the_task_keys_leave_text_runs_hashes_alone():
    tiny = REPO / "experiments" / "tiny.yaml"
    text = spec_hash(load_experiment(tiny))
    assert spec_hash(load_experiment(tiny, ["data.task=text", "data.bigram_backcopy.n_triggers=5"])) == text
    synthetic = spec_hash(load_experiment(PRESET))
    assert spec_hash(load_experiment(PRESET, ["data.bigram_backcopy.n_triggers=5"])) != synthetic


@pytest.mark.slow
def test_a_tiny_run_logs_the_task_metrics(tmp_path: Path):
    from gatelab.train.run import run

    tiny = ["model.d_model=16", "model.head_dim=8", "model.ffn_hidden=32", "data.seq_len=16",
            "data.bigram_backcopy.train_sequences=64", "data.bigram_backcopy.heldout_sequences=16",
            "train.max_steps=4", "train.batch_size=4", "train.warmup_steps=1", "train.threads=1",
            "eval.batch_size=8", "eval.max_windows_per_domain=16", "eval.in_context_examples=2", "eval.probe_batches=1"]
    result = run(load_experiment(PRESET, tiny), runs_dir=tmp_path / "runs", quiet=True, log=lambda *_: None)
    assert result.status == "finished"
    names = ["bb/copy_accuracy", "bb/copy_loss", "bb/bigram_loss", "bb/bigram_loss_optimal",
             "bb/f_attn_trigger_queries", "bb/f_attn_other_queries"]
    logged = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}").get_run(result.run_id).data.metrics
    for name in names:
        assert np.isfinite(result.metrics[name]) and logged[name] == pytest.approx(result.metrics[name]), name
    assert 0 <= result.metrics["bb/copy_accuracy"] <= 1 and 0 < result.metrics["bb/f_attn_other_queries"] < 1
    assert result.metrics["bb/bigram_loss"] > result.metrics["bb/bigram_loss_optimal"] > 0  # 4 steps learn little
    assert "ppl/bigram_backcopy" in logged and "long_ppl/x1" not in logged  # long context needs the text 'speeches'
