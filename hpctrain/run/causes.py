"""The run protocol's words: why a checkpoint was saved, why a life ended, what happens next.

One vocabulary from the signal to the journal: a signal becomes a StopReason in the trainer,
the checkpoint records it, the control step turns it into a Cause, and the Cause picks the
restart budget. Every value is the string written in events.jsonl (str enums compare equal to
those strings, so readers of the JSON need no conversion). STOP_TABLE, at the end, is every
translation of a stop in one place: its signal, urgency, deadline, exit code and cause.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

from hpctrain.run.exitcodes import WORKER_SAVED_AND_STOPPED, WORKER_SAVED_FOR_TIMELIMIT

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
        return STOP_TABLE[self].urgency

    @property
    def checkpoint_reason(self) -> CheckpointReason:
        """The reason of the save this stop forces (the same word)."""
        return CheckpointReason(self.value)


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
    # The step's srun started no task (slurmctld away, or the step refused): nothing of the run
    # failed; launched again, charged to no budget (hpctrain.run.launch_marks).
    LAUNCH = "launch"
    # Lives in a row (slurm.no_progress_lives) ended by a failure without a checkpoint newer than
    # any before them: a crash at every resume, a hang then a crash. The run stops; nothing retries.
    NO_PROGRESS = "no_progress"
    # A node failed one of its checks at the start of a life (slurm.health, hpctrain.process.node_health):
    # the failure names it, the check and what it found; the life is charged to node_failure.
    NODE_HEALTH = "node_health"
    # A training node drained by an administrator, left for a free spare at a step boundary after
    # a forced save (hpctrain.recovery.drain_watch): no step redone, charged to no budget.
    DRAIN = "drain"
    # A training node whose rank the straggler watch named, left for a free spare at a step
    # boundary after a forced save (trainer.straggler_action=relaunch,
    # hpctrain.recovery.straggler_move): no step redone, charged to no budget.
    STRAGGLER = "straggler"


# Causes that restart the job, each with its own budget (slurm.restart_budget.<cause>).
RESTART_CAUSES = (Cause.PREEMPT, Cause.TIMELIMIT, Cause.NODE_FAILURE, Cause.CRASH, Cause.HANG)


class Action(Word):
    """What happens next to a run, as hpctrain.recovery.decide decides it. After a training step
    it is the first word of the answer line the batch script reads (the template is rendered with
    these words: hpctrain.run.protocol); a `failure` event's `action` holds one too."""

    FINISH = "finish"  # the run is done: exit 0
    REQUEUE = "requeue"  # scontrol requeue (excluding nodes); falls back to sbatch if refused
    RELAUNCH = "relaunch"  # srun again at once on the nodes left, excluding some
    STOP = "stop"  # scancel'ed: the job ends as Slurm cancels it
    FAIL = "fail"  # cannot go on (a budget, a user's mistake): exit non-zero, FAILED
    # The run goes on in a new job: the run dir's job.sbatch submitted again (a refused requeue,
    # a lost batch host); this job ends.
    RESUBMIT = "resubmit"
    # `control begin`: nothing stands in the way, the batch script launches its training step.
    LAUNCH = "launch"


# ---- a stop, from the signal to the exit ------------------------------------------------------


class Grace(Word):
    """What bounds a stop's forced save (hpctrain.checkpoint.deadline.deadline_s)."""

    SIGNAL_DELAY = "signal_delay"  # the time-limit warning's head start: slurm.signal_delay_s
    SIGTERM = "sigterm"  # Slurm's GraceTime or KillWait (hpctrain.checkpoint.deadline.sigterm_s)
    NONE = "none"  # nobody kills the process after it: the save takes what it takes


@dataclass(frozen=True)
class StopRow:
    """What each part of hpctrain makes of one StopReason (its CheckpointReason is the same word)."""

    signal: str | None  # the signal's name without SIG; None: slurm.signal, the time-limit warning
    urgency: int  # ranks that saw different signals agree on the largest (hpctrain.trainer.stop_vote)
    grace: Grace  # the time its forced save has
    exit_code: int  # the training process's after the save (hpctrain.run.exitcodes)
    cause: Cause  # what the control step charges the life to (its restart budget)


# The signal handler (hpctrain.process.signals) -> the ranks' vote (hpctrain.trainer.stop_vote) ->
# the forced save (hpctrain.trainer.stopping) -> the exit (hpctrain.process.life) -> the control
# step's cause (hpctrain.recovery.judge.classify).
STOP_TABLE: dict[StopReason, StopRow] = {
    StopReason.TIMELIMIT: StopRow(None, 1, Grace.SIGNAL_DELAY, WORKER_SAVED_FOR_TIMELIMIT, Cause.TIMELIMIT),
    # SIGTERM: Slurm's preemption (scancel and an admin's requeue too: the control step tells them apart)
    StopReason.PREEMPT: StopRow("TERM", 2, Grace.SIGTERM, WORKER_SAVED_AND_STOPPED, Cause.PREEMPT),
    StopReason.INTERRUPT: StopRow("INT", 3, Grace.NONE, WORKER_SAVED_AND_STOPPED, Cause.PREEMPT),
}


def stop_of_urgency(urgency: int) -> StopReason | None:
    """The stop whose urgency the ranks agreed on (0, none: None)."""
    return next((reason for reason, row in STOP_TABLE.items() if row.urgency == urgency), None)


def stop_cause(saved: StopReason | None, exit_code: int | None) -> Cause | None:
    """What a life that ended by a stop is charged to, from the stop its ranks saved for (`saved`)
    or the exit code its training process left with after the save: the time limit's first (the
    allocation ends soon, whatever else happened), then a preemption's; None: no stop."""
    causes = {row.cause for reason, row in STOP_TABLE.items() if reason is saved or row.exit_code == exit_code}
    return next((cause for cause in (Cause.TIMELIMIT, Cause.PREEMPT) if cause in causes), None)


def signal_of(reason: StopReason, timelimit_signal: str) -> int:
    """The signal number that asks for `reason`; `timelimit_signal` is slurm.signal (no SIG)."""
    return int(getattr(signal, f"SIG{STOP_TABLE[reason].signal or timelimit_signal}"))
