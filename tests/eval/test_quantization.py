"""W8A8 fake quantisation against the formula, its undoing, and the outlier effect it is there to measure."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gatelab.eval.metrics import domain_perplexities
from gatelab.eval.quantization import fake_quantize_int8, w8a8_fake_quantized, w8a8_perplexities
from gatelab.model import build_model
from tests.helpers import micro_config

V = 61  # micro_config's vocabulary


def reference_int8(x: torch.Tensor) -> torch.Tensor:
    """Symmetric per-tensor int8, written from the formula: s = max|x| / 127, round(x / s) in [-127, 127], times s."""
    scale = x.abs().max() / 127
    return torch.round(x / scale).clamp(-127, 127) * scale


def test_fake_quantisation_is_the_formula():
    x = torch.randn(64, 48, generator=torch.Generator().manual_seed(0)) * 3
    quantised = fake_quantize_int8(x)
    assert torch.equal(quantised, reference_int8(x))
    scale = x.abs().max() / 127
    assert (quantised / scale).round().unique().numel() <= 255  # on the int8 grid
    assert quantised.abs().max() == x.abs().max()  # the largest value is exact, by the choice of scale
    assert torch.equal(fake_quantize_int8(torch.zeros(3, 4)), torch.zeros(3, 4))  # no 0/0


def test_a_fake_quantised_linear_computes_on_int8_weights_and_inputs():
    generator = torch.Generator().manual_seed(1)
    linear = nn.Linear(16, 8)
    x = torch.randn(2, 5, 16, generator=generator)
    x[0, 0, 3] = 40.0  # an outlier: it sets the input's scale, so the small values lose precision
    with w8a8_fake_quantized(linear, keep=()), torch.no_grad():
        quantised = linear(x)
    expected = F.linear(reference_int8(x), reference_int8(linear.weight.detach()), linear.bias.detach())
    torch.testing.assert_close(quantised, expected, rtol=0, atol=1e-6)
    assert not torch.allclose(quantised, linear(x).detach(), atol=1e-3)  # and it is not the full-precision output


@pytest.mark.parametrize("tied", [False, True])
def test_the_model_is_exactly_as_before_afterwards(tied):
    model = build_model(micro_config(tie_embeddings=tied), seed=0)
    ids = torch.randint(0, V, (3, 12), generator=torch.Generator().manual_seed(2))
    parameters = dict(model.named_parameters(remove_duplicate=False))
    values = {name: p.detach().clone() for name, p in model.state_dict().items()}
    with torch.no_grad():
        before = model(ids)
        with w8a8_fake_quantized(model):
            during = model(ids)
            assert model.blocks[0].attn.in_proj.weight is not parameters["blocks.0.attn.in_proj.weight"]
            assert model.lm_head.weight is parameters["lm_head.weight"]  # the final layer stays in full precision
        after = model(ids)
    assert not torch.equal(during, before)
    assert torch.equal(after, before)
    assert dict(model.named_parameters(remove_duplicate=False)).keys() == parameters.keys()
    assert all(p is parameters[name] for name, p in model.named_parameters(remove_duplicate=False))
    assert all(torch.equal(p, values[name]) for name, p in model.state_dict().items())
    assert (model.lm_head.weight is model.embed.weight) == tied
    assert not any(module._forward_pre_hooks for module in model.modules())


def test_the_model_is_restored_when_the_evaluation_inside_fails():
    model = build_model(micro_config(), seed=0)
    weight = model.blocks[1].ffn.down_proj.weight
    with pytest.raises(RuntimeError, match="inside"), w8a8_fake_quantized(model):
        raise RuntimeError("inside")
    assert model.blocks[1].ffn.down_proj.weight is weight
    assert not any(module._forward_pre_hooks for module in model.modules())


def successor_windows(n: int, seed: int, length: int = 14) -> torch.Tensor:
    """Windows of x, x+1, x+2, ... mod V: a rule a micro model learns in a few dozen steps."""
    start = torch.randint(0, V, (n, 1), generator=torch.Generator().manual_seed(seed))
    return (start + torch.arange(length)) % V


def trained_micro_model() -> nn.Module:
    torch.manual_seed(0)
    model = build_model(micro_config(), seed=0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(40):
        windows = successor_windows(16, seed=step + 1)
        loss = F.cross_entropy(model(windows[:, :-1]).transpose(1, 2), windows[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def test_an_activation_outlier_costs_perplexity_under_w8a8_only():
    """One SwiGLU unit's up projection times 1000 and its down projection column over 1000: the same function in
    full precision, but one channel of down_proj's input 1000x larger widens that tensor's int8 scale."""
    model = trained_micro_model()
    heldout = {"successor": successor_windows(16, seed=999)}
    clean_ppl = domain_perplexities(model, heldout)["avg"]
    clean_w8a8 = w8a8_perplexities(model, heldout, batch_size=8)["avg"]
    assert clean_ppl < 2 and clean_w8a8 == pytest.approx(clean_ppl, rel=0.01)  # without outliers int8 is harmless
    ffn, unit, factor = model.blocks[0].ffn, 3, 1000.0
    with torch.no_grad():
        ffn.gate_up_proj.weight[ffn.down_proj.in_features + unit] *= factor
        ffn.down_proj.weight[:, unit] /= factor
    assert domain_perplexities(model, heldout)["avg"] == pytest.approx(clean_ppl, rel=1e-4)
    assert w8a8_perplexities(model, heldout, batch_size=8)["avg"] > 1.5 * clean_w8a8
