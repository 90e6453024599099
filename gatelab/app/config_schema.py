"""`gatelab config schema`: every key of an experiment file and of a sweep file, read from their pydantic models, as
the markdown reference page (experiments/CONFIG.md) or as the JSON Schema an editor's YAML language server reads.

Each key's help is its field's `description`; `keys_without_help` names the keys that lack one, so a test fails on a
new key without help. The page is deterministic (no dates, no paths of this machine): a test keeps the committed page
equal to `reference_page()`.
"""

from __future__ import annotations

import inspect
import json
import types
import typing
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import to_jsonable_python

from gatelab.config import ATTENTION_KINDS, ExperimentConfig, ModelConfig
from gatelab.sweep.sweep_file import SweepFile

FILE_KINDS: dict[str, type[BaseModel]] = {"experiment": ExperimentConfig, "sweep": SweepFile}
FILE_TITLES = {"experiment": "Experiment file (a preset such as experiments/tiny.yaml)",
               "sweep": "Sweep file (such as sweeps/quickstart.yaml)"}
JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"  # the dialect pydantic writes
PAGE_INTRO = """# Configuration reference

Every key of an experiment file and of a sweep file: its type, default, allowed values and what it does. This page
is made by `gatelab config schema` from the pydantic models in gatelab/config.py and gatelab/sweep/sweep_file.py,
and tests/app/test_config_schema.py keeps it equal to that command's output: to change it, change a model's
`Field(description=...)` and run `gatelab config schema > experiments/CONFIG.md`.

For an editor, `gatelab config schema --json --kind experiment` (or `--kind sweep`) prints the JSON Schema of one
kind of file: save it, e.g. as experiment.schema.json, and a YAML language server (VS Code's YAML extension, for one)
checks and completes a file whose first line is `# yaml-language-server: $schema=experiment.schema.json`.

A key `a.b[].c` is the key `c` of each item of the list `a.b`; `a.<name>.c` is the key `c` of each value of the
mapping `a`. `--set`, and a sweep's `grid`, `zip`, `overrides` and ladder rungs, name experiment keys by their
dotted paths, e.g. `train.lr`.
"""

_UNIONS = (typing.Union, types.UnionType)


def _nested_model(annotation: Any) -> tuple[type[BaseModel], str] | None:
    """The model inside an annotation such as `MoEConfig | None`, and how a dotted key reaches into it: "" (the value
    itself), "[]" (each item of a list) or ".<name>" (each value of a mapping)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, ""
    origin = typing.get_origin(annotation)
    for arg in typing.get_args(annotation):
        found = _nested_model(arg)
        if found is not None:
            model, reach = found
            step = "[]" if origin in (list, tuple) else ".<name>" if origin is dict else ""
            return model, step + reach
    return None


def model_sections(root: type[BaseModel], *, path: str = "") -> list[tuple[str, type[BaseModel]]]:
    """(dotted path, model) for `root` and every model nested in it, depth first in the fields' order."""
    sections = [(path, root)]
    for name, field in root.model_fields.items():
        found = _nested_model(field.annotation)
        if found is not None:
            model, reach = found
            sections += model_sections(model, path=(f"{path}.{name}" if path else name) + reach)
    return sections


def _keys(root: type[BaseModel]) -> list[tuple[str, FieldInfo]]:
    return [(f"{path}.{name}" if path else name, field)
            for path, model in model_sections(root) for name, field in model.model_fields.items()]


def keys_without_help(root: type[BaseModel]) -> list[str]:
    """The dotted keys of `root`'s tree whose field has no `description` (the help the reference page prints)."""
    return [key for key, field in _keys(root) if not (field.description or "").strip()]


def _type_name(annotation: Any) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return " | ".join(dict.fromkeys(type(value).__name__ for value in args))
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin in _UNIONS:
        return " | ".join(dict.fromkeys(_type_name(arg) for arg in args))
    if origin in (list, tuple, dict):
        return f"{origin.__name__}[{', '.join(_type_name(arg) for arg in args)}]"
    if annotation is type(None):
        return "null"
    if annotation is Any:
        return "any"
    return getattr(annotation, "__name__", str(annotation))


_BOUNDS = {annotated_types.Gt: ("gt", ">"), annotated_types.Ge: ("ge", ">="), annotated_types.Lt: ("lt", "<"),
           annotated_types.Le: ("le", "<=")}


def _constraints(metadata: list[Any]) -> list[str]:
    found = []
    for item in metadata:
        if isinstance(item, FieldInfo):  # Annotated[float, Field(ge=0)] inside a tuple
            found += _constraints(item.metadata)
        elif type(item) in _BOUNDS:
            attribute, symbol = _BOUNDS[type(item)]
            found.append(f"{symbol} {getattr(item, attribute)}")
        elif isinstance(item, annotated_types.MinLen):
            found.append(f"at least {item.min_length} item(s)")
        elif getattr(item, "pattern", None):
            found.append(f"matches {item.pattern}")
    return found


def _allowed(annotation: Any) -> list[str]:
    """What a value may be beyond its type: a Literal's choices and the bounds inside the annotation."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return [json.dumps(value) for value in args]
    if origin is typing.Annotated:
        return _allowed(args[0]) + _constraints(list(args[1:]))
    return [allowed for arg in args for allowed in _allowed(arg)]


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return ""
    default = field.get_default(call_default_factory=True)
    if isinstance(default, BaseModel):
        return "{}"  # each of its keys takes its own default (its section below)
    return json.dumps(to_jsonable_python(default), ensure_ascii=False)


def _text(text: str) -> str:
    """Markdown text: `<name>` outside a code span would be read as an HTML tag (in a code span it is shown as is)."""
    parts = text.split("`")
    return "`".join(part if inside_code % 2 else part.replace("<", "\\<") for inside_code, part in enumerate(parts))


def _cell(text: str) -> str:
    """Text in a markdown table cell: a pipe, even in a code span, would end the cell."""
    return _text(text).replace("|", "\\|")


def _code(text: str) -> str:
    return f"`{text.replace('|', chr(92) + '|')}`" if text else ""


def _section(path: str, model: type[BaseModel]) -> list[str]:
    title = f"`{path}`: {model.__name__}" if path else f"Top level: {model.__name__}"
    lines = [f"### {title}", "", _text(inspect.cleandoc(model.__doc__ or "")), "",
             "| key | type | default | allowed | help |", "| --- | --- | --- | --- | --- |"]
    for name, field in model.model_fields.items():
        key = f"{path}.{name}" if path else name
        allowed = dict.fromkeys(_allowed(field.annotation) + _constraints(field.metadata))  # a tuple's repeat once
        default = _code(_default(field)) or "required"
        lines.append(f"| {_code(key)} | {_code(_type_name(field.annotation))} | {default} | "
                     f"{_code(', '.join(allowed))} | {_cell(field.description or '')} |")
    if model is ModelConfig:
        lines += ["", "Each `model.attention` kind, as a query's scaled causal scores s_j become the weights of the "
                  "values:", ""]
        lines += [f"- `{name}`: {_text(traits.doc)}" for name, traits in ATTENTION_KINDS.items()]
    return lines + [""]


def reference_page(kinds: tuple[str, ...] = tuple(FILE_KINDS)) -> str:
    """The markdown reference of the file kinds `kinds`: one section per model, the file's top level first, then each
    nested model in the order its fields are declared."""
    lines = PAGE_INTRO.splitlines() + [""]
    for kind in kinds:
        lines += [f"## {FILE_TITLES[kind]}", ""]
        for path, model in model_sections(FILE_KINDS[kind]):
            lines += _section(path, model)
    return "\n".join(lines).rstrip("\n") + "\n"


def json_schema(kind: str) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of one kind of file, for an editor: `# yaml-language-server: $schema=...`."""
    return {"$schema": JSON_SCHEMA_DIALECT, **FILE_KINDS[kind].model_json_schema()}
