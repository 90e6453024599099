"""What a run writes to MLflow (rank 0 only): its start (tags, parameters, configs), its spikes, and how it ended
(pruned, diverged, or finished with its evaluation and lm-eval scores); and what MLflow already records of it."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import lightning as L
import numpy as np
from tokenizers import Tokenizer

from gatelab import tracking
from gatelab.config import ExperimentConfig, ModelConfig, flatten
from gatelab.config_files import to_yaml
from gatelab.data.datasets import TokenCorpus
from gatelab.data.identity import spec_hash
from gatelab.devices import device_name, evaluation_device
from gatelab.errors import redact
from gatelab.host import machine_name
from gatelab.metrics import DIVERGED_STEP, EVAL_S, PRUNED_STEP, SPIKE, TRAIN_LOSS
from gatelab.model import count_parameters
from gatelab.progress import DEVICE_TAG, HOST_TAG, format_duration
from gatelab.store_uris import run_tracking_uri
from gatelab.tracked_run import TrackedRun
from gatelab.train.module import GatedLM, SpikeRule, StabilityMonitor
from gatelab.train.phases import PhaseClock
from gatelab.train.result import RunResult


def tracked_run(experiment: ExperimentConfig, tracking_uri: str | None, runs_dir: Path) -> TrackedRun:
    return TrackedRun(run_tracking_uri(tracking_uri, experiment, runs_dir), runs_dir,
                      experiment.tracking.experiment or experiment.name, spec_hash(experiment))


def recorded_outcome(tracked: TrackedRun) -> RunResult | None:
    """The run's result if MLflow records it as ended, finished or diverged; None if it has to be trained."""
    outcome = tracked.recorded_outcome()
    if outcome is None:
        return None
    status, metrics = outcome
    step = metrics.get(DIVERGED_STEP)
    return RunResult(status, tracked.run_id, tracked.spec_hash, metrics, int(step) if step is not None else None)


def recorded_result(experiment: ExperimentConfig, tracking_uri: str | None = None,
                    runs_dir: Path = Path("runs")) -> RunResult | None:
    """What MLflow records of this experiment's run, if it ended (finished or diverged); None otherwise."""
    return recorded_outcome(tracked_run(experiment, tracking_uri, runs_dir))


def open_run(tracked: TrackedRun, experiment: ExperimentConfig, model_config: ModelConfig, trainer: L.Trainer,
             resuming: bool, set_aside: bool, extra_tags: dict | None, log: Callable[[str], object]) -> bool:
    """Open (or continue) the MLflow run; a fresh start also records its parameters and configs, with the precision it
    trains in (`auto` resolves by machine, and a resumed run keeps the one it began in). The host and device tags say
    where it trained (a resumed run: where it trained last), for `gatelab sweep plan`'s measured estimates.

    Returns whether this start continues, from step 0, the MLflow run of an earlier process cut off before its first
    checkpoint (`cut_off_before_a_checkpoint`)."""
    device = trainer.strategy.root_device
    tags = {tracking.VARIANT_TAG: experiment.variant, tracking.SEED_TAG: str(experiment.seed),
            tracking.EXPERIMENT_TAG: experiment.name, HOST_TAG: machine_name(), DEVICE_TAG: device_name(device),
            **SpikeRule.from_config(experiment.train).describe(), **(extra_tags or {})}
    params = None if resuming else start_params(experiment, model_config, str(trainer.precision))
    continuing = params is not None and cut_off_before_a_checkpoint(tracked, params, set_aside)
    tracked.open(resuming or continuing, tags, run_name=f"{experiment.variant}-s{experiment.seed}")
    if resuming:
        return False
    if continuing:
        log(f"continuing MLflow run {tracked.run_id} from step 0: an earlier process was stopped in it before its "
            "first checkpoint; the points it logged are kept")
    tracked.log_start(params, {"config/experiment.yaml": to_yaml(experiment),
                               "config/model_resolved.yaml": to_yaml(model_config)})
    return continuing


def start_params(experiment: ExperimentConfig, model_config: ModelConfig, precision: str) -> dict:
    """The parameters a run records once, as it starts: its config, the resolved model, the precision it trains in."""
    params = flatten(experiment) | {f"resolved.{k}": v for k, v in flatten(model_config.model_dump(mode='json')).items()
                                    if k in ("gates", "n_heads", "n_kv_heads", "ffn_hidden")}
    params[tracking.TOTAL_PARAMS_PARAM] = count_parameters(model_config)
    params[tracking.RESOLVED_PRECISION_PARAM] = precision
    params[tracking.EVAL_BUDGET_PARAM] = experiment.eval.budget_name(experiment.data.seq_len)
    return params


def cut_off_before_a_checkpoint(tracked: TrackedRun, params: dict, set_aside: bool) -> bool:
    """Whether the MLflow run found for this spec hash was stopped (Ctrl-C, SIGTERM, a kill, a crash) before it wrote a
    checkpoint, so this start, from step 0 like it, continues it rather than leaving it KILLED beside a second run.
    Not where a checkpoint was set aside at this start (that run trained past what is now lost: sweeps/README.md,
    Reliability), nor where it recorded other parameters (`train.precision: auto` resolved otherwise on another
    machine)."""
    if tracked.run_id is None or set_aside:
        return False
    recorded = tracked.client.get_run(tracked.run_id).data.params
    kept = {name: redact(str(value))[:500] for name, value in params.items()}  # as log_start records them
    # A recorded value may be the start of ours: Lightning's MLflow logger cuts values at 250 characters.
    return all(kept[name].startswith(recorded.get(name, "")) for name in kept)


def log_spikes(tracked: TrackedRun, stability: StabilityMonitor, resuming: bool) -> None:
    """Each spike the monitor found as metric `train/spike`: its loss, at its step. A resumed run may have logged some
    before it was cut off; those are not logged twice."""
    logged = set(tracked.metric_history(SPIKE)[0]) if resuming else set()
    new = [(step, loss) for step, loss in zip(stability.spikes, stability.spike_losses) if step not in logged]
    tracked.log_series(SPIKE, [step for step, _ in new], [loss for _, loss in new])


def record_pruned(tracked: TrackedRun, clock: PhaseClock, step: int) -> None:
    clock.log(tracked, step)
    tracked.log_metrics({PRUNED_STEP: step}, step=0)
    tracked.end("pruned")


def record_diverged(tracked: TrackedRun, stability: StabilityMonitor, clock: PhaseClock, step: int,
                    logged_before: bool) -> None:
    """`logged_before`: a resumed or continued run, which may have logged some of its spikes already."""
    log_spikes(tracked, stability, logged_before)
    clock.log(tracked, step)
    tracked.log_metrics({DIVERGED_STEP: stability.diverged_step}, step=0)
    tracked.end("diverged")


def record_finished(tracked: TrackedRun, experiment: ExperimentConfig, module: GatedLM, trainer: L.Trainer,
                    tokenizer: Tokenizer | None, corpus: TokenCorpus, domains: list[str], stability: StabilityMonitor,
                    clock: PhaseClock, logged_before: bool, log: Callable[[str], object]) -> dict[str, float]:
    """Evaluate the trained model on the device it trained on and record it, saying what it evaluates as each part
    starts (on a CPU the evaluation can take minutes after the last step); returns the evaluation's metrics."""
    from gatelab.train.evaluate import evaluate  # evaluation imports plotting; keep it off the training path

    step = trainer.global_step
    started = time.perf_counter()
    log_spikes(tracked, stability, logged_before)
    # Lightning's teardown moved the module back to the CPU when `fit` ended.
    device = evaluation_device(trainer.strategy.root_device, experiment.train.accelerator)
    if device.type != "cpu":
        log(f"evaluating on {device_name(device)} ({device})")
    module.model.to(device)
    metrics, artifacts = evaluate(module.model, experiment, tokenizer, corpus, domains,
                                  tracked.metric_history(TRAIN_LOSS), stability.spikes, log=log)
    log("recording the evaluation in MLflow: metrics, probes and plots")
    tracked.log_metrics({name: float(value) for name, value in metrics.items()
                         if value is not None and np.isfinite(value)}, step)
    tracked.log_artifacts(artifacts, "eval")
    if experiment.eval.lm_eval is not None:
        log(f"evaluating: lm-evaluation-harness tasks {', '.join(experiment.eval.lm_eval.tasks)}")
        metrics |= score_benchmarks(tracked, experiment, module, tokenizer, corpus, step)
    log(f"evaluated in {format_duration(time.perf_counter() - started)}")
    clock.phase_ended(EVAL_S)
    clock.log(tracked, step)
    tracked.end("finished")
    return metrics


def score_benchmarks(tracked: TrackedRun, experiment: ExperimentConfig, module: GatedLM, tokenizer: Tokenizer | None,
                     corpus: TokenCorpus, step: int) -> dict[str, float]:
    """eval.lm_eval's tasks through lm-evaluation-harness, recorded as `gatelab eval` records them (so it skips
    them)."""
    from gatelab.eval import scoring

    config = experiment.eval.lm_eval
    settings = scoring.HarnessSettings(tuple(config.tasks), config.num_fewshot, config.limit, config.include_path,
                                       experiment.eval.batch_size)
    metrics, payloads, tags = scoring.score_live(module.model, tokenizer, corpus.bos_id, corpus.eos_id,
                                                experiment.data.seq_len, experiment.train.precision, settings)
    tracked.log_metrics(metrics, step)
    tracked.log_artifacts({f"{task}.json": (lambda path, p=payload: path.write_text(json.dumps(p, indent=1,
                                                                                               default=str)))
                           for task, payload in payloads.items()}, scoring.ARTIFACT_FOLDER)
    tracked.set_tags(tags)
    return metrics
