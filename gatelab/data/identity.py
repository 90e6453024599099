"""A run's identity: `spec_hash`, a content hash of everything that decides a run's result.

The hash reads an experiment's config as `model_dump` gives it, except for the keys in `HASH_RULES`, one declared table
read by one loop. They are keys that do not change a run's result (where it is tracked, how its tokens are stored, speed
settings); keys added after runs were recorded, left out while they hold the value those runs had, so a sweep still
finds its finished runs by hash (README, run identity); and the data a run reads, hashed by content rather than by name
(a source's files, a tokenizer.json's bytes). The data is read here, so the hash lives in the data layer, not in
`gatelab.config`; hash a resolved experiment (`gatelab.data.resolve`), whose `model.vocab_size` is a number.

A new config key that changes what a run does needs a `LeftOutAt` entry holding the value runs had before it existed,
or every recorded run gets a new identity (tests/test_config.py keeps golden hashes).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from gatelab.config import ExperimentConfig
from gatelab.data.external import source_identity
from gatelab.data.tokenizer import TRAINED_BPE, load_foreign_tokenizer

_LEFT_OUT = object()  # what a rule reads for a key the hash leaves out


@dataclass(frozen=True)
class LeftOut:
    """The key is never hashed."""

    def read(self, experiment: ExperimentConfig, value: Any) -> Any:
        return _LEFT_OUT


@dataclass(frozen=True)
class LeftOutAt:
    """The key is hashed unless it holds `legacy`, the value runs had before it existed."""

    legacy: Any

    def read(self, experiment: ExperimentConfig, value: Any) -> Any:
        return _LEFT_OUT if value == self.legacy else value


@dataclass(frozen=True)
class LeftOutWhen:
    """The key is hashed unless `condition` holds for the experiment."""

    condition: Callable[[ExperimentConfig], bool]

    def read(self, experiment: ExperimentConfig, value: Any) -> Any:
        return _LEFT_OUT if self.condition(experiment) else value


@dataclass(frozen=True)
class HeldAt:
    """The key is hashed as `value` whatever it holds."""

    value: Any

    def read(self, experiment: ExperimentConfig, value: Any) -> Any:
        return self.value


@dataclass(frozen=True)
class HashedAs:
    """Where `condition` holds, the key is hashed as `identity(experiment)` instead of its value."""

    identity: Callable[[ExperimentConfig], Any]
    condition: Callable[[ExperimentConfig], bool]

    def read(self, experiment: ExperimentConfig, value: Any) -> Any:
        return self.identity(experiment) if self.condition(experiment) else value


Rule = LeftOut | LeftOutAt | LeftOutWhen | HeldAt | HashedAs


@dataclass(frozen=True)
class HashRule:
    """How the hash reads one key: `path` is dotted in the dumped config, `*` standing for every item of a list."""

    path: str
    rule: Rule
    why: str


def _text_task(experiment: ExperimentConfig) -> bool:
    return experiment.data.task == "text"


def _builtin_source(experiment: ExperimentConfig) -> bool:
    return experiment.data.source == "builtin"


def _source_is(source: str) -> Callable[[ExperimentConfig], bool]:
    return lambda experiment: experiment.data.source == source


def _foreign_tokenizer(experiment: ExperimentConfig) -> bool:
    return experiment.data.task == "text" and experiment.data.tokenizer != TRAINED_BPE


def _no_foreign_tokenizer(experiment: ExperimentConfig) -> bool:
    return not _foreign_tokenizer(experiment)


def _gate_logits_decayed_or_absent(experiment: ExperimentConfig) -> bool:
    has_gate_logits = any(g.kind == "gate" and not g.input_dependent for g in experiment.model.gates)
    return experiment.train.decay_gate_logits or not has_gate_logits


def _source_identity(experiment: ExperimentConfig) -> dict[str, Any]:
    return source_identity(experiment.data)


def _tokenizer_identity(experiment: ExperimentConfig) -> str:
    data = experiment.data
    return load_foreign_tokenizer(data.tokenizer, data.bos_token, data.eos_token).identity


_ADDED_LATER = "added after runs were recorded: left out at the value they had, so they keep their hashes"
_SPEED = ("a speed setting: the same computation, to float rounding, so a sweep may turn it on or off without "
          "training anything again")
_SYNTHETIC_TASK = "the synthetic task's keys came later: left out of text runs, which keep their hashes"
_SOURCE = "data.source came later: a built-in run keeps the hash it had before it existed"
_BPE = "the trained BPE (or none, for the synthetic task), as before these keys existed: the same hashes"

HASH_RULES: tuple[HashRule, ...] = (
    HashRule("tracking", LeftOut(), "where the run is recorded, not what it does"),
    HashRule("data.shard_mb", LeftOut(), "how the tokens are stored: the same batches either way"),
    HashRule("data.loader_workers", LeftOut(), "how the batches are assembled: the same batches either way"),
    HashRule("train.compile", HeldAt(False), _SPEED + "; held at its old default, so that runs recorded before a "
                                                      "preset turned it on keep their hashes"),
    HashRule("train.compile_mode", LeftOut(), _SPEED),
    HashRule("model.o_proj_init_scale", LeftOutAt(1.0), _ADDED_LATER),
    HashRule("model.gates.*.scale", LeftOutAt(None), _ADDED_LATER),
    HashRule("model.gates.*.compute_dtype", LeftOutAt("model"), _ADDED_LATER),
    HashRule("model.gates.*.init", LeftOutAt("normal"), _ADDED_LATER),
    HashRule("model.attention", LeftOutAt("softmax"), _ADDED_LATER),
    HashRule("model.kv_bias", LeftOutAt(False), _ADDED_LATER),
    HashRule("train.decay_gate_logits", LeftOutWhen(_gate_logits_decayed_or_absent),
             _ADDED_LATER + " (decayed, as before the key existed), or where there are no input-independent gate "
                            "logits to decay"),
    HashRule("eval.lm_eval", LeftOutAt(None), _ADDED_LATER),
    HashRule("eval.blimp", LeftOutAt(True), _ADDED_LATER),
    HashRule("eval.budget", LeftOut(), "which held-out text the end-of-run scores read, not what the run trains: "
                                       "a run records it (resolved.eval.budget), and reports never compare runs "
                                       "scored on different budgets"),
    HashRule("data.task", LeftOutWhen(_text_task), _SYNTHETIC_TASK),
    HashRule("data.bigram_backcopy", LeftOutWhen(_text_task), _SYNTHETIC_TASK),
    HashRule("data.source", LeftOutWhen(_builtin_source), _SOURCE),
    HashRule("data.files", LeftOutWhen(_builtin_source), _SOURCE),
    HashRule("data.hf", LeftOutWhen(_builtin_source), _SOURCE),
    HashRule("data.files", HashedAs(_source_identity, _source_is("files")),
             "the text itself, cheaply: each file's path, size and modification time"),
    HashRule("data.hf", HashedAs(_source_identity, _source_is("hf")),
             "the dataset's id, config, split and revision, and a local folder's files as data.files"),
    HashRule("data.tokenizer", HashedAs(_tokenizer_identity, _foreign_tokenizer),
             "a file by its bytes, not its path: moving it keeps the run, editing it makes another"),
    HashRule("data.tokenizer", LeftOutWhen(_no_foreign_tokenizer), _BPE),
    HashRule("data.bos_token", LeftOutWhen(_no_foreign_tokenizer), _BPE),
    HashRule("data.eos_token", LeftOutWhen(_no_foreign_tokenizer), _BPE),
)


def _slots(node: Any, parts: list[str]) -> Iterator[tuple[dict[str, Any], str]]:
    """(mapping, key) of every value at the dotted `parts` under `node` that is there; `*` steps into a list's items."""
    head, rest = parts[0], parts[1:]
    if head == "*":
        children = node if isinstance(node, list) else []
    elif isinstance(node, dict) and head in node:
        if not rest:
            yield node, head
            return
        children = [node[head]]
    else:
        return
    for child in children:
        yield from _slots(child, rest)


def hashed_payload(experiment: ExperimentConfig) -> dict[str, Any]:
    """What `spec_hash` hashes: the dumped config read through HASH_RULES, in the table's order."""
    payload = experiment.model_dump(mode="json")
    for entry in HASH_RULES:
        for mapping, key in list(_slots(payload, entry.path.split("."))):
            value = entry.rule.read(experiment, mapping[key])
            if value is _LEFT_OUT:
                del mapping[key]
            else:
                mapping[key] = value
    return payload


def spec_hash(experiment: ExperimentConfig) -> str:
    """A content hash of everything that decides a run's result (not where it is tracked): the run's identity."""
    return hashlib.sha256(json.dumps(hashed_payload(experiment), sort_keys=True).encode()).hexdigest()[:16]
