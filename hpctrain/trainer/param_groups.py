"""Optimizers that get the model's parameters by name, and the usual weight-decay rule.

An `optim._target_` whose first parameter is named `named_parameters` is given the model's
`(name, parameter)` pairs instead of the bare parameters (components.build), so a factory of the
user's own can group them by name. `adamw` is such a factory with the rule nanoGPT, Hugging
Face's Trainer and timm use: no weight decay for biases and normalization weights (every
parameter of fewer than two dimensions) nor, by name, for embeddings listed in `no_decay`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import nn


def split_by_decay(
    named_parameters: Iterable[tuple[str, nn.Parameter]], no_decay: Sequence[str] = ()
) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """(decayed, not decayed): matrices and embeddings decay; biases, norm weights, and any
    parameter whose name contains one of `no_decay`, do not. Parameters not trained are left out."""
    decayed, kept = [], []
    for name, parameter in named_parameters:
        if not parameter.requires_grad:
            continue
        if parameter.dim() < 2 or any(part in name for part in no_decay):
            kept.append(parameter)
        else:
            decayed.append(parameter)
    return decayed, kept


def adamw(
    named_parameters: Iterable[tuple[str, nn.Parameter]],
    lr: float = 1e-3,
    betas: Sequence[float] = (0.9, 0.999),
    weight_decay: float = 0.01,
    eps: float = 1e-8,
    no_decay: Sequence[str] = (),
) -> torch.optim.AdamW:
    """torch.optim.AdamW with two groups: `weight_decay` for matrices, none for biases and norms."""
    decayed, kept = split_by_decay(named_parameters, no_decay)
    groups = [{"params": decayed, "weight_decay": weight_decay}, {"params": kept, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(float(betas[0]), float(betas[1])), eps=eps)
