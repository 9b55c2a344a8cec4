"""Which ranks are stragglers: persistently slower than their peers at work that waits on no one.

A slow rank slows every step of the job (its peers wait for it in the gradient all-reduce), so a
step's wall time is the same on every rank and names no one. What differs is the work before the
first collective of a step: the forward passes and the losses of its micro-batches. Each rank times
that (hpctrain.trainer.step), and every `window` steps the ranks gather their window's time (the
mean of its steps, the slowest one left out: one small all-gather); a rank whose time is over
`threshold` times its peers' median (the other ranks') in two windows in a row is a straggler.
A mean, not a median: a rank slowed part of the time (throttled in bursts, sharing its cores,
stopped for part of every 100 ms) finishes many steps untouched and the rest much later, and
the median of such steps hides it. Leaving the slowest out, and the two windows, keep one slow
step (a first step that compiles) from flagging anyone; an evaluation is not timed at all, nor a
step while the rank's own checkpoint is written in the background (the writer thread takes the
interpreter's lock from the training thread: in a loaded test suite that made rank 0 1.6x slow
for two windows); a rank with too few steps timed is not judged in that window.

An episode is journaled once: `straggler` when ranks become slow, `straggler_cleared` when they are
no longer. The functions here are pure: tests/test_stragglers.py is their table.
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

# Below this many seconds a step more than its peers, no rank is a straggler whatever the ratio:
# steps of a few milliseconds (a small model on CPU) vary by more than 30% from the scheduler's
# whims alone, and a rank that loses half a millisecond a step slows no one measurably.
MIN_EXCESS_S = 0.005


def slowdowns(
    times: Sequence[float | None],
    threshold: float,
    min_excess_s: float = MIN_EXCESS_S,
    queued: Sequence[float] | None = None,
) -> dict[int, float]:
    """The ranks (index into `times`, one per rank) slower than `threshold` times the median of
    their peers, and by at least `min_excess_s`, with their time over that median. A rank whose
    time is None (it timed too few steps of the window: it was writing a checkpoint) is neither
    judged nor a peer; one rank alone has no peers: none.

    `queued`: each rank's seconds a step that its other threads (torch's intra-op workers) waited
    for a core. What a rank's threads waited beyond the least waiting rank's is taken off its time
    before it is judged (its peers' times as they are): a machine running more threads than it has
    cores slows whichever rank's workers it leaves waiting, and that is the machine's load, not the
    rank's node."""
    known = {rank: t for rank, t in enumerate(times) if t is not None}
    found: dict[int, float] = {}
    if len(known) < 2:
        return found
    least = min(queued[rank] for rank in known) if queued is not None else 0.0
    for rank, time in known.items():
        own = time - (queued[rank] - least if queued is not None else 0.0)
        peers = statistics.median([t for other, t in known.items() if other != rank])
        if peers > 0 and own > threshold * peers and own - peers >= min_excess_s:
            found[rank] = round(own / peers, 3)
    return found


@dataclass
class Episodes:
    """The ranks named slow so far: what to journal as a window's verdicts come in. A rank is
    named once it is slow in `windows` windows in a row (persistently: a rank that lost its core
    to another process for one window is no straggler), and cleared at its first window that is
    not slow."""

    windows: int = 2
    named: set[int] = field(default_factory=set)
    slow_for: dict[int, int] = field(default_factory=dict)  # rank -> windows in a row it was slow

    def update(self, slow: dict[int, float], unjudged: Collection[int] = ()) -> tuple[dict[int, float], list[int]]:
        """(ranks that became slow, with their slowdown; ranks no longer slow) for this window.
        A rank `unjudged` this window (too few of its steps timed) is as it was: neither a window
        more nor a window less of its slowness."""
        kept = {rank: self.slow_for[rank] for rank in unjudged if rank in self.slow_for}
        self.slow_for = {rank: self.slow_for.get(rank, 0) + 1 for rank in slow} | kept
        began = {rank: x for rank, x in slow.items() if rank not in self.named and self.slow_for[rank] >= self.windows}
        ended = sorted(self.named - set(slow) - set(unjudged))
        self.named = (self.named & (set(slow) | set(unjudged))) | set(began)
        return began, ended


def window_time(times: Sequence[float], fewest: int = 1) -> float | None:
    """A rank's time for a window: the mean of its steps' own work, the slowest step left out;
    None for fewer than `fewest` steps timed (too few to say)."""
    if len(times) < max(1, fewest):
        return None
    kept = sorted(times)[:-1] if len(times) > 2 else list(times)
    return statistics.fmean(kept)
