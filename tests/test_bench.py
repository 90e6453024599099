"""`gatelab bench`: the pieces it measures with, on a micro model (no timing is asserted: figures are the bench's)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import yaml

from gatelab import bench
from gatelab.config import load_experiment
from gatelab.model import resolve_model
from tests.helpers import MICRO, REPO


@pytest.fixture()
def micro(tmp_path):
    config = {**MICRO, "variant": "baseline", "train": {**MICRO["train"], "log_every": 2}}
    path = tmp_path / "micro.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_plain_step_trains_the_model_and_interleaving_times_every_step(micro):
    experiment = load_experiment(micro)
    steps = {name: bench.plain_step(experiment, "32-true") for name in ("a", "b")}
    times = bench.time_interleaved(steps, warmup=1, measured=3)
    assert {name: len(seconds) for name, seconds in times.items()} == {"a": 3, "b": 3}
    assert all(second > 0 for seconds in times.values() for second in seconds)


def test_the_step_s_gemms_are_six_flops_per_linear_weight_and_token(micro):
    """Every Linear runs one forward and two backward GEMMs (input and weight gradients): 6 x weights x tokens FLOPs.
    The dense micro model has no other matmul outside SDPA, so the traced shapes must add up to exactly that."""
    experiment = load_experiment(micro)
    model = resolve_model(experiment)
    shapes = bench.gemm_shapes(bench.plain_step(experiment, "32-true"), torch.float32)
    linear_weights = (model.n_layers * (model.d_model * (model.n_heads + 2 * model.n_kv_heads) * model.head_dim
                                        + model.n_heads * model.head_dim * model.d_model
                                        + 3 * model.d_model * model.ffn_hidden)
                      + model.vocab_size * model.d_model)  # the tied output head
    tokens = experiment.train.batch_size * experiment.data.seq_len
    assert sum(bench._mm_flops(a, b) for _, a, b, _ in shapes) == 6 * linear_weights * tokens
    seconds, flops = bench.time_gemms(shapes, repeats=1)
    assert seconds > 0 and flops == 6 * linear_weights * tokens


@pytest.mark.slow
def test_lightning_steps_time_every_step_after_the_first(micro, tmp_path):
    times = bench.lightning_steps(load_experiment(micro), "32-true", 5, tmp_path)
    assert len(times) == 4 and all(t > 0 for t in times)


def test_gpu_estimate_counts_weights_optimizer_state_activations_and_logits():
    experiment = load_experiment(REPO / "experiments" / "small.yaml")
    model = resolve_model(experiment)
    estimate = bench.gpu_estimate(experiment, peak_flops=1e15, utilisation=0.5)
    tokens = experiment.train.batch_size * experiment.data.seq_len
    activations = tokens * (model.n_layers * (34 * model.d_model + 6 * model.ffn_hidden) + 6 * model.vocab_size)
    assert estimate["memory_gb"] * 1e9 == pytest.approx(16 * estimate["params"] + activations)
    assert estimate["step_s"] == pytest.approx(bench.model_flops_per_step(experiment) / 5e14)
    assert estimate["tokens_per_s"] == pytest.approx(tokens / estimate["step_s"])


def _report(**ratios) -> bench.BenchReport:
    steps = [bench.StepFigures("tiny", label, "32-true", 1.0, 1.0, 10, ratio, "x") for label, ratio in ratios.items()]
    return bench.BenchReport(machine={}, steps=steps, plan_seconds=6.0)


def test_acceptance_checks_say_which_targets_hold():
    report = _report(lightning=1.02, g1_elem_sig=1.2, g1_head_sig=1.01, **{"gatelab preset": 0.8})
    checks = {c["target"]: c["holds"] for c in bench.acceptance_checks(report)}
    assert checks["tiny: Lightning step / plain loop, same precision"] is True
    assert checks["tiny: g1_elem_sig step / baseline step"] is False
    assert checks["tiny: g1_head_sig step / baseline step"] is True
    assert checks["tiny: gatelab tokens/s / plain fp32 eager tokens/s"] is False  # 1 / 0.8 = 1.25 < 2
    assert checks["sweep plan over the paper-scale preset (s)"] is False


def test_markdown_lists_every_target_and_step(tmp_path):
    report = _report(lightning=1.02, g1_elem_sig=1.2)
    report.machine = {"cpu": "cpu", "cores": 2, "torch_threads": 2, "fast_bf16_cpu": False, "torch": "2", "gpu": None}
    report.checks = bench.acceptance_checks(report)
    written = bench.write(report, tmp_path)
    markdown = (tmp_path / "bench.md").read_text()
    assert "| tiny: g1_elem_sig step / baseline step | 1.2 | ≤ 1.1 | **no** |" in markdown
    assert "| tiny: gatelab tokens/s / plain fp32 eager tokens/s | n/a | ≥ 2.0 | not measured |" in markdown
    assert [p.name for p in written] == ["bench.json", "bench.md"]


@pytest.mark.parametrize("arguments, message", [
    (["--variants", "g1_elem_sig"], "must include baseline"),
    (["--variants", "baseline,g9_elem_sig"], "g9_elem_sig"),
    (["missing.yaml"], "missing.yaml"),
    (["--steps", "0"], "--steps"),
    (["--lightning-steps", "3"], "--lightning-steps"),
])
@pytest.mark.slow
def test_bad_input_ends_in_one_message_before_measuring(arguments, message, tmp_path):
    result = subprocess.run([sys.executable, "-m", "gatelab", "bench", *arguments, "--out", str(tmp_path / "out")],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()
