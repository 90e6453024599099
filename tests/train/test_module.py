"""The training pieces that need no data download: the step-indexed batch stream, the learning-rate schedule and the
stability monitor's spike and divergence rules."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from gatelab.data.datasets import PackedDataset
from gatelab.errors import GatelabError
from gatelab.train.module import SpikeRule, StabilityMonitor, StepBatches, lr_at


def _windows() -> PackedDataset:
    return PackedDataset({"a": np.arange(1000, dtype=np.int64)}, seq_len=4, seed=0)


def test_batches_depend_only_on_the_step():
    stream = StepBatches(_windows(), batch_size=3, steps_per_epoch=5, start_step=lambda: 0)
    from_start = list(stream)
    resumed = list(StepBatches(_windows(), batch_size=3, steps_per_epoch=5, start_step=lambda: 2))
    assert len(from_start) == 5 and len(resumed) == 3  # the epoch ends at the next validation boundary
    for a, b in zip(from_start[2:], resumed):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_ddp_ranks_split_the_global_batch():
    whole = next(iter(StepBatches(_windows(), 4, 10, lambda: 3)))[0]
    parts = [next(iter(StepBatches(_windows(), 4, 10, lambda: 3, rank=r, world_size=2)))[0] for r in (0, 1)]
    assert torch.equal(torch.cat(parts), whole)
    with pytest.raises(GatelabError, match="must divide evenly over 3 processes"):
        StepBatches(_windows(), 4, 10, lambda: 0, world_size=3)


class _Trainer:
    global_step = 0


@pytest.mark.parametrize("context", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])  # spawn: macOS's way
def test_loader_workers_keep_the_step_order(context):
    trainer = _Trainer()
    stream = StepBatches(_windows(), batch_size=3, steps_per_epoch=7, start_step=lambda: trainer.global_step)
    trainer.global_step = 2  # restored from a checkpoint before the epoch's workers start
    alone = list(DataLoader(stream, batch_size=None))
    workers = list(DataLoader(stream, batch_size=None, num_workers=2, multiprocessing_context=context))
    assert len(alone) == len(workers) == 5  # steps 2..6, the rest of the epoch
    for (x, y), (xw, yw) in zip(alone, workers, strict=True):
        assert torch.equal(x, xw) and torch.equal(y, yw)
    assert torch.equal(alone[0][0], stream.batch(2)[0])


def test_warmup_then_cosine_to_the_floor():
    assert lr_at(0, 1.0, 0.1, warmup=10, total=110) == pytest.approx(0.1)
    assert lr_at(9, 1.0, 0.1, warmup=10, total=110) == pytest.approx(1.0)
    assert lr_at(60, 1.0, 0.1, warmup=10, total=110) == pytest.approx(0.55)
    assert lr_at(110, 1.0, 0.1, warmup=10, total=110) == pytest.approx(0.1)


def _apply_rule(losses: list[float], warmup: int, margin: float = 0.15, steps: list[int] | None = None):
    """SpikeRule over a loss curve, one (step, loss) at a time: (spikes, diverged step, the rule after it)."""
    rule, spikes = SpikeRule(warmup, beta=0.98, margin=margin, factor=3.0), []
    for step, loss in zip(steps if steps is not None else range(len(losses)), losses):
        outcome = rule.check(step, loss)
        if outcome == "diverged":
            return spikes, step, rule
        if outcome == "spike":
            spikes.append(step)
    return spikes, None, rule


def test_spike_rule_on_a_hand_made_curve():
    losses = [2.0] * 100
    losses[5] = 4.0  # inside warmup: not counted
    losses[30] = 2.5  # spike
    losses[31] = 2.0  # back to normal right after: the EMA moved by only 0.01
    losses[45] = 2.1  # a bump below the margin
    losses[60] = 3.0  # spike
    losses[61] = 3.0  # still far above the EMA (about 2.02): spike
    losses[80] = float("nan")  # non-finite: the run diverged there, and the loss is kept out of the EMA
    spikes, diverged, rule = _apply_rule(losses, warmup=10)
    assert (spikes, diverged) == ([30, 60, 61], 80) and math.isfinite(rule.ema)
    assert _apply_rule(losses, warmup=0)[:2] == ([5, 30, 60, 61], 80)
    assert _apply_rule(losses, warmup=10, margin=0.05)[:2] == ([30, 45, 60, 61], 80)


def test_spike_rule_reports_the_given_steps_of_a_subsampled_curve():
    losses = [2.0, 2.0, 2.0, 3.0, 2.0, 3.0]
    steps = [0, 100, 200, 300, 400, 500]
    assert _apply_rule(losses, warmup=350, steps=steps)[:2] == ([500], None)


MONITOR = dict(warmup=5, beta=0.9, margin=0.15, factor=3.0)


def _step_by_step(losses: list[float], warmup: int, beta: float, margin: float, factor: float):
    """The monitor's rules checked after every step, as it did before it batched its read-backs: (spikes, diverged)."""
    ema, spikes = None, []
    for step, loss in enumerate(losses):
        if not math.isfinite(loss) or (ema is not None and step >= warmup and loss > factor * ema):
            return spikes, step
        if ema is not None and step >= warmup and loss > ema + margin:
            spikes.append(step)
        ema = loss if ema is None else beta * ema + (1 - beta) * loss
    return spikes, None


def _train(monitor: StabilityMonitor, losses: list[float], first_step: int = 0, log_every: int = 10, end: bool = True):
    """Drive the monitor as Lightning does, one optimizer step per batch; the step at which the run stopped, if any."""
    trainer = SimpleNamespace(global_step=first_step, callback_metrics={}, log_every_n_steps=log_every,
                              should_stop=False)
    module = SimpleNamespace(log=lambda *args, **kwargs: None)
    for step in range(first_step, len(losses)):
        trainer.global_step = step + 1  # Lightning has counted the optimizer step by on_train_batch_end
        trainer.callback_metrics["train/loss"] = torch.tensor(losses[step])
        monitor.on_train_batch_end(trainer, module, None, None, step)
        if trainer.should_stop:
            return step
    if end:
        monitor.on_train_end(trainer, module)
    return None


def _curve(diverge_at: int | None, nan: bool = False, length: int = 60) -> list[float]:
    generator = np.random.default_rng(0)
    losses = (3.0 + 0.1 * generator.standard_normal(length)).tolist()
    losses[3] = 3.6  # in warmup: folded into the EMA, never a spike
    losses[12] = losses[13] = 3.5  # spikes
    losses[30] = 3.3  # a spike
    if diverge_at is not None:
        losses[diverge_at] = float("nan") if nan else 12.0
    return losses


@pytest.mark.parametrize("every", [1, 3, 10, 100])
@pytest.mark.parametrize("diverge_at,nan", [(None, False), (41, False), (47, True), (59, True)])
def test_batched_read_back_finds_the_spikes_and_divergence_a_step_by_step_check_finds(every, diverge_at, nan):
    losses = _curve(diverge_at, nan)
    spikes, diverged = _step_by_step(losses, **MONITOR)
    assert spikes[:3] == [12, 13, 30] and diverged == diverge_at  # the curve has the events it is made for
    monitor = StabilityMonitor(**MONITOR, every=every)
    stopped = _train(monitor, losses)
    assert monitor.spikes == spikes and monitor.diverged_step == diverged
    assert monitor.spike_losses == pytest.approx([losses[step] for step in spikes])
    if stopped is not None:  # at the end of the divergence's interval (None: the last, partial one, read at the end)
        assert diverged <= stopped < diverged + every and (stopped + 1) % every == 0


def test_the_interval_defaults_to_the_trainers_logging_interval():
    losses = _curve(diverge_at=41)
    assert _train(StabilityMonitor(**MONITOR), losses, log_every=4) == 43
    assert _train(StabilityMonitor(**MONITOR), losses, log_every=1) == 41


@pytest.mark.parametrize("resume_at", [7, 20, 33, 45])
def test_a_checkpoint_inside_an_interval_resumes_to_the_same_spikes_and_divergence(resume_at):
    losses = _curve(diverge_at=47)
    unbroken = StabilityMonitor(**MONITOR, every=10)
    _train(unbroken, losses)
    first = StabilityMonitor(**MONITOR, every=10)
    _train(first, losses[:resume_at], end=False)  # killed inside an interval: unchecked steps ride in the checkpoint
    state = first.state_dict()
    assert len(state["pending_steps"]) == resume_at % 10 and all(isinstance(v, float) for v in state["pending_losses"])
    resumed = StabilityMonitor(**MONITOR, every=10)
    resumed.load_state_dict(state)
    _train(resumed, losses, first_step=resume_at)
    assert (resumed.spikes, resumed.diverged_step) == (unbroken.spikes, unbroken.diverged_step)
    assert resumed.spike_losses == unbroken.spike_losses
    assert resumed.ema == unbroken.ema


def test_a_checkpoint_without_spike_losses_restores_them_as_unknown():
    old = {"ema": 3.0, "spikes": [12, 13], "pending_steps": [], "pending_losses": []}
    monitor = StabilityMonitor(**MONITOR)
    monitor.load_state_dict(old)
    assert monitor.spikes == [12, 13] and len(monitor.spike_losses) == 2
    assert all(math.isnan(loss) for loss in monitor.spike_losses)


@pytest.mark.parametrize("decay_gate_logits", [False, True])
def test_input_independent_gate_logits_get_weight_decay_only_when_asked(decay_gate_logits):
    from gatelab.config import ExperimentConfig
    from gatelab.train.module import GatedLM
    from gatelab.variants import apply_variant
    from tests.helpers import micro_config

    model = apply_variant(micro_config(), "g1_inputindep_sig")
    experiment = ExperimentConfig.model_validate({"name": "decay", "model": model.model_dump(),
                                                  "train": {"decay_gate_logits": decay_gate_logits}})
    module = GatedLM(experiment, model)
    optimizer = module.configure_optimizers()["optimizer"]
    names = {id(p): n for n, p in module.named_parameters()}
    by_decay = {group["weight_decay"]: {names[id(p)] for p in group["params"]} for group in optimizer.param_groups}
    logits = {n for n in names.values() if n.endswith("logits_HD")}
    assert len(logits) == 2  # one per layer
    assert (logits <= by_decay[0.1]) == decay_gate_logits and (logits <= by_decay[0.0]) != decay_gate_logits
    assert all(n.endswith("weight") for n in by_decay[0.1] - logits)  # the matrices, and nothing else
    assert any(n.endswith("in_proj.weight") for n in by_decay[0.1])


def _cpuinfo(vendor: str, flags: str) -> str:
    core = (f"processor\t: {{n}}\nvendor_id\t: {vendor}\nmodel name\t: a CPU with avx512_bf16 in its name\n"
            f"flags\t\t: {flags}\n")
    return "\n".join(core.format(n=n) for n in range(2))


@pytest.mark.parametrize("vendor, flags, fast", [
    ("GenuineIntel", "fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile", True),  # Sapphire Rapids with AMX
    ("GenuineIntel", "fpu avx2 avx512f avx512_bf16 avx512_fp16", False),  # the same CPU in a VM that hides AMX
    ("AuthenticAMD", "fpu avx2 avx512f avx512_bf16", True),  # an EPYC Zen 4
    ("AuthenticAMD", "fpu avx2 fma", False),  # bf16 emulated
    ("GenuineIntel", "fpu avx2 fma", False),
])
def test_bf16_counts_as_fast_on_a_cpu_only_where_its_matmuls_beat_fp32(monkeypatch, vendor, flags, fast):
    """Measured (results/bench/README.md): AMX and AMD's AVX512-BF16 run bf16 GEMMs faster than fp32; Intel's
    AVX512-BF16 without AMX about half as fast. The flags line decides, not a flag's name elsewhere in the text."""
    from gatelab import host

    monkeypatch.setattr(host, "cpu_info", lambda: _cpuinfo(vendor, flags))
    assert host.cpu_has_fast_bf16() is fast
    monkeypatch.setattr(host, "cpu_info", lambda: "")  # no /proc/cpuinfo (macOS, Windows)
    assert host.cpu_has_fast_bf16() is False


def test_a_checkpoint_holds_no_secret_of_the_experiment(tmp_path):
    """Issue 35: a tracking URI's password was in plain text in last.ckpt (the MLflow params were redacted). Every
    string of the experiment a checkpoint describes itself with is redacted, and it still reads back as an
    experiment."""
    import pickle

    from gatelab.data.resolve import experiment_from_dict, load_experiment
    from gatelab.model import resolve_model
    from gatelab.train.module import GatedLM
    from tests.helpers import write_micro_experiment

    experiment = load_experiment(write_micro_experiment(tmp_path),
                                 ["tracking.uri=http://bob:Tr0ub4dor-x@127.0.0.1:9", "tracking.experiment=micro"])
    checkpoint: dict = {}
    GatedLM(experiment, resolve_model(experiment)).on_save_checkpoint(checkpoint)
    assert b"Tr0ub4dor-x" not in pickle.dumps(checkpoint)
    described = experiment_from_dict(checkpoint["gatelab"]["experiment"], "the checkpoint")
    assert described.tracking.uri == "http://bob:***@127.0.0.1:9" and described.model == experiment.model
