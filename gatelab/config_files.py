"""The config as text: YAML read with repeated keys and alias bombs refused, `--set key.path=value` parsed and set
by dotted path, a config written back as YAML. What a key may hold is gatelab.config's."""

from __future__ import annotations

import difflib
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from gatelab.config import ExperimentConfig, submodel_of
from gatelab.errors import GatelabError


def parse_assignment(assignment: str) -> tuple[str, Any]:
    """`train.lr=1e-3` -> ("train.lr", 0.001); the value is read as YAML so types come out right."""
    key, sep, raw = assignment.partition("=")
    if not sep or not key.strip():
        raise GatelabError(f"--set {assignment!r}: expected KEY.PATH=VALUE, for example train.lr=1e-3")
    return key.strip(), _load_yaml(raw, f"--set {assignment!r}")


def set_dotted(tree: dict[str, Any], dotted: str, value: Any, root: type[BaseModel] = ExperimentConfig) -> None:
    """Set `a.b.c` in a nested dict, refusing paths the config tree does not have (with a hint)."""
    parts = dotted.split(".")
    model: type[BaseModel] | None = root
    node = tree
    for depth, part in enumerate(parts):
        if model is not None and part not in model.model_fields:
            valid = sorted(model.model_fields)
            close = difflib.get_close_matches(part, valid, n=1)
            hint = f"; did you mean '{'.'.join(parts[:depth] + [close[0]])}'?" if close else ""
            raise GatelabError(f"{dotted}: unknown key '{part}'{hint} (valid keys here: {', '.join(valid)})")
        if depth == len(parts) - 1:
            node[part] = value
            return
        model = submodel_of(model.model_fields[part].annotation) if model is not None else None
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key repeated in one mapping: PyYAML keeps the last one silently, so a second `train:`
    block would replace the first without a word."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` keys may be overridden: that is their use
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, typing.Hashable) and key in first_line:
                raise _DuplicateKey(f"key '{key}' appears twice in the same mapping, at lines {first_line[key]} and "
                                    f"{line}; keep one of them (YAML would silently use the last)")
            first_line.setdefault(key, line)
        return super().construct_mapping(node, deep=deep)

    def get_single_node(self):
        # Nested aliases (`&a [*a, *a, ...]` a few levels deep) expand to billions of elements wherever the value is
        # walked or printed: refuse a document beyond any config's size before anything reads it.
        node = super().get_single_node()
        if node is not None and _expanded_size(node, {}) > MAX_YAML_NODES:
            raise _DuplicateKey(f"the document expands to more than {MAX_YAML_NODES:,} values through its aliases "
                                "(*name); a gatelab file needs far fewer: write the values out")
        return node


MAX_YAML_NODES = 1_000_000


def _expanded_size(node: yaml.Node, sizes: dict[int, int]) -> int:
    """Nodes in `node` with every alias expanded, counted once per node object (so nested aliases cost no time)."""
    if id(node) not in sizes:
        sizes[id(node)] = 1  # a node reached again while counting it (a recursive alias) counts once
        if isinstance(node, yaml.SequenceNode):
            sizes[id(node)] += sum(_expanded_size(child, sizes) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            sizes[id(node)] += sum(_expanded_size(key, sizes) + _expanded_size(value, sizes)
                                   for key, value in node.value)
    return sizes[id(node)]


class _DuplicateKey(yaml.YAMLError):
    """A YAML file gatelab refuses though PyYAML would load it (a repeated key, too many aliases)."""


def _load_yaml(text: str, source: str) -> Any:
    """`text` parsed with duplicate keys refused; YAML errors become a GatelabError naming `source` and the line."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)
    except _DuplicateKey as exc:
        raise GatelabError(f"{source}: {exc}") from None
    except yaml.YAMLError as exc:
        for mark in (getattr(exc, "context_mark", None), getattr(exc, "problem_mark", None)):
            if mark is not None:
                mark.name = source  # PyYAML would say "<unicode string>"
        raise GatelabError(f"{source}: not valid YAML: {exc}") from None


def _read_text(path: Path) -> str:
    if path.is_dir():
        raise GatelabError(f"{path}: is a folder, not a YAML file; name a file inside it")
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise GatelabError(f"{path}: no such file") from None
    except OSError as exc:
        raise GatelabError(f"{path}: cannot be read ({exc.strerror}); check that it is a file this user may read") \
            from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise GatelabError(f"{path}: byte 0x{raw[exc.start]:02x} at offset {exc.start} (line {line}) is not UTF-8; "
                           "save the file as UTF-8") from None


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    data = _load_yaml(_read_text(path), str(path))
    if not isinstance(data, dict):
        raise GatelabError(f"{path}: expected a mapping of keys at the top level, got {type(data).__name__}")
    return data


def read_experiment_tree(path: str | Path, overrides: typing.Sequence[str] = ()) -> dict[str, Any]:
    """An experiment preset's keys with `key.path=value` overrides applied; errors name the file and key."""
    data = read_yaml(path)
    for assignment in overrides:
        key, value = parse_assignment(assignment)
        try:
            set_dotted(data, key, value)
        except GatelabError as exc:
            raise GatelabError(f"{path}: --set {exc}") from None
    return data


def to_yaml(config: BaseModel) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
