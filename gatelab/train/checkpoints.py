"""Checkpoints that are whole or absent, and a damaged one set aside instead of crashing every resume.

Lightning's own save (`_atomic_save`: an fsspec transaction, a temporary file moved into place) survives a killed
process but not a power cut: nothing is flushed to disk before the rename, so the new name can point at blocks that
never reached it. `DurableCheckpointIO` writes the temporary file, fsyncs it, renames it and fsyncs the folder; during
`fit` the rename waits until the step's metrics are kept (PublishAfterStepMetrics).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from gatelab.errors import first_line


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
            _write_synced(checkpoint, staged)
        except BaseException as error:
            staged.unlink(missing_ok=True)  # a failed write (a full disk) leaves the old checkpoint, not half a new one
            if isinstance(error, OSError) and error.errno is not None:
                raise OSError(error.errno, error.strerror, str(path)) from error  # the message names the checkpoint
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


def _write_synced(checkpoint: dict[str, Any], staged: Path) -> None:
    with staged.open("wb") as file:
        writer = _WriteErrors(file)
        try:
            torch.save(checkpoint, writer)
        except RuntimeError as error:  # torch's writer hides the file's error: "unexpected pos 704 vs 598"
            if writer.error is None:
                raise
            raise writer.error from error
        file.flush()
        os.fsync(file.fileno())


class _WriteErrors:
    """A file that keeps the OSError of a failed write, which torch.save turns into a RuntimeError naming neither the
    file nor the cause (a full disk): the checkpoint's writer re-raises it naming the checkpoint."""

    def __init__(self, file) -> None:
        self.file, self.error = file, None

    def write(self, data) -> int:
        try:
            return self.file.write(data)
        except OSError as error:
            self.error = error
            raise

    def __getattr__(self, name: str):
        return getattr(self.file, name)


class PublishAfterStepMetrics(L.Callback):
    """Lightning saves a step's checkpoint before it logs that step's metrics, and the resumed run never trains that
    step again: so during `fit` a checkpoint is published at the start of the next step (or the end of training), once
    the logger's queued points are kept on disk."""

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


# What Lightning reads back to resume a run (its _CheckpointConnector), and gatelab's own record of the run.
_RESUME_KEYS = ("pytorch-lightning_version", "global_step", "epoch", "state_dict", "loops", "optimizer_states",
                "gatelab")


@dataclass(frozen=True)
class ThisRun:
    """What a checkpoint must match to resume this run: the run's spec hash, and its weights' names and shapes."""

    spec_hash: str
    weights: dict[str, tuple[int, ...]]

    @classmethod
    def of(cls, spec_hash: str, model_config) -> ThisRun:
        from gatelab.model import build_model

        with torch.device("meta"):  # names and shapes only: nothing is allocated
            model = build_model(model_config)
        return cls(spec_hash, {f"model.{name}": tuple(t.shape) for name, t in model.state_dict().items()})


def set_aside_unless_resumable(checkpoint: Path, run: ThisRun, log) -> bool:
    """Whether `checkpoint` exists and resumes this run. One that does not (truncated, overwritten, a foreign file,
    another run's or another model's checkpoint) is renamed `<name>.unreadable-<time>` (`.not-this-run-<time>` where
    it loads) with one line saying why, and the run starts again from step 0: resuming from it would fail on every
    attempt, or silently train another run's weights."""
    if not checkpoint.exists():
        return False
    try:
        problem, label = why_not_resumable(_load_lazily(checkpoint), run), "not-this-run"
    except Exception as error:  # torch raises RuntimeError, EOFError, UnpicklingError... for a damaged file
        problem, label = f"does not load ({first_line(error)[:160]})", "unreadable"
    if problem is None:
        return True
    aside = _free_name(checkpoint.with_name(f"{checkpoint.name}.{label}-{time.strftime('%Y%m%d-%H%M%S')}"))
    os.replace(checkpoint, aside)
    log(f"checkpoint {checkpoint} {problem}; moved it to {aside.name} and training this run again from step 0")
    return False


def why_not_resumable(state: Any, run: ThisRun) -> str | None:
    """Why the loaded checkpoint `state` cannot resume `run`, or None where it can."""
    if not isinstance(state, dict):
        return f"is not a checkpoint (it holds a {type(state).__name__})"
    missing = [key for key in _RESUME_KEYS if key not in state]
    if missing:
        return f"is not a gatelab checkpoint (it has no {', '.join(repr(key) for key in missing)})"
    recorded = _recorded_spec_hash(state)
    if recorded != run.spec_hash:
        return (f"is another run's (spec hash {recorded or 'unknown'}; this run's is {run.spec_hash})")
    weights = state["state_dict"]
    if not isinstance(weights, dict) or not isinstance(state["optimizer_states"], list):
        return "is not a gatelab checkpoint (its state_dict or optimizer_states is of another type)"
    shapes = {name: tuple(getattr(value, "shape", ())) for name, value in weights.items()}
    if shapes != run.weights:
        wrong = sorted(set(shapes) ^ set(run.weights)) or sorted(n for n in shapes if shapes[n] != run.weights[n])
        return f"holds weights that do not fit this model ({', '.join(wrong[:3])}{', ...' if len(wrong) > 3 else ''})"
    return None


def _recorded_spec_hash(state: dict) -> str | None:
    """The spec hash of the experiment the checkpoint describes itself with; None where it describes none."""
    from gatelab.config import ExperimentConfig
    from gatelab.data.identity import spec_hash

    try:
        recorded = state["gatelab"].get("spec_hash")  # written since it was kept apart from the redacted experiment
        return recorded if isinstance(recorded, str) else \
            spec_hash(ExperimentConfig.model_validate(state["gatelab"]["experiment"]))
    except Exception:  # noqa: BLE001  not a dict, not an experiment this gatelab reads: not this run's either way
        return None


def _free_name(path: Path) -> Path:
    """`path`, or `path-2`, `path-3`... where it is taken: a second checkpoint set aside in the same second keeps the
    first."""
    candidate, n = path, 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}-{n}")
    return candidate


def remove_unfinished_writes(run_dir: Path, log) -> None:
    """Remove the temporary files a process killed while writing a checkpoint (or its unsent metric points) left in
    `run_dir`, saying so in one line. Call it holding the run: no other process writes there then."""
    leftovers = sorted(p for folder in (run_dir, run_dir / "checkpoints") for p in folder.glob(".*.tmp") if p.is_file())
    for leftover in leftovers:
        leftover.unlink(missing_ok=True)
    if leftovers:
        log(f"removed {len(leftovers)} unfinished write(s) a killed process left in {run_dir}: "
            f"{', '.join(str(p.relative_to(run_dir)) for p in leftovers)}")


def recorded_precision(checkpoint: Path, run: ThisRun) -> str | None:
    """The precision the run of `checkpoint` trained in, as its checkpoint records it; None without a checkpoint that
    resumes `run` (another run's trained in its own precision) or for one written before gatelab recorded it."""
    if not checkpoint.exists():
        return None
    try:
        state = _load_lazily(checkpoint)
    except Exception:  # noqa: BLE001  an unreadable checkpoint is set aside later, with its own message
        return None
    if why_not_resumable(state, run) is not None:
        return None
    return (state.get("gatelab") or {}).get("precision")


def _load_lazily(checkpoint: Path) -> dict:
    """The checkpoint's dict, its tensors memory-mapped: reads its structure without reading every weight."""
    return torch.load(checkpoint, map_location="cpu", weights_only=False, mmap=True)
