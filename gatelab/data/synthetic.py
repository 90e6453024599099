"""Bigram-Backcopy (BB, Guo et al. 2024, "Active-Dormant Attention Heads", arXiv 2410.13835), generated in memory.

Sequence: BOS, then x1 from the stationary distribution of the bigram chain P restricted to non-trigger tokens, then for
t >= 1: x_{t+1} = x_{t-1} when x_t is a trigger (backcopy), else x_{t+1} ~ P(. | x_t). Two triggers never follow each
other (by induction from x1, which is not one: a token after a trigger is a copy of the token before it), so a copied
token is never a trigger. Only a query whose token is a trigger needs another position; elsewhere a head has nothing to
read, and sinks onto BOS.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gatelab.config import BigramBackcopyConfig
from gatelab.data.datasets import TokenCorpus, TokenSplit
from gatelab.data.shards import token_dtype

DOMAIN = "bigram_backcopy"
BOS, EOS, FIRST_ORDINARY = 0, 1, 2


def _stationary(transitions_NN: np.ndarray) -> np.ndarray:
    """The left eigenvector of eigenvalue 1 (unique: Dirichlet rows are positive almost surely, so the chain is
    ergodic)."""
    values, vectors = np.linalg.eig(transitions_NN.T)
    pi_N = np.abs(np.real(vectors[:, np.argmin(np.abs(values - 1))]))
    return pi_N / pi_N.sum()


@dataclass(frozen=True)
class BigramBackcopy:
    """The task's chain, in token ids: N = vocab_size - 2 ordinary tokens, id = FIRST_ORDINARY + ordinary index."""

    config: BigramBackcopyConfig
    vocab_size: int
    transitions_NN: np.ndarray  # P(next | current), rows over the ordinary tokens
    stationary_N: np.ndarray
    trigger_ids: np.ndarray  # sorted token ids

    @classmethod
    def from_config(cls, config: BigramBackcopyConfig, vocab_size: int) -> BigramBackcopy:
        n = vocab_size - FIRST_ORDINARY
        rng = np.random.default_rng(np.random.SeedSequence(config.data_seed).spawn(3)[0])  # train, heldout: [1], [2]
        zipf_N = 1.0 / np.arange(1, n + 1) ** config.zipf_exponent  # the expected row: ordinary token i has rank i + 1
        transitions_NN = rng.dirichlet(config.concentration * n * zipf_N / zipf_N.sum(), size=n)
        stationary_N = _stationary(transitions_NN)
        triggers = np.argsort(-stationary_N, kind="stable")[: config.n_triggers]
        return cls(config, vocab_size, transitions_NN, stationary_N, np.sort(triggers) + FIRST_ORDINARY)

    @property
    def is_trigger_V(self) -> np.ndarray:
        """Boolean over every token id (BOS and EOS are not triggers)."""
        mask_V = np.zeros(self.vocab_size, dtype=bool)
        mask_V[self.trigger_ids] = True
        return mask_V

    @property
    def row_entropy_V(self) -> np.ndarray:
        """H(P(. | id)) in nats for every ordinary id (0 for BOS and EOS): the optimal loss after that token."""
        p_NN = self.transitions_NN
        entropy_N = -np.sum(p_NN * np.log(np.where(p_NN > 0, p_NN, 1.0)), axis=1)
        return np.concatenate([np.zeros(FIRST_ORDINARY), entropy_N])

    @property
    def entropy_rate(self) -> float:
        """sum_i pi_i H(P_i) in nats, the chain's entropy rate: about the best achievable loss on bigram positions
        (those are visited in proportions a little off pi: the triggers' rows are never used)."""
        return float(self.stationary_N @ self.row_entropy_V[FIRST_ORDINARY:])

    def sample(self, n_sequences: int, length: int, rng: np.random.Generator) -> np.ndarray:
        """(n_sequences, length) token ids, int64, vectorised over sequences one position at a time."""
        ids_SL = np.full((n_sequences, length), BOS, dtype=np.int64)
        is_trigger_V = self.is_trigger_V
        start_N = np.where(is_trigger_V[FIRST_ORDINARY:], 0.0, self.stationary_N)
        cdf_NN = np.cumsum(self.transitions_NN, axis=1)
        if length > 1:
            ids_SL[:, 1] = rng.choice(len(start_N), size=n_sequences, p=start_N / start_N.sum()) + FIRST_ORDINARY
        for t in range(1, length - 1):
            current_S = ids_SL[:, t] - FIRST_ORDINARY
            u_S = rng.random(n_sequences)
            drawn_S = np.minimum((u_S[:, None] > cdf_NN[current_S]).sum(axis=1), len(cdf_NN) - 1)  # inverse CDF
            ids_SL[:, t + 1] = np.where(is_trigger_V[ids_SL[:, t]], ids_SL[:, t - 1], drawn_S + FIRST_ORDINARY)
        return ids_SL

    def corpus(self, seq_len: int) -> TokenCorpus:
        """One domain, DOMAIN, whose sequences are all `seq_len + 1` tokens (`window_tokens`): the training windows
        of `train_dataset`, and heldout_windows', are whole sequences.

        Not `seq_len`-token sequences under the default stride: every window's last target would then be the next
        sequence's BOS, and the model learns to predict BOS at position seq_len - 1 (measured: 0.01 nats there on
        train windows after 600 steps, and 8.5 nats on the held-out sequences' real token there). Train and held-out
        draw from their own random streams: changing one count leaves the other split unchanged.
        """
        streams = np.random.SeedSequence(self.config.data_seed).spawn(3)
        length, splits = seq_len + 1, {}
        for split, count, stream in (("train", self.config.train_sequences, streams[1]),
                                     ("heldout", self.config.heldout_sequences, streams[2])):
            ids_SL = self.sample(count, length, np.random.default_rng(stream))
            splits[(DOMAIN, split)] = TokenSplit(
                DOMAIN, split, ids_SL.reshape(-1).astype(token_dtype(self.vocab_size)),
                np.arange(count + 1, dtype=np.int64) * length, tuple(f"{split}-{i}" for i in range(count)))
        return TokenCorpus(Path(f"<{DOMAIN} data_seed={self.config.data_seed}, in memory>"), self.vocab_size, BOS, EOS,
                           splits, window_tokens=length)
