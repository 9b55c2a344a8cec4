"""The last look before the batch script asks Slurm for its requeue, as a pure function.

The control step ignores SIGTERM from the decision to requeue on (Slurm's own requeue sends one,
and ExcNodeList must still be set). So a scancel, an administrator's requeue or a preemption's
requeue that came meanwhile is only seen in the job's record (`scontrol show job`), read just
before asking. hpctrain.recovery.decide.decide_requeue reads it, the control step acts;
tests/test_before_requeue.py is the table, on records captured on the dev cluster.
"""

from __future__ import annotations

from enum import Enum


class BeforeRequeue(Enum):
    ASK = "ask"  # nothing came in between: ask for the requeue
    REQUEUED_ALREADY = "requeued_already"  # Slurm counts a restart past this life's: nothing to ask
    CANCELLED = "cancelled"  # a scancel: record it, ask nothing


def before_requeue(restarts: int | None, being_ended: bool, restart: int) -> BeforeRequeue:
    """From the job record (`restarts`: Slurm's Restarts, None without a record; `being_ended`:
    COMPLETING or CANCELLED, not for its time limit) and this life's `restart` number.

    A requeue in progress also shows COMPLETING, but counts a restart more, so the restart count
    is looked at first. Slurm 22.05 grants the requeue of a job being cancelled (Restarts=1,
    PENDING): asking then would bring a job the user cancelled back."""
    if restarts is not None and restarts > restart:
        return BeforeRequeue.REQUEUED_ALREADY
    if being_ended:
        return BeforeRequeue.CANCELLED
    return BeforeRequeue.ASK
