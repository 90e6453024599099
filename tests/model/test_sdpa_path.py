"""No gate forces SDPA off its fast kernels: every variant hands `F.scaled_dot_product_attention` what the flash (and
cuDNN) kernels take under mixed precision, so on a GPU no variant's step falls back to the math path, which makes the
(B, H, T, T) scores whole (small preset: 3.2 GB a layer in fp32). The attention kinds without a fused kernel (sigmoid,
softpick: `Attention.uses_sdpa` false, said in their variant notes) make no SDPA call and are skipped."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gatelab.model import attention_kinds, build_model
from gatelab.variants import VARIANTS, apply_variant
from tests.helpers import micro_config

CASES = [(variant, ffn) for variant in VARIANTS for ffn in ("dense", "moe")
         if not (ffn == "dense" and "moe." in " ".join(VARIANTS[variant].model_changes))]


def flash_refusals(q_BHTD: torch.Tensor, k_BKTD: torch.Tensor, v_BKTD: torch.Tensor, attn_mask=None,
                   dropout_p: float = 0.0, is_causal: bool = False, scale=None, enable_gqa: bool = False) -> list[str]:
    """What in one SDPA call the CUDA flash kernel refuses (torch's sdp_utils checks that a CPU can evaluate): the
    reasons it would take another path."""
    reasons = []
    if {q_BHTD.dtype, k_BKTD.dtype, v_BKTD.dtype} - {torch.bfloat16} and \
            {q_BHTD.dtype, k_BKTD.dtype, v_BKTD.dtype} - {torch.float16}:
        reasons.append(f"dtypes {q_BHTD.dtype}, {k_BKTD.dtype}, {v_BKTD.dtype}: flash takes all bf16 or all fp16")
    if attn_mask is not None:
        reasons.append("an attention mask: flash takes is_causal only")
    if any(t.dim() != 4 for t in (q_BHTD, k_BKTD, v_BKTD)):
        reasons.append("not 4-D")
    head_dim = q_BHTD.shape[-1]
    if head_dim % 8 or head_dim > 256 or k_BKTD.shape[-1] != head_dim or v_BKTD.shape[-1] != head_dim:
        reasons.append(f"head dim {head_dim}: flash takes a multiple of 8 up to 256, the same for q, k and v")
    if any(t.stride(-1) != 1 for t in (q_BHTD, k_BKTD, v_BKTD)):
        reasons.append("a last dimension that is not contiguous")
    heads, kv_heads = q_BHTD.shape[1], k_BKTD.shape[1]
    if heads != kv_heads and (not enable_gqa or heads % kv_heads):
        reasons.append(f"{heads} query heads on {kv_heads} KV heads without enable_gqa")
    if dropout_p:
        reasons.append("dropout")
    return reasons


@pytest.mark.parametrize("variant,ffn", CASES)
def test_every_variant_hands_sdpa_what_its_flash_kernel_takes_under_bf16_autocast(variant, ffn, monkeypatch,
                                                                                  token_ids):
    calls = []
    real_sdpa = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append(flash_refusals(*args, **kwargs))
        return real_sdpa(*args, **kwargs)

    monkeypatch.setattr(attention_kinds.F, "scaled_dot_product_attention", spy)
    model = build_model(apply_variant(micro_config(ffn), variant))
    if not model.blocks[0].attn.uses_sdpa:
        pytest.skip(f"{model.config.attention} attention has no fused kernel: its training path is explicit")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(token_ids).float().sum().backward()
    assert len(calls) == model.config.n_layers
    assert calls == [[]] * len(calls), calls[0]


def test_the_check_refuses_what_flash_refuses():
    """The check itself can fail: fp32 inputs, a mask and GQA without enable_gqa are each named."""
    q_BHTD, k_BKTD = torch.zeros(1, 4, 8, 64), torch.zeros(1, 2, 8, 64)
    reasons = flash_refusals(q_BHTD, k_BKTD, k_BKTD, attn_mask=torch.ones(8, 8, dtype=torch.bool))
    assert len(reasons) == 3 and "dtypes" in reasons[0] and "mask" in reasons[1] and "enable_gqa" in reasons[2]
    assert flash_refusals(q_BHTD.bfloat16(), k_BKTD.bfloat16(), k_BKTD.bfloat16(), is_causal=True,
                          enable_gqa=True) == []


@pytest.mark.gpu
@pytest.mark.parametrize("variant", [v for v, ffn in CASES if ffn == "dense"])
def test_on_a_gpu_every_variant_trains_with_sdpa_s_flash_or_cudnn_kernel_alone(variant):
    """SDPA with only the fast kernels allowed raises rather than falling back to the math path."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    config = micro_config("dense", head_dim=64)
    model = build_model(apply_variant(config, variant), device="cuda")
    if not model.blocks[0].attn.uses_sdpa:
        pytest.skip(f"{model.config.attention} attention has no fused kernel: its training path is explicit")
    token_ids = torch.randint(0, config.vocab_size, (2, 128), device="cuda")
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION]), \
            torch.autocast("cuda", dtype=torch.bfloat16):
        model(token_ids).float().sum().backward()
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())
