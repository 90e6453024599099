"""What a sweep command tells the user to run next (gatelab.sweep.next_commands): the line that re-queues failed
cells, and the resume line after a signal."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from gatelab.interrupts import Interrupted
from gatelab.sweep import executor
from gatelab.sweep.next_commands import failed_cells_line
from gatelab.sweep.queue import SweepLedger
from gatelab.sweep.spec import expand, load_sweep
from gatelab.workspace import Workspace
from tests.helpers import write_sweep


def test_the_failed_cells_line_names_each_failed_cell_and_the_command_that_requeues_them(tmp_path):
    sweep = write_sweep(tmp_path, {"grid": {"variant": ["baseline", "g1_elem_sig", "g1_head_sig"]}})
    specs = expand(load_sweep(sweep))
    storage = str(tmp_path / "ledger.journal")
    assert failed_cells_line(sweep, None, storage, tmp_path / "runs") is None  # no ledger yet: nothing failed
    ledger = SweepLedger(storage, "t")
    ledger.enqueue_missing(specs)
    claims = {claim.index: claim for claim in (ledger.claim() for _ in specs)}
    ledger.fail(claims[0], "RuntimeError: out of memory", retries=0)
    ledger.fail(claims[2], "RuntimeError: out of memory", retries=0)
    ledger.finish(claims[1], "finished", "run-b", 3.0)
    line = failed_cells_line(sweep, None, storage, tmp_path / "runs")
    assert line.startswith(f"failed: cells 0 ({specs[0].label()}), 2 ({specs[2].label()}) (why: gatelab sweep status)")
    assert line.endswith(f"re-queue them with: gatelab sweep reset {sweep} --failed --storage {storage} "
                         f"--runs-dir {tmp_path / 'runs'}"), line


@pytest.mark.parametrize("launcher_waits", [True, False], ids=["local", "slurm"])
def test_a_launched_worker_names_the_users_command_or_leaves_the_resume_line_to_its_launcher(monkeypatch,
                                                                                             launcher_waits):
    """SIGTERM to `sweep run --workers 2` printed three resume lines, two naming the internal `sweep worker`."""
    from gatelab.sweep.next_commands import interrupted_line

    monkeypatch.setattr(sys, "argv", ["gatelab", "sweep", "run", "s.yaml", "--workers", "2", "--storage",
                                      "postgresql://u:hunter2x@db/ledger"])
    for name, value in executor.launcher_env(says_resume=launcher_waits).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(sys, "argv", executor.worker_command(
        Path("s.yaml"), experiment=None, workspace=Workspace(storage="ledger.journal"), threads=1, heartbeat_s=1.0,
        grace_s=5.0))
    line = interrupted_line(Interrupted(signal.SIGTERM))
    if launcher_waits:
        assert line is None  # the launcher, waiting for this worker, prints the one line
    else:
        assert line.endswith("resume with: gatelab sweep run s.yaml --workers 2 --storage "
                             "postgresql://u:***@db/ledger"), line
