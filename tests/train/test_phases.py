"""Where a run's wall time went (gatelab.train.phases): the imports are timed for a process's first run only."""

from __future__ import annotations

import time

# Imported before IMPORTED, as in any process that trains: import_s counts from gatelab's first import, and these
# imports' seconds are what lie between it and IMPORTED.
from gatelab.train import phases

IMPORTED = time.monotonic()


def test_imports_are_timed_for_the_first_run_of_a_process_only(monkeypatch):
    monkeypatch.setattr(phases, "_first_run_of_process", True)
    first, later = phases.PhaseClock().seconds, phases.PhaseClock().seconds
    assert first["time/import_s"] >= time.monotonic() - IMPORTED  # the process started before this file was imported
    assert later["time/import_s"] == 0  # a sweep worker's later runs import nothing
