"""End-of-run evaluation: the paper's metrics as MLflow metrics, and their per-layer detail and plots as artifacts."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from gatelab import metrics as catalogue
from gatelab.config import ExperimentConfig
from gatelab.data.datasets import (
    domain_with_long_documents,
    evaluation_windows,
    long_context_windows,
    unigram_perplexity,
)
from gatelab.data.synthetic import DOMAIN as BIGRAM_BACKCOPY
from gatelab.data.synthetic import BigramBackcopy
from gatelab.data.tokenizer import bytes_per_token
from gatelab.devices import evaluation_batch_size, evaluation_precision, rows_for_length
from gatelab.eval.benchmarks import PACKAGED_BLIMP, load_blimp, run_in_context_suite, score_blimp
from gatelab.eval.metrics import (
    bits_per_byte_by_domain,
    domain_window_nlls,
    evaluation_mode,
    long_context_perplexity,
    model_device,
    perplexities_by_domain,
)
from gatelab.eval.plots import run_plot_writers
from gatelab.eval.probes import FirstTokenShareByQuery, probe_model
from gatelab.eval.quantization import W8A8_WINDOWS_PER_DOMAIN, w8a8_perplexities

# State of the Union addresses: the built-in corpora's long held-out documents. A files or hf source is evaluated on its
# domain with the most held-out documents long enough.
LONG_CONTEXT_DOMAIN = "speeches"


def evaluate(model, experiment: ExperimentConfig, tokenizer, corpus, domains: list[str],
             loss_history: tuple[Sequence[int], Sequence[float]], spikes: list[int],
             log=print) -> tuple[dict[str, float], dict[str, Callable[[Path], object]]]:
    """(metrics for MLflow, artifact writers by file name). `loss_history` is the run's training loss as
    (steps, losses); `spikes` the steps of its loss spikes. `log` hears each part as it starts: on a CPU the whole
    takes from seconds to minutes, and nothing else moves meanwhile.

    It runs on the device the model is on (the run puts it where it trained), with fp32 weights and activations
    whatever the run trained in, on a GPU with TF32 products (`evaluation_precision`). Not bf16: on a trained tiny
    checkpoint bf16 autocast moved ppl/avg by only 0.004%, but single tokens' log-probabilities by up to 0.03 nats and
    3 of 670 BLiMP pairs to the other side, where gated variants differ by about 1%; the probes read activation maxima
    and attention shares. On a GPU a forward pass also takes larger batches (`evaluation_batch_size`); which windows
    are scored and probed does not depend on it."""
    model = model.float().eval()
    device = model_device(model)
    with evaluation_precision(device):
        return _evaluate(model, device, experiment, tokenizer, corpus, domains, loss_history, spikes, log)


def _evaluate(model, device: torch.device, experiment: ExperimentConfig, tokenizer, corpus, domains: list[str],
              loss_history: tuple[Sequence[int], Sequence[float]], spikes: list[int],
              log) -> tuple[dict[str, float], dict[str, Callable[[Path], object]]]:
    evaluation, seq_len = experiment.eval, experiment.data.seq_len
    batch_size = evaluation_batch_size(evaluation.batch_size, experiment.train.batch_size, device)
    windows = {d: torch.from_numpy(w)
               for d, w in evaluation_windows(corpus, domains, evaluation, seq_len, tokenizer).items()}
    metrics, nlls = heldout_metrics(model, corpus, domains, windows, batch_size, log)
    metrics |= bits_per_byte_metrics(tokenizer, windows, nlls, log)
    metrics |= quantization_metrics(model, windows, nlls, evaluation.batch_size, log)
    metrics |= long_context_metrics(model, experiment, corpus, domains, batch_size, log)
    if evaluation.blimp and experiment.data.task == "text":  # English minimal pairs: the synthetic task has no words
        # BLiMP's sentences are a few dozen tokens, not seq_len: on a GPU a batch holds about as many tokens as one of
        # the training length (at 32 tokens a sentence)
        metrics |= blimp_metrics(model, experiment, tokenizer, corpus.bos_id,
                                 rows_for_length(batch_size, seq_len, 32, device), log)
    metrics |= in_context_metrics(model, experiment, corpus, batch_size, log)

    mixed = torch.cat([w[: evaluation.batch_size] for w in windows.values()])[:, :-1]
    batches = [mixed[i::evaluation.probe_batches] for i in range(evaluation.probe_batches)]
    log("evaluating: probes (attention-sink share and sink rate, massive activations and kurtosis, gate scores)")
    report = probe_model(model, [b for b in batches if len(b)])
    metrics.update(report.summary())
    metrics[catalogue.SPIKES_TOTAL] = float(len(spikes))
    if experiment.data.task == "bigram_backcopy":
        log("evaluating: bigram-backcopy copy and bigram losses")
        task = BigramBackcopy.from_config(experiment.data.bigram_backcopy, corpus.vocab_size)
        metrics.update(bigram_backcopy_metrics(model, task, windows[BIGRAM_BACKCOPY], batch_size))

    artifacts: dict[str, Callable[[Path], object]] = {
        "probes.json": lambda path: path.write_text(json.dumps(report.to_dict(), indent=1)),
        **run_plot_writers(experiment.variant, loss_history, spikes, report.first_token_share, report.f_attn,
                           report.gate_histogram),
    }
    return metrics, artifacts


def heldout_metrics(model, corpus, domains: list[str], windows: dict[str, torch.Tensor], batch_size: int,
                    log) -> tuple[dict[str, float], dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """`ppl/<domain>` over each domain's held-out windows, and `unigram_ppl/avg`: the perplexity of the training
    split's unigram distribution on the held-out one, averaged over the domains; with each window's NLL and tokens."""
    log(f"evaluating: held-out perplexity of {len(domains)} domain(s) ({', '.join(domains)}), "
        f"{sum(len(w) for w in windows.values())} windows")
    nlls = domain_window_nlls(model, windows, batch_size)
    by_domain = perplexities_by_domain(nlls)
    metrics = {catalogue.DOMAIN_PPL.format(domain=domain): by_domain[domain] for domain in domains}
    metrics[catalogue.PPL_AVG] = by_domain["avg"]
    unigram = [unigram_perplexity(corpus.get(d, "train").counts(corpus.vocab_size),
                                  corpus.get(d, "heldout").counts(corpus.vocab_size)) for d in domains]
    metrics[catalogue.UNIGRAM_PPL_AVG] = float(np.mean(unigram))
    return metrics, nlls


def bits_per_byte_metrics(tokenizer, windows: dict[str, torch.Tensor],
                          nlls: dict[str, tuple[torch.Tensor, torch.Tensor]], log) -> dict[str, float]:
    """`bpb/<domain>` and `bpb/avg` from the held-out pass's `nlls`; none where the run has no tokenizer (a synthetic
    task) or one that is not byte-level (`bytes_per_token`)."""
    table = bytes_per_token(tokenizer) if tokenizer is not None else None
    if table is None:
        if tokenizer is not None:
            log("the tokenizer is not byte-level, so a token's bytes are not fixed: no bits per byte")
        return {}
    by_domain = bits_per_byte_by_domain(nlls, windows, torch.from_numpy(table))
    return {catalogue.BPB_AVG if domain == "avg" else catalogue.DOMAIN_BPB.format(domain=domain): value
            for domain, value in by_domain.items()}


def w8a8_rows(n_windows: int) -> slice:
    """Which of a domain's held-out windows the W8A8 perplexity reads: W8A8_WINDOWS_PER_DOMAIN of them, strided so
    that they span the held-out text as the windows do."""
    step = max(1, n_windows // W8A8_WINDOWS_PER_DOMAIN)
    return slice(0, step * W8A8_WINDOWS_PER_DOMAIN, step)


def quantization_metrics(model, windows: dict[str, torch.Tensor], nlls: dict[str, tuple[torch.Tensor, torch.Tensor]],
                         batch_size: int, log) -> dict[str, float]:
    """`eval/w8a8_ppl`: the held-out perplexity (mean over domains) of `w8a8_rows` of each domain's windows under W8A8
    fake quantisation (gatelab.eval.quantization); `eval/w8a8_ppl_ratio`: that over the full-precision perplexity of
    the same windows (from the held-out pass's `nlls`), the figure that compares with ppl/avg. Per-tensor activation
    scales depend on which windows share a forward pass, so the batch is eval.batch_size on every device."""
    rows = {d: w8a8_rows(len(w)) for d, w in windows.items()}
    subset = {d: w[rows[d]] for d, w in windows.items()}
    log(f"evaluating: W8A8 fake-quantised perplexity, {sum(len(w) for w in subset.values())} windows")
    w8a8_ppl = w8a8_perplexities(model, subset, batch_size)["avg"]
    full_precision = perplexities_by_domain({d: (nll[rows[d]], tokens[rows[d]]) for d, (nll, tokens) in nlls.items()})
    return {catalogue.W8A8_PPL: w8a8_ppl, catalogue.W8A8_PPL_RATIO: w8a8_ppl / full_precision["avg"]}


def long_context_metrics(model, experiment: ExperimentConfig, corpus, domains: list[str], batch_size: int,
                         log) -> dict[str, float]:
    """`long_ppl/x<m>` (and `long_ppl_beyond_train/x<m>`) at each of eval.long_context_multipliers times the training
    length, on LONG_CONTEXT_DOMAIN or else the domain with held-out documents that long; none where no domain has."""
    multipliers, seq_len = experiment.eval.long_context_multipliers, experiment.data.seq_len
    long_domain = LONG_CONTEXT_DOMAIN if LONG_CONTEXT_DOMAIN in domains else None
    if long_domain is None and experiment.data.source != "builtin":
        long_domain = domain_with_long_documents(corpus, domains, max(multipliers) * seq_len + 1)
        if long_domain is None:
            log(f"no held-out document has {max(multipliers) * seq_len + 1} tokens: no long-context evaluation")
    if long_domain is None:
        return {}
    log(f"evaluating: long-context perplexity on {long_domain} at "
        f"{', '.join(f'{m}x' for m in multipliers)} the training length")
    longest = long_context_windows(corpus, long_domain, seq_len, multipliers)[max(multipliers)]
    documents = [torch.from_numpy(row) for row in longest]
    metrics = {}
    for m, result in long_context_perplexity(model, documents, seq_len, multipliers, batch_size=batch_size).items():
        if result is not None:
            metrics[catalogue.LONG_PPL.format(multiplier=m)] = result["ppl"]
            if result["ppl_beyond_train_len"] is not None:
                metrics[catalogue.LONG_PPL_BEYOND_TRAIN.format(multiplier=m)] = result["ppl_beyond_train_len"]
    return metrics


def blimp_metrics(model, experiment: ExperimentConfig, tokenizer, bos_id: int, sentence_batch_size: int,
                  log) -> dict[str, float]:
    """`blimp/accuracy`: the share of BLiMP's minimal pairs whose grammatical sentence the model finds likelier."""
    evaluation = experiment.eval
    pairs = load_blimp(Path(evaluation.blimp_path or PACKAGED_BLIMP), per_paradigm=evaluation.blimp_per_paradigm,
                       seed=experiment.seed)
    log(f"evaluating: BLiMP, {len(pairs)} minimal pairs")
    blimp = score_blimp(model, tokenizer, pairs, bos_id=bos_id, batch_size=sentence_batch_size)
    return {catalogue.BLIMP_ACCURACY: blimp["accuracy"]}


def in_context_metrics(model, experiment: ExperimentConfig, corpus, batch_size: int, log) -> dict[str, float]:
    """`icl/<task>`: the accuracy of each synthetic in-context task (induction, MQAR, ...) on fresh random tokens."""
    evaluation = experiment.eval
    log(f"evaluating: in-context tasks, {evaluation.in_context_examples} examples each")
    accuracies = run_in_context_suite(model, corpus.vocab_size, experiment.data.seq_len, seed=experiment.seed,
                                      reserved_ids=[corpus.bos_id, corpus.eos_id],
                                      n_examples=evaluation.in_context_examples, batch_size=batch_size)
    return {catalogue.ICL.format(task=task.replace('@', '_len')): accuracy  # MLflow refuses '@' in metric names
            for task, accuracy in accuracies.items()}


def bigram_backcopy_metrics(model, task: BigramBackcopy, windows_NT1: torch.Tensor,
                            batch_size: int) -> dict[str, float]:
    """`bb/*` over held-out sequences (N, T+1): the copy after a trigger, the bigram elsewhere, and F-Attn by query.

    Query position 0 (BOS, predicting x1) is in neither group. `bb/bigram_loss_optimal` is the mean of H(P(. | x_t))
    over the very positions `bb/bigram_loss` averages: the Bayes loss there, which the chain's entropy rate
    (`BigramBackcopy.entropy_rate`) approximates up to sampling and the triggers' share of the stationary mass.
    """
    is_trigger_V, entropy_V = torch.from_numpy(task.is_trigger_V), torch.from_numpy(task.row_entropy_V)
    recorder = FirstTokenShareByQuery()
    sums = dict.fromkeys(("copy_correct", "copy_loss", "bigram_loss", "bigram_loss_optimal"), 0.0)
    n_copy = n_bigram = 0
    for windows_BT1 in windows_NT1.split(batch_size):
        input_ids_BT, targets_BT = windows_BT1[:, :-1], windows_BT1[:, 1:]
        copy_BT = is_trigger_V[input_ids_BT]
        bigram_BT = ~copy_BT
        bigram_BT[:, 0] = False
        recorder.marked_BT = copy_BT
        with evaluation_mode(model):
            logits_BTV = model(input_ids_BT.to(model_device(model)), probe=recorder).float().cpu()
        nll_BT = torch.nn.functional.cross_entropy(logits_BTV.transpose(1, 2), targets_BT, reduction="none")
        target_logit_BT = logits_BTV.gather(2, targets_BT.unsqueeze(2)).squeeze(2)
        best_other_BT = logits_BTV.scatter(2, targets_BT.unsqueeze(2), float("-inf")).amax(dim=2)
        # A strict win, as score_in_context: a constant-logit model scores 0, not whenever argmax breaks a tie its way.
        sums["copy_correct"] += (target_logit_BT > best_other_BT)[copy_BT].sum().item()
        sums["copy_loss"] += nll_BT[copy_BT].sum().item()
        sums["bigram_loss"] += nll_BT[bigram_BT].sum().item()
        sums["bigram_loss_optimal"] += entropy_V[input_ids_BT][bigram_BT].sum().item()
        n_copy, n_bigram = n_copy + int(copy_BT.sum()), n_bigram + int(bigram_BT.sum())
    mean = lambda total, count: total / count if count else float("nan")  # noqa: E731
    return {
        catalogue.BB_COPY_ACCURACY: mean(sums["copy_correct"], n_copy),
        catalogue.BB_COPY_LOSS: mean(sums["copy_loss"], n_copy),
        catalogue.BB_BIGRAM_LOSS: mean(sums["bigram_loss"], n_bigram),
        catalogue.BB_BIGRAM_LOSS_OPTIMAL: mean(sums["bigram_loss_optimal"], n_bigram),
        catalogue.BB_F_ATTN_TRIGGER: recorder.share(True, model.config.n_layers),
        catalogue.BB_F_ATTN_OTHER: recorder.share(False, model.config.n_layers),
    }
