"""How a training step ended, and where the run can go on: the pieces hpctrain.recovery.decide
puts together, each a pure function of the facts (hpctrain.recovery.facts) and the history
(hpctrain.recovery.history).
"""

from __future__ import annotations

from collections.abc import Sequence

from hpctrain.recovery.facts import ClusterView, Outcome, Service
from hpctrain.recovery.history import (
    History,
    checkpoint_interval_s,
    is_failure,
    marks,
    saved_for,
    silent_nodes,
    unhealthy_nodes,
)
from hpctrain.run.causes import Cause, StopReason, stop_cause
from hpctrain.run.events import Draining, Event, Relaunch, Start, StragglerLeaving
from hpctrain.run.exitcodes import WORKER_HUNG, WORKER_SAVED_AND_STOPPED

# srun's exit code for a task ended by SIGTERM's default action (128 + 15).
SIGTERMED = 143


def classify(since: Sequence[Event], outcome: Outcome, lost: list[str], preempting: bool | None = False) -> Cause:
    """Why the step ended, judged only by this step's events: a life that died before `start`
    is not judged by the previous life's stop. `preempting`: the job's record shows a PreemptTime
    (a preemption's grace runs); None: the record could not be read."""
    saved = next((r for r in map(saved_for, reversed(since)) if r), None)
    stopped = stop_cause(saved, outcome.exit_code)  # by the stop table (hpctrain.run.causes.STOP_TABLE)
    if outcome.warned or stopped is Cause.TIMELIMIT:
        return Cause.TIMELIMIT  # the allocation ends soon: only a requeue helps, whatever else failed
    peer_died = _a_peers_death(saved, since, outcome, preempting)
    if not peer_died and stopped is Cause.PREEMPT:
        if not lost and preempting is not True and any(isinstance(e, Draining) for e in since):
            return Cause.DRAIN  # the watcher's SIGTERM: a training node drains, a spare is free
        if not lost and preempting is not True and any(isinstance(e, StragglerLeaving) for e in since):
            return Cause.STRAGGLER  # the watcher's SIGTERM: a straggler's node, a spare is free
        return Cause.PREEMPT  # SIGTERM to the tasks but not to this shell: Slurm's preemption
    if preempting and not lost and outcome.exit_code in (None, SIGTERMED):
        # Inside a preemption's grace: no step launched (`control begin` saw the grace), or one
        # that Slurm's SIGTERM reached before the task could hold it (srun was still starting
        # it). Before: charged as a crash, and the crash budget is 1.
        return Cause.PREEMPT
    if lost:
        return Cause.NODE_FAILURE
    if outcome.exit_code == WORKER_HUNG or any(is_failure(e, Cause.HANG) for e in since):
        return Cause.HANG  # the watchdog wrote it: srun may pass its exit code on as another
    return Cause.CRASH


def launch_lost(since: Sequence[Event], outcome: Outcome) -> bool:
    """srun failed without starting any task: no task's mark (hpctrain.run.launch_marks),
    nothing journaled since the launch, no signal taken by the batch shell. slurmctld away (srun
    gives up after about 20 s) or the step refused: nothing of the run failed."""
    return (
        outcome.task_began is False
        and outcome.exit_code not in (None, 0)
        and not outcome.terminated
        and not outcome.warned
        and not since
    )


def lost_nodes(since: Sequence[Event], outcome: Outcome, cluster: ClusterView) -> list[str]:
    """The step's nodes that failed, failed their checks, or left the allocation (an idle spare
    failing is not the step's loss; a drained node is not a failed one)."""
    starts = [e for e in since if isinstance(e, Start)]
    # Before its `start`, the step ran (or tried to) on every allocated node not excluded.
    launched_on = set(cluster.original or cluster.allocated) - set(outcome.excluded)
    step_nodes = set(starts[-1].nodes) if starts else launched_on
    gone = step_nodes - set(cluster.allocated) if cluster.allocated else set()
    # A node the heartbeat watcher heard fall silent: Slurm may list it as up for minutes yet.
    silent = silent_nodes(since) & step_nodes
    # A node that failed its checks as the step started (hpctrain.process.node_health): alive, in
    # service for Slurm, and unfit for this run.
    unhealthy = unhealthy_nodes(since) & launched_on
    return sorted(gone | silent | unhealthy | set(cluster.failed(sorted(step_nodes))))


def relaunch(
    history: History,
    outcome: Outcome,
    cluster: ClusterView,
    kept_out: set[str],
    lost: list[str],
    cause: Cause = Cause.NODE_FAILURE,
) -> Relaunch | None:
    """A relaunch on the nodes left, when enough of them are in service (a drained spare is
    not) and the allocation has time for at least one checkpoint interval before its warning,
    and no preemption's grace is running (Slurm would not warn the new step again), leaving out
    the nodes its node check found unfit (cluster.checked). Enough: the
    training nodes (a spare takes a lost one's place), or with slurm.nodes a range its low end
    (the step goes on with the survivors, fewer processes: trainer.elastic)."""
    if outcome.warned or cluster.time_left_s is None or cluster.preempting:
        return None
    checked = cluster.checked
    # Not a node that did not answer the node check (service: failed), nor one where the old
    # step's processes would not end (hpctrain.recovery.node_check).
    unfit = set(checked.unanswering) | set(checked.lingering)
    survivors = [n for n in cluster.allocated if n not in kept_out | unfit and cluster.service(n) is Service.UP]
    interval = checkpoint_interval_s(history.events) or outcome.signal_delay_s
    least = outcome.fewest_nodes
    if len(survivors) < least or cluster.time_left_s < outcome.signal_delay_s + interval:
        return None
    excluded = sorted(kept_out | set(cluster.drained(cluster.allocated)) | (unfit & set(cluster.allocated)))
    step = survivors[: outcome.nodes_wanted]
    return Relaunch(
        **marks(history),
        cause=cause,
        failed=lost,
        excluded=excluded,
        nodes=step,
        spare_nodes=len(survivors) - len(step),
        stale_ended=checked.ended if checked.nodes else None,
        unanswered=sorted(checked.unanswering),
        lingering=sorted(checked.lingering),
    )


def keep_out(outcome: Outcome, cluster: ClusterView, lost: list[str]) -> set[str]:
    """The user's slurm.exclude, the nodes lost now (a spare that did not answer a relaunch's
    node check too), and nodes excluded earlier that Slurm has not returned to service: one that
    is back is allowed again."""
    earlier = {n for n in outcome.excluded if cluster.service(n) is not Service.UP}
    dead = set(cluster.checked.unanswering)
    return set(outcome.user_exclude) | set(lost) | dead | (earlier - set(outcome.user_exclude))


def requeue_shape(kept_out: set[str], outcome: Outcome, cluster: ClusterView) -> tuple[set[str], int | None]:
    """The requeued job's ExcNodeList, and its node count when it must shrink (None: as it is).

    It holds training nodes and spares. Counted are the nodes that could run it now: its
    partition's (not another partition's), with the features its --constraint asks for and the
    GPUs and memory per node it asks for (hpctrain.recovery.node_sizes), not kept out, and in
    service (not down, not drained by an administrator). Enough for all it holds: keep the failed
    nodes out. Fewer, but enough to train: keep them out and give up the spares it cannot have
    now, rather than wait for a repair or the end of a maintenance. Too few to train: keep only
    slurm.exclude out, so the job starts once nodes are back (failed ones kept out, it could wait
    for ever: Reason=BadConstraints), and ask only for its training nodes, so any of them coming
    back will do. Slurm starts no job on a down node anyway."""
    needed = len(cluster.original or cluster.allocated)
    if not cluster.nodes:
        return kept_out, None
    pool = set(cluster.partition_nodes or cluster.nodes) - kept_out
    if cluster.constraint_nodes is not None:
        pool &= cluster.constraint_nodes
    if cluster.big_enough_nodes is not None:  # a mixed partition: too small a node never runs it
        pool &= cluster.big_enough_nodes
    usable = {n for n in pool if cluster.service(n) is Service.UP}
    if len(usable) >= needed:
        return kept_out, None
    least = outcome.fewest_nodes
    if least < outcome.nodes_wanted:
        # slurm.nodes is a range: Slurm starts the job on as many as it has within it. Too few
        # even for its low end: keep only slurm.exclude out, as below, so a node back will do.
        return (kept_out if len(usable) >= least else set(outcome.user_exclude)), None
    if len(usable) >= outcome.nodes_wanted:
        return kept_out, len(usable)
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
