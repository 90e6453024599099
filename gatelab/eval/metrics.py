"""Language-model metrics: perplexity (overall, per domain, at 1x-8x the training length) and bits per byte.

The model contract is the whole package's: `logits_BTV = model(input_ids_BT)` gives next-token logits. Every metric runs
batched under `torch.no_grad()` in eval mode on the device of the model's parameters, and accumulates negative
log-likelihoods in float64 on the CPU so that averages over millions of tokens do not drift.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn

IGNORE_INDEX = -100

# A window tensor (N, T+1), or (input_ids, targets) pairs each of shape (T,) or (B, T).
Windows = Tensor | Iterable[tuple[Tensor, Tensor]]


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's first parameter (or buffer); CPU for a module that has neither."""
    for tensor in (*model.parameters(), *model.buffers()):
        return tensor.device
    return torch.device("cpu")


@contextmanager
def evaluation_mode(model: nn.Module) -> Iterator[None]:
    """`no_grad` plus `model.eval()`, then every submodule's own previous mode back, so evaluating mid-training is
    safe (also for a submodule deliberately kept in eval mode while the rest trains)."""
    was_training = {module: module.training for module in model.modules()}
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        for module, training in was_training.items():
            module.training = training


def token_nll(model: nn.Module, input_ids_BT: Tensor, targets_BT: Tensor, ignore_index: int = IGNORE_INDEX) -> Tensor:
    """Per-position negative log-likelihood (B, T), float64 on the CPU, 0 where the target is `ignore_index`.

    Logits are upcast to float32 before the softmax: bf16 log-probabilities lose about two digits.
    """
    device = model_device(model)
    with evaluation_mode(model):
        logits_BTV = model(input_ids_BT.to(device))
    if logits_BTV.shape[:2] != input_ids_BT.shape:
        raise ValueError(f"model returned logits of shape {tuple(logits_BTV.shape)} for input of shape "
                         f"{tuple(input_ids_BT.shape)}; expected (B, T, V)")
    nll_BT = F.cross_entropy(logits_BTV.float().transpose(1, 2), targets_BT.to(device), ignore_index=ignore_index,
                             reduction="none")
    return nll_BT.cpu().double()


def sequence_nll(model: nn.Module, input_ids_BT: Tensor, targets_BT: Tensor,
                 ignore_index: int = IGNORE_INDEX) -> tuple[float, int]:
    """Summed NLL (nats) over the targets that are not `ignore_index`, and how many there were."""
    nll_BT = token_nll(model, input_ids_BT, targets_BT, ignore_index)
    return nll_BT.sum().item(), int((targets_BT != ignore_index).sum())


def _batches(windows: Windows, batch_size: int) -> Iterator[tuple[Tensor, Tensor]]:
    """(input_ids_BT, targets_BT) batches of at most `batch_size` rows from either accepted window format."""
    if isinstance(windows, Tensor):
        if windows.dim() != 2 or windows.size(1) < 2:
            raise ValueError(f"a window tensor must be (N, T+1) with T >= 1, got shape {tuple(windows.shape)}")
        for windows_BT1 in windows.split(batch_size):
            yield windows_BT1[:, :-1], windows_BT1[:, 1:]
        return
    for input_ids, targets in windows:
        input_ids_BT = input_ids.unsqueeze(0) if input_ids.dim() == 1 else input_ids
        targets_BT = targets.unsqueeze(0) if targets.dim() == 1 else targets
        yield from zip(input_ids_BT.split(batch_size), targets_BT.split(batch_size))


def perplexity(model: nn.Module, windows: Windows, batch_size: int = 16) -> float:
    """exp(mean NLL per scored token) over all windows (either `Windows` format; IGNORE_INDEX targets skipped), at
    most `batch_size` rows a forward pass."""
    total_nll, n_tokens = 0.0, 0
    for input_ids_BT, targets_BT in _batches(windows, batch_size):
        batch_nll, batch_tokens = sequence_nll(model, input_ids_BT, targets_BT)
        total_nll += batch_nll
        n_tokens += batch_tokens
    if n_tokens == 0:
        raise ValueError("perplexity: the windows contain no token to score")
    return math.exp(total_nll / n_tokens)


def window_nlls(model: nn.Module, windows_NT1: Tensor, batch_size: int = 16) -> tuple[Tensor, Tensor]:
    """Per window of an (N, T+1) window tensor: the NLL of each of its targets (N, T) (nats, float64, 0 where
    ignored) and its number of scored tokens (N,); any subset's perplexity (`perplexity_of`) and bits per byte
    (`bits_per_byte_of`) follow without running the model again."""
    nlls, token_counts = [], []
    for input_ids_BT, targets_BT in _batches(windows_NT1, batch_size):
        nlls.append(token_nll(model, input_ids_BT, targets_BT))
        token_counts.append((targets_BT != IGNORE_INDEX).sum(dim=1))
    return torch.cat(nlls), torch.cat(token_counts)


def perplexity_of(nll_NT: Tensor, tokens_N: Tensor) -> float:
    """exp(mean NLL per scored token) over windows whose `window_nlls` these are."""
    n_tokens = int(tokens_N.sum())
    if n_tokens == 0:
        raise ValueError("perplexity: the windows contain no token to score")
    return math.exp(nll_NT.sum().item() / n_tokens)


def bits_per_byte_of(nll_NT: Tensor, targets_NT: Tensor, bytes_per_token_V: Tensor) -> float:
    """Bits per UTF-8 byte of the targets' text: the NLL (nats) of the targets that are text over ln 2 x their bytes
    (`bytes_per_token_V`: gatelab.data.tokenizer.bytes_per_token), which keeps the tokenizer out of a comparison.

    A special token (BOS, EOS: 0 bytes) is no text: its NLL is left out as its bytes are, as nanochat's evaluate_bpb
    leaves it out.
    """
    scored_NT = targets_NT != IGNORE_INDEX
    bytes_NT = torch.where(scored_NT, bytes_per_token_V[targets_NT.clamp(min=0)], 0)
    n_bytes = int(bytes_NT.sum())
    if n_bytes == 0:
        raise ValueError("bits per byte: the windows contain no text to score")
    return nll_NT[bytes_NT > 0].sum().item() / (math.log(2) * n_bytes)


def domain_window_nlls(model: nn.Module, windows_by_domain: Mapping[str, Tensor],
                       batch_size: int = 16) -> dict[str, tuple[Tensor, Tensor]]:
    """`window_nlls` of each held-out domain's windows."""
    if not windows_by_domain:
        raise ValueError("domain_perplexities: no domain given")
    if "avg" in windows_by_domain:
        raise ValueError('domain_perplexities: "avg" is reserved for the mean over domains; rename that domain')
    return {domain: window_nlls(model, windows, batch_size) for domain, windows in windows_by_domain.items()}


def perplexities_by_domain(nlls_by_domain: Mapping[str, tuple[Tensor, Tensor]]) -> dict[str, float]:
    """Perplexity per domain from `domain_window_nlls`, plus "avg", the arithmetic mean of the domain PPLs.

    The paper's "Avg PPL" is the mean over its held-out sets (English, Chinese, Code, Math, Law, Literature), not the
    PPL of the pooled tokens, so a small domain weighs as much as a large one.
    """
    return _with_mean({domain: perplexity_of(*nlls) for domain, nlls in nlls_by_domain.items()})


def bits_per_byte_by_domain(nlls_by_domain: Mapping[str, tuple[Tensor, Tensor]],
                            windows_by_domain: Mapping[str, Tensor], bytes_per_token_V: Tensor) -> dict[str, float]:
    """Bits per byte per domain from `domain_window_nlls` of these (N, T+1) windows, plus "avg", the arithmetic mean
    of the domain values: the mean over domains, as "avg" of `perplexities_by_domain` is."""
    return _with_mean({domain: bits_per_byte_of(nll_NT, windows_by_domain[domain][:, 1:], bytes_per_token_V)
                       for domain, (nll_NT, _) in nlls_by_domain.items()})


def _with_mean(by_domain: dict[str, float]) -> dict[str, float]:
    return by_domain | {"avg": sum(by_domain.values()) / len(by_domain)}


def domain_perplexities(model: nn.Module, windows_by_domain: Mapping[str, Tensor],
                        batch_size: int = 16) -> dict[str, float]:
    """`perplexities_by_domain` of each held-out domain's (N, T+1) windows."""
    return perplexities_by_domain(domain_window_nlls(model, windows_by_domain, batch_size))


def long_context_perplexity(model: nn.Module, documents: Sequence[Tensor], train_seq_len: int,
                            multipliers: Sequence[int] = (1, 2, 4, 8),
                            batch_size: int = 1) -> dict[int, dict[str, float | None] | None]:
    """How a model extrapolates past its training length: per multiplier m, over every document's non-overlapping
    windows of m * train_seq_len + 1 tokens from its start, "ppl" of all their predicted positions and
    "ppl_beyond_train_len" of those at input positions >= train_seq_len (None at m = 1); None where no document is that
    long. `batch_size` counts windows of the training length, so every m runs about as many tokens a forward pass."""
    results: dict[int, dict[str, float | None] | None] = {}
    for multiplier in multipliers:
        if multiplier < 1:
            raise ValueError(f"long_context_perplexity: multipliers must be >= 1, got {multiplier}")
        window_len = multiplier * train_seq_len + 1
        windows = [doc[: (len(doc) // window_len) * window_len].reshape(-1, window_len)
                   for doc in documents if len(doc) >= window_len]
        if not windows:
            results[multiplier] = None
            continue
        windows_NL = torch.cat(windows)
        total_nll, beyond_nll = 0.0, 0.0
        for windows_BL in windows_NL.split(max(1, batch_size // multiplier)):
            nll_BT = token_nll(model, windows_BL[:, :-1], windows_BL[:, 1:])
            total_nll += nll_BT.sum().item()
            beyond_nll += nll_BT[:, train_seq_len:].sum().item()
        n_windows = windows_NL.size(0)
        n_beyond = n_windows * (multiplier - 1) * train_seq_len
        results[multiplier] = {"ppl": math.exp(total_nll / (n_windows * multiplier * train_seq_len)),
                               "ppl_beyond_train_len": math.exp(beyond_nll / n_beyond) if n_beyond else None}
    return results
