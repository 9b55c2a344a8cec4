"""The value every data factory returns: a train and an eval dataset.

A data factory is any callable, referenced from a config `_target_` node, that takes keyword
arguments and returns `Splits`. Keeping the split decision inside the factory (rather than in the
trainer) means the held-out set is a property of the dataset, fixed by its own seed, and never
depends on the world size or the training seed.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.utils.data import Dataset


@dataclass(frozen=True)
class Splits:
    """Train and eval datasets; each item is an `(input, target)` pair."""

    train: Dataset
    eval: Dataset
    # Targets are the inputs shifted by one token (a language model's data): a model that
    # shifts its `labels` itself is given the inputs (hpctrain.trainer.model_io).
    next_token: bool = False
