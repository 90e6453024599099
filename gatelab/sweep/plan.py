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

Estimated seconds, measured where earlier runs recorded them (`time/*`, tagged with their host and device, e.g.
"NVIDIA H200" or "cpu"). A run is priced by the first of:

- "measured": runs of the same shape (`STEP_SHAPE`) on this device: their median step time x max_steps, plus the
  median seconds of set-up and evaluation of those that evaluated alike (`EVAL_SETTING_PREFIXES`), else their median
  set-up and an estimated evaluation;
- "measured rate": runs of other shapes on this device, in the same settings (`RATE_SETTINGS`): training FLOPs at the
  median FLOP rate they achieved, plus their median set-up and an estimated evaluation;
- "flops": training FLOPs at a default rate for the device (`device_defaults`: a GPU's dense bf16 peak from
  `GPU_PEAKS` at `DEFAULT_MFU`, `GPU_FLOPS` for a GPU not in the table or not here, `CPU_FLOPS` on a CPU), plus a
  default set-up and an estimated evaluation.

The estimated evaluation is its forward FLOPs (`evaluation_flops`) at the device's evaluation rate (fp32 weights: a
CPU's fp32 rate, a GPU's TF32 one) plus `EVAL_FIXED_S`. A process imports torch, Lightning and MLflow once, however many
runs it trains (a sweep worker trains many): those seconds (`import_s`) are added once to a sweep's total, not to each
run.

A run of this device counts when its device tag names the device a run of the experiment would train on here
(`plan_device`); a GPU's runs count from any machine (the GPU sets the pace), a CPU's from this machine only.
"""

from __future__ import annotations

import ast
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gatelab import paper as paper_tables
from gatelab import tracking
from gatelab.config import DataConfig, EvalConfig, ExperimentConfig, ModelConfig, flatten
from gatelab.config_files import set_dotted
from gatelab.data.budget import CorpusCounter, built_in_chars_per_token
from gatelab.data.corpora import HELDOUT_FRACTION
from gatelab.devices import device_name, evaluation_device, gpu_peak
from gatelab.errors import GatelabError, redact
from gatelab.eval.quantization import W8A8_WINDOWS_PER_DOMAIN
from gatelab.host import machine_name
from gatelab.metrics import EVAL_S, IMPORT_S, SETUP_S, STEP_S, WALL_STEP_S
from gatelab.model.params import added_parameters, resolve_model
from gatelab.progress import DEVICE_TAG, HOST_TAG
from gatelab.store_checks import store_errors
from gatelab.store_uris import missing_local_store, run_tracking_uri
from gatelab.sweep.flops import active_parameters, training_flops
from gatelab.sweep.ladder import RUNG
from gatelab.sweep.spec import Progress, RunSpec, format_value
from gatelab.variants import apply_variant

# A rough default for a small CPU in bf16 autocast, in the Lightning loop; measured figures live in results/bench/
# (`gatelab bench` reports a machine's achieved FLOP/s; --flops-per-second passes one to the plan). Other processes on
# the same cores slow a run further.
CPU_FLOPS = 7.0e10
# A small CPU's fp32 forward passes in evaluation: the tiny preset's end-of-run evaluation (1.4e12 forward FLOPs by
# evaluation_flops) took 11-28 s in the 9 `gatelab bench` runs under results/bench/*/bench.json, median 18 s; less
# EVAL_FIXED_S, about 9e10 FLOP/s.
CPU_EVAL_FLOPS = 9.0e10
# gatelab's eager bf16-mixed step reached 19-22% of an H200's dense bf16 peak (989 TFLOP/s) on the small preset
# (0.23-0.25 s a step of 4.58e13 FLOPs): the default model FLOPs utilisation of a GPU that no run has measured yet.
DEFAULT_MFU = 0.20
# A GPU run planned where torch sees no GPU (a login node), or on a GPU not in GPU_PEAKS: an H100 SXM at DEFAULT_MFU.
GPU_FLOPS = DEFAULT_MFU * 989e12
# A `32-true` run's training runs in fp32 on the CUDA cores (torch leaves TF32 off for matmuls): a third of the fp32
# peak, a guess for gatelab's widths between launches and host work.
FP32_UTILISATION = 0.3
# The end-of-run evaluation keeps fp32 weights with TF32 products on a GPU (gatelab.devices.evaluation_precision),
# whose dense peak is half the bf16 one on every GPU in GPU_PEAKS. Forward passes of a few batches each between host
# work (tokenizing BLiMP, making the in-context tasks, reading results back): a tenth of it, a guess until a GPU run
# records its own `time/eval_s`.
EVAL_TF32_UTILISATION = 0.1

# Seconds outside the steps where no run has measured them: imports once a process, set-up (data, tokenizer, model,
# MLflow) once a run. CPU: the medians of the 14 `gatelab bench` child runs under results/bench/*/bench.json (import
# 3.6-10 s, median 6.5; set-up 2.3-31 s, median 5.3). GPU: not measured (no GPU figures here); the CPU's plus CUDA's
# own start: loading torch's CUDA libraries, creating the context and the cuBLAS handles, moving the model, starting
# the loader workers. The first run on a device records its own, which the measured bases then use.
CPU_IMPORT_S, CPU_SETUP_S = 6.0, 5.0
GPU_IMPORT_S, GPU_SETUP_S = 8.0, 7.0
# Evaluation beyond its forward passes, on any device: BLiMP's tokenizing, the in-context tasks generated on the CPU,
# the unigram baseline, the plots and the MLflow artifacts.
EVAL_FIXED_S = 3.0

# What the evaluation reads (gatelab.train.evaluate, gatelab.eval.benchmarks): long-context perplexity on the built-in
# "speeches" domain (another source: its domain with the most long documents), on at most 16 held-out documents
# (`long_context_windows`); BLiMP's 67 paradigms, 100 pairs each in gatelab's subset and 1000 in the official release,
# sentences of about 16 tokens; the in-context suite's induction span and MQAR pairs cap.
LONG_CONTEXT_DOMAIN, LONG_CONTEXT_DOCUMENTS = "speeches", 16
BLIMP_PARADIGMS, BLIMP_PACKAGED_PAIRS, BLIMP_RELEASE_PAIRS, BLIMP_SENTENCE_TOKENS = 67, 100, 1000, 16
IN_CONTEXT_MAX_PAIRS = 32


def evaluation_flops(experiment: ExperimentConfig, model: ModelConfig, active: int,
                     corpus_tokens: int | None = None) -> float:
    """Forward FLOPs of a run's end-of-run evaluation: 2 x N_active a token, plus the QK^T and AV matmuls at each part's
    context length (4 x n_layers x context x n_heads x head_dim a token, the forward third of the training term).

    The parts, as `gatelab.train.evaluate` runs them: the held-out windows (`heldout_windows_per_domain`), the W8A8
    pass on up to W8A8_WINDOWS_PER_DOMAIN of them a domain, the probes on the first eval.batch_size of them a domain,
    the long-context windows at each of eval.long_context_multipliers, BLiMP, and the in-context suite (induction at
    seq_len, MQAR, needles at a quarter, half and all of seq_len). Counted from the config, not tokenized: within a few
    tens of percent, as the estimate needs; the long-context part assumes all its documents are there.
    """
    evaluation, data, seq_len = experiment.eval, experiment.data, experiment.data.seq_len
    text = data.task == "text"
    domains = (data.domains or DataConfig.model_fields["domains"].default) if text else ["bigram_backcopy"]
    if text:
        heldout = corpus_tokens * HELDOUT_FRACTION / (1 - HELDOUT_FRACTION) / len(domains) if corpus_tokens else None
        windows = len(domains) * heldout_windows_per_domain(evaluation, seq_len, model.vocab_size, heldout)
    else:
        windows = min(evaluation.max_windows_per_domain, data.bigram_backcopy.heldout_sequences)
    per_domain = max(1, windows // len(domains))
    probe_rows = len(domains) * min(evaluation.batch_size, per_domain)
    w8a8_rows = len(domains) * min(W8A8_WINDOWS_PER_DOMAIN, per_domain)
    parts = [(windows * seq_len, seq_len), (probe_rows * seq_len, seq_len), (w8a8_rows * seq_len, seq_len)]
    if not text:
        parts.append((windows * seq_len, seq_len))  # bigram-backcopy's own metrics read the windows again
    if text and (data.source != "builtin" or LONG_CONTEXT_DOMAIN in domains):
        document = max(evaluation.long_context_multipliers) * seq_len + 1  # each document's prefix, cut per multiplier
        for multiplier in sorted(set(evaluation.long_context_multipliers)):
            length = multiplier * seq_len
            parts.append((LONG_CONTEXT_DOCUMENTS * (document // (length + 1)) * length, length))
    if text and evaluation.blimp:
        available = BLIMP_RELEASE_PAIRS if evaluation.blimp_path else BLIMP_PACKAGED_PAIRS
        sentences = BLIMP_PARADIGMS * min(evaluation.blimp_per_paradigm, available) * 2
        parts.append((sentences * BLIMP_SENTENCE_TOKENS, BLIMP_SENTENCE_TOKENS))
    mqar = 4 * min(IN_CONTEXT_MAX_PAIRS, seq_len // 4)
    needles = [length for length in sorted({seq_len // 4, seq_len // 2, seq_len}) if length >= 5]
    parts += [(evaluation.in_context_examples * length, length) for length in (seq_len, mqar, *needles)]
    attention_per_context = 4 * model.n_layers * model.n_heads * model.head_dim
    return float(sum(tokens * (2 * active + attention_per_context * context) for tokens, context in parts))


def heldout_windows_per_domain(evaluation: EvalConfig, seq_len: int, vocab_size: int,
                               heldout_tokens: float | None) -> int:
    """The held-out windows of seq_len + 1 tokens a domain's end-of-run scores read: eval.max_windows_per_domain, or
    what eval.budget holds (its tokens; its bytes at the built-in corpora's characters per token, a byte a character;
    its documents, whose lengths only tokenizing tells, as the whole split: a bound; max_windows_per_domain where the
    corpus is not counted), and no more than the domain's held-out split holds (`heldout_tokens`: HELDOUT_FRACTION of
    its documents, taken as that share of its tokens)."""
    budget, width = evaluation.budget, seq_len + 1
    if budget is None:
        wanted = evaluation.max_windows_per_domain
    elif budget.tokens is not None:
        wanted = budget.tokens // width
    elif budget.bytes is not None:
        wanted = round(budget.bytes / built_in_chars_per_token(vocab_size)) // width
    else:
        wanted = None if heldout_tokens else evaluation.max_windows_per_domain  # documents, on an uncounted corpus
    held = round(heldout_tokens / width) if heldout_tokens else None
    return max(1, min(n for n in (wanted, held) if n is not None))


def plan_device(experiment: ExperimentConfig) -> str | None:
    """The device a run of `experiment` would train on here, named as runs tag theirs (`gatelab.devices.device_name`):
    the one `gatelab.devices.evaluation_device` picks for its train.accelerator (the GPU torch sees, Apple's GPU, or
    the CPU); None for gpu or cuda where there is no GPU (a login node planning for its GPU nodes), "mps" for mps."""
    accelerator = experiment.train.accelerator
    device = evaluation_device(None, accelerator)
    if device.type == "cpu" and accelerator in ("gpu", "cuda", "mps"):
        return "mps" if accelerator == "mps" else None
    return device_name(device)


@dataclass(frozen=True)
class DeviceDefaults:
    """How a run is priced on a device where no run has measured it: training and evaluation FLOP/s, the seconds of
    imports (once a process) and of set-up (once a run), and how each rate was chosen, for the estimate lines."""

    train_flops_per_second: float
    eval_flops_per_second: float
    import_s: float
    setup_s: float
    rate_source: str  # "NVIDIA H200 at 20% of its 989 TFLOP/s dense bf16 peak"
    eval_rate_source: str


def device_defaults(device: str | None, precision: str = "auto") -> DeviceDefaults:
    """The defaults of the module docstring's "flops" basis for `device` (a `plan_device` name); in `32-true` a GPU
    trains at FP32_UTILISATION of its fp32 peak instead."""
    if device in ("cpu", "mps"):
        return DeviceDefaults(CPU_FLOPS, CPU_EVAL_FLOPS, CPU_IMPORT_S, CPU_SETUP_S,
                              "assumed for a small CPU; `gatelab bench` measures this one's",
                              "the tiny preset's evaluations on 2-core CPUs, results/bench/")
    peak = gpu_peak(device) if device else None
    if peak is None:
        where = "no GPU here" if device is None else f"{device}, not in gatelab's table of GPUs"
        peak = gpu_peak("H100")
        name, whose = f"{where}: assumed", "an H100's"
    else:
        name, whose = f"{device} at", "its"
    fp32 = FP32_UTILISATION * peak.fp32_flops
    fp32_source = f"{FP32_UTILISATION:.0%} of {whose} {peak.fp32_flops / 1e12:.3g} TFLOP/s fp32 peak"
    tf32 = EVAL_TF32_UTILISATION * peak.bf16_flops / 2
    eval_source = f"{EVAL_TF32_UTILISATION:.0%} of {whose} {peak.bf16_flops / 2e12:.0f} TFLOP/s TF32 peak"
    if precision == "32-true":
        return DeviceDefaults(fp32, tf32, GPU_IMPORT_S, GPU_SETUP_S, f"{name} {fp32_source} (train.precision 32-true)",
                              eval_source)
    return DeviceDefaults(DEFAULT_MFU * peak.bf16_flops, tf32, GPU_IMPORT_S, GPU_SETUP_S,
                          f"{name} {DEFAULT_MFU:.0%} of {whose} {peak.bf16_flops / 1e12:.0f} TFLOP/s dense bf16 peak",
                          eval_source)


# What a training step costs on one machine, read from a run's MLflow params: the model's shape, the batch, the
# precision and the devices. The variant is not in it (a gate adds a few percent); runs of the same variant are
# preferred where there are some.
STEP_SHAPE = ("model.vocab_size", "model.n_layers", "model.d_model", "model.n_heads", "model.n_kv_heads",
              "model.head_dim", "model.ffn", "model.ffn_hidden", "train.batch_size", "data.seq_len", "train.precision",
              "train.accelerator", "train.devices", "train.num_nodes", "train.threads")
# What sets the FLOP rate a device reaches besides the model's shape: a run of another shape prices this one only
# where these agree (a GPU's bf16 tensor cores peak at about 15x its fp32 rate; a compiled tiny step took 0.55x the
# eager one on a CPU, results/bench/; a step on two devices holds the FLOPs of two).
RATE_SETTINGS = ("train.precision", "train.compile", "train.accelerator", "train.devices", "train.num_nodes",
                 "train.threads")
# What sets the end-of-run evaluation's cost besides the model's shape: a same-shape run's seconds of set-up and
# evaluation price a run only where these agree (an eval.budget of a million bytes a domain reads about 30 times the
# default windows of the tiny preset); else its set-up is measured and its evaluation estimated.
EVAL_SETTING_PREFIXES = ("eval.", "data.domains", "data.task")


@dataclass(frozen=True)
class MeasuredRun:
    """One finished run of this machine or of this machine's GPU model, as its MLflow run recorded it."""

    shape: tuple[str, ...]
    variant: str
    seconds_per_step: float
    overhead_s: float  # setup_s + eval_s: around training, once a run (import_s is once a process)
    device: str | None = None  # its DEVICE_TAG; None where it was recorded before runs had one
    settings: tuple[str, ...] = ()  # its RATE_SETTINGS
    flops_per_step: float | None = None  # training FLOPs of one of its steps (`recorded_step_flops`)
    setup_s: float | None = None
    import_s: float | None = None  # None where it was not the first run of its process, the one that imported
    evaluation: tuple[tuple[str, str], ...] = ()  # its `eval_settings`


@dataclass(frozen=True)
class MeasuredStep:
    seconds_per_step: float
    overhead_s: float | None  # of the runs that evaluated as this one will; None where none did
    setup_s: float | None
    runs: int


@dataclass(frozen=True)
class MeasuredRate:
    flops_per_second: float
    setup_s: float | None
    runs: int


def step_shape(params: Mapping[str, Any]) -> tuple[str, ...]:
    """The STEP_SHAPE values as MLflow keeps params: as strings."""
    return tuple(str(params.get(key)) for key in STEP_SHAPE)


def step_settings(params: Mapping[str, Any]) -> tuple[str, ...]:
    """The RATE_SETTINGS values, as strings as step_shape."""
    return tuple(str(params.get(key)) for key in RATE_SETTINGS)


def eval_settings(params: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """The EVAL_SETTING_PREFIXES values, as MLflow keeps params (as strings), sorted by key."""
    return tuple(sorted((key, str(value)) for key, value in params.items() if key.startswith(EVAL_SETTING_PREFIXES)))


def _param_value(text: str) -> Any:
    """A param back as the value flatten had: MLflow keeps str(value), so "12", "True", "None" and "['a']" are Python
    literals, and anything else ("dense") is the string itself."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def recorded_step_flops(params: Mapping[str, str]) -> float | None:
    """Training FLOPs of one step of a recorded run, as plan_rows counts a step: its model rebuilt from the `model.*`
    params with its variant applied, its logged `model.total_params`, `train.batch_size` and `data.seq_len`. None where
    the params do not rebuild a model (an older run, a value cut at MLflow's 500 characters, a renamed variant)."""
    try:
        fields: dict[str, Any] = {}
        for key, text in params.items():
            if key.startswith("model.") and key != tracking.TOTAL_PARAMS_PARAM:
                set_dotted(fields, key.removeprefix("model."), _param_value(text), root=ModelConfig)
        model = apply_variant(ModelConfig.model_validate(fields), params.get("variant", "baseline"))
        total, seq_len = int(params[tracking.TOTAL_PARAMS_PARAM]), int(params["data.seq_len"])
        tokens = int(params["train.batch_size"]) * seq_len
    except (KeyError, TypeError, ValueError, ValidationError, GatelabError):
        return None
    return training_flops(model, active_parameters(model, total), tokens, seq_len)


def measured_runs(uri: str, host: str | None = None, devices: Sequence[str | None] = ()) -> list[MeasuredRun]:
    """The newest thousand finished, timed runs of the store that `host` (this machine) trained, and the newest
    thousand from any machine tagged with one of the GPUs in `devices` (module docstring), in any MLflow experiment
    (STEP_SHAPE decides what is comparable); [] where the store does not exist (a plan never creates one)."""
    if missing_local_store(uri):
        return []
    finished = f"tags.`{tracking.STATUS_TAG}` = 'finished'"
    queries = [f"tags.`{HOST_TAG}` = '{host or machine_name()}' AND {finished}"]
    queries += [f"tags.`{DEVICE_TAG}` = '{device}' AND {finished}" for device in sorted({d for d in devices if d})
                if device not in ("cpu", "mps") and "'" not in device]
    runs: dict[str, Any] = {}
    with store_errors(uri):
        client = tracking.client(uri)
        ids = [experiment.experiment_id for experiment in client.search_experiments()]
        if not ids:
            return []
        for query in queries:
            for run in client.search_runs(ids, query, order_by=["attributes.start_time DESC"], max_results=1000):
                runs.setdefault(run.info.run_id, run)
    found = []
    for run in runs.values():
        metrics, params = run.data.metrics, run.data.params
        # wall seconds a step; runs before issue 44 recorded that as time/step_s, now the steady-state step
        step_s = metrics.get(WALL_STEP_S, metrics.get(STEP_S, 0.0))
        if not step_s > 0:
            continue
        imports = metrics.get(IMPORT_S)
        found.append(MeasuredRun(step_shape(params), params.get("variant", ""), step_s,
                                 metrics.get(SETUP_S, 0.0) + metrics.get(EVAL_S, 0.0),
                                 device=run.data.tags.get(DEVICE_TAG), settings=step_settings(params),
                                 flops_per_step=recorded_step_flops(params), setup_s=metrics.get(SETUP_S),
                                 import_s=imports if imports else None, evaluation=eval_settings(params)))
    return found


def on_device(run: MeasuredRun, device: str | None) -> bool:
    """Whether `run` timed `device`: its tag names it, or it has no tag (recorded before there was one: measured_runs
    took it from this machine, as plans did then)."""
    return run.device is None or run.device == device


def measured_step(experiment: ExperimentConfig, measured: Sequence[MeasuredRun]) -> MeasuredStep | None:
    """The median cost of earlier runs of this experiment's shape (of its variant, where there are some): a step, the
    set-up, and the set-up with the evaluation of those that evaluated as this experiment will (`eval_settings`)."""
    flat = flatten(experiment)
    shape, evaluation = step_shape(flat), eval_settings(flat)
    same = [run for run in measured if run.shape == shape]
    same = [run for run in same if run.variant == experiment.variant] or same
    if not same:
        return None
    overheads = [run.overhead_s for run in same if run.evaluation == evaluation]
    setups = [run.setup_s for run in same if run.setup_s is not None]
    return MeasuredStep(statistics.median(run.seconds_per_step for run in same),
                        statistics.median(overheads) if overheads else None,
                        statistics.median(setups) if setups else None, len(same))


def measured_rate(experiment: ExperimentConfig, measured: Sequence[MeasuredRun]) -> MeasuredRate | None:
    """The median training FLOP rate (a step's FLOPs over its seconds) of earlier runs in this experiment's
    RATE_SETTINGS whose FLOPs could be rebuilt, with their median set-up; None where there is none."""
    settings = step_settings(flatten(experiment))
    timed = [run for run in measured
             if run.settings == settings and run.flops_per_step and run.seconds_per_step > 0]
    if not timed:
        return None
    setups = [run.setup_s for run in timed if run.setup_s is not None]
    return MeasuredRate(statistics.median(run.flops_per_step / run.seconds_per_step for run in timed),
                        statistics.median(setups) if setups else None, len(timed))


def plan_rows(specs: Sequence[RunSpec], paper: str | None = None, flops_per_second: float | None = None,
              trials: int = 1, measured: Sequence[MeasuredRun] = ()) -> list[dict[str, Any]]:
    """One row per run. `paper` adds the paper's added-parameter figure (table1, table6); `trials` > 1 for a search
    sweep, where each row is one cell searched `trials` times (row figures are per trial, totals count them all).
    `seconds` is a run's training (`train_s`) plus the time around it, priced on one of the module docstring's bases
    (`basis`); `flops_per_second` given (--flops-per-second) sets the FLOPs basis's rate, and no measured rate replaces
    it. `import_s` is a process's: estimate_lines counts it once a worker."""
    count_corpus = CorpusCounter()
    paper_added = paper_tables.added_params(paper)
    rows = []
    progress = Progress("pricing the runs", len(specs), unit="runs")
    for done, spec in enumerate(specs):
        progress(done)
        row, here = _flops_row(spec, count_corpus, flops_per_second, measured, trials)
        _price_measured(row, spec.experiment, here, flops_per_second)
        around = row["setup_s"] + row["eval_s"] if row["eval_s"] is not None else row["measured_overhead_s"]
        row["seconds"] = row["train_s"] + around
        if paper_added is not None:
            row["paper_added_m"] = paper_added.get(spec.experiment.variant)
        rows.append(row)
    return rows


def _flops_row(spec: RunSpec, count_corpus: CorpusCounter, flops_per_second: float | None,
               measured: Sequence[MeasuredRun], trials: int) -> tuple[dict[str, Any], list[MeasuredRun]]:
    """A run's row priced on the FLOPs basis, and the `measured` runs of its device."""
    experiment = spec.experiment
    model = resolve_model(experiment)
    total, added = added_parameters(experiment, experiment.variant)
    active = active_parameters(model, total)
    tokens = experiment.train.max_steps * experiment.train.batch_size * experiment.data.seq_len
    flops = training_flops(model, active, tokens, experiment.data.seq_len)  # as flops.run_training_flops counts
    corpus = count_corpus(experiment.data, experiment.model.vocab_size)
    device = plan_device(experiment)
    defaults = device_defaults(device, experiment.train.precision)
    here = [run for run in measured if on_device(run, device)]
    imports = [run.import_s for run in here if run.import_s]
    throughput = flops_per_second or defaults.train_flops_per_second
    eval_flops = evaluation_flops(experiment, model, active, corpus.tokens)
    row: dict[str, Any] = {
        "index": spec.index,
        "label": spec.label(),
        "hash": spec.hash,
        "variant": experiment.variant,
        "seed": experiment.seed,
        "overrides": " ".join(f"{key}={format_value(value)}" for key, value in spec.settings().items()),
        "rung": spec.cell.get(RUNG),  # its ladder rung (also in overrides); None outside a ladder
        "total_params": total,
        "added_params": added,
        "active_params": active,
        "tokens": tokens,
        "corpus_tokens": corpus.tokens,
        "corpus_count": corpus.how,
        "corpus_note": corpus.note,
        "passes": corpus.passes(tokens),
        "flops": flops,
        "device": device,
        "basis": "flops",
        "flops_per_second": throughput,
        "rate_source": "as given (--flops-per-second)" if flops_per_second else defaults.rate_source,
        "train_s": flops / throughput,
        "setup_s": defaults.setup_s,
        "setup_basis": "default",
        "eval_flops": eval_flops,
        "eval_flops_per_second": defaults.eval_flops_per_second,
        "eval_rate_source": defaults.eval_rate_source,
        "eval_s": eval_flops / defaults.eval_flops_per_second + EVAL_FIXED_S,
        "import_s": statistics.median(imports) if imports else defaults.import_s,
        "import_basis": "measured" if imports else "default",
        "trials": trials,
    }
    return row, here


def _price_measured(row: dict[str, Any], experiment: ExperimentConfig, here: Sequence[MeasuredRun],
                    flops_per_second: float | None) -> None:
    """The row re-priced from runs of its device, where it has some: "measured" from runs of the same shape, else
    "measured rate" (unless the rate is given)."""
    step = measured_step(experiment, here) if here else None
    rate = measured_rate(experiment, here) if here and step is None and not flops_per_second else None
    if step is not None:
        row.update(basis="measured", train_s=step.seconds_per_step * experiment.train.max_steps,
                   measured_step_s=step.seconds_per_step, measured_overhead_s=step.overhead_s, measured_runs=step.runs)
        if step.overhead_s is not None:
            row.update(setup_s=None, setup_basis=None, eval_s=None)
        elif step.setup_s is not None:  # its evaluation stays the estimate: those runs evaluated otherwise
            row.update(setup_s=step.setup_s, setup_basis="measured")
    elif rate is not None:
        row.update(basis="measured rate", flops_per_second=rate.flops_per_second,
                   rate_source=f"measured on {row['device']}", train_s=row["flops"] / rate.flops_per_second,
                   measured_runs=rate.runs)
        if rate.setup_s is not None:
            row.update(setup_s=rate.setup_s, setup_basis="measured")


def rung_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per ladder rung, in the ladder's order: its runs; the baseline's parameters at the rung (a run's total
    less what its variant adds: the count the tokens rule reads), the tokens of a run and their ratio (each distinct
    value: a grid over batch size or sequence length gives several); its runs' FLOPs and seconds together. [] for a
    sweep without a ladder."""
    by_rung: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        if row.get("rung") is not None:
            by_rung.setdefault(row["rung"], []).append(row)
    summary = []
    for rung, members in by_rung.items():
        summary.append({
            "rung": rung,
            "runs": sum(row["trials"] for row in members),
            "baseline_params": sorted({row["total_params"] - row["added_params"] for row in members}),
            "tokens": sorted({row["tokens"] for row in members}),
            "tokens_per_parameter": sorted({row["tokens"] / (row["total_params"] - row["added_params"])
                                            for row in members}),
            "flops": sum(row["flops"] * row["trials"] for row in members),
            "seconds": sum(row["seconds"] * row["trials"] for row in members),
        })
    return summary


def plan_totals(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Sums over the runs; `seconds` is the runs' own, `wall_s` what one worker takes for them all: the runs, and the
    imports of its one process (what `estimate_lines` prints for one worker)."""
    seconds = sum(row["seconds"] * row["trials"] for row in rows)
    return {
        "runs": sum(row["trials"] for row in rows),
        "tokens": sum(row["tokens"] * row["trials"] for row in rows),
        "flops": sum(row["flops"] * row["trials"] for row in rows),
        "seconds": seconds,
        "hours": seconds / 3600,
        "wall_s": wall_seconds(rows),
    }


def wall_seconds(rows: Sequence[dict[str, Any]], workers: int = 1) -> float:
    """The estimated wall time of `rows` on `workers` processes side by side: the runs' seconds shared out (never less
    than the longest run), plus the imports, which each process pays once at the same time as the others."""
    if not rows:
        return 0.0
    seconds = sum(row["seconds"] * row["trials"] for row in rows)
    return max(seconds / workers, max(row["seconds"] for row in rows)) + max(row["import_s"] for row in rows)


def sweep_measurements(specs: Sequence[RunSpec], tracking_uri: str | None,
                       runs_dir: Path) -> tuple[list[MeasuredRun], list[str]]:
    """This machine's earlier finished runs, and those of the GPUs these runs would train on here from any machine, in
    the stores these runs will record in; and a note for each store that could not be read (the estimate then falls
    back to FLOPs, the plan still prints)."""
    devices = sorted({plan_device(spec.experiment) for spec in specs} - {None})
    found, notes = [], []
    for uri in sorted({run_tracking_uri(tracking_uri, spec.experiment, runs_dir, create=False)
                       for spec in specs}):
        try:
            found += measured_runs(uri, devices=devices)
        except Exception as error:  # a store that is down costs the measured estimate, never the plan
            notes.append(f"no measured step times from {redact(uri)}: {redact(str(error).splitlines()[0])}")
    return found, notes
