"""Parameter counts on the meta device: the same numbers as a built model, without torch._dynamo's import."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gatelab.config import GateConfig, SwitchHeadConfig
from gatelab.model import build_model, count_parameters
from tests.helpers import REPO, micro_config


@pytest.mark.parametrize("config", [
    micro_config(),
    micro_config("moe", tie_embeddings=False),
    micro_config(gates=[GateConfig(position="g1", granularity="elementwise"), GateConfig(position="g2")]),
    micro_config(switch_head=SwitchHeadConfig(n_experts=2, top_k=1, projections="v")),
], ids=["dense", "moe-untied", "gated", "switch-head"])
def test_counted_on_meta_equals_a_built_model(config):
    built = build_model(config)
    assert count_parameters(config) == sum(p.numel() for p in built.parameters())


def test_meta_parameters_are_left_uninitialised_without_touching_real_tensors():
    # the skipped initialisers are meta-only: a model built beside a count is still drawn as before
    before = build_model(micro_config(), seed=3).state_dict()
    count_parameters(micro_config())
    after = build_model(micro_config(), seed=3).state_dict()
    assert all((before[name] == after[name]).all() for name in before)


def test_counting_parameters_does_not_import_torch_dynamo():
    # `gatelab sweep plan` counts the parameters of every cell; torch._dynamo's import was most of its 5 s
    code = ("import sys; from gatelab.data.resolve import load_experiment; from gatelab.model import added_parameters; "
            "print(added_parameters(load_experiment('experiments/paper-moe-15b.yaml'), 'g1_elem_sig')[1] > 0, "
            "'torch._dynamo' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "False"]
