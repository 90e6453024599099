"""resolve_experiment: validation reads no tokenizer; resolving loads it, checks it and fills vocab_size: auto."""

from __future__ import annotations

from pathlib import Path

import pytest

from gatelab.config import ExperimentConfig
from gatelab.data.resolve import VocabularyTooSmall, experiment_from_dict, resolve_experiment
from gatelab.errors import GatelabError
from tests.helpers import DENSE, write_foreign_tokenizer


def tree(tokenizer: str, vocab_size: object = "auto") -> dict:
    return {**DENSE, "model": {**DENSE["model"], "vocab_size": vocab_size}, "data": {**DENSE["data"],
                                                                                      "tokenizer": tokenizer}}


def test_validation_reads_no_tokenizer_file(tmp_path: Path) -> None:
    absent = tmp_path / "absent" / "tokenizer.json"
    experiment = ExperimentConfig.model_validate(tree(str(absent)))  # values and types only: no file is opened
    assert experiment.model.vocab_size == "auto"
    with pytest.raises(GatelabError, match=rf"data.tokenizer: {absent}: no such file"):
        resolve_experiment(experiment)


def test_resolving_returns_a_new_config_and_keeps_what_needs_nothing(tmp_path: Path) -> None:
    foreign = write_foreign_tokenizer(tmp_path / "tokenizer.json")
    validated = ExperimentConfig.model_validate(tree(str(foreign)))
    resolved = resolve_experiment(validated)
    assert resolved.model.vocab_size == 384 and validated.model.vocab_size == "auto"  # the input is left as it was
    assert resolve_experiment(resolved) == resolved  # resolving twice changes nothing
    assert resolve_experiment(resolved.with_train(lr=1e-4)).model.vocab_size == 384  # in-memory copies stay resolved
    bpe = ExperimentConfig.model_validate(tree("bpe", 64))
    assert resolve_experiment(bpe) is bpe


def test_a_vocabulary_too_small_reads_as_a_validation_error(tmp_path: Path) -> None:
    foreign = write_foreign_tokenizer(tmp_path / "tokenizer.json")
    with pytest.raises(VocabularyTooSmall, match=r"more than model.vocab_size \(256\)"):
        resolve_experiment(ExperimentConfig.model_validate(tree(str(foreign), 256)))
    with pytest.raises(GatelabError) as error:
        experiment_from_dict(tree(str(foreign), 256), "exp.yaml")
    assert str(error.value).startswith("exp.yaml: invalid configuration\n  data.tokenizer ")
