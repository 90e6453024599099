"""W8A8 fake quantisation, to measure what activation outliers cost: the held-out perplexity of a model whose linear
layers see int8 weights and int8 inputs.

Per-tensor symmetric int8 (round to nearest, scale = max|x| / 127, integers in [-127, 127]) by torch's
`fake_quantize_per_tensor_affine`, for the weight of every `nn.Linear` and, on the fly at each forward call, for its
input: one outlier in a tensor widens the scale for every other value in it, which is how outliers hurt 8-bit
inference (Bondarenko et al., NeurIPS 2023, "Quantizable Transformers: Removing Outliers by Helping Attention Heads
Do Nothing", section 2, whose Tables 1-3 report "W8A8 ppl."). Like theirs, the final linear layer (`lm_head`) stays in
full precision (their section 5). Theirs is a deployment estimate (static calibrated activation ranges, asymmetric
activations, quantisers on every layer's input and output); here a call's activation scale is its own maximum, so the
result depends on which sequences share a forward call: callers keep the batch size fixed.

What this does not reach: weights used outside an `nn.Linear` call (MoE experts' batched matrices, the embedding),
and the inputs of matrix products that are not `nn.Linear` calls (attention's QK^T and PV).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from gatelab.eval.metrics import domain_perplexities

# The W8A8 perplexity runs on this many of each domain's held-out windows, evenly strided (all where a domain has no
# more): a pass over all of them would cost as much again as the held-out perplexity (2.6 s of the tiny preset's 14 s
# evaluation on 2 CPU cores), 8 of 32 cost 0.65 s. Their full-precision reference comes from the held-out pass.
W8A8_WINDOWS_PER_DOMAIN = 8

INT8_MAX = 127  # symmetric: -127..127, so that 0 is exact and the range is the same on both sides
FULL_PRECISION_MODULES = ("lm_head",)  # Bondarenko et al. leave the final linear layer unquantised


def fake_quantize_int8(x: Tensor) -> Tensor:
    """x rounded to the int8 grid of its own per-tensor symmetric scale max|x| / 127, as floats of x's dtype."""
    max_abs = x.detach().abs().amax().float()
    # An all-zero tensor would have scale 0: any positive scale maps it to 0 exactly.
    scale = (max_abs / INT8_MAX).clamp_min(torch.finfo(torch.float32).tiny)
    zero_point = torch.zeros((), dtype=torch.int32, device=x.device)
    return torch.fake_quantize_per_tensor_affine(x.float(), scale, zero_point, -INT8_MAX, INT8_MAX).to(x.dtype)


def _quantize_input(module: nn.Module, args: tuple) -> tuple:
    return (fake_quantize_int8(args[0]), *args[1:])


@contextmanager
def w8a8_fake_quantized(model: nn.Module, keep: Collection[str] = FULL_PRECISION_MODULES) -> Iterator[nn.Module]:
    """The model with every `nn.Linear` (but those named in `keep`) computing on int8-rounded weights and inputs.

    Each such module's weight Parameter is set aside and a quantised copy put in its place, and a forward pre-hook
    quantises its input; on leaving, the hooks go and the very Parameter objects come back, untouched (tied weights
    stay tied, an optimizer still holds the model's parameters)."""
    originals: list[tuple[nn.Linear, nn.Parameter]] = []
    hooks = []
    try:
        with torch.no_grad():
            for name, module in model.named_modules():
                if isinstance(module, nn.Linear) and name not in keep:
                    originals.append((module, module.weight))
                    module.weight = nn.Parameter(fake_quantize_int8(module.weight), requires_grad=False)
                    hooks.append(module.register_forward_pre_hook(_quantize_input))
        yield model
    finally:
        for hook in hooks:
            hook.remove()
        for module, weight in originals:
            module.weight = weight


def w8a8_perplexities(model: nn.Module, windows_by_domain: Mapping[str, Tensor], batch_size: int) -> dict[str, float]:
    """`domain_perplexities` (per domain, and "avg" their mean) of the model under W8A8 fake quantisation.
    `batch_size` sets which windows share an activation scale: keep it fixed to compare runs."""
    with w8a8_fake_quantized(model):
        return domain_perplexities(model, windows_by_domain, batch_size)
