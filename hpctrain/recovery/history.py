"""The run's journal as recovery reads it: which events are this run's (its lineage), what this
life and the one before it wrote, and the restarts each budget has been charged.

Pure functions of the events (hpctrain.run.events); hpctrain.recovery.decide decides with them.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from hpctrain.recovery.facts import Budgets
from hpctrain.run.causes import RESTART_CAUSES, Cause, CheckpointReason, StopReason, stop_reason
from hpctrain.run.events import (
    BY_KEEPER,
    Checkpoint,
    Event,
    Failure,
    ForcedSave,
    Relaunch,
    Requeue,
    Retry,
    Silent,
    Start,
    Stop,
    StragglerLeaving,
)


@dataclass(frozen=True)
class History:
    job_id: str
    restart: int  # SLURM_RESTART_COUNT of this life
    events: tuple[Event, ...]  # the run's events for this job and the jobs it was resubmitted from
    since_launch: tuple[Event, ...] = ()  # written since the step that just ended was launched
    # Other names of this job: an array task (SLURM_JOB_ID 44) is also `36_7`, the id
    # submission.json and hpctrain-cancel use (the guardian reads them from Slurm's record).
    aliases: tuple[str, ...] = ()
    # The life before this one's batch shell got SIGTERM (its trap's mark, RunDir.sigterm_mark):
    # Slurm told it to stop, so a restart with nothing recorded was no node failure.
    previous_shell_terminated: bool = False

    @property
    def names(self) -> set[str]:
        return {self.job_id, *self.aliases}

    def mine(self) -> list[Event]:
        """What this life wrote (this job, this restart)."""
        return [e for e in self.events if e.job_id == self.job_id and e.restart == self.restart]


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
    """Requeues and relaunches by their cause's word (slurm.restart_budget's keys). A step launched
    again because srun started no task (Cause.LAUNCH) is no restart: nothing of the run failed."""
    return Counter(str(e.cause) for e in events if isinstance(e, (Requeue, Relaunch)) and e.cause in RESTART_CAUSES)


def over_budget(events: Sequence[Event], cause: Cause, budgets: Budgets) -> str | None:
    done = restarts_by_cause(events)
    if done[cause.value] + 1 > budgets.allowed(cause):
        return f"restart budget for {cause.value} spent ({done[cause.value]} of {budgets.allowed(cause)})"
    if sum(done.values()) + 1 > budgets.total:
        return f"slurm.max_restarts spent ({sum(done.values())} of {budgets.total} restarts in all)"
    return None


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


# Lives that end for these made no mistake of the run's: they never count as lives without
# progress (nor break a row of them). A preemption or the time limit without a save (GraceTime 0)
# loses the life's steps by the site's doing; a launch that started no task trained nothing; a
# drained node is left after a save, by an administrator's doing; a straggler's node likewise.
_NOT_THE_RUNS = (Cause.PREEMPT, Cause.TIMELIMIT, Cause.LAUNCH, Cause.DRAIN, Cause.STRAGGLER)


def lives_without_progress(events: Sequence[Event], this_life: tuple[str, int], ending_for: Cause) -> int:
    """The run's lives in a row, newest last, that ended in a failure without a checkpoint newer
    than every one before them; `this_life` (job id, restart), ending now for `ending_for`, is the
    newest. A life is what one start of the batch script trains, its relaunches included; a life
    that wrote such a checkpoint ends the row, one ended for a cause in _NOT_THE_RUNS is skipped."""
    lives: dict[tuple[str | None, int | None], list] = {}  # life -> [made progress, ended for]
    newest: int | None = None
    current: tuple[str | None, int | None] | None = None
    for event in events:
        if isinstance(event, Start):
            current = (event.job_id, event.restart)
            lives.setdefault(current, [False, None])
            newest = event.resumed_from_step if newest is None else newest
        elif isinstance(event, Checkpoint) and current is not None:
            if newest is None or event.step > newest:
                newest = event.step
                lives[current][0] = True
        elif isinstance(event, Requeue) and (event.job_id, event.restart) in lives:
            lives[(event.job_id, event.restart)][1] = event.cause
    if this_life in lives:
        lives[this_life][1] = ending_for
    row = 0
    for progressed, ended_for in reversed(list(lives.values())):
        if progressed:
            break
        if ended_for is None or ended_for in _NOT_THE_RUNS:
            continue
        row += 1
    return row


def nodes_failing_in_a_row(events: Sequence[Event], lives: int) -> set[str]:
    """The nodes named by the failures (`failure` events with `nodes`: a health check, a silent
    node, Slurm's NODE_FAIL, a node lost before its start) of `lives` lives in a row, wherever in
    the run's past: such a node is kept out of its next lives (slurm.health.keep_out_after_lives),
    though Slurm lists it in service. A life is a (job, restart), in the order the journal first
    names it; 0 lives: none."""
    if lives <= 0:
        return set()
    named: dict[tuple[str | None, int | None], set[str]] = {}
    for event in events:
        if event.job_id is None:  # a record of no life's own (a checkpoint's, written by rank 0)
            continue
        failed = named.setdefault((event.job_id, event.restart), set())
        if isinstance(event, Failure) and event.nodes:
            failed.update(event.nodes)
    row = list(named.values())
    return {node for at in range(len(row) - lives + 1) for node in set.intersection(*row[at : at + lives])}


def unhealthy_nodes(since: Sequence[Event]) -> set[str]:
    """The nodes that failed a check at the start of this step (hpctrain.process.node_health)."""
    return {node for e in since if isinstance(e, Failure) and e.cause == Cause.NODE_HEALTH for node in e.nodes or ()}


def silent_nodes(since: Sequence[Event]) -> set[str]:
    """The nodes the batch script's heartbeat watcher declared silent in this step."""
    return {node for e in since if isinstance(e, Silent) for node in e.nodes}


def stragglers_left(history: History) -> set[str]:
    """The nodes this life (this start of the batch script, its relaunches included) left for a
    straggler (`straggler_leaving`): kept out of its later relaunches too, though Slurm lists them
    in service. A requeued job's new allocation may have them again: by then they may be well."""
    return {
        node
        for e in history.events
        if isinstance(e, StragglerLeaving) and e.job_id in history.names and e.restart == history.restart
        for node in e.nodes
    }


def previous_life(history: History) -> Sequence[Event]:
    """What the life before this one (restart - 1) wrote, from its first record of its own on.
    A life that wrote nothing (its batch node died while torch imported) is judged by nothing,
    never by an earlier life's stop."""
    own = [i for i, e in enumerate(history.events) if e.job_id in history.names and e.restart is not None]
    previous = [i for i in own if history.events[i].restart == history.restart - 1]
    return history.events[previous[0] :] if previous else ()


def decided_requeue(history: History) -> Requeue | None:
    """This life's own requeue decision (after-step's, or the keeper's), the newest: its node
    count is what the requeued or resubmitted job asks for."""
    decided = [e for e in history.mine() if isinstance(e, Requeue) and e.by in (None, BY_KEEPER)]
    return decided[-1] if decided else None


def last_relaunch_excluded(history: History) -> tuple[str, ...]:
    """The srun --exclude of this life's last step: its newest relaunch's (none: the first step's)."""
    relaunches = [e for e in history.events if isinstance(e, Relaunch) and e.restart == history.restart]
    return tuple(relaunches[-1].excluded) if relaunches else ()


def saved_for(event: Event) -> StopReason | None:
    """The stop signal a forced save answered: its checkpoint, the forced_save record (written
    whatever was chosen: a save skipped for lack of time writes no checkpoint), or the `stop` the
    ranks agreed on before the save (all that is left when the save was killed)."""
    return stop_reason(event.reason) if isinstance(event, (Checkpoint, ForcedSave, Stop)) else None


def is_failure(event: Event, cause: Cause) -> bool:
    return isinstance(event, Failure) and event.cause == cause


def marks(history: History) -> dict:
    """The fields that stamp an event as this life's."""
    return {"job_id": history.job_id, "restart": history.restart}


def launches_lost(history: History) -> int:
    """This life's steps launched again in a row because srun started no task (relaunches with
    Cause.LAUNCH since the life's last `start`)."""
    count = 0
    for event in reversed(history.events):
        if (event.job_id, event.restart) != (history.job_id, history.restart):
            continue
        if isinstance(event, Start):
            break
        if isinstance(event, Relaunch) and event.cause is Cause.LAUNCH:
            count += 1
    return count


def relaunched_for(history: History, cause: Cause) -> bool:
    """This life's step now ending was relaunched in the job after a `cause` (its last relaunch)."""
    ours = [
        e
        for e in history.events
        if isinstance(e, Relaunch) and (e.job_id, e.restart) == (history.job_id, history.restart)
    ]
    return bool(ours) and ours[-1].cause is cause
