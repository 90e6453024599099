"""Optuna searches inside a sweep: one study per grid cell (e.g. the best learning rate per variant).

Each trial is a real gatelab run (its own MLflow run, tagged with the study and trial), pruned through
optuna-integration's Lightning callback on `val/loss` at each validation. A pruned trial ends as a finished MLflow run
tagged `gatelab.status=pruned`, never as a crash; a diverged one scores +inf, so "the largest stable learning rate"
reads off the study directly. Studies live in the sweep's ledger storage and resume where they stopped.
"""

from __future__ import annotations

import math
import time
import traceback

import optuna
from optuna.trial import TrialState

from gatelab import tracking
from gatelab.errors import GatelabError, redact
from gatelab.metrics import VAL_LOSS
from gatelab.store_checks import store_errors
from gatelab.store_uris import run_tracking_uri
from gatelab.sweep.ledger_storage import open_storage, tracking_stores
from gatelab.sweep.queue import set_trial_state
from gatelab.sweep.spec import with_values
from gatelab.tracking import STATUS_TAG
from gatelab.train.result import RunPruned
from gatelab.workspace import Workspace

MAX_INVALID_TRIALS = 20  # suggestions that are no valid run, in one cell, before the search stops with an error
PRUNERS = {
    "none": lambda: optuna.pruners.NopPruner(),
    "median": lambda: optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0),
    "hyperband": lambda: optuna.pruners.HyperbandPruner(),
}


def study_name(sweep_name: str, spec) -> str:
    return f"{sweep_name}.search.{spec.index}.{spec.hash}"


def pruning_callback(trial: optuna.Trial, monitor: str = VAL_LOSS):
    """optuna-integration's Lightning pruning callback, raising gatelab's `RunPruned` where it raises
    `optuna.TrialPruned`: the training code stops a pruned run as a result without knowing Optuna."""
    from optuna_integration import PyTorchLightningPruningCallback


    class PruneRun(PyTorchLightningPruningCallback):
        def on_validation_end(self, trainer, pl_module) -> None:
            try:
                super().on_validation_end(trainer, pl_module)
            except optuna.TrialPruned as pruned:
                raise RunPruned(str(pruned)) from pruned

    return PruneRun(trial, monitor=monitor)


def _final_value(result, metric: str, *, experiment, workspace: Workspace) -> float:
    """The run's last value of `metric`: from its evaluation's result, else as MLflow recorded it (`val/loss`,
    logged during training); +inf where the run has none."""
    if metric in result.metrics:
        return result.metrics[metric]

    uri = run_tracking_uri(workspace.tracking_uri, experiment, workspace.runs_dir)
    with store_errors(uri):
        recorded = tracking.client(uri).get_run(result.run_id).data.metrics
    return recorded.get(metric, math.inf)


def run_search(sweep, specs, *, workspace: Workspace, log=print, claim_until: float | None = None) -> dict[str, dict]:
    """Run (or finish) the search of every cell, its studies in `workspace.storage` (named: the sweep's ledger);
    returns each cell's best parameters and value. No trial starts after `claim_until` (a time.time(); Optuna's
    `timeout`): the search stops there, and the same command goes on with it."""
    from gatelab.train.run import run

    search = sweep.search
    tracking_uri, runs_dir = workspace.tracking_uri, workspace.runs_dir
    stores = tracking_stores(specs, tracking_uri=tracking_uri, runs_dir=runs_dir)
    ledger = open_storage(workspace.storage, stores)  # refused here, before any training
    best: dict[str, dict] = {}
    for spec in specs:
        study = optuna.create_study(
            study_name=study_name(sweep.name, spec), storage=ledger, load_if_exists=True,
            direction=search.direction, pruner=PRUNERS[search.pruner](),
            sampler=optuna.samplers.TPESampler(seed=spec.experiment.seed))
        for stale in study.get_trials(states=(TrialState.RUNNING,)):  # left by a killed search: start it again
            set_trial_state(study, stale, TrialState.FAIL)
        counted = (TrialState.COMPLETE, TrialState.PRUNED)
        invalid_trials = 0
        while len(study.get_trials(states=counted)) < search.n_trials:
            if claim_until is not None and time.time() >= claim_until:
                log(f"timeout: no new trial started; the search stops at cell {spec.index} (the same command goes "
                    "on with it)")
                return best
            trial = study.ask()
            try:
                experiment = with_values(spec, search.suggest(trial)).experiment
            except GatelabError as invalid:  # a combination of values the load-time checks could not foresee
                _fail_invalid(study, trial, invalid, f"cell {spec.index}", log)
                invalid_trials += 1
                if invalid_trials >= MAX_INVALID_TRIALS:  # the sampler keeps proposing them: stop, do not spin
                    raise GatelabError(f"sweep {sweep.name}, cell {spec.index}: {invalid_trials} suggested trials were "
                                       f"no valid run (the last: {redact(str(invalid))}); narrow search.params so "
                                       "that every combination is valid") from None
                continue
            log(f"cell {spec.index} ({spec.label()}) trial {trial.number}: {trial.params}")
            pruning = pruning_callback(trial)
            tags = {"optuna.study": study.study_name, "optuna.trial": str(trial.number),
                    "gatelab.search_cell": spec.hash}
            try:
                result = run(experiment, tracking_uri=tracking_uri, runs_dir=runs_dir, quiet=True, log=log,
                             extra_callbacks=(pruning,), extra_tags=tags)
            except Exception:  # a crashed trial is recorded as failed and the search goes on
                trial.set_user_attr("gatelab.error", redact(traceback.format_exc())[-2000:])
                study.tell(trial, state=TrialState.FAIL)
                continue
            trial.set_user_attr("gatelab.mlflow_run_id", result.run_id)
            trial.set_user_attr(STATUS_TAG, result.status)
            if result.status == "pruned":
                study.tell(trial, state=TrialState.PRUNED)
            else:
                value = _final_value(result, search.metric, experiment=experiment, workspace=workspace) \
                    if result.status == "finished" else math.inf
                study.tell(trial, value if math.isfinite(value) else math.inf)
        top = _best_trial(study, search.direction)
        if top is not None:
            best[spec.hash] = {"label": spec.label(), "params": top.params, "value": top.value}
            log(f"cell {spec.index} ({spec.label()}): best {search.metric} {top.value:.4f} at {top.params}")
    return best


def _fail_invalid(study, trial, invalid: GatelabError, cell: str, log) -> None:
    """A suggested trial that is no valid run: failed without training, and why said and kept on it."""
    log(f"{cell} trial {trial.number}: {trial.params} is no valid run, failed without training: {redact(str(invalid))}")
    trial.set_user_attr("gatelab.error", redact(str(invalid))[-2000:])
    study.tell(trial, state=TrialState.FAIL)


def _best_trial(study, direction: str):
    """The study's best finished trial with a finite value, or None."""
    finished = [t for t in study.get_trials(states=(TrialState.COMPLETE,)) if math.isfinite(t.value)]
    if not finished:
        return None
    return min(finished, key=lambda t: t.value) if direction == "minimize" else max(finished, key=lambda t: t.value)
