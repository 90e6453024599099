"""Model sizes as an axis of a sweep (a sweep file's `ladder:` block, `gatelab.sweep.sweep_file.Ladder`).

Every cell of the grid runs at every rung, the rung outermost: the cell gains `rung: <name>` (a setting like any axis,
so `gatelab table` groups rows by it and `exclude` can drop e.g. {rung: m, variant: g1_head_sig}), the rung's `model.*`
values (after `overrides`, before the cell's own values), and train.max_steps from the ladder's tokens rule. The rule
is read off the cell's config with variant := baseline, so every variant of a rung trains the same steps on the same
tokens, and a gate's extra parameters buy it no extra data:

    per_parameter: max_steps = ceil(per_parameter x baseline parameters / (batch_size x seq_len))
    flops:         max_steps = ceil(flops / the baseline's training FLOPs a step, as `gatelab sweep plan` counts them)

Parameters are `count_parameters` (tied embeddings once, the embedding included, as the plan's `total` column).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from gatelab.config import ExperimentConfig
from gatelab.config_files import set_dotted
from gatelab.errors import GatelabError
from gatelab.sweep.flops import run_training_flops
from gatelab.sweep.sweep_file import Ladder, RungTokens, SweepFile

RUNG = "rung"  # the cell key naming a run's rung
STEPS_KEY = "train.max_steps"

Checker = Callable[[dict[str, Any]], tuple[ExperimentConfig | None, list[str]]]


def rung_steps(baseline: ExperimentConfig, tokens: RungTokens) -> int:
    """train.max_steps of every run of a rung, from the baseline's model at that rung (module docstring)."""
    from gatelab.model.params import count_parameters, resolve_model  # torch: only once a sweep is being resolved

    step_tokens = baseline.train.batch_size * baseline.data.seq_len
    if tokens.per_parameter is not None:  # Fractions: 10 x 12,800 / 1,280 is 100 steps, not 101 by a rounding error
        total = count_parameters(resolve_model(baseline, "baseline"))
        wanted = Fraction(repr(tokens.per_parameter)) * total / step_tokens
    else:
        per_step = run_training_flops(baseline.model_copy(update={"variant": "baseline"}), tokens=step_tokens)
        wanted = Fraction(repr(tokens.flops)) / Fraction(per_step)
    return max(1, math.ceil(wanted))


def rule_text(tokens: RungTokens) -> str:
    if tokens.per_parameter is not None:
        return f"{tokens.per_parameter:g} tokens a parameter"
    return f"{tokens.flops:.3g} FLOPs a run"


def ladder_cells(ladder: Ladder, product: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The grid's cells at every rung, the rung outermost (cell indices run through a rung before the next)."""
    return [{RUNG: name, **cell} for name in ladder.rungs for cell in product]


def ladder_problems(sweep_file: SweepFile) -> list[str]:
    """What makes a ladder unusable before any cell is resolved, each line naming its key and the fix."""
    ladder = sweep_file.ladder
    if ladder is None:
        return [f"{where}.{RUNG}: there is no ladder: block to take a rung from; add one, or drop {RUNG}"
                for where, keys in _set_elsewhere(sweep_file) if RUNG in keys]
    problems = []
    seen: dict[str, str] = {}
    for name, values in ladder.rungs.items():
        for key in values:
            if not key.startswith("model."):
                problems.append(f"ladder.rungs.{name}.{key}: a rung sets the model's size, model.* keys only; set "
                                f"{key} in overrides (every run) or grid (an axis)")
                continue
            try:
                set_dotted({}, key, None)
            except GatelabError as exc:  # an unknown key, with the close ones
                problems.append(f"ladder.rungs.{name}.{exc}")
        same = seen.setdefault(repr(sorted(values.items(), key=repr)), name)
        if same != name:
            problems.append(f"ladder.rungs.{name}: the same model values as rung {same}; give each rung its own size")
    sized = {key: [name for name, values in ladder.rungs.items() if key in values]
             for values in ladder.rungs.values() for key in values}
    for where, keys in _set_elsewhere(sweep_file):
        for key in keys:
            if key == STEPS_KEY:
                problems.append(f"{where}.{key}: the ladder's tokens rule ({rule_text(ladder.tokens)}) sets each "
                                f"rung's steps; drop {key} from {where.split('[')[0]} (or drop the ladder to set "
                                "steps yourself)")
            elif key in sized and where != "overrides":
                problems.append(f"{where}.{key}: also set by ladder rung(s) {', '.join(sized[key])}; the rung decides "
                                "the model's size, so drop it here or from the rungs")
            elif key == RUNG and not where.startswith("include"):
                problems.append(f"{where}.{RUNG}: ladder.rungs is the rung axis already; drop {RUNG} here (to skip "
                                "a rung for some runs, exclude: [{rung: <name>, ...}])")
    for index, cell in enumerate(sweep_file.include):
        if cell.get(RUNG) not in ladder.rungs:
            given = f"'{cell[RUNG]}' is not a rung" if RUNG in cell else "missing; every run of a ladder names its rung"
            problems.append(f"include[{index}].{RUNG}: {given} (one of {', '.join(ladder.rungs)})")
    return problems


def _set_elsewhere(sweep_file: SweepFile) -> list[tuple[str, list[str]]]:
    """Each block that sets keys of a run besides the ladder, with the keys it sets."""
    blocks = [("grid", list(sweep_file.grid)), ("zip", list(sweep_file.zip)),
              ("overrides", list(sweep_file.overrides))]
    blocks += [(f"include[{index}]", list(cell)) for index, cell in enumerate(sweep_file.include)]
    if sweep_file.search is not None:
        blocks.append(("search.params", list(sweep_file.search.params)))
    return blocks


def set_rung_model(tree: dict[str, Any], ladder: Ladder, rung: str) -> None:
    """The rung's model.* values into a run's config tree (paths checked by ladder_problems)."""
    for key, value in ladder.rungs[rung].items():
        set_dotted(tree, key, value)


def set_rung_steps(tree: dict[str, Any], ladder: Ladder, check: Checker) -> list[str]:
    """train.max_steps of `tree` (a cell at its rung, every other value set) from the ladder's rule, read off the same
    tree with variant baseline; the baseline's problems where it is no valid run (nothing else is checked then)."""
    baseline, problems = check({**tree, "variant": "baseline"})
    if baseline is None:
        return problems
    set_dotted(tree, STEPS_KEY, rung_steps(baseline, ladder.tokens))
    return []
