"""`run(experiment)`: one experiment in, one finished MLflow run out, resumable from its last checkpoint.

A `Run` is built whole before it trains (`Run.__init__`: the resolved model, the Trainer, the run folder held, the
data, rank 0's MLflow run) and then trains, evaluates and records (`Run.fit`). What it uses lives beside it in
gatelab.train: rank agreement (rank_agreement), progress (step_progress), the phase clock (phases), MLflow
(recording).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from tokenizers import Tokenizer

from gatelab.config import ExperimentConfig, ModelConfig
from gatelab.data.datasets import TokenCorpus, evaluation_windows, heldout_windows, train_dataset
from gatelab.data.identity import spec_hash
from gatelab.data.prepare import load_data
from gatelab.errors import GatelabError
from gatelab.eval.probes import attention_output_rms
from gatelab.host import cannot_compile, resolve_precision
from gatelab.interrupts import Interrupted, raise_on_signals
from gatelab.metrics import SETUP_S
from gatelab.model import resolve_model
from gatelab.progress import progress_every_s, silence_noise
from gatelab.store_checks import check_store
from gatelab.store_uris import run_tracking_uri
from gatelab.tracked_run import TrackedRun
from gatelab.tracking import code_version
from gatelab.train.checkpoints import (
    DurableCheckpointIO,
    PublishAfterStepMetrics,
    ThisRun,
    recorded_precision,
    remove_unfinished_writes,
    set_aside_unless_resumable,
)
from gatelab.train.compiling import CompileReport, forget_earlier_graphs, share_cache
from gatelab.train.memory import check_fits
from gatelab.train.module import GatedLM, StabilityMonitor, StepBatches, TextData
from gatelab.train.ownership import Lease, OwnershipFence, RunOwnership, RunTakenOver
from gatelab.train.phases import PhaseClock
from gatelab.train.rank_agreement import AlreadyRecorded, RankAgreement, alone_until_fit
from gatelab.train.recording import (
    open_run,
    record_diverged,
    record_finished,
    record_pruned,
    recorded_outcome,
)
from gatelab.train.result import RunPruned, RunResult
from gatelab.train.step_progress import StepBar, StepProgress, above_the_bar


def run(experiment: ExperimentConfig, tracking_uri: str | None = None, runs_dir: Path = Path("runs"),
        quiet: bool = False, log=print, extra_callbacks: tuple = (), extra_tags: dict | None = None,
        lease: Lease | None = None, bar: bool | None = None, model_config: ModelConfig | None = None) -> RunResult:
    """Train, evaluate and record one run; under DDP this runs on every rank, and only rank 0 touches MLflow.

    It says what it does (data preparation, progress, each part of the evaluation) through `log`, unless `quiet`.
    Progress is Lightning's bar where `bar` (by default: where stdout is a terminal), else a plain line every
    GATELAB_PROGRESS_EVERY seconds (30), which a log file keeps. `model_config`: the experiment's resolved model, where
    the caller resolved it already (`gatelab train` does, to answer a bad variant before Lightning is imported).

    Nothing is allocated, prepared or opened before the run is known to fit in memory (`check_fits`), and one process
    at a time trains it (`RunOwnership`: a second one raises RunInProgress; a sweep worker that lost its `lease` raises
    RunTakenOver without writing again). SIGINT/SIGTERM raise `Interrupted` after the MLflow run is closed as KILLED.
    """
    load_training_code()
    with raise_on_signals():
        training = Run(experiment, tracking_uri=tracking_uri, runs_dir=runs_dir, quiet=quiet, log=log,
                       extra_callbacks=extra_callbacks, extra_tags=extra_tags, lease=lease, bar=bar,
                       model_config=model_config)
        try:
            return training.fit()
        finally:
            training.release()


def load_training_code() -> None:
    """Import what a run loads late (evaluation, which brings plotting; the metric outbox), then read the code version
    (`tracking.code_version`, read once a process): the code a run records is then the code that runs, whatever the
    tree becomes while it, or a worker's later runs, work."""
    import gatelab.metric_outbox  # noqa: F401
    import gatelab.train.evaluate  # noqa: F401

    code_version()


def _silent(*_) -> None:
    return None


class Run:
    """One run, built whole: everything that can exist before `fit` is made here, once, and never replaced.

    Only rank 0 holds the folder (`ownership`, for every rank), decides whether to resume, opens the MLflow run
    (`tracked`, the Trainer's logger) and says anything. The folder is held from here until `release`.
    """

    def __init__(self, experiment: ExperimentConfig, *, tracking_uri: str | None = None, runs_dir: Path = Path("runs"),
                 quiet: bool = False, log: Callable[[str], object] = print, extra_callbacks: tuple = (),
                 extra_tags: dict | None = None, lease: Lease | None = None, bar: bool | None = None,
                 model_config: ModelConfig | None = None) -> None:
        self.clock = PhaseClock()
        _check_strategy(experiment)
        silence_noise()  # here, not only in the command: Lightning's own import resets its loggers to INFO
        bar = not quiet and (sys.stdout.isatty() if bar is None else bar)
        log = above_the_bar(log) if bar else log
        chatter = _silent if quiet else log
        self.steps = StepProgress(chatter, every_s=None if quiet or bar else progress_every_s())
        self.model_config = model_config or resolve_model(experiment)
        check_fits(experiment, self.model_config)
        if experiment.train.compile and (why := cannot_compile(experiment.train.accelerator)):
            log(f"train.compile: {why}; training eager")
            experiment = experiment.with_train(compile=False)
        _set_threads(experiment.train.threads)
        self.experiment = experiment
        self.digest = spec_hash(experiment)
        self.runs_dir = runs_dir
        self.run_dir = runs_dir / experiment.name / f"{experiment.variant}-s{experiment.seed}-{self.digest}"
        self.checkpoint = self.run_dir / "checkpoints" / "last.ckpt"
        self.this_run = ThisRun.of(self.digest, self.model_config)  # what a checkpoint must match to resume this run
        self.extra_tags = extra_tags

        self.stability = StabilityMonitor.from_config(experiment.train)
        ownership = RunOwnership(self.run_dir, lease)
        self.trainer, began_in, precision = self._trainer(ownership, lease, bar, extra_callbacks, chatter)
        self.rank = self.trainer.global_rank
        self.log, self.chatter = (_silent, _silent) if self.rank else (log, chatter)  # rank 0 says everything once
        self.ownership = None if self.rank else ownership  # rank 0 holds the run for all ranks
        if began_in and began_in != precision:  # a run is never silently changed halfway
            self.log(f"train.precision auto: resuming in {began_in}, the precision this run began in (here auto is "
                     f"{precision})")

        uri = run_tracking_uri(tracking_uri, experiment, runs_dir, create=False)
        self.tokenizer, self.corpus, self.domains = self._data(uri, embedded=not (tracking_uri or
                                                                                   experiment.tracking.uri))
        try:
            self.resuming, self.set_aside = self._resume_or_set_aside()
            self.tracked = None if self.rank else self._tracked_run(uri)
            # Done already (a worker killed after the run ended, before its ledger heard): never a second run.
            self.recorded = None if self.tracked is None else recorded_outcome(self.tracked)
            if self.recorded is not None:
                self.log(f"{experiment.variant} seed {experiment.seed} is already {self.recorded.status} in MLflow "
                         f"run {self.tracked.run_id}")
            opens = self.tracked is not None and self.recorded is None
            self.continuing = opens and self._open_tracked()
            self.agreement = RankAgreement(self.resuming, self.recorded, self.tracked.run_id if opens else "")
            self.trainer.callbacks.insert(0, self.agreement)  # first: every rank hears rank 0 before anything else
        except BaseException:
            self.release()
            raise

    def _trainer(self, ownership: RunOwnership, lease: Lease | None, bar: bool, extra_callbacks: tuple,
                 chatter: Callable[[str], object]) -> tuple[L.Trainer, str | None, str]:
        """The Trainer, its callbacks, the precision it trains in (and the one a checkpoint began in, if any).

        The Trainer comes first, with no logger, as it knows this process's global rank before anything is written
        (`rank_zero_only.rank` as set at import ignores NODE_RANK, so is 0 on the first process of every node).
        """
        train = self.experiment.train
        fence = [OwnershipFence(ownership)] if lease is not None else []
        compiling = []
        if train.compile:
            forget_earlier_graphs()
            compiling.append(CompileReport(share_cache(self.runs_dir), chatter))
        precision = resolve_precision(train.precision, train.accelerator, moe=self.model_config.ffn == "moe")
        began_in = recorded_precision(self.checkpoint, self.this_run) if train.precision == "auto" else None
        callbacks = [self.stability, *fence, self.steps, *compiling, *extra_callbacks]
        return build_trainer(self.experiment, self.run_dir, callbacks, bar, began_in or precision), began_in, precision

    def _data(self, uri: str, embedded: bool) -> tuple[Tokenizer | None, TokenCorpus, list[str]]:
        """The tokenizer, corpus and domains; rank 0 checks the MLflow store and takes the run folder around it.
        `embedded`: the store is the default one under runs_dir."""
        made = _folders_to_make(self.run_dir)
        try:
            if self.rank == 0 and not embedded:
                check_store(uri)  # a dead server or a bad URI, in seconds, before the data is touched
            if self.rank == 0:
                self.ownership.acquire()
            data = load_data(self.experiment, log=self.chatter, warn=self.log)
            if self.experiment.eval.budget is not None:  # a budget the text cannot fill fails now, not after training
                evaluation_windows(data[1], data[2], self.experiment.eval, self.experiment.data.seq_len, data[0])
            if self.rank == 0 and embedded:  # made only once the data is ready, as bad input leaves no runs/ behind
                self.runs_dir.mkdir(parents=True, exist_ok=True)
                check_store(uri)
            return data
        except BaseException:
            self.release()
            _remove_if_left_empty(made)  # bad input or a busy run leaves no run folder behind
            raise

    def _resume_or_set_aside(self) -> tuple[bool, bool]:
        """Whether this start resumes from the checkpoint, and whether rank 0 set aside one that could not resume it.
        Other ranks only look: rank 0 tells them its decision in `setup`, and every rank must agree."""
        if self.rank:
            return self.checkpoint.exists(), False
        remove_unfinished_writes(self.run_dir, self.log)
        found = self.checkpoint.exists()
        resuming = set_aside_unless_resumable(self.checkpoint, self.this_run, self.log)
        return resuming, found and not resuming

    def _tracked_run(self, uri: str) -> TrackedRun:
        """Rank 0's MLflow run of this spec hash, not yet opened; it writes only while this process holds the run."""
        experiment = self.experiment
        tracked = TrackedRun(uri, self.runs_dir, experiment.tracking.experiment or experiment.name, self.digest,
                             unsent_path=self.run_dir / "unsent-metrics.jsonl")
        tracked.writes_allowed = self.ownership.held
        return tracked

    def _open_tracked(self) -> bool:
        """Rank 0: open (or continue) the MLflow run and make it the trainer's logger; whether it continues the run of
        an earlier process cut off before its first checkpoint."""
        tracked = self.tracked
        continuing = open_run(tracked, self.experiment, self.model_config, self.trainer, self.resuming,
                              self.set_aside, self.extra_tags, self.log)
        if self.resuming:
            self.log(f"resuming {self.run_dir} from {self.checkpoint} into MLflow run {tracked.run_id}")
        self.trainer.logger = tracked.logger
        return continuing

    def release(self) -> None:
        """Let go of the run folder (rank 0; other ranks never held it)."""
        if self.ownership is not None:
            self.ownership.release()

    def fit(self) -> RunResult:
        """Train, evaluate and record; the run's result, with the steps this session trained and their seconds. A
        failure or an interruption closes rank 0's MLflow run as FAILED or KILLED (a run taken over: nothing is
        written)."""
        if self.recorded is not None and alone_until_fit(self.trainer):
            result = self.recorded  # no other rank exists yet, and none will: `fit` is not called
        else:
            result = self._fit_and_record_closing_on_failure()
        return replace(result, trained_steps=self.steps.steps, train_s=self.steps.train_s)

    def _fit_and_record_closing_on_failure(self) -> RunResult:
        tracked = self.tracked
        try:
            return self._fit_and_record()
        except Interrupted:
            if tracked is not None and tracked.run_id is not None:
                tracked.close_interrupted()
            raise
        except RunTakenOver:
            raise  # the run is another process's now: write nothing
        except Exception:
            if tracked is not None and tracked.run_id is not None and self.recorded is None:
                tracked.close_failed()
            raise

    def _fit_and_record(self) -> RunResult:
        trainer, stability, rank, digest = self.trainer, self.stability, self.rank, self.digest
        module, data = _module_and_data(self.experiment, self.model_config, self.corpus, self.domains)
        self.clock.phase_ended(SETUP_S)
        try:
            trainer.fit(module, datamodule=data, ckpt_path=str(self.checkpoint) if self.resuming else None)
        except AlreadyRecorded:  # rank 0 found it done in MLflow, and other ranks were already running (see above)
            return replace(self.agreement.recorded, global_rank=rank)
        except RunPruned as pruned:  # a search stopped this run early: a result, not a crash
            self.clock.training_ended(trainer)
            if rank == 0:
                record_pruned(self.tracked, self.clock, trainer.global_step)
            self.log(f"run pruned at step {trainer.global_step}: {pruned}")
            return RunResult("pruned", self.agreement.run_id, digest, global_rank=rank)
        self.clock.training_ended(trainer)
        run_id = self.agreement.run_id  # rank 0's, broadcast to every rank in `setup`
        self._keep_the_last_steps()

        logged_before = self.resuming or self.continuing  # some spikes may be in MLflow already
        if stability.diverged_step is not None:  # every rank sees the same synced loss, so every rank agrees
            if rank == 0:
                record_diverged(self.tracked, stability, self.clock, trainer.global_step, logged_before)
            self.log(f"run diverged at step {stability.diverged_step}: recorded as diverged in MLflow run {run_id}")
            return RunResult("diverged", run_id, digest, diverged_step=stability.diverged_step, global_rank=rank)
        if rank:
            return RunResult("finished", run_id, digest, global_rank=rank)  # rank 0 evaluates and records
        metrics = record_finished(self.tracked, self.experiment, module, trainer, self.tokenizer, self.corpus,
                                  self.domains, stability, self.clock, logged_before, self.chatter)
        return RunResult("finished", run_id, digest, metrics | self.clock.seconds)

    def _keep_the_last_steps(self) -> None:
        """After `fit`: the checkpoint of the last step, and the training metrics a tracking outage held back."""
        trainer = self.trainer
        if self.ownership is not None:  # a process paused through the end of training must not overwrite its successor
            self.ownership.check()
        if self.stability.diverged_step is None and trainer.global_step % self.experiment.train.checkpoint_every:
            # ModelCheckpoint(every_n_train_steps) writes last.ckpt on multiples of checkpoint_every only (Lightning
            # 2.6's on_train_end skips its save once one was written). Every rank calls it; rank 0 writes.
            trainer.save_checkpoint(self.checkpoint, weights_only=False)  # the full state, as ModelCheckpoint writes it
        if self.tracked is not None:  # raises, the checkpoint kept, if the outage lasts
            self.tracked.flush()


def _check_strategy(experiment: ExperimentConfig) -> None:
    train = experiment.train
    if train.strategy == "ddp_spawn":
        # Spawned workers train on pickled copies of the callbacks: the recording process never hears of their spikes.
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
        # Every rank validates on all held-out windows, so rank 0's unsynced val/loss is the whole set's; StepBatches
        # slices the training batch by rank itself.
        use_distributed_sampler=False,
        default_root_dir=run_dir, deterministic=False, plugins=[checkpoint_io, *slurm_plugins()],
    )


def slurm_plugins() -> list:
    """In a Slurm job step, Lightning's Slurm environment without its own requeue: a sweep's Slurm task owns Slurm's
    warning signal (gatelab.sweep.slurm), and two requeues of one task would race."""
    from lightning.pytorch.plugins.environments import SLURMEnvironment

    return [SLURMEnvironment(auto_requeue=False)] if SLURMEnvironment.detect() else []


def _module_and_data(experiment: ExperimentConfig, model_config: ModelConfig, corpus: TokenCorpus,
                     domains: list[str]) -> tuple[GatedLM, TextData]:
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


def initial_attention_scale(experiment: ExperimentConfig) -> float:
    """The attention output's RMS at step 0 of `experiment`'s run, made again without training: the same seeded
    initialisation and first training batch as `run` (the metric `init/attn_output_rms` that runs log since issue 34;
    for runs recorded before, `experiments/scripts/backfill_init_scale.py` logs this). fp32 on the CPU."""
    _, corpus, domains = load_data(experiment, log=lambda line: None, warn=lambda line: None)
    model_config = resolve_model(experiment)
    module, data = _module_and_data(experiment, model_config, corpus, domains)
    input_ids_BT, _ = StepBatches(data.windows, experiment.train.batch_size, 1, 0).batch(0)
    return attention_output_rms(module.model, input_ids_BT)
