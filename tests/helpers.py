"""What several test modules share: the repository's paths, micro model and experiment configs, and the ways the tests
run gatelab (as a subprocess, as users do) and find the local PostgreSQL server."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from gatelab.config import ModelConfig, MoEConfig

REPO = Path(__file__).resolve().parents[1]
BLIMP = REPO.parent / "shared" / "benchmarks" / "blimp" / "data"
SHIPPED_SWEEPS = sorted((REPO / "sweeps").glob("*.yaml"))


# --- micro models, in memory ----------------------------------------------------------------------------------------

def micro_config(ffn: str = "dense", **changes) -> ModelConfig:
    fields = dict(vocab_size=61, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, head_dim=8, ffn_hidden=48)
    if ffn == "moe":
        fields.update(ffn="moe", ffn_hidden=None, moe=MoEConfig(n_experts=4, top_k=2, expert_hidden=16))
    fields.update(changes)
    return ModelConfig(**fields)


class Capture:
    """A probe that keeps every tensor it is given, keyed by (layer, name)."""

    def __init__(self) -> None:
        self.tensors: dict[tuple[int, str], torch.Tensor] = {}

    def add(self, layer: int, name: str, tensor: torch.Tensor) -> None:
        self.tensors[(layer, name)] = tensor.detach().clone()


# --- a micro experiment that trains on real corpora in seconds ------------------------------------------------------

MICRO = {
    "name": "micro",
    "variant": "g1_elem_sig",
    "seed": 3,
    "model": {"vocab_size": 512, "n_layers": 2, "d_model": 32, "n_heads": 2, "n_kv_heads": 1, "head_dim": 16,
              "ffn_hidden": 64},
    "data": {"domains": ["scripture", "speeches"], "seq_len": 32},
    "train": {"max_steps": 16, "batch_size": 4, "warmup_steps": 2, "checkpoint_every": 4, "log_every": 1,
              "precision": "32-true", "lr": 3e-3, "threads": 1},
    "eval": {"every_n_steps": 8, "batch_size": 4, "max_windows_per_domain": 4, "long_context_multipliers": [1, 2],
             "in_context_examples": 4, "probe_batches": 1, "blimp_per_paradigm": 1,
             "blimp_path": str(BLIMP) if BLIMP.is_dir() else None},
}
MICRO_SWEEP_VARIANTS = ["baseline", "g1_elem_sig", "g1_head_sig"]


def write_micro_experiment(tmp_path: Path, data: dict | None = None, **train) -> Path:
    config = {**MICRO, "data": data or MICRO["data"], "train": {**MICRO["train"], **train}}
    path = tmp_path / "micro.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def write_micro_sweep(folder: Path, name: str, max_steps: int = 150, **extra) -> Path:
    """A sweep of MICRO_SWEEP_VARIANTS, seed 0, over the MICRO preset (no validation, no BLiMP)."""
    preset = {**MICRO, "train": {**MICRO["train"], "max_steps": max_steps, "checkpoint_every": 50, "log_every": 10},
              "eval": {**MICRO["eval"], "every_n_steps": None, "blimp": False}}
    (folder / "micro.yaml").write_text(yaml.safe_dump(preset))
    sweep = {"name": name, "experiment": "micro.yaml", "grid": {"variant": MICRO_SWEEP_VARIANTS, "seed": [0]}, **extra}
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep))
    return path


def sqlite_uri(runs: Path) -> str:
    return f"sqlite:///{(runs / 'mlflow.db').resolve()}"


def open_tracked_run(runs: Path, resuming: bool = False):
    """The micro experiment's TrackedRun in `runs`'s SQLite store, opened (resumed where `resuming`)."""
    from gatelab import tracked_run, tracking

    runs.mkdir(exist_ok=True)
    tracked = tracked_run.TrackedRun(sqlite_uri(runs), runs, "micro", "hash-1")
    tracked.open(resuming, {tracking.VARIANT_TAG: "baseline"}, run_name="baseline-s0")
    return tracked


def ledger_specs(n: int) -> list:
    """n stand-ins for a sweep's RunSpecs, as the ledger reads them: hash, index and label."""
    return [SimpleNamespace(hash=f"h{i}", index=i, label=lambda i=i: f"cell {i}") for i in range(n)]


# --- a tokenizer.json of another family (GPT-2-like), made here ----------------------------------------------------

def write_foreign_tokenizer(path: Path, vocab_size: int = 300) -> Path:
    """A GPT-2-like tokenizer.json: byte-level BPE whose only special token is <|endoftext|>."""
    import random

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = random.Random(3)
    words = "river stone lantern quiet harbour orchard signal meadow copper window".split()
    texts = [" ".join(rng.choice(words) for _ in range(200)) for _ in range(20)]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer=trainer)
    path.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path))
    return path


# --- gatelab as a user runs it: a subprocess ------------------------------------------------------------------------

# `python -c REPORTS_LIGHTNING ARGS...` runs `gatelab ARGS...` and prints at exit whether Lightning was imported: it
# costs about 5 s of CPU, so an argument the command refuses should be answered without it.
REPORTS_LIGHTNING = ("import atexit, sys; atexit.register(lambda: print('lightning imported:', 'lightning' in "
                     "sys.modules)); sys.argv = ['gatelab', *sys.argv[1:]]; from gatelab.cli import main; main()")


def gatelab_cli(*args: str, cwd: Path, wait: bool = True):
    command = [sys.executable, "-m", "gatelab", *args]
    if not wait:
        return subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600)


def train_cli(experiment: Path, runs: Path, *extra: str, wait: bool = True):
    """`gatelab train EXPERIMENT --quiet --runs-dir RUNS ...`, run from the folder above RUNS."""
    return gatelab_cli("train", str(experiment), "--quiet", "--runs-dir", str(runs), *extra, cwd=runs.parent,
                       wait=wait)


def train_in_process(experiment: Path, runs: Path, *overrides: str):
    """What `gatelab train EXPERIMENT --quiet --runs-dir RUNS --set OVERRIDE ...` does, in this process: for runs a test
    only reads (a `gatelab` process spends seconds importing). Returns the run's RunResult."""
    from gatelab.data.resolve import load_experiment
    from gatelab.train.run import run

    return run(load_experiment(experiment, list(overrides)), runs_dir=runs, quiet=True)


def made_once(tmp_path_factory, name: str, make: Callable[[Path], dict]) -> dict:
    """`make(folder)` run once for the whole test session, even when pytest-xdist spreads a module's tests over
    several workers (each of which would otherwise make its own copy of a module fixture): the first worker makes
    it under a lock in the folder the workers share, the others read what it returned. `make` returns plain JSON
    (paths as strings). Without xdist it is simply made."""
    import json
    import shutil

    from filelock import FileLock

    if "PYTEST_XDIST_WORKER" not in os.environ:
        return make(tmp_path_factory.mktemp(name))
    shared = tmp_path_factory.getbasetemp().parent  # the session's folder, above each worker's own
    done = shared / f"{name}.json"
    with FileLock(str(shared / f"{name}.lock")):
        if not done.exists():
            folder = shared / name
            shutil.rmtree(folder, ignore_errors=True)  # what a worker whose `make` failed left
            folder.mkdir()
            done.write_text(json.dumps(make(folder)))
    return json.loads(done.read_text())


# --- sweep files in a scratch folder --------------------------------------------------------------------------------

DENSE = {
    "name": "micro", "variant": "baseline", "seed": 0,
    "model": {"vocab_size": 64, "n_layers": 2, "d_model": 32, "n_heads": 4, "n_kv_heads": 2, "head_dim": 8,
              "ffn": "dense", "ffn_hidden": 48},
    "train": {"max_steps": 10, "batch_size": 2, "lr": 1.0e-3},
    "data": {"seq_len": 16},
}
MOE = {**DENSE, "name": "micro-moe",
       "model": {**DENSE["model"], "ffn": "moe", "ffn_hidden": None,
                 "moe": {"n_experts": 4, "top_k": 2, "expert_hidden": 16}}}


def write_sweep(tmp_path: Path, body: dict, preset: dict = DENSE, name: str = "s.yaml") -> Path:
    (tmp_path / "presets").mkdir(exist_ok=True)
    (tmp_path / "presets" / "micro.yaml").write_text(yaml.safe_dump(preset))
    (tmp_path / "sweeps").mkdir(exist_ok=True)
    path = tmp_path / "sweeps" / name
    path.write_text(yaml.safe_dump({"name": "t", "experiment": "../presets/micro.yaml", **body}, sort_keys=False))
    return path


# --- the local PostgreSQL server of the multi-worker tests (127.0.0.1:5432, trust auth, database `test`) ------------

POSTGRES_URL = os.environ.get("GATELAB_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")


def postgres_reason() -> str | None:
    """None when the server answers, else why the PostgreSQL tests are skipped."""
    try:
        import psycopg

        psycopg.connect(POSTGRES_URL, connect_timeout=3).close()
    except Exception as error:  # no driver, no server, refused: all mean "skip, and say why"
        return f"no PostgreSQL at {POSTGRES_URL} ({type(error).__name__}: {str(error).strip()[:120]})"
    return None


@contextlib.contextmanager
def postgres_database(prefix: str) -> Iterator[str]:
    """The URL of an empty PostgreSQL database of its own on the test server, dropped afterwards (skips the test where
    no server answers)."""
    reason = postgres_reason()
    if reason:
        pytest.skip(reason)
    import psycopg

    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(POSTGRES_URL, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    try:
        yield POSTGRES_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# --- a files source made by the tests -------------------------------------------------------------------------------

_PROSE = ("the river ran past the old mill and the miller sang of wheat and rain while the long road wound home "
          "through fields of barley where children counted crows and a letter waited on the table by the "
          "window").split()


def write_files_corpus(folder: Path, n_docs: int = 60) -> dict:
    """A parquet corpus of two genres (columns id, text, genre), written here; returns `data` settings for MICRO that
    train on it (`data.source: files`, domains by genre, its own data directory). Some documents are long enough for
    long-context windows at 2 x seq_len 32."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = []
    for i in range(n_docs):
        words = [_PROSE[(i * 11 + j * 7 + j * j) % len(_PROSE)] for j in range(80 + 37 * (i % 9))]
        records.append({"id": f"doc-{i:03d}", "text": f"Entry {i}. " + " ".join(words) + ".",
                        "genre": ("letters", "poems")[i % 2]})
    folder.mkdir(parents=True, exist_ok=True)
    half = n_docs // 2
    pq.write_table(pa.Table.from_pylist(records[:half]), folder / "part-0.parquet")
    pq.write_table(pa.Table.from_pylist(records[half:]), folder / "part-1.parquet")
    return {"source": "files", "seq_len": 32, "data_dir": str(folder.parent / "files-data"),
            "files": {"paths": [str(folder / "*.parquet")], "id_field": "id", "domain_field": "genre"}}


# --- a real `mlflow server` -----------------------------------------------------------------------------------------

class MlflowServer:
    """`mlflow server` on a free port over one SQLite backend store in `folder`; it can be killed and started again
    on the same port and store."""

    def __init__(self, folder: Path) -> None:
        from gatelab.report.ui import find_free_port

        self.port = find_free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(self.port),
                        "--workers", "1", "--backend-store-uri", f"sqlite:///{folder / 'server.db'}",
                        "--artifacts-destination", str(folder / "art")]
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        import time
        import urllib.request

        import pytest

        # as `gatelab ui` runs it: without MLflow 3's GenAI job runner (eight huey processes, 2 s more to start)
        environment = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        self.process = subprocess.Popen(self.command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        env=environment, start_new_session=True)
        deadline = time.time() + 90
        while time.time() < deadline:
            try:
                if urllib.request.urlopen(f"{self.url}/health", timeout=2).status == 200:
                    return
            except OSError:
                time.sleep(0.5)
        self.stop(signal.SIGKILL)
        pytest.fail("mlflow server did not answer /health within 90 s")

    def stop(self, signum: int = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signum)
        self.process.wait(timeout=30)

    def kill(self) -> None:
        self.stop(signal.SIGKILL)


def in_a_terminal(args: list[str], columns: int = 120, cwd: Path = REPO, timeout: float = 300) -> tuple[int, str]:
    """`args` run with stdout and stderr on a pseudo-terminal `columns` wide, as a user's terminal shows them: the exit
    code and what was shown (CR LF as LF, colour codes left out). gatelab fits a terminal only where stdout is one,
    never by COLUMNS alone."""
    import fcntl
    import pty
    import select
    import struct
    import termios
    import time

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower, cwd=cwd, env=env,
                               close_fds=True)
    os.close(follower)
    shown, deadline = bytearray(), time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([leader], [], [], 0.5)[0]:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the follower's last holder has exited
                break
            if not chunk:
                break
            shown += chunk
        elif process.poll() is not None:
            break
    else:
        process.kill()
    os.close(leader)
    import re

    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07", "", shown.decode(errors="replace"))  # colours, links
    return process.wait(timeout=30), text.replace("\r\n", "\n")


# --- shared assertions and stand-ins ----------------------------------------------------------------------------------

def assert_head_loss_matches_whole_logits(model) -> None:
    """`head_loss` against `next_token_loss` of the whole logits on one micro batch (vocabulary 512): the loss to
    1e-6 and fp32, every parameter's gradient to 1e-4."""
    import pytest

    from gatelab.train.head_loss import head_loss, next_token_loss

    input_ids_BT, targets_BT = (torch.randint(0, 512, (4, 32), generator=torch.Generator().manual_seed(seed))
                                for seed in (1, 2))
    hidden_BTD, _ = model.hidden_states(input_ids_BT)
    whole = next_token_loss(model.lm_head(hidden_BTD), targets_BT)
    chunked = head_loss(hidden_BTD, model.lm_head.weight, targets_BT)
    whole_grads = torch.autograd.grad(whole, list(model.parameters()), retain_graph=True)
    chunked_grads = torch.autograd.grad(chunked, list(model.parameters()))
    assert chunked.dtype == torch.float32 and chunked.item() == pytest.approx(whole.item(), rel=1e-6)
    for whole_grad, chunked_grad in zip(whole_grads, chunked_grads):
        torch.testing.assert_close(chunked_grad, whole_grad, rtol=1e-4, atol=1e-7)


def see_gpus(monkeypatch, visible: str | None, count: int) -> None:
    """What this process sees of GPUs: CUDA_VISIBLE_DEVICES as given (None: unset) and torch's device count."""
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
