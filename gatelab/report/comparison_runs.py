"""Each comparison `gatelab table` makes, as an MLflow run of its own (issue 44) in the experiment "<sweep>
comparisons" (gatelab.tracking.comparisons_experiment), so that `mlflow.search_runs` answers which variant moved how
far from its baseline at which rung without reading the report's files. One run per row of the main table (a variant
group against the baseline of its settings: in a ladder sweep, one per rung) with params.table = "main", and one per
row of the ladder table (a variant arm's compute multiplier, read at its largest rung) with params.table = "ladder".
Never a tag on a training run, and nothing on a read-only store.

Params, what was compared (a change makes a new run: RunStore.log_comparisons): sweep, table, variant, group,
baseline, rung, metric, each side's run ids and seeds, the evaluation budget. Metrics, what came of it, where finite:
delta, delta_percent, p, mde, step_time_ratio (and _low, _high: its 95% interval), compute_multiplier (and _low,
_high), alpha. Tags: the verdict in the table's words and the test.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from gatelab.report.budgets import run_budget
from gatelab.report.ladder_table import LadderArm, arm_name, multiplier_cell
from gatelab.report.step_cost import StepCost, step_cost
from gatelab.report.tables import ONE_SEED_TEST, PPL, GroupNumbers, RunRecord
from gatelab.sweep.ladder import RUNG
from gatelab.tracking import ComparisonRun, RunStore

NO_RUNG = "none"
VERDICT_TAG, TEST_TAG, SWEEP_TAG = "gatelab.comparison.verdict", "gatelab.comparison.test", "gatelab.comparison.sweep"
# Run ids beyond this many characters are named only in the run's comparison.json: MLflow caps a param's value (6000
# characters since MLflow 2.x, 500 before).
FALLBACK_PARAM_LIMIT = 500


def log_comparison_runs(sweep_name: str, records: Sequence[RunRecord], rows: Sequence[GroupNumbers],
                        ladder_arms: Sequence[LadderArm], store: RunStore, metric: str = PPL) -> list[str]:
    """The main table's rows (`rows`, baseline rows aside) and the ladder table's (`ladder_arms`) as runs of the
    sweep's comparisons experiment; their ids, [] on a read-only store (nothing read or written)."""
    if store.read_only:
        return []
    by_group: dict[str, list[RunRecord]] = {}
    by_arm: dict[str, list[RunRecord]] = {}
    for record in records:
        by_group.setdefault(record.group, []).append(record)
        by_arm.setdefault(arm_name(record), []).append(record)
    comparisons = [_main_run(sweep_name, row, by_group.get(row.members[0].baseline_group, []), metric)
                   for row in rows if row.variant != "baseline"]
    comparisons += [_ladder_run(sweep_name, arm, by_arm.get(arm.arm, []), by_arm.get(arm.baseline, []), metric)
                    for arm in ladder_arms]
    return store.log_comparisons(sweep_name, comparisons)


def budgets_of(runs: Iterable[RunRecord]) -> str:
    """The runs' evaluation budgets (gatelab.report.budgets.run_budget: the param they recorded, or their config's
    windows for a run from before it), each distinct one once, sorted."""
    return ", ".join(sorted({run_budget(record) for record in runs}))


def compared(records: Iterable[RunRecord], metric: str) -> list[RunRecord]:
    """The runs a comparison's numbers come from: finished, with the metric."""
    return [r for r in records if r.status == "finished" and r.run_id is not None and metric in r.metrics]


def _comparison(key: str, name: str, identity: dict[str, str], variant: list[RunRecord], baseline: list[RunRecord],
                metrics: dict[str, float | None], tags: dict[str, str]) -> ComparisonRun:
    """The ComparisonRun of one row: `identity` and both sides' runs as params, the finite metrics."""
    ids = {"variant_run_ids": sorted(r.run_id for r in variant), "baseline_run_ids": sorted(r.run_id for r in baseline)}
    params = {**identity, **{name: _ids_param(values) for name, values in ids.items()},
              "variant_seeds": str(len({r.spec.experiment.seed for r in variant})),
              "baseline_seeds": str(len({r.spec.experiment.seed for r in baseline})),
              "eval_budget": budgets_of([*variant, *baseline])}
    finite = {name: float(value) for name, value in metrics.items() if value is not None and math.isfinite(value)}
    return ComparisonRun(key, name, params, finite, tags, {**params, **ids, "metrics": finite, "tags": tags})


def _ids_param(run_ids: list[str]) -> str:
    text = ",".join(run_ids)
    return text if len(text) <= _param_limit() else f"{len(run_ids)} runs: see comparison.json"


def _param_limit() -> int:
    try:
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH
    except ImportError:  # an MLflow that moved it: the oldest limit is safe everywhere
        return FALLBACK_PARAM_LIMIT
    return MAX_PARAM_VAL_LENGTH


def _step_time_metrics(cost: StepCost | None) -> dict[str, float | None]:
    if cost is None or cost.ratio is None:
        return {}
    low, high = cost.ratio.interval or (None, None)
    return {"step_time_ratio": cost.ratio.ratio, "step_time_ratio_low": low, "step_time_ratio_high": high}


def _main_run(sweep_name: str, row: GroupNumbers, baseline: list[RunRecord],
              metric: str) -> ComparisonRun:
    result = row.comparison
    rung = row.members[0].spec.settings().get(RUNG)
    identity = {"sweep": sweep_name, "table": "main", "variant": row.variant, "group": row.group,
                "baseline": row.members[0].baseline_group, "rung": NO_RUNG if rung is None else str(rung),
                "metric": metric}
    metrics: dict[str, float | None] = {"delta": row.delta, "delta_percent": row.delta_percent,
                                        **_step_time_metrics(row.step_cost)}
    if result is not None:
        metrics.update(p=result.p_value, mde=result.mde)
    tags = {VERDICT_TAG: _main_verdict(row), TEST_TAG: "" if result is None else result.test, SWEEP_TAG: sweep_name}
    return _comparison(f"main/{row.group}", row.group, identity, compared(row.members, metric),
                       compared(baseline, metric), metrics, tags)


def _main_verdict(row: GroupNumbers) -> str:
    """The row's result as the main table words it: its change, p and test, or why it has none."""
    result = row.comparison
    if result is None:
        return "not compared: the variant or its baseline has no finished run"
    change = f"Δ {result.delta:+.4g} ({row.delta_percent:+.2f}%)"
    if result.p_value is None:
        return f"{change}, {ONE_SEED_TEST if result.n == 1 else 'not tested: ' + (result.reason or 'n/a')}"
    return f"{change}, p {result.p_value:.3g} ({result.test})"


def _ladder_run(sweep_name: str, arm: LadderArm, variant: list[RunRecord], baseline: list[RunRecord],
                metric: str) -> ComparisonRun:
    fit = arm.fit
    identity = {"sweep": sweep_name, "table": "ladder", "variant": arm.variant, "group": arm.arm,
                "baseline": arm.baseline, "rung": arm.largest_rung or NO_RUNG, "metric": metric}
    low, high = fit.interval or (None, None)
    metrics: dict[str, float | None] = {"compute_multiplier": fit.multiplier, "compute_multiplier_low": low,
                                        "compute_multiplier_high": high, "alpha": fit.alpha}
    if arm.largest_rung:  # the table's wall-clock multiplier is the compute multiplier over this ratio
        variant_top, baseline_top = ([r for r in side if r.spec.settings().get(RUNG) == arm.largest_rung]
                                     for side in (variant, baseline))
        metrics.update(_step_time_metrics(step_cost(variant_top, baseline_top)))
    verdict = multiplier_cell(fit) + (f" at rung {arm.largest_rung}" if fit.testable else "")
    test = f"scaling-law fit, alpha {fit.alpha_source}, seed bootstrap" if fit.testable else ""
    tags = {VERDICT_TAG: verdict, TEST_TAG: test, SWEEP_TAG: sweep_name}
    return _comparison(f"ladder/{arm.arm}", f"{arm.arm} (ladder)", identity, compared(variant, metric),
                       compared(baseline, metric), metrics, tags)
