"""The claims file (sweeps/claims/*.yaml): the paper's claims as data, each checked against the sweep it reads.

A claim names its sweep, the groups of runs it compares (a variant plus the sweep's other swept keys, written as
`gatelab table` prints them: "g1_elem_sig train.lr=0.002"), its kind and direction, its metric, the paper's figure, and
when it can be tested at this scale (`testable_if`). `load_claims` checks every sweep name against the sweep files in
the claims file's parent folder (sweeps/ for sweeps/claims/tiny.yaml), every variant and setting against that sweep's
expanded grid, and every paper table, column and row id against gatelab.paper. A renamed sweep, a misspelled variant or
a learning rate the sweep does not run is one GatelabError naming the file, the claim and the key, with the valid
values, before anything is read from a store.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import PositiveFloat, ValidationError, model_validator

from gatelab.config import StrictModel, format_validation_error
from gatelab.config_files import read_yaml
from gatelab.errors import GatelabError
from gatelab.metrics import PPL_AVG
from gatelab.paper import SWEEP_TABLES, missing_files, model_kinds, reference
from gatelab.sweep.ladder import RUNG
from gatelab.sweep.spec import expand, load_sweep

Kind = Literal["direction", "closeness", "level", "change", "rank", "lr sensitivity", "stable rate", "multiplier",
               "not addressed"]
Direction = Literal["lower", "higher"]
UNIFORM_FIRST_TOKEN = "uniform first-token attention"  # a named level: see claims.uniform_first_token_share
DIRECTED: tuple[str, ...] = ("direction", "level", "change", "lr sensitivity", "stable rate", "multiplier")
TWO_GROUPS: tuple[str, ...] = ("direction", "closeness", "change", "lr sensitivity", "stable rate", "multiplier")
ON_AN_AXIS: tuple[str, ...] = ("lr sensitivity", "stable rate", "multiplier")


class PaperFigure(StrictModel):
    """Where the paper's figure for a claim comes from: a table's column for the claim's rows, or words.

    The table says which of the paper's models the figure is from (gatelab.paper.TABLES: Table 2 dense; Tables 1, 3, 4
    and 6 MoE). A perplexity direction row compares its 95% interval with the figure's relative effect only where that
    model is the sweep's (dense or MoE): a dense row whose figure is an MoE one can never be "does not hold (the
    paper's size excluded)".
    """

    table: str | None = None  # a gatelab.paper.SWEEP_TABLES key
    column: str = "ppl"  # a column of gatelab.paper.reference(table): ppl, Gate Score, M-Act, F-Attn, ...
    ids: list[str] | None = None  # the paper's row ids for (a, b), or (a,) for a level, where they are not the variants
    # (a, b) row pairs of `table` whose relative differences (a - b) / b are the paper's effect as a range (e.g. G1
    # against the baseline in each block of Table 2); default: the one pair `ids` (or the variants of a and b)
    pairs: list[tuple[str, str]] | None = None
    text: str = ""  # the paper's figure in words, where no pair of rows gives it


class PaperGain(StrictModel):
    """Two rows of one of the paper's tables whose relative perplexity difference (ids[0] - ids[1]) / ids[1] is a
    gain of the paper's."""

    table: str  # a gatelab.paper.SWEEP_TABLES key, of the sweep's model (dense: table2; MoE: table1, table3, ...)
    ids: tuple[str, str]


class Margin(StrictModel):
    """A closeness claim's equivalence margin, relative to group b's mean and never measured on our runs: `fraction`
    times the paper's own gap for the claim's pair (`paper_gain`: the two rows of the paper that the claim compares,
    from the paper's model of the sweep's kind, dense or MoE), or a `relative` margin stated with its `reason` and a
    `positive_control`: two groups of the same sweep whose difference must exceed the margin, or the margin is too wide
    for the sweep to tell anything apart."""

    fraction: PositiveFloat | None = None
    paper_gain: PaperGain | None = None
    relative: PositiveFloat | None = None  # e.g. 0.01: +-1% of group b's mean
    reason: str = ""  # why a stated relative margin is the right one
    positive_control: tuple[str, str] | None = None  # (a, b): groups of the sweep, b the reference of the difference

    @model_validator(mode="before")
    @classmethod
    def _no_gain_from_our_runs(cls, data: Any) -> Any:
        if isinstance(data, dict) and "gain" in data:
            raise ValueError("margin.gain (a gain measured on our own runs) is gone: margins come from the paper; "
                             "write {fraction: 0.5, paper_gain: {table: table1, ids: [g1_elem_sig, baseline]}} or "
                             "{relative: 0.01, reason: ...}")
        return data

    @model_validator(mode="after")
    def _one_form(self) -> Margin:
        from_paper = (self.fraction is not None, self.paper_gain is not None)
        stated = (self.relative is not None, bool(self.reason))
        if not ((all(from_paper) and not any(stated)) or (all(stated) and not any(from_paper))):
            raise ValueError("a margin is either {fraction: F, paper_gain: {table: T, ids: [A, B]}} or "
                             "{relative: R, reason: WHY, positive_control: [A, B]}")
        if all(stated) and self.positive_control is None:
            raise ValueError("a stated margin needs positive_control: [A, B], two groups of the sweep whose difference "
                             "exceeds the margin (else no difference of that size could be told apart)")
        if all(from_paper) and self.positive_control is not None:
            raise ValueError("positive_control goes with a stated margin; a margin from the paper's gap needs none")
        return self


AXIS_RULES = ("unstable", "diverges")  # rules read over an axis of the grid (e.g. train.lr), not at one setting


class TestableIf(StrictModel):
    """A condition on the runs without which the claim cannot be tested at this scale, and what it means.

    rule above/below: the mean of `metric` over `group`'s ended runs is above (below) `level` (a number, or
        "uniform first-token attention": what causal attention spread evenly puts on token 0 at the runs' seq_len).
    rule moved: the mean is more than `by` away from `start` (a gate score from its value at initialisation).
    rule unstable: over `axis` (e.g. train.lr), `group` is unstable somewhere: a run diverged, or at a value of the
        axis above the one with the lowest mean `metric`, the mean is more than `by` above that lowest one.
    rule diverges: over `axis`, some run of `group` diverged (a rise in loss alone is not enough: the highest stable
        rate says nothing where every rate of the grid is stable).
    """

    __test__ = False  # not a pytest class, despite its name

    name: str | None = None  # set from the claims file's `preconditions`: rows naming one share its answer
    rule: Literal["above", "below", "moved", "unstable", "diverges"]
    group: str
    metric: str
    level: float | Literal["uniform first-token attention"] | None = None
    start: float | None = None
    by: PositiveFloat | None = None
    axis: str | None = None
    reason: str  # what "not testable" means here, in words

    @model_validator(mode="after")
    def _check(self) -> TestableIf:
        needs = {"above": ("level",), "below": ("level",), "moved": ("start", "by"), "unstable": ("axis", "by"),
                 "diverges": ("axis",)}
        missing = [key for key in needs[self.rule] if getattr(self, key) is None]
        if missing:
            raise ValueError(f"rule '{self.rule}' needs {' and '.join(missing)}")
        return self


class Claim(StrictModel):
    """One of the paper's claims, as the claims table tests it (see gatelab.report.claims for each kind's test)."""

    claim: str  # the statement, as the table prints it
    sweep: str | None = None  # the sweep (its `name:`) whose runs test it; none for a claim not addressed
    kind: Kind
    direction: Direction | None = None  # which way the paper says group a goes (against b, a level, or over the axis)
    a: str = ""  # the group the claim is about; for change, lr sensitivity and stable rate without the varied key
    b: str | None = None  # the group it is compared with
    metric: str = PPL_AVG  # an MLflow metric of the runs, or a key of claims.DERIVED
    level: float | None = None  # level: the claimed level
    setting: tuple[str, str] | None = None  # change: the (from, to) settings, e.g. two learning rates
    axis: str | None = None  # lr sensitivity, stable rate: the swept key whose values are compared, e.g. train.lr
    # (multiplier: always the ladder's rung, gatelab.report.claims_ladder)
    rank_ids: list[str] = []  # rank: the groups ranked against the paper's
    only_gated: bool = False  # rank: keep only the variants with a gate (gatelab.variants), not baseline or references
    margin: Margin | None = None  # closeness: the equivalence margin
    paper: PaperFigure = PaperFigure()
    testable_if: list[TestableIf | str] = []  # a rule, or the name of one of the file's `preconditions`
    true_by_construction: str | None = None  # why the row cannot fail: shown, not tested, not counted as support
    # direction: the claim (its text) of another row of the sweep comparing group a with a group whose attention output
    # starts at a's scale; a row whose groups start at different scales holds only if that row holds
    scale_control: str | None = None
    # this row's effect against the paper's is its sweep's regime: statements of size (closeness against the paper's
    # gap, "the paper's size excluded") are made in the sweep only where that ratio is within a factor of 4
    regime_reference: bool = False
    # the claim (its text) of the row this one is read beside: an unmatched comparison beside the paper's matched one
    beside: str | None = None
    why: str = ""  # a note on the row: what the test means at this scale
    # confirmatory: declared in this file before any run it reads (a test checks the commit dates); exploratory: the
    # paper's claims written after their data; other paper: another paper's claim. Each section is corrected apart.
    section: Literal["confirmatory", "exploratory", "other paper"] = "exploratory"

    @model_validator(mode="before")
    @classmethod
    def _rung_axis(cls, data: Any) -> Any:
        """A multiplier reads a ladder, whose axis is its rung."""
        if isinstance(data, dict) and data.get("kind") == "multiplier" and "axis" not in data:
            return {**data, "axis": RUNG}
        return data

    @model_validator(mode="after")
    def _check(self) -> Claim:
        problems = []
        if self.kind == "not addressed":
            if self.sweep is not None or not self.why:
                raise ValueError("a claim not addressed names no sweep and says why in `why` (what is missing)")
            return self
        if self.sweep is None:
            problems.append("a claim needs sweep: the name of the sweep whose runs test it")
        if self.kind in DIRECTED and self.direction is None:
            problems.append(f"a {self.kind} claim needs direction: lower or higher")
        if self.kind in TWO_GROUPS and not (self.a and self.b):
            problems.append(f"a {self.kind} claim needs groups a and b")
        if self.kind == "level" and (not self.a or self.level is None):
            problems.append("a level claim needs group a and a level")
        if self.kind == "change" and self.setting is None:
            problems.append("a change claim needs setting: [FROM, TO], e.g. [train.lr=0.002, train.lr=0.008]")
        if self.kind in ON_AN_AXIS and self.axis is None:
            problems.append(f"a {self.kind} claim needs axis, the swept key it varies (e.g. train.lr)")
        if self.kind == "closeness" and self.margin is None:
            problems.append("a closeness claim needs margin: {fraction: F, paper_gain: {table: T, ids: [A, B]}} or "
                            "{relative: R, reason: WHY}")
        if self.scale_control is not None and self.kind != "direction":
            problems.append("scale_control is a direction claim's key")
        if self.kind == "multiplier" and (self.axis != RUNG or not self.metric.startswith("ppl/")):
            problems.append(f"a multiplier claim reads a ladder over its {RUNG} (give no axis) and a perplexity metric "
                            "(ppl/...), whose ln is the loss the ladder's law is fitted to")
        if self.kind == "rank" and len(self.rank_ids) < 3:
            problems.append("a rank claim needs at least 3 rank_ids")
        if problems:
            raise ValueError("; ".join(problems))
        return self


class ClaimsFile(StrictModel):
    """The keys of a claims file: named preconditions that rows share (`testable_if: [NAME]`), then the rows."""

    preconditions: dict[str, TestableIf] = {}
    claims: list[Claim]


# --- groups: a variant plus settings, as RunRecord.group writes them --------------------------------------------------


def group_name(variant: str, settings: Mapping[str, Any]) -> str:
    """'g1_elem_sig train.lr=0.002': the variant, then each setting sorted by key (`RunRecord.group`)."""
    text = " ".join(f"{key}={value}" for key, value in sorted(settings.items()))
    return f"{variant}{' ' + text if text else ''}"


def _value(raw: str) -> Any:
    """A setting's value as YAML reads it; '2e-3' (a string to YAML 1.1) as the number it means."""
    value = yaml.safe_load(raw) if raw else raw
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def parse_settings(text: str) -> dict[str, Any]:
    """'train.lr=0.002 model.qk_norm=false' -> {'train.lr': 0.002, 'model.qk_norm': False}."""
    settings = {}
    for part in text.split():
        key, sep, raw = part.partition("=")
        if not sep or not key:
            raise ValueError(f"'{part}' is not KEY=VALUE")
        settings[key] = _value(raw)
    return settings


def parse_group(text: str) -> tuple[str, dict[str, Any]]:
    """'g1_elem_sig train.lr=0.002' -> ('g1_elem_sig', {'train.lr': 0.002})."""
    variant, _, rest = text.strip().partition(" ")
    return variant, parse_settings(rest)


def architecture(model: Any) -> str:
    """"moe" for an experiment's model with an MoE FFN (ffn: moe, or a moe block), else "dense": which of the paper's
    models (gatelab.paper.TABLES[...].model) a sweep's runs stand for."""
    return "moe" if model.ffn == "moe" or model.moe is not None else "dense"


# --- loading and checking --------------------------------------------------------------------------------------------


def _hint(value: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(value, valid, n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def _same(a: Any, b: Any) -> bool:
    """Equal as settings: 2e-3 is 0.002; True is not 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return math.isclose(float(a), float(b), rel_tol=1e-12, abs_tol=0.0)
    return a == b


class _SweepGrid:
    """What a claim may name in one sweep: its variants, its swept keys and their values, and its groups."""

    def __init__(self, sweep: Any) -> None:
        self.name = sweep.name
        self.path = sweep.path
        self.specs = expand(sweep)
        self.variants = list(dict.fromkeys(spec.experiment.variant for spec in self.specs))
        self.values: dict[str, list[Any]] = {}
        for spec in self.specs:
            for key, value in spec.settings().items():
                known = self.values.setdefault(key, [])
                if not any(_same(value, v) for v in known):
                    known.append(value)
        self.groups = {group_name(spec.experiment.variant, spec.settings()) for spec in self.specs}
        self.architectures = {architecture(spec.experiment.model) for spec in self.specs}

    def resolve(self, text: str, where: str, problems: list[str], partial: bool = False,
                extra: Mapping[str, Any] | None = None) -> str | None:
        """The group `text` in this sweep's own spelling of its values, or None after adding a problem. `partial`:
        the group leaves out the claim's varied key(s) (`extra` fills them in when checking that runs exist)."""
        try:
            variant, settings = parse_group(text)
        except ValueError as error:
            problems.append(f"{where}: {error}; write a group as VARIANT KEY=VALUE ...")
            return None
        if variant not in self.variants:
            problems.append(f"{where}: variant '{variant}' is not in sweep {self.name}{_hint(variant, self.variants)}; "
                            f"its variants: {', '.join(self.variants)}")
            return None
        canonical = self._settings(settings, where, problems)
        if canonical is None:
            return None
        full = group_name(variant, {**canonical, **(extra or {})})
        if (not partial or extra is not None) and full not in self.groups:
            mine = sorted(g for g in self.groups if g.split(" ", 1)[0] == variant)
            problems.append(f"{where}: sweep {self.name} has no runs of '{full}'; its groups of {variant}: "
                            f"{', '.join(mine)}")
            return None
        return group_name(variant, canonical)

    def _settings(self, settings: Mapping[str, Any], where: str, problems: list[str]) -> dict[str, Any] | None:
        """`settings` with each value as the sweep spells it, or None after adding a problem."""
        canonical = {}
        for key, value in settings.items():
            if key not in self.values:
                keys = sorted(self.values)
                swept = f"its swept keys: {', '.join(keys)}" if keys else "it sweeps no key besides variant and seed"
                problems.append(f"{where}: '{key}' is not swept in {self.name}{_hint(key, keys)}; {swept}")
                return None
            match = next((v for v in self.values[key] if _same(v, value)), None)
            if match is None:
                valid = [str(v) for v in self.values[key]]
                problems.append(f"{where}: {key}={value} is not in sweep {self.name}'s grid"
                                f"{_hint(str(value), valid)}; its values of {key}: {', '.join(valid)}")
                return None
            canonical[key] = match
        return canonical

    def axis_values(self, axis: str, where: str, problems: list[str]) -> list[Any] | None:
        if axis not in self.values:
            keys = sorted(self.values)
            problems.append(f"{where}: '{axis}' is not swept in {self.name}{_hint(axis, keys)}; its swept keys: "
                            f"{', '.join(keys) or '(none besides variant and seed)'}")
            return None
        return list(self.values[axis])


def sweep_files(folder: Path) -> dict[str, Path]:
    """{sweep name: its file} for the sweep files directly in `folder`; a file that does not read is left out here
    (loading it when a claim names it says what is wrong)."""
    found: dict[str, Path] = {}
    for path in sorted(Path(folder).glob("*.yaml")):
        try:
            name = read_yaml(path).get("name")
        except GatelabError:
            continue
        if isinstance(name, str):
            found.setdefault(name, path)
    return found


def _paper_rows(table: str, column: str, where: str, problems: list[str]) -> list[str] | None:
    """The row ids of the paper's `table` (a SWEEP_TABLES key) that has `column`; None where there is nothing to
    check ids against (a problem added, or the paper's file missing: the table prints a note that it is)."""
    if table not in SWEEP_TABLES:
        problems.append(f"{where}.table: '{table}' is not a paper table{_hint(table, list(SWEEP_TABLES))}; valid: "
                        f"{', '.join(SWEEP_TABLES)}")
        return None
    if missing_files(table):
        return None
    frame = reference(table)
    if column not in frame.columns:
        columns = [str(c) for c in frame.columns]
        problems.append(f"{where}.column: '{column}' is not a column of the paper's {table}{_hint(column, columns)}; "
                        f"its columns: {', '.join(columns)}")
        return None
    return [str(i) for i in frame.index]


def _check_ids(table: str, ids: list[str], rows: list[str], key: str, where: str, problems: list[str]) -> None:
    for paper_id in ids:
        if paper_id not in rows:
            problems.append(f"{where}: {key}: the paper's {table} has no row '{paper_id}'{_hint(paper_id, rows)}; "
                            f"give paper.ids or paper.text (its rows: {', '.join(rows)})")


def _check_paper(claim: Claim, where: str, problems: list[str]) -> None:
    figure = claim.paper
    if figure.table is None:
        return
    rows = _paper_rows(figure.table, figure.column, f"{where}: paper", problems)
    if rows is None or figure.text:
        return
    if figure.ids is not None:
        ids, key = figure.ids, "paper.ids"
    elif claim.kind == "rank":
        ids, key = [parse_group(g)[0] for g in claim.rank_ids], "rank_ids (as the paper's ids)"
    else:
        groups = [claim.a] if claim.kind == "level" else [claim.a, claim.b or ""]
        ids, key = [parse_group(g)[0] for g in groups], "the variants of a and b (as the paper's ids)"
    if figure.ids is not None or figure.pairs is None:
        _check_ids(figure.table, ids, rows, key, where, problems)
    for i, pair in enumerate(figure.pairs or ()):
        _check_ids(figure.table, list(pair), rows, f"paper.pairs[{i}]", where, problems)


def _check_margin(claim: Claim, grid: _SweepGrid, where: str, problems: list[str]) -> None:
    """A margin from the paper names the claim's own pair (a and b as the paper's rows, or paper.ids) in a table of
    the paper's model of the sweep's kind (dense or MoE); a stated margin's positive control names groups of the
    sweep."""
    margin = claim.margin
    if margin.positive_control is not None:
        for i, group in enumerate(margin.positive_control):
            grid.resolve(group, f"{where}: margin.positive_control[{i}]", problems)
    gain = margin.paper_gain
    if gain is None:
        return
    own = list(claim.paper.ids or [parse_group(g)[0] for g in (claim.a, claim.b or "")])
    if list(gain.ids) != own:
        problems.append(f"{where}: margin.paper_gain.ids: {list(gain.ids)} is not the claim's own pair {own}: a "
                        "closeness margin comes from the paper's gap for the same comparison")
    rows = _paper_rows(gain.table, "ppl", f"{where}: margin.paper_gain", problems)
    if rows is None:
        return
    _check_ids(gain.table, list(gain.ids), rows, "margin.paper_gain.ids", where, problems)
    kinds = model_kinds(gain.table)
    if kinds != grid.architectures:
        problems.append(f"{where}: margin.paper_gain: the paper's {gain.table} is its {'/'.join(sorted(kinds))} "
                        f"model's, and sweep {grid.name} trains {'/'.join(sorted(grid.architectures))} models; name a "
                        "table of the same kind (table2 dense; table1, table3 MoE) or give {relative: R, reason: WHY}")


def _check_scale_controls(claims: list[Claim], wheres: list[str], problems: list[str]) -> None:
    """Each scale_control names one other direction row of the same sweep about the same group a, itself without a
    scale_control (a control's verdict is read as it stands)."""
    by_text: dict[str, list[Claim]] = {}
    for claim in claims:
        by_text.setdefault(claim.claim, []).append(claim)
    for claim, where in zip(claims, wheres, strict=True):
        if claim.scale_control is None:
            continue
        named = by_text.get(claim.scale_control, [])
        same = [c.claim for c in claims if c.sweep == claim.sweep and c.kind == "direction" and c.a == claim.a
                and c is not claim]
        if len(named) != 1 or named[0] is claim:
            problems.append(f"{where}: scale_control: {'several rows' if named else 'no row'} '{claim.scale_control}'"
                            f"{_hint(claim.scale_control, same)}; rows of {claim.sweep} about {claim.a}: "
                            f"{', '.join(same) or '(none)'}")
            continue
        control = named[0]
        if (control.sweep, control.kind, control.a) != (claim.sweep, "direction", claim.a) or control.scale_control:
            problems.append(f"{where}: scale_control: '{control.claim}' is not a direction row of {claim.sweep} about "
                            f"{claim.a} without a scale_control of its own")


def _check_claim(claim: Claim, grid: _SweepGrid, where: str, problems: list[str],
                 preconditions: Mapping[str, TestableIf]) -> Claim:
    """The claim with its groups spelled as the sweep spells them; problems appended for whatever does not exist."""
    update: dict[str, Any] = {}
    if claim.kind == "change":
        settings = []
        for i, text in enumerate(claim.setting or ()):
            try:
                parsed = grid._settings(parse_settings(text), f"{where}: setting[{i}]", problems)
            except ValueError as error:
                problems.append(f"{where}: setting[{i}]: {error}")
                parsed = None
            settings.append(parsed)
        if all(s is not None for s in settings):
            update["setting"] = tuple(group_name("", s).strip() for s in settings)
        for key in ("a", "b"):
            resolved = grid.resolve(getattr(claim, key) or "", f"{where}: {key}", problems, partial=True)
            for s in settings if resolved is not None else ():
                if s is not None:
                    grid.resolve(resolved, f"{where}: {key}", problems, partial=True, extra=s)
            update[key] = resolved
    elif claim.kind in ON_AN_AXIS:
        values = grid.axis_values(claim.axis or "", f"{where}: axis", problems)
        for key in ("a", "b"):
            resolved = grid.resolve(getattr(claim, key) or "", f"{where}: {key}", problems, partial=True)
            if resolved is not None and values:
                grid.resolve(resolved, f"{where}: {key}", problems, partial=True, extra={claim.axis: values[0]})
            update[key] = resolved
    else:
        for key in ("a", "b"):
            text = getattr(claim, key)
            if text:
                update[key] = grid.resolve(text, f"{where}: {key}", problems)
    if claim.rank_ids:
        update["rank_ids"] = [grid.resolve(g, f"{where}: rank_ids[{i}]", problems)
                              for i, g in enumerate(claim.rank_ids)]
    if claim.margin is not None:
        _check_margin(claim, grid, where, problems)
    rules = []
    for i, rule in enumerate(claim.testable_if):
        at = f"{where}: testable_if[{i}]"
        if isinstance(rule, str):
            if rule not in preconditions:
                problems.append(f"{at}: no precondition '{rule}'{_hint(rule, list(preconditions))}; the file's "
                                f"preconditions: {', '.join(preconditions) or '(none)'}")
                continue
            rule = preconditions[rule].model_copy(update={"name": rule})
        if rule.rule in AXIS_RULES:
            values = grid.axis_values(rule.axis or "", f"{at}.axis", problems)
            group = grid.resolve(rule.group, f"{at}.group", problems, partial=True)
            if group is not None and values:
                grid.resolve(group, f"{at}.group", problems, partial=True, extra={rule.axis: values[0]})
        else:
            group = grid.resolve(rule.group, f"{at}.group", problems)
        rules.append(rule.model_copy(update={"group": group}))
    update["testable_if"] = rules
    _check_paper(claim, where, problems)
    return claim.model_copy(update=update)


def load_claims(path: str | Path, sweeps: Mapping[str, Any] | None = None) -> list[Claim]:
    """Read a claims file and check it against the sweeps it names (module docstring); one GatelabError lists every
    problem. `sweeps` ({name: a loaded Sweep}) are used as given instead of loading their files again."""
    path = Path(path)
    source = str(path)
    try:
        parsed = ClaimsFile.model_validate(read_yaml(path))
    except ValidationError as exc:
        raise GatelabError(format_validation_error(exc, source, ClaimsFile).replace(
            "invalid configuration", "invalid claims file")) from None
    folder = path.parent.parent
    files = sweep_files(folder)
    loaded: dict[str, Any] = dict(sweeps or {})
    grids: dict[str, _SweepGrid] = {}
    problems: list[str] = []
    claims: list[Claim] = []
    wheres: list[str] = []
    names = sorted(set(files) | set(loaded))
    for index, claim in enumerate(parsed.claims):
        where = f"claims[{index}] \"{claim.claim}\""
        if claim.kind == "not addressed":
            claims.append(claim)
            wheres.append(where)
            continue
        if claim.sweep not in grids:
            if claim.sweep not in loaded and claim.sweep in files:
                try:
                    loaded[claim.sweep] = load_sweep(files[claim.sweep])
                except GatelabError as error:
                    problems.append(f"{where}: sweep: {claim.sweep} does not load: {error}")
                    continue
            if claim.sweep in loaded:
                grids[claim.sweep] = _SweepGrid(loaded[claim.sweep])
        if claim.sweep not in grids:
            problems.append(f"{where}: sweep: '{claim.sweep}' is not a sweep in {folder}/{_hint(claim.sweep, names)}; "
                            f"its sweeps: {', '.join(names)}")
            continue
        claims.append(_check_claim(claim, grids[claim.sweep], where, problems, parsed.preconditions))
        wheres.append(where)
    _check_scale_controls(claims, wheres, problems)
    texts = {c.claim for c in claims}
    problems += [f"{where}: beside: no row '{claim.beside}'{_hint(claim.beside, sorted(texts))}"
                 for claim, where in zip(claims, wheres, strict=True) if claim.beside and claim.beside not in texts]
    references = [c.sweep for c in claims if c.regime_reference]
    problems += [f"regime_reference: sweep {sweep} has {references.count(sweep)} reference rows; one at most"
                 for sweep in sorted(set(references)) if references.count(sweep) > 1]
    problems += [f"{where}: regime_reference: a reference is a direction row on a perplexity metric with the paper's "
                 "table figure" for claim, where in zip(claims, wheres, strict=True) if claim.regime_reference
                 and (claim.kind != "direction" or not claim.metric.startswith("ppl/") or claim.paper.table is None)]
    if problems:
        raise GatelabError(f"{source}: invalid claims file\n" + "\n".join(f"  {p}" for p in problems))
    return claims
