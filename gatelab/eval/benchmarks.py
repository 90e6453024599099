"""Zero-shot benchmarks small models can be scored on: BLiMP minimal pairs and synthetic in-context tasks.

The paper reports few-shot MMLU, GSM8k, HumanEval, ... on models trained on 400B-3.5T tokens; models trained in minutes
score at chance there. BLiMP (grammatical vs ungrammatical sentence, Warstadt et al. 2020) and the synthetic
in-context tasks (induction copying, multi-query associative recall, needle retrieval) separate small models and probe
what gating is claimed to change: how attention retrieves from context, and at which lengths.

The synthetic tasks are generated from a seed over token ids in [0, vocab_size) minus `reserved_ids` (special
tokens), so they work with any tokenizer.
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import torch
from torch import Tensor, nn

from gatelab.eval.metrics import IGNORE_INDEX, evaluation_mode, model_device, token_nll

BLIMP_FIELDS = ("sentence_good", "sentence_bad", "UID", "pairID")
# The first 100 pairs of each of BLiMP's 67 paradigms, shipped with the package (its NOTICE.md): BLiMP offline.
PACKAGED_BLIMP = Path(__file__).resolve().parent / "blimp"
NEEDLE_MIN_LEN = 5  # (marker, key, value) needle + (marker, key) query
SUITE_MAX_INDUCTION_SPAN = 32
SUITE_MAX_MQAR_PAIRS = 32


class Encoding(Protocol):
    ids: list[int]


class Tokenizer(Protocol):
    """The part of a HuggingFace `tokenizers.Tokenizer` used here."""

    def encode(self, text: str, add_special_tokens: bool = True) -> Encoding: ...


# --------------------------------------------------------------------------------------------------------------- BLiMP


def load_blimp(path: str | Path = PACKAGED_BLIMP, paradigms: Iterable[str] | None = None,
               per_paradigm: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
    """BLiMP pairs (each file's records as they are) from one `<paradigm>.jsonl` per paradigm, as the official release
    lays them out; by default the package's 100 pairs a paradigm. `per_paradigm` keeps a random subset of each, in file
    order, which depends only on (seed, paradigm), so adding a paradigm does not reshuffle the others.
    """
    directory = Path(path)
    if not directory.is_dir():
        raise FileNotFoundError(f"BLiMP data directory not found: {directory} (expected one <paradigm>.jsonl file per "
                                "paradigm)")
    available = sorted(file.stem for file in directory.glob("*.jsonl"))
    if not available:
        raise FileNotFoundError(f"no BLiMP <paradigm>.jsonl files in {directory}")
    wanted = available if paradigms is None else list(paradigms)
    missing = [paradigm for paradigm in wanted if paradigm not in available]
    if missing:
        raise FileNotFoundError(f"BLiMP paradigm file(s) {', '.join(f'{p}.jsonl' for p in missing)} not in "
                                f"{directory}; available: {', '.join(available)}")
    pairs: list[dict[str, Any]] = []
    for paradigm in wanted:
        records = _read_blimp_file(directory / f"{paradigm}.jsonl")
        if per_paradigm is not None and per_paradigm < len(records):
            keep = sorted(random.Random(f"{seed}:{paradigm}").sample(range(len(records)), per_paradigm))
            records = [records[i] for i in keep]
        pairs.extend(records)
    return pairs


def _read_blimp_file(file: Path) -> list[dict[str, Any]]:
    records = []
    for line_no, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        record = json.loads(line)
        absent = [field for field in BLIMP_FIELDS if field not in record]
        if absent:
            raise ValueError(f"{file}:{line_no}: BLiMP record lacks field(s) {', '.join(absent)}")
        records.append(record)
    return records


def sentence_logprobs(model: nn.Module, sequences: Sequence[Sequence[int]], batch_size: int = 32) -> Tensor:
    """Total log-probability (N,) float64 of each token sequence's tokens 1.., each conditioned on those before it;
    batches are right-padded with id 0, which a causal model's earlier positions never see."""
    if any(len(sequence) < 2 for sequence in sequences):
        raise ValueError("sentence_logprobs: every sequence needs >= 2 tokens (the first one is only context)")
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    logprobs_N = torch.zeros(len(sequences), dtype=torch.float64)
    for start in range(0, len(order), batch_size):
        batch = order[start : start + batch_size]
        max_len = max(len(sequences[i]) for i in batch)
        tokens_BL = torch.zeros(len(batch), max_len, dtype=torch.long)
        targets_BL = torch.full((len(batch), max_len), IGNORE_INDEX, dtype=torch.long)
        for row, i in enumerate(batch):
            tokens_BL[row, : len(sequences[i])] = torch.tensor(sequences[i])
            targets_BL[row, : len(sequences[i])] = tokens_BL[row, : len(sequences[i])]
        nll_BT = token_nll(model, tokens_BL[:, :-1], targets_BL[:, 1:])
        logprobs_N[batch] = -nll_BT.sum(dim=1)
    return logprobs_N


def score_blimp(model: nn.Module, tokenizer: Tokenizer, pairs: Sequence[dict[str, Any]], bos_id: int | None = None,
                batch_size: int = 32) -> dict[str, Any]:
    """Zero-shot BLiMP: a pair is right when the good sentence has the strictly higher total log-probability.

    Without `bos_id` the first token is only context (a causal LM does not know its unconditional probability).
    Sentences are encoded without the tokenizer's special tokens, as training text is (a Llama-3 tokenizer.json would
    add a second BOS). Unnormalised, as in the BLiMP paper; a tie counts as wrong.
    """
    if not pairs:
        raise ValueError("score_blimp: no pairs to score")
    prefix = [] if bos_id is None else [bos_id]
    sequences = [prefix + tokenizer.encode(pair[field], add_special_tokens=False).ids
                 for pair in pairs for field in ("sentence_good", "sentence_bad")]
    logprobs_N2 = sentence_logprobs(model, sequences, batch_size).view(-1, 2)
    correct_N = (logprobs_N2[:, 0] > logprobs_N2[:, 1]).tolist()
    outcomes_by_paradigm: dict[str, list[bool]] = defaultdict(list)
    for pair, correct in zip(pairs, correct_N):
        outcomes_by_paradigm[pair["UID"]].append(correct)
    return {
        "accuracy": sum(correct_N) / len(correct_N),
        "by_paradigm": {uid: sum(outcomes) / len(outcomes) for uid, outcomes in outcomes_by_paradigm.items()},
        "n": len(correct_N),
    }


# ------------------------------------------------------------------------------------------------- in-context tasks


class InContextBatch(NamedTuple):
    """A synthetic task: the model reads `input_ids_NT`; at each position where `score_mask_NT` is set its greedy
    next-token prediction must equal `targets_NT` (IGNORE_INDEX elsewhere)."""

    input_ids_NT: Tensor
    score_mask_NT: Tensor
    targets_NT: Tensor


def _usable_ids(vocab_size: int, reserved_ids: Iterable[int], needed: int, task: str) -> Tensor:
    """The sorted token ids a task may use: [0, vocab_size) minus the reserved (special) ids."""
    reserved = set(reserved_ids)
    usable = torch.tensor([i for i in range(vocab_size) if i not in reserved], dtype=torch.long)
    if len(usable) < needed:
        raise ValueError(f"{task}: needs {needed} usable token ids but vocab_size={vocab_size} minus {len(reserved)} "
                         f"reserved ids leaves {len(usable)}")
    return usable


def _task_batch(input_ids_NT: Tensor, score_mask_NT: Tensor, expected_NT: Tensor) -> InContextBatch:
    return InContextBatch(input_ids_NT, score_mask_NT, expected_NT.masked_fill(~score_mask_NT, IGNORE_INDEX))


def generate_induction(n_examples: int, seq_len: int, span_len: int, vocab_size: int, seed: int,
                       reserved_ids: Iterable[int] = ()) -> InContextBatch:
    """Induction copying: a random span of `span_len` distinct tokens, which the filler never uses, in the first half,
    repeated in the second; scored: the predictions inside the second copy after its first token."""
    if span_len < 2 or seq_len // 2 < span_len:
        raise ValueError(f"generate_induction: need 2 <= span_len <= seq_len // 2, got span_len={span_len}, "
                         f"seq_len={seq_len}")
    usable = _usable_ids(vocab_size, reserved_ids, span_len + 1, "generate_induction")
    generator = torch.Generator().manual_seed(seed)
    half = seq_len // 2
    input_ids_NT = torch.empty(n_examples, seq_len, dtype=torch.long)
    score_mask_NT = torch.zeros(n_examples, seq_len, dtype=torch.bool)
    expected_NT = torch.zeros(n_examples, seq_len, dtype=torch.long)
    for n in range(n_examples):
        shuffled = usable[torch.randperm(len(usable), generator=generator)]
        span, filler_pool = shuffled[:span_len], shuffled[span_len:]
        input_ids_NT[n] = filler_pool[torch.randint(len(filler_pool), (seq_len,), generator=generator)]
        first = int(torch.randint(half - span_len + 1, (), generator=generator))
        second = half + int(torch.randint(seq_len - half - span_len + 1, (), generator=generator))
        input_ids_NT[n, first : first + span_len] = span
        input_ids_NT[n, second : second + span_len] = span
        score_mask_NT[n, second : second + span_len - 1] = True
        expected_NT[n, second : second + span_len - 1] = span[1:]
    return _task_batch(input_ids_NT, score_mask_NT, expected_NT)


def generate_mqar(n_examples: int, n_pairs: int, vocab_size: int, seed: int,
                  reserved_ids: Iterable[int] = ()) -> InContextBatch:
    """Multi-query associative recall (Arora et al. 2023, Zoology): k1 v1 ... kK vK, then q1 v(q1) ... qK v(qK).

    Distinct keys from the lower half of the usable ids, values (repeats allowed, as in Zoology) from the upper half,
    so a token's role is unambiguous; scored: the value predicted right after each queried key.
    """
    usable = _usable_ids(vocab_size, reserved_ids, 2 * n_pairs, "generate_mqar")
    key_pool, value_pool = usable[: len(usable) // 2], usable[len(usable) // 2 :]
    generator = torch.Generator().manual_seed(seed)
    key_choice_NK = torch.rand(n_examples, len(key_pool), generator=generator).argsort(dim=1)[:, :n_pairs]
    keys_NK = key_pool[key_choice_NK]
    values_NK = value_pool[torch.randint(len(value_pool), (n_examples, n_pairs), generator=generator)]
    query_order_NK = torch.rand(n_examples, n_pairs, generator=generator).argsort(dim=1)
    query_keys_NK, query_values_NK = keys_NK.gather(1, query_order_NK), values_NK.gather(1, query_order_NK)
    context_N2K = torch.stack((keys_NK, values_NK), dim=-1).flatten(1)
    queries_N2K = torch.stack((query_keys_NK, query_values_NK), dim=-1).flatten(1)
    input_ids_NT = torch.cat((context_N2K, queries_N2K), dim=1)
    score_mask_NT = torch.zeros_like(input_ids_NT, dtype=torch.bool)
    score_mask_NT[:, 2 * n_pairs :: 2] = True  # the queried keys
    expected_NT = torch.zeros_like(input_ids_NT)
    expected_NT[:, 2 * n_pairs :: 2] = query_values_NK
    return _task_batch(input_ids_NT, score_mask_NT, expected_NT)


def generate_needle(n_examples: int, context_len: int, vocab_size: int, seed: int,
                    reserved_ids: Iterable[int] = ()) -> InContextBatch:
    """Needle retrieval: random filler with a (marker, key, value) needle at a uniformly random depth, ending in
    (marker, key); scored: predicting the value at the last position.

    The marker is the smallest usable id and never appears in the filler, so exactly one earlier (marker, key) exists.
    """
    if context_len < NEEDLE_MIN_LEN:
        raise ValueError(f"generate_needle: context_len must be >= {NEEDLE_MIN_LEN}, got {context_len}")
    usable = _usable_ids(vocab_size, reserved_ids, 2, "generate_needle")
    marker, pool = usable[0], usable[1:]
    generator = torch.Generator().manual_seed(seed)
    input_ids_NT = pool[torch.randint(len(pool), (n_examples, context_len), generator=generator)]
    key_N = pool[torch.randint(len(pool), (n_examples,), generator=generator)]
    value_N = pool[torch.randint(len(pool), (n_examples,), generator=generator)]
    # The needle must end before the final (marker, key): it starts at most at context_len - 5.
    depth_N = torch.randint(context_len - NEEDLE_MIN_LEN + 1, (n_examples,), generator=generator)
    rows_N = torch.arange(n_examples)
    input_ids_NT[rows_N, depth_N] = marker
    input_ids_NT[rows_N, depth_N + 1] = key_N
    input_ids_NT[rows_N, depth_N + 2] = value_N
    input_ids_NT[:, -2] = marker
    input_ids_NT[:, -1] = key_N
    score_mask_NT = torch.zeros_like(input_ids_NT, dtype=torch.bool)
    score_mask_NT[:, -1] = True
    expected_NT = torch.zeros_like(input_ids_NT)
    expected_NT[:, -1] = value_N
    return _task_batch(input_ids_NT, score_mask_NT, expected_NT)


def score_in_context(model: nn.Module, task_batch: InContextBatch, batch_size: int = 16) -> float:
    """Greedy next-token accuracy over the scored positions: right only when the target's logit is strictly above
    every other, as argmax would credit a constant-logit model whenever the target is the smallest id."""
    device = model_device(model)
    n_correct, n_scored = 0, 0
    for input_ids_BT, score_mask_BT, targets_BT in zip(*(tensor.split(batch_size) for tensor in task_batch)):
        with evaluation_mode(model):
            logits_BTV = model(input_ids_BT.to(device))
        score_mask_BT, targets_BT = score_mask_BT.to(device), targets_BT.to(device)
        logits_SV = logits_BTV[score_mask_BT].float()  # S = scored positions in this batch
        targets_S1 = targets_BT[score_mask_BT].unsqueeze(1)
        target_logit_S = logits_SV.gather(1, targets_S1).squeeze(1)
        best_other_logit_S = logits_SV.scatter(1, targets_S1, float("-inf")).max(dim=1).values
        n_correct += int((target_logit_S > best_other_logit_S).sum())
        n_scored += targets_S1.size(0)
    if n_scored == 0:
        raise ValueError("score_in_context: the task has no scored position")
    return n_correct / n_scored


def run_in_context_suite(model: nn.Module, vocab_size: int, seq_len: int, seed: int = 0,
                         reserved_ids: Iterable[int] = (), n_examples: int = 64,
                         batch_size: int = 16) -> dict[str, float]:
    """Accuracy on every synthetic task sized to a model trained at `seq_len`: "induction", "mqar" and "needle@<L>"
    for L in seq_len // 4, seq_len // 2, seq_len, each task with its own seed derived from `seed`."""
    reserved = tuple(reserved_ids)
    span_len = min(SUITE_MAX_INDUCTION_SPAN, seq_len // 4)
    n_pairs = min(SUITE_MAX_MQAR_PAIRS, seq_len // 4)
    tasks = {
        "induction": generate_induction(n_examples, seq_len, span_len, vocab_size, seed, reserved),
        "mqar": generate_mqar(n_examples, n_pairs, vocab_size, seed + 1, reserved),
    }
    needle_lengths = sorted({seq_len // 4, seq_len // 2, seq_len})
    for offset, length in enumerate(needle_lengths, start=2):
        if length >= NEEDLE_MIN_LEN:
            tasks[f"needle@{length}"] = generate_needle(n_examples, length, vocab_size, seed + offset, reserved)
    return {name: score_in_context(model, task, batch_size) for name, task in tasks.items()}
