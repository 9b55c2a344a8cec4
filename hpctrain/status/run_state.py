"""One state per run, decided once: Slurm's word while it knows the job, else the journal's.

The journal adds what Slurm cannot say: why a job waits again (the requeue's cause), and how
a job ended after Slurm forgot it (no accounting, and older than MinJobAge).
"""

from __future__ import annotations

from dataclasses import dataclass

from hpctrain.slurm.states import FAILED_STATES, STOPPED_STATES, WAITING_STATES
from hpctrain.status.journal_summary import JournalSummary
from hpctrain.status.slurm_query import SlurmJob


@dataclass(frozen=True)
class RunState:
    label: str  # what the table shows: RUNNING, PENDING (requeued: timelimit), FAILED (user_error)
    failed: bool  # counts for the exit code


def decide(job: SlurmJob | None, journal: JournalSummary) -> RunState:
    return _from_slurm(job, journal) if job is not None else _from_journal(journal)


def _from_slurm(job: SlurmJob, journal: JournalSummary) -> RunState:
    state = job.state
    if state in WAITING_STATES:
        # A job that has started before and waits again was requeued (by the batch script after
        # a save, by Slurm after its node died, or by a preemption): Slurm holds it ~2 minutes
        # with Reason=BeginTime. Say why, from the journal's last word.
        if journal.started or journal.ending == "requeue" or (job.restarts or 0) > 0 or state != "PENDING":
            cause = journal.cause if journal.ending in ("requeue", "failure") else None
            return RunState(f"PENDING (requeued: {cause})" if cause else "PENDING (requeued)", False)
        return RunState(f"PENDING ({job.reason})" if job.reason else "PENDING", False)
    if state in FAILED_STATES:
        return RunState(_with_cause(state, journal), True)
    if state in STOPPED_STATES:  # scancel, or a preemption that did not requeue
        return RunState(state, journal.ending != "finish")
    if state == "COMPLETED" and journal.ending == "pruned":
        return RunState("COMPLETED (pruned)", False)
    if state == "COMPLETED" and journal.ending == "failure":
        return RunState(_with_cause("FAILED", journal), True)
    return RunState(state, False)


def _from_journal(journal: JournalSummary) -> RunState:
    """Slurm does not know the job (or there is none: hpctrain-train on this machine)."""
    slurm = journal.job_id is not None
    ending, cause = journal.ending, journal.cause
    if ending == "finish":
        return RunState("COMPLETED" if slurm else "FINISHED", False)
    if ending == "failure":
        return RunState(_with_cause("FAILED", journal), True)
    if ending == "pruned":  # hpctrain-tune's pruner stopped the trial: saved, ended on purpose
        return RunState("COMPLETED (pruned)" if slurm else "PRUNED", False)
    if ending == "cancelled":
        return RunState("CANCELLED", True)
    if ending == "requeue":
        return RunState(f"REQUEUED ({cause})" if cause else "REQUEUED", False)
    if ending == "stopped":
        return RunState(f"STOPPED ({cause})" if cause else "STOPPED", False)
    if journal.dry_run:
        return RunState("DRY RUN", False)
    if journal.live_here and not slurm:  # hpctrain-train on this machine, training now
        return RunState("RUNNING (local)", False)
    # Started with no end recorded (killed without a word, or training on another machine), or
    # never started.
    return RunState("UNKNOWN", False)


def _with_cause(state: str, journal: JournalSummary) -> str:
    return f"{state} ({journal.cause})" if journal.ending == "failure" and journal.cause else state
