"""Parameter accounting without allocating weights (meta device), and the resolved model of an experiment."""

from __future__ import annotations

import functools

import torch
from torch.overrides import TorchFunctionMode

from gatelab.config import ExperimentConfig, ModelConfig
from gatelab.model.transformer import GatedTransformer
from gatelab.variants import apply_variant


class _NoValuesToInitialise(TorchFunctionMode):
    """Random initialisers are no-ops here: meta tensors hold no values. Were they run, torch's Python meta kernel of
    `normal_` would import torch._dynamo (1.3 s on 2 cores), a third of a `gatelab sweep plan`, which counts every
    cell's parameters."""

    SKIPPED = (torch.nn.init.normal_, torch.nn.init.uniform_, torch.nn.init.trunc_normal_, torch.Tensor.normal_,
               torch.Tensor.uniform_)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensor = args[0] if args else kwargs.get("tensor")  # torch.nn.init passes its tensor by keyword
        if func in self.SKIPPED and isinstance(tensor, torch.Tensor) and tensor.is_meta:
            return tensor
        return func(*args, **kwargs)


def count_parameters(config: ModelConfig) -> int:
    """Total parameters (tied embeddings once), counted on the meta device: a 15B model costs no memory. Counted once
    per distinct model: a run asks twice, a plan once a cell."""
    return _count_parameters(config.model_dump_json())


@functools.cache
def _count_parameters(config_json: str) -> int:
    with torch.device("meta"), _NoValuesToInitialise():
        model = GatedTransformer(ModelConfig.model_validate_json(config_json))
    return sum(p.numel() for p in model.parameters())


def resolve_model(experiment: ExperimentConfig, variant: str | None = None) -> ModelConfig:
    """The experiment's model with its variant applied; with `match_params` a dense FFN is narrowed to the baseline's
    count.

    The paper matches its dense rows by narrowing the FFN by an amount it does not state; gatelab narrows every
    layer's SwiGLU by the added parameters divided by 3 * d_model * n_layers (rounded), so the totals agree to within
    one FFN column per layer.
    """
    model = apply_variant(experiment.model, variant or experiment.variant)
    if not (model.match_params and model.ffn == "dense"):
        return model
    added = count_parameters(model) - count_parameters(experiment.model)
    narrower = round(added / (3 * model.d_model * model.n_layers))
    return model.model_copy(update={"ffn_hidden": max(1, model.ffn_hidden - narrower)})


def added_parameters(experiment: ExperimentConfig, variant: str) -> tuple[int, int]:
    """(total parameters, parameters added relative to `baseline`) of a variant under an experiment."""
    total = count_parameters(resolve_model(experiment, variant))
    return total, total - count_parameters(resolve_model(experiment, "baseline"))
