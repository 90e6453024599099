"""`run(experiment)`: one experiment in, one finished MLflow run out, resumable from its last checkpoint."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import lightning as L
import numpy as np
import optuna
import torch
from lightning.pytorch.callbacks import ModelCheckpoint, TQDMProgressBar
from lightning.pytorch.loggers import MLFlowLogger

from gatelab import tracking
from gatelab.config import ExperimentConfig, flatten, spec_hash, to_yaml
from gatelab.data.corpora import prepare_corpora
from gatelab.data.datasets import heldout_windows, tokenize_corpus, train_dataset
from gatelab.data.tokenizer import load_or_train_tokenizer
from gatelab.errors import GatelabError
from gatelab.model import count_parameters, resolve_model
from gatelab.train.module import GatedLM, StabilityMonitor, TextData, resolve_precision


@dataclass
class RunResult:
    status: str  # finished / diverged / pruned
    run_id: str
    spec_hash: str
    metrics: dict[str, float] = field(default_factory=dict)
    diverged_step: int | None = None


def load_data(experiment: ExperimentConfig, log=print, warn=print):
    """Corpora, tokenizer and token streams, each prepared once and cached under the data directory.

    `warn` reports what changes the result (a missing domain) even when `log` is silenced.
    """
    data = experiment.data
    manifest = prepare_corpora(data.data_dir, [d for d in data.domains if d not in data.user_files], log=log)
    if data.user_files:
        from gatelab.data.corpora import domains_from_files

        manifest = domains_from_files(data.user_files, data.data_dir, log=log)
    present = [d for d in data.domains if d in manifest.available_domains]
    missing = [d for d in data.domains if d not in present]
    if missing:
        warn(f"domains missing, carrying on without them: {', '.join(missing)} (run `gatelab data prepare` to see why)")
    if not present:
        raise GatelabError(f"data.domains: none of {', '.join(data.domains)} could be prepared")
    tokenizer = load_or_train_tokenizer(manifest, experiment.model.vocab_size, domains=present, log=log)
    corpus = tokenize_corpus(manifest, tokenizer, present, log=log)
    return tokenizer, corpus, present


def _quiet_lightning() -> None:
    """Keep Lightning's start-up banners (accelerator, tips) and two known upstream warnings out of sweep logs."""
    import logging
    import warnings

    logging.getLogger("lightning.pytorch.utilities.rank_zero").setLevel(logging.WARNING)
    logging.getLogger("lightning.pytorch.accelerators.cuda").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)` is deprecated.*")
    # bf16 autocast hands nn.RMSNorm bf16 input with an fp32 weight; torch then takes its unfused path (a speed
    # matter, measured in the performance issue), and says so on every run.
    warnings.filterwarnings("ignore", message=r"Mismatch dtype between input and weight.*")


def run(experiment: ExperimentConfig, tracking_uri: str | None = None, runs_dir: Path = Path("runs"),
        quiet: bool = False, log=print, extra_callbacks: tuple = (), extra_tags: dict | None = None) -> RunResult:
    train = experiment.train
    if quiet:
        _quiet_lightning()
    if train.threads:
        torch.set_num_threads(train.threads)
    model_config = resolve_model(experiment)
    digest = spec_hash(experiment)
    run_dir = runs_dir / experiment.name / f"{experiment.variant}-s{experiment.seed}-{digest}"
    run_dir.mkdir(parents=True, exist_ok=True)

    tokenizer, corpus, domains = load_data(experiment, log=log if not quiet else (lambda *_: None), warn=log)

    uri = tracking_uri or experiment.tracking.uri or tracking.default_tracking_uri(runs_dir)
    client = tracking.MlflowClient(uri)
    experiment_name = experiment.tracking.experiment or experiment.name
    experiment_id = tracking.experiment_id(client, experiment_name, runs_dir)
    checkpoint = run_dir / "checkpoints" / "last.ckpt"
    run_id = tracking.find_run(client, experiment_id, digest)
    if run_id is not None:
        recorded = client.get_run(run_id)
        outcome = recorded.data.tags.get(tracking.STATUS_TAG)
        if recorded.info.status == "FINISHED" and outcome in ("finished", "diverged"):
            # Done already (a worker killed after the run ended, before its ledger heard): never a second run.
            log(f"{experiment.variant} seed {experiment.seed} is already {outcome} in MLflow run {run_id}")
            step = recorded.data.metrics.get("diverged_step")
            return RunResult(outcome, run_id, digest, dict(recorded.data.metrics),
                             int(step) if step is not None else None)
    if run_id is not None and not checkpoint.exists():
        # The run started elsewhere (another machine's checkpoint folder) or lost its checkpoint: it starts again
        # from step 0 in a new MLflow run, and an old one that was cut off is closed as KILLED, not left RUNNING.
        if client.get_run(run_id).info.status == "RUNNING":
            client.set_tag(run_id, tracking.STATUS_TAG, "superseded")
            client.set_terminated(run_id, "KILLED")
        run_id = None
    tags = {tracking.SPEC_HASH_TAG: digest, tracking.STATUS_TAG: "running", "variant": experiment.variant,
            "seed": str(experiment.seed), "experiment": experiment.name, **tracking.code_version(),
            "gatelab.spike_definition": f"loss > EMA(beta={train.spike_ema}) of earlier losses + {train.spike_margin} "
                                        f"nats, after {train.warmup_steps} warmup steps",
            "gatelab.divergence_definition": f"non-finite loss, or loss > {train.divergence_factor} x EMA after warmup",
            **tracking.package_versions(), **(extra_tags or {})}
    logger = MLFlowLogger(experiment_name=experiment_name, tracking_uri=uri, run_id=run_id, tags=tags,
                          run_name=f"{experiment.variant}-s{experiment.seed}")
    run_id = logger.run_id
    if checkpoint.exists():
        log(f"resuming {run_dir} from {checkpoint} into MLflow run {run_id}")
    else:
        params = flatten(experiment) | {f"resolved.{k}": v for k, v in flatten(model_config.model_dump(mode='json')).items()
                                       if k in ("gates", "n_heads", "n_kv_heads", "ffn_hidden")}
        params["model.total_params"] = count_parameters(model_config)
        logger.log_hyperparams({k: str(v)[:500] for k, v in params.items()})
        client.log_text(run_id, to_yaml(experiment), "config/experiment.yaml")
        client.log_text(run_id, to_yaml(model_config), "config/model_resolved.yaml")

    L.seed_everything(experiment.seed, workers=True, verbose=False)
    module = GatedLM(experiment, model_config)
    stability = StabilityMonitor(train.warmup_steps, train.spike_ema, train.spike_margin, train.divergence_factor)
    callbacks = [stability, *extra_callbacks]
    every = experiment.eval.every_n_steps
    validation = None
    if every:
        validation = torch.cat([torch.from_numpy(heldout_windows(corpus, d, experiment.data.seq_len,
                                                                 experiment.eval.max_windows_per_domain))
                                for d in domains])
    checkpoints = ModelCheckpoint(dirpath=run_dir / "checkpoints", every_n_train_steps=train.checkpoint_every,
                                  save_last=True, save_top_k=0)
    trainer = L.Trainer(
        max_steps=train.max_steps, accelerator=train.accelerator, devices=train.devices, num_nodes=train.num_nodes,
        strategy=train.strategy, precision=resolve_precision(train.precision, train.accelerator),
        gradient_clip_val=train.grad_clip or None, logger=logger, log_every_n_steps=train.log_every,
        callbacks=callbacks + [checkpoints] + ([] if quiet else [TQDMProgressBar(refresh_rate=10)]),
        enable_progress_bar=not quiet, enable_model_summary=False, num_sanity_val_steps=0,
        limit_val_batches=1.0 if every else 0, check_val_every_n_epoch=1,
        default_root_dir=run_dir, deterministic=False,
    )
    windows = train_dataset(corpus, experiment.data.seq_len, experiment.seed, domains)
    data = TextData(windows, train.batch_size, every or train.max_steps, validation)
    try:
        trainer.fit(module, datamodule=data, ckpt_path=str(checkpoint) if checkpoint.exists() else None)
    except optuna.TrialPruned as pruned:  # an Optuna search stopped this run early: a result, not a crash
        client.set_tag(run_id, tracking.STATUS_TAG, "pruned")
        client.log_metric(run_id, "pruned_step", trainer.global_step)
        logger.finalize("success")
        log(f"run pruned at step {trainer.global_step}: {pruned}")
        return RunResult("pruned", run_id, digest)

    if stability.diverged_step is not None:
        client.log_metric(run_id, "diverged_step", stability.diverged_step)
        client.set_tag(run_id, tracking.STATUS_TAG, "diverged")
        logger.finalize("success")
        log(f"run diverged at step {stability.diverged_step}: recorded as diverged in MLflow run {run_id}")
        return RunResult("diverged", run_id, digest, diverged_step=stability.diverged_step)

    from gatelab.train.evaluate import evaluate  # evaluation imports plotting; keep it off the training path

    metrics, artifacts = evaluate(module.model, experiment, tokenizer, corpus, domains,
                                  client.get_metric_history(run_id, "train/loss"), stability.spikes)
    for name, value in metrics.items():
        if value is not None and np.isfinite(value):
            client.log_metric(run_id, name, float(value), step=trainer.global_step)
    with tempfile.TemporaryDirectory() as folder:
        for name, write in artifacts.items():
            path = Path(folder) / name
            write(path)
            client.log_artifact(run_id, str(path), "eval")
    client.set_tag(run_id, tracking.STATUS_TAG, "finished")
    logger.finalize("success")
    return RunResult("finished", run_id, digest, metrics)

