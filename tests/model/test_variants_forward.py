"""Every registered variant, on a dense and an MoE micro model: gradients, causality, the training path (SDPA) against
the explicit path the probes use."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gatelab.errors import GatelabError
from gatelab.model import Attention, build_model
from gatelab.variants import VARIANTS, apply_variant
from tests.helpers import Capture, micro_config

torch.set_default_dtype(torch.float32)
CASES = [(variant, ffn) for variant in VARIANTS for ffn in ("dense", "moe")
         if not (ffn == "dense" and "moe." in " ".join(VARIANTS[variant].model_changes))]


def _model(variant: str, ffn: str, seed: int = 0):
    return build_model(apply_variant(micro_config(ffn), variant), seed=seed)


@pytest.mark.parametrize("variant,ffn", CASES)
def test_forward_backward_reaches_every_gate_parameter(variant, ffn, token_ids):
    model = _model(variant, ffn)
    logits, aux = model.forward_with_aux(token_ids)
    loss = F.cross_entropy(logits.flatten(0, 1), token_ids.flatten()) + sum(aux.values(), torch.tensor(0.0))
    loss.backward()
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None, name
        assert torch.isfinite(parameter.grad).all(), name
    gate_gradients = 0
    for module in model.modules():
        if isinstance(module, Attention):
            for block, rows in module.row_blocks().items():
                if block.startswith(("gate", "router")):
                    assert module.in_proj.weight.grad[rows].abs().sum() > 0, (variant, block)
                    gate_gradients += 1
            for name, parameter in module.gates.named_parameters():
                assert parameter.grad.abs().sum() > 0, (variant, name)
                gate_gradients += 1
            for name, parameter in module.named_parameters(recurse=False):  # sink logits, KV biases
                assert parameter.grad.abs().sum() > 0, (variant, name)
    has_gate_params = (any(g.kind not in ("silu", "scale") for g in model.config.gates)
                       or model.config.switch_head is not None)
    assert (gate_gradients > 0) == has_gate_params


@pytest.mark.parametrize("variant,ffn", CASES)
def test_causality(variant, ffn, token_ids):
    model = _model(variant, ffn).eval()
    changed = token_ids.clone()
    changed[:, 6] = (changed[:, 6] + 1) % 61
    with torch.no_grad():
        before, after = model(token_ids), model(changed)
    # MoE experts see a different set of tokens when any token changes, so matmul blocking may differ in the last bit
    torch.testing.assert_close(before[:, :6], after[:, :6], rtol=0, atol=1e-6)
    assert not torch.allclose(before[:, 6:], after[:, 6:])


@pytest.mark.parametrize("variant,ffn", CASES)
def test_sdpa_and_explicit_softmax_agree(variant, ffn, token_ids):
    model = _model(variant, ffn).eval()
    with torch.no_grad():
        fast = model(token_ids)
        probe = Capture()
        slow = model(token_ids, probe=probe)
    torch.testing.assert_close(fast, slow, rtol=0, atol=1e-5)
    probs = probe.tensors[(0, "attention_probs")]
    attn = model.blocks[0].attn
    if attn.weights_sum_to_one:
        torch.testing.assert_close(probs.sum(-1), torch.ones_like(probs[..., 0]))
    elif attn.kind in ("off_by_one", "learnable_sink", "softmax"):  # the rest is on the sink or the KV-bias slot
        assert (probs.sum(-1) < 1).all()
    assert probs.min() >= 0
    assert probs.triu(diagonal=1).abs().max() == 0  # nothing attends to the future


def test_variants_compose():
    config = apply_variant(micro_config(), "g1_elem_sig+g2_head_sig")
    assert [g.position for g in config.gates] == ["g1", "g2"]
    model = build_model(config)
    assert model(torch.zeros(1, 4, dtype=torch.long)).shape == (1, 4, 61)


def test_moe_only_variant_on_dense_model_says_why():
    with pytest.raises(GatelabError, match="has no 'moe' block"):
        apply_variant(micro_config(), "ref_add4experts")


def test_unknown_variant_lists_valid_ids():
    with pytest.raises(GatelabError, match="did you mean g1_elem_sig.*valid variants are baseline"):
        apply_variant(micro_config(), "g1_elem_sigg")
