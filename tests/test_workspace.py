"""Where a command's runs live (gatelab.workspace's Workspace)."""

from __future__ import annotations

from gatelab.store_uris import default_tracking_uri
from gatelab.workspace import Workspace


def test_a_workspace_reads_the_store_it_was_given_else_the_embedded_one_under_its_runs_folder(tmp_path):
    runs = tmp_path / "runs"
    assert Workspace(runs_dir=runs).store(create=False) == default_tracking_uri(runs, create=False)
    assert not runs.exists()  # made only where asked
    given = Workspace(runs_dir=runs, tracking_uri="http://host:5000")
    assert given.store() == "http://host:5000" and not runs.exists()
    with_ledger = given.with_storage("ledger.journal")
    assert (with_ledger.runs_dir, with_ledger.tracking_uri, with_ledger.storage) == (runs, "http://host:5000",
                                                                                     "ledger.journal")
    assert given.storage is None  # a copy: the workspace it came from is unchanged
