"""The `gatelab` command. User errors (bad files, keys, values) end in one message and exit code 2, no traceback."""

from __future__ import annotations

import json
import logging
import shlex
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from gatelab.errors import GatelabError, install_redaction, print_failure, redact
from gatelab.output_folders import require_folder, require_writable_folder

# No pretty exceptions: main() turns every escaping exception into one redacted line, never a traceback.
app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.split("\n")[0],
                  pretty_exceptions_enable=False)
# markup=False: a table cell (a path, a run's error) holding `[red]` or `[/bold]` is printed as written.
console = Console(markup=False) if sys.stdout.isatty() else Console(width=200, markup=False)  # pipes get whole rows


@app.callback()
def _root() -> None:
    """gatelab: gated-attention ablations from a YAML file, tracked in MLflow."""


def _fail(error: GatelabError) -> None:
    # Text, not markup: a path or key holding `[red]` or `[/bold]` is printed as written.
    message = Text.assemble(("error:", "bold red"), " ", redact(str(error)))
    Console(stderr=True).print(message, highlight=False, soft_wrap=True)
    raise typer.Exit(code=2)


def _folder_option(param: typer.CallbackParam, folder: Optional[Path]) -> Optional[Path]:
    if folder is not None:
        require_folder(folder, param.opts[0])
    return folder


def _output_folder_option(param: typer.CallbackParam, folder: Optional[Path]) -> Optional[Path]:
    if folder is not None:
        require_writable_folder(folder, param.opts[0])
    return folder


def _bench_output_option(param: typer.CallbackParam, out: Path) -> Path:
    require_writable_folder(out.parent if out.suffix == ".md" else out, param.opts[0])  # --data takes a .md file too
    return out


@app.command()
def variants(
    experiment: Annotated[Optional[Path], typer.Option(help="count parameters under this experiment preset")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
) -> None:
    """List every registered variant with its axes, formula and paper rows (and parameters under an experiment)."""
    from gatelab.variants import VARIANTS

    try:
        rows = variant_rows(experiment)
    except GatelabError as error:
        _fail(error)
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table(box=None, title=f"{len(VARIANTS)} variants" + (f" under {experiment}" if experiment else ""))
    for column in ("id", "position", "granularity", "heads", "form", "activation", "paper rows", "formula"):
        table.add_column(column)
    if experiment:
        table.add_column("total", justify="right")
        table.add_column("added", justify="right")
    for row in rows:
        cells = [row["id"], *(row["axes"][k] for k in ("position", "granularity", "heads", "form", "activation")),
                 " ".join(f"T{r['table'][5:]}{r['row']}" for r in row["paper_rows"]), row["formula"]]
        if experiment:
            cells += [_millions(row["total_params"]), _millions(row["added_params"], signed=True)]
        table.add_row(*cells)
    console.print(table)


def _millions(count: int | None, signed: bool = False) -> str:
    if count is None:
        return "n/a"
    return f"{count / 1e6:+.2f}M" if signed else f"{count / 1e6:.2f}M"


def variant_rows(experiment_path: Path | None) -> list[dict]:
    from gatelab.config import load_experiment
    from gatelab.model.params import added_parameters
    from gatelab.variants import VARIANTS

    experiment = load_experiment(experiment_path) if experiment_path else None
    rows = []
    for variant in VARIANTS.values():
        row = {"id": variant.id, "summary": variant.summary, "formula": variant.formula, "axes": variant.axes(),
               "paper_rows": [{"table": r.table, "row": r.row} for r in variant.paper_rows], "note": variant.note}
        if experiment is not None:
            try:
                row["total_params"], row["added_params"] = added_parameters(experiment, variant.id)
            except GatelabError as error:  # e.g. ref_add4experts on a dense preset
                row["total_params"] = row["added_params"] = None
                row["not_applicable"] = str(error)
        rows.append(row)
    return rows


VERBOSE_HELP = "also Lightning's device lines and tips, and third-party deprecation warnings"


def _quiet_noise(verbose: bool) -> None:
    """--verbose, or not: for this process and every worker or rank it starts (`gatelab.progress`)."""
    from gatelab.progress import set_verbose, silence_noise

    set_verbose(verbose)
    silence_noise()


@app.command()
def train(
    experiment: Annotated[Path, typer.Argument(help="an experiment preset, e.g. experiments/tiny.yaml")],
    variant: Annotated[Optional[str], typer.Option(help="a registry id; '+' composes, e.g. g1_elem_sig+g2_elem_sig")] = None,
    seed: Annotated[Optional[int], typer.Option(help="overrides the preset's seed")] = None,
    set_: Annotated[list[str], typer.Option("--set", help="KEY.PATH=VALUE override, repeatable")] = [],
    tracking_uri: Annotated[Optional[str], typer.Option(help="MLflow tracking URI (default: sqlite under runs/)")] = None,
    runs_dir: Annotated[Path, typer.Option(help="checkpoints and the default MLflow store",
                                           callback=_folder_option)] = Path("runs"),
    quiet: Annotated[bool, typer.Option("--quiet", help="no progress, data or evaluation lines")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", help=VERBOSE_HELP)] = False,
) -> None:
    """Train and evaluate one run, tracked in MLflow; re-running the same command resumes it. Progress is a bar in a
    terminal, else a line every GATELAB_PROGRESS_EVERY seconds (30)."""
    _quiet_noise(verbose)
    from gatelab.config import load_experiment
    from gatelab.errors import redact
    from gatelab.variants import variant_ids

    overrides = list(set_) + ([f"variant={variant}"] if variant else []) + ([f"seed={seed}"] if seed is not None else [])
    try:  # the file, keys and variant are checked before Lightning is imported (5 s): a typo is answered at once
        config = load_experiment(experiment, overrides)
        variant_ids(config.variant)
        from gatelab.model import resolve_model

        resolve_model(config)  # shape errors of the variant surface before any data or training work
    except GatelabError as error:
        _fail(error)
    from gatelab.interrupts import Interrupted
    from gatelab.train.ownership import RunInProgress
    from gatelab.train.run import run

    try:
        result = run(config, tracking_uri=tracking_uri, runs_dir=runs_dir, quiet=quiet)
    except RunInProgress as busy:  # not a failure: the run is being made, by another process
        typer.echo(str(busy))
        return
    except Interrupted as interrupted:
        typer.echo(f"interrupted ({interrupted}): the MLflow run is closed as KILLED and its last checkpoint kept; run "
                   "the same command again to resume", err=True)
        raise typer.Exit(code=interrupted.exit_code) from None
    except GatelabError as error:
        _fail(error)
    where = redact(tracking_uri or config.tracking.uri or f"sqlite:///{runs_dir / 'mlflow.db'}")
    typer.echo(f"{result.status}: MLflow run {result.run_id} in {where}")
    if result.status == "diverged":
        typer.echo(f"diverged at step {result.diverged_step}")
        return
    for name in ("ppl/avg", "unigram_ppl/avg", "blimp/accuracy", "probe/f_attn", "probe/m_act", "probe/gate_score_mean"):
        if name in result.metrics:
            typer.echo(f"  {name:24s} {result.metrics[name]:.4f}")


data_app = typer.Typer(help="Offline corpora: fetch once, cache, check.")
app.add_typer(data_app, name="data")


@data_app.command("prepare")
def data_prepare(
    experiment_file: Annotated[Optional[Path], typer.Argument(
        metavar="[EXPERIMENT]", help="a preset: make its corpus, tokenizer and token shards, e.g. experiments/tiny.yaml")
    ] = None,
    data_dir: Annotated[Optional[Path], typer.Option(help="default: $GATELAB_DATA_DIR, else ~/.cache/gatelab/data")] = None,
    domain: Annotated[list[str], typer.Option(help="without EXPERIMENT: only these built-in domains (repeatable)")] = [],
    experiment: Annotated[Optional[Path], typer.Option(help="the same as EXPERIMENT", hidden=True)] = None,
    set_: Annotated[list[str], typer.Option("--set", help="override a key of EXPERIMENT: key.path=value")] = [],
) -> None:
    """Make the data a run trains on, once: with EXPERIMENT, its corpus, tokenizer and token shards (resumable: run
    it again after an interruption and the finished shards are kept); without, the built-in corpora only."""
    preset = experiment_file or experiment
    try:
        if preset is not None:
            from gatelab.config import load_experiment
            from gatelab.data.prepare import BarProgress, load_data

            overrides = list(set_) + ([f"data.data_dir={data_dir}"] if data_dir is not None else [])
            config = load_experiment(preset, overrides)
            bar = BarProgress() if sys.stderr.isatty() else None
            try:
                load_data(config, log=typer.echo, warn=typer.echo, progress=bar)
            finally:
                if bar is not None:
                    bar.stop()
            return
        from gatelab.data.corpora import prepare_corpora

        manifest = prepare_corpora(data_dir, domain or None)
    except GatelabError as error:
        _fail(error)
    if manifest.missing:
        typer.echo(f"missing domains: {', '.join(manifest.missing)} (see the messages above for how to get them)")


sweep_app = typer.Typer(help="Sweeps: plan, run, join from another machine, follow.")
app.add_typer(sweep_app, name="sweep")
RunsDir = Annotated[Path, typer.Option(help="checkpoints, the ledger and the default MLflow store",
                                       callback=_folder_option)]
ExperimentOption = Annotated[Optional[Path], typer.Option(help="a preset that replaces the sweep's experiment")]


@sweep_app.command("plan")
def sweep_plan(
    sweep: Annotated[Path, typer.Argument(help="a sweep file, e.g. sweeps/quickstart.yaml")],
    experiment: ExperimentOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
    flops_per_second: Annotated[Optional[float], typer.Option(help="throughput for the time estimate (instead of "
                                                                   "step times measured on this machine)")] = None,
    tracking_uri: Annotated[Optional[str], typer.Option(
        help="MLflow store whose earlier runs' step times price the plan (default: sqlite under runs/)")] = None,
    runs_dir: RunsDir = Path("runs"),
) -> None:
    """One row per run: variant, seed, overrides, parameters, tokens and estimated time (measured from this machine's
    earlier runs of the same shape where the store has some, else a rough guess from FLOPs); rejects bad cells."""
    from gatelab.sweep.plan import cli_plan

    try:
        cli_plan(sweep, experiment, as_json, flops_per_second, tracking_uri, runs_dir)
    except GatelabError as error:
        _fail(error)


@sweep_app.command("run")
def sweep_run(
    sweep: Annotated[Path, typer.Argument(help="a sweep file, e.g. sweeps/quickstart.yaml")],
    experiment: ExperimentOption = None,
    workers: Annotated[int, typer.Option(min=1, help="worker processes (one GPU each, or a share of the cores)")] = 1,
    executor: Annotated[str, typer.Option(help="local, slurm (a submitit job array) or submitit-local")] = "local",
    storage: Annotated[Optional[str], typer.Option(help="ledger: a journal file or an RDB URL (postgresql://...)")] = None,
    tracking_uri: Annotated[Optional[str], typer.Option(help="MLflow tracking URI (default: sqlite under runs/)")] = None,
    runs_dir: RunsDir = Path("runs"),
    heartbeat: Annotated[float, typer.Option(help="seconds between a worker's heartbeats")] = 10.0,
    grace: Annotated[float, typer.Option(help="seconds without a heartbeat before a run is taken over")] = 60.0,
    slurm_partition: Annotated[Optional[str], typer.Option(help="Slurm partition")] = None,
    slurm_gpus: Annotated[int, typer.Option(help="GPUs per Slurm worker")] = 1,
    slurm_time_min: Annotated[int, typer.Option(help="Slurm time limit per worker, minutes")] = 24 * 60,
    verbose: Annotated[bool, typer.Option("--verbose", help=VERBOSE_HELP)] = False,
) -> None:
    """Run every unfinished run of a sweep; safe to re-run, and to run from several processes or machines at once.
    Each run's progress is a bar (one worker in a terminal), else a line every GATELAB_PROGRESS_EVERY seconds (30)."""
    _quiet_noise(verbose)
    from gatelab.interrupts import Interrupted, raise_on_signals
    from gatelab.sweep.queue import CELLS_FAILED, default_storage, failed_cells_line, open_ledger
    from gatelab.sweep.spec import expand, load_sweep
    from gatelab.errors import redact

    try:
        with raise_on_signals():  # from the start: Ctrl-C during the imports of torch is no traceback either
            plan = load_sweep(sweep, experiment)
            specs = expand(plan)  # every cell is validated before any ledger, MLflow or training work
            storage = storage or default_storage(runs_dir, plan.name)
            typer.echo(f"sweep {plan.name}: {len(specs)} runs; ledger {redact(storage)}")
            from gatelab.sweep.plan import sweep_run_estimate

            for line in sweep_run_estimate(plan, specs, storage, tracking_uri, runs_dir, workers):
                typer.echo(line)
            if plan.search is not None:
                from gatelab.sweep.search import run_search

                run_search(plan, specs, storage=storage, tracking_uri=tracking_uri, runs_dir=runs_dir)
            elif executor == "local" and workers == 1:
                from gatelab.sweep.worker import work

                work(sweep, experiment, storage, tracking_uri, runs_dir, heartbeat_s=heartbeat, grace_s=grace,
                     progress=sys.stdout.isatty())
            else:
                from gatelab.tracking import default_tracking_uri, prepare_store

                open_ledger(plan, specs, storage, tracking_uri, runs_dir)  # a bad ledger: one message, not N
                worker_uri = tracking_uri or default_tracking_uri(runs_dir)
                prepare_store(worker_uri)
                worker_args = dict(sweep=sweep, experiment=experiment, storage=storage, tracking_uri=worker_uri,
                                   runs_dir=runs_dir, heartbeat_s=heartbeat, grace_s=grace)
                if executor == "local":
                    from gatelab.sweep.executor import run_local_workers

                    code = run_local_workers(workers, **worker_args)
                    if code > CELLS_FAILED:
                        raise GatelabError(f"a worker exited with code {code}; its message is above")
                elif executor in ("slurm", "submitit-local"):
                    from gatelab.sweep.executor import submit_workers

                    cluster = "slurm" if executor == "slurm" else "local"
                    slurm = {"partition": slurm_partition, "gpus": slurm_gpus, "time_min": slurm_time_min}
                    jobs = submit_workers(workers, cluster, runs_dir / plan.name / "submitit", slurm,
                                          wait=cluster == "local", **worker_args)
                    typer.echo(f"submitted workers {', '.join(jobs)}")
                    if cluster == "slurm":
                        typer.echo(f"follow them with: gatelab sweep status {sweep}")
                        return
                else:
                    raise GatelabError(f"--executor {executor!r}: valid executors are local, slurm, submitit-local")
    except GatelabError as error:
        _fail(error)
    except Interrupted as interrupted:
        _exit_interrupted(interrupted)
    _print_status(sweep, experiment, storage, runs_dir, as_json=False)
    from gatelab.progress import closing_lines
    from gatelab.sweep.queue import tracking_stores

    for line in closing_lines(sweep, plan.name, tracking_stores(specs, tracking_uri, runs_dir), runs_dir, experiment,
                              tracking_uri, None if storage == default_storage(runs_dir, plan.name) else storage):
        typer.echo(line)
    _exit_if_cells_failed(failed_cells_line(sweep, experiment, storage, runs_dir))


@sweep_app.command("worker")
def sweep_worker(
    sweep: Annotated[Path, typer.Argument(help="the sweep file (the same on every machine)")],
    storage: Annotated[str, typer.Option(help="the shared ledger, e.g. postgresql://user@host/db")],
    experiment: ExperimentOption = None,
    tracking_uri: Annotated[Optional[str], typer.Option(help="MLflow tracking URI, e.g. http://host:5000")] = None,
    runs_dir: RunsDir = Path("runs"),
    threads: Annotated[Optional[int], typer.Option(help="torch threads for this worker")] = None,
    heartbeat: Annotated[float, typer.Option(help="seconds between heartbeats")] = 10.0,
    grace: Annotated[float, typer.Option(help="seconds without a heartbeat before a run is taken over")] = 60.0,
    verbose: Annotated[bool, typer.Option("--verbose", help=VERBOSE_HELP)] = False,
) -> None:
    """Join a sweep whose ledger lives in shared storage, from any machine; work until no run is left. Each run's
    progress is a line every GATELAB_PROGRESS_EVERY seconds (30): several workers may share one terminal."""
    _quiet_noise(verbose)
    from gatelab.interrupts import Interrupted, raise_on_signals
    from gatelab.sweep.queue import failed_cells_line

    try:
        with raise_on_signals():  # from the start: Ctrl-C during the imports of torch is no traceback either
            from gatelab.sweep.worker import work

            report = work(sweep, experiment, storage, tracking_uri, runs_dir, threads, heartbeat, grace)
            failed = failed_cells_line(sweep, experiment, storage, runs_dir)
    except GatelabError as error:
        _fail(error)
    except Interrupted as interrupted:
        _exit_interrupted(interrupted)
    typer.echo(f"worker done: {len(report.finished)} finished, {len(report.diverged)} diverged, "
               f"{len(report.failed)} failed")
    _exit_if_cells_failed(failed)


def _exit_interrupted(interrupted) -> None:
    """A sweep command stopped by Ctrl-C or SIGTERM: what to run to resume, and the shell's exit code (130, 143)."""
    from gatelab.sweep.queue import interrupted_line

    typer.echo(interrupted_line(interrupted), err=True)
    raise typer.Exit(code=interrupted.exit_code)


def _exit_if_cells_failed(failed_line: str | None) -> None:
    """Exit 1 (CELLS_FAILED) naming the failed cells and the reset command, where any cell of the sweep failed."""
    from gatelab.sweep.queue import CELLS_FAILED

    if failed_line:
        typer.echo(failed_line, err=True)
        raise typer.Exit(code=CELLS_FAILED)


@sweep_app.command("reset")
def sweep_reset(
    sweep: Annotated[Path, typer.Argument(help="the sweep file")],
    cell: Annotated[list[int], typer.Option("--cell", help="a failed cell, by its # in `gatelab sweep status`; "
                                                          "repeatable")] = [],
    failed: Annotated[bool, typer.Option("--failed", help="every failed cell")] = False,
    experiment: ExperimentOption = None,
    storage: Annotated[Optional[str], typer.Option(help="the ledger (default: the journal under runs/)")] = None,
    tracking_uri: Annotated[Optional[str], typer.Option(help="MLflow tracking URI (default: sqlite under runs/)")] = None,
    runs_dir: RunsDir = Path("runs"),
) -> None:
    """Put failed cells back in the queue with fresh attempts; `gatelab sweep run` (or a worker) then trains them.
    Running, finished and diverged cells are refused: one would be trained twice, the others are results."""
    from gatelab.errors import redact
    from gatelab.sweep.queue import SweepLedger, default_storage, ledger_exists, tracking_stores
    from gatelab.sweep.spec import expand, load_sweep

    try:
        if not cell and not failed:
            raise GatelabError("say which cells to reset: --failed (every failed cell) or --cell N (repeatable)")
        plan = load_sweep(sweep, experiment)
        specs = expand(plan)
        storage = storage or default_storage(runs_dir, plan.name)
        stores = tracking_stores(specs, tracking_uri, runs_dir)
        if not ledger_exists(storage, plan.name, stores):
            raise GatelabError(f"sweep {plan.name} has no ledger in {redact(storage)}: nothing has run yet (pass "
                               "--storage or --runs-dir if it lives elsewhere)")
        requeued = SweepLedger(storage, plan.name, tracking_uris=stores).reset(specs, cell, failed)
    except GatelabError as error:
        _fail(error)
    for state in requeued:
        typer.echo(f"cell {state.index} ({state.label}): failed after {state.attempts} attempt(s) -> pending, "
                   "attempts counted afresh")
    typer.echo(f"re-queued {len(requeued)} cell(s)" + (f"; train them with: gatelab sweep run {sweep}" if requeued
                                                        else ": no cell had failed"))


@sweep_app.command("status")
def sweep_status(
    sweep: Annotated[Path, typer.Argument(help="the sweep file")],
    experiment: ExperimentOption = None,
    storage: Annotated[Optional[str], typer.Option(help="the ledger (default: the journal under runs/)")] = None,
    runs_dir: RunsDir = Path("runs"),
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
) -> None:
    """Counts and one row per run: pending, running (where, since when), finished, diverged, failed."""
    try:
        _print_status(sweep, experiment, storage, runs_dir, as_json)
    except GatelabError as error:
        _fail(error)


def _print_status(sweep: Path, experiment: Path | None, storage: str | None, runs_dir: Path, as_json: bool) -> None:
    import time
    from collections import Counter
    from dataclasses import asdict

    from gatelab.sweep.queue import ledger_states
    from gatelab.sweep.spec import expand, load_sweep

    plan = load_sweep(sweep, experiment)
    specs = expand(plan)
    states = ledger_states(storage, runs_dir, plan.name, specs)
    counts = Counter(state.status for state in states)
    if as_json:
        typer.echo(json.dumps({"sweep": plan.name, "counts": dict(counts), "runs": [asdict(s) for s in states]},
                              indent=2))
        return
    table = Table(box=None, title=f"sweep {plan.name}: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    for column in ("#", "run", "status", "detail", "attempts", "MLflow run"):
        table.add_column(column)
    for state in states:
        if state.status == "running":
            detail = f"on {state.worker} for {time.time() - (state.since or time.time()):.0f} s"
        elif state.status == "diverged":
            detail = f"at step {state.diverged_step}"
        elif state.status == "failed":
            detail = state.error or ""
        elif state.status == "finished" and state.value is not None:
            detail = f"ppl/avg {state.value:.3f}"
        else:
            detail = ""
        table.add_row(str(state.index), state.label, state.status, detail, str(state.attempts),
                      state.mlflow_run_id or "")
    console.print(table)


@app.command()
def table(
    sweep: Annotated[Path, typer.Argument(help="a sweep file whose runs to compare")],
    format_: Annotated[str, typer.Option("--format", help="comma-separated: md, csv, latex, html")] = "md,csv,latex,html",
    out: Annotated[Optional[Path], typer.Option(help="output folder (default: <runs dir>/reports/<sweep name>, "
                                                "untracked by git; results/ holds the shipped references)",
                                                callback=_output_folder_option)] = None,
    experiment: ExperimentOption = None,
    tracking_uri: Annotated[Optional[str], typer.Option(help="MLflow tracking URI (default: sqlite under runs/)")] = None,
    storage: Annotated[Optional[str], typer.Option(help="the sweep's ledger (default: the journal under runs/)")] = None,
    runs_dir: RunsDir = Path("runs"),
) -> None:
    """The sweep's comparison table laid out like the paper's, with the paper's numbers, significance and plots."""
    try:
        from gatelab.report.report import make_report

        formats = [f.strip() for f in format_.split(",") if f.strip()]
        command = "gatelab table " + " ".join(shlex.quote(a) for a in sys.argv[2:])
        written = make_report(sweep, experiment, formats, out, tracking_uri, runs_dir, storage, log=typer.echo,
                              command=command)
    except (GatelabError, ValueError) as error:
        _fail(GatelabError(str(error)))
    typer.echo("wrote " + ", ".join(str(p) for p in written))


@app.command("eval")
def eval_(
    target: Annotated[str, typer.Argument(help="a sweep file (every finished run of it) or one MLflow run id")],
    tasks: Annotated[str, typer.Option(help="comma-separated lm-eval tasks, e.g. gatelab_blimp or hellaswag,arc_easy")],
    num_fewshot: Annotated[Optional[int], typer.Option(help="few-shot examples (default: each task's own)")] = None,
    limit: Annotated[Optional[float], typer.Option(help="documents per task (below 1: a fraction of them)")] = None,
    include_path: Annotated[Optional[Path], typer.Option(help="a folder of your own lm-eval task YAMLs")] = None,
    batch_size: Annotated[int, typer.Option(help="sequences per forward")] = 16,
    workers: Annotated[int, typer.Option(help="processes scoring runs side by side")] = 1,
    experiment: ExperimentOption = None,
    tracking_uri: Annotated[Optional[str], typer.Option(help="MLflow tracking URI (default: sqlite under runs/)")] = None,
    runs_dir: RunsDir = Path("runs"),
) -> None:
    """Score finished runs with lm-evaluation-harness, from their checkpoints, into the same MLflow runs; a run
    already scored on a task with the same settings is skipped, so the command can be run again after a stop."""
    from gatelab.tracking import RunStore, missing_local_store

    try:
        from gatelab.eval.scoring import HarnessSettings, score_in_parallel, targets_of

        settings = HarnessSettings(tuple(t.strip() for t in tasks.split(",") if t.strip()), num_fewshot, limit,
                                   str(include_path) if include_path else None, batch_size)
        if not settings.tasks:
            raise GatelabError("--tasks: name at least one lm-eval task, e.g. --tasks gatelab_blimp")
        uri = tracking_uri or f"sqlite:///{(runs_dir / 'mlflow.db').resolve()}?timeout=60"
        if missing_local_store(uri):
            raise GatelabError(missing_local_store(uri))
        targets = targets_of(target, experiment, RunStore(uri, runs_dir), log=typer.echo)
        counts = score_in_parallel(targets, settings, uri, runs_dir, workers, log=typer.echo)
    except GatelabError as error:
        _fail(error)
    except KeyboardInterrupt:
        typer.echo("interrupted: the scores logged so far are kept; run the same command again to score the rest",
                   err=True)
        raise typer.Exit(code=130) from None
    typer.echo(f"scored {counts['scored']} run(s); {counts['skipped']} already had these scores")


@app.command("lm-eval", context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                                          "help_option_names": []})
def lm_eval_command(ctx: typer.Context) -> None:
    """lm-evaluation-harness's own command line, with gatelab runs as its model `gatelab` and gatelab's offline tasks:
    gatelab lm-eval --model gatelab --model_args run=RUN_ID --tasks gatelab_blimp (`--help` for lm-eval's options)."""
    from gatelab.eval.harness import main as lm_eval_main

    lm_eval_main(ctx.args)


@app.command()
def claims(
    sweeps: Annotated[list[Path], typer.Argument(help="the sweep files whose runs test the claims, e.g. sweeps/repro-*.yaml")],
    format_: Annotated[str, typer.Option("--format", help="comma-separated: md, csv, latex, html")] = "md,csv,latex,html",
    out: Annotated[Path, typer.Option(help="output folder", callback=_output_folder_option)] = Path("results/tiny"),
    tracking_uri: Annotated[Optional[str], typer.Option(help="MLflow tracking URI (default: sqlite under runs/)")] = None,
    storage: Annotated[Optional[str], typer.Option(help="the sweeps' ledger (default: the journals under runs/)")] = None,
    runs_dir: RunsDir = Path("runs"),
    claims_file: Annotated[Path, typer.Option("--claims", help="the claims file; its sweeps are the files in its "
                                              "parent folder")] = Path("sweeps/claims/tiny.yaml"),
) -> None:
    """The paper's claims, one row each, checked on the sweeps' runs: figure, spread, p and q, MDE and a verdict."""
    try:
        from gatelab.report.claims import make_claims

        formats = [f.strip() for f in format_.split(",") if f.strip()]
        command = "gatelab claims " + " ".join(shlex.quote(a) for a in sys.argv[2:])
        written = make_claims(sweeps, out, formats, tracking_uri, runs_dir, storage, command, log=typer.echo,
                              claims_path=claims_file)
    except (GatelabError, ValueError) as error:
        _fail(GatelabError(str(error)))
    typer.echo("wrote " + ", ".join(str(p) for p in written))


@app.command()
def ui(
    sweep: Annotated[Optional[Path], typer.Argument(help="a sweep file (its runs are in the same store)")] = None,
    tracking_uri: Annotated[Optional[str], typer.Option(help="MLflow tracking URI (default: sqlite under runs/)")] = None,
    runs_dir: RunsDir = Path("runs"),
    port: Annotated[int, typer.Option(help="port on 127.0.0.1")] = 5000,
    screenshot: Annotated[Optional[Path], typer.Option(help="write a PNG of the page it prints (headless Chromium), "
                                                       "then stop")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", help="show the server's own log lines (else kept in a log "
                                                            "file, named if it fails)")] = False,
) -> None:
    """Start the MLflow UI on 127.0.0.1 over the sweep's tracking store and print the page to open: the sweep's runs
    (or the only experiment's) sorted by ppl/avg with the key metrics as columns. Ctrl-C stops it."""
    from gatelab.report.ui import serve_ui
    from gatelab.tracking import default_tracking_uri

    try:
        sweep_name = None
        if sweep is not None:
            from gatelab.sweep.spec import load_sweep

            sweep_name = load_sweep(sweep).name  # a wrong file is an error here, not an empty UI
        serve_ui(tracking_uri or default_tracking_uri(runs_dir), port=port, sweep_name=sweep_name,
                 screenshot=screenshot, verbose=verbose)
    except GatelabError as error:
        _fail(error)


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
                                            "a .md file)", callback=_bench_output_option)] = Path("results/bench"),
    data: Annotated[bool, typer.Option("--data", help="the data bench instead: tokenizing, reading a 1e9-token "
                                                      "corpus, peak RSS (gatelab/bench_data.py)")] = False,
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
    from gatelab import bench as bench_module
    from gatelab.host import repo_root
    from gatelab.progress import silence_noise

    log = (lambda message: typer.echo(message, err=True)) if as_json else typer.echo
    silence_noise()  # as in `gatelab train` (GATELAB_VERBOSE=1 keeps them): no dtype warning from the first compile
    if data:
        from gatelab import bench_data

        try:
            report = bench_data.bench_data(scratch, bench_data.QUICK if quick else bench_data.Sizes(), log=log)
        except GatelabError as error:
            _fail(error)
        _write_bench(bench_data, report, out, as_json)
        return
    # by the source's name: typer 0.29 vendors its own click, whose ParameterSource is not click's
    given = {name for name in ctx.params if ctx.get_parameter_source(name).name not in ("DEFAULT", "DEFAULT_MAP")}
    defaults = {"presets": presets or bench_module.DEFAULT_PRESETS, "variants": variants, "steps": steps,
                "warmup": warmup, "lightning_steps": lightning_steps}
    options = bench_module.with_gpu_defaults(defaults, given)
    if changed := [name for name in options if options[name] != defaults[name]]:
        log("CUDA: GPU defaults for the options not given: " + "; ".join(
            f"{name.replace('_', '-')} {' '.join(options[name]) if name == 'presets' else options[name]}"
            for name in changed))
    presets, variants, steps, warmup, lightning_steps = (options[name] for name in defaults)
    if lightning_steps <= warmup + 1:
        _fail(GatelabError(f"--lightning-steps ({lightning_steps}) must exceed --warmup ({warmup}) by at least 2: "
                           "each Lightning block times the steps after its warm-up"))
    chosen_parts = [part.strip() for part in parts.split(",") if part.strip()]
    if unknown := [part for part in chosen_parts if part not in bench_module.PARTS]:
        _fail(GatelabError(f"--parts: {', '.join(unknown)} is not one of {', '.join(bench_module.PARTS)}"))
    chosen_presets = presets if "presets" in given else [repo_root() / p for p in presets]
    try:
        command = "gatelab bench " + shlex.join(sys.argv[2:])

        def save(report) -> None:  # between parts: a bench cut off by a time limit keeps what it measured
            report.command = command
            bench_module.write(report, out)

        report = bench_module.bench(chosen_presets, [v.strip() for v in variants.split(",") if v.strip()], warmup,
                                    steps, lightning_steps, run_steps, sweep, bf16_steps, log=log,
                                    parts=chosen_parts, save=save)
    except GatelabError as error:
        _fail(error)
    _write_bench(bench_module, report, out, as_json)
    if not as_json:  # the targets once more, where the output ends: the tables above them scroll them off the screen
        typer.echo("\n" + bench_module.summary_markdown(report), nl=False)


def _write_bench(module, report, out: Path, as_json: bool) -> None:
    """A bench report (`gatelab.bench` or `gatelab.bench_data`) into `out`, then as JSON or Markdown on stdout."""
    from dataclasses import asdict

    report.command = "gatelab bench " + shlex.join(sys.argv[2:])
    written = module.write(report, out)
    if as_json:
        typer.echo(json.dumps(asdict(report), indent=2, default=str))
        return
    typer.echo(module.to_markdown(report))
    typer.echo("wrote " + ", ".join(str(p) for p in written))


def main() -> None:
    """`gatelab` and `python -m gatelab`: whatever escapes a command ends as one redacted line, exit 2 for a user
    error (GatelabError) and 1 for anything else; GATELAB_DEBUG=1 adds the (redacted) traceback."""
    install_redaction()
    # MLflow logs every SQLAlchemy error with its traceback (`_logger.exception`) before raising it; gatelab turns the
    # error itself into one message naming the store.
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
    try:
        app()
    except Exception as error:
        print_failure(error)
        sys.exit(2 if isinstance(error, GatelabError) else 1)


if __name__ == "__main__":
    main()
