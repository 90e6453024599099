"""FLOPs: the model's count a step (the plan's), this machine's matmul rate on the very GEMM shapes a step runs, and
a GPU's tokens/s and memory estimated from FLOP and byte counts."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from gatelab.bench.machine import bench_device
from gatelab.bench.profiling import GEMM_OPS, kineto_markers_dropped
from gatelab.bench.timing import time_interleaved
from gatelab.config import ExperimentConfig
from gatelab.model import count_parameters, resolve_model
from gatelab.sweep.plan import active_parameters, training_flops


def gemm_shapes(step: Callable[[], None],
                dtype: torch.dtype) -> list[tuple[str, tuple[int, ...], tuple[int, ...], torch.dtype]]:
    """(op, shape A, shape B, dtype) of every matrix multiply one training step runs, forward and backward.

    The profiler records shapes, not dtypes: `dtype` is the step's matmul dtype (bf16 under bf16 autocast)."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with kineto_markers_dropped(), profile(activities=activities, record_shapes=True) as trace:
        step()
    shapes = []
    for event in trace.events():
        if event.name in GEMM_OPS and event.input_shapes:
            operands = event.input_shapes[1:3] if event.name.startswith("aten::addmm") else event.input_shapes[:2]
            shapes.append((event.name, tuple(operands[0]), tuple(operands[1]), dtype))
    return shapes


def mm_flops(a: tuple[int, ...], b: tuple[int, ...]) -> float:
    """FLOPs of one (batched) matrix multiply of shapes `a` and `b`."""
    batch = a[0] if len(a) == 3 else 1
    return 2.0 * batch * a[-2] * a[-1] * b[-1]


def gemm_pass(shapes) -> tuple[Callable[[], None], float]:
    """(a callable that runs every GEMM of `shapes` once, in the step's order, on random operands; their FLOPs), to
    time in the same interleaved rounds as the step whose GEMMs they are (`time_interleaved`)."""
    device, operands, calls, flops = bench_device(), {}, [], 0.0
    for _, a, b, dtype in shapes:
        if (a, b, dtype) not in operands:
            operands[(a, b, dtype)] = (torch.randn(a, device=device, dtype=dtype),
                                       torch.randn(b, device=device, dtype=dtype))
        calls.append((torch.bmm if len(a) == 3 else torch.mm, *operands[(a, b, dtype)]))
        flops += mm_flops(a, b)

    def run() -> None:
        for multiply, left, right in calls:
            multiply(left, right)

    return run, flops


def square_gemm_flops(dtype: torch.dtype = torch.float32, size: int = 1024) -> float:
    multiply, flops = gemm_pass([("aten::mm", (size, size), (size, size), dtype)])
    return flops / statistics.median(time_interleaved({"gemm": multiply}, 1, 7)["gemm"])


def model_flops_per_step(experiment: ExperimentConfig) -> float:
    model = resolve_model(experiment)
    tokens = experiment.train.batch_size * experiment.data.seq_len
    return training_flops(model, active_parameters(model, count_parameters(model)), tokens, experiment.data.seq_len)


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
