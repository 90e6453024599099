"""The GPU check's verdicts (experiments/scripts/gpu-check.sh): each line of issue 41's GPU acceptance read off what
one step of the check left in its logs folder, PASS, FAIL or NOT RUN with its figure, printed the moment that step ends.

    python -m gatelab.bench.gpu_check STEP --logs DIR [--runs DIR]     STEP: numerics, sweep, bench, pytest, table

The shell script leaves, per step, NAME.log, NAME.status (exit status; 124: cut off at its limit) and NAME.seconds,
and beside them gpu-util.csv (nvidia-smi every second: timestamp, utilization %, memory MiB) and, from the bench,
bench/bench.json. Each verdict is also appended to lines.txt; `table` prints them all, the check's last lines.
Kept apart from the script so that every rule is tested on a CPU with made-up logs (tests/bench/test_gpu_check.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from gatelab.metrics import EVAL_S, PEAK_GPU_GB
from gatelab.store_uris import default_tracking_uri, sqlite_file

SWEEP_LIMIT_S = 240.0  # the quick-start sweep's 3 runs on small, after the data is prepared
EVAL_LIMIT_S = 20.0  # a run's evaluation
EVAL_MEDIAN_UTILIZATION = 50.0  # nvidia-smi's utilization.gpu, %, median of the samples during an evaluation
PLAN_TOLERANCE = 0.30  # the plan's estimate against the sweep's wall time
MFU_TARGET, MFU_GOAL = 0.40, 0.45
PEAK_MEMORY_GB = 32.0  # max_memory_allocated of the compiled small step and of each quick-start run
QUICKSTART_RUNS = 3


@dataclass(frozen=True)
class Verdict:
    ok: bool | None  # None: not run
    what: str
    figure: str

    def line(self) -> str:
        return f"{'NOT RUN' if self.ok is None else 'PASS' if self.ok else 'FAIL':7s}  {self.what}: {self.figure}"


@dataclass(frozen=True)
class StepResult:
    status: int | None  # None: the step did not run
    seconds: float | None
    log: str

    @property
    def cut_off(self) -> bool:
        return self.status in (124, 137)

    def how(self) -> str:
        if self.status is None:
            return "not run"
        ended = "cut off at its limit" if self.cut_off else f"exit {self.status}"
        return ended + (f" after {self.seconds:.0f} s" if self.seconds is not None else "")


def read_step(logs: Path, name: str) -> StepResult:
    def text(suffix: str) -> str | None:
        path = logs / f"{name}.{suffix}"
        return path.read_text().strip() if path.exists() else None

    status, seconds = text("status"), text("seconds")
    return StepResult(int(status) if status else None, float(seconds) if seconds else None, text("log") or "")


def last_line(log: str) -> str:
    return next((line.strip() for line in reversed(log.splitlines()) if line.strip()), "(no output)")


def numerics_verdict(step: StepResult) -> Verdict:
    """The numerics check exits 0 only when every variant is within its tolerance and its positive control (the
    layout copy bypassed) was caught; its last line says so in figures."""
    what = "every variant within its tolerance of float64 in bf16, the positive control caught"
    return Verdict(None if step.status is None else step.status == 0, what, f"{step.how()}; {last_line(step.log)}")


@dataclass(frozen=True)
class RunRecord:
    """What one quick-start run recorded in MLflow."""
    variant: str
    status: str
    eval_s: float | None
    eval_end: float | None  # epoch seconds: when `time/eval_s` was logged, the end of the evaluation
    peak_gpu_gb: float | None
    device: str


def read_utilization(path: Path) -> list[tuple[float, float]]:
    """(epoch seconds, utilization %) from nvidia-smi's CSV (`timestamp,utilization.gpu,memory.used`, no header, no
    units); its timestamps are this machine's local time, as `datetime.timestamp` reads a naive one."""
    samples = []
    if not path.exists():
        return samples
    for row in path.read_text().splitlines():
        fields = [field.strip() for field in row.split(",")]
        try:
            at = datetime.strptime(fields[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            samples.append((at, float(fields[1].rstrip(" %"))))
        except (ValueError, IndexError):
            continue  # a header, or a line cut off when the sampler was stopped
    return samples


def utilization_during(samples: list[tuple[float, float]], start: float, end: float) -> list[float]:
    # a sample tells of the second before it
    return [utilization for at, utilization in samples if start < at <= end + 1.0]


def sweep_verdicts(step: StepResult, runs: list[RunRecord], samples: list[tuple[float, float]]) -> list[Verdict]:
    finished = [run for run in runs if run.status == "finished"]
    whole = (step.status == 0 and len(finished) == QUICKSTART_RUNS and step.seconds is not None
             and step.seconds <= SWEEP_LIMIT_S)
    verdicts = [Verdict(None if step.status is None else whole,
                        f"the quick-start sweep on small finishes its {QUICKSTART_RUNS} runs in "
                        f"<= {SWEEP_LIMIT_S:.0f} s after the data is prepared",
                        f"{step.how()}, {len(finished)} run(s) finished")]
    for run in runs:
        if run.eval_s is None or run.eval_end is None:
            verdicts.append(Verdict(False, f"{run.variant}: evaluation <= {EVAL_LIMIT_S:.0f} s, GPU busy",
                                    f"no time/eval_s recorded (run {run.status})"))
        else:
            busy = utilization_during(samples, run.eval_end - run.eval_s, run.eval_end)
            median = statistics.median(busy) if busy else None
            verdicts.append(Verdict(
                run.eval_s <= EVAL_LIMIT_S and median is not None and median >= EVAL_MEDIAN_UTILIZATION,
                f"{run.variant}: evaluation <= {EVAL_LIMIT_S:.0f} s with nvidia-smi's median utilization during it "
                f">= {EVAL_MEDIAN_UTILIZATION:.0f}%",
                f"{run.eval_s:.1f} s, median {'-' if median is None else f'{median:.0f}%'} of {len(busy)} samples, "
                f"on {run.device or 'an unrecorded device'}"))
        verdicts.append(Verdict(None if run.peak_gpu_gb is None else run.peak_gpu_gb <= PEAK_MEMORY_GB,
                                f"{run.variant}: peak GPU memory of the run <= {PEAK_MEMORY_GB:.0f} GB",
                                "not recorded" if run.peak_gpu_gb is None else f"{run.peak_gpu_gb:.1f} GB"))
    if not runs:
        verdicts.append(Verdict(None, "each quick-start run's evaluation and peak memory", "no run recorded"))
    return verdicts


def plan_verdict(plan: StepResult, sweep: StepResult) -> Verdict:
    what = f"the sweep plan within {PLAN_TOLERANCE:.0%} of the sweep's wall time"
    try:
        estimate = json.loads(plan.log[plan.log.index("{"):])["totals"]["wall_s"]
    except (ValueError, KeyError, TypeError):
        return Verdict(None, what, f"no estimate ({plan.how()})")
    if sweep.status != 0 or not sweep.seconds:
        return Verdict(None, what, f"estimate {estimate:.0f} s; the sweep did not finish ({sweep.how()})")
    off = estimate / sweep.seconds - 1
    return Verdict(abs(off) <= PLAN_TOLERANCE, what, f"estimate {estimate:.0f} s against {sweep.seconds:.0f} s "
                                                     f"({off:+.0%})")


def bench_verdicts(step: StepResult, report: dict | None) -> list[Verdict]:
    """The compiled small step: graph breaks (recorded first, so judged even where the bench stopped later), MFU at
    the plan's FLOP count, peak memory."""
    graphs = {variant: figures for by_variant in (report or {}).get("graphs", {}).values()
              for variant, figures in by_variant.items()}  # preset -> variant -> steps.block_graphs
    counted = [figures.get("graph_breaks") for figures in graphs.values() if figures.get("graph_breaks") is not None]
    graph_text = ", ".join(f"{label} {figures.get('graphs')} graph(s), {figures.get('graph_breaks')} break(s)"
                           for label, figures in graphs.items())
    verdicts = [Verdict(all(count == 0 for count in counted) if counted else None,
                        "the compiled small step at 0 graph breaks",
                        graph_text or f"graph count not recorded ({step.how()}; {last_line(step.log)})")]
    gpu = next(iter((report or {}).get("gpu", {}).values()), None)
    mfu_what = f"the compiled small step (gatelab's Lightning step) at >= {MFU_TARGET:.0%} MFU (goal {MFU_GOAL:.0%})"
    memory_what = f"the compiled small step's peak GPU memory (max_memory_allocated) <= {PEAK_MEMORY_GB:.0f} GB"
    if not gpu or gpu.get("lightning_step_s") is None:
        why = f"no Lightning step figures in bench.json ({step.how()}; {last_line(step.log)})"
        return [*verdicts, Verdict(None, mfu_what, why), Verdict(None, memory_what, why)]
    mfu, flops, step_s = gpu.get("mfu_lightning"), gpu.get("model_flops_per_step"), gpu.get("lightning_step_s")
    verdicts.append(Verdict(None if mfu is None else mfu >= MFU_TARGET, mfu_what,
                            f"MFU {'-' if mfu is None else f'{mfu:.1%}'}: {flops and flops / 1e12:.4g} TFLOP a step "
                            f"(the plan's count) in {step_s:.4f} s against {(gpu.get('peak_flops') or 0) / 1e12:.0f} "
                            f"TFLOP/s ({gpu.get('gpu')})"))
    peak = gpu.get("lightning_peak_gpu_gb")
    verdicts.append(Verdict(None if peak is None else peak <= PEAK_MEMORY_GB, memory_what,
                            "not recorded" if peak is None else f"{peak:.1f} GB"))
    return verdicts


def top_kernels(report: dict | None, count: int = 5) -> list[str]:
    lines = []
    for preset, by_variant in (report or {}).get("kernels", {}).items():
        for variant, summary in by_variant.items():
            groups = ", ".join(f"{group['group'].split(' (')[0]} {group['share']:.0%}"
                               for group in summary.get("groups", [])[:count])
            lines.append(f"{preset} {variant}: {summary.get('window_ms_per_step', float('nan')):.1f} ms a step, "
                         f"idle {summary.get('idle_share', float('nan')):.1%}; {groups}")
    return lines


def pytest_verdict(step: StepResult) -> Verdict:
    closing = last_line(step.log)
    passed = step.status == 0 and " passed" in closing and "failed" not in closing and "error" not in closing
    return Verdict(None if step.status is None else passed, "pytest -m gpu passes", f"{step.how()}; {closing}")


def read_runs(runs_dir: Path) -> list[RunRecord]:
    """The quick-start sweep's runs, oldest first, from the runs folder's SQLite MLflow store."""
    uri = default_tracking_uri(runs_dir, create=False, as_written=True)
    if not sqlite_file(uri).exists():
        return []
    import mlflow

    client = mlflow.MlflowClient(uri)
    records = []
    for experiment in client.search_experiments():
        for run in client.search_runs([experiment.experiment_id]):
            history = client.get_metric_history(run.info.run_id, EVAL_S)
            eval_end = history[-1].timestamp / 1000 if history else None
            metrics, tags = run.data.metrics, run.data.tags
            records.append((run.info.start_time, RunRecord(
                tags.get("variant", run.info.run_name or "?"), tags.get("gatelab.status", run.info.status.lower()),
                metrics.get(EVAL_S), eval_end, metrics.get(PEAK_GPU_GB),
                tags.get("gatelab.device", ""))))
    return [record for _, record in sorted(records, key=lambda pair: pair[0])]


def verdicts_of(step: str, logs: Path, runs_dir: Path | None) -> list[Verdict]:
    if step == "numerics":
        return [numerics_verdict(read_step(logs, "numerics"))]
    if step == "sweep":
        sweep = read_step(logs, "sweep")
        runs = read_runs(runs_dir) if runs_dir else []
        return [*sweep_verdicts(sweep, runs, read_utilization(logs / "gpu-util.csv")),
                plan_verdict(read_step(logs, "plan"), sweep)]
    if step == "bench":
        path = logs / "bench" / "bench.json"
        report = json.loads(path.read_text()) if path.exists() else None
        for line in top_kernels(report):
            print(f"         kernels: {line}")
        return bench_verdicts(read_step(logs, "bench"), report)
    if step == "pytest":
        return [pytest_verdict(read_step(logs, "pytest"))]
    raise ValueError(f"unknown step {step!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("step", choices=["numerics", "sweep", "bench", "pytest", "table"])
    parser.add_argument("--logs", type=Path, required=True)
    parser.add_argument("--runs", type=Path)
    args = parser.parse_args(argv)
    lines_file = args.logs / "lines.txt"
    if args.step == "table":
        lines = lines_file.read_text().splitlines() if lines_file.exists() else []
        print("\n".join(["", "GPU check (issue 41):", *lines]))
        return 1 if any(line.startswith("FAIL") for line in lines) or not lines else 0
    lines = [verdict.line() for verdict in verdicts_of(args.step, args.logs, args.runs)]
    with lines_file.open("a") as out:
        out.write("".join(f"{line}\n" for line in lines))
    print("\n".join(lines), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
