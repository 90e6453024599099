"""`gatelab sweep plan`: a sweep file validated and priced, one row per run, before anything runs."""

from __future__ import annotations

from pathlib import Path

from gatelab import paper as paper_tables
from gatelab.workspace import Workspace


def show_plan(sweep_path: Path, *, experiment: Path | None = None, as_json: bool = False,
              flops_per_second: float | None = None, workspace: Workspace | None = None, workers: int = 1,
              cell: int | None = None) -> None:
    """Load and validate the sweep (GatelabError on any bad cell), then print its plan, its time for `workers` workers.
    With a `workspace` and no `flops_per_second`, times are measured where its store holds earlier runs of the same
    shape from this machine. With a `cell`, that cell's resolved config instead (gatelab.app.config_show)."""
    if cell is not None:
        from gatelab.app.config_show import cell_config, print_resolved

        return print_resolved(cell_config(sweep_path, cell=cell, experiment=experiment))
    from gatelab.sweep.plan import plan_rows, sweep_measurements
    from gatelab.sweep.plan_render import corpus_warnings, render_plan
    from gatelab.sweep.spec import load_sweep

    sweep = load_sweep(sweep_path, experiment)
    trials = sweep.search.n_trials if sweep.search else 1
    measured, notes = [], []
    if flops_per_second is None and workspace is not None:
        measured, notes = sweep_measurements(sweep.runs, tracking_uri=workspace.tracking_uri,
                                             runs_dir=workspace.runs_dir)
    rows = plan_rows(sweep.runs, paper=sweep.paper, flops_per_second=flops_per_second, trials=trials,
                     measured=measured)
    notes += [str(duplicate) for duplicate in sweep.duplicates]
    warnings = corpus_warnings(rows, sweep.runs)
    if sweep.search:
        notes.append(f"each row is an Optuna search of {trials} trials over "
                     f"{', '.join(sweep.search.params)} ({sweep.search.direction} {sweep.search.metric})")
    table = paper_tables.TABLES.get(sweep.paper or "")
    if table is not None and table.added and not any("paper_added_m" in row for row in rows):
        notes.append(f"no paper column: {paper_tables.paper_file(table.file)} is missing")
    title = f"{sweep.name}: {len(rows)} runs on {sweep.experiment_path}"
    title += f" (paper {sweep.paper})" if sweep.paper else ""
    extra = {"sweep": sweep.name, "experiment": str(sweep.experiment_path), "paper": sweep.paper,
             "duplicates": [str(d) for d in sweep.duplicates], "warnings": warnings}
    render_plan(rows, as_json, title=title, notes=warnings + notes, extra=extra, workers=workers)
