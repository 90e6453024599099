"""`run(experiment)`: one experiment in, one finished MLflow run out, resumable from its last checkpoint."""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import ModelCheckpoint, TQDMProgressBar

from gatelab import host, tracking
from gatelab.devices import device_name, evaluation_device
from gatelab.config import ExperimentConfig, ModelConfig, flatten, to_yaml
from gatelab.data.identity import spec_hash
from gatelab.data.datasets import heldout_windows, train_dataset
from gatelab.data.prepare import load_data
from gatelab.errors import GatelabError, redact
from gatelab.interrupts import Interrupted, raise_on_signals
from gatelab.metrics import TRAIN_LOSS
from gatelab.model import count_parameters, resolve_model
from gatelab.progress import (DEFAULT_EVERY_S, DEVICE_TAG, HOST_TAG, format_duration, progress_every_s,
                              silence_noise, step_time)
from gatelab.tracking import TrackedRun
from gatelab.train.checkpoints import (DurableCheckpointIO, PublishAfterStepMetrics, ThisRun, recorded_precision,
                                      remove_unfinished_writes, set_aside_unless_resumable)
from gatelab.train.compiling import CompileReport, cannot_compile, forget_earlier_graphs, share_cache
from gatelab.train.memory import check_fits
from gatelab.host import resolve_precision
from gatelab.train.module import GatedLM, SpikeRule, StabilityMonitor, TextData
from gatelab.train.ownership import Lease, OwnershipFence, RunOwnership, RunTakenOver


@dataclass
class RunResult:
    status: str  # finished / diverged / pruned
    run_id: str
    spec_hash: str
    metrics: dict[str, float] = field(default_factory=dict)
    diverged_step: int | None = None
    global_rank: int = 0  # under DDP every rank returns one; only rank 0's carries the evaluation metrics
    trained_steps: int = 0  # what this session trained (a resumed run: the steps after its checkpoint) ...
    train_s: float = 0.0  # ... and in how many seconds: a sweep's estimate of the time it has left


class RunPruned(Exception):
    """Raised by a callback to end a run early as a result, not a failure: an Optuna search's pruner
    (`gatelab.sweep.search.pruning_callback`). The run is recorded as pruned at the step it reached."""


class _AlreadyRecorded(Exception):
    """Raised on every rank in `setup` when rank 0 found the run already finished or diverged in MLflow."""


class _RankAgreement(L.Callback):
    """What rank 0 decided before `fit`, told to every rank as soon as the process group exists (`setup`, before the
    checkpoint is restored and before any step).

    Ranks other than 0 never open MLflow: here they learn the run id, and whether rank 0 found the run already
    recorded, in which case every rank leaves `fit` together (one rank returning early while the others enter `fit`
    would leave them waiting in the process group forever). Every rank must also have made the same resume decision:
    a checkpoint folder that one node sees and another does not would train different steps on different ranks.
    """

    def __init__(self, resuming: bool) -> None:
        self.resuming = resuming
        self.recorded: RunResult | None = None  # rank 0 sets both before `fit`
        self.run_id = ""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.recorded, self.run_id, resuming = trainer.strategy.broadcast((self.recorded, self.run_id, self.resuming))
        if self.recorded is not None:
            raise _AlreadyRecorded
        if not trainer.strategy.reduce_boolean_decision(self.resuming == resuming, all=True):
            raise GatelabError("the ranks of this run disagree on resuming from its checkpoint: the runs directory "
                               "must be one folder that every node sees")


def _tracked_run(experiment: ExperimentConfig, tracking_uri: str | None, runs_dir: Path) -> TrackedRun:
    return TrackedRun(tracking.run_tracking_uri(tracking_uri, experiment, runs_dir), runs_dir,
                      experiment.tracking.experiment or experiment.name, spec_hash(experiment))


def _recorded_outcome(tracked: TrackedRun) -> RunResult | None:
    """The run's result if MLflow records it as ended, finished or diverged; None if it has to be trained."""
    outcome = tracked.recorded_outcome()
    if outcome is None:
        return None
    status, metrics = outcome
    step = metrics.get("diverged_step")
    return RunResult(status, tracked.run_id, tracked.spec_hash, metrics, int(step) if step is not None else None)


def recorded_result(experiment: ExperimentConfig, tracking_uri: str | None = None,
                    runs_dir: Path = Path("runs")) -> RunResult | None:
    """What MLflow records of this experiment's run, if it ended (finished or diverged); None otherwise."""
    return _recorded_outcome(_tracked_run(experiment, tracking_uri, runs_dir))


def _alone_until_fit(trainer: L.Trainer) -> bool:
    """Whether no other rank of this run can exist before rank 0 calls `trainer.fit`.

    True for one process, and for one node whose other ranks Lightning itself starts inside `fit` (its subprocess
    launcher re-runs this command line for ranks 1..N-1 when rank 0 calls `fit`): rank 0 may then return before
    `fit` and no rank is left waiting. Ranks started by torchrun or srun, or the ranks of another node, run `run()`
    from the start and must be told inside `fit` (`_RankAgreement`).
    """
    environment = getattr(trainer.strategy, "cluster_environment", None)
    external = environment is not None and environment.creates_processes_externally
    return trainer.world_size == 1 or (trainer.num_nodes == 1 and not external)


class StepProgress(L.Callback):
    """Measures a run's seconds a training step (from the first step of this session: a resumed run counts only what
    it trains now) and, where `every_s` is set, logs a plain line at least that often:
    `step 80/150, loss 5.43, 1.1 s a step, 1 min 17 s left`. Hooks run on every rank; only rank 0 speaks."""

    def __init__(self, log: Callable[[str], object] = print, every_s: float | None = DEFAULT_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        # `say`, not `log`: Lightning sets every callback's `log` to the module's `self.log` (callback_connector)
        self.say, self.every_s, self.clock = log, every_s, clock
        self.first_step = 0
        self.started = self.last_line = 0.0
        self.steps = 0
        self.train_s = 0.0

    @property
    def seconds_per_step(self) -> float | None:
        return self.train_s / self.steps if self.steps else None

    def on_train_start(self, trainer, pl_module) -> None:
        self.first_step = trainer.global_step
        self.started = self.last_line = self.clock()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        now = self.clock()
        self.steps, self.train_s = trainer.global_step - self.first_step, now - self.started
        if self.every_s is None or now - self.last_line < self.every_s or trainer.global_rank:
            return
        self.last_line = now
        self.say(self.line(trainer.global_step, trainer.max_steps, trainer.callback_metrics.get(TRAIN_LOSS)))

    def on_train_end(self, trainer, pl_module) -> None:
        if self.every_s is not None and self.steps and not trainer.global_rank:
            self.say(f"trained {self.steps} steps in {format_duration(self.train_s)} "
                     f"({step_time(self.seconds_per_step)})")

    def line(self, step: int, max_steps: int, loss=None) -> str:
        parts = [f"step {step}/{max_steps}"]
        if loss is not None:
            parts.append(f"loss {float(loss):.3f}")
        rate = self.seconds_per_step
        if rate is not None:
            parts += [step_time(rate), f"{format_duration(rate * max(0, max_steps - step))} left"]
        return ", ".join(parts)


class StepBar(TQDMProgressBar):
    """Lightning's bar over the run's steps, `step/max_steps` (Lightning's counts an epoch's batches: `0/?` on a
    stream), redrawn every step (every 10 left a minute without output at 6 s a step; tqdm itself redraws at most ten
    times a second), without `v_num` (a logger's version: gatelab's Trainer has none, so it meant nothing)."""

    def __init__(self) -> None:
        super().__init__(refresh_rate=1)

    def on_train_epoch_start(self, trainer, *args) -> None:
        super().on_train_epoch_start(trainer, *args)
        bar = self.train_progress_bar
        bar.total, bar.initial, bar.n = trainer.max_steps, trainer.global_step, trainer.global_step  # resumed: from there
        bar.set_description("training")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if self.train_progress_bar is not None and not self.train_progress_bar.disable:
            self.train_progress_bar.n = trainer.global_step
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))  # redraws the bar

    def get_metrics(self, trainer, pl_module) -> dict:
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        return metrics


def above_the_bar(log: Callable[[str], object]) -> Callable[[str], object]:
    """`log` for a run that shows a bar: each line goes above the bar (tqdm clears it, then draws it again below),
    not onto the bar's own line, where "compiled in ..." was glued and each line left a copy of the bar behind."""
    def say(line: str) -> None:
        from tqdm import tqdm

        with tqdm.external_write_mode(file=sys.stdout):
            log(line)
    return say


_first_run_of_process = True


class _PhaseClock:
    """Where a run's wall time went, as `time/*` metrics: `import_s` from the program's start (its first import of
    gatelab) to its first `run()` (0 for its later runs: a sweep worker imports once), then `setup_s` (data,
    tokenizer, model, MLflow), `train_s` (`fit`) and `eval_s` (the final evaluation and its artifacts), each from the end of the one before.

    A resumed run records the session that ended it, so the seconds of one killed before the end are not counted.
    """

    def __init__(self) -> None:
        global _first_run_of_process
        self.seconds: dict[str, float] = {}
        self.seconds["time/import_s"] = host.seconds_since_start() if _first_run_of_process else 0.0
        _first_run_of_process = False
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.reset_peak_memory_stats()  # a sweep worker's GPU peak is each run's own, not its largest run's
        self._since = time.perf_counter()

    def phase_ended(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[f"time/{phase}_s"] = now - self._since
        self._since = now

    def training_ended(self, trainer: L.Trainer) -> None:
        """`train_s`, and `step_s`: the mean seconds of a training step this session, which `gatelab sweep plan` reads
        back to estimate the next sweep of the same shape on this machine (HOST_TAG)."""
        self.phase_ended("train")
        steps = next(c for c in trainer.callbacks if isinstance(c, StepProgress))
        if steps.seconds_per_step is not None:
            self.seconds["time/step_s"] = steps.seconds_per_step
        compiled = next((c for c in trainer.callbacks if isinstance(c, CompileReport)), None)
        if compiled is not None and compiled.compile_s is not None:
            self.seconds["time/compile_s"] = compiled.compile_s
        if (peak := _peak_gpu_gb()) is not None:
            # Training's own peak: `memory/peak_gpu_gb`, read at the end, also holds the evaluation's batches.
            self.seconds["memory/peak_gpu_train_gb"] = peak

    def log(self, tracked: TrackedRun, step: int) -> None:
        tracked.log_metrics(self.seconds | peak_memory(), step)


def peak_memory() -> dict[str, float]:
    """`memory/peak_rss_gb`: this process's largest resident set so far (a sweep worker's, over its runs until now;
    see `host.peak_rss_gb`); `memory/peak_gpu_gb`: the most CUDA memory torch held during this run (training and
    evaluation), where there is a GPU."""
    memory = {"memory/peak_rss_gb": host.peak_rss_gb()}
    if (peak := _peak_gpu_gb()) is not None:
        memory["memory/peak_gpu_gb"] = peak
    return memory


def _peak_gpu_gb() -> float | None:
    """The most CUDA memory torch held since the last reset, in GB; None where CUDA was never used here."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.max_memory_allocated() / 1e9
    return None


def _check_strategy(experiment: ExperimentConfig) -> None:
    train = experiment.train
    if train.strategy == "ddp_spawn":
        # Spawned workers train on pickled copies of the callbacks, and only the weights and callback_metrics come
        # back, so the process that evaluates and records would never hear of a divergence (it would record a diverged
        # run as finished) or a spike, and would log its evaluation at step 0.
        raise GatelabError("train.strategy: 'ddp_spawn' is not supported (its workers' divergence and spike records "
                           "never reach the process that records the run); use 'ddp', which trains the same way")
    if train.strategy == "fsdp" and not (torch.cuda.is_available() and train.accelerator in ("auto", "gpu", "cuda")):
        raise GatelabError("train.strategy: 'fsdp' needs CUDA GPUs (Lightning runs FSDP on CUDA only); use 'ddp' on "
                           "CPU, which trains the same way")


def _set_threads(threads: int | None) -> None:
    if threads:
        torch.set_num_threads(threads)
        # Lightning's DDP launcher sets every rank to cores/devices threads unless OMP_NUM_THREADS is set; set here, it
        # reaches the ranks the launcher starts too, and every rank keeps train.threads.
        os.environ["OMP_NUM_THREADS"] = str(threads)


@dataclass
class RunSession:
    """One run's parts in one place, handed whole from step to step (torchtitan keeps a run's on its `Trainer`).

    Filled in as they come to exist: the configs, folders, clock and progress first (`_start_session`); the Lightning
    trainer with its callbacks and this process's rank (`_attach_trainer`); the MLflow store; the data (`_load_data`);
    on rank 0 the MLflow run (`_open_tracked`); the LightningModule just before `fit`. Other ranks hold no `ownership`
    and no `tracked`, and say nothing (`log` and `chatter` are silent there): rank 0 says everything once.
    """

    experiment: ExperimentConfig
    model_config: ModelConfig
    runs_dir: Path
    run_dir: Path  # runs_dir/<experiment>/<variant>-s<seed>-<spec hash>
    digest: str  # spec_hash(experiment)
    clock: _PhaseClock
    steps: StepProgress
    log: Callable[[str], object]  # what the run always says (warnings, resuming, the outcome) ...
    chatter: Callable[[str], object]  # ... and what it says unless quiet (data, progress, each part of the evaluation)
    extra_tags: dict | None = None
    trainer: L.Trainer | None = None
    agreement: _RankAgreement | None = None
    stability: StabilityMonitor | None = None
    ownership: RunOwnership | None = None  # rank 0's hold on the run folder, for every rank
    rank: int = 0
    uri: str = ""  # the MLflow store ...
    embedded: bool = True  # ... and whether it is the default one under runs_dir (made once the data is ready)
    tokenizer: object = None
    corpus: object = None
    domains: list[str] = field(default_factory=list)
    resuming: bool = False  # from checkpoint, into the same MLflow run
    set_aside: bool = False  # a checkpoint that could not resume this run was moved aside at this start
    continuing: bool = False  # from step 0 into the MLflow run an earlier process opened before its first checkpoint
    tracked: TrackedRun | None = None  # rank 0's MLflow run
    module: GatedLM | None = None

    @property
    def checkpoint(self) -> Path:
        return self.run_dir / "checkpoints" / "last.ckpt"


def build_trainer(experiment: ExperimentConfig, run_dir: Path, callbacks: list[L.Callback],
                  bar: bool, precision: str) -> L.Trainer:
    """The run's Trainer at `precision`, with no logger: `callbacks`, then checkpoints every `train.checkpoint_every`
    steps into `run_dir/checkpoints` (and Lightning's progress bar where `bar`)."""
    train, every = experiment.train, experiment.eval.every_n_steps
    checkpoints = ModelCheckpoint(dirpath=run_dir / "checkpoints", every_n_train_steps=train.checkpoint_every,
                                  save_last=True, save_top_k=0)
    checkpoint_io = DurableCheckpointIO()
    return L.Trainer(
        max_steps=train.max_steps, accelerator=train.accelerator, devices=train.devices, num_nodes=train.num_nodes,
        strategy=train.strategy, precision=precision,
        gradient_clip_val=train.grad_clip or None, logger=False, log_every_n_steps=train.log_every,
        callbacks=[*callbacks, PublishAfterStepMetrics(checkpoint_io), checkpoints]
        + ([StepBar()] if bar else []),
        enable_progress_bar=bar, enable_model_summary=False, num_sanity_val_steps=0,
        limit_val_batches=1.0 if every else 0, check_val_every_n_epoch=1,
        # Every rank validates on all held-out windows, so val/loss (logged by rank 0, not synced) is the whole set's,
        # as on one device; Lightning's DistributedSampler would hand rank 0 half of them (padded when uneven). The
        # training stream needs no sampler: StepBatches slices the global batch by rank itself.
        use_distributed_sampler=False,
        default_root_dir=run_dir, deterministic=False, plugins=[checkpoint_io],
    )


def _open_run(session: RunSession) -> None:
    """Open (or continue) the MLflow run; a fresh start also records its parameters and configs, with the precision it
    trains in (`auto` resolves by machine, and a resumed run keeps the one it began in). The host and device tags say
    where it trained (a resumed run: where it trained last), for `gatelab sweep plan`'s measured estimates."""
    experiment, model_config, tracked = session.experiment, session.model_config, session.tracked
    device = session.trainer.strategy.root_device
    tags = {tracking.VARIANT_TAG: experiment.variant, tracking.SEED_TAG: str(experiment.seed),
            tracking.EXPERIMENT_TAG: experiment.name, HOST_TAG: socket.gethostname(), DEVICE_TAG: device_name(device),
            **SpikeRule.from_config(experiment.train).describe(), **(session.extra_tags or {})}
    params = None if session.resuming else _start_params(session)
    session.continuing = params is not None and _cut_off_before_a_checkpoint(session, params)
    tracked.open(session.resuming or session.continuing, tags, run_name=f"{experiment.variant}-s{experiment.seed}")
    if session.resuming:
        return
    if session.continuing:
        session.log(f"continuing MLflow run {tracked.run_id} from step 0: an earlier process was stopped in it before "
                    "its first checkpoint; the points it logged are kept")
    tracked.log_start(params, {"config/experiment.yaml": to_yaml(experiment),
                               "config/model_resolved.yaml": to_yaml(model_config)})


def _start_params(session: RunSession) -> dict:
    """The parameters a run records once, as it starts: its config, the resolved model, the precision it trains in."""
    experiment, model_config = session.experiment, session.model_config
    params = flatten(experiment) | {f"resolved.{k}": v for k, v in flatten(model_config.model_dump(mode='json')).items()
                                    if k in ("gates", "n_heads", "n_kv_heads", "ffn_hidden")}
    params["model.total_params"] = count_parameters(model_config)
    params["resolved.train.precision"] = str(session.trainer.precision)
    return params


def _cut_off_before_a_checkpoint(session: RunSession, params: dict) -> bool:
    """Whether the MLflow run found for this spec hash was stopped (Ctrl-C, SIGTERM, a kill, a crash) before it wrote a
    checkpoint, so this start, from step 0 like it, continues it rather than leaving it KILLED beside a second run.
    Not where a checkpoint was set aside at this start (that run trained past what is now lost: README, Reliability),
    nor where it recorded other parameters (`train.precision: auto` resolved otherwise on another machine)."""
    tracked = session.tracked
    if tracked.run_id is None or session.set_aside:
        return False
    recorded = tracked.client.get_run(tracked.run_id).data.params
    kept = {name: redact(str(value))[:500] for name, value in params.items()}  # as log_start records them
    # A recorded value may be the start of ours: Lightning's MLflow logger cuts values at 250 characters.
    return all(kept[name].startswith(recorded.get(name, "")) for name in kept)


def _module_and_data(experiment: ExperimentConfig, model_config: ModelConfig, corpus, domains: list[str]):
    L.seed_everything(experiment.seed, workers=True, verbose=False)
    module = GatedLM(experiment, model_config)  # identical on every rank: the initialisation is seeded
    every = experiment.eval.every_n_steps
    validation = None
    if every:
        validation = torch.cat([torch.from_numpy(heldout_windows(corpus, d, experiment.data.seq_len,
                                                                 experiment.eval.max_windows_per_domain))
                                for d in domains])
    windows = train_dataset(corpus, experiment.data.seq_len, experiment.seed, domains)
    return module, TextData(windows, experiment.train.batch_size, every or experiment.train.max_steps, validation,
                            loader_workers=experiment.data.loader_workers)


def log_spikes(tracked: TrackedRun, stability: StabilityMonitor, resuming: bool) -> None:
    """Each spike the monitor found as metric `train/spike`: its loss, at its step. A resumed run may have logged some
    before it was cut off; those are not logged twice."""
    logged = set(tracked.metric_history("train/spike")[0]) if resuming else set()
    new = [(step, loss) for step, loss in zip(stability.spikes, stability.spike_losses) if step not in logged]
    tracked.log_series("train/spike", [step for step, _ in new], [loss for _, loss in new])


def _record_pruned(session: RunSession) -> None:
    tracked, step = session.tracked, session.trainer.global_step
    session.clock.log(tracked, step)
    tracked.log_metrics({"pruned_step": step}, step=0)
    tracked.end("pruned")


def _record_diverged(session: RunSession) -> None:
    tracked, stability = session.tracked, session.stability
    log_spikes(tracked, stability, session.resuming or session.continuing)
    session.clock.log(tracked, session.trainer.global_step)
    tracked.log_metrics({"diverged_step": stability.diverged_step}, step=0)
    tracked.end("diverged")


def _record_finished(session: RunSession) -> dict[str, float]:
    """Evaluate the trained model on the device it trained on and record it, saying what it evaluates as each part
    starts (on a CPU the evaluation can take minutes after the last step); returns the evaluation's metrics."""
    from gatelab.train.evaluate import evaluate  # evaluation imports plotting; keep it off the training path

    experiment, tracked, log, step = session.experiment, session.tracked, session.chatter, session.trainer.global_step
    started = time.perf_counter()
    log_spikes(tracked, session.stability, session.resuming or session.continuing)
    # Lightning's teardown moved the module back to the CPU when `fit` ended.
    device = evaluation_device(session.trainer.strategy.root_device, experiment.train.accelerator)
    if device.type != "cpu":
        log(f"evaluating on {device_name(device)} ({device})")
    session.module.model.to(device)
    metrics, artifacts = evaluate(session.module.model, experiment, session.tokenizer, session.corpus,
                                  session.domains, tracked.metric_history(TRAIN_LOSS), session.stability.spikes,
                                  log=log)
    log("recording the evaluation in MLflow: metrics, probes and plots")
    tracked.log_metrics({name: float(value) for name, value in metrics.items()
                         if value is not None and np.isfinite(value)}, step)
    tracked.log_artifacts(artifacts, "eval")
    if experiment.eval.lm_eval is not None:
        log(f"evaluating: lm-evaluation-harness tasks {', '.join(experiment.eval.lm_eval.tasks)}")
        metrics |= _score_benchmarks(session)
    log(f"evaluated in {format_duration(time.perf_counter() - started)}")
    session.clock.phase_ended("eval")
    session.clock.log(tracked, step)
    tracked.end("finished")
    return metrics


def _score_benchmarks(session: RunSession) -> dict[str, float]:
    """eval.lm_eval's tasks through lm-evaluation-harness, recorded as `gatelab eval` records them (so it skips them)."""
    import json

    from gatelab.eval import scoring

    experiment, tracked, corpus = session.experiment, session.tracked, session.corpus
    config = experiment.eval.lm_eval
    settings = scoring.HarnessSettings(tuple(config.tasks), config.num_fewshot, config.limit, config.include_path,
                                       experiment.eval.batch_size)
    metrics, payloads, tags = scoring.score_live(session.module.model, session.tokenizer, corpus.bos_id, corpus.eos_id,
                                                experiment.data.seq_len, experiment.train.precision, settings)
    tracked.log_metrics(metrics, session.trainer.global_step)
    tracked.log_artifacts({f"{task}.json": (lambda path, p=payload: path.write_text(json.dumps(p, indent=1,
                                                                                               default=str)))
                           for task, payload in payloads.items()}, scoring.PREFIX)
    tracked.set_tags(tags)
    return metrics


def run(experiment: ExperimentConfig, tracking_uri: str | None = None, runs_dir: Path = Path("runs"),
        quiet: bool = False, log=print, extra_callbacks: tuple = (), extra_tags: dict | None = None,
        lease: Lease | None = None, bar: bool | None = None) -> RunResult:
    """Train, evaluate and record one run; under DDP this runs on every rank, and only rank 0 touches MLflow.

    It says what it does (data preparation, progress, each part of the evaluation) through `log`, unless `quiet`.
    Progress is Lightning's bar where `bar` (by default: where stdout is a terminal), else a plain line every
    GATELAB_PROGRESS_EVERY seconds (30), which a log file keeps.

    Nothing is allocated, prepared or opened before the run is known to fit in memory (`check_fits`), and one process
    at a time trains it (`RunOwnership`: a second one raises RunInProgress; a sweep worker that lost its `lease` raises
    RunTakenOver without writing again). SIGINT/SIGTERM raise `Interrupted` after the MLflow run is closed as KILLED.
    """
    clock = _PhaseClock()
    _check_strategy(experiment)
    silence_noise()  # here, not only in the command: Lightning's own import resets its loggers to INFO
    bar = not quiet and (sys.stdout.isatty() if bar is None else bar)
    log = above_the_bar(log) if bar else log
    chatter = (lambda *_: None) if quiet else log
    steps = StepProgress(chatter, every_s=None if quiet or bar else progress_every_s())
    session = _start_session(experiment, runs_dir, clock, steps, log, chatter, extra_tags)
    _attach_trainer(session, lease, bar, extra_callbacks)
    session.uri = tracking.run_tracking_uri(tracking_uri, session.experiment, runs_dir, create=False)
    session.embedded = not (tracking_uri or session.experiment.tracking.uri)
    made = _folders_to_make(session.run_dir)
    with raise_on_signals():
        _load_data(session, made)
        try:
            result = _train_and_record(session)
            return replace(result, trained_steps=steps.steps, train_s=steps.train_s)
        finally:
            if session.ownership is not None:
                session.ownership.release()


def _start_session(experiment: ExperimentConfig, runs_dir: Path, clock: _PhaseClock, steps: StepProgress, log,
                   chatter, extra_tags: dict | None) -> RunSession:
    """The run's resolved model and its folder, once it is known to fit in memory."""
    model_config = resolve_model(experiment)
    check_fits(experiment, model_config)
    if experiment.train.compile and (why := cannot_compile(experiment.train.accelerator)):
        log(f"train.compile: {why}; training eager")
        experiment = experiment.with_train(compile=False)
    _set_threads(experiment.train.threads)
    digest = spec_hash(experiment)
    run_dir = runs_dir / experiment.name / f"{experiment.variant}-s{experiment.seed}-{digest}"
    return RunSession(experiment, model_config, runs_dir, run_dir, digest, clock, steps, log, chatter, extra_tags)


def _attach_trainer(session: RunSession, lease: Lease | None, bar: bool, extra_callbacks: tuple) -> None:
    """The Trainer, its callbacks and this process's rank; on ranks other than 0, silence and no ownership.

    The Trainer comes first, with no logger, because it knows this process's global rank before anything is written:
    NODE_RANK x devices + LOCAL_RANK under Lightning's own launcher, SLURM_PROCID under srun, RANK under torchrun.
    (`rank_zero_only.rank` as set at import ignores NODE_RANK: it is 0 on the first process of every node under
    Lightning's launcher.) Rank 0 gets the MLflow logger later; the other ranks never open the MLflow store.
    """
    experiment, train = session.experiment, session.experiment.train
    session.stability = StabilityMonitor.from_config(train)
    session.agreement = _RankAgreement(resuming=False)
    ownership = RunOwnership(session.run_dir, lease)
    fence = [OwnershipFence(ownership)] if lease is not None else []
    compiling = []
    if train.compile:
        forget_earlier_graphs()
        compiling.append(CompileReport(share_cache(session.runs_dir), session.chatter))
    precision = resolve_precision(train.precision, train.accelerator, moe=session.model_config.ffn == "moe")
    this_run = ThisRun.of(session.digest, session.model_config)
    began_in = recorded_precision(session.checkpoint, this_run) if train.precision == "auto" else None
    callbacks = [session.agreement, session.stability, *fence, session.steps, *compiling, *extra_callbacks]
    session.trainer = build_trainer(experiment, session.run_dir, callbacks, bar, began_in or precision)
    session.rank = session.trainer.global_rank
    if session.rank:
        session.log = session.chatter = lambda *_: None  # rank 0 says everything once
    else:
        session.ownership = ownership  # rank 0 holds the run for all ranks
    if began_in and began_in != precision:  # a run is never silently changed halfway
        session.log(f"train.precision auto: resuming in {began_in}, the precision this run began in (here auto is "
                    f"{precision})")


def _load_data(session: RunSession, made: list[Path]) -> None:
    """The tokenizer, corpus and domains; rank 0 checks the MLflow store and takes the run folder around it. A failure
    releases the folder and leaves no run folder behind (bad input, a busy run, a dead tracking server)."""
    rank, uri = session.rank, session.uri
    try:
        if rank == 0 and not session.embedded:
            tracking.check_store(uri)  # a dead server or a bad URI, in seconds, before the data is touched
        if rank == 0:
            session.ownership.acquire()
        session.tokenizer, session.corpus, session.domains = load_data(session.experiment, log=session.chatter,
                                                                       warn=session.log)
        if rank == 0 and session.embedded:  # made only once the data is ready: bad input leaves no runs/ behind
            session.runs_dir.mkdir(parents=True, exist_ok=True)
            tracking.check_store(uri)
    except BaseException:
        if session.ownership is not None:
            session.ownership.release()
        _remove_if_left_empty(made)  # bad input or a busy run leaves no run folder behind
        raise


def _folders_to_make(run_dir: Path) -> list[Path]:
    """`run_dir` and those of its parents that do not exist yet, deepest first."""
    return [folder for folder in (run_dir, *run_dir.parents) if not folder.exists()]


def _remove_if_left_empty(folders: list[Path]) -> None:
    if folders:
        (folders[0] / "owner.lock").unlink(missing_ok=True)
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:  # not empty (another process wrote there meanwhile) or already gone: leave it
            return


def _train_and_record(session: RunSession) -> RunResult:
    checkpoint = session.checkpoint
    if session.rank == 0:
        remove_unfinished_writes(session.run_dir, session.log)
        found = checkpoint.exists()
        resuming = set_aside_unless_resumable(checkpoint, ThisRun.of(session.digest, session.model_config),
                                              session.log)
        session.set_aside = found and not resuming
    else:
        resuming = checkpoint.exists()
    session.resuming = session.agreement.resuming = resuming
    # Done already (a worker killed after the run ended, before its ledger heard): never a second run.
    if session.rank == 0 and _open_tracked(session) is not None and _alone_until_fit(session.trainer):
        return session.agreement.recorded  # no other rank exists yet, and none will: `fit` is not called
    tracked = session.tracked
    try:
        return _fit_and_record(session)
    except Interrupted:
        if tracked is not None and tracked.run_id is not None:
            tracked.close_interrupted()
        raise
    except RunTakenOver:
        raise  # the run is another process's now: write nothing
    except Exception:
        if tracked is not None and tracked.run_id is not None and session.agreement.recorded is None:
            tracked.close_failed()
        raise


def _open_tracked(session: RunSession) -> RunResult | None:
    """Rank 0: the run's MLflow run, found ended already (its result, returned) or opened and made the trainer's
    logger, its id told to the other ranks through `_RankAgreement`."""
    experiment, agreement = session.experiment, session.agreement
    tracked = session.tracked = TrackedRun(session.uri, session.runs_dir,
                                           experiment.tracking.experiment or experiment.name, session.digest,
                                           unsent_path=session.run_dir / "unsent-metrics.jsonl")
    tracked.writes_allowed = session.ownership.held
    agreement.recorded = _recorded_outcome(tracked)
    if agreement.recorded is not None:
        session.log(f"{experiment.variant} seed {experiment.seed} is already {agreement.recorded.status} in MLflow "
                    f"run {tracked.run_id}")
        return agreement.recorded
    _open_run(session)
    if session.resuming:
        session.log(f"resuming {session.run_dir} from {session.checkpoint} into MLflow run {tracked.run_id}")
    session.trainer.logger = tracked.logger
    agreement.run_id = tracked.run_id
    return None


def _fit_and_record(session: RunSession) -> RunResult:
    trainer, stability, rank, digest = session.trainer, session.stability, session.rank, session.digest
    session.module, data = _module_and_data(session.experiment, session.model_config, session.corpus, session.domains)
    session.clock.phase_ended("setup")
    try:
        trainer.fit(session.module, datamodule=data, ckpt_path=str(session.checkpoint) if session.resuming else None)
    except _AlreadyRecorded:  # rank 0 found it done in MLflow, and other ranks were already running (see above)
        return replace(session.agreement.recorded, global_rank=rank)
    except RunPruned as pruned:  # a search stopped this run early: a result, not a crash
        session.clock.training_ended(trainer)
        if rank == 0:
            _record_pruned(session)
        session.log(f"run pruned at step {trainer.global_step}: {pruned}")
        return RunResult("pruned", session.agreement.run_id, digest, global_rank=rank)
    session.clock.training_ended(trainer)
    run_id = session.agreement.run_id  # rank 0's, broadcast to every rank in `setup`
    _keep_the_last_steps(session)

    if stability.diverged_step is not None:  # every rank sees the same synced loss, so every rank agrees
        if rank == 0:
            _record_diverged(session)
        session.log(f"run diverged at step {stability.diverged_step}: recorded as diverged in MLflow run {run_id}")
        return RunResult("diverged", run_id, digest, diverged_step=stability.diverged_step, global_rank=rank)
    if rank:
        return RunResult("finished", run_id, digest, global_rank=rank)  # rank 0 evaluates and records
    metrics = _record_finished(session)
    return RunResult("finished", run_id, digest, metrics | session.clock.seconds)


def _keep_the_last_steps(session: RunSession) -> None:
    """After `fit`: the checkpoint of the last step, and the training metrics a tracking outage held back."""
    trainer = session.trainer
    if session.ownership is not None:  # a process paused through the end of training must not overwrite its successor
        session.ownership.check()
    if session.stability.diverged_step is None and trainer.global_step % session.experiment.train.checkpoint_every:
        # ModelCheckpoint(every_n_train_steps) writes last.ckpt on multiples of checkpoint_every only (Lightning 2.6's
        # on_train_end skips its save once one was written): without this, `gatelab eval` would score the weights of
        # some steps before the end. Every rank calls it; rank 0 writes.
        trainer.save_checkpoint(session.checkpoint, weights_only=False)  # the full state, as ModelCheckpoint writes it
    if session.tracked is not None:  # raises, the checkpoint kept, if the outage lasts
        session.tracked.flush()


def initial_attention_scale(experiment: ExperimentConfig) -> float:
    """The attention output's RMS at step 0 of `experiment`'s run, made again without training: the same seeded
    initialisation and first training batch as `run` (the metric `init/attn_output_rms` that runs log since issue 34;
    for runs recorded before, `experiments/backfill_init_scale.py` logs this). fp32 on the CPU."""
    from gatelab.eval.probes import attention_output_rms
    from gatelab.train.module import StepBatches

    _, corpus, domains = load_data(experiment, log=lambda line: None, warn=lambda line: None)
    model_config = resolve_model(experiment)
    module, data = _module_and_data(experiment, model_config, corpus, domains)
    input_ids_BT, _ = StepBatches(data.windows, experiment.train.batch_size, 1, 0).batch(0)
    return attention_output_rms(module.model, input_ids_BT)
