"""Top-k routing, the expert mixture and the auxiliary losses of the MoE FFN."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from gatelab.config import MoEConfig
from gatelab.model.moe import MoEFeedForward


def _moe(n_experts: int = 6, top_k: int = 2) -> MoEFeedForward:
    moe = MoEFeedForward(16, MoEConfig(n_experts=n_experts, top_k=top_k, expert_hidden=8))
    torch.nn.init.normal_(moe.w_gate_up_EDF, std=0.2)
    torch.nn.init.normal_(moe.w_down_EFD, std=0.2)
    return moe


def test_each_token_goes_to_exactly_top_k_distinct_experts():
    moe, x = _moe(top_k=3), torch.randn(40, 16)
    experts, weights, _ = moe.route(x)
    assert experts.shape == (40, 3)
    assert all(len(set(row.tolist())) == 3 for row in experts)
    torch.testing.assert_close(weights.sum(-1), torch.ones(40))


def test_output_is_the_weighted_sum_of_the_chosen_experts():
    moe, x = _moe(), torch.randn(3, 5, 16)
    out, aux = moe(x)
    experts, weights, _ = moe.route(x.reshape(-1, 16))
    expected = torch.stack([
        sum(w * moe.expert(int(e), token[None])[0] for e, w in zip(experts[n], weights[n]))
        for n, token in enumerate(x.reshape(-1, 16))
    ])
    torch.testing.assert_close(out.reshape(-1, 16), expected, rtol=1e-5, atol=1e-6)
    assert all(torch.isfinite(v) for v in aux.values())


def test_aux_losses_have_known_values_for_a_uniform_router():
    moe = _moe(n_experts=8, top_k=2)
    torch.nn.init.zeros_(moe.router.weight)  # every expert equally likely
    _, aux = moe(torch.randn(2, 6, 16))
    assert math.isclose(aux["load_balance"].item(), 1.0, rel_tol=1e-6)  # perfectly balanced probabilities
    assert math.isclose(aux["z_loss"].item(), math.log(8) ** 2, rel_tol=1e-6)


def test_load_balance_grows_when_the_router_collapses():
    moe = _moe(n_experts=4, top_k=1)
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[0] = 5.0  # expert 0 wins for inputs with a positive sum
    x = torch.rand(32, 16)
    _, aux = moe(x.view(4, 8, 16))
    assert aux["load_balance"].item() > 3.0
    loss = aux["load_balance"] + F.mse_loss(moe(x.view(4, 8, 16))[0], x.view(4, 8, 16))
    loss.backward()
    assert torch.isfinite(moe.router.weight.grad).all() and moe.router.weight.grad.abs().sum() > 0
