"""How often the in-memory tier copies: the fewest steps between copies for which a copy costs
at most `trainer.memory_ckpt_overhead` of the training time, never fewer than
`trainer.memory_ckpt_every`.

A copy's cost is the CPU it takes: the host copy training waits for, its sending thread's
(serializing, checksumming, the socket) and the holders' (receiving and checking it, reported in
their answers), which on nodes whose cores the training processes keep busy comes out of
training too. On a GPU node the training thread mostly
waits on the device and a copy every step is cheap; on CPU, a copy of a small model costs a good
share of a step. So the ranks measure both, and every AGREE_EVERY steps (the first time
AGREE_FIRST steps into the life) they agree on one interval (an all-gather of a few numbers): the
widest any rank needs, so every rank copies at the same steps (a restore needs one step every
rank copied). A rank whose node cannot hold the copies (hpctrain.checkpoint.memory_tier) turns the
tier off for all. Pure functions: tests/test_memory_interval.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

AGREE_FIRST = 20  # steps into a life: the first steps (compiling, warming caches) are not typical
AGREE_EVERY = 200
MAX_INTERVAL = 10_000


@dataclass(frozen=True)
class Measured:
    """One rank's view at an agreement: whether its node can hold the copies (None: not asked
    yet), a copy's cost and a step's time in seconds (0: not measured yet)."""

    fits: bool | None
    copy_s: float
    step_s: float


def widened(copy_s: float, step_s: float, overhead: float, minimum: int) -> int:
    """The fewest steps between copies (at least `minimum`) for which copy_s is at most
    `overhead` of their time; `minimum` when either is unmeasured or overhead is 0."""
    if overhead <= 0 or copy_s <= 0 or step_s <= 0:
        return minimum
    return min(MAX_INTERVAL, max(minimum, math.ceil(copy_s / (overhead * step_s))))


def agreed(views: Sequence[Measured], overhead: float, minimum: int) -> int:
    """The interval every rank copies at from now on: 0 (off) when a rank's node cannot hold the
    copies, else the widest interval any rank needs."""
    if any(view.fits is False for view in views):
        return 0
    return max((widened(v.copy_s, v.step_s, overhead, minimum) for v in views), default=minimum)


def agrees_at(step: int, first_step: int) -> bool:
    """Whether the ranks agree on the interval after `step` of a life whose first step was `first_step`."""
    into = step - first_step + 1
    return into >= AGREE_FIRST and (into - AGREE_FIRST) % AGREE_EVERY == 0
