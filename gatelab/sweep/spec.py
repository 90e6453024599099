"""A sweep file -> validated, hashed RunSpecs: the grid is checked cell by cell before anything runs.

A sweep is an experiment preset plus axes (see `SweepFile` for the keys). Expansion order, which fixes each cell's
`index`: the `grid` product (axes in file order, the first axis outermost), each grid cell multiplied by the rows of
`zip` (zip innermost), minus the cells `exclude` matches, then the `include` cells in file order. With no grid and no
zip the product is one empty cell (the preset itself) unless `include` is given, in which case the includes are the
runs. `exclude` acts on the product only: an include is always run. A `ladder` multiplies the product by its rungs,
the rung outermost (`gatelab.sweep.ladder`); an include then names its rung.

Each cell resolves as: preset, then `overrides`, then its rung's model values, then the cell's own values (so a cell
wins over an override), then its rung's train.max_steps, then `name` := the sweep's name. Two cells that resolve to the
same config (same `spec_hash`) are one run: the first is kept, the others are listed in `Sweep.duplicates`; indices are
not renumbered, so `cell 7` means the same cell in an error message, the plan and the ledger.
"""

from __future__ import annotations

import copy
import difflib
import itertools
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gatelab.config import DataConfig, ExperimentConfig, format_validation_error
from gatelab.config_files import read_yaml, set_dotted
from gatelab.data.identity import spec_hash
from gatelab.data.resolve import VocabularyTooSmall, experiment_from_dict, resolve_experiment
from gatelab.data.tokenizer import TRAINED_BPE
from gatelab.errors import GatelabError
from gatelab.metrics import KEY_METRICS, find, names_for
from gatelab.progress import CommandClock
from gatelab.sweep.ladder import RUNG, ladder_cells, ladder_problems, set_rung_model, set_rung_steps
from gatelab.sweep.sweep_file import Ladder, SearchParam, SearchSpace, SweepFile
from gatelab.variants import variant_ids

MAX_LISTED_LINES = 20  # an error listing longer than this ends in "and N more"
MAX_COMBINATIONS = 4096  # searched values checked together; beyond, the corners of the space (each range's ends)
# A grid larger than this is refused from its axes' lengths alone, before a cell is made: each cell is checked, planned
# and run as a training run of its own, and a million took 85 s to check before anything could be said about them.
MAX_CELLS = 10_000
PROGRESS_AFTER_S = 5.0  # loading or planning a sweep that takes longer says how far it is, every PROGRESS_AFTER_S
_RESERVED = {"name": "the run's name is the sweep's name; rename the sweep instead"}


# --- what a sweep expands to ----------------------------------------------------------------------------------------


def format_value(value: Any) -> str:
    """A cell value as a user would write it: 0.004, 1e-05, true, null, [1,2]."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, float):
        return repr(value)  # the shortest text that reads back as the same float
    if isinstance(value, list | tuple | dict):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def format_cell(cell: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{key}: {format_value(value)}" for key, value in cell.items()) + "}"


@dataclass(frozen=True)
class RunSpec:
    """One run of a sweep: its cell and the fully resolved experiment (preset + overrides + cell)."""

    sweep: str  # the sweep's name
    index: int  # cell number in expansion order; stable for a given sweep file
    cell: dict[str, Any]  # the cell's axis values, canonicalised by the config ("1e-3" -> 0.001)
    experiment: ExperimentConfig  # experiment.name is the sweep's name
    hash: str  # spec_hash(experiment): the run's identity

    def settings(self) -> dict[str, Any]:
        """The cell without `variant` and `seed`."""
        return {key: value for key, value in self.cell.items() if key not in ("variant", "seed")}

    def label(self) -> str:
        """'g1_elem_sig s1 train.lr=0.004': the variant and seed always, then the cell's other values."""
        parts = [self.experiment.variant, f"s{self.experiment.seed}"]
        return " ".join(parts + [f"{key}={format_value(value)}" for key, value in self.settings().items()])


@dataclass(frozen=True)
class Duplicate:
    """A cell dropped because it resolves to the same config as an earlier one."""

    index: int
    cell: dict[str, Any]
    same_as: int

    def __str__(self) -> str:
        return f"cell {self.index} {format_cell(self.cell)} is the same run as cell {self.same_as}: run once"


@dataclass(frozen=True)
class Sweep:
    """A loaded, fully validated sweep file."""

    path: Path
    name: str
    experiment_path: Path  # the preset used (the file's `experiment`, or --experiment)
    file: SweepFile
    runs: tuple[RunSpec, ...]
    duplicates: tuple[Duplicate, ...] = field(default=())

    @property
    def retries(self) -> int:
        return self.file.retries

    @property
    def paper(self) -> str | None:
        return self.file.paper

    @property
    def search(self) -> SearchSpace | None:
        return self.file.search

    @property
    def ladder(self) -> Ladder | None:
        return self.file.ladder


def expand(sweep: Sweep) -> list[RunSpec]:
    """The sweep's runs in expansion order, duplicates removed (validation happened in `load_sweep`)."""
    return list(sweep.runs)


def with_values(spec: RunSpec, values: dict[str, Any]) -> RunSpec:
    """`spec` with more dotted keys set (a search trial's suggestions): a new cell, experiment and hash."""
    tree = spec.experiment.model_dump(mode="json")
    for key, value in values.items():
        set_dotted(tree, key, value)
    experiment = experiment_from_dict(tree, f"sweep {spec.sweep}, cell {spec.index} {format_cell(values)}")
    return RunSpec(spec.sweep, spec.index, {**spec.cell, **values}, experiment, spec_hash(experiment))


# --- loading --------------------------------------------------------------------------------------------------------


def load_sweep(path: str | Path, experiment_override: str | Path | None = None) -> Sweep:
    """Read, expand and validate a sweep file; one GatelabError lists every problem. Creates no files.

    `experiment_override` (the CLI's --experiment) is a path as the user typed it; the file's own `experiment:` key is
    relative to the sweep file's folder.
    """
    path = Path(path)
    source = str(path)
    data = read_yaml(path)
    try:
        sweep_file = SweepFile.model_validate(data)
    except ValidationError as exc:
        raise GatelabError(format_validation_error(exc, source, SweepFile)) from None

    too_large = _size_problems(sweep_file)
    problems = _structure_problems(sweep_file) + too_large
    if experiment_override is not None:
        experiment_path = Path(experiment_override)
    elif sweep_file.experiment is not None:
        experiment_path = Path(os.path.normpath(path.parent / sweep_file.experiment))
    else:
        experiment_path = None
        problems.append(f"experiment: missing; name a preset relative to {path.parent}/ or pass --experiment")
    cells = [] if too_large else _cells(sweep_file, problems)  # never a million dicts to say there are too many
    if problems:
        raise GatelabError(f"{source}: invalid sweep\n" + "\n".join(f"  {p}" for p in problems))

    try:
        base = read_yaml(experiment_path)
        base["name"] = sweep_file.name
        experiment_from_dict(base, str(experiment_path))  # the preset alone must be valid
    except GatelabError as exc:
        raise GatelabError(f"{source}: experiment: {exc}") from None

    resolved: list[tuple[int, dict[str, Any], ExperimentConfig, str]] = []
    cell_problems: list[tuple[int, dict[str, Any], str]] = []
    check, progress = _CellChecker(sweep_file), Progress(f"checking {source}", len(cells))
    for index, cell in enumerate(cells):
        progress(index)
        experiment, found = _resolve_cell(base, sweep_file, cell, check)
        if found:
            cell_problems += [(index, cell, problem) for problem in found]
        elif not cell_problems:  # once one cell is bad nothing runs: the others are only checked
            resolved.append((index, _canonical(cell, experiment), experiment, spec_hash(experiment)))
    if cell_problems:
        raise GatelabError(_cell_report(source, cell_problems, len(cells)))
    if sweep_file.search is not None:
        distinct = {experiment.data.model_dump_json(): experiment for _, _, experiment, _ in resolved}
        problem = _search_metric_problem(sweep_file.search, list(distinct.values()))
        if problem:
            raise GatelabError(f"{source}: {problem}; nothing was run")

    problem = _token_budget_problem([experiment for _, _, experiment, _ in resolved])
    if problem:
        raise GatelabError(f"{source}: {problem}; nothing was run")
    runs, duplicates = _runs_once(sweep_file.name, resolved)
    return Sweep(path, sweep_file.name, experiment_path, sweep_file, runs, duplicates)


def _token_budget_problem(experiments: list[ExperimentConfig]) -> str | None:
    """Why the cells' eval.budget.tokens would not score one text: their tokenizers differ (a tokenizer file or Hub
    name and its framing, or the trained BPE's vocabulary size), and N tokens of each is other text; else None."""
    if not any(e.eval.budget is not None and e.eval.budget.tokens is not None for e in experiments):
        return None
    tokenizers = {(e.data.tokenizer, e.data.bos_token, e.data.eos_token,
                   e.model.vocab_size if e.data.tokenizer == TRAINED_BPE else None) for e in experiments}
    if len(tokenizers) < 2:
        return None
    return (f"eval.budget.tokens: the cells use {len(tokenizers)} tokenizers (data.tokenizer, or model.vocab_size of "
            "the trained BPE), and the same number of tokens is other held-out text under each, so their scores would "
            "not compare; use eval.budget.bytes or eval.budget.documents, the same text under any tokenizer")


def _runs_once(sweep_name: str, resolved: list[tuple[int, dict[str, Any], ExperimentConfig, str]],
               ) -> tuple[tuple[RunSpec, ...], tuple[Duplicate, ...]]:
    """The cells as runs, each config once: a cell of the same spec hash as an earlier one is a Duplicate."""
    runs: list[RunSpec] = []
    duplicates: list[Duplicate] = []
    first_of: dict[str, int] = {}
    for index, cell, experiment, digest in resolved:
        if digest in first_of:
            duplicates.append(Duplicate(index, cell, first_of[digest]))
            continue
        first_of[digest] = index
        runs.append(RunSpec(sweep_name, index, cell, experiment, digest))
    return tuple(runs), tuple(duplicates)


def _dotted_problem(where: str, key: str) -> str | None:
    if key.split(".")[0] in _RESERVED:
        return f"{where}{key}: {_RESERVED[key.split('.')[0]]}"
    try:
        set_dotted({}, key, None)
    except GatelabError as exc:
        return f"{where}{exc}"
    return None


def _structure_problems(sweep_file: SweepFile) -> list[str]:
    """Problems of the file as a whole (not of one cell): empty axes, zip lengths, keys that can never apply."""
    problems: list[str] = []
    for block, axes in (("grid", sweep_file.grid), ("zip", sweep_file.zip)):
        for axis, values in axes.items():
            if not values:
                problems.append(f"{block}.{axis}: empty list; an axis needs at least one value")
            if axis.split(".")[0] in _RESERVED:
                problems.append(f"{block}.{axis}: {_RESERVED[axis.split('.')[0]]}")
    lengths = {axis: len(values) for axis, values in sweep_file.zip.items()}
    if len(set(lengths.values())) > 1:
        listed = ", ".join(f"{axis}: {n}" for axis, n in lengths.items())
        problems.append(f"zip: lists of different lengths ({listed}); zipped axes move together, one value of each "
                        "per run, so they need the same length")
    for axis in sweep_file.zip:
        if axis in sweep_file.grid:
            problems.append(f"zip.{axis}: also an axis of grid; an axis belongs to grid or to zip, not both")
    for index, cell in enumerate(sweep_file.include):
        for key in cell:
            if key.split(".")[0] in _RESERVED:
                problems.append(f"include[{index}].{key}: {_RESERVED[key.split('.')[0]]}")
    for key in sweep_file.overrides:
        problem = _dotted_problem("overrides: ", key)
        if problem:
            problems.append(problem)

    problems += ladder_problems(sweep_file)
    axes = list(sweep_file.grid) + list(sweep_file.zip) + ([RUNG] if sweep_file.ladder else [])
    for index, partial in enumerate(sweep_file.exclude):
        if not partial:
            problems.append(f"exclude[{index}]: empty; give the axis values of the runs to drop")
        for key in partial:
            if key not in axes:
                close = difflib.get_close_matches(key, axes, n=1)
                hint = f"; did you mean '{close[0]}'?" if close else ""
                problems.append(f"exclude[{index}].{key}: not an axis of grid or zip{hint} "
                                f"(axes: {', '.join(axes) or 'none'})")

    if sweep_file.search is not None:
        set_elsewhere = set(axes) | set(sweep_file.overrides) | {k for cell in sweep_file.include for k in cell}
        for key in sweep_file.search.params:
            problem = _dotted_problem("search.params: ", key)
            if problem:
                problems.append(problem)
            elif key in set_elsewhere:
                problems.append(f"search.params.{key}: also set by grid, zip, include or overrides; a searched key "
                                "takes its values from the search only")
    return problems


def _size_problems(sweep_file: SweepFile) -> list[str]:
    """The grid's cell count, from its axes' lengths, where it is over MAX_CELLS (before excludes: they are read cell by
    cell)."""
    lengths = {axis: len(values) for axis, values in sweep_file.grid.items()}
    if sweep_file.zip:
        lengths["zip"] = min((len(values) for values in sweep_file.zip.values()), default=0)
    if sweep_file.ladder is not None:
        lengths[RUNG] = len(sweep_file.ladder.rungs)
    cells = math.prod(lengths.values()) + len(sweep_file.include)
    if cells <= MAX_CELLS:
        return []
    largest = ", ".join(f"{axis} {n:,}" for axis, n in sorted(lengths.items(), key=lambda item: -item[1])[:3])
    return [f"grid: {cells:,} cells (largest axes: {largest}), over the {MAX_CELLS:,} a sweep file may hold, each a "
            "training run checked and run one by one; split it into several sweep files, or sample the space with a "
            "search: block (search.params and search.n_trials, an Optuna search)"]


def _same(a: Any, b: Any) -> bool:
    """Equality that lets YAML's '1e-3' (a string to PyYAML) match 0.001."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if a == b:
        return True
    try:
        return math.isclose(float(a), float(b), rel_tol=1e-12, abs_tol=0.0)
    except (TypeError, ValueError):
        return False


def _cells(sweep_file: SweepFile, problems: list[str]) -> list[dict[str, Any]]:
    """Expansion order: grid product x zip rows, minus excludes, then includes (see the module docstring)."""
    grid_axes = list(sweep_file.grid)
    product = [dict(zip(grid_axes, values)) for values in itertools.product(*sweep_file.grid.values())]
    if sweep_file.zip:
        length = min(len(values) for values in sweep_file.zip.values())
        rows = [{axis: values[row] for axis, values in sweep_file.zip.items()} for row in range(length)]
        product = [{**grid_cell, **row} for grid_cell in product for row in rows]
    if not sweep_file.grid and not sweep_file.zip and sweep_file.include:
        product = []
    elif sweep_file.ladder is not None:
        product = ladder_cells(sweep_file.ladder, product)

    kept = []
    matched = [False] * len(sweep_file.exclude)
    for cell in product:
        hits = [i for i, partial in enumerate(sweep_file.exclude)
                if partial and all(key in cell and _same(cell[key], value) for key, value in partial.items())]
        for i in hits:
            matched[i] = True
        if not hits:
            kept.append(cell)
    for i, partial in enumerate(sweep_file.exclude):
        axes = {*sweep_file.grid, *sweep_file.zip, *([RUNG] if sweep_file.ladder else [])}
        if partial and not matched[i] and all(key in axes for key in partial):
            problems.append(f"exclude[{i}] {format_cell(partial)}: matches no run of the grid; check its values")
    cells = kept + [dict(cell) for cell in sweep_file.include]
    if not cells and not problems:
        problems.append("no runs: exclude drops every cell of the grid and there is no include")
    return cells


class Progress:
    """'<what>: N of M <unit>' on stderr once the command has said nothing for PROGRESS_AFTER_S, and again every
    PROGRESS_AFTER_S: the clock (gatelab.progress.CommandClock, started by each command) is shared by every Progress of
    the command, so a command of several phases (check the cells, price the runs) that each take less still speaks.
    A phase over within PROGRESS_AFTER_S / 5 says nothing: it was no wait, whoever spoke last (a library call in a
    process whose earlier command, not this one, set the clock). stdout stays the command's output (`--json`)."""

    def __init__(self, what: str, total: int, unit: str = "cells") -> None:
        self.what, self.total, self.unit = what, total, unit
        now = self.started = time.monotonic()
        # A phase starting long after the last one (a worker reloading its sweep an hour later) is new work: its
        # clock starts now, rather than saying "0 of N" at once.
        if CommandClock.last_word is None or now - CommandClock.last_word > 12 * PROGRESS_AFTER_S:
            CommandClock.last_word = now

    def __call__(self, done: int) -> None:
        now = time.monotonic()
        if now - self.started >= PROGRESS_AFTER_S / 5 and now - (CommandClock.last_word or now) >= PROGRESS_AFTER_S:
            print(f"{self.what}: {done} of {self.total} {self.unit}", file=sys.stderr, flush=True)
            CommandClock.last_word = now


class _CellChecker:
    """Checks resolved config trees as a run would be set up, with one answer per distinct tree: a search's values
    are checked against every cell, and cells that differ only in their seed share every answer."""

    def __init__(self, sweep_file: SweepFile) -> None:
        self.sweep_file = sweep_file
        self._answers: dict[str, tuple[ExperimentConfig | None, list[str]]] = {}

    def __call__(self, tree: dict[str, Any], model_too: bool = True) -> tuple[ExperimentConfig | None, list[str]]:
        seed = tree.get("seed")
        plain_seed = type(seed) is int  # any int is a valid seed; anything else is checked as part of the tree
        key = json.dumps({**tree, "seed": None if plain_seed else seed}, sort_keys=True, default=str) + str(model_too)
        if key not in self._answers:
            self._answers[key] = self._check(tree, model_too)
            return self._answers[key]
        experiment, found = self._answers[key]
        if experiment is not None and plain_seed and experiment.seed != seed:
            experiment = experiment.model_copy(update={"seed": seed})
        return experiment, found

    def _check(self, tree: dict[str, Any], model_too: bool) -> tuple[ExperimentConfig | None, list[str]]:
        from gatelab.model.params import resolve_model  # torch: imported only once a sweep is being resolved

        found = []
        if isinstance(tree.get("variant"), str):
            try:
                variant_ids(tree["variant"])
            except GatelabError as exc:
                found.append(f"variant: {exc}")
        try:
            experiment = resolve_experiment(ExperimentConfig.model_validate(tree))  # loads data.tokenizer
        except ValidationError as exc:
            found += [line.strip() for line in format_validation_error(exc, "").splitlines()[1:]]
        except VocabularyTooSmall as exc:
            found.append(str(exc))
        if found:
            return None, found
        if experiment.train.num_nodes > 1:
            found.append(f"train.num_nodes: {experiment.train.num_nodes} cannot run inside a sweep worker, which "
                         "trains on one machine; use 1, or start `gatelab train` on every node under srun or torchrun")
        if self.sweep_file.search is not None and experiment.train.devices not in (1, "auto"):
            found.append(f"train.devices: {experiment.train.devices} with a search: block is not supported (a pruned "
                         "trial cannot stop every DDP rank); use 1 device per trial and more workers")
        if found:
            return None, found
        if model_too:
            try:
                resolve_model(experiment)  # e.g. ref_add4experts on a dense preset
            except GatelabError as exc:
                return None, [str(exc)]
        return experiment, []


def _resolve_cell(base: dict[str, Any], sweep_file: SweepFile, cell: dict[str, Any],
                  check: _CellChecker) -> tuple[ExperimentConfig | None, list[str]]:
    """(the resolved experiment, []) or (None, the cell's problems, each naming its key)."""
    tree = copy.deepcopy(base)
    for key, value in sweep_file.overrides.items():
        set_dotted(tree, key, copy.deepcopy(value))  # paths checked in _structure_problems
    ladder = sweep_file.ladder if RUNG in cell else None  # ladder_problems saw that every cell has a rung
    if ladder is not None:
        set_rung_model(tree, ladder, cell[RUNG])
    problems = []
    for key, value in cell.items():
        try:
            if key != RUNG:
                set_dotted(tree, key, copy.deepcopy(value))
        except GatelabError as exc:
            problems.append(str(exc))  # reported with whatever else is wrong with the cell
    tree["name"] = sweep_file.name
    rung_problems = set_rung_steps(tree, ladder, check) if ladder is not None and not problems else []
    experiment, found = (None, rung_problems) if rung_problems else check(tree)
    problems += found
    if problems or sweep_file.search is None:
        return (None if problems else experiment), problems
    for key, param in sweep_file.search.params.items():
        problems += _search_problems(tree, key, param, check)
    if not problems:
        problems += _combination_problems(tree, sweep_file.search, check)
    return (None if problems else experiment), problems


def _combination_problems(tree: dict[str, Any], search: SearchSpace, check: _CellChecker) -> list[str]:
    """Where each searched value is valid alone, their combinations (up to MAX_COMBINATIONS of them: a range's ends,
    every choice) must be too: `train.lr` and `train.min_lr` each in range can still put min_lr above lr."""
    if len(search.params) < 2:
        return []
    values = [param.checked_values() for param in search.params.values()]
    if math.prod(len(v) for v in values) > MAX_COMBINATIONS:
        values = [[v[0], v[-1]] for v in values]  # the corners of the space
    for combination in itertools.product(*values):
        trial_tree = copy.deepcopy(tree)
        for key, value in zip(search.params, combination):
            set_dotted(trial_tree, key, value)
        _, found = check(trial_tree)
        if found:
            together = format_cell(dict(zip(search.params, combination)))
            return [f"search.params: together, {together} make an invalid run ({found[0]}); narrow the ranges so "
                    "that every combination is a valid run"]
    return []


def _search_problems(tree: dict[str, Any], key: str, param: SearchParam, check: _CellChecker) -> list[str]:
    """What is wrong with the run of `tree` at each value `param` may take (`SearchParam.checked_values`), as one line
    naming the key, the bad values and the fix: for an int range, the valid values as categorical choices."""
    bad: dict[Any, str] = {}
    good: list[Any] = []
    model_too = key.startswith("model.") or key == "variant"
    values = param.checked_values()
    for value in values:
        trial_tree = copy.deepcopy(tree)
        set_dotted(trial_tree, key, value)
        _, found = check(trial_tree, model_too=model_too)
        if found:
            bad[value] = found[0]
        else:
            good.append(value)
    if not bad:
        return []
    first, why = next(iter(bad.items()))
    if param.type == "float":
        return [f"search.params.{key} = {format_value(value)}: {problem}; narrow low and high to values that are "
                "valid" for value, problem in bad.items()]
    listed = ", ".join(format_value(value) for value in list(bad)[:12]) + (
        f" and {len(bad) - 12} more" if len(bad) > 12 else "")
    span = f"of {int(param.low)}..{int(param.high)} " if param.type == "int" else "of its choices "
    if not good:
        fix = "no value is valid for this cell: change the range or the cell"
    elif param.type == "int" and good == list(range(good[0], good[-1] + 1)):
        fix = f"narrow the range to low: {good[0]}, high: {good[-1]}"
    elif param.type == "int":
        fix = (f"search the valid ones only: {{type: categorical, choices: "
               f"[{', '.join(format_value(value) for value in good[:40])}{', ...' if len(good) > 40 else ''}]}}")
    else:
        fix = "drop them from choices"
    return [f"search.params.{key}: {listed} {span}make an invalid run (at {format_value(first)}: {why}); {fix}"]


# --- the metrics a run logs, for a search's `metric` ----------------------------------------------------------------


def _search_metric_problem(search: SearchSpace, experiments: list[ExperimentConfig]) -> str | None:
    """None where the search's metric is one the catalogue (gatelab.metrics) declares, a `ppl/<domain>` of a domain
    every cell's runs evaluate; else one line naming it, the close names and some metrics to pick from."""
    metric = find(search.metric)
    for experiment in experiments:
        domains = experiment.data.domains or DataConfig.model_fields["domains"].default or []
        domain = metric.filled(search.metric).get("domain") if metric is not None else None
        if metric is not None and (domain is None or domain in domains):
            continue
        close = _closest(search.metric, names_for(domains, experiment.eval.long_context_multipliers,
                                                  experiment.model.n_layers))
        hint = f"did you mean {' or '.join(repr(name) for name in close)}? " if close else ""
        return (f"search.metric: '{search.metric}' is not a metric a run logs, so there would be nothing to "
                f"{search.direction}; {hint}(e.g. {', '.join(KEY_METRICS[:3])}; gatelab.metrics lists every metric "
                "a run records, and the runs' metrics are listed in the MLflow UI)")
    return None


def _closest(name: str, names: list[str], cutoff: float = 0.6, most: int = 4) -> list[str]:
    """The names closest to `name` (difflib's ratio, at least `cutoff`): the best one, or those tied for best (up to
    `most`, in the order of `names`: `long_ppl/x` is as close to `long_ppl/x1` as to `long_ppl/x2`)."""
    ratios = [difflib.SequenceMatcher(None, name, candidate).ratio() for candidate in names]
    best = max(ratios, default=0.0)
    return [] if best < cutoff else [candidate for candidate, ratio in zip(names, ratios) if ratio == best][:most]


def _canonical(cell: dict[str, Any], experiment: ExperimentConfig) -> dict[str, Any]:
    """The cell with each scalar value as the config read it ('1e-3' -> 0.001), for labels, tables and matching."""
    dumped: Any = experiment.model_dump(mode="json")
    canonical = {}
    for key, value in cell.items():
        if key == RUNG:  # a name of the ladder, no key of the config
            canonical[key] = value
            continue
        node = dumped
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        canonical[key] = node if node is None or isinstance(node, bool | int | float | str) else value
    return canonical


def _cell_report(source: str, problems: list[tuple[int, dict[str, Any], str]], n_cells: int) -> str:
    """One line per distinct problem (its first cell named in full, the other cells by number), about 20 lines."""
    groups: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for index, cell, problem in problems:
        groups.setdefault(problem, []).append((index, cell))
    bad = len({index for index, _, _ in problems})
    lines = [f"{source}: {bad} of {n_cells} cells are invalid; nothing was run"]
    shown = 0
    for problem, cells in groups.items():
        block = [f"  cell {cells[0][0]} {format_cell(cells[0][1])}: {problem}"]
        if len(cells) > 1:
            others = [str(index) for index, _ in cells[1:]]
            listed = ", ".join(others[:12]) + (f" and {len(others) - 12} more" if len(others) > 12 else "")
            block.append(f"    the same in cell{'s' if len(others) > 1 else ''} {listed}")
        if len(lines) + len(block) > MAX_LISTED_LINES and shown:
            lines.append(f"  ... and {len(groups) - shown} more problems")
            break
        lines += block
        shown += 1
    return "\n".join(lines)
