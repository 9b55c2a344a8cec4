"""Recovery at a start of the batch script, as pure functions: `control begin` records a restart
Slurm made on its own (its node died, a preemption's grace ran out, an administrator requeued) and
counts it, then launches the training step, or does not inside a preemption's grace.

Part of hpctrain.recovery.decide (which names every moment's function); tests/test_decide.py is
their table.
"""

from __future__ import annotations

from hpctrain.recovery.decision import Decision
from hpctrain.recovery.facts import Budgets, ClusterView
from hpctrain.recovery.history import History, marks, over_budget, previous_life, saved_for
from hpctrain.run.causes import Action, Cause, StopReason
from hpctrain.run.events import BY_SLURM, Cancelled, Event, Failure, Requeue, Start


def decide_begin(history: History, cluster: ClusterView, budgets: Budgets) -> Decision | None:
    """At a start of the batch script: a restart Slurm made without the batch script asking
    (its node died, a preemption's grace ran out, an administrator requeued) is recorded and
    counted. None: nothing to record, train."""
    ours = [e for e in history.events if isinstance(e, Requeue) and e.job_id == history.job_id]
    mark = marks(history)
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
    previous = previous_life(history)
    written: list[Event] = []
    if history.previous_shell_terminated or any(
        isinstance(e, Cancelled) or saved_for(e) is StopReason.PREEMPT for e in previous
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


def decide_start(history: History, cluster: ClusterView, budgets: Budgets) -> Decision:
    """`control begin`: decide_begin's record, then LAUNCH the training step; FAIL when a restart
    budget is spent; REQUEUE (launch nothing: after-step requeues the preemption it is) inside a
    preemption's grace, where a step launched now would be warned by nobody and SIGTERMed as it
    starts, at the grace's end."""
    begun = decide_begin(history, cluster, budgets)
    if begun is not None and begun.action is Action.FAIL:
        return begun
    events, message = (begun.events, begun.message) if begun is not None else ((), "")
    return Decision(Action.REQUEUE if cluster.preempting else Action.LAUNCH, events, message=message)
