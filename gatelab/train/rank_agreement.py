"""What rank 0 decides before `fit` (the MLflow run, whether it is recorded already, whether to resume), and how
every other rank of the run hears it."""

from __future__ import annotations

import lightning as L

from gatelab.errors import GatelabError
from gatelab.train.result import RunResult


class AlreadyRecorded(Exception):
    """Raised on every rank in `setup` when rank 0 found the run already finished or diverged in MLflow."""


class RankAgreement(L.Callback):
    """What rank 0 decided before `fit`, told to every rank as soon as the process group exists (`setup`, before the
    checkpoint is restored and before any step).

    Ranks other than 0 never open MLflow: here they learn the run id, and whether rank 0 found the run already
    recorded, in which case every rank leaves `fit` together (one rank returning early while the others enter `fit`
    would leave them waiting in the process group forever). Every rank must also have made the same resume decision:
    a checkpoint folder that one node sees and another does not would train different steps on different ranks.

    Built once rank 0 has decided; on the other ranks `recorded` and `run_id` are rank 0's from `setup` on (the one
    thing a rank learns during `fit`).
    """

    def __init__(self, resuming: bool, recorded: RunResult | None, run_id: str) -> None:
        self.resuming, self.recorded, self.run_id = resuming, recorded, run_id

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.recorded, self.run_id, resuming = trainer.strategy.broadcast((self.recorded, self.run_id, self.resuming))
        if self.recorded is not None:
            raise AlreadyRecorded
        if not trainer.strategy.reduce_boolean_decision(self.resuming == resuming, all=True):
            raise GatelabError("the ranks of this run disagree on resuming from its checkpoint: the runs directory "
                               "must be one folder that every node sees")


def alone_until_fit(trainer: L.Trainer) -> bool:
    """Whether no other rank of this run can exist before rank 0 calls `trainer.fit`.

    True for one process, and for one node whose other ranks Lightning itself starts inside `fit` (its subprocess
    launcher re-runs this command line for ranks 1..N-1 when rank 0 calls `fit`): rank 0 may then return before
    `fit` and no rank is left waiting. Ranks started by torchrun or srun, or the ranks of another node, run `run()`
    from the start and must be told inside `fit` (`RankAgreement`).
    """
    environment = getattr(trainer.strategy, "cluster_environment", None)
    external = environment is not None and environment.creates_processes_externally
    return trainer.world_size == 1 or (trainer.num_nodes == 1 and not external)
