"""`gatelab table`: a sweep's runs -> paper-shaped tables, plots, exports, and a sweep-level MLflow run holding them."""

from __future__ import annotations

import math
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from gatelab.output_folders import require_writable_folder
from gatelab.report.export import ReportTable, check_formats, export_report
from gatelab.report.plots import (plot_context_length, plot_delta_vs_paper, plot_first_token_attention,
                                  plot_gate_histograms, plot_loss_curves)
from gatelab.report.regimes import regime_reports
from gatelab.report.tables import PPL, build_comparison, collect_runs, data_stamp, probe_payloads
from gatelab.sweep.queue import ledger_states
from gatelab.sweep.spec import expand, load_sweep
from gatelab.tracking import RunStore, default_tracking_uri

History = tuple[Sequence[int], Sequence[float]]  # (steps, values) of one metric, in step order


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
        steps, losses = store.metric_history(record.run_id, "train/loss")
        spikes = spike_steps(store.metric_history(record.run_id, "train/spike"),
                             store.metric_history(record.run_id, "train/spikes"),
                             record.metrics.get("train/spikes_total"), steps[-1] if steps else None)
        curves[record.group] = (steps, losses, spikes)
    return curves


def make_report(sweep_path: Path, experiment: Path | None, formats: list[str], out_dir: Path | None,
                tracking_uri: str | None, runs_dir: Path, storage: str | None, log=print) -> list[Path]:
    check_formats(formats)  # a wrong format is an error before any download or plot
    sweep = load_sweep(sweep_path, experiment)
    out = out_dir or Path("results") / sweep.name
    require_writable_folder(out, "--out")  # the default one too, before any run is read
    specs = expand(sweep)
    store = RunStore(tracking_uri or default_tracking_uri(runs_dir), runs_dir)
    records = collect_runs(specs, store, sweep.name, ledger_states(storage, runs_dir, sweep.name, specs))
    comparison = build_comparison(records, sweep.paper)
    out.mkdir(parents=True, exist_ok=True)

    numbers = comparison.numbers
    payloads = probe_payloads(records, store)
    groups = dict.fromkeys(r.group for r in records)  # in the sweep's order (not a set's): a re-made plot is identical
    means = {g: {int(m.split("x")[1]): np.mean([r.metrics[m] for r in records if r.group == g and m in r.metrics])
                 for m in sorted({m for r in records if r.group == g for m in r.metrics if m.startswith("long_ppl/x")})}
             for g in groups}
    plots = [
        # Relative changes: a tiny model's perplexity is two orders of magnitude above the paper's, its deltas too.
        plot_delta_vs_paper((100 * numbers["delta"] / (numbers["mean"] - numbers["delta"])).dropna().to_dict(),
                            (100 * numbers["paper_delta"] / (numbers["paper"] - numbers["paper_delta"])).dropna().to_dict(),
                            out / "delta_vs_paper.png", metric="Avg PPL, % change"),
        plot_first_token_attention({g: p["first_token_share"] for g, p in payloads.items()},
                                   out / "first_token_attention.png"),
        plot_gate_histograms({g: np.sum([np.sum(h, axis=0) for h in p["gate_histogram"].values()], axis=0).tolist()
                              for g, p in payloads.items() if p.get("gate_histogram")},
                             out / "gate_score_histograms.png"),  # every gate position of a group, all layers
        plot_loss_curves(_loss_curves(records, store), out / "loss_curves.png"),
        plot_context_length({g: m for g, m in means.items() if m}, specs[0].experiment.data.seq_len,
                            out / "context_length.png"),
    ]
    # Where the sweep has them: the gap to baseline against the step, and final loss against the learning rate.
    regime_tables, regime_plots = regime_reports(records, store, sweep.name, out)
    plots += regime_plots
    title = f"{sweep.name}: {PPL} by variant" + (f", beside the paper's {sweep.paper}" if sweep.paper else "")
    tables = [ReportTable(title, comparison.frame, comparison.notes), *regime_tables]
    command = "gatelab table " + " ".join(shlex.quote(a) for a in sys.argv[2:]) if len(sys.argv) > 2 else None
    written = export_report(tables, plots, out, formats, sweep.name, command=command, stamp=data_stamp(records))
    store.log_report(sweep.name, written + plots)  # the report opens from the MLflow UI too
    for table in tables:
        log(table.frame.to_string(index=False))
        for note in table.notes:
            log(note)
    return written + plots
