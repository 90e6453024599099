"""Gates on the attention path (Qiu et al. 2025, Eq. 5): one module for every position and design axis.

A gate acts on a per-head tensor (B, T, H, D): the SDPA output Y at G1 (H = q), V or K at G2/G3 (H = k, applied before
the KV heads are repeated), Q at G4 (H = q), and the output projection at G5 (H = 1, D = d_model).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gatelab.config import GateConfig

ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "sigmoid": torch.sigmoid,
    "silu": F.silu,
    "ns_sigmoid": lambda x: 0.5 + 0.5 * torch.sigmoid(x),  # Eq. 9: range [0.5, 1], so it cannot be sparse
    "identity": lambda x: x,
    "softplus": F.softplus,  # Poolside's Laguna: range (0, inf), log 2 at 0
    "two_sigmoid": lambda x: 2 * torch.sigmoid(x),  # range (0, 2), exactly 1 at 0: with zero-initialised rows, no gate
}


def silu_gate_init_rms(logit_std: float) -> float:
    """The root mean square of SiLU(z), z ~ N(0, logit_std^2): how much a multiplicative SiLU gate shrinks Y at init.

    A gate's logits X W read the pre-norm hidden state, whose RMSNorm output has mean square 1 per element at init, and
    W ~ N(0, init_std^2), so each logit is N(0, d_model init_std^2). Gauss-Hermite quadrature (exact to float precision
    for this smooth integrand at 64 nodes)."""
    nodes, weights = np.polynomial.hermite_e.hermegauss(64)  # probabilists' Hermite: weight exp(-z^2 / 2)
    z = logit_std * nodes
    silu = z / (1.0 + np.exp(-z))
    return float(math.sqrt(np.sum(weights * silu**2) / math.sqrt(2 * math.pi)))


class Gate(nn.Module):
    """score = act(logits); Y' = Y * score (multiplicative) or Y + score (additive).

    Logits read the pre-norm hidden state X through `logit_width` columns of the attention's fused input projection
    (so the gate costs no extra matmul), or, for an input-independent gate, a learned (H, D) tensor that is
    zero-initialised (the paper: sigmoid starts at 0.5). `kind` rmsnorm and silu are Table 3's parameter-free
    non-linearities on Y, and `kind` scale the constant control Y' = c Y: they return no score. `logit_std` is the
    std of a gate logit at init (sqrt(d_model) * init_std), which `scale: silu_gate_init` matches. With
    `compute_dtype: float32` the activation and the product run in (at least) float32 and the product is cast back to
    Y's dtype; `init: zero` is applied by `gatelab.model.transformer.init_weights` to the gate's logit rows.
    """

    def __init__(self, config: GateConfig, n_heads: int, head_dim: int, norm_eps: float = 1e-6,
                 logit_std: float = 0.0):
        super().__init__()
        self.config = config
        self.score_dim = 1 if config.granularity == "headwise" else head_dim
        single_projection = config.heads == "shared" and config.shared_scores == "single_projection"
        self.score_heads = 1 if single_projection else n_heads
        learned = config.kind == "gate"
        self.logit_width = self.score_heads * self.score_dim if learned and config.input_dependent else 0
        if learned and not config.input_dependent:
            self.logits_HD = nn.Parameter(torch.zeros(self.score_heads, self.score_dim))
        if config.kind == "rmsnorm":
            self.norm = nn.RMSNorm(head_dim, eps=norm_eps)
        if config.kind == "scale":
            self.constant = silu_gate_init_rms(logit_std) if config.scale == "silu_gate_init" else float(config.scale)

    @property
    def site(self) -> str:
        """Where in the attention block the gate acts: its position, or g3/g4 after QK-norm when so configured."""
        after_norm = self.config.position in ("g3", "g4") and not self.config.before_qk_norm
        return f"{self.config.position}_normed" if after_norm else self.config.position

    def scores(self, logits_BTW: Tensor | None, batch: int, time: int) -> Tensor:
        """Gate scores, (B, T, H or 1, D or 1), or (H or 1, D or 1) for an input-independent gate."""
        if self.config.input_dependent:
            logits = logits_BTW.view(batch, time, self.score_heads, self.score_dim)
        else:
            logits = self.logits_HD
        if self.config.compute_dtype == "float32":
            logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 under autocast otherwise
        scores = ACTIVATIONS[self.config.activation](logits)
        if self.config.heads == "shared" and self.score_heads > 1:
            scores = scores.mean(dim=-2, keepdim=True)  # "we average over the query head dimension" (section 4.2)
        return scores

    def forward(self, y_BTHD: Tensor, logits_BTW: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        if self.config.kind == "rmsnorm":
            return self.norm(y_BTHD), None
        if self.config.kind == "silu":
            return F.silu(y_BTHD), None
        if self.config.kind == "scale":
            return y_BTHD * self.constant, None
        scores = self.scores(logits_BTW, y_BTHD.shape[0], y_BTHD.shape[1])
        if self.config.compute_dtype == "float32":
            y_wide = y_BTHD.to(scores.dtype)
            gated = y_wide + scores if self.config.form == "additive" else y_wide * scores
            return gated.to(y_BTHD.dtype), scores
        if self.config.form == "additive":
            return y_BTHD + scores, scores
        return y_BTHD * scores, scores
