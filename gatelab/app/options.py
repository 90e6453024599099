"""The arguments and options that several `gatelab` commands share, declared once (typer `Annotated` aliases), each
with the name, default and help a user sees in `--help`. Where a command gives an option help of its own (it means
something else there: a worker's store is a server, `variants --experiment` counts parameters), that wording stands
beside the others here, named after the command; an option of one command only is declared in gatelab.cli."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from gatelab.output_folders import require_folder, require_writable_folder


def folder_option(param: typer.CallbackParam, *, folder: Optional[Path]) -> Optional[Path]:
    """A folder option checked before any work: not a file, and creatable."""
    if folder is not None:
        require_folder(folder, param.opts[0])
    return folder


def output_folder_option(param: typer.CallbackParam, *, folder: Optional[Path]) -> Optional[Path]:
    """An output folder option checked before any work: writable."""
    if folder is not None:
        require_writable_folder(folder, param.opts[0])
    return folder


def bench_output_option(param: typer.CallbackParam, *, out: Path) -> Path:
    """`gatelab bench --out`: a writable folder, or with --data a .md file in one."""
    require_writable_folder(out.parent if out.suffix == ".md" else out, param.opts[0])
    return out


SweepFile = Annotated[Path, typer.Argument(help="a sweep file, e.g. sweeps/quickstart.yaml")]
TheSweepFile = Annotated[Path, typer.Argument(help="the sweep file")]

ExperimentOption = Annotated[Optional[Path], typer.Option(help="a preset that replaces the sweep's experiment")]
VariantsExperiment = Annotated[Optional[Path], typer.Option(help="count parameters under this experiment preset")]

RunsDir = Annotated[Path, typer.Option(help="checkpoints, the ledger and the default MLflow store",
                                       callback=folder_option)]
TrainRunsDir = Annotated[Path, typer.Option(help="checkpoints and the default MLflow store", callback=folder_option)]

TrackingUri = Annotated[Optional[str], typer.Option(help="MLflow tracking URI (default: sqlite under runs/)")]
PlanTrackingUri = Annotated[Optional[str], typer.Option(
    help="MLflow store whose earlier runs' step times price the plan (default: sqlite under runs/)")]
PlanWorkers = Annotated[int, typer.Option(min=1, help="price the sweep's wall time on this many workers side by "
                                                     "side, as sweep run --workers")]
PlanCell = Annotated[Optional[int], typer.Option("--cell", help="instead of the table: cell N's resolved config "
                                                               "(N from the # column), as `gatelab config show` "
                                                               "prints it")]
WorkerTrackingUri = Annotated[Optional[str], typer.Option(help="MLflow tracking URI, e.g. http://host:5000")]

Ledger = Annotated[Optional[str], typer.Option(help="the ledger (default: the journal under runs/)")]
RunLedger = Annotated[Optional[str], typer.Option(help="ledger: a journal file or an RDB URL (postgresql://...)")]
WorkerLedger = Annotated[str, typer.Option(help="the shared ledger, e.g. postgresql://user@host/db")]
TableLedger = Annotated[Optional[str], typer.Option(help="the sweep's ledger (default: the journal under runs/)")]
ClaimsLedger = Annotated[Optional[str], typer.Option(help="the sweeps' ledger (default: the journals under runs/)")]

Heartbeat = Annotated[float, typer.Option(help="seconds between a worker's heartbeats")]
WorkerHeartbeat = Annotated[float, typer.Option(help="seconds between heartbeats")]
Grace = Annotated[float, typer.Option(help="seconds without a heartbeat before a run is taken over")]
Timeout = Annotated[Optional[float], typer.Option(min=0, help="seconds after which no new run starts (Optuna's "
                                                             "timeout): runs under way finish, and the same command "
                                                             "goes on later")]

AsJson = Annotated[bool, typer.Option("--json", help="print JSON instead of a table")]
Formats = Annotated[str, typer.Option("--format", help="comma-separated: md, csv, latex, html")]
Verbose = Annotated[bool, typer.Option("--verbose", help="also Lightning's device lines and tips, and third-party "
                                                         "deprecation warnings")]

SlurmPartition = Annotated[Optional[str], typer.Option(help="Slurm partition (over the sweep file's slurm.partition)")]
SlurmGpus = Annotated[Optional[int], typer.Option(min=0, help="GPUs per Slurm worker (slurm.gpus_per_worker; 1)")]
SlurmTimeMin = Annotated[Optional[int], typer.Option(min=1, help="each Slurm worker's time limit, minutes "
                                                                 "(slurm.time_min; 1440)")]
SlurmSbatch = Annotated[list[str], typer.Option(help="an extra sbatch option NAME=VALUE, e.g. account=lab or "
                                                     "mem=64G; repeatable, added to the sweep file's slurm.sbatch")]
SlurmSetup = Annotated[list[str], typer.Option(help="a shell line run before each Slurm worker, e.g. 'module load "
                                                    "cuda'; repeatable, after the sweep file's slurm.setup")]
SlurmWait = Annotated[bool, typer.Option(help="wait for the Slurm tasks, submitting fresh ones for any that Slurm "
                                              "ends while cells are left; --no-wait submits and returns")]

