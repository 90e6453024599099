"""Fine-grained top-k routed SwiGLU experts with the load-balancing loss and the router z-loss (Table 1's backbone).

Shapes: N tokens (B*T flattened), D d_model, E experts, K top-k, F expert hidden width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gatelab.config import MoEConfig


class MoEFeedForward(nn.Module):
    """Softmax router, top-k experts per token, top-k weights renormalised (Qwen-MoE's `norm_topk_prob`).

    Expert weights are stacked (E, ...) so a paper-scale model is built on the meta device in milliseconds.
    """

    def __init__(self, d_model: int, config: MoEConfig):
        super().__init__()
        self.config = config
        E, F_ = config.n_experts, config.expert_hidden
        self.router = nn.Linear(d_model, E, bias=False)
        self.w_gate_up_EDF = nn.Parameter(torch.empty(E, d_model, 2 * F_))  # SwiGLU gate | up, fused
        self.w_down_EFD = nn.Parameter(torch.empty(E, F_, d_model))

    def route(self, x_ND: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(expert ids (N, K), their weights (N, K), router logits (N, E))."""
        logits_NE = self.router(x_ND).float()
        weights_NK, experts_NK = logits_NE.softmax(dim=-1).topk(self.config.top_k, dim=-1)
        if self.config.normalize_top_k:
            weights_NK = weights_NK / weights_NK.sum(dim=-1, keepdim=True)
        return experts_NK, weights_NK, logits_NE

    def expert(self, index: int, x_ND: Tensor) -> Tensor:
        gate_NF, up_NF = (x_ND @ self.w_gate_up_EDF[index]).chunk(2, dim=-1)
        return (F.silu(gate_NF) * up_NF) @ self.w_down_EFD[index]

    def forward(self, x_BTD: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        x_ND = x_BTD.reshape(-1, x_BTD.shape[-1])
        experts_NK, weights_NK, logits_NE = self.route(x_ND)
        out_ND = torch.zeros_like(x_ND)
        for index in range(self.config.n_experts):
            token_ids, slot = (experts_NK == index).nonzero(as_tuple=True)
            if token_ids.numel():
                contribution = self.expert(index, x_ND[token_ids]) * weights_NK[token_ids, slot, None]
                out_ND.index_add_(0, token_ids, contribution.to(out_ND.dtype))
        # Switch-Transformer load balance: E * sum_e (share of routed slots on e) * (mean router probability of e);
        # 1.0 when perfectly balanced. Computed over the whole batch, the "global-batch" LBL at this scale.
        E = self.config.n_experts
        slot_share_E = torch.bincount(experts_NK.flatten(), minlength=E).float() / experts_NK.numel()
        load_balance = E * (slot_share_E * logits_NE.softmax(dim=-1).mean(dim=0)).sum()
        z_loss = torch.logsumexp(logits_NE, dim=-1).pow(2).mean()  # ST-MoE router z-loss
        return out_ND.view_as(x_BTD), {"load_balance": load_balance, "z_loss": z_loss}
