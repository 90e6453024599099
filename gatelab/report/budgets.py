"""The evaluation budget each run was scored on (EvalConfig.budget: the held-out text its end-of-run scores read), and
the rule every comparison of the reports keeps: runs scored on different budgets are never compared. The table's Δ and
p, the per-arm table, the ladder's multiplier and the claims' tests each ask `not_comparable` of the runs they would
set side by side, and say its answer instead of a number.

eval.budget is not in a run's spec hash (gatelab.data.identity), so a sweep file that gains one finds its earlier runs,
scored on the windows of their own config: only the param a run records tells them apart.

Runs are duck-typed records (gatelab.report.tables.RunRecord: spec, status, budget), so that every report module, the
tables' own imports among them, can read this one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from gatelab.tracking import EVAL_BUDGET_PARAM

NOT_COMPARABLE = "not comparable"


def run_budget(record: Any) -> str:
    """The budget a run recorded (EVAL_BUDGET_PARAM); a run from before that param was scored on its own config's
    windows (eval.max_windows_per_domain of data.seq_len, both in its spec hash), whatever eval.budget the sweep file
    now sets."""
    if record.budget:
        return record.budget
    experiment = record.spec.experiment
    return experiment.eval.model_copy(update={"budget": None}).budget_name(experiment.data.seq_len)


def not_comparable(runs: Iterable[Any]) -> str | None:
    """What a comparison of `runs` shows instead of its figures where their finished runs were scored on different
    budgets (naming them, with how many runs each); else None. BUDGET_FIX says how to make them one."""
    counts = Counter(run_budget(r) for r in runs if r.status == "finished")
    if len(counts) < 2:
        return None
    listed = " vs ".join(f"{budget}: {n} run{'s' if n > 1 else ''}" for budget, n in sorted(counts.items()))
    return f"{NOT_COMPARABLE}: scored on different evaluation budgets ({listed})"


BUDGET_FIX = (f"Runs scored on different evaluation budgets (param {EVAL_BUDGET_PARAM}: the held-out text of each "
              "domain the end-of-run scores read) are never compared. To compare them, score every cell on one: set "
              "one eval.budget in the sweep file and set aside the runs scored on another (gatelab sweep supersede "
              "--run ...), so that gatelab sweep run trains them again; eval.budget is not in a run's spec hash, so "
              "the sweep alone keeps them.")
