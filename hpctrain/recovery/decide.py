"""Recovery as pure functions: from what happened to what comes next, one function per moment.

    decide_start     `control begin`: a start of the batch script (a restart Slurm made on its
                     own is recorded and counted; launch, or not inside a preemption's grace),
                     in hpctrain.recovery.decide_start
    decide           `control after-step`: a training step (one srun) has ended
    decide_cancelled `control cancelled`: the batch shell's SIGTERM trap
    decide_requeue   `control requeue`: the last look before asking Slurm for the decided requeue
    decide_refused   the requeue was refused, or got no answer: requeued after all, submitted
                     again (RESUBMIT), or FAIL
    decide_host_lost the keeper: the batch host is silent (hpctrain.recovery.lost_host)
    decide_guard     the guardian: the training job ended without completing (lost_host too)

They read and call nothing: hpctrain.recovery.gather makes the facts (hpctrain.recovery.facts),
the control step (hpctrain.recovery.control) calls one of them once and carries out the Decision
(hpctrain.recovery.decision) with hpctrain.recovery.apply. The journal is read with
hpctrain.recovery.history, a step judged with hpctrain.recovery.judge. tests/test_decide.py,
tests/test_keeper.py and tests/test_guardian.py are their tables.
"""

from __future__ import annotations

from dataclasses import replace

from hpctrain.recovery.before_requeue import BeforeRequeue, before_requeue
from hpctrain.recovery.decide_start import decide_begin, decide_start
from hpctrain.recovery.decision import JOB, WHY, Decision, Shape
from hpctrain.recovery.facts import Budgets, ClusterView, JobSeen, Outcome, Refusal, Requested
from hpctrain.recovery.history import (
    History,
    checkpoint_interval_s,
    decided_requeue,
    is_failure,
    launches_lost,
    lineage,
    lives_without_progress,
    marks,
    nodes_failing_in_a_row,
    over_budget,
    relaunched_for,
    silent_nodes,
    stragglers_left,
    unhealthy_nodes,
)
from hpctrain.recovery.judge import classify, keep_out, launch_lost, lost_nodes, relaunch, requeue_shape
from hpctrain.recovery.lost_host import decide_guard, decide_host_lost, decide_keeper
from hpctrain.run.causes import Action, Cause
from hpctrain.run.events import (
    BY_SLURM,
    CANCELLED_BY_COMMAND,
    DETECTED_BY_CHECK,
    DETECTED_BY_HEALTH,
    DETECTED_BY_HEARTBEAT,
    DETECTED_BY_SLURM,
    Cancelled,
    Event,
    Failure,
    Finish,
    Requeue,
    Silent,
    last_checkpoint_step,
)

# A step whose srun started no task is launched again, charged to nothing, this many times in a row;
# then it is judged as any failed step (a crash): a srun that can never start (a bad
# slurm.srun_args) must not loop.
LAUNCH_AGAIN = 2

__all__ = [
    "Decision",
    "History",
    "checkpoint_interval_s",
    "decide",
    "decide_begin",
    "decide_cancelled",
    "decide_guard",
    "decide_host_lost",
    "decide_keeper",
    "decide_refused",
    "decide_requeue",
    "decide_start",
    "lineage",
]


def decide(history: History, outcome: Outcome, cluster: ClusterView, budgets: Budgets) -> Decision:
    since = history.since_launch
    if outcome.exit_code == 0 or any(isinstance(e, Finish) for e in since):
        return Decision(Action.FINISH, message="finished")
    if any(is_failure(e, Cause.USER_ERROR) for e in since):
        # A bad value or file: every retry would fail alike; the worker said why.
        return Decision(Action.FAIL, message="a training process refused the config (see the error line)")
    mark = marks(history)
    if outcome.terminated:
        # scancel signals this shell (a preemption does not, until its grace ends): stop. Slurm
        # requeues a preempted job whose grace ran out on its own; decide_begin then tells so.
        return decide_cancelled(history, cluster.requeued_by_slurm, cluster.timed_out)
    lost = lost_nodes(since, outcome, cluster)
    if not lost and launch_lost(since, outcome) and launches_lost(history) < LAUNCH_AGAIN:
        # srun started no task (slurmctld away; the control step waited for its answer): nothing
        # failed, nothing is charged. Launched again in the job; without the time or the nodes
        # for it, requeued (no budget either).
        again = relaunch(
            history, outcome, cluster, keep_out(outcome, cluster, []) | stragglers_left(history), [], Cause.LAUNCH
        )
        if again:
            said = f"launch again on {','.join(again.nodes)} (its srun started no task)"
            return Decision(Action.RELAUNCH, (again,), tuple(again.excluded), said, step_nodes=len(again.nodes))
        shaped, nodes = requeue_shape(keep_out(outcome, cluster, []), outcome, cluster)
        requeue = Requeue(**mark, cause=Cause.LAUNCH, excluded=sorted(shaped), nodes=nodes)
        return Decision(Action.REQUEUE, (requeue,), tuple(sorted(shaped)), "requeue (its srun started no task)")
    cause = classify(since, outcome, lost, preempting=cluster.preempting)
    if cause in (Cause.DRAIN, Cause.STRAGGLER):
        return _leave_nodes(history, outcome, cluster, cause)
    written: list[Event] = []
    if lost:
        heard_silent = silent_nodes(since)
        if set(lost) & heard_silent:
            detected = DETECTED_BY_HEARTBEAT
        elif set(lost) <= unhealthy_nodes(since):
            detected = DETECTED_BY_HEALTH
        elif set(lost) <= cluster.checked.unanswering:
            detected = DETECTED_BY_CHECK
        else:
            detected = DETECTED_BY_SLURM
        # The live ranks' stacks, taken by the watcher before it ended the step (where they waited).
        report = next((e.report for e in reversed(since) if isinstance(e, Silent) and e.report), None)
        written.append(
            Failure(
                **mark,
                cause=Cause.NODE_FAILURE,
                nodes=lost,
                exit_code=outcome.exit_code,
                detected_by=detected,
                report=report if detected == DETECTED_BY_HEARTBEAT else None,
            )
        )
    if cause in (Cause.CRASH, Cause.HANG) and not any(is_failure(e, cause) for e in since):
        written.append(Failure(**mark, cause=cause, nodes=[], exit_code=outcome.exit_code))
    spent = over_budget(history.events, cause, budgets)
    if spent:
        written.append(Failure(**mark, cause=Cause.BUDGET, reason=spent, action=Action.FAIL.value))
        return Decision(Action.FAIL, tuple(written), message=spent)
    # A node that keeps breaking lives stays out, though Slurm lists it in service again.
    breaking = nodes_failing_in_a_row((*history.events, *written), budgets.keep_out_after_lives)
    kept_out = keep_out(outcome, cluster, lost) | breaking | stragglers_left(history)
    # A node lost, or a rank hung or crashed on nodes that all live: train again in this job at
    # once (a requeue waits for Slurm's hold on a requeued job, about 120 s, then the queue), as
    # torchrun restarts its workers in place. A hang or a crash right after a relaunch for the same
    # cause is not tried a third time here: requeued, it gets a new allocation.
    again_in_job = cause in (Cause.HANG, Cause.CRASH) and not (lost or relaunched_for(history, cause))
    if cause is Cause.NODE_FAILURE or again_in_job:
        again = relaunch(history, outcome, cluster, kept_out, lost, cause)
        if again:
            return Decision(
                Action.RELAUNCH,
                (*written, again),
                tuple(again.excluded),
                f"relaunch on {','.join(again.nodes)} ({cause.value})",
                step_nodes=len(again.nodes),
            )
    stalled = lives_without_progress(history.events, (history.job_id, history.restart), cause)
    if budgets.no_progress_lives and stalled >= budgets.no_progress_lives:
        # Each requeue costs a queue wait and spends a budget one life at a time: a run that
        # cannot get past its newest checkpoint stops now, and says so.
        why = f"{stalled} lives in a row ended ({cause.value} this one) without a newer checkpoint"
        written.append(Failure(**mark, cause=Cause.NO_PROGRESS, reason=why, action=Action.FAIL.value))
        return Decision(Action.FAIL, tuple(written), message=why)
    shaped, nodes = requeue_shape(kept_out, outcome, cluster)
    excluded = sorted(shaped)
    written.append(Requeue(**mark, cause=cause, excluded=excluded, nodes=nodes))
    given_up = f"; on {nodes} nodes, the spares it cannot have given up" if nodes is not None else ""
    return Decision(Action.REQUEUE, tuple(written), tuple(excluded), f"requeue ({cause.value}{given_up})")


def _leave_nodes(history: History, outcome: Outcome, cluster: ClusterView, cause: Cause) -> Decision:
    """The ranks saved and stopped at the watcher's word: a training node drains, or a rank's node
    was named a straggler, and a spare was free (hpctrain.recovery.drain_watch,
    hpctrain.recovery.straggler_move). Relaunched at once without those nodes (relaunch leaves
    out every node that is not in service; a straggler's is kept out by name), charged to no
    budget: nothing failed, and the node never comes back into this life's steps. Without the
    nodes for it by now (the spare failed meanwhile), requeued without them, charged to nothing
    either."""
    kept_out = keep_out(outcome, cluster, []) | stragglers_left(history)
    again = relaunch(history, outcome, cluster, kept_out, [], cause)
    if again:
        left = cluster.drained(cluster.original) if cause is Cause.DRAIN else sorted(stragglers_left(history))
        said = f"relaunch on {','.join(again.nodes)} ({cause.value}: {','.join(left)} left)"
        return Decision(Action.RELAUNCH, (again,), tuple(again.excluded), said, step_nodes=len(again.nodes))
    shaped, nodes = requeue_shape(kept_out, outcome, cluster)  # Slurm starts nothing on a drained node
    requeue = Requeue(**marks(history), cause=cause, excluded=sorted(shaped), nodes=nodes)
    return Decision(Action.REQUEUE, (requeue,), tuple(sorted(shaped)), f"requeue ({cause.value}: no spare left for it)")


def decide_cancelled(history: History, requeued_by_slurm: bool = False, timed_out: bool = False) -> Decision:
    """This shell got SIGTERM (scancel, or a preemption's grace ending): `cancelled`, written once
    per life. The batch shell's trap writes it at once, since Slurm kills the shell KillWait
    seconds later, often before the step has ended and after-step could run. When the job's
    record shows Slurm requeuing it (an admin's `scontrol requeue`, a preemption's grace ended),
    it is no cancel: the requeue is recorded now (`preempt`, by Slurm), once per life, since only
    this shell knows it was no node failure (a life requeued before its tasks wrote anything would
    otherwise be charged to node_failure at the next start); its budget is checked there.
    Nor when it shows the time limit ended the job (Reason=TimeLimit: the limit reached while the
    step stopped or after-step decided): the run's guardian, finding no cancel, submits it again
    (charged to `timelimit`)."""
    if requeued_by_slurm:
        recorded = any(
            isinstance(e, Requeue) and (e.job_id, e.restart) == (history.job_id, history.restart)
            for e in history.events
        )
        requeue = () if recorded else (Requeue(**marks(history), cause=Cause.PREEMPT, by=BY_SLURM),)
        return Decision(
            Action.STOP, requeue, message="Slurm is requeuing this job: the run comes back", comes_back=True
        )
    if timed_out:
        return Decision(
            Action.STOP,
            message="the time limit ended this job, no cancel: its guardian submits it again",
            comes_back=True,
        )
    told = any(
        isinstance(e, Cancelled)
        and (
            (e.job_id, e.restart) == (history.job_id, history.restart)
            # hpctrain-cancel recorded it right after its scancel: a cancelled job has no later life.
            or (e.by == CANCELLED_BY_COMMAND and e.job_id in history.names)
        )
        for e in history.events
    )
    written = () if told else (Cancelled(**marks(history), step=last_checkpoint_step(history.events)),)
    return Decision(Action.STOP, written, message="cancelled")


def decide_requeue(history: History, seen: JobSeen, excluded: tuple[str, ...], requested: Requested) -> Decision:
    """`control requeue`, after the answer `requeue`: the control step ignores SIGTERM from the
    decision on (Slurm's own requeue sends one), so the job's record, read just before, is what
    shows a scancel or a requeue that came meanwhile (hpctrain.recovery.before_requeue). Asked,
    and taken, the requeued job is shaped as this life's requeue decision said."""
    look = before_requeue(seen.restarts, seen.being_ended, history.restart)
    if look is BeforeRequeue.REQUEUED_ALREADY:
        return Decision(Action.REQUEUE, message="Slurm is requeuing this job already")
    if look is BeforeRequeue.CANCELLED:
        cancelled = decide_cancelled(history)
        said = "the job was cancelled while its step ended: no requeue"
        return replace(cancelled, message=f"{cancelled.message}\n{said}")
    return Decision(Action.REQUEUE, excluded=excluded, ask=True, shape=_requeued_shape(history, excluded, requested))


def decide_refused(history: History, excluded: tuple[str, ...], refusal: Refusal, requested: Requested) -> Decision:
    """Slurm did not take this job's requeue (`control requeue`, or the batch shell's own ask:
    `requeue-refused`). Requeued after all (seen once slurmctld answered again, or in the job's
    record): shaped as decided. No answer at all: FAIL, never a second job while Slurm may still
    requeue this one into the same run dir. Refused: RESUBMIT, job.sbatch again into the same run
    dir (it resumes there), on the node count this life's decision judged; FAIL when it cannot."""
    if refusal.requeued:
        said = f"scontrol requeue got no answer ({refusal.message.strip()}); the job was requeued"
        return Decision(Action.REQUEUE, message=said, shape=_requeued_shape(history, excluded, requested))
    words = refusal.refused
    if words is None:
        # Slurm was away until (almost) the job's time limit: no second job while Slurm may still
        # requeue this one, and no `fail` either: an outage is nobody's decision to end the run.
        # The job ends undecided; once Slurm is back, its guardian submits the run again (as the
        # requeue decided and charged here).
        why = (
            f"slurmctld did not answer the requeue for {refusal.waited_s:.0f} s ({refusal.message.strip()}), "
            "until the job's time limit: not submitted again (Slurm may still requeue this job); its guardian "
            "submits the run again once Slurm is back"
        )
        failure = Failure(**marks(history), cause=Cause.REQUEUE_REFUSED, reason=why)
        return Decision(Action.STOP, (failure,), message=why)
    reason = f"scontrol requeue refused: {words.strip() or 'no message'}"
    if refusal.requeued_anyway:  # only the ExcNodeList update failed: Slurm restarts this job
        return Decision(Action.REQUEUE, message=f"{reason}; the job was requeued all the same")
    if not refusal.job_script_found:
        return _refused_fail(history, f"{reason}; submitting again failed: {refusal.job_script} is missing")
    decided = decided_requeue(history)
    failure = Failure(**marks(history), cause=Cause.REQUEUE_REFUSED, reason=reason, action=Action.RESUBMIT.value)
    return Decision(
        Action.RESUBMIT,
        (failure,),
        excluded,
        message=f"{reason}; the run goes on in job {JOB} (same run dir)",
        shape=Shape(excluded, requested.new_job_nodes(decided.nodes if decided else None)),
        otherwise=_refused_fail(history, f"{reason}; submitting again failed: {WHY}"),
    )


def _refused_fail(history: History, why: str) -> Decision:
    failure = Failure(**marks(history), cause=Cause.REQUEUE_REFUSED, reason=why, action=Action.FAIL.value)
    return Decision(Action.FAIL, (failure,), message=why)


def _requeued_shape(history: History, excluded: tuple[str, ...], requested: Requested) -> Shape:
    """The requeued job's next start: EXCLUDED kept out, on the node count this life's requeue
    decision gave it (its spares given up), or as it is."""
    decided = decided_requeue(history)
    return Shape(excluded, decided.nodes if decided else None, requested.exclude)
