"""The gate formulas, checked against explicit computations from the same weights."""

from __future__ import annotations

import pytest
import torch

from gatelab.model import build_model, gates
from gatelab.model.attention import Attention
from gatelab.variants import VARIANTS, apply_variant
from tests.helpers import Capture, micro_config

B, T, D, H, DK = 2, 7, 32, 4, 8


def _attention(variant: str, seed: int = 0) -> Attention:
    return build_model(apply_variant(micro_config(), variant), seed=seed).blocks[0].attn.eval()


def _x() -> torch.Tensor:
    return torch.randn(B, T, D, generator=torch.Generator().manual_seed(1))


def _run(attn: Attention, x: torch.Tensor) -> tuple[torch.Tensor, Capture]:
    probe = Capture()
    with torch.no_grad():
        out = attn(x, build_model(micro_config()).rotary.cos_sin(x.shape[1], x.device), probe)
    return out, probe


def test_fused_g1_equals_explicit_gate_from_the_same_weights():
    attn, x = _attention("g1_elem_sig"), _x()
    out, probe = _run(attn, x)
    w_theta = attn.in_proj.weight[attn.row_blocks()["gate0_g1"]]  # (H*Dk, D)
    y = probe.tensors[(0, "sdpa_output")].reshape(B, T, H * DK)
    expected = attn.o_proj(y * torch.sigmoid(x @ w_theta.T))
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-6)


def test_gate_rows_do_not_change_the_attention_itself():
    """The gated model's Y equals the baseline's Y: same seed, so q, k, v rows are the same values (common init)."""
    x = _x()
    _, gated = _run(_attention("g1_elem_sig"), x)
    _, plain = _run(_attention("baseline"), x)
    torch.testing.assert_close(gated.tensors[(0, "sdpa_output")], plain.tensors[(0, "sdpa_output")])


def test_input_independent_gate_halves_the_baseline_output_at_init():
    x = _x()
    gated, _ = _run(_attention("g1_inputindep_sig"), x)
    plain, _ = _run(_attention("baseline"), x)
    torch.testing.assert_close(gated, 0.5 * plain, rtol=0, atol=1e-6)


def _gate_ratio(variant: str) -> torch.Tensor:
    _, probe = _run(_attention(variant), _x())
    return probe.tensors[(0, "sdpa_gated_output")] / probe.tensors[(0, "sdpa_output")]  # (B, T, H, Dk)


def test_headwise_gate_is_constant_across_head_dim():
    ratio = _gate_ratio("g1_head_sig")
    torch.testing.assert_close(ratio, ratio[..., :1].expand_as(ratio), rtol=1e-5, atol=1e-6)
    assert ratio[..., 0].std() > 1e-4  # but it differs between heads and tokens


def test_head_shared_gate_is_equal_across_heads():
    ratio = _gate_ratio("g1_elem_sig_shared")
    torch.testing.assert_close(ratio, ratio[:, :, :1].expand_as(ratio), rtol=1e-5, atol=1e-6)
    assert ratio[:, :, 0].std() > 1e-4


def test_head_shared_score_is_the_mean_of_per_head_scores():
    attn, x = _attention("g1_elem_sig_shared"), _x()
    _, probe = _run(attn, x)
    logits = (x @ attn.in_proj.weight[attn.row_blocks()["gate0_g1"]].T).view(B, T, H, DK)
    expected = torch.sigmoid(logits).mean(dim=2, keepdim=True)
    torch.testing.assert_close(probe.tensors[(0, "gate_score.g1")], expected)


def test_elementwise_g2_gates_each_kv_head_from_its_value_token():
    attn, x = _attention("g2_elem_sig"), _x()
    _, probe = _run(attn, x)
    scores = probe.tensors[(0, "gate_score.g2")]
    assert scores.shape == (B, T, 2, DK)  # one gate per KV head, before the KV heads are repeated
    w_theta = attn.in_proj.weight[attn.row_blocks()["gate0_g2"]]
    torch.testing.assert_close(scores, torch.sigmoid(x @ w_theta.T).view(B, T, 2, DK))


def test_additive_silu_and_ns_sigmoid_formulas():
    x = _x()
    for variant, activation, additive in [
        ("g1_elem_silu_add", torch.nn.functional.silu, True),
        ("g1_elem_nssig", lambda z: 0.5 + 0.5 * torch.sigmoid(z), False),
        ("g1_elem_id_add", lambda z: z, True),
    ]:
        attn = _attention(variant)
        _, probe = _run(attn, x)
        y = probe.tensors[(0, "sdpa_output")]
        score = activation(x @ attn.in_proj.weight[attn.row_blocks()["gate0_g1"]].T).view(B, T, H, DK)
        expected = y + score if additive else y * score
        torch.testing.assert_close(probe.tensors[(0, "sdpa_gated_output")], expected, msg=variant)


def test_switch_v_1top1_equals_g2_head_sig():
    """The paper: 'Switch v 1top1 is equivalent to v Headwise Gate (Table 1 row 11)'."""
    switch = build_model(apply_variant(micro_config(), "switch_v_1top1"), seed=0).eval()
    gate = build_model(apply_variant(micro_config(), "g2_head_sig"), seed=3).eval()
    gate.load_state_dict(switch.state_dict())  # same shapes: router rows take the gate rows' place
    ids = torch.randint(0, 61, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(switch(ids), gate(ids))


def test_common_random_numbers_share_every_common_parameter():
    plain = build_model(apply_variant(micro_config(), "baseline"), seed=5)
    gated = build_model(apply_variant(micro_config(), "g1_elem_sig"), seed=5)
    for name, value in plain.state_dict().items():
        other = gated.state_dict()[name]
        if name.endswith("in_proj.weight"):
            other = other[: value.shape[0]]  # q | k | v come first; the gate rows follow
        torch.testing.assert_close(value, other, rtol=0, atol=0, msg=name)
    assert not torch.equal(build_model(micro_config(), seed=6).embed.weight, plain.embed.weight)


def test_the_constant_control_is_half_the_baseline_output_from_the_same_weights():
    x = _x()
    control, _ = _run(_attention("ctrl_scale_0p5"), x)
    plain, _ = _run(_attention("baseline"), x)
    torch.testing.assert_close(control, 0.5 * plain, rtol=0, atol=1e-6)


def test_the_silu_matched_control_scales_by_the_measured_rms_of_silu_gate_scores_at_init():
    """The constant is computed from d_model and init_std; the SiLU gate's scores measured over many tokens of real
    pre-norm hidden states (RMSNorm output, mean square 1) agree with it."""
    import math

    config = micro_config(d_model=256, head_dim=64)
    model = build_model(apply_variant(config, "g1_elem_silu"), seed=0)
    ids = torch.randint(0, config.vocab_size, (8, 64), generator=torch.Generator().manual_seed(2))
    probe = Capture()
    with torch.no_grad():
        model(ids, probe)
    measured = probe.tensors[(0, "gate_score.g1")].pow(2).mean().sqrt().item()
    control = build_model(apply_variant(config, "ctrl_scale_silu"), seed=0).blocks[0].attn.gates[0].constant
    assert control == pytest.approx(measured, rel=0.05)
    assert control == pytest.approx(gates.silu_gate_init_rms(math.sqrt(256) * 0.02))


def test_silu_gate_init_rms_against_sampling_and_its_small_logit_limit():
    z = torch.randn(2_000_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 0.7
    assert gates.silu_gate_init_rms(0.7) == pytest.approx(torch.nn.functional.silu(z).pow(2).mean().sqrt().item(),
                                                         rel=2e-3)
    assert gates.silu_gate_init_rms(1e-3) == pytest.approx(1e-3 / 2, rel=1e-3)  # silu(z) ~ z / 2 near 0


def test_the_init_matched_control_halves_only_the_output_projection_at_init():
    plain = build_model(apply_variant(micro_config(), "baseline"), seed=3)
    control = build_model(apply_variant(micro_config(), "ctrl_oproj_init_0p5"), seed=3)
    for (name, a), (_, b) in zip(plain.named_parameters(), control.named_parameters()):
        expected = 0.5 * a if name.endswith("o_proj.weight") else a
        torch.testing.assert_close(b, expected, rtol=0, atol=0, msg=name)


def test_a_scale_needs_kind_scale_and_kind_scale_needs_a_scale():
    from pydantic import ValidationError

    from gatelab.config import GateConfig

    with pytest.raises(ValidationError, match="scale is for kind 'scale'"):
        GateConfig(position="g1", scale=0.5)
    with pytest.raises(ValidationError, match="silu_gate_init"):
        GateConfig(position="g1", kind="scale")
    with pytest.raises(ValidationError):
        GateConfig(position="g1", kind="scale", scale="half")


# --- gates the paper did not train: softplus, 2 sigmoid from zero, a float32 sigmoid ---------------------------------

REFERENCE_ACTIVATIONS = {
    "sigmoid": lambda z: 1 / (1 + torch.exp(-z)),
    "softplus": lambda z: torch.log(1 + torch.exp(z)),
    "two_sigmoid": lambda z: 2 / (1 + torch.exp(-z)),
}
NEW_GATE_VARIANTS = [v.id for v in VARIANTS.values() if any(
    g.activation in ("softplus", "two_sigmoid") or g.compute_dtype != "model" or g.init != "normal" for g in v.gates)]


@pytest.mark.parametrize("variant", NEW_GATE_VARIANTS)
def test_new_gates_equal_their_formula_forward_and_backward_in_float64(variant):
    attn = _attention(variant).double()
    gate_config = attn.gates[0].config
    rows = attn.row_blocks()["gate0_g1"]
    with torch.no_grad():  # random gate rows, so a zero-initialised gate is checked away from its start too
        attn.in_proj.weight[rows] = torch.randn(H * DK, D, generator=torch.Generator().manual_seed(3),
                                                dtype=torch.float64) * 0.3
    x = _x().double()
    rope = tuple(t.double() for t in build_model(micro_config()).rotary.cos_sin(T, x.device))
    got = attn(x, rope)
    _, probe = _run(attn, x)  # the explicit path's Y (float64), as the reference's input
    y = probe.tensors[(0, "sdpa_output")].reshape(B, T, H * DK)
    w_theta = attn.in_proj.weight[rows].detach().clone().requires_grad_()
    expected = attn.o_proj(y * REFERENCE_ACTIVATIONS[gate_config.activation](x @ w_theta.T))
    assert got.dtype == torch.float64 and (got - expected).abs().max() < 1e-6
    weight = torch.randn(B, T, D, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    (got * weight).sum().backward()
    (expected * weight).sum().backward()
    got_grad = attn.in_proj.weight.grad[rows]
    assert (got_grad - w_theta.grad).abs().max() < 1e-6 and w_theta.grad.abs().max() > 1e-3


@pytest.mark.parametrize("activation", ["sigmoid", "softplus"])
def test_a_float32_gate_computes_score_and_product_in_float32_under_bf16(activation):
    from gatelab.config import GateConfig

    generator = torch.Generator().manual_seed(0)
    y = torch.randn(B, T, H, DK, generator=generator).bfloat16()
    logits = torch.randn(B, T, H * DK, generator=generator).bfloat16()
    act = {"sigmoid": torch.sigmoid, "softplus": torch.nn.functional.softplus}[activation]
    wide = gates.Gate(GateConfig(position="g1", activation=activation, compute_dtype="float32"), H, DK)
    model_dtype = gates.Gate(GateConfig(position="g1", activation=activation), H, DK)
    got, scores = wide(y, logits)
    assert scores.dtype == torch.float32 and got.dtype == torch.bfloat16
    assert torch.equal(got, (y.float() * act(logits.float()).view(B, T, H, DK)).bfloat16())
    narrow, _ = model_dtype(y, logits)
    assert torch.equal(narrow, y * act(logits).view(B, T, H, DK))
    assert not torch.equal(got, narrow)  # bf16 rounds the score before the product


def test_two_sigmoid_from_zero_starts_as_the_ungated_model_exactly():
    ids = torch.randint(0, 61, (2, 9), generator=torch.Generator().manual_seed(6))
    for ffn in ("dense", "moe"):
        plain = build_model(apply_variant(micro_config(ffn), "baseline"), seed=7)
        gated = build_model(apply_variant(micro_config(ffn), "g1_elem_2sig_zeroinit"), seed=7)
        with torch.no_grad():
            assert torch.equal(gated(ids), plain(ids)), ffn
        for block_plain, block_gated in zip(plain.blocks, gated.blocks):
            rows = block_gated.attn.row_blocks()
            assert block_gated.attn.in_proj.weight[rows["gate0_g1"]].abs().max() == 0


@pytest.mark.parametrize("variant", NEW_GATE_VARIANTS + ["sink_learnable", "kv_bias", "sink_off_by_one"])
def test_new_variants_share_every_baseline_parameter_value(variant):
    """Common random numbers: a new gate's rows or a new attention parameter shift no other parameter's values."""
    plain = build_model(apply_variant(micro_config(), "baseline"), seed=5).state_dict()
    other = build_model(apply_variant(micro_config(), variant), seed=5).state_dict()
    for name, value in plain.items():
        torch.testing.assert_close(other[name][: value.shape[0]], value, rtol=0, atol=0, msg=name)
