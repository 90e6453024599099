"""bench.md and bench.json from a BenchReport, and the summary `gatelab bench` prints last."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

from gatelab.bench.checks import QUICKSTART_STEPS, gpu_figures
from gatelab.bench.gpu_profile import kernel_markdown
from gatelab.bench.measure import GPU_FP32_ROWS
from gatelab.bench.profiling import profile_groups
from gatelab.bench.report import BenchReport
from gatelab.bench.runs import PLAN_EXPERIMENT, PLAN_SWEEP
from gatelab.bench.steps import PEER_LABEL


def fmt(value, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def fmt_interval(interval) -> str:
    return "" if not interval else f"{fmt(interval[0])}-{fmt(interval[1])}"


def percent(share: float | None) -> str:
    return "n/a" if share is None else f"{share:.0%}"


def targets_markdown(report: BenchReport) -> list[str]:
    """The targets and whether each holds: near the top of bench.md, and again at the end of what the command prints
    (after the GPU figures, on a GPU), where a reader of the terminal looks."""
    lines = ["## Targets", "",
             "A step-time ratio's 95% interval is a bootstrap over its timed steps (interleaved rounds resampled "
             "whole): where it reaches across the limit, whether the target holds in one run is down to the run's "
             "noise."]
    if report.machine.get("gpu"):
        lines[-1] += (" The rows named GPU come last: the targets of a GPU run (issues 30 and 31); the rows named "
                      "tiny are the CPU's.")
    lines += ["", "| target | measured | 95% interval | limit | holds |", "|---|---|---|---|---|"]
    for c in report.checks:
        holds = {True: "yes", False: "**no**", None: "not measured"}[c["holds"]]
        holds += " (within noise)" if c.get("within_noise") else ""
        lines.append(f"| {c['target']} | {fmt(c['measured'])} | {fmt_interval(c.get('interval'))} | "
                     f"{'≤' if c['at_most'] else '≥'} {c['limit']} | {holds} |")
    return lines


def gpu_markdown(report: BenchReport) -> list[str]:
    """The figures behind the GPU's targets (gpu_figures); nothing on a CPU."""
    figures = gpu_figures(report)
    if not figures:
        return []
    lines = ["## On the GPU", "",
             "MFU: model FLOPs a step (the plan's count) / the median step time / the GPU's dense bf16 peak, of "
             "gatelab's Lightning step (as it trains) and of the plain loop. Evaluation, fixed costs (all but "
             "training: start, imports, setup, evaluation) and peak memory: the real child run. Evaluation share: of "
             f"a run of {QUICKSTART_STEPS} steps (the quick start's length) at the Lightning step time, plus those "
             "fixed costs.",
             "",
             "| preset | GPU | peak TFLOP/s | model GFLOP/step | Lightning step (ms) | MFU | plain step (ms) | MFU | "
             f"evaluation (s) | fixed (s) | evaluation share of a {QUICKSTART_STEPS}-step run | peak GPU memory (GB) | "
             "of which training (GB) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def ms(seconds: float | None) -> str:
        return fmt(seconds and seconds * 1e3)

    for preset, g in figures.items():
        lines.append(f"| {preset} | {g['gpu']} | {fmt(g['peak_flops'] and g['peak_flops'] / 1e12)} | "
                     f"{fmt(g['model_flops_per_step'] and g['model_flops_per_step'] / 1e9, 5)} | "
                     f"{ms(g['lightning_step_s'])} | {fmt(g['mfu_lightning'], 2)} | {ms(g['plain_step_s'])} | "
                     f"{fmt(g['mfu_plain'], 2)} | {fmt(g['eval_s'])} | {fmt(g['fixed_s'])} | "
                     f"{percent(g['eval_share_of_quickstart_run'])} | {fmt(g['peak_gpu_gb'])} | "
                     f"{fmt(g['peak_gpu_train_gb'])} |")
    if any(g["peak_flops"] is None for g in figures.values()):
        lines += ["", "MFU not measured: this GPU is not in gatelab's table of GPU peaks "
                      "(gatelab.devices.GPU_PEAKS)."]
    return lines


def summary_markdown(report: BenchReport) -> str:
    """What `gatelab bench` prints last: the GPU figures (on a GPU), then the targets."""
    lines = gpu_markdown(report)
    return "\n".join(lines + [""] * bool(lines) + targets_markdown(report)) + "\n"


def to_markdown(report: BenchReport) -> str:
    m = report.machine
    lines = ["# gatelab bench" + ("" if report.complete
                                  else " (partial: saved between parts, the bench had not ended)"),
             "", f"`{report.command}`", "",
             f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']} ({m['torch_threads']} threads), "
             f"fast bf16 on the CPU: {'yes' if m['fast_bf16_cpu'] else 'no'}, GPU: {m['gpu'] or 'none'}.", ""]
    lines += targets_markdown(report)
    gpu = gpu_markdown(report)
    lines += [""] * bool(gpu) + gpu
    for section in (step_times_markdown, flops_markdown, op_profile_markdown, kernels_markdown, notes_markdown,
                    graphs_markdown, compiling_markdown, numerics_markdown, runs_markdown, estimates_markdown):
        lines += section(report)
    return "\n".join(lines) + "\n"


def step_times_markdown(report: BenchReport) -> list[str]:
    lines = ["", "## Step times (median of interleaved steps)", "",
             "A variant's FLOP ratio is its model FLOPs per step over baseline's: the step-time ratio a step bound by "
             "its FLOPs would have." + (f" On a GPU the fp32 row's ratio to the preset's precision is measured on at "
                                        f"most {GPU_FP32_ROWS} rows of the batch (a whole batch may not fit in fp32)."
                                        if report.machine.get("gpu") else ""), "",
             "| preset | what | precision | step (ms) | tokens/s | ratio | 95% interval | to | FLOP ratio | "
             "spread p10-p90 | steps |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in report.steps:
        lines.append(f"| {s.preset} | {s.label} | {s.precision} | {s.step_s * 1e3:.0f} | {s.tokens_per_s:.0f} | "
                     f"{fmt(s.ratio)} | {fmt_interval(s.ratio_interval)} | {s.ratio_to or ''} | "
                     f"{fmt(s.flops_ratio, 4)} | {s.spread:.0%} | {s.steps} |")
    return lines


def flops_markdown(report: BenchReport) -> list[str]:
    lines = ["", "## FLOPs", "",
             "| preset | precision | model GFLOP/step | achieved GFLOP/s | GEMM GFLOP/s (same shapes) | "
             "achieved / GEMM rate | GEMM s/step | share outside GEMMs | 1024³ GEMM GFLOP/s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for g in report.gemm:
        lines.append(f"| {g.preset} | {g.precision} | {g.model_flops_per_step / 1e9:.1f} | "
                     f"{g.achieved_flops_per_s / 1e9:.1f} | {g.gemm_flops_per_s / 1e9:.1f} | {g.gemm_rate_share:.0%} | "
                     f"{g.gemm_s_per_step:.3f} | {g.share_outside_gemm:.0%} | {g.square_gemm_flops_per_s / 1e9:.1f} |")
    return lines


def op_profile_markdown(report: BenchReport) -> list[str]:
    lines = []
    for preset, rows in report.profile.items():
        lines += ["", f"## Where a {preset} step goes (torch.profiler, self time by op group)", "",
                  "| group | ms/step | share | slowest ops |", "|---|---|---|---|"]
        for group in profile_groups(rows):
            lines.append(f"| {group['group']} | {group['ms_per_step']:.1f} | {group['share']:.1%} | "
                         f"{', '.join(group['ops'])} |")
        lines += ["", "| op | group | ms/step | share | calls/step |", "|---|---|---|---|---|"]
        for row in rows[:15]:
            lines.append(f"| {row['op'][:60]} | {row['group']} | {row['ms_per_step']:.1f} | {row['share']:.1%} | "
                         f"{row['calls_per_step']:.0f} |")
    return lines


def kernels_markdown(report: BenchReport) -> list[str]:
    lines = []
    for preset, by_variant in report.kernels.items():
        for variant, summary in by_variant.items():
            lines += [""] + kernel_markdown(summary, f"CUDA kernels of a {preset} step: {variant} "
                                                     f"({report.machine.get('gpu')}, torch.profiler)")
    return lines


def notes_markdown(report: BenchReport) -> list[str]:
    """Why transformers was not compared, where it was not, and what else was not measured."""
    lines = []
    for preset, why in report.peer.items():
        lines += ["", f"{preset}: {PEER_LABEL} {why}."]
    for note in report.notes:
        lines += ["", f"{note}."]
    return lines


def graphs_markdown(report: BenchReport) -> list[str]:
    if not report.graphs:
        return []
    lines = ["", "## Graphs of a compiled block (torch._dynamo.explain on block 0)", "",
             "One graph is a block without graph breaks; each break returns to Python between two graphs, which "
             "inductor cannot fuse across.", "",
             "| preset | variant | graphs | graph breaks | why |", "|---|---|---|---|---|"]
    for preset, by_variant in report.graphs.items():
        for variant, g in by_variant.items():
            why = "; ".join(f"{count}x {reason}" for reason, count in g["break_reasons"].items())
            lines.append(f"| {preset} | {variant} | {g['graphs']} | {g['graph_breaks']} | {why} |")
    return lines


def compiling_markdown(report: BenchReport) -> list[str]:
    if not report.compile_cost:
        return []
    lines = ["", "## Compiling, twice in one runs folder (real `gatelab train` runs)", "",
             "| preset | run | compile (s) | graphs loaded from the cache | graphs compiled |", "|---|---|---|---|---|"]
    for preset, cost in report.compile_cost.items():
        for index, run in enumerate(cost["runs"], 1):
            lines.append(f"| {preset} | {index} (seed {run['seed']}) | {run['compile_s']:.1f} | "
                         f"{run['graphs_loaded']} | {run['graphs_compiled']} |")
    return lines


def numerics_markdown(report: BenchReport) -> list[str]:
    lines = []
    for preset, numerics in report.numerics.items():
        curves = numerics["curves"]
        rows = f", {numerics['batch_size']} rows a batch" if "batch_size" in numerics else ""
        lines += ["", f"## Numerics: {preset}, {numerics['steps']} training steps on the same batches (fp32{rows})", "",
                  "The step before the faster one (whole logits, per-parameter AdamW, eager) against this one.", "",
                  "| step | before | eager | compiled |", "|---|---|---|---|"]
        for index in sorted({i for i in (0, 9, 19, 29, 39) if i < numerics["steps"]} | {numerics["steps"] - 1}):
            lines.append(f"| {index + 1} | {curves['before'][index]:.6f} | {curves['eager'][index]:.6f} | "
                         f"{curves['compiled'][index]:.6f} |")
        differences = numerics["max_relative_difference"]
        lines.append(f"| largest relative difference | | {differences['eager']:.2g} | {differences['compiled']:.2g} |")
    return lines


def runs_markdown(report: BenchReport) -> list[str]:
    """The real child run of each preset, and the sweep with one worker and then two where there was one."""
    lines = ["", "## One run (a real `gatelab train` in a child process)", "",
             "| preset | steps | wall (s) | import | setup | train | eval | fixed (s) | preset run: fixed share | "
             "peak RSS (GB) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, c in report.run_cost.items():
        p = c["phases"]
        lines.append(f"| {name}{' (compiled, from the cache)' if c.get('compiled') else ''} | {c['steps']} | "
                     f"{c['wall_s']:.1f} | {fmt(p.get('import_s'))} | "
                     f"{fmt(p.get('setup_s'))} | {fmt(p.get('train_s'))} | {fmt(p.get('eval_s'))} | "
                     f"{fmt(c['fixed_s'])} | {fmt(c['fixed_share_of_preset_run'])} | "
                     f"{c['peak_rss_bytes'] / 1e9:.2f} |")
    if report.sweep:
        lines += ["", f"## Sweep `{report.sweep['sweep']}`", "",
                  "| workers | wall (s) | runs | Σ train (s) | Σ eval (s) | peak RSS of a worker (GB) |",
                  "|---|---|---|---|---|---|"]
        for count, r in report.sweep["by_workers"].items():
            lines.append(f"| {count} | {r['wall_s']:.0f} | {r['runs']} | {r['train_s_sum']:.0f} | "
                         f"{r['eval_s_sum']:.0f} | {r['peak_rss_bytes'] / 1e9:.2f} |")
    return lines


def estimates_markdown(report: BenchReport) -> list[str]:
    """The sweep plan's seconds and the GPU estimates from FLOP and byte counts."""
    lines = ["", f"`gatelab sweep plan {PLAN_SWEEP} --experiment {PLAN_EXPERIMENT} --json`: "
             f"{fmt(report.plan_seconds)} s", "",
             "## One GPU, estimated from FLOP and byte counts (not measured)", "",
             "| preset | params (M) | tokens/step | GFLOP/step | step (s) | tokens/s | run (h) | memory (GB) |",
             "|---|---|---|---|---|---|---|---|"]
    for e in report.gpu_estimates:
        lines.append(f"| {e['preset']} | {e['params'] / 1e6:.1f} | {e['tokens_per_step']} | "
                     f"{e['flops_per_step'] / 1e9:.0f} | {e['step_s']:.3f} | {e['tokens_per_s']:.0f} | "
                     f"{e['run_hours']:.2f} | {e['memory_gb']:.1f} |")
    return lines


def write(report: BenchReport, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(asdict(report), indent=2, default=str) + "\n")
    (out / "bench.md").write_text(to_markdown(report))
    return [out / "bench.json", out / "bench.md"]
