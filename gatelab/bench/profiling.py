"""Where a step's time goes by aten op (torch.profiler's self times, grouped by what each op serves), and the
profiler's own noise on stderr kept out of the bench's output."""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch.profiler import ProfilerActivity, profile

from gatelab.bench.machine import synchronize

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


def op_group(name: str) -> str:
    if re.fullmatch(r"\w+Backward\d+", name):  # an autograd node's own time: the kernels it launches are ops
        return "autograd engine (per-node bookkeeping)"
    return next((group for group, prefixes in OP_GROUPS if name.startswith(prefixes)), "other")


def op_profile(step: Callable[[], None], steps: int = 3) -> list[dict]:
    """Self time of every op over `steps` profiled steps, per step: the profiler's `key_averages`, each row with
    its group (OP_GROUPS), slowest first. Self time counts an op once, whatever it calls (device time on a GPU)."""
    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with kineto_markers_dropped(), profile(activities=activities) as trace:
        for _ in range(steps):
            step()
        synchronize()
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


def profile_groups(rows: list[dict], name: str = "op", names: str = "ops") -> list[dict]:
    """The profile's rows (slowest first) summed by group, slowest first, each with its three slowest `name`s listed
    under `names` (an op profile's, or gpu_profile's kernel rows)."""
    groups: dict[str, dict] = {}
    for row in rows:
        group = groups.setdefault(row["group"], {"group": row["group"], "ms_per_step": 0.0, "share": 0.0, names: []})
        group["ms_per_step"] += row["ms_per_step"]
        group["share"] += row["share"]
        group[names].append(row[name])
    for group in groups.values():
        group[names] = group[names][:3]
    return sorted(groups.values(), key=lambda group: -group["ms_per_step"])
