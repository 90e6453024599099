"""The paper's mechanistic probes (section 4.3, appendix A.3/A.5), over a model and held-out batches.

- F-Attn: head-averaged attention probability on token 0, per layer and its mean over layers. Query position 0 can only
  attend to itself, so the headline value excludes it; the value with it is kept too (the paper does not say;
  experiments/README.md, 'Decisions the paper leaves open').
- M-Act: the largest |activation| of each layer's output hidden state (the residual stream after the FFN), and its
  mean over layers; with where the maximum sits (token 0 or not) and the share of tokens within half of it, because in
  small models the maximum can be a broad offset written into most tokens rather than an outlier on the sink token.
- Gate score: mean and 0.05-wide histogram of the gate scores per layer; the flat mean over all gates and layers.
- Sparsity of the gated SDPA output: the share of |Y'| below 1e-2 and 1e-3, beside the ungated Y and the control Y
  times the layer's mean gate score (appendix A.3).

Beside the paper's, the probes that tell "do-nothing" attention mechanisms apart (issue 33), from the same pass:
- Sink rate, Sink_1^epsilon of Gu et al. (ICLR 2025, "When Attention Sink Emerges in Language Models: An Empirical
  View"): a head's importance score of the first token is alpha_1 = (1/T) sum_{i=1..T} A_{i,1}, its mean attention
  over all T queries, the first included; the head is a sink head where alpha_1 > epsilon = 0.3, and the sink rate is
  the share of sink heads. As their reference code (sail-sg/Attention-Sink, `compute_attention_sink`) the threshold is
  applied per sequence and the share taken over (sequence, layer, head), per layer and over all layers. alpha_1
  depends on T (they probe 64 tokens; here the run's seq_len).
- Kurtosis of each block's output (the residual stream after the block), as Bondarenko et al. (NeurIPS 2023,
  "Quantizable Transformers: Removing Outliers by Helping Attention Heads Do Nothing", section 5; their code's
  `kurtosis`, applied to `x.view(batch, -1)`): per sequence over all its T x D values, mu_4 / s^4 with s the
  Bessel-corrected std, so Pearson's kurtosis (a Gaussian gives 3, not 0), then averaged over sequences. Their code
  adds 1e-6 to s^4 against division by zero; here only an exact 0 is guarded, because at a small model's residual
  scale (std about 0.03 near initialisation) that 1e-6 would halve the value.
- The largest |activation| of each block's output: M-Act's per-layer maxima (over every probed token), named again.
  Bondarenko et al. average each sequence's maximum over the validation set instead; the maximum over all tokens is
  what sets a per-tensor quantisation range.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

import torch
from torch import Tensor, nn

from gatelab import metrics as catalogue
from gatelab.eval.metrics import model_device

SPARSITY_THRESHOLDS = (1e-2, 1e-3)
HISTOGRAM_BINS = 20  # bins of 0.05 over [0, 1], as the paper's Figure 3
NEAR_MAX_FRACTION = 0.5
SINK_EPSILON = 0.3  # Gu et al.'s threshold on a head's mean attention to the first token


def sequence_kurtosis(values_BN: Tensor) -> Tensor:
    """Pearson kurtosis (Gaussian: 3) of each row of (B, N) values, in float64: mu_4 / s^4, s the Bessel-corrected
    standard deviation, as Bondarenko et al.'s `kurtosis` but for its 1e-6 (module docstring). A constant row: 0."""
    x_BN = values_BN.double()
    centred_BN = x_BN - x_BN.mean(dim=1, keepdim=True)
    return (centred_BN**4).mean(dim=1) / (x_BN.std(dim=1) ** 4).clamp_min(torch.finfo(torch.float64).tiny)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


class ProbeRecorder:
    """Passed to `model(ids, probe=recorder)`: reduces each probed tensor as it arrives, so memory stays flat."""

    def __init__(self) -> None:
        self.sums: dict[tuple[int, str], float] = defaultdict(float)
        self.counts: dict[tuple[int, str], int] = defaultdict(int)
        self.maxima: dict[tuple[int, str], float] = {}
        self.max_at_first_token: dict[int, bool] = {}
        self.near_max_shares: dict[int, list[float]] = defaultdict(list)
        self.histograms: dict[tuple[int, str], Tensor] = {}
        self._sdpa_output: dict[int, Tensor] = {}
        self._g1_mean: dict[int, float] = {}

    def _accumulate(self, layer: int, name: str, total: float, count: int) -> None:
        self.sums[(layer, name)] += total
        self.counts[(layer, name)] += count

    def add(self, layer: int, name: str, tensor: Tensor) -> None:
        tensor = tensor.detach().float()
        if name == "attention_probs":  # (B, H, T, T)
            first_BHT = tensor[..., 0]
            self._accumulate(layer, "first_token_share", first_BHT[:, :, 1:].sum().item(), first_BHT[:, :, 1:].numel())
            self._accumulate(layer, "first_token_share_with_first_query", first_BHT.sum().item(), first_BHT.numel())
            alpha_BH = first_BHT.mean(dim=-1)  # Gu et al.'s alpha_1 of each head in each sequence, query 0 included
            self._accumulate(layer, "sink_heads", (alpha_BH > SINK_EPSILON).sum().item(), alpha_BH.numel())
        elif name in ("attn_output", "attn_residual", "ffn_output", "ffn_residual"):  # (B, T, D)
            token_max_BT = tensor.abs().amax(dim=-1)
            batch_max = token_max_BT.max().item()
            if batch_max >= self.maxima.get((layer, name), float("-inf")):
                self.maxima[(layer, name)] = batch_max
                if name == "ffn_residual":
                    position = int(token_max_BT.argmax().item()) % token_max_BT.shape[1]
                    self.max_at_first_token[layer] = position == 0
            if name == "ffn_residual":
                near = (token_max_BT >= NEAR_MAX_FRACTION * batch_max).float().mean().item()
                self.near_max_shares[layer].append(near)
                kurtosis_B = sequence_kurtosis(tensor.flatten(start_dim=1))
                self._accumulate(layer, "kurtosis", kurtosis_B.sum().item(), kurtosis_B.numel())
        elif name.startswith("gate_score."):  # (B, T, H, D), or (H, D) for an input-independent gate
            self._accumulate(layer, name, tensor.sum().item(), tensor.numel())
            histogram = torch.histc(tensor.clamp(0.0, 1.0), bins=HISTOGRAM_BINS, min=0.0, max=1.0)
            self.histograms[(layer, name)] = self.histograms.get((layer, name), 0) + histogram
            if name == "gate_score.g1":
                self._g1_mean[layer] = tensor.mean().item()
        elif name == "sdpa_output":  # (B, T, H, Dk), before any G1 gate
            self._sdpa_output[layer] = tensor
            self._accumulate(layer, "mean_abs_sdpa_output", tensor.abs().sum().item(), tensor.numel())
            for threshold in SPARSITY_THRESHOLDS:
                below = (tensor.abs() < threshold).sum().item()
                self._accumulate(layer, f"sdpa_output_below_{threshold:g}", below, tensor.numel())
        elif name == "sdpa_gated_output":
            ungated = self._sdpa_output.pop(layer)
            control = ungated * self._g1_mean.pop(layer, 1.0)  # the same Y scaled by the average gate score
            self._accumulate(layer, "mean_abs_sdpa_gated_output", tensor.abs().sum().item(), tensor.numel())
            for threshold in SPARSITY_THRESHOLDS:
                below = (tensor.abs() < threshold).sum().item()
                self._accumulate(layer, f"gated_output_below_{threshold:g}", below, tensor.numel())
                below = (control.abs() < threshold).sum().item()
                self._accumulate(layer, f"control_output_below_{threshold:g}", below, tensor.numel())

    def per_layer(self, name: str, n_layers: int) -> list[float]:
        return [self.sums[(i, name)] / self.counts[(i, name)] if self.counts[(i, name)] else float("nan")
                for i in range(n_layers)]


class FirstTokenShareByQuery:
    """A probe recorder for F-Attn split by the kind of query: set `marked_BT` (True where the query's token is of the
    kind, e.g. a trigger) before each forward. Keeps only the attention on token 0, head-averaged, for query positions
    >= 1 as ProbeRecorder does; `share(marked, n_layers)` is the layer mean of per-layer means, like F-Attn.
    """

    def __init__(self) -> None:
        self.marked_BT: Tensor | None = None
        self.sums: dict[tuple[int, bool], float] = defaultdict(float)
        self.counts: dict[tuple[int, bool], int] = defaultdict(int)

    def add(self, layer: int, name: str, tensor: Tensor) -> None:
        if name != "attention_probs":  # (B, H, T, T)
            return
        first_BT = tensor.detach().float()[..., 0].mean(dim=1)[:, 1:]
        marked_BT = self.marked_BT[:, 1:].to(first_BT.device)
        for marked, where_BT in ((True, marked_BT), (False, ~marked_BT)):
            self.sums[(layer, marked)] += first_BT[where_BT].sum().item()
            self.counts[(layer, marked)] += int(where_BT.sum())

    def share(self, marked: bool, n_layers: int) -> float:
        return _mean([self.sums[(i, marked)] / self.counts[(i, marked)] for i in range(n_layers)
                      if self.counts[(i, marked)]])


@dataclass
class ProbeReport:
    n_layers: int
    first_token_share: list[float]
    first_token_share_with_first_query: list[float]
    max_activation: list[float]
    max_activation_at_first_token: list[bool]
    tokens_near_max_share: list[float]
    sublayer_max: dict[str, list[float]]
    gate_score_mean: dict[str, list[float]] = field(default_factory=dict)  # per gate position, per layer
    gate_histogram: dict[str, list[list[float]]] = field(default_factory=dict)  # counts in HISTOGRAM_BINS bins
    sparsity: dict[str, list[float]] = field(default_factory=dict)  # per measure, per layer
    gate_score: float | None = None  # flat mean over every gate element of every layer; None without gate scores
    sink_rate: list[float] = field(default_factory=list)  # per layer: the share of (sequence, head) with alpha_1 > 0.3
    kurtosis: list[float] = field(default_factory=list)  # per block: its output's kurtosis, mean over sequences

    @property
    def f_attn(self) -> float:
        return _mean(self.first_token_share)

    @property
    def m_act(self) -> float:
        return _mean(self.max_activation)

    def summary(self) -> dict[str, float]:
        """The scalar metrics, by their MLflow names."""
        metrics = {
            catalogue.F_ATTN: self.f_attn,
            catalogue.F_ATTN_WITH_FIRST_QUERY: _mean(self.first_token_share_with_first_query),
            catalogue.M_ACT: self.m_act,
            catalogue.M_ACT_MAX_AT_FIRST_TOKEN: _mean([float(x) for x in self.max_activation_at_first_token]),
            catalogue.M_ACT_NEAR_MAX: _mean(self.tokens_near_max_share),
        }
        if self.gate_score is not None:
            metrics[catalogue.GATE_SCORE_MEAN] = self.gate_score
        for measure, values in self.sparsity.items():
            metrics[catalogue.SPARSITY.format(measure=measure)] = _mean(values)
        return metrics | self.outlier_summary()

    def outlier_summary(self) -> dict[str, float]:
        """Sink rate, kurtosis and largest |activation|, per layer (block) and over layers. Every layer has as many
        heads, so the mean of the per-layer sink rates is the share over all heads, as Gu et al.'s. A layer that
        handed no attention probabilities (NaN) is left out."""
        sink = {i: rate for i, rate in enumerate(self.sink_rate) if not math.isnan(rate)}
        kurtosis = {i: value for i, value in enumerate(self.kurtosis) if not math.isnan(value)}
        metrics = {catalogue.SINK_RATE: _mean(list(sink.values()))} if sink else {}
        metrics |= {catalogue.SINK_RATE_OF_LAYER.format(layer=i): rate for i, rate in sink.items()}
        if kurtosis:
            metrics |= {catalogue.KURTOSIS_MAX: max(kurtosis.values()),
                        catalogue.KURTOSIS_MEAN: _mean(list(kurtosis.values()))}
        metrics |= {catalogue.KURTOSIS_OF_BLOCK.format(block=i): value for i, value in kurtosis.items()}
        metrics[catalogue.MAX_ABS_ACTIVATION] = max(self.max_activation)
        metrics |= {catalogue.MAX_ABS_ACTIVATION_OF_BLOCK.format(block=i): value
                    for i, value in enumerate(self.max_activation)}
        return metrics

    def to_dict(self) -> dict:
        # probes.json names the summary's metrics without their `probe/`
        return {**asdict(self), "summary": {name.split("/", 1)[1]: value for name, value in self.summary().items()}}


@torch.no_grad()
def probe_model(model: nn.Module, batches: Iterable[Tensor]) -> ProbeReport:
    """Run the probes over batches of token ids (B, T), on the device of the model's parameters; the explicit softmax
    path runs only here."""
    was_training = model.training
    model.eval()
    recorder = ProbeRecorder()
    device = model_device(model)
    for input_ids_BT in batches:
        model(input_ids_BT.to(device), probe=recorder)
    model.train(was_training)
    n_layers = model.config.n_layers
    positions = sorted({name.split(".", 1)[1] for (_, name) in recorder.histograms})
    gate_keys = [key for key in recorder.counts if key[1].startswith("gate_score.")]
    sparsity_names = sorted({name for (_, name) in recorder.counts if "below" in name or name.startswith("mean_abs")})
    return ProbeReport(
        n_layers=n_layers,
        first_token_share=recorder.per_layer("first_token_share", n_layers),
        first_token_share_with_first_query=recorder.per_layer("first_token_share_with_first_query", n_layers),
        max_activation=[recorder.maxima[(i, "ffn_residual")] for i in range(n_layers)],
        max_activation_at_first_token=[recorder.max_at_first_token[i] for i in range(n_layers)],
        tokens_near_max_share=[_mean(recorder.near_max_shares[i]) for i in range(n_layers)],
        sublayer_max={name: [recorder.maxima[(i, name)] for i in range(n_layers)]
                      for name in ("attn_output", "attn_residual", "ffn_output", "ffn_residual")},
        gate_score_mean={p: recorder.per_layer(f"gate_score.{p}", n_layers) for p in positions},
        gate_histogram={p: [recorder.histograms[(i, f"gate_score.{p}")].tolist()
                            if (i, f"gate_score.{p}") in recorder.histograms else [0.0] * HISTOGRAM_BINS
                            for i in range(n_layers)] for p in positions},
        sparsity={name: recorder.per_layer(name, n_layers) for name in sparsity_names},
        gate_score=sum(recorder.sums[k] for k in gate_keys) / sum(recorder.counts[k] for k in gate_keys)
        if gate_keys else None,
        sink_rate=recorder.per_layer("sink_heads", n_layers),
        kurtosis=recorder.per_layer("kurtosis", n_layers),
    )


class _AttentionOutputRms:
    """A probe that keeps only the sum of squares of each layer's attention output (what the residual stream gets)."""

    def __init__(self) -> None:
        self.squares: dict[int, float] = defaultdict(float)
        self.counts: dict[int, int] = defaultdict(int)

    def add(self, layer: int, name: str, tensor: Tensor) -> None:
        if name == "attn_output":  # (B, T, D)
            self.squares[layer] += tensor.detach().float().square().sum().item()
            self.counts[layer] += tensor.numel()


@torch.no_grad()
def attention_output_rms(model: nn.Module, input_ids_BT: Tensor) -> float:
    """The RMS of each layer's attention-sublayer output on one batch, averaged over layers.

    Logged at step 0 of every run (`gatelab.metrics.INIT_SCALE`): a gate that scores 0.5 at init, a SiLU gate, a
    smaller output projection all shrink what attention adds to the residual stream before anything is learned, and at
    small scale that alone moves perplexity. The claims table reads it to tell a gating effect from an init-scale one.
    """
    was_training = model.training
    model.eval()
    recorder = _AttentionOutputRms()
    model(input_ids_BT.to(model_device(model)), probe=recorder)
    model.train(was_training)
    return _mean([math.sqrt(recorder.squares[i] / recorder.counts[i]) for i in sorted(recorder.counts)])
