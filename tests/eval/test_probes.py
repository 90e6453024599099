"""The probes on inputs with known answers, and on a real micro model."""

from __future__ import annotations

import math

import pytest
import torch
from scipy import stats as scipy_stats

from gatelab.eval.probes import FirstTokenShareByQuery, ProbeRecorder, ProbeReport, probe_model, sequence_kurtosis
from gatelab.model import build_model
from gatelab.variants import apply_variant
from tests.helpers import Capture, micro_config


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
    names = {"probe/f_attn", "probe/m_act", "probe/gate_score_mean", "probe/sparsity_gated_output_below_0.01"}
    assert names <= set(summary)
    assert all(math.isfinite(v) for v in summary.values())
    # probes.json names them without MLflow's `probe/`
    assert report.to_dict()["summary"] == {name.removeprefix("probe/"): value for name, value in summary.items()}
    assert "probe/gate_score_mean" not in probe_model(build_model(micro_config()), [ids]).summary()


def attention_with_first_token_mean(alpha: float, T: int) -> torch.Tensor:
    """A causal (T, T) attention pattern whose mean attention to token 0 over all T queries is `alpha`: query 0 sees
    only itself, the others put the same share on token 0 and spread the rest over the tokens they see."""
    on_first = (alpha * T - 1) / (T - 1)
    probs = torch.zeros(T, T)
    probs[0, 0] = 1.0
    for query in range(1, T):
        probs[query, 0] = on_first
        probs[query, 1: query + 1] = (1 - on_first) / query
    return probs


def test_sink_rate_counts_heads_over_the_threshold_per_sequence_and_layer():
    """Gu et al.'s sink rate at epsilon 0.3: (sequence, head) pairs of each layer whose alpha_1 exceeds it."""
    T = 10
    # layer -> sequence -> head's alpha_1; 0.1 = 1/T is a head that attends to token 0 from query 0 only
    alphas = {0: [[1.0, 0.29], [0.31, 0.1]], 1: [[0.29, 0.29], [1.0, 0.29]]}
    recorder = ProbeRecorder()
    for layer, by_sequence in alphas.items():
        probs = torch.stack([torch.stack([attention_with_first_token_mean(alpha, T) for alpha in heads])
                             for heads in by_sequence])  # (B, H, T, T)
        assert torch.allclose(probs.sum(-1), torch.ones(2, 2, T))
        torch.testing.assert_close(probs[..., 0].mean(-1), torch.tensor(by_sequence))
        recorder.add(layer, "attention_probs", probs)
    rates = recorder.per_layer("sink_heads", 2)
    assert rates == [2 / 4, 1 / 4]  # an all-on-token-0 head and a 0.31 head count; 0.29 and 0.1 do not
    report = ProbeReport(n_layers=2, first_token_share=[0.0] * 2, first_token_share_with_first_query=[0.0] * 2,
                         max_activation=[1.0, 2.0], max_activation_at_first_token=[False] * 2,
                         tokens_near_max_share=[0.0] * 2, sublayer_max={}, sink_rate=rates)
    summary = report.summary()
    assert summary["probe/sink_rate/layer0"] == 0.5 and summary["probe/sink_rate/layer1"] == 0.25
    assert summary["probe/sink_rate"] == 3 / 8  # the share of all 8 (sequence, layer, head) triples


def test_kurtosis_is_pearsons_not_excess():
    generator = torch.Generator().manual_seed(0)
    gaussian = torch.randn(2, 200_000, generator=generator)
    assert sequence_kurtosis(gaussian).tolist() == pytest.approx([3.0, 3.0], abs=0.05)  # not 0: Pearson's
    laplace = torch.distributions.Laplace(0.0, 1.0).sample((1, 200_000))
    assert sequence_kurtosis(laplace).item() == pytest.approx(6.0, abs=0.2)
    outlier = torch.randn(1, 10_000, generator=generator)
    outlier[0, 17] = 1000.0  # one massive activation among 10^4 ordinary ones
    assert sequence_kurtosis(outlier).item() > 1000
    for sample in (gaussian, laplace, outlier):  # against scipy's (population variance; ours is Bessel-corrected)
        n = sample.shape[1]
        expected = scipy_stats.kurtosis(sample.double().numpy(), axis=1, fisher=False) * ((n - 1) / n) ** 2
        assert sequence_kurtosis(sample).numpy() == pytest.approx(expected, rel=1e-9)
    assert sequence_kurtosis(torch.full((1, 8), 2.0)).item() == 0.0  # a constant row: no division by zero


def test_kurtosis_and_largest_activation_of_each_block_output_on_a_micro_model():
    """Per block: the mean over sequences of each sequence's kurtosis over its T x D output values, and the exact
    largest |value| (M-Act's); over blocks their max (and kurtosis' mean)."""
    model = build_model(micro_config(), seed=0)
    batches = [torch.randint(0, 61, (3, 12), generator=torch.Generator().manual_seed(s)) for s in (1, 2)]
    report = probe_model(model, batches)
    outputs = {0: [], 1: []}
    for ids in batches:
        capture = Capture()
        model(ids, probe=capture)
        for layer in outputs:
            outputs[layer].append(capture.tensors[(layer, "ffn_residual")])
    summary = report.summary()
    for layer, tensors in outputs.items():
        values = torch.cat(tensors)  # (6, 12, 32)
        largest = values.abs().max().item()
        assert summary[f"probe/max_abs_activation/block{layer}"] == largest == report.max_activation[layer]
        per_sequence = sequence_kurtosis(values.flatten(start_dim=1))
        assert summary[f"probe/kurtosis/block{layer}"] == pytest.approx(per_sequence.mean().item(), rel=1e-12)
    assert summary["probe/max_abs_activation"] == max(report.max_activation)
    assert summary["probe/kurtosis_max"] == max(report.kurtosis) and summary["probe/kurtosis_mean"] == pytest.approx(
        sum(report.kurtosis) / 2)
    sink_rates = ("probe/sink_rate", "probe/sink_rate/layer0", "probe/sink_rate/layer1")
    assert all(math.isfinite(summary[name]) for name in sink_rates)
    assert 0 <= summary["probe/sink_rate"] <= 1


def test_the_attention_output_rms_at_init_follows_the_gate_and_the_output_projection():
    from gatelab.config import ModelConfig
    from gatelab.eval.probes import attention_output_rms

    # One layer: deeper ones read a residual stream the first layer's scale has already changed.
    base = ModelConfig(vocab_size=64, n_layers=1, d_model=32, n_heads=4, n_kv_heads=2, head_dim=8, ffn="dense",
                       ffn_hidden=64)
    ids_BT = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    scale = {v: attention_output_rms(build_model(apply_variant(base, v), seed=0), ids_BT)
             for v in ("baseline", "ctrl_scale_0p5", "ctrl_oproj_init_0p5", "g1_elem_2sig_zeroinit")}
    # x0.5 on the SDPA output halves what attention adds; so does W_O at half the std; a gate open at 1 changes nothing
    assert scale["ctrl_scale_0p5"] == pytest.approx(0.5 * scale["baseline"], rel=1e-5)
    assert scale["ctrl_oproj_init_0p5"] == pytest.approx(0.5 * scale["baseline"], rel=1e-5)
    assert scale["g1_elem_2sig_zeroinit"] == pytest.approx(scale["baseline"], rel=1e-5)
