"""The paper's mechanistic probes (section 4.3, appendix A.3/A.5), over a model and held-out batches.

- F-Attn: head-averaged attention probability on token 0, per layer and its mean over layers. Query position 0 can only
  attend to itself, so the headline value excludes it; the value with it is kept too (the paper does not say;
  README, 'Decisions the paper leaves open').
- M-Act: the largest |activation| of each layer's output hidden state (the residual stream after the FFN), and its
  mean over layers; with where the maximum sits (token 0 or not) and the share of tokens within half of it, because in
  small models the maximum can be a broad offset written into most tokens rather than an outlier on the sink token.
- Gate score: mean and 0.05-wide histogram of the gate scores per layer; the flat mean over all gates and layers.
- Sparsity of the gated SDPA output: the share of |Y'| below 1e-2 and 1e-3, beside the ungated Y and the control Y
  times the layer's mean gate score (appendix A.3).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

import torch
from torch import Tensor, nn

from gatelab.eval.metrics import model_device

SPARSITY_THRESHOLDS = (1e-2, 1e-3)
HISTOGRAM_BINS = 20  # bins of 0.05 over [0, 1], as the paper's Figure 3
NEAR_MAX_FRACTION = 0.5


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
        return [self.sums[(l, name)] / self.counts[(l, name)] if self.counts[(l, name)] else float("nan")
                for l in range(n_layers)]


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
        return _mean([self.sums[(l, marked)] / self.counts[(l, marked)] for l in range(n_layers)
                      if self.counts[(l, marked)]])


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

    @property
    def f_attn(self) -> float:
        return _mean(self.first_token_share)

    @property
    def m_act(self) -> float:
        return _mean(self.max_activation)

    def summary(self) -> dict[str, float]:
        """The scalar metrics, named for MLflow."""
        metrics = {
            "f_attn": self.f_attn,
            "f_attn_with_first_query": _mean(self.first_token_share_with_first_query),
            "m_act": self.m_act,
            "m_act_share_layers_max_at_first_token": _mean([float(x) for x in self.max_activation_at_first_token]),
            "m_act_tokens_near_max_share": _mean(self.tokens_near_max_share),
        }
        if self.gate_score is not None:
            metrics["gate_score_mean"] = self.gate_score
        for measure, values in self.sparsity.items():
            metrics[f"sparsity_{measure}"] = _mean(values)
        return metrics

    def to_dict(self) -> dict:
        return {**asdict(self), "summary": self.summary()}


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
        max_activation=[recorder.maxima[(l, "ffn_residual")] for l in range(n_layers)],
        max_activation_at_first_token=[recorder.max_at_first_token[l] for l in range(n_layers)],
        tokens_near_max_share=[_mean(recorder.near_max_shares[l]) for l in range(n_layers)],
        sublayer_max={name: [recorder.maxima[(l, name)] for l in range(n_layers)]
                      for name in ("attn_output", "attn_residual", "ffn_output", "ffn_residual")},
        gate_score_mean={p: recorder.per_layer(f"gate_score.{p}", n_layers) for p in positions},
        gate_histogram={p: [recorder.histograms[(l, f"gate_score.{p}")].tolist()
                            if (l, f"gate_score.{p}") in recorder.histograms else [0.0] * HISTOGRAM_BINS
                            for l in range(n_layers)] for p in positions},
        sparsity={name: recorder.per_layer(name, n_layers) for name in sparsity_names},
        gate_score=sum(recorder.sums[k] for k in gate_keys) / sum(recorder.counts[k] for k in gate_keys)
        if gate_keys else None,
    )
