"""The training FLOPs of a model, as `gatelab sweep plan` counts them (its module docstring has the formula, PaLM's
6N + 12LHQT a token): here, below both the plan and the sweep file's ladder, so a ladder's FLOP budget per rung and the
plan's estimate count the same FLOPs."""

from __future__ import annotations

from gatelab.config import ModelConfig


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
