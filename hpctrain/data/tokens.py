"""Deterministic synthetic token sequences for language-model smoke tests and benchmarks.

Sequences are sampled from a fixed random sparse Markov chain: every token has a few likely
successors (drawn once from `seed`) with geometrically decreasing probabilities. Unlike uniform
random tokens this is learnable: the best achievable next-token loss is the chain's entropy
(about 1.1 nats with 4 successors) against log(vocab_size) for a model that learned nothing, so a
falling loss curve proves that the training loop works end to end.

Generation is vectorized across sequences (one step per position), so 4096 sequences of 129
tokens take a few milliseconds. Train and eval come from independent random streams of the same
chain, derived from `seed` alone, so the eval set does not change with `num_train`.
"""

from __future__ import annotations

import logging

import numpy as np
import torch
from torch.utils.data import TensorDataset

from hpctrain.data.splits import Splits

log = logging.getLogger(__name__)

# Successors per token; their probabilities are proportional to 2^-i (8/15, 4/15, 2/15, 1/15).
_BRANCHING = 4


def _generators(seed: int) -> tuple[torch.Generator, torch.Generator, torch.Generator]:
    """Independent generators for the chain, the train stream and the eval stream.

    SeedSequence.spawn gives statistically independent child seeds, so seed=0's train stream
    is not seed=1's chain (which naive `seed + 1` offsets would give).
    """
    children = np.random.SeedSequence(seed).spawn(3)
    return tuple(  # type: ignore[return-value]
        torch.Generator().manual_seed(int(c.generate_state(1, dtype=np.uint64)[0] >> 1)) for c in children
    )


def _sample(
    successors: torch.Tensor, cum_probs: torch.Tensor, n: int, length: int, gen: torch.Generator
) -> torch.Tensor:
    """Sample `n` chains of `length` tokens; returns int64 [n, length]."""
    vocab_size = successors.shape[0]
    seqs = torch.empty(n, length, dtype=torch.int64)
    seqs[:, 0] = torch.randint(vocab_size, (n,), generator=gen)
    # Inverse-CDF sampling with uniform draws: bit-stable across versions, unlike multinomial.
    u = torch.rand(n, length - 1, generator=gen)
    choice = torch.searchsorted(cum_probs, u, right=True).clamp_(max=successors.shape[1] - 1)
    for t in range(1, length):
        seqs[:, t] = successors[seqs[:, t - 1], choice[:, t - 1]]
    return seqs


def synthetic_tokens(
    vocab_size: int = 512,
    seq_len: int = 128,
    num_train: int = 4096,
    num_eval: int = 256,
    seed: int = 0,
) -> Splits:
    """Return `Splits` of `(x, y)` int64 pairs of length `seq_len`, with y = x shifted by one.

    Args:
        vocab_size: number of distinct tokens, >= 2.
        seq_len: tokens per input (each item is drawn from a chain of seq_len + 1 tokens).
        num_train: train sequences, >= 1.
        num_eval: eval sequences, >= 1.
        seed: fixes the chain and both streams; the same arguments give identical tensors.
    """
    for name, value, low in (
        ("vocab_size", vocab_size, 2),
        ("seq_len", seq_len, 1),
        ("num_train", num_train, 1),
        ("num_eval", num_eval, 1),
    ):
        if value < low:
            raise ValueError(f"{name} (got {value}) must be >= {low}")

    chain_gen, train_gen, eval_gen = _generators(seed)
    # Successors may repeat for a token; that only merges their probabilities, which is harmless.
    successors = torch.randint(vocab_size, (vocab_size, _BRANCHING), generator=chain_gen)
    probs = torch.pow(2.0, -torch.arange(_BRANCHING, dtype=torch.float64))
    cum_probs = (probs.cumsum(0) / probs.sum()).float()

    def split(n: int, gen: torch.Generator) -> TensorDataset:
        seqs = _sample(successors, cum_probs, n, seq_len + 1, gen)
        return TensorDataset(seqs[:, :-1].contiguous(), seqs[:, 1:].contiguous())

    log.debug(
        "synthetic_tokens: vocab=%d seq_len=%d train=%d eval=%d seed=%d",
        vocab_size,
        seq_len,
        num_train,
        num_eval,
        seed,
    )
    return Splits(train=split(num_train, train_gen), eval=split(num_eval, eval_gen), next_token=True)
