"""The gated transformer: `build_model(config, seed)` gives a model whose forward is `logits_BTV = model(ids_BT)`."""

from gatelab.model.attention import Attention
from gatelab.model.attention_kinds import explicit_attention
from gatelab.model.gates import Gate
from gatelab.model.moe import MoEFeedForward
from gatelab.model.params import added_parameters, count_parameters, resolve_model
from gatelab.model.transformer import GatedTransformer, build_model, init_weights

__all__ = [
    "Attention", "Gate", "GatedTransformer", "MoEFeedForward", "added_parameters", "build_model", "count_parameters",
    "explicit_attention", "init_weights", "resolve_model",
]
