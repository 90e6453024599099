"""`bench`: every measurement of `gatelab bench`, part by part, into one BenchReport.

Every figure is a median of many steps after warm-up, and the steps of the things compared are interleaved (one step
of each in turn, round after round), so a machine that slows down or speeds up midway shifts all of them alike: on a
shared machine single timings drift from minute to minute by more than most differences measured here.
"""

from __future__ import annotations

import importlib.util
import re
import statistics
import tempfile
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gatelab import host
from gatelab.bench.checks import acceptance_checks, gpu_figures
from gatelab.bench.flops import gemm_pass, gemm_shapes, gpu_estimate, model_flops_per_step, square_gemm_flops
from gatelab.bench.gpu_profile import kernel_profile, lightning_kernel_profile
from gatelab.bench.machine import bench_device, machine_facts
from gatelab.bench.profiling import op_profile
from gatelab.bench.report import BenchReport, GemmFigures, StepFigures
from gatelab.bench.runs import compile_cost, measures_compile_cache, plan_seconds, run_cost, run_cost_of, sweep_cost
from gatelab.bench.steps import (
    PEER_LABEL,
    block_graphs,
    cuda_graph_step,
    fits_in_memory,
    lightning_steps,
    loss_curves,
    matmul_dtype,
    plain_step,
    transformers_step,
)
from gatelab.bench.timing import ratio_interval, spread, time_interleaved
from gatelab.config import ExperimentConfig
from gatelab.data.resolve import load_experiment
from gatelab.errors import GatelabError
from gatelab.host import resolve_precision
from gatelab.model import resolve_model
from gatelab.sweep.spec import load_sweep
from gatelab.variants import variant_ids

DEFAULT_PRESETS = ("experiments/tiny.yaml", "experiments/tiny-moe.yaml")
# `gatelab bench`'s options on a CUDA machine, for those the user does not give (`with_gpu_defaults`): the GPU preset
# (tiny and tiny-moe are sized for 2 CPU cores and say nothing of a GPU), baseline, every G1 variant (issue 31: each
# within 3% of its FLOP ratio) and one variant of each other gate position, and fewer timed steps and shorter
# warm-ups (a GPU step's time settles within a step or two and spreads by a few percent, a shared CPU's by 20-35%).
# The child run keeps its 20 steps.
GPU_VARIANTS = ("baseline", "g1_elem_sig", "g1_head_sig", "g1_elem_sig_shared", "g1_elem_silu", "g1_elem_silu_add",
                "g1_elem_nssig", "g1_elem_id_add", "g1_inputindep_sig", "g1_rmsnorm", "g1_silu_noparam",
                "g2_elem_sig", "g3_elem_sig", "g4_elem_sig", "g5_elem_sig")
GPU_DEFAULTS = {"presets": ("experiments/small.yaml",), "variants": ",".join(GPU_VARIANTS), "steps": 10,
                "warmup": 2, "lightning_steps": 10}
# Rows of the batch that fp32 steps take on a GPU (the fp32/bf16 ratio and the loss curves): a whole small batch
# (64 x 1024) keeps about 75 GB of activations for the backward pass in fp32 (54 GB under bf16 autocast; counted with
# saved-tensor hooks), more than an H100 holds beside the bench's other models, and 3 x 50 fp32 steps of it would take
# two minutes of the GPU check's eight.
GPU_FP32_ROWS = 16
# Steps of those loss curves on a GPU (50 on a CPU): the three curves and an fp32 compile stay under half a minute.
GPU_CURVE_STEPS = 20
# The parts of `bench` a run may leave out (`gatelab bench --parts`); the Lightning step against the plain loop, the
# sweep plan and the GPU estimates always run. variants: every variant against baseline (and the CUDA kernel profiles);
# compile: eager against compiled (and CUDA graphs on a GPU), and the other precision; numerics: the loss curves;
# profile: the op profile and the GEMM rate; run: the real child runs (fixed costs, evaluation, peak memory, compiling
# from the cache).
PARTS = ("variants", "compile", "numerics", "profile", "run")


def with_gpu_defaults(options: dict, given: Collection[str]) -> dict:
    """`gatelab bench`'s options (by parameter name) with GPU_DEFAULTS for those not in `given`, on a machine with
    CUDA; elsewhere, or for an option the user gave, as they are."""
    if not torch.cuda.is_available():
        return options
    return options | {name: value for name, value in GPU_DEFAULTS.items() if name not in given}


@dataclass(frozen=True)
class Settings:
    """The options every preset is measured with."""

    variants: list[str]
    warmup: int
    measured: int  # timed rounds of interleaved steps
    lightning_steps: int  # steps of each Lightning block
    run_steps: int
    bf16_steps: int
    log: Callable[[str], object]


@dataclass
class PresetUnderTest:
    """One preset as its parts measure it; the Lightning part, which always runs, adds the preset's plain step and the
    times the later parts are set against."""

    preset: Path
    base: ExperimentConfig
    precision: str
    device: torch.device
    plain: Callable[[], None] | None = None  # the preset's plain step
    plain_times: list[float] = field(default_factory=list)
    lightning_times: list[float] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.base.name

    @property
    def tokens(self) -> int:
        return self.base.train.batch_size * self.base.data.seq_len

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def plain_label(self) -> str:
        return f"plain {self.precision}"

    @property
    def plain_s(self) -> float:
        return statistics.median(self.plain_times)

    @property
    def lightning_s(self) -> float:
        return statistics.median(self.lightning_times)


def validate(presets: list[Path], variants: list[str], sweep: Path | None) -> None:
    """Every preset, variant and the sweep file load before anything is measured (errors name file and key)."""
    if "baseline" not in variants:
        raise GatelabError(f"--variants must include baseline (the ratios are to it), got {', '.join(variants)}")
    for preset in presets:
        for variant in variants:
            variant_ids(variant)
            resolve_model(load_experiment(preset, [f"variant={variant}"]))
    if sweep is not None:
        load_sweep(sweep)


def bench(presets: list[Path], variants: list[str], warmup: int, measured: int, lightning_steps_count: int,
          run_steps: int, sweep: Path | None, bf16_steps: int, log=print, parts: Collection[str] = PARTS,
          save: Callable[[BenchReport], object] | None = None) -> BenchReport:
    """Every measurement, in this order, printing progress with `log`; of the optional ones (PARTS) those in `parts`.
    `save` gets the report so far after each part (marked partial), so a bench cut off by a time limit keeps what it
    measured.

    On a GPU it must end within 8 minutes (issue 30; issue 31's acceptance script gives it 7.5 of its 9): about 400 s
    for the small preset with GPU_DEFAULTS, estimated from figures measured on an H200 at 9f6aa79: start and imports
    10-15 s, CUDA 2-5 s, an eager bf16 step 0.25 s, a compiled one 0.21 s after a first compile of about 13 s (3 s
    from the cache), an fp32 step 0.8 s (0.2 s on GPU_FP32_ROWS rows), an evaluation of at most 20 s.
    """
    validate(presets, variants, sweep)
    # Every variant's compiled blocks stay live here, side by side: more graphs of Block.forward than dynamo keeps by
    # default (8), past which it would run the rest eager (a training run compiles one variant: see
    # gatelab.train.compiling.forget_earlier_graphs).
    torch._dynamo.config.recompile_limit = 64
    report = BenchReport(machine=machine_facts())

    def part_done() -> None:
        if save is not None:
            report.gpu, report.checks = gpu_figures(report), acceptance_checks(report)
            save(report)

    root, device = host.repo_root(), bench_device()
    settings = Settings(variants, warmup, measured, lightning_steps_count, run_steps, bf16_steps, log)
    for preset in presets:
        bench_preset(report, preset, device, settings, parts, part_done)
    measure_plan_and_sweep(report, root, sweep, log)
    report.gpu = gpu_figures(report)
    report.checks = acceptance_checks(report)
    report.complete = True
    return report


def bench_preset(report: BenchReport, preset: Path, device: torch.device, settings: Settings,
                 parts: Collection[str], part_done: Callable[[], None]) -> None:
    """The parts of one preset, in order, with `part_done` after each (whether it ran or not)."""
    base = load_experiment(preset)
    precision = resolve_precision(base.train.precision, base.train.accelerator, moe=base.model.ffn == "moe")
    under_test = PresetUnderTest(preset, base, precision, device)
    report.model_flops[under_test.name] = model_flops_per_step(base)
    measure_graphs(report, under_test, settings)
    if "variants" in parts:
        measure_variants(report, under_test, settings)
    part_done()
    measure_lightning(report, under_test, settings)
    part_done()
    measure_lightning_kernels(report, under_test, settings)
    for part, measure in (("compile", measure_compile), ("numerics", measure_numerics),
                          ("profile", measure_profile), ("run", measure_runs)):
        part_done()
        if part in parts:
            measure(report, under_test, settings)
    part_done()


def measure_graphs(report: BenchReport, under_test: PresetUnderTest, settings: Settings) -> None:
    """How many graphs dynamo makes of each variant's block (`block_graphs`), first: its `explain` resets dynamo, which
    would drop the compiled steps of the parts after it."""
    name = under_test.name
    report.graphs[name] = {v: block_graphs(load_experiment(under_test.preset, [f"variant={v}"]), under_test.precision)
                           for v in settings.variants}
    counts = ", ".join(f"{v} {g['graphs']}" for v, g in report.graphs[name].items())
    settings.log(f"{name}: graphs of a compiled block (torch._dynamo.explain; 1 is no graph break): {counts}")


def measure_variants(report: BenchReport, under_test: PresetUnderTest, settings: Settings) -> None:
    """Every variant's plain step against baseline's (and transformers' Qwen3 where it compares), interleaved; on a
    GPU, the CUDA kernels of one variant of each gate family."""
    name, precision, variants = under_test.name, under_test.precision, settings.variants
    compiled = "compiled" if under_test.base.train.compile else "eager"
    settings.log(f"{name}: variants {', '.join(variants)} at {precision} ({compiled}), {settings.measured} "
                 "interleaved steps each")
    experiments = {v: load_experiment(under_test.preset, [f"variant={v}"]) for v in variants}
    steps = {v: plain_step(experiment, precision) for v, experiment in experiments.items()}
    peer = peer_step(report, under_test, settings.log)
    if peer is not None:
        steps[PEER_LABEL] = peer
    times = time_interleaved(steps, settings.warmup + 1, settings.measured)  # one more round: the first compiles
    # both ratios to the "baseline" row (the preset itself may name another variant)
    base_s, base_flops = statistics.median(times["baseline"]), model_flops_per_step(experiments["baseline"])
    for variant, seconds in times.items():
        median = statistics.median(seconds)
        flops_ratio = (model_flops_per_step(experiments[variant]) / base_flops if variant in experiments
                       else None)
        interval = None if variant == "baseline" else ratio_interval(seconds, times["baseline"], paired=True)
        report.steps.append(StepFigures(name, variant, precision, median, under_test.tokens / median, len(seconds),
                                        median / base_s, "baseline", spread(seconds), flops_ratio, interval))
    if under_test.cuda:
        report.kernels[name] = {}
        for variant in kernel_profile_variants(list(experiments)):
            settings.log(f"{name}: CUDA kernels of a {variant} step (torch.profiler: kernels, their share, idle gaps)")
            report.kernels[name][f"{variant}, plain loop"] = kernel_profile(steps[variant])


def peer_step(report: BenchReport, under_test: PresetUnderTest, log: Callable[[str], object]) -> Callable | None:
    """transformers' Qwen3 step at the preset's shapes, to time beside the variants; else None, with why in
    `report.peer`."""
    name = under_test.name
    peer = transformers_step(under_test.base, under_test.precision)
    if peer is None:
        report.peer[name] = ("not compared: transformers is not installed (pip install -e \".[compare]\")"
                             if importlib.util.find_spec("transformers") is None
                             else "not compared: Qwen3ForCausalLM is a dense model with QK-norm, this preset "
                                  "is not")
        return None
    if under_test.cuda and not fits_in_memory(peer):
        del peer
        torch.cuda.empty_cache()
        report.peer[name] = f"not compared: its step at this batch runs out of {report.machine['gpu']}'s memory"
        return None
    log(f"{name}: with {PEER_LABEL} at the same shapes, interleaved")
    return peer


def kernel_profile_variants(variants: list[str]) -> list[str]:
    """Baseline and the first variant of each gate family (position G1..G5, and G1's headwise one) among `variants`:
    the steps whose CUDA kernels the bench profiles."""
    chosen, families = [], set()
    for variant in variants:
        family = ("baseline" if variant == "baseline"
                  else variant.split("_")[0] + ("_head" if "_head" in variant else ""))
        if family not in families and (family == "baseline" or re.fullmatch(r"g[1-5](_head)?", family)):
            families.add(family)
            chosen.append(variant)
    return chosen


def measure_lightning(report: BenchReport, under_test: PresetUnderTest, settings: Settings) -> None:
    """gatelab's Lightning step against the plain loop on the same model, in three alternating blocks of each."""
    name, precision, base, warmup = under_test.name, under_test.precision, under_test.base, settings.warmup
    settings.log(f"{name}: gatelab's Lightning step against the plain loop ({precision})")
    under_test.plain = plain = plain_step(base, precision)
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(3):  # three blocks of each, alternating, so drift hits both
            if under_test.cuda:  # the peak of gatelab's own step (the plain loop's model and state stay resident)
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            under_test.lightning_times += lightning_steps(base, precision, settings.lightning_steps,
                                                          Path(folder))[warmup:]
            if under_test.cuda:
                report.lightning_peak_gpu_gb[name] = max(report.lightning_peak_gpu_gb.get(name, 0.0),
                                                         torch.cuda.max_memory_allocated() / 1e9)
            under_test.plain_times += time_interleaved({"plain": plain}, warmup,
                                                       settings.lightning_steps - warmup)["plain"]
    plain_s, lightning_s, tokens = under_test.plain_s, under_test.lightning_s, under_test.tokens
    plain_times, lightning_times = under_test.plain_times, under_test.lightning_times
    report.steps.append(StepFigures(name, under_test.plain_label, precision, plain_s, tokens / plain_s,
                                    len(plain_times), spread=spread(plain_times)))
    report.steps.append(StepFigures(name, "lightning", precision, lightning_s, tokens / lightning_s,
                                    len(lightning_times), lightning_s / plain_s, under_test.plain_label,
                                    spread(lightning_times),
                                    ratio_interval=ratio_interval(lightning_times, plain_times, paired=False)))


def measure_lightning_kernels(report: BenchReport, under_test: PresetUnderTest, settings: Settings) -> None:
    """On a GPU, the CUDA kernels of gatelab's Lightning step, after its figures are saved: a profiler that fails
    (torch 2.11's events lack a field 2.13's have) costs them nothing."""
    name, precision, base, warmup = under_test.name, under_test.precision, under_test.base, settings.warmup
    if under_test.cuda:
        settings.log(f"{name}: CUDA kernels of gatelab's Lightning step ({base.variant}): data loader, logging and "
                     "optimizer included")
        kernels = lightning_kernel_profile(first=warmup + 1, steps=3)
        with tempfile.TemporaryDirectory() as folder:
            lightning_steps(base, precision, warmup + 5, Path(folder), callbacks=[kernels])
        report.kernels.setdefault(name, {})[f"{base.variant}, gatelab's Lightning step"] = kernels.summary


def measure_compile(report: BenchReport, under_test: PresetUnderTest, settings: Settings) -> None:
    """The plain step eager against compiled (and compiled with CUDA graphs on a GPU), interleaved with the preset's
    own; then the other precision (`measure_precisions`)."""
    name, precision, base, cuda = under_test.name, under_test.precision, under_test.base, under_test.cuda
    settings.log(f"{name}: eager against torch.compile" + (" and torch.compile with CUDA graphs" if cuda else "")
                 + ", then bf16 autocast against fp32 (eager, interleaved)")
    eager = base.with_train(compile=False)
    eager_step = plain_step(eager, precision)
    steps = {"eager": eager_step, "compiled": plain_step(base.with_train(compile=True), precision),
             "preset": under_test.plain}
    if cuda:
        graphed = cuda_graph_step(base, precision)
        if isinstance(graphed, str):
            report.notes.append(f"{name}: compiled with CUDA graphs {graphed}")
        else:
            steps["compiled, CUDA graphs"] = graphed
    times = time_interleaved(steps, settings.warmup + 1, settings.measured)  # one more round: the first compiles
    for setting in [s for s in steps if s != "preset"]:
        seconds = statistics.median(times[setting])
        report.steps.append(StepFigures(name, f"plain {precision} {setting}", precision, seconds,
                                        under_test.tokens / seconds, settings.measured,
                                        seconds / statistics.median(times["preset"]),
                                        under_test.plain_label, spread(times[setting]),
                                        ratio_interval=ratio_interval(times[setting], times["preset"], True)))
    eager_s = under_test.plain_s * statistics.median(times["eager"]) / statistics.median(times["preset"])
    measure_precisions(report, under_test, settings, eager, eager_step, eager_s)


def measure_precisions(report: BenchReport, under_test: PresetUnderTest, settings: Settings,
                       eager: ExperimentConfig, eager_step: Callable[[], None], eager_s: float) -> None:
    """The eager step in the other precision (fp32 against bf16 autocast) against the preset's, interleaved; and the
    preset as gatelab trains it (the Lightning step) against a plain fp32 eager loop."""
    name, precision, cuda, tokens = under_test.name, under_test.precision, under_test.cuda, under_test.tokens
    other = "bf16-mixed" if precision == "32-true" else "32-true"
    bf16_slow = not (report.machine["fast_bf16_cpu"] or cuda)
    rounds = settings.bf16_steps if bf16_slow else settings.measured  # emulated bf16 takes ~20x longer: fewer rounds
    # on a GPU the ratio of the two precisions on at most GPU_FP32_ROWS rows: a whole batch may not fit in fp32
    cut = eager.with_train(batch_size=min(GPU_FP32_ROWS, eager.train.batch_size)) if cuda else None
    times = time_interleaved({"preset": plain_step(cut, precision) if cut else eager_step,
                              "other": plain_step(cut or eager, other)}, 1, rounds)
    ratio = statistics.median(times["other"]) / statistics.median(times["preset"])
    other_s = eager_s * ratio  # the interleaved ratio, on the many-step median of the preset's precision
    report.steps.append(StepFigures(name, f"plain {other} eager", other, other_s, tokens / other_s, rounds,
                                    ratio, f"plain {precision} eager", spread(times["other"]),
                                    ratio_interval=ratio_interval(times["other"], times["preset"], True)))
    fp32_s = eager_s if precision == "32-true" else other_s
    lightning_s = under_test.lightning_s
    report.steps.append(StepFigures(name, "gatelab preset", precision, lightning_s, tokens / lightning_s,
                                    len(under_test.lightning_times), lightning_s / fp32_s, "plain 32-true eager"))


def measure_numerics(report: BenchReport, under_test: PresetUnderTest, settings: Settings) -> None:
    """fp32 loss curves of the step before the faster one, and of this one eager and compiled (`loss_curves`)."""
    rows = min(GPU_FP32_ROWS, under_test.base.train.batch_size) if under_test.cuda else None
    curve_steps = GPU_CURVE_STEPS if under_test.cuda else 50
    settings.log(f"{under_test.name}: a {curve_steps}-step fp32 loss curve of the step before the faster one, and of "
                 "this one eager and compiled" + (f" ({rows} rows a batch)" if rows else ""))
    report.numerics[under_test.name] = loss_curves(under_test.base, steps=curve_steps, rows=rows)


def measure_profile(report: BenchReport, under_test: PresetUnderTest, settings: Settings) -> None:
    """The plain step's op profile, and its model FLOP/s against this machine's rate on the step's own GEMMs, timed
    in the same interleaved rounds."""
    name, precision, plain, log = under_test.name, under_test.precision, under_test.plain, settings.log
    log(f"{name}: profile of the step by op")
    report.profile[name] = op_profile(plain)

    log(f"{name}: GEMM shapes of one step, and this machine's rate on them (interleaved with the step)")
    dtype = matmul_dtype(precision)
    shapes = gemm_shapes(plain, dtype)
    gemms, gemm_flops = gemm_pass(shapes)
    times = time_interleaved({"step": plain, "gemms": gemms}, settings.warmup, settings.measured)
    step_s, gemm_s = statistics.median(times["step"]), statistics.median(times["gemms"])
    flops = model_flops_per_step(under_test.base)
    interval = ratio_interval(times["gemms"], times["step"], paired=True)  # gemm_s / step_s
    scale = flops / gemm_flops
    report.gemm.append(GemmFigures(name, precision, flops, flops / step_s, gemm_flops / gemm_s, gemm_s,
                                   max(0.0, 1 - gemm_s / step_s), square_gemm_flops(dtype), len(shapes),
                                   interval and (scale * interval[0], scale * interval[1])))


def measure_runs(report: BenchReport, under_test: PresetUnderTest, settings: Settings) -> None:
    """Real `gatelab train` runs in child processes: on a CPU one run (fixed costs, evaluation, peak memory); where
    the compile cache is measured, two compiled runs in one runs folder, the second of which is the one real run on a
    GPU."""
    name, base, cuda, run_steps = under_test.name, under_test.base, under_test.cuda, settings.run_steps
    preset, lightning_s = str(under_test.preset), under_test.lightning_s
    if not cuda:
        settings.log(f"{name}: one real run of {run_steps} steps in a child process (fixed costs, evaluation, peak "
                     "memory)")
        with tempfile.TemporaryDirectory() as folder:
            report.run_cost[name] = run_cost(preset, run_steps, lightning_s, base.train.max_steps, Path(folder))
    if measures_compile_cache(base, under_test.device):
        settings.log(f"{name}: compiling, twice in one runs folder (the second run should load the first's cache)"
                     + ("" if base.train.compile else "; the preset trains eager, a GPU sweep may compile")
                     + ("; the second, compiled from the cache, is also the one real run of "
                        f"{run_steps} steps (fixed costs, evaluation, peak memory)" if cuda else ""))
        steps_each = run_steps if cuda else 5
        with tempfile.TemporaryDirectory() as folder:
            report.compile_cost[name] = compiling = compile_cost(preset, steps_each, Path(folder),
                                                                 evaluate_second=cuda)
            if cuda:
                report.run_cost[name] = run_cost_of(preset, steps_each, compiling["runs"][1]["wall_s"], lightning_s,
                                                    base.train.max_steps, Path(folder), seed=1, compiled=True)


def measure_plan_and_sweep(report: BenchReport, root: Path, sweep: Path | None, log: Callable[[str], object]) -> None:
    """The sweep plan's seconds over the paper-scale preset, the GPU estimates of the small presets, and with `sweep`
    a real sweep with one worker and then two."""
    log("sweep plan over the paper-scale preset")
    report.plan_seconds = plan_seconds(root)
    for preset in ("experiments/small.yaml", "experiments/small-moe.yaml"):
        report.gpu_estimates.append(gpu_estimate(load_experiment(root / preset)))
    if sweep:
        log(f"{sweep}: one worker, then two (this takes as long as the sweep, twice)")
        with tempfile.TemporaryDirectory() as folder:
            report.sweep = sweep_cost(str(sweep), Path(folder))
