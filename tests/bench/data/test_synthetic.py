"""`gatelab bench --data` (gatelab.bench.data.synthetic): the synthetic corpus it reads at scale is gatelab's shard
format. (The bench itself runs for minutes: results/bench/data.md is its output, with the command.)"""

from __future__ import annotations

import hashlib

import numpy as np

from gatelab.bench.data import synthetic
from gatelab.data.datasets import train_dataset
from gatelab.data.shards import SplitShards


def test_the_synthetic_corpus_is_whole_shards_in_gatelab_s_format(tmp_path):
    spec = synthetic.synthetic_spec(300_000, 20_000, vocab=512, shard_tokens=100_000)
    assert not synthetic.write_synthetic(tmp_path, spec, log=lambda *_: None)["cached"]
    corpus = synthetic.load_synthetic(tmp_path)
    train = corpus.get(synthetic.SYNTH_DOMAIN, "train")
    assert len(train.tokens) == 300_000 and len(train.tokens.paths) == 3
    record = SplitShards.read(tmp_path / "synth.train" / "split.json")
    for shard in record.shards:
        assert hashlib.sha256((tmp_path / "synth.train" / shard.file).read_bytes()).hexdigest() == shard.sha256
    tokens = np.asarray(train.tokens)
    starts, ends = train.doc_starts[:-1], train.doc_starts[1:]
    assert (tokens[starts] == corpus.bos_id).all() and (tokens[ends - 1] == corpus.eos_id).all()
    lengths = ends - starts  # 2,048-8,192 tokens, but for the last of each shard, cut to fill the shard exactly
    assert (lengths < 2048).sum() <= len(record.shards) and lengths.min() >= 3 and lengths.max() <= 8192 + 2
    assert tokens.max() < 512 and train.unigram_counts.sum() == 300_000
    assert (train.unigram_counts == np.bincount(tokens, minlength=512)).all()
    assert len(train.doc_ids) == len(starts)
    assert len(train_dataset(corpus, 16, seed=0)) > 0
    assert synthetic.write_synthetic(tmp_path, spec, log=lambda *_: None)["cached"]  # whole: not written again
