"""A confirmatory row of the claims file is declared before its runs: its text's first commit is older than the first
run it reads (issue 43). Checked on the committed claims file and store, and on a made-up history where a row came
after its runs."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

import pandas as pd
import pytest

from gatelab import tracking
from gatelab.report.claims_file import Claim, load_claims, parse_group
from tests.helpers import REPO, sqlite_uri

CLAIMS = Path("sweeps/claims/tiny.yaml")


def first_declared(repo: Path, claims_path: Path, text: str) -> pd.Timestamp | None:
    """When `text` first appeared in the claims file: the committer date of the oldest commit that added it."""
    found = subprocess.run(["git", "log", "--reverse", "--format=%ct", "-S", text, "--", str(claims_path)], cwd=repo,
                           capture_output=True, text=True, check=True).stdout.split()
    return pd.Timestamp(int(found[0]), unit="s", tz="UTC") if found else None


def first_run_started(store: tracking.RunStore, claim: Claim) -> pd.Timestamp | None:
    """The start of the first run (superseded ones aside) of the variants a row compares."""
    runs = store.sweep_runs(claim.sweep)
    if runs.empty:
        return None
    variants = {parse_group(group)[0] for group in (claim.a, claim.b) if group}
    read = runs[runs[f"tags.{tracking.VARIANT_TAG}"].isin(variants)]
    return None if read.empty else read["start_time"].min()


def declared_late(repo: Path, claims_path: Path, claims: list[Claim], store: tracking.RunStore) -> dict[str, str]:
    """{claim: why} for each confirmatory row not committed before the first run it reads."""
    late = {}
    for claim in (c for c in claims if c.section == "confirmatory"):
        declared, started = first_declared(repo, claims_path, claim.claim), first_run_started(store, claim)
        if declared is None:
            late[claim.claim] = "never committed"
        elif started is not None and declared >= started:
            late[claim.claim] = f"committed {declared}, its first run started {started}"
    return late


@pytest.fixture(scope="module")
def committed_store(tmp_path_factory) -> tracking.RunStore:
    folder = tmp_path_factory.mktemp("store")
    with tarfile.open(REPO / "results" / "tiny" / "mlflow-store.tar.xz") as archive:
        archive.extractall(folder, filter="data")
    return tracking.RunStore(sqlite_uri(folder / "runs"), folder / "runs", read_only=True)


def _full_history() -> None:
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=REPO, capture_output=True,
                             text=True).stdout.strip()
    if shallow != "false":
        pytest.skip("needs the repository's whole history (a shallow clone dates every row at its graft)")


def test_every_committed_confirmatory_row_was_declared_before_its_first_run(committed_store):
    _full_history()
    claims = load_claims(REPO / CLAIMS)
    confirmatory = [c for c in claims if c.section == "confirmatory"]
    with_runs = [c for c in confirmatory if first_run_started(committed_store, c) is not None]
    assert len(confirmatory) == 9 and len(with_runs) == 9
    assert declared_late(REPO, CLAIMS, claims, committed_store) == {}


def _git(repo: Path, *args: str, when: str | None = None) -> None:
    env = os.environ | {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t"}
    if when:
        env |= {"GIT_AUTHOR_DATE": when, "GIT_COMMITTER_DATE": when}
    subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True)


def test_a_row_committed_after_its_first_run_is_found(tmp_path, committed_store):
    # the committed rows against a history in which the matched control row came in 2026-01-01 and every other row
    # in 2027: the runs of 11-27 and 11-28 then all started before their rows
    claims = [c for c in load_claims(REPO / CLAIMS) if c.section == "confirmatory"]
    repo = tmp_path / "repo"
    (repo / CLAIMS.parent).mkdir(parents=True)
    _git(repo, "init", "-q")
    (repo / CLAIMS).write_text(f"- {claims[0].claim}\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "early", when="2026-01-01T00:00:00Z")
    (repo / CLAIMS).write_text("".join(f"- {c.claim}\n" for c in claims))
    _git(repo, "commit", "-qam", "late", when="2027-01-01T00:00:00Z")
    late = declared_late(repo, CLAIMS, claims, committed_store)
    with_runs = {c.claim for c in claims[1:] if first_run_started(committed_store, c) is not None}
    assert set(late) == with_runs and len(with_runs) >= 6
    assert all(why.startswith("committed 2027-01-01") for why in late.values())
