"""How a query's scaled causal scores s_j become the weights of the values (`model.attention`), and the learned KV-bias
slot every query may also attend to (`model.kv_bias`).

Two paths compute the same thing. `attend` is the training path; `explicit_attention` writes the weights out and
returns them, for the probes (and is the training path of the kinds without a fused kernel: sigmoid, softpick).

The softmax kinds reach SDPA's fused kernels through "virtual" positions prepended to the keys and values: the sink
(score b_h, value 0) and the KV-bias slot (key k_0, value v_0), each with a dummy query prepended to q, so the call
stays square and causal (`is_causal=True`, no mask: flash takes it) and query t sees the virtual positions and tokens
0..t. The sink's score must be b_h whatever the query: off-by-one's b = 0 is a zero key; `learnable_sink` appends
SINK_COLUMNS feature columns to q, k and v, the query's first one b_h sqrt(d_k) and the sink key's 1. Autograd
differentiates through the fused kernel as usual. The shorter y * sigmoid(lse - b_h) is exact in the forward pass but
not trainable as is: torch 2.13's fused kernels return the log-sum-exp without a gradient (output_differentiability
False), flex_attention has no backward on the CPU, and the gradient through lse reaches q and k.

Shapes: B batch, H query heads, K KV heads, T tokens, N virtual positions, D head dim (d_k), S = N + T.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

SINK_COLUMNS = 8  # flash takes head dims in multiples of 8: the learnable sink's one column, padded
SOFTPICK_EPS = 1e-8  # Zuhri et al.'s reference implementation


@dataclass(frozen=True)
class AttentionKind:
    fused: bool  # the training path is one SDPA call that the flash kernel takes
    sink: bool  # a softmax with a sink logit: mass the real tokens do not get


KINDS: dict[str, AttentionKind] = {
    "softmax": AttentionKind(fused=True, sink=False),
    "off_by_one": AttentionKind(fused=True, sink=True),
    "learnable_sink": AttentionKind(fused=True, sink=True),
    "sigmoid": AttentionKind(fused=False, sink=False),
    "softpick": AttentionKind(fused=False, sink=False),
}


def _sigmoid_weights(scores_BHTS: Tensor, n_virtual: int) -> Tensor:
    """sigmoid(s - log n) with n = t + 1, the tokens query t attends to: b = -log n as Ramapuram et al. 2024 (arXiv
    2409.04431; their n is the sequence length), taken per query rather than per window, so a query's output depends on
    nothing after it, not even the window length (evaluation runs at several lengths). Masked scores are -inf: weight
    0."""
    time = scores_BHTS.shape[-2]
    log_n_T1 = torch.arange(1, time + 1, device=scores_BHTS.device, dtype=scores_BHTS.dtype).log()[:, None]
    return torch.sigmoid(scores_BHTS - log_n_T1)


def _softpick_weights(scores_BHTS: Tensor, n_virtual: int) -> Tensor:
    """relu(e^s - 1) / sum |e^s - 1|, in Zuhri et al.'s stable form (the row max m factored out of both)."""
    m_BHT1 = scores_BHTS.amax(dim=-1, keepdim=True)  # finite: every query sees itself
    shifted_BHTS = torch.exp(scores_BHTS - m_BHT1) - torch.exp(-m_BHT1)
    allowed_BHTS = scores_BHTS.isfinite()  # a masked score's |e^-inf - 1| is 1, not 0: leave it out of the sum
    total_BHT1 = torch.where(allowed_BHTS, shifted_BHTS.abs(), 0.0).sum(dim=-1, keepdim=True)
    return F.relu(shifted_BHTS) / (total_BHT1 + SOFTPICK_EPS)


WEIGHTS = {
    "softmax": lambda scores_BHTS, n_virtual: scores_BHTS.softmax(dim=-1),
    "off_by_one": lambda scores_BHTS, n_virtual: scores_BHTS.softmax(dim=-1),
    "learnable_sink": lambda scores_BHTS, n_virtual: scores_BHTS.softmax(dim=-1),
    "sigmoid": _sigmoid_weights,
    "softpick": _softpick_weights,
}


def _repeat_kv(x_BKXD: Tensor, n_rep: int) -> Tensor:
    return x_BKXD.repeat_interleave(n_rep, dim=1)  # query head i reads KV head i // n_rep, as SDPA's enable_gqa


def explicit_attention(q_BHTD: Tensor, k_BKTD: Tensor, v_BKTD: Tensor, kind: str = "softmax",
                       sink_logits_H: Tensor | None = None, kv_bias: tuple[Tensor, Tensor] | None = None
                       ) -> tuple[Tensor, Tensor]:
    """Causal attention written out: (Y, the weights on the real tokens), the weights SDPA never exposes.

    The weights are those the mechanism uses: with a sink or a KV-bias slot they sum to less than 1 over the tokens (the
    rest is on the virtual position), under sigmoid attention they are the sigmoids. `kv_bias`: (k_0, v_0), each (K, D).
    """
    H, K, T, D = q_BHTD.shape[1], k_BKTD.shape[1], q_BHTD.shape[2], q_BHTD.shape[3]
    k_BHTD, v_BHTD = _repeat_kv(k_BKTD, H // K), _repeat_kv(v_BKTD, H // K)
    dtype = torch.promote_types(q_BHTD.dtype, torch.float32)
    scores_BHTT = (q_BHTD @ k_BHTD.transpose(-2, -1)).to(dtype) / math.sqrt(D)
    causal_TT = torch.ones(T, T, dtype=torch.bool, device=q_BHTD.device).tril()
    scores_BHTT = scores_BHTT.masked_fill(~causal_TT, float("-inf"))
    virtual_scores, virtual_values = [], []  # (B or 1, H, T or 1, 1) scores and (H, 1, D) values, in `attend`'s order
    if KINDS[kind].sink:
        sink_H = sink_logits_H if sink_logits_H is not None else q_BHTD.new_zeros(H)
        virtual_scores.append(sink_H.to(dtype).view(1, H, 1, 1).expand(*scores_BHTT.shape[:3], 1))
        virtual_values.append(v_BKTD.new_zeros(H, 1, D))
    if kv_bias is not None:
        key_HD, value_HD = (_repeat_kv(p.to(q_BHTD.dtype)[None], H // K)[0] for p in kv_bias)
        virtual_scores.append((q_BHTD @ key_HD[:, :, None]).to(dtype) / math.sqrt(D))
        virtual_values.append(value_HD.to(v_BKTD.dtype)[:, None, :])
    N = len(virtual_scores)
    if N:
        scores_BHTT = torch.cat([*virtual_scores, scores_BHTT], dim=-1)  # (B, H, T, S)
    weights_BHTS = WEIGHTS[kind](scores_BHTT, N)
    weights_BHTT = weights_BHTS[..., N:]
    y_BHTD = weights_BHTT.to(v_BHTD.dtype) @ v_BHTD
    if N:
        y_BHTD = y_BHTD + weights_BHTS[..., :N].to(v_BHTD.dtype) @ torch.cat(virtual_values, dim=1)
    return y_BHTD, weights_BHTT


SDPA_ALIGNMENT = 8  # elements: 16 bytes in bf16


def sdpa_layout(x: Tensor) -> Tensor:
    """`x` itself where its last stride is 1 and every other stride a multiple of SDPA_ALIGNMENT, else a contiguous
    copy (the same values).

    q, k and v are views into one projection's output, whose row is as wide as q + k + v + the gates' logits: a
    headwise G1 gate adds n_heads logits, so at the tiny presets' widths v's token stride is 132 elements. On an H100
    in bf16 (torch 2.11, CUDA 13) a fused SDPA kernel given such a v trained g1_head_sig to 2.6 times the baseline's
    perplexity, its gates closed, where the CPU's kernel trained it to the baseline's (results/tiny/README.md, issue
    34); fused kernels assume aligned rows (pytorch/pytorch#112577: non-contiguous inputs to the mem-efficient
    kernel return wrong values). Aligned views, every other variant's, pass untouched: no copy.

    Decided from the strides alone, which dynamo knows statically: `storage_offset()` breaks a compiled block's graph
    (issue 41). The storage offset is aligned by construction where the strides are: `Attention` lays q, k and v out
    first in its projection, each a whole number of heads, so a view starts at a multiple of the head stride (and
    RoPE's q and k are new tensors, offset 0). Under torch.compile inductor lays out SDPA's inputs itself and aligns
    them on a GPU (torch._inductor.lowering.sdpa_constraint)."""
    aligned = all(stride % SDPA_ALIGNMENT == 0 for stride in x.stride()[:-1])
    return x if aligned and x.stride(-1) == 1 else x.contiguous()


def attend(q_BHTD: Tensor, k_BKTD: Tensor, v_BKTD: Tensor, kind: str = "softmax",
           sink_logits_H: Tensor | None = None, kv_bias: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """The training path: one SDPA call for the softmax kinds (see the module's docstring), else the explicit path."""
    if not KINDS[kind].fused:
        return explicit_attention(q_BHTD, k_BKTD, v_BKTD, kind, sink_logits_H, kv_bias)[0]
    q_BHTD, k_BKTD, v_BKTD = sdpa_layout(q_BHTD), sdpa_layout(k_BKTD), sdpa_layout(v_BKTD)
    B, H, T, D = q_BHTD.shape
    K = k_BKTD.shape[1]
    if not KINDS[kind].sink and kv_bias is None:
        return F.scaled_dot_product_attention(q_BHTD, k_BKTD, v_BKTD, is_causal=True, enable_gqa=H != K)
    keys, values = [], []  # virtual positions, (B, K, 1, D) each
    if KINDS[kind].sink:
        keys.append(k_BKTD.new_zeros(B, K, 1, D))
        values.append(v_BKTD.new_zeros(B, K, 1, D))
    if kv_bias is not None:
        key_KD, value_KD = kv_bias
        keys.append(key_KD.to(k_BKTD.dtype)[None, :, None, :].expand(B, K, 1, D))
        values.append(value_KD.to(v_BKTD.dtype)[None, :, None, :].expand(B, K, 1, D))
    N = len(keys)
    q_BHSD = torch.cat([q_BHTD.new_zeros(B, H, N, D), q_BHTD], dim=2)
    k_BKSD, v_BKSD = torch.cat([*keys, k_BKTD], dim=2), torch.cat([*values, v_BKTD], dim=2)
    if kind == "learnable_sink":
        q_BHSD, k_BKSD, v_BKSD = _with_sink_columns(q_BHSD, k_BKSD, v_BKSD, sink_logits_H)
    y_BHSD = F.scaled_dot_product_attention(q_BHSD, k_BKSD, v_BKSD, is_causal=True, scale=1 / math.sqrt(D),
                                            enable_gqa=H != K)
    return y_BHSD[:, :, N:, :D]


def _with_sink_columns(q_BHSD: Tensor, k_BKSD: Tensor, v_BKSD: Tensor, sink_logits_H: Tensor
                       ) -> tuple[Tensor, Tensor, Tensor]:
    """SINK_COLUMNS more features, zero but for the query's first (b_h sqrt(D)) and the sink key's (1, at position 0):
    the sink scores b_h for every query (the scale stays 1 / sqrt(D)), the other scores are unchanged."""
    (B, H, S, D), K = q_BHSD.shape, k_BKSD.shape[1]
    sink_BHS1 = (sink_logits_H * math.sqrt(D)).to(q_BHSD.dtype).view(1, H, 1, 1).expand(B, H, S, 1)
    q_BHSD = torch.cat([q_BHSD, sink_BHS1, q_BHSD.new_zeros(B, H, S, SINK_COLUMNS - 1)], dim=-1)
    marker_BKSC = k_BKSD.new_zeros(B, K, S, SINK_COLUMNS)
    marker_BKSC[:, :, 0, 0] = 1.0
    k_BKSD = torch.cat([k_BKSD, marker_BKSC], dim=-1)
    v_BKSD = torch.cat([v_BKSD, v_BKSD.new_zeros(B, K, S, SINK_COLUMNS)], dim=-1)
    return q_BHSD, k_BKSD, v_BKSD
