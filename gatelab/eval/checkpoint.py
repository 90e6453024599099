"""A gatelab run's trained weights read back from its Lightning checkpoint, apart from the lm-eval model
(gatelab.eval.harness) so that reading one needs torch alone: a GPU machine's bundle carries lm-eval only on request."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch

from gatelab.errors import GatelabError


def load_checkpoint(path: str | Path) -> tuple[dict[str, Any] | None, dict[str, torch.Tensor]]:
    """(the `gatelab` description that `GatedLM.on_save_checkpoint` stores, or None in an older checkpoint; the
    model's state dict) of a Lightning checkpoint, on the CPU."""
    path = Path(path)
    try:
        try:
            # Memory-mapped: the optimizer's state, twice the weights, is never read.
            checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except pickle.UnpicklingError as error:
            if "Unsupported global" not in str(error):
                raise
            # A callback's state of a class torch's safe unpickler does not know: the user's own run's checkpoint,
            # which Lightning itself resumes from with a full load.
            checkpoint = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    except Exception as error:  # torch.load raises many kinds for a file that is not a checkpoint
        # torch's own message for a damaged file advises weights_only=False, which is no answer here
        detail = f": {error}" if isinstance(error, OSError) else ""
        raise GatelabError(f"{path}: not a readable checkpoint (torch.load raised {type(error).__name__}{detail}); "
                           "give the checkpoints/last.ckpt that a gatelab run wrote") from None
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise GatelabError(f"{path}: not a Lightning checkpoint of a gatelab run (no state_dict)")
    state = {name.removeprefix("model."): tensor for name, tensor in checkpoint["state_dict"].items()
             if name.startswith("model.")}
    return checkpoint.get("gatelab"), state
