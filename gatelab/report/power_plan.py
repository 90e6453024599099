"""The seeds a confirmatory sweep needs (issue 43), computed from a pilot's runs and written beside the sweep file.

The rule: seeds = max(14, the smallest n that gives 80% power to detect half the paper's G1 effect (the mean of
(G1 - baseline) / baseline over the paper's row pairs that the claims file gives the sweep's G1 row, times the pilot's
baseline mean) at the pilot's paired spread, two-sided paired t-test at alpha 0.05 / m, m the number of confirmatory
rows the claims file declares: Holm's first, most stringent step, so the row keeps that power at whichever step of
Holm's it is tested. Both come from the claims file, so a row added to the family, or a pair to the paper's effect,
changes the plan rather than leaving a number typed on a command line behind.

    python -m gatelab.report.power_plan sweeps/repro-matched-confirm.yaml --pilot repro-matched
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Optional

import numpy as np
import typer

from gatelab.errors import GatelabError, exit_code, print_failure
from gatelab.metrics import PPL_AVG

CLAIMS = Path("sweeps/claims/tiny.yaml")  # relative to the repository root, as `gatelab claims` reads it
VARIANT = "g1_elem_sig"  # the claims row whose paper pairs give the effect: this against baseline


@dataclass(frozen=True)
class PaperPair:
    a: str  # the table's row ids
    b: str
    a_value: float
    b_value: float

    @property
    def effect(self) -> float:
        return (self.a_value - self.b_value) / self.b_value


@dataclass(frozen=True)
class PowerPlan:
    """What the seed count is made of: the pilot's paired spread, the paper's effect, the level; and the count."""

    pilot: str  # the pilot sweep's name
    paper_table: str  # the gatelab.paper table the pairs are rows of
    a: str  # the groups compared, a - b, paired by seed
    b: str
    metric: str
    seeds: tuple[int, ...]  # the pilot's seeds with a finite value in both groups
    sd: float  # of the paired differences a - b (ddof 1)
    baseline_mean: float  # b's mean over those seeds
    paper_pairs: tuple[PaperPair, ...]
    family_size: int
    alpha: float = 0.05
    power: float = 0.8
    effect_fraction: float = 0.5  # of the paper's effect: the smallest gain worth confirming
    min_seeds: int = 14
    seeds_for_power: int = 0  # the answer, set by plan_seeds

    @property
    def paper_effect(self) -> float:
        return float(np.mean([pair.effect for pair in self.paper_pairs]))

    @property
    def target(self) -> float:
        return self.effect_fraction * abs(self.paper_effect) * self.baseline_mean

    @property
    def level(self) -> float:
        return self.alpha / self.family_size

    @property
    def seeds_needed(self) -> int:
        return max(self.min_seeds, self.seeds_for_power)


@dataclass(frozen=True)
class ClaimsInputs:
    """What the plan takes from the claims file: the paper's table and row pairs of the sweep's G1 row, and the size
    of the declared confirmatory family."""

    table: str
    pairs: tuple[tuple[str, str], ...]
    family_size: int


def claims_inputs(claims_path: Path, sweep) -> ClaimsInputs:
    """The sweep's row comparing VARIANT with baseline in the claims file, and the file's confirmatory rows."""
    from gatelab.report.claims_file import load_claims

    claims = load_claims(claims_path, {sweep.name: sweep})
    rows = [c for c in claims if c.sweep == sweep.name and (c.a, c.b) == (VARIANT, "baseline") and c.paper.table]
    if len(rows) != 1:
        raise GatelabError(f"{claims_path}: {len(rows)} rows compare {VARIANT} with baseline on sweep {sweep.name} "
                           "against a table of the paper; the plan reads the paper's effect from exactly one (add it, "
                           "with paper: {table: ..., pairs: ...}, or name another file with --claims)")
        # (a claims file that names no pairs compares the variants' own rows: the one pair (a, b))
    row = rows[0]
    pairs = tuple(tuple(pair) for pair in row.paper.pairs or [tuple(row.paper.ids or (row.a, row.b))])
    family = sum(c.section == "confirmatory" for c in claims)
    if family < 1:
        raise GatelabError(f"{claims_path}: no row has section: confirmatory; the plan corrects alpha over the "
                           "declared confirmatory family, so declare it before planning its seeds")
    return ClaimsInputs(row.paper.table, pairs, family)


def paper_pairs(table: str, pairs: Sequence[tuple[str, str]]) -> tuple[PaperPair, ...]:
    """The paper's perplexities of each row pair (gatelab.paper's CSVs)."""
    from gatelab.report.tables import paper_reference

    values = paper_reference(table)["ppl"]
    missing = [i for pair in pairs for i in pair if i not in values.index or not math.isfinite(values[i])]
    if missing:
        raise GatelabError(f"the paper's {table}: no perplexity for {', '.join(missing)}; restore its CSV "
                           "(gatelab/paper_tables/) or unset $GATELAB_PAPER_DIR")
    return tuple(PaperPair(a, b, float(values[a]), float(values[b])) for a, b in pairs)


def plan_seeds(a_values: Mapping[int, float], b_values: Mapping[int, float], pairs: Sequence[PaperPair], *,
               family_size: int, pilot: str, a: str, b: str, paper_table: str = "table2", metric: str = PPL_AVG,
               alpha: float = 0.05, power: float = 0.8, effect_fraction: float = 0.5, min_seeds: int = 14) -> PowerPlan:
    """The plan from the pilot's {seed: value} of groups a and b, paired over the seeds both have finite values for."""
    from gatelab.report.stats import seeds_needed, shared_seeds

    if family_size < 1:
        raise GatelabError(f"a confirmatory family of {family_size} rows: it has at least one")
    seeds = shared_seeds(a_values, b_values)
    if len(seeds) < 2:
        raise GatelabError(f"pilot {pilot}: {len(seeds)} seed(s) with finished runs of both {a} and {b}; the paired "
                           "spread needs two or more: name a pilot that ran them (--pilot)")
    a_seeds, b_seeds = (np.array([float(values[s]) for s in seeds]) for values in (a_values, b_values))
    plan = PowerPlan(pilot, paper_table, a, b, metric, tuple(seeds), float(np.std(a_seeds - b_seeds, ddof=1)),
                     float(np.mean(b_seeds)), tuple(pairs), family_size, alpha, power, effect_fraction, min_seeds)
    needed = seeds_needed(plan.target, plan.sd, paired=True, alpha=plan.level, power=power)
    if needed is None:
        raise GatelabError(f"pilot {pilot}: no seed count detects {plan.target:.4g} at a paired sd of {plan.sd:.4g} "
                           f"(the sd must be above zero and the target a difference): check the pilot's {metric}")
    return replace(plan, seeds_for_power=needed)


def _span(seeds: Sequence[int]) -> str:
    seeds = sorted(seeds)
    if not seeds:
        return "none"
    if seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}-{seeds[-1]}"
    return ", ".join(map(str, seeds))


def render(plan: PowerPlan, sweep_file: str, declared_seeds: Sequence[int], command: str, stamp: str) -> str:
    """The plan as a Markdown page: what was read, the paper's effect, the seeds needed, and whether the sweep's are."""
    from gatelab.paper import TABLES
    from gatelab.report.claims_evidence import row_labels

    table, (_, labels) = TABLES[plan.paper_table], row_labels(plan.paper_table)
    rows = [f"| {labels.get(p.a, p.a)} {p.a} | {p.a_value:.3f} | {labels.get(p.b, p.b)} {p.b} | {p.b_value:.3f} | "
            f"{100 * p.effect:+.3f}% |" for p in plan.paper_pairs]
    short = plan.seeds_needed - len(declared_seeds)
    verdict = "enough" if short <= 0 else f"not enough: {short} short of {plan.seeds_needed}"
    return "\n".join([
        f"# Seeds for {Path(sweep_file).stem}: the power calculation",
        "",
        f"Written by `{command}` from the pilot's runs in the MLflow store of `--runs-dir` (its path is left out: the "
        f"same runs give the same page wherever they lie), {stamp}.",
        "",
        f"The rule (issue 43): seeds = max({plan.min_seeds}, the smallest n that gives {100 * plan.power:g}% power to "
        f"detect {plan.effect_fraction:g} x the paper's effect at the pilot's paired spread, two-sided paired t-test "
        f"at alpha {plan.alpha:g} / m, m = {plan.family_size} the declared confirmatory family: Holm's first, most "
        "stringent step). The paper's pairs and the family are the claims file's.",
        "",
        "## The pilot",
        "",
        "| | |",
        "|---|---|",
        f"| sweep | {plan.pilot} |",
        f"| groups | {plan.a} - {plan.b}, paired by seed, finished runs only |",
        f"| metric | {plan.metric} |",
        f"| seeds | {len(plan.seeds)} ({_span(plan.seeds)}) |",
        f"| sd of the paired differences | {plan.sd:.4f} |",
        f"| {plan.b} mean | {plan.baseline_mean:.3f} |",
        "",
        f"## The paper's effect ({table.name}, {table.ppl})",
        "",
        "| G1 row | | baseline row | | (G1 - baseline) / baseline |",
        "|---|---:|---|---:|---:|",
        *rows,
        f"| mean | | | | {100 * plan.paper_effect:+.3f}% |",
        "",
        "## Seeds",
        "",
        f"- target difference: {plan.effect_fraction:g} x {100 * abs(plan.paper_effect):.3f}% x "
        f"{plan.baseline_mean:.3f} = {plan.target:.4f} {plan.metric}",
        f"- level: {plan.alpha:g} / {plan.family_size} = {plan.level:.6f}, two-sided; power {plan.power:g}",
        f"- seeds for that power (gatelab.report.stats.seeds_needed, paired): {plan.seeds_for_power}",
        f"- seeds needed: max({plan.min_seeds}, {plan.seeds_for_power}) = {plan.seeds_needed}",
        f"- {sweep_file} declares {len(declared_seeds)} seeds ({_span(declared_seeds)}) of {plan.a} and {plan.b}: "
        f"{verdict}",
        ""])


def _check_variants(sweep) -> None:
    variants = sorted({spec.experiment.variant for spec in sweep.runs})
    if not {VARIANT, "baseline"} <= set(variants):
        raise GatelabError(f"{sweep.path}: grid.variant is {', '.join(variants)}; the paper's effect is {VARIANT}'s "
                           f"against baseline, so a power plan needs a sweep that runs both")


def write_plan(sweep_path: Path, pilot: str, runs_dir: Path, out: Path | None = None,
               claims_path: Path = CLAIMS) -> Path:
    """The plan's page for the sweep file, from the runs of the pilot (a sweep file beside it) in the store under
    runs_dir, only read, and the paper's effect and the family in the claims file; by default beside the sweep file,
    NAME.power.md."""
    from gatelab.report.budgets import BUDGET_FIX, not_comparable
    from gatelab.report.claims_evidence import by_seed
    from gatelab.report.tables import collect_runs, data_stamp
    from gatelab.store_uris import missing_local_store
    from gatelab.sweep.spec import load_sweep
    from gatelab.tracking import RunStore
    from gatelab.workspace import Workspace

    a, b = VARIANT, "baseline"
    sweep = load_sweep(sweep_path)
    _check_variants(sweep)
    pilot_path = sweep_path.parent / f"{pilot}.yaml"
    if not pilot_path.is_file():
        raise GatelabError(f"--pilot {pilot}: no sweep file {pilot_path}; name a sweep of {sweep_path.parent}/")
    if not Path(claims_path).is_file():
        raise GatelabError(f"--claims {claims_path}: no such file; run from the repository root or name the claims "
                           "file that declares the sweep's rows")
    inputs = claims_inputs(claims_path, sweep)
    pilot_sweep = load_sweep(pilot_path)
    uri = Workspace(runs_dir=runs_dir).store(create=False)
    if missing_local_store(uri):  # reading a missing store would create an empty one
        raise GatelabError(f"--runs-dir {runs_dir}: no MLflow store (mlflow.db) there; name the folder that holds the "
                           "pilot's runs (the committed ones: runs/ of results/tiny/mlflow-store.tar.xz, extracted)")
    records = collect_runs(list(pilot_sweep.runs), RunStore(uri, runs_dir, read_only=True), pilot_sweep.name)
    # A diverged run would count as uniform prediction (claims' rule): an outlier that no pilot spread should carry.
    finished = [r for r in records if r.status == "finished" and r.group in (a, b)]
    apart = not_comparable(finished)
    if apart is not None:
        raise GatelabError(f"pilot {pilot_sweep.name}: {apart}; {BUDGET_FIX}")
    plan = plan_seeds(by_seed(finished, a, PPL_AVG), by_seed(finished, b, PPL_AVG),
                      paper_pairs(inputs.table, inputs.pairs), family_size=inputs.family_size,
                      pilot=pilot_sweep.name, a=a, b=b, paper_table=inputs.table)
    declared = sorted({s.experiment.seed for s in sweep.runs if s.experiment.variant == a}
                      & {s.experiment.seed for s in sweep.runs if s.experiment.variant == b})
    claims_option = "" if Path(claims_path) == CLAIMS else f" --claims {Path(claims_path).as_posix()}"
    command = f"python -m gatelab.report.power_plan {sweep_path.as_posix()} --pilot {pilot}{claims_option}"
    page = render(plan, sweep_path.as_posix(), declared, command, data_stamp(finished))
    out = out or sweep_path.with_suffix(".power.md")
    out.write_text(page, encoding="utf-8")
    return out


def plan_command(
    sweep_file: Annotated[Path, typer.Argument(help="the sweep whose seeds are planned")],
    pilot: Annotated[str, typer.Option(help="the sweep beside SWEEP_FILE whose runs give the spread")],
    claims: Annotated[Path, typer.Option(help="the claims file: the sweep's G1 row gives the paper's pairs, its "
                                              "confirmatory rows the family")] = CLAIMS,
    runs_dir: Annotated[Path, typer.Option(help="the folder of the MLflow store")] = Path("runs"),
    out: Annotated[Optional[Path], typer.Option(help="default: beside the sweep file, NAME.power.md")] = None,
) -> None:
    """The seeds a confirmatory sweep needs, from a pilot's runs, written beside the sweep file."""
    typer.echo(f"wrote {write_plan(sweep_file, pilot, runs_dir, out, claims)}")


def main(argv: Sequence[str] | None = None) -> int:
    """The command; a bad value ends in one line and exit code 2 (typer's usage errors as typer prints them), never a
    traceback."""
    from gatelab.progress import CommandClock

    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command()(plan_command)
    CommandClock.start()
    try:
        app(list(sys.argv[1:] if argv is None else argv), prog_name="python -m gatelab.report.power_plan")
    except SystemExit as done:  # click's standalone mode ends every command so
        return int(done.code or 0)
    except Exception as error:
        print_failure(error)
        return exit_code(error)
    return 0


if __name__ == "__main__":
    sys.exit(main())
