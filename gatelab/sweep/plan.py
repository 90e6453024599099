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

Estimated seconds = FLOPs / throughput, the training loop only: process start, data loading, evaluation and probes
come on top (results/bench/ has measured figures).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gatelab import paper as paper_tables
from gatelab.config import ExperimentConfig, ModelConfig
from gatelab.data.budget import CorpusCounter, format_tokens, repeat_warning
from gatelab.sweep.spec import RunSpec, format_value, load_sweep

# A rough default for a small CPU in bf16 autocast, in the Lightning loop; measured figures live in results/bench/
# (`gatelab bench` reports a machine's achieved FLOP/s; --flops-per-second passes one to the plan). Other processes on
# the same cores slow a run further: read CPU estimates as lower bounds.
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


def plan_rows(specs: Sequence[RunSpec], paper: str | None = None, flops_per_second: float | None = None,
              trials: int = 1) -> list[dict[str, Any]]:
    """One row per run. `paper` adds the paper's added-parameter figure (table1, table6); `trials` > 1 for a search
    sweep, where each row is one cell searched `trials` times (row figures are per trial, totals count them all)."""
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
            "trials": trials,
        }
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
    throughputs = sorted({row["flops_per_second"] for row in rows})
    console.print(f"{totals['runs']} runs, {format_tokens(totals['tokens'])} tokens, {totals['flops']:.2e} FLOPs, about "
                  f"{_duration(totals['seconds'])} of training at "
                  f"{', '.join(f'{t:.2g}' for t in throughputs)} FLOP/s (evaluation and start-up not included)",
                  highlight=False)
    for note in notes:
        console.print(note, highlight=False, markup=False)


def cli_plan(sweep_path: Path, experiment: Path | None = None, as_json: bool = False,
             flops_per_second: float | None = None) -> None:
    """`gatelab sweep plan`: load and validate the sweep (GatelabError on any bad cell), then print its plan."""
    sweep = load_sweep(sweep_path, experiment)
    trials = sweep.search.n_trials if sweep.search else 1
    rows = plan_rows(sweep.runs, paper=sweep.paper, flops_per_second=flops_per_second, trials=trials)
    notes = [str(duplicate) for duplicate in sweep.duplicates]
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
    "CPU_FLOPS", "GPU_FLOPS", "ParameterCounter", "active_parameters", "cli_plan", "corpus_warnings",
    "plan_json", "plan_rows", "plan_totals", "render_plan", "training_flops",
]
