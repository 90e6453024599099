"""A pre-norm decoder-only transformer (RMSNorm, RoPE, SwiGLU, GQA, QK-norm) with a dense or MoE FFN.

Shapes: B batch, T time, D d_model, V vocabulary.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gatelab.config import ModelConfig
from gatelab.model.attention import Attention, Rotary
from gatelab.model.moe import MoEFeedForward


class FeedForward(nn.Module):
    """SwiGLU with the gate and up projections fused into one matmul."""

    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.gate_up_proj = nn.Linear(d_model, 2 * hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x_BTD: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        gate_BTF, up_BTF = self.gate_up_proj(x_BTD).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate_BTF) * up_BTF), {}


class Block(nn.Module):
    """x + Attn(Norm(x)), then x + FFN(Norm(x)); with sandwich norm each sublayer output is normed before the add."""

    def __init__(self, config: ModelConfig, layer_index: int):
        super().__init__()
        self.layer_index = layer_index
        D, eps = config.d_model, config.norm_eps
        self.attn_norm, self.attn = nn.RMSNorm(D, eps=eps), Attention(config, layer_index)
        self.ffn_norm = nn.RMSNorm(D, eps=eps)
        self.ffn = MoEFeedForward(D, config.moe) if config.ffn == "moe" else FeedForward(D, config.ffn_hidden)
        self.attn_out_norm = nn.RMSNorm(D, eps=eps) if config.sandwich_norm else nn.Identity()
        self.ffn_out_norm = nn.RMSNorm(D, eps=eps) if config.sandwich_norm else nn.Identity()

    def forward(self, x_BTD: Tensor, rope_TD: tuple[Tensor, Tensor], probe=None) -> tuple[Tensor, dict[str, Tensor]]:
        attn_BTD = self.attn_out_norm(self.attn(self.attn_norm(x_BTD), rope_TD, probe))
        x_BTD = x_BTD + attn_BTD
        if probe is not None:
            probe.add(self.layer_index, "attn_output", attn_BTD)
            probe.add(self.layer_index, "attn_residual", x_BTD)
        ffn_BTD, aux = self.ffn(self.ffn_norm(x_BTD))
        ffn_BTD = self.ffn_out_norm(ffn_BTD)
        x_BTD = x_BTD + ffn_BTD
        if probe is not None:
            probe.add(self.layer_index, "ffn_output", ffn_BTD)
            probe.add(self.layer_index, "ffn_residual", x_BTD)  # the layer's output hidden state, for M-Act
        return x_BTD, aux


class GatedTransformer(nn.Module):
    """`logits_BTV = model(input_ids_BT)`; `forward_with_aux` also returns the MoE auxiliary losses, and
    `hidden_states` stops before `lm_head` (training feeds it to a chunked linear cross-entropy)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.rotary = Rotary(config.head_dim, config.rope_base)
        self.blocks = nn.ModuleList(Block(config, index) for index in range(config.n_layers))
        self.norm = nn.RMSNorm(config.d_model, eps=config.norm_eps)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    def forward_with_aux(self, input_ids_BT: Tensor, probe=None) -> tuple[Tensor, dict[str, Tensor]]:
        hidden_BTD, aux_means = self.hidden_states(input_ids_BT, probe)
        return self.lm_head(hidden_BTD), aux_means

    def hidden_states(self, input_ids_BT: Tensor, probe=None, blocks: Sequence[Callable] | None = None
                      ) -> tuple[Tensor, dict[str, Tensor]]:
        """The final-normed hidden states that `lm_head` reads, and the MoE auxiliary losses (layer means).

        `blocks` stand in for `self.blocks` (training passes their compiled forms)."""
        x_BTD = self.embed(input_ids_BT)
        # Built here, not in the blocks: the rotary cache is Python state, which a compiled block would guard on.
        rope_TD = self.rotary.cos_sin(input_ids_BT.shape[1], x_BTD.device)
        aux_sums: dict[str, Tensor] = {}
        for block in blocks or self.blocks:
            x_BTD, aux = block(x_BTD, rope_TD, probe)
            for name, value in aux.items():
                aux_sums[name] = aux_sums.get(name, 0.0) + value
        aux_means = {name: total / len(self.blocks) for name, total in aux_sums.items()}
        return self.norm(x_BTD), aux_means

    def forward(self, input_ids_BT: Tensor, probe=None) -> Tensor:
        return self.forward_with_aux(input_ids_BT, probe)[0]


def _stream_seed(seed: int, name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}/{name}".encode()).digest()[:8], "little") & (2**63 - 1)


def _normal_(target: Tensor, std: float, seed: int, name: str) -> None:
    generator = torch.Generator().manual_seed(_stream_seed(seed, name))
    values = torch.empty(target.shape, dtype=torch.float32).normal_(0.0, std, generator=generator)
    with torch.no_grad():
        target.copy_(values.to(device=target.device, dtype=target.dtype))


@torch.no_grad()
def init_weights(model: GatedTransformer, seed: int) -> None:
    """N(0, init_std) for every matrix (o_proj: times o_proj_init_scale), ones for norms, zeros for input-independent
    gate logits, sink logits, KV biases and the logit rows of a gate with `init: zero`.

    Each weight (each row block of a fused projection, each expert) draws from its own random stream named after it,
    so a variant shares with `baseline` the exact initial values of every parameter they have in common, and what the
    variant adds never shifts them: the common random numbers that make pairwise comparisons by seed possible.
    """
    std = model.config.init_std
    for module_name, module in model.named_modules():
        prefix = f"{module_name}." if module_name else ""
        if isinstance(module, Attention):
            zero_blocks = module.zero_initialised_blocks()
            for block, rows in module.row_blocks().items():
                if block in zero_blocks:  # its stream is left undrawn: every other block keeps its values
                    module.in_proj.weight[rows].zero_()
                else:
                    _normal_(module.in_proj.weight[rows], std, seed, f"{prefix}in_proj.{block}")
            _normal_(module.o_proj.weight, std * model.config.o_proj_init_scale, seed, f"{prefix}o_proj")
        elif isinstance(module, MoEFeedForward):
            _normal_(module.router.weight, std, seed, f"{prefix}router")
            for expert in range(module.config.n_experts):
                _normal_(module.w_gate_up_EDF[expert], std, seed, f"{prefix}expert{expert}.gate_up")
                _normal_(module.w_down_EFD[expert], std, seed, f"{prefix}expert{expert}.down")
        elif isinstance(module, FeedForward):
            _normal_(module.gate_up_proj.weight, std, seed, f"{prefix}gate_up_proj")
            _normal_(module.down_proj.weight, std, seed, f"{prefix}down_proj")
        elif isinstance(module, nn.Embedding):
            _normal_(module.weight, std, seed, f"{prefix}weight")
        elif isinstance(module, nn.RMSNorm):
            module.weight.fill_(1.0)
    if not model.config.tie_embeddings:
        _normal_(model.lm_head.weight, std, seed, "lm_head")
    for name, parameter in model.named_parameters():
        if name.endswith("logits_HD"):
            parameter.zero_()  # input-independent gate: sigmoid(0) = 0.5 at the start (paper, section 4.3)
        elif name.endswith(("sink_logits_H", "kv_bias_key", "kv_bias_value")):
            parameter.zero_()  # b_h = 0 as Megatron-LM's learnable softmax offset; k_0 = v_0 = 0 (Gu et al.)


def build_model(config: ModelConfig, seed: int = 0, device: torch.device | str | None = None) -> GatedTransformer:
    model = GatedTransformer(config).to(device) if device is not None else GatedTransformer(config)
    init_weights(model, seed)
    return model
