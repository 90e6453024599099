"""The LightningModule, the DataModule and the callbacks of one gatelab run."""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Iterator

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset

from gatelab import metrics as catalogue
from gatelab.config import ExperimentConfig, ModelConfig, TrainConfig
from gatelab.data.datasets import PackedDataset
from gatelab.data.identity import spec_hash
from gatelab.errors import GatelabError, redact
from gatelab.eval.probes import attention_output_rms
from gatelab.host import resolve_precision
from gatelab.model import build_model
from gatelab.train.head_loss import head_loss, next_token_loss, whole_logits_loss


def redacted_strings(tree):
    """`tree` (JSON-like: dicts, lists, strings, numbers) with every string passed through gatelab.errors.redact."""
    if isinstance(tree, dict):
        return {key: redacted_strings(value) for key, value in tree.items()}
    if isinstance(tree, list):
        return [redacted_strings(value) for value in tree]
    return redact(tree) if isinstance(tree, str) else tree


def lr_at(step: int, peak: float, floor: float, warmup: int, total: int) -> float:
    """Linear warmup to `peak`, then cosine decay to `floor` at `total` steps (the paper's MoE schedule shape)."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return floor + 0.5 * (peak - floor) * (1 + math.cos(math.pi * progress))


class GatedLM(L.LightningModule):
    """Next-token cross-entropy plus the MoE auxiliary losses; AdamW with warmup and cosine decay."""

    def __init__(self, experiment: ExperimentConfig, model_config: ModelConfig):
        super().__init__()
        self.experiment = experiment
        self.model = build_model(model_config, seed=experiment.seed)
        self.train_hidden_states = self.model.hidden_states
        if experiment.train.compile:
            # Regional compilation: the blocks share their code and shapes, so one compiled graph serves them all and
            # compiling takes a quarter of a whole-model compile. A plain list, not submodules: the state dict's keys
            # stay as they are; evaluation and probes call the blocks themselves, eager. The head loss is a second
            # region (see `train_head_loss`).
            mode = None if experiment.train.compile_mode == "default" else experiment.train.compile_mode
            compiled_blocks = [torch.compile(block, mode=mode) for block in self.model.blocks]
            self.train_hidden_states = functools.partial(self.model.hidden_states, blocks=compiled_blocks)
            self.compiled_head_loss = torch.compile(whole_logits_loss, mode=mode)
        else:
            self.compiled_head_loss = None
        self.moe = model_config.moe
        self.cuda_graphs = experiment.train.compile and experiment.train.compile_mode in ("reduce-overhead",
                                                                                          "max-autotune")
        self._step_started = time.perf_counter()

    def forward(self, input_ids_BT: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids_BT)

    def training_loss(self, input_ids_BT: torch.Tensor, targets_BT: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """(next-token loss, the loss to minimise: that plus the MoE auxiliary losses, the auxiliary losses)."""
        if self.cuda_graphs:
            # A new training step: CUDA graph trees may reuse the memory of the previous step's graph outputs.
            torch.compiler.cudagraph_mark_step_begin()
        hidden_BTD, aux = self.train_hidden_states(input_ids_BT)
        loss = self.train_head_loss(hidden_BTD, self.model.lm_head.weight, targets_BT)
        return loss, self.with_aux_losses(loss, aux), aux

    def train_head_loss(self, hidden_BTD: torch.Tensor, head_weight_VD: torch.Tensor, targets_BT: torch.Tensor
                        ) -> torch.Tensor:
        """The next-token loss of the final hidden states (gatelab.train.head_loss). Under autocast with
        `train.compile`: inductor's fused cross-entropy of the whole low-precision logits (0.77x the tiny step in bf16
        on a CPU, results/bench/). Otherwise `head_loss`, chunked, compiled or not (in fp32 faster than the compiled
        whole logits at the tiny preset, 290 against 307 ms a step, and its memory stays flat as logits grow)."""
        if self.compiled_head_loss is not None and torch.is_autocast_enabled(hidden_BTD.device.type):
            return self.compiled_head_loss(hidden_BTD, head_weight_VD, targets_BT)
        return head_loss(hidden_BTD, head_weight_VD, targets_BT)

    def with_aux_losses(self, loss: torch.Tensor, aux: dict[str, torch.Tensor]) -> torch.Tensor:
        """The loss to minimise: `loss` plus the MoE auxiliary losses, weighted as configured (dense: `loss`)."""
        if self.moe is None:
            return loss
        return loss + self.moe.load_balance_coef * aux["load_balance"] + self.moe.z_loss_coef * aux["z_loss"]

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        input_ids_BT, targets_BT = batch
        if self.global_step == 0 and self.logger is not None:
            self.log_init_scale(input_ids_BT)
        loss, total, aux = self.training_loss(input_ids_BT, targets_BT)
        if self.moe is not None:
            self.log_dict({catalogue.LOAD_BALANCE: aux["load_balance"], catalogue.Z_LOSS: aux["z_loss"]})
        # A host clock: on an accelerator it times the step's launches, which keep pace with the device over many steps
        # (the launch queue fills and the host waits) but not within one.
        now = time.perf_counter()
        tokens_per_s = input_ids_BT.numel() / max(now - self._step_started, 1e-9)
        self._step_started = now
        # Lightning reads a progress-bar tensor back (`.item()`) after every step, a device sync, and other tensors
        # only at logging steps: the loss goes to the bar only on CPU, where reading it back is free.
        self.log(catalogue.TRAIN_LOSS, loss, prog_bar=self.device.type == "cpu", sync_dist=True)  # DDP: global batch's
        # Host numbers as CPU tensors: `self.log` turns a Python float into a tensor on the module's device, a
        # host-to-device copy that waits for the device's queue (pytorch/pytorch#120996).
        self.log(catalogue.TOKENS_PER_S, torch.tensor(tokens_per_s), prog_bar=True)
        self.log(catalogue.LEARNING_RATE, torch.tensor(self.optimizers().param_groups[0]["lr"]))
        return total

    def log_init_scale(self, input_ids_BT: torch.Tensor) -> None:
        """The attention output's RMS at step 0, on the first training batch, before the first update (the claims
        table's init-scale check; gatelab.eval.probes.attention_output_rms). Rank 0's logger only."""
        rms = attention_output_rms(self.model, input_ids_BT)
        self.logger.log_metrics({catalogue.INIT_SCALE: rms}, step=0)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        input_ids_BT, targets_BT = batch
        loss = next_token_loss(self.model(input_ids_BT), targets_BT)
        self.log(catalogue.VAL_LOSS, loss, prog_bar=True, batch_size=input_ids_BT.shape[0])

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # The checkpoint rebuilds its model without the YAML, the registry or MLflow (eval.checkpoint.load_checkpoint);
        # the precision, as `auto` may resolve otherwise where it resumes; strings redacted, as people copy last.ckpt;
        # the spec hash of the unredacted experiment, which decides whether the file resumes a run.
        checkpoint["gatelab"] = {"experiment": redacted_strings(self.experiment.model_dump(mode="json")),
                                 "spec_hash": spec_hash(self.experiment),
                                 "model": self.model.config.model_dump(mode="json"),
                                 "precision": self._trainer.precision if self._trainer is not None else None}

    def on_validation_epoch_end(self) -> None:
        if catalogue.VAL_LOSS in self.trainer.callback_metrics:
            self.log(catalogue.VAL_PPL, torch.exp(self.trainer.callback_metrics[catalogue.VAL_LOSS]))

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """Clips by the global norm and logs that norm, one norm for both (Lightning's clipping and a logged norm took
        two; torch takes its foreach kernels where the device has them). Clipping here rather than in Lightning's
        mixed-precision plugin lets bf16-mixed train with torch's fused AdamW, which the plugin refuses to clip for (it
        unscales 16-mixed's gradients itself). Under FSDP Lightning's own clipping (a shard's norm is not the
        model's)."""
        lightning_clips = self.experiment.train.strategy == "fsdp" or (gradient_clip_algorithm or "norm") != "norm"
        if gradient_clip_val and not lightning_clips:
            norm = torch.nn.utils.clip_grad_norm_(self.parameters(), gradient_clip_val)
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in self.parameters() if p.grad is not None])
        self.log(catalogue.GRAD_NORM, norm)
        if gradient_clip_val and lightning_clips:
            self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def configure_optimizers(self):
        train = self.experiment.train
        decay, no_decay = [], []
        for name, parameter in self.named_parameters():
            gate_logits = name.endswith("logits_HD")  # input-independent gate logits: (H, D), yet not a weight matrix
            is_weight = parameter.ndim >= 2 and (not gate_logits or train.decay_gate_logits)
            (decay if is_weight else no_decay).append(parameter)  # no_decay: norms and gate logits
        # torch's fused AdamW (one kernel over all parameters, CPU and GPU): on the CPU its default is a loop of
        # per-parameter ops, 3-7% of a tiny step (`gatelab bench`'s profile); on a GPU the default's foreach kernels
        # run one pass per moment and update. Not with 16-mixed's GradScaler, whose unscaling the fused optimizer does
        # inside its step, after the gradients were clipped (`configure_gradient_clipping` clips for bf16-mixed), nor
        # under FSDP's mixed precision, whose clipping is Lightning's.
        precision = self._trainer.precision if self._trainer is not None \
            else resolve_precision(train.precision, train.accelerator, moe=self.model.config.ffn == "moe")
        fused = self.device.type in ("cpu", "cuda") and (
            "mixed" not in precision or (precision == "bf16-mixed" and train.strategy != "fsdp"))
        optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": train.weight_decay},
                                       {"params": no_decay, "weight_decay": 0.0}], lr=train.lr, betas=train.betas,
                                      fused=fused)
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: lr_at(step, train.lr, train.min_lr, train.warmup_steps, train.max_steps) / train.lr
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


class StepBatches(IterableDataset):
    """Batch i of a run is windows [i*B, (i+1)*B) of the seed's order, whatever happened before.

    The stream starts at the trainer's global step, which Lightning restores before the epoch begins, so a resumed
    run sees the batches an uninterrupted one would. An "epoch" is `steps_per_epoch` batches, one validation interval
    (Optuna's pruning callback reports per epoch). Under DDP each of the `world_size` processes takes its contiguous
    slice of the global batch B, so the data is the same on any device count. DataLoader worker w of W assembles steps
    w, w + W, ..., handed out in turn, so the order is the same as with none; workers are not persistent, each starts
    after the trainer restored its step, which `__getstate__` pickles as a number.
    """

    def __init__(self, windows: PackedDataset, batch_size: int, steps_per_epoch: int, start_step,
                 rank: int = 0, world_size: int = 1) -> None:
        if batch_size % world_size:
            raise GatelabError(f"train.batch_size ({batch_size}) is the global batch and must divide evenly over "
                               f"{world_size} processes (devices x num_nodes)")
        self.windows, self.batch_size, self.steps_per_epoch, self.start_step = (windows, batch_size, steps_per_epoch,
                                                                                start_step)
        self.local_batch = batch_size // world_size
        self.offset = rank * self.local_batch

    def _first_step(self) -> int:
        return self.start_step() if callable(self.start_step) else self.start_step

    def __getstate__(self) -> dict:
        return {**self.__dict__, "start_step": self._first_step()}

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        first = step * self.batch_size + self.offset
        inputs, targets = zip(*(self.windows[(first + i) % len(self.windows)] for i in range(self.local_batch)))
        return torch.stack(inputs), torch.stack(targets)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        step = self._first_step()
        end = (step // self.steps_per_epoch + 1) * self.steps_per_epoch
        worker = torch.utils.data.get_worker_info()
        workers, me = (1, 0) if worker is None else (worker.num_workers, worker.id)
        for step in range(step + me, end, workers):
            yield self.batch(step)


class TextData(L.LightningDataModule):
    """Training batches by step; validation on held-out windows of every domain (`val/loss`)."""

    def __init__(self, windows: PackedDataset, batch_size: int, steps_per_epoch: int,
                 validation_windows: torch.Tensor | None = None, loader_workers: int = 0):
        super().__init__()
        self.windows, self.batch_size, self.steps_per_epoch = windows, batch_size, steps_per_epoch
        self.validation_windows, self.loader_workers = validation_windows, loader_workers

    def train_dataloader(self) -> DataLoader:
        stream = StepBatches(self.windows, self.batch_size, self.steps_per_epoch, lambda: self.trainer.global_step,
                             rank=self.trainer.global_rank, world_size=self.trainer.world_size)
        return DataLoader(stream, batch_size=None, num_workers=self.loader_workers,
                          pin_memory=torch.cuda.is_available())

    def val_dataloader(self) -> DataLoader:
        windows = (self.validation_windows if self.validation_windows is not None
                   else torch.zeros(0, 2, dtype=torch.long))
        pairs = torch.utils.data.TensorDataset(windows[:, :-1], windows[:, 1:])
        return DataLoader(pairs, batch_size=self.batch_size)


class SpikeRule:
    """gatelab's one definition of a loss spike and of divergence, applied to one step's loss at a time, in order.

    A spike: a step after warmup whose loss exceeds the exponential moving average of earlier losses (beta `beta`) by
    more than `margin` nats; the average is taken before the step is folded in, so a spike cannot mask itself, and it
    runs through warmup so it is settled when counting starts. Divergence: a non-finite loss, or after warmup a loss
    above `factor` times that average; a diverged step is not folded in (the run stops there).
    """

    def __init__(self, warmup: int, beta: float, margin: float, factor: float, ema: float | None = None):
        self.warmup, self.beta, self.margin, self.factor, self.ema = warmup, beta, margin, factor, ema

    @classmethod
    def from_config(cls, train: TrainConfig) -> SpikeRule:
        return cls(train.warmup_steps, train.spike_ema, train.spike_margin, train.divergence_factor)

    def describe(self) -> dict[str, str]:
        """The rule in words, as tags on the run."""
        return {"gatelab.spike_definition": f"loss > EMA(beta={self.beta}) of earlier losses + {self.margin} nats, "
                                            f"after {self.warmup} warmup steps",
                "gatelab.divergence_definition": f"non-finite loss, or loss > {self.factor} x EMA after warmup"}

    def check(self, step: int, loss: float) -> str | None:
        """'diverged', 'spike' or None for the next step's loss."""
        after_warmup = self.ema is not None and step >= self.warmup
        if not math.isfinite(loss) or (after_warmup and loss > self.factor * self.ema):
            return "diverged"
        spike = after_warmup and loss > self.ema + self.margin
        self.ema = loss if self.ema is None else self.beta * self.ema + (1 - self.beta) * loss
        return "spike" if spike else None


class StabilityMonitor(L.Callback):
    """Counts loss spikes and stops a run whose loss turns non-finite or explodes, recording it as diverged, by the
    rule of `SpikeRule` applied to every step's loss.

    The step losses stay on the device and are read back together every `every` steps (default: the trainer's
    `log_every_n_steps`, so `train/spikes` is current whenever it reaches the logger) and when training ends: one
    device sync per interval instead of one per step. Spike and divergence steps are those a step-by-step check finds;
    a divergence stops the run at the end of its interval, up to `every - 1` steps after `diverged_step`.
    """

    def __init__(self, warmup: int, beta: float, margin: float, factor: float, every: int | None = None):
        self.rule = SpikeRule(warmup, beta, margin, factor)
        self.every = every
        self.spikes: list[int] = []
        self.spike_losses: list[float] = []  # the loss of each step in `spikes`
        self.diverged_step: int | None = None
        self._pending_steps: list[int] = []
        self._pending_losses: list[torch.Tensor] = []  # 0-d, on the device
        self._restored_losses: list[float] = []  # losses of _pending_steps that a checkpoint brought back to the host

    @classmethod
    def from_config(cls, train: TrainConfig) -> StabilityMonitor:
        """The monitor of a run with these training settings (gatelab train and gatelab bench use the same one)."""
        return cls(train.warmup_steps, train.spike_ema, train.spike_margin, train.divergence_factor)

    @property
    def ema(self) -> float | None:
        return self.rule.ema

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.diverged_step is not None:
            return
        self._pending_steps.append(trainer.global_step - 1)
        self._pending_losses.append(trainer.callback_metrics[catalogue.TRAIN_LOSS].detach())
        if trainer.global_step % (self.every or max(1, trainer.log_every_n_steps)) == 0:
            self._check(trainer)
        if self.diverged_step is None:
            pl_module.log(catalogue.SPIKES, torch.tensor(float(len(self.spikes))))  # a CPU tensor: no device copy

    def on_train_end(self, trainer, pl_module) -> None:
        self._check(trainer)  # the last, partial interval

    def _check(self, trainer) -> None:
        """The rule over the pending steps, in order; the first divergence stops the run."""
        if not self._pending_steps:
            return
        steps, losses = self._pending_steps, self._read_back()
        self._pending_steps, self._pending_losses, self._restored_losses = [], [], []
        for step, loss in zip(steps, losses):
            outcome = self.rule.check(step, loss)
            if outcome == "diverged":
                self.diverged_step = step
                trainer.should_stop = True
                return
            if outcome == "spike":
                self.spikes.append(step)
                self.spike_losses.append(loss)

    def _read_back(self) -> list[float]:
        """The pending steps' losses on the host: one device sync for all of them."""
        return self._restored_losses + (torch.stack(self._pending_losses).tolist() if self._pending_losses else [])

    def state_dict(self) -> dict:
        # Steps not yet checked travel with the checkpoint, so a resumed run checks them as an unbroken one would.
        return {"ema": self.rule.ema, "spikes": self.spikes, "spike_losses": self.spike_losses,
                "pending_steps": list(self._pending_steps), "pending_losses": self._read_back()}

    def load_state_dict(self, state: dict) -> None:
        self.rule.ema, self.spikes = state["ema"], list(state["spikes"])
        # Checkpoints written before spike losses were kept: NaN marks a loss that is not known.
        self.spike_losses = list(state.get("spike_losses", [math.nan] * len(self.spikes)))
        self._pending_steps = list(state.get("pending_steps", []))  # absent in checkpoints from before batching
        self._restored_losses, self._pending_losses = list(state.get("pending_losses", [])), []
