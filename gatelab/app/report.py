"""`gatelab table`: a sweep file and its ledger read, its runs collected from MLflow, and their report written
(gatelab.report.report makes it)."""

from __future__ import annotations

import shlex
from pathlib import Path

from typer import echo

from gatelab.app import comma_list, say_written
from gatelab.errors import GatelabError
from gatelab.output_folders import require_writable_folder
from gatelab.store_uris import missing_local_store, read_only_store
from gatelab.tracking import RunStore
from gatelab.workspace import Workspace


def make_report(sweep_path: Path, *, experiment: Path | None, formats: list[str], out_dir: Path | None,
                workspace: Workspace, log=print, command: str | None = None) -> list[Path]:
    """The report of a sweep's runs under `out_dir`, by default <runs_dir>/reports/<sweep name>/ (git ignores runs/,
    so a report never overwrites the shipped references under results/ unless --out names them)."""
    from gatelab.report.export import check_formats, check_markdown_target
    from gatelab.report.report import MARKDOWN_NAME, REPORTS, write_report
    from gatelab.report.tables import collect_runs
    from gatelab.sweep.queue import ledger_states
    from gatelab.sweep.spec import expand, load_sweep

    check_formats(formats)  # a wrong format is an error before any download or plot
    sweep = load_sweep(sweep_path, experiment)
    uri, runs_dir = workspace.store(create=False), workspace.runs_dir
    missing = missing_local_store(uri)  # reading a missing store would create an empty one
    if missing:
        raise GatelabError(missing)
    out = out_dir or Path(runs_dir) / REPORTS / sweep.name
    require_writable_folder(out, "--out" if out_dir else "--runs-dir")  # the default one too, before any run is read
    if "md" in check_formats(formats):
        check_markdown_target(out / MARKDOWN_NAME)  # a hand-written README.md there is refused, not overwritten
    command = command or " ".join(["gatelab table", shlex.quote(str(sweep_path)),
                                   *(["--out", shlex.quote(str(out_dir))] if out_dir else [])])
    specs = expand(sweep)
    # The report is also logged to a sweep-level MLflow run, so that it opens from the UI beside the runs: only where
    # the store may be written; a store made read-only (chmod -w, a shared copy) is read and left byte for byte.
    read_only = read_only_store(uri)
    store = RunStore(uri, runs_dir, read_only=read_only is not None)
    records = collect_runs(specs, store, sweep.name, ledger_states(
        workspace.storage, runs_dir=runs_dir, sweep_name=sweep.name, specs=specs))
    written = write_report(sweep.name, sweep.paper, records, store, out, formats, command,
                           specs[0].experiment.data.seq_len, log=log)
    if read_only:
        log(f"not logged to MLflow: {read_only}, so the report is only in {out}")
    return written


def table(sweep_path: Path, *, experiment: Path | None, formats: str, out_dir: Path | None, workspace: Workspace,
          command: str) -> None:
    """`gatelab table`: the report, its tables printed, then the files it wrote. A ValueError (a value in the runs
    that the report cannot use) is a user error too."""
    try:
        written = make_report(sweep_path, experiment=experiment, formats=comma_list(formats), out_dir=out_dir,
                              workspace=workspace, log=echo, command=command)
    except ValueError as error:
        raise GatelabError(str(error)) from None
    say_written(written)
