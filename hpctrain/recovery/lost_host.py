"""Recovery when the batch script itself is lost, as pure functions (hpctrain.recovery.decide lists
them with the others): the guardian's (`decide_guard`, the training job ended without its batch
script deciding) and the keeper's (`decide_host_lost`, the batch host silent while the job runs).
tests/test_guardian.py and tests/test_keeper.py are their tables.
"""

from __future__ import annotations

from dataclasses import replace

from hpctrain.recovery.decision import JOB, WHY, Decision, Shape
from hpctrain.recovery.facts import Budgets, ClusterView, JobEnd, JobSeen, Outcome, Requested
from hpctrain.recovery.history import History, decided_requeue, marks, over_budget
from hpctrain.recovery.judge import keep_out, requeue_shape
from hpctrain.run.causes import Action, Cause
from hpctrain.run.events import (
    BY_GUARDIAN,
    BY_KEEPER,
    CANCELLED_BY_COMMAND,
    DETECTED_BY_HEARTBEAT,
    Cancelled,
    Failure,
    Finish,
    Requeue,
)
from hpctrain.slurm.states import ALLOCATED_STATES, HELD_STATES, WAITING_STATES

# Slurm's end state -> the restart budget a guardian's resubmission is charged to. Any other
# state (FAILED, NODE_FAIL, BOOT_FAIL, or a record Slurm no longer has): the batch node was lost.
_GUARDED_CAUSES = {
    "PREEMPTED": Cause.PREEMPT,  # PreemptMode=CANCEL
    "TIMEOUT": Cause.TIMELIMIT,
    "DEADLINE": Cause.TIMELIMIT,
    "OUT_OF_MEMORY": Cause.CRASH,
}


# Slurm's states of a job that has not ended, or will run again by itself (a requeued job is
# PENDING); COMPLETING is a job ending, judged by what it ended as.
_NOT_ENDED = (WAITING_STATES | HELD_STATES | ALLOCATED_STATES) - {"COMPLETING"}


def decide_guard(history: History, ended: JobEnd, budgets: Budgets) -> Decision:
    """The run's guardian job started: the training job (history.job_id, its last life
    history.restart) ended without completing (`--dependency=afternotok`). When the journal
    says nothing ended the run on purpose (no finish, no failure that ended it, no cancel, no
    resubmission), its batch script died before it could decide (the batch node was lost, which
    Slurm does not requeue under --no-kill): REQUEUE, meaning the guardian submits the run dir's
    job.sbatch again; the new job resumes from the newest complete checkpoint. Charged to the
    restart budget of the cause Slurm's state gives."""
    # The last life's own words (an earlier life's `cancelled` may have been a preemption Slurm
    # requeued), and hpctrain-cancel's, which ends the job whatever life it names.
    mine = [
        e
        for e in history.events
        if e.job_id in history.names
        and (e.restart == ended.restarts or (isinstance(e, Cancelled) and e.by == CANCELLED_BY_COMMAND))
    ]
    if ended.state == "COMPLETED" or any(isinstance(e, Finish) for e in history.events):
        return Decision(Action.FINISH, message="the run finished: nothing to do")
    if ended.state in _NOT_ENDED:
        # afternotok fired, then the job came back (a requeue of the ended job, a held job
        # released): it goes on by itself; a second job would train beside it.
        return Decision(Action.STOP, message=f"job {history.job_id} is {ended.state} again: it goes on by itself")
    for event in reversed(mine):
        if isinstance(event, Failure) and event.new_job_id:
            return Decision(Action.STOP, message=f"the run already goes on in job {event.new_job_id}")
        if isinstance(event, Failure) and (event.action == Action.FAIL.value or event.cause == Cause.USER_ERROR):
            return Decision(Action.STOP, message=f"the run ended on purpose ({event.cause}): nothing to do")
        if isinstance(event, Cancelled):
            return Decision(Action.STOP, message="the run was cancelled: nothing to do")
    if ended.state == "CANCELLED":
        # scancel'ed while the batch shell could not record it: the user's word stands.
        return Decision(Action.STOP, message="the job was cancelled (scancel): nothing to do")
    mark: dict = {"job_id": history.job_id, "restart": ended.restarts}
    said = f"the job ended {ended.state or 'unseen'}{f' ({ended.reason})' if ended.reason else ''}"
    decided = next((e for e in reversed(mine) if isinstance(e, Requeue) and e.by is None), None)
    if decided is not None:
        # The batch script decided a requeue (and charged it) but ended before Slurm took it (its
        # shell killed, its node lost while asking): submitted again as that requeue, charged once.
        failure = Failure(
            **mark,
            cause=decided.cause,
            reason=f"{said} before Slurm took the requeue its batch script decided",
            by=BY_GUARDIAN,
            action=Action.RESUBMIT.value,
        )
        return _resubmit((failure,), f"{said}: submitting the run again ({decided.cause.value})")
    cause = _GUARDED_CAUSES.get(ended.state or "", Cause.NODE_FAILURE)
    lost = [ended.batch_host] if cause is Cause.NODE_FAILURE and ended.batch_host else []
    failure = Failure(**mark, cause=cause, nodes=lost, reason=f"{said} before its batch script decided", by=BY_GUARDIAN)
    spent = over_budget(history.events, cause, budgets)
    if spent:
        budget = Failure(**mark, cause=Cause.BUDGET, reason=spent, action=Action.FAIL.value, by=BY_GUARDIAN)
        return Decision(Action.FAIL, (failure, budget), message=spent)
    written = (replace(failure, action=Action.RESUBMIT.value), Requeue(**mark, cause=cause, by=BY_GUARDIAN))
    return _resubmit(written, f"{said}: submitting the run again ({cause.value})")


def _resubmit(written: tuple, message: str) -> Decision:
    """The guardian's REQUEUE: job.sbatch submitted again; when sbatch fails, the run ends FAILED
    with the failure saying why (WHY: sbatch's words), and nothing else is journaled."""
    failure = next(e for e in written if isinstance(e, Failure))
    failed = replace(failure, reason=f"submitting job.sbatch again failed ({WHY})", action=Action.FAIL.value)
    return Decision(Action.REQUEUE, written, message=message, otherwise=Decision(Action.FAIL, (failed,), message=WHY))


def decide_keeper(
    history: History, host: str, silent_s: float, outcome: Outcome, cluster: ClusterView, budgets: Budgets
) -> Decision:
    """The batch host's keeper (a step on another node of the job) heard nothing from the batch
    script's node for `silent_s` seconds while Slurm still shows this life RUNNING: the batch
    script is gone (its node died silently, or Slurm removed the node from the job and killed
    the script without ending the job), and nothing else would end this life before its time
    limit. REQUEUE, meaning the run dir's job.sbatch is submitted again without that node and
    this job cancelled (a requeue would wait, COMPLETING, until Slurm hears from the silent
    node: SlurmdTimeout), charged to node_failure; FAIL when that budget is spent (the keeper
    cancels the job); STOP when the life had ended on purpose (finish, fail, cancel). A requeue
    the batch script had decided before it died is carried out as decided, charged once.
    `outcome`: the facts of this life's last step (its relaunches' exclusions)."""
    if any(isinstance(e, Finish) for e in history.events):
        return Decision(Action.STOP, message="the run finished: nothing to do")
    mark = marks(history)
    said = f"nothing heard from the batch host {host} for {silent_s:.0f} s while the job runs"
    failure = Failure(
        **mark,
        cause=Cause.NODE_FAILURE,
        nodes=[host],
        reason=said,
        by=BY_KEEPER,
        detected_by=DETECTED_BY_HEARTBEAT,
        action=Action.RESUBMIT.value,
    )
    for event in reversed(history.mine()):
        if isinstance(event, Cancelled):
            return Decision(Action.STOP, message="the job was cancelled: nothing to do")
        if isinstance(event, Failure) and (event.action == Action.FAIL.value or event.new_job_id):
            return Decision(Action.STOP, message=f"the run ended on purpose ({event.cause}): nothing to do")
        if isinstance(event, Requeue) and event.by in (None, BY_KEEPER):
            # The batch script decided it (and charged it) but was lost before Slurm took it.
            decided = replace(failure, cause=event.cause, reason=f"{said}, after its requeue was decided")
            return Decision(
                Action.REQUEUE, (decided,), tuple(event.excluded or ()), f"{said}: submitting the run again"
            )
    spent = over_budget(history.events, Cause.NODE_FAILURE, budgets)
    if spent:
        budget = Failure(**mark, cause=Cause.BUDGET, reason=spent, action=Action.FAIL.value, by=BY_KEEPER)
        return Decision(Action.FAIL, (replace(failure, action=None), budget), message=spent)
    kept_out, nodes = requeue_shape(keep_out(outcome, cluster, [host]), outcome, cluster)
    excluded = sorted(kept_out)
    requeue = Requeue(**mark, cause=Cause.NODE_FAILURE, excluded=excluded, nodes=nodes, by=BY_KEEPER)
    message = f"{said}: submitting the run again without it (node_failure)"
    return Decision(Action.REQUEUE, (failure, requeue), tuple(excluded), message)


def decide_host_lost(
    history: History,
    host: str,
    silent_s: float,
    seen: JobSeen,
    outcome: Outcome,
    cluster: ClusterView | None,
    budgets: Budgets,
    requested: Requested,
) -> Decision:
    """The keeper's call (`batch_host_lost`): the batch host silent for `silent_s`, and Slurm's
    record of the job (`seen`). A life Slurm has ended or requeued since (the batch script
    finished or asked; Slurm ended it, and the guardian takes over) is left alone: the silence
    was the life's end (`cluster` is then not looked at: None). Otherwise decide_keeper, its
    submission carried out as RESUBMIT (the training steps killed first, this job cancelled
    after); refused, Slurm's own requeue of this job instead (it starts again once Slurm hears
    from the lost node, SlurmdTimeout, but the run goes on); refused too, FAIL."""
    if cluster is None or seen.moved_on(history.restart):
        return Decision(Action.STOP, message=f"the batch host {host} is silent, the job {seen.said}: nothing to do")
    decided = decide_keeper(history, host, silent_s, outcome, cluster, budgets)
    if decided.action is not Action.REQUEUE:
        return decided
    failure, *rest = decided.events
    assert isinstance(failure, Failure)  # decide_keeper's REQUEUE writes its failure first
    asked = next((e for e in decided.events if isinstance(e, Requeue)), None) or decided_requeue(history)
    nodes = asked.nodes if asked else None
    failed = Decision(
        Action.FAIL,
        (replace(failure, reason=f"{failure.reason}; submitting again failed: {WHY}", action=Action.FAIL.value),),
    )
    requeue = Decision(
        Action.REQUEUE,
        (replace(failure, action=Action.REQUEUE.value), *rest),
        decided.excluded,
        f"submitting again failed ({WHY}): asking Slurm to requeue",
        ask=True,
        shape=Shape(decided.excluded, nodes, requested.exclude),
        otherwise=failed,
    )
    return Decision(
        Action.RESUBMIT,
        decided.events,
        decided.excluded,
        f"the run goes on in job {JOB} (same run dir)",
        shape=Shape(decided.excluded, requested.new_job_nodes(nodes)),
        otherwise=requeue,
    )
