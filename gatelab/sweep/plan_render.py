"""How `gatelab sweep plan` shows what `gatelab.sweep.plan` estimates (the table of runs, the estimate lines under it,
the corpus warnings, JSON), and `gatelab sweep run`'s opening estimate."""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from gatelab.data.budget import format_tokens, repeat_warning
from gatelab.progress import DONE, format_duration, step_time
from gatelab.sweep.plan import EVAL_FIXED_S, plan_rows, plan_totals, rung_rows, sweep_measurements, wall_seconds
from gatelab.sweep.spec import RunSpec

RICH_TABLE_ROWS = 500  # a longer plan is printed as plain aligned text (`_plain_table`): rich takes 2 ms a row


def _index_ranges(indices: Sequence[int]) -> str:
    """[0, 1, 2, 5] -> "0-2, 5"."""
    spans: list[list[int]] = []
    for index in sorted(indices):
        if spans and index == spans[-1][1] + 1:
            spans[-1][1] = index
        else:
            spans.append([index, index])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _runs(indices: Sequence[int]) -> str:
    return f"run {indices[0]}" if len(indices) == 1 else f"runs {_index_ranges(indices)}"


def corpus_warnings(rows: Sequence[dict[str, Any]], specs: Sequence[RunSpec]) -> list[str]:
    """One warning per distinct case of runs that would pass over their corpus more than once (same corpus count and
    tokens: the same factor), and one line per distinct way a corpus was estimated or could not be counted."""
    cases: dict[tuple, list[int]] = {}
    experiments = {spec.index: spec.experiment for spec in specs}
    for row in rows:
        if row["passes"] is not None and row["passes"] > 1:
            cases.setdefault((row["tokens"], row["corpus_tokens"], row["corpus_count"]), []).append(row["index"])
    lines = []
    for (tokens, corpus_tokens, how), indices in cases.items():
        experiment = experiments[indices[0]]
        subject = _runs(indices)
        lines.append("warning: " + repeat_warning(subject, experiment.data, tokens, corpus_tokens,
                                                  experiment.train.batch_size * experiment.data.seq_len,
                                                  estimated=how == "estimate"))
    if cases and any(row.get("rung") is not None for row in rows):
        lines.append("  (a ladder sets train.max_steps from its tokens rule: for fewer passes, lower ladder.tokens or "
                     "the rungs, or add text)")
    for how, mark in (("estimate", "~"), ("unknown", "?")):
        notes: dict[str, list[int]] = {}
        for row in rows:
            if row["corpus_count"] == how:
                notes.setdefault(row["corpus_note"], []).append(row["index"])
        lines += [f"corpus {mark} ({_runs(indices)}): {note}" for note, indices in notes.items()]
    return lines


def plan_json(rows: Sequence[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    rungs = rung_rows(rows)
    return {"runs": list(rows), "totals": plan_totals(rows), **({"rungs": rungs} if rungs else {}), **extra}


def _params(count: int, signed: bool = False) -> str:
    sign = "+" if signed and count else ""
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(count) >= scale:
            return f"{count / scale:{sign}.2f}{suffix}"
    return f"{count:{sign}d}"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.1f}m"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f}h"
    if seconds < 365 * 86400:
        return f"{seconds / 86400:.1f}d"
    years = seconds / (365.25 * 86400)
    return f"{years:.3g}y" if years < 1000 else f"{years:,.0f}y"


def render_plan(rows: Sequence[dict[str, Any]], as_json: bool = False, *, title: str | None = None,
                notes: Sequence[str] = (), extra: dict[str, Any] | None = None, console: Any = None,
                workers: int = 1) -> None:
    """Print the plan: a rich table (and a ladder's table of rungs) with a totals line and notes, the time for
    `workers` workers, or JSON {"runs": [...], "totals": {...}, "rungs": [...] (a ladder's), ...}."""
    if as_json:
        print(json.dumps(plan_json(rows, **(extra or {})), indent=2), file=getattr(console, "file", sys.stdout))
        return
    console = console or (Console(markup=False) if sys.stdout.isatty() else Console(width=200, markup=False))
    with_paper = any("paper_added_m" in row for row in rows)
    with_trials = any(row["trials"] > 1 for row in rows)
    columns = ["#", "variant", "seed", "overrides", "total", "added"] + (["paper added"] if with_paper else []) \
        + ["tokens", "corpus", "passes", "FLOPs", "est. time"] + (["trials"] if with_trials else [])
    cells = [_row_cells(row, with_paper, with_trials) for row in rows]
    if len(rows) > RICH_TABLE_ROWS:
        left = {columns.index("variant"), columns.index("overrides")}
        console.file.write(_plain_table(columns, cells, left, title) + "\n")  # as written: no markup, no wrapping
    else:
        table = Table(box=None, title=title, title_justify="left")
        for column in columns:
            table.add_column(column, justify="left" if column in ("variant", "overrides") else "right")
        for row_cells in cells:
            table.add_row(*row_cells)
        console.print(table)
    rungs = rung_rows(rows)
    if rungs:
        console.print(_rung_table(rungs))
    totals = plan_totals(rows)
    console.print(f"{totals['runs']} runs, {format_tokens(totals['tokens'])} tokens, {totals['flops']:.2e} FLOPs",
                  highlight=False)
    for line in estimate_lines(rows, workers):
        console.print(line, highlight=False, markup=False)
    for note in notes:
        console.print(note, highlight=False, markup=False)


def _rung_table(rungs: Sequence[dict[str, Any]]) -> Table:
    """The ladder at a glance: what each rung trains, and what its runs cost together (time: on one worker)."""
    def spread(values: Sequence[float], show: Any) -> str:
        return show(values[0]) if len(values) == 1 else f"{show(values[0])}-{show(values[-1])}"

    table = Table(box=None, title="ladder rungs (parameters: the baseline's, which the tokens rule reads)",
                  title_justify="left")
    for column in ("rung", "runs", "parameters", "tokens a run", "tokens a parameter", "FLOPs (all runs)",
                   "est. time (1 worker)"):
        table.add_column(column, justify="left" if column == "rung" else "right")
    for rung in rungs:
        table.add_row(rung["rung"], str(rung["runs"]), spread(rung["baseline_params"], _params),
                      spread(rung["tokens"], format_tokens), spread(rung["tokens_per_parameter"], "{:.1f}".format),
                      f"{rung['flops']:.2e}", _duration(rung["seconds"]))
    return table


def _row_cells(row: dict[str, Any], with_paper: bool, with_trials: bool) -> list[str]:
    cells = [str(row["index"]), row["variant"], str(row["seed"]), row["overrides"] or "-",
             _params(row["total_params"]), _params(row["added_params"], signed=True)]
    if with_paper:
        paper = row.get("paper_added_m")
        cells.append("n/a" if paper is None else f"{paper:+g}M")
    mark = {"estimate": "~", "unknown": "?"}.get(row["corpus_count"], "")
    corpus = "?" if row["corpus_tokens"] is None else mark + format_tokens(row["corpus_tokens"])
    passes = "?" if row["passes"] is None else f"{mark}{row['passes']:.3g}"
    cells += [format_tokens(row["tokens"]), corpus, passes, f"{row['flops']:.2e}", _duration(row["seconds"])]
    if with_trials:
        cells.append(str(row["trials"]))
    return cells


def _plain_table(columns: Sequence[str], rows: Sequence[Sequence[str]], left: set[int], title: str | None) -> str:
    """The plan's table as aligned text, its columns as rich draws them (box=None): rich lays out about 2 ms a row, so
    a plan of 10,000 runs took 20 s to print; this takes milliseconds."""
    widths = [max([len(column)] + [len(row[i]) for row in rows]) for i, column in enumerate(columns)]

    def line(cells: Sequence[str]) -> str:
        return " ".join(cell.ljust(width) if i in left else cell.rjust(width)
                        for i, (cell, width) in enumerate(zip(cells, widths))).rstrip()

    return "\n".join(([title] if title else []) + [line(columns)] + [line(row) for row in rows])


def _where(rows: Sequence[dict[str, Any]]) -> str:
    """Where rows were measured: the GPU (its runs count from any machine), else "this machine"."""
    gpus = sorted({row["device"] for row in rows} - {"cpu", "mps", None})
    return ", ".join(gpus) or "this machine"


def _how(bases: Iterable[str]) -> str:
    kinds = set(bases)
    return "measured" if kinds == {"measured"} else "a default" if kinds == {"default"} else "partly measured"


def estimate_lines(rows: Sequence[dict[str, Any]], workers: int = 1, what: str = "") -> list[str]:
    """The estimated time of `rows` (runs to train, split over `workers`), and how it was made: one line for the total,
    one per basis (measured here, a rate measured here, or a rough guess from FLOPs), one for the set-up and evaluation
    the rate bases estimate, and one for the imports, which each worker process pays once (the total adds them once:
    the workers import side by side)."""
    if not rows:
        return []
    totals = plan_totals(rows)
    per_run = totals["seconds"] / totals["runs"]
    shared = f" on {workers} workers" if workers > 1 else ""
    imports = max(row["import_s"] for row in rows)
    measured = [row for row in rows if row["basis"] == "measured"]
    rated = [row for row in rows if row["basis"] == "measured rate"]
    guessed = [row for row in rows if row["basis"] == "flops"]
    # A FLOPs guess can be off several-fold either way (the quickstart's 150 tiny steps took 0.27 s each on 2 idle
    # cores, against the guess's 1.0 s; under load, 2-5x longer), so it is labelled a rough guess, not a bound; so is a
    # measured rate, which carries an estimated evaluation and another shape's efficiency.
    about = "roughly" if guessed or rated else "about"
    lines = [f"estimate: {about} {format_duration(wall_seconds(rows, workers))} for "
             f"{totals['runs']} {what}run(s){shared}, {format_duration(per_run)} a run"]
    evaluated_alike = [row for row in measured if row["measured_overhead_s"] is not None]
    if measured:
        steps = statistics.median(row["measured_step_s"] for row in measured)
        earlier = max(row["measured_runs"] for row in measured)
        where = _where(measured)
        around = (f" + {format_duration(statistics.median(row['measured_overhead_s'] for row in evaluated_alike))} "
                  "of set-up and evaluation a run" if evaluated_alike else "")
        lines.append(f"  measured on {where} ({len(measured)} of {len(rows)} runs): {step_time(steps)} x "
                     f"max_steps{around}, the median of {earlier} earlier run(s) of the same shape"
                     + ("; other processes on the same cores slow runs down" if where == "this machine" else ""))
        if len(evaluated_alike) < len(measured):
            lines.append(f"  ({len(measured) - len(evaluated_alike)} of those evaluate unlike the runs measured "
                         "(eval.*, data.domains, data.task): their evaluation is estimated below)")
    if rated:
        rates = ", ".join(f"{rate:.2g}" for rate in sorted({row["flops_per_second"] for row in rated}))
        earlier = max(row["measured_runs"] for row in rated)
        lines.append(f"  from the rate measured on {_where(rated)} ({len(rated)} of {len(rows)} runs): training FLOPs "
                     f"(6 x parameters x tokens + attention) at {rates} FLOP/s, the median that {earlier} earlier "
                     "run(s) of other shapes reached")
    if guessed:
        rates = "; ".join(sorted({f"{row['flops_per_second']:.2g} FLOP/s ({row['rate_source']})" for row in guessed}))
        lines.append(f"  a rough guess ({len(guessed)} of {len(rows)} runs): training FLOPs (6 x parameters x tokens + "
                     f"attention) at {rates}; runs record their step time, so the next plan of the same shape on "
                     "this device is measured")
    estimated = rated + guessed + [row for row in measured if row["measured_overhead_s"] is None]
    if estimated:
        setup = statistics.median(row["setup_s"] for row in estimated)
        evaluation = statistics.median(row["eval_s"] for row in estimated)
        eval_flops = statistics.median(row["eval_flops"] for row in estimated)
        eval_rates = "; ".join(sorted({f"{row['eval_flops_per_second']:.2g} FLOP/s ({row['eval_rate_source']})"
                                       for row in estimated}))
        lines.append(f"  around training ({len(estimated)} of {len(rows)} runs): {format_duration(setup)} of set-up "
                     f"({_how(row['setup_basis'] for row in estimated)}) and {format_duration(evaluation)} of "
                     f"evaluation a run: its {eval_flops:.2g} forward FLOPs at {eval_rates}, + "
                     f"{EVAL_FIXED_S:.0f} s of plots and artifacts")
    lines.append(f"  and {format_duration(imports)} of imports once a worker process "
                 f"({_how(row['import_basis'] for row in rows)})")
    return lines

def sweep_run_estimate(sweep, specs: Sequence[RunSpec], storage: str, tracking_uri: str | None, runs_dir: Path,
                       workers: int) -> list[str]:
    """`gatelab sweep run`'s opening estimate: the runs its ledger has not seen end yet, priced as `sweep plan`
    prices them."""
    from gatelab.sweep.queue import ledger_states

    trials = sweep.search.n_trials if sweep.search else 1
    if sweep.search:  # a search's ledger holds trials, not cells: every cell is priced
        left = list(specs)
    else:
        done = {state.hash for state in ledger_states(storage, runs_dir, sweep.name, specs)
                if state.status in DONE}
        left = [spec for spec in specs if spec.hash not in done]
    if not left:
        return []
    measured, notes = sweep_measurements(left, tracking_uri, runs_dir)
    rows = plan_rows(left, trials=trials, measured=measured)
    return estimate_lines(rows, workers, what="" if len(left) == len(specs) else "remaining ") + notes
