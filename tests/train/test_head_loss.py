"""gatelab.train.head_loss in each precision: fp16's gradient against fp64's, 16-mixed training against fp32 through
Lightning's GradScaler, and the fp32 loss where torch has no `F.linear_cross_entropy` (torch before 2.13)."""

from __future__ import annotations

import lightning as L
import pytest
import torch
import torch.nn.functional as F
import yaml
from lightning.pytorch.plugins.precision import MixedPrecision

from gatelab.data.resolve import load_experiment
from gatelab.model import build_model, resolve_model
from gatelab.train import head_loss as head_loss_module
from gatelab.train.head_loss import head_loss
from gatelab.train.module import GatedLM
from tests.helpers import MICRO, assert_head_loss_matches_whole_logits

GRAD_SCALER_INITIAL_SCALE = 2.0**16  # torch.amp.GradScaler's init_scale: the factor 16-mixed's first backward carries


@pytest.fixture()
def without_torchs_linear_cross_entropy(monkeypatch):
    """torch as the GPU machines' 2.11 is: no chunked linear cross-entropy (there already: nothing to hide)."""
    monkeypatch.delattr(torch.nn, "LinearCrossEntropyOptions", raising=False)
    monkeypatch.delattr(F, "linear_cross_entropy", raising=False)


def _relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    return ((value.double() - reference).norm() / reference.norm()).item()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_under_autocast_the_head_gradients_are_within_the_dtype_s_rounding_of_fp64(dtype):
    """8,192 tokens at a 4,096 vocabulary: (softmax - one_hot) / N is about 3e-8 here, at fp16's smallest value (6e-8),
    so an fp16 logit gradient rounded before the GradScaler's factor arrived lost its softmax part: the hidden and
    weight gradients were 14% and 54% off (102% and 140% at 16,384 tokens). The hidden states and the head's rows
    share a direction, as trained ones do; around a zero mean the lost part would mostly cancel. The inputs are rounded
    to `dtype` (relative error eps / 2 each) and all after the matmuls is fp32: the gradients are within one eps of
    fp64 (measured: fp16 4.8e-4 against its eps 9.8e-4, bf16 2.9e-3 against 7.8e-3)."""
    generator = torch.Generator().manual_seed(0)
    tokens, vocab, dim = 8192, 4096, 16
    hidden_BTD = torch.randn(1, tokens, dim, generator=generator, dtype=torch.float64) + 1.0
    weight_VD = (torch.randn(vocab, dim, generator=generator, dtype=torch.float64) + 1.0) * 0.02  # near-uniform p
    targets_BT = torch.randint(0, vocab, (1, tokens), generator=generator)
    reference_inputs = [hidden_BTD.clone().requires_grad_(), weight_VD.clone().requires_grad_()]
    reference = F.cross_entropy((reference_inputs[0] @ reference_inputs[1].T).flatten(0, 1), targets_BT.flatten())
    reference_grads = torch.autograd.grad(reference, reference_inputs)
    inputs = [hidden_BTD.float().requires_grad_(), weight_VD.float().requires_grad_()]
    with torch.autocast("cpu", dtype=dtype):
        loss = head_loss(inputs[0], inputs[1], targets_BT)
    grads = torch.autograd.grad(GRAD_SCALER_INITIAL_SCALE * loss, inputs)
    eps = torch.finfo(dtype).eps
    assert loss.dtype == torch.float32 and abs(loss.item() - reference.item()) < eps * reference.item()
    for name, grad, reference_grad in zip(("hidden", "weight"), grads, reference_grads):
        assert grad.dtype == torch.float32
        error = _relative_error(grad / GRAD_SCALER_INITIAL_SCALE, reference_grad)
        assert error < eps, f"{name} gradient {error:.2e} off fp64 in {dtype}"


def _micro_experiment(tmp_path, **model):
    path = tmp_path / "micro.yaml"
    config = {**MICRO, "model": {**MICRO["model"], **model}, "data": {**MICRO["data"], "seq_len": 1024}}
    path.write_text(yaml.safe_dump(config))
    return load_experiment(path)


def _fit(experiment, steps: int, **trainer_precision) -> tuple[GatedLM, L.Trainer, list[float], dict]:
    """`steps` Lightning steps of learnable batches (targets a function of the inputs), with gatelab's clipping: the
    module, the trainer, the losses, and the parameters' updates."""
    generator = torch.Generator().manual_seed(0)
    vocab = experiment.model.vocab_size
    inputs = [torch.randint(0, vocab, (experiment.train.batch_size, experiment.data.seq_len), generator=generator)
              for _ in range(steps)]
    batches = [(input_ids_BT, (7 * input_ids_BT + 3) % vocab) for input_ids_BT in inputs]
    lm = GatedLM(experiment, resolve_model(experiment))
    before = {name: parameter.detach().clone() for name, parameter in lm.named_parameters()}
    losses = []

    class KeepLosses(L.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            losses.append(outputs["loss"].item())

    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=steps, gradient_clip_val=1.0, logger=False,
                        callbacks=[KeepLosses()], enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, **trainer_precision)
    trainer.fit(lm, train_dataloaders=torch.utils.data.DataLoader(batches, batch_size=None))
    updates = {name: parameter.detach() - before[name] for name, parameter in lm.named_parameters()}
    return lm, trainer, losses, updates


def test_16_mixed_training_through_lightning_s_grad_scaler_updates_the_weights_as_fp32_does(tmp_path):
    """Two AdamW steps of 4,096 tokens at a 4,096 vocabulary (tied embeddings: the head's gradient reaches the
    embedding), 16-mixed against 32-true. Lightning turns `precision="16-mixed"` into bf16 on a CPU, so its
    mixed-precision plugin is given directly, with the GradScaler it makes for fp16. Before the fp16 logit gradient
    waited for the scaler's factor, the updates were 17.7% off fp32's (the final norm's 168%); now 0.5%: the rest is
    fp16's rounding of the blocks' matmuls."""
    experiment = _micro_experiment(tmp_path, vocab_size=4096)
    *_, fp32_losses, fp32_updates = _fit(experiment, 2, precision="32-true")
    _, trainer, fp16_losses, fp16_updates = _fit(experiment, 2, plugins=[MixedPrecision("16-mixed", "cpu")])
    assert trainer.precision == "16-mixed"
    assert trainer.precision_plugin.scaler.get_scale() == GRAD_SCALER_INITIAL_SCALE  # no step skipped for an inf
    assert fp16_losses == pytest.approx(fp32_losses, rel=1e-5)
    flat_fp32, flat_fp16 = (torch.cat([update.flatten() for update in updates.values()])
                            for updates in (fp32_updates, fp16_updates))
    assert _relative_error(flat_fp16, flat_fp32.double()) < 2e-2
    for name, update in fp16_updates.items():
        assert _relative_error(update, fp32_updates[name].double()) < 5e-2, name


@pytest.fixture()
def small_chunks(monkeypatch):
    """Chunks of 64 tokens at the micro vocabulary (512): a micro batch of 128 tokens is two."""
    monkeypatch.setattr(head_loss_module, "CPU_CHUNK_LOGIT_BYTES", 4 * 512 * 64)


def test_without_torchs_linear_cross_entropy_the_fp32_head_loss_has_the_loss_and_gradients_of_whole_logits(
        tmp_path, small_chunks, without_torchs_linear_cross_entropy):
    assert_head_loss_matches_whole_logits(build_model(resolve_model(_micro_experiment(tmp_path)), seed=1))


def test_without_torchs_linear_cross_entropy_an_fp32_run_trains_as_with_it(tmp_path, monkeypatch):
    """Three 32-true Lightning steps through GatedLM where torch lacks the op (an fp32 step crashed there) against
    three with it. The two sum a token's loss in another order, so fp32 rounding differs; Adam divides each step by the
    gradient's running scale, so where a gradient is near zero (the tied embedding's rows of tokens a batch barely
    holds) that rounding can move an element's update by a part in a few hundred: seen on a Xeon with AMX, 2 of 16,384
    embedding elements 0.4% apart. Each parameter's whole update is compared, as the mixed-precision test does."""
    experiment = _micro_experiment(tmp_path)
    *_, with_op_losses, with_op_updates = _fit(experiment.with_train(batch_size=2), 3, precision="32-true")
    monkeypatch.delattr(torch.nn, "LinearCrossEntropyOptions", raising=False)
    monkeypatch.delattr(F, "linear_cross_entropy", raising=False)
    _, trainer, losses, updates = _fit(experiment.with_train(batch_size=2), 3, precision="32-true")
    assert trainer.global_step == 3 and losses == pytest.approx(with_op_losses, rel=1e-5)
    assert updates.keys() == with_op_updates.keys()
    for name, update in updates.items():
        assert _relative_error(update, with_op_updates[name].double()) < 1e-3, name
