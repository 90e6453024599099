"""The rules that read a row of the claims table against more than its own test: the regime of its sweep (is the
sweep's reference effect commensurate with the paper's, so that a statement of size means anything), the sections
(confirmatory rows corrected apart from exploratory ones and from other papers' claims), and the name of the rule that
gave each verdict.

A statement of size (a closeness row, "the paper's size excluded") compares our figures with the paper's sizes. At
0.2 to 40 tokens a parameter a gate can move perplexity by eight times the paper's effect, or by a twentieth of it: a
margin or an exclusion set by the paper's numbers then says nothing about the paper. So each sweep names one reference
row (`regime_reference`, G1 against the baseline), and sizes are read in that sweep only where the reference effect is
within COMMENSURATE times the paper's, either way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from gatelab.report.budgets import not_comparable
from gatelab.report.claims_evidence import PaperEffect, by_seed
from gatelab.report.claims_file import Claim
from gatelab.report.stats import benjamini_hochberg, shared_seeds
from gatelab.report.tables import RunRecord

COMMENSURATE = 4.0  # a sweep's reference effect within 1/4 to 4 times the paper's: sizes can be compared

HOLDS, FAILS, INCONCLUSIVE = "holds", "does not hold", "inconclusive at this scale"
PAPER_SIZE_EXCLUDED = f"{FAILS} (the paper's size excluded)"
CONFOUNDED = "init-scale confounded"
NOT_TESTABLE, TRUE_BY_CONSTRUCTION = "not testable at this scale", "true by construction"
DESCRIPTIVE, NOT_RUN = "descriptive (not tested)", "not run"
NOT_ADDRESSED = "not addressed"

# The rule that gave a row its verdict, as the table's column `rule` names it.
RULE_TEST = "test: q < 0.05"
RULE_NO_DECISION = "no decision: q >= 0.05"
RULE_SIZE = "size: interval beyond the paper's effects"
RULE_MARGIN = "margin: interval beyond it"
RULE_INIT_SCALE = "init scale: groups start apart"
RULE_SCALE_CONTROL = "init scale: its control holds"
RULE_REGIME = "regime: reference effect vs the paper's"
RULE_POSITIVE_CONTROL = "positive control: within the margin"
RULE_PRECONDITION = "precondition: did not arise"
RULE_BUDGET = "evaluation budget: runs scored on different ones"
RULE_CONSTRUCTION, RULE_DESCRIPTIVE = "true by construction", "descriptive"
RULE_NOT_RUN, RULE_NOT_ADDRESSED = "not run", "not addressed"
RULE_WHOLE_SAMPLE = "whole sample: runs still to end"  # a confirmatory row is read on all of its declared runs
RULE_INTERVAL = "interval: 95% bootstrap beside 1"  # a ladder's compute multiplier (gatelab.report.claims_ladder)
RULE_LADDER = "ladder: no law to read"

SECTIONS = {  # section: (heading in words, correction)
    "confirmatory": ("confirmatory: declared before the runs they read", "holm"),
    "exploratory": ("exploratory: the paper's claims, written after their data", "bh"),
    "other paper": ("other papers' claims", "bh"),
}
CORRECTION_NAMES = {"holm": "Holm", "bh": "Benjamini-Hochberg"}


@dataclass(frozen=True)
class Regime:
    """A sweep's reference effect against the paper's: ratio ours / the paper's mean effect (None: no reference)."""

    ratio: float | None
    text: str

    @property
    def commensurate(self) -> bool:
        return self.ratio is not None and 1.0 / COMMENSURATE <= self.ratio <= COMMENSURATE

    def cell(self) -> str:
        return "n/a" if self.ratio is None else f"{self.ratio:.3g}x"


NO_REFERENCE = Regime(None, "no reference row in this sweep: no size can be compared with the paper's")


def regime(claim: Claim, records: Sequence[RunRecord], paper: PaperEffect | None) -> Regime:
    """The regime that reference row `claim` sets for its sweep: its relative effect (mean over the shared seeds)
    against the mean of the paper's effects for the sweep's kind of model (`paper`, None where the paper has none)."""
    apart = not_comparable(r for r in records if r.group in (claim.a, claim.b))
    if apart is not None:
        return Regime(None, f"reference \"{claim.claim}\": {apart}")
    a, b = by_seed(records, claim.a, claim.metric), by_seed(records, claim.b or "", claim.metric)
    seeds = [s for s in shared_seeds(a, b) if math.isfinite(a[s]) and math.isfinite(b[s])]
    if paper is None or not seeds:
        why = "the paper has no effect for the sweep's kind of model" if paper is None else "no shared seeds"
        return Regime(None, f"reference \"{claim.claim}\": {why}")
    mean_b = float(np.mean([b[s] for s in seeds]))
    ours = (float(np.mean([a[s] for s in seeds])) - mean_b) / mean_b
    theirs = float(np.mean(paper.effects))
    ratio = ours / theirs
    inside = 1.0 / COMMENSURATE <= ratio <= COMMENSURATE
    return Regime(ratio, f"regime of {claim.sweep}: its reference \"{claim.claim}\" is {100 * ours:+.3g}% against the "
                         f"paper's {100 * theirs:+.3g}% ({paper.source}, mean), {ratio:.3g}x, "
                         f"{'inside' if inside else 'outside'} [1/{COMMENSURATE:g}, {COMMENSURATE:g}]")


def size_not_read(claim: Claim, sweep_regime: Regime) -> str | None:
    """Why the regime rule leaves a row that is a statement of size unread (not testable), or None: a closeness, and a
    ladder's compute multiplier, outside the regime. A closeness with a stated margin is read in a sweep without a
    reference row (its positive control, not the paper's size, tells whether the sweep can see the margin)."""
    stated = claim.kind == "closeness" and claim.margin.paper_gain is None
    if claim.kind not in ("closeness", "multiplier") or sweep_regime.commensurate or \
            (stated and sweep_regime.ratio is None):
        return None
    what = "a closeness" if claim.kind == "closeness" else "a compute multiplier"
    return f"not testable: {what} is a statement of size; {sweep_regime.text}"


def inconclusive(sign: float, expected: float) -> str:
    """Inconclusive, with the way the figures point."""
    way = "the paper's direction" if sign == expected else "the other way" if sign == -expected else "no difference"
    return f"{INCONCLUSIVE} ({way})"


def rule_of(verdict: str) -> str:
    """The rule a verdict of the row's own test comes from (the rules applied after it name themselves)."""
    if verdict.startswith(PAPER_SIZE_EXCLUDED):
        return RULE_SIZE
    if verdict.startswith(f"{FAILS} (apart"):
        return RULE_MARGIN
    if verdict.startswith((HOLDS, FAILS)):
        return RULE_TEST
    if verdict.startswith(INCONCLUSIVE):
        return RULE_NO_DECISION
    return {TRUE_BY_CONSTRUCTION: RULE_CONSTRUCTION, NOT_RUN: RULE_NOT_RUN, NOT_ADDRESSED: RULE_NOT_ADDRESSED,
            NOT_TESTABLE: RULE_PRECONDITION}.get(verdict, RULE_DESCRIPTIVE)


def corrected(claims: Sequence[Claim], p_values: Sequence[float | None]) -> list[float | None]:
    """Each row's p corrected within its section (SECTIONS): Holm over the confirmatory rows, Benjamini-Hochberg over
    each other section; rows without a p-value stay None and are in no family."""
    q_values: list[float | None] = [None] * len(p_values)
    for section, (_, method) in SECTIONS.items():
        members = [i for i, c in enumerate(claims) if c.section == section]
        family = [p_values[i] for i in members]
        for i, q in zip(members, holm(family) if method == "holm" else benjamini_hochberg(family), strict=True):
            q_values[i] = q
    return q_values


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values (`statsmodels.stats.multitest.multipletests`); None stays None."""
    from statsmodels.stats.multitest import multipletests

    tested = [i for i, p in enumerate(p_values) if p is not None and math.isfinite(float(p))]
    adjusted: list[float | None] = [None] * len(p_values)
    if tested:
        _, holm_p, _, _ = multipletests([float(p_values[i]) for i in tested], method="holm")
        for i, q in zip(tested, holm_p, strict=True):
            adjusted[i] = float(q)
    return adjusted


def regimes_by_sweep(claims: Sequence[Claim], records_by_sweep: Mapping[str, Sequence[RunRecord]],
                     effect_of) -> dict[str, Regime]:
    """{sweep: its Regime} for every sweep with a reference row and runs; `effect_of(claim, records)` the paper's
    effect matching the sweep's kind of model."""
    found = {}
    for claim in claims:
        records = records_by_sweep.get(claim.sweep or "")
        if claim.regime_reference and records:
            found[claim.sweep] = regime(claim, records, effect_of(claim, records))
    return found
