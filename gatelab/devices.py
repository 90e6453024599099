"""Where a model runs outside the training loop: the end-of-run evaluation, the probes, `gatelab eval`, the lm-eval
model and the bench. One rule, so that a run evaluates where it trained.

Lightning moves the module back to the CPU when `fit` ends (its strategy's teardown), so a run that trained on a GPU
and evaluated "wherever the model is" evaluated on the host's cores: minutes instead of seconds on one H200.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

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


__all__ = ["device_name", "evaluation_batch_size", "evaluation_device", "evaluation_precision"]
