"""What one run comes to (gatelab.train.result's RunResult)."""

from __future__ import annotations

from gatelab.train.result import RunResult


def test_a_result_has_metrics_of_its_own_and_counts_nothing_trained_unless_told():
    first, second = RunResult("finished", "run-a", "hash-a"), RunResult("pruned", "run-b", "hash-b")
    first.metrics["ppl/avg"] = 2.0
    assert second.metrics == {}  # not one dict shared by every result
    # a run found recorded already trained nothing in this session: the sweep's time estimate must not count it
    assert (second.diverged_step, second.global_rank, second.trained_steps, second.train_s) == (None, 0, 0, 0.0)
