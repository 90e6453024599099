"""`gatelab variants`: every registered variant with its axes, formula, paper rows and reference, and its parameters
under an experiment preset."""

from __future__ import annotations

import json
from pathlib import Path

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


def _millions(count: int | None, signed: bool = False) -> str:
    if count is None:
        return "n/a"
    if abs(count) < 100_000:  # a sink logit per head or a KV bias: +0.00M would hide it
        return f"{count:+,d}" if signed else f"{count:,d}"
    return f"{count / 1e6:+.2f}M" if signed else f"{count / 1e6:.2f}M"


def print_variants(experiment: Path | None, as_json: bool) -> None:
    """The variants as a table, or as JSON."""
    from rich.table import Table

    from gatelab.variants import VARIANTS

    rows = variant_rows(experiment)
    if as_json:
        echo(json.dumps(rows, indent=2))
        return
    table = Table(box=None, title=f"{len(VARIANTS)} variants" + (f" under {experiment}" if experiment else ""))
    for column in ("id", "position", "granularity", "heads", "form", "activation", "attention", "paper rows",
                   "formula", "reference"):
        table.add_column(column)
    if experiment:
        table.add_column("total", justify="right")
        table.add_column("added", justify="right")
    for row in rows:
        cells = [row["id"], *(row["axes"][k] for k in ("position", "granularity", "heads", "form", "activation",
                                                       "attention")),
                 " ".join(f"T{r['table'][5:]}{r['row']}" for r in row["paper_rows"]), row["formula"], row["reference"]]
        if experiment:
            cells += [_millions(row["total_params"]), _millions(row["added_params"], signed=True)]
        table.add_row(*cells)
    stdout_console().print(table)
