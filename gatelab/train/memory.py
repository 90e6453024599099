"""Will this run fit? A lower bound on its memory, computed before anything is allocated, against the machine.

The bound counts only what a run cannot do without, so a run it refuses cannot fit, and one it lets through may
still be tight:
- fp32 weights, their gradients and AdamW's two moments (16 bytes a parameter; mixed precision keeps fp32 masters);
- the training step's logits and their gradient (fp32, batch x seq_len x vocab, twice): cross-entropy keeps them;
- the residual stream each layer saves for backward (batch x seq_len x d_model, once per layer);
- for the kinds whose training path is explicit (sigmoid, softpick: `explicit_output`), the q, k and v each layer's
  checkpointed attention keeps, and one query block's scores at the peak of its recomputation and backward;
- evaluation's largest forward pass (gatelab.train.evaluate), each with its fp32 logits: the held-out windows, the
  long-context windows (eval.long_context_multipliers: batch // m windows of m x seq_len), and the probes, whose
  explicit path (`explicit_attention`) holds whole (B, H, T, T) weights for every kind; the step-0 probe of the
  attention's scale (`init/attn_output_rms`) does so on a training batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from gatelab.config import ExperimentConfig, ModelConfig
from gatelab.devices import evaluation_batch_size
from gatelab.errors import GatelabError
from gatelab.model import count_parameters
from gatelab.model.attention_kinds import KINDS, query_block_rows

GB = 1e9

# fp32 (B, H, Q, T) tensors alive at once at the peak of the explicit path, rounded down from a count of live storages
# on the CPU (tests/train/test_memory.py measures them): with gradients, one query block's forward, recomputation and
# backward under checkpointing; without, one block of `explicit_output` or the probes' whole (B, H, T, T).
EXPLICIT_TENSORS_TRAINING = {"softmax": 3, "off_by_one": 4, "learnable_sink": 4, "sigmoid": 3, "softpick": 9}
EXPLICIT_TENSORS_NO_GRAD = {"softmax": 2, "off_by_one": 2, "learnable_sink": 2, "sigmoid": 3, "softpick": 4}
LOW_PRECISION_BYTES = 2  # q, k, v under bf16 or fp16 autocast; fp32 keeps twice that, and the bound stays a bound


@dataclass(frozen=True)
class MemoryBound:
    """Bytes, per device, that the run needs at least."""

    parameters: int
    weights_and_optimizer: int
    training_activations: int
    evaluation: int
    evaluation_pass: str = "evaluation"  # the largest pass, as the refusal names it
    evaluation_keys: str = "data.seq_len, eval.long_context_multipliers, eval.batch_size"  # the settings that drive it

    @property
    def total(self) -> int:
        return self.weights_and_optimizer + max(self.training_activations, self.evaluation)

    def largest(self) -> str:
        parts = {"weights, gradients and AdamW state": self.weights_and_optimizer,
                 "training activations": self.training_activations, "evaluation": self.evaluation}
        return max(parts, key=parts.get)


@dataclass(frozen=True)
class _Pass:
    """One forward pass without gradients: `rows` sequences of `tokens`, attention in blocks or written out whole."""

    name: str
    keys: str
    rows: int
    tokens: int
    attention: str  # "fused" (SDPA: no (B, H, T, T)), "blocks" (`explicit_output`) or "whole" (the probes)


def _ranks(experiment: ExperimentConfig) -> int:
    devices = experiment.train.devices
    return (devices if isinstance(devices, int) else 1) * experiment.train.num_nodes


def _evaluates_on_gpu(experiment: ExperimentConfig) -> bool:
    return experiment.train.accelerator in ("gpu", "cuda", "auto") and torch.cuda.is_available()


def explicit_attention_bytes(model: ModelConfig, rows: int, tokens: int, whole: bool, training: bool) -> int:
    """The explicit path's (B, H, Q, T) tensors alive at once: in `explicit_output`'s query blocks, or whole."""
    queries = tokens if whole else query_block_rows(rows, model.n_heads, tokens)
    tensors = (EXPLICIT_TENSORS_TRAINING if training else EXPLICIT_TENSORS_NO_GRAD)[model.attention]
    return tensors * 4 * rows * model.n_heads * queries * tokens


def training_bytes(experiment: ExperimentConfig, model: ModelConfig, batch: int) -> int:
    seq, vocab = experiment.data.seq_len, model.vocab_size
    total = 4 * batch * seq * (2 * vocab + model.n_layers * model.d_model)
    if not KINDS[model.attention].fused:
        qkv = batch * seq * (model.n_heads + 2 * model.n_kv_heads) * model.head_dim
        total += model.n_layers * LOW_PRECISION_BYTES * qkv
        total += explicit_attention_bytes(model, batch, seq, whole=False, training=True)
    return total


def _evaluation_passes(experiment: ExperimentConfig, model: ModelConfig, batch: int) -> list[_Pass]:
    """What `gatelab.train.evaluate` runs, with which batch and which attention path (and the step-0 probe)."""
    evaluation, data, seq = experiment.eval, experiment.data, experiment.data.seq_len
    on_gpu = _evaluates_on_gpu(experiment)
    rows = evaluation_batch_size(evaluation.batch_size, experiment.train.batch_size,
                                 torch.device("cuda" if on_gpu else "cpu"))
    rows_keys = "eval.batch_size, train.batch_size" if on_gpu else "eval.batch_size"  # a GPU evaluates the larger
    forward = "fused" if KINDS[model.attention].fused else "blocks"
    passes = [_Pass(f"held-out windows ({rows} x {seq:,} tokens)", f"{rows_keys}, data.seq_len", rows, seq, forward),
              _Pass(f"the step-0 attention-scale probe ({batch} x {seq:,} tokens, whole weights)",
                    "train.batch_size, data.seq_len", batch, seq, "whole")]
    if data.task == "bigram_backcopy":
        passes.append(_Pass(f"the bigram-backcopy probe ({rows} x {seq:,} tokens, whole weights)",
                            f"{rows_keys}, data.seq_len", rows, seq, "whole"))
        n_domains = 1
    else:
        # builtin corpora: the configured domains and the user's; a files or hf source: its named domains, at least one
        n_domains = max(1, len(data.domains) + len(data.user_files))
        if data.source != "builtin" or "speeches" in data.domains:  # evaluate.LONG_CONTEXT_DOMAIN
            for m in sorted(set(evaluation.long_context_multipliers)):
                passes.append(_Pass(f"the {m}x long-context windows ({max(1, rows // m)} x {m * seq:,} tokens)",
                                    f"eval.long_context_multipliers, {rows_keys}, data.seq_len",
                                    max(1, rows // m), m * seq, forward))
    probed = n_domains * min(evaluation.batch_size, evaluation.max_windows_per_domain)
    passes.append(_Pass(f"the probes ({math.ceil(probed / evaluation.probe_batches)} x {seq:,} tokens, whole weights)",
                        "eval.batch_size (or raise eval.probe_batches), data.seq_len",
                        math.ceil(probed / evaluation.probe_batches), seq, "whole"))
    return passes


def _pass_bytes(model: ModelConfig, one: _Pass) -> tuple[int, int]:
    """(logits, attention) bytes of one pass."""
    logits = 4 * one.rows * one.tokens * model.vocab_size
    if one.attention == "fused":
        return logits, 0
    return logits, explicit_attention_bytes(model, one.rows, one.tokens, one.attention == "whole", training=False)


def memory_bound(experiment: ExperimentConfig, model: ModelConfig) -> MemoryBound:
    parameters = count_parameters(model)  # meta device: counting allocates nothing
    sharded = _ranks(experiment) if experiment.train.strategy == "fsdp" else 1
    weights = 16 * parameters // sharded
    batch = max(1, experiment.train.batch_size // _ranks(experiment))
    training = training_bytes(experiment, model, batch)
    largest = max(_evaluation_passes(experiment, model, batch), key=lambda one: sum(_pass_bytes(model, one)))
    logits, attention = _pass_bytes(model, largest)
    if attention:
        name = f"evaluation, {largest.name} with {model.attention}'s explicit attention"
    else:
        name = f"evaluation, {largest.name}"
    keys = largest.keys + (", model.vocab_size" if logits >= attention else "")
    return MemoryBound(parameters, weights, training, logits + attention, name, keys)


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
    if KINDS[model.attention].fused:
        training = ("training activations", "train.batch_size, data.seq_len, model.vocab_size")
    else:
        training = (f"training activations with {model.attention}'s explicit attention",
                    "train.batch_size, data.seq_len")
    part, keys = {"weights, gradients and AdamW state": ("weights, gradients and AdamW state",
                                                         "model.vocab_size, model.d_model, model.n_layers"),
                  "training activations": training,
                  "evaluation": (bound.evaluation_pass, bound.evaluation_keys)}[bound.largest()]
    raise GatelabError(
        f"{experiment.name} ({experiment.variant}) needs at least {bound.total / GB:,.1f} GB per device "
        f"({bound.parameters / 1e6:,.1f}M parameters; {part}: "
        f"{max(bound.weights_and_optimizer, bound.training_activations, bound.evaluation) / GB:,.1f} GB), more than "
        f"{limit[1]}: lower {keys}, or train on a larger machine; nothing was started")
