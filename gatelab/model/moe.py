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
        return swiglu(x_ND, self.w_gate_up_EDF[index], self.w_down_EFD[index])

    def forward(self, x_BTD: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        x_ND = x_BTD.reshape(-1, x_BTD.shape[-1])
        experts_NK, weights_NK, logits_NE = self.route(x_ND)
        E, K = self.config.n_experts, self.config.top_k
        # Dispatch: sort the N*K routed slots (S) by expert once, so each expert reads one contiguous slice and the
        # slice sizes are the only values the host needs: one device->host sync per layer, where a `nonzero` per
        # expert synced E times. The stable sort keeps each expert's tokens in ascending order, as that loop had them.
        experts_S = experts_NK.flatten()
        order_S = experts_S.argsort(stable=True)
        token_ids_S = order_S // K
        counts_E = torch.bincount(experts_S, minlength=E)
        # unbind: one autograd node whose backward stacks the E weight gradients; indexing w[e] per expert would
        # zero-fill and add a full (E, ...) gradient E times (about 5 ms more per layer on CPU at tiny-moe's shape).
        y_SD = torch.cat([
            swiglu(x_cD, w_gate_up_DF2, w_down_FD)
            for x_cD, w_gate_up_DF2, w_down_FD in zip(x_ND[token_ids_S].split(counts_E.tolist()),
                                                     self.w_gate_up_EDF.unbind(0), self.w_down_EFD.unbind(0))
        ])
        contribution_SD = y_SD * weights_NK.flatten()[order_S, None]
        # Combine: a token's K contributions are added in ascending expert order, as the per-expert loop added them.
        # On CUDA, index_add_ adds them with atomics in no fixed order unless torch.use_deterministic_algorithms is on
        # (Trainer(deterministic=True)); putting each slot back in its (token, k) place and summing over k is
        # deterministic always, but measured about 5 ms per layer slower on CPU at tiny-moe's shape.
        out_ND = torch.zeros_like(x_ND).index_add_(0, token_ids_S, contribution_SD.to(x_ND.dtype))
        # Switch-Transformer load balance: E * sum_e (share of routed slots on e) * (mean router probability of e);
        # 1.0 when perfectly balanced. Computed over the whole batch, the "global-batch" LBL at this scale.
        slot_share_E = counts_E.float() / experts_NK.numel()
        load_balance = E * (slot_share_E * logits_NE.softmax(dim=-1).mean(dim=0)).sum()
        z_loss = torch.logsumexp(logits_NE, dim=-1).pow(2).mean()  # ST-MoE router z-loss
        return out_ND.view_as(x_BTD), {"load_balance": load_balance, "z_loss": z_loss}


def swiglu(x_ND: Tensor, w_gate_up_DF2: Tensor, w_down_FD: Tensor) -> Tensor:
    """One expert: SwiGLU with its gate and up projections fused into one (D, 2F) matrix."""
    gate_NF, up_NF = (x_ND @ w_gate_up_DF2).chunk(2, dim=-1)
    return (F.silu(gate_NF) * up_NF) @ w_down_FD
