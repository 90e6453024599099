"""The training steps the bench times: gatelab's model in a plain PyTorch loop (eager, compiled, with CUDA graphs),
gatelab's real Lightning training, and transformers' Qwen3 at the same shapes; and the loss curves that check the
step's numerics. Training data are random tokens: a step's cost does not depend on them, and no corpus is needed."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from pathlib import Path

import numpy as np
import torch

from gatelab import tracking
from gatelab.bench.machine import bench_device, synchronize
from gatelab.config import ExperimentConfig
from gatelab.data.datasets import PackedDataset
from gatelab.model import build_model, resolve_model
from gatelab.progress import silence_noise
from gatelab.store_uris import default_tracking_uri
from gatelab.train.head_loss import next_token_loss

PEER_LABEL = "transformers Qwen3ForCausalLM"


def random_windows(vocab_size: int, seq_len: int, seed: int = 0, tokens: int = 1 << 20):
    """A PackedDataset over random tokens: the training stream gatelab's data module serves, without a corpus."""
    stream = np.random.default_rng(seed).integers(0, vocab_size, tokens, dtype=np.int64).astype(np.int32)
    return PackedDataset({"random": stream}, seq_len, seed)


def batch_stream(experiment: ExperimentConfig):
    """gatelab's own step-indexed batches (the same for every harness), endless."""
    from gatelab.train.module import StepBatches

    windows = random_windows(experiment.model.vocab_size, experiment.data.seq_len, experiment.seed)
    batches = StepBatches(windows, experiment.train.batch_size, 1 << 30, lambda: 0)
    return iter(batches)


def matmul_dtype(precision: str) -> torch.dtype:
    """The dtype matmuls run in under a Lightning precision setting."""
    return {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision, torch.float32)


def autocast(precision: str):
    dtype = matmul_dtype(precision)
    return torch.autocast(bench_device().type, dtype=dtype, enabled=dtype != torch.float32)


def plain_step(experiment: ExperimentConfig, precision: str) -> Callable[[], None]:
    """A plain PyTorch training step on gatelab's model: the same init, loss, AdamW groups, schedule and clipping as
    gatelab's LightningModule (its `training_loss`, blocks compiled where `train.compile`), none of Lightning's
    machinery."""
    from gatelab.train.module import GatedLM

    experiment = experiment.with_train(precision=precision)
    module = GatedLM(experiment, resolve_model(experiment)).to(bench_device())
    optimizers = module.configure_optimizers()  # as Lightning's at this precision (fused AdamW where it may be)
    optimizer, schedule = optimizers["optimizer"], optimizers["lr_scheduler"]["scheduler"]
    return scaled_step(experiment, precision, module, lambda *batch: module.training_loss(*batch)[1], optimizer,
                       schedule)


def scaled_step(experiment: ExperimentConfig, precision: str, model: torch.nn.Module, loss: Callable,
                optimizer: torch.optim.Optimizer, schedule=None) -> Callable[[], None]:
    """A step as Lightning takes it at `precision`: `loss` of the next batch under autocast, scaled where fp16,
    clipped at `train.grad_clip`, then the optimizer's step and the schedule's, if any."""
    batches, clip = batch_stream(experiment), experiment.train.grad_clip
    scaler = torch.amp.GradScaler(enabled=precision == "16-mixed")

    def step() -> None:
        input_ids_BT, targets_BT = (t.to(bench_device(), non_blocking=True) for t in next(batches))
        with autocast(precision):
            total = loss(input_ids_BT, targets_BT)
        scaler.scale(total).backward()
        if clip:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        scaler.step(optimizer)
        scaler.update()
        if schedule is not None:
            schedule.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def cuda_graph_step(experiment: ExperimentConfig, precision: str) -> Callable[[], None] | str:
    """`plain_step` compiled with `train.compile_mode: reduce-overhead` (CUDA graphs), after two steps that record
    and replay its graphs; or why it cannot run (CUDA graph trees refuse some programs: the bench goes on without)."""
    try:
        step = plain_step(experiment.with_train(compile=True, compile_mode="reduce-overhead"), precision)
        for _ in range(2):
            step()
        synchronize()
        return step
    except Exception as error:  # noqa: BLE001 - any failure of CUDA graphs is a finding to report, not a crash
        torch.cuda.empty_cache()
        return f"not timed: train.compile_mode reduce-overhead failed ({type(error).__name__}: {str(error)[:200]})"


def block_graphs(experiment: ExperimentConfig, precision: str) -> dict:
    """How dynamo splits a compiled block of the experiment's model: `torch._dynamo.explain` on its first block (every
    block has the same code and shapes), one row of the preset's length under the preset's autocast. Each break is a
    return to Python and a graph boundary inductor cannot fuse across (issue 41: `sdpa_layout`'s storage offset split
    every block in 6). `explain` resets dynamo: call it before anything of the preset compiles."""
    model = build_model(resolve_model(experiment), experiment.seed, bench_device())
    x_BTD = torch.randn(1, experiment.data.seq_len, model.config.d_model, device=bench_device())
    with autocast(precision):
        explained = torch._dynamo.explain(model.blocks[0])(x_BTD, model.rotary.cos_sin(x_BTD.shape[1], x_BTD.device))
    reasons: dict[str, int] = {}  # "why (at file:line)" -> how many breaks
    for reason in explained.break_reasons:
        where = reason.user_stack[-1] if reason.user_stack else None
        at = f" (at {Path(where.filename).name}:{where.lineno})" if where else ""
        why = str(reason.reason).strip().splitlines()[0] + at
        reasons[why] = reasons.get(why, 0) + 1
    return {"graphs": explained.graph_count, "graph_breaks": explained.graph_break_count, "break_reasons": reasons}


def loss_curves(experiment: ExperimentConfig, steps: int = 50, rows: int | None = None) -> dict:
    """Per-step training losses of `steps` steps on the same batches: the step as it was before the faster one (whole
    logits and fp32 cross-entropy, torch's per-parameter AdamW, eager), and gatelab's step eager and compiled. Returns
    the curves and each one's largest relative difference to the one before. In fp32 whatever the preset's precision:
    a check of the step's numerics, which bf16 rounding would drown. `rows`: batches of that many rows instead of the
    preset's (GPU_FP32_ROWS on a GPU)."""
    from gatelab.train.module import GatedLM

    experiment = experiment.with_train(precision="32-true", batch_size=rows or experiment.train.batch_size)

    def curve(compile: bool, before: bool) -> list[float]:
        module = GatedLM(experiment.with_train(compile=compile), resolve_model(experiment)).to(bench_device())
        optimizers = module.configure_optimizers()
        optimizer, schedule = optimizers["optimizer"], optimizers["lr_scheduler"]["scheduler"]
        if before:
            groups = [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in optimizer.param_groups]
            optimizer = torch.optim.AdamW(groups, lr=experiment.train.lr, betas=experiment.train.betas, foreach=False)
            schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule.lr_lambdas[0])
        losses = []

        def total_loss(input_ids_BT: torch.Tensor, targets_BT: torch.Tensor) -> torch.Tensor:
            if before:
                logits_BTV, aux = module.model.forward_with_aux(input_ids_BT)
                loss = next_token_loss(logits_BTV, targets_BT)
                total = module.with_aux_losses(loss, aux)
            else:
                loss, total, _ = module.training_loss(input_ids_BT, targets_BT)
            losses.append(loss.item())
            return total

        step = scaled_step(experiment, "32-true", module, total_loss, optimizer, schedule)
        for _ in range(steps):
            step()
        return losses

    before = curve(compile=False, before=True)
    curves = {"before": before, "eager": curve(compile=False, before=False), "compiled": curve(compile=True,
                                                                                            before=False)}
    return {"steps": steps, "batch_size": experiment.train.batch_size, "curves": curves,
            "max_relative_difference": {name: max(abs(a - b) / abs(a) for a, b in zip(before, losses))
                                        for name, losses in curves.items() if name != "before"}}


def step_timer():
    """A Lightning callback whose `starts` are the times each training batch started: the whole step from one to the
    next, with everything Lightning does. Made here, not at import: a bad argument to `gatelab bench` is answered
    without Lightning's imports."""
    import lightning as L

    class StepTimer(L.Callback):
        def __init__(self) -> None:
            self.starts: list[float] = []

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            synchronize()
            self.starts.append(time.perf_counter())

    return StepTimer()


def lightning_steps(experiment: ExperimentConfig, precision: str, steps: int, folder: Path,
                    callbacks: Collection = ()) -> list[float]:
    """Seconds per step of gatelab's Lightning training: its module, data module, Trainer settings, stability monitor
    and an MLflow logger writing to a SQLite store, as in `gatelab train` (quiet, no checkpoint)."""
    import lightning as L  # here, not at the top: a bad argument to `gatelab bench` is answered without Lightning

    from gatelab.train.module import GatedLM, StabilityMonitor, TextData

    silence_noise()
    train = experiment.train
    timer = step_timer()
    uri = default_tracking_uri(folder, create=False, as_written=True)
    # made here, as `gatelab train` does: Lightning's logger would make it too, with a warning line
    tracking.RunStore(uri, folder).experiment_id("bench")
    logger = tracking.lightning_logger("bench", uri)
    trainer = L.Trainer(
        max_steps=steps, accelerator=train.accelerator, devices=1, precision=precision,
        gradient_clip_val=train.grad_clip or None, logger=logger, log_every_n_steps=train.log_every,
        callbacks=[StabilityMonitor.from_config(train), timer, *callbacks],
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=0,
        limit_val_batches=0, default_root_dir=folder, use_distributed_sampler=False,
    )
    module = GatedLM(experiment, resolve_model(experiment))
    windows = random_windows(experiment.model.vocab_size, experiment.data.seq_len, experiment.seed)
    trainer.fit(module, datamodule=TextData(windows, train.batch_size, steps))
    return list(np.diff(timer.starts))


def fits_in_memory(step: Callable[[], None]) -> bool:
    """Whether one step runs without running out of GPU memory. For transformers' Qwen3 step on a GPU: gatelab's own
    small step peaks at about 51 GB of an H100's 80, and Qwen3's at that batch has not been measured (its RMSNorm
    upcasts to fp32), so a peer that does not fit is left out instead of ending the bench."""
    try:
        step()
    except torch.cuda.OutOfMemoryError:
        return False
    return True


def transformers_step(experiment: ExperimentConfig, precision: str) -> Callable[[], None] | None:
    """A training step of transformers' Qwen3ForCausalLM (the library a user would otherwise pick) at the preset's
    shapes: the same batches, loss (fp32 cross-entropy of the logits), AdamW, clipping and precision, eager as
    transformers runs by default. None where transformers is not installed (`pip install -e ".[compare]"`) or the
    preset is not a plain dense Qwen3 (MoE FFN, sandwich norm, no QK-norm)."""
    try:
        from transformers import Qwen3Config, Qwen3ForCausalLM
    except ImportError:
        return None
    model = experiment.model
    if model.ffn != "dense" or model.sandwich_norm or not model.qk_norm:
        return None
    config = Qwen3Config(
        vocab_size=model.vocab_size, hidden_size=model.d_model, intermediate_size=model.ffn_hidden,
        num_hidden_layers=model.n_layers, num_attention_heads=model.n_heads, num_key_value_heads=model.n_kv_heads,
        head_dim=model.head_dim, tie_word_embeddings=model.tie_embeddings, rms_norm_eps=model.norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": model.rope_base}, use_cache=False,
        attn_implementation="sdpa", max_position_embeddings=experiment.data.seq_len)
    peer = Qwen3ForCausalLM(config).to(bench_device()).train()
    train = experiment.train
    optimizer = torch.optim.AdamW(peer.parameters(), lr=train.lr, betas=train.betas, weight_decay=train.weight_decay)

    def loss(input_ids_BT: torch.Tensor, targets_BT: torch.Tensor) -> torch.Tensor:
        return next_token_loss(peer(input_ids=input_ids_BT).logits, targets_BT)

    return scaled_step(experiment, precision, peer, loss, optimizer)
