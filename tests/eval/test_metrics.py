"""Perplexity and loss-spike metrics on models whose answers are known in closed form."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gatelab.eval.metrics import (
    bits_per_byte_by_domain,
    bits_per_byte_of,
    domain_perplexities,
    domain_window_nlls,
    long_context_perplexity,
    perplexities_by_domain,
    perplexity,
    perplexity_of,
    sequence_nll,
    window_nlls,
)

V = 37


class ZeroLogits(nn.Module):
    """Uniform over the vocabulary: every token costs log V nats, so the perplexity is exactly V."""

    def forward(self, input_ids_BT: Tensor) -> Tensor:
        return torch.zeros(*input_ids_BT.shape, V)


class Successor(nn.Module):
    """Puts logit `boost` on (x + 1) % V and 0 elsewhere: p(successor) = e^boost / (e^boost + V - 1)."""

    def __init__(self, boost: float) -> None:
        super().__init__()
        self.boost = boost

    def forward(self, input_ids_BT: Tensor) -> Tensor:
        return self.boost * F.one_hot((input_ids_BT + 1) % V, V).float()


class SuccessorBeyond(nn.Module):
    """Uniform at positions < `from_position`, a near-certain successor predictor from there on."""

    def __init__(self, from_position: int) -> None:
        super().__init__()
        self.from_position = from_position

    def forward(self, input_ids_BT: Tensor) -> Tensor:
        logits_BTV = 1e4 * F.one_hot((input_ids_BT + 1) % V, V).float()
        logits_BTV[:, : self.from_position] = 0.0
        return logits_BTV


def counting_windows(n: int, length: int, step: int = 1) -> Tensor:
    """(n, length) windows of x_{t+1} = x_t + step (mod V), each from its own offset."""
    return (torch.arange(n)[:, None] + step * torch.arange(length)[None, :]) % V


def p_successor(boost: float) -> float:
    return math.exp(boost) / (math.exp(boost) + V - 1)


def test_uniform_model_perplexity_is_vocab_size_in_every_window_format():
    windows_NT1 = torch.randint(V, (10, 17), generator=torch.Generator().manual_seed(0))
    pairs_1d = [(w[:-1], w[1:]) for w in windows_NT1]
    pairs_2d = [(windows_NT1[:6, :-1], windows_NT1[:6, 1:]), (windows_NT1[6:, :-1], windows_NT1[6:, 1:])]
    for windows in (windows_NT1, pairs_1d, pairs_2d):
        for batch_size in (1, 4, 100):
            assert perplexity(ZeroLogits(), windows, batch_size) == pytest.approx(V, rel=1e-4)


def test_known_probability_gives_known_perplexity():
    boost = 2.0
    assert perplexity(Successor(boost), counting_windows(8, 33), 3) == pytest.approx(1 / p_successor(boost), rel=1e-5)
    assert perplexity(Successor(1e4), counting_windows(8, 33), 3) == pytest.approx(1.0, abs=1e-6)


def test_sequence_nll_skips_ignored_targets():
    windows_NT1 = torch.randint(V, (3, 9), generator=torch.Generator().manual_seed(1))
    targets_BT = windows_NT1[:, 1:].clone()
    targets_BT[0, :5] = -100
    targets_BT[2, -1] = -100
    total_nll, n_tokens = sequence_nll(ZeroLogits(), windows_NT1[:, :-1], targets_BT)
    assert n_tokens == 3 * 8 - 6
    assert total_nll == pytest.approx(n_tokens * math.log(V), rel=1e-6)


def test_domain_perplexities_average_the_domain_ppls_not_the_tokens():
    boost = 3.0
    by_domain = {
        "counting": counting_windows(4, 17, step=1),  # every target is the favoured successor
        "skipping": counting_windows(12, 17, step=2),  # no target is
    }
    ppl = domain_perplexities(Successor(boost), by_domain, batch_size=5)
    ppl_counting = 1 / p_successor(boost)
    ppl_skipping = math.exp(boost) + V - 1
    assert ppl["counting"] == pytest.approx(ppl_counting, rel=1e-5)
    assert ppl["skipping"] == pytest.approx(ppl_skipping, rel=1e-5)
    assert ppl["avg"] == pytest.approx((ppl_counting + ppl_skipping) / 2, rel=1e-5)

    uniform = domain_perplexities(ZeroLogits(), by_domain, batch_size=5)
    assert uniform == pytest.approx({"counting": V, "skipping": V, "avg": V}, rel=1e-4)


def test_per_window_nlls_give_the_perplexity_of_any_subset_without_another_pass():
    """The held-out pass keeps each window's NLL, so the W8A8 probe's full-precision reference on a subset of the
    windows needs no second full-precision pass."""
    boost = 3.0
    windows = torch.cat([counting_windows(3, 17, step=1), counting_windows(5, 17, step=2)])  # 3 easy, 5 hard
    nll_NT, tokens_N = window_nlls(Successor(boost), windows, batch_size=3)
    assert tokens_N.tolist() == [16] * 8 and nll_NT.shape == (8, 16) and nll_NT.dtype == torch.float64
    easy, hard = -16 * math.log(p_successor(boost)), 16 * math.log(math.exp(boost) + V - 1)
    assert nll_NT.sum(dim=1).tolist() == pytest.approx([easy] * 3 + [hard] * 5, rel=1e-5)
    assert perplexity_of(nll_NT, tokens_N) == pytest.approx(perplexity(Successor(boost), windows, 3), rel=1e-12)
    assert perplexity_of(nll_NT[:3], tokens_N[:3]) == pytest.approx(1 / p_successor(boost), rel=1e-5)
    assert perplexity_of(nll_NT[3::2], tokens_N[3::2]) == pytest.approx(math.exp(boost) + V - 1, rel=1e-5)
    by_domain = domain_window_nlls(Successor(boost), {"easy": windows[:3], "hard": windows[3:]}, batch_size=2)
    assert perplexities_by_domain(by_domain) == pytest.approx(
        domain_perplexities(Successor(boost), {"easy": windows[:3], "hard": windows[3:]}), rel=1e-12)
    with pytest.raises(ValueError, match="no token"):
        perplexity_of(nll_NT[:0], tokens_N[:0])


def test_uniform_prediction_costs_log2_v_bits_a_token_spread_over_its_bytes():
    """ln V nats a token; bpb = total nats / (ln 2 x bytes). A special token (0 bytes, here id 0) counts in neither."""
    bytes_per_token_V = torch.arange(V) % 4  # ids 0, 4, 8, ... stand for no text
    windows = counting_windows(6, 17, step=1)
    nll_NT, _ = window_nlls(ZeroLogits(), windows, batch_size=4)
    targets_NT = windows[:, 1:]
    n_bytes = int(bytes_per_token_V[targets_NT].sum())
    text_tokens = int((bytes_per_token_V[targets_NT] > 0).sum())
    assert 0 < text_tokens < targets_NT.numel()
    expected = text_tokens * math.log(V) / (math.log(2) * n_bytes)
    assert bits_per_byte_of(nll_NT, targets_NT, bytes_per_token_V) == pytest.approx(expected, rel=1e-6)
    one_byte_each = torch.ones(V, dtype=torch.long)  # one byte a token: bits per byte is bits per token, log2 V
    assert bits_per_byte_of(nll_NT, targets_NT, one_byte_each) == pytest.approx(math.log2(V), rel=1e-6)
    ignored_NT = targets_NT.masked_fill(torch.arange(16) < 8, -100)  # ignored targets count in neither
    assert bits_per_byte_of(nll_NT, ignored_NT, one_byte_each) == pytest.approx(math.log2(V), rel=1e-6)
    with pytest.raises(ValueError, match="no text"):
        bits_per_byte_of(nll_NT, targets_NT, torch.zeros(V, dtype=torch.long))


def test_bits_per_byte_average_the_domain_values_as_perplexity_does():
    boost, three_bytes_V = 3.0, torch.full((V,), 3)
    by_domain = {"counting": counting_windows(4, 17, step=1), "skipping": counting_windows(12, 17, step=2)}
    bpb = bits_per_byte_by_domain(domain_window_nlls(Successor(boost), by_domain, 5), by_domain, three_bytes_V)
    counting, skipping = -math.log2(p_successor(boost)) / 3, math.log2(math.exp(boost) + V - 1) / 3
    assert bpb == pytest.approx({"counting": counting, "skipping": skipping, "avg": (counting + skipping) / 2},
                                rel=1e-5)


def test_domain_named_avg_is_refused():
    with pytest.raises(ValueError, match="avg"):
        domain_perplexities(ZeroLogits(), {"avg": counting_windows(2, 5)})


def test_long_context_uniform_model_and_missing_lengths():
    train_len = 8
    documents = [torch.randint(V, (n,)) for n in (20, 40, 60)]  # 4x windows (33 tokens) fit, 8x ones (65) do not
    result = long_context_perplexity(ZeroLogits(), documents, train_len, multipliers=(1, 2, 4, 8), batch_size=2)
    assert result[8] is None
    assert result[1]["ppl"] == pytest.approx(V, rel=1e-4)
    assert result[1]["ppl_beyond_train_len"] is None
    for multiplier in (2, 4):
        assert result[multiplier]["ppl"] == pytest.approx(V, rel=1e-4)
        assert result[multiplier]["ppl_beyond_train_len"] == pytest.approx(V, rel=1e-4)


def test_long_context_separates_the_extrapolation_region():
    """Uniform inside the training length, perfect beyond it: all-position PPL = V^(1/m), beyond-train PPL = 1."""
    train_len = 8
    documents = [counting_windows(1, 100)[0], counting_windows(1, 300)[0]]
    result = long_context_perplexity(SuccessorBeyond(train_len), documents, train_len, multipliers=(1, 2, 4))
    assert result[1]["ppl"] == pytest.approx(V, rel=1e-4)
    for multiplier in (2, 4):
        assert result[multiplier]["ppl"] == pytest.approx(V ** (1 / multiplier), rel=1e-4)
        assert result[multiplier]["ppl_beyond_train_len"] == pytest.approx(1.0, abs=1e-6)


def test_long_context_windows_do_not_overlap():
    class Recorder(ZeroLogits):
        def __init__(self) -> None:
            super().__init__()
            self.first_tokens: list[int] = []

        def forward(self, input_ids_BT: Tensor) -> Tensor:
            self.first_tokens += input_ids_BT[:, 0].tolist()
            return super().forward(input_ids_BT)

    recorder = Recorder()
    document = torch.arange(30) % V
    long_context_perplexity(recorder, [document], train_seq_len=4, multipliers=(2,), batch_size=1)
    assert recorder.first_tokens == [0, 9, 18]  # windows of 2 * 4 + 1 tokens; the last 3 tokens are left over


def test_evaluation_runs_without_grad_in_eval_mode_and_restores_training_mode():
    class Probe(ZeroLogits):
        def forward(self, input_ids_BT: Tensor) -> Tensor:
            assert not torch.is_grad_enabled() and not self.training
            return super().forward(input_ids_BT)

    model = Probe().train()
    model.frozen = nn.Linear(1, 1).eval()
    perplexity(model, counting_windows(2, 5))
    assert model.training and not model.frozen.training


def test_long_context_batches_hold_about_the_same_tokens_at_every_length():
    class Recorder(ZeroLogits):
        def __init__(self) -> None:
            super().__init__()
            self.batch_shapes: list[tuple[int, int]] = []

        def forward(self, input_ids_BT: Tensor) -> Tensor:
            self.batch_shapes.append(tuple(input_ids_BT.shape))
            return super().forward(input_ids_BT)

    recorder = Recorder()
    long_context_perplexity(recorder, [torch.arange(200) % V], train_seq_len=4, multipliers=(1, 2, 4), batch_size=4)
    # 40 windows of 1 x 4 tokens, 22 of 2 x 4, 11 of 4 x 4: every batch is full
    assert set(recorder.batch_shapes) == {(4, 4), (2, 8), (1, 16)}


def test_long_context_perplexity_does_not_depend_on_the_batch_size():
    from gatelab.config import ModelConfig
    from gatelab.model import build_model

    model = build_model(ModelConfig(vocab_size=V, n_layers=1, d_model=16, n_heads=2, n_kv_heads=1, head_dim=8,
                                    ffn_hidden=32), seed=0)
    documents = [torch.randint(V, (n,), generator=torch.Generator().manual_seed(n)) for n in (70, 90, 130)]
    one = long_context_perplexity(model, documents, 8, multipliers=(1, 2, 4), batch_size=1)
    many = long_context_perplexity(model, documents, 8, multipliers=(1, 2, 4), batch_size=8)
    for multiplier in (1, 2, 4):
        assert many[multiplier]["ppl"] == pytest.approx(one[multiplier]["ppl"], rel=1e-5)
