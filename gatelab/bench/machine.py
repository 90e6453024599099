"""The machine the bench measures on: what it is, which device the steps run on, and waiting for that device."""

from __future__ import annotations

import platform

import torch

from gatelab import host
from gatelab.devices import device_name, evaluation_device, gpu_peak


def machine_facts() -> dict:
    facts = {"cpu": host.cpu_model(), "cores": len(host.available_cores()),
             "torch_threads": torch.get_num_threads(), "fast_bf16_cpu": host.cpu_has_fast_bf16(),
             "torch": torch.__version__, "python": platform.python_version(),
             "gpu": device_name(bench_device()) if bench_device().type == "cuda" else None}
    return facts


def bench_device() -> torch.device:
    """The current CUDA device where there is one, else the CPU (not Apple's GPU: `synchronize` does not wait for
    it)."""
    return evaluation_device(accelerator="cuda")


def synchronize() -> None:
    """Wait for the GPU's queued work, where there is a GPU: a step's time is the time until its kernels end."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def gpu_peak_flops(name: str | None) -> float | None:
    """The dense bf16 peak of a GPU by its name (`gatelab.devices.GPU_PEAKS`, which the plan prices GPUs by); None for
    a GPU not in the table, or none."""
    peak = gpu_peak(name)
    return peak and peak.bf16_flops
