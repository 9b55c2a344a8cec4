"""Learning-rate schedules, stepped once per optimizer step."""

from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import LambdaLR


def warmup_cosine(
    optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int = 0, min_lr_ratio: float = 0.1
) -> LambdaLR:
    """Linear warmup over `warmup_steps`, then cosine decay to `min_lr_ratio` x the base lr at
    `total_steps` (hpctrain passes the run's total optimizer steps)."""
    if warmup_steps < 0:
        raise ValueError(f"sched.warmup_steps must be >= 0 (got {warmup_steps})")
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise ValueError(f"sched.min_lr_ratio must be in [0, 1] (got {min_lr_ratio})")

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        span = max(1, total_steps - warmup_steps)
        progress = min(1.0, (step - warmup_steps) / span)
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return LambdaLR(optimizer, factor)
