"""Where a training step's GPU time goes, kernel by kernel, and how long the GPU sits idle waiting for the host.

`profiling.op_profile` charges device time to the aten op that launched it; this module reads the kernels themselves, as
the GPU ran them: their groups (GEMM, attention, inductor's Triton kernels, ...), and the gaps between them. A gap
is time no kernel, copy or fill ran: the GPU waiting for the host to launch more work (Python, dispatch, the
optimizer's bookkeeping, a synchronisation). Everything but `kernel_profile` is a pure function of kernel names and
times, tested on CPU; `kernel_profile` collects those from torch.profiler on a CUDA GPU.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile

from gatelab.bench.machine import synchronize
from gatelab.bench.profiling import kineto_markers_dropped, profile_groups

# A kernel launch costs ~2-5 us of GPU idle time even when the host keeps ahead of the GPU: shorter gaps are launch
# latency, longer ones the GPU waiting for the host.
GAP_THRESHOLD_US = 5.0

ATTENTION = "attention (flash / memory-efficient / cuDNN SDPA)"
GEMM = "matmul (cuBLAS/CUTLASS GEMM)"
# CUDA kernel name -> group, by lowercase substring, first match wins, so the order matters where names share words.
KERNEL_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # First: flash kernels carry "cutlass::" in their template arguments, cuDNN's SDPA kernels "sm90_", and the
    # memory-efficient ones (fmha_cutlassF/B) "cutlass": all would otherwise count as GEMMs.
    (ATTENTION, ("flash", "fmha", "attention", "sdpa")),
    # cuBLAS names its kernels after the tile and architecture (sm90_xmma_gemm_..., ampere_bf16_s16816gemm_...,
    # cuBLASLt's nvjet_... on Hopper, splitKreduce after a split-K GEMM); CUTLASS ones say cutlass; inductor's
    # max-autotune GEMM templates are triton_tem_fused_{mm,addmm,bmm}.
    (GEMM, ("gemm", "gemv", "xmma", "nvjet", "cutlass", "cublas", "splitkreduce", "sm80_", "sm90_", "sm100_",
            "triton_tem_fused_mm", "triton_tem_fused_addmm", "triton_tem_fused_bmm")),
    # torch.compile's kernels: each fuses several ops (triton_poi_: pointwise, triton_red_/triton_per_: reductions).
    ("inductor fused kernels (Triton)", ("triton_",)),
    # Eager log_softmax is cunn_SoftMaxForward/Backward; nll_loss has its own kernels.
    ("cross-entropy (softmax, nll)", ("softmax", "nll_loss", "cross_entropy")),
    # Eager RMSNorm (torch's _fused_rms_norm) runs the layer-norm kernels with an rms flag in the template arguments.
    ("norms (RMSNorm)", ("rms_norm", "rmsnorm", "layer_norm", "layernorm", "rowwisemoments", "gammabetabackward")),
    # Fused/foreach AdamW runs multi_tensor_apply kernels; grad-norm clipping runs foreach norms (lpnorm) or, one
    # tensor at a time, reduce_kernels over NormTwoOps: caught here before the reductions below.
    ("AdamW and grad-norm (multi-tensor)", ("multi_tensor_apply", "fusedadam", "fused_adam", "adamw", "lpnorm",
                                            "normtwoops", "normops")),
    ("reductions", ("reduce_kernel", "devicereduce", "devicescan")),
    # Before elementwise: dtype casts and fills are elementwise kernels whose functor says what they do.
    ("copies and fills", ("memcpy", "memset", "copy_kernel", "catarraybatchedcopy", "fillfunctor", "fill_kernel",
                          "index", "embedding", "gather", "scatter")),
    ("elementwise", ("elementwise_kernel",)),
)


def kernel_group(name: str) -> str:
    lowered = name.lower()
    return next((group for group, patterns in KERNEL_GROUPS if any(p in lowered for p in patterns)), "other")


@dataclass(frozen=True)
class KernelInterval:
    """One kernel (or memcpy/memset) as the GPU ran it, in microseconds on the profiler's clock."""
    name: str
    start_us: float
    end_us: float


# In a template argument, the word that says what a generic kernel computes: the functor of an elementwise kernel
# (sigmoid_kernel_cuda, MulFunctor), a reduction's ops (MeanOps), a CUTLASS GEMM's configuration.
_KERNEL_HINT = re.compile(r"\b[A-Za-z]\w*(?:_kernel_cuda|Functor\w*|Ops|Epilogue)\b|\bcutlass_\w+")


def short_kernel_name(name: str, width: int = 80) -> str:
    """`name` without "void ", aten's namespaces, template arguments and argument lists, then in brackets the last
    hint found in them (`vectorized_elementwise_kernel [sigmoid_kernel_cuda]`), at most `width` characters."""
    if name.startswith(("Memcpy", "Memset")):  # "Memcpy HtoD (Pinned -> Device)": the parentheses say what it is
        return name[:width]
    name = name.removeprefix("void ").replace("(anonymous namespace)::", "").replace("at::native::", "")
    kept, dropped, depth = [], [], 0
    for index, char in enumerate(name):
        if char in "<(":
            depth += 1
        closing = char in ">)" and not (char == ">" and name[index - 1:index] == "-")  # "->" closes nothing
        (dropped if depth or closing else kept).append(char)
        if closing:
            depth = max(depth - 1, 0)
    short = "".join(kept).strip()
    hints = _KERNEL_HINT.findall("".join(dropped))
    hint = next((h for h in reversed(hints) if h not in short), None)
    return (f"{short} [{hint}]" if hint else short)[:width]


def _busy_blocks(intervals: Iterable[KernelInterval]) -> list[tuple[float, float, str, str]]:
    """(start, end, first kernel, last kernel to end) of each stretch of time with some kernel running."""
    blocks: list[list] = []
    for kernel in sorted(intervals, key=lambda k: (k.start_us, k.end_us)):
        if blocks and kernel.start_us <= blocks[-1][1]:  # overlaps or touches: same busy stretch
            if kernel.end_us >= blocks[-1][1]:
                blocks[-1][1], blocks[-1][3] = kernel.end_us, kernel.name
        else:
            blocks.append([kernel.start_us, kernel.end_us, kernel.name, kernel.name])
    return [tuple(block) for block in blocks]


def busy_union(intervals: Iterable[KernelInterval]) -> list[tuple[float, float]]:
    """The union of the kernels' intervals: kernels on different streams overlap, and overlapped time counts once."""
    return [(start, end) for start, end, _, _ in _busy_blocks(intervals)]


def _rows_by_name(intervals: list[KernelInterval], steps: int) -> list[dict]:
    """One row per short name, slowest first: the same kernel built for other dtypes or tiles adds up in one row."""
    rows: dict[str, dict] = {}
    for kernel in intervals:
        label = short_kernel_name(kernel.name)
        row = rows.setdefault(label, {"kernel": label, "group": kernel_group(kernel.name), "ms_per_step": 0.0,
                                      "calls_per_step": 0.0})
        row["ms_per_step"] += (kernel.end_us - kernel.start_us) / 1e3 / steps
        row["calls_per_step"] += 1 / steps
    total = sum(row["ms_per_step"] for row in rows.values())
    for row in rows.values():
        row["share"] = row["ms_per_step"] / total if total else 0.0
    return sorted(rows.values(), key=lambda row: -row["ms_per_step"])


def kernel_summary(intervals: Iterable[KernelInterval], steps: int, gap_threshold_us: float = GAP_THRESHOLD_US) -> dict:
    """Per step of `steps` profiled back to back: the window from the first kernel's start to the last one's end,
    the time some kernel ran in it (busy) and the rest (idle), the kernels and their groups by summed time, and the
    gaps between kernels longer than `gap_threshold_us`. No kernels give zeros and empty lists."""
    intervals = list(intervals)
    blocks = _busy_blocks(intervals)
    window_us = blocks[-1][1] - blocks[0][0] if blocks else 0.0
    busy_us = sum(end - start for start, end, _, _ in blocks)
    gaps = [(next_block[0] - block[1], block[3], next_block[2]) for block, next_block in zip(blocks, blocks[1:])
            if next_block[0] - block[1] > gap_threshold_us]
    kernel_rows = _rows_by_name(intervals, steps)
    return {
        "steps": steps,
        "window_ms_per_step": window_us / 1e3 / steps,
        "busy_ms_per_step": busy_us / 1e3 / steps,
        "idle_ms_per_step": (window_us - busy_us) / 1e3 / steps,
        "idle_share": (window_us - busy_us) / window_us if window_us > 0 else 0.0,
        "kernels": kernel_rows,
        "groups": profile_groups(kernel_rows, "kernel", "kernels"),
        "gaps": {"threshold_us": gap_threshold_us, "count_per_step": len(gaps) / steps,
                 "ms_per_step": sum(gap for gap, _, _ in gaps) / 1e3 / steps,
                 "largest": [{"ms": gap / 1e3, "after": short_kernel_name(after), "before": short_kernel_name(before)}
                             for gap, after, before in sorted(gaps, key=lambda g: -g[0])[:5]]},
    }


# The profiler's device events that are work: kernels, copies and fills. It also records GPU-side spans of
# record_function ranges ("gpu_user_annotation", which cover the kernels inside them) and, when asked, CUDA
# synchronisations ("cuda_sync"): counting either would count kernels twice or a wait as work.
_DEVICE_WORK = ("kernel", "gpu_memcpy", "gpu_memset")


def device_work(events: Iterable, device_index: int) -> list[KernelInterval]:
    """The kernels, copies and fills on CUDA device `device_index` among a trace's FunctionEvents (`trace.events()`,
    times in microseconds). An event without an activity type counts unless it is a user annotation: torch 2.11's
    FunctionEvent has no `activity_type` attribute, and an older one may lack `is_user_annotation` too."""
    def is_work(event) -> bool:
        activity = getattr(event, "activity_type", None)
        return activity in _DEVICE_WORK if activity else not getattr(event, "is_user_annotation", False)

    return [KernelInterval(event.name, event.time_range.start, event.time_range.end) for event in events
            if event.device_type == torch.autograd.DeviceType.CUDA and event.device_index == device_index
            and is_work(event)]


def kernel_profile(step: Callable[[], None], steps: int = 3) -> dict:
    """`kernel_summary` of `steps` consecutive calls of `step` on the current CUDA device, after one untimed call.
    Only the last step is waited for, so steps queue on the GPU as in training."""
    if not torch.cuda.is_available():
        raise RuntimeError(f"kernel_profile reads CUDA kernels: torch {torch.__version__} sees no CUDA GPU "
                           "(torch.cuda.is_available() is False)")
    step()
    synchronize()
    with kineto_markers_dropped(), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as trace:
        for _ in range(steps):
            step()
        synchronize()
    return kernel_summary(device_work(trace.events(), torch.cuda.current_device()), steps)


class LightningKernelProfile:
    """A Lightning callback: `kernel_summary` of training steps `first` to `first + steps - 1` of a fit, the real step
    with its data loader, logging, clipping and optimizer. The window ends where step `first + steps` starts, so the
    wait for its batch counts as idle. Made by `lightning_kernel_profile` (Lightning is imported only there)."""

    def __init__(self, first: int = 3, steps: int = 3) -> None:
        self.first, self.steps = first, steps
        self.summary: dict | None = None
        self._profile = None
        self._open = ExitStack()  # the profiler inside kineto_markers_dropped, across two callbacks

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        if batch_idx == self.first:
            torch.cuda.synchronize()
            self._open.enter_context(kineto_markers_dropped())
            self._profile = self._open.enter_context(profile(activities=[ProfilerActivity.CPU,
                                                                         ProfilerActivity.CUDA]))
        elif batch_idx == self.first + self.steps:
            self._stop(self.steps)

    def on_train_end(self, trainer, pl_module) -> None:
        if self._profile is not None:  # the fit ended inside the window: the steps it had
            self._stop(max(1, trainer.global_step - self.first))

    def _stop(self, steps: int) -> None:
        torch.cuda.synchronize()
        self._open.close()
        self.summary = kernel_summary(device_work(self._profile.events(), torch.cuda.current_device()), steps)
        self._profile = None


def lightning_kernel_profile(first: int = 3, steps: int = 3):
    """A `LightningKernelProfile` that Lightning takes as a callback."""
    import lightning as L

    return type("LightningKernelProfileCallback", (LightningKernelProfile, L.Callback), {})(first, steps)


def kernel_markdown(summary: dict, title: str) -> list[str]:
    """Markdown lines: `title`, the step's window, busy and idle time, then tables of groups, the 10 slowest kernels
    and the largest gaps (as render.to_markdown's tables)."""
    lines = [f"## {title}", ""]
    if not summary["kernels"]:
        return lines + ["No CUDA kernels were recorded."]
    gaps = summary["gaps"]
    lines += [f"Per step: {summary['window_ms_per_step']:.3f} ms from the first kernel's start to the last one's end, "
              f"{summary['busy_ms_per_step']:.3f} ms with a kernel running, {summary['idle_ms_per_step']:.3f} ms idle "
              f"({summary['idle_share']:.1%} of the window: the GPU waiting for the host). Gaps longer than "
              f"{gaps['threshold_us']:g} us (launch latency is shorter): {gaps['count_per_step']:g} a step, "
              f"{gaps['ms_per_step']:.3f} ms.", "",
              "| group | ms/step | share | slowest kernels |", "|---|---|---|---|"]
    for group in summary["groups"]:
        lines.append(f"| {group['group']} | {group['ms_per_step']:.3f} | {group['share']:.1%} | "
                     f"{', '.join(group['kernels'])} |")
    lines += ["", "| kernel | group | ms/step | share | calls/step |", "|---|---|---|---|---|"]
    for row in summary["kernels"][:10]:
        lines.append(f"| {row['kernel']} | {row['group']} | {row['ms_per_step']:.3f} | {row['share']:.1%} | "
                     f"{row['calls_per_step']:.0f} |")
    if gaps["largest"]:
        lines += ["", "| gap (ms) | after | before |", "|---|---|---|"]
        lines += [f"| {gap['ms']:.3f} | {gap['after']} | {gap['before']} |" for gap in gaps["largest"]]
    return lines
