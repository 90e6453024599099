"""`gatelab table`'s spike count: the training monitor's, placed at logged steps for runs without `train/spike`."""

from __future__ import annotations

from pathlib import Path

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


def test_a_report_table_fits_the_terminal_key_columns_first_and_says_where_the_rest_is(monkeypatch):
    import pandas as pd

    from gatelab.report.export import ReportTable
    from gatelab.report.report import log_table

    wide = {f"ppl/domain{i}": [f"{100 + i:.3f} (3)"] * 2 for i in range(30)}
    frame = pd.DataFrame({"variant": ["baseline", "g1_elem_sig"], "runs": ["3 finished"] * 2, **wide,
                          "paper Avg PPL": [7.499, 7.404], "ppl/avg (mean ± std (n))": ["283 ± 12 (3)"] * 2,
                          "Δ (%)": ["", "-25.6"], "paper Δ (%)": ["", "-1.27"]})
    note = "Significance: a note long enough that it has to wrap in a terminal of eighty columns, " * 3
    table = ReportTable("t", frame, [note])
    lines: list[str] = []
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)  # a terminal, 80 columns wide
    log_table(table, [Path("out/README.md"), Path("out/t.csv"), Path("out/plot.png")], lines.append)
    text = "\n".join(lines).splitlines()
    assert max(map(len, text)) <= 80
    header = text[0].split()
    assert header[:2] == ["variant", "runs"] and "paper" in header  # ours beside the paper's, before the rest
    assert "ppl/domain29" in "\n".join(text) and "README.md, t.csv" in "\n".join(text)  # named, and where it is
    assert "plot.png" not in "\n".join(text)

    lines.clear()
    monkeypatch.delenv("COLUMNS")
    monkeypatch.setattr("sys.stdout.isatty", lambda: False)  # a pipe: whole rows, the table's own order
    log_table(table, [], lines.append)
    assert lines[0].splitlines()[0].split()[:3] == ["variant", "runs", "ppl/domain0"]
    assert lines[-1] == note
