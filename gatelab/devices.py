"""Where a model runs outside the training loop: the end-of-run evaluation, the probes, `gatelab eval`, the lm-eval
model and the bench. One rule, so that a run evaluates where it trained. And which GPU each local worker of
`gatelab sweep run --workers` and `gatelab eval --workers` gets (`worker_gpus`).

Lightning moves the module back to the CPU when `fit` ends (its strategy's teardown), so a run that trained on a GPU
and evaluated "wherever the model is" evaluated on the host's cores: minutes instead of seconds on one H200.
"""

from __future__ import annotations

import logging
import os
import re
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)


def evaluation_device(requested: str | torch.device | None = None, accelerator: str = "auto") -> torch.device:
    """The device to evaluate on: `requested` (where a run trained, or one a user named), else by the run's
    `train.accelerator`. A CUDA or MPS device this machine lacks falls back with a warning, as lm-eval's own HF model
    does, since its command line asks for cuda:0 unless told otherwise.
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
    """Rows of one forward pass over sequences of `length` tokens: on a GPU as many tokens as `batch_size` rows of
    `seq_len`, so that short sentences fill the device instead of launching thousands of small passes; on a CPU
    `batch_size`."""
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
    GpuPeak(r"\bH[12]00\b.*\bNVL\b", 835e12, 60e12),
    GpuPeak(r"\bH[12]00\b", 989e12, 67e12),
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


VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"


def gpu_count() -> int:
    """The GPUs torch sees here (under the user's CUDA_VISIBLE_DEVICES); 0 without a usable CUDA."""
    try:
        return torch.cuda.device_count()
    except Exception:  # a broken driver or CUDA build: plan for CPUs
        return 0


def visible_entries(value: str) -> list[str]:
    """The GPUs a CUDA_VISIBLE_DEVICES value names, as it names them: `4`, `GPU-8f3a...`, `MIG-...`. CUDA reads the
    list up to its first invalid entry, so "" and "-1" name none, and "0,-1,1" names GPU 0 only."""
    entries = []
    for entry in value.split(","):
        entry = entry.strip()
        if not entry or entry.startswith("-"):
            break
        entries.append(entry)
    return entries


@dataclass(frozen=True)
class WorkerGpus:
    """The GPU each of a launch's local workers gets, as its CUDA_VISIBLE_DEVICES (`per_worker`); none at all on a
    machine without GPUs, whose workers share the cores instead (`gatelab.sweep.executor`)."""

    gpus: tuple[str, ...]  # the launch's GPUs: the user's CUDA_VISIBLE_DEVICES entries as given, else 0..n-1
    per_worker: tuple[str, ...]  # round-robin over `gpus`; () without GPUs
    user_visible: str | None  # the user's CUDA_VISIBLE_DEVICES, None where unset

    def env(self, worker: int) -> dict[str, str]:
        return {VISIBLE_ENV: self.per_worker[worker]} if self.per_worker else {}

    def launch_line(self) -> str | None:
        """How many workers share each GPU, e.g. "4 workers on 2 GPUs (CUDA_VISIBLE_DEVICES=4,5): 2 a GPU"; None
        without GPUs."""
        if not self.per_worker:
            return None
        load = Counter(self.per_worker)
        used = [gpu for gpu in self.gpus if gpu in load]
        of = f" of {len(self.gpus)}" if len(used) < len(self.gpus) else ""
        where = (f"{VISIBLE_ENV}={self.user_visible}" if self.user_visible is not None
                 else f"GPU{'s' * (len(used) > 1)} {','.join(used)}")
        counts = sorted(set(load.values()), reverse=True)
        if len(counts) == 1:
            share = "one a GPU" if counts[0] == 1 else f"{counts[0]} a GPU"
        else:  # uneven: which GPUs take the extra worker
            share = "; ".join(_on(count, [gpu for gpu in used if load[gpu] == count]) for count in counts)
        workers = len(self.per_worker)
        return (f"{workers} worker{'s' * (workers > 1)} on {len(used)}{of} GPU{'s' * (len(self.gpus) > 1)} "
                f"({where}): {share}")


def _on(workers: int, gpus: list[str]) -> str:
    return f"{workers} on GPU{'s' * (len(gpus) > 1)} {','.join(gpus)}"


def assign_gpus(n_workers: int, user_visible: str | None, count: int) -> WorkerGpus:
    """Each of `n_workers` local workers' GPU, in turn (round-robin where workers outnumber GPUs) from the user's
    CUDA_VISIBLE_DEVICES where it is set, so that `4,5,6,7` trains on 4-7, else from the `count` GPUs torch sees; None
    where torch sees none. Entries pass on as written (UUIDs, MIG ids), and `count` does not shorten the user's list:
    a process enumerates a single MIG instance however many the variable names, but each worker can have one."""
    gpus = visible_entries(user_visible) if user_visible is not None else [str(index) for index in range(count)]
    if count <= 0 or not gpus:  # no GPU; "" or -1 also get here, with a stand-in count (torch then counts none)
        return WorkerGpus((), (), user_visible)
    return WorkerGpus(tuple(gpus), tuple(gpus[index % len(gpus)] for index in range(n_workers)), user_visible)


def worker_gpus(n_workers: int, environ: Mapping[str, str] = os.environ) -> WorkerGpus:
    """`assign_gpus` for this process: its CUDA_VISIBLE_DEVICES and the GPUs torch sees. One rule for every launcher
    of local workers: `gatelab sweep run --workers` and `gatelab eval --workers`."""
    return assign_gpus(n_workers, environ.get(VISIBLE_ENV), gpu_count())
