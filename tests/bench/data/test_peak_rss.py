"""`gatelab bench --data` (gatelab.bench.data.peak_rss): a peak-RSS child trains over the synthetic corpus."""

from __future__ import annotations

import pytest

from gatelab.bench.data import peak_rss, synthetic


@pytest.mark.slow
def test_a_peak_rss_child_trains_over_the_synthetic_corpus_and_reports_its_peak(tmp_path):
    """The child process the bench starts per corpus (`python -m gatelab.bench.data rss ...`), for real: tiny's model,
    three Lightning steps over a small synthetic corpus."""
    spec = synthetic.synthetic_spec(300_000, 20_000, vocab=512, shard_tokens=100_000)
    synthetic.write_synthetic(tmp_path, spec, log=lambda *_: None)
    report = peak_rss.run_rss_child("synthetic", str(tmp_path), 3, "warm")
    assert (report["kind"], report["steps"], report["train_tokens"], report["cache"]) == ("synthetic", 3, 300_000,
                                                                                         "warm")
    assert report["peak_rss_gb"] >= report["peak_rss_by_stage_gb"]["after_imports"] > 0
    assert report["median_step_s"] > 0
