"""`gatelab config`: the keys of experiment and sweep files (`schema`) and a run's resolved configuration (`show`,
gatelab.app.config_show), a command group of its own that gatelab.cli adds under the name `config`."""

from __future__ import annotations

import json
from enum import Enum
from typing import Annotated, Optional

import typer

from gatelab.app import run_command
from gatelab.app.config_show import show as show_config
from gatelab.errors import GatelabError

config_app = typer.Typer(help="Configuration: the schema of experiment and sweep files, and a run's resolved "
                              "configuration.", rich_markup_mode="markdown")  # markdown help as gatelab.cli's


class FileKind(str, Enum):
    experiment = "experiment"
    sweep = "sweep"


def print_schema(kind: FileKind | None, *, as_json: bool) -> None:
    """The reference page of `kind` (default: both kinds), or with `as_json` the JSON Schema of `kind`."""
    from gatelab.app.config_schema import FILE_KINDS, json_schema, reference_page

    if as_json:
        if kind is None:
            raise GatelabError("--json prints the schema of one kind of file, as an editor reads it: add --kind "
                               "experiment or --kind sweep")
        typer.echo(json.dumps(json_schema(kind.value), indent=2))
        return
    typer.echo(reference_page(tuple(FILE_KINDS) if kind is None else (kind.value,)), nl=False)


@config_app.command()
def schema(
    kind: Annotated[Optional[FileKind], typer.Option(help="only this kind of file (with --json, required)")] = None,
    *, as_json: Annotated[bool, typer.Option("--json", help="the JSON Schema of --kind, for an editor's YAML language "
                                                         "server, instead of the markdown page")] = False,
) -> None:
    """Every key of an experiment file and of a sweep file, with its type, default, allowed values and help, as the
    markdown page experiments/CONFIG.md is made of (`gatelab config schema > experiments/CONFIG.md`)."""
    run_command(print_schema, kind, as_json=as_json)


config_app.command("show")(show_config)
