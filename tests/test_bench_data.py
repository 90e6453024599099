"""`gatelab bench --data`: the synthetic corpus is gatelab's shard format, and the quick bench reports every figure
(no figure is asserted against its target: the targets are the bench's to report)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from gatelab import bench_data
from gatelab.data.datasets import train_dataset
from gatelab.data.shards import SplitShards
from tests.helpers import REPO


def test_the_synthetic_corpus_is_whole_shards_in_gatelab_s_format(tmp_path):
    spec = bench_data.synthetic_spec(300_000, 20_000, vocab=512, shard_tokens=100_000)
    assert not bench_data.write_synthetic(tmp_path, spec, log=lambda *_: None)["cached"]
    corpus = bench_data.load_synthetic(tmp_path)
    train = corpus.get(bench_data.SYNTH_DOMAIN, "train")
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
    assert bench_data.write_synthetic(tmp_path, spec, log=lambda *_: None)["cached"]  # whole: not written again


@pytest.mark.slow
def test_the_quick_data_bench_reports_every_figure(tmp_path):
    out = tmp_path / "report" / "data.md"
    # An empty data directory: the text is the Python standard library's, whatever this machine has prepared.
    env = {**os.environ, "GATELAB_DATA_DIR": str(tmp_path / "data")}
    result = subprocess.run([sys.executable, "-m", "gatelab", "bench", "--data", "--quick", "--scratch",
                             str(tmp_path / "scratch"), "--out", str(out)],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.with_suffix(".json").read_text())

    tokenize = report["tokenize"]
    for key in ("whole_prepare_s", "whole_prepare_tokens_per_s", "stage_text_tokens_per_s", "bare_tokens_per_s",
                "ratio", "whole_ratio", "text_tokens"):
        assert tokenize[key] > 0, key
    assert tokenize["mb_by_source"] and tokenize["ratio_by_round"] and tokenize["profile"]["tokens"] > 0
    assert tokenize["paired"]["median_ratio"] > 0

    scale = report["scale"]
    assert scale["corpus"]["train_tokens"] == bench_data.QUICK.large_tokens
    assert scale["gatelab_maps_shards"] in (True, False)
    assert {row["loader"] for row in scale["loader"]} == {"StepBatches.batch", "DataLoader, 0 workers",
                                                          "DataLoader, 2 workers"}
    for row in scale["loader"]:
        assert row["windows_per_s"] > 0 and row["ratio_to_training"] > 0
    assert scale["training"]["windows_per_s"] > 0 and scale["consumed_windows_per_s"] > 0
    large, small = bench_data.QUICK.large_tokens, bench_data.QUICK.small_tokens
    assert [(row["kind"], row["train_tokens"]) for row in scale["rss"]] == [
        ("synthetic", large), ("synthetic", large), ("synthetic-memmap", large), ("synthetic", small)]
    assert not list((tmp_path / "scratch").glob("*fresh-copy*"))  # the copy for the freshly-written rows is gone
    assert all(row["peak_rss_gb"] > 0 and row["steps"] == bench_data.QUICK.rss_steps for row in scale["rss"])
    assert math.isfinite(scale["rss_difference_gb"])
    targets = [check["target"] for check in report["checks"]]
    assert all(check["measured"] is not None for check in report["checks"])
    assert sum(t.startswith("tokenize stage tokens/s") for t in targets) == 1
    assert sum(t.startswith("loader windows/s") for t in targets) == 5  # 3 with the page cache warm, 2 evicted
    assert sum(t.startswith("peak RSS") for t in targets) == 2  # the large corpus, evicted and freshly written

    markdown = out.read_text()
    assert markdown.startswith("# gatelab data bench\n\n`gatelab bench --data --quick")
    for heading in ("## Targets", "## 1. Tokenizing", "## 2. Reading at scale", "× training", "peak RSS"):
        assert heading in markdown
