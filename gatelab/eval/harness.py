"""gatelab runs as lm-evaluation-harness models: `GatelabLM`, lm-eval model `gatelab`, and the package's offline tasks.

    python -m gatelab.eval.harness --model gatelab --model_args run=RUN_ID --tasks gatelab_blimp --batch_size 32

`run` is an MLflow run id, a checkpoint (`.ckpt`) or a run folder holding `checkpoints/last.ckpt`. Text is scored the
way gatelab trains and scores BLiMP (`benchmarks.score_blimp`): the run's own tokenizer, no special tokens from it, one
BOS before every context, at most the training length (`data.seq_len`) of tokens per forward, truncated from the left.

Differences from lm-eval's HFLM: the context always starts with BOS (HFLM adds one only when the tokenizer's
post-processor does); a continuation longer than the training length is scored over several windows, each with as much
context as fits (HFLM asserts); generation is greedy only, one window of the training length per step, no KV cache.

lm-eval 0.4 finds models only in its registry, which this module fills when it is imported; `python -m
gatelab.eval.harness ARGS` is lm-eval's own command line with that done and `local_task_dir()` on the include path.
"""

from __future__ import annotations

import json
import logging
import sys
from collections import defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from unittest import mock
from urllib.parse import unquote, urlparse

import datasets
import torch
import yaml
from lm_eval import evaluator
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from torch import nn
from tqdm import tqdm

from gatelab import tracking
from gatelab.config import ModelConfig
from gatelab.data.prepare import load_data
from gatelab.data.resolve import experiment_from_dict
from gatelab.devices import evaluation_device, rows_for_length
from gatelab.errors import GatelabError, install_redaction, redact
from gatelab.eval.benchmarks import PACKAGED_BLIMP, load_blimp
from gatelab.eval.checkpoint import load_checkpoint
from gatelab.eval.metrics import evaluation_mode, model_device
from gatelab.host import resolve_precision
from gatelab.model import build_model
from gatelab.store_uris import default_tracking_uri, sqlite_file

log = logging.getLogger(__name__)

TASK_DIR = Path(__file__).resolve().parent / "tasks"
CHECKPOINT = Path("checkpoints") / "last.ckpt"  # inside a run folder, as gatelab.train.run writes it
MODEL_ARGS = ("run", "tracking_uri", "runs_dir", "batch_size", "device", "max_gen_toks")
AUTOCAST_DTYPES = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


def local_task_dir() -> Path:
    """The folder of gatelab's lm-eval task YAMLs, for `--include_path` or `TaskManager(include_path=...)`.

    The YAMLs are static: their data comes through `!function gatelab.eval.harness.<loader>`, which lm-eval imports
    by module name, so no path in them depends on where gatelab is installed or on the working directory (a relative
    `dataset_kwargs.data_files` would be read from the working directory by `datasets.load_dataset`).
    """
    return TASK_DIR


def blimp_dataset(blimp_path: str | None = None, blimp_per_paradigm: int | None = None, blimp_seed: int = 0,
                  **_: Any):
    """Task `gatelab_blimp`'s data: BLiMP pairs as one `test` split, read by `benchmarks.load_blimp`, so lm-eval and
    `score_blimp` see the same pairs in the same order. lm-eval calls this with the task's metadata, which
    `--metadata '{"blimp_path": ..., "blimp_per_paradigm": ...}'` extends (the rest, such as `version`, is ignored).

    Each pair also carries its prompt (`context`, empty) and `choices` (bad, good) as fields, which the task names:
    lm-eval compiles a Jinja template afresh for every document, a third of its time on BLiMP.
    """
    pairs = load_blimp(blimp_path or PACKAGED_BLIMP, per_paradigm=blimp_per_paradigm, seed=blimp_seed)
    docs = [{**pair, "context": "", "choices": [pair["sentence_bad"], pair["sentence_good"]]} for pair in pairs]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(docs)})


# --------------------------------------------------------------------------------------- finding a run's checkpoint


def _tracking_uri(tracking_uri: str | None, runs_dir: Path) -> str:
    uri = tracking_uri or default_tracking_uri(runs_dir, create=False, as_written=True)
    database = sqlite_file(uri)
    # MLflow would create an empty store at a mistyped path and then report the run as missing from it.
    if database is not None and not database.is_file():
        raise GatelabError(f"no MLflow store at {database} (from tracking_uri {redact(uri)}): run from the folder that "
                           "holds runs/, or pass tracking_uri=sqlite:////absolute/path/mlflow.db and runs_dir=")
    return uri


def _runs_dirs(runs_dir: Path, uri: str, artifact_location: str) -> list[Path]:
    """Where a run's folder may be: `runs_dir`, then the folder of gatelab's local artifact store
    (`<runs_dir>/mlartifacts`, see tracking.RunStore.experiment_id) and of a SQLite store (`<runs_dir>/mlflow.db`),
    which both name the runs folder the run was trained with, whatever the working directory is now."""
    candidates = [runs_dir]
    if artifact_location.startswith("file:"):
        candidates.append(Path(unquote(urlparse(artifact_location).path)).parent)
    if (database := sqlite_file(uri)) is not None:
        candidates.append(database.parent)
    return list(dict.fromkeys(path.resolve() for path in candidates))


def checkpoint_of_run(run_id: str, tracking_uri: str | None = None, runs_dir: str | Path = "runs") -> Path:
    """The `last.ckpt` of a gatelab run given its MLflow run id; the run folder is
    `<runs_dir>/<experiment>/<variant>-s<seed>-<spec hash>`, named by the tags gatelab writes on every run."""
    uri = _tracking_uri(tracking_uri, Path(runs_dir))
    store = tracking.RunStore(uri, Path(runs_dir))
    tags, artifact_location = store.run_data(run_id).tags, store.artifact_location(run_id)
    needed = (tracking.SPEC_HASH_TAG, tracking.EXPERIMENT_TAG, tracking.VARIANT_TAG, tracking.SEED_TAG)
    if any(tag not in tags for tag in needed):
        raise GatelabError(f"MLflow run '{run_id}' is not a gatelab training run (it lacks the tags "
                           f"{', '.join(t for t in needed if t not in tags)}): give the id of a trained run")
    folder = Path(tags[tracking.EXPERIMENT_TAG]) / (
        f"{tags[tracking.VARIANT_TAG]}-s{tags[tracking.SEED_TAG]}-{tags[tracking.SPEC_HASH_TAG]}")
    looked = [base / folder / CHECKPOINT for base in _runs_dirs(Path(runs_dir), uri, artifact_location)]
    for path in looked:
        if path.is_file():
            status = tags.get(tracking.STATUS_TAG)
            if status != "finished":
                log.warning("MLflow run %s is %s, not finished: its checkpoint is where training stopped", run_id,
                            status)
            return path
    raise GatelabError(f"MLflow run '{run_id}' has no checkpoint: looked for {', '.join(map(str, looked))}; pass "
                       "runs_dir= the runs folder it was trained with, or run= the path of its last.ckpt")


def _configs_from_mlflow(run_id: str, uri: str) -> dict[str, Any]:
    """A checkpoint written before checkpoints described themselves: the run's configs as gatelab logged them."""
    store, texts = tracking.RunStore(uri), {}
    for key, artifact in (("experiment", "config/experiment.yaml"), ("model", "config/model_resolved.yaml")):
        text = store.artifact_text(run_id, artifact)
        if text is None:
            raise GatelabError(f"MLflow run '{run_id}': its checkpoint does not describe its model and its artifact "
                               f"{artifact} cannot be read from {redact(uri)}")
        texts[key] = yaml.safe_load(text)
    return texts


def _resolve_run(run: str, tracking_uri: str | None, runs_dir: str | Path):
    """(checkpoint path, its description, the model's state dict) for `run`: a .ckpt file, a run folder, or an MLflow
    run id."""
    path = Path(run).expanduser()
    if path.is_dir():
        if not (path / CHECKPOINT).is_file():
            raise GatelabError(f"{path}: no {CHECKPOINT} in this folder; give a gatelab run folder "
                               "(runs/<experiment>/<variant>-s<seed>-<hash>), a .ckpt file or an MLflow run id")
        path = path / CHECKPOINT
    if path.is_file():
        described, state = load_checkpoint(path)
        if described is None:
            raise GatelabError(f"{path}: written before gatelab checkpoints described their model; load it by its "
                               "MLflow run id instead (run=RUN_ID), which reads the run's logged configs")
        return path, described, state
    if path.suffix == ".ckpt" or len(path.parts) > 1:
        raise GatelabError(f"{run}: no such checkpoint file or run folder; give a .ckpt path, a run folder or an "
                           "MLflow run id")
    checkpoint = checkpoint_of_run(run, tracking_uri, runs_dir)
    described, state = load_checkpoint(checkpoint)
    if described is None:
        described = _configs_from_mlflow(run, _tracking_uri(tracking_uri, Path(runs_dir)))
    return checkpoint, described, state


def _autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The run's mixed precision on a GPU; fp32 (None: no autocast) on a CPU, where bf16 is emulated on most hosts
    and only costs digits."""
    if device.type != "cuda":
        return None
    return AUTOCAST_DTYPES.get(resolve_precision(precision, "cuda"))


def _parse_model_args(arg_string: str) -> dict[str, str]:
    """`key=value,key=value` with every value kept a string: lm-eval's own parser turns a run id such as '1234e5...'
    into a float."""
    args = {}
    for item in filter(None, (part.strip() for part in arg_string.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise GatelabError(f"--model_args: '{item}' is not key=value (keys: {', '.join(MODEL_ARGS)})")
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        args[key.strip()] = value
    return args


def _positive_int(name: str, value: int | str) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if number < 1:
        raise GatelabError(f"model arg {name}: expected a positive integer, got {value!r}"
                           + (" ('auto' is HFLM's; gatelab takes a number)" if str(value).startswith("auto") else ""))
    return number


# ------------------------------------------------------------------------------------------------- the lm-eval model


def _register(cls):
    # `python -m gatelab.eval.harness` runs this file as __main__ and then imports it as gatelab.eval.harness (main()
    # and the tasks' `!function` do): only that copy registers, as lm-eval's registry refuses a second class for a name.
    return cls if __name__ == "__main__" else register_model("gatelab")(cls)


@_register
class GatelabLM(LM):
    """A gatelab model behind lm-eval's `LM` interface: loglikelihood, loglikelihood_rolling and greedy generate_until.

    Model args (lm-eval's `--model_args`): `run` (MLflow run id, .ckpt file or run folder), `tracking_uri` (default:
    the SQLite store in `runs_dir`), `runs_dir` (default `runs`), `batch_size` (16), `device` (default: where the run
    trained, by `gatelab.devices.evaluation_device`: a GPU where there is one, unless the run's train.accelerator is
    cpu), `max_gen_toks` (64, when a task sets none).
    """

    def __init__(self, run: str, tracking_uri: str | None = None, runs_dir: str = "runs", batch_size: int | str = 16,
                 device: str | None = None, max_gen_toks: int | str = 64, max_batch_size: Any = None, **unknown: Any):
        super().__init__()
        if unknown:
            raise GatelabError(f"model arg(s) {', '.join(sorted(unknown))} not known to the gatelab model; its args "
                               f"are {', '.join(MODEL_ARGS)}")
        batch_size, max_gen_toks = _positive_int("batch_size", batch_size), _positive_int("max_gen_toks", max_gen_toks)
        checkpoint, described, state = _resolve_run(str(run), tracking_uri, runs_dir)
        experiment = experiment_from_dict(described["experiment"], f"{checkpoint} (its experiment)")
        model_config = ModelConfig.model_validate(described["model"])
        if experiment.data.task != "text":
            raise GatelabError(f"{checkpoint}: the run trains on the synthetic task '{experiment.data.task}', which "
                               "has no text tokenizer: lm-eval's tasks are text")
        model = build_model(model_config, seed=experiment.seed)
        try:
            model.load_state_dict(state)
        except RuntimeError as error:  # a config logged by another gatelab version than the weights' model
            raise GatelabError(f"{checkpoint}: its weights do not fit the model its config builds "
                               f"({str(error).splitlines()[0]})") from None
        tokenizer, corpus, _ = load_data(experiment, log=lambda *_: None, warn=lambda *_: None)
        device = evaluation_device(device, experiment.train.accelerator)
        self._setup(model.to(device), tokenizer, corpus.bos_id, corpus.eos_id, experiment.data.seq_len, batch_size,
                    device, experiment.train.precision, max_gen_toks)
        self.source = str(checkpoint)

    @classmethod
    def from_model(cls, model: nn.Module, tokenizer, bos_id: int, seq_len: int, batch_size: int = 16,
                   device: str | torch.device | None = None, precision: str = "32-true", eos_id: int | None = None,
                   max_gen_toks: int = 64) -> GatelabLM:
        """A live model (`logits_BTV = model(ids_BT)`, e.g. `GatedLM.model` at the end of training) with its
        `tokenizers.Tokenizer`, BOS id and training length; moved to `device` when one is given. `eos_id` ends a
        generation (default: none, only `until` and `max_gen_toks` do)."""
        self = cls.__new__(cls)
        LM.__init__(self)
        device = torch.device(device) if device is not None else model_device(model)
        self._setup(model.to(device), tokenizer, bos_id, eos_id, seq_len, batch_size, device, precision, max_gen_toks)
        self.source = type(model).__name__
        return self

    def _setup(self, model: nn.Module, tokenizer, bos_id: int, eos_id: int | None, seq_len: int, batch_size: int,
               device: torch.device, precision: str, max_gen_toks: int) -> None:
        self.model, self.tokenizer, self.bos_id, self.eos_id = model, tokenizer, bos_id, eos_id
        self.max_length, self.batch_size, self._max_gen_toks = seq_len, batch_size, max_gen_toks
        self._device = device
        self.autocast_dtype = _autocast_dtype(precision, device)

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> GatelabLM:
        return cls.create_from_arg_obj(_parse_model_args(arg_string), additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict[str, Any], additional_config: dict | None = None) -> GatelabLM:
        # The command line's --batch_size (1 unless given) and --device come in additional_config; the same key in
        # --model_args wins (lm-eval's own merge passes both and fails on the duplicate).
        extra = {key: value for key, value in (additional_config or {}).items()
                 if value is not None and key not in arg_dict}
        return cls(**arg_dict, **extra)

    @property
    def max_gen_toks(self) -> int:
        return self._max_gen_toks

    def get_model_info(self) -> dict[str, Any]:
        return {"model_source": self.source, "max_length": self.max_length,
                "model_num_parameters": sum(p.numel() for p in self.model.parameters())}

    # --- tokens -----------------------------------------------------------------------------------------------------

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """(BOS + context ids, continuation ids), as HFLM splits them: trailing spaces of the context go to the
        continuation, and context + continuation is encoded whole and split after the context's own tokens, so the
        continuation's ids are those the model would see in running text."""
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces:
            context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
        if not context:
            return [self.bos_id], self._encode(continuation)
        context_ids = self._encode(context)
        return [self.bos_id] + context_ids, self._encode(context + continuation)[len(context_ids):]

    def _logits(self, input_ids_BT: torch.Tensor) -> torch.Tensor:
        """Logits (B, T, V) in the model's (or autocast's) dtype; callers upcast the positions they read."""
        with evaluation_mode(self.model), torch.autocast(self._device.type, dtype=self.autocast_dtype,
                                                         enabled=self.autocast_dtype is not None):
            return self.model(input_ids_BT.to(self._device))

    # --- loglikelihood ----------------------------------------------------------------------------------------------

    def _windows(self, context_ids: list[int], continuation_ids: list[int]) -> list[tuple[list[int], list[int]]]:
        """(input ids, scored target ids) windows of at most `max_length` inputs that score every continuation token
        once, each given as much context as fits: one window, `(context + continuation)[-(L+1):][:-1]` as HFLM's, when
        the continuation fits in L; otherwise L targets a window, from the first."""
        tokens, first, L = context_ids + continuation_ids, len(context_ids), self.max_length
        windows = []
        for start in range(first, len(tokens), L):
            end = min(start + L, len(tokens))
            windows.append((tokens[max(0, end - 1 - L): end - 1], tokens[start:end]))
        return windows

    def _score(self, requests: Sequence[tuple[list[int], list[int]]], disable_tqdm: bool = True,
               ) -> list[tuple[float, bool]]:
        """(sum of log-probabilities of the continuation ids, whether greedy decoding gives them) per request.

        Windows are sorted longest first and right-padded with id 0 (a causal model's real positions never see the
        padding); log-probabilities are taken in fp32 and summed in fp64, as `benchmarks.sentence_logprobs` does, so
        the two agree to rounding.
        """
        windows = [(index, *window) for index, (context_ids, continuation_ids) in enumerate(requests)
                   for window in self._windows(context_ids, continuation_ids)]
        windows.sort(key=lambda window: -len(window[1]))
        logprob = [0.0] * len(requests)
        greedy = [True] * len(requests)
        for batch in tqdm(self._batches(windows), disable=disable_tqdm, desc="gatelab loglikelihood"):
            input_ids_BT = torch.zeros(len(batch), len(batch[0][1]), dtype=torch.long)
            rows, positions, targets = [], [], []  # S = the batch's scored positions
            for row, (_, input_ids, scored) in enumerate(batch):
                input_ids_BT[row, : len(input_ids)] = torch.tensor(input_ids)
                rows += [row] * len(scored)
                positions += range(len(input_ids) - len(scored), len(input_ids))
                targets += scored
            logits_BTV = self._logits(input_ids_BT)
            rows_S, positions_S, targets_S = (torch.tensor(x, device=logits_BTV.device)
                                              for x in (rows, positions, targets))
            # Only the scored positions are upcast: (S, V) rather than (B, T, V) in fp32.
            logprobs_SV = logits_BTV[rows_S, positions_S].float().log_softmax(dim=-1)
            token_logprob_S = logprobs_SV.gather(1, targets_S[:, None]).squeeze(1).double()
            miss_S = (logprobs_SV.argmax(dim=-1) != targets_S).double()
            sums_B = torch.zeros(len(batch), dtype=torch.float64, device=rows_S.device).index_add_(0, rows_S,
                                                                                                   token_logprob_S)
            misses_B = torch.zeros_like(sums_B).index_add_(0, rows_S, miss_S)
            for (index, _, _), total, misses in zip(batch, sums_B.tolist(), misses_B.tolist()):
                logprob[index] += total
                greedy[index] &= misses == 0
        return list(zip(logprob, greedy))

    def _batches(self, windows: list) -> Iterator[list]:
        """Windows (longest first) in batches of `batch_size` rows; on a GPU, of as many tokens as `batch_size` rows
        of the training length (`rows_for_length`, by each batch's longest window)."""
        start = 0
        while start < len(windows):
            rows = rows_for_length(self.batch_size, self.max_length, len(windows[start][1]), self._device)
            yield windows[start: start + rows]
            start += rows

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        pairs = [request.args for request in requests]
        results = self._score([self._encode_pair(context, continuation) for context, continuation in pairs],
                              disable_tqdm)
        for pair, result in zip(pairs, results):
            self.cache_hook.add_partial("loglikelihood", pair, result)
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Each document's total log-probability after BOS, in HFLM's disjoint rolling windows of the training length:
        every token scored once, each window but the first with a full context."""
        spans, windows = [], []
        for request in requests:
            document_windows = [make_disjoint_window(window) for window in get_rolling_token_windows(
                token_list=self._encode(request.args[0]), prefix_token=self.bos_id, max_seq_len=self.max_length,
                context_len=1)]
            spans.append((len(windows), len(windows) + len(document_windows)))
            windows += document_windows
        scores = self._score(windows, disable_tqdm)
        totals = [sum(logprob for logprob, _ in scores[start:end]) for start, end in spans]
        for request, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    # --- generation -------------------------------------------------------------------------------------------------

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy continuations, each cut before the first of its `until` strings, ended by EOS or `max_gen_toks`.

        Requests whose prompts have the same number of tokens and the same settings run as one batch (no padding, so
        nothing the model was not trained on); each step reads the last `max_length` tokens.
        """
        results: list[str | None] = [None] * len(requests)
        groups: dict[tuple[int, str], list[int]] = defaultdict(list)
        prompts, settings = [], []
        warned = False
        for index, request in enumerate(requests):
            context, gen_kwargs = request.args
            kwargs = normalize_gen_kwargs(gen_kwargs, self.max_gen_toks)
            if kwargs.get("do_sample") and not warned:
                log.warning("gatelab model: generation is greedy; do_sample/temperature are ignored")
                warned = True
            until = handle_stop_sequences(kwargs.get("until"), eos=None)
            prompts.append([self.bos_id] + self._encode(context))
            settings.append((until, kwargs["max_gen_toks"]))
            groups[(len(prompts[-1]), json.dumps(settings[-1]))].append(index)
        progress = tqdm(total=len(requests), disable=disable_tqdm, desc="gatelab generate_until")
        for indices in groups.values():
            until, max_new = settings[indices[0]]
            for start in range(0, len(indices), self.batch_size):
                batch = indices[start: start + self.batch_size]
                texts = self._greedy([prompts[i] for i in batch], until, max_new)
                for index, text in zip(batch, texts):
                    results[index] = text
                    self.cache_hook.add_partial("generate_until", requests[index].args, text)
                progress.update(len(batch))
        progress.close()
        return results

    def _greedy(self, prompts_B: list[list[int]], until: list[str], max_new: int) -> list[str]:
        """Greedy continuations of equally long prompts, as text cut before the first stop string."""
        tokens_BT = torch.tensor(prompts_B, dtype=torch.long)
        new_ids: list[list[int]] = [[] for _ in prompts_B]
        done = [max_new < 1] * len(prompts_B)
        while not all(done):
            next_B = self._logits(tokens_BT[:, -self.max_length:])[:, -1].float().argmax(dim=-1).cpu()
            tokens_BT = torch.cat((tokens_BT, next_B[:, None]), dim=1)
            for row, token in enumerate(next_B.tolist()):
                if done[row]:
                    continue
                if token == self.eos_id:
                    done[row] = True
                    continue
                new_ids[row].append(token)
                text = self.tokenizer.decode(new_ids[row], skip_special_tokens=True)
                done[row] = len(new_ids[row]) >= max_new or any(stop and stop in text for stop in until)
        return [postprocess_generated_text(self.tokenizer.decode(ids, skip_special_tokens=True), until, None)
                for ids in new_ids]


# ------------------------------------------------------------------------------------------------ lm-eval's own CLI


def quiet_git():
    """A context in which lm-eval's results name gatelab's commit as their git_hash. lm-eval runs `git describe` in the
    working folder with git's stderr on ours: outside a clone it printed "fatal: not a git repository"; gatelab reads
    its commit with git's output kept (`tracking.code_version`)."""
    return mock.patch.object(evaluator, "get_git_commit_hash", lambda: tracking.code_version()["gatelab.git_commit"])


def main(argv: Sequence[str] | None = None) -> None:
    """lm-eval's command line (`lm_eval ...`, same arguments) with model `gatelab` registered and gatelab's tasks on
    the include path unless `--include_path` is given (lm-eval takes one; gatelab's tasks can then be named by file,
    `--tasks <local_task_dir()>/gatelab_blimp.yaml`)."""
    from lm_eval.__main__ import cli_evaluate

    import gatelab.eval.harness  # noqa: F401  registers `gatelab` when this file runs as __main__

    install_redaction()

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) > 1 and not any(arg == "--include_path" or arg.startswith("--include_path=") for arg in args):
        args += ["--include_path", str(local_task_dir())]
    sys.argv = [sys.argv[0] if sys.argv else "lm_eval", *args]  # lm-eval's parser reads sys.argv itself
    try:
        with quiet_git():
            cli_evaluate()
    except GatelabError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
