"""Benchmark scores from lm-evaluation-harness, logged into gatelab's MLflow runs: `gatelab eval` for runs that have
finished (from their checkpoints), and `score_live` for a model at the end of its training.

A run's scores for a task are metrics ``lm_eval/<task>/<metric>`` (and ``lm_eval/<task>/<metric>/stderr``), the
harness's results JSON an artifact ``lm_eval/<task>.json``, and last a tag ``gatelab.lm_eval.<task>`` holding the
settings they were made with (task version, few-shot count, limit). The tag is what makes scoring idempotent: a run
whose tag matches is not scored again, and a scorer killed before the tag is written leaves the task to score again,
never a tag over missing metrics.

Plain processes for `--workers`, not the sweep's Optuna ledger: scoring is keyed by that tag, so two processes that
scored the same run would log the same values twice, not corrupt anything. Each gets a GPU of its own, as sweep workers.
"""

from __future__ import annotations

import difflib
import json
import logging
import math
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import Any
from unittest import mock

from tqdm import tqdm

from gatelab.data.hub import hub_unreachable
from gatelab.errors import GatelabError
from gatelab.metrics import LM_EVAL, LM_EVAL_STDERR
from gatelab.tracking import RunStore

ARTIFACT_FOLDER = "lm_eval"  # of the results JSONs
TAG_PREFIX = "gatelab.lm_eval."


@dataclass(frozen=True)
class HarnessSettings:
    """What the harness is asked: tasks and the settings that change their scores."""

    tasks: tuple[str, ...]
    num_fewshot: int | None = None
    limit: float | None = None  # documents per task (an integer), or a fraction of them below 1
    include_path: str | None = None  # a folder of the user's own task YAMLs, beside gatelab's
    batch_size: int = 16


LOCAL_TASK_PREFIX = "gatelab_"  # gatelab's offline tasks (gatelab/eval/tasks)


def task_manager(include_path: str | None = None, tasks: Sequence[str] = ()):
    """lm-eval's task index over gatelab's offline tasks and the user's folder, and lm-eval's own tasks unless those
    two hold every task named (indexing lm-eval's 14,000 task files takes about 18 s)."""
    from lm_eval.tasks import TaskManager

    from gatelab.eval.harness import local_task_dir

    paths = [str(local_task_dir())]
    if include_path:
        folder = Path(include_path).expanduser()
        if not folder.is_dir():
            raise GatelabError(f"--include-path {include_path}: no such folder; give a folder of lm-eval task YAMLs")
        paths.append(str(folder))
    local = TaskManager(include_path=paths, include_defaults=False)
    # A name with gatelab's prefix is one of gatelab's tasks or a typo of one (lm-eval has none of that name): its
    # error, naming the nearest of gatelab's tasks, comes without indexing lm-eval's.
    if tasks and all(task in local.all_tasks or task.startswith(LOCAL_TASK_PREFIX) for task in tasks):
        return local
    return TaskManager(include_path=paths)


def check_tasks(tasks: Sequence[str], manager) -> None:
    """An unknown task is one error naming the nearest valid names (lm-eval's index is the list of valid names)."""
    known = set(manager.all_tasks)
    for task in tasks:
        if task not in known:
            near = difflib.get_close_matches(task, sorted(known), n=5, cutoff=0.6)
            hint = f"did you mean {', '.join(near)}? " if near else ""
            raise GatelabError(f"--tasks: lm-eval has no task {task!r}; {hint}`python -m gatelab.eval.harness --tasks "
                               f"list` lists them all (gatelab's offline tasks start with {LOCAL_TASK_PREFIX})")


def task_version(task: str, manager) -> Any:
    """The task's `metadata.version` as its YAML declares it (None for a task defined in Python)."""
    from lm_eval.tasks._yaml_loader import load_yaml

    entry = manager.task_index.get(task)
    if entry is None or entry.yaml_path is None:
        return None
    try:
        return (load_yaml(entry.yaml_path, resolve_func=False).get("metadata") or {}).get("version")
    except (OSError, ValueError):
        return None


def settings_tag(task: str, settings: HarnessSettings, manager) -> str:
    return json.dumps({"version": task_version(task, manager), "num_fewshot": settings.num_fewshot,
                       "limit": settings.limit}, sort_keys=True)


def metrics_of(task: str, task_results: dict[str, Any]) -> dict[str, float]:
    """lm-eval's ``{"acc,none": 0.5, "acc_stderr,none": 0.1, ...}`` as ``lm_eval/<task>/acc`` and
    ``lm_eval/<task>/acc/stderr``; a filter other than `none` joins the metric's name (``exact_match_strict-match``)."""
    metrics = {}
    for key, value in task_results.items():
        if "," not in key or not isinstance(value, int | float) or isinstance(value, bool):
            continue  # "alias", "samples", and "N/A" where a stderr could not be computed
        name, filter_name = key.split(",", 1)
        stderr = name.endswith("_stderr")
        name = name.removesuffix("_stderr") + ("" if filter_name == "none" else f"_{filter_name}")
        if math.isfinite(value):
            metrics[(LM_EVAL_STDERR if stderr else LM_EVAL).format(task=task, measure=name)] = float(value)
    return metrics


def _offline_error(task: str, error: BaseException) -> GatelabError:
    reason = hub_unreachable()
    if reason is None:
        return GatelabError(f"task {task!r} could not be loaded ({type(error).__name__}: "
                            f"{str(error).splitlines()[0][:300] if str(error) else ''})")
    return GatelabError(
        f"task {task!r} needs its dataset from the Hugging Face Hub, which cannot be reached ({reason}); download the "
        "dataset where the Hub is reachable and write a task YAML with `dataset_path: json` (or parquet) and "
        "`dataset_kwargs: {data_files: {test: /path/to/file}}` in a folder given to --include-path, as gatelab's own "
        "offline tasks do (gatelab/eval/tasks)")


def load_tasks(settings: HarnessSettings, manager) -> dict:
    """lm-eval's task objects by the name asked for (a task, a group whose scores lm-eval aggregates, or a tag's
    tasks as a list), loaded once (datasets included) before any model is: a task whose data cannot be had fails
    here, as one message. TaskManager.load, not get_task_dict, which lm-eval deprecates."""
    if hub_unreachable() is not None:
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # fail at once rather than retry the network
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    quiet_lm_eval()
    loaded = {}
    for task in settings.tasks:
        try:
            built = manager.load([task])
        except GatelabError:
            raise
        except Exception as error:  # noqa: BLE001  datasets and lm-eval raise many kinds for a dataset out of reach
            raise _offline_error(task, error) from None
        loaded[task] = built["groups"].get(task) or built["tasks"].get(task) or list(built["tasks"].values())
    return loaded


def evaluate(lm, settings: HarnessSettings, tasks: dict, manager) -> dict[str, Any]:
    """The harness's results for `lm` on the loaded `tasks`. `manager` is the task index they were loaded from:
    without it `simple_evaluate` builds lm-eval's whole index again (14,000 task files, about 10 s) for every run."""
    from lm_eval import simple_evaluate

    from gatelab.eval.harness import quiet_git

    quiet_lm_eval()
    objects = [o for value in tasks.values() for o in (value if isinstance(value, list) else [value])]
    with quiet_git(), _labelled_request_bar():
        return simple_evaluate(model=lm, tasks=objects, num_fewshot=settings.num_fewshot,
                               limit=settings.limit, log_samples=False, bootstrap_iters=1000, task_manager=manager)


def quiet_lm_eval() -> None:
    """lm-eval's warnings only, without its hint about its own `--metadata`: it says it for every task with a
    custom_dataset (gatelab_blimp has one) when the task loads its data, and `gatelab eval` has no such option
    (gatelab passes what its datasets need itself)."""
    logging.getLogger("lm_eval").setLevel(logging.WARNING)
    logging.getLogger("lm_eval.api.task").addFilter(_drop_metadata_hint)


def _drop_metadata_hint(record: logging.LogRecord) -> bool:
    return "Custom kwargs can be passed to `--metadata`" not in record.getMessage()


def _labelled_request_bar():
    """lm-eval (0.4.13) builds each task's requests under a progress bar with no label (`0%| | 0/40`): this one
    says what it counts, for the length of one evaluation."""
    import lm_eval.api.task

    return mock.patch.object(lm_eval.api.task, "tqdm", partial(tqdm, desc="lm-eval: building requests"))


def record(store: RunStore, run_id: str, results: dict[str, Any], tags: dict[str, str]) -> dict[str, float]:
    """Each task's metrics and results JSON into the run, then its tag (last: see the module docstring)."""
    logged: dict[str, float] = {}
    for task, tag in tags.items():
        metrics = metrics_of(task, results["results"].get(task, {}))
        payload = {key: results.get(key, {}).get(task) for key in ("results", "versions", "n-shot", "configs",
                                                                     "n-samples", "higher_is_better")}
        payload["lm_eval_version"] = results.get("lm_eval_version") or metadata.version("lm_eval")
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / f"{task}.json"
            path.write_text(json.dumps(payload, indent=1, default=str))
            store.log_scores(run_id, metrics, {TAG_PREFIX + task: tag}, [path], ARTIFACT_FOLDER)
        logged |= metrics
    return logged


@dataclass(frozen=True)
class Target:
    """A finished run to score (gatelab.app.score finds them: a sweep's, or one run id)."""

    run_id: str
    label: str  # what the user sees: "<variant> seed <n>" or the run id


def pending_tasks(store: RunStore, target: Target, tags: dict[str, str]) -> dict[str, str]:
    """The tasks (with their settings tag) this run has not been scored on with these settings."""
    recorded = store.run_data(target.run_id).tags
    return {task: tag for task, tag in tags.items() if recorded.get(TAG_PREFIX + task) != tag}


def score_runs(targets: Sequence[Target], settings: HarnessSettings, uri: str, runs_dir: Path,
               log=print) -> dict[str, int]:
    """Score every target on the tasks it lacks; returns counts of runs scored and skipped."""
    from gatelab.devices import device_name
    from gatelab.eval.harness import GatelabLM

    store = RunStore(uri, runs_dir)
    manager = task_manager(settings.include_path, settings.tasks)
    check_tasks(settings.tasks, manager)
    tags = {task: settings_tag(task, settings, manager) for task in settings.tasks}
    todo = [(t, pending_tasks(store, t, tags)) for t in targets]
    todo = [(t, pending) for t, pending in todo if pending]
    counts = {"scored": 0, "skipped": len(targets) - len(todo)}
    if not todo:
        return counts
    loaded = load_tasks(settings, manager)
    for target, pending in todo:
        lm = GatelabLM(run=target.run_id, tracking_uri=uri, runs_dir=str(runs_dir), batch_size=settings.batch_size)
        log(f"scoring {target.label} on {', '.join(pending)} ({device_name(lm.device)})")
        results = evaluate(lm, settings, {task: loaded[task] for task in pending}, manager)
        metrics = record(store, target.run_id, results, pending)
        log("  " + ", ".join(f"{name.split('/', 1)[1]} {value:.4f}" for name, value in metrics.items()
                             if not name.endswith("/stderr")))
        counts["scored"] += 1
    return counts


def _score_share(args: tuple) -> dict[str, int]:
    targets, settings, uri, runs_dir = args
    return score_runs(targets, settings, uri, runs_dir)


def _use_devices(env: dict[str, str]) -> None:
    """A scoring process's first act: its CUDA_VISIBLE_DEVICES, set before anything in it initialises CUDA."""
    os.environ.update(env)


def score_in_parallel(targets: Sequence[Target], settings: HarnessSettings, uri: str, runs_dir: Path, workers: int,
                      log=print) -> dict[str, int]:
    """`score_runs` over `workers` processes, the runs dealt out round-robin, each process on its own GPU where there
    are GPUs (see the module docstring)."""
    if workers <= 1 or len(targets) <= 1:
        return score_runs(targets, settings, uri, runs_dir, log)
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor  # looked up here, where a test stands in for it

    from gatelab.devices import worker_gpus

    shares = [list(targets[i::workers]) for i in range(workers)]
    shares = [s for s in shares if s]
    gpus = worker_gpus(len(shares))
    if gpus.per_worker:
        log(gpus.launch_line())
    # A pool of one process per share: a process's CUDA_VISIBLE_DEVICES counts only until CUDA starts in it, so a
    # process of a shared pool that took a second share would score it on the first share's GPU.
    context = multiprocessing.get_context("spawn")
    pools = [ProcessPoolExecutor(1, mp_context=context, initializer=_use_devices, initargs=(gpus.env(index),))
             for index in range(len(shares))]
    try:
        futures = [pool.submit(_score_share, (share, settings, uri, runs_dir)) for pool, share in zip(pools, shares)]
        results = [future.result() for future in futures]
    finally:
        for pool in pools:
            pool.shutdown(cancel_futures=True)
    return {key: sum(r[key] for r in results) for key in ("scored", "skipped")}


def score_live(model, tokenizer, bos_id: int, eos_id: int, seq_len: int, precision: str, settings: HarnessSettings
               ) -> tuple[dict[str, float], dict[str, Any], dict[str, str]]:
    """The harness on a model in memory (the end of a training run): (metrics, results JSON per task, the settings
    tags that make `gatelab eval` skip these tasks)."""
    from gatelab.eval.harness import GatelabLM

    manager = task_manager(settings.include_path, settings.tasks)
    check_tasks(settings.tasks, manager)
    lm = GatelabLM.from_model(model, tokenizer, bos_id, seq_len, batch_size=settings.batch_size, precision=precision,
                              eos_id=eos_id)
    results = evaluate(lm, settings, load_tasks(settings, manager), manager)
    metrics = {}
    for task in settings.tasks:
        metrics |= metrics_of(task, results["results"].get(task, {}))
    payloads = {task: {key: results.get(key, {}).get(task) for key in ("results", "versions", "n-shot")}
                for task in settings.tasks}
    return metrics, payloads, {TAG_PREFIX + task: settings_tag(task, settings, manager) for task in settings.tasks}
