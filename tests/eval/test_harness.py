"""gatelab models behind lm-evaluation-harness: known answers against gatelab's own scoring, oracle models, the offline
BLiMP task, checkpoints from a real run, and lm-eval's command line."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from tokenizers import Tokenizer
from torch import Tensor, nn

# lm-eval is a dependency, but a GPU machine's bundle carries it only on request (EVAL=1): there `pytest -m gpu` must
# still collect, so this module skips whole, saying why, rather than stopping the collection with an ImportError.
lm_eval = pytest.importorskip("lm_eval", reason="lm-eval is not installed: `pip install -e .` brings it")
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

from gatelab.errors import GatelabError  # noqa: E402
from gatelab.eval.benchmarks import PACKAGED_BLIMP, load_blimp, score_blimp, sentence_logprobs  # noqa: E402
from gatelab.eval.harness import GatelabLM, load_checkpoint, local_task_dir  # noqa: E402
from gatelab.model import build_model  # noqa: E402
from tests.helpers import (  # noqa: E402
    REPO,
    made_once,
    micro_config,
    sqlite_uri,
    train_in_process,
    write_foreign_tokenizer,
    write_micro_experiment,
)

V = 300  # the vocabulary of write_foreign_tokenizer's tokenizer
SENTENCES = ["river stone lantern quiet harbour.", "The cat, who slept, was not seen by Anna?",
             "Who should Derek hug after shocking Richard?", "orchard", "signal meadow copper window river stone"]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Tokenizer:
    return Tokenizer.from_file(str(write_foreign_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json")))


@pytest.fixture(scope="module")
def bos(tokenizer) -> int:
    return tokenizer.token_to_id("<|endoftext|>")


@pytest.fixture(scope="module")
def micro_model() -> nn.Module:
    return build_model(micro_config(vocab_size=V), seed=0)


class FavourTokens(nn.Module):
    """The same logits at every position: `bonus` on the favoured ids, 0 elsewhere (none favoured: uniform, so two
    equally long texts tie exactly)."""

    def __init__(self, favoured: list[int] = (), bonus: float = 5.0, vocab_size: int = V) -> None:
        super().__init__()
        self.register_buffer("bias_V", torch.zeros(vocab_size))
        self.bias_V[list(favoured)] = bonus

    def forward(self, input_ids_BT: Tensor) -> Tensor:
        return self.bias_V.expand(*input_ids_BT.shape, -1).clone()


class NextToken(nn.Module):
    """A bigram oracle: after token x the logits favour `table[x]` (default: x itself)."""

    def __init__(self, table: dict[int, int], vocab_size: int = V) -> None:
        super().__init__()
        next_V = torch.arange(vocab_size)
        for current, following in table.items():
            next_V[current] = following
        self.register_buffer("next_V", next_V)

    def forward(self, input_ids_BT: Tensor) -> Tensor:
        return 10.0 * nn.functional.one_hot(self.next_V[input_ids_BT], V).float()


def requests(kind: str, arguments: list[tuple]) -> list[Instance]:
    return [Instance(request_type=kind, doc={}, arguments=args, idx=i) for i, args in enumerate(arguments)]


def reference_logprob(model: nn.Module, ids: list[int]) -> float:
    """gatelab's own scoring: the total log-probability of ids[1:] given what comes before."""
    return sentence_logprobs(model, [ids]).item() if len(ids) > 1 else 0.0


# --- known answers: gatelab's own scoring ---------------------------------------------------------------------------


def test_loglikelihood_equals_sentence_logprobs(micro_model, tokenizer, bos):
    lm = GatelabLM.from_model(micro_model, tokenizer, bos, seq_len=128, batch_size=3)  # batches of mixed lengths
    results = lm.loglikelihood(requests("loglikelihood", [("", s) for s in SENTENCES]))
    expected = sentence_logprobs(micro_model, [[bos] + tokenizer.encode(s, add_special_tokens=False).ids
                                               for s in SENTENCES])
    assert torch.allclose(torch.tensor([logprob for logprob, _ in results], dtype=torch.float64), expected, atol=1e-5)


def test_continuation_is_scored_given_its_context(micro_model, tokenizer, bos):
    """A continuation's log-probability is that of context + continuation minus that of the context; trailing spaces
    of the context move to the continuation (HFLM's split), so both spellings score alike."""
    lm = GatelabLM.from_model(micro_model, tokenizer, bos, seq_len=128)
    encode = lambda text: [bos] + tokenizer.encode(text, add_special_tokens=False).ids  # noqa: E731
    (with_space, _), (moved, _) = lm.loglikelihood(requests("loglikelihood", [
        ("the old harbour", " river quiet"), ("the old harbour ", "river quiet")]))
    expected = (reference_logprob(micro_model, encode("the old harbour river quiet"))
                - reference_logprob(micro_model, encode("the old harbour")))
    assert with_space == pytest.approx(expected, abs=1e-5)
    assert moved == pytest.approx(expected, abs=1e-5)


def test_context_is_left_truncated_to_the_training_length(micro_model, tokenizer, bos):
    L = 8
    lm = GatelabLM.from_model(micro_model, tokenizer, bos, seq_len=L)
    context, continuation = "river stone lantern quiet harbour orchard signal meadow copper", " window river"
    [(logprob, _)] = lm.loglikelihood(requests("loglikelihood", [(context, continuation)]))
    context_ids, continuation_ids = lm._encode_pair(context, continuation)
    assert len(context_ids) > L
    tokens = (context_ids + continuation_ids)[-(L + 1):]  # the model sees L inputs and predicts the last ones
    expected = reference_logprob(micro_model, tokens) - reference_logprob(micro_model, tokens[:-len(continuation_ids)])
    assert logprob == pytest.approx(expected, abs=1e-5)


def test_rolling_windows_score_every_token_once(micro_model, tokenizer, bos):
    """A document shorter than the training length is one window (= gatelab's sentence score); a longer one is
    HFLM's disjoint windows, each predicting up to L tokens with a full L-token context after the first."""
    document = " ".join(SENTENCES)
    ids = [bos] + tokenizer.encode(document, add_special_tokens=False).ids
    long_lm = GatelabLM.from_model(micro_model, tokenizer, bos, seq_len=256)
    assert long_lm.loglikelihood_rolling(requests("loglikelihood_rolling", [(document,)])) == pytest.approx(
        [reference_logprob(micro_model, ids)], abs=1e-5)

    L = 8
    lm = GatelabLM.from_model(micro_model, tokenizer, bos, seq_len=L, batch_size=4)
    expected, start = reference_logprob(micro_model, ids[: L + 1]), L + 1  # BOS + the first L tokens
    while start < len(ids):
        end = min(start + L, len(ids))
        window = ids[end - 1 - L: end]  # L inputs, predicting ids[start:end]
        expected += (reference_logprob(micro_model, window)
                     - reference_logprob(micro_model, window[: len(window) - (end - start)]))
        start = end
    [rolling] = lm.loglikelihood_rolling(requests("loglikelihood_rolling", [(document,)]))
    assert len(ids) > 3 * L and rolling == pytest.approx(expected, abs=1e-4)
    # A continuation longer than L is scored over the same windows.
    [(whole, _)] = lm.loglikelihood(requests("loglikelihood", [("", document)]))
    assert whole == pytest.approx(rolling, abs=1e-5)


# --- BLiMP through lm-eval equals score_blimp -----------------------------------------------------------------------


def lm_eval_accuracy(lm: GatelabLM, task: str, include_path: Path, **metadata) -> dict:
    # Without lm-eval's own thousands of task YAMLs, which take it seconds to index.
    manager = TaskManager(include_path=str(include_path), include_defaults=False, metadata=metadata or None)
    results = lm_eval.simple_evaluate(model=lm, tasks=[task], task_manager=manager, verbosity="ERROR")
    return results["results"][task]


@pytest.mark.parametrize("kind", ["micro", "uniform"])
def test_blimp_through_lm_eval_equals_score_blimp(kind, micro_model, tokenizer, bos):
    """Exactly, on the same pairs; the uniform model ties every pair of equally long sentences, which both count as
    wrong. seq_len covers the longest sentence: score_blimp does not truncate."""
    model = micro_model if kind == "micro" else FavourTokens()
    lm = GatelabLM.from_model(model, tokenizer, bos, seq_len=128, batch_size=64)
    result = lm_eval_accuracy(lm, "gatelab_blimp", local_task_dir(), blimp_per_paradigm=2, blimp_seed=5)
    expected = score_blimp(model, tokenizer, load_blimp(per_paradigm=2, seed=5), bos_id=bos)
    assert result["acc,none"] == expected["accuracy"]
    assert expected["n"] == 134


def test_scoring_gatelab_s_own_task_never_indexes_lm_eval_s_task_files(micro_model, tokenizer, bos, monkeypatch):
    """lm-eval's whole index (14,000 YAMLs) takes about 10 s: `score_live`, as `gatelab eval` per run, keeps to the
    index of gatelab's tasks (simple_evaluate used to build the whole one again for every run it scored)."""
    import lm_eval.evaluator
    import lm_eval.tasks

    from gatelab.eval import scoring

    whole_indexes = []

    class CountingManager(TaskManager):
        def __init__(self, *args, include_defaults: bool = True, **kwargs):
            whole_indexes.extend([kwargs.get("include_path")] if include_defaults else [])
            super().__init__(*args, include_defaults=include_defaults, **kwargs)

    monkeypatch.setattr(lm_eval.tasks, "TaskManager", CountingManager)
    monkeypatch.setattr(lm_eval.evaluator, "TaskManager", CountingManager)
    settings = scoring.HarnessSettings(tasks=("gatelab_blimp",), limit=4, batch_size=8)
    metrics, _, tags = scoring.score_live(micro_model, tokenizer, bos, bos, 128, "32-true", settings)
    assert 0 <= metrics["lm_eval/gatelab_blimp/acc"] <= 1 and set(tags) == {"gatelab.lm_eval.gatelab_blimp"}
    assert whole_indexes == []


def test_packaged_blimp_is_the_first_pairs_of_every_paradigm():
    files = sorted(PACKAGED_BLIMP.glob("*.jsonl"))
    assert len(files) == 67 and (PACKAGED_BLIMP / "NOTICE.md").is_file()
    largest_preset = max(yaml.safe_load(p.read_text()).get("eval", {}).get("blimp_per_paradigm", 20)
                         for p in (REPO / "experiments").glob("*.yaml"))
    pairs = load_blimp()
    assert len(pairs) == 67 * 100 >= 67 * largest_preset
    shared = REPO.parent / "shared" / "benchmarks" / "blimp" / "data"
    if shared.is_dir():  # the release's records, unchanged, pairID 0-99
        for file in files:
            assert file.read_text().splitlines() == (shared / file.name).read_text().splitlines()[:100]


# --- oracle models ----------------------------------------------------------------------------------------------------


def write_hellaswag_task(folder: Path, docs: list[dict]) -> Path:
    """A HellaSwag-format multiple-choice task (ctx, endings, label) read from a local JSON Lines file."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "docs.jsonl").write_text("".join(json.dumps(doc) + "\n" for doc in docs))
    task = {"task": "oracle_mc", "dataset_path": "json", "output_type": "multiple_choice", "test_split": "test",
            "dataset_kwargs": {"data_files": {"test": str(folder / "docs.jsonl")}, "cache_dir": str(folder / "cache")},
            "doc_to_text": "{{ctx}}", "doc_to_choice": "{{endings}}", "doc_to_target": "label",
            "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}]}
    (folder / "oracle_mc.yaml").write_text(yaml.safe_dump(task))
    return folder


def test_oracle_scores_one_and_zero_on_a_multiple_choice_task(tmp_path, tokenizer, bos):
    endings = ["stone quiet", "copper quiet", "meadow quiet", "window quiet"]  # one token a word
    docs = [{"ctx": "the old harbour", "endings": endings[i:] + endings[:i], "label": (4 - i) % 4} for i in range(4)]
    tasks = write_hellaswag_task(tmp_path / "tasks", docs)
    stone, copper = (tokenizer.token_to_id("Ġ" + word) for word in ("stone", "copper"))
    right = GatelabLM.from_model(FavourTokens([stone]), tokenizer, bos, seq_len=32)
    wrong = GatelabLM.from_model(FavourTokens([copper]), tokenizer, bos, seq_len=32)
    assert lm_eval_accuracy(right, "oracle_mc", tasks)["acc,none"] == 1.0
    assert lm_eval_accuracy(wrong, "oracle_mc", tasks)["acc,none"] == 0.0


def test_generate_until_stops_at_until_eos_and_max_gen_toks(tokenizer, bos):
    the = tokenizer.encode("the", add_special_tokens=False).ids[-1]
    harbour, stone, quiet = (tokenizer.token_to_id("Ġ" + word) for word in ("harbour", "stone", "quiet"))
    eos = bos  # GPT-2-like: one <|endoftext|> for both
    table = {the: harbour, harbour: stone, stone: quiet, quiet: eos}
    lm = GatelabLM.from_model(NextToken(table), tokenizer, bos, seq_len=4, batch_size=2, eos_id=eos)
    outputs = lm.generate_until(requests("generate_until", [
        ("the", {"until": [" stone"], "max_gen_toks": 10}),  # cut before the stop string
        ("the", {"until": ["our st"], "max_gen_toks": 10}),  # a stop string across tokens
        ("the", {"until": [], "max_gen_toks": 2}),
        ("the", {"until": ["never"]}),  # ends at EOS; the window slides past seq_len
        ("the harbour", {"until": [" quiet"], "do_sample": False}),
    ]))
    assert outputs == [" harbour", " harb", " harbour stone", " harbour stone quiet", " stone"]


# --- checkpoints, run ids and errors --------------------------------------------------------------------------------


def test_unknown_run_id_names_the_id_and_the_store(tmp_path):
    from gatelab import tracking

    uri = sqlite_uri(tmp_path)
    tracking.prepare_store(uri)
    with pytest.raises(GatelabError, match="no MLflow run '0123456789abcdef0123456789abcdef'"):
        GatelabLM(run="0123456789abcdef0123456789abcdef", tracking_uri=uri)
    with pytest.raises(GatelabError, match=r"no MLflow store at .*nowhere.*mlflow\.db"):
        GatelabLM(run="0123456789abcdef0123456789abcdef", runs_dir=str(tmp_path / "nowhere"))
    assert not (tmp_path / "nowhere").exists()  # no empty store made at a mistyped path


def test_bad_paths_and_args_are_one_clear_error(tmp_path):
    with pytest.raises(GatelabError, match="missing/last.ckpt: no such checkpoint file or run folder"):
        GatelabLM(run="missing/last.ckpt")
    (tmp_path / "run-folder").mkdir()
    with pytest.raises(GatelabError, match="no checkpoints/last.ckpt in this folder"):
        GatelabLM(run=str(tmp_path / "run-folder"))
    (tmp_path / "broken.ckpt").write_text("not a checkpoint")
    with pytest.raises(GatelabError, match="broken.ckpt: not a readable checkpoint"):
        GatelabLM(run=str(tmp_path / "broken.ckpt"))
    with pytest.raises(GatelabError, match="batch_size: expected a positive integer"):
        GatelabLM.create_from_arg_string(f"run={tmp_path / 'broken.ckpt'},batch_size=auto")
    with pytest.raises(GatelabError, match=r"model arg\(s\) pretrained not known to the gatelab model"):
        GatelabLM.create_from_arg_string("run=x,pretrained=gpt2")


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A real micro `gatelab train` run: 10 steps, checkpoints every 4 (so the last one is not a multiple). Trained
    once a session: the tests only read it (one copies it before changing the copy)."""
    stored = made_once(tmp_path_factory, "trained", _train_once)
    return {key: value if key == "run_id" else Path(value) for key, value in stored.items()}


def _train_once(folder: Path) -> dict:
    experiment = write_micro_experiment(folder, max_steps=10, checkpoint_every=4)
    config = yaml.safe_load(experiment.read_text())
    config["eval"]["blimp"] = False  # the run's own BLiMP score is not what these tests check
    experiment.write_text(yaml.safe_dump(config))
    # In this process: the tests read the run and its checkpoints; how `gatelab train` starts is tested elsewhere.
    assert train_in_process(experiment, folder / "runs").status == "finished"
    from gatelab import tracking

    client = tracking.client(sqlite_uri(folder / "runs"))
    [run] = client.search_runs([client.get_experiment_by_name("micro").experiment_id])
    [checkpoint] = (folder / "runs").glob("micro/*/checkpoints/last.ckpt")
    return {"runs": str(folder / "runs"), "run_id": run.info.run_id, "checkpoint": str(checkpoint),
            "experiment": str(experiment)}


@pytest.mark.slow
def test_checkpoint_rebuilds_the_live_model(trained_run, tmp_path, monkeypatch):
    """A run id, its folder and its .ckpt load the same model, which scores as the model rebuilt by hand from the
    experiment and the checkpoint's weights; the run id is found from another working directory."""
    from gatelab.data.prepare import load_data
    from gatelab.data.resolve import load_experiment
    from gatelab.model import resolve_model

    experiment = load_experiment(trained_run["experiment"])
    described, state = load_checkpoint(trained_run["checkpoint"])
    assert described["model"] == resolve_model(experiment).model_dump(mode="json")
    live = build_model(resolve_model(experiment), seed=experiment.seed)
    live.load_state_dict(state)
    tokenizer, corpus, _ = load_data(experiment, log=lambda *_: None, warn=lambda *_: None)
    texts = requests("loglikelihood", [("", s) for s in SENTENCES] + [("The river", " ran past the mill.")])
    expected = GatelabLM.from_model(live, tokenizer, corpus.bos_id, experiment.data.seq_len).loglikelihood(texts)

    monkeypatch.chdir(tmp_path)  # ./runs does not exist here: the store's own location names the runs folder
    for run in (trained_run["run_id"], str(trained_run["checkpoint"]), str(trained_run["checkpoint"].parents[1])):
        lm = GatelabLM(run=run, tracking_uri=sqlite_uri(trained_run["runs"]), device="cpu")
        assert lm.loglikelihood(texts) == expected, run


@pytest.mark.slow
def test_checkpoint_without_description_falls_back_to_the_runs_logged_configs(trained_run, tmp_path):
    copy = tmp_path / "runs"
    shutil.copytree(trained_run["runs"], copy)
    [checkpoint] = copy.glob("micro/*/checkpoints/last.ckpt")
    old = torch.load(checkpoint, map_location="cpu", weights_only=True)
    del old["gatelab"]
    torch.save(old, checkpoint)
    with pytest.raises(GatelabError, match="load it by its MLflow run id"):
        GatelabLM(run=str(checkpoint))
    lm = GatelabLM(run=trained_run["run_id"], tracking_uri=sqlite_uri(copy), runs_dir=str(copy), device="cpu")
    assert lm.source == str(checkpoint.resolve())


@pytest.mark.slow
def test_last_checkpoint_holds_the_final_step(trained_run):
    assert torch.load(trained_run["checkpoint"], map_location="cpu", weights_only=True)["global_step"] == 10


@pytest.mark.slow
def test_lm_eval_command_line_runs_gatelab_blimp(trained_run, tmp_path):
    """`python -m gatelab.eval.harness` is lm-eval's CLI with the model registered and the tasks included."""
    result = subprocess.run(
        [sys.executable, "-m", "gatelab.eval.harness", "--model", "gatelab", "--model_args",
         f"run={trained_run['checkpoint']},device=cpu", "--tasks", "gatelab_blimp", "--batch_size", "32",
         "--metadata", json.dumps({"blimp_per_paradigm": 1}), "--output_path", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    [written] = (tmp_path / "out").rglob("results*.json")
    results = json.loads(written.read_text())
    assert results["n-samples"]["gatelab_blimp"]["effective"] == 67
    assert 0.0 <= results["results"]["gatelab_blimp"]["acc,none"] <= 1.0

    missing = subprocess.run([sys.executable, "-m", "gatelab.eval.harness", "--model", "gatelab", "--model_args",
                              "run=0123456789abcdef0123456789abcdef", "--tasks", "gatelab_blimp"],
                             capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert missing.returncode == 2 and "error: no MLflow store at runs/mlflow.db" in missing.stderr
    assert "Traceback" not in missing.stderr
