"""A compiled block is one graph: dynamo traces every variant's block whose attention kind is fused without a break
(issue 41: `sdpa_layout` read `storage_offset()`, which split every block into 6 graphs, the baseline's too).
`torch._dynamo.explain` traces without compiling, about a second a variant on the CPU."""

from __future__ import annotations

import pytest
import torch

from gatelab.model import attention_kinds, build_model
from gatelab.variants import VARIANTS, apply_variant
from tests.helpers import micro_config


def _config(variant: str):
    """The dense micro model, or the MoE one for a variant that changes the MoE block."""
    ffn = "moe" if "moe." in " ".join(VARIANTS[variant].model_changes) else "dense"
    return apply_variant(micro_config(ffn), variant)


FUSED = [v for v in VARIANTS if attention_kinds.KINDS[_config(v).attention].fused]


@pytest.mark.parametrize("variant", FUSED)
def test_every_fused_variant_s_block_traces_as_one_graph(variant):
    """The MoE FFN's dispatch syncs with the host once a layer (its expert counts), a break by design: for the
    variants that need an MoE model the attention module alone is traced."""
    torch._dynamo.reset()
    model = build_model(_config(variant))
    x_BTD = torch.randn(2, 10, model.config.d_model)
    rope_TD = model.rotary.cos_sin(10, x_BTD.device)
    block = model.blocks[0] if model.config.ffn == "dense" else model.blocks[0].attn
    explained = torch._dynamo.explain(block)(x_BTD, rope_TD)
    reasons = [str(b.reason).splitlines()[0] for b in explained.break_reasons]
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), reasons


def test_the_fused_cases_include_the_misaligned_layout_and_every_virtual_slot():
    """The copy that a misaligned v needs (a headwise G1 gate's logits widen the row) is among the traced, as are the
    sinks and the KV-bias slot."""
    assert {"baseline", "g1_head_sig", "sink_off_by_one", "sink_learnable", "kv_bias", "ref_add4experts"} <= set(FUSED)
    assert "sigmoid_attn" not in FUSED and "softpick" not in FUSED
