"""How every rank of a run hears what rank 0 decided before `fit` (gatelab.train.rank_agreement), with the strategy's
collectives stood in for by rank 0's answer."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gatelab.errors import GatelabError
from gatelab.train.rank_agreement import AlreadyRecorded, RankAgreement, alone_until_fit
from gatelab.train.result import RunResult


def _trainer(rank_zero_decided: tuple) -> SimpleNamespace:
    """A trainer whose broadcast hands a rank rank 0's (recorded, run id, resuming); the reduction is this rank's."""
    strategy = SimpleNamespace(broadcast=lambda _: rank_zero_decided, reduce_boolean_decision=lambda agree, all: agree)
    return SimpleNamespace(strategy=strategy)


def test_another_rank_learns_rank_zero_s_decision_and_leaves_with_it():
    rank_one = RankAgreement(resuming=True, recorded=None, run_id="")  # what a rank knows before `setup`
    rank_one.setup(_trainer((None, "run-0", True)), None, "fit")
    assert rank_one.run_id == "run-0" and rank_one.recorded is None
    recorded = RunResult("finished", "run-0", "hash")
    with pytest.raises(AlreadyRecorded):
        rank_one.setup(_trainer((recorded, "run-0", True)), None, "fit")
    assert rank_one.recorded is recorded
    with pytest.raises(GatelabError, match="disagree on resuming"):
        RankAgreement(resuming=False, recorded=None, run_id="").setup(_trainer((None, "run-0", True)), None, "fit")


@pytest.mark.parametrize("world_size, num_nodes, external, alone", [
    (1, 1, False, True),  # one process
    (2, 1, False, True),  # Lightning starts ranks 1.. inside `fit`
    (2, 1, True, False),  # torchrun or srun started every rank already
    (4, 2, False, False),  # another node's ranks run from the start
])
def test_rank_zero_is_alone_until_fit_only_where_lightning_starts_the_other_ranks(world_size, num_nodes, external,
                                                                                   alone):
    environment = SimpleNamespace(creates_processes_externally=external)
    trainer = SimpleNamespace(world_size=world_size, num_nodes=num_nodes,
                              strategy=SimpleNamespace(cluster_environment=environment))
    assert alone_until_fit(trainer) is alone
