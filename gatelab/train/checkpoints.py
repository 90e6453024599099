"""Checkpoints that are whole or absent, and a damaged one set aside instead of crashing every resume.

Lightning's own save (`_atomic_save`: an fsspec transaction, a temporary file moved into place) survives a killed
process but not a power cut: nothing is flushed to disk before the rename, so the new name can point at blocks that
never reached it. `DurableCheckpointIO` writes the temporary file, fsyncs it, renames it and fsyncs the folder.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO


class DurableCheckpointIO(TorchCheckpointIO):
    """TorchCheckpointIO for local paths, written temp file -> fsync -> rename -> fsync(folder)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None or "://" in str(path):  # remote stores: Lightning's own transaction
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        staged = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            with staged.open("wb") as file:
                torch.save(checkpoint, file)
                file.flush()
                os.fsync(file.fileno())
            os.replace(staged, path)
        finally:
            staged.unlink(missing_ok=True)  # a failed write (a full disk) leaves the old checkpoint, not half a new one
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)


def set_aside_if_unreadable(checkpoint: Path, log) -> bool:
    """Whether `checkpoint` exists and loads. One that does not (truncated, overwritten) is renamed
    `<name>.unreadable-<time>` with one line saying so, and the run starts again from step 0: resuming from it would
    fail on every attempt."""
    if not checkpoint.exists():
        return False
    try:
        torch.load(checkpoint, map_location="cpu", weights_only=False, mmap=True)  # mmap: checks without reading all
        return True
    except Exception as error:  # torch raises RuntimeError, EOFError, UnpicklingError... for a damaged file
        aside = checkpoint.with_name(f"{checkpoint.name}.unreadable-{time.strftime('%Y%m%d-%H%M%S')}")
        os.replace(checkpoint, aside)
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:160]
        log(f"checkpoint {checkpoint} does not load ({reason}); moved it to {aside.name} and training this run again "
            "from step 0")
        return False
