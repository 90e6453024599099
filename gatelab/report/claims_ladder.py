"""A claims row of kind `multiplier` (gatelab.report.claims): on a ladder sweep, group a's compute multiplier over group
b at the largest rung, read off b's fitted law (gatelab.report.ladder, the same fit as `gatelab table`'s ladder table).

Its test is the multiplier's seed-bootstrap 95% interval, not a p-value: wholly above 1 (below 1 for direction lower)
holds, wholly on the other side does not hold, otherwise inconclusive. The row has no p-value, so it is in no section's
correction, and its interval is uncorrected. A multiplier is a statement of size: the regime rule reads it only where
its sweep's reference row is commensurate with the paper's (claims_rules.size_not_read), and where the ladder fits no
law (too few rungs, a baseline whose loss does not fall, too few seeds to resample) the row is not testable, with why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gatelab.report.claims_file import Claim
from gatelab.report.claims_rules import COMMENSURATE, FAILS, HOLDS, NOT_TESTABLE, inconclusive
from gatelab.report.ladder import MIN_RUNGS, MIN_SEEDS_PER_RUNG, RESAMPLES, fit_ladder
from gatelab.report.tables import RunRecord

# Printed under the claims table where a row is a multiplier (gatelab.report.claims_report).
MULTIPLIER_RULE = (
    "Multiplier (a ladder sweep: the same arms at several model sizes, its rungs): group a's compute multiplier over "
    "group b, the compute of b's fitted law L(C) = L_inf + A C^-alpha that reaches a's loss over a's compute, at a's "
    "largest rung (loss: ln of the metric; compute: each run's training FLOPs; the fit's rule as `gatelab table`'s "
    f"ladder table states it: {MIN_RUNGS} rungs an arm at least, {MIN_SEEDS_PER_RUNG} seeds a rung). Its test is the "
    f"seed bootstrap's 95% interval ({RESAMPLES} resamples, percentile, fixed seed): holds where it lies wholly on the "
    "claimed side of 1, does not hold where it lies wholly on the other, otherwise inconclusive; no p-value, so the "
    "row is in no family (rule: interval). A multiplier is a statement of size: it is read only where the sweep's "
    f"reference row is within 1/{COMMENSURATE:g} to {COMMENSURATE:g} times the paper's effect (rule: regime), and "
    "where the ladder fits no law it is not testable, with why (rule: ladder). The init-scale rule applies as to any "
    "row comparing two groups.")
TEST = f"seed bootstrap of the ladder fit ({RESAMPLES} resamples, 95% percentile)"


@dataclass(frozen=True)
class MultiplierReading:
    """A multiplier row's figures, its verdict (NOT_TESTABLE where the ladder fits no law) and notes."""

    cells: dict[str, str]
    verdict: str
    notes: list[str] = field(default_factory=list)

    @property
    def testable(self) -> bool:
        return self.verdict != NOT_TESTABLE


def interval_verdict(interval: tuple[float, float], multiplier: float, direction: str | None) -> str:
    """The verdict of a multiplier's interval against 1, the claim's `direction` higher (above 1) or lower."""
    expected = -1.0 if direction == "lower" else 1.0
    side = 1.0 if interval[0] > 1 else -1.0 if interval[1] < 1 else 0.0
    if side == expected:
        return HOLDS
    if side == -expected:
        return f"{FAILS} (the interval on the other side of 1)"
    return inconclusive(1.0 if multiplier > 1 else -1.0 if multiplier < 1 else 0.0, expected)


def read_multiplier(claim: Claim, records: Sequence[RunRecord]) -> MultiplierReading:
    """Group a's compute multiplier over group b (groups without the rung, as the claims file names them)."""
    from gatelab.report.ladder_table import UNIT, ladder_points  # matplotlib: only where a row reads a ladder

    points, rung_names = ladder_points(records, claim.metric)
    fit = fit_ladder(points.get(claim.b or "", {}), points.get(claim.a, {}), unit=UNIT)
    rungs = f"{fit.n_rungs} rungs"
    if not fit.testable:
        cells = {"ours": "n/a", "spread (sd)": "", "n": rungs, "test": f"{TEST}: not testable", "r (seeds)": "",
                 "MDE": ""}
        return MultiplierReading(cells, NOT_TESTABLE, [f"not testable: {fit.why_not}"])
    low, high = fit.interval
    rung = rung_names.get(claim.a, {}).get(fit.largest_compute, "")
    cells = {"ours": f"{fit.multiplier:.3f}x (95% CI {low:.3f} to {high:.3f}) at rung {rung} "
                     f"({fit.largest_compute:.3g} {UNIT})",
             "spread (sd)": "", "n": rungs, "test": TEST, "r (seeds)": "", "MDE": ""}
    law = (f"{claim.b}'s law: alpha {fit.alpha:.3g} ({fit.alpha_source}), L_inf {fit.irreducible_loss:.4g} nats of "
           f"ln({claim.metric})")
    return MultiplierReading(cells, interval_verdict((low, high), fit.multiplier, claim.direction), [law])
