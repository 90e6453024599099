"""`gatelab claims`: the sweep files and the claims file read, each sweep's runs collected from MLflow and its ledger,
and the claims table written (gatelab.report.claims checks each claim, gatelab.report.claims_report writes it)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from typer import echo

from gatelab.app import comma_list, say_written
from gatelab.errors import GatelabError
from gatelab.metrics import TRAIN_LOSS
from gatelab.progress import DEVICE_TAG
from gatelab.store_uris import missing_local_store
from gatelab.tracking import RESOLVED_PRECISION_PARAM, TOTAL_PARAMS_PARAM, RunStore
from gatelab.workspace import Workspace

DEFAULT_CLAIMS = Path("sweeps/claims/tiny.yaml")  # relative to the repository root, where gatelab is run from


def make_claims(sweep_paths: Sequence[Path], *, out_dir: Path, formats: Sequence[str], workspace: Workspace,
                command: str | None = None, log=print, claims_path: Path = DEFAULT_CLAIMS) -> list[Path]:
    """The claims table of the given sweeps' runs, written as `claims.<format>` under `out_dir`."""
    from gatelab.report.claims_evidence import LOSS_SPIKES, count_loss_spikes
    from gatelab.report.claims_file import load_claims
    from gatelab.report.claims_report import write_claims
    from gatelab.report.export import check_formats
    from gatelab.report.tables import collect_runs
    from gatelab.sweep.queue import ledger_states
    from gatelab.sweep.spec import expand, load_sweep

    check_formats(formats)
    sweeps = {}
    for path in sweep_paths:
        sweep = load_sweep(path)
        sweeps[sweep.name] = sweep
    if not Path(claims_path).exists():
        raise GatelabError(f"{claims_path}: no such claims file; run gatelab claims from the repository root (the "
                           "default is sweeps/claims/tiny.yaml there) or name one with --claims FILE")
    claims = load_claims(claims_path, sweeps)
    uri, runs_dir = workspace.store(create=False), workspace.runs_dir
    missing = missing_local_store(uri)  # reading a missing store would create an empty one: none is opened
    if missing:
        log(f"{missing.split(':')[0]}: no run has ended, so every claim is marked not run")
    store = _NoRuns() if missing else RunStore(uri, runs_dir, read_only=True)  # claims only read the runs
    records = {}
    for name, sweep in sweeps.items():
        specs = expand(sweep)
        records[name] = collect_runs(specs, store, name, ledger_states(
            workspace.storage, runs_dir=runs_dir, sweep_name=name, specs=specs))
    spiky = {claim.sweep for claim in claims if claim.metric == LOSS_SPIKES}
    for name in spiky & set(records):
        count_loss_spikes(records[name], lambda run_id: store.metric_history(run_id, TRAIN_LOSS))
    known = {claim.sweep for claim in claims if claim.sweep is not None}
    unused = sorted(set(records) - known)
    if unused:
        log(f"no claim reads the sweep(s) {', '.join(unused)}; claims read {', '.join(sorted(known))}")

    def logged_parameters(run_id: str) -> int | None:
        logged = store.run_data(run_id).params.get(TOTAL_PARAMS_PARAM)
        return None if logged is None else int(logged)

    def logged_setup(run_id: str) -> str | None:
        data = store.run_data(run_id)
        precision, device = data.params.get(RESOLVED_PRECISION_PARAM), data.tags.get(DEVICE_TAG)
        if device is None and data.tags.get("version.torch", "").endswith("+cpu"):
            device = "cpu"  # runs before 11-27 logged no device; a CPU build of torch trains on the CPU
        if device is None:
            return None
        return f"{precision} on {device}" if precision else f"precision not logged, on {device}"

    return write_claims(records, claims, out_dir, formats, command, log=log, logged_parameters=logged_parameters,
                        logged_setup=logged_setup)


def claims(sweep_paths: Sequence[Path], *, formats: str, out_dir: Path, workspace: Workspace, claims_path: Path,
           command: str) -> None:
    """`gatelab claims`: the claims table, each claim's verdict printed, then the files it wrote. A ValueError (a
    value in the runs or the claims file that the table cannot use) is a user error too."""
    try:
        written = make_claims(sweep_paths, out_dir=out_dir, formats=comma_list(formats), workspace=workspace,
                              command=command, log=echo, claims_path=claims_path)
    except ValueError as error:
        raise GatelabError(str(error)) from None
    say_written(written)


class _NoRuns:
    """The runs of a store that does not exist: none (a claims table of 'not run' rows, and no store made)."""

    def sweep_runs(self, sweep_name: str):
        import pandas as pd

        return pd.DataFrame()

    def metric_history(self, run_id: str, name: str) -> tuple[list[int], list[float]]:
        return [], []
