"""Recovery as a pure function: from what happened to what the batch script does next.

`decide(history, outcome, cluster, budgets)` runs when a training step (one srun) has ended;
`decide_begin(history, cluster, budgets)` when the batch script starts again; `decide_guard(history,
ended, budgets)` in the run's guardian job, once the training job ended without completing. They
read and call nothing: hpctrain/recovery/control.py gathers the facts, calls them, writes the returned events and
hands the action to the batch shell. tests/test_decide.py is their table.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

from hpctrain.recovery.facts import Budgets, ClusterView, JobEnd, Outcome, Service
from hpctrain.run.causes import Action, Cause, CheckpointReason, StopReason, stop_reason
from hpctrain.run.events import (
    BY_GUARDIAN,
    BY_KEEPER,
    BY_SLURM,
    CANCELLED_BY_COMMAND,
    DETECTED_BY_HEARTBEAT,
    DETECTED_BY_SLURM,
    Cancelled,
    Checkpoint,
    Event,
    Failure,
    Finish,
    ForcedSave,
    Relaunch,
    Requeue,
    Retry,
    Silent,
    Start,
    Stop,
)
from hpctrain.run.exitcodes import WORKER_HUNG, WORKER_SAVED_AND_STOPPED, WORKER_SAVED_FOR_TIMELIMIT


@dataclass(frozen=True)
class History:
    job_id: str
    restart: int  # SLURM_RESTART_COUNT of this life
    events: tuple[Event, ...]  # the run's events for this job and the jobs it was resubmitted from
    since_launch: tuple[Event, ...] = ()  # written since the step that just ended was launched
    # Other names of this job: an array task (SLURM_JOB_ID 44) is also `36_7`, the id
    # submission.json and hpctrain-cancel use.
    aliases: tuple[str, ...] = ()
    # The life before this one's batch shell got SIGTERM (its trap's mark, RunDir.sigterm_mark):
    # Slurm told it to stop, so a restart with nothing recorded was no node failure.
    previous_shell_terminated: bool = False

    @property
    def agreed_stop(self) -> Stop | None:
        """The stop the ranks agreed on in the step that just ended: written before the save it
        forced, so it is here even when that save was killed (no checkpoint, no forced_save)."""
        return next((e for e in reversed(self.since_launch) if isinstance(e, Stop)), None)


@dataclass(frozen=True)
class Decision:
    action: Action
    events: tuple[Event, ...] = ()  # for the journal, in order
    excluded: tuple[str, ...] = ()  # requeue: the job's ExcNodeList; relaunch: srun --exclude
    message: str = ""  # one line for the job's output
    comes_back: bool = False  # STOP: this life ends, but Slurm requeues the job (no cancel)
    step_nodes: int | None = None  # RELAUNCH: how many nodes the new step runs on

    @property
    def ends_run(self) -> bool:
        """This job ends and the run with it: an hpctrain-tune trial is told so."""
        return self.action in (Action.FINISH, Action.FAIL, Action.STOP) and not self.comes_back


def decide(history: History, outcome: Outcome, cluster: ClusterView, budgets: Budgets) -> Decision:
    since = history.since_launch
    if outcome.exit_code == 0 or any(isinstance(e, Finish) for e in since):
        return Decision(Action.FINISH, message="finished")
    if any(_is(e, Cause.USER_ERROR) for e in since):
        # A bad value or file: every retry would fail alike; the worker said why.
        return Decision(Action.FAIL, message="a training process refused the config (see the error line)")
    mark = _marks(history)
    if outcome.terminated:
        # scancel signals this shell (a preemption does not, until its grace ends): stop. Slurm
        # requeues a preempted job whose grace ran out on its own; decide_begin then tells so.
        return decide_cancelled(history, cluster.requeued_by_slurm, cluster.timed_out)
    lost = lost_nodes(since, outcome, cluster)
    cause = classify(since, outcome, lost, preempting=cluster.preempting)
    written: list[Event] = []
    if lost:
        heard_silent = silent_nodes(since)
        detected = DETECTED_BY_HEARTBEAT if set(lost) & heard_silent else DETECTED_BY_SLURM
        written.append(
            Failure(**mark, cause=Cause.NODE_FAILURE, nodes=lost, exit_code=outcome.exit_code, detected_by=detected)
        )
    if cause in (Cause.CRASH, Cause.HANG) and not any(_is(e, cause) for e in since):
        written.append(Failure(**mark, cause=cause, nodes=[], exit_code=outcome.exit_code))
    spent = over_budget(history.events, cause, budgets)
    if spent:
        written.append(Failure(**mark, cause=Cause.BUDGET, reason=spent, action=Action.FAIL.value))
        return Decision(Action.FAIL, tuple(written), message=spent)
    keep_out = _keep_out(outcome, cluster, lost)
    if cause is Cause.NODE_FAILURE:
        relaunch = _relaunch(history, outcome, cluster, keep_out, lost)
        if relaunch:
            return Decision(
                Action.RELAUNCH,
                (*written, relaunch),
                tuple(relaunch.excluded),
                f"relaunch on {','.join(relaunch.nodes)}",
                step_nodes=len(relaunch.nodes),
            )
    kept_out, nodes = _requeue_shape(keep_out, outcome, cluster)
    excluded = sorted(kept_out)
    written.append(Requeue(**mark, cause=cause, excluded=excluded, nodes=nodes))
    given_up = f"; on {nodes} nodes, the spares it cannot have given up" if nodes is not None else ""
    return Decision(Action.REQUEUE, tuple(written), tuple(excluded), f"requeue ({cause.value}{given_up})")


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
        requeue = () if recorded else (Requeue(**_marks(history), cause=Cause.PREEMPT, by=BY_SLURM),)
        return Decision(
            Action.STOP, requeue, message="Slurm is requeuing this job: the run comes back", comes_back=True
        )
    if timed_out:
        return Decision(
            Action.STOP,
            message="the time limit ended this job, no cancel: its guardian submits it again",
            comes_back=True,
        )
    names = {history.job_id, *history.aliases}
    told = any(
        isinstance(e, Cancelled)
        and (
            (e.job_id, e.restart) == (history.job_id, history.restart)
            # hpctrain-cancel recorded it right after its scancel: a cancelled job has no later life.
            or (e.by == CANCELLED_BY_COMMAND and e.job_id in names)
        )
        for e in history.events
    )
    written = () if told else (Cancelled(**_marks(history), step=last_checkpoint_step(history.events)),)
    return Decision(Action.STOP, written, message="cancelled")


def decide_begin(history: History, cluster: ClusterView, budgets: Budgets) -> Decision | None:
    """At a start of the batch script: a restart Slurm made without the batch script asking
    (its node died, a preemption's grace ran out, an administrator requeued) is recorded and
    counted. None: nothing to record, train."""
    ours = [e for e in history.events if isinstance(e, Requeue) and e.job_id == history.job_id]
    mark = _marks(history)
    if history.restart <= len(ours):
        trapped = ours[-1] if ours and ours[-1].by == BY_SLURM and ours[-1].restart == history.restart - 1 else None
        if trapped is None:
            return None
        # The last life's SIGTERM trap recorded Slurm's requeue as it happened: its budget now.
        spent = over_budget(tuple(e for e in history.events if e is not trapped), trapped.cause, budgets)
        if not spent:
            return None
        failure = Failure(**mark, cause=Cause.BUDGET, reason=spent, action=Action.FAIL.value)
        return Decision(Action.FAIL, (failure,), message=spent)
    previous = _previous_life(history)
    written: list[Event] = []
    if history.previous_shell_terminated or any(
        isinstance(e, Cancelled) or _saved_for(e) is StopReason.PREEMPT for e in previous
    ):
        # The tasks saved for SIGTERM, or the shell got one (an admin's requeue, a preemption's
        # grace ended, its trap killed before it recorded it), then Slurm requeued: a preemption.
        cause = Cause.PREEMPT
    else:
        cause = Cause.NODE_FAILURE
        nodes = next((e.nodes for e in reversed(previous) if isinstance(e, Start)), [])
        written.append(Failure(**mark, cause=cause, nodes=cluster.failed(nodes), by=BY_SLURM))
    written.append(Requeue(**mark, cause=cause, by=BY_SLURM))
    spent = over_budget(history.events, cause, budgets)
    if spent:
        written.append(Failure(**mark, cause=Cause.BUDGET, reason=spent, action=Action.FAIL.value))
        return Decision(Action.FAIL, tuple(written), message=spent)
    return Decision(Action.REQUEUE, tuple(written), message=f"restarted by Slurm ({cause.value})")


def decide_guard(history: History, ended: JobEnd, budgets: Budgets) -> Decision:
    """The run's guardian job started: the training job (history.job_id, its last life
    history.restart) ended without completing (`--dependency=afternotok`). When the journal
    says nothing ended the run on purpose (no finish, no failure that ended it, no cancel, no
    resubmission), its batch script died before it could decide (the batch node was lost, which
    Slurm does not requeue under --no-kill): REQUEUE, meaning the guardian submits the run dir's
    job.sbatch again; the new job resumes from the newest complete checkpoint. Charged to the
    restart budget of the cause Slurm's state gives."""
    names = {history.job_id, *history.aliases}
    # The last life's own words (an earlier life's `cancelled` may have been a preemption Slurm
    # requeued), and hpctrain-cancel's, which ends the job whatever life it names.
    mine = [
        e
        for e in history.events
        if e.job_id in names
        and (e.restart == ended.restarts or (isinstance(e, Cancelled) and e.by == CANCELLED_BY_COMMAND))
    ]
    if ended.state == "COMPLETED" or any(isinstance(e, Finish) for e in history.events):
        return Decision(Action.FINISH, message="the run finished: nothing to do")
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
            action="resubmit",
        )
        return Decision(Action.REQUEUE, (failure,), message=f"{said}: submitting the run again ({decided.cause.value})")
    cause = _GUARDED_CAUSES.get(ended.state or "", Cause.NODE_FAILURE)
    lost = [ended.batch_host] if cause is Cause.NODE_FAILURE and ended.batch_host else []
    failure = Failure(**mark, cause=cause, nodes=lost, reason=f"{said} before its batch script decided", by=BY_GUARDIAN)
    spent = over_budget(history.events, cause, budgets)
    if spent:
        budget = Failure(**mark, cause=Cause.BUDGET, reason=spent, action=Action.FAIL.value, by=BY_GUARDIAN)
        return Decision(Action.FAIL, (failure, budget), message=spent)
    written = (replace(failure, action="resubmit"), Requeue(**mark, cause=cause, by=BY_GUARDIAN))
    return Decision(Action.REQUEUE, written, message=f"{said}: submitting the run again ({cause.value})")


def decide_keeper(
    history: History, host: str, silent_s: float, outcome: Outcome, cluster: ClusterView, budgets: Budgets
) -> Decision:
    """The batch host's keeper (a step on another node of the job) heard nothing from the batch
    script's node for `silent_s` seconds while Slurm still shows this life RUNNING: the batch
    script is gone (its node died silently, or Slurm removed the node from the job and killed
    the script without ending the job), and nothing else would end this life before its time
    limit. REQUEUE, meaning the keeper submits the run dir's job.sbatch again without that node
    and cancels this job (a requeue would wait, COMPLETING, until Slurm hears from the silent
    node: SlurmdTimeout), charged to node_failure; FAIL when that budget is spent (the keeper
    cancels the job); STOP when the life had ended on purpose (finish, fail, cancel). A requeue
    the batch script had decided before it died is carried out as decided, charged once.
    `outcome`: the facts of this life's last step (its relaunches' exclusions)."""
    mine = [e for e in history.events if e.job_id == history.job_id and e.restart == history.restart]
    if any(isinstance(e, Finish) for e in history.events):
        return Decision(Action.STOP, message="the run finished: nothing to do")
    mark = _marks(history)
    said = f"nothing heard from the batch host {host} for {silent_s:.0f} s while the job runs"
    failure = Failure(
        **mark,
        cause=Cause.NODE_FAILURE,
        nodes=[host],
        reason=said,
        by=BY_KEEPER,
        detected_by=DETECTED_BY_HEARTBEAT,
        action="resubmit",
    )
    for event in reversed(mine):
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
    kept_out, nodes = _requeue_shape(_keep_out(outcome, cluster, [host]), outcome, cluster)
    excluded = sorted(kept_out)
    requeue = Requeue(**mark, cause=Cause.NODE_FAILURE, excluded=excluded, nodes=nodes, by=BY_KEEPER)
    message = f"{said}: submitting the run again without it (node_failure)"
    return Decision(Action.REQUEUE, (failure, requeue), tuple(excluded), message)


# srun's exit code for a task ended by SIGTERM's default action (128 + 15).
SIGTERMED = 143

# Slurm's end state -> the restart budget a guardian's resubmission is charged to. Any other
# state (FAILED, NODE_FAIL, BOOT_FAIL, or a record Slurm no longer has): the batch node was lost.
_GUARDED_CAUSES = {
    "PREEMPTED": Cause.PREEMPT,  # PreemptMode=CANCEL
    "TIMEOUT": Cause.TIMELIMIT,
    "DEADLINE": Cause.TIMELIMIT,
    "OUT_OF_MEMORY": Cause.CRASH,
}


# ---- the pieces, each a pure function of the facts ------------------------------------------------


def classify(since: Sequence[Event], outcome: Outcome, lost: list[str], preempting: bool | None = False) -> Cause:
    """Why the step ended, judged only by this step's events: a life that died before `start`
    is not judged by the previous life's stop. `preempting`: the job's record shows a PreemptTime
    (a preemption's grace runs); None: the record could not be read."""
    saved = next((r for r in map(_saved_for, reversed(since)) if r), None)
    if outcome.warned or saved is StopReason.TIMELIMIT or outcome.exit_code == WORKER_SAVED_FOR_TIMELIMIT:
        return Cause.TIMELIMIT  # the allocation ends soon: only a requeue helps, whatever else failed
    peer_died = _a_peers_death(saved, since, outcome, preempting)
    if not peer_died and (
        saved in (StopReason.PREEMPT, StopReason.INTERRUPT) or outcome.exit_code == WORKER_SAVED_AND_STOPPED
    ):
        return Cause.PREEMPT  # SIGTERM to the tasks but not to this shell: Slurm's preemption
    if preempting and not lost and outcome.exit_code in (None, SIGTERMED):
        # Inside a preemption's grace: no step launched (`control begin` saw the grace), or one
        # that Slurm's SIGTERM reached before the task could hold it (srun was still starting
        # it). Before: charged as a crash, and the crash budget is 1.
        return Cause.PREEMPT
    if lost:
        return Cause.NODE_FAILURE
    if outcome.exit_code == WORKER_HUNG or any(_is(e, Cause.HANG) for e in since):
        return Cause.HANG  # the watchdog wrote it: srun may pass its exit code on as another
    return Cause.CRASH


def lost_nodes(since: Sequence[Event], outcome: Outcome, cluster: ClusterView) -> list[str]:
    """The step's nodes that failed or left the allocation (an idle spare failing is not the
    step's loss; a drained node is not a failed one)."""
    starts = [e for e in since if isinstance(e, Start)]
    # Before its `start`, the step ran (or tried to) on every allocated node not excluded.
    launched_on = set(cluster.original or cluster.allocated) - set(outcome.excluded)
    step_nodes = set(starts[-1].nodes) if starts else launched_on
    gone = step_nodes - set(cluster.allocated) if cluster.allocated else set()
    # A node the heartbeat watcher heard fall silent: Slurm may list it as up for minutes yet.
    silent = silent_nodes(since) & step_nodes
    return sorted(gone | silent | set(cluster.failed(sorted(step_nodes))))


def silent_nodes(since: Sequence[Event]) -> set[str]:
    """The nodes the batch script's heartbeat watcher declared silent in this step."""
    return {node for e in since if isinstance(e, Silent) for node in e.nodes}


def over_budget(events: Sequence[Event], cause: Cause, budgets: Budgets) -> str | None:
    done = restarts_by_cause(events)
    if done[cause.value] + 1 > budgets.allowed(cause):
        return f"restart budget for {cause.value} spent ({done[cause.value]} of {budgets.allowed(cause)})"
    if sum(done.values()) + 1 > budgets.total:
        return f"slurm.max_restarts spent ({sum(done.values())} of {budgets.total} restarts in all)"
    return None


def lineage(events: Sequence[Event], job_id: str, aliases: Sequence[str] = ()) -> tuple[Event, ...]:
    """The events of this run's job and of the jobs it was resubmitted from (a refused requeue
    goes on in a new job: its budgets go on too). Events without a job (checkpoints) stay.
    A `retry` (hpctrain-submit --retry) starts a new budget window: the lineage never reaches
    back past a retried job, so a run whose crash budget was spent gets its budgets again."""
    jobs, grew = {job_id, *aliases}, True
    retried = {e.job_id for e in events if isinstance(e, Retry)}
    while grew:
        before = len(jobs)
        jobs |= {
            e.job_id
            for e in events
            if isinstance(e, Failure) and e.new_job_id in jobs - retried and e.job_id and e.new_job_id
        }
        grew = len(jobs) > before
    return tuple(e for e in events if e.job_id is None or e.job_id in jobs)


def restarts_by_cause(events: Sequence[Event]) -> Counter[str]:
    """Requeues and relaunches by their cause's word (slurm.restart_budget's keys)."""
    return Counter(str(e.cause) for e in events if isinstance(e, (Requeue, Relaunch)))


def checkpoint_interval_s(events: Sequence[Event]) -> float | None:
    """Seconds between periodic checkpoints in one life (median), or None before two."""
    gaps, previous = [], None
    for event in events:
        if isinstance(event, Start):
            previous = None
        elif isinstance(event, Checkpoint) and event.reason == CheckpointReason.PERIODIC:
            if previous is not None:
                gaps.append(event.time - previous)
            previous = event.time
    return statistics.median(gaps) if gaps else None


def last_checkpoint_step(events: Sequence[Event]) -> int | None:
    steps = [e.step for e in events if isinstance(e, Checkpoint)]
    return steps[-1] if steps else None


def _relaunch(
    history: History, outcome: Outcome, cluster: ClusterView, keep_out: set[str], lost: list[str]
) -> Relaunch | None:
    """A relaunch on the nodes left, when enough of them are in service (a drained spare is
    not) and the allocation has time for at least one checkpoint interval before its warning,
    and no preemption's grace is running (Slurm would not warn the new step again). Enough: the
    training nodes (a spare takes a lost one's place), or with slurm.nodes a range its low end
    (the step goes on with the survivors, fewer processes: trainer.elastic)."""
    if outcome.warned or cluster.time_left_s is None or cluster.preempting:
        return None
    survivors = [n for n in cluster.allocated if n not in keep_out and cluster.service(n) is Service.UP]
    interval = checkpoint_interval_s(history.events) or outcome.signal_delay_s
    least = outcome.fewest_nodes
    if len(survivors) < least or cluster.time_left_s < outcome.signal_delay_s + interval:
        return None
    excluded = sorted(keep_out | set(cluster.drained(cluster.allocated)))
    step = survivors[: outcome.nodes_wanted]
    return Relaunch(
        **_marks(history),
        cause=Cause.NODE_FAILURE,
        failed=lost,
        excluded=excluded,
        nodes=step,
        spare_nodes=len(survivors) - len(step),
    )


def _keep_out(outcome: Outcome, cluster: ClusterView, lost: list[str]) -> set[str]:
    """The user's slurm.exclude, the nodes lost now, and nodes excluded earlier that Slurm has
    not returned to service: one that is back is allowed again."""
    earlier = {n for n in outcome.excluded if cluster.service(n) is not Service.UP}
    return set(outcome.user_exclude) | set(lost) | (earlier - set(outcome.user_exclude))


def _requeue_shape(keep_out: set[str], outcome: Outcome, cluster: ClusterView) -> tuple[set[str], int | None]:
    """The requeued job's ExcNodeList, and its node count when it must shrink (None: as it is).

    It holds training nodes and spares. Counted are the nodes that could run it now: its
    partition's (not another partition's), with the features its --constraint asks for, not kept
    out, and in service (not down, not drained by an administrator). Enough for all it holds: keep
    the failed nodes out. Fewer, but enough to train: keep them out and give up the spares it
    cannot have now, rather than wait for a repair or the end of a maintenance. Too few to train:
    keep only slurm.exclude out, so the job starts once nodes are back (failed ones kept out, it
    could wait for ever: Reason=BadConstraints), and ask only for its training nodes, so any of
    them coming back will do. Slurm starts no job on a down node anyway."""
    needed = len(cluster.original or cluster.allocated)
    if not cluster.nodes:
        return keep_out, None
    pool = set(cluster.partition_nodes or cluster.nodes) - keep_out
    if cluster.constraint_nodes is not None:
        pool &= cluster.constraint_nodes
    usable = {n for n in pool if cluster.service(n) is Service.UP}
    if len(usable) >= needed:
        return keep_out, None
    least = outcome.fewest_nodes
    if least < outcome.nodes_wanted:
        # slurm.nodes is a range: Slurm starts the job on as many as it has within it. Too few
        # even for its low end: keep only slurm.exclude out, as below, so a node back will do.
        return (keep_out if len(usable) >= least else set(outcome.user_exclude)), None
    if len(usable) >= outcome.nodes_wanted:
        return keep_out, len(usable)
    return set(outcome.user_exclude), (outcome.nodes_wanted if needed > outcome.nodes_wanted else None)


def _a_peers_death(saved: StopReason | None, since: Sequence[Event], outcome: Outcome, preempting: bool | None) -> bool:
    """A `preempt` stop one task wrote alone while it started (no `start` in this step: the ranks
    never met to agree on it), whose SIGTERM Slurm did not send as a preemption (no PreemptTime,
    and this shell got none, or decide_cancelled would judge), while not every task stopped
    cleanly (srun's code is not 76): srun's --kill-on-bad-exit ended the step after another task
    died, and this one took its SIGTERM for a stop. The death is the cause (before: charged to
    `preempt`, whose budget of 50 let a rank that dies at every start loop 50 times). A stop the
    ranks agreed on after their `start` stays a stop, whatever srun's code (srun SIGTERMs the last
    ranks once the first has left with 76)."""
    return (
        saved is StopReason.PREEMPT
        and preempting is False
        and outcome.exit_code not in (WORKER_SAVED_AND_STOPPED, None)
        and not any(isinstance(e, Start) for e in since)
    )


def _previous_life(history: History) -> Sequence[Event]:
    """What the life before this one (restart - 1) wrote, from its first record of its own on.
    A life that wrote nothing (its batch node died while torch imported) is judged by nothing,
    never by an earlier life's stop. A journal without restart numbers: since the last start."""
    names = {history.job_id, *history.aliases}
    own = [i for i, e in enumerate(history.events) if e.job_id in names and e.restart is not None]
    if not own:
        return _last_life(history.events)
    previous = [i for i in own if history.events[i].restart == history.restart - 1]
    return history.events[previous[0] :] if previous else ()


def _last_life(events: Sequence[Event]) -> Sequence[Event]:
    starts = [i for i, e in enumerate(events) if isinstance(e, Start)]
    return events[starts[-1] :] if starts else ()


def _saved_for(event: Event) -> StopReason | None:
    """The stop signal a forced save answered: its checkpoint, the forced_save record (written
    whatever was chosen: a save skipped for lack of time writes no checkpoint), or the `stop` the
    ranks agreed on before the save (all that is left when the save was killed)."""
    return stop_reason(event.reason) if isinstance(event, (Checkpoint, ForcedSave, Stop)) else None


def _is(event: Event, cause: Cause) -> bool:
    return isinstance(event, Failure) and event.cause == cause


def _marks(history: History) -> dict:
    return {"job_id": history.job_id, "restart": history.restart}
