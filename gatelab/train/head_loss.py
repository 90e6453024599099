"""The training step's loss head: `lm_head` and next-token cross-entropy, without whole fp32 logits.

Shapes: B batch, T time, D d_model, V vocabulary, N = B * T tokens, C tokens of one chunk.

The logits are the step's largest tensors (small preset: 64 x 1024 tokens x 16384 = 1.07e9 values, 4.3 GB each in
fp32); eager cross-entropy keeps them, their log-softmax and their gradient. Three paths, by precision:
- full precision: torch's chunked `F.linear_cross_entropy`, whose loss is fp32 because its inputs are; where torch
  lacks it (before 2.13), `ChunkedLinearCrossEntropy` in fp32;
- autocast (bf16/fp16 mixed), eager: `ChunkedLinearCrossEntropy`, low-precision matmuls a chunk at a time with an fp32
  softmax and an fp32 loss. torch's chunked op returns its loss in its inputs' dtype: a bf16 loss is up to 0.4% off
  (one bf16 step at a loss of 8), more than the differences the sweeps measure;
- autocast with `train.compile`: `whole_logits_loss` compiled (gatelab.train.module), whose fused kernels make the
  bf16 logits and their gradient whole but never fp32 ones.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Bytes of one chunk's fp32 logits: on CPU 8 MB (512 tokens at V = 4096 measured 10% faster a step than torch's
# 128-token default, page faults of fresh allocations); on a GPU 256 MB (4096 tokens at V = 16384: matmuls of
# 4096 x 768 x 16384, large enough to run near the GPU's rate, and 16 launches a step rather than one).
CPU_CHUNK_LOGIT_BYTES = 8 << 20
GPU_CHUNK_LOGIT_BYTES = 256 << 20


def next_token_loss(logits_BTV: torch.Tensor, targets_BT: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy in nats, computed in fp32 whatever the logits' dtype."""
    return F.cross_entropy(logits_BTV.flatten(0, 1).float(), targets_BT.flatten())


def whole_logits_loss(hidden_BTD: torch.Tensor, head_weight_VD: torch.Tensor, targets_BT: torch.Tensor) -> torch.Tensor:
    """`next_token_loss` of the whole logits (what `train.compile` compiles under autocast)."""
    return next_token_loss(F.linear(hidden_BTD, head_weight_VD), targets_BT)


def chunk_rows(vocab_size: int, device: torch.device) -> int:
    """Tokens a chunk: a power of two whose fp32 logits fill the device's chunk budget, 64 to 4096 on CPU."""
    budget = CPU_CHUNK_LOGIT_BYTES if device.type == "cpu" else GPU_CHUNK_LOGIT_BYTES
    largest = 12 if device.type == "cpu" else 16
    return 1 << max(6, min(largest, (budget // (4 * vocab_size)).bit_length() - 1))


def _softmax_minus_one_hot(logits_CV: torch.Tensor, logsumexp_C: torch.Tensor, targets_C: torch.Tensor
                           ) -> torch.Tensor:
    """N times d loss / d logits of one chunk, in fp32, made in place of the chunk's logits."""
    grad_logits_CV = logits_CV.sub_(logsumexp_C[:, None]).exp_()
    grad_logits_CV[torch.arange(len(targets_C), device=targets_C.device), targets_C] -= 1.0
    return grad_logits_CV


class ChunkedLinearCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of `hidden_ND @ weight_VD.T` with matmuls in `dtype` and an fp32 softmax and loss.

    As Liger's and torch's fused linear cross-entropy: a chunk's logits live only while the chunk is worked on, so
    only the gradients of the inputs outlive it (N x D and V x D). The logits are rounded to `dtype` as autocast's
    `lm_head` rounds them, then softmaxed in fp32: the loss equals `next_token_loss` of autocast's whole logits to
    float rounding. The weight gradient accumulates in fp32. In fp32 (`dtype` float32) it is the head loss where torch
    has no `F.linear_cross_entropy`.

    Where the logit gradient is made, by dtype:
    - bf16 and fp32: in the forward pass, with the chunk's logits at hand (three matmuls a chunk), (softmax - one_hot)
      / N rounded to bf16 there: bf16 has fp32's exponent range, so the 1/N costs it nothing.
    - fp16: in the backward pass, from the logits made again (four matmuls a chunk), as (softmax - one_hot) *
      grad_loss / N in fp32 rounded to fp16 only then (0.05% off, as autograd's whole logits). Rounded in the forward
      pass, (softmax - one_hot) / N lost every entry below fp16's 6e-8 (at 16,384 tokens and V = 4,096 the head's
      gradients were 102% and 140% off fp64's), and without `grad_loss`, which carries 16-mixed's GradScaler factor, a
      chunk's weight gradient that overflowed would stay inf however far the scaler backed off."""

    @staticmethod
    def forward(ctx, hidden_ND: torch.Tensor, weight_VD: torch.Tensor, targets_N: torch.Tensor, rows: int,
                dtype: torch.dtype) -> torch.Tensor:
        tokens = hidden_ND.shape[0]
        wanted = ctx.needs_input_grad[:2]
        gradient_in_backward = dtype == torch.float16
        with torch.autocast(hidden_ND.device.type, enabled=False):
            hidden_low_ND, weight_low_VD = hidden_ND.to(dtype), weight_VD.to(dtype)
            loss_sum = torch.zeros((), dtype=torch.float32, device=hidden_ND.device)
            logsumexp_N = (torch.empty(tokens, dtype=torch.float32, device=hidden_ND.device) if gradient_in_backward
                           else None)
            gradients_now = any(wanted) and not gradient_in_backward
            grad_hidden_ND = torch.empty_like(hidden_low_ND) if gradients_now and wanted[0] else None
            grad_weight_VD = torch.zeros_like(weight_VD, dtype=torch.float32) if gradients_now and wanted[1] else None
            for start in range(0, tokens, rows):
                hidden_CD, targets_C = hidden_low_ND[start:start + rows], targets_N[start:start + rows]
                logits_CV = (hidden_CD @ weight_low_VD.T).float()
                logsumexp_C = torch.logsumexp(logits_CV, dim=-1)
                loss_sum += (logsumexp_C - logits_CV.gather(1, targets_C[:, None]).squeeze(1)).sum()
                if logsumexp_N is not None:
                    logsumexp_N[start:start + rows] = logsumexp_C
                if gradients_now:
                    grad_logits_CV = _softmax_minus_one_hot(logits_CV, logsumexp_C, targets_C).div_(tokens).to(dtype)
                    _chunk_input_gradients(grad_logits_CV, hidden_CD, weight_low_VD, start, grad_hidden_ND,
                                           grad_weight_VD)
        if gradient_in_backward:
            ctx.save_for_backward(hidden_ND, weight_VD, targets_N, logsumexp_N)
        else:
            ctx.save_for_backward(grad_hidden_ND, grad_weight_VD)
        ctx.gradient_in_backward, ctx.rows, ctx.dtype = gradient_in_backward, rows, dtype
        ctx.dtypes = (hidden_ND.dtype, weight_VD.dtype)
        return loss_sum / tokens

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        hidden_dtype, weight_dtype = ctx.dtypes
        if ctx.gradient_in_backward:
            grad_hidden_ND, grad_weight_VD = ChunkedLinearCrossEntropy._input_gradients(ctx, grad_loss)
        else:
            grad_hidden_ND, grad_weight_VD = ctx.saved_tensors
            grad_hidden_ND = None if grad_hidden_ND is None else grad_hidden_ND * grad_loss
            grad_weight_VD = None if grad_weight_VD is None else grad_weight_VD * grad_loss
        grad_hidden = None if grad_hidden_ND is None else grad_hidden_ND.to(hidden_dtype)
        grad_weight = None if grad_weight_VD is None else grad_weight_VD.to(weight_dtype)
        return grad_hidden, grad_weight, None, None, None

    @staticmethod
    def _input_gradients(ctx, grad_loss: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The fp16 case: the chunks' logits made again, their gradient scaled by `grad_loss` / N in fp32."""
        hidden_ND, weight_VD, targets_N, logsumexp_N = ctx.saved_tensors
        tokens, rows, dtype = hidden_ND.shape[0], ctx.rows, ctx.dtype
        factor = grad_loss.float() / tokens
        with torch.autocast(hidden_ND.device.type, enabled=False):
            hidden_low_ND, weight_low_VD = hidden_ND.to(dtype), weight_VD.to(dtype)
            grad_hidden_ND = torch.empty_like(hidden_low_ND) if ctx.needs_input_grad[0] else None
            grad_weight_VD = (torch.zeros_like(weight_VD, dtype=torch.float32) if ctx.needs_input_grad[1]
                              else None)
            for start in range(0, tokens, rows):
                hidden_CD, targets_C = hidden_low_ND[start:start + rows], targets_N[start:start + rows]
                logits_CV = (hidden_CD @ weight_low_VD.T).float()
                grad_logits_CV = _softmax_minus_one_hot(logits_CV, logsumexp_N[start:start + rows], targets_C)
                grad_logits_CV = grad_logits_CV.mul_(factor).to(dtype)
                _chunk_input_gradients(grad_logits_CV, hidden_CD, weight_low_VD, start, grad_hidden_ND,
                                       grad_weight_VD)
        return grad_hidden_ND, grad_weight_VD


def _chunk_input_gradients(grad_logits_CV: torch.Tensor, hidden_CD: torch.Tensor, weight_VD: torch.Tensor, start: int,
                           grad_hidden_ND: torch.Tensor | None, grad_weight_VD: torch.Tensor | None) -> None:
    """One chunk's share of the inputs' gradients, written into `grad_hidden_ND` and added to `grad_weight_VD`."""
    if grad_hidden_ND is not None:
        grad_hidden_ND[start:start + len(hidden_CD)] = grad_logits_CV @ weight_VD
    if grad_weight_VD is not None:
        grad_weight_VD += grad_logits_CV.T @ hidden_CD


def torch_has_linear_cross_entropy() -> bool:
    """Whether torch has the chunked `F.linear_cross_entropy` (torch 2.13 has it, the GPU machines' 2.11 does not)."""
    return hasattr(torch.nn, "LinearCrossEntropyOptions") and hasattr(F, "linear_cross_entropy")


def head_loss(hidden_BTD: torch.Tensor, head_weight_VD: torch.Tensor, targets_BT: torch.Tensor) -> torch.Tensor:
    """`next_token_loss(hidden_BTD @ head_weight_VD.T, targets_BT)` in chunks, never with whole fp32 logits, by the
    module docstring's paths (torch's op chunks `chunk_rows` tokens at a time on CPU, its own way on GPUs)."""
    device_type = hidden_BTD.device.type
    hidden_ND, targets_N = hidden_BTD.flatten(0, 1), targets_BT.flatten()
    rows = chunk_rows(head_weight_VD.shape[0], hidden_BTD.device)
    if torch.is_autocast_enabled(device_type):
        return ChunkedLinearCrossEntropy.apply(hidden_ND, head_weight_VD, targets_N, rows,
                                               torch.get_autocast_dtype(device_type))
    if not torch_has_linear_cross_entropy():
        return ChunkedLinearCrossEntropy.apply(hidden_ND, head_weight_VD, targets_N, rows, torch.float32)
    options = torch.nn.LinearCrossEntropyOptions()
    if device_type == "cpu":
        options = torch.nn.LinearCrossEntropyOptions(chunking_method=None, batch_chunk_size=rows)
    return F.linear_cross_entropy(hidden_ND, head_weight_VD, targets_N, options=options)
