"""Will this run fit? A lower bound on its memory, computed before anything is allocated, against the machine.

The bound counts only what a run cannot do without, so a run it refuses cannot fit, and one it lets through may
still be tight:
- fp32 weights, their gradients and AdamW's two moments (16 bytes a parameter; mixed precision keeps fp32 masters);
- the training step's logits and their gradient (fp32, batch x seq_len x vocab, twice): cross-entropy keeps them;
- the residual stream each layer saves for backward (batch x seq_len x d_model, once per layer);
- evaluation's longest window (long-context multipliers), logits only, and one sequence's attention probabilities in
  the probes' explicit attention path (heads x T x T: SDPA never returns them, so the probes materialise them).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from gatelab.config import ExperimentConfig, ModelConfig
from gatelab.errors import GatelabError
from gatelab.model import count_parameters

GB = 1e9


@dataclass(frozen=True)
class MemoryBound:
    """Bytes, per device, that the run needs at least."""

    parameters: int
    weights_and_optimizer: int
    training_activations: int
    evaluation: int

    @property
    def total(self) -> int:
        return self.weights_and_optimizer + max(self.training_activations, self.evaluation)

    def largest(self) -> str:
        parts = {"weights, gradients and AdamW state": self.weights_and_optimizer,
                 "training activations": self.training_activations, "evaluation": self.evaluation}
        return max(parts, key=parts.get)


def _ranks(experiment: ExperimentConfig) -> int:
    devices = experiment.train.devices
    return (devices if isinstance(devices, int) else 1) * experiment.train.num_nodes


def memory_bound(experiment: ExperimentConfig, model: ModelConfig) -> MemoryBound:
    parameters = count_parameters(model)  # meta device: counting allocates nothing
    sharded = _ranks(experiment) if experiment.train.strategy == "fsdp" else 1
    weights = 16 * parameters // sharded
    batch = max(1, experiment.train.batch_size // _ranks(experiment))
    seq, vocab = experiment.data.seq_len, model.vocab_size
    training = 4 * batch * seq * (2 * vocab + model.n_layers * model.d_model)
    longest = seq * max(experiment.eval.long_context_multipliers or [1])
    evaluation = 4 * (experiment.eval.batch_size * longest * vocab + model.n_heads * longest * longest)
    return MemoryBound(parameters, weights, training, evaluation)


def available_bytes(experiment: ExperimentConfig) -> tuple[int, str] | None:
    """(bytes, where) that one rank can use: a CUDA device's total memory when the run trains on GPUs, else this
    machine's MemAvailable. None where neither can be read."""
    accelerator = experiment.train.accelerator
    if accelerator in ("gpu", "cuda", "auto") and torch.cuda.is_available():
        _free, total = torch.cuda.mem_get_info()
        return total, f"the GPU's {total / GB:.1f} GB ({torch.cuda.get_device_name()})"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
                return available, f"this machine's {available / GB:.1f} GB available memory"
    except OSError:
        pass
    return None


def check_fits(experiment: ExperimentConfig, model: ModelConfig) -> MemoryBound:
    """Raise GatelabError, naming the bound, its largest part and the keys that drive it, when the run cannot fit."""
    bound = memory_bound(experiment, model)
    limit = available_bytes(experiment)
    if limit is None or bound.total <= limit[0]:
        return bound
    keys = {"weights, gradients and AdamW state": "model.vocab_size, model.d_model, model.n_layers",
            "training activations": "train.batch_size, data.seq_len, model.vocab_size",
            "evaluation": "data.seq_len, eval.long_context_multipliers, eval.batch_size"}[bound.largest()]
    raise GatelabError(
        f"{experiment.name} ({experiment.variant}) needs at least {bound.total / GB:,.1f} GB per device "
        f"({bound.parameters / 1e6:,.1f}M parameters; {bound.largest()}: "
        f"{max(bound.weights_and_optimizer, bound.training_activations, bound.evaluation) / GB:,.1f} GB), more than "
        f"{limit[1]}: lower {keys}, or train on a larger machine; nothing was started")
