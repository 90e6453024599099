"""The paper's claims, each checked on the runs of a sweep: our figure, its spread, p and q, the minimum detectable
effect and a verdict, one row per claim (`gatelab claims`).

The claims are data (sweeps/claims/tiny.yaml, read by gatelab.report.claims_file): which sweep, which groups of runs,
which metric, which way the paper says it goes, the paper's figure, and when this scale can test it at all. This
module decides when each claim can be tested and turns it into a row from what it reads
(gatelab.report.claims_evidence), tested by its kind (gatelab.report.claims_checks). Every tested row has a p-value
but a ladder's compute multiplier, which its bootstrap interval decides (gatelab.report.claims_ladder); the p-values are
corrected within each section (claims_rules.SECTIONS) and the verdicts are decided on the q-values.
gatelab.report.claims_report states every rule in words under the table, and writes the summary paragraph.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from gatelab.metrics import INIT_SCALE
from gatelab.report.budgets import BUDGET_FIX, NOT_COMPARABLE, not_comparable
from gatelab.report.claims_checks import (
    ALPHA,
    CHECKS,
    COLUMNS,
    DIFFERS,
    INIT_SCALE_RATIO,
    MATCHED,
    NOT_LOGGED,
    Outcome,
    fmt,
    no_figures,
    p_cell,
    positive_control,
    rank_ids,
    relative_metric,
)
from gatelab.report.claims_evidence import (
    LOSS_SPIKES,
    PaperEffect,
    axis_runs,
    by_seed,
    effect_span,
    paper_figure,
    run_value,
    spike_rule,
    with_settings,
    worst_value,
)
from gatelab.report.claims_file import (
    AXIS_RULES,
    ON_AN_AXIS,
    TWO_GROUPS,
    UNIFORM_FIRST_TOKEN,
    Claim,
    TestableIf,
    architecture,
    parse_settings,
)
from gatelab.report.claims_rules import (
    CONFOUNDED,
    DESCRIPTIVE,
    FAILS,
    HOLDS,
    INCONCLUSIVE,
    NO_REFERENCE,
    NOT_ADDRESSED,
    NOT_RUN,
    NOT_TESTABLE,
    PAPER_SIZE_EXCLUDED,
    RULE_BUDGET,
    RULE_INIT_SCALE,
    RULE_POSITIVE_CONTROL,
    RULE_PRECONDITION,
    RULE_REGIME,
    RULE_SCALE_CONTROL,
    RULE_WHOLE_SAMPLE,
    SECTIONS,
    TRUE_BY_CONSTRUCTION,
    Regime,
    corrected,
    inconclusive,
    regimes_by_sweep,
    rule_of,
    size_not_read,
)
from gatelab.report.tables import ENDED, RunRecord

# --- when a claim can be tested here ----------------------------------------------------------------------------------

# What readers of the table use: the table, one row, the verdicts a row can get and the checks behind them.
__all__ = ["ALPHA", "CHECKS", "COLUMNS", "CONFOUNDED", "DESCRIPTIVE", "FAILS", "HOLDS", "INCONCLUSIVE",
           "INIT_SCALE_RATIO", "NOT_ADDRESSED", "NOT_RUN", "NOT_TESTABLE", "PAPER_SIZE_EXCLUDED", "RULE_WHOLE_SAMPLE",
           "TRUE_BY_CONSTRUCTION", "Context", "claims_table", "evaluate_claim", "inconclusive",
           "uniform_first_token_share"]


def uniform_first_token_share(seq_len: int) -> float:
    """F-Attn of attention spread evenly over the causal prefix: query i (1..T-1; query 0 is left out, as the probe
    does) puts 1/(i+1) on token 0, so the mean is (H_T - 1)/(T - 1), H_T the T-th harmonic number."""
    return (sum(1.0 / k for k in range(1, seq_len + 1)) - 1.0) / (seq_len - 1)


def _rule_holds(rule: TestableIf, records: Sequence[RunRecord]) -> tuple[bool, str]:
    """Whether a testable_if rule holds on the runs, and the rule with what was measured, in words."""
    if rule.rule == "diverges":
        runs = axis_runs(records, rule.group, rule.axis or "")
        diverged = sorted(v for v, rs in runs.items() if any(r.status == "diverged" for r in rs))
        where = f" (at {rule.axis}={', '.join(f'{v:g}' for v in diverged)})" if diverged else ""
        return bool(diverged), f"{rule.group}: diverged at {len(diverged)} of {len(runs)} {rule.axis} values{where}"
    if rule.rule == "unstable":
        runs = axis_runs(records, rule.group, rule.axis or "")
        diverged = sum(r.status == "diverged" for rs in runs.values() for r in rs)
        finite = {v: [x for x in (run_value(r, rule.metric) for r in rs) if math.isfinite(x)] for v, rs in runs.items()}
        means = {v: float(np.mean(xs)) for v, xs in finite.items() if xs}
        if not means:
            return diverged > 0, f"{rule.group} over {rule.axis}: no {rule.metric} (diverged runs: {diverged})"
        best = min(means, key=lambda v: means[v])
        rises = [means[v] - means[best] for v in means if v > best]
        above = f"above it {rule.metric} rises by at most {max(rises):.3g}" if rises else "no value above it"
        text = (f"{rule.group}: lowest mean {rule.metric} at {rule.axis}={best:g}, {above}; {diverged} diverged run(s) "
                f"(rule: a rise > {rule.by:g} or a diverged run)")
        return diverged > 0 or max(rises, default=0.0) > (rule.by or 0.0), text
    values = [v for v in by_seed(records, rule.group, rule.metric).values() if math.isfinite(v)]
    mean = float(np.mean(values)) if values else math.nan
    if rule.rule == "moved":
        moved = abs(mean - (rule.start or 0.0))
        return moved > (rule.by or 0.0), (f"{rule.group} {rule.metric} {mean:.3g}, {moved:.3g} from its initial "
                                           f"{rule.start:g} (rule: > {rule.by:g})")
    level, named = rule.level, f"{rule.level:g}" if isinstance(rule.level, float | int) else ""
    if rule.level == UNIFORM_FIRST_TOKEN:
        seq_len = next(r.spec.experiment.data.seq_len for r in records if r.group == rule.group)
        level = uniform_first_token_share(seq_len)
        named = f"uniform causal attention's {level:.3g} at {seq_len} tokens"
    passed = mean > level if rule.rule == "above" else mean < level
    return passed, f"{rule.group} {rule.metric} {mean:.3g} (rule: {rule.rule} {named})"


def _groups(claim: Claim, records: Sequence[RunRecord]) -> list[str]:
    """The groups of runs a claim reads, as RunRecord.group names them (an axis claim's are read by `axis_runs`)."""
    groups = list(rank_ids(claim)) if claim.kind == "rank" else [g for g in (claim.a, claim.b) if g]
    if claim.kind in ON_AN_AXIS:
        groups = []  # read over the axis: see axis_runs
    if claim.kind == "change":
        groups = [with_settings(g, parse_settings(s)) for g in groups for s in claim.setting or ()]
    return list(dict.fromkeys(groups))


def _runs_read(claim: Claim, records: Sequence[RunRecord]) -> list[RunRecord]:
    """The runs a claim's test reads (not its testable_if rules')."""
    if claim.kind in ON_AN_AXIS:
        return [r for g in (claim.a, claim.b or "") for rs in axis_runs(records, g, claim.axis or "").values()
                for r in rs]
    groups = set(_groups(claim, records))
    return [r for r in records if r.group in groups]


def _missing(claim: Claim, records: Sequence[RunRecord]) -> list[str]:
    """What a claim reads and the runs lack, in words: groups without ended runs, metrics without a value."""
    def measured(group: str, metric: str) -> bool:
        return any(math.isfinite(v) for v in by_seed(records, group, metric).values())

    reads = [(g, claim.metric) for g in _groups(claim, records)]
    reads += [(rule.group, rule.metric) for rule in claim.testable_if if rule.rule not in AXIS_RULES]
    unrun = [g for g, _ in reads if not by_seed(records, g, claim.metric)]
    axis_groups = [(g, claim.axis) for g in (claim.a, claim.b) if g and claim.kind in ON_AN_AXIS]
    axis_groups += [(rule.group, rule.axis) for rule in claim.testable_if if rule.rule in AXIS_RULES]
    unrun += [f"{g} over {axis}" for g, axis in axis_groups if not axis_runs(records, g, axis or "")]
    unmeasured = [f"no {metric} in the runs of {g}" for g, metric in reads
                  if g not in unrun and not measured(g, metric)]
    return ([f"no ended runs of {', '.join(dict.fromkeys(unrun))}"] if unrun else []) + list(dict.fromkeys(unmeasured))


def _comparison(claim: Claim) -> str:
    if claim.kind == "rank":
        return f"{len(rank_ids(claim))} variants" + (" with a gate" if claim.only_gated else "")
    if claim.kind == "change":
        return f"{claim.a} vs {claim.b}, {' -> '.join(claim.setting or ())}"
    if claim.kind in ON_AN_AXIS:
        return f"{claim.a} vs {claim.b}, over {claim.axis}"
    return claim.a if claim.b is None else f"{claim.a} vs {claim.b}"


def _matching_effect(claim: Claim, effect: PaperEffect | None, records: Sequence[RunRecord]
                     ) -> tuple[PaperEffect | None, str]:
    """The paper's effect where it is from the sweep's own kind of model (dense or MoE), and a note saying which
    figure the row's interval is compared with, or that none is."""
    if effect is None or claim.kind != "direction" or not relative_metric(claim.metric):
        return None, ""
    models = {architecture(r.spec.experiment.model) for r in records}
    model = next(iter(models)) if len(models) == 1 else "/".join(sorted(models))
    if effect.model == model:
        return effect, (f"95% CI compared with the paper's {model} effect ({effect.source}): "
                        f"{effect_span(effect.effects)}")
    return None, (f"the paper's figure is its {effect.model or 'mixed'} model's, the sweep's is {model}: no size to "
                  "compare the interval with")


def _init_values(claim: Claim, records: Sequence[RunRecord], group: str) -> list[float]:
    """INIT_SCALE of a group's runs: at the claim's first setting for a change, over the axis for an axis claim (the
    scale at step 0 depends on neither)."""
    if claim.kind in ON_AN_AXIS:
        runs = [r for rs in axis_runs(records, group, claim.axis or "").values() for r in rs]
        values = [run_value(r, INIT_SCALE) for r in runs]
    else:
        if claim.kind == "change":
            group = with_settings(group, parse_settings((claim.setting or ("",))[0]))
        values = list(by_seed(records, group, INIT_SCALE).values())
    return [v for v in values if math.isfinite(v)]


def _init_scale(claim: Claim, records: Sequence[RunRecord]) -> tuple[str, str, float | None]:
    """Whether groups a and b start at one scale of the attention output (INIT_SCALE's group means within
    INIT_SCALE_RATIO): MATCHED, DIFFERS or NOT_LOGGED, a note, and the ratio of a's mean to b's."""
    means = {}
    for group in (claim.a, claim.b or ""):
        values = _init_values(claim, records, group)
        means[group] = float(np.mean(values)) if values else math.nan
    unlogged = [g for g, m in means.items() if not math.isfinite(m)]
    if unlogged:
        return NOT_LOGGED, (f"init scale not logged ({INIT_SCALE} absent on the runs of "
                            f"{', '.join(unlogged)}): the init-scale rule could not be applied"), None
    mean_a, mean_b = means[claim.a], means[claim.b or ""]
    ratio = mean_a / mean_b if mean_b else math.inf
    low, high = INIT_SCALE_RATIO
    inside = low <= ratio <= high
    return (MATCHED if inside else DIFFERS), (f"init scale ({INIT_SCALE}) {mean_a:.3g} vs {mean_b:.3g}, "
                                              f"ratio {ratio:.3g}, {'inside' if inside else 'outside'} "
                                              f"[{low:g}, {high:g}]"), ratio


def _not_run(test: str, why: str) -> str:
    """The test column of a row shown but not tested: the test its kind fixes, and why it did not run."""
    name = test.split(":")[0].strip()
    if name.startswith("none ("):  # no test to begin with (a descriptive row): only the reason is added
        return f"{name[:-1]}; {why})"
    return f"{name} (not run: {why})" if name else f"none ({why})"


@dataclass
class Context:
    """What rows of one table share: each sweep's regime, and each named precondition's answer, found once a sweep."""

    regimes: Mapping[str, Regime] = field(default_factory=dict)
    answers: dict[tuple[str, str], tuple[bool, str]] = field(default_factory=dict)

    def precondition(self, claim: Claim, rule: TestableIf, records: Sequence[RunRecord]) -> tuple[bool, str]:
        if rule.name is None:
            return _rule_holds(rule, records)
        key = (claim.sweep or "", rule.name)
        if key not in self.answers:
            passed, text = _rule_holds(rule, records)
            self.answers[key] = passed, f"precondition \"{rule.name}\" ({'met' if passed else 'not met'}): {text}"
        return self.answers[key]


def _unread(claim: Claim, records: Sequence[RunRecord] | None) -> Outcome | None:
    """The outcome of a row whose runs cannot be read together: its sweep or a group it reads not run, or the runs
    it reads scored on different evaluation budgets (gatelab.report.budgets); None where they can be."""
    if not records:
        return Outcome(no_figures("none (its sweep has not run)"), None, lambda q: NOT_RUN, [claim.why])
    read = _runs_read(claim, records)
    ended = sum(r.status in ENDED for r in read)
    if claim.section == "confirmatory" and 0 < ended < len(read):
        return Outcome(no_figures(f"none ({ended} of {len(read)} runs ended)"), None, lambda q: NOT_RUN,
                       [f"{ended} of the {len(read)} runs it reads have ended: a confirmatory row is read only on the "
                        "whole sample declared for it, never on a part (no interim look)", claim.why],
                       rule=RULE_WHOLE_SAMPLE)
    missing = _missing(claim, records)
    if missing:
        return Outcome(no_figures("none (not run)"), None, lambda q: NOT_RUN, [*missing, claim.why])
    apart = not_comparable(_runs_read(claim, records))
    if apart is not None:
        return Outcome(no_figures(f"none ({NOT_COMPARABLE})"), None, lambda q: NOT_TESTABLE,
                       [apart, BUDGET_FIX, claim.why], rule=RULE_BUDGET)
    return None


def evaluate_claim(claim: Claim, records: Sequence[RunRecord] | None, context: Context | None = None
                   ) -> tuple[dict[str, str], Outcome]:
    """One row of the claims table before the correction: its fixed cells, and the outcome of its test."""
    context = context or Context()
    paper_text, effect = paper_figure(claim)
    row = {"section": claim.section, "claim": claim.claim, "sweep": claim.sweep or "-",
           "comparison": "-" if claim.kind == "not addressed" else _comparison(claim),
           "metric": "-" if claim.kind == "not addressed" else claim.metric, "paper": paper_text}
    if claim.kind == "not addressed":
        return row, CHECKS[claim.kind](claim, (), None)
    unread = _unread(claim, records)
    if unread is not None:
        return row, unread
    effect, compared = _matching_effect(claim, effect, records)
    outcome = CHECKS[claim.kind](claim, records, effect)
    if claim.metric == LOSS_SPIKES:
        outcome.notes.append(spike_rule(records))
    diverged = sum(r.status == "diverged" for r in _runs_read(claim, records))
    if diverged:
        outcome.notes.append(f"{diverged} diverged run(s) counted as uniform prediction"
                             if not math.isnan(worst_value(records[0], claim.metric))
                             else f"{diverged} diverged run(s) have no {claim.metric} and are left out")
    # Figures shown, not tested: the column still names the row's test, fixed by its kind, with why it did not run.
    untested = outcome.cells | {"r (seeds)": "", "MDE": ""}

    def not_testable(rule: str, reasons: list[str]) -> tuple[dict[str, str], Outcome]:
        cells = untested | {"test": _not_run(outcome.cells["test"], "not testable")}
        return row, Outcome(cells, None, lambda q: NOT_TESTABLE, [*reasons, *outcome.notes, claim.why], rule=rule,
                            regime=outcome.regime)

    if claim.true_by_construction:
        notes = [claim.true_by_construction, *outcome.notes, claim.why]
        untested["test"] = _not_run(outcome.cells["test"], "true by construction")
        return row, Outcome(untested, None, lambda q: TRUE_BY_CONSTRUCTION, notes)
    checked = [(rule, *context.precondition(claim, rule, records)) for rule in claim.testable_if]
    failed = [(rule, text) for rule, passed, text in checked if not passed]
    if failed:
        return not_testable(RULE_PRECONDITION, [f"not testable: {rule.reason} ({text})" for rule, text in failed])
    sweep_regime = context.regimes.get(claim.sweep or "", NO_REFERENCE)
    if claim.kind == "direction" and effect is not None or claim.kind in ("closeness", "multiplier"):
        outcome.regime = sweep_regime  # the row can make a statement of size
    unread = None if outcome.rule else size_not_read(claim, sweep_regime)
    if unread:
        return not_testable(RULE_REGIME, [unread])
    if claim.kind == "closeness" and claim.margin.paper_gain is None:
        moved, text = positive_control(claim, records, float(claim.margin.relative))
        if not moved:
            return not_testable(RULE_POSITIVE_CONTROL, [f"not testable: the margin is wider than what the sweep can "
                                                        f"tell apart ({text})"])
        outcome.notes.append(text)
    if claim.kind in TWO_GROUPS:
        outcome.scale, scale_note, outcome.init_ratio = _init_scale(claim, records)
        outcome.notes += [compared, scale_note]
    if outcome.regime is not None and outcome.regime.ratio is not None:
        outcome.notes.append(outcome.regime.text)
    outcome.notes = [f"testable: {text}" for _, _, text in checked] + outcome.notes + [claim.why]
    return row, outcome


def _verdicts(claims: Sequence[Claim], outcomes: Sequence[Outcome], q_values: Sequence[float | None]
              ) -> list[tuple[str, str, list[str]]]:
    """Each row's verdict, the rule that gave it and notes: from its q, then the init-scale rule on every comparison
    of two groups whichever way it points (groups that start at different scales are init-scale confounded, unless
    the row would hold and names a scale-matched control row that holds: a control names no control of its own, so its
    verdict is final after the first pass), then the regime rule on "the paper's size excluded"."""
    first: list[tuple[str, str, list[str]]] = []
    for claim, outcome, q in zip(claims, outcomes, q_values, strict=True):
        verdict = outcome.decide(q)
        rule = outcome.rule or outcome.test_rule or rule_of(verdict)
        if outcome.scale == DIFFERS and outcome.rule is None and not (verdict == HOLDS and claim.scale_control):
            control = "" if claim.scale_control else "; no scale-matched control row (scale_control)"
            first.append((CONFOUNDED, RULE_INIT_SCALE, [f"the test alone: {verdict}{control}"]))
        elif verdict == PAPER_SIZE_EXCLUDED and not (outcome.regime or NO_REFERENCE).commensurate:
            first.append((NOT_TESTABLE, RULE_REGIME, [f"the test alone: {verdict}; a size is not read outside the "
                                                      "regime"]))
        else:
            first.append((verdict, rule, []))
    by_claim = {claim.claim: verdict for claim, (verdict, _, _) in zip(claims, first, strict=True)}
    final = []
    for claim, outcome, (verdict, rule, notes) in zip(claims, outcomes, first, strict=True):
        if verdict == HOLDS and outcome.scale == DIFFERS and claim.scale_control is not None:
            control = by_claim.get(claim.scale_control, "not in this table")
            verdict, rule = (HOLDS, RULE_SCALE_CONTROL) if control == HOLDS else (CONFOUNDED, RULE_INIT_SCALE)
            notes = [f"the scale-matched control row \"{claim.scale_control}\": {control}"]
        final.append((verdict, rule, notes))
    by_claim = {claim.claim: verdict for claim, (verdict, _, _) in zip(claims, final, strict=True)}
    for claim, (_, _, notes) in zip(claims, final, strict=True):
        if claim.beside:
            notes.append(f"read beside \"{claim.beside}\": {by_claim.get(claim.beside, 'not in this table')}")
    return final


def claims_table(records_by_sweep: Mapping[str, Sequence[RunRecord]], claims: Sequence[Claim]) -> pd.DataFrame:
    """Every claim, by section (SECTIONS) and in order within it, with p and q, p corrected within the row's section;
    a claim whose sweep is not given is marked "not run"."""
    claims = sorted(claims, key=lambda claim: list(SECTIONS).index(claim.section))
    effect_of = lambda claim, records: _matching_effect(claim, paper_figure(claim)[1], records)[0]  # noqa: E731
    context = Context(regimes_by_sweep(claims, records_by_sweep, effect_of))
    evaluated = [evaluate_claim(claim, records_by_sweep.get(claim.sweep), context) for claim in claims]
    q_values = corrected(claims, [outcome.p_value for _, outcome in evaluated])
    verdicts = _verdicts(claims, [outcome for _, outcome in evaluated], q_values)
    rows = []
    for (row, outcome), q, (verdict, rule, notes) in zip(evaluated, q_values, verdicts, strict=True):
        rows.append(row | outcome.cells | {"p": p_cell(outcome.p_value), "q": p_cell(q), "verdict": verdict,
                                           "rule": rule, "init ratio": fmt(outcome.init_ratio),
                                           "regime": outcome.regime.cell() if outcome.regime else "",
                                           "note": "; ".join(n for n in [*outcome.notes, *notes] if n)})
    return pd.DataFrame(rows, columns=COLUMNS)
