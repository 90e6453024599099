"""Real `gatelab` commands in child processes: one training run (its fixed costs, evaluation and peak memory),
compiling twice in one runs folder (the second should load the first's cache), a sweep with one worker and then two,
and the sweep plan over the paper-scale preset."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from gatelab import tracking
from gatelab.config import ExperimentConfig
from gatelab.errors import GatelabError
from gatelab.metrics import EVAL_S, PEAK_GPU_GB, PEAK_GPU_TRAIN_GB, PEAK_RSS_GB, TRAIN_S
from gatelab.store_uris import default_tracking_uri

PLAN_SWEEP, PLAN_EXPERIMENT = "sweeps/paper-table1.yaml", "experiments/paper-moe-15b.yaml"
# The end-of-run evaluation cut to a few windows: the compile runs time their first steps, not their evaluation, and
# each of the two would otherwise pay a full one (up to 20 s on a GPU, about 10 s for tiny on 2 CPU cores).
LIGHT_EVALUATION = ("eval.max_windows_per_domain=1", "eval.long_context_multipliers=[1]", "eval.blimp=false",
                    "eval.in_context_examples=1", "eval.probe_batches=1")


def child_seconds(command: list[str], cwd: Path, timeout: float = 3600) -> float:
    """Wall seconds of a command that must succeed."""
    return timed_child(command, cwd, timeout)[0]


def timed_child(command: list[str], cwd: Path, timeout: float = 3600,
                env: dict[str, str] | None = None) -> tuple[float, subprocess.CompletedProcess]:
    """(wall seconds, what it printed) of a command that must succeed."""
    started = time.perf_counter()
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    if result.returncode != 0:
        raise GatelabError(f"`{' '.join(command)}` failed ({result.returncode}):\n{result.stdout[-2000:]}"
                           f"\n{result.stderr[-4000:]}")
    return time.perf_counter() - started, result


def run_timings(runs_dir: Path, seed: int | None = None) -> list[dict[str, float]]:
    """The `time/*` and `memory/*` metrics of every finished run in a runs folder's MLflow store (of one seed's)."""
    store = tracking.RunStore(default_tracking_uri(runs_dir, create=False, as_written=True), runs_dir)
    return store.finished_run_metrics(("time/", "memory/"), seed=seed)


def measures_compile_cache(experiment: ExperimentConfig, device: torch.device) -> bool:
    """Whether the bench runs `compile_cost` for a preset: where the preset compiles, and on every GPU, where the
    target (the second run of a shape compiles in under 10 s) is about inductor's cache, which a GPU sweep that turns
    compiling on leans on whatever the preset says."""
    return experiment.train.compile or device.type == "cuda"


def compile_cost(preset: str, steps: int, folder: Path, evaluate_second: bool = False) -> dict:
    """Two real `gatelab train` runs of the same shapes (seeds 0 and 1) with `train.compile` on, one after the other
    in one fresh runs folder: the first compiles, the second should load inductor's cache (gatelab.train.compiling).
    Each run's compile seconds and cache counts are read from its own log line, with its wall seconds. Both evaluate
    lightly (LIGHT_EVALUATION), except the second where `evaluate_second`: on a GPU it is also the bench's one real
    run (`run_cost_of`), which saves a child process of about a minute of the GPU check's eight."""
    from gatelab.train.compiling import CACHE_VARIABLE, COMPILED_LINE

    environment = {k: v for k, v in os.environ.items() if k != CACHE_VARIABLE}
    environment["GATELAB_PROGRESS_EVERY"] = "3600"
    runs = []
    for seed in (0, 1):
        command = [sys.executable, "-m", "gatelab", "train", str(Path(preset).resolve()), "--runs-dir", str(folder),
                   "--set", f"train.max_steps={steps}", "--set", "train.compile=true", "--set", f"seed={seed}"]
        if not (evaluate_second and seed == 1):
            command += [word for setting in LIGHT_EVALUATION for word in ("--set", setting)]
        wall, result = timed_child(command, folder, env=environment)
        found = COMPILED_LINE.search(result.stdout)
        if not found:
            raise GatelabError(f"`{' '.join(command)}` said nothing of compiling:\n"
                               f"{result.stdout[-2000:]}\n{result.stderr[-4000:]}")
        runs.append({"seed": seed, "compile_s": float(found[1]), "graphs_loaded": int(found[2]),
                     "graphs_compiled": int(found[3]), "line": found[0], "wall_s": wall})
    return {"preset": preset, "steps": steps, "runs": runs, "cache": str(folder / "compile-cache")}


def run_cost(preset: str, steps: int, step_s: float, preset_steps: int, folder: Path) -> dict:
    """A real `gatelab train` of `steps` steps in a child process: its wall time, phases and peak memory; the fixed
    part (everything but training) against the preset's full training time at the measured step time."""
    command = [sys.executable, "-m", "gatelab", "train", str(Path(preset).resolve()), "--quiet",
               "--runs-dir", str(folder), "--set", f"train.max_steps={steps}"]
    return run_cost_of(preset, steps, child_seconds(command, cwd=folder), step_s, preset_steps, folder)


def run_cost_of(preset: str, steps: int, wall: float, step_s: float, preset_steps: int, folder: Path,
                seed: int | None = None, compiled: bool = False) -> dict:
    """`run_cost`'s figures of a run that finished in `folder` (the one of `seed`) in `wall` seconds."""
    timings = run_timings(folder, seed)
    phases = timings[0] if timings else {}
    peak = phases.get(PEAK_RSS_GB, math.nan) * 1e9  # the run's own figure: a child's maxrss counts forks
    train_s = phases.get(TRAIN_S)
    fixed_s = wall - train_s if train_s is not None else None
    full_train_s = preset_steps * step_s
    return {"preset": preset, "steps": steps, "wall_s": wall, "peak_rss_bytes": peak, "compiled": compiled,
            "peak_gpu_gb": phases.get(PEAK_GPU_GB),  # gatelab.train.phases.peak_memory; none on a CPU
            "peak_gpu_train_gb": phases.get(PEAK_GPU_TRAIN_GB),  # training's alone, before evaluation
            "phases": {k.removeprefix("time/"): v for k, v in phases.items() if k.startswith("time/")},
            "fixed_s": fixed_s, "preset_steps": preset_steps, "preset_train_s_at_measured_step": full_train_s,
            "fixed_share_of_preset_run": fixed_s / (fixed_s + full_train_s) if fixed_s is not None else None}


def sweep_cost(sweep: str, folder: Path, workers: tuple[int, ...] = (1, 2)) -> dict:
    """`gatelab sweep run` of a real sweep with each worker count, in fresh runs folders: wall time and, from the runs'
    `time/*` metrics, the share of the one-worker wall time that is not training."""
    results = {}
    for count in workers:
        runs_dir = folder / f"workers{count}"
        command = [sys.executable, "-m", "gatelab", "sweep", "run", str(Path(sweep).resolve()), "--workers",
                   str(count), "--runs-dir", str(runs_dir)]
        wall = child_seconds(command, cwd=folder, timeout=4 * 3600)
        timings = run_timings(runs_dir)
        train_s = sum(t.get(TRAIN_S, math.nan) for t in timings)
        peak = max((t.get(PEAK_RSS_GB, math.nan) for t in timings), default=math.nan) * 1e9
        results[count] = {"wall_s": wall, "runs": len(timings), "train_s_sum": train_s, "peak_rss_bytes": peak,
                          "eval_s_sum": sum(t.get(EVAL_S, math.nan) for t in timings)}
    one = results[workers[0]]
    summary = {"sweep": sweep, "by_workers": results,
               "fixed_share_one_worker": (one["wall_s"] - one["train_s_sum"]) / one["wall_s"]}
    if len(workers) > 1:
        summary["throughput_ratio"] = one["wall_s"] / results[workers[-1]]["wall_s"]
    return summary


def plan_seconds(root: Path) -> float:
    return child_seconds([sys.executable, "-m", "gatelab", "sweep", "plan", str(root / PLAN_SWEEP), "--experiment",
                          str(root / PLAN_EXPERIMENT), "--json"], cwd=root)
