"""A sweep's runs -> paper-shaped tables, plots, exports, and a sweep-level MLflow run holding them (`gatelab table`,
which gatelab.app.report reads the sweep and its runs for)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from gatelab.eval.plots import VariantColours, plot_first_token_attention, plot_gate_histograms, plot_loss_curves
from gatelab.metrics import SPIKE, SPIKES, SPIKES_TOTAL, STEP_S, TRAIN_LOSS
from gatelab.progress import fit_columns, fit_line, terminal_columns
from gatelab.report.comparison_runs import log_comparison_runs
from gatelab.report.export import ReportSection, ReportTable, export_report
from gatelab.report.ladder_table import ladder_report
from gatelab.report.plots import plot_context_length, plot_delta_vs_paper
from gatelab.report.regimes import regime_reports
from gatelab.report.stats import mean_std
from gatelab.report.step_cost import STEP_TIME_RATIO, arm_frame, seed_values
from gatelab.report.tables import PPL, RunRecord, build_comparison, comparison_title, data_stamp, probe_payloads
from gatelab.tracking import RunStore

History = tuple[Sequence[int], Sequence[float]]  # (steps, values) of one metric, in step order
MARKDOWN_NAME = "README.md"  # GitHub shows a folder's README.md under its file list: the report opens by itself
REPORTS = "reports"  # the default output is <runs dir>/reports/<sweep name>/: the user's own, beside its store

# sweeps/quickstart.yaml's three runs (ppl/avg of baseline, g1_elem_sig, g1_head_sig), same seed, each from a fresh
# clone: where, and what it gave. The first two are issue 18's, the third the run issue 36 reported, the fourth the one
# made for issue 36 (the README's first command on a 120-column pty, idle machine), the last the one results/quickstart
# now shows (issue 44: a new checkout and an empty data directory, the cores shared with other work).
CROSS_MACHINE_PPL = (
    ("the machine of the first shipped reference (issue 18)", (419.5, 294.2, 296.9)),
    ("a second machine (issue 18)", (425.2, 292.0, 297.2)),
    ("a 2-core AVX2 machine shared with other work (issue 36)", (408.8, 292.0, 297.2)),
    ("an idle 2-core AVX2 EPYC in fp32 (issue 36)", (416.1, 292.0, 297.2)),
    ("a 2-core Xeon with AMX in bf16, results/quickstart (issue 44)", (418.0, 295.6, 296.8)),
)
CROSS_MACHINE_GROUPS = ("baseline", "g1_elem_sig", "g1_head_sig")


def closeness_section(records: Sequence[RunRecord], metric: str = PPL) -> ReportSection:
    """How far a user's own run of the sweep may fall from these numbers: across machines (measured four times) and
    across seeds (measured here, where the sweep has two or more)."""
    spreads = []
    for index, group in enumerate(CROSS_MACHINE_GROUPS):
        values = [figures[index] for _, figures in CROSS_MACHINE_PPL]
        spreads.append(f"{group} {min(values):.1f} to {max(values):.1f} ({100 * (max(values) / min(values) - 1):.1f}%)")
    runs = "; ".join(f"{' / '.join(f'{v:.1f}' for v in figures)} on {where}" for where, figures in CROSS_MACHINE_PPL)
    paragraphs = [
        "Runs of the same seed and commit on another machine give other numbers: CPU kernels, precision (bf16 on "
        "some CPUs, fp32 on others: `precision: auto`) and thread counts differ between machines, so sums round "
        "differently and the runs drift apart as they train.",
        f"Measured {len(CROSS_MACHINE_PPL)} times, sweeps/quickstart.yaml from a fresh clone ({PPL} of "
        f"{' / '.join(CROSS_MACHINE_GROUPS)}): {runs}. Ranges: {'; '.join(spreads)}. The gated runs agree closely, "
        "the baseline less (also between two machines with the same kind of CPU), so your baseline may land anywhere "
        "in its range: compare the differences between variants (Δ vs baseline, Δ (%)) with this in mind, not the "
        "absolute values.",
        seed_spread_text(records, metric),
    ]
    return ReportSection("How close your numbers should be", paragraphs)


def seed_spread_text(records: Sequence[RunRecord], metric: str = PPL) -> str:
    """The seed-to-seed spread of `metric` in each row with two or more finished runs, or why there is none."""
    values: dict[str, list[float]] = {}
    for record in records:
        value = record.metrics.get(metric)
        if record.status == "finished" and value is not None and math.isfinite(value):
            values.setdefault(record.group, []).append(value)
    spreads = {group: mean_std(v) for group, v in values.items() if len(v) >= 2}
    seeds = {record.spec.experiment.seed for record in records}
    if spreads:
        cells = [f"{group} {std:.3f} ({100 * std / abs(mean):.2f}% of its mean, {n} seeds)"
                 for group, (mean, std, n) in spreads.items()]
        fewer = [group for group in dict.fromkeys(r.group for r in records) if group not in spreads]
        return (f"Seed-to-seed spread of {metric} in this sweep (standard deviation over seeds): " + "; ".join(cells)
                + ". A difference between variants inside these spreads is seed noise; the table's p column tests each."
                + (f" Fewer than two finished seeds, so no spread: {', '.join(fewer)}." if fewer else ""))
    if len(seeds) >= 2:
        return (f"This sweep has {len(seeds)} seeds, but no row has two finished runs yet, so the seed-to-seed spread "
                "is not measured.")
    return ("This sweep has one seed, so the seed-to-seed spread is not measured: a difference between variants "
            "smaller than the cross-machine one above is not evidence. Add seeds (seed: [0, 1, 2]) to measure it.")


def spike_steps(spikes: History, counts: History, total: float | None, last_step: int | None = None) -> list[int]:
    """The steps of a run's loss spikes, as many as its `train/spikes_total`.

    `spikes` is the run's `train/spike` history (one point per spike, at its step): where it has any, those steps.
    Runs logged before that metric have only `counts`, the stability monitor's cumulative `train/spikes` at each
    logging step: a rise of k puts k spikes at that logged step (they happened in the interval before it), and spikes
    counted after the last logged count (`total` above it) go to the last logged step (or `last_step` where no count
    was logged). The monitor checks every step's loss, so this, not a recount on the logged subsample, is the count.
    """
    if len(spikes[0]):
        return sorted(int(step) for step in spikes[0])
    steps: list[int] = []
    seen = 0
    for step, count in zip(*counts):
        rise = int(round(count)) - seen
        if rise > 0:
            steps += [int(step)] * rise
            seen += rise
    remainder = int(round(total)) - seen if total is not None and math.isfinite(total) else 0
    at = counts[0][-1] if len(counts[0]) else last_step
    if remainder > 0 and at is not None:
        steps += [int(at)] * remainder
    return steps


def _loss_curves(records, store: RunStore) -> dict:
    """Per group, the training loss of its first finished run and that run's spike steps."""
    curves = {}
    for record in records:
        if record.status != "finished" or record.group in curves:
            continue
        steps, losses = store.metric_history(record.run_id, TRAIN_LOSS)
        spikes = spike_steps(store.metric_history(record.run_id, SPIKE),
                             store.metric_history(record.run_id, SPIKES),
                             record.metrics.get(SPIKES_TOTAL), steps[-1] if steps else None)
        curves[record.group] = (steps, losses, spikes)
    return curves


def write_report(sweep_name: str, paper: str | None, records: Sequence[RunRecord], store: RunStore, out: Path,
                 formats: list[str], command: str, seq_len: int, log=print) -> list[Path]:
    """The report of a sweep's runs under `out`: the comparison table laid out like the paper's `paper` table, the
    regime tables, plots and exports, also logged to the sweep-level MLflow run; prints the tables. `seq_len` is the
    training length the context-length plot marks."""
    comparison = build_comparison(records, paper)
    out.mkdir(parents=True, exist_ok=True)

    numbers = comparison.numbers
    payloads = probe_payloads(records, store)
    groups = dict.fromkeys(r.group for r in records)  # in the sweep's order (not a set's): a re-made plot is identical
    means = {g: {int(m.split("x")[1]): np.mean([r.metrics[m] for r in records if r.group == g and m in r.metrics])
                 for m in sorted({m for r in records if r.group == g for m in r.metrics if m.startswith("long_ppl/x")})}
             for g in groups}
    colours = VariantColours()
    for group in groups:  # the sweep's order: baseline first where the sweep names it first
        colours[group]
    plots = [
        # Relative changes: a tiny model's perplexity is two orders of magnitude above the paper's, its deltas too.
        plot_delta_vs_paper(numbers["delta_percent"].dropna().to_dict(),
                            numbers["paper_delta_percent"].dropna().to_dict(), out / "delta_vs_paper.png",
                            metric="Avg PPL", unit="%"),
        plot_first_token_attention({g: p["first_token_share"] for g, p in payloads.items()},
                                   out / "first_token_attention.png", colours),
        plot_gate_histograms({g: np.sum([np.sum(h, axis=0) for h in p["gate_histogram"].values()], axis=0).tolist()
                              for g, p in payloads.items() if p.get("gate_histogram")},
                             out / "gate_score_histograms.png", colours),  # every gate position of a group, all layers
        plot_loss_curves(_loss_curves(records, store), out / "loss_curves.png", colours),
        plot_context_length({g: m for g, m in means.items() if m}, seq_len, out / "context_length.png", colours),
    ]
    # Where the sweep has them: the gap to baseline against the step, and final loss against the learning rate.
    regime_tables, regime_plots = regime_reports(records, store, sweep_name, out, colours)
    plots += regime_plots
    ladder, ladder_plots, ladder_arms = ladder_report(records, sweep_name, out, colours)  # nothing where no rungs
    plots += ladder_plots
    main = ReportTable(comparison_title(sweep_name, records, paper), comparison.frame, comparison.notes,
                       key="main", secondary=comparison.secondary)
    arms = ReportTable(f"{sweep_name}: each arm's {PPL} and step time", arm_frame(records, PPL), [ARMS_NOTE],
                       key="arms")
    written = export_report([main, arms, *ladder, *regime_tables], plots, out, formats, sweep_name, command=command,
                            stamp=data_stamp(records), markdown_name=MARKDOWN_NAME,
                            sections=[closeness_section(records)], data={"seeds": seed_values(records, [PPL, STEP_S])})
    store.log_report(sweep_name, written + plots)  # the report opens from the MLflow UI too
    log_comparison_runs(sweep_name, records, comparison.rows, ladder_arms, store)  # each row queryable on its own
    for table in (main, arms, *ladder, *regime_tables):
        log_table(table, written, log)
    return written + plots


ARMS_NOTE = (f"n, mean and sd over each arm's finished seeds; Δ vs baseline and p: the paired t-test over the seeds "
             f"the arm shares with the baseline of its settings. {STEP_S}: the steady-state step (the median after "
             "the warm-up, without validation), comparable only between runs of one host and device. Every seed's "
             "value is in <sweep>_seeds.csv.")


def log_table(table: ReportTable, written: Sequence[Path], log) -> None:
    """A report table as the terminal can show it, where the rest is, and its notes. Ours beside the paper's come
    first: the variant, our figure, its change, p and the test, then the paper's figure and change."""
    width = terminal_columns()
    frame = table.frame
    key = [c for c in frame.columns[:1]] + [c for c in frame.columns[1:] if str(c).startswith(PPL) or str(c) in (
        "runs", "Δ (%)", "p", "test", STEP_TIME_RATIO, "paper Avg PPL", "paper Δ (%)")]
    if width is not None:  # a pipe or a file keeps the table's own order, whole
        frame = frame[key + [c for c in frame.columns if c not in key]]
    text, left_out = fit_columns(frame, width)
    log(text)
    lines = list(table.notes)
    if left_out:
        files = [p.name for p in written if p.suffix in (".md", ".csv", ".html")]
        lines.insert(0, f"(and {len(left_out)} more columns, too wide for this terminal: {', '.join(left_out)}; "
                        f"every column is in {', '.join(files) or 'the report files'})")
    for line in lines:
        log(fit_line(line, width))
