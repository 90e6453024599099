"""A run that cannot fit is refused before anything is allocated, prepared or opened."""

from __future__ import annotations

import resource

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from gatelab.data.resolve import load_experiment
from gatelab.errors import GatelabError
from gatelab.model import resolve_model
from gatelab.train import memory
from tests.helpers import REPO, sqlite_uri, train_cli, write_micro_experiment

GB = 10**9


@pytest.mark.parametrize("override, key", [("model.vocab_size=100000000", "model.vocab_size"),
                                           ("data.seq_len=1000000000", "data.seq_len")])
def test_a_run_too_large_for_the_machine_is_refused_with_its_bound(tmp_path, monkeypatch, override, key):
    monkeypatch.setattr(memory, "available_bytes", lambda experiment: (24 * GB, "this machine's 24.0 GB"))
    experiment = load_experiment(write_micro_experiment(tmp_path), [override])
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(GatelabError, match=rf"needs at least [\d,.]+ GB.*more than this machine's 24.0 GB.*{key}"):
        memory.check_fits(experiment, resolve_model(experiment))
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 200_000  # kB: nothing was allocated


def test_the_bound_counts_weights_optimizer_and_logits():
    experiment = load_experiment(REPO / "experiments" / "tiny.yaml")
    bound = memory.memory_bound(experiment, resolve_model(experiment))
    assert bound.weights_and_optimizer == 16 * bound.parameters
    batch, seq, vocab = experiment.train.batch_size, experiment.data.seq_len, experiment.model.vocab_size
    assert bound.training_activations >= 8 * batch * seq * vocab
    assert bound.total < 4 * GB  # the quick start fits a laptop


@pytest.mark.parametrize("preset", sorted((REPO / "experiments").glob("tiny*.yaml")), ids=lambda p: p.stem)
def test_the_cpu_presets_are_not_refused_here(preset):
    experiment = load_experiment(preset)
    memory.check_fits(experiment, resolve_model(experiment))


@pytest.mark.slow
def test_a_refused_run_leaves_no_run_folder_and_no_mlflow_run(tmp_path):
    runs = tmp_path / "runs"
    result = train_cli(write_micro_experiment(tmp_path), runs, "--set", "model.vocab_size=100000000")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "model.vocab_size" in result.stderr and "Traceback" not in result.stdout + result.stderr
    assert not runs.exists() or not (runs / "mlflow.db").exists() or _no_runs(sqlite_uri(runs))
    assert not (runs / "micro").exists()


def _no_runs(uri: str) -> bool:
    import mlflow

    client = mlflow.MlflowClient(uri)
    return not client.search_runs([e.experiment_id for e in client.search_experiments()])


def _small(variant: str, *overrides: str):
    experiment = load_experiment(REPO / "experiments" / "small.yaml", [f"variant={variant}", *overrides])
    return experiment, resolve_model(experiment)


@pytest.mark.parametrize("variant", ["sigmoid_attn", "softpick"])
def test_the_explicit_kinds_training_counts_their_q_k_v_and_one_query_block(monkeypatch, variant):
    """Issue 41: sigmoid's explicit path kept (B, H, T, T) per layer, 58 GB in the small preset, and the bound counted
    none of it. In query blocks under checkpointing it keeps q, k, v per layer and one block at a time: it fits."""
    from gatelab.model.attention_kinds import query_block_rows

    experiment, model = _small(variant)
    _, baseline = _small("baseline")
    batch, seq, H = experiment.train.batch_size, experiment.data.seq_len, model.n_heads
    qkv = model.n_layers * 2 * batch * seq * (H + 2 * model.n_kv_heads) * model.head_dim
    block = memory.EXPLICIT_TENSORS_TRAINING[model.attention] * 4 * batch * H * query_block_rows(batch, H, seq) * seq
    assert (memory.memory_bound(experiment, model).training_activations
            - memory.memory_bound(experiment, baseline).training_activations) == qkv + block
    monkeypatch.setattr(memory, "available_bytes", lambda experiment: (80 * GB, "the GPU's 80.0 GB"))
    memory.check_fits(experiment, model)


def test_the_probes_whole_weights_are_counted_and_their_setting_named(tmp_path, monkeypatch):
    """The probes write every kind's (B, H, T, T) out on eval.batch_size x domains / eval.probe_batches sequences:
    the bound counted one sequence's."""
    monkeypatch.setattr(memory, "available_bytes", lambda experiment: (24 * GB, "this machine's 24.0 GB"))
    experiment = load_experiment(write_micro_experiment(tmp_path), [
        "data.seq_len=4096", "eval.batch_size=64", "eval.max_windows_per_domain=64", "eval.probe_batches=1",
        "eval.long_context_multipliers=[1]"])
    with pytest.raises(GatelabError, match=r"evaluation, the probes .*more than this machine's 24.0 GB: lower "
                                           r"eval.batch_size \(or raise eval.probe_batches\)"):
        memory.check_fits(experiment, resolve_model(experiment))
    memory.check_fits(load_experiment(write_micro_experiment(tmp_path), [
        "data.seq_len=4096", "eval.batch_size=64", "eval.max_windows_per_domain=64", "eval.probe_batches=64",
        "eval.long_context_multipliers=[1]"]), resolve_model(experiment))


@pytest.mark.parametrize("kind", ["softmax", "off_by_one", "learnable_sink", "sigmoid", "softpick"])
def test_the_counted_attention_tensors_are_no_more_than_the_explicit_path_keeps(kind):
    """EXPLICIT_TENSORS_*, measured: the most bytes of storage alive at once while the explicit path runs, in units
    of one block's (or the whole) fp32 (B, H, Q, T), at a shape where q, k and v are small beside it."""
    from gatelab.model.attention_kinds import explicit_attention, explicit_output

    B, H, K, T, D, rows = 1, 2, 1, 1024, 4, 64
    q, k, v = (torch.randn(B, n, T, D, requires_grad=True) for n in (H, K, K))
    sink = torch.zeros(H) if kind == "learnable_sink" else None
    block, whole = 4 * B * H * rows * T, 4 * B * H * T * T

    def train():
        explicit_output(q, k, v, kind, sink, block_bytes=block).sum().backward()

    with torch.no_grad(), LiveBytes() as blocks:
        explicit_output(q, k, v, kind, sink, block_bytes=block)
    with torch.no_grad(), LiveBytes() as probes:
        explicit_attention(q, k, v, kind, sink)
    with LiveBytes() as training:
        train()
    no_grad = memory.EXPLICIT_TENSORS_NO_GRAD[kind]
    assert no_grad * block <= blocks.peak < (no_grad + 1.5) * block
    assert no_grad * whole <= probes.peak < (no_grad + 1) * whole
    assert memory.EXPLICIT_TENSORS_TRAINING[kind] * block <= training.peak
    assert training.peak < (memory.EXPLICIT_TENSORS_TRAINING[kind] + 1.5) * block < whole  # never (B, H, T, T)


class LiveBytes(TorchDispatchMode):
    """The most bytes of tensor storage alive at once among the storages the ops under it made (`peak`): a CPU
    run has no allocator statistics to read."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.live = {key: (ref, size) for key, (ref, size) in self.live.items() if not ref.expired()}
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                storage = tensor.untyped_storage()
                self.live.setdefault(storage._cdata, (StorageWeakRef(storage), storage.nbytes()))
        self.peak = max(self.peak, sum(size for _, size in self.live.values()))
        return out
