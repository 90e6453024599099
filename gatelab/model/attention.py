"""GQA self-attention with QK-norm and RoPE, gates at G1..G5, and an explicit softmax path for probes.

Shapes: B batch, T time, D d_model, H query heads (q), K key/value heads (k), Dk head dim, E Switch-Head experts.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gatelab.config import ModelConfig
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


def explicit_attention(q_BHTD: Tensor, k_BKTD: Tensor, v_BKTD: Tensor) -> tuple[Tensor, Tensor]:
    """Causal softmax attention written out, returning the probabilities SDPA never exposes (for the sink probes)."""
    n_rep = q_BHTD.shape[1] // k_BKTD.shape[1]
    k_BHTD = k_BKTD.repeat_interleave(n_rep, dim=1)  # query head i reads KV head i // n_rep, as SDPA's enable_gqa
    v_BHTD = v_BKTD.repeat_interleave(n_rep, dim=1)
    time = q_BHTD.shape[2]
    scores_BHTT = (q_BHTD @ k_BHTD.transpose(-2, -1)).float() / math.sqrt(q_BHTD.shape[-1])
    causal_TT = torch.ones(time, time, dtype=torch.bool, device=q_BHTD.device).tril()
    probs_BHTT = scores_BHTT.masked_fill(~causal_TT, float("-inf")).softmax(dim=-1)
    return (probs_BHTT.to(v_BHTD.dtype) @ v_BHTD), probs_BHTT


def switch_mix(experts_BTKED: Tensor, router_logits_BTKE: Tensor, top_k: int) -> Tensor:
    """SwitchHead's non-competitive routing: the top-k experts of each KV head, weighted by their sigmoid scores."""
    scores_BTKE = torch.sigmoid(router_logits_BTKE)
    if top_k < scores_BTKE.shape[-1]:
        keep = torch.zeros_like(scores_BTKE).scatter_(-1, scores_BTKE.topk(top_k, dim=-1).indices, 1.0)
        scores_BTKE = scores_BTKE * keep
    return (experts_BTKED * scores_BTKE.unsqueeze(-1)).sum(dim=-2)


class Attention(nn.Module):
    """GQA attention whose projections of X are one matmul, with gates from `config.gates`.

    Differences from a plain GQA block: `in_proj` is wider than q|k|v by every input-dependent gate's logits (the
    official code fuses the G1 gate into q_proj; the authors' training code fuses q, gate, k and v, their issue #11),
    and by Switch-Head experts and routers when `config.switch_head` is set. Column blocks are laid out in the order of
    `self.widths`; the official grouped-per-KV-head layout differs only by a permutation of rows.
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
                self.widths[f"gate{index}_{gate.config.position}"] = gate.logit_width
        self.in_proj = nn.Linear(D, sum(self.widths.values()), bias=False)
        self.o_proj = nn.Linear(H * Dk, D, bias=False)
        self.q_norm = nn.RMSNorm(Dk, eps=config.norm_eps) if config.qk_norm else nn.Identity()
        self.k_norm = nn.RMSNorm(Dk, eps=config.norm_eps) if config.qk_norm else nn.Identity()

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
                x_BTHD, scores = gate(x_BTHD, logits.get(f"gate{index}_{gate.config.position}"))
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
            y_BHTD = F.scaled_dot_product_attention(q_BHTD, k_BKTD, v_BKTD, is_causal=True, enable_gqa=H != K)
        else:
            y_BHTD, probs_BHTT = explicit_attention(q_BHTD, k_BKTD, v_BKTD)
            probe.add(self.layer_index, "attention_probs", probs_BHTT)
        y_BTHD = y_BHTD.transpose(1, 2)

        if probe is not None:
            probe.add(self.layer_index, "sdpa_output", y_BTHD)
        y_BTHD = self._gate("g1", y_BTHD, parts, probe)
        if probe is not None:
            probe.add(self.layer_index, "sdpa_gated_output", y_BTHD)
        out_BTD = self.o_proj(y_BTHD.reshape(B, T, H * Dk))
        return self._gate("g5", out_BTD.view(B, T, 1, -1), parts, probe).view(B, T, -1)
