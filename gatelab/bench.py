"""`gatelab bench`: where the time of a training step goes, measured side by side in one process.

Every figure is a median of many steps after warm-up, and the steps of the things compared are interleaved (one step
of each in turn, round after round), so a machine that slows down or speeds up midway shifts all of them alike: on a
shared machine single timings drift from minute to minute by more than most differences measured here.

What it measures, per experiment preset (tiny and tiny-moe by default):
- the step time and tokens/s of `baseline` and one variant of each gate family, as ratios to `baseline`;
- gatelab's real Lightning training step (its Trainer settings, callbacks and MLflow logger) against a plain PyTorch
  loop on the same model, batches, optimizer and precision: the framework overhead as a ratio;
- fp32 against bf16 autocast, and the preset's own precision against a plain fp32 eager loop;
- the model's achieved FLOP/s against this machine's matrix-multiply FLOP/s on the very GEMM shapes the step runs
  (read off a profiler trace of one step), and so the share of step time spent outside those GEMMs;
- peak memory, and the fixed cost of one run (process start and imports, setup, evaluation) against its training time,
  from a real `gatelab train` run in a child process;
- with `--sweep`, a real sweep run with one worker and then two (wall time, fixed-cost share, throughput ratio).
Training data are random tokens: the step's cost does not depend on them, and the bench needs no corpus.

On a CUDA machine it is the GPU check of issue 30, which must end within 8 minutes on one H100 or H200: the options a
user does not give take GPU_DEFAULTS (the small preset, three variants, shorter warm-ups), fp32 steps run on a cut
batch, the compile-cache runs happen whatever the preset says, and the targets end with the GPU's own: MFU of the
Lightning step, seconds of a run's evaluation, peak GPU memory of a run, and compiling from the cache (`gpu_figures`,
`acceptance_checks`). `bench`'s docstring has the seconds each part is expected to take there.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from gatelab import host, tracking
from gatelab.config import ExperimentConfig, load_experiment
from gatelab.devices import device_name, evaluation_device, gpu_peak
from gatelab.errors import GatelabError
from gatelab.gpu_profile import kernel_markdown, kernel_profile, lightning_kernel_profile

DEFAULT_PRESETS = ("experiments/tiny.yaml", "experiments/tiny-moe.yaml")
# One variant of each gate family: G1 elementwise and headwise, G2, G5 (the MoE backbone is
# the tiny-moe preset's own baseline).
DEFAULT_VARIANTS = ("baseline", "g1_elem_sig", "g1_head_sig", "g2_elem_sig", "g5_elem_sig")
PLAN_SWEEP, PLAN_EXPERIMENT = "sweeps/paper-table1.yaml", "experiments/paper-moe-15b.yaml"

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
# The most a G1 variant's step may cost over its FLOP ratio to baseline on a GPU (issue 31): its gate's work beyond
# the FLOPs (elementwise kernels, a wider projection's output) fused away.
G1_OVER_FLOP_RATIO = 1.03
# Rows of the batch that fp32 steps take on a GPU (the fp32/bf16 ratio and the loss curves): a whole small batch
# (64 x 1024) keeps about 75 GB of activations for the backward pass in fp32 (54 GB under bf16 autocast; counted with
# saved-tensor hooks), more than an H100 holds beside the bench's other models, and 3 x 50 fp32 steps of it would take
# two minutes of the GPU check's eight.
GPU_FP32_ROWS = 16
# Steps of those loss curves on a GPU (50 on a CPU): the three curves and an fp32 compile stay under half a minute.
GPU_CURVE_STEPS = 20
# The length of the README's first experiment (sweeps/quickstart.yaml's train.max_steps): the run whose evaluation
# share a user feels first.
QUICKSTART_STEPS = 150
# The parts of `bench` a run may leave out (`gatelab bench --parts`); the Lightning step against the plain loop, the
# sweep plan and the GPU estimates always run. variants: every variant against baseline (and the CUDA kernel profiles);
# compile: eager against compiled (and CUDA graphs on a GPU), and the other precision; numerics: the loss curves;
# profile: the op profile and the GEMM rate; run: the real child runs (fixed costs, evaluation, peak memory, compiling
# from the cache).
PARTS = ("variants", "compile", "numerics", "profile", "run")


@dataclass
class StepFigures:
    """Median step time of one thing measured, with what it is relative to."""

    preset: str
    label: str  # e.g. "baseline", "g1_elem_sig", "plain fp32", "lightning"
    precision: str
    step_s: float
    tokens_per_s: float
    steps: int
    ratio: float | None = None  # to the row named in `ratio_to`
    ratio_to: str | None = None
    spread: float = 0.0  # (p90 - p10) / median of the timed steps
    flops_ratio: float | None = None  # a variant's model FLOPs per step to baseline's: the ratio its extra work sets
    ratio_interval: tuple[float, float] | None = None  # 95% bootstrap interval of `ratio` (see `ratio_interval`)


@dataclass
class GemmFigures:
    preset: str
    precision: str
    model_flops_per_step: float
    achieved_flops_per_s: float
    gemm_flops_per_s: float  # this machine's matmul rate on the step's own GEMM shapes
    gemm_s_per_step: float
    share_outside_gemm: float
    square_gemm_flops_per_s: float  # a 1024^3 GEMM, for scale
    shapes: int
    gemm_rate_share_interval: tuple[float, float] | None = None  # 95% bootstrap interval of `gemm_rate_share`

    @property
    def gemm_rate_share(self) -> float:
        """The step's model FLOP/s as a share of the rate its own GEMMs reach without the rest of the step (attention
        FLOPs count in the model's, not in the GEMMs': SDPA is not a GEMM op). Both are timed in the same interleaved
        rounds (`gemm_pass`): a machine whose speed drifts by a third between minutes moved this share from 77% to
        122% between two runs of the same code when the GEMMs were timed on their own after the steps."""
        return self.achieved_flops_per_s / self.gemm_flops_per_s


@dataclass
class BenchReport:
    machine: dict
    steps: list[StepFigures] = field(default_factory=list)
    gemm: list[GemmFigures] = field(default_factory=list)
    run_cost: dict = field(default_factory=dict)
    profile: dict = field(default_factory=dict)  # preset -> op_profile rows of its own step
    compile_cost: dict = field(default_factory=dict)  # preset -> compile_cost
    peer: dict = field(default_factory=dict)  # preset -> why transformers was not compared, where it was not
    numerics: dict = field(default_factory=dict)  # preset -> loss_curves
    sweep: dict = field(default_factory=dict)
    plan_seconds: float | None = None
    gpu_estimates: list[dict] = field(default_factory=list)
    gpu: dict = field(default_factory=dict)  # preset -> gpu_figures, on a GPU
    kernels: dict = field(default_factory=dict)  # preset -> variant -> gpu_profile.kernel_summary, on a GPU
    notes: list = field(default_factory=list)  # what was not measured, and why
    model_flops: dict = field(default_factory=dict)  # preset -> model FLOPs a step (the plan's count)
    complete: bool = False  # False in what `bench` saves between its parts
    checks: list[dict] = field(default_factory=list)
    command: str = ""


# --- the machine ----------------------------------------------------------------------------------------------------


def machine_facts() -> dict:
    from gatelab.host import cpu_has_fast_bf16

    names = re.findall(r"^model name\s*:\s*(.+)$", host.cpu_info(), re.M)
    cpu = names[0] if names else platform.processor() or platform.machine()
    facts = {"cpu": cpu, "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
             "torch_threads": torch.get_num_threads(), "fast_bf16_cpu": cpu_has_fast_bf16(),
             "torch": torch.__version__, "python": platform.python_version(),
             "gpu": device_name(_device()) if _device().type == "cuda" else None}
    return facts


def _device() -> torch.device:
    """The current CUDA device where there is one, else the CPU (not Apple's GPU: `_sync` does not wait for it)."""
    return evaluation_device(accelerator="cuda")


def gpu_peak_flops(name: str | None) -> float | None:
    """The dense bf16 peak of a GPU by its name (`gatelab.devices.GPU_PEAKS`, which the plan prices GPUs by); None for
    a GPU not in the table, or none."""
    peak = gpu_peak(name)
    return peak and peak.bf16_flops


def with_gpu_defaults(options: dict, given: Collection[str]) -> dict:
    """`gatelab bench`'s options (by parameter name) with GPU_DEFAULTS for those not in `given`, on a machine with
    CUDA; elsewhere, or for an option the user gave, as they are."""
    if not torch.cuda.is_available():
        return options
    return options | {name: value for name, value in GPU_DEFAULTS.items() if name not in given}


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


# --- steps to time ----------------------------------------------------------------------------------------------------


def random_windows(vocab_size: int, seq_len: int, seed: int = 0, tokens: int = 1 << 20):
    """A PackedDataset over random tokens: the training stream gatelab's data module serves, without a corpus."""
    from gatelab.data.datasets import PackedDataset

    stream = np.random.default_rng(seed).integers(0, vocab_size, tokens, dtype=np.int64).astype(np.int32)
    return PackedDataset({"random": stream}, seq_len, seed)


def batch_stream(experiment: ExperimentConfig):
    """gatelab's own step-indexed batches (the same for every harness), endless."""
    from gatelab.train.module import StepBatches

    windows = random_windows(experiment.model.vocab_size, experiment.data.seq_len, experiment.seed)
    batches = StepBatches(windows, experiment.train.batch_size, 1 << 30, lambda: 0)
    return iter(batches)


def _matmul_dtype(precision: str) -> torch.dtype:
    """The dtype matmuls run in under a Lightning precision setting."""
    return {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision, torch.float32)


def _autocast(precision: str):
    dtype = _matmul_dtype(precision)
    return torch.autocast(_device().type, dtype=dtype, enabled=dtype != torch.float32)


def plain_step(experiment: ExperimentConfig, precision: str) -> Callable[[], None]:
    """A plain PyTorch training step on gatelab's model: the same init, loss, AdamW groups, schedule and clipping as
    gatelab's LightningModule (its `training_loss`, blocks compiled where `train.compile`), none of Lightning's
    machinery."""
    from gatelab.model import resolve_model
    from gatelab.train.module import GatedLM

    experiment = experiment.with_train(precision=precision)
    module = GatedLM(experiment, resolve_model(experiment)).to(_device())
    optimizers = module.configure_optimizers()  # as Lightning's at this precision (fused AdamW where it may be)
    optimizer, schedule = optimizers["optimizer"], optimizers["lr_scheduler"]["scheduler"]
    batches, clip = batch_stream(experiment), experiment.train.grad_clip
    scaler = torch.amp.GradScaler(enabled=precision == "16-mixed")

    def step() -> None:
        input_ids_BT, targets_BT = (t.to(_device(), non_blocking=True) for t in next(batches))
        with _autocast(precision):
            total = module.training_loss(input_ids_BT, targets_BT)[1]
        scaler.scale(total).backward()
        if clip:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(module.parameters(), clip)
        scaler.step(optimizer)
        scaler.update()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def cuda_graph_step(experiment: ExperimentConfig, precision: str) -> Callable[[], None] | str:
    """`plain_step` compiled with `train.compile_mode: reduce-overhead` (CUDA graphs), after two steps that record
    and replay its graphs; or why it cannot run (CUDA graph trees refuse some programs: the bench goes on without)."""
    try:
        step = plain_step(experiment.with_train(compile=True, compile_mode="reduce-overhead"), precision)
        for _ in range(2):
            step()
        _sync()
        return step
    except Exception as error:  # noqa: BLE001 - any failure of CUDA graphs is a finding to report, not a crash
        torch.cuda.empty_cache()
        return f"not timed: train.compile_mode reduce-overhead failed ({type(error).__name__}: {str(error)[:200]})"


def loss_curves(experiment: ExperimentConfig, steps: int = 50, rows: int | None = None) -> dict:
    """Per-step training losses of `steps` steps on the same batches: the step as it was before the faster one (whole
    logits and fp32 cross-entropy, torch's per-parameter AdamW, eager), and gatelab's step eager and compiled. Returns
    the curves and each one's largest relative difference to the one before. In fp32 whatever the preset's precision:
    a check of the step's numerics, which bf16 rounding would drown. `rows`: batches of that many rows instead of the
    preset's (GPU_FP32_ROWS on a GPU)."""
    from gatelab.model import resolve_model
    from gatelab.train.module import GatedLM, next_token_loss

    experiment = experiment.with_train(precision="32-true", batch_size=rows or experiment.train.batch_size)
    train = experiment.train

    def curve(compile: bool, before: bool) -> list[float]:
        module = GatedLM(experiment.with_train(compile=compile), resolve_model(experiment)).to(_device())
        optimizers = module.configure_optimizers()
        optimizer, schedule = optimizers["optimizer"], optimizers["lr_scheduler"]["scheduler"]
        if before:
            groups = [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in optimizer.param_groups]
            optimizer = torch.optim.AdamW(groups, lr=train.lr, betas=train.betas, foreach=False)
            schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule.lr_lambdas[0])
        batches, losses = batch_stream(experiment), []
        for _ in range(steps):
            input_ids_BT, targets_BT = (t.to(_device()) for t in next(batches))
            if before:
                logits_BTV, aux = module.model.forward_with_aux(input_ids_BT)
                loss = next_token_loss(logits_BTV, targets_BT)
                total = module.with_aux_losses(loss, aux)
            else:
                loss, total, _ = module.training_loss(input_ids_BT, targets_BT)
            total.backward()
            if train.grad_clip:
                torch.nn.utils.clip_grad_norm_(module.parameters(), train.grad_clip)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())
        return losses

    before = curve(compile=False, before=True)
    curves = {"before": before, "eager": curve(compile=False, before=False), "compiled": curve(compile=True,
                                                                                            before=False)}
    return {"steps": steps, "batch_size": experiment.train.batch_size, "curves": curves,
            "max_relative_difference": {name: max(abs(a - b) / abs(a) for a, b in zip(before, losses))
                                        for name, losses in curves.items() if name != "before"}}


def time_interleaved(steps: dict[str, Callable[[], None]], warmup: int, measured: int) -> dict[str, list[float]]:
    """Seconds of each step, taking one step of each in turn, `warmup` rounds untimed then `measured` timed."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    for round_index in range(warmup + measured):
        for name, step in steps.items():
            _sync()
            started = time.perf_counter()
            step()
            _sync()
            if round_index >= warmup:
                times[name].append(time.perf_counter() - started)
    return times


def ratio_interval(times: list[float], reference: list[float], paired: bool,
                   confidence: float = 0.95) -> tuple[float, float] | None:
    """A bootstrap interval of median(times) / median(reference): the range a rerun of the same measurement would
    likely give, which a single ratio hides. On a shared 2-core machine one step's time spreads by 20-35% (p10-p90),
    so a ratio of two 40-step medians moves by a few percent from run to run, as much as the targets' margins.

    `paired`: the two come from the same interleaved rounds (`time_interleaved`), so rounds are resampled whole and a
    slow round slows both; else (steps timed in separate blocks) each is resampled on its own. None under 5 steps."""
    if min(len(times), len(reference)) < 5:
        return None
    from scipy import stats

    def ratio_of_medians(a, b, axis=-1):
        return np.median(a, axis=axis) / np.median(b, axis=axis)

    result = stats.bootstrap((np.asarray(times), np.asarray(reference)), ratio_of_medians, paired=paired,
                             vectorized=True, confidence_level=confidence, n_resamples=2000, method="percentile",
                             rng=np.random.default_rng(0))
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def _spread(times: list[float]) -> float:
    if len(times) < 3:
        return 0.0
    low, high = np.percentile(times, [10, 90])
    return float((high - low) / statistics.median(times))


def lightning_steps(experiment: ExperimentConfig, precision: str, steps: int, folder: Path,
                    callbacks: Collection = ()) -> list[float]:
    """Seconds per step of gatelab's Lightning training: its module, data module, Trainer settings, stability monitor
    and an MLflow logger writing to a SQLite store, as in `gatelab train` (quiet, no checkpoint)."""
    import lightning as L  # here, not at the top: a bad argument to `gatelab bench` is answered without Lightning

    from gatelab.model import resolve_model
    from gatelab.progress import silence_noise
    from gatelab.train.module import GatedLM, StabilityMonitor, TextData

    class StepTimer(L.Callback):
        """The time from one training batch's start to the next: the whole step, with everything Lightning does."""

        def __init__(self) -> None:
            self.starts: list[float] = []

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            _sync()
            self.starts.append(time.perf_counter())

    silence_noise()
    train = experiment.train
    timer = StepTimer()
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    # made here, as `gatelab train` does: Lightning's logger would make it too, with a warning line in the bench's output
    tracking.RunStore(uri, folder).experiment_id("bench")
    logger = tracking.lightning_logger("bench", uri)
    trainer = L.Trainer(
        max_steps=steps, accelerator=train.accelerator, devices=1, precision=precision,
        gradient_clip_val=train.grad_clip or None, logger=logger, log_every_n_steps=train.log_every,
        callbacks=[StabilityMonitor.from_config(train), timer, *callbacks],
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=0,
        limit_val_batches=0, default_root_dir=folder, use_distributed_sampler=False,
    )
    module = GatedLM(experiment, resolve_model(experiment))
    windows = random_windows(experiment.model.vocab_size, experiment.data.seq_len, experiment.seed)
    trainer.fit(module, datamodule=TextData(windows, train.batch_size, steps))
    return list(np.diff(timer.starts))


@contextmanager
def kineto_markers_dropped() -> Iterator[None]:
    """The profiler's C++ side (kineto, torch 2.13) writes `USDT: ... profiler_start` and `profiler_stop` lines to the
    process's stderr whatever KINETO_LOG_LEVEL says: noise in the bench's output. Everything else written to stderr in
    the meantime is passed on."""
    sys.stderr.flush()
    with tempfile.TemporaryFile(mode="w+b") as captured:
        saved = os.dup(2)
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().splitlines(keepends=True) if not line.startswith(b"USDT:")]
            if kept:
                sys.stderr.write(b"".join(kept).decode(errors="replace"))
                sys.stderr.flush()


# --- GEMM shapes ------------------------------------------------------------------------------------------------------


def gemm_shapes(step: Callable[[], None], dtype: torch.dtype) -> list[tuple[str, tuple[int, ...], tuple[int, ...], torch.dtype]]:
    """(op, shape A, shape B, dtype) of every matrix multiply one training step runs, forward and backward.

    The profiler records shapes, not dtypes: `dtype` is the step's matmul dtype (bf16 under bf16 autocast)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with kineto_markers_dropped(), profile(activities=activities, record_shapes=True) as trace:
        step()
    shapes = []
    for event in trace.events():
        if event.name in GEMM_OPS and event.input_shapes:
            operands = event.input_shapes[1:3] if event.name.startswith("aten::addmm") else event.input_shapes[:2]
            shapes.append((event.name, tuple(operands[0]), tuple(operands[1]), dtype))
    return shapes


GEMM_OPS = ("aten::mm", "aten::bmm", "aten::addmm", "aten::addmm_")
# Where each aten op of a step comes from, for the profile table: first match by name prefix wins. Elementwise ops
# (mul, add, ...) serve RoPE, RMSNorm, SwiGLU and the gates alike; the op table beside it names them one by one.
OP_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("matmul (GEMM)", GEMM_OPS),
    ("attention (SDPA kernel)", ("aten::_scaled_dot_product", "aten::scaled_dot_product")),
    ("cross-entropy (softmax, nll)", ("aten::_log_softmax", "aten::log_softmax", "aten::nll_loss", "aten::exp",
                                      "aten::amax", "aten::logsumexp", "aten::scatter_add", "aten::gather",
                                      "aten::sub", "aten::log_", "aten::reciprocal", "aten::where", "aten::eq",
                                      "aten::bitwise_not", "aten::dot", "torch_nn::_linear_cross_entropy")),
    ("RMSNorm (pow, mean, rsqrt)", ("aten::pow", "aten::mean", "aten::rsqrt", "aten::rms_norm", "aten::_fused_rms")),
    ("SwiGLU (silu)", ("aten::silu",)),
    ("gates (sigmoid)", ("aten::sigmoid",)),
    ("RoPE and fused-projection split (cat, neg)", ("aten::cat", "aten::neg", "aten::split", "aten::chunk")),
    ("elementwise mul / add / div", ("aten::mul", "aten::add", "aten::div", "aten::sum")),
    ("AdamW and grad-norm clipping", ("aten::_foreach", "aten::_fused_adam", "aten::lerp", "aten::sqrt",
                                      "aten::linalg_vector_norm", "aten::clamp", "aten::addcdiv", "aten::addcmul")),
    ("data movement (copy, fill, views)", ("aten::copy_", "aten::fill_", "aten::zero", "aten::empty", "aten::to",
                                           "aten::_to_copy", "aten::clone", "aten::contiguous", "aten::index",
                                           "aten::embedding", "aten::view", "aten::reshape", "aten::transpose",
                                           "aten::t", "aten::expand", "aten::as_strided", "aten::slice",
                                           "aten::select", "aten::permute", "aten::unsqueeze", "aten::detach",
                                           "aten::_unsafe_view", "aten::resize_", "aten::set_", "aten::new_")),
    ("autograd engine (per-node bookkeeping)", ("autograd::", "GeneratedBackwardFor", "torch::autograd", "detach")),
    ("dispatch (matmul/linear wrappers, scalars)", ("aten::matmul", "aten::linear", "aten::item",
                                                    "aten::_local_scalar_dense", "aten::result_type",
                                                    "aten::resolve_conj", "aten::lift_fresh", "aten::scalar_tensor",
                                                    "aten::narrow", "aten::stack", "aten::squeeze", "aten::flatten",
                                                    "aten::numpy_T", "aten::ones_like")),
    ("fused kernels (torch.compile)", ("## Call CompiledFxGraph", "cpp_fused", "triton_", "Torch-Compiled Region")),
)


def op_group(name: str) -> str:
    if re.fullmatch(r"\w+Backward\d+", name):  # an autograd node's own time: the kernels it launches are ops
        return "autograd engine (per-node bookkeeping)"
    return next((group for group, prefixes in OP_GROUPS if name.startswith(prefixes)), "other")


def op_profile(step: Callable[[], None], steps: int = 3) -> list[dict]:
    """Self time of every op over `steps` profiled steps, per step: the profiler's `key_averages`, each row with
    its group (OP_GROUPS), slowest first. Self time counts an op once, whatever it calls (device time on a GPU)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with kineto_markers_dropped(), profile(activities=activities) as trace:
        for _ in range(steps):
            step()
        _sync()
    rows = []
    for event in trace.key_averages():
        self_us = event.self_device_time_total if cuda else event.self_cpu_time_total
        if self_us > 0 and not event.key.startswith(("ProfilerStep", "Optimizer.step", "Optimizer.zero_grad")):
            name = "inductor's fused kernels of a compiled graph" if event.key.startswith("## Call Compiled") \
                else event.key
            rows.append({"op": name, "group": op_group(event.key), "ms_per_step": self_us / 1e3 / steps,
                         "calls_per_step": event.count / steps})
    total = sum(row["ms_per_step"] for row in rows)
    for row in rows:
        row["share"] = row["ms_per_step"] / total
    return sorted(rows, key=lambda row: -row["ms_per_step"])


def profile_groups(rows: list[dict]) -> list[dict]:
    """The op profile summed by group, slowest first, each with its three slowest ops."""
    groups: dict[str, dict] = {}
    for row in rows:
        group = groups.setdefault(row["group"], {"group": row["group"], "ms_per_step": 0.0, "share": 0.0, "ops": []})
        group["ms_per_step"] += row["ms_per_step"]
        group["share"] += row["share"]
        group["ops"].append(row["op"])
    for group in groups.values():
        group["ops"] = group["ops"][:3]
    return sorted(groups.values(), key=lambda group: -group["ms_per_step"])


PEER_LABEL = "transformers Qwen3ForCausalLM"


def fits_in_memory(step: Callable[[], None]) -> bool:
    """Whether one step runs without running out of GPU memory. For transformers' Qwen3 step on a GPU: gatelab's own
    small step peaks at about 51 GB of an H100's 80, and Qwen3's at that batch has not been measured (its RMSNorm
    upcasts to fp32), so a peer that does not fit is left out instead of ending the bench."""
    try:
        step()
    except torch.cuda.OutOfMemoryError:
        return False
    return True


def transformers_step(experiment: ExperimentConfig, precision: str) -> Callable[[], None] | None:
    """A training step of transformers' Qwen3ForCausalLM (the library a user would otherwise pick) at the preset's
    shapes: the same batches, loss (fp32 cross-entropy of the logits), AdamW, clipping and precision, eager as
    transformers runs by default. None where transformers is not installed (`pip install -e ".[compare]"`) or the
    preset is not a plain dense Qwen3 (MoE FFN, sandwich norm, no QK-norm)."""
    try:
        from transformers import Qwen3Config, Qwen3ForCausalLM
    except ImportError:
        return None
    model = experiment.model
    if model.ffn != "dense" or model.sandwich_norm or not model.qk_norm:
        return None
    config = Qwen3Config(
        vocab_size=model.vocab_size, hidden_size=model.d_model, intermediate_size=model.ffn_hidden,
        num_hidden_layers=model.n_layers, num_attention_heads=model.n_heads, num_key_value_heads=model.n_kv_heads,
        head_dim=model.head_dim, tie_word_embeddings=model.tie_embeddings, rms_norm_eps=model.norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": model.rope_base}, use_cache=False,
        attn_implementation="sdpa", max_position_embeddings=experiment.data.seq_len)
    peer = Qwen3ForCausalLM(config).to(_device()).train()
    train = experiment.train
    optimizer = torch.optim.AdamW(peer.parameters(), lr=train.lr, betas=train.betas, weight_decay=train.weight_decay)
    batches = batch_stream(experiment)
    scaler = torch.amp.GradScaler(enabled=precision == "16-mixed")

    def step() -> None:
        from gatelab.train.module import next_token_loss

        input_ids_BT, targets_BT = (t.to(_device(), non_blocking=True) for t in next(batches))
        with _autocast(precision):
            loss = next_token_loss(peer(input_ids=input_ids_BT).logits, targets_BT)
        scaler.scale(loss).backward()
        if train.grad_clip:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(peer.parameters(), train.grad_clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)

    return step


# The end-of-run evaluation cut to a few windows: the compile runs time their first steps, not their evaluation, and
# each of the two would otherwise pay a full one (up to 20 s on a GPU, about 10 s for tiny on 2 CPU cores).
LIGHT_EVALUATION = ("eval.max_windows_per_domain=1", "eval.long_context_multipliers=[1]", "eval.blimp=false",
                    "eval.in_context_examples=1", "eval.probe_batches=1")


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
        wall, result = _timed_child(command, folder, env=environment)
        found = COMPILED_LINE.search(result.stdout)
        if not found:
            raise GatelabError(f"`{' '.join(command)}` said nothing of compiling:\n"
                               f"{result.stdout[-2000:]}\n{result.stderr[-4000:]}")
        runs.append({"seed": seed, "compile_s": float(found[1]), "graphs_loaded": int(found[2]),
                     "graphs_compiled": int(found[3]), "line": found[0], "wall_s": wall})
    return {"preset": preset, "steps": steps, "runs": runs, "cache": str(folder / "compile-cache")}


def _mm_flops(a: tuple[int, ...], b: tuple[int, ...]) -> float:
    batch = a[0] if len(a) == 3 else 1
    return 2.0 * batch * a[-2] * a[-1] * b[-1]


def gemm_pass(shapes) -> tuple[Callable[[], None], float]:
    """(a callable that runs every GEMM of `shapes` once, in the step's order, on random operands; their FLOPs), to
    time in the same interleaved rounds as the step whose GEMMs they are (`time_interleaved`)."""
    device, operands, calls, flops = _device(), {}, [], 0.0
    for _, a, b, dtype in shapes:
        if (a, b, dtype) not in operands:
            operands[(a, b, dtype)] = (torch.randn(a, device=device, dtype=dtype),
                                       torch.randn(b, device=device, dtype=dtype))
        calls.append((torch.bmm if len(a) == 3 else torch.mm, *operands[(a, b, dtype)]))
        flops += _mm_flops(a, b)

    def run() -> None:
        for multiply, left, right in calls:
            multiply(left, right)

    return run, flops


def square_gemm_flops(dtype: torch.dtype = torch.float32, size: int = 1024) -> float:
    multiply, flops = gemm_pass([("aten::mm", (size, size), (size, size), dtype)])
    return flops / statistics.median(time_interleaved({"gemm": multiply}, 1, 7)["gemm"])


def model_flops_per_step(experiment: ExperimentConfig) -> float:
    from gatelab.model import count_parameters, resolve_model
    from gatelab.sweep.plan import active_parameters, training_flops

    model = resolve_model(experiment)
    tokens = experiment.train.batch_size * experiment.data.seq_len
    return training_flops(model, active_parameters(model, count_parameters(model)), tokens, experiment.data.seq_len)


# --- one real run, and a real sweep, in child processes -------------------------------------------------------------


def _child(command: list[str], cwd: Path, timeout: float = 3600) -> float:
    """Wall seconds of a command that must succeed."""
    return _timed_child(command, cwd, timeout)[0]


def _timed_child(command: list[str], cwd: Path, timeout: float = 3600,
                 env: dict[str, str] | None = None) -> tuple[float, subprocess.CompletedProcess]:
    """(wall seconds, what it printed) of a command that must succeed."""
    started = time.perf_counter()
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    if result.returncode != 0:
        raise GatelabError(f"`{' '.join(command)}` failed ({result.returncode}):\n{result.stdout[-2000:]}"
                           f"\n{result.stderr[-4000:]}")
    return time.perf_counter() - started, result


def _run_timings(runs_dir: Path, seed: int | None = None) -> list[dict[str, float]]:
    """The `time/*` and `memory/*` metrics of every finished run in a runs folder's MLflow store (of one seed's)."""
    store = tracking.RunStore(f"sqlite:///{runs_dir / 'mlflow.db'}", runs_dir)
    return store.finished_run_metrics(("time/", "memory/"), seed=seed)


def run_cost(preset: str, steps: int, step_s: float, preset_steps: int, folder: Path) -> dict:
    """A real `gatelab train` of `steps` steps in a child process: its wall time, phases and peak memory; the fixed
    part (everything but training) against the preset's full training time at the measured step time."""
    command = [sys.executable, "-m", "gatelab", "train", str(Path(preset).resolve()), "--quiet",
               "--runs-dir", str(folder), "--set", f"train.max_steps={steps}"]
    return run_cost_of(preset, steps, _child(command, cwd=folder), step_s, preset_steps, folder)


def run_cost_of(preset: str, steps: int, wall: float, step_s: float, preset_steps: int, folder: Path,
                seed: int | None = None, compiled: bool = False) -> dict:
    """`run_cost`'s figures of a run that finished in `folder` (the one of `seed`) in `wall` seconds."""
    timings = _run_timings(folder, seed)
    phases = timings[0] if timings else {}
    peak = phases.get("memory/peak_rss_gb", math.nan) * 1e9  # the run's own figure: a child's maxrss counts forks
    train_s = phases.get("time/train_s")
    fixed_s = wall - train_s if train_s is not None else None
    full_train_s = preset_steps * step_s
    return {"preset": preset, "steps": steps, "wall_s": wall, "peak_rss_bytes": peak, "compiled": compiled,
            "peak_gpu_gb": phases.get("memory/peak_gpu_gb"),  # gatelab.train.run.peak_memory; none on a CPU
            "peak_gpu_train_gb": phases.get("memory/peak_gpu_train_gb"),  # training's alone, before evaluation
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
        wall = _child(command, cwd=folder, timeout=4 * 3600)
        timings = _run_timings(runs_dir)
        train_s = sum(t.get("time/train_s", math.nan) for t in timings)
        peak = max((t.get("memory/peak_rss_gb", math.nan) for t in timings), default=math.nan) * 1e9
        results[count] = {"wall_s": wall, "runs": len(timings), "train_s_sum": train_s, "peak_rss_bytes": peak,
                          "eval_s_sum": sum(t.get("time/eval_s", math.nan) for t in timings)}
    one = results[workers[0]]
    summary = {"sweep": sweep, "by_workers": results,
               "fixed_share_one_worker": (one["wall_s"] - one["train_s_sum"]) / one["wall_s"]}
    if len(workers) > 1:
        summary["throughput_ratio"] = one["wall_s"] / results[workers[-1]]["wall_s"]
    return summary


def plan_seconds(root: Path) -> float:
    return _child([sys.executable, "-m", "gatelab", "sweep", "plan", str(root / PLAN_SWEEP), "--experiment",
                   str(root / PLAN_EXPERIMENT), "--json"], cwd=root)


# --- GPU planning figures from FLOP and byte counts ------------------------------------------------------------------


def gpu_estimate(experiment: ExperimentConfig, peak_flops: float = 989e12, utilisation: float = 0.4,
                 memory_bytes: float = 80e9) -> dict:
    """Tokens/s and memory of one run on one GPU, from counts, not measurement.

    Time: training FLOPs (gatelab.sweep.plan) at `utilisation` of the bf16 dense peak (H100 SXM: 989 TFLOP/s).
    Memory: 16 bytes a parameter (fp32 weights, gradients and AdamW's two moments; bf16-mixed keeps fp32 masters), plus
    activations kept for the backward pass under bf16 autocast with fused (flash) attention, per layer and token
    about 34 * d_model bytes (Korthikanti et al. 2022, Eq. 2 without the attention-matrix term, which flash attention
    does not store) with SwiGLU's wider hidden counted as 2 * 3 * ffn bytes, plus the logits (bf16 and their fp32
    copy for the loss: 6 * vocab bytes a token). MoE: routed experts' activations at top_k of them.
    """
    from gatelab.model import count_parameters, resolve_model

    model = resolve_model(experiment)
    params = count_parameters(model)
    tokens = experiment.train.batch_size * experiment.data.seq_len
    flops = model_flops_per_step(experiment)
    hidden = (model.moe.expert_hidden * model.moe.top_k if model.ffn == "moe" and model.moe else model.ffn_hidden)
    per_layer_token = 34 * model.d_model + 6 * hidden
    activations = tokens * (model.n_layers * per_layer_token + 6 * model.vocab_size)
    memory = 16 * params + activations
    step_s = flops / (peak_flops * utilisation)
    return {"preset": experiment.name, "params": params, "tokens_per_step": tokens, "flops_per_step": flops,
            "assumed_flops_per_s": peak_flops * utilisation, "step_s": step_s, "tokens_per_s": tokens / step_s,
            "run_hours": experiment.train.max_steps * step_s / 3600, "memory_gb": memory / 1e9,
            "fits_gb": memory_bytes / 1e9}


# --- the bench ------------------------------------------------------------------------------------------------------




def validate(presets: list[Path], variants: list[str], sweep: Path | None) -> None:
    """Every preset, variant and the sweep file load before anything is measured (errors name file and key)."""
    from gatelab.model import resolve_model
    from gatelab.sweep.spec import load_sweep
    from gatelab.variants import variant_ids

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

    On a GPU it must end within 8 minutes (issue 30; issue 31's acceptance script gives it 7.5 of its 9). Expected
    seconds of each part on one H100 or H200 for the small preset with GPU_DEFAULTS (15 variants, compiled), from:
    process start and imports 10-15 s, CUDA and cuBLAS start 2-5 s, an eager bf16 step 0.25 s, a compiled one 0.21 s
    after a first compile of about 13 s (4 graphs; another variant's blocks about 8 s: the head loss's graphs come from
    the cache; 3 s all from the cache), an fp32 step 0.8 s (0.2 s on GPU_FP32_ROWS rows), an evaluation of at most
    20 s, a 90M-parameter model built on the CPU about 0.7 s (measured on an H200 at 9f6aa79, eager; the rest
    estimated, not yet measured):

        start, imports, CUDA                                                                      20
        15 variants, 3 untimed rounds (the first compiles each) + 10 timed                       150
        CUDA kernel profiles of 6 variants (one per gate family and baseline), 4 steps each         10
        Lightning against the plain loop: 3 blocks of 10 + 10 steps, a Trainer each (~3 s)       25
        eager against compiled: compiled from the cache, then 13 rounds of 3 steps                15
        bf16 against fp32 on 16 rows: 11 rounds                                                    5
        loss curves: 3 x 20 fp32 steps on 16 rows (GPU_CURVE_STEPS), a 15 s fp32 compile          27
        op profile; GEMM shapes, and the GEMMs interleaved with 12 steps                          12
        two compiled child runs of 20 steps: 50 with LIGHT_EVALUATION, then from the cache
          with the full evaluation, which is also the one real run (start 20, setup 10, 5, 20)   105
        sweep plan (a child process), GPU estimates                                               15
        total                                                                           about 385 (6.4 min)
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

    root = host.repo_root()
    device = _device()
    cuda = device.type == "cuda"
    from gatelab.host import resolve_precision

    for preset in presets:
        base = load_experiment(preset)
        precision = resolve_precision(base.train.precision, base.train.accelerator, moe=base.model.ffn == "moe")
        name = base.name
        tokens = base.train.batch_size * base.data.seq_len
        compiled = "compiled" if base.train.compile else "eager"
        report.model_flops[name] = model_flops_per_step(base)
        if "variants" in parts:
            log(f"{name}: variants {', '.join(variants)} at {precision} ({compiled}), {measured} interleaved steps "
                "each")
            experiments = {v: load_experiment(preset, [f"variant={v}"]) for v in variants}
            steps = {v: plain_step(experiment, precision) for v, experiment in experiments.items()}
            peer = transformers_step(base, precision)
            if peer is None:
                report.peer[name] = ("not compared: transformers is not installed (pip install -e \".[compare]\")"
                                     if importlib.util.find_spec("transformers") is None
                                     else "not compared: Qwen3ForCausalLM is a dense model with QK-norm, this preset "
                                          "is not")
            elif cuda and not fits_in_memory(peer):
                peer = None
                torch.cuda.empty_cache()
                report.peer[name] = f"not compared: its step at this batch runs out of {report.machine['gpu']}'s memory"
            else:
                log(f"{name}: with {PEER_LABEL} at the same shapes, interleaved")
                steps[PEER_LABEL] = peer
            times = time_interleaved(steps, warmup + 1, measured)  # one more round: the first compiles
            # both ratios to the "baseline" row (the preset itself may name another variant)
            base_s, base_flops = statistics.median(times["baseline"]), model_flops_per_step(experiments["baseline"])
            for variant, seconds in times.items():
                median = statistics.median(seconds)
                flops_ratio = (model_flops_per_step(experiments[variant]) / base_flops if variant in experiments
                               else None)
                interval = None if variant == "baseline" else ratio_interval(seconds, times["baseline"], paired=True)
                report.steps.append(StepFigures(name, variant, precision, median, tokens / median, len(seconds),
                                                median / base_s, "baseline", _spread(seconds), flops_ratio, interval))
            if cuda:
                report.kernels[name] = {}
                for variant in kernel_profile_variants(list(experiments)):
                    log(f"{name}: CUDA kernels of a {variant} step (torch.profiler: kernels, their share, idle gaps)")
                    report.kernels[name][f"{variant}, plain loop"] = kernel_profile(steps[variant])
            del steps, peer  # their models and AdamW states: off the GPU before the next steps

        part_done()
        log(f"{name}: gatelab's Lightning step against the plain loop ({precision})")
        plain_times: list[float] = []
        lightning_times: list[float] = []
        plain = plain_step(base, precision)
        with tempfile.TemporaryDirectory() as folder:
            for _ in range(3):  # three blocks of each, alternating, so drift hits both
                lightning_times += lightning_steps(base, precision, lightning_steps_count, Path(folder))[warmup:]
                plain_times += time_interleaved({"plain": plain}, warmup, lightning_steps_count - warmup)["plain"]
            if cuda:
                log(f"{name}: CUDA kernels of gatelab's Lightning step ({base.variant}): data loader, logging and "
                    "optimizer included")
                kernels = lightning_kernel_profile(first=warmup + 1, steps=3)
                lightning_steps(base, precision, warmup + 5, Path(folder), callbacks=[kernels])
                report.kernels.setdefault(name, {})[f"{base.variant}, gatelab's Lightning step"] = kernels.summary
        plain_s, lightning_s = statistics.median(plain_times), statistics.median(lightning_times)
        plain_label = f"plain {precision}"
        report.steps.append(StepFigures(name, plain_label, precision, plain_s, tokens / plain_s, len(plain_times),
                                        spread=_spread(plain_times)))
        report.steps.append(StepFigures(name, "lightning", precision, lightning_s, tokens / lightning_s,
                                        len(lightning_times), lightning_s / plain_s, plain_label,
                                        _spread(lightning_times),
                                        ratio_interval=ratio_interval(lightning_times, plain_times, paired=False)))

        part_done()
        if "compile" in parts:
            log(f"{name}: eager against torch.compile" + (" and torch.compile with CUDA graphs" if cuda else "")
                + ", then bf16 autocast against fp32 (eager, interleaved)")
            eager = base.with_train(compile=False)
            eager_step = plain_step(eager, precision)
            settings = {"eager": eager_step, "compiled": plain_step(base.with_train(compile=True), precision),
                        "preset": plain}
            if cuda:
                graphed = cuda_graph_step(base, precision)
                if isinstance(graphed, str):
                    report.notes.append(f"{name}: compiled with CUDA graphs {graphed}")
                else:
                    settings["compiled, CUDA graphs"] = graphed
            times = time_interleaved(settings, warmup + 1, measured)  # one more round: the first compiles
            for setting in [s for s in settings if s != "preset"]:
                seconds = statistics.median(times[setting])
                report.steps.append(StepFigures(name, f"plain {precision} {setting}", precision, seconds,
                                                tokens / seconds, measured,
                                                seconds / statistics.median(times["preset"]),
                                                plain_label, _spread(times[setting]),
                                                ratio_interval=ratio_interval(times[setting], times["preset"], True)))
            eager_s = plain_s * statistics.median(times["eager"]) / statistics.median(times["preset"])
            other = "bf16-mixed" if precision == "32-true" else "32-true"
            bf16_slow = not (report.machine["fast_bf16_cpu"] or cuda)
            rounds = bf16_steps if bf16_slow else measured  # emulated bf16 takes ~20x longer a step: fewer rounds
            # on a GPU the ratio of the two precisions on at most GPU_FP32_ROWS rows: a whole batch may not fit in fp32
            cut = eager.with_train(batch_size=min(GPU_FP32_ROWS, eager.train.batch_size)) if cuda else None
            times = time_interleaved({"preset": plain_step(cut, precision) if cut else eager_step,
                                      "other": plain_step(cut or eager, other)}, 1, rounds)
            ratio = statistics.median(times["other"]) / statistics.median(times["preset"])
            other_s = eager_s * ratio  # the interleaved ratio, on the many-step median of the preset's precision
            report.steps.append(StepFigures(name, f"plain {other} eager", other, other_s, tokens / other_s, rounds,
                                            ratio, f"plain {precision} eager", _spread(times["other"]),
                                            ratio_interval=ratio_interval(times["other"], times["preset"], True)))
            fp32_s = eager_s if precision == "32-true" else other_s
            report.steps.append(StepFigures(name, "gatelab preset", precision, lightning_s, tokens / lightning_s,
                                            len(lightning_times), lightning_s / fp32_s, "plain 32-true eager"))

        part_done()
        if "numerics" in parts:
            rows = min(GPU_FP32_ROWS, base.train.batch_size) if cuda else None
            curve_steps = GPU_CURVE_STEPS if cuda else 50
            log(f"{name}: a {curve_steps}-step fp32 loss curve of the step before the faster one, and of this one "
                "eager and compiled" + (f" ({rows} rows a batch)" if rows else ""))
            report.numerics[name] = loss_curves(base, steps=curve_steps, rows=rows)

        part_done()
        if "profile" in parts:
            log(f"{name}: profile of the step by op")
            report.profile[name] = op_profile(plain)

            log(f"{name}: GEMM shapes of one step, and this machine's rate on them (interleaved with the step)")
            dtype = _matmul_dtype(precision)
            shapes = gemm_shapes(plain, dtype)
            gemms, gemm_flops = gemm_pass(shapes)
            times = time_interleaved({"step": plain, "gemms": gemms}, warmup, measured)
            step_s, gemm_s = statistics.median(times["step"]), statistics.median(times["gemms"])
            flops = model_flops_per_step(base)
            interval = ratio_interval(times["gemms"], times["step"], paired=True)  # gemm_s / step_s
            scale = flops / gemm_flops
            report.gemm.append(GemmFigures(name, precision, flops, flops / step_s, gemm_flops / gemm_s, gemm_s,
                                           max(0.0, 1 - gemm_s / step_s), square_gemm_flops(dtype), len(shapes),
                                           interval and (scale * interval[0], scale * interval[1])))

        part_done()
        if "run" in parts:
            if not cuda:
                log(f"{name}: one real run of {run_steps} steps in a child process (fixed costs, evaluation, peak "
                    "memory)")
                with tempfile.TemporaryDirectory() as folder:
                    report.run_cost[name] = run_cost(str(preset), run_steps, lightning_s, base.train.max_steps,
                                                     Path(folder))
            if measures_compile_cache(base, device):
                log(f"{name}: compiling, twice in one runs folder (the second run should load the first's cache)"
                    + ("" if base.train.compile else "; the preset trains eager, a GPU sweep may compile")
                    + ("; the second, compiled from the cache, is also the one real run of "
                       f"{run_steps} steps (fixed costs, evaluation, peak memory)" if cuda else ""))
                steps_each = run_steps if cuda else 5
                with tempfile.TemporaryDirectory() as folder:
                    report.compile_cost[name] = compiling = compile_cost(str(preset), steps_each, Path(folder),
                                                                         evaluate_second=cuda)
                    if cuda:
                        report.run_cost[name] = run_cost_of(str(preset), steps_each, compiling["runs"][1]["wall_s"],
                                                            lightning_s, base.train.max_steps, Path(folder), seed=1,
                                                            compiled=True)

        part_done()
    log("sweep plan over the paper-scale preset")
    report.plan_seconds = plan_seconds(root)
    for preset in ("experiments/small.yaml", "experiments/small-moe.yaml"):
        report.gpu_estimates.append(gpu_estimate(load_experiment(root / preset)))
    if sweep:
        log(f"{sweep}: one worker, then two (this takes as long as the sweep, twice)")
        with tempfile.TemporaryDirectory() as folder:
            report.sweep = sweep_cost(str(sweep), Path(folder))
    report.gpu = gpu_figures(report)
    report.checks = acceptance_checks(report)
    report.complete = True
    return report


def kernel_profile_variants(variants: list[str]) -> list[str]:
    """Baseline and the first variant of each gate family (position G1..G5, and G1's headwise one) among `variants`:
    the steps whose CUDA kernels the bench profiles."""
    chosen, families = [], set()
    for variant in variants:
        family = "baseline" if variant == "baseline" else variant.split("_")[0] + ("_head" if "_head" in variant else "")
        if family not in families and (family == "baseline" or re.fullmatch(r"g[1-5](_head)?", family)):
            families.add(family)
            chosen.append(variant)
    return chosen


def gpu_figures(report: BenchReport) -> dict[str, dict]:
    """Per preset measured on a GPU: MFU (model FLOPs a step, the plan's count, / the median step time / the GPU's
    dense bf16 peak) of gatelab's Lightning step, the step it trains with, and of the plain loop beside it; and from the
    real child run (`run_cost`) its evaluation seconds, their share of a quick-start-length run (QUICKSTART_STEPS steps
    at the Lightning step time plus the child run's fixed costs, evaluation included) and its peak GPU memory. Empty on
    a CPU; None for what was not measured, MFU included on a GPU not in gatelab.devices.GPU_PEAKS."""
    gpu = report.machine.get("gpu")
    if not gpu:
        return {}
    peak = gpu_peak_flops(gpu)
    by = {(s.preset, s.label): s for s in report.steps}
    flops = {g.preset: g.model_flops_per_step for g in report.gemm} | report.model_flops
    figures = {}
    for preset in dict.fromkeys(s.preset for s in report.steps):
        lightning = by.get((preset, "lightning"))
        plain = by.get((preset, lightning.ratio_to)) if lightning else None

        def mfu(row: StepFigures | None) -> float | None:
            return None if row is None or peak is None or preset not in flops else flops[preset] / row.step_s / peak

        cost = report.run_cost.get(preset, {})
        eval_s, fixed_s = cost.get("phases", {}).get("eval_s"), cost.get("fixed_s")
        run_s = fixed_s + QUICKSTART_STEPS * lightning.step_s if fixed_s is not None and lightning else None
        figures[preset] = {
            "gpu": gpu, "peak_flops": peak, "model_flops_per_step": flops.get(preset),
            "lightning_step_s": lightning and lightning.step_s, "mfu_lightning": mfu(lightning),
            "plain_step_s": plain and plain.step_s, "mfu_plain": mfu(plain),
            "eval_s": eval_s, "fixed_s": fixed_s, "quickstart_run_s": run_s,
            "eval_share_of_quickstart_run": eval_s / run_s if eval_s is not None and run_s else None,
            "peak_gpu_gb": cost.get("peak_gpu_gb"), "peak_gpu_train_gb": cost.get("peak_gpu_train_gb")}
    return figures


def _cached_compile_s(compiling: dict | None) -> float | None:
    """The second compile run's seconds, where it loaded graphs from the first's cache (else it says nothing of it)."""
    second = compiling and compiling["runs"][1]
    return second["compile_s"] if second and second["graphs_loaded"] else None


def acceptance_checks(report: BenchReport) -> list[dict]:
    """gatelab's performance targets, each with the figure measured here and whether it holds. A step-time ratio
    also has its 95% interval, and `within_noise` where that interval reaches across the limit: whether it holds
    then depends on the run, not on the code."""
    checks = []

    def check(target: str, value: float | None, limit: float, at_most: bool = True, unit: str = "x",
              interval: tuple[float, float] | None = None) -> None:
        holds = None if value is None else (value <= limit if at_most else value >= limit)
        within_noise = None if value is None or interval is None else interval[0] <= limit <= interval[1]
        checks.append({"target": target, "measured": value, "limit": limit, "at_most": at_most, "unit": unit,
                       "holds": holds, "interval": interval, "within_noise": within_noise})

    by = {(s.preset, s.label): s for s in report.steps}
    for preset in dict.fromkeys(s.preset for s in report.steps):
        lightning = by.get((preset, "lightning"))
        check(f"{preset}: Lightning step / plain loop, same precision", lightning and lightning.ratio, 1.05,
              interval=lightning and lightning.ratio_interval)
    tiny = "tiny"
    peer = by.get((tiny, PEER_LABEL))
    inverted = peer and peer.ratio_interval and (1 / peer.ratio_interval[1], 1 / peer.ratio_interval[0])
    check(f"tiny: baseline step / {PEER_LABEL} step", peer and 1 / peer.ratio, 0.8, interval=inverted or None)
    gemm = next((g for g in report.gemm if g.preset == tiny), None)
    check("tiny: achieved FLOP/s / GEMM FLOP/s on the step's own shapes", gemm and gemm.gemm_rate_share, 0.8,
          at_most=False, interval=gemm and gemm.gemm_rate_share_interval)
    for variant, limit in (("g1_elem_sig", 1.05), ("g1_head_sig", 1.02)):
        row = by.get((tiny, variant))
        check(f"tiny: {variant} step / baseline step", row and row.ratio, limit, interval=row and row.ratio_interval)
    check("tiny: compile seconds of the second run of a shape (cache loaded)",
          _cached_compile_s(report.compile_cost.get(tiny)), 10.0, unit="s")
    for preset, numerics in report.numerics.items():
        for setting, difference in numerics["max_relative_difference"].items():
            check(f"{preset}: {numerics['steps']}-step loss curve, {setting}: largest relative difference to the step "
                  "before", difference, 1e-3, unit="")
    preset_row = by.get((tiny, "gatelab preset"))
    check("tiny: gatelab tokens/s / plain fp32 eager tokens/s", preset_row and 1 / preset_row.ratio, 2.0,
          at_most=False)
    if report.sweep:
        check(f"{report.sweep['sweep']}: fixed costs / wall time (1 worker)", report.sweep["fixed_share_one_worker"],
              0.25)
        check(f"{report.sweep['sweep']}: throughput 2 workers / 1 worker", report.sweep.get("throughput_ratio"), 1.1,
              at_most=False)
    cost = report.run_cost.get(tiny)
    if cost:
        check("tiny: peak memory of a run (GB)", cost["peak_rss_bytes"] / 1e9, 2.0, unit="GB")
    check("sweep plan over the paper-scale preset (s)", report.plan_seconds, 5.0, unit="s")
    # Last, so that the bench ends with them: the GPU's targets (issues 30 and 31), per preset measured on it. Before
    # issue 31's changes the small preset stood at MFU 0.19-0.22 and 51 GB (eager) on an H200.
    for preset, gpu in gpu_figures(report).items():
        peak = gpu["peak_flops"]
        against = (f"{gpu['gpu']}: dense bf16 peak {peak / 1e12:.0f} TFLOP/s" if peak
                   else f"{gpu['gpu']} is not in gatelab's table of GPU peaks")
        check(f"{preset}, GPU: MFU of gatelab's Lightning training step ({against})", gpu["mfu_lightning"], 0.40,
              at_most=False, unit="")
        check(f"{preset}, GPU: evaluation seconds of a run", gpu["eval_s"], 20.0, unit="s")
        check(f"{preset}, GPU: peak GPU memory of a run (GB)", gpu["peak_gpu_gb"], 32.0, unit="GB")
        check(f"{preset}, GPU: compile seconds of the second run of a shape (cache loaded)",
              _cached_compile_s(report.compile_cost.get(preset)), 10.0, unit="s")
        for row in report.steps:
            if row.preset == preset and row.label.startswith("g1_") and row.flops_ratio:
                interval = row.ratio_interval and tuple(bound / row.flops_ratio for bound in row.ratio_interval)
                check(f"{preset}, GPU: {row.label} step / baseline step, over its FLOP ratio "
                      f"({row.flops_ratio:.4f})", row.ratio / row.flops_ratio, G1_OVER_FLOP_RATIO,
                      interval=interval)
    return checks


# --- output ---------------------------------------------------------------------------------------------------------


def _fmt(value, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def _interval(interval) -> str:
    return "" if not interval else f"{_fmt(interval[0])}-{_fmt(interval[1])}"


def targets_markdown(report: BenchReport) -> list[str]:
    """The targets and whether each holds: near the top of bench.md, and again at the end of what the command prints
    (after the GPU figures, on a GPU), where a reader of the terminal looks."""
    lines = ["## Targets", "",
             "A step-time ratio's 95% interval is a bootstrap over its timed steps (interleaved rounds resampled whole): "
             "where it reaches across the limit, whether the target holds in one run is down to the run's noise."]
    if report.machine.get("gpu"):
        lines[-1] += (" The rows named GPU come last: the targets of a GPU run (issues 30 and 31); the rows named "
                      "tiny are the CPU's.")
    lines += ["", "| target | measured | 95% interval | limit | holds |", "|---|---|---|---|---|"]
    for c in report.checks:
        holds = {True: "yes", False: "**no**", None: "not measured"}[c["holds"]]
        holds += " (within noise)" if c.get("within_noise") else ""
        lines.append(f"| {c['target']} | {_fmt(c['measured'])} | {_interval(c.get('interval'))} | "
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
        return _fmt(seconds and seconds * 1e3)

    for preset, g in figures.items():
        lines.append(f"| {preset} | {g['gpu']} | {_fmt(g['peak_flops'] and g['peak_flops'] / 1e12)} | "
                     f"{_fmt(g['model_flops_per_step'] and g['model_flops_per_step'] / 1e9, 5)} | "
                     f"{ms(g['lightning_step_s'])} | {_fmt(g['mfu_lightning'], 2)} | {ms(g['plain_step_s'])} | "
                     f"{_fmt(g['mfu_plain'], 2)} | {_fmt(g['eval_s'])} | {_fmt(g['fixed_s'])} | "
                     f"{_percent(g['eval_share_of_quickstart_run'])} | {_fmt(g['peak_gpu_gb'])} | "
                     f"{_fmt(g['peak_gpu_train_gb'])} |")
    if any(g["peak_flops"] is None for g in figures.values()):
        lines += ["", "MFU not measured: this GPU is not in gatelab's table of GPU peaks "
                      "(gatelab.devices.GPU_PEAKS)."]
    return lines


def summary_markdown(report: BenchReport) -> str:
    """What `gatelab bench` prints last: the GPU figures (on a GPU), then the targets."""
    lines = gpu_markdown(report)
    return "\n".join(lines + [""] * bool(lines) + targets_markdown(report)) + "\n"


def _percent(share: float | None) -> str:
    return "n/a" if share is None else f"{share:.0%}"


def to_markdown(report: BenchReport) -> str:
    m = report.machine
    lines = ["# gatelab bench" + ("" if report.complete else " (partial: saved between parts, the bench had not ended)"),
             "", f"`{report.command}`", "",
             f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']} ({m['torch_threads']} threads), "
             f"fast bf16 on the CPU: {'yes' if m['fast_bf16_cpu'] else 'no'}, GPU: {m['gpu'] or 'none'}.", ""]
    lines += targets_markdown(report)
    gpu = gpu_markdown(report)
    lines += [""] * bool(gpu) + gpu
    lines += ["", "## Step times (median of interleaved steps)", "",
              "A variant's FLOP ratio is its model FLOPs per step over baseline's: the step-time ratio a step bound by "
              "its FLOPs would have." + (f" On a GPU the fp32 row's ratio to the preset's precision is measured on at "
                                         f"most {GPU_FP32_ROWS} rows of the batch (a whole batch may not fit in fp32)."
                                         if m.get("gpu") else ""), "",
              "| preset | what | precision | step (ms) | tokens/s | ratio | 95% interval | to | FLOP ratio | "
              "spread p10-p90 | steps |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in report.steps:
        lines.append(f"| {s.preset} | {s.label} | {s.precision} | {s.step_s * 1e3:.0f} | {s.tokens_per_s:.0f} | "
                     f"{_fmt(s.ratio)} | {_interval(s.ratio_interval)} | {s.ratio_to or ''} | "
                     f"{_fmt(s.flops_ratio, 4)} | {s.spread:.0%} | {s.steps} |")
    lines += ["", "## FLOPs", "",
              "| preset | precision | model GFLOP/step | achieved GFLOP/s | GEMM GFLOP/s (same shapes) | "
              "achieved / GEMM rate | GEMM s/step | share outside GEMMs | 1024³ GEMM GFLOP/s |",
              "|---|---|---|---|---|---|---|---|---|"]
    for g in report.gemm:
        lines.append(f"| {g.preset} | {g.precision} | {g.model_flops_per_step / 1e9:.1f} | "
                     f"{g.achieved_flops_per_s / 1e9:.1f} | {g.gemm_flops_per_s / 1e9:.1f} | {g.gemm_rate_share:.0%} | "
                     f"{g.gemm_s_per_step:.3f} | {g.share_outside_gemm:.0%} | {g.square_gemm_flops_per_s / 1e9:.1f} |")
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
    for preset, by_variant in report.kernels.items():
        for variant, summary in by_variant.items():
            lines += [""] + kernel_markdown(summary, f"CUDA kernels of a {preset} step: {variant} "
                                                     f"({report.machine.get('gpu')}, torch.profiler)")
    for preset, why in report.peer.items():
        lines += ["", f"{preset}: {PEER_LABEL} {why}."]
    for note in report.notes:
        lines += ["", f"{note}."]
    if report.compile_cost:
        lines += ["", "## Compiling, twice in one runs folder (real `gatelab train` runs)", "",
                  "| preset | run | compile (s) | graphs loaded from the cache | graphs compiled |", "|---|---|---|---|---|"]
        for preset, cost in report.compile_cost.items():
            for index, run in enumerate(cost["runs"], 1):
                lines.append(f"| {preset} | {index} (seed {run['seed']}) | {run['compile_s']:.1f} | "
                             f"{run['graphs_loaded']} | {run['graphs_compiled']} |")
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
    lines += ["", "## One run (a real `gatelab train` in a child process)", "",
              "| preset | steps | wall (s) | import | setup | train | eval | fixed (s) | preset run: fixed share | "
              "peak RSS (GB) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, c in report.run_cost.items():
        p = c["phases"]
        lines.append(f"| {name}{' (compiled, from the cache)' if c.get('compiled') else ''} | {c['steps']} | "
                     f"{c['wall_s']:.1f} | {_fmt(p.get('import_s'))} | "
                     f"{_fmt(p.get('setup_s'))} | {_fmt(p.get('train_s'))} | {_fmt(p.get('eval_s'))} | "
                     f"{_fmt(c['fixed_s'])} | {_fmt(c['fixed_share_of_preset_run'])} | "
                     f"{c['peak_rss_bytes'] / 1e9:.2f} |")
    if report.sweep:
        lines += ["", f"## Sweep `{report.sweep['sweep']}`", "",
                  "| workers | wall (s) | runs | Σ train (s) | Σ eval (s) | peak RSS of a worker (GB) |",
                  "|---|---|---|---|---|---|"]
        for count, r in report.sweep["by_workers"].items():
            lines.append(f"| {count} | {r['wall_s']:.0f} | {r['runs']} | {r['train_s_sum']:.0f} | "
                         f"{r['eval_s_sum']:.0f} | {r['peak_rss_bytes'] / 1e9:.2f} |")
    lines += ["", f"`gatelab sweep plan {PLAN_SWEEP} --experiment {PLAN_EXPERIMENT} --json`: "
              f"{_fmt(report.plan_seconds)} s", "",
              "## One GPU, estimated from FLOP and byte counts (not measured)", "",
              "| preset | params (M) | tokens/step | GFLOP/step | step (s) | tokens/s | run (h) | memory (GB) |",
              "|---|---|---|---|---|---|---|---|"]
    for e in report.gpu_estimates:
        lines.append(f"| {e['preset']} | {e['params'] / 1e6:.1f} | {e['tokens_per_step']} | "
                     f"{e['flops_per_step'] / 1e9:.0f} | {e['step_s']:.3f} | {e['tokens_per_s']:.0f} | "
                     f"{e['run_hours']:.2f} | {e['memory_gb']:.1f} |")
    return "\n".join(lines) + "\n"


def write(report: BenchReport, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(asdict(report), indent=2, default=str) + "\n")
    (out / "bench.md").write_text(to_markdown(report))
    return [out / "bench.json", out / "bench.md"]
