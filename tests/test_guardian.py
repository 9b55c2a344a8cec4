"""The guardian's decision as a table, and the script that runs it.

Each row: the run's journal, how Slurm says the job ended (a record captured on the dev cluster,
tests/fixtures/slurm/guardian) -> what the guardian does (resubmit the run or nothing) and the
events it writes (event:cause). The guardian starts only when the job ended without completing
(`--dependency=afternotok`); it must never resubmit a run someone ended on purpose.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from hpctrain.recovery.decide import History, decide_guard, lineage
from hpctrain.recovery.facts import Budgets, JobEnd
from hpctrain.recovery.guardian import job_end
from hpctrain.run.causes import Action, Cause, CheckpointReason, StopReason
from hpctrain.run.events import (
    BY_GUARDIAN,
    CANCELLED_BY_COMMAND,
    Cancelled,
    Checkpoint,
    Event,
    Failure,
    Finish,
    Requeue,
    Start,
    Stop,
)
from hpctrain.slurm.records import parse_job_record

FIXTURES = Path(__file__).parent / "fixtures" / "slurm" / "guardian"
JOB = "41"
DEFAULTS = {"preempt": 50, "timelimit": 50, "node_failure": 5, "crash": 1, "hang": 2}


def captured(name: str, job_id: str = JOB) -> JobEnd:
    """A record Slurm wrote, as the guardian reads it (its JobId made this table's job)."""
    record = parse_job_record((FIXTURES / f"{name}.txt").read_text())
    assert record is not None
    return job_end(replace(record, job_id=job_id))


BATCH_HOST_DOWN = captured("batch_host_down")
SCANCELLED = captured("scancelled")
TIMEOUT = captured("timeout")
# A state the dev cluster does not leave a guardian to see, as squeue(1) lists it
# (tests/fixtures/slurm/squeue_job_state_codes.txt): "Job terminated due to preemption"
# (PreemptMode=CANCEL; the dev cluster requeues).
PREEMPTED = JobEnd(state="PREEMPTED")
# `scontrol show job` of a requeued job on the dev cluster: PENDING (BeginTime), Restarts=1.
REQUEUED_PENDING = captured("../scontrol/requeued_pending")
GONE = JobEnd(state=None)  # Slurm dropped the record (MinJobAge) before the guardian looked

TRAINING = (
    Start(time=10.0, job_id=JOB, restart=0, nodes=["node1", "node2"], world_size=2),
    Checkpoint(time=20.0, step=20, reason=CheckpointReason.PERIODIC),
)
# The SIGKILL of the batch step reaches the tasks as the job ends: their SIGTERM save is the stop.
KILLED_WITH_THE_JOB = (Stop(time=30.0, job_id=JOB, restart=0, step=33, reason=StopReason.PREEMPT, deadline_s=30.0),)


@dataclass
class Row:
    journal: tuple[Event, ...]
    ended: JobEnd
    action: Action
    written: list[str]
    budgets: dict[str, int] | None = None


ROWS = {
    # ---- nobody decided: the batch script died with its node ----
    "batch host lost (FAILED JobLaunchFailure)": Row(
        TRAINING, BATCH_HOST_DOWN, Action.REQUEUE, ["failure:node_failure", "requeue:node_failure"]
    ),
    "batch host lost while the tasks saved for the job's end": Row(
        (*TRAINING, *KILLED_WITH_THE_JOB),
        BATCH_HOST_DOWN,
        Action.REQUEUE,
        ["failure:node_failure", "requeue:node_failure"],
    ),
    "batch host lost before the first start": Row(
        (), BATCH_HOST_DOWN, Action.REQUEUE, ["failure:node_failure", "requeue:node_failure"]
    ),
    "record gone, journal silent": Row(
        TRAINING, GONE, Action.REQUEUE, ["failure:node_failure", "requeue:node_failure"]
    ),
    "time limit with no warning acted on": Row(
        TRAINING, TIMEOUT, Action.REQUEUE, ["failure:timelimit", "requeue:timelimit"]
    ),
    "preempted, PreemptMode=CANCEL": Row(TRAINING, PREEMPTED, Action.REQUEUE, ["failure:preempt", "requeue:preempt"]),
    # The time limit reached while the warned step stopped or after-step decided: the trap saw
    # Reason=TimeLimit and wrote no cancel (tests/test_decide.py).
    "time limit reached during the warned stop": Row(
        (*TRAINING, Stop(time=30.0, job_id=JOB, restart=0, step=33, reason=StopReason.TIMELIMIT, deadline_s=25.5)),
        TIMEOUT,
        Action.REQUEUE,
        ["failure:timelimit", "requeue:timelimit"],
    ),
    # ---- the batch script decided a requeue, and ended before Slurm took it ----
    # (its shell killed after the decision; its node lost while it asked): submitted again as
    # that requeue, whose budget the decision already charged: no second `requeue`.
    "requeue decided, never asked": Row(
        (*TRAINING, *KILLED_WITH_THE_JOB, Requeue(time=31.0, job_id=JOB, restart=0, cause=Cause.PREEMPT)),
        JobEnd(state="FAILED"),
        Action.REQUEUE,
        ["failure:preempt"],
    ),
    # slurmctld away until the time limit while the requeue was asked: the job ended undecided
    # (its `failure` has no action: an outage ends no run on purpose).
    "requeue decided, slurmctld away until the time limit": Row(
        (
            *TRAINING,
            Requeue(time=31.0, job_id=JOB, restart=0, cause=Cause.CRASH),
            Failure(time=3590.0, job_id=JOB, restart=0, cause=Cause.REQUEUE_REFUSED, reason="no answer"),
        ),
        JobEnd(state="FAILED"),
        Action.REQUEUE,
        ["failure:crash"],
    ),
    "node failure budget spent": Row(
        # Life 0 was requeued for a failed node; life 1 lost its batch host.
        (
            *TRAINING,
            Requeue(time=25.0, job_id=JOB, restart=0, cause=Cause.NODE_FAILURE),
            Start(time=30.0, job_id=JOB, restart=1, nodes=["node2", "node3"], world_size=2),
        ),
        replace(BATCH_HOST_DOWN, restarts=1),
        Action.FAIL,
        ["failure:node_failure", "failure:budget"],
        {**DEFAULTS, "node_failure": 1},
    ),
    # ---- someone decided: nothing to do ----
    "finished (the job failed after its finish)": Row(
        (*TRAINING, Finish(time=40.0, job_id=JOB, restart=0, step=100)), BATCH_HOST_DOWN, Action.FINISH, []
    ),
    "scancel, recorded by the trap": Row(
        (*TRAINING, Cancelled(time=40.0, job_id=JOB, restart=0, step=20)), SCANCELLED, Action.STOP, []
    ),
    "scancel, nothing recorded": Row(TRAINING, SCANCELLED, Action.STOP, []),
    "hpctrain-cancel while it was pending": Row(
        (Cancelled(time=5.0, job_id=JOB, restart=0, by=CANCELLED_BY_COMMAND),), SCANCELLED, Action.STOP, []
    ),
    "budget spent by the batch script": Row(
        (*TRAINING, Failure(time=40.0, job_id=JOB, restart=0, cause=Cause.BUDGET, action="fail")),
        JobEnd(state="FAILED"),
        Action.STOP,
        [],
    ),
    "a user's mistake": Row(
        (*TRAINING, Failure(time=40.0, job_id=JOB, restart=0, cause=Cause.USER_ERROR, message="bad lr")),
        JobEnd(state="FAILED"),
        Action.STOP,
        [],
    ),
    "refused requeue already resubmitted": Row(
        (
            *TRAINING,
            Failure(time=40.0, job_id=JOB, restart=0, cause=Cause.REQUEUE_REFUSED, action="resubmit", new_job_id="42"),
        ),
        JobEnd(state="FAILED"),
        Action.STOP,
        [],
    ),
    # ---- the job came back after afternotok fired: it goes on by itself, no second job ----
    "the ended job requeued, PENDING again (scontrol's record)": Row(TRAINING, REQUEUED_PENDING, Action.STOP, []),
}


def _named(event: Event) -> str:
    cause = getattr(event, "cause", None)
    return f"{event.name}:{cause}" if cause else event.name


@pytest.mark.parametrize("row", ROWS.values(), ids=ROWS.keys())
def test_decide_guard(row: Row) -> None:
    history = History(JOB, row.ended.restarts, lineage(row.journal, JOB))
    decision = decide_guard(history, row.ended, Budgets(row.budgets or DEFAULTS))
    assert decision.action is row.action, decision.message
    assert [_named(e) for e in decision.events] == row.written, decision.events
    assert all(e.by == BY_GUARDIAN for e in decision.events)
    assert all((e.job_id, e.restart) == (JOB, row.ended.restarts) for e in decision.events)


def test_the_resubmission_names_the_lost_batch_host_and_is_charged_once() -> None:
    decision = decide_guard(History(JOB, 0, TRAINING), BATCH_HOST_DOWN, Budgets(DEFAULTS))
    failure, requeue = decision.events
    assert isinstance(failure, Failure) and failure.nodes == ["node1"] and failure.action == "resubmit"
    assert "FAILED (JobLaunchFailure)" in (failure.reason or "")
    assert isinstance(requeue, Requeue) and requeue.cause == Cause.NODE_FAILURE


def test_an_earlier_lifes_cancel_that_slurm_requeued_does_not_stop_the_guardian() -> None:
    """Life 0's trap wrote `cancelled` for a preemption it could not tell apart (no answer from
    slurmctld in time), Slurm requeued the job, life 1 lost its batch node: resubmit."""
    journal = (*TRAINING, Cancelled(time=30.0, job_id=JOB, restart=0, step=20))
    life1 = replace(BATCH_HOST_DOWN, restarts=1)
    decision = decide_guard(History(JOB, 1, journal), life1, Budgets(DEFAULTS))
    assert decision.action is Action.REQUEUE, decision.message


def test_a_guardians_resubmission_keeps_the_runs_budgets() -> None:
    """The new job's lineage reaches the lost one through `new_job_id`: the guardian's requeue
    counts against node_failure's budget in the new job."""
    decision = decide_guard(History(JOB, 0, TRAINING), BATCH_HOST_DOWN, Budgets(DEFAULTS))
    failure, requeue = decision.events
    journal = (*TRAINING, replace(failure, new_job_id="42"), requeue, Start(time=60.0, job_id="42", restart=0))
    again = decide_guard(
        History("42", 0, lineage(journal, "42")), BATCH_HOST_DOWN, Budgets({**DEFAULTS, "node_failure": 1})
    )
    assert again.action is Action.FAIL and [_named(e) for e in again.events] == [
        "failure:node_failure",
        "failure:budget",
    ]


def test_a_resubmission_sbatch_refuses_ends_the_run_failed_saying_why() -> None:
    """What comes when sbatch refuses the guardian's resubmission is the decider's too (`otherwise`):
    one failure, the run's last word, with sbatch's own words; no requeue is journaled."""
    decision = decide_guard(History(JOB, 0, TRAINING), BATCH_HOST_DOWN, Budgets(DEFAULTS))
    refused = decision.because("exit 1: sbatch: error: Batch job submission failed: Invalid account")
    assert refused.action is Action.FAIL and [_named(e) for e in refused.events] == ["failure:node_failure"]
    (failure,) = refused.events
    assert isinstance(failure, Failure) and failure.action == "fail" and failure.by == BY_GUARDIAN
    assert (
        failure.reason
        == "submitting job.sbatch again failed (exit 1: sbatch: error: Batch job submission failed: Invalid account)"
    )
    assert decision.resubmitted("77").events[0].new_job_id == "77"
