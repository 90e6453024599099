"""GQA self-attention with QK-norm and RoPE, gates at G1..G5, the attention kind of `model.attention` and its KV-bias
slot (gatelab.model.attention_kinds), and an explicit path that returns the attention weights for probes.

Shapes: B batch, T time, D d_model, H query heads (q), K key/value heads (k), Dk head dim, E Switch-Head experts.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from gatelab.config import ModelConfig
from gatelab.model.attention_kinds import KINDS, attend, explicit_attention
from gatelab.model.gates import Gate


class Rotary(nn.Module):
    """RoPE (rotate-half layout). cos/sin are built for the length asked, so evaluation can run past training length."""

    def __init__(self, head_dim: int, base: float):
        super().__init__()
        # Computed on the CPU even under a meta-device context (parameter counting), where torch's Python kernels of the
        # division would import torch._dynamo (1.3 s); the model moves it with its parameters.
        exponents = torch.arange(0, head_dim, 2, device="cpu").float() / head_dim
        self.register_buffer("inv_freq", 1.0 / base**exponents, persistent=False)
        self._cache: tuple[int, torch.device, Tensor, Tensor] | None = None

    def cos_sin(self, time: int, device: torch.device) -> tuple[Tensor, Tensor]:
        if self._cache is None or self._cache[0] < time or self._cache[1] != device:
            freqs_TF = torch.outer(torch.arange(time, device=device, dtype=torch.float32), self.inv_freq.to(device))
            emb_TDk = torch.cat([freqs_TF, freqs_TF], dim=-1)
            self._cache = (time, device, emb_TDk.cos(), emb_TDk.sin())
        return self._cache[2][:time], self._cache[3][:time]

    @staticmethod
    def apply(x_BHTD: Tensor, cos_TD: Tensor, sin_TD: Tensor) -> Tensor:
        x1, x2 = x_BHTD.chunk(2, dim=-1)
        rotated = torch.cat([-x2, x1], dim=-1)
        return (x_BHTD.float() * cos_TD + rotated.float() * sin_TD).to(x_BHTD.dtype)


def top_k_mask(scores_BTKE: Tensor, top_k: int) -> Tensor:
    """1 on each KV head's top-k experts, else 0."""
    return torch.zeros_like(scores_BTKE).scatter_(-1, scores_BTKE.topk(top_k, dim=-1).indices, 1.0)


def switch_mix(experts_BTKED: Tensor, router_logits_BTKE: Tensor, top_k: int) -> Tensor:
    """SwitchHead's non-competitive routing: the top-k experts of each KV head, weighted by their sigmoid scores."""
    scores_BTKE = torch.sigmoid(router_logits_BTKE)
    if top_k < scores_BTKE.shape[-1]:
        scores_BTKE = scores_BTKE * top_k_mask(scores_BTKE, top_k)
    return (experts_BTKED * scores_BTKE.unsqueeze(-1)).sum(dim=-2)


class Attention(nn.Module):
    """GQA attention whose projections of X are one matmul, with gates from `config.gates`.

    Differences from a plain GQA block: `in_proj` is wider than q|k|v by every input-dependent gate's logits (the
    official code fuses the G1 gate into q_proj; the authors' training code fuses q, gate, k and v, their issue #11),
    and by Switch-Head experts and routers when `config.switch_head` is set. Column blocks are laid out in the order of
    `self.widths`; the official grouped-per-KV-head layout differs only by a permutation of rows. A learnable sink has
    one logit per query head (`sink_logits_H`), the KV-bias slot a key and a value per KV head (`kv_bias_key`,
    `kv_bias_value`, flat K * Dk: 1-D like every bias, which the optimizer does not decay); all start at zero.
    """

    def __init__(self, config: ModelConfig, layer_index: int):
        super().__init__()
        self.layer_index = layer_index
        H, K, Dk, D = config.n_heads, config.n_kv_heads, config.head_dim, config.d_model
        self.n_heads, self.n_kv_heads, self.head_dim = H, K, Dk
        heads_and_dim = {"g1": (H, Dk), "g4": (H, Dk), "g2": (K, Dk), "g3": (K, Dk), "g5": (1, D)}
        self.gates = nn.ModuleList(
            Gate(g, *heads_and_dim[g.position], norm_eps=config.norm_eps, logit_std=math.sqrt(D) * config.init_std)
            for g in config.gates
        )
        self.switch = config.switch_head
        experts = {"k": 1, "v": 1}
        if self.switch is not None:
            for projection in self.switch.projections:
                experts[projection] = self.switch.n_experts
        self.widths: dict[str, int] = {"q": H * Dk, "k": K * experts["k"] * Dk, "v": K * experts["v"] * Dk}
        if self.switch is not None:
            for projection in self.switch.projections:
                self.widths[f"router_{projection}"] = K * self.switch.n_experts
        for index, gate in enumerate(self.gates):
            if gate.logit_width:
                self.widths[self._gate_block(index, gate)] = gate.logit_width
        self.in_proj = nn.Linear(D, sum(self.widths.values()), bias=False)
        self.o_proj = nn.Linear(H * Dk, D, bias=False)
        self.q_norm = nn.RMSNorm(Dk, eps=config.norm_eps) if config.qk_norm else nn.Identity()
        self.k_norm = nn.RMSNorm(Dk, eps=config.norm_eps) if config.qk_norm else nn.Identity()
        self.kind = config.attention
        if config.attention == "learnable_sink":
            self.sink_logits_H = nn.Parameter(torch.zeros(H))
        self.kv_bias = config.kv_bias
        if config.kv_bias:
            self.kv_bias_key = nn.Parameter(torch.zeros(K * Dk))
            self.kv_bias_value = nn.Parameter(torch.zeros(K * Dk))

    @property
    def uses_sdpa(self) -> bool:
        """Whether the training path is one SDPA call (a fused kernel); sigmoid and softpick score in query blocks."""
        return KINDS[self.kind].fused

    @property
    def weights_sum_to_one(self) -> bool:
        """Whether each query's attention weights over the tokens sum to 1 (no sink, no KV-bias slot, a softmax)."""
        return self.kind == "softmax" and not self.kv_bias

    def zero_initialised_blocks(self) -> set[str]:
        """The row blocks of `in_proj` that start at zero: the logit rows of gates with `init: zero`."""
        return {self._gate_block(index, gate) for index, gate in enumerate(self.gates)
                if gate.logit_width and gate.config.init == "zero"}

    @staticmethod
    def _gate_block(index: int, gate: Gate) -> str:
        return f"gate{index}_{gate.config.position}"

    def _mechanism(self) -> dict:
        """The attention kind and its parameters, as `attend` and `explicit_attention` take them."""
        kv_bias = None
        if self.kv_bias:
            shape = (self.n_kv_heads, self.head_dim)
            kv_bias = (self.kv_bias_key.view(shape), self.kv_bias_value.view(shape))
        return {"kind": self.kind, "sink_logits_H": getattr(self, "sink_logits_H", None), "kv_bias": kv_bias}

    def row_blocks(self) -> dict[str, slice]:
        """Which rows of `in_proj.weight` hold which projection: q, k, v, routers, gate logits."""
        blocks, start = {}, 0
        for name, width in self.widths.items():
            blocks[name] = slice(start, start + width)
            start += width
        return blocks

    def _gate(self, site: str, x_BTHD: Tensor, logits: dict[str, Tensor], probe) -> Tensor:
        for index, gate in enumerate(self.gates):
            if gate.site == site:
                x_BTHD, scores = gate(x_BTHD, logits.get(self._gate_block(index, gate)))
                if probe is not None and scores is not None:
                    probe.add(self.layer_index, f"gate_score.{gate.config.position}", scores)
        return x_BTHD

    def forward(self, x_BTD: Tensor, rope_TD: tuple[Tensor, Tensor], probe=None) -> Tensor:
        """`rope_TD`: RoPE's (cos, sin) for T positions, from `Rotary.cos_sin`."""
        B, T, _ = x_BTD.shape
        H, K, Dk = self.n_heads, self.n_kv_heads, self.head_dim
        parts = dict(zip(self.widths, self.in_proj(x_BTD).split(list(self.widths.values()), dim=-1)))
        q_BTHD = parts["q"].view(B, T, H, Dk)
        k_BTKD, v_BTKD = parts["k"].view(B, T, K, -1, Dk), parts["v"].view(B, T, K, -1, Dk)
        if self.switch is not None and "k" in self.switch.projections:
            k_BTKD = switch_mix(k_BTKD, parts["router_k"].view(B, T, K, -1), self.switch.top_k)
        if self.switch is not None and "v" in self.switch.projections:
            v_BTKD = switch_mix(v_BTKD, parts["router_v"].view(B, T, K, -1), self.switch.top_k)
        k_BTKD, v_BTKD = k_BTKD.view(B, T, K, Dk), v_BTKD.view(B, T, K, Dk)

        v_BTKD = self._gate("g2", v_BTKD, parts, probe)
        k_BTKD = self._gate("g3", k_BTKD, parts, probe)
        q_BTHD = self._gate("g4", q_BTHD, parts, probe)
        q_BTHD, k_BTKD = self.q_norm(q_BTHD), self.k_norm(k_BTKD)
        k_BTKD = self._gate("g3_normed", k_BTKD, parts, probe)
        q_BTHD = self._gate("g4_normed", q_BTHD, parts, probe)

        cos_TD, sin_TD = rope_TD
        q_BHTD = Rotary.apply(q_BTHD.transpose(1, 2), cos_TD, sin_TD)
        k_BKTD = Rotary.apply(k_BTKD.transpose(1, 2), cos_TD, sin_TD)
        v_BKTD = v_BTKD.transpose(1, 2)
        if probe is None:
            y_BHTD = attend(q_BHTD, k_BKTD, v_BKTD, **self._mechanism())
        else:
            y_BHTD, probs_BHTT = explicit_attention(q_BHTD, k_BKTD, v_BKTD, **self._mechanism())
            probe.add(self.layer_index, "attention_probs", probs_BHTT)
        y_BTHD = y_BHTD.transpose(1, 2)

        if probe is not None:
            probe.add(self.layer_index, "sdpa_output", y_BTHD)
        y_BTHD = self._gate("g1", y_BTHD, parts, probe)
        if probe is not None:
            probe.add(self.layer_index, "sdpa_gated_output", y_BTHD)
        out_BTD = self.o_proj(y_BTHD.reshape(B, T, H * Dk))
        return self._gate("g5", out_BTD.view(B, T, 1, -1), parts, probe).view(B, T, -1)
