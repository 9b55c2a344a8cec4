"""The run protocol's words: why a checkpoint was saved, why a life ended, what happens next.

One vocabulary from the signal to the journal: a signal becomes a StopReason in the trainer,
the checkpoint records it, the control step turns it into a Cause, and the Cause picks the
restart budget. Every value is the string written in events.jsonl (str enums compare equal to
those strings, so readers of the JSON need no conversion).
"""

from __future__ import annotations

from enum import Enum
from typing import TypeVar

W = TypeVar("W", bound="Word")


class Word(str, Enum):
    """A str enum that prints as its word (Python 3.12 would print `Cause.CRASH` otherwise)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    @classmethod
    def read(cls: type[W], word: str) -> W:
        """A word as a journal holds it. One this hpctrain does not know (a newer hpctrain wrote
        it) reads as an unlisted member rather than failing the whole journal: it prints, equals
        and writes back as that word, and is none of the listed members."""
        try:
            return cls(word)
        except ValueError:
            unlisted = str.__new__(cls, word)
            unlisted._name_, unlisted._value_ = word.upper(), word
            return unlisted


class CheckpointReason(Word):
    PERIODIC = "periodic"
    TIMELIMIT = "timelimit"
    PREEMPT = "preempt"
    INTERRUPT = "interrupt"
    FINAL = "final"
    PRUNED = "pruned"  # hpctrain-tune's pruner stopped the trial at an evaluation step


class StopReason(Word):
    """Why the ranks agreed to stop after a signal (the save's CheckpointReason, same word)."""

    TIMELIMIT = "timelimit"  # the time-limit signal (slurm.signal, USR2 by default)
    PREEMPT = "preempt"  # SIGTERM: Slurm's preemption, or scancel
    INTERRUPT = "interrupt"  # Ctrl-C

    @property
    def urgency(self) -> int:
        """Ranks that saw different signals agree on the most urgent one (the largest)."""
        return _URGENCY[self]

    @property
    def checkpoint_reason(self) -> CheckpointReason:
        """The reason of the save this stop forces (the same word)."""
        return CheckpointReason(self.value)


_URGENCY = {StopReason.TIMELIMIT: 1, StopReason.PREEMPT: 2, StopReason.INTERRUPT: 3}


def stop_reason(reason: str) -> StopReason | None:
    """The stop signal a save answered, from its reason (a CheckpointReason or StopReason): None
    for a periodic, final or pruned save, or a word this hpctrain does not know."""
    try:
        return StopReason(str(reason))
    except ValueError:
        return None


class Cause(Word):
    """The `cause` of `requeue`, `relaunch` and `failure` events."""

    PREEMPT = "preempt"
    TIMELIMIT = "timelimit"
    NODE_FAILURE = "node_failure"
    CRASH = "crash"
    HANG = "hang"
    USER_ERROR = "user_error"  # a worker refused a value or file: never retried
    BUDGET = "budget"  # a restart budget is spent: the job ends
    REQUEUE_REFUSED = "requeue_refused"  # scontrol refused the requeue and sbatch the resubmission


# Causes that restart the job, each with its own budget (slurm.restart_budget.<cause>).
RESTART_CAUSES = (Cause.PREEMPT, Cause.TIMELIMIT, Cause.NODE_FAILURE, Cause.CRASH, Cause.HANG)


class Action(Word):
    """What the batch script does after a training step ended: the first word it reads."""

    FINISH = "finish"  # the run is done: exit 0
    REQUEUE = "requeue"  # scontrol requeue (excluding nodes); falls back to sbatch if refused
    RELAUNCH = "relaunch"  # srun again at once on the nodes left, excluding some
    STOP = "stop"  # scancel'ed: the job ends as Slurm cancels it
    FAIL = "fail"  # cannot go on (a budget, a user's mistake): exit non-zero, FAILED
