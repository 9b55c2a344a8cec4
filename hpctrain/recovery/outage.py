"""Waiting out slurmctld: how long, and the asking again with growing pauses.

A control step that gets no answer from slurmctld (a failover, an upgrade, a database restart, a
network blip) never decides on that silence: a requeue without answer is asked again, and a step
whose srun started no task waits for Slurm before it is launched again. Both wait here, until
shortly before the job's time limit (slurmctld back by then ends the job itself); the deadline
and the pauses are one policy, in one place.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Protocol, TypeVar

from hpctrain.slurm.times import time_limit_s

# Pauses growing from the first to the longest, until this long before the job's time limit, and
# never longer than OUTAGE_LONGEST_S in one control step.
OUTAGE_FIRST_PAUSE_S = 5.0
OUTAGE_LONGEST_PAUSE_S = 60.0
OUTAGE_END_MARGIN_S = 30.0
OUTAGE_LONGEST_S = 7 * 24 * 3600.0

_T = TypeVar("_T")


class Renewable(Protocol):
    def renew(self, seconds: float) -> None: ...


def deadline(allocated_at: float | None, time_limit: str, wait_s: float) -> float:
    """How long (monotonic) an outage is waited out: until shortly before this job's time limit
    (when Slurm started it, `allocated_at`, plus slurm.time), however long slurmctld is away; at
    least `wait_s`. Unknown start or limit: `wait_s`."""
    limit = time_limit_s(time_limit)
    now = time.monotonic()
    if allocated_at is None or limit is None:
        return now + wait_s
    left = allocated_at + limit - OUTAGE_END_MARGIN_S - time.time()
    return now + max(wait_s, min(left, OUTAGE_LONGEST_S))


def until_answered(
    ask: Callable[[], tuple[bool, _T]], within: Renewable, until: float, wait_s: float, doing: str
) -> tuple[_T, float]:
    """`ask` (done, what it got) again, with pauses growing from OUTAGE_FIRST_PAUSE_S, until it is
    done or `until` (monotonic); each ask within `wait_s` of Slurm calls (`within` renewed).
    (What it got last, seconds waited.)"""
    began = time.monotonic()
    pause = OUTAGE_FIRST_PAUSE_S
    while True:
        within.renew(min(wait_s, max(1.0, until - time.monotonic())))
        done, got = ask()
        if done or time.monotonic() + pause >= until:
            return got, time.monotonic() - began
        print(
            f"hpctrain: slurmctld still gives no answer after {time.monotonic() - began:.0f} s; {doing} "
            f"in {pause:g} s (for up to {until - time.monotonic():.0f} s more, until the job's time limit)",
            file=sys.stderr,
            flush=True,
        )
        time.sleep(pause)
        pause = min(pause * 2, OUTAGE_LONGEST_PAUSE_S)
