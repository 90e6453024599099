"""The `gatelab` command. User errors (bad files, keys, values) end in one message and exit code 2, no traceback."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

# What the commands do (modules that import torch, Lightning or MLflow only inside their functions).
from gatelab.app import command_line
from gatelab.app import run_command as _run
from gatelab.app.claims import claims as write_claims
from gatelab.app.config_commands import config_app
from gatelab.app.data import prepare
from gatelab.app.options import (
    AsJson,
    ClaimsLedger,
    ExperimentOption,
    Formats,
    Grace,
    Heartbeat,
    Ledger,
    PlanCell,
    PlanTrackingUri,
    PlanWorkers,
    RunLedger,
    RunsDir,
    SlurmGpus,
    SlurmPartition,
    SlurmSbatch,
    SlurmSetup,
    SlurmTimeMin,
    SlurmWait,
    SweepFile,
    TableLedger,
    TheSweepFile,
    Timeout,
    TrackingUri,
    TrainRunsDir,
    VariantsExperiment,
    Verbose,
    WorkerHeartbeat,
    WorkerLedger,
    WorkerTrackingUri,
    bench_output_option,
    output_folder_option,
)
from gatelab.app.plan import show_plan
from gatelab.app.report import table as write_table
from gatelab.app.score import lm_eval, score
from gatelab.app.sweep import print_status, reset, supersede, worker
from gatelab.app.sweep_run import Launch, run_sweep
from gatelab.app.train import train as train_run
from gatelab.app.ui import ui as serve_ui
from gatelab.app.variants import print_variants
from gatelab.errors import exit_code, install_redaction, print_failure
from gatelab.workspace import Workspace

# No pretty exceptions: main() turns every escaping exception into one redacted line, never a traceback.
# Markdown help: a docstring's lines flow into one paragraph (typer's rich mode keeps each line break, so the command
# list broke sentences mid-line) and `code` shows as code.
HELP_MARKUP = "markdown"
app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.split("\n")[0],
                  pretty_exceptions_enable=False, rich_markup_mode=HELP_MARKUP)
data_app = typer.Typer(help="Offline corpora: fetch once, cache, check.", rich_markup_mode=HELP_MARKUP)
app.add_typer(data_app, name="data")
sweep_app = typer.Typer(help="Sweeps: plan, run, join from another machine, follow.", rich_markup_mode=HELP_MARKUP)
app.add_typer(sweep_app, name="sweep")
app.add_typer(config_app, name="config")


@app.callback()
def _root() -> None:
    """gatelab: gated-attention ablations from a YAML file, tracked in MLflow."""


@app.command()
def variants(experiment: VariantsExperiment = None, as_json: AsJson = False) -> None:
    """List every registered variant with its axes, formula and paper rows (and parameters under an experiment)."""
    _run(print_variants, experiment, as_json=as_json)


@app.command()
def train(
    experiment: Annotated[Path, typer.Argument(help="an experiment preset, e.g. experiments/tiny.yaml")],
    variant: Annotated[Optional[str], typer.Option(help="a registry id; '+' composes, e.g. "
                                                        "g1_elem_sig+g2_elem_sig")] = None,
    seed: Annotated[Optional[int], typer.Option(help="overrides the preset's seed")] = None,
    set_: Annotated[list[str], typer.Option("--set", help="KEY.PATH=VALUE override, repeatable")] = [],
    tracking_uri: TrackingUri = None, runs_dir: TrainRunsDir = Path("runs"),
    quiet: Annotated[bool, typer.Option("--quiet", help="no progress, data or evaluation lines")] = False,
    verbose: Verbose = False,
) -> None:
    """Train and evaluate one run, tracked in MLflow; re-running the same command resumes it. Progress is a bar in a
    terminal, else a line every GATELAB_PROGRESS_EVERY seconds (30)."""
    _run(train_run, experiment, variant=variant, seed=seed, set_=set_, quiet=quiet, verbose=verbose,
         workspace=Workspace(runs_dir=runs_dir, tracking_uri=tracking_uri))


@data_app.command("prepare")
def data_prepare(
    experiment_file: Annotated[Optional[Path], typer.Argument(metavar="[EXPERIMENT]",
        help="a preset: make its corpus, tokenizer and token shards, e.g. experiments/tiny.yaml")
    ] = None,
    data_dir: Annotated[Optional[Path], typer.Option(help="default: $GATELAB_DATA_DIR, else "
                                                          "~/.cache/gatelab/data")] = None,
    domain: Annotated[list[str], typer.Option(help="without EXPERIMENT: only these built-in domains "
                                                   "(repeatable)")] = [],
    experiment: Annotated[Optional[Path], typer.Option(help="the same as EXPERIMENT", hidden=True)] = None,
    set_: Annotated[list[str], typer.Option("--set", help="override a key of EXPERIMENT: key.path=value")] = [],
) -> None:
    """Make the data a run trains on, once: with EXPERIMENT, its corpus, tokenizer and token shards (resumable: run
    it again after an interruption and the finished shards are kept); without, the built-in corpora only."""
    _run(prepare, experiment_file or experiment, data_dir=data_dir, domains=domain, set_=set_)


@sweep_app.command("plan")
def sweep_plan(
    sweep: SweepFile, experiment: ExperimentOption = None, as_json: AsJson = False,
    flops_per_second: Annotated[Optional[float], typer.Option(help="throughput for the time estimate (instead of "
                                                                   "step times measured on this machine)")] = None,
    tracking_uri: PlanTrackingUri = None, runs_dir: RunsDir = Path("runs"), workers: PlanWorkers = 1,
    cell: PlanCell = None,
) -> None:
    """One row per run: variant, seed, overrides, parameters, tokens and estimated time (measured from this machine's
    earlier runs of the same shape where the store has some, else a rough guess from FLOPs); rejects bad cells."""
    _run(show_plan, sweep, experiment=experiment, as_json=as_json, flops_per_second=flops_per_second,
         workspace=Workspace(runs_dir=runs_dir, tracking_uri=tracking_uri), workers=workers, cell=cell)


@sweep_app.command("run")
def sweep_run(
    sweep: SweepFile, experiment: ExperimentOption = None,
    workers: Annotated[int, typer.Option(min=1, help="worker processes (a GPU each, from CUDA_VISIBLE_DEVICES "
                                                          "where set, shared in turn if fewer; else a share of the "
                                                          "cores)")] = 1,
    executor: Annotated[str, typer.Option(help="local, slurm (a submitit job array) or submitit-local")] = "local",
    storage: RunLedger = None, tracking_uri: TrackingUri = None, runs_dir: RunsDir = Path("runs"),
    heartbeat: Heartbeat = 10.0, grace: Grace = 60.0,
    slurm_partition: SlurmPartition = None, slurm_gpus: SlurmGpus = None, slurm_time_min: SlurmTimeMin = None,
    slurm_sbatch: SlurmSbatch = [], slurm_setup: SlurmSetup = [], wait: SlurmWait = True, timeout: Timeout = None,
    verbose: Verbose = False,
) -> None:
    """Run every unfinished run of a sweep; safe to re-run, and to run from several processes or machines at once.
    Each run's progress is a bar (one worker in a terminal), else a line every GATELAB_PROGRESS_EVERY seconds (30)."""
    slurm = dict(partition=slurm_partition, gpus=slurm_gpus, time_min=slurm_time_min, sbatch=slurm_sbatch,
                 setup=slurm_setup)
    launch = Launch(executor=executor, workers=workers, heartbeat=heartbeat, grace=grace, slurm=slurm, wait=wait,
                    timeout=timeout)
    _run(run_sweep, sweep, experiment=experiment, verbose=verbose, launch=launch,
         workspace=Workspace(runs_dir=runs_dir, tracking_uri=tracking_uri, storage=storage))


@sweep_app.command("worker")
def sweep_worker(
    sweep: Annotated[Path, typer.Argument(help="the sweep file (the same on every machine)")],
    storage: WorkerLedger, experiment: ExperimentOption = None, tracking_uri: WorkerTrackingUri = None,
    runs_dir: RunsDir = Path("runs"),
    threads: Annotated[Optional[int], typer.Option(help="torch threads for this worker")] = None,
    heartbeat: WorkerHeartbeat = 10.0, grace: Grace = 60.0, timeout: Timeout = None, verbose: Verbose = False,
) -> None:
    """Join a sweep whose ledger lives in shared storage, from any machine; work until no run is left. Each run's
    progress is a line every GATELAB_PROGRESS_EVERY seconds (30): several workers may share one terminal."""
    _run(worker, sweep, experiment=experiment, threads=threads, heartbeat=heartbeat, grace=grace, timeout=timeout,
         verbose=verbose,
         workspace=Workspace(runs_dir=runs_dir, tracking_uri=tracking_uri, storage=storage))


@sweep_app.command("reset")
def sweep_reset(
    sweep: TheSweepFile,
    cell: Annotated[list[int], typer.Option("--cell", help="a failed cell, by its # in `gatelab sweep status`; "
                                                          "repeatable")] = [],
    failed: Annotated[bool, typer.Option("--failed", help="every failed cell")] = False,
    experiment: ExperimentOption = None, storage: Ledger = None, tracking_uri: TrackingUri = None,
    runs_dir: RunsDir = Path("runs"),
) -> None:
    """Put failed cells back in the queue with fresh attempts; `gatelab sweep run` (or a worker) then trains them.
    Running, finished and diverged cells are refused: one would be trained twice, the others are results."""
    _run(reset, sweep, cells=cell, failed=failed, experiment=experiment,
         workspace=Workspace(runs_dir=runs_dir, tracking_uri=tracking_uri, storage=storage))


@sweep_app.command("status")
def sweep_status(sweep: TheSweepFile, experiment: ExperimentOption = None, storage: Ledger = None,
                 runs_dir: RunsDir = Path("runs"), as_json: AsJson = False) -> None:
    """Counts and one row per run: pending, running (where, since when), finished, diverged, failed."""
    _run(print_status, sweep, experiment=experiment, workspace=Workspace(runs_dir=runs_dir, storage=storage),
         as_json=as_json)


@sweep_app.command("supersede")
def sweep_supersede(
    sweep: TheSweepFile,
    reason: Annotated[str, typer.Option(help="why, kept on each run beside its old status")],
    run_id: Annotated[list[str], typer.Option("--run", help="an MLflow run id of the sweep (`gatelab sweep status` "
                                                            "lists them); repeatable")] = [],
    experiment_name: Annotated[Optional[str], typer.Option(help="instead of --run: every run of this MLflow "
                                                                "experiment, e.g. a renamed copy of old runs")] = None,
    tracking_uri: TrackingUri = None, runs_dir: RunsDir = Path("runs"),
) -> None:
    """Set runs aside (a bug, an old copy), with a reason, so that `gatelab table`, `claims` and `eval` never read them.

    Each run gets `gatelab.status=superseded`, the reason and its old status; metrics and artifacts stay, and a
    finished run of the same cell is read instead. All are checked before anything changes; a rerun changes nothing."""
    _run(supersede, sweep, run_ids=run_id, experiment_name=experiment_name, reason=reason,
         workspace=Workspace(runs_dir=runs_dir, tracking_uri=tracking_uri))


@app.command()
def table(
    sweep: Annotated[Path, typer.Argument(help="a sweep file whose runs to compare")],
    format_: Formats = "md,csv,latex,html",
    out: Annotated[Optional[Path], typer.Option(help="output folder (default: <runs dir>/reports/<sweep name>, "
                                                "untracked by git; results/ holds the shipped references)",
                                                callback=output_folder_option)] = None,
    experiment: ExperimentOption = None, tracking_uri: TrackingUri = None, storage: TableLedger = None,
    runs_dir: RunsDir = Path("runs"),
) -> None:
    """The sweep's comparison table laid out like the paper's, with the paper's numbers, significance and plots."""
    _run(write_table, sweep, experiment=experiment, formats=format_, out_dir=out, command=command_line("table"),
         workspace=Workspace(runs_dir=runs_dir, tracking_uri=tracking_uri, storage=storage))


@app.command("eval")
def eval_(
    target: Annotated[str, typer.Argument(help="a sweep file (every finished run of it) or one MLflow run id")],
    tasks: Annotated[str, typer.Option(help="comma-separated lm-eval tasks, e.g. gatelab_blimp or hellaswag,arc_easy")],
    num_fewshot: Annotated[Optional[int], typer.Option(help="few-shot examples (default: each task's own)")] = None,
    limit: Annotated[Optional[float], typer.Option(help="documents per task (below 1: a fraction of them)")] = None,
    include_path: Annotated[Optional[Path], typer.Option(help="a folder of your own lm-eval task YAMLs")] = None,
    batch_size: Annotated[int, typer.Option(help="sequences per forward")] = 16,
    workers: Annotated[int, typer.Option(help="processes scoring runs side by side (a GPU each, "
                                                 "as sweep run --workers)")] = 1,
    experiment: ExperimentOption = None, tracking_uri: TrackingUri = None, runs_dir: RunsDir = Path("runs"),
) -> None:
    """Score finished runs with lm-evaluation-harness, from their checkpoints, into the same MLflow runs; a run
    already scored on a task with the same settings is skipped, so the command can be run again after a stop."""
    _run(score, target, tasks=tasks, num_fewshot=num_fewshot, limit=limit, include_path=include_path,
         batch_size=batch_size, workers=workers, experiment=experiment,
         workspace=Workspace(runs_dir=runs_dir, tracking_uri=tracking_uri))


@app.command("lm-eval", context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                                          "help_option_names": []})
def lm_eval_command(ctx: typer.Context) -> None:
    """lm-evaluation-harness's own command line, with gatelab runs as its model `gatelab` and gatelab's offline tasks:
    gatelab lm-eval --model gatelab --model_args run=RUN_ID --tasks gatelab_blimp (`--help` for lm-eval's options)."""
    lm_eval(ctx.args)


@app.command()
def claims(
    sweeps: Annotated[list[Path], typer.Argument(help="the sweep files whose runs test the claims, e.g. "
                                                      "sweeps/repro-*.yaml")],
    format_: Formats = "md,csv,latex,html",
    out: Annotated[Path, typer.Option(help="output folder", callback=output_folder_option)] = Path("results/tiny"),
    tracking_uri: TrackingUri = None, storage: ClaimsLedger = None, runs_dir: RunsDir = Path("runs"),
    claims_file: Annotated[Path, typer.Option("--claims", help="the claims file; its sweeps are the files in its "
                                              "parent folder")] = Path("sweeps/claims/tiny.yaml"),
) -> None:
    """The paper's claims, one row each, checked on the sweeps' runs: figure, spread, p and q, MDE and a verdict."""
    _run(write_claims, sweeps, formats=format_, out_dir=out, claims_path=claims_file, command=command_line("claims"),
         workspace=Workspace(runs_dir=runs_dir, tracking_uri=tracking_uri, storage=storage))


@app.command()
def ui(
    sweep: Annotated[Optional[Path], typer.Argument(help="a sweep file (its runs are in the same store)")] = None,
    tracking_uri: TrackingUri = None, runs_dir: RunsDir = Path("runs"),
    port: Annotated[int, typer.Option(help="port on 127.0.0.1")] = 5000,
    screenshot: Annotated[Optional[Path], typer.Option(help="write a PNG of the page it prints (headless Chromium), "
                                                       "then stop")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", help="show the server's own log lines (else kept in a log "
                                                            "file, named if it fails)")] = False,
) -> None:
    """Start the MLflow UI on 127.0.0.1 over the sweep's tracking store and print the page to open: the sweep's runs
    (or the only experiment's) sorted by ppl/avg with the key metrics as columns. Ctrl-C stops it."""
    _run(serve_ui, sweep, workspace=Workspace(runs_dir=runs_dir, tracking_uri=tracking_uri), port=port,
         screenshot=screenshot, verbose=verbose)


@app.command()
def bench(
    ctx: typer.Context,
    presets: Annotated[Optional[list[Path]], typer.Argument(help="experiment presets (default: tiny and tiny-moe; "
                                                                 "with CUDA: small)")] = None,
    variants: Annotated[str, typer.Option(help="comma-separated variants, baseline first (with CUDA the default is "
                                               "baseline,g1_elem_sig,g1_head_sig)")] = ",".join(
        ("baseline", "g1_elem_sig", "g1_head_sig", "g2_elem_sig", "g5_elem_sig")),
    steps: Annotated[int, typer.Option(min=2, help="timed steps per variant (interleaved; with CUDA the default is "
                                                   "10)")] = 20,
    warmup: Annotated[int, typer.Option(min=0, help="untimed steps first (with CUDA the default is 2)")] = 3,
    lightning_steps: Annotated[int, typer.Option(min=2, help="steps per Lightning block (3 blocks; with CUDA the "
                                                             "default is 10)")] = 12,
    run_steps: Annotated[int, typer.Option(min=1, help="steps of the real child run that measures fixed costs")] = 20,
    bf16_steps: Annotated[int, typer.Option(min=1, help="timed bf16 steps where the CPU emulates bf16 (slow)")] = 3,
    sweep: Annotated[Optional[Path], typer.Option(help="also run this sweep with 1 then 2 workers (slow)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the JSON report")] = False,
    out: Annotated[Path, typer.Option(help="folder for bench.md and bench.json (--data: data.md and data.json, or "
                                            "a .md file)", callback=bench_output_option)] = Path("results/bench"),
    data: Annotated[bool, typer.Option("--data", help="the data bench instead: tokenizing, reading a 1e9-token "
                                                      "corpus, peak RSS (gatelab/bench/data/)")] = False,
    scratch: Annotated[Optional[Path], typer.Option(help="--data: folder for its corpora (about 2 GB; default "
                                                         "beside the data directory)")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="--data: small sizes, a minute or two")] = False,
    parts: Annotated[str, typer.Option(help="comma-separated parts to measure beside the Lightning step: variants, "
                                            "compile, numerics, profile, run (default: all)")] = ",".join(
        ("variants", "compile", "numerics", "profile", "run")),
) -> None:
    """Throughput and overhead: variants against baseline, Lightning against a plain loop, fp32 against bf16,
    FLOP/s against this machine's GEMM rate, fixed costs and peak memory of a run, GPU estimates. It ends with the
    targets and whether each holds; with CUDA, the GPU's too (MFU, evaluation seconds, peak GPU memory, compiling from
    the cache), and the options not given take GPU defaults so that it ends within 8 minutes. With --data, the data
    path instead: tokenizing against a bare encode_batch loop, loader windows/s against training, peak RSS."""
    from gatelab.app.bench import BenchOptions
    from gatelab.app.bench import bench as run_bench

    # by the source's name: typer 0.29 vendors its own click, whose ParameterSource is not click's
    given = {name for name in ctx.params if ctx.get_parameter_source(name).name not in ("DEFAULT", "DEFAULT_MAP")}
    _run(run_bench, BenchOptions(**ctx.params), given=given, command=command_line("bench"))


def main() -> None:
    """`gatelab` and `python -m gatelab`: whatever escapes a command ends as one redacted line, exit 2 for a user error
    (a GatelabError, or a file or disk refusing: `exit_code`) and 1 for anything else; GATELAB_DEBUG=1 adds the
    (redacted) traceback."""
    install_redaction()
    # MLflow logs every SQLAlchemy error with its traceback (`_logger.exception`) before raising it; gatelab turns the
    # error itself into one message naming the store.
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
    try:
        app()
    except Exception as error:
        print_failure(error)
        sys.exit(exit_code(error))


if __name__ == "__main__":
    main()
