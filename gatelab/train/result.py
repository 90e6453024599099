"""What one run comes to (`RunResult`), and the exception that ends a run early as a result (`RunPruned`)."""

from __future__ import annotations

from dataclasses import dataclass, field


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
