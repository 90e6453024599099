"""`gatelab sweep plan`: what a sweep will cost before it runs. One row per run, parameters counted on the meta device.

Training FLOPs per run (PaLM, Chowdhery et al. 2022, appendix B: 6N + 12LHQT per token):

    FLOPs = 6 * N_active * tokens  +  12 * n_layers * seq_len * n_heads * head_dim * tokens
    tokens = train.max_steps * train.batch_size * data.seq_len

N_active is every parameter that takes part in a matmul for each token: all parameters except the input embedding
table (a lookup costs no FLOPs; the output head is a V x D matmul whether tied or not, and at gatelab's small
vocabularies-to-width ratios leaving it out would undercount the tiny presets by a third), with each MoE layer's
routed experts counted at top_k / n_experts. Switch-Head experts are counted in full: gatelab computes every expert's
projection and then mixes them. The attention term is the QK^T and AV matmuls without the causal halving, as PaLM.

What a run will see: `corpus_tokens`, the training tokens its corpus holds (`corpus_count` says whether that is exact,
an estimate or unknown: `gatelab.data.budget`), and `passes` = tokens / corpus_tokens. A run above one pass repeats
its training data, and gets a warning line under the table.

Estimated seconds, measured where it can be: every run records `time/step_s` (its mean seconds a training step) and
the machine it ran on (`gatelab.host`), so a run of the same shape (`STEP_SHAPE`) that this machine finished before
prices a run at its median step time x max_steps, plus its median seconds of set-up and evaluation. Otherwise a rough
guess: FLOPs / an assumed throughput, the training loop only (process start, data loading, evaluation and probes come
on top; results/bench/ has measured figures).
"""

from __future__ import annotations

import json
import socket
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gatelab import paper as paper_tables
from gatelab.config import ExperimentConfig, ModelConfig, flatten
from gatelab.data.budget import CorpusCounter, format_tokens, repeat_warning
from gatelab.progress import DONE, HOST_TAG, format_duration, step_time
from gatelab.sweep.spec import RunSpec, format_value, load_sweep

# A rough default for a small CPU in bf16 autocast, in the Lightning loop; measured figures live in results/bench/
# (`gatelab bench` reports a machine's achieved FLOP/s; --flops-per-second passes one to the plan). Other processes on
# the same cores slow a run further.
CPU_FLOPS = 7.0e10
# 40% of one H100's dense bf16 peak (989 TFLOP/s): a realistic model FLOPs utilisation for small models.
GPU_FLOPS = 4.0e14


class ParameterCounter:
    """count_parameters with a cache per distinct model config: a paper-scale plan counts each model once."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}

    def __call__(self, model: ModelConfig) -> int:
        from gatelab.model.params import count_parameters

        key = model.model_dump_json()
        if key not in self._counts:
            self._counts[key] = count_parameters(model)
        return self._counts[key]


def active_parameters(model: ModelConfig, total: int) -> int:
    """N_active of the module docstring: no input embedding table, routed experts at top_k / n_experts."""
    embedding = model.vocab_size * model.d_model
    active = total - (0 if model.tie_embeddings else embedding)  # tied: the one table is the output head's matmul
    if model.ffn == "moe" and model.moe is not None:
        per_expert = 3 * model.d_model * model.moe.expert_hidden  # SwiGLU gate, up and down
        active -= model.n_layers * (model.moe.n_experts - model.moe.top_k) * per_expert
    return active


def training_flops(model: ModelConfig, active: int, tokens: int, seq_len: int) -> float:
    attention_per_token = 12 * model.n_layers * seq_len * model.n_heads * model.head_dim
    return float(6 * active * tokens + attention_per_token * tokens)


def default_flops_per_second(experiment: ExperimentConfig) -> float:
    return GPU_FLOPS if experiment.train.accelerator in ("gpu", "cuda") else CPU_FLOPS


# What a training step costs on one machine, read from a run's MLflow params: the model's shape, the batch, the
# precision and the devices. The variant is not in it (a gate adds a few percent); runs of the same variant are
# preferred where there are some.
STEP_SHAPE = ("model.vocab_size", "model.n_layers", "model.d_model", "model.n_heads", "model.n_kv_heads",
              "model.head_dim", "model.ffn", "model.ffn_hidden", "train.batch_size", "data.seq_len", "train.precision",
              "train.accelerator", "train.devices", "train.num_nodes", "train.threads")


@dataclass(frozen=True)
class MeasuredRun:
    """One finished run of this machine, as its MLflow run recorded it."""

    shape: tuple[str, ...]
    variant: str
    seconds_per_step: float
    overhead_s: float  # setup_s + eval_s: around training, once a run (import_s is once a process)


@dataclass(frozen=True)
class MeasuredStep:
    seconds_per_step: float
    overhead_s: float
    runs: int


def step_shape(params: Mapping[str, Any]) -> tuple[str, ...]:
    """The STEP_SHAPE values as MLflow keeps params: as strings."""
    return tuple(str(params.get(key)) for key in STEP_SHAPE)


def measured_runs(uri: str, host: str | None = None) -> list[MeasuredRun]:
    """The newest thousand finished runs of the store that `host` (this machine) trained and timed, in any MLflow
    experiment (a `gatelab train` of the preset counts for a sweep over it: STEP_SHAPE decides what is comparable); []
    where the store does not exist (a plan never creates one). A store that fails raises GatelabError."""
    from gatelab import tracking

    if tracking.missing_local_store(uri):
        return []
    host = host or socket.gethostname()
    found = []
    with tracking.store_errors(uri):
        client = tracking.client(uri)
        ids = [experiment.experiment_id for experiment in client.search_experiments()]
        if not ids:
            return []
        runs = client.search_runs(ids, f"tags.`{HOST_TAG}` = '{host}' AND tags.`{tracking.STATUS_TAG}` = 'finished'",
                                  order_by=["attributes.start_time DESC"], max_results=1000)
    for run in runs:
        metrics, params = run.data.metrics, run.data.params
        if "time/step_s" not in metrics:
            continue
        found.append(MeasuredRun(step_shape(params), params.get("variant", ""), metrics["time/step_s"],
                                 metrics.get("time/setup_s", 0.0) + metrics.get("time/eval_s", 0.0)))
    return found


def measured_step(experiment: ExperimentConfig, measured: Sequence[MeasuredRun]) -> MeasuredStep | None:
    """The median cost of earlier runs of this experiment's shape (of its variant, where there are some)."""
    shape = step_shape(flatten(experiment))
    same = [run for run in measured if run.shape == shape]
    same = [run for run in same if run.variant == experiment.variant] or same
    if not same:
        return None
    return MeasuredStep(statistics.median(run.seconds_per_step for run in same),
                        statistics.median(run.overhead_s for run in same), len(same))


def plan_rows(specs: Sequence[RunSpec], paper: str | None = None, flops_per_second: float | None = None,
              trials: int = 1, measured: Sequence[MeasuredRun] = ()) -> list[dict[str, Any]]:
    """One row per run. `paper` adds the paper's added-parameter figure (table1, table6); `trials` > 1 for a search
    sweep, where each row is one cell searched `trials` times (row figures are per trial, totals count them all).
    `seconds` comes from `measured` runs of the same shape where there are some (`basis` "measured"), else from FLOPs
    (`basis` "flops")."""
    from gatelab.model.params import resolve_model

    count = ParameterCounter()
    count_corpus = CorpusCounter()
    paper_added = paper_tables.added_params(paper)
    rows = []
    for spec in specs:
        experiment = spec.experiment
        model = resolve_model(experiment)
        total = count(model)
        added = total - count(resolve_model(experiment, "baseline"))
        active = active_parameters(model, total)
        tokens = experiment.train.max_steps * experiment.train.batch_size * experiment.data.seq_len
        flops = training_flops(model, active, tokens, experiment.data.seq_len)
        throughput = flops_per_second or default_flops_per_second(experiment)
        corpus = count_corpus(experiment.data, experiment.model.vocab_size)
        row: dict[str, Any] = {
            "index": spec.index,
            "label": spec.label(),
            "hash": spec.hash,
            "variant": experiment.variant,
            "seed": experiment.seed,
            "overrides": " ".join(f"{key}={format_value(value)}" for key, value in spec.settings().items()),
            "total_params": total,
            "added_params": added,
            "active_params": active,
            "tokens": tokens,
            "corpus_tokens": corpus.tokens,
            "corpus_count": corpus.how,
            "corpus_note": corpus.note,
            "passes": corpus.passes(tokens),
            "flops": flops,
            "flops_per_second": throughput,
            "seconds": flops / throughput,
            "basis": "flops",
            "trials": trials,
        }
        step = measured_step(experiment, measured) if measured else None
        if step is not None:
            row.update(seconds=step.seconds_per_step * experiment.train.max_steps + step.overhead_s, basis="measured",
                       measured_step_s=step.seconds_per_step, measured_overhead_s=step.overhead_s,
                       measured_runs=step.runs)
        if paper_added is not None:
            row["paper_added_m"] = paper_added.get(experiment.variant)
        rows.append(row)
    return rows


def plan_totals(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    seconds = sum(row["seconds"] * row["trials"] for row in rows)
    return {
        "runs": sum(row["trials"] for row in rows),
        "tokens": sum(row["tokens"] * row["trials"] for row in rows),
        "flops": sum(row["flops"] * row["trials"] for row in rows),
        "seconds": seconds,
        "hours": seconds / 3600,
    }


def _index_ranges(indices: Sequence[int]) -> str:
    """[0, 1, 2, 5] -> "0-2, 5"."""
    spans: list[list[int]] = []
    for index in sorted(indices):
        if spans and index == spans[-1][1] + 1:
            spans[-1][1] = index
        else:
            spans.append([index, index])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _runs(indices: Sequence[int]) -> str:
    return f"run {indices[0]}" if len(indices) == 1 else f"runs {_index_ranges(indices)}"


def corpus_warnings(rows: Sequence[dict[str, Any]], specs: Sequence[RunSpec]) -> list[str]:
    """One warning per distinct case of runs that would pass over their corpus more than once (same corpus count and
    tokens: the same factor), and one line per distinct way a corpus was estimated or could not be counted."""
    cases: dict[tuple, list[int]] = {}
    experiments = {spec.index: spec.experiment for spec in specs}
    for row in rows:
        if row["passes"] is not None and row["passes"] > 1:
            cases.setdefault((row["tokens"], row["corpus_tokens"], row["corpus_count"]), []).append(row["index"])
    lines = []
    for (tokens, corpus_tokens, how), indices in cases.items():
        experiment = experiments[indices[0]]
        subject = _runs(indices)
        lines.append("warning: " + repeat_warning(subject, experiment.data, tokens, corpus_tokens,
                                                  experiment.train.batch_size * experiment.data.seq_len,
                                                  estimated=how == "estimate"))
    for how, mark in (("estimate", "~"), ("unknown", "?")):
        notes: dict[str, list[int]] = {}
        for row in rows:
            if row["corpus_count"] == how:
                notes.setdefault(row["corpus_note"], []).append(row["index"])
        lines += [f"corpus {mark} ({_runs(indices)}): {note}" for note, indices in notes.items()]
    return lines


def plan_json(rows: Sequence[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"runs": list(rows), "totals": plan_totals(rows), **extra}


def _params(count: int, signed: bool = False) -> str:
    sign = "+" if signed and count else ""
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(count) >= scale:
            return f"{count / scale:{sign}.2f}{suffix}"
    return f"{count:{sign}d}"



def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.1f}m"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f}h"
    if seconds < 365 * 86400:
        return f"{seconds / 86400:.1f}d"
    years = seconds / (365.25 * 86400)
    return f"{years:.3g}y" if years < 1000 else f"{years:,.0f}y"


def render_plan(rows: Sequence[dict[str, Any]], as_json: bool = False, *, title: str | None = None,
                notes: Sequence[str] = (), extra: dict[str, Any] | None = None, console: Any = None) -> None:
    """Print the plan: a rich table with a totals line and notes, or JSON {"runs": [...], "totals": {...}, ...}."""
    if as_json:
        print(json.dumps(plan_json(rows, **(extra or {})), indent=2), file=getattr(console, "file", sys.stdout))
        return
    from rich.console import Console
    from rich.table import Table

    console = console or (Console(markup=False) if sys.stdout.isatty() else Console(width=200, markup=False))
    with_paper = any("paper_added_m" in row for row in rows)
    with_trials = any(row["trials"] > 1 for row in rows)
    table = Table(box=None, title=title, title_justify="left")
    columns = ["#", "variant", "seed", "overrides", "total", "added"] + (["paper added"] if with_paper else []) \
        + ["tokens", "corpus", "passes", "FLOPs", "est. time"] + (["trials"] if with_trials else [])
    for column in columns:
        table.add_column(column, justify="left" if column in ("variant", "overrides") else "right")
    for row in rows:
        cells = [str(row["index"]), row["variant"], str(row["seed"]), row["overrides"] or "-",
                 _params(row["total_params"]), _params(row["added_params"], signed=True)]
        if with_paper:
            paper = row.get("paper_added_m")
            cells.append("n/a" if paper is None else f"{paper:+g}M")
        mark = {"estimate": "~", "unknown": "?"}.get(row["corpus_count"], "")
        corpus = "?" if row["corpus_tokens"] is None else mark + format_tokens(row["corpus_tokens"])
        passes = "?" if row["passes"] is None else f"{mark}{row['passes']:.3g}"
        cells += [format_tokens(row["tokens"]), corpus, passes, f"{row['flops']:.2e}", _duration(row["seconds"])]
        if with_trials:
            cells.append(str(row["trials"]))
        table.add_row(*cells)
    console.print(table)
    totals = plan_totals(rows)
    console.print(f"{totals['runs']} runs, {format_tokens(totals['tokens'])} tokens, {totals['flops']:.2e} FLOPs",
                  highlight=False)
    for line in estimate_lines(rows):
        console.print(line, highlight=False, markup=False)
    for note in notes:
        console.print(note, highlight=False, markup=False)


def estimate_lines(rows: Sequence[dict[str, Any]], workers: int = 1, what: str = "") -> list[str]:
    """The estimated time of `rows` (runs to train, split over `workers`), and how it was made: one line for the total,
    one per basis (measured here, or a rough guess from FLOPs)."""
    if not rows:
        return []
    totals = plan_totals(rows)
    per_run = totals["seconds"] / totals["runs"]
    shared = f" on {workers} workers" if workers > 1 else ""
    longest = max(row["seconds"] for row in rows)
    measured = [row for row in rows if row["basis"] == "measured"]
    guessed = [row for row in rows if row["basis"] == "flops"]
    # A FLOPs guess can be off several-fold either way (the quickstart's 150 tiny steps took 0.27 s each on 2 idle
    # cores, against the guess's 1.0 s; under load, 2-5x longer), so it is labelled a rough guess, not a bound.
    about = "roughly" if guessed else "about"
    lines = [f"estimate: {about} {format_duration(max(totals['seconds'] / workers, longest))} for {totals['runs']} "
             f"{what}run(s){shared}, {format_duration(per_run)} a run"]
    if measured:
        steps = statistics.median(row["measured_step_s"] for row in measured)
        overhead = statistics.median(row["measured_overhead_s"] for row in measured)
        earlier = max(row["measured_runs"] for row in measured)
        lines.append(f"  measured on this machine ({len(measured)} of {len(rows)} runs): {step_time(steps)} x "
                     f"max_steps + {format_duration(overhead)} of set-up and evaluation a run, the median of "
                     f"{earlier} earlier run(s) of the same shape; other processes on the same cores slow runs down")
    if guessed:
        rates = ", ".join(f"{rate:.2g}" for rate in sorted({row["flops_per_second"] for row in guessed}))
        lines.append(f"  a rough guess ({len(guessed)} of {len(rows)} runs): training FLOPs (6 x parameters x tokens + "
                     f"attention) at an assumed {rates} FLOP/s, start-up and evaluation not included; runs record "
                     "their step time, so the next plan of the same shape on this machine is measured")
    return lines


def sweep_measurements(specs: Sequence[RunSpec], tracking_uri: str | None,
                       runs_dir: Path) -> tuple[list[MeasuredRun], list[str]]:
    """This machine's earlier finished runs, in the stores these runs will record in; and a note for each store that
    could not be read (the estimate then falls back to FLOPs, the plan still prints)."""
    from gatelab import tracking
    from gatelab.errors import redact

    found, notes = [], []
    for uri in sorted({tracking.run_tracking_uri(tracking_uri, spec.experiment, runs_dir, create=False)
                       for spec in specs}):
        try:
            found += measured_runs(uri)
        except Exception as error:  # a store that is down costs the measured estimate, never the plan
            notes.append(f"no measured step times from {redact(uri)}: {redact(str(error).splitlines()[0])}")
    return found, notes


def sweep_run_estimate(sweep, specs: Sequence[RunSpec], storage: str, tracking_uri: str | None, runs_dir: Path,
                       workers: int) -> list[str]:
    """`gatelab sweep run`'s opening estimate: the runs its ledger has not seen end yet, priced as `sweep plan`
    prices them."""
    from gatelab.sweep.queue import ledger_states

    trials = sweep.search.n_trials if sweep.search else 1
    if sweep.search:  # a search's ledger holds trials, not cells: every cell is priced
        left = list(specs)
    else:
        done = {state.hash for state in ledger_states(storage, runs_dir, sweep.name, specs)
                if state.status in DONE}
        left = [spec for spec in specs if spec.hash not in done]
    if not left:
        return []
    measured, notes = sweep_measurements(left, tracking_uri, runs_dir)
    rows = plan_rows(left, trials=trials, measured=measured)
    return estimate_lines(rows, workers, what="" if len(left) == len(specs) else "remaining ") + notes


def cli_plan(sweep_path: Path, experiment: Path | None = None, as_json: bool = False,
             flops_per_second: float | None = None, tracking_uri: str | None = None,
             runs_dir: Path | None = None) -> None:
    """`gatelab sweep plan`: load and validate the sweep (GatelabError on any bad cell), then print its plan. With
    `runs_dir` (or `tracking_uri`) and no `flops_per_second`, times are measured where that store holds earlier runs of
    the same shape from this machine."""
    sweep = load_sweep(sweep_path, experiment)
    trials = sweep.search.n_trials if sweep.search else 1
    measured, notes = [], []
    if flops_per_second is None and (runs_dir is not None or tracking_uri is not None):
        measured, notes = sweep_measurements(sweep.runs, tracking_uri, runs_dir or Path("runs"))
    rows = plan_rows(sweep.runs, paper=sweep.paper, flops_per_second=flops_per_second, trials=trials,
                     measured=measured)
    notes += [str(duplicate) for duplicate in sweep.duplicates]
    warnings = corpus_warnings(rows, sweep.runs)
    if sweep.search:
        notes.append(f"each row is an Optuna search of {trials} trials over "
                     f"{', '.join(sweep.search.params)} ({sweep.search.direction} {sweep.search.metric})")
    table = paper_tables.TABLES.get(sweep.paper or "")
    if table is not None and table.added and not any("paper_added_m" in row for row in rows):
        notes.append(f"no paper column: {paper_tables.paper_file(table.file)} is missing")
    title = f"{sweep.name}: {len(rows)} runs on {sweep.experiment_path}"
    title += f" (paper {sweep.paper})" if sweep.paper else ""
    extra = {"sweep": sweep.name, "experiment": str(sweep.experiment_path), "paper": sweep.paper,
             "duplicates": [str(d) for d in sweep.duplicates], "warnings": warnings}
    render_plan(rows, as_json, title=title, notes=warnings + notes, extra=extra)


__all__ = [
    "CPU_FLOPS", "GPU_FLOPS", "STEP_SHAPE", "MeasuredRun", "MeasuredStep", "ParameterCounter", "active_parameters",
    "cli_plan", "corpus_warnings", "estimate_lines", "measured_runs", "measured_step", "plan_json", "plan_rows",
    "plan_totals", "render_plan", "step_shape", "sweep_measurements", "sweep_run_estimate", "training_flops",
]
