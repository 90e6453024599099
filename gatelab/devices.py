"""Where a model runs outside the training loop: the end-of-run evaluation, the probes, `gatelab eval`, the lm-eval
model and the bench. One rule, so that a run evaluates where it trained.

Lightning moves the module back to the CPU when `fit` ends (its strategy's teardown), so a run that trained on a GPU
and evaluated "wherever the model is" evaluated on the host's cores: minutes instead of seconds on one H200.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)


def evaluation_device(requested: str | torch.device | None = None, accelerator: str = "auto") -> torch.device:
    """The device to evaluate on.

    `requested` first: the device a run trained on (Lightning's `trainer.strategy.root_device`) or one a user named
    (`gatelab eval`'s and the lm-eval model's `device`). A CUDA or MPS device this machine lacks falls back, with a
    warning, to the rule below, as lm-eval's own HF model does: its command line asks for cuda:0 unless told otherwise.
    Then the run's `train.accelerator`: `cpu` is the CPU; `gpu`, `cuda` and `auto` are the current CUDA device where
    CUDA is available; `mps` (and `auto` without CUDA) is Apple's GPU where it is available; anything else the CPU.
    """
    if requested is not None:
        device = torch.device(requested)
        if _available(device):
            return device
        log.warning("device %s asked for, but this machine has none: evaluating on %s", device,
                    fallback := evaluation_device(None, accelerator))
        return fallback
    if accelerator == "cpu":
        return torch.device("cpu")
    if accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    if accelerator in ("auto", "gpu", "mps") and _available(torch.device("mps")):
        return torch.device("mps")
    return torch.device("cpu")


def _available(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_available() and (device.index is None or device.index < torch.cuda.device_count())
    if device.type == "mps":
        return getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    return device.type == "cpu"


def device_name(device: torch.device) -> str:
    """What a device is, for run tags and plans: the GPU's model name (`NVIDIA H200`), `mps`, or `cpu`."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return device.type


def evaluation_batch_size(configured: int, train_batch_size: int, device: torch.device) -> int:
    """Rows of one evaluation forward pass at the training length. On a CPU `eval.batch_size` as configured (nothing
    changes there). On a GPU at least the training batch: training held that batch with its activations and gradients,
    so a forward pass without gradients fits, and a small eval batch leaves most of an H100 idle between launches."""
    if device.type == "cpu":
        return configured
    return max(configured, train_batch_size)


def rows_for_length(batch_size: int, seq_len: int, length: int, device: torch.device) -> int:
    """Rows of one forward pass over sequences of `length` tokens, where `batch_size` rows of `seq_len` (the training
    length) is the evaluation's batch: on a GPU as many tokens as that batch holds, so that a benchmark of short
    sentences fills the device instead of launching thousands of small forward passes; on a CPU `batch_size`
    (nothing changes there). Padding never changes a score, so neither does the batching (up to rounding)."""
    if device.type == "cpu":
        return batch_size
    return max(batch_size, batch_size * seq_len // max(1, length))


@contextmanager
def evaluation_precision(device: torch.device) -> Iterator[None]:
    """Within the block, an fp32 model's matrix products on a CUDA device run on TF32 tensor cores (10-bit mantissas,
    fp32 accumulation and outputs); elsewhere nothing changes. Strict fp32 runs on an H100 at about a fifteenth of its
    tensor-core rate, a large share of a small run's evaluation; bf16 autocast is faster still but rounds the logits
    themselves to 8 significant bits, which on a trained tiny model flipped 3 of 670 BLiMP pairs (TF32's outputs stay
    fp32). The setting is the process's, so it is put back after."""
    if device.type != "cuda":
        yield
        return
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


@dataclass(frozen=True)
class GpuPeak:
    """A GPU's dense peak FLOP/s, for the device a name matches (`pattern`, searched in `torch.cuda.get_device_name()`:
    "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA A100-SXM4-80GB")."""

    pattern: str
    bf16_flops: float  # tensor cores, without 2:4 sparsity (NVIDIA's datasheets print twice that "with sparsity")
    fp32_flops: float  # CUDA cores, no TF32


# NVIDIA's datasheets (dense bf16 is half the "with sparsity" figure): H100 SXM 1,979 / 67 TFLOP/s fp32, H100 PCIe
# 1,513 / 51, H100 NVL 1,671 / 60, H200 SXM as H100 SXM, H200 NVL as H100 NVL, HGX B200 4,500 / 75, A100 624 / 19.5,
# L40S 733 / 91.6, A10 250 / 31.2. The first pattern that matches wins, so variants come before their family; whole
# words, so A10 is not A100 or A10G. `gatelab sweep plan` prices a GPU by it, `gatelab bench` reports MFU against it.
GPU_PEAKS = (
    GpuPeak(r"\bH100\b.*\bPCIe\b", 756e12, 51e12),
    GpuPeak(r"\bH100\b.*\bNVL\b", 835e12, 60e12),
    GpuPeak(r"\bH100\b", 989e12, 67e12),
    GpuPeak(r"\bH200\b.*\bNVL\b", 835e12, 60e12),
    GpuPeak(r"\bH200\b", 989e12, 67e12),
    GpuPeak(r"\bB200\b", 2250e12, 75e12),
    GpuPeak(r"\bA100\b", 312e12, 19.5e12),
    GpuPeak(r"\bL40S\b", 362e12, 91.6e12),
    GpuPeak(r"\bA10\b", 125e12, 31.2e12),
)


def gpu_peak(name: str | None) -> GpuPeak | None:
    """The peaks of the GPU a `device_name` names (GPU_PEAKS); None for a GPU not in the table, or none: gatelab then
    assumes nothing of its own (the plan prices it as an H100 and says so, the bench leaves its MFU unmeasured)."""
    if not name:
        return None
    return next((peak for peak in GPU_PEAKS if re.search(peak.pattern, name, re.IGNORECASE)), None)


__all__ = ["GPU_PEAKS", "GpuPeak", "device_name", "evaluation_batch_size", "evaluation_device", "evaluation_precision", "gpu_peak",
           "rows_for_length"]
