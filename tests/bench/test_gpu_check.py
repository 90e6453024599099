"""The GPU check (experiments/scripts/gpu-check.sh, gatelab/bench/gpu_check.py): every verdict rule on made-up logs, the
MLflow reader on a real store, and `pytest -m gpu` collecting where lm-eval is not importable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime

import pytest

from gatelab.bench import gpu_check
from gatelab.bench.gpu_check import (
    RunRecord,
    StepResult,
    bench_verdicts,
    plan_verdict,
    pytest_verdict,
    read_runs,
    read_utilization,
    sweep_verdicts,
)
from tests.helpers import REPO

FINISHED_SWEEP = StepResult(0, 200.0, "3 runs finished")


def runs(eval_s: float = 12.0, end: float = 1000.0, peak: float = 20.0) -> list[RunRecord]:
    return [RunRecord(variant, "finished", eval_s, end, peak, "NVIDIA H100 80GB HBM3")
            for variant in ("baseline", "g1_elem_sig", "g1_head_sig")]


def samples(start: float, end: float, utilization: float) -> list[tuple[float, float]]:
    return [(at, utilization) for at in range(int(start), int(end) + 1)]


def verdict_of(verdicts, words: str):
    return next(v for v in verdicts if words in v.what)


def test_a_sweep_within_its_time_with_busy_evaluations_passes_every_line():
    verdicts = sweep_verdicts(FINISHED_SWEEP, runs(), samples(980, 1000, 80.0))
    assert [v.ok for v in verdicts] == [True] * 7, [v.line() for v in verdicts]


@pytest.mark.parametrize(("step", "records", "utilization", "failing"), [
    (StepResult(0, 250.0, ""), runs(), 80.0, "finishes its 3 runs"),  # over 240 s
    (StepResult(0, 200.0, ""), runs()[:2], 80.0, "finishes its 3 runs"),  # a run missing
    (StepResult(124, 300.0, ""), runs(), 80.0, "finishes its 3 runs"),  # cut off at its limit
    (FINISHED_SWEEP, runs(eval_s=25.0), 80.0, "baseline: evaluation"),  # evaluation too slow
    (FINISHED_SWEEP, runs(), 30.0, "baseline: evaluation"),  # the GPU idle while evaluating
    (FINISHED_SWEEP, runs(peak=33.0), 80.0, "baseline: peak GPU memory"),
    (FINISHED_SWEEP, [RunRecord("baseline", "failed", None, None, None, "")], 80.0, "baseline: evaluation"),
])
def test_each_sweep_rule_fails_on_its_own_fault(step, records, utilization, failing):
    verdict = verdict_of(sweep_verdicts(step, records, samples(980, 1000, utilization)), failing)
    assert verdict.ok is False, verdict.line()


def test_utilization_is_read_only_during_the_evaluation():
    busy_training = samples(900, 979, 100.0)
    idle_evaluation = samples(981, 1000, 0.0)
    verdict = verdict_of(sweep_verdicts(FINISHED_SWEEP, runs(eval_s=19.0), busy_training + idle_evaluation),
                         "baseline: evaluation")
    assert verdict.ok is False and "median 0%" in verdict.figure


def test_nvidia_smi_samples_are_read_in_local_time_and_junk_lines_skipped(tmp_path):
    at = datetime(2026, 11, 28, 1, 2, 3, 500000)
    csv = tmp_path / "gpu-util.csv"
    csv.write_text(f"{at:%Y/%m/%d %H:%M:%S.%f}, 87, 1234\ntimestamp, utilization.gpu\n2026/11/28 01:02:0")
    assert read_utilization(csv) == [(at.timestamp(), 87.0)]
    assert read_utilization(tmp_path / "absent.csv") == []


@pytest.mark.parametrize(("estimate", "ok"), [(200.0, True), (150.0, True), (139.0, False), (261.0, False)])
def test_the_plan_is_held_to_30_percent_of_the_sweep(estimate, ok):
    plan = StepResult(0, 5.0, "some progress\n" + json.dumps({"runs": [], "totals": {"wall_s": estimate}}))
    assert plan_verdict(plan, FINISHED_SWEEP).ok is ok


def test_no_plan_figure_or_no_finished_sweep_is_not_run_rather_than_a_pass():
    assert plan_verdict(StepResult(1, 5.0, "Traceback"), FINISHED_SWEEP).ok is None
    plan = StepResult(0, 5.0, json.dumps({"totals": {"wall_s": 200.0}}))
    assert plan_verdict(plan, StepResult(124, 300.0, "")).ok is None


def bench_report(mfu: float = 0.42, breaks: int = 0, peak: float = 25.0) -> dict:
    gpu = {"gpu": "NVIDIA H100 80GB HBM3", "peak_flops": 989e12, "model_flops_per_step": 4.0e14,
           "lightning_step_s": 0.95, "mfu_lightning": mfu, "lightning_peak_gpu_gb": peak}
    graphs = {"small": {"baseline": {"graphs": 1 + breaks, "graph_breaks": breaks},
                        "g1_head_sig": {"graphs": 1, "graph_breaks": 0}}}
    kernels = {"small": {"baseline, plain loop": {"window_ms_per_step": 950.0, "idle_share": 0.02,
                                                  "groups": [{"group": "GEMM (cuBLAS)", "share": 0.6}]}}}
    return {"gpu": {"small": gpu}, "graphs": graphs, "kernels": kernels}


@pytest.mark.parametrize(("report", "failing"), [
    (bench_report(mfu=0.39), "MFU"), (bench_report(breaks=2), "graph breaks"), (bench_report(peak=33.0), "memory"),
])
def test_each_bench_rule_fails_on_its_own_fault(report, failing):
    verdicts = bench_verdicts(StepResult(0, 120.0, ""), report)
    assert verdict_of(verdicts, failing).ok is False
    assert all(v.ok for v in verdicts if failing not in v.what)


def test_a_bench_without_gpu_figures_is_not_run_and_says_why():
    verdicts = bench_verdicts(StepResult(124, 300.0, "compiling baseline"), None)
    assert all(v.ok is None for v in verdicts) and "cut off at its limit" in verdicts[0].figure


def test_graph_breaks_are_judged_even_where_the_bench_stopped_after_recording_them():
    """On the H100 the bench stopped at the Lightning step's kernel profile (torch 2.11's profiler events), after it
    had saved the graph counts: those are a verdict, the MFU and memory lines are not run."""
    report = bench_report()
    del report["gpu"]
    verdicts = bench_verdicts(StepResult(1, 72.0, "error: AttributeError: 'FunctionEvent' ..."), report)
    assert [v.ok for v in verdicts] == [True, None, None]
    assert "FunctionEvent" in verdicts[1].figure
    assert gpu_check.top_kernels(bench_report()) == ["small baseline, plain loop: 950.0 ms a step, idle 2.0%; "
                                                     "GEMM 60%"]


@pytest.mark.parametrize(("status", "closing", "ok"), [
    (0, "12 passed, 1 skipped in 80.2s", True), (1, "1 failed, 11 passed in 80.2s", False),
    (2, "1 error in 3.0s", False), (None, "", None),
])
def test_pytest_passes_only_on_exit_0_with_tests_passed(status, closing, ok):
    assert pytest_verdict(StepResult(status, 80.0, f"....\n{closing}\n")).ok is ok


def test_the_closing_table_fails_when_any_line_failed(tmp_path, capsys):
    (tmp_path / "numerics.status").write_text("0")
    (tmp_path / "numerics.log").write_text("every variant within its tolerance; positive control caught\n")
    (tmp_path / "pytest.status").write_text("1")
    (tmp_path / "pytest.log").write_text("1 failed, 3 passed in 9s\n")
    assert gpu_check.main(["numerics", "--logs", str(tmp_path)]) == 0
    assert gpu_check.main(["table", "--logs", str(tmp_path)]) == 0
    assert gpu_check.main(["pytest", "--logs", str(tmp_path)]) == 0
    assert gpu_check.main(["table", "--logs", str(tmp_path)]) == 1
    table = capsys.readouterr().out.split("GPU check (issue 41):")[-1].strip().splitlines()
    assert [line.split()[0] for line in table] == ["PASS", "FAIL"]


def test_runs_are_read_from_the_sweeps_mlflow_store(tmp_path):
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.create_experiment("quickstart")
    run = client.create_run(experiment, tags={"variant": "g1_head_sig", "gatelab.status": "finished",
                                              "gatelab.device": "NVIDIA H200"})
    client.log_metric(run.info.run_id, "time/eval_s", 14.5, timestamp=1_700_000_000_000)
    client.log_metric(run.info.run_id, "memory/peak_gpu_gb", 21.0)
    client.set_terminated(run.info.run_id)
    assert read_runs(tmp_path) == [RunRecord("g1_head_sig", "finished", 14.5, 1_700_000_000.0, 21.0, "NVIDIA H200")]
    assert read_runs(tmp_path / "absent") == []


def test_the_check_scripts_parse():
    for script in ("gpu-check.sh", "gpu-check-more.sh"):
        subprocess.run(["bash", "-n", str(REPO / "experiments" / "scripts" / script)], check=True)


# What ../shared/gpu/bundle.sh leaves out of a GPU machine's install (lm-eval unless EVAL=1; MLflow's server and
# PostgreSQL's driver): `pytest -m gpu` must collect there all the same.
NOT_ON_A_GPU_MACHINE = ("lm_eval", "psycopg", "gunicorn", "graphene", "huey", "skops", "docker")


def test_pytest_m_gpu_collects_where_lm_eval_is_not_importable(tmp_path):
    """A module that needs what a GPU machine's bundle leaves out skips, saying why, instead of stopping the whole
    collection (it stopped at tests/eval/test_harness.py's `import lm_eval`)."""
    for name in NOT_ON_A_GPU_MACHINE:
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(
            f"raise ModuleNotFoundError('{name} is hidden by this test', name='{name}')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    collected = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-p",
                                "no:cacheprovider", "-p", "no:xdist", "-o", "addopts=", "-rs", "tests"],
                               cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr[-3000:]
    assert "error" not in collected.stdout.splitlines()[-1], collected.stdout[-3000:]
    assert "tests/eval/test_harness.py" in collected.stdout and "lm-eval is not installed" in collected.stdout


def test_every_gatelab_module_but_the_lm_eval_model_imports_without_what_a_gpu_bundle_leaves_out(tmp_path):
    """On the H100 the bf16-against-fp32 `gpu` test failed because it read a checkpoint through gatelab.eval.harness,
    which imports lm-eval; the checkpoint reader lives in gatelab.eval.checkpoint now. Only the lm-eval model itself
    may need lm-eval at import."""
    for name in NOT_ON_A_GPU_MACHINE:
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(
            f"raise ModuleNotFoundError('{name} is hidden by this test', name='{name}')\n")
    needs_lm_eval = {"gatelab.eval.harness"}
    script = (
        "import importlib, pkgutil, gatelab\n"
        "failed = []\n"
        "for module in pkgutil.walk_packages(gatelab.__path__, 'gatelab.'):\n"
        f"    if module.name in {needs_lm_eval!r} or module.name.endswith('__main__'):\n"
        "        continue\n"
        "    try:\n"
        "        importlib.import_module(module.name)\n"
        "    except ModuleNotFoundError as error:\n"
        "        failed.append(f'{module.name}: {error}')\n"
        "print('\\n'.join(failed) or 'all imported')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    imported = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=300)
    assert imported.stdout.strip() == "all imported", imported.stdout + imported.stderr[-2000:]
