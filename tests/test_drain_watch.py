"""A drained training node left for a free spare (hpctrain.recovery.drain_watch): the watcher's
decision as a table over sinfo's own words (captured on the dev cluster, tests/fixtures/slurm),
then what the control step makes of the step the watcher stopped
(tests/test_slurm_drain.py runs it on the dev cluster)."""

from __future__ import annotations

import pytest
from test_decide import EARLIER, JOB, ckpt, sinfo, start, stop

from hpctrain.recovery.decide import History, decide
from hpctrain.recovery.drain_watch import DrainMove, drain_move
from hpctrain.recovery.facts import Budgets, ClusterView, Outcome
from hpctrain.recovery.history import lives_without_progress
from hpctrain.run.causes import Action, Cause
from hpctrain.run.events import Draining, Relaunch, Requeue
from hpctrain.run.exitcodes import WORKER_SAVED_AND_STOPPED

ALL = ("node1", "node2", "node3")

MOVES = {
    # node3 draining (sinfo_spare_draining: `draining`, reason hpctrain-test), trains; node2 idle.
    "a training node draining, a spare free: to the spare": (
        "spare_draining",
        ("node1", "node3"),
        ALL,
        DrainMove(["node3"], ["hpctrain-test"], ["node2"]),
    ),
    "the spare is the one draining: nothing to do": ("spare_draining", ("node1", "node2"), ALL, None),
    "no spare in the job: trains on": ("spare_draining", ("node1", "node3"), ("node1", "node3"), None),
    # node3 drained (sinfo_node3_drained: `drained`, Kill task failed), trains; node1 idle.
    "drained, not only draining: the same": (
        "node3_drained",
        ("node2", "node3"),
        ALL,
        DrainMove(["node3"], ["Kill task failed"], ["node1"]),
    ),
    "nothing drains: nothing to do": ("idle", ("node1", "node2"), ALL, None),
    # A spare Slurm no longer lists (removed from the cluster): no spare in service.
    "a node Slurm does not list: no spare": ("spare_draining", ("node1", "node3"), ("node1", "node3", "node9"), None),
}


@pytest.mark.parametrize("name", list(MOVES))
def test_drain_move(name: str) -> None:
    fixture, step, job, move = MOVES[name]
    assert drain_move(step, job, sinfo(fixture)) == move


def test_two_drained_and_one_spare_move_nothing() -> None:
    states = sinfo("spare_draining")
    both = {**states, "node1": states["node3"].__class__("node1", "draining", "maint")}
    assert drain_move(("node1", "node3"), ALL, both) is None


DRAINING = Draining(time=150.0, job_id=JOB, restart=0, nodes=["node3"], reasons=["maint"], spares=["node2"])
# The ranks agreed to stop at step 61 and saved it, then left with the stop's code.
SAVED = (stop(61, "preempt", 151.0), ckpt(61, "preempt", 152.0))


def _decide(since: tuple, allocated: tuple = ALL, preempting: bool | None = False, budgets: dict | None = None):
    cluster = ClusterView(sinfo("spare_draining"), allocated, allocated, 3000.0, preempting=preempting)
    history = History(JOB, 0, (*EARLIER, *since), since)
    outcome = Outcome(exit_code=WORKER_SAVED_AND_STOPPED, nodes_wanted=2, signal_delay_s=30.0)
    return decide(history, outcome, cluster, Budgets(budgets if budgets is not None else {"preempt": 50}))


def test_a_step_stopped_for_a_drain_is_relaunched_on_the_spare_charged_to_nothing() -> None:
    # No budget for any cause: a drain spends none.
    decision = _decide((start("node1", "node3"), DRAINING, *SAVED), budgets={})
    assert decision.action is Action.RELAUNCH, decision.message
    (relaunch,) = decision.events
    assert isinstance(relaunch, Relaunch)
    assert (relaunch.cause, relaunch.nodes, relaunch.excluded, relaunch.failed) == (
        Cause.DRAIN,
        ["node1", "node2"],
        ["node3"],
        [],
    )


def test_without_the_spare_by_now_it_is_requeued_charged_to_nothing() -> None:
    decision = _decide((start("node1", "node3"), DRAINING, *SAVED), allocated=("node1", "node3"), budgets={})
    assert decision.action is Action.REQUEUE
    (requeue,) = decision.events
    assert isinstance(requeue, Requeue) and requeue.cause == Cause.DRAIN


def test_a_preemption_at_the_same_time_is_a_preemption() -> None:
    decision = _decide((start("node1", "node3"), DRAINING, *SAVED), preempting=True)
    assert decision.action is Action.REQUEUE
    assert [e.cause for e in decision.events if isinstance(e, Requeue)] == [Cause.PREEMPT]


def test_a_stop_without_the_watchers_record_is_still_a_preemption() -> None:
    decision = _decide((start("node1", "node3"), *SAVED))
    assert [e.cause for e in decision.events if isinstance(e, Requeue)] == [Cause.PREEMPT]


def test_a_drain_is_no_life_without_progress() -> None:
    # Life 0 crashed without a checkpoint; life 1, ending now for a drain, is skipped (neither
    # counted nor breaking the row): one life without progress, not two.
    crashed = (start("node1", "node3", t=10.0), Requeue(time=20.0, job_id=JOB, restart=0, cause=Cause.CRASH))
    drained = (start("node1", "node3", t=30.0, restart=1),)
    assert lives_without_progress([*crashed, *drained], (JOB, 1), Cause.DRAIN) == 1
    assert lives_without_progress([*crashed, *drained], (JOB, 1), Cause.CRASH) == 2
