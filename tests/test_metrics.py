"""The metric catalogue (gatelab.metrics) against what real runs record: a micro dense run and a micro MoE run, trained
in this process, their MLflow metric names read back."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gatelab import metrics
from gatelab.metrics import CATALOGUE, KEY_METRICS, PLACEHOLDERS, find, matching
from tests.helpers import REPO, made_once, sqlite_uri, train_in_process, write_micro_experiment

MOE_OVERRIDES = ("model.ffn=moe", "model.ffn_hidden=null", "model.moe.n_experts=4", "model.moe.top_k=2",
                 "model.moe.expert_hidden=16")


def _logged(folder, overrides: tuple[str, ...]) -> list[str]:
    import mlflow

    runs = folder / "runs"
    assert train_in_process(write_micro_experiment(folder), runs, *overrides).status == "finished"
    client = mlflow.MlflowClient(sqlite_uri(runs))
    (run,) = client.search_runs([experiment.experiment_id for experiment in client.search_experiments()])
    return sorted(run.data.metrics)


@pytest.fixture(scope="module")
def logged(tmp_path_factory) -> dict[str, list[str]]:
    """The metric names of a finished micro run (MICRO: g1_elem_sig, validation, BLiMP, long context at 1x and 2x) and
    of the same run with an MoE FFN."""
    def make(folder):
        (folder / "dense").mkdir()
        (folder / "moe").mkdir()
        return {"dense": _logged(folder / "dense", ()), "moe": _logged(folder / "moe", MOE_OVERRIDES)}

    return made_once(tmp_path_factory, "catalogue-runs", make)


def test_every_metric_a_run_logs_is_one_catalogue_entry(logged):
    names = sorted(set(logged["dense"]) | set(logged["moe"]))
    assert len(names) > 40
    assert {name: [metric.name for metric in matching(name)] for name in names
            if len(matching(name)) != 1} == {}


def test_every_entry_is_logged_by_a_micro_run_or_says_when_it_is_logged(logged):
    names = set(logged["dense"]) | set(logged["moe"])
    unlogged = [metric.name for metric in CATALOGUE if metric.condition is None
                and not any(metric.matches(name) for name in names)]
    assert unlogged == []


def test_an_entry_without_a_condition_is_logged_by_every_run(logged):
    for run, names in logged.items():
        missing = [metric.name for metric in CATALOGUE if metric.condition is None
                   and not any(metric.matches(name) for name in names)]
        assert missing == [], run


def test_the_moe_run_logs_what_only_moe_logs(logged):
    only_moe = set(logged["moe"]) - set(logged["dense"])
    assert only_moe == {"train/load_balance", "train/z_loss"}
    assert {find(name).condition for name in only_moe} == {"model.ffn moe"}


def test_each_entry_is_declared_once_with_known_placeholders_and_values():
    names = [metric.name for metric in CATALOGUE]
    assert len(names) == len(set(names))
    for metric in CATALOGUE:
        assert metric.better in ("lower", "higher", "none") and metric.unit and metric.about, metric.name
        assert metric.pattern  # every placeholder is one of PLACEHOLDERS (a KeyError otherwise)
        if not metric.is_family:
            assert find(metric.name) is metric
    assert set(PLACEHOLDERS) >= {"domain", "multiplier", "layer", "block"}


@pytest.mark.parametrize("name, entry", [("ppl/avg", "ppl/avg"), ("ppl/speeches", "ppl/{domain}"),
                                         ("long_ppl/x8", "long_ppl/x{multiplier}"),
                                         ("probe/sink_rate/layer11", "probe/sink_rate/layer{layer}"),
                                         ("lm_eval/hellaswag/acc_norm", "lm_eval/{task}/{measure}"),
                                         ("lm_eval/hellaswag/acc_norm/stderr", "lm_eval/{task}/{measure}/stderr")])
def test_a_name_finds_its_entry(name, entry):
    assert find(name).name == entry


@pytest.mark.parametrize("name, entry", [
    (metrics.DOMAIN_PPL.format(domain="speeches"), "ppl/{domain}"),
    (metrics.LONG_PPL_BEYOND_TRAIN.format(multiplier=4), "long_ppl_beyond_train/x{multiplier}"),
    (metrics.KURTOSIS_OF_BLOCK.format(block=3), "probe/kurtosis/block{block}"),
    (metrics.SPARSITY.format(measure="control_output_below_0.001"), "probe/sparsity_control_output_below_{threshold}"),
    (metrics.SPARSITY.format(measure="mean_abs_sdpa_output"), "probe/sparsity_mean_abs_sdpa_output"),
    (metrics.ICL.format(task="needle_len16"), "icl/needle_len{length}"),
    (metrics.LM_EVAL_STDERR.format(task="blimp", measure="acc"), "lm_eval/{task}/{measure}/stderr")])
def test_a_formatter_fills_in_a_name_of_its_entry(name, entry):
    assert find(name).name == entry


@pytest.mark.parametrize("fragment", ["long_ppl/x", "sink_rate/layer", "probe/sink_rate/layer", "probe/", "ppl/",
                                      "probe/{}", "lm_eval/hellaswag"])
def test_a_fragment_finds_nothing(fragment):
    assert find(fragment) is None


def test_one_key_metrics_tuple_read_by_the_ui_view_and_gatelab_train():
    import json

    from gatelab import tracking
    from gatelab.app import train

    assert KEY_METRICS is KEY_METRICS and train.KEY_METRICS is KEY_METRICS
    assert KEY_METRICS[:2] == ("ppl/avg", "val/loss") and "unigram_ppl/avg" in KEY_METRICS
    state = json.loads(json.loads(tracking.key_metrics_view(0))["state"])
    assert state["selectedColumns"][:-1] == [f"metrics.`{name}`" for name in KEY_METRICS]
    assert all(find(name).key for name in KEY_METRICS)


def test_the_catalogue_imports_without_torch():
    code = f"import sys; import {metrics.__name__}; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "False", result.stderr
