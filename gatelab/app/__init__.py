"""What each `gatelab` command does, one module a command or command group: `gatelab.cli` maps the arguments to one
call here and the call's result to an exit code. A user error is a GatelabError, which the command line turns into
one message and exit code 2; a function that can end otherwise returns the exit code.

Each module imports inside its functions what loads torch, Lightning, MLflow or Optuna: gatelab.cli imports these
modules whole, and `gatelab --help` and a typo in an argument are still answered before any of them is imported.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.text import Text
from typer import echo

from gatelab.errors import GatelabError, redact
from gatelab.progress import CommandClock, fit_line, set_verbose, silence_noise, terminal_columns


def run_command(work: Callable[..., int | None], /, *arguments: Any, **options: Any) -> None:
    """`work(*arguments, **options)`, a call into gatelab.app from a command: a GatelabError ends in one message and
    exit code 2; a code returned, as that code. (gatelab.app's functions take one positional argument at most.)"""
    CommandClock.start()  # its progress lines speak after its own silence, not after an earlier command's
    try:
        code = work(*arguments, **options)
    except GatelabError as error:
        # Text, not markup: a path or key holding `[red]` or `[/bold]` is printed as written.
        message = Text.assemble(("error:", "bold red"), " ", redact(str(error)))
        Console(stderr=True).print(message, highlight=False, soft_wrap=True)
        raise typer.Exit(code=2)
    if code:
        raise typer.Exit(code=code)


def command_line(name: str) -> str:
    """The `gatelab <name>` command line as the user typed it, for the files it writes."""
    return f"gatelab {name} " + " ".join(shlex.quote(a) for a in sys.argv[2:])


def quiet_noise(verbose: bool) -> None:
    """--verbose, or not: for this process and every worker or rank it starts (`gatelab.progress`)."""
    set_verbose(verbose)
    silence_noise()


def stdout_console():
    """A rich console for stdout, as wide as the terminal where stdout is one (gatelab.progress.terminal_columns).
    markup=False: a table cell (a path, a run's error) holding `[red]` or `[/bold]` is printed as written; a pipe gets
    whole rows."""
    return Console(width=terminal_columns() or 200, markup=False)


def comma_list(text: str) -> list[str]:
    """`--format md, csv` and the like: the comma-separated words, blanks dropped."""
    return [word.strip() for word in text.split(",") if word.strip()]


def say_written(written: Iterable[Path]) -> None:
    """The closing line of a command that writes files: which."""
    echo(fit_line("wrote " + ", ".join(str(path) for path in written), terminal_columns()))
