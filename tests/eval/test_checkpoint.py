"""A run's weights read back from its Lightning checkpoint (gatelab.eval.checkpoint), and one message for a file that
is none."""

from __future__ import annotations

import pytest
import torch

from gatelab.errors import GatelabError
from gatelab.eval.checkpoint import load_checkpoint


def test_the_model_s_weights_and_description_are_read_and_the_rest_is_left_out(tmp_path):
    weight = torch.arange(6.0).reshape(2, 3)
    path = tmp_path / "last.ckpt"
    torch.save({"state_dict": {"model.blocks.0.weight": weight, "stability.ema": torch.ones(1)},
                "optimizer_states": [{"state": {}}], "gatelab": {"model": {"d_model": 3}}}, path)
    described, state = load_checkpoint(path)
    assert described == {"model": {"d_model": 3}}
    assert list(state) == ["blocks.0.weight"] and torch.equal(state["blocks.0.weight"], weight)
    torch.save({"state_dict": {"model.w": weight}}, path)  # written before checkpoints described their model
    assert load_checkpoint(path)[0] is None


def test_a_file_that_is_no_checkpoint_of_a_run_is_one_message_naming_it(tmp_path):
    junk, foreign = tmp_path / "junk.ckpt", tmp_path / "foreign.ckpt"
    junk.write_text("not a checkpoint")
    torch.save({"weights": torch.ones(1)}, foreign)
    with pytest.raises(GatelabError, match="junk.ckpt: not a readable checkpoint"):
        load_checkpoint(junk)
    with pytest.raises(GatelabError, match="foreign.ckpt: not a Lightning checkpoint of a gatelab run"):
        load_checkpoint(foreign)
