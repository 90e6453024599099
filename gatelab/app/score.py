"""`gatelab eval`: the finished runs of a sweep file (or one MLflow run id) scored with lm-evaluation-harness, into
their MLflow runs (gatelab.eval.scoring scores them); and `gatelab lm-eval`, the harness's own command line."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from typer import echo

from gatelab.errors import GatelabError
from gatelab.store_uris import missing_local_store
from gatelab.tracking import STATUS_TAG, RunStore

if TYPE_CHECKING:
    from gatelab.eval.scoring import Target
    from gatelab.workspace import Workspace


def targets_of(target: str, *, experiment: Path | None, store: RunStore, log=print) -> list[Target]:
    """The finished runs to score: every one of a sweep file's runs that has finished, or one MLflow run id."""
    from gatelab.eval.scoring import Target

    path = Path(target)
    if path.suffix in (".yaml", ".yml") or path.is_file():
        from gatelab.report.tables import collect_runs
        from gatelab.sweep.spec import expand, load_sweep

        sweep = load_sweep(path, experiment)
        records = collect_runs(expand(sweep), store, sweep.name)
        finished = [r for r in records if r.status == "finished" and r.run_id]
        others = len(records) - len(finished)
        if others:
            log(f"{others} of {len(records)} runs of {sweep.name} have not finished; scoring the {len(finished)} that "
                "have")
        return [Target(r.run_id, f"{r.spec.experiment.variant} seed {r.spec.experiment.seed}"
                       + (f" ({' '.join(f'{k}={v}' for k, v in r.spec.settings().items())})" if r.spec.settings()
                          else "")) for r in finished]
    status = store.run_data(target).tags.get(STATUS_TAG)
    if status != "finished":
        raise GatelabError(f"MLflow run '{target}' is {status or 'not a gatelab run'}, not finished: score finished "
                           "runs (a sweep file scores every finished run of the sweep)")
    return [Target(target, target)]


def score(target: str, *, tasks: str, num_fewshot: int | None, limit: float | None, include_path: Path | None,
          batch_size: int, workers: int, experiment: Path | None, workspace: Workspace) -> int:
    """Score the runs on the comma-separated `tasks` they lack and say how many; the exit code (130 after Ctrl-C)."""
    try:
        from gatelab.eval.scoring import HarnessSettings, score_in_parallel

        settings = HarnessSettings(tuple(t.strip() for t in tasks.split(",") if t.strip()), num_fewshot, limit,
                                   str(include_path) if include_path else None, batch_size)
        if not settings.tasks:
            raise GatelabError("--tasks: name at least one lm-eval task, e.g. --tasks gatelab_blimp")
        uri, runs_dir = workspace.store(create=False), workspace.runs_dir
        if missing_local_store(uri):
            raise GatelabError(missing_local_store(uri))
        targets = targets_of(target, experiment=experiment, store=RunStore(uri, runs_dir), log=echo)
        counts = score_in_parallel(targets, settings, uri, runs_dir, workers, log=echo)
    except KeyboardInterrupt:
        echo("interrupted: the scores logged so far are kept; run the same command again to score the rest", err=True)
        return 130
    echo(f"scored {counts['scored']} run(s); {counts['skipped']} already had these scores")
    return 0


def lm_eval(args: list[str]) -> None:
    """lm-evaluation-harness's command line on `args`, with gatelab's model and offline tasks registered."""
    from gatelab.eval.harness import main

    main(args)
