"""A straggler's node left for a free spare (trainer.straggler_action=relaunch,
hpctrain.recovery.straggler_move): which nodes the journal names slow, the watcher's move as a
table over sinfo's own words (captured on the dev cluster, tests/fixtures/slurm), then what the
control step makes of the step the watcher stopped (tests/test_slurm_straggler.py runs it on the
dev cluster)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_decide import EARLIER, JOB, ckpt, sinfo, start, stop

from hpctrain.config.slurm_file import straggler_action
from hpctrain.recovery.decide import History, decide
from hpctrain.recovery.facts import Budgets, ClusterView, Outcome
from hpctrain.recovery.history import lives_without_progress
from hpctrain.recovery.straggler_move import JournalTail, StragglerMove, named_stragglers, straggler_move
from hpctrain.run.causes import Action, Cause
from hpctrain.run.events import Failure, Journal, Relaunch, Requeue, Straggler, StragglerCleared, StragglerLeaving
from hpctrain.run.exitcodes import WORKER_SAVED_AND_STOPPED
from hpctrain.status.diagnosis import diagnosis_lines

ALL = ("node1", "node2", "node3")


def named(step: int, ranks: list[int], nodes: list[str], slowdown: list[float]) -> Straggler:
    return Straggler(
        time=100.0 + step,
        job_id=JOB,
        restart=0,
        step=step,
        ranks=ranks,
        nodes=nodes,
        slowdown=slowdown,
        window_steps=20,
    )


def cleared(step: int, ranks: list[int], nodes: list[str]) -> StragglerCleared:
    return StragglerCleared(
        time=100.0 + step, job_id=JOB, restart=0, step=step, ranks=ranks, nodes=nodes, window_steps=20
    )


NAMED = {
    "none named": ([start("node1", "node3")], {}),
    "one rank named": ([start("node1", "node3"), named(40, [1], ["node3"], [1.6])], {"node3": 1.6}),
    "named, then cleared": (
        [start("node1", "node3"), named(40, [1], ["node3"], [1.6]), cleared(60, [1], ["node3"])],
        {},
    ),
    "two ranks of one node: its slowest": (
        [start("node1", "node3"), named(40, [2, 3], ["node3", "node3"], [1.4, 1.9])],
        {"node3": 1.9},
    ),
    "one of them cleared: the other still slow": (
        [start("node1", "node3"), named(40, [2, 3], ["node3", "node3"], [1.4, 1.9]), cleared(60, [3], ["node3"])],
        {"node3": 1.4},
    ),
    # A life's ranks are not the next life's: its start forgets what the life before it named.
    "named in the life before: forgotten": (
        [start("node1", "node3"), named(40, [1], ["node3"], [1.6]), start("node1", "node2")],
        {},
    ),
}


@pytest.mark.parametrize("name", list(NAMED))
def test_named_stragglers(name: str) -> None:
    events, nodes = NAMED[name]
    assert named_stragglers(events) == nodes


MOVES = {
    "a training node named, a spare free: to the spare": (
        "idle",
        {"node3": 1.6},
        ("node1", "node3"),
        ALL,
        StragglerMove(["node3"], [1.6], ["node2"]),
    ),
    "nothing named: nothing to do": ("idle", {}, ("node1", "node3"), ALL, None),
    "named on a node not in the step (left already): nothing to do": (
        "idle",
        {"node3": 1.6},
        ("node1", "node2"),
        ALL,
        None,
    ),
    "no spare in the job: trains on": ("idle", {"node3": 1.6}, ("node1", "node3"), ("node1", "node3"), None),
    # node3 drained (sinfo_node3_drained): the spare is not in service.
    "the spare drained: trains on": ("node3_drained", {"node1": 1.6}, ("node1", "node2"), ALL, None),
    "two named, one spare: trains on": ("idle", {"node1": 1.5, "node3": 1.6}, ("node1", "node3"), ALL, None),
}


@pytest.mark.parametrize("name", list(MOVES))
def test_straggler_move(name: str) -> None:
    fixture, slow, step, job, move = MOVES[name]
    assert straggler_move(slow, step, job, sinfo(fixture)) == move


@pytest.mark.stragglers  # its journal names one on purpose (tests/straggler_audit.py)
def test_the_journal_tail_reads_each_record_once_and_a_torn_line_when_it_is_whole(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    journal = Journal(path)
    tail = JournalTail(path)
    assert tail.new_events() == []  # no journal yet
    journal.write_event(start("node1", "node3"))
    journal.write_event(named(40, [1], ["node3"], [1.6]))
    assert [e.name for e in tail.new_events()] == ["start", "straggler"]
    whole = cleared(60, [1], ["node3"]).to_record()
    line = json.dumps(whole)
    with path.open("a") as out:
        out.write(line[:20])  # a record being written
    assert tail.new_events() == []
    with path.open("a") as out:
        out.write(line[20:] + "\n")
    assert [e.name for e in tail.new_events()] == ["straggler_cleared"]
    assert tail.new_events() == []


LEAVING = StragglerLeaving(time=150.0, job_id=JOB, restart=0, nodes=["node3"], slowdown=[1.6], spares=["node2"])
# The ranks agreed to stop at step 61 and saved it, then left with the stop's code.
SAVED = (stop(61, "preempt", 151.0), ckpt(61, "preempt", 152.0))


def _decide(
    since: tuple,
    allocated: tuple = ALL,
    preempting: bool | None = False,
    budgets: dict | None = None,
    before: tuple = (),
):
    cluster = ClusterView(sinfo("idle"), allocated, allocated, 3000.0, preempting=preempting)
    history = History(JOB, 0, (*EARLIER, *before, *since), since)
    outcome = Outcome(exit_code=WORKER_SAVED_AND_STOPPED, nodes_wanted=2, signal_delay_s=30.0)
    return decide(history, outcome, cluster, Budgets(budgets if budgets is not None else {"preempt": 50}))


def test_a_step_stopped_to_leave_a_straggler_is_relaunched_on_the_spare_charged_to_nothing() -> None:
    # No budget for any cause: leaving a straggler spends none. node3 is in service (sinfo idle):
    # it is kept out by name.
    decision = _decide((start("node1", "node3"), named(40, [1], ["node3"], [1.6]), LEAVING, *SAVED), budgets={})
    assert decision.action is Action.RELAUNCH, decision.message
    (relaunch,) = decision.events
    assert isinstance(relaunch, Relaunch)
    assert (relaunch.cause, relaunch.nodes, relaunch.excluded, relaunch.failed) == (
        Cause.STRAGGLER,
        ["node1", "node2"],
        ["node3"],
        [],
    )
    assert "straggler: node3 left" in decision.message


def test_without_the_spare_by_now_it_is_requeued_without_the_node_charged_to_nothing() -> None:
    decision = _decide((start("node1", "node3"), LEAVING, *SAVED), allocated=("node1", "node3"), budgets={})
    assert decision.action is Action.REQUEUE
    (requeue,) = decision.events
    assert isinstance(requeue, Requeue) and requeue.cause == Cause.STRAGGLER


def test_a_preemption_at_the_same_time_is_a_preemption() -> None:
    decision = _decide((start("node1", "node3"), LEAVING, *SAVED), preempting=True)
    assert [e.cause for e in decision.events if isinstance(e, Requeue)] == [Cause.PREEMPT]


def test_a_node_left_as_a_straggler_stays_out_of_the_lifes_later_relaunches() -> None:
    # The straggler's step was relaunched on node1 and node2; node1 is then lost. node3 is idle in
    # Slurm's eyes, but it was left for its slowness: the relaunch has too few nodes without it.
    left = (
        start("node1", "node3"),
        LEAVING,
        *SAVED,
        Relaunch(
            time=153.0, job_id=JOB, restart=0, cause=Cause.STRAGGLER, nodes=["node1", "node2"], excluded=["node3"]
        ),
    )
    since = (start("node1", "node2", t=160.0), ckpt(80, "periodic", 170.0))
    history = History(JOB, 0, (*EARLIER, *left, *since), since)
    outcome = Outcome(exit_code=1, excluded=("node3",), nodes_wanted=2, signal_delay_s=30.0)
    budgets = Budgets({"node_failure": 5})
    node1_gone = ClusterView(sinfo("idle"), ("node2", "node3"), ALL, 3000.0)
    decision = decide(history, outcome, node1_gone, budgets)
    assert decision.action is Action.REQUEUE, decision.message
    # The same life without the straggler's record: node3, in service, would take node1's place.
    history = History(JOB, 0, (*EARLIER, *[e for e in left if not isinstance(e, StragglerLeaving)], *since), since)
    assert decide(history, outcome, node1_gone, budgets).action is Action.RELAUNCH


def test_leaving_a_straggler_is_no_life_without_progress() -> None:
    crashed = (start("node1", "node3", t=10.0), Requeue(time=20.0, job_id=JOB, restart=0, cause=Cause.CRASH))
    left = (start("node1", "node3", t=30.0, restart=1),)
    assert lives_without_progress([*crashed, *left], (JOB, 1), Cause.STRAGGLER) == 1


def test_the_watcher_reads_the_action_from_the_run_config(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("slurm:\n  nodes: 2\n")
    assert straggler_action(config) == "report"  # a run of an hpctrain before the key
    config.write_text("trainer:\n  straggler_action: relaunch\n")
    assert straggler_action(config) == "relaunch"
    config.write_text("trainer:\n  straggler_action: move\n")
    with pytest.raises(ValueError, match="trainer.straggler_action: must be report or relaunch"):
        straggler_action(config)


def test_no_failure_is_written_for_a_straggler_left() -> None:
    decision = _decide((start("node1", "node3"), LEAVING, *SAVED))
    assert not [e for e in decision.events if isinstance(e, Failure)]


def test_status_says_the_stragglers_node_was_left() -> None:
    events = [start("node1", "node3"), named(40, [1], ["node3"], [2.1]), LEAVING, named(90, [0], ["node1"], [1.5])]
    assert diagnosis_lines(events) == [
        "straggler: rank 1 on node3 2.10x its peers from step 40, its node left for node2",
        "straggler: rank 0 on node1 1.50x its peers from step 90, still slow at the last window",
    ]
