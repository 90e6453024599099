"""The end-of-run evaluation's bits per byte: logged for every domain by a real micro run, from the held-out pass's
NLLs, and shown by `gatelab table`; none where a token's bytes are not fixed."""

from __future__ import annotations

import csv
import math

import mlflow
import pytest
import torch
import yaml

from gatelab import metrics as catalogue
from gatelab.errors import GatelabError
from gatelab.tracking import EVAL_BUDGET_PARAM
from gatelab.train.evaluate import bits_per_byte_metrics
from tests.helpers import MICRO, sqlite_uri, train_in_process, write_micro_experiment


def test_a_run_logs_bits_per_byte_for_every_domain_and_gatelab_table_shows_their_mean(tmp_path):
    from gatelab.app.report import make_report
    from gatelab.workspace import Workspace

    runs = tmp_path / "runs"
    experiment = write_micro_experiment(tmp_path, max_steps=4, checkpoint_every=4)
    assert train_in_process(experiment, runs).status == "finished"
    mlflow.set_tracking_uri(sqlite_uri(runs))
    row = mlflow.search_runs(experiment_names=["micro"]).iloc[0]
    domains = MICRO["data"]["domains"]
    assert row[f"params.{EVAL_BUDGET_PARAM}"] == "windows=4x32"  # no eval.budget: the preset's windows, recorded
    bpb = {d: row[f"metrics.{catalogue.DOMAIN_BPB.format(domain=d)}"] for d in domains}
    assert row[f"metrics.{catalogue.BPB_AVG}"] == sum(bpb.values()) / len(bpb)  # the mean over domains, as ppl/avg
    for domain, value in bpb.items():
        # a token of English text holds more than one byte, so a byte costs fewer bits than a token
        bits_per_token = math.log2(row[f"metrics.{catalogue.DOMAIN_PPL.format(domain=domain)}"])
        assert 0 < value < bits_per_token, domain

    sweep = tmp_path / "sweep.yaml"  # the run again, as a one-cell sweep of the same spec
    sweep.write_text(yaml.safe_dump({"name": "micro", "experiment": experiment.name,
                                     "grid": {"variant": [MICRO["variant"]], "seed": [MICRO["seed"]]}}))
    out = tmp_path / "out"
    make_report(sweep, experiment=None, formats=["csv"], out_dir=out, workspace=Workspace(runs_dir=runs),
                log=lambda *args: None)
    table = next(csv.DictReader((out / "micro.csv").open()))
    assert table[catalogue.BPB_AVG] == f"{row[f'metrics.{catalogue.BPB_AVG}']:.3f} (1)"


def test_no_bits_per_byte_without_a_byte_level_tokenizer():
    from tokenizers import Tokenizer, decoders, models

    windows = {"d": torch.zeros(2, 5, dtype=torch.long)}
    nlls = {"d": (torch.ones(2, 4, dtype=torch.float64), torch.full((2,), 4))}
    assert bits_per_byte_metrics(None, windows, nlls, log=print) == {}  # a synthetic task: no text
    said = []
    word_level = Tokenizer(models.WordLevel({"a": 0}, unk_token="a"))
    word_level.decoder = decoders.WordPiece()
    assert bits_per_byte_metrics(word_level, windows, nlls, log=said.append) == {}
    assert said == ["the tokenizer is not byte-level, so a token's bytes are not fixed: no bits per byte"]


def test_a_run_scored_on_a_bytes_budget_records_it_and_one_the_text_cannot_fill_fails_before_training(tmp_path):
    runs = tmp_path / "runs"
    experiment = write_micro_experiment(tmp_path, max_steps=2, checkpoint_every=2)
    with pytest.raises(GatelabError, match="eval.budget tokens=8: scripture's held-out text within it is 8 tokens"):
        train_in_process(experiment, runs, "eval.budget.tokens=8")
    assert train_in_process(experiment, runs, "eval.budget.bytes=3000").status == "finished"
    mlflow.set_tracking_uri(sqlite_uri(runs))
    row = mlflow.search_runs(experiment_names=["micro"]).iloc[0]
    assert row[f"params.{EVAL_BUDGET_PARAM}"] == "bytes=3000" and row["params.eval.budget.bytes"] == "3000"
    assert row[f"metrics.{catalogue.BPB_AVG}"] > 0
