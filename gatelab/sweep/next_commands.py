"""What a sweep command tells the user to run next: the line that re-queues failed cells, and the line that resumes
after Ctrl-C or SIGTERM (the command the user typed, its password hidden)."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from gatelab.errors import redact
from gatelab.interrupts import Interrupted
from gatelab.sweep.ledger_storage import shown_storage
from gatelab.sweep.queue import ledger_states


def failed_cells_line(sweep_path: Path, experiment: Path | None, storage: str | None, runs_dir: Path) -> str | None:
    """One line naming the sweep's failed cells and the command that re-queues them; None when no cell failed."""
    from gatelab.sweep.spec import expand, load_sweep

    sweep = load_sweep(sweep_path, experiment)
    failed = [state for state in ledger_states(storage, runs_dir, sweep.name, expand(sweep))
              if state.status == "failed"]
    if not failed:
        return None
    command = ["gatelab", "sweep", "reset", str(sweep_path), "--failed"]
    command += ["--experiment", str(experiment)] if experiment else []
    command += ["--storage", shown_storage(storage)] if storage else []
    command += ["--runs-dir", str(runs_dir)] if runs_dir != Path("runs") else []
    cells = ", ".join(f"{state.index} ({state.label})" for state in failed)
    return (f"failed: cell{'s' * (len(failed) > 1)} {cells} (why: gatelab sweep status); once the cause is fixed, "
            f"re-queue {'them' if len(failed) > 1 else 'it'} with: {shlex.join(command)}")


# The command a user ran, set by `gatelab sweep run` in the environment of the workers it starts: their resume line
# names it, not the internal `gatelab sweep worker` command.
USER_COMMAND_ENV = "GATELAB_USER_COMMAND"
# Set where the launcher prints the resume line itself (local worker processes, submitit's local executor): a worker
# so started prints none.
LAUNCHER_SAYS_ENV = "GATELAB_LAUNCHER_SAYS_RESUME"


def user_command() -> str:
    """The command line the user typed (its passwords hidden): this process's, or its launcher's."""
    return os.environ.get(USER_COMMAND_ENV) or redact(shlex.join(["gatelab", *sys.argv[1:]]))


def interrupted_line(interrupted: Interrupted) -> str | None:
    """What to run to go on after Ctrl-C or SIGTERM: the command the user ran (its password hidden); None in a worker
    whose launcher says it."""
    if os.environ.get(LAUNCHER_SAYS_ENV) == "1":
        return None
    return (f"interrupted by {interrupted}: the run in progress is back in the queue; resume with: "
            f"{user_command()}")
