"""The probes on inputs with known answers, and on a real micro model."""

from __future__ import annotations

import math

import pytest
import torch

from gatelab.eval.probes import FirstTokenShareByQuery, ProbeRecorder, probe_model
from gatelab.model import build_model
from gatelab.variants import apply_variant
from tests.helpers import micro_config


def test_first_token_share_of_a_hand_built_pattern():
    T = 5
    probs = torch.zeros(1, 2, T, T)
    probs[..., 0, 0] = 1.0  # query 0 can only see itself
    probs[..., 1:, 0] = 0.25
    probs[..., 1:, 1] = 0.75
    recorder = ProbeRecorder()
    recorder.add(0, "attention_probs", probs)
    assert recorder.per_layer("first_token_share", 1) == [pytest.approx(0.25)]
    assert recorder.per_layer("first_token_share_with_first_query", 1) == [pytest.approx((1 + 4 * 0.25) / 5)]


def test_first_token_share_split_by_query_kind():
    probs = torch.zeros(1, 2, 4, 4)
    probs[..., 0] = torch.tensor([1.0, 0.2, 0.9, 0.4])  # per query; the rest of each row does not matter here
    probs[:, 1, 3, 0] = 0.8  # the second head of query 3
    recorder = FirstTokenShareByQuery()
    recorder.marked_BT = torch.tensor([[True, True, False, False]])  # query 0 is left out even when marked
    recorder.add(0, "attention_probs", probs)
    recorder.add(0, "ffn_residual", torch.ones(1, 4, 8))  # other probes are ignored
    assert recorder.share(True, 1) == pytest.approx(0.2)
    assert recorder.share(False, 1) == pytest.approx((0.9 + (0.4 + 0.8) / 2) / 2)


def test_massive_activation_location_and_breadth():
    recorder = ProbeRecorder()
    hidden = torch.ones(2, 6, 4)
    hidden[1, 0, 2] = -50.0  # the outlier sits on the first token
    recorder.add(0, "ffn_residual", hidden)
    assert recorder.maxima[(0, "ffn_residual")] == 50.0
    assert recorder.max_at_first_token[0] is True
    assert recorder.near_max_shares[0] == [pytest.approx(1 / 12)]
    broad = torch.full((1, 4, 3), 2.0)
    broad[0, 3, 0] = 3.0  # a broad offset: every token is within half of the max
    recorder.add(1, "ffn_residual", broad)
    assert recorder.max_at_first_token[1] is False and recorder.near_max_shares[1] == [1.0]


def test_gate_histogram_and_sparsity_counts():
    recorder = ProbeRecorder()
    y = torch.tensor([1.0, 0.5, 0.02, 0.004]).view(1, 1, 1, 4)
    scores = torch.tensor([0.001, 0.5, 0.3, 0.99]).view(1, 1, 1, 4)
    recorder.add(0, "sdpa_output", y)
    recorder.add(0, "gate_score.g1", scores)
    recorder.add(0, "sdpa_gated_output", y * scores)  # 0.001, 0.25, 0.006, 0.00396
    assert recorder.per_layer("gated_output_below_0.01", 1) == [0.75]
    assert recorder.per_layer("gated_output_below_0.001", 1) == [0.0]
    assert recorder.per_layer("sdpa_output_below_0.01", 1) == [0.25]
    # control: y times the mean score 0.44775 -> 0.448, 0.224, 0.00896, 0.00179
    assert recorder.per_layer("control_output_below_0.01", 1) == [0.5]
    histogram = recorder.histograms[(0, "gate_score.g1")].tolist()
    assert histogram[0] == 1 and histogram[6] == 1 and histogram[10] == 1 and histogram[19] == 1


def test_probe_model_on_a_micro_model():
    ids = torch.randint(0, 61, (2, 12))
    report = probe_model(build_model(apply_variant(micro_config(), "g1_inputindep_sig")), [ids, ids])
    assert report.gate_score == pytest.approx(0.5)  # zero-initialised logits
    assert len(report.first_token_share) == 2 and 0 < report.f_attn < 1
    assert report.max_activation == report.sublayer_max["ffn_residual"]
    assert sum(report.gate_histogram["g1"][0]) == 2 * 4 * 8  # (H, Dk) scores counted once per batch
    summary = report.summary()
    assert {"f_attn", "m_act", "gate_score_mean", "sparsity_gated_output_below_0.01"} <= set(summary)
    assert all(math.isfinite(v) for v in summary.values())
    assert "gate_score_mean" not in probe_model(build_model(micro_config()), [ids]).summary()
