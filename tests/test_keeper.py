"""The batch host's keeper: its decision as a table, and its ear as real processes.

decide_keeper runs when the keeper (a step on another node of the job) has heard nothing from the
batch script's node for slurm.silent_node_timeout_s while Slurm still shows the life RUNNING.
Rows: the run's journal and the nodes as sinfo showed them on the dev cluster
(tests/fixtures/slurm/sinfo_*.txt) -> submit the run again (REQUEUE) without which nodes, end it
(FAIL), or nothing (STOP), and the events written (event:cause). The listening half runs a real
watcher process answering over UDP, then SIGSTOPs it as a silent node would be.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from hpctrain.recovery.decide import History, decide_host_lost, decide_keeper
from hpctrain.recovery.decision import Shape
from hpctrain.recovery.facts import Budgets, ClusterView, JobSeen, Outcome, Requested, parse_sinfo_nodes
from hpctrain.recovery.keeper import Ear, listen_for_silence
from hpctrain.run import exitcodes
from hpctrain.run.causes import Action, Cause, CheckpointReason
from hpctrain.run.events import (
    BY_KEEPER,
    DETECTED_BY_HEARTBEAT,
    Cancelled,
    Checkpoint,
    Event,
    Failure,
    Finish,
    Requeue,
    Start,
)
from hpctrain.run.heartbeats import PING, PONG
from hpctrain.run.protocol import KEEPER_EXITS

FIXTURES = Path(__file__).parent / "fixtures" / "slurm"
JOB = "57"
DEFAULTS = {"preempt": 50, "timelimit": 50, "node_failure": 5, "crash": 1, "hang": 2}
HOST = "node1"  # the batch host, a training node


def sinfo(name: str) -> dict:
    return parse_sinfo_nodes((FIXTURES / f"sinfo_{name}.txt").read_text())


TRAINING = (
    Start(time=10.0, job_id=JOB, restart=0, nodes=["node1", "node2"], world_size=2),
    Checkpoint(time=20.0, step=20, reason=CheckpointReason.PERIODIC),
)
ALL_UP = ClusterView(sinfo("idle"), ("node2",), ("node1", "node2"), 600.0)
# A 2+1 job on a 3-node cluster: the batch host lost leaves two nodes, enough to train.
WITH_SPARE = ClusterView(sinfo("idle"), ("node2", "node3"), ("node1", "node2", "node3"), 600.0)
# node2 drained by an administrator, node3 down: with the batch host out, nothing is left.
NOTHING_LEFT = ClusterView(sinfo("down_not_responding"), ("node2",), ("node1", "node2"), 600.0)


@dataclass
class Row:
    journal: tuple[Event, ...]
    cluster: ClusterView
    action: Action
    written: list[str]
    excluded: tuple[str, ...] = ()
    budgets: dict[str, int] | None = None
    user_exclude: tuple[str, ...] = ()


ROWS = {
    # ---- the batch script is gone while the job runs ----
    "batch host silent: again without it": Row(
        TRAINING, ALL_UP, Action.REQUEUE, ["failure:node_failure", "requeue:node_failure"], ("node1",)
    ),
    # slurm.exclude=node3 on three nodes: without node1 too, one node is left for a 2-node job, so
    # only slurm.exclude is kept out and the job waits for node1's return.
    "batch host silent, slurm.exclude leaves too few": Row(
        TRAINING,
        ALL_UP,
        Action.REQUEUE,
        ["failure:node_failure", "requeue:node_failure"],
        ("node3",),
        user_exclude=("node3",),
    ),
    "batch host silent, a spare: again on the rest": Row(
        TRAINING, WITH_SPARE, Action.REQUEUE, ["failure:node_failure", "requeue:node_failure"], ("node1",)
    ),
    # Kept out, the job could wait for ever (nothing else in service): only slurm.exclude is.
    "batch host silent, no other node in service": Row(
        TRAINING, NOTHING_LEFT, Action.REQUEUE, ["failure:node_failure", "requeue:node_failure"], ()
    ),
    "before the first start": Row(
        (), ALL_UP, Action.REQUEUE, ["failure:node_failure", "requeue:node_failure"], ("node1",)
    ),
    "node failure budget spent": Row(
        (*TRAINING, Requeue(time=25.0, job_id="56", restart=0, cause=Cause.NODE_FAILURE)),
        ALL_UP,
        Action.FAIL,
        ["failure:node_failure", "failure:budget"],
        budgets={**DEFAULTS, "node_failure": 1},
    ),
    # ---- the batch script decided, then was lost before Slurm took it: as decided, charged once ----
    "requeue decided, never asked": Row(
        (*TRAINING, Requeue(time=30.0, job_id=JOB, restart=0, cause=Cause.PREEMPT, excluded=["node3"])),
        ALL_UP,
        Action.REQUEUE,
        ["failure:preempt"],
        ("node3",),
    ),
    # ---- the life ended on purpose: nothing to do ----
    "finished": Row((*TRAINING, Finish(time=40.0, job_id=JOB, restart=0, step=100)), ALL_UP, Action.STOP, []),
    "scancel recorded by the trap": Row(
        (*TRAINING, Cancelled(time=40.0, job_id=JOB, restart=0, step=20)), ALL_UP, Action.STOP, []
    ),
    "budget spent by the batch script": Row(
        (*TRAINING, Failure(time=40.0, job_id=JOB, restart=0, cause=Cause.BUDGET, action="fail")),
        ALL_UP,
        Action.STOP,
        [],
    ),
    "refused requeue already resubmitted": Row(
        (
            *TRAINING,
            Failure(time=40.0, job_id=JOB, restart=0, cause=Cause.REQUEUE_REFUSED, action="resubmit", new_job_id="58"),
        ),
        ALL_UP,
        Action.STOP,
        [],
    ),
}


def _named(event: Event) -> str:
    cause = getattr(event, "cause", None)
    return f"{event.name}:{cause}" if cause else event.name


def _decide(row: Row):
    # The earlier job 56 went on in 57 (a refused requeue): its requeue counts against the budget.
    journal = (*row.journal, Failure(time=26.0, job_id="56", restart=0, cause=Cause.REQUEUE_REFUSED, new_job_id=JOB))
    outcome = Outcome(exit_code=None, user_exclude=row.user_exclude, nodes_wanted=2)
    return decide_keeper(History(JOB, 0, journal), HOST, 12.3, outcome, row.cluster, Budgets(row.budgets or DEFAULTS))


@pytest.mark.parametrize("row", ROWS.values(), ids=ROWS.keys())
def test_decide_keeper(row: Row) -> None:
    decision = _decide(row)
    assert decision.action is row.action, decision.message
    assert [_named(e) for e in decision.events] == row.written, decision.events
    assert decision.excluded == row.excluded
    assert all(e.by == BY_KEEPER and (e.job_id, e.restart) == (JOB, 0) for e in decision.events)


def test_the_failure_names_the_batch_host_and_how_it_was_heard() -> None:
    decision = _decide(ROWS["batch host silent: again without it"])
    failure, requeue = decision.events
    assert isinstance(failure, Failure) and isinstance(requeue, Requeue)
    assert (failure.nodes, failure.detected_by, failure.action) == (["node1"], DETECTED_BY_HEARTBEAT, "resubmit")
    assert "node1" in failure.reason and "12 s" in failure.reason
    assert requeue.nodes is None  # the rest holds all the job asked for
    spent = _decide(ROWS["node failure budget spent"])
    assert spent.events[0].action is None and spent.events[1].action == "fail"


def test_a_spare_given_up_when_too_few_nodes_remain() -> None:
    # 2 training nodes + 1 spare on node1..node3 with node2 drained: the batch host out leaves
    # node3 alone, too few even to train: only slurm.exclude is kept out, the job asks for 2.
    three = ClusterView(sinfo("down_not_responding"), ("node2", "node3"), ("node1", "node2", "node3"), 600.0)
    decision = decide_keeper(
        History(JOB, 0, TRAINING), HOST, 11.0, Outcome(exit_code=None, nodes_wanted=2), three, Budgets(DEFAULTS)
    )
    (_, requeue) = decision.events
    assert (decision.excluded, requeue.nodes) == ((), 2)


# ---- the keeper's call: Slurm's record first, then decide_keeper carried out as RESUBMIT ----------

RUNNING = JobSeen(True, "RUNNING", 0)
ASKED = Requested(exclude="node9", life_nodes=2)
# (Slurm's record of the job, the journal) -> action, events written when it is carried out
HOST_LOST = {
    "the job ended since: nothing to do": (JobSeen(True, "COMPLETED", 0), TRAINING, Action.STOP, []),
    "no record (Slurm silent): nothing to do": (JobSeen(), TRAINING, Action.STOP, []),
    "Slurm requeued it since: nothing to do": (JobSeen(True, "RUNNING", 1), TRAINING, Action.STOP, []),
    "running: submitted again without the batch host": (
        RUNNING,
        TRAINING,
        Action.RESUBMIT,
        ["failure:node_failure", "requeue:node_failure"],
    ),
    "running, budget spent: fail": (
        RUNNING,
        (*TRAINING, Requeue(time=25.0, job_id="56", restart=0, cause=Cause.NODE_FAILURE)),
        Action.FAIL,
        ["failure:node_failure", "failure:budget"],
    ),
    "running, finished meanwhile: nothing to do": (
        RUNNING,
        (*TRAINING, Finish(time=40.0, job_id=JOB, restart=0, step=100)),
        Action.STOP,
        [],
    ),
}


def _host_lost(seen: JobSeen, journal: tuple[Event, ...]):
    cluster = None if seen.moved_on(0) else ALL_UP  # a life that moved on: its nodes are not looked at
    outcome = Outcome(exit_code=None, nodes_wanted=2)
    budgets = Budgets({**DEFAULTS, "node_failure": 1})
    return decide_host_lost(History(JOB, 0, journal), HOST, 12.3, seen, outcome, cluster, budgets, ASKED)


@pytest.mark.parametrize("seen, journal, action, written", HOST_LOST.values(), ids=HOST_LOST.keys())
def test_decide_host_lost(seen: JobSeen, journal: tuple[Event, ...], action: Action, written: list[str]) -> None:
    decision = _host_lost(seen, journal)
    assert decision.action is action, decision.message
    assert [_named(e) for e in decision.events] == written
    codes = {Action.STOP: 0, Action.RESUBMIT: exitcodes.BATCH_RESUBMITTED, Action.FAIL: exitcodes.BATCH_FAILED}
    assert KEEPER_EXITS[decision.action] == codes[action]
    if not seen.moved_on(0):
        return
    assert decision.message == f"the batch host {HOST} is silent, the job {seen.said}: nothing to do"


def test_a_refused_submission_falls_back_to_slurms_requeue_then_ends_the_job() -> None:
    """sbatch refused: Slurm's own requeue of this job, without the batch host; refused too: FAIL,
    the failure saying why the submission failed."""
    decision = _host_lost(RUNNING, TRAINING)
    assert decision.shape == Shape(("node1",), 2)  # as many nodes as this life had
    went_on = decision.resubmitted("58")
    assert went_on.message == "the run goes on in job 58 (same run dir)"
    assert [getattr(e, "new_job_id", None) for e in went_on.events] == ["58", None]  # the failure names it
    requeue = decision.because("sbatch: error: Batch job submission failed")
    assert (requeue.action, requeue.ask, requeue.shape) == (Action.REQUEUE, True, Shape(("node1",), None, "node9"))
    said = "submitting again failed (sbatch: error: Batch job submission failed): asking Slurm to requeue"
    assert requeue.message == said
    assert [(_named(e), getattr(e, "action", None)) for e in requeue.events] == [
        ("failure:node_failure", "requeue"),
        ("requeue:node_failure", None),
    ]
    assert KEEPER_EXITS[requeue.action] == exitcodes.BATCH_REQUEUED
    failed = requeue.because("scontrol: error: Job is pending execution")
    (failure,) = failed.events
    assert failed.action is Action.FAIL and isinstance(failure, Failure) and failure.action == "fail"
    assert failure.reason is not None and failure.reason.endswith(
        "while the job runs; submitting again failed: sbatch: error: Batch job submission failed"
    )
    assert failed.message == ""  # written, not said: the keeper said the submission's failure


def test_a_decided_requeue_is_submitted_on_its_node_count() -> None:
    decided = Requeue(time=30.0, job_id=JOB, restart=0, cause=Cause.PREEMPT, excluded=["node3"], nodes=1)
    decision = _host_lost(RUNNING, (*TRAINING, decided))
    assert decision.action is Action.RESUBMIT and [_named(e) for e in decision.events] == ["failure:preempt"]
    assert decision.shape == Shape(("node3",), 1)
    assert decision.because("no").shape == Shape(("node3",), 1, "node9")


# ---- the ear: a real watcher answering, then stopped -----------------------------------------------

ANSWERER = """
import socket, sys
from hpctrain.recovery.watch import PING, PONG
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.bind(("127.0.0.1", 0))
print(sock.getsockname()[1], flush=True)
while True:
    data, sender = sock.recvfrom(64)
    if data == PING:
        sock.sendto(PONG, sender)
"""


@pytest.fixture
def answerer():
    process = subprocess.Popen([sys.executable, "-c", ANSWERER], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        yield process, int(process.stdout.readline())
    finally:
        process.kill()  # a SIGKILL ends a stopped process too
        process.wait()


def test_an_answering_watcher_is_never_taken_for_silent(answerer) -> None:
    process, port = answerer
    stopped_at: list[float] = []

    def stop_later() -> None:
        time.sleep(6.0)
        stopped_at.append(time.monotonic())
        os.kill(process.pid, signal.SIGSTOP)

    threading.Thread(target=stop_later, daemon=True).start()
    began = time.monotonic()
    silent_s = listen_for_silence(("127.0.0.1", port), timeout_s=3.0)
    heard_until = time.monotonic()
    # Six seconds of answers (twice the timeout) went by without a false alarm; the silence was
    # declared about the timeout after the stop, no sooner.
    assert stopped_at and stopped_at[0] - began >= 5.9
    assert 3.0 < silent_s < 5.0
    assert 3.0 - 1.1 <= heard_until - stopped_at[0] < 5.5  # the last answer came up to one ask before


def test_a_keeper_arms_at_the_first_answer_and_never_before() -> None:
    """A watcher that does not answer for 5 s (UDP blocked, not started yet: longer than the 3 s
    timeout) is no lost host; its first answer arms the keeper, and its silence after that is."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as late:
        late.bind(("127.0.0.1", 0))
        late.settimeout(0.2)

        def answer_from_5_to_7_s() -> None:
            began = time.monotonic()
            while time.monotonic() - began < 7.0:
                with contextlib.suppress(TimeoutError):
                    data, sender = late.recvfrom(64)
                    if data == PING and time.monotonic() - began >= 5.0:
                        late.sendto(PONG, sender)

        threading.Thread(target=answer_from_5_to_7_s, daemon=True).start()
        began = time.monotonic()
        silent_s = listen_for_silence(late.getsockname(), timeout_s=3.0)
        took = time.monotonic() - began
    assert 3.0 < silent_s < 4.5
    assert 5.0 + 3.0 < took < 7.0 + 4.5, took  # the silence after the last answer, not the first 5 s


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        pytest.param([("look", 100.0)], [None], id="nothing heard, nothing to say"),
        pytest.param([("look", 100.0), ("look", 200.0)], [None, None], id="never answered: unarmed"),
        pytest.param([("answer", 1.0), ("look", 3.0), ("look", 4.5)], [None, 3.5], id="silent past the timeout"),
        pytest.param([("answer", 1.0), ("look", 2.0), ("look", 4.0)], [None, None], id="exactly the timeout: not yet"),
        pytest.param(
            [("answer", 1.0), ("look", 1.25), ("look", 30.0), ("look", 32.0)],
            [None, None, None],
            id="its own pause restarts the count",
        ),
        pytest.param(
            [("answer", 1.0), ("look", 2.0), ("answer", 3.0), ("look", 5.0), ("look", 6.5)],
            [None, None, 3.5],
            id="each answer restarts it",
        ),
    ],
)
def test_the_ear(steps: list[tuple[str, float]], expected: list[float | None]) -> None:
    ear = Ear(timeout_s=3.0, tick=0.0)
    said = []
    for what, now in steps:
        if what == "answer":
            ear.answered(now)
        else:
            said.append(ear.silent_for(now))
    assert said == expected
