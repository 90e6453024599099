"""The faster training step (chunked head loss, compiled blocks with a shared cache) computes what the plain one did."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import yaml

from gatelab import host
from gatelab.data.identity import spec_hash
from gatelab.data.resolve import load_experiment
from gatelab.model import build_model, resolve_model
from gatelab.train import compiling
from gatelab.train import head_loss as head_loss_module
from gatelab.train.head_loss import head_loss, next_token_loss
from gatelab.train.module import GatedLM, lr_at
from tests.helpers import MICRO, assert_head_loss_matches_whole_logits, write_micro_experiment


def _micro(tmp_path, **train):
    return load_experiment(write_micro_experiment(tmp_path, **train))


def _batches(experiment, steps: int):
    generator = torch.Generator().manual_seed(0)
    shape = (experiment.train.batch_size, experiment.data.seq_len)
    vocab = experiment.model.vocab_size
    inputs = [torch.randint(0, vocab, shape, generator=generator) for _ in range(steps)]
    return [(input_ids_BT, (7 * input_ids_BT + 3) % vocab) for input_ids_BT in inputs]  # learnable: the loss falls


def _loss_curve(experiment, batches, loss_of, fused: bool = True) -> list[float]:
    """Per-step losses of `len(batches)` AdamW steps with clipping, as gatelab trains, with `loss_of(module, x, y)`;
    with torch's per-parameter AdamW unless `fused` (the step before the fused one)."""
    lm = GatedLM(experiment, resolve_model(experiment))
    optimizers = lm.configure_optimizers()
    optimizer, schedule = optimizers["optimizer"], optimizers["lr_scheduler"]["scheduler"]
    assert optimizer.defaults["fused"]
    if not fused:
        train = experiment.train
        groups = [{"params": group["params"], "weight_decay": group["weight_decay"]}
                  for group in optimizer.param_groups]
        optimizer = torch.optim.AdamW(groups, lr=train.lr, betas=train.betas, foreach=False)
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: lr_at(step, train.lr, train.min_lr, train.warmup_steps, train.max_steps) / train.lr)
    losses = []
    for input_ids_BT, targets_BT in batches:
        loss = loss_of(lm, input_ids_BT, targets_BT)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(lm.parameters(), experiment.train.grad_clip)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def _whole_logits(lm, input_ids_BT, targets_BT):
    return next_token_loss(lm.model(input_ids_BT), targets_BT)  # the step before the chunked head loss


def _training_loss(lm, input_ids_BT, targets_BT):
    return lm.training_loss(input_ids_BT, targets_BT)[1]


@pytest.fixture()
def small_chunks(monkeypatch):
    """Chunks of 32 tokens at the micro vocabulary (512), so a micro batch (128 tokens) is cut into four."""
    monkeypatch.setattr(head_loss_module, "CPU_CHUNK_LOGIT_BYTES", 4 * 512 * 32)


@pytest.mark.parametrize("tie_embeddings", [True, False])
def test_the_chunked_head_loss_has_the_loss_and_gradients_of_whole_logits(tmp_path, small_chunks, tie_embeddings):
    path = tmp_path / "micro.yaml"
    path.write_text(yaml.safe_dump({**MICRO, "model": {**MICRO["model"], "tie_embeddings": tie_embeddings}}))
    assert_head_loss_matches_whole_logits(build_model(resolve_model(load_experiment(path)), seed=1))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("tokens", [16, 200])
def test_under_autocast_the_head_loss_is_fp32_with_the_loss_and_gradients_of_whole_low_precision_logits(tokens, dtype):
    """`ChunkedLinearCrossEntropy` (chunks of 64 tokens: one chunk, and four with a short last one) against autocast's
    whole low-precision logits and fp32 cross-entropy, the eager step before it."""
    generator = torch.Generator().manual_seed(0)
    hidden_BTD = torch.randn(2, tokens // 2, 96, generator=generator, requires_grad=True)
    weight_VD = (torch.randn(512, 96, generator=generator) * 0.1).requires_grad_()
    targets_BT = torch.randint(0, 512, (2, tokens // 2), generator=generator)
    with torch.autocast("cpu", dtype=dtype):
        loss = head_loss(hidden_BTD, weight_VD, targets_BT)
        reference = next_token_loss(torch.nn.functional.linear(hidden_BTD, weight_VD), targets_BT)
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(reference.item(), rel=1e-6)
    grads = torch.autograd.grad(3.0 * loss, [hidden_BTD, weight_VD])  # a scaled loss: the saved gradients scale
    reference_grads = torch.autograd.grad(3.0 * reference, [hidden_BTD, weight_VD])
    for grad, reference_grad in zip(grads, reference_grads):
        assert grad.dtype == torch.float32
        torch.testing.assert_close(grad, reference_grad, rtol=2e-2, atol=2e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
def test_the_chunks_never_hold_whole_fp32_logits(small_chunks, monkeypatch, dtype):
    """The largest tensor the chunked loss makes is one chunk's fp32 logits, not the whole batch's: under autocast, and
    in fp32 where torch has no `F.linear_cross_entropy` (fp16 makes the chunks' logits again in backward)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class LargestFp32(TorchDispatchMode):
        largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for tensor in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(tensor, torch.Tensor) and tensor.dtype == torch.float32:
                    LargestFp32.largest = max(LargestFp32.largest, tensor.numel())
            return out

    tokens, vocab = 1024, 512
    hidden_BTD = torch.randn(4, tokens // 4, 32, requires_grad=True)
    weight_VD = (torch.randn(vocab, 32) * 0.1).requires_grad_()
    targets_BT = torch.randint(0, vocab, (4, tokens // 4))
    if dtype == torch.float32:
        monkeypatch.delattr(torch.nn, "LinearCrossEntropyOptions", raising=False)
        monkeypatch.delattr(torch.nn.functional, "linear_cross_entropy", raising=False)
    with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32), LargestFp32():
        head_loss(hidden_BTD, weight_VD, targets_BT).backward()
    rows = head_loss_module.chunk_rows(vocab, hidden_BTD.device)
    assert rows < tokens and LargestFp32.largest == rows * vocab


def test_a_50_step_loss_curve_of_the_faster_step_matches_the_step_before_it(tmp_path, small_chunks):
    experiment = _micro(tmp_path, grad_clip=1.0, max_steps=50)
    batches = _batches(experiment, 50)
    reference = _loss_curve(experiment, batches, _whole_logits, fused=False)
    faster = _loss_curve(experiment, batches, _training_loss)
    assert reference[-1] < reference[0] - 0.5  # it learns: the curves compared are not flat
    relative = max(abs(a - b) / abs(a) for a, b in zip(reference, faster))
    assert relative < 1e-3, relative


def test_compiling_is_a_speed_setting_not_part_of_a_run_s_identity(tmp_path):
    eager = _micro(tmp_path, compile=False)
    compiled = eager.with_train(compile=True)
    assert spec_hash(eager) == spec_hash(compiled)


def test_without_a_cpp_compiler_compiling_on_the_cpu_is_refused_with_the_fix(monkeypatch):
    monkeypatch.setattr(host.shutil, "which", lambda name: None)
    monkeypatch.setattr(compiling.torch.cuda, "is_available", lambda: False)
    why = host.cannot_compile("auto")
    assert "no C++ compiler" in why and "CXX" in why
    monkeypatch.setattr(host.shutil, "which", lambda name: f"/usr/bin/{name}")
    assert host.cannot_compile("cpu") is None


def test_the_shared_cache_is_the_runs_folder_s_unless_the_user_chose_one(tmp_path, monkeypatch):
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv(compiling.CACHE_VARIABLE, default_cache_dir())  # what inductor writes there itself
    assert compiling.share_cache(tmp_path / "runs") == (tmp_path / "runs" / "compile-cache").resolve()
    monkeypatch.setenv(compiling.CACHE_VARIABLE, str(tmp_path / "mine"))
    assert compiling.share_cache(tmp_path / "runs") == tmp_path / "mine"


@pytest.mark.slow
def test_the_second_run_of_a_shape_loads_the_first_run_s_compiled_graphs(tmp_path):
    """Two `gatelab train` processes (seeds 0 and 1) in one runs folder: the first compiles and fills the folder's
    cache, the second compiles nothing and says it loaded the graphs."""
    # three steps: CompileReport times the compile as the first step less the second, once the third starts
    experiment = write_micro_experiment(tmp_path, compile=True, max_steps=3, checkpoint_every=3)
    config = yaml.safe_load(experiment.read_text())
    config["eval"].update(every_n_steps=None, blimp=False)  # evaluation stays eager: nothing here to compile
    experiment.write_text(yaml.safe_dump(config))
    runs = tmp_path / "runs"
    environment = {k: v for k, v in os.environ.items() if k != compiling.CACHE_VARIABLE}
    found, outputs = [], []
    for seed in (0, 1):
        result = subprocess.run([sys.executable, "-m", "gatelab", "train", str(experiment), "--runs-dir", str(runs),
                                 "--set", f"seed={seed}"], capture_output=True, text=True, timeout=600,
                                env=environment)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        found.append(compiling.COMPILED_LINE.search(result.stdout))
        outputs.append(result.stdout)
    assert all(found), [result.stdout[-2000:]]
    first, second = found
    assert int(first[3]) > 0 and int(second[2]) == int(first[3]) and int(second[3]) == 0
    cache = (runs / "compile-cache").resolve()
    assert all(f"{line[0]} (inductor cache {cache})" in output for line, output in zip(found, outputs))


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_lightning_trains_with_gradient_clipping_at_each_precision(tmp_path, precision):
    """gatelab clips the gradients itself (`configure_gradient_clipping`), so bf16-mixed trains with the fused AdamW,
    which Lightning's mixed-precision plugin refuses to clip for; 16-mixed keeps the unfused one, whose gradients
    Lightning's GradScaler unscales before they are clipped."""
    import lightning as L

    experiment = _micro(tmp_path, grad_clip=1.0, max_steps=2)
    lm = GatedLM(experiment, resolve_model(experiment))
    trainer = L.Trainer(accelerator="cpu", devices=1, precision=precision, max_steps=2, gradient_clip_val=1.0,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    before = [p.detach().clone() for p in lm.parameters()]
    trainer.fit(lm, train_dataloaders=torch.utils.data.DataLoader(_batches(experiment, 2), batch_size=None))
    assert trainer.global_step == 2
    assert trainer.optimizers[0].defaults["fused"]
    assert all(torch.isfinite(p).all() for p in lm.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, lm.parameters()))


@pytest.mark.parametrize("autocast", [False, True])
def test_a_compiled_run_takes_the_compiled_whole_logits_loss_under_autocast_and_the_chunked_one_in_fp32(
        tmp_path, small_chunks, autocast):
    """With `train.compile`, under autocast (where eager training makes whole logits too) the head loss is inductor's
    whole-logits loss; in fp32 it stays the chunked loss (faster there, and its memory does not grow with the
    logits)."""
    experiment = _micro(tmp_path, compile=True)
    lm = GatedLM(experiment, resolve_model(experiment))
    lm.train_hidden_states = lm.model.hidden_states  # the blocks eager: only the head loss's choice is under test
    calls = []
    lm.compiled_head_loss = lambda *tensors: calls.append(tensors) or head_loss_module.whole_logits_loss(*tensors)
    input_ids_BT, targets_BT = _batches(experiment, 1)[0]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = lm.training_loss(input_ids_BT, targets_BT)[0]
        reference = next_token_loss(lm.model(input_ids_BT), targets_BT)
    assert len(calls) == int(autocast)
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(reference.item(), rel=1e-2 if autocast else 1e-5)


def test_an_eager_run_never_compiles_the_head_loss(tmp_path):
    experiment = _micro(tmp_path, compile=False)
    assert GatedLM(experiment, resolve_model(experiment)).compiled_head_loss is None


@pytest.mark.slow
def test_under_bf16_autocast_the_compiled_head_loss_has_the_eager_loss_and_gradients(tmp_path):
    """The compiled region (inductor's fused cross-entropy of bf16 logits) against eager whole logits, same weights."""
    experiment = _micro(tmp_path)
    eager, compiled = (GatedLM(experiment.with_train(compile=flag), resolve_model(experiment))
                       for flag in (False, True))
    assert compiled.compiled_head_loss is not None
    input_ids_BT, targets_BT = _batches(experiment, 1)[0]
    losses, grads = [], []
    for lm in (eager, compiled):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            hidden_BTD, _ = lm.model.hidden_states(input_ids_BT)
            loss = lm.train_head_loss(hidden_BTD, lm.model.lm_head.weight, targets_BT)
        losses.append(loss)
        grads.append(torch.autograd.grad(loss, list(lm.parameters())))
    assert losses[1].dtype == torch.float32
    assert losses[1].item() == pytest.approx(losses[0].item(), rel=2e-3)
    for eager_grad, compiled_grad in zip(*grads):
        torch.testing.assert_close(compiled_grad, eager_grad, rtol=2e-2, atol=2e-3)


@pytest.mark.parametrize("verbose", [False, True])
def test_an_unreadable_compile_cache_entry_is_one_line_without_a_traceback(tmp_path, monkeypatch, verbose):
    """Inductor logs an unreadable cache entry with its traceback and compiles again; gatelab says it once, in one
    line naming the cache, unless --verbose."""
    import logging
    import pickle

    import torch._inductor.codecache  # noqa: F401  (in the state of a real run: torch's loggers set up by inductor)
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from gatelab.progress import VERBOSE_ENV

    monkeypatch.setattr(compiling, "DAMAGED_ENTRY", compiling.DamagedCacheEntry())
    monkeypatch.setattr(compiling.INDUCTOR_CACHE_LOG, "filters", [])
    monkeypatch.setenv(compiling.CACHE_VARIABLE, default_cache_dir())
    monkeypatch.setenv(VERBOSE_ENV, "1" if verbose else "0")
    cache = compiling.share_cache(tmp_path / "runs")
    # Once inductor is imported, torch's loggers stop propagating to the root (torch._logging gives them a handler of
    # their own), so pytest's caplog would see nothing: collect at the logger itself, after its filters, as torch's
    # handler does.
    records: list[logging.LogRecord] = []
    collector = logging.Handler(logging.WARNING)
    collector.emit = records.append
    log, level = compiling.INDUCTOR_CACHE_LOG, compiling.INDUCTOR_CACHE_LOG.level
    monkeypatch.setattr(log, "disabled", False)
    monkeypatch.setattr(log, "handlers", [collector])
    log.setLevel(logging.WARNING)
    try:
        for _ in range(2):  # as inductor does for each damaged graph it meets
            try:
                pickle.loads(b"garbage")
            except pickle.UnpicklingError:
                log.warning("fx graph cache unable to load compiled graph", exc_info=True)
    finally:
        log.setLevel(level)
    if verbose:
        assert len(records) == 2 and all(r.exc_info for r in records)
        return
    assert len(records) == 1 and records[0].exc_info is None
    line = records[0].getMessage()
    assert str(cache) in line and "UnpicklingError" in line and "compiled again" in line


def _compile_report_after(steps: int, cache) -> tuple[compiling.CompileReport, list[str]]:
    """A CompileReport driven through `steps` training steps and the end of training, and the lines it said."""
    from types import SimpleNamespace

    lines = []
    report = compiling.CompileReport(cache, log=lines.append)
    trainer = SimpleNamespace(global_rank=0)
    for batch_idx in range(steps):
        report.on_train_batch_start(trainer, None, None, batch_idx)
        report.on_train_batch_end(trainer, None, None, None, batch_idx)
    report.on_train_end(trainer, None)
    return report, lines


@pytest.mark.parametrize("steps", [1, 2])
def test_a_compiled_run_too_short_to_time_the_compiling_still_says_what_the_cache_did(tmp_path, steps):
    report, [announced, line] = _compile_report_after(steps, tmp_path / "cache")
    assert announced.startswith("compiling the model for its first step")  # said before the long first step
    assert line.startswith("compiled in at most ") and f"(inductor cache {tmp_path / 'cache'})" in line
    assert "graph(s) loaded from the cache" in line and report.compile_s is None  # no time/compile_s from a guess
    assert not compiling.COMPILED_LINE.search(line)  # the bench reads only measured compile times


def test_a_run_that_timed_its_compiling_says_it_once(tmp_path):
    report, lines = _compile_report_after(4, tmp_path / "cache")
    assert len(lines) == 2 and lines[0].startswith("compiling the model for its first step")
    assert compiling.COMPILED_LINE.search(lines[1]) and report.compile_s is not None


@pytest.mark.parametrize(("precision", "strategy", "fused"), [
    ("32-true", "auto", True), ("bf16-mixed", "auto", True), ("16-mixed", "auto", False), ("bf16-mixed", "fsdp", False),
])
def test_adamw_is_fused_unless_a_grad_scaler_or_fsdp_clips(tmp_path, precision, strategy, fused):
    """(Lightning turns 16-mixed into bf16-mixed on a CPU, so the rule is read off the module, not a CPU Trainer.)"""
    experiment = _micro(tmp_path).with_train(precision=precision, strategy=strategy)
    optimizer = GatedLM(experiment, resolve_model(experiment)).configure_optimizers()["optimizer"]
    assert bool(optimizer.defaults["fused"]) == fused


@pytest.mark.parametrize("clip", [0.5, 0.0])
def test_gradients_are_clipped_to_the_global_norm_which_is_logged_before_clipping(tmp_path, clip):
    experiment = _micro(tmp_path, grad_clip=clip or 1.0)
    lm = GatedLM(experiment, resolve_model(experiment))
    input_ids_BT, targets_BT = _batches(experiment, 1)[0]
    (100.0 * lm.training_loss(input_ids_BT, targets_BT)[1]).backward()
    before = torch.nn.utils.get_total_norm([p.grad for p in lm.parameters()])
    logged = {}
    lm.log = lambda name, value, **kwargs: logged.__setitem__(name, value)
    lm.configure_gradient_clipping(None, clip or None, "norm")
    after = torch.nn.utils.get_total_norm([p.grad for p in lm.parameters()])
    assert logged["train/grad_norm"].item() == pytest.approx(before.item(), rel=1e-6) and before > 1.0
    assert after.item() == pytest.approx(clip if clip else before.item(), rel=1e-4)


def test_the_compile_mode_is_a_speed_setting_and_only_cuda_graph_modes_mark_steps(tmp_path):
    eager = _micro(tmp_path, compile=False)
    graphed = eager.with_train(compile=True, compile_mode="reduce-overhead")
    assert spec_hash(graphed) == spec_hash(eager)
    assert GatedLM(graphed, resolve_model(graphed)).cuda_graphs
    tuned = eager.with_train(compile=True, compile_mode="max-autotune-no-cudagraphs")
    assert not GatedLM(tuned, resolve_model(tuned)).cuda_graphs
    assert not GatedLM(eager.with_train(compile_mode="reduce-overhead"), resolve_model(eager)).cuda_graphs  # eager


def test_a_compile_mode_not_offered_is_named_with_the_choices(tmp_path):
    from gatelab.errors import GatelabError

    with pytest.raises(GatelabError, match="compile_mode") as caught:
        load_experiment(write_micro_experiment(tmp_path, compile_mode="fast"))
    assert "reduce-overhead" in str(caught.value)
