"""Shared fixtures: micro models that run forward and backward on CPU in milliseconds."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gatelab.config import ModelConfig, MoEConfig

REPO = Path(__file__).resolve().parents[1]


def micro_config(ffn: str = "dense", **changes) -> ModelConfig:
    fields = dict(vocab_size=61, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, head_dim=8, ffn_hidden=48)
    if ffn == "moe":
        fields.update(ffn="moe", ffn_hidden=None, moe=MoEConfig(n_experts=4, top_k=2, expert_hidden=16))
    fields.update(changes)
    return ModelConfig(**fields)


class Capture:
    """A probe that keeps every tensor it is given, keyed by (layer, name)."""

    def __init__(self) -> None:
        self.tensors: dict[tuple[int, str], torch.Tensor] = {}

    def add(self, layer: int, name: str, tensor: torch.Tensor) -> None:
        self.tensors[(layer, name)] = tensor.detach().clone()


@pytest.fixture
def token_ids() -> torch.Tensor:
    return torch.randint(0, 61, (2, 10), generator=torch.Generator().manual_seed(0))
