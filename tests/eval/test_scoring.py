"""`gatelab eval`: lm-eval scores of finished runs into their MLflow runs, once per task and settings, resumable after a
kill, each `--workers` process on a GPU of its own; `gatelab table` shows them; bad input is one message."""

from __future__ import annotations

import concurrent.futures
import os
import re
import signal
import time
from concurrent.futures import Future
from unittest import mock

import pytest

from gatelab import tracking
from gatelab.errors import GatelabError
from gatelab.eval import scoring
from gatelab.eval.scoring import TAG_PREFIX, HarnessSettings, Target, metrics_of
from tests.helpers import gatelab_cli, see_gpus, sqlite_uri, write_micro_sweep


def test_lm_eval_keys_become_metric_names():
    results = {"alias": "blimp", "acc,none": 0.75, "acc_stderr,none": 0.02, "exact_match,strict-match": 0.5,
               "exact_match_stderr,strict-match": "N/A", "samples": 12, "acc_norm,none": float("nan")}
    assert metrics_of("blimp", results) == {
        "lm_eval/blimp/acc": 0.75, "lm_eval/blimp/acc/stderr": 0.02,
        "lm_eval/blimp/exact_match_strict-match": 0.5}


class _InlinePool:
    """A ProcessPoolExecutor whose processes are this one: each task runs after the pool's initializer, in an
    environment put back after it, so each task sees only what its pool's initializer set."""

    def __init__(self, max_workers, mp_context=None, initializer=None, initargs=()):
        self.initializer, self.initargs = initializer, initargs

    def submit(self, fn, *args) -> Future:
        future = Future()
        with mock.patch.dict(os.environ):
            if self.initializer is not None:
                self.initializer(*self.initargs)
            future.set_result(fn(*args))
        return future

    def map(self, fn, iterable):
        return [self.submit(fn, item).result() for item in iterable]

    def shutdown(self, wait=True, cancel_futures=False) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


@pytest.mark.parametrize("visible,count,given,line", [
    ("4,5", 2, {"a": "4", "b": "5", "c": "4", "d": "5"}, "4 workers on 2 GPUs (CUDA_VISIBLE_DEVICES=4,5): 2 a GPU"),
    (None, 2, {"a": "0", "b": "1", "c": "0", "d": "1"}, "4 workers on 2 GPUs (GPUs 0,1): 2 a GPU"),
    ("-1", 0, {"a": "-1", "b": "-1", "c": "-1", "d": "-1"}, None),
], ids=["users-gpus", "torch-sees", "no-gpu"])
def test_each_scoring_process_scores_on_a_gpu_of_its_own(monkeypatch, visible, count, given, line):
    """`gatelab eval --workers 4` set no device: every process scored on cuda:0."""
    see_gpus(monkeypatch, visible, count)
    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", _InlinePool)
    seen = {}

    def score_runs(targets, settings, uri, runs_dir):
        seen.update({target.label: os.environ.get("CUDA_VISIBLE_DEVICES") for target in targets})
        return {"scored": len(targets), "skipped": 0}

    monkeypatch.setattr(scoring, "score_runs", score_runs)
    lines = []
    targets = [Target(f"run-{label}", label) for label in "abcd"]
    counts = scoring.score_in_parallel(targets, HarnessSettings(("gatelab_blimp",)), "sqlite:///x.db", "runs", 4,
                                       log=lines.append)
    assert counts == {"scored": 4, "skipped": 0}
    assert seen == given
    assert lines == ([line] if line else [])


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """Three finished micro runs (baseline and two gated variants), trained by `gatelab sweep run`."""
    folder = tmp_path_factory.mktemp("swept")
    sweep = write_micro_sweep(folder, "scored", max_steps=12)
    done = gatelab_cli("sweep", "run", str(sweep), "--runs-dir", str(folder / "runs"), cwd=folder)
    assert done.returncode == 0, done.stdout + done.stderr
    return folder, sweep


def _scored(folder) -> dict[str, dict]:
    client = tracking.client(sqlite_uri(folder / "runs"))
    runs = client.search_runs([client.get_experiment_by_name("scored").experiment_id],
                              filter_string=f"tags.`{tracking.STATUS_TAG}` = 'finished'")
    return {run.info.run_id: {"metrics": run.data.metrics, "tags": run.data.tags} for run in runs}


EVAL = ("--tasks", "gatelab_blimp", "--limit", "40", "--batch-size", "8")


@pytest.mark.slow
def test_eval_scores_each_finished_run_once_and_survives_a_kill(swept):
    folder, sweep = swept
    runs = ("--runs-dir", str(folder / "runs"))
    process = gatelab_cli("eval", str(sweep), *EVAL, *runs, cwd=folder, wait=False)
    deadline = time.time() + 300
    while time.time() < deadline and process.poll() is None:
        if any(TAG_PREFIX + "gatelab_blimp" in r["tags"] for r in _scored(folder).values()):
            break
        time.sleep(0.2)
    assert process.poll() is None, "scoring ended before it could be killed: " + process.stdout.read()
    process.send_signal(signal.SIGKILL)
    process.wait()
    scored_before = {i for i, r in _scored(folder).items() if TAG_PREFIX + "gatelab_blimp" in r["tags"]}
    assert 1 <= len(scored_before) < 3
    before = {i: r["metrics"] for i, r in _scored(folder).items() if i in scored_before}

    resumed = gatelab_cli("eval", str(sweep), *EVAL, *runs, cwd=folder)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"scored {3 - len(scored_before)} run(s); {len(scored_before)} already had these scores" in resumed.stdout
    said = resumed.stdout + resumed.stderr
    # lm-eval's words about lm-eval, not to our users
    assert "deprecated" not in said and "--metadata" not in said, said
    assert not re.search(r"(^|\r)\s*\d+%\|", said, re.M), said  # every progress bar says what it counts
    assert "not a git repository" not in resumed.stderr  # lm-eval's own `git describe`, outside a clone
    after = _scored(folder)
    for run_id, run in after.items():
        assert 0 <= run["metrics"]["lm_eval/gatelab_blimp/acc"] <= 1
        assert "lm_eval/gatelab_blimp/acc/stderr" in run["metrics"]
    assert all(after[i]["metrics"] == before[i] for i in scored_before)  # nothing logged is lost or redone

    table = gatelab_cli("table", str(sweep), "--format", "md", "--out", str(folder / "report"), *runs, cwd=folder)
    assert table.returncode == 0, table.stdout + table.stderr
    report = (folder / "report" / "README.md").read_text()
    assert "lm_eval/gatelab_blimp/acc" in report and "lm_eval/gatelab_blimp/acc Δ" in report


@pytest.mark.slow
@pytest.mark.parametrize("args, words", [
    (("--tasks", "gatelab_blimpp"), ["no task 'gatelab_blimpp'", "did you mean gatelab_blimp"]),
    (("--tasks", "hellaswag"), ["'hellaswag'", "Hugging Face Hub", "--include-path"]),
    (("--tasks", ""), ["--tasks"]),
])
def test_bad_tasks_are_one_message_and_exit_2(swept, args, words):
    folder, sweep = swept
    result = gatelab_cli("eval", str(sweep), *args, "--runs-dir", str(folder / "runs"), cwd=folder)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and all(w in result.stderr for w in words), result.stderr


@pytest.mark.slow
def test_a_run_id_that_does_not_exist_is_one_message(swept):
    folder, _ = swept
    result = gatelab_cli("eval", "0123456789abcdef", "--tasks", "gatelab_blimp", "--runs-dir", str(folder / "runs"),
                         cwd=folder)
    assert result.returncode == 2 and "no MLflow run '0123456789abcdef'" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_typo_of_gatelab_s_task_is_answered_from_gatelab_s_own_index():
    """lm-eval has no task with gatelab's prefix: the error names gatelab's nearest task without indexing lm-eval's
    14,000 task files first."""
    from gatelab.eval.scoring import check_tasks, task_manager

    manager = task_manager(tasks=["gatelab_blimpp"])
    assert "gatelab_blimp" in manager.all_tasks and "hellaswag" not in manager.all_tasks
    with pytest.raises(GatelabError, match="no task 'gatelab_blimpp'; did you mean gatelab_blimp"):
        check_tasks(["gatelab_blimpp"], manager)


def test_lm_eval_s_git_lookup_prints_nothing_outside_a_clone(tmp_path):
    """lm-eval runs `git describe` in the working folder, git's stderr on ours: `gatelab eval` printed "fatal: not a
    git repository" outside a clone. Within quiet_git its results name gatelab's commit, and git says nothing."""
    import subprocess
    import sys

    look_up = ("from lm_eval import evaluator; from gatelab.eval.harness import quiet_git\n"
               "with quiet_git(): print(evaluator.get_git_commit_hash())\n")
    quiet = subprocess.run([sys.executable, "-c", look_up], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    assert quiet.stdout.strip() == tracking.code_version()["gatelab.git_commit"]
    bare = subprocess.run([sys.executable, "-c", "from lm_eval import evaluator; evaluator.get_git_commit_hash()"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert "not a git repository" in bare.stderr  # what quiet_git keeps off the terminal
