"""`gatelab ui`: the MLflow UI over a sweep's tracking store, until Ctrl-C (gatelab.report.ui runs it)."""

from __future__ import annotations

from pathlib import Path

from gatelab.report.ui import serve_ui
from gatelab.workspace import Workspace


def ui(sweep: Path | None, *, workspace: Workspace, port: int, screenshot: Path | None, verbose: bool) -> None:
    """Serve the store's runs, opening on the sweep's (a wrong sweep file is an error here, not an empty UI). Only
    reads: a store or runs folder that does not exist is an error, not created."""
    sweep_name = None
    if sweep is not None:
        from gatelab.sweep.spec import load_sweep

        sweep_name = load_sweep(sweep).name
    serve_ui(workspace.store(create=False), port=port, sweep_name=sweep_name, screenshot=screenshot, verbose=verbose)
