"""`gatelab config show` and `gatelab sweep plan SWEEP --cell N`: the configuration a run would train, resolved and
printed without training (Lightning's `--print_config`, Hydra's `--cfg job`).

What is printed is what the run logs as `config/experiment.yaml` (redacted as the run redacts it), valid YAML that
`gatelab train` reads as it is and that gives the same spec hash; each value that differs from its default says in a
trailing comment where it came from. The resolved model (`config/model_resolved.yaml`: the variant applied, the FFN
narrowed by `match_params`) follows as a commented block, which YAML ignores.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
import yaml
from pydantic import BaseModel
from rich.console import Console
from rich.text import Text

from gatelab.app.train import command_overrides
from gatelab.config import ExperimentConfig, ModelConfig, flatten, setting_warnings, submodel_of
from gatelab.config_files import parse_assignment, read_yaml, to_yaml
from gatelab.errors import GatelabError, redact
from gatelab.host import cannot_compile

PRESET, SWEEP = "preset", "sweep"
COMMENT_COLUMN = 48  # where `# from` comments line up; a longer line takes its own


@dataclass(frozen=True)
class ResolvedConfig:
    """A run's configuration as the run would log it, with where each non-default value came from.

    `sources` maps an experiment leaf (flattened as `gatelab.config.flatten` does: `model.n_layers`, a list whole) to
    "preset", "sweep", "--set", "--variant" or "--seed"; `model_sources` maps a resolved model leaf (a gate by its
    index, `gates[1]`) to those or to "variant <id>" or "match_params"."""

    title: str
    experiment: ExperimentConfig
    model: ModelConfig
    spec_hash: str
    parameters: int
    sources: dict[str, str]
    model_sources: dict[str, str]
    notes: list[str] = field(default_factory=list)

    @property
    def experiment_yaml(self) -> str:
        """`config/experiment.yaml` as the run logs it."""
        return redact(to_yaml(self.experiment))

    @property
    def model_yaml(self) -> str:
        """`config/model_resolved.yaml` as the run logs it."""
        return redact(to_yaml(self.model))


@dataclass(frozen=True)
class Layer:
    """One source of values above the preset: its name and the keys it sets (a value's own key, or a block above
    it)."""

    name: str
    keys: Sequence[str] = ()

    def sets(self, leaf: str) -> bool:
        return any(leaf == key or leaf.startswith(key + ".") for key in self.keys)


def resolved_config(preset: Path, *, variant: str | None = None, overrides: Sequence[str] = (),
                    seed: int | None = None) -> ResolvedConfig:
    """What `gatelab train PRESET --variant V --seed S --set K=V ...` would train and log, resolved as it resolves it
    (the same `load_experiment`, so `model.vocab_size: auto` reads the tokenizer's size), without data or training.
    Raises GatelabError for a bad file, key, value or variant, as `gatelab train` does."""
    from gatelab.data.resolve import load_experiment

    experiment = load_experiment(preset, command_overrides(overrides, variant=variant, seed=seed))
    layers = [Layer("--set", [parse_assignment(assignment)[0] for assignment in overrides]),
              Layer("--variant", ["variant"] if variant else []), Layer("--seed", ["seed"] if seed is not None else [])]
    words = [str(preset), *(["--variant", variant] if variant else []), *(["--seed", str(seed)] if seed is not None
                                                                          else [])]
    words += [word for assignment in overrides for word in ("--set", assignment)]
    return _resolved(shlex.join(words), experiment, base=_preset_alone(read_yaml(preset), preset), layers=layers)


def cell_config(sweep_path: Path, *, cell: int, experiment: Path | None = None) -> ResolvedConfig:
    """`resolved_config` of cell `cell` (its # in `gatelab sweep plan` and `sweep status`) of a sweep: the values its
    name, overrides, grid or ladder set come from "sweep". Raises GatelabError for a cell the sweep does not have."""
    from gatelab.sweep.spec import load_sweep

    sweep = load_sweep(sweep_path, experiment)
    spec = next((spec for spec in sweep.runs if spec.index == cell), None)
    if spec is None:
        same = next((duplicate for duplicate in sweep.duplicates if duplicate.index == cell), None)
        if same is not None:
            raise GatelabError(f"--cell {cell}: {same}; show --cell {same.same_as}")
        raise GatelabError(f"--cell {cell}: sweep {sweep.name} ({sweep_path}) has no cell {cell}; its cells run from "
                           f"{sweep.runs[0].index} to {sweep.runs[-1].index} (the # column of `gatelab sweep plan "
                           f"{sweep_path}`)")
    base = _preset_alone(read_yaml(sweep.experiment_path), sweep.experiment_path)
    layers = [Layer(SWEEP, ["name", *sweep.file.overrides, *spec.cell])]
    resolved = _resolved(f"cell {cell} of sweep {sweep.name} ({sweep_path}) on {sweep.experiment_path}",
                         spec.experiment, base=base, layers=layers)
    if sweep.search is not None:
        resolved.notes.append(f"an Optuna search: each trial of this cell also sets {', '.join(sweep.search.params)} "
                              "and has a spec hash of its own; shown is the cell before any trial")
    return resolved


def _preset_alone(tree: dict[str, Any], path: Path) -> ExperimentConfig | None:
    """The preset's experiment without the layers above it, or None where it is not valid alone (a --set completes
    it): values the layers change without naming them (a ladder's rung) are found against it."""
    from gatelab.data.resolve import experiment_from_dict

    try:
        return experiment_from_dict(tree, str(path))
    except GatelabError:
        return None


def _resolved(title: str, experiment: ExperimentConfig, *, base: ExperimentConfig | None,
              layers: list[Layer]) -> ResolvedConfig:
    """The run's logged configs, spec hash and parameter count, made as gatelab.train.run and recording make them."""
    from gatelab.data.identity import spec_hash
    from gatelab.model import count_parameters, resolve_model

    model = resolve_model(experiment)  # GatelabError for a variant that does not fit the preset
    notes = [line.removeprefix("warning: ") for line in setting_warnings(experiment)]
    if experiment.train.compile and (why := cannot_compile(experiment.train.accelerator)):
        notes.append(f"train.compile: {why}; the run trains eager and logs train.compile false (the same spec hash)")
        experiment = experiment.with_train(compile=False)
    if redact(to_yaml(experiment)) != to_yaml(experiment):
        notes.append("a secret (a password in tracking.uri, say) is shown as ***, as the run logs it: write it back, "
                     "or pass --tracking-uri, before training from this file (tracking is not in the spec hash)")
    sources = experiment_sources(experiment, base=base, layers=layers)
    return ResolvedConfig(redact(title), experiment, model, spec_hash(experiment), count_parameters(model), sources,
                          model_sources(experiment, model=model, sources=sources), notes)


def default_leaves(config_type: type[BaseModel], *, prefix: str = "") -> dict[str, Any]:
    """Each leaf's pydantic default, keyed as `flatten` keys it; a required key has none (a required block: its
    leaves' defaults), and a block whose default is None is one leaf, None."""
    from pydantic_core import to_jsonable_python

    leaves: dict[str, Any] = {}
    for name, info in config_type.model_fields.items():
        key, block = prefix + name, submodel_of(info.annotation)
        if info.is_required():
            leaves |= default_leaves(block, prefix=key + ".") if block is not None else {}
            continue
        default = info.get_default(call_default_factory=True)
        if isinstance(default, BaseModel):
            leaves |= flatten(default, key + ".")
        else:
            leaves[key] = to_jsonable_python(default)
    return leaves


def experiment_sources(experiment: ExperimentConfig, *, base: ExperimentConfig | None,
                       layers: Sequence[Layer]) -> dict[str, str]:
    """Where each experiment leaf that differs from its default came from: the last layer that sets its key; else,
    where `base` (the preset alone) holds another value, the last layer that sets anything; else the preset."""
    defaults = default_leaves(ExperimentConfig)
    before = flatten(base) if base is not None else {}
    last = next((layer.name for layer in reversed(layers) if layer.keys), PRESET)
    sources = {}
    for leaf, value in flatten(experiment).items():
        if leaf in defaults and defaults[leaf] == value:
            continue
        setter = next((layer.name for layer in reversed(layers) if layer.sets(leaf)), None)
        sources[leaf] = setter or (last if base is not None and before.get(leaf) != value else PRESET)
    return sources


def model_sources(experiment: ExperimentConfig, *, model: ModelConfig, sources: dict[str, str]) -> dict[str, str]:
    """Where each resolved model leaf that differs from its default came from: the variant that adds a gate (gates by
    index, `gates[1]`) or changes a field, `match_params` (the FFN narrowed), or where the experiment's key came
    from."""
    from gatelab.variants import get_variant, variant_ids

    by_variant: dict[str, str] = {}
    gate = len(experiment.model.gates)
    for variant_id in variant_ids(experiment.variant):
        variant = get_variant(variant_id)
        by_variant |= {f"gates[{index}]": f"variant {variant_id}" for index in range(gate, gate + len(variant.gates))}
        by_variant |= {dotted: f"variant {variant_id}" for dotted in variant.model_changes}
        gate += len(variant.gates)
    defaults, before = default_leaves(ModelConfig), flatten(experiment.model)
    found = {}
    for leaf, value in flatten(model).items():
        if leaf == "gates":
            found |= {f"gates[{index}]": by_variant.get(f"gates[{index}]") or sources.get("model.gates", PRESET)
                      for index in range(len(value))}
        elif value != before.get(leaf):
            matched = leaf == "ffn_hidden" and model.match_params and leaf not in by_variant
            found[leaf] = "match_params" if matched else by_variant.get(leaf, f"variant {experiment.variant}")
        elif leaf not in defaults or defaults[leaf] != value:
            found[leaf] = sources.get(f"model.{leaf}", PRESET)
    return found


# --- printing --------------------------------------------------------------------------------------------------------


def with_sources(text: str, *, sources: dict[str, str]) -> str:
    """`text` (YAML) with `# from <source>` after each line whose key (or list item, `gates[1]`) has a source, lined
    up; a value spread over several lines gets none, and where a comment would change what the text loads (it should
    not), the text comes back as it was."""
    lines = text.splitlines()
    marks: dict[int, str] = {}
    for path, line, value in _keys(yaml.compose(text)):
        if path in sources and (not isinstance(value, yaml.ScalarNode) or value.end_mark.line == line):
            marks.setdefault(line, sources[path])
    width = min(COMMENT_COLUMN, max((len(lines[line]) for line in marks), default=0))
    marked = "\n".join(f"{line.ljust(width)}  # from {marks[number]}" if number in marks else line
                       for number, line in enumerate(lines)) + "\n"
    return marked if yaml.safe_load(marked) == yaml.safe_load(text) else text


def _keys(node: yaml.Node, prefix: str = ""):
    """(dotted path, line of its key or list item, value node) of every mapping key and list item under `node`."""
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            path = prefix + key.value
            yield path, key.start_mark.line, value
            yield from _keys(value, path + ".")
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            path = f"{prefix.removesuffix('.')}[{index}]"
            yield path, item.start_mark.line, item
            yield from _keys(item, path + ".")


def render(config: ResolvedConfig) -> str:
    """The header (spec hash, parameters, notes), the experiment YAML with its sources, and the resolved model as a
    commented block: a file that `gatelab train` reads as it is."""
    header = [f"# {config.title}, resolved without training",
              f"# spec hash {config.spec_hash}, {config.parameters:,} parameters",
              "# config/experiment.yaml as the run logs it: `gatelab train` on this file trains this run. `# from` "
              "says where each value that differs from its default came from.",
              *(f"# note: {note}" for note in config.notes)]
    model = with_sources(config.model_yaml, sources=config.model_sources)
    return "\n".join([*header, "", with_sources(config.experiment_yaml, sources=config.sources).rstrip("\n"), "",
                      "# config/model_resolved.yaml, the model the run builds from the keys above (the variant "
                      "applied):", *(f"# {line}".rstrip() for line in model.splitlines())]) + "\n"


def print_resolved(config: ResolvedConfig) -> None:
    typer.echo(render(config), nl=False)


def show(
    experiment: Annotated[Path, typer.Argument(help="an experiment preset, e.g. experiments/tiny.yaml")], *,
    variant: Annotated[Optional[str], typer.Option(help="a registry id; '+' composes, e.g. "
                                                        "g1_elem_sig+g2_elem_sig")] = None,
    seed: Annotated[Optional[int], typer.Option(help="overrides the preset's seed")] = None,
    set_: Annotated[list[str], typer.Option("--set", help="KEY.PATH=VALUE override, repeatable")] = [],
) -> None:
    """The configuration `gatelab train` would train with the same arguments, without training: the experiment as the
    run logs it (save it and train it: the same spec hash), where each value came from, the spec hash, the parameter
    count and the resolved model."""
    try:
        print_resolved(resolved_config(experiment, variant=variant, overrides=set_, seed=seed))
    except GatelabError as error:  # as gatelab.cli's commands end: one message, exit code 2
        Console(stderr=True).print(Text.assemble(("error:", "bold red"), " ", redact(str(error))), highlight=False,
                                   soft_wrap=True)
        raise typer.Exit(code=2) from None
