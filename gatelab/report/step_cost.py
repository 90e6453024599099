"""What a variant costs beside what it changes: its steady-state step time (`time/step_s`) over the baseline's, with
a 95% interval, where both arms' runs ran on one host and one device (a step time from another machine measures the
machine); each arm's figures for the table's metric and the step time; and every seed's value, for the CSV.

Runs are duck-typed records (gatelab.report.tables.RunRecord: spec, status, metrics, host, device, group,
baseline_group), so the tables import this module and not the other way round.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from gatelab.metrics import STEP_S, WALL_STEP_S
from gatelab.progress import DEVICE_TAG, HOST_TAG
from gatelab.report.budgets import NOT_COMPARABLE, not_comparable
from gatelab.report.stats import Ratio, compare_shared_seeds, mean_std, ratio_of_means

STEP_TIME_RATIO = "step-time ratio"
ARM_COLUMNS = ("variant", "metric", "n", "mean", "sd", "Δ vs baseline", "p")
STEP_TIME_NOTE = (f"{STEP_TIME_RATIO}: the row's mean {STEP_S} (the steady-state step: the median step after the "
                  "warm-up, without validation) over its baseline's, over the seeds both have; in brackets its 95% "
                  "interval, the t-interval of the per-seed log ratios, exponentiated. Shown only where every "
                  f"finished run of both arms carries one host ({HOST_TAG}) and one device ({DEVICE_TAG}).")


def values_by_seed(members: Sequence[Any], metric: str) -> dict[int, float]:
    """The finished runs' values of `metric`, keyed by seed."""
    return {r.spec.experiment.seed: r.metrics[metric] for r in members
            if r.status == "finished" and metric in r.metrics}


@dataclass(frozen=True)
class StepCost:
    """A row's step-time ratio against its baseline, or why the two arms' step times do not compare."""

    ratio: Ratio | None
    why_not: str | None = None  # set where `ratio` is None

    @property
    def cell(self) -> str:
        if self.ratio is None:
            return NOT_COMPARABLE
        if not math.isfinite(self.ratio.ratio):
            return f"n/a ({self.ratio.reason})"
        if self.ratio.interval is None:
            return f"{self.ratio.ratio:.3f} ({self.ratio.reason})"
        low, high = self.ratio.interval
        return f"{self.ratio.ratio:.3f} [{low:.3f}, {high:.3f}]"


def why_not_comparable(runs: Sequence[Any]) -> str | None:
    """None where every run carries the same host and device tags and timed the steady-state step; else why their
    step times do not compare."""
    if any(r.host is None or r.device is None for r in runs):
        return f"runs without {HOST_TAG}/{DEVICE_TAG} tags (recorded before runs carried them)"
    if any(WALL_STEP_S not in r.metrics for r in runs):
        # before issue 44 time/step_s was the session's mean step, compile and validation included: not a cost
        return f"runs whose {STEP_S} is the session's mean step, compile and validation included (recorded before " \
               f"{WALL_STEP_S} was logged beside the steady-state step)"
    for what, tags in (("hosts", {r.host for r in runs}), ("devices", {r.device for r in runs})):
        if len(tags) > 1:
            return f"runs on {len(tags)} {what} ({', '.join(sorted(tags))})"
    return None


def step_cost(variant: Sequence[Any], baseline: Sequence[Any]) -> StepCost:
    """The variant arm's step time over the baseline arm's, paired by seed (`ratio_of_means`), where comparable."""
    finished = [r for r in (*variant, *baseline) if r.status == "finished"]
    why_not = why_not_comparable(finished)
    if why_not is not None:
        return StepCost(None, why_not)
    return StepCost(ratio_of_means(values_by_seed(variant, STEP_S), values_by_seed(baseline, STEP_S)))


def step_cost_notes(costs: dict[str, StepCost]) -> list[str]:
    """The column's definition, and for the rows that say "not comparable", why (rows of one reason together)."""
    if not costs:
        return []
    rows_by_reason: dict[str, list[str]] = {}
    for group, cost in costs.items():
        if cost.why_not is not None:
            rows_by_reason.setdefault(cost.why_not, []).append(group)
    return [STEP_TIME_NOTE] + [f"{STEP_TIME_RATIO} {NOT_COMPARABLE} for {', '.join(groups)}: {reason}."
                               for reason, groups in rows_by_reason.items()]


def arm_frame(records: Sequence[Any], metric: str) -> pd.DataFrame:
    """Each arm (group) for `metric` and for the step time: n, mean and sd over its finished seeds, and its change
    against the baseline of the same settings with the paired t-test's p over the seeds both have; for `metric`, not
    where the two arms' runs were scored on different evaluation budgets (gatelab.report.budgets)."""
    groups: dict[str, list[Any]] = {}
    for record in records:
        groups.setdefault(record.group, []).append(record)
    lines = []
    for group, members in groups.items():
        baseline = groups.get(members[0].baseline_group, [])
        apart = not_comparable(members + ([] if baseline is members else baseline))
        for name in (metric, STEP_S):
            values = values_by_seed(members, name)
            mean, sd, n = mean_std(values.values())
            line = {"variant": group, "metric": name, "n": str(n), "mean": "" if n == 0 else f"{mean:.4g}",
                    "sd": "" if sd is None else f"{sd:.3g}", "Δ vs baseline": "", "p": ""}
            if apart is not None and name == metric:  # a step time is the training's: no budget reads it
                line["Δ vs baseline"] = apart
            elif baseline and baseline is not members and values:
                result = compare_shared_seeds(values, values_by_seed(baseline, name))
                line["Δ vs baseline"] = "" if math.isnan(result.delta) else f"{result.delta:+.4g}"
                line["p"] = f"{result.p_value:.3g}" if result.p_value is not None else f"n/a ({result.reason})"
            lines.append(line)
    return pd.DataFrame(lines, columns=list(ARM_COLUMNS))


def seed_values(records: Sequence[Any], metrics: Sequence[str]) -> pd.DataFrame:
    """Every finished run's value of each of `metrics`, one row each (variant, seed, metric, value): the numbers the
    per-arm table is made from, for a reader's own test."""
    rows = [{"variant": r.group, "seed": r.spec.experiment.seed, "metric": name, "value": r.metrics[name]}
            for name in metrics for r in records if r.status == "finished" and name in r.metrics]
    return pd.DataFrame(rows, columns=["variant", "seed", "metric", "value"])
