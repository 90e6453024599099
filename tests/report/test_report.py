"""`gatelab table`'s spike count: the training monitor's, placed at logged steps for runs without `train/spike`."""

from __future__ import annotations

from gatelab.report.report import spike_steps

NONE: tuple[list[int], list[float]] = ([], [])


def test_spike_history_gives_the_steps_as_logged():
    assert spike_steps(([37, 12], [4.1, 5.0]), ([10, 20, 30, 40], [0, 1, 1, 2]), 2.0) == [12, 37]


def test_cumulative_counts_place_each_rise_at_its_logged_step():
    counts = ([0, 10, 20, 30, 40], [0.0, 1.0, 1.0, 3.0, 3.0])
    assert spike_steps(NONE, counts, 3.0) == [10, 30, 30]


def test_a_spike_after_the_last_logged_count_goes_to_the_last_logged_step():
    counts = ([0, 10, 20], [0.0, 1.0, 1.0])  # a spike at step 25 was counted after the last logging step
    steps = spike_steps(NONE, counts, 2.0)
    assert steps == [10, 20] and len(steps) == 2


def test_without_any_count_history_spikes_go_to_the_last_loss_step():
    assert spike_steps(NONE, NONE, 2.0, last_step=99) == [99, 99]
    assert spike_steps(NONE, NONE, 0.0, last_step=99) == []
    assert spike_steps(NONE, NONE, None, last_step=99) == []


def test_the_count_matches_spikes_total_whatever_the_history():
    for counts, total in (((range(0, 50, 10), [0, 0, 2, 2, 5]), 5.0), ((range(0, 50, 10), [0, 0, 2, 2, 5]), 7.0),
                          ((range(0, 50, 10), [0, 0, 0, 0, 0]), 1.0)):
        assert len(spike_steps(NONE, (list(counts[0]), counts[1]), total)) == total
