"""Top-k routing, the expert mixture and the auxiliary losses of the MoE FFN."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from gatelab.config import MoEConfig
from gatelab.model.moe import MoEFeedForward


def _moe(n_experts: int = 6, top_k: int = 2, normalize_top_k: bool = True) -> MoEFeedForward:
    moe = MoEFeedForward(16, MoEConfig(n_experts=n_experts, top_k=top_k, expert_hidden=8,
                                       normalize_top_k=normalize_top_k))
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


def _per_expert_reference(moe: MoEFeedForward, x_BTD: torch.Tensor) -> torch.Tensor:
    """The dispatch the sorted one replaced: a mask per expert, its tokens gathered, run and added back."""
    x_ND = x_BTD.reshape(-1, x_BTD.shape[-1])
    experts_NK, weights_NK, _ = moe.route(x_ND)
    out_ND = torch.zeros_like(x_ND)
    for index in range(moe.config.n_experts):
        token_ids, slot = (experts_NK == index).nonzero(as_tuple=True)
        gate_NF, up_NF = (x_ND[token_ids] @ moe.w_gate_up_EDF[index]).chunk(2, dim=-1)
        expert_ND = (F.silu(gate_NF) * up_NF) @ moe.w_down_EFD[index]
        out_ND = out_ND.index_add(0, token_ids, expert_ND * weights_NK[token_ids, slot, None])
    return out_ND.view_as(x_BTD)


@pytest.mark.parametrize("n_experts,top_k,normalize_top_k,tokens", [
    (6, 2, True, 21), (8, 3, False, 21), (16, 4, True, 64),
    (8, 1, True, 3),  # at most 3 of 8 experts get a token: empty slices must give zero gradients, not errors
])
def test_sorted_dispatch_matches_the_per_expert_loop_in_value_and_gradient(n_experts, top_k, normalize_top_k, tokens):
    torch.manual_seed(n_experts + top_k)
    x = torch.randn(1, tokens, 16)
    results = []
    for forward in (lambda m, x: m(x)[0], _per_expert_reference):
        torch.manual_seed(0)
        moe = _moe(n_experts, top_k, normalize_top_k)
        torch.nn.init.normal_(moe.router.weight, std=0.5)
        x_leaf = x.clone().requires_grad_()
        out = forward(moe, x_leaf)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()  # every output gets its own weight
        results.append((out.detach(), x_leaf.grad, {n: p.grad for n, p in moe.named_parameters()}))
    (out, x_grad, grads), (ref_out, ref_x_grad, ref_grads) = results
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x_grad, ref_x_grad, rtol=1e-5, atol=1e-5)
    assert grads.keys() == ref_grads.keys() == {"router.weight", "w_gate_up_EDF", "w_down_EFD"}
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-5, atol=1e-5, msg=name)


class _HostReads(TorchFunctionMode):
    """Counts the calls that bring a tensor's values to the host: each one waits for the device on a GPU."""

    READS = {"item", "tolist", "nonzero", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__"}

    def __init__(self):
        super().__init__()
        self.calls: Counter[str] = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", None) in self.READS:
            self.calls[func.__name__] += 1
        return func(*args, **(kwargs or {}))


def test_the_forward_reads_the_device_once_for_all_experts():
    moe, x = _moe(n_experts=8, top_k=2), torch.randn(2, 9, 16)
    with _HostReads() as reads:
        moe(x)
    assert reads.calls == {"tolist": 1}  # the per-expert slice sizes; the per-expert loop called nonzero 8 times
