"""`gatelab variants`: every registered variant with its axes, formula, paper rows and reference, and its parameters
under an experiment preset."""

from __future__ import annotations

import json
from pathlib import Path

from rich.table import Table
from typer import echo

from gatelab.app import stdout_console
from gatelab.errors import GatelabError


def variant_rows(experiment_path: Path | None) -> list[dict]:
    from gatelab.data.resolve import load_experiment
    from gatelab.model.params import added_parameters
    from gatelab.variants import VARIANTS

    experiment = load_experiment(experiment_path) if experiment_path else None
    rows = []
    for variant in VARIANTS.values():
        row = {"id": variant.id, "summary": variant.summary, "formula": variant.formula, "axes": variant.axes(),
               "paper_rows": [{"table": r.table, "row": r.row} for r in variant.paper_rows], "note": variant.note,
               "reference": variant.citation()}
        if experiment is not None:
            try:
                row["total_params"], row["added_params"] = added_parameters(experiment, variant.id)
            except GatelabError as error:  # e.g. ref_add4experts on a dense preset
                row["total_params"] = row["added_params"] = None
                row["not_applicable"] = str(error)
        rows.append(row)
    return rows


WIDE_TABLE_COLUMNS = 200  # what the whole table takes, one line a variant for most


def _millions(count: int | None, signed: bool = False) -> str:
    if count is None:
        return "n/a"
    if abs(count) < 100_000:  # a sink logit per head or a KV bias: +0.00M would hide it
        return f"{count:+,d}" if signed else f"{count:,d}"
    return f"{count / 1e6:+.2f}M" if signed else f"{count / 1e6:.2f}M"


def print_variants(experiment: Path | None, *, as_json: bool) -> None:
    """The variants as a table, or as JSON."""
    from gatelab.variants import VARIANTS

    rows = variant_rows(experiment)
    if as_json:
        echo(json.dumps(rows, indent=2))
        return
    console = stdout_console()
    table = Table(box=None, title=f"{len(VARIANTS)} variants" + (f" under {experiment}" if experiment else ""))
    # The id is what a user copies into a sweep file: never cut or wrapped. In a terminal narrower than the whole
    # table the six axes share one column, and the other columns wrap.
    compact = console.width < WIDE_TABLE_COLUMNS
    axes = ("position", "granularity", "heads", "form", "activation", "attention")
    table.add_column("id", no_wrap=True, min_width=max(len(v) for v in VARIANTS))
    for column in (("axes",) if compact else axes) + ("paper rows", "formula", "reference"):
        table.add_column(column, overflow="fold", ratio=2 if column == "formula" else 1 if compact else None)
    if experiment:
        table.add_column("total", justify="right", no_wrap=True)
        table.add_column("added", justify="right", no_wrap=True)
    for row in rows:
        axis_cells = [row["axes"][k] for k in axes]
        cells = [row["id"], *([" ".join(a for a in axis_cells if a != "-") or "-"] if compact else axis_cells),
                 " ".join(f"T{r['table'][5:]}{r['row']}" for r in row["paper_rows"]), row["formula"], row["reference"]]
        if experiment:
            cells += [_millions(row["total_params"]), _millions(row["added_params"], signed=True)]
        table.add_row(*cells)
    console.print(table)
