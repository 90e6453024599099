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
# Which part of gatelab logs a metric: gatelab.train.module's steps, gatelab.train.run around them, the end-of-run
# evaluation (gatelab.train.evaluate) and its probes (gatelab.eval.probes), gatelab.eval.scoring, or Lightning itself.
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


# Name prefixes whose last part another module names: a probe's sparsity measure (gatelab.eval.probes), an in-context
# task of gatelab.eval.benchmarks' suite (its '@' spelled `_len`: MLflow refuses '@').
SPARSITY = "probe/sparsity_{measure}"
ICL = "icl/{task}"

_GATED = "a variant with a gate (not baseline)"
_LONG = "eval.long_context_multipliers and a domain with held-out documents that long (speeches, or a files/hf domain)"
_LONG_BEYOND = _LONG + ", at a multiplier above 1"
_GPU = "a CUDA GPU"
_MOE = "model.ffn moe"
_BIGRAM = "data.task bigram_backcopy"
# gatelab.data.tokenizer.bytes_per_token: a token's bytes are fixed only in a byte-level tokenizer
_BYTES = ("data.task text and a byte-level tokenizer (data.tokenizer bpe, or a tokenizer.json or Hub name whose "
          "decoder is ByteLevel: GPT-2's, Qwen's, Llama 3's)")
_LM_EVAL = "lm-eval installed, and `gatelab eval` run on the run or eval.lm_eval set"

# Each entry gatelab logs binds its name to a constant (`PPL_AVG := "ppl/avg"`), a family its formatter
# (`LONG_PPL.format(multiplier=4)`); the code that logs or reads a metric imports it, so a name is spelled here only.
CATALOGUE: tuple[Metric, ...] = (
    # the evaluation at the end of a run (the key ones first: KEY_METRICS keeps this order)
    Metric(PPL_AVG := "ppl/avg", "perplexity", "lower", "eval",
           "held-out perplexity, mean over the domains; held-out is eval.budget's text (the param "
           "resolved.eval.budget), and runs of different budgets never compare", key=True),
    Metric(VAL_LOSS := "val/loss", "nats/token", "lower", "train", "validation loss during training", key=True,
           condition="eval.every_n_steps set (validation during training)"),
    Metric(UNIGRAM_PPL_AVG := "unigram_ppl/avg", "perplexity", "lower", "eval",
           "the training split's unigram distribution's perplexity on the held-out split, mean over domains (a floor "
           "to compare ppl/avg with)", key=True),
    Metric(F_ATTN := "probe/f_attn", "share", "lower", "probes",
           "attention on the first token (attention sink), mean over layers", key=True),
    Metric(M_ACT := "probe/m_act", "activation", "lower", "probes",
           "largest |activation| of the residual stream, mean over layers", key=True),
    Metric(GATE_SCORE_MEAN := "probe/gate_score_mean", "gate score", "none", "probes",
           "mean gate score over every gate element", key=True, condition=_GATED),
    Metric(BLIMP_ACCURACY := "blimp/accuracy", "share", "higher", "eval", "BLiMP minimal pairs scored right", key=True,
           condition="eval.blimp on and data.task text"),
    Metric(DOMAIN_PPL := "ppl/{domain}", "perplexity", "lower", "eval", "held-out perplexity of one domain"),
    Metric(BPB_AVG := "bpb/avg", "bits/byte", "lower", "eval",
           "held-out bits per UTF-8 byte, mean over the domains as ppl/avg is (not pooled); the tokenizer stays out "
           "of it, so runs of different tokenizers compare (on one eval.budget in bytes or documents: the same text)",
           condition=_BYTES),
    Metric(DOMAIN_BPB := "bpb/{domain}", "bits/byte", "lower", "eval",
           "held-out bits per byte of one domain: the nats of its text tokens over ln 2 x their UTF-8 bytes (special "
           "tokens in neither)", condition=_BYTES),
    Metric(LONG_PPL := "long_ppl/x{multiplier}", "perplexity", "lower", "eval",
           "perplexity of long documents at this multiple of the training length", condition=_LONG),
    Metric(LONG_PPL_BEYOND_TRAIN := "long_ppl_beyond_train/x{multiplier}", "perplexity", "lower", "eval",
           "the same, of the tokens beyond the training length only", condition=_LONG_BEYOND),
    Metric(W8A8_PPL := "eval/w8a8_ppl", "perplexity", "lower", "eval",
           "held-out perplexity with int8 weights and activations"),
    Metric(W8A8_PPL_RATIO := "eval/w8a8_ppl_ratio", "ratio", "lower", "eval",
           "eval/w8a8_ppl over full precision's on the same windows"),
    Metric(ICL.format(task="induction"), "share", "higher", "eval", "induction-head copy accuracy"),
    Metric(ICL.format(task="mqar"), "share", "higher", "eval", "multi-query associative recall accuracy"),
    Metric(ICL.format(task="needle_len{length}"), "share", "higher", "eval",
           "needle-in-a-haystack accuracy at this length"),
    Metric(BB_COPY_ACCURACY := "bb/copy_accuracy", "share", "higher", "eval", "bigram-backcopy: copies after a trigger",
           condition=_BIGRAM),
    Metric(BB_COPY_LOSS := "bb/copy_loss", "nats/token", "lower", "eval", "bigram-backcopy: loss after a trigger",
           condition=_BIGRAM),
    Metric(BB_BIGRAM_LOSS := "bb/bigram_loss", "nats/token", "lower", "eval", "bigram-backcopy: loss elsewhere",
           condition=_BIGRAM),
    Metric(BB_BIGRAM_LOSS_OPTIMAL := "bb/bigram_loss_optimal", "nats/token", "none", "eval",
           "bigram-backcopy: the Bayes loss there", condition=_BIGRAM),
    Metric(BB_F_ATTN_TRIGGER := "bb/f_attn_trigger_queries", "share", "none", "eval",
           "bigram-backcopy: F-Attn of trigger queries", condition=_BIGRAM),
    Metric(BB_F_ATTN_OTHER := "bb/f_attn_other_queries", "share", "none", "eval",
           "bigram-backcopy: F-Attn of other queries", condition=_BIGRAM),
    # the probes' other summaries (gatelab.eval.probes.ProbeReport.summary)
    Metric(F_ATTN_WITH_FIRST_QUERY := "probe/f_attn_with_first_query", "share", "lower", "probes",
           "F-Attn counting the first query too"),
    Metric(M_ACT_MAX_AT_FIRST_TOKEN := "probe/m_act_share_layers_max_at_first_token", "share", "none", "probes",
           "share of layers whose largest activation is at the first token"),
    Metric(M_ACT_NEAR_MAX := "probe/m_act_tokens_near_max_share", "share", "none", "probes",
           "share of tokens near the layer's maximum"),
    Metric(SINK_RATE := "probe/sink_rate", "share", "lower", "probes",
           "share of (sequence, head) with first-token attention > 0.3"),
    Metric(SINK_RATE_OF_LAYER := "probe/sink_rate/layer{layer}", "share", "lower", "probes",
           "the sink rate of one layer"),
    Metric(KURTOSIS_MAX := "probe/kurtosis_max", "kurtosis", "lower", "probes",
           "largest block-output kurtosis over blocks"),
    Metric(KURTOSIS_MEAN := "probe/kurtosis_mean", "kurtosis", "lower", "probes",
           "block-output kurtosis, mean over blocks"),
    Metric(KURTOSIS_OF_BLOCK := "probe/kurtosis/block{block}", "kurtosis", "lower", "probes",
           "one block's output kurtosis"),
    Metric(MAX_ABS_ACTIVATION := "probe/max_abs_activation", "activation", "lower", "probes",
           "largest |activation| over blocks"),
    Metric(MAX_ABS_ACTIVATION_OF_BLOCK := "probe/max_abs_activation/block{block}", "activation", "lower", "probes",
           "one block's largest |activation|"),
    Metric(SPARSITY.format(measure="sdpa_output_below_{threshold}"), "share", "none", "probes",
           "share of attention outputs (before the G1 gate) below the threshold"),
    Metric(SPARSITY.format(measure="gated_output_below_{threshold}"), "share", "none", "probes",
           "share of attention outputs (after the G1 gate) below the threshold"),
    Metric(SPARSITY.format(measure="control_output_below_{threshold}"), "share", "none", "probes",
           "the same, of ungated outputs scaled by the mean gate score (the control)"),
    Metric(SPARSITY.format(measure="mean_abs_sdpa_output"), "activation", "none", "probes",
           "mean |attention output| before the G1 gate"),
    Metric(SPARSITY.format(measure="mean_abs_sdpa_gated_output"), "activation", "none", "probes",
           "mean |attention output| after the G1 gate"),
    # training
    Metric(TRAIN_LOSS := "train/loss", "nats/token", "lower", "train", "training loss, at each logging step"),
    Metric(LEARNING_RATE := "train/lr", "lr", "none", "train", "learning rate"),
    Metric(TOKENS_PER_S := "train/tokens_per_s", "tokens/s", "higher", "train",
           "training throughput of the step (host clock)"),
    Metric(GRAD_NORM := "train/grad_norm", "norm", "none", "train", "global gradient norm before clipping"),
    Metric(LOAD_BALANCE := "train/load_balance", "loss", "lower", "train", "MoE load-balance auxiliary loss",
           condition=_MOE),
    Metric(Z_LOSS := "train/z_loss", "loss", "lower", "train", "MoE router z-loss", condition=_MOE),
    Metric(SPIKES := "train/spikes", "count", "lower", "train", "loss spikes so far, at each logging step"),
    Metric(VAL_PPL := "val/ppl", "perplexity", "lower", "train", "exp(val/loss)", condition="eval.every_n_steps set"),
    Metric(INIT_SCALE := "init/attn_output_rms", "rms", "none", "train",
           "attention output RMS at step 0 (the claims table's init-scale check)"),
    Metric("epoch", "epoch", "none", "lightning", "Lightning's epoch counter"),
    # the run around training
    Metric(SPIKES_TOTAL := "train/spikes_total", "count", "lower", "run", "loss spikes of the whole run"),
    Metric(SPIKE := "train/spike", "nats/token", "none", "run", "the loss of each spike, at its step",
           condition="the training loss spiked"),
    Metric(PRUNED_STEP := "pruned_step", "step", "none", "run", "the step a search pruned the run at",
           condition="a sweep search pruned the run"),
    Metric(DIVERGED_STEP := "diverged_step", "step", "none", "run", "the step the run diverged at",
           condition="the run diverged"),
    Metric(IMPORT_S := "time/import_s", "s", "lower", "run",
           "from the program's start to its first run (0 for later runs)"),
    Metric(SETUP_S := "time/setup_s", "s", "lower", "run", "data, tokenizer, model and MLflow set up"),
    Metric(TRAIN_S := "time/train_s", "s", "lower", "run", "training (`fit`)"),
    Metric(EVAL_S := "time/eval_s", "s", "lower", "run", "the final evaluation and its artifacts",
           condition="the run finished (not pruned or diverged)"),
    Metric(STEP_S := "time/step_s", "s", "lower", "run",
           "steady-state seconds of a training step this session: the median of each step's own time (batch start to "
           "end: no validation, no data wait) after the first max(5, 10%) steps (compile, warm-up)",
           condition="the session trained at least one step"),
    Metric(WALL_STEP_S := "time/wall_step_s", "s", "lower", "run",
           "wall seconds a training step this session, compile, validation and data waits included: what `gatelab "
           "sweep plan` multiplies by a run's steps", condition="the session trained at least one step"),
    Metric(STEADY_TOKENS_PER_S := "time/steady_tokens_per_s", "tokens/s", "higher", "run",
           "steady-state training throughput, every rank's tokens of a step over time/step_s",
           condition="the session trained at least one step"),
    Metric(COMPILE_S := "time/compile_s", "s", "lower", "run", "torch.compile's seconds", condition="train.compile on"),
    Metric(PEAK_RSS_GB := "memory/peak_rss_gb", "GB", "lower", "run", "the process's largest resident set"),
    Metric(PEAK_GPU_GB := "memory/peak_gpu_gb", "GB", "lower", "run", "peak CUDA memory of training and evaluation",
           condition=_GPU),
    Metric(PEAK_GPU_TRAIN_GB := "memory/peak_gpu_train_gb", "GB", "lower", "run", "peak CUDA memory of training",
           condition=_GPU),
    # lm-evaluation-harness
    Metric(LM_EVAL := "lm_eval/{task}/{measure}", "measure", "none", "lm_eval",
           "an lm-eval task's measure (acc, acc_norm, ...; which way is better is the task's)", condition=_LM_EVAL),
    Metric(LM_EVAL_STDERR := "lm_eval/{task}/{measure}/stderr", "measure", "lower", "lm_eval", "its standard error",
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
