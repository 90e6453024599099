"""How a query's scaled causal scores s_j become the weights of the values (`model.attention`), and the learned KV-bias
slot every query may also attend to (`model.kv_bias`).

Two paths compute the same thing. `attend` is the training path; `explicit_attention` writes the weights out and
returns them, for the probes. The kinds without a fused kernel (sigmoid, softpick) train on `explicit_output`, the
explicit path in query blocks, which never holds (B, H, T, T).

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

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from gatelab.config import ATTENTION_KINDS, AttentionKindTraits

SINK_COLUMNS = 8  # flash takes head dims in multiples of 8: the learnable sink's one column, padded
SOFTPICK_EPS = 1e-8  # Zuhri et al.'s reference implementation


# Each kind's flags, from the one table of kinds the config validates against and the docs list
KINDS: dict[str, AttentionKindTraits] = ATTENTION_KINDS


def _sigmoid_weights(scores_BHQS: Tensor, n_virtual: int) -> Tensor:
    """sigmoid(s - log n) with n = t + 1, the tokens query t attends to: b = -log n as Ramapuram et al. 2024 (arXiv
    2409.04431; their n is the sequence length), taken per query rather than per window, so a query's output depends on
    nothing after it, not even the window length (evaluation runs at several lengths). Masked scores are -inf: weight
    0. The Q queries are the last of the S - n_virtual tokens (a query block sees the tokens up to its last query)."""
    queries, tokens = scores_BHQS.shape[-2], scores_BHQS.shape[-1] - n_virtual
    log_n_Q1 = torch.arange(tokens - queries + 1, tokens + 1, device=scores_BHQS.device,
                            dtype=scores_BHQS.dtype).log()[:, None]
    return torch.sigmoid(scores_BHQS - log_n_Q1)


def _softpick_weights(scores_BHQS: Tensor, n_virtual: int) -> Tensor:
    """relu(e^s - 1) / sum |e^s - 1|, in Zuhri et al.'s stable form (the row max m factored out of both)."""
    m_BHQ1 = scores_BHQS.amax(dim=-1, keepdim=True)  # finite: every query sees itself
    shifted_BHQS = torch.exp(scores_BHQS - m_BHQ1) - torch.exp(-m_BHQ1)
    allowed_BHQS = scores_BHQS.isfinite()  # a masked score's |e^-inf - 1| is 1, not 0: leave it out of the sum
    total_BHQ1 = torch.where(allowed_BHQS, shifted_BHQS.abs(), 0.0).sum(dim=-1, keepdim=True)
    return F.relu(shifted_BHQS) / (total_BHQ1 + SOFTPICK_EPS)


# Keyed by KINDS' names (tests/model/test_attention_kinds.py checks it); torch functions, so here, not in the table
WEIGHTS = {
    "softmax": lambda scores_BHQS, n_virtual: scores_BHQS.softmax(dim=-1),
    "off_by_one": lambda scores_BHQS, n_virtual: scores_BHQS.softmax(dim=-1),
    "learnable_sink": lambda scores_BHQS, n_virtual: scores_BHQS.softmax(dim=-1),
    "sigmoid": _sigmoid_weights,
    "softpick": _softpick_weights,
}


def _repeat_kv(x_BKXD: Tensor, n_rep: int) -> Tensor:
    return x_BKXD.repeat_interleave(n_rep, dim=1)  # query head i reads KV head i // n_rep, as SDPA's enable_gqa


def _full_precision_product(a: Tensor, b: Tensor) -> Tensor:
    """a @ b in fp32 (or wider) inputs and output, autocast or not: under bf16 autocast the scores were rounded to 8
    significant bits before the upcast, 2-4x the error of the fused kernels (which score in fp32) for sigmoid and
    softpick. bf16 inputs upcast exactly; on a GPU the product may take TF32 where the process allows it."""
    dtype = torch.promote_types(a.dtype, torch.float32)
    with torch.autocast(a.device.type, enabled=False):
        return a.to(dtype) @ b.to(dtype)


def _attention_block(q_BHQD: Tensor, k_BKTD: Tensor, v_BKTD: Tensor, kind: str, sink_logits_H: Tensor | None,
                     kv_bias: tuple[Tensor, Tensor] | None) -> tuple[Tensor, Tensor]:
    """(Y, weights on the real tokens) of the Q queries that are the last of the T tokens given: a query's weights
    depend only on its own row of scores, so blocks of queries give the whole's values."""
    H, K, Q, T, D = q_BHQD.shape[1], k_BKTD.shape[1], q_BHQD.shape[2], k_BKTD.shape[2], q_BHQD.shape[3]
    k_BHTD, v_BHTD = _repeat_kv(k_BKTD, H // K), _repeat_kv(v_BKTD, H // K)
    # In place: the product's backward reads q and k, not its output, and an evaluation keeps one (B, H, Q, T) less
    scores_BHQT = _full_precision_product(q_BHQD, k_BHTD.transpose(-2, -1)).div_(math.sqrt(D))
    causal_QT = torch.ones(Q, T, dtype=torch.bool, device=q_BHQD.device).tril(diagonal=T - Q)
    scores_BHQT = scores_BHQT.masked_fill_(~causal_QT, float("-inf"))
    dtype = scores_BHQT.dtype
    virtual_scores, virtual_values = [], []  # (B or 1, H, Q or 1, 1) scores and (H, 1, D) values, in `attend`'s order
    if KINDS[kind].sink:
        sink_H = sink_logits_H if sink_logits_H is not None else q_BHQD.new_zeros(H)
        virtual_scores.append(sink_H.to(dtype).view(1, H, 1, 1).expand(*scores_BHQT.shape[:3], 1))
        virtual_values.append(v_BKTD.new_zeros(H, 1, D))
    if kv_bias is not None:
        key_HD, value_HD = (_repeat_kv(p.to(q_BHQD.dtype)[None], H // K)[0] for p in kv_bias)
        virtual_scores.append(_full_precision_product(q_BHQD, key_HD[:, :, None]) / math.sqrt(D))
        virtual_values.append(value_HD.to(v_BKTD.dtype)[:, None, :])
    N = len(virtual_scores)
    if N:
        scores_BHQT = torch.cat([*virtual_scores, scores_BHQT], dim=-1)  # (B, H, Q, N + T)
    weights_BHQS = WEIGHTS[kind](scores_BHQT, N)
    weights_BHQT = weights_BHQS[..., N:]
    y_BHQD = weights_BHQT.to(v_BHTD.dtype) @ v_BHTD
    if N:
        y_BHQD = y_BHQD + weights_BHQS[..., :N].to(v_BHTD.dtype) @ torch.cat(virtual_values, dim=1)
    return y_BHQD, weights_BHQT


def explicit_attention(q_BHTD: Tensor, k_BKTD: Tensor, v_BKTD: Tensor, kind: str = "softmax",
                       sink_logits_H: Tensor | None = None, kv_bias: tuple[Tensor, Tensor] | None = None
                       ) -> tuple[Tensor, Tensor]:
    """Causal attention written out: (Y, the weights on the real tokens), the weights SDPA never exposes.

    The weights are those the mechanism uses: with a sink or a KV-bias slot they sum to less than 1 over the tokens (the
    rest is on the virtual position), under sigmoid attention they are the sigmoids. `kv_bias`: (k_0, v_0), each (K, D).
    The scores are fp32 (or q's dtype if wider) under autocast too. Every (B, H, T, T) is live at once: for the probes,
    on a few sequences; `explicit_output` computes Y alone in bounded memory.
    """
    return _attention_block(q_BHTD, k_BKTD, v_BKTD, kind, sink_logits_H, kv_bias)


# Bytes of one query block's fp32 scores (B, H, Q, T) in `explicit_output`. A block's forward and backward hold a few
# tensors of that size (EXPLICIT_BLOCK_TENSORS in gatelab.train.memory): GBs, not the small preset's 58 GB of weights
# saved for backward. Blocks of fewer rows launch more, smaller products.
EXPLICIT_BLOCK_BYTES = 2**30


def query_block_rows(batch: int, n_heads: int, tokens: int, block_bytes: int = EXPLICIT_BLOCK_BYTES) -> int:
    """Queries per block in `explicit_output`: as many as keep one block's fp32 scores within `block_bytes`."""
    return max(1, min(tokens, block_bytes // (4 * batch * n_heads * tokens)))


def _block_output(q_BHQD: Tensor, k_BKTD: Tensor, v_BKTD: Tensor, kind: str, sink_logits_H: Tensor | None,
                  kv_bias: tuple[Tensor, Tensor] | None) -> Tensor:
    return _attention_block(q_BHQD, k_BKTD, v_BKTD, kind, sink_logits_H, kv_bias)[0]


def explicit_output(q_BHTD: Tensor, k_BKTD: Tensor, v_BKTD: Tensor, kind: str = "softmax",
                    sink_logits_H: Tensor | None = None, kv_bias: tuple[Tensor, Tensor] | None = None,
                    block_bytes: int = EXPLICIT_BLOCK_BYTES) -> Tensor:
    """`explicit_attention`'s Y, the same values, in blocks of `query_block_rows` queries, each over the tokens up to
    its last query: one block's (B, H, Q, T) scores are live at a time, not (B, H, T, T).

    Where gradients are on, each block runs under activation checkpointing, which recomputes one block's weights at a
    time where autograd would keep (B, H, T, T) weights per layer (58 GB for sigmoid in the small preset).
    """
    B, H, T, _ = q_BHTD.shape
    rows = query_block_rows(B, H, T, block_bytes)
    blocks = []
    for start in range(0, T, rows):
        end = min(T, start + rows)
        args = (q_BHTD[:, :, start:end], k_BKTD[:, :, :end], v_BKTD[:, :, :end], kind, sink_logits_H, kv_bias)
        if torch.is_grad_enabled():
            blocks.append(checkpoint(_block_output, *args, use_reentrant=False, preserve_rng_state=False))
        else:
            blocks.append(_block_output(*args))
    return blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=2)


SDPA_ALIGNMENT = 8  # elements: 16 bytes in bf16


def sdpa_layout(x: Tensor) -> Tensor:
    """`x` itself where its last stride is 1 and every other stride a multiple of SDPA_ALIGNMENT, else a contiguous
    copy (the same values).

    q, k and v are views into one projection's output, whose row also holds the gates' logits (a headwise G1 gate's
    n_heads make v's token stride 132 at the tiny widths). Fused kernels assume aligned rows (pytorch/pytorch#112577):
    on an H100 in bf16 such a v trained g1_head_sig to 2.6 times the baseline's perplexity (results/tiny/README.md).

    Decided from the strides alone, as `storage_offset()` breaks a compiled block's graph; the offset is aligned by
    construction where the strides are (`Attention` lays q, k and v out first, each a whole number of heads)."""
    aligned = all(stride % SDPA_ALIGNMENT == 0 for stride in x.stride()[:-1])
    return x if aligned and x.stride(-1) == 1 else x.contiguous()


def attend(q_BHTD: Tensor, k_BKTD: Tensor, v_BKTD: Tensor, kind: str = "softmax",
           sink_logits_H: Tensor | None = None, kv_bias: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """The training path: one SDPA call for the softmax kinds (see the module's docstring), else the explicit path."""
    if not KINDS[kind].fused:
        return explicit_output(q_BHTD, k_BKTD, v_BKTD, kind, sink_logits_H, kv_bias)
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
