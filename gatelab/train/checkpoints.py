"""Checkpoints that are whole or absent, and a damaged one set aside instead of crashing every resume.

Lightning's own save (`_atomic_save`: an fsspec transaction, a temporary file moved into place) survives a killed
process but not a power cut: nothing is flushed to disk before the rename, so the new name can point at blocks that
never reached it. `DurableCheckpointIO` writes the temporary file, fsyncs it, renames it and fsyncs the folder; during
`fit` the rename waits until the step's metrics are kept (PublishAfterStepMetrics).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO


class DurableCheckpointIO(TorchCheckpointIO):
    """TorchCheckpointIO for local paths, written temp file -> fsync -> rename -> fsync(folder).

    While `hold` is set (during `fit`, by PublishAfterStepMetrics), a written checkpoint stays staged, whole and
    fsynced but not renamed, until `publish()`."""

    def __init__(self) -> None:
        super().__init__()
        self.hold = False
        self._staged: tuple[Path, Path] | None = None  # (the written temp file, the name it gets on publish)

    @property
    def pending(self) -> bool:
        return self._staged is not None

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None or "://" in str(path):  # remote stores: Lightning's own transaction
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        staged = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
        try:
            with staged.open("wb") as file:
                torch.save(checkpoint, file)
                file.flush()
                os.fsync(file.fileno())
        except BaseException:
            staged.unlink(missing_ok=True)  # a failed write (a full disk) leaves the old checkpoint, not half a new one
            raise
        self.discard()  # an older staged one of the same step (a save at validation end) is superseded
        self._staged = (staged, path)
        if not self.hold:
            self.publish()

    def publish(self) -> None:
        """Give the staged checkpoint its name, durably."""
        if self._staged is None:
            return
        staged, path = self._staged
        self._staged = None
        os.replace(staged, path)
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)

    def discard(self) -> None:
        if self._staged is not None:
            self._staged[0].unlink(missing_ok=True)
            self._staged = None


class PublishAfterStepMetrics(L.Callback):
    """Lightning saves a step's checkpoint (ModelCheckpoint.on_train_batch_end) before it logs that step's metrics. A
    checkpoint visible before those points are sent or on disk lets a kill lose them for good: the resumed run starts
    after that step and never trains it again. So during `fit` a checkpoint is published at the start of the next
    step, or at the end of training, once the logger's queued points (that step's included) are kept on disk first.
    A process stopped in between leaves the previous checkpoint, and its successor re-trains from there."""

    def __init__(self, checkpoint_io: DurableCheckpointIO) -> None:
        self.checkpoint_io = checkpoint_io

    def on_train_start(self, trainer, pl_module) -> None:
        self.checkpoint_io.hold = True

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._publish(trainer)

    def on_train_end(self, trainer, pl_module) -> None:
        self._publish(trainer)
        self.checkpoint_io.hold = False

    def on_exception(self, trainer, pl_module, exception) -> None:
        self.checkpoint_io.discard()  # its step's metrics may be lost: the previous checkpoint stays the one to resume
        self.checkpoint_io.hold = False

    def _publish(self, trainer) -> None:
        if not self.checkpoint_io.pending:
            return
        from gatelab.metric_outbox import QueuedMLFlowLogger

        if isinstance(trainer.logger, QueuedMLFlowLogger) and trainer.is_global_zero:
            trainer.logger.outbox.save_queued()
        self.checkpoint_io.publish()


def set_aside_if_unreadable(checkpoint: Path, log) -> bool:
    """Whether `checkpoint` exists and loads. One that does not (truncated, overwritten) is renamed
    `<name>.unreadable-<time>` with one line saying so, and the run starts again from step 0: resuming from it would
    fail on every attempt."""
    if not checkpoint.exists():
        return False
    try:
        _load_lazily(checkpoint)
        return True
    except Exception as error:  # torch raises RuntimeError, EOFError, UnpicklingError... for a damaged file
        aside = checkpoint.with_name(f"{checkpoint.name}.unreadable-{time.strftime('%Y%m%d-%H%M%S')}")
        os.replace(checkpoint, aside)
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:160]
        log(f"checkpoint {checkpoint} does not load ({reason}); moved it to {aside.name} and training this run again "
            "from step 0")
        return False


def recorded_precision(checkpoint: Path) -> str | None:
    """The precision the run of `checkpoint` trained in, as its checkpoint records it; None without a readable
    checkpoint or for one written before gatelab recorded it."""
    if not checkpoint.exists():
        return None
    try:
        state = _load_lazily(checkpoint)
    except Exception:  # noqa: BLE001  an unreadable checkpoint is set aside later, with its own message
        return None
    return (state.get("gatelab") or {}).get("precision")


def _load_lazily(checkpoint: Path) -> dict:
    """The checkpoint's dict, its tensors memory-mapped: reads its structure without reading every weight."""
    return torch.load(checkpoint, map_location="cpu", weights_only=False, mmap=True)
