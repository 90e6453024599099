"""BLiMP scoring and the synthetic in-context tasks, on models whose preferences and answers are known."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from torch import Tensor, nn

from gatelab.eval import benchmarks
from gatelab.eval.benchmarks import (
    generate_induction,
    generate_mqar,
    generate_needle,
    load_blimp,
    run_in_context_suite,
    score_blimp,
    score_in_context,
    sentence_logprobs,
)

SHARED_BLIMP = Path("/work/shared/benchmarks/blimp/data")
V = 64


class ZeroLogits(nn.Module):
    """Uniform over the vocabulary: no preference between any two tokens."""

    def __init__(self, vocab_size: int = V) -> None:
        super().__init__()
        self.vocab_size = vocab_size

    def forward(self, input_ids_BT: Tensor) -> Tensor:
        return torch.zeros(*input_ids_BT.shape, self.vocab_size)


class FavouriteToken(ZeroLogits):
    """Always gives `favourite` a higher logit, so of two equally long sentences the one containing it is likelier."""

    def __init__(self, favourite: int) -> None:
        super().__init__()
        self.favourite = favourite

    def forward(self, input_ids_BT: Tensor) -> Tensor:
        logits_BTV = super().forward(input_ids_BT)
        logits_BTV[..., self.favourite] = 5.0
        return logits_BTV


class TinyCausalLM(nn.Module):
    """A random causal model (embedding, running mean over the prefix, linear): any leak of right padding into earlier
    positions would change its log-probabilities."""

    def __init__(self, vocab_size: int = V, dim: int = 16) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(vocab_size, dim)
        self.out = nn.Linear(dim, vocab_size)

    def forward(self, input_ids_BT: Tensor) -> Tensor:
        hidden_BTD = self.embed(input_ids_BT).cumsum(dim=1)
        hidden_BTD = hidden_BTD / torch.arange(1, input_ids_BT.size(1) + 1)[None, :, None]
        return self.out(torch.tanh(hidden_BTD))


class PreviousOccurrenceLookup(ZeroLogits):
    """A perfect in-context retriever: predicts the token that followed the latest earlier occurrence of the current
    token, preferring an occurrence whose preceding token also matches (so (marker, key) finds the needle). Uniform
    where the current token has not occurred before."""

    def forward(self, input_ids_BT: Tensor) -> Tensor:
        B, T = input_ids_BT.shape
        same_BTS = input_ids_BT[:, :, None] == input_ids_BT[:, None, :]  # [b, t, s]: x_t == x_s
        earlier_TS = torch.ones(T, T, dtype=torch.bool).tril(diagonal=-1)
        candidate_BTS = same_BTS & earlier_TS
        previous_matches_BTS = torch.zeros_like(same_BTS)
        previous_matches_BTS[:, 1:, 1:] = same_BTS[:, :-1, :-1]  # x_{t-1} == x_{s-1}
        preference_BTS = torch.arange(T) + T * previous_matches_BTS  # latest, and two-token matches first
        preference_BTS = preference_BTS.masked_fill(~candidate_BTS, -1)
        source_BT = preference_BTS.argmax(dim=2)
        found_BT = candidate_BTS.any(dim=2)
        predicted_BT = input_ids_BT.gather(1, (source_BT + 1).clamp(max=T - 1))
        return 1e4 * F.one_hot(predicted_BT, self.vocab_size).float() * found_BT[..., None]


class TaskOracle(ZeroLogits):
    """Knows the answers of one task batch: a huge logit on the expected next token at every scored position."""

    def __init__(self, task) -> None:
        super().__init__()
        self.task = task

    def forward(self, input_ids_BT: Tensor) -> Tensor:
        rows_B = (input_ids_BT[:, None, :] == self.task.input_ids_NT[None]).all(dim=2).float().argmax(dim=1)
        targets_BT = self.task.targets_NT[rows_B].clamp(min=0)
        return 1e4 * F.one_hot(targets_BT, self.vocab_size).float()


class WordTokenizer:
    """Whitespace tokenizer over a fixed word list, with the `encode(text).ids` interface of `tokenizers`."""

    def __init__(self, words: list[str], post_processor_bos: bool = False) -> None:
        self.ids = {word: i for i, word in enumerate(words)}
        self.post_processor_bos = post_processor_bos  # like a Llama-3 tokenizer.json, which adds its BOS itself

    def encode(self, text: str, add_special_tokens: bool = True) -> SimpleNamespace:
        bos = [self.ids["<bos>"]] if self.post_processor_bos and add_special_tokens else []
        return SimpleNamespace(ids=bos + [self.ids[word] for word in text.split()])


# --------------------------------------------------------------------------------------------------------------- BLiMP

WORDS = ["<bos>", "the", "cat", "dog", "sat", "ran", "on", "mat", "quietly", "very"]


def favourite_pairs() -> list[dict]:
    """Equal-length pairs whose good sentence alone contains "quietly"."""
    return [
        {"sentence_good": "the cat sat quietly", "sentence_bad": "the cat sat on", "UID": "p1", "pairID": "0"},
        {"sentence_good": "the dog ran quietly", "sentence_bad": "the dog ran very", "UID": "p1", "pairID": "1"},
        {"sentence_good": "the quietly cat", "sentence_bad": "the very cat", "UID": "p2", "pairID": "0"},
    ]


def test_blimp_prepends_one_bos_even_where_the_tokenizer_adds_its_own(monkeypatch):
    scored = []

    def record(model, sequences, batch_size):
        scored.extend(sequences)
        return torch.zeros(len(sequences))

    monkeypatch.setattr(benchmarks, "sentence_logprobs", record)
    score_blimp(None, WordTokenizer(WORDS, post_processor_bos=True), favourite_pairs(), bos_id=0)
    assert len(scored) == 6 and all(s[0] == 0 and 0 not in s[1:] for s in scored)


@pytest.mark.parametrize("bos_id", [None, 0])
def test_blimp_model_preferring_the_good_sentence_scores_one_and_swapped_zero(bos_id):
    tokenizer = WordTokenizer(WORDS)
    model = FavouriteToken(tokenizer.ids["quietly"])
    pairs = favourite_pairs()
    result = score_blimp(model, tokenizer, pairs, bos_id=bos_id, batch_size=2)
    assert result == {"accuracy": 1.0, "by_paradigm": {"p1": 1.0, "p2": 1.0}, "n": 3}
    swapped = [{**pair, "sentence_good": pair["sentence_bad"], "sentence_bad": pair["sentence_good"]} for pair in pairs]
    assert score_blimp(model, tokenizer, swapped, bos_id=bos_id)["accuracy"] == 0.0


def test_blimp_ties_count_as_wrong():
    tokenizer = WordTokenizer(WORDS)
    result = score_blimp(ZeroLogits(), tokenizer, favourite_pairs(), bos_id=0)  # equal lengths: exact ties
    assert result["accuracy"] == 0.0


def test_blimp_first_token_is_scored_only_after_bos():
    tokenizer = WordTokenizer(WORDS)
    model = FavouriteToken(tokenizer.ids["quietly"])
    pair = [{"sentence_good": "quietly the dog ran", "sentence_bad": "very the dog ran", "UID": "p", "pairID": "0"}]
    assert score_blimp(model, tokenizer, pair, bos_id=0)["accuracy"] == 1.0
    assert score_blimp(model, tokenizer, pair)["accuracy"] == 0.0  # the first token is only context: a tie


def random_sentences(n: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 15, (n,), generator=generator).tolist()
    return [torch.randint(V, (length,), generator=generator).tolist() for length in lengths]


def test_blimp_padding_does_not_change_scores():
    model = TinyCausalLM()
    sentences = random_sentences(23, seed=0)
    one_by_one_N = sentence_logprobs(model, sentences, batch_size=1)
    for batch_size in (3, 8, 100):
        assert torch.allclose(sentence_logprobs(model, sentences, batch_size), one_by_one_N, rtol=0, atol=1e-4)
    by_hand = [
        F.log_softmax(model(torch.tensor([s[:-1]])), dim=-1)[0, torch.arange(len(s) - 1), s[1:]].sum().item()
        for s in sentences
    ]
    assert one_by_one_N.tolist() == pytest.approx(by_hand, abs=1e-4)

    words = [str(i) for i in range(V)]
    pairs = [
        {"sentence_good": " ".join(map(str, good)), "sentence_bad": " ".join(map(str, bad)), "UID": f"u{i % 3}",
         "pairID": str(i)}
        for i, (good, bad) in enumerate(zip(sentences, random_sentences(23, seed=1)))
    ]
    scores = [score_blimp(model, WordTokenizer(words), pairs, batch_size=b) for b in (1, 5, 64)]
    assert scores[0] == scores[1] == scores[2]


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))


def test_load_blimp_names_what_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "nowhere")):
        load_blimp(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        load_blimp(tmp_path)  # exists but holds no paradigm file
    write_jsonl(tmp_path / "p1.jsonl", favourite_pairs()[:2])
    with pytest.raises(FileNotFoundError, match="p9.jsonl"):
        load_blimp(tmp_path, paradigms=["p1", "p9"])
    write_jsonl(tmp_path / "broken.jsonl", [{"sentence_good": "the cat"}])
    with pytest.raises(ValueError, match=r"broken.jsonl:1: .*sentence_bad"):
        load_blimp(tmp_path)
    assert load_blimp(tmp_path, paradigms=["p1"]) == favourite_pairs()[:2]


@pytest.mark.skipif(not SHARED_BLIMP.is_dir(), reason=f"no BLiMP copy at {SHARED_BLIMP}")
def test_real_blimp_files_load_and_score_with_a_real_tokenizer():
    pairs = load_blimp(SHARED_BLIMP, per_paradigm=5)
    paradigms = sorted(path.stem for path in SHARED_BLIMP.glob("*.jsonl"))
    assert len(pairs) == 5 * len(paradigms) and len(paradigms) == 67
    assert sorted({pair["UID"] for pair in pairs}) == paradigms
    assert load_blimp(SHARED_BLIMP, per_paradigm=5) == pairs
    assert load_blimp(SHARED_BLIMP, per_paradigm=5, seed=1) != pairs
    assert load_blimp(SHARED_BLIMP, paradigms=[paradigms[3]], per_paradigm=5) == pairs[15:20]

    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    sentences = [pair[field] for pair in pairs for field in ("sentence_good", "sentence_bad")]
    tokenizer.train_from_iterator(sentences, trainers.BpeTrainer(vocab_size=300, special_tokens=["[UNK]", "<bos>"]))
    bos_id = tokenizer.token_to_id("<bos>")

    # A uniform model scores a sentence by its token count alone: the good one wins iff it has fewer tokens.
    result = score_blimp(ZeroLogits(tokenizer.get_vocab_size()), tokenizer, pairs, bos_id=bos_id, batch_size=64)
    shorter = [
        len(tokenizer.encode(pair["sentence_good"]).ids) < len(tokenizer.encode(pair["sentence_bad"]).ids)
        for pair in pairs
    ]
    assert result["n"] == len(pairs)
    assert result["accuracy"] == pytest.approx(sum(shorter) / len(pairs))
    assert set(result["by_paradigm"]) == set(paradigms)
    # Reorderings of the same words tokenize to the same count: all ties, so all wrong.
    assert result["by_paradigm"]["adjunct_island"] == 0.0


# ------------------------------------------------------------------------------------------------- in-context tasks

RESERVED = (0, 1, 2)


def make_task(name: str, seed: int = 0):
    if name == "induction":
        return generate_induction(12, seq_len=48, span_len=10, vocab_size=V, seed=seed, reserved_ids=RESERVED)
    if name == "mqar":
        return generate_mqar(12, n_pairs=8, vocab_size=V, seed=seed, reserved_ids=RESERVED)
    return generate_needle(12, context_len=40, vocab_size=V, seed=seed, reserved_ids=RESERVED)


TASKS = ["induction", "mqar", "needle"]


@pytest.mark.parametrize("name", TASKS)
def test_tasks_are_deterministic_and_avoid_reserved_ids(name):
    task = make_task(name)
    for a, b in zip(task, make_task(name)):
        assert torch.equal(a, b)
    assert not torch.equal(task.input_ids_NT, make_task(name, seed=1).input_ids_NT)
    scored_targets = task.targets_NT[task.score_mask_NT]
    assert (task.targets_NT[~task.score_mask_NT] == -100).all()
    for reserved in RESERVED:
        assert not (task.input_ids_NT == reserved).any() and not (scored_targets == reserved).any()
    assert task.input_ids_NT.dtype == task.targets_NT.dtype == torch.long and task.score_mask_NT.dtype == torch.bool


@pytest.mark.parametrize("name", TASKS)
def test_true_next_token_scores_one_and_uniform_scores_zero(name):
    task = make_task(name)
    assert score_in_context(TaskOracle(task), task, batch_size=5) == 1.0
    assert score_in_context(PreviousOccurrenceLookup(), task, batch_size=5) == 1.0
    assert score_in_context(ZeroLogits(), task, batch_size=5) == 0.0  # all-tie logits: never strictly right


def test_task_layouts():
    induction = make_task("induction")
    assert induction.score_mask_NT.sum(dim=1).tolist() == [9] * 12  # span_len - 1 scored tokens per example

    mqar = make_task("mqar")
    assert mqar.input_ids_NT.shape == (12, 32)
    context_NK2 = mqar.input_ids_NT[:, :16].view(12, 8, 2)
    for n in range(12):
        value_of = dict(context_NK2[n].tolist())
        assert len(value_of) == 8  # distinct keys
        queried = mqar.input_ids_NT[n, 16::2].tolist()
        assert sorted(queried) == sorted(value_of)
        assert mqar.targets_NT[n, 16::2].tolist() == [value_of[key] for key in queried]

    needle = make_task("needle")
    assert needle.score_mask_NT[:, -1].all() and needle.score_mask_NT.sum() == 12
    marker = needle.input_ids_NT[0, -2]
    assert ((needle.input_ids_NT[:, :-2] == marker).sum(dim=1) == 1).all()  # exactly one needle


def test_ties_between_target_and_another_token_are_wrong():
    class TieWithZero(TaskOracle):
        def forward(self, input_ids_BT: Tensor) -> Tensor:
            logits_BTV = super().forward(input_ids_BT)
            logits_BTV[..., 3] = 1e4
            return logits_BTV

    task = make_task("needle")
    tied = (task.targets_NT[task.score_mask_NT] != 3).float().mean().item()
    assert score_in_context(TieWithZero(task), task) == pytest.approx(1 - tied)


def test_in_context_suite_keys_and_extremes():
    suite = run_in_context_suite(PreviousOccurrenceLookup(), V, seq_len=64, seed=0, reserved_ids=RESERVED, n_examples=8)
    assert list(suite) == ["induction", "mqar", "needle@16", "needle@32", "needle@64"]
    assert all(accuracy == 1.0 for accuracy in suite.values())
    uniform = run_in_context_suite(ZeroLogits(), V, seq_len=64, seed=0, reserved_ids=RESERVED, n_examples=8)
    assert all(accuracy == 0.0 for accuracy in uniform.values())
