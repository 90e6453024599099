"""End-of-run evaluation: the paper's metrics as MLflow metrics, and their per-layer detail and plots as artifacts."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: runs write PNG files, never open windows
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from gatelab.config import ExperimentConfig  # noqa: E402
from gatelab.data.datasets import heldout_windows, long_context_windows, unigram_perplexity  # noqa: E402
from gatelab.data.tokenizer import bos_id  # noqa: E402
from gatelab.eval.benchmarks import load_blimp, run_in_context_suite, score_blimp  # noqa: E402
from gatelab.eval.metrics import domain_perplexities, long_context_perplexity  # noqa: E402
from gatelab.eval.probes import ProbeReport, probe_model  # noqa: E402

LONG_CONTEXT_DOMAIN = "speeches"  # State of the Union addresses: the long held-out documents


def evaluate(model, experiment: ExperimentConfig, tokenizer, corpus, domains: list[str], loss_history, spikes: list[int],
             log=print) -> tuple[dict[str, float], dict[str, Callable[[Path], None]]]:
    """(metrics for MLflow, artifact writers by file name)."""
    evaluation, seq_len = experiment.eval, experiment.data.seq_len
    model = model.float().eval()
    metrics: dict[str, float] = {}
    windows = {d: torch.from_numpy(heldout_windows(corpus, d, seq_len, evaluation.max_windows_per_domain))
               for d in domains}
    for domain, value in domain_perplexities(model, windows, evaluation.batch_size).items():
        metrics[f"ppl/{domain}"] = value
    unigram = [unigram_perplexity(corpus.tokens(d, "train"), corpus.tokens(d, "heldout"), corpus.vocab_size)
               for d in domains]
    metrics["unigram_ppl/avg"] = float(np.mean(unigram))

    if LONG_CONTEXT_DOMAIN in domains:
        multipliers = evaluation.long_context_multipliers
        longest = long_context_windows(corpus, LONG_CONTEXT_DOMAIN, seq_len, multipliers)[max(multipliers)]
        documents = [torch.from_numpy(row) for row in longest]
        for m, result in long_context_perplexity(model, documents, seq_len, multipliers,
                                                    batch_size=evaluation.batch_size).items():
            if result is not None:
                metrics[f"long_ppl/x{m}"] = result["ppl"]
                if result["ppl_beyond_train_len"] is not None:
                    metrics[f"long_ppl_beyond_train/x{m}"] = result["ppl_beyond_train_len"]

    if evaluation.blimp_path:
        pairs = load_blimp(Path(evaluation.blimp_path), per_paradigm=evaluation.blimp_per_paradigm,
                           seed=experiment.seed)
        blimp = score_blimp(model, tokenizer, pairs, bos_id=bos_id(tokenizer), batch_size=evaluation.batch_size)
        metrics["blimp/accuracy"] = blimp["accuracy"]

    reserved = [bos_id(tokenizer), corpus.eos_id]
    for task, accuracy in run_in_context_suite(model, corpus.vocab_size, seq_len, seed=experiment.seed,
                                               reserved_ids=reserved, n_examples=evaluation.in_context_examples,
                                               batch_size=evaluation.batch_size).items():
        metrics[f"icl/{task.replace('@', '_len')}"] = accuracy  # MLflow refuses '@' in metric names

    mixed = torch.cat([w[: evaluation.batch_size] for w in windows.values()])[:, :-1]
    batches = [mixed[i::evaluation.probe_batches] for i in range(evaluation.probe_batches)]
    report = probe_model(model, [b for b in batches if len(b)])
    metrics.update({f"probe/{k}": v for k, v in report.summary().items()})
    metrics["train/spikes_total"] = float(len(spikes))

    steps = [m.step for m in loss_history]
    losses = [m.value for m in loss_history]
    artifacts = {
        "probes.json": lambda path: path.write_text(json.dumps(report.to_dict(), indent=1)),
        "loss_curve.png": lambda path: plot_loss(path, steps, losses, spikes, experiment.variant),
        "first_token_attention.png": lambda path: plot_first_token_attention(path, report, experiment.variant),
    }
    if report.gate_histogram:
        artifacts["gate_score_histogram.png"] = lambda path: plot_gate_histogram(path, report, experiment.variant)
    return metrics, artifacts


@contextmanager
def _figure(path: Path, title: str, xlabel: str, ylabel: str) -> Iterator[plt.Axes]:
    figure, axis = plt.subplots(figsize=(6, 3.5))
    yield axis
    axis.set(xlabel=xlabel, ylabel=ylabel, title=title)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def plot_loss(path: Path, steps: list[int], losses: list[float], spikes: list[int], label: str) -> None:
    with _figure(path, "Training loss, spikes marked", "step", "training loss (nats)") as axis:
        axis.plot(steps, losses, lw=1, label=label)
        marked = [s for s in spikes if s in steps]
        axis.scatter(marked, [losses[steps.index(s)] for s in marked], color="red", s=12, label="spikes", zorder=3)


def plot_first_token_attention(path: Path, report: ProbeReport, label: str) -> None:
    with _figure(path, "First-token attention per layer (Figure 2)", "layer", "attention on token 0") as axis:
        axis.plot(range(report.n_layers), report.first_token_share, marker="o",
                  label=f"{label} (F-Attn {report.f_attn:.3f})")


def plot_gate_histogram(path: Path, report: ProbeReport, label: str) -> None:
    with _figure(path, "Gate scores (Figure 3)", "gate score", "share") as axis:
        edges = np.linspace(0, 1, len(next(iter(report.gate_histogram.values()))[0]) + 1)
        for position, per_layer in report.gate_histogram.items():
            counts = np.sum(per_layer, axis=0)
            axis.stairs(counts / max(counts.sum(), 1), edges, label=f"{label} {position}")
