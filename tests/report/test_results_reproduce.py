"""The committed claims tables are what the committed store gives (issue 43's first acceptance line, kept by issue 44):
`gatelab claims sweeps/repro-*.yaml --out results/tiny` and the ladder's `gatelab claims sweeps/ladder-g1.yaml --claims
sweeps/claims/ladder.yaml --out results/tiny/ladder-g1`, run as the results/tiny README says, in a folder holding only
the checkout's sweeps and presets and the store extracted from results/tiny/mlflow-store.tar.xz, write the committed
files byte for byte."""

from __future__ import annotations

import tarfile

import pytest

from tests.helpers import REPO, gatelab_cli

COMMITTED = REPO / "results" / "tiny"
CLAIMS_FILES = ("claims.csv", "claims.md", "claims.tex", "claims.html", "summary.md")


@pytest.fixture(scope="module")
def remade(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fresh")
    for name in ("sweeps", "experiments"):
        (folder / name).symlink_to(REPO / name, target_is_directory=True)
    with tarfile.open(COMMITTED / "mlflow-store.tar.xz") as archive:
        archive.extractall(folder, filter="data")
    sweeps = sorted(path.relative_to(REPO).as_posix() for path in (REPO / "sweeps").glob("repro-*.yaml"))
    done = gatelab_cli("claims", *sweeps, "--out", "results/tiny", cwd=folder)
    assert done.returncode == 0, done.stderr[-2000:]
    done = gatelab_cli("claims", "sweeps/ladder-g1.yaml", "--claims", "sweeps/claims/ladder.yaml", "--out",
                       "results/tiny/ladder-g1", cwd=folder)
    assert done.returncode == 0, done.stderr[-2000:]
    return folder / "results" / "tiny"


@pytest.mark.parametrize("name", [*CLAIMS_FILES, *(f"ladder-g1/{name}" for name in CLAIMS_FILES)])
def test_the_committed_claims_file_is_what_the_committed_store_gives(remade, name):
    assert (remade / name).read_bytes() == (COMMITTED / name).read_bytes()
