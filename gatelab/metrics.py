"""What a run records, declared once: each MLflow metric or metric family, its unit, which way is better, which part of
gatelab logs it, whether it is a key column, and when it is logged only sometimes (`condition`).

A family's name has placeholders (`ppl/{domain}`, `long_ppl/x{multiplier}`); PLACEHOLDERS says what each may be.
Every name matches exactly one entry (tests/test_metrics.py checks it against real runs, and that every entry is
logged by a micro run or says when it is). No torch, no MLflow: the sweep's search-metric check and the report read it.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Literal

Better = Literal["lower", "higher", "none"]
# Which part of gatelab logs a metric: the Lightning module's training and validation steps (gatelab.train.module),
# the run around it (gatelab.train.run: time, memory, spikes, how it ended), the end-of-run evaluation
# (gatelab.train.evaluate), its probes (gatelab.eval.probes), lm-evaluation-harness (gatelab.eval.scoring: `gatelab
# eval`, or eval.lm_eval during a run), or Lightning itself.
Part = Literal["train", "run", "eval", "probes", "lm_eval", "lightning"]

# What a placeholder of a family's name stands for, as a regular expression. A domain is any name but `avg`, which is
# the mean over domains (an entry of its own).
PLACEHOLDERS: dict[str, str] = {
    "domain": r"(?!avg$)[A-Za-z0-9_.-]+",
    "multiplier": r"[1-9][0-9]*",
    "length": r"[1-9][0-9]*",
    "layer": r"[0-9]+",
    "block": r"[0-9]+",
    "threshold": r"[0-9][0-9.e-]*",
    "task": r"[A-Za-z0-9_.-]+",
    "measure": r"[A-Za-z0-9_.-]+",
}
_PLACEHOLDER = re.compile(r"\{(\w+)\}")


@dataclass(frozen=True)
class Metric:
    """One metric, or a family of them where `name` has placeholders (`ppl/{domain}`)."""

    name: str
    unit: str
    better: Better
    part: Part
    about: str
    key: bool = False  # a column of the MLflow UI's key-metrics view, and a line `gatelab train` prints
    condition: str | None = None  # when it is logged only sometimes; None: every finished run logs it

    @property
    def is_family(self) -> bool:
        return _PLACEHOLDER.search(self.name) is not None

    @functools.cached_property
    def pattern(self) -> re.Pattern:
        parts = _PLACEHOLDER.split(self.name)  # literal, placeholder, literal, ...
        return re.compile("".join(re.escape(part) if i % 2 == 0 else f"(?P<{part}>{PLACEHOLDERS[part]})"
                                  for i, part in enumerate(parts)))

    def matches(self, name: str) -> bool:
        return self.pattern.fullmatch(name) is not None

    def filled(self, name: str) -> dict[str, str]:
        """The placeholders' values in `name`, a name of this family ({} where it is none)."""
        found = self.pattern.fullmatch(name)
        return found.groupdict() if found else {}


# The names the code logs through constants (their loggers import them from here).
PPL_AVG = "ppl/avg"
VAL_LOSS = "val/loss"
TRAIN_LOSS = "train/loss"
UNIGRAM_PPL_AVG = "unigram_ppl/avg"
BLIMP_ACCURACY = "blimp/accuracy"
INIT_SCALE = "init/attn_output_rms"
F_ATTN, M_ACT, GATE_SCORE_MEAN = "probe/f_attn", "probe/m_act", "probe/gate_score_mean"

_GATED = "a variant with a gate (not baseline)"
_LONG = "eval.long_context_multipliers and a domain with held-out documents that long (speeches, or a files/hf domain)"
_LONG_BEYOND = _LONG + ", at a multiplier above 1"
_GPU = "a CUDA GPU"
_MOE = "model.ffn moe"
_BIGRAM = "data.task bigram_backcopy"
_LM_EVAL = "lm-eval installed, and `gatelab eval` run on the run or eval.lm_eval set"

CATALOGUE: tuple[Metric, ...] = (
    # the evaluation at the end of a run (the key ones first: KEY_METRICS keeps this order)
    Metric(PPL_AVG, "perplexity", "lower", "eval", "held-out perplexity, mean over the domains", key=True),
    Metric(VAL_LOSS, "nats/token", "lower", "train", "validation loss during training", key=True,
           condition="eval.every_n_steps set (validation during training)"),
    Metric(UNIGRAM_PPL_AVG, "perplexity", "lower", "eval",
           "the training split's unigram distribution's perplexity on the held-out split, mean over domains (a floor "
           "to compare ppl/avg with)", key=True),
    Metric(F_ATTN, "share", "lower", "probes", "attention on the first token (attention sink), mean over layers",
           key=True),
    Metric(M_ACT, "activation", "lower", "probes", "largest |activation| of the residual stream, mean over layers",
           key=True),
    Metric(GATE_SCORE_MEAN, "gate score", "none", "probes", "mean gate score over every gate element", key=True,
           condition=_GATED),
    Metric(BLIMP_ACCURACY, "share", "higher", "eval", "BLiMP minimal pairs scored right", key=True,
           condition="eval.blimp on and data.task text"),
    Metric("ppl/{domain}", "perplexity", "lower", "eval", "held-out perplexity of one domain"),
    Metric("long_ppl/x{multiplier}", "perplexity", "lower", "eval",
           "perplexity of long documents at this multiple of the training length", condition=_LONG),
    Metric("long_ppl_beyond_train/x{multiplier}", "perplexity", "lower", "eval",
           "the same, of the tokens beyond the training length only", condition=_LONG_BEYOND),
    Metric("eval/w8a8_ppl", "perplexity", "lower", "eval", "held-out perplexity with int8 weights and activations"),
    Metric("eval/w8a8_ppl_ratio", "ratio", "lower", "eval", "eval/w8a8_ppl over full precision's on the same windows"),
    Metric("icl/induction", "share", "higher", "eval", "induction-head copy accuracy"),
    Metric("icl/mqar", "share", "higher", "eval", "multi-query associative recall accuracy"),
    Metric("icl/needle_len{length}", "share", "higher", "eval", "needle-in-a-haystack accuracy at this length"),
    Metric("bb/copy_accuracy", "share", "higher", "eval", "bigram-backcopy: copies after a trigger", condition=_BIGRAM),
    Metric("bb/copy_loss", "nats/token", "lower", "eval", "bigram-backcopy: loss after a trigger", condition=_BIGRAM),
    Metric("bb/bigram_loss", "nats/token", "lower", "eval", "bigram-backcopy: loss elsewhere", condition=_BIGRAM),
    Metric("bb/bigram_loss_optimal", "nats/token", "none", "eval", "bigram-backcopy: the Bayes loss there",
           condition=_BIGRAM),
    Metric("bb/f_attn_trigger_queries", "share", "none", "eval", "bigram-backcopy: F-Attn of trigger queries",
           condition=_BIGRAM),
    Metric("bb/f_attn_other_queries", "share", "none", "eval", "bigram-backcopy: F-Attn of other queries",
           condition=_BIGRAM),
    # the probes' other summaries (gatelab.eval.probes.ProbeReport.summary), as `probe/<name>`
    Metric("probe/f_attn_with_first_query", "share", "lower", "probes", "F-Attn counting the first query too"),
    Metric("probe/m_act_share_layers_max_at_first_token", "share", "none", "probes",
           "share of layers whose largest activation is at the first token"),
    Metric("probe/m_act_tokens_near_max_share", "share", "none", "probes", "share of tokens near the layer's maximum"),
    Metric("probe/sink_rate", "share", "lower", "probes", "share of (sequence, head) with first-token attention > 0.3"),
    Metric("probe/sink_rate/layer{layer}", "share", "lower", "probes", "the sink rate of one layer"),
    Metric("probe/kurtosis_max", "kurtosis", "lower", "probes", "largest block-output kurtosis over blocks"),
    Metric("probe/kurtosis_mean", "kurtosis", "lower", "probes", "block-output kurtosis, mean over blocks"),
    Metric("probe/kurtosis/block{block}", "kurtosis", "lower", "probes", "one block's output kurtosis"),
    Metric("probe/max_abs_activation", "activation", "lower", "probes", "largest |activation| over blocks"),
    Metric("probe/max_abs_activation/block{block}", "activation", "lower", "probes",
           "one block's largest |activation|"),
    Metric("probe/sparsity_sdpa_output_below_{threshold}", "share", "none", "probes",
           "share of attention outputs (before the G1 gate) below the threshold"),
    Metric("probe/sparsity_gated_output_below_{threshold}", "share", "none", "probes",
           "share of attention outputs (after the G1 gate) below the threshold"),
    Metric("probe/sparsity_control_output_below_{threshold}", "share", "none", "probes",
           "the same, of ungated outputs scaled by the mean gate score (the control)"),
    Metric("probe/sparsity_mean_abs_sdpa_output", "activation", "none", "probes",
           "mean |attention output| before the G1 gate"),
    Metric("probe/sparsity_mean_abs_sdpa_gated_output", "activation", "none", "probes",
           "mean |attention output| after the G1 gate"),
    # training
    Metric(TRAIN_LOSS, "nats/token", "lower", "train", "training loss, at each logging step"),
    Metric("train/lr", "lr", "none", "train", "learning rate"),
    Metric("train/tokens_per_s", "tokens/s", "higher", "train", "training throughput of the step (host clock)"),
    Metric("train/grad_norm", "norm", "none", "train", "global gradient norm before clipping"),
    Metric("train/load_balance", "loss", "lower", "train", "MoE load-balance auxiliary loss", condition=_MOE),
    Metric("train/z_loss", "loss", "lower", "train", "MoE router z-loss", condition=_MOE),
    Metric("train/spikes", "count", "lower", "train", "loss spikes so far, at each logging step"),
    Metric("val/ppl", "perplexity", "lower", "train", "exp(val/loss)", condition="eval.every_n_steps set"),
    Metric(INIT_SCALE, "rms", "none", "train", "attention output RMS at step 0 (the claims table's init-scale check)"),
    Metric("epoch", "epoch", "none", "lightning", "Lightning's epoch counter"),
    # the run around training
    Metric("train/spikes_total", "count", "lower", "run", "loss spikes of the whole run"),
    Metric("train/spike", "nats/token", "none", "run", "the loss of each spike, at its step",
           condition="the training loss spiked"),
    Metric("pruned_step", "step", "none", "run", "the step a search pruned the run at",
           condition="a sweep search pruned the run"),
    Metric("diverged_step", "step", "none", "run", "the step the run diverged at", condition="the run diverged"),
    Metric("time/import_s", "s", "lower", "run", "from the program's start to its first run (0 for later runs)"),
    Metric("time/setup_s", "s", "lower", "run", "data, tokenizer, model and MLflow set up"),
    Metric("time/train_s", "s", "lower", "run", "training (`fit`)"),
    Metric("time/eval_s", "s", "lower", "run", "the final evaluation and its artifacts",
           condition="the run finished (not pruned or diverged)"),
    Metric("time/step_s", "s", "lower", "run", "mean seconds of a training step this session",
           condition="the session trained at least one step"),
    Metric("time/compile_s", "s", "lower", "run", "torch.compile's seconds", condition="train.compile on"),
    Metric("memory/peak_rss_gb", "GB", "lower", "run", "the process's largest resident set"),
    Metric("memory/peak_gpu_gb", "GB", "lower", "run", "peak CUDA memory of training and evaluation",
           condition=_GPU),
    Metric("memory/peak_gpu_train_gb", "GB", "lower", "run", "peak CUDA memory of training", condition=_GPU),
    # lm-evaluation-harness
    Metric("lm_eval/{task}/{measure}", "measure", "none", "lm_eval",
           "an lm-eval task's measure (acc, acc_norm, ...; which way is better is the task's)", condition=_LM_EVAL),
    Metric("lm_eval/{task}/{measure}/stderr", "measure", "lower", "lm_eval", "its standard error",
           condition=_LM_EVAL),
)

KEY_METRICS: tuple[str, ...] = tuple(metric.name for metric in CATALOGUE if metric.key)


def matching(name: str) -> list[Metric]:
    """Every entry `name` matches (one, for a name a run logs)."""
    return [metric for metric in CATALOGUE if metric.matches(name)]


def find(name: str) -> Metric | None:
    """The one entry `name` matches; None where it matches none or, which the catalogue's test rules out, several."""
    found = matching(name)
    return found[0] if len(found) == 1 else None


def names_for(domains: list[str], multipliers: list[int], n_layers: int) -> list[str]:
    """The catalogue's names with the placeholders a run's config decides filled in (its domains, long-context
    multipliers and layers); a family of other placeholders (lm-eval's tasks, a threshold) stays a pattern."""
    values = {"domain": domains, "multiplier": [str(m) for m in multipliers],
              "layer": [str(i) for i in range(n_layers)], "block": [str(i) for i in range(n_layers)]}
    names = []
    for metric in CATALOGUE:
        placeholders = _PLACEHOLDER.findall(metric.name)
        if len(placeholders) == 1 and placeholders[0] in values:
            names += [metric.name.replace(f"{{{placeholders[0]}}}", value) for value in values[placeholders[0]]]
        else:
            names.append(metric.name)
    return names


__all__ = ["CATALOGUE", "KEY_METRICS", "PLACEHOLDERS", "Metric", "find", "matching", "names_for"]
