"""An experiment as it runs on this machine: the validated config, plus what only the data's files can tell.

`gatelab.config` validates values and types, `gatelab.config_files` reads the YAML, and neither reads more. A
`data.tokenizer` that names a tokenizer.json or a Hugging Face tokenizer has to be loaded to be checked, and
`model.vocab_size: auto` takes its size: that is I/O, so it happens here, in `resolve_experiment`, and
`load_experiment` and `experiment_from_dict` resolve every config they give. Every command reads its experiment
through them, so a tokenizer that does not load, or that the model's vocabulary cannot hold, is one message naming the
file, the key and the fix, before anything trains.

A resolved config stays resolved under `model_copy` and `with_train`; a tree validated by `ExperimentConfig` alone (a
sweep cell, say) is resolved by passing it through `resolve_experiment`.
"""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

from gatelab.config import ExperimentConfig, validate_experiment
from gatelab.config_files import read_experiment_tree
from gatelab.data.tokenizer import TRAINED_BPE, load_foreign_tokenizer
from gatelab.errors import GatelabError

VOCAB_MULTIPLE = 128  # `model.vocab_size: auto` is the tokenizer's size rounded up to a multiple of this


class VocabularyTooSmall(GatelabError):
    """`model.vocab_size` cannot hold every id of `data.tokenizer`: a configuration error, reported as validation
    reports one (under "invalid configuration"), unlike a tokenizer that does not load."""


def resolve_experiment(experiment: ExperimentConfig) -> ExperimentConfig:
    """`experiment` with its `data.tokenizer` loaded and checked against the model, and `model.vocab_size: auto` set to
    the tokenizer's size rounded up to a multiple of VOCAB_MULTIPLE; the same config where there is nothing to resolve.

    Raises GatelabError (a DataError naming `data.tokenizer` where the tokenizer does not load, VocabularyTooSmall
    where the model's vocabulary is smaller than it), without the config's file: callers name it.
    """
    data, model = experiment.data, experiment.model
    if data.task != "text" or data.tokenizer == TRAINED_BPE:
        return experiment  # the trained BPE is sized by model.vocab_size; ExperimentConfig checked that it is a number
    size = load_foreign_tokenizer(data.tokenizer, data.bos_token, data.eos_token).vocab_size
    rounded = -(-size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE
    if model.vocab_size == "auto":
        return experiment.model_copy(update={"model": model.model_copy(update={"vocab_size": rounded})})
    if size > model.vocab_size:
        raise VocabularyTooSmall(f"data.tokenizer {data.tokenizer} has {size} tokens, more than model.vocab_size "
                                 f"({model.vocab_size}): set model.vocab_size to auto (or {rounded}, its size rounded "
                                 f"up to a multiple of {VOCAB_MULTIPLE})")
    return experiment


def experiment_from_dict(data: dict[str, Any], source: str) -> ExperimentConfig:
    """The resolved experiment `data` describes; errors are one GatelabError naming `source` and the key."""
    experiment = validate_experiment(data, source)
    try:
        return resolve_experiment(experiment)
    except VocabularyTooSmall as exc:
        raise GatelabError(f"{source}: invalid configuration\n  {exc}") from None
    except GatelabError as exc:  # a data.tokenizer that does not load: one line, not a validation report
        raise GatelabError(f"{source}: {exc}") from None


def load_experiment(path: str | Path, overrides: typing.Sequence[str] = ()) -> ExperimentConfig:
    """Read an experiment preset, apply `key.path=value` overrides, validate and resolve it; errors name the file and
    key."""
    return experiment_from_dict(read_experiment_tree(path, overrides), str(path))
