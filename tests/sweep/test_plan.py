"""`gatelab sweep plan`: parameters, paper columns, FLOPs and time per run, without allocating a weight."""

from __future__ import annotations

import csv
import json
import time

import pytest
import torch

from gatelab.app.plan import show_plan
from gatelab.config import flatten
from gatelab.data.corpora import HELDOUT_FRACTION
from gatelab.model.params import resolve_model
from gatelab.progress import format_duration
from gatelab.sweep.plan import (
    CPU_EVAL_FLOPS,
    CPU_FLOPS,
    CPU_IMPORT_S,
    CPU_SETUP_S,
    DEFAULT_MFU,
    EVAL_FIXED_S,
    EVAL_TF32_UTILISATION,
    FP32_UTILISATION,
    GPU_FLOPS,
    GPU_IMPORT_S,
    GPU_SETUP_S,
    MeasuredRun,
    eval_settings,
    evaluation_flops,
    heldout_windows_per_domain,
    plan_rows,
    plan_totals,
    step_settings,
    step_shape,
)
from gatelab.sweep.plan_render import estimate_lines
from gatelab.sweep.spec import expand, load_sweep
from tests.helpers import MOE, REPO, SHIPPED_SWEEPS, write_sweep


def _gpu(monkeypatch, name: str | None) -> None:
    """torch sees one GPU called `name` (None: none), as far as plan_device asks."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: name is not None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)


@pytest.fixture(autouse=True)
def _no_gpu(monkeypatch):
    """Plans here are a CPU's unless a test gives torch a GPU: the same figures on a machine that has one."""
    _gpu(monkeypatch, None)


@pytest.mark.parametrize("path", SHIPPED_SWEEPS, ids=lambda p: p.stem)
def test_every_shipped_sweep_plans(path, capsys):
    show_plan(path, as_json=True)
    plan = json.loads(capsys.readouterr().out)
    assert len(plan["runs"]) == len(expand(load_sweep(path)))
    assert all(row["total_params"] > 0 and row["seconds"] > 0 for row in plan["runs"])


def test_paper_table1_at_paper_scale_matches_the_papers_added_parameters():
    start = time.perf_counter()
    sweep = load_sweep(REPO / "sweeps" / "paper-table1.yaml", REPO / "experiments" / "paper-moe-15b.yaml")
    rows = plan_rows(expand(sweep), paper=sweep.paper)
    elapsed = time.perf_counter() - start
    assert elapsed < 5, f"planning 15 paper-scale rows took {elapsed:.1f}s"
    assert len(rows) == 15
    with (REPO / "results" / "paper" / "paper_table1_moe.csv").open(newline="") as handle:
        paper = {row["row"]: row for row in csv.DictReader(handle)}
    for number, row in enumerate(rows, start=1):
        expected = paper[f"({number})"]
        assert row["variant"] == expected["id"] and row["paper_added_m"] == float(expected["Added (M)"])
        if number == 1:
            assert row["added_params"] == 0
        elif number != 4:  # row 4: the paper's 400M is not reproducible from its description (gatelab.variants)
            assert row["added_params"] / 1e6 == pytest.approx(row["paper_added_m"], rel=0.02), row["label"]
    assert 15.5e9 < rows[0]["total_params"] < 15.7e9  # "15A2B": 15B total ...
    assert 1.5e9 < rows[0]["active_params"] < 2.5e9  # ... about 2B activated


def test_plan_json_shape(tmp_path, capsys):
    path = write_sweep(tmp_path, {"grid": {"variant": ["baseline", "g1_elem_sig"], "train.lr": [1.0e-3, 2.0e-3]},
                                  "paper": "table1"})
    show_plan(path, as_json=True)
    plan = json.loads(capsys.readouterr().out)
    assert {"runs", "totals"} <= set(plan)
    assert set(plan["totals"]) == {"runs", "tokens", "flops", "seconds", "hours", "wall_s"}
    row = plan["runs"][3]
    assert {"index", "label", "hash", "variant", "seed", "overrides", "total_params", "added_params", "active_params",
            "tokens", "flops", "flops_per_second", "seconds", "trials", "paper_added_m", "corpus_tokens",
            "corpus_count", "passes", "basis", "device", "rate_source", "train_s", "setup_s", "eval_s", "eval_flops",
            "eval_flops_per_second", "import_s"} <= set(row)
    assert isinstance(plan["warnings"], list)
    assert (row["index"], row["variant"], row["seed"], row["overrides"]) == (3, "g1_elem_sig", 0, "train.lr=0.002")
    assert row["label"] == "g1_elem_sig s0 train.lr=0.002" and row["paper_added_m"] == 201
    assert plan["totals"]["runs"] == 4 and plan["totals"]["tokens"] == 4 * 10 * 2 * 16


def test_added_parameters_are_against_the_same_cell_as_baseline(tmp_path):
    path = write_sweep(tmp_path, {"grid": {"variant": ["baseline", "g1_elem_sig"], "model.n_layers": [1, 3]}})
    rows = plan_rows(expand(load_sweep(path)))
    gate = 32 * 4 * 8  # d_model x (q * d_k) per layer
    assert [row["added_params"] for row in rows] == [0, 0, 1 * gate, 3 * gate]


def test_flops_follow_the_documented_formula(tmp_path):
    dense = plan_rows(expand(load_sweep(write_sweep(tmp_path, {}))))[0]
    tokens = 10 * 2 * 16
    attention = 12 * 2 * 16 * 4 * 8  # 12 * n_layers * seq_len * n_heads * head_dim
    assert dense["active_params"] == dense["total_params"]  # tied: the one table is the output head
    assert dense["flops"] == 6 * dense["total_params"] * tokens + attention * tokens
    assert dense["train_s"] == pytest.approx(dense["flops"] / CPU_FLOPS)

    moe = plan_rows(expand(load_sweep(write_sweep(tmp_path, {"overrides": {"model.tie_embeddings": False}},
                                                  preset=MOE))))[0]
    inactive_experts = 2 * (4 - 2) * 3 * 32 * 16  # n_layers * (E - top_k) * SwiGLU weights of one expert
    assert moe["active_params"] == moe["total_params"] - 64 * 32 - inactive_experts
    assert moe["flops"] == 6 * moe["active_params"] * tokens + attention * tokens


def test_throughput_follows_the_accelerator_or_the_flag(tmp_path):
    gpu = write_sweep(tmp_path, {"overrides": {"train.accelerator": "gpu"}})
    assert plan_rows(expand(load_sweep(gpu)))[0]["flops_per_second"] == GPU_FLOPS
    row = plan_rows(expand(load_sweep(gpu)), flops_per_second=1e9)[0]
    assert row["train_s"] == pytest.approx(row["flops"] / 1e9)
    assert row["rate_source"] == "as given (--flops-per-second)"
    assert row["seconds"] == pytest.approx(row["train_s"] + row["setup_s"] + row["eval_s"])  # the flag is training's


def test_search_sweeps_count_every_trial(tmp_path):
    path = write_sweep(tmp_path, {"grid": {"variant": ["baseline", "g1_elem_sig"]}, "search": {
        "params": {"train.lr": {"type": "float", "low": 1.0e-4, "high": 1.0e-2, "log": True}}, "n_trials": 5}})
    sweep = load_sweep(path)
    rows = plan_rows(expand(sweep), trials=sweep.search.n_trials)
    totals = plan_totals(rows)
    assert totals["runs"] == 10 and totals["seconds"] == pytest.approx(5 * sum(r["seconds"] for r in rows))


def test_table6_has_its_paper_column(tmp_path):
    path = write_sweep(tmp_path, {"grid": {"variant": ["baseline", "switch_v_8top2"]}, "paper": "table6"})
    rows = plan_rows(expand(load_sweep(path)), paper="table6")
    assert [row["paper_added_m"] for row in rows] == [None, 25]


def test_a_missing_paper_file_drops_the_column(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GATELAB_PAPER_DIR", str(tmp_path / "nowhere"))
    path = write_sweep(tmp_path, {"grid": {"variant": ["baseline"]}, "paper": "table1"})
    rows = plan_rows(expand(load_sweep(path)), paper="table1")
    assert "paper_added_m" not in rows[0]
    show_plan(path)
    out = capsys.readouterr().out
    assert "paper added" not in out
    assert "no paper column:" in out and "paper_table1_moe.csv is missing" in out


def _bigram_sweep(tmp_path, train_sequences: int, max_steps: int, batch_size: int = 1):
    """Two runs on a generated corpus of train_sequences x 17 tokens, each training max_steps x batch_size x 16."""
    return write_sweep(tmp_path, {"grid": {"variant": ["baseline", "g1_elem_sig"]}, "overrides": {
        "data.task": "bigram_backcopy", "data.bigram_backcopy.train_sequences": train_sequences,
        "train.max_steps": max_steps, "train.batch_size": batch_size}})


def test_plan_json_says_what_each_run_will_see(tmp_path, capsys):
    show_plan(_bigram_sweep(tmp_path, train_sequences=10, max_steps=17), as_json=True)
    plan = json.loads(capsys.readouterr().out)
    row = plan["runs"][0]
    assert (row["tokens"], row["corpus_tokens"], row["corpus_count"]) == (17 * 16, 10 * 17, "exact")
    assert row["passes"] == pytest.approx(1.6)
    assert plan["warnings"] == [("warning: runs 0-1 would pass over their corpus 1.6x (272 training tokens from 170): "
                                 "raise data.bigram_backcopy.train_sequences, or lower train.max_steps to 10 for one "
                                 "pass")]


def test_unprepared_corpora_show_a_question_mark_and_how_to_count(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GATELAB_DATA_DIR", str(tmp_path / "no-data"))
    show_plan(write_sweep(tmp_path, {"grid": {"variant": ["baseline"]}}))
    out = capsys.readouterr().out
    assert " ? " in out and "would pass" not in out
    assert "run `gatelab data prepare PRESET` to count the corpus" in " ".join(out.split())  # as the terminal wraps it
    show_plan(write_sweep(tmp_path, {"grid": {"variant": ["baseline"]}}), as_json=True)
    row = json.loads(capsys.readouterr().out)["runs"][0]
    assert (row["corpus_tokens"], row["corpus_count"], row["passes"]) == (None, "unknown", None)
    assert not (tmp_path / "no-data").exists()


# --- the time estimate: which device's runs count, the defaults where none do, and what a run costs around training --

def test_start_up_and_evaluation_are_in_a_flops_priced_run_and_imports_count_once(tmp_path, monkeypatch):
    monkeypatch.setenv("GATELAB_DATA_DIR", str(tmp_path / "no-data"))  # corpus unknown: every held-out window counted
    rows = plan_rows(expand(load_sweep(write_sweep(tmp_path, {"grid": {"seed": [0, 1]}}))))
    row = rows[0]
    # The micro preset (2 layers, 4 heads of 8, seq_len 16) under EvalConfig's defaults, tokens at each context length:
    # held-out 5 domains x 64 windows x 16 = 5120, W8A8 5 x 8 x 16 = 640 and probes 5 x 16 x 16 = 1280, at 16;
    # long-context on 16 documents of 8 x 16 + 1 tokens: 7 windows of 16 each (1792) at 16, 3 of 32 (1536) at 32, one
    # of 64 (1024) at 64, one of 128 (2048) at 128; BLiMP 67 x 20 pairs x 2 x 16 = 42880 at 16; in-context, 64 examples
    # each: induction 16, MQAR 4 x 4 = 16, needles 8 and 16 tokens.
    tokens_by_context = {16: 5120 + 640 + 1280 + 1792 + 42880 + 64 * 16 + 64 * 16 + 64 * 16, 32: 1536, 64: 1024,
                         128: 2048, 8: 64 * 8}
    attention = 4 * 2 * 4 * 8  # 4 x n_layers x n_heads x head_dim, a token a unit of context
    assert row["eval_flops"] == sum(tokens * (2 * row["active_params"] + attention * context)
                                    for context, tokens in tokens_by_context.items())
    assert row["eval_s"] == pytest.approx(row["eval_flops"] / CPU_EVAL_FLOPS + EVAL_FIXED_S)
    # A corpus whose held-out split (HELDOUT_FRACTION of its documents) holds 100 windows of 17 evaluates 100, not 320.
    experiment = expand(load_sweep(write_sweep(tmp_path, {})))[0].experiment
    corpus_tokens = 100 * 17 * (1 - HELDOUT_FRACTION) / HELDOUT_FRACTION
    fewer = evaluation_flops(experiment, resolve_model(experiment), row["active_params"], corpus_tokens)
    assert row["eval_flops"] - fewer == (320 - 100) * 16 * (2 * row["active_params"] + attention * 16)
    assert (row["basis"], row["device"], row["setup_s"], row["import_s"]) == ("flops", "cpu", CPU_SETUP_S, CPU_IMPORT_S)
    assert row["seconds"] == pytest.approx(row["flops"] / CPU_FLOPS + CPU_SETUP_S + row["eval_s"])
    assert row["seconds"] - row["train_s"] > CPU_SETUP_S + EVAL_FIXED_S  # a run of 10 micro steps is mostly this
    lines = estimate_lines(rows)
    total = rows[0]["seconds"] + rows[1]["seconds"] + CPU_IMPORT_S  # one process imports for both runs
    assert lines[0].startswith(f"estimate: roughly {format_duration(total)} for 2 run(s), ")
    assert lines[2].startswith(f"  around training (2 of 2 runs): {CPU_SETUP_S:.0f} s of set-up (a default) and ")
    assert lines[3] == f"  and {CPU_IMPORT_S:.0f} s of imports once a worker process (a default)"
    assert "not included" not in "\n".join(lines)


@pytest.mark.parametrize(("name", "bf16", "fp32"), [
    ("NVIDIA H100 80GB HBM3", 989e12, 67e12), ("NVIDIA H100 PCIe", 756e12, 51e12), ("NVIDIA H200", 989e12, 67e12),
    ("NVIDIA A100-SXM4-80GB", 312e12, 19.5e12), ("NVIDIA L40S", 362e12, 91.6e12), ("NVIDIA A10", 125e12, 31.2e12),
    ("NVIDIA B200", 2250e12, 75e12)])
def test_a_gpu_without_measured_runs_is_priced_from_its_peak_by_name(tmp_path, monkeypatch, name, bf16, fp32):
    _gpu(monkeypatch, name)
    [row] = plan_rows(expand(load_sweep(write_sweep(tmp_path, {}))))  # accelerator auto: the GPU where there is one
    assert (row["device"], row["basis"]) == (name, "flops")
    assert row["flops_per_second"] == pytest.approx(DEFAULT_MFU * bf16)
    # evaluation: fp32 weights with TF32 products, whose dense peak is half the bf16 one
    assert row["eval_flops_per_second"] == pytest.approx(EVAL_TF32_UTILISATION * bf16 / 2)
    assert (row["setup_s"], row["import_s"]) == (GPU_SETUP_S, GPU_IMPORT_S)
    lines = estimate_lines([row])
    assert f"({name} at 20% of its {bf16 / 1e12:.0f} TFLOP/s dense bf16 peak)" in lines[1]
    assert f"(10% of its {bf16 / 2e12:.0f} TFLOP/s TF32 peak)" in lines[2]
    # a 32-true run trains on the CUDA cores
    [fp32_row] = plan_rows(expand(load_sweep(write_sweep(tmp_path, {"overrides": {"train.precision": "32-true"}},
                                                         name="fp32.yaml"))))
    assert fp32_row["flops_per_second"] == pytest.approx(FP32_UTILISATION * fp32)


@pytest.mark.parametrize(("name", "accelerator", "label"), [
    ("NVIDIA A10G", "auto", "NVIDIA A10G, not in gatelab's table of GPUs: assumed 20% of an H100's 989 TFLOP/s dense "
                            "bf16 peak"),  # A10G is not an A10: whole words
    (None, "gpu", "no GPU here: assumed 20% of an H100's 989 TFLOP/s dense bf16 peak")])
def test_a_gpu_not_in_the_table_or_not_here_gets_the_assumed_rate_and_says_so(tmp_path, monkeypatch, name,
                                                                              accelerator, label):
    _gpu(monkeypatch, name)
    [row] = plan_rows(expand(load_sweep(write_sweep(tmp_path, {"overrides": {"train.accelerator": accelerator}}))))
    assert (row["device"], row["flops_per_second"], row["rate_source"]) == (name, GPU_FLOPS, label)
    assert f"at {GPU_FLOPS:.2g} FLOP/s ({label})" in estimate_lines([row])[1]


def test_the_h200_default_prices_the_small_preset_at_its_measured_step(monkeypatch):
    """One H200 trained the quickstart on small.yaml (eager, bf16-mixed, 64 x 1024) at 0.23-0.25 s a step."""
    _gpu(monkeypatch, "NVIDIA H200")
    rows = plan_rows(expand(load_sweep(REPO / "sweeps" / "quickstart.yaml", REPO / "experiments" / "small.yaml")))
    for row in rows:
        assert 0.23 * 0.85 < row["train_s"] / 150 < 0.25 * 1.15, row["label"]


def test_measured_runs_count_for_the_device_they_timed(tmp_path, monkeypatch):
    [spec] = expand(load_sweep(write_sweep(tmp_path, {})))
    shape = step_shape(flatten(spec.experiment))
    measured = [MeasuredRun(shape, "baseline", 0.5, 10.0),  # untagged: recorded on this machine before the tag
                MeasuredRun(shape, "baseline", 0.7, 10.0, device="cpu"),
                MeasuredRun(shape, "baseline", 50.0, 10.0, device="NVIDIA H100 80GB HBM3")]
    [cpu] = plan_rows([spec], measured=measured)
    assert (cpu["basis"], cpu["measured_runs"], cpu["measured_step_s"]) == ("measured", 2, pytest.approx(0.6))
    _gpu(monkeypatch, "NVIDIA H200")
    [h200] = plan_rows([spec], measured=measured)  # only the untagged run: the H100's and the CPU's are other devices
    assert (h200["basis"], h200["measured_runs"], h200["measured_step_s"]) == ("measured", 1, 0.5)
    _gpu(monkeypatch, "NVIDIA H100 80GB HBM3")
    [h100] = plan_rows([spec], measured=measured)
    assert (h100["measured_runs"], h100["measured_step_s"]) == (2, pytest.approx(25.25))
    assert estimate_lines([h100])[1].startswith("  measured on NVIDIA H100 80GB HBM3 (1 of 1 runs): ")


def test_an_eval_budget_is_priced_by_the_windows_it_reads():
    from gatelab.config import EvalConfig
    from gatelab.data.budget import MEASURED_CHARS_PER_TOKEN

    def windows(heldout_tokens=None, **evaluation):
        return heldout_windows_per_domain(EvalConfig(**evaluation), 255, 512, heldout_tokens)

    assert windows() == 64 and windows(max_windows_per_domain=10) == 10
    assert windows(budget={"tokens": 100_000}) == 100_000 // 256 == 390
    assert windows(budget={"bytes": 1_000_000}) == round(1e6 / MEASURED_CHARS_PER_TOKEN[512]["all"]) // 256 == 1899
    assert windows(50_000, budget={"bytes": 1_000_000}) == round(50_000 / 256) == 195  # no more than the split holds
    assert windows(50_000, budget={"documents": 3}) == 195  # documents' lengths are not known: the split, a bound
    assert windows(budget={"documents": 3}) == 64  # nor the split's, where the corpus is not counted
    assert windows(50_000) == 64 and windows(100, budget={"tokens": 10}) == 1  # never none


def test_runs_measured_with_other_evaluation_settings_give_their_step_and_set_up_but_not_their_evaluation(tmp_path):
    """An eval.budget of a million bytes reads about 30 times the default windows: a same-shape run that evaluated
    otherwise cannot price this one's evaluation."""
    [spec] = expand(load_sweep(write_sweep(tmp_path, {})))
    budgeted = spec.experiment.model_copy(update={"eval": spec.experiment.eval.model_copy(
        update={"budget": {"bytes": 1_000_000}})})
    shape = step_shape(flatten(spec.experiment))
    assert step_shape(flatten(budgeted)) == shape and eval_settings(flatten(budgeted)) != eval_settings(
        flatten(spec.experiment))

    def run(step_s, overhead_s, setup_s, experiment):
        return MeasuredRun(shape, "baseline", step_s, overhead_s, setup_s=setup_s,
                           evaluation=eval_settings(flatten(experiment)))

    steps = spec.experiment.train.max_steps
    measured = [run(0.5, 30.0, 4.0, budgeted), run(0.7, 50.0, 8.0, budgeted)]
    [row] = plan_rows([spec], measured=measured)
    assert (row["basis"], row["measured_step_s"], row["measured_overhead_s"]) == ("measured", pytest.approx(0.6), None)
    assert (row["setup_s"], row["setup_basis"]) == (6.0, "measured")
    assert row["eval_s"] == pytest.approx(row["eval_flops"] / CPU_EVAL_FLOPS + EVAL_FIXED_S)
    assert row["seconds"] == pytest.approx(0.6 * steps + 6.0 + row["eval_s"])
    lines = estimate_lines([row])
    assert " of set-up and evaluation a run" not in lines[1] and "evaluate unlike the runs measured" in lines[2]
    assert lines[3].startswith("  around training (1 of 1 runs): 6 s of set-up (measured) and ")
    measured.append(run(0.6, 12.0, 2.0, spec.experiment))  # one that evaluated alike: its figure, whole
    [row] = plan_rows([spec], measured=measured)
    assert (row["measured_overhead_s"], row["setup_s"], row["eval_s"]) == (12.0, None, None)
    assert row["seconds"] == pytest.approx(0.6 * steps + 12.0)


def test_runs_of_other_shapes_on_this_device_price_a_run_at_their_measured_flop_rate(tmp_path, monkeypatch):
    _gpu(monkeypatch, "NVIDIA H200")
    [spec] = expand(load_sweep(write_sweep(tmp_path, {})))
    other = spec.experiment.with_train(batch_size=64)  # another shape, the same RATE_SETTINGS

    def timed(flops_per_second: float, setup_s: float, device: str = "NVIDIA H200", settings=other) -> MeasuredRun:
        return MeasuredRun(step_shape(flatten(other)), "baseline", 1e12 / flops_per_second, setup_s + 30.0,
                           device=device, settings=step_settings(flatten(settings)), flops_per_step=1e12,
                           setup_s=setup_s)

    measured = [timed(1e14, 4.0), timed(3e14, 6.0), timed(2e14, 9.0),
                timed(1e10, 99.0, device="NVIDIA H100 80GB HBM3"),  # another GPU
                timed(1e10, 99.0, settings=other.with_train(precision="32-true")),  # another precision
                MeasuredRun(step_shape(flatten(other)), "baseline", 1e-3, 1.0, device="NVIDIA H200",
                            settings=step_settings(flatten(other)))]  # FLOPs not rebuilt from its params
    [row] = plan_rows([spec], measured=measured)
    assert (row["basis"], row["measured_runs"], row["flops_per_second"]) == ("measured rate", 3, pytest.approx(2e14))
    assert row["train_s"] == pytest.approx(row["flops"] / 2e14)
    assert (row["setup_s"], row["setup_basis"]) == (6.0, "measured")
    assert row["eval_s"] == pytest.approx(row["eval_flops"] / (EVAL_TF32_UTILISATION * 989e12 / 2) + EVAL_FIXED_S)
    assert row["seconds"] == pytest.approx(row["train_s"] + 6.0 + row["eval_s"])
    lines = estimate_lines([row])
    assert lines[1] == ("  from the rate measured on NVIDIA H200 (1 of 1 runs): training FLOPs (6 x parameters x "
                        "tokens + attention) at 2e+14 FLOP/s, the median that 3 earlier run(s) of other shapes reached")
    assert lines[2].startswith("  around training (1 of 1 runs): 6 s of set-up (measured) and ")
    [given] = plan_rows([spec], flops_per_second=1e9, measured=measured)  # --flops-per-second wins over a rate
    assert (given["basis"], given["flops_per_second"]) == ("flops", 1e9)


def test_the_store_gives_this_machines_runs_and_its_gpus_runs_from_any_machine(tmp_path):
    """measured_runs reads what a real run records: host and device tags, params, time/* metrics."""
    from mlflow.entities import Metric, Param

    from gatelab import tracking
    from gatelab.model.params import count_parameters
    from gatelab.progress import DEVICE_TAG, HOST_TAG
    from gatelab.sweep.plan import measured_runs

    [spec] = expand(load_sweep(write_sweep(tmp_path, {})))
    experiment = spec.experiment
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracking.prepare_store(uri)
    client = tracking.client(uri)
    experiment_id = client.create_experiment(experiment.name)
    params = [Param(key, str(value)) for key, value in flatten(experiment).items()]  # as TrackedRun.log_start
    params.append(Param("model.total_params", str(count_parameters(resolve_model(experiment)))))
    for host, device, step_s in (("here", None, 0.1), ("here", "NVIDIA H100 80GB HBM3", 0.2),
                                 ("elsewhere", "NVIDIA H200", 0.3), ("elsewhere", "cpu", 0.4),
                                 ("elsewhere", "NVIDIA H100 80GB HBM3", 0.5)):
        tags = {HOST_TAG: host, tracking.STATUS_TAG: "finished", **({DEVICE_TAG: device} if device else {})}
        run_id = client.create_run(experiment_id, tags=tags).info.run_id
        for start in range(0, len(params), 100):  # MLflow takes 100 params a batch
            client.log_batch(run_id, params=params[start:start + 100])
        # runs since issue 44 record the wall step apart from the steady one (time/step_s, the smaller): the plan
        # prices with the wall step, and with time/step_s (then the wall step) for runs recorded before
        timed = [("time/wall_step_s", step_s), ("time/step_s", step_s / 2)] if device == "NVIDIA H200" else \
            [("time/step_s", step_s)]
        client.log_batch(run_id, metrics=[Metric(name, value, 0, 0) for name, value in
                                          (*timed, ("time/setup_s", 4.0), ("time/import_s", 7.0))])
    found = measured_runs(uri, host="here", devices=["NVIDIA H200", "cpu"])  # a CPU's runs count from here only
    assert sorted((run.seconds_per_step, run.device) for run in found) == [
        (0.1, None), (0.2, "NVIDIA H100 80GB HBM3"), (0.3, "NVIDIA H200")]
    [row] = plan_rows([spec])
    for run in found:
        assert run.flops_per_step == pytest.approx(row["flops"] / experiment.train.max_steps)  # rebuilt from params
        assert (run.settings, run.setup_s, run.import_s) == (step_settings(flatten(experiment)), 4.0, 7.0)
        assert run.evaluation == eval_settings(flatten(experiment))  # eval.* and data.domains, as recorded


def test_pricing_many_runs_says_how_far_it_is(tmp_path, monkeypatch, capsys):
    from gatelab.sweep import spec

    sweep = load_sweep(write_sweep(tmp_path, {"grid": {"seed": [0, 1, 2]}}))
    monkeypatch.setattr(spec, "PROGRESS_AFTER_S", 0.0)
    plan_rows(expand(sweep))
    assert "pricing the runs: 2 of 3 runs" in capsys.readouterr().err
