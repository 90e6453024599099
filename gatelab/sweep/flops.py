"""The training FLOPs of a model, as `gatelab sweep plan` counts them (its module docstring has the formula, PaLM's
6N + 12LHQT a token): here, below both the plan and the sweep file's ladder, so a ladder's FLOP budget per rung and the
plan's estimate count the same FLOPs."""

from __future__ import annotations

from gatelab.config import ExperimentConfig, ModelConfig


def active_parameters(model: ModelConfig, total: int) -> int:
    """N_active of gatelab.sweep.plan's docstring: no input embedding table, routed experts at top_k / n_experts."""
    embedding = model.vocab_size * model.d_model
    active = total - (0 if model.tie_embeddings else embedding)  # tied: the one table is the output head's matmul
    if model.ffn == "moe" and model.moe is not None:
        per_expert = 3 * model.d_model * model.moe.expert_hidden  # SwiGLU gate, up and down
        active -= model.n_layers * (model.moe.n_experts - model.moe.top_k) * per_expert
    return active


def training_flops(model: ModelConfig, active: int, tokens: int, seq_len: int) -> float:
    """Training FLOPs of `tokens` tokens (forward and backward) in sequences of `seq_len`."""
    attention_per_token = 12 * model.n_layers * seq_len * model.n_heads * model.head_dim
    return float(6 * active * tokens + attention_per_token * tokens)


def run_training_flops(experiment: ExperimentConfig, tokens: int | None = None) -> float:
    """The training FLOPs of an experiment's run (its resolved model; `tokens` defaults to the run's max_steps x
    batch_size x seq_len): a ladder rung's FLOP budget and the compute `gatelab table` reads for a rung."""
    from gatelab.model.params import count_parameters, resolve_model  # torch: only where FLOPs are counted

    model = resolve_model(experiment)
    if tokens is None:
        tokens = experiment.train.max_steps * experiment.train.batch_size * experiment.data.seq_len
    return training_flops(model, active_parameters(model, count_parameters(model)), tokens, experiment.data.seq_len)
