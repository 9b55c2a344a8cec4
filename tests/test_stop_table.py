"""hpctrain.run.causes.STOP_TABLE: every translation of a stop, from its signal to its cause, read
from the one table by the handler, the vote, the deadline, the exit and the control step."""

from __future__ import annotations

import signal

import pytest

from hpctrain.checkpoint.deadline import deadline_s
from hpctrain.process.signals import StopFlag
from hpctrain.run.causes import (
    STOP_TABLE,
    Cause,
    CheckpointReason,
    StopReason,
    signal_of,
    stop_cause,
    stop_of_urgency,
)
from hpctrain.run.exitcodes import WORKER_HUNG, WORKER_SAVED_AND_STOPPED, WORKER_SAVED_FOR_TIMELIMIT

# signal (slurm.signal=USR1), exit code, cause, deadline (signal_delay_s 120, SIGTERM gives 30, 5 s since)
ROWS = {
    StopReason.TIMELIMIT: (signal.SIGUSR1, WORKER_SAVED_FOR_TIMELIMIT, Cause.TIMELIMIT, 115.0),
    StopReason.PREEMPT: (signal.SIGTERM, WORKER_SAVED_AND_STOPPED, Cause.PREEMPT, 25.0),
    StopReason.INTERRUPT: (signal.SIGINT, WORKER_SAVED_AND_STOPPED, Cause.PREEMPT, None),
}


@pytest.mark.parametrize("reason", list(StopReason))
def test_each_stop_reads_its_row(reason: StopReason) -> None:
    signum, exit_code, cause, deadline = ROWS[reason]
    row = STOP_TABLE[reason]
    assert signal_of(reason, "USR1") == signum and StopFlag("USR1").signal_names[signum] is reason
    assert (row.exit_code, row.cause) == (exit_code, cause)
    assert deadline_s(reason, 5.0, 120.0, 30.0) == deadline
    assert reason.checkpoint_reason is CheckpointReason(reason.value)  # the save's word is the stop's
    assert stop_of_urgency(reason.urgency) is reason


def test_the_ranks_agree_on_the_most_urgent_stop() -> None:
    assert [r for r in sorted(StopReason, key=lambda r: r.urgency)] == [
        StopReason.TIMELIMIT,
        StopReason.PREEMPT,
        StopReason.INTERRUPT,
    ]
    assert stop_of_urgency(0) is None
    flag = StopFlag()
    flag.note(signal.SIGTERM, 2.0)
    flag.note(signal.SIGUSR2, 1.0)
    assert flag.agreed_alone() is StopReason.PREEMPT and flag.requested_at == 1.0


@pytest.mark.parametrize(
    "saved, exit_code, cause",
    [
        (None, None, None),
        (None, 1, None),
        (None, WORKER_HUNG, None),  # a hang is no stop: the control step tells it by its own record
        (StopReason.TIMELIMIT, None, Cause.TIMELIMIT),
        (None, WORKER_SAVED_FOR_TIMELIMIT, Cause.TIMELIMIT),
        (StopReason.PREEMPT, WORKER_SAVED_FOR_TIMELIMIT, Cause.TIMELIMIT),  # the time limit comes first
        (StopReason.PREEMPT, None, Cause.PREEMPT),
        (StopReason.INTERRUPT, 143, Cause.PREEMPT),
        (None, WORKER_SAVED_AND_STOPPED, Cause.PREEMPT),
        (StopReason.TIMELIMIT, WORKER_SAVED_AND_STOPPED, Cause.TIMELIMIT),
    ],
)
def test_the_cause_a_stopped_life_is_charged_to(
    saved: StopReason | None, exit_code: int | None, cause: Cause | None
) -> None:
    assert stop_cause(saved, exit_code) is cause
