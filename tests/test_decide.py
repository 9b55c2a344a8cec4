"""Recovery as a table: every fault alone and in the combinations real sites send together.

Each row: what happened before (the run's journal), what this step wrote, how the step ended,
what Slurm says about the nodes (text captured from the dev cluster, tests/fixtures/slurm) ->
the action, the events written (event:cause) and the nodes kept out.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from hpctrain.recovery.decide import (
    History,
    checkpoint_interval_s,
    decide,
    decide_begin,
    decide_cancelled,
    decide_refused,
    decide_requeue,
    decide_start,
    lineage,
)
from hpctrain.recovery.decision import Decision, Shape
from hpctrain.recovery.facts import (
    Budgets,
    Checked,
    ClusterView,
    JobSeen,
    Outcome,
    Refusal,
    Requested,
    parse_sinfo_nodes,
)
from hpctrain.recovery.history import lives_without_progress, saved_for
from hpctrain.recovery.judge import classify
from hpctrain.run import exitcodes
from hpctrain.run.causes import Action, Cause, CheckpointReason, StopReason
from hpctrain.run.events import (
    BY_SLURM,
    Cancelled,
    Checkpoint,
    Event,
    Failure,
    Finish,
    ForcedSave,
    Relaunch,
    Requeue,
    Retry,
    Start,
    Stop,
)
from hpctrain.run.exitcodes import (
    WORKER_HUNG,
    WORKER_SAVED_AND_STOPPED,
    WORKER_SAVED_FOR_TIMELIMIT,
    WORKER_USER_ERROR,
)
from hpctrain.run.protocol import BEGIN_EXITS, REQUEUE_EXITS

FIXTURES = Path(__file__).parent / "fixtures" / "slurm"
JOB = "41"
DEFAULTS = {"preempt": 50, "timelimit": 50, "node_failure": 5, "crash": 1, "hang": 2}


def sinfo(name: str) -> dict:
    return parse_sinfo_nodes((FIXTURES / f"sinfo_{name}.txt").read_text())


def start(*nodes: str, t: float = 100.0, restart: int = 0) -> Start:
    return Start(time=t, job_id=JOB, restart=restart, nodes=list(nodes), world_size=len(nodes))


def ckpt(step: int, reason: str, t: float) -> Checkpoint:
    return Checkpoint(time=t, step=step, reason=CheckpointReason(reason))


def stop(step: int, reason: str, t: float) -> Stop:
    """The ranks agreed to stop (written before the forced save, so even when it is killed)."""
    return Stop(time=t, job_id=JOB, restart=0, step=step, reason=StopReason(reason), deadline_s=25.0)


def forced(reason: str, choice: str, t: float = 170.0) -> ForcedSave:
    return ForcedSave(time=t, step=61, reason=StopReason(reason), forced_save=choice)


def requeue(cause: str, t: float = 50.0, excluded: list[str] | None = None) -> Requeue:
    return Requeue(time=t, job_id=JOB, cause=Cause(cause), excluded=excluded or [])


def failure(cause: str, t: float = 150.0, **fields) -> Failure:
    return Failure(time=t, job_id=JOB, cause=Cause(cause), **fields)


# A run that checkpointed every 20 s in its earlier life: one checkpoint interval is 20 s.
EARLIER = (start("node1", "node2", t=0.0), ckpt(20, "periodic", 20.0), ckpt(40, "periodic", 40.0))


@dataclass
class Row:
    before: tuple[Event, ...]  # the journal before this step was launched
    since: tuple[Event, ...]  # written by this step
    outcome: Outcome
    nodes: str = "idle"  # the sinfo fixture
    allocated: tuple[str, ...] = ("node1", "node2")
    original: tuple[str, ...] = ("node1", "node2")
    time_left_s: float | None = 3000.0
    budgets: dict = field(default_factory=lambda: dict(DEFAULTS))
    max_restarts: int | None = None
    requeued_by_slurm: bool = False  # the job's record counts a restart past this life's
    preempting: bool | None = False  # the job's record shows a PreemptTime (None: not read)
    partition_nodes: tuple[str, ...] = ()  # the job's partition's nodes (empty: not known)
    timed_out: bool = False  # the job's record says its time limit ended it (Reason=TimeLimit)
    constraint_nodes: frozenset[str] | None = None  # the nodes that meet the job's --constraint
    big_enough_nodes: frozenset[str] | None = None  # the nodes with the job's GPUs and memory per node
    # expected:
    action: Action = Action.REQUEUE
    events: list[str] = field(default_factory=list)
    excluded: tuple[str, ...] = ()
    requeue_nodes: int | None = None  # the requeued job's lowered node count (None: unchanged)
    ends_run: bool | None = None  # None: as the action says (finish, fail, stop end it)


def out(code: int | None, **fields) -> Outcome:
    return Outcome(exit_code=code, nodes_wanted=2, signal_delay_s=30.0, **fields)


TIMELIMIT_SAVE = (start("node1", "node2", t=100.0), stop(55, "timelimit", 159.0), ckpt(55, "timelimit", 160.0))
PREEMPT_SAVE = (start("node1", "node2", t=100.0), stop(55, "preempt", 159.0), ckpt(55, "preempt", 160.0))
SPARE = {"allocated": ("node1", "node2", "node3"), "original": ("node1", "node2", "node3")}
# This life crashed once and was relaunched in the job for it: a second crash is requeued.
CRASHED_ONCE = (
    start("node1", "node2", t=100.0),
    failure("crash", t=160.0),
    Relaunch(time=161.0, job_id=JOB, restart=0, cause=Cause.CRASH, nodes=["node1", "node2"]),
)
CRASH_2 = {**DEFAULTS, "crash": 2}
RELAUNCHED = ["failure:crash", "relaunch:crash"]
CRASHED = ["failure:crash", "requeue:crash"]

ROWS = {
    # ---- every fault alone ----
    "finished": Row(EARLIER, (start("node1", "node2"), Finish(time=200.0, step=600)), out(0), action=Action.FINISH),
    "user's mistake": Row(
        (), (failure("user_error", message="model.foo"),), out(WORKER_USER_ERROR), action=Action.FAIL
    ),
    "time limit": Row(
        EARLIER, TIMELIMIT_SAVE, out(WORKER_SAVED_FOR_TIMELIMIT, warned=True), events=["requeue:timelimit"]
    ),
    "preemption": Row(EARLIER, PREEMPT_SAVE, out(WORKER_SAVED_AND_STOPPED), events=["requeue:preempt"]),
    "scancel": Row(
        EARLIER, PREEMPT_SAVE, out(WORKER_SAVED_AND_STOPPED, terminated=True), action=Action.STOP, events=["cancelled"]
    ),
    # The batch shell's SIGTERM while the job's record shows Slurm requeuing it (an admin's
    # `scontrol requeue`, tests/fixtures/slurm/scontrol/stop_admin_requeued.txt: Restarts=1; a
    # preemption's grace ended): no cancel, a study's trial is not told it ended, and the
    # requeue is recorded (preempt, by Slurm) while this shell still knows it was no node failure.
    "SIGTERM to the shell while Slurm requeues the job": Row(
        EARLIER,
        PREEMPT_SAVE,
        out(WORKER_SAVED_AND_STOPPED, terminated=True),
        requeued_by_slurm=True,
        action=Action.STOP,
        events=["requeue:preempt"],
        ends_run=False,
    ),
    # The time limit reached while the warned step still stopped (or after-step decided): Slurm's
    # SIGTERM to the shell is the limit's (Reason=TimeLimit, tests/fixtures/slurm/scontrol/
    # stop_timelimit.txt). No cancel: the job ends TIMEOUT and the guardian submits it
    # again. Before: recorded as `cancelled`, the run over, a study's trial told FAIL.
    "the time limit's SIGTERM to the shell of a warned step": Row(
        EARLIER,
        (start("node1", "node2", t=100.0), stop(55, "timelimit", 159.0)),
        out(None, terminated=True, warned=True),
        timed_out=True,
        action=Action.STOP,
        ends_run=False,
    ),
    "scancel already recorded by the shell's trap: nothing written twice": Row(
        EARLIER,
        (*PREEMPT_SAVE, Cancelled(time=161.0, job_id=JOB, restart=0, step=40)),
        out(WORKER_SAVED_AND_STOPPED, terminated=True),
        action=Action.STOP,
    ),
    # A crash on nodes that all live: trained again in this job at once, on the same nodes, as
    # torchrun restarts its workers (a requeue waits out Slurm's hold, about 120 s, then the queue).
    "crash": Row(
        EARLIER, (start("node1", "node2"),), out(1), action=Action.RELAUNCH, events=["failure:crash", "relaunch:crash"]
    ),
    # The relaunched step crashed too: not tried a third time here; requeued, the run gets a new
    # allocation (and the crash budget counts both).
    "a crash right after a crash's relaunch: requeue": Row(
        (*EARLIER, *CRASHED_ONCE), (start("node1", "node2", t=170.0),), out(1), budgets=CRASH_2, events=CRASHED
    ),
    "a crash after a hang's relaunch: relaunched once for the crash": Row(
        (*EARLIER, start("node1", "node2", t=100.0), failure("hang", t=160.0, rank=1)),
        (
            Relaunch(time=161.0, job_id=JOB, restart=0, cause=Cause.HANG, nodes=["node1", "node2"]),
            start("node1", "node2", t=170.0),
        ),
        out(1),
        action=Action.RELAUNCH,
        events=["failure:crash", "relaunch:crash"],
    ),
    "a crash with no time left for a checkpoint interval: requeue": Row(
        EARLIER, (start("node1", "node2"),), out(1), time_left_s=40.0, events=CRASHED
    ),
    "the crash budget spent by the relaunch: no requeue": Row(
        (*EARLIER, *CRASHED_ONCE),
        (start("node1", "node2", t=170.0),),
        out(1),
        action=Action.FAIL,
        events=["failure:crash", "failure:budget"],
    ),
    # The ranks agreed to stop, then the save was killed (OOM, a rank SIGKILLed): no checkpoint,
    # no forced_save, only the `stop`; srun passes the kill on. Before: charged as a crash.
    "preemption whose save was killed": Row(
        EARLIER,
        (start("node1", "node2", t=100.0), stop(55, "preempt", 159.0)),
        out(137),
        preempting=True,
        events=["requeue:preempt"],
    ),
    "time limit whose save was killed": Row(
        EARLIER, (start("node1", "node2", t=100.0), stop(55, "timelimit", 159.0)), out(9), events=["requeue:timelimit"]
    ),
    # A signal before the tasks' handlers (torch still importing): the worker records it, writes
    # the `stop` and leaves before the rendezvous (hpctrain.worker); the other tasks are killed.
    "preemption before any start": Row(
        EARLIER, (stop(40, "preempt", 101.0),), out(137), preempting=True, events=["requeue:preempt"]
    ),
    # Rank 1 SIGKILLed before it imported torch (tests/test_slurm_start_node_faults.py): srun's
    # --kill-on-bad-exit SIGTERMs rank 0, which leaves with a `preempt` stop; no PreemptTime, no
    # SIGTERM to the shell: the rank's death is the cause (before: charged to preempt).
    "a rank dying at start-up: srun's SIGTERM to the others is no preemption": Row(
        EARLIER, (stop(40, "preempt", 101.0),), out(137), action=Action.RELAUNCH, events=RELAUNCHED
    ),
    "the same while Slurm did not answer: the stop's word is kept": Row(
        EARLIER, (stop(40, "preempt", 101.0),), out(137), preempting=None, events=["requeue:preempt"]
    ),
    "every task stopped cleanly on a SIGTERM Slurm did not send as a preemption": Row(
        EARLIER, (start("node1", "node2"), stop(55, "preempt", 159.0)), out(76), events=["requeue:preempt"]
    ),
    # A stop the ranks agreed on (after their `start`), one rank gone with 76, srun's SIGTERM to
    # the last (143): a stop, not a crash, whoever sent the SIGTERM (tests/test_slurm_start_node_faults.py).
    "an agreed stop that srun ended with 143 after the first rank left": Row(
        EARLIER, (start("node1", "node2"), stop(55, "preempt", 159.0)), out(143), events=["requeue:preempt"]
    ),
    # A rank hung on nodes that all live: trained again in this job at once, on the same nodes (a
    # requeue waits out Slurm's hold on a requeued job, about 120 s).
    "hang (srun passes the watchdog's 77 on as another code): relaunch": Row(
        EARLIER,
        (start("node1", "node2"), failure("hang", rank=1)),
        out(137),
        action=Action.RELAUNCH,
        events=["relaunch:hang"],
    ),
    "hang seen by its exit code alone: relaunch": Row(
        EARLIER,
        (start("node1", "node2"),),
        out(WORKER_HUNG),
        action=Action.RELAUNCH,
        events=["failure:hang", "relaunch:hang"],
    ),
    # The relaunched step hung too: the same nodes are not tried a third time; requeued, the run
    # gets a new allocation (and the hang budget counts both).
    "a hang right after a hang's relaunch: requeue": Row(
        (*EARLIER, start("node1", "node2", t=100.0), failure("hang", t=160.0, rank=1)),
        (
            Relaunch(time=161.0, job_id=JOB, restart=0, cause=Cause.HANG, nodes=["node1", "node2"]),
            start("node1", "node2", t=170.0),
        ),
        out(WORKER_HUNG),
        budgets={**DEFAULTS, "hang": 3},
        events=["failure:hang", "requeue:hang"],
    ),
    "a hang with no time left for a checkpoint interval: requeue": Row(
        EARLIER, (start("node1", "node2"),), out(WORKER_HUNG), time_left_s=40.0, events=["failure:hang", "requeue:hang"]
    ),
    "a hang inside a preemption's grace: requeue": Row(
        EARLIER,
        (start("node1", "node2"),),
        out(WORKER_HUNG),
        preempting=True,
        events=["failure:hang", "requeue:hang"],
    ),
    "node failure, no spare: requeue without it": Row(
        EARLIER,
        (start("node1", "node2"),),
        out(137),
        nodes="node_down_while_held",
        allocated=("node1",),
        events=["failure:node_failure", "requeue:node_failure"],
        excluded=("node2",),
    ),
    # Only the job's partition counts (node3 is in another one): excluding node2 would leave the
    # 2-node job one node it may run on, and it would wait for ever (BadConstraints), even once
    # node2 is back. Before: every node sinfo lists counted, node2 was kept out.
    "node failure, the partition has no node to spare: keep none out": Row(
        EARLIER,
        (start("node1", "node2"),),
        out(137),
        nodes="node_down_while_held",
        allocated=("node1",),
        partition_nodes=("node1", "node2"),
        events=["failure:node_failure", "requeue:node_failure"],
    ),
    "node failure, the partition has a node to spare: keep it out": Row(
        EARLIER,
        (start("node1", "node2"),),
        out(137),
        nodes="node_down_while_held",
        allocated=("node1",),
        partition_nodes=("node1", "node2", "node3"),
        events=["failure:node_failure", "requeue:node_failure"],
        excluded=("node2",),
    ),
    # Only nodes with the job's --constraint features count: node3 lacks them, so excluding
    # node2 would leave the 2-node job one node it may run on (BadConstraints for ever).
    "node failure, no other node meets the job's constraint: keep none out": Row(
        EARLIER,
        (start("node1", "node2"),),
        out(137),
        nodes="node_down_while_held",
        allocated=("node1",),
        partition_nodes=("node1", "node2", "node3"),
        constraint_nodes=frozenset({"node1", "node2"}),
        events=["failure:node_failure", "requeue:node_failure"],
    ),
    "node failure, another node meets the job's constraint: keep it out": Row(
        EARLIER,
        (start("node1", "node2"),),
        out(137),
        nodes="node_down_while_held",
        allocated=("node1",),
        partition_nodes=("node1", "node2", "node3"),
        constraint_nodes=frozenset({"node1", "node2", "node3"}),
        events=["failure:node_failure", "requeue:node_failure"],
        excluded=("node2",),
    ),
    # A mixed partition: node3 is up but has fewer GPUs (or less memory) than the job asks per
    # node. Counted, it let the requeue keep node2 out and wait for ever (Reason=Resources).
    "node failure, the only other node too small for the job: keep none out": Row(
        EARLIER,
        (start("node1", "node2"),),
        out(137),
        nodes="node_down_while_held",
        allocated=("node1",),
        partition_nodes=("node1", "node2", "node3"),
        big_enough_nodes=frozenset({"node1", "node2"}),
        events=["failure:node_failure", "requeue:node_failure"],
    ),
    "node failure, another node big enough: keep it out": Row(
        EARLIER,
        (start("node1", "node2"),),
        out(137),
        nodes="node_down_while_held",
        allocated=("node1",),
        partition_nodes=("node1", "node2", "node3"),
        big_enough_nodes=frozenset({"node1", "node2", "node3"}),
        events=["failure:node_failure", "requeue:node_failure"],
        excluded=("node2",),
    ),
    # A drained node (node2, an administrator's maintenance) runs no job: it does not count.
    "node failure, the only other node drained: keep none out": Row(
        EARLIER,
        (start("node1", "node3"),),
        out(137),
        nodes="drain_down_while_held",
        allocated=("node1",),
        original=("node1", "node3"),
        partition_nodes=("node1", "node2", "node3"),
        events=["failure:node_failure", "requeue:node_failure"],
    ),
    "node failure, spare up: relaunch at once": Row(
        EARLIER,
        (start("node1", "node2"),),
        out(137),
        nodes="node_down_while_held",
        **{**SPARE, "allocated": ("node1", "node3")},
        action=Action.RELAUNCH,
        events=["failure:node_failure", "relaunch:node_failure"],
        excluded=("node2",),
    ),
    # A node failed, and the job's record shows a PreemptTime (a preemption's grace runs): a step
    # relaunched now would never be warned, only killed at the grace's end. Requeue instead.
    "node failure inside a preemption's grace, spare up: requeue, not relaunch": Row(
        EARLIER,
        (start("node1", "node2"),),
        out(137),
        nodes="node_down_while_held",
        **{**SPARE, "allocated": ("node1", "node3")},
        preempting=True,
        events=["failure:node_failure", "requeue:node_failure"],
        excluded=("node2",),  # 2 nodes left for its 3: it starts again on them, the spare given up
        requeue_nodes=2,
    ),
    # ---- the cases of the issue ----
    # node3, the spare, drained: the 3-node job would wait for the end of its maintenance. Its
    # two training nodes can run it: it starts again on 2, the spare given up.
    "drained spare + time limit: requeue on the training nodes, not relaunch": Row(
        EARLIER,
        TIMELIMIT_SAVE,
        out(WORKER_SAVED_FOR_TIMELIMIT, warned=True),
        nodes="spare_draining",
        **SPARE,
        events=["requeue:timelimit"],
        requeue_nodes=2,
    ),
    "drained spare + preemption: requeue on the training nodes, not relaunch": Row(
        EARLIER,
        PREEMPT_SAVE,
        out(WORKER_SAVED_AND_STOPPED),
        nodes="spare_draining",
        **SPARE,
        events=["requeue:preempt"],
        requeue_nodes=2,
    ),
    "drained spare, 2 nodes to train on 1: requeue keeps one spare": Row(
        EARLIER,
        TIMELIMIT_SAVE,
        replace(out(WORKER_SAVED_FOR_TIMELIMIT, warned=True), nodes_wanted=1),
        nodes="spare_draining",
        **SPARE,
        events=["requeue:timelimit"],
        requeue_nodes=2,
    ),
    "node failing after the time-limit warning: requeue": Row(
        EARLIER,
        (start("node1", "node2"),),
        out(137, warned=True),
        nodes="node_down_while_held",
        allocated=("node1",),
        events=["failure:node_failure", "requeue:timelimit"],
        excluded=("node2",),
    ),
    # Before: it kept no failed node out and waited, 3 nodes held, for node2's repair.
    "a requeue that would leave fewer nodes than the job holds keeps the failed one out and gives up the spare": Row(
        EARLIER,
        (start("node1", "node2"),),
        out(137, warned=True, user_exclude=("node9",)),
        nodes="node_down_while_held",
        **{**SPARE, "allocated": ("node1", "node3")},
        events=["failure:node_failure", "requeue:timelimit"],
        excluded=("node2", "node9"),
        requeue_nodes=2,
    ),
    "a requeue that would leave too few nodes to train keeps no failed node out (it would wait for ever)": Row(
        EARLIER,
        (start("node1", "node2"),),
        out(137, warned=True, user_exclude=("node9",)),
        nodes="node_down_while_held",
        allocated=("node1",),
        partition_nodes=("node1", "node2"),
        events=["failure:node_failure", "requeue:timelimit"],
        excluded=("node9",),
    ),
    "node failure with too little time left for a checkpoint interval: requeue": Row(
        EARLIER,
        (start("node1", "node2"),),
        out(137),
        nodes="node_down_while_held",
        **{**SPARE, "allocated": ("node1", "node3")},
        time_left_s=45.0,
        events=["failure:node_failure", "requeue:node_failure"],
        excluded=("node2",),  # 2 nodes left for its 3: it starts again on them, the spare given up
        requeue_nodes=2,
    ),
    "node failure, time left unknown: requeue": Row(
        EARLIER,
        (start("node1", "node2"),),
        out(137),
        nodes="node_down_while_held",
        **{**SPARE, "allocated": ("node1", "node3")},
        time_left_s=None,
        events=["failure:node_failure", "requeue:node_failure"],
        excluded=("node2",),  # 2 nodes left for its 3: it starts again on them, the spare given up
        requeue_nodes=2,
    ),
    "life dying before start after a time-limit stop: crash": Row(
        (*EARLIER, ckpt(55, "timelimit", 60.0), requeue("timelimit", 61.0)),
        (),
        out(1),
        action=Action.RELAUNCH,
        events=RELAUNCHED,
    ),
    "time-limit warning during start-up: time limit": Row(
        EARLIER, (), out(140, warned=True), events=["requeue:timelimit"]
    ),
    "time-limit warning before srun started (no step launched)": Row(
        EARLIER, (), out(None, warned=True), events=["requeue:timelimit"]
    ),
    "scancel before srun started": Row(
        EARLIER, (), out(None, terminated=True), action=Action.STOP, events=["cancelled"]
    ),
    # Preempted while the batch script started (tests/test_slurm_start_preemption.py, GraceTime 20):
    # `control begin` saw the grace and launched nothing; or srun was starting the step when
    # Slurm's SIGTERM reached it, before the task could hold it (143). Before: charged as a crash.
    "preemption's grace running before srun started (no step launched)": Row(
        EARLIER, (), out(None), preempting=True, events=["requeue:preempt"]
    ),
    "a step SIGTERMed as it started inside a preemption's grace: preempt, not crash": Row(
        EARLIER, (), out(143), preempting=True, events=["requeue:preempt"]
    ),
    "a step SIGTERMed outside any grace is still a crash": Row(
        EARLIER, (), out(143), action=Action.RELAUNCH, events=RELAUNCHED
    ),
    "a crash inside a preemption's grace is still a crash": Row(
        EARLIER, (start("node1", "node2"),), out(1), preempting=True, events=["failure:crash", "requeue:crash"]
    ),
    "slurm.exclude is kept in the requeue's ExcNodeList": Row(
        (*EARLIER, *CRASHED_ONCE),
        (start("node1", "node2"),),
        out(1, user_exclude=("node9",)),
        budgets=CRASH_2,
        events=CRASHED,
        excluded=("node9",),
    ),
    "a node excluded earlier and back in service is allowed again": Row(
        (*EARLIER, *CRASHED_ONCE),
        (start("node1", "node2"),),
        out(1, excluded=("node3",)),
        nodes="idle",
        budgets=CRASH_2,
        events=CRASHED,
    ),
    "a node excluded earlier and still down stays out": Row(
        (*EARLIER, *CRASHED_ONCE),
        (start("node1", "node3"),),
        out(1, excluded=("node2",)),
        nodes="node_down_while_held",
        allocated=("node1", "node3"),
        original=("node1", "node3"),
        budgets=CRASH_2,
        events=CRASHED,
        excluded=("node2",),
    ),
    # ---- combinations ----
    "preemption during a background write": Row(
        EARLIER,
        (start("node1", "node2"), stop(61, "preempt", 169.0), ckpt(61, "preempt", 170.0), ckpt(60, "periodic", 171.0)),
        out(WORKER_SAVED_AND_STOPPED),
        events=["requeue:preempt"],
    ),
    "preemption whose forced save was skipped for lack of time (no checkpoint written)": Row(
        EARLIER,
        (start("node1", "node2"), stop(61, "preempt", 169.0), forced("preempt", "skipped")),
        out(WORKER_SAVED_AND_STOPPED),
        events=["requeue:preempt"],
    ),
    "time-limit stop that abandoned a background write and wrote the stop step": Row(
        EARLIER,
        (
            start("node1", "node2"),
            stop(61, "timelimit", 169.0),
            forced("timelimit", "abandoned_inflight"),
            ckpt(61, "timelimit", 171.0),
        ),
        out(WORKER_SAVED_FOR_TIMELIMIT),
        events=["requeue:timelimit"],
    ),
    "scancel after a forced save that kept the last checkpoint": Row(
        EARLIER,
        (start("node1", "node2"), forced("preempt", "skipped")),
        out(WORKER_SAVED_AND_STOPPED, terminated=True),
        action=Action.STOP,
        events=["cancelled"],
    ),
    "scancel during a forced save (killed before it was written)": Row(
        EARLIER,
        (start("node1", "node2"), stop(61, "preempt", 169.0)),
        out(143, terminated=True),
        action=Action.STOP,
        events=["cancelled"],
    ),
    "a node failing while the job relaunches on a spare": Row(
        (
            *EARLIER,
            failure("node_failure", 45.0, nodes=["node2"]),
            Relaunch(time=46.0, job_id=JOB, cause=Cause.NODE_FAILURE, failed=["node2"], excluded=["node2"]),
        ),
        (),
        out(137, excluded=("node2",)),
        nodes="node_down_while_held",
        allocated=("node1",),
        original=("node1", "node2", "node3"),
        events=["failure:node_failure", "requeue:node_failure"],
        # One node in service of the 2 it trains on: none kept out (it would wait for ever), and
        # it asks for its 2 training nodes only, so either failed node coming back will do.
        excluded=(),
        requeue_nodes=2,
    ),
    "the same node failing twice": Row(
        (
            *EARLIER,
            failure("node_failure", 45.0, nodes=["node2"]),
            requeue("node_failure", 46.0, ["node2"]),
            start("node1", "node2", t=90.0, restart=1),
        ),
        (start("node1", "node2", t=100.0, restart=1),),
        out(137),
        nodes="node_down_while_held",
        allocated=("node1",),
        events=["failure:node_failure", "requeue:node_failure"],
        excluded=("node2",),
    ),
    "the same node failing past its budget": Row(
        (*EARLIER, requeue("node_failure", 46.0, ["node2"])),
        (start("node1", "node2"),),
        out(137),
        nodes="node_down_while_held",
        allocated=("node1",),
        budgets={**DEFAULTS, "node_failure": 1},
        action=Action.FAIL,
        events=["failure:node_failure", "failure:budget"],
    ),
    "a budget spent by a mix of causes": Row(
        (*EARLIER, requeue("preempt", 41.0), requeue("timelimit", 42.0), requeue("node_failure", 43.0)),
        (start("node1", "node2"),),
        out(1),
        max_restarts=3,
        action=Action.FAIL,
        events=["failure:crash", "failure:budget"],
    ),
    "the crash budget spent": Row(
        (*EARLIER, failure("crash", 44.0), requeue("crash", 45.0)),
        (start("node1", "node2"),),
        out(1),
        action=Action.FAIL,
        events=["failure:crash", "failure:budget"],
    ),
    "the default budgets can all be reached (49 preemptions before)": Row(
        (*EARLIER, *(requeue("preempt", 41.0) for _ in range(49))),
        PREEMPT_SAVE,
        out(WORKER_SAVED_AND_STOPPED),
        events=["requeue:preempt"],
    ),
}


@pytest.mark.parametrize("row", ROWS.values(), ids=ROWS.keys())
def test_decide(row: Row) -> None:
    cluster = ClusterView(
        sinfo(row.nodes),
        row.allocated,
        row.original,
        row.time_left_s,
        row.requeued_by_slurm,
        row.preempting,
        row.partition_nodes,
        row.timed_out,
        row.constraint_nodes,
        big_enough_nodes=row.big_enough_nodes,
    )
    history = History(JOB, 0, (*row.before, *row.since), row.since)
    decision = decide(history, row.outcome, cluster, Budgets(row.budgets, row.max_restarts))
    assert decision.action is row.action, decision.message
    assert [_named(e) for e in decision.events] == row.events
    ends = row.action in (Action.FINISH, Action.FAIL, Action.STOP) if row.ends_run is None else row.ends_run
    assert decision.ends_run is ends
    assert decision.excluded == row.excluded
    assert [e.nodes for e in decision.events if isinstance(e, Requeue)] == [
        row.requeue_nodes for e in decision.events if isinstance(e, Requeue)
    ]
    for event in decision.events:
        assert (event.job_id, event.restart) == (JOB, 0)


def _named(event: Event) -> str:
    cause = getattr(event, "cause", None)
    return f"{event.name}:{cause}" if cause else event.name


def test_relaunch_names_the_nodes_and_leaves_drained_ones_out() -> None:
    # node2 failed; node3 (a spare) is up; node1 trains on. slurm.nodes=1 here.
    cluster = ClusterView(sinfo("node_down_while_held"), ("node1", "node3"), ("node1", "node2", "node3"), 600.0)
    history = History(JOB, 0, (*EARLIER, start("node1", "node2")), (start("node1", "node2"),))
    outcome = Outcome(exit_code=137, nodes_wanted=1, signal_delay_s=30.0)
    relaunch = decide(history, outcome, cluster, Budgets(DEFAULTS)).events[-1]
    assert isinstance(relaunch, Relaunch)
    assert (relaunch.failed, relaunch.nodes, relaunch.spare_nodes, relaunch.excluded) == (
        ["node2"],
        ["node1"],
        1,
        ["node2"],
    )
    drained = ClusterView(sinfo("spare_draining"), ("node1", "node2", "node3"), ("node1", "node2", "node3"), 600.0)
    lost_two = Outcome(exit_code=137, nodes_wanted=2, signal_delay_s=30.0)
    history = History(JOB, 0, EARLIER, (start("node1", "node2"),))
    gone = ClusterView(drained.nodes, ("node1", "node3"), drained.original, 600.0)  # node2 left the allocation
    decision = decide(history, lost_two, gone, Budgets(DEFAULTS))
    assert decision.action is Action.REQUEUE  # the only spare is draining: no relaunch onto it


# ---- slurm.nodes a range (2-3, trainer.elastic): the survivors train on ----
# node2 of a 3-node job DOWN (sinfo_node_down_while_held, seen on the dev cluster), left the
# allocation (--no-kill); no spare, no other node in the partition.
RANGE = {
    "three nodes, one lost, two left (the low end): relaunch on the two": (
        dict(nodes_least=2),
        3000.0,
        Action.RELAUNCH,
        ("node1", "node3"),
        ["node2"],
    ),
    # A count of 3 cannot train on 2: it waits for a node back, node2 not kept out (it could be
    # the one that comes back).
    "the same without a range: requeue to wait for a node": (dict(), 3000.0, Action.REQUEUE, None, []),
    "a range of 3-3 is a count: requeue the same way": (dict(nodes_least=3), 3000.0, Action.REQUEUE, None, []),
    "two left of a range 3-4, below its low end: requeue the same way": (
        dict(nodes_least=3, nodes_wanted=4),
        3000.0,
        Action.REQUEUE,
        None,
        [],
    ),
    # No time for a relaunch: requeued, node2 kept out; Slurm starts it on the two left (its
    # min-max), no node count lowered.
    "too little time left for a checkpoint interval: requeue without node2": (
        dict(nodes_least=2),
        40.0,
        Action.REQUEUE,
        None,
        ["node2"],
    ),
}


@pytest.mark.parametrize("name", list(RANGE))
def test_a_range_of_nodes_trains_on_the_survivors(name: str) -> None:
    fields, time_left_s, action, step_nodes, excluded = RANGE[name]
    outcome = Outcome(exit_code=137, signal_delay_s=30.0, **{"nodes_wanted": 3, **fields})
    step = start("node1", "node2", "node3")
    cluster = ClusterView(
        sinfo("node_down_while_held"),
        ("node1", "node3"),  # node2 left the allocation (--no-kill)
        ("node1", "node2", "node3"),
        time_left_s,
        partition_nodes=("node1", "node2", "node3"),
    )
    decision = decide(History(JOB, 0, (*EARLIER, step), (step,)), outcome, cluster, Budgets(DEFAULTS))
    assert decision.action is action, decision
    assert decision.events[0].cause is Cause.NODE_FAILURE and decision.events[0].nodes == ["node2"]
    if action is Action.RELAUNCH:
        relaunch = decision.events[-1]
        assert isinstance(relaunch, Relaunch)
        assert (tuple(relaunch.nodes), relaunch.excluded, relaunch.spare_nodes) == (step_nodes, excluded, 0)
        assert decision.step_nodes == len(step_nodes)
    else:
        requeue = decision.events[-1]
        assert isinstance(requeue, Requeue) and requeue.nodes is None, requeue
        assert requeue.excluded == excluded


# ---- a start of the batch script ----


def test_a_first_start_records_nothing() -> None:
    assert decide_begin(History(JOB, 0, ()), ClusterView(sinfo("idle")), Budgets(DEFAULTS)) is None
    ours = History(JOB, 1, (*EARLIER, requeue("timelimit", 41.0)))
    assert decide_begin(ours, ClusterView(sinfo("idle")), Budgets(DEFAULTS)) is None


def test_the_batch_node_dying_is_slurms_own_requeue() -> None:
    history = History(JOB, 1, EARLIER)
    decision = decide_begin(history, ClusterView(sinfo("node_down_while_held")), Budgets(DEFAULTS))
    assert decision is not None and decision.action is Action.REQUEUE
    assert [_named(e) for e in decision.events] == ["failure:node_failure", "requeue:node_failure"]
    assert decision.events[0].nodes == ["node2"] and decision.events[1].by == BY_SLURM


def test_a_preemption_whose_grace_ran_out_is_counted_as_preemption() -> None:
    history = History(JOB, 1, (*EARLIER, Cancelled(time=50.0, job_id=JOB, step=40)))
    decision = decide_begin(history, ClusterView(sinfo("idle")), Budgets(DEFAULTS))
    assert decision is not None and [_named(e) for e in decision.events] == ["requeue:preempt"]


def test_a_shell_killed_before_its_trap_recorded_the_sigterm_is_a_preemption() -> None:
    """An admin's `scontrol requeue` while the batch script set up: the trap marked the SIGTERM,
    then Slurm killed it (KillWait) before its control step wrote the requeue. No node died."""
    history = History(JOB, 1, EARLIER, previous_shell_terminated=True)
    decision = decide_begin(history, ClusterView(sinfo("node_down_while_held")), Budgets(DEFAULTS))
    assert decision is not None and [(_named(e), e.by) for e in decision.events] == [("requeue:preempt", BY_SLURM)]
    # Without the mark the same restart is a node failure (test_the_batch_node_dying_...).
    unmarked = decide_begin(History(JOB, 1, EARLIER), ClusterView(sinfo("node_down_while_held")), Budgets(DEFAULTS))
    assert unmarked is not None and _named(unmarked.events[0]) == "failure:node_failure"


def test_a_life_that_wrote_nothing_is_not_judged_by_the_life_before() -> None:
    """Life 0 was preempted (saved, requeued by its batch script); life 1's batch node died while
    torch imported, before any record; Slurm restarted it. Life 2 must see a node failure, not
    life 0's preemption (before: judged by the last `start`, life 0's)."""
    life0 = (*PREEMPT_SAVE, Requeue(time=170.0, job_id=JOB, restart=0, cause=Cause.PREEMPT))
    decision = decide_begin(History(JOB, 2, (*EARLIER, *life0)), ClusterView(sinfo("idle")), Budgets(DEFAULTS))
    assert decision is not None and [_named(e) for e in decision.events] == [
        "failure:node_failure",
        "requeue:node_failure",
    ]
    # A life 1 that did write its stop (a preemption before its start: hpctrain.worker) is a preemption.
    early = Stop(time=200.0, job_id=JOB, restart=1, step=55, reason=StopReason.PREEMPT, deadline_s=0.0)
    decision = decide_begin(History(JOB, 2, (*EARLIER, *life0, early)), ClusterView(sinfo("idle")), Budgets(DEFAULTS))
    assert decision is not None and [_named(e) for e in decision.events] == ["requeue:preempt"]


def test_slurms_own_requeue_past_the_budget_fails() -> None:
    history = History(JOB, 2, (*EARLIER, Requeue(time=41.0, job_id=JOB, cause=Cause.NODE_FAILURE, by=BY_SLURM)))
    decision = decide_begin(history, ClusterView(sinfo("idle")), Budgets({**DEFAULTS, "node_failure": 1}))
    assert decision is not None and decision.action is Action.FAIL
    assert [_named(e) for e in decision.events] == ["failure:node_failure", "requeue:node_failure", "failure:budget"]


# ---- the history the decisions read ----


def test_a_resubmitted_run_keeps_its_budgets() -> None:
    events = (
        Requeue(time=1.0, job_id="40", cause=Cause.CRASH),  # an unrelated older job of this run dir
        Requeue(time=2.0, job_id="41", cause=Cause.TIMELIMIT),
        Failure(time=3.0, job_id="41", cause=Cause.REQUEUE_REFUSED, action="resubmit", new_job_id="42"),
        Checkpoint(time=4.0, step=10, reason=CheckpointReason.PERIODIC),
        Start(time=5.0, job_id="42"),
    )
    assert [e.time for e in lineage(events, "42")] == [2.0, 3.0, 4.0, 5.0]


def test_checkpoint_interval_is_measured_within_a_life() -> None:
    events = (*EARLIER, start("node1", "node2", t=300.0), ckpt(60, "periodic", 330.0), ckpt(80, "periodic", 360.0))
    assert checkpoint_interval_s(events) == 25.0  # median of 20 and 30; the gap across lives not counted
    assert checkpoint_interval_s(EARLIER[:2]) is None


def agreed_stop(history: History) -> Event | None:
    """The stop this step's judgment reads (the newest event of the step a stop was saved for)."""
    return next((e for e in reversed(history.since_launch) if saved_for(e)), None)


def test_the_history_shows_a_stop_whose_save_was_killed() -> None:
    # The ranks agreed to stop at step 61, then the save was killed: no checkpoint, no
    # forced_save, only the `stop` written before the save started.
    killed = (start("node1", "node2"), stop(61, "preempt", 169.0))
    history = History(JOB, 0, (*EARLIER, *killed), killed)
    assert agreed_stop(history) == killed[1]
    assert saved_for(killed[1]) is StopReason.PREEMPT
    assert killed[1] in lineage(history.events, JOB)  # it names its job: kept with it
    # The step is judged as the stop it was, whatever srun's code (killed half-way: 137).
    assert classify(history.since_launch, out(137), []) is Cause.PREEMPT
    # A stop agreed in an earlier step is not this step's.
    relaunched = start("node1", "node2", t=300.0)
    later = History(JOB, 0, (*EARLIER, *PREEMPT_SAVE, relaunched), (relaunched,))
    assert agreed_stop(later) is None
    assert classify(later.since_launch, out(137), []) is Cause.CRASH
    assert agreed_stop(History(JOB, 0, EARLIER, (start("node1", "node2"),))) is None


# ---- budgets after hpctrain-submit --retry: a new window ----

RETRIED = "57"
# Job 41 spent its crash budget and ended FAILED; `hpctrain-submit --retry` queued job 57.
SPENT = (*EARLIER, failure("crash", 44.0), requeue("crash", 45.0), failure("crash", 60.0), failure("budget", 60.1))
RETRY = Retry(time=70.0, job_id=RETRIED, previous_job_id=JOB, previous_state="FAILED")


def crash_of(job: str, t: float) -> tuple[Event, ...]:
    return (Start(time=t, job_id=job, restart=0, nodes=["node1", "node2"]),)


# (the run's journal, the job deciding, budgets) -> action, events written
BUDGET_WINDOWS = {
    "a retried job crashing gets its crash budget again": (
        (*SPENT, RETRY, *crash_of(RETRIED, 80.0)),
        RETRIED,
        DEFAULTS,
        Action.REQUEUE,
        ["failure:crash", "requeue:crash"],
    ),
    "and spends it like any job": (
        (
            *SPENT,
            RETRY,
            *crash_of(RETRIED, 80.0),
            Requeue(time=91.0, job_id=RETRIED, cause=Cause.CRASH),
        ),
        RETRIED,
        DEFAULTS,
        Action.FAIL,
        ["failure:crash", "failure:budget"],
    ),
    "slurm.max_restarts counts from the retry too": (
        (*EARLIER, *(requeue("preempt", 41.0) for _ in range(3)), RETRY, *crash_of(RETRIED, 80.0)),
        RETRIED,
        {**DEFAULTS, "max_restarts": 3},
        Action.REQUEUE,
        ["failure:crash", "requeue:crash"],
    ),
    "a retried job's refused requeue goes on in a new job: the window goes on": (
        (
            *SPENT,
            RETRY,
            *crash_of(RETRIED, 80.0),
            Requeue(time=91.0, job_id=RETRIED, cause=Cause.CRASH),
            Failure(time=92.0, job_id=RETRIED, cause=Cause.REQUEUE_REFUSED, action="resubmit", new_job_id="58"),
            *crash_of("58", 95.0),
        ),
        "58",
        DEFAULTS,
        Action.FAIL,
        ["failure:crash", "failure:budget"],
    ),
    "a retry linked to its old job still starts a new window": (
        (
            *SPENT,
            Failure(time=65.0, job_id=JOB, cause=Cause.REQUEUE_REFUSED, action="resubmit", new_job_id=RETRIED),
            RETRY,
            *crash_of(RETRIED, 80.0),
        ),
        RETRIED,
        DEFAULTS,
        Action.REQUEUE,
        ["failure:crash", "requeue:crash"],
    ),
    "without a retry a resubmitted job keeps the spent budget": (
        (
            *SPENT,
            Failure(time=65.0, job_id=JOB, cause=Cause.REQUEUE_REFUSED, action="resubmit", new_job_id=RETRIED),
            *crash_of(RETRIED, 80.0),
        ),
        RETRIED,
        DEFAULTS,
        Action.FAIL,
        ["failure:crash", "failure:budget"],
    ),
}


@pytest.mark.parametrize("journal, job, budgets, action, written", BUDGET_WINDOWS.values(), ids=BUDGET_WINDOWS.keys())
def test_budgets_after_a_retry(journal: tuple, job: str, budgets: dict, action: Action, written: list[str]) -> None:
    budgets = dict(budgets)
    total = budgets.pop("max_restarts", None)
    events = lineage(journal, job)
    since = events[-1:]  # the last life's start
    decision = decide(
        History(job, 0, events, since), Outcome(exit_code=1, nodes_wanted=2), ClusterView(), Budgets(budgets, total)
    )
    assert decision.action is action, decision.message
    assert [_named(e) for e in decision.events] == written


def test_a_retried_job_starts_without_a_restart_to_record() -> None:
    events = lineage((*SPENT, RETRY), RETRIED)
    assert decide_begin(History(RETRIED, 0, events), ClusterView(), Budgets(DEFAULTS)) is None


# ---- one cancel per life: the batch shell's trap and hpctrain-cancel ----

BY_COMMAND = Cancelled(time=161.0, job_id=JOB, step=40, by="hpctrain-cancel")
CANCELS = {
    "the trap alone": ((), JOB, (), ["cancelled"]),
    "hpctrain-cancel wrote it first": ((BY_COMMAND,), JOB, (), []),
    "hpctrain-cancel named the array task the trap knows by its own id": (
        (Cancelled(time=161.0, job_id="36_7", by="hpctrain-cancel"),),
        "44",
        ("36_7",),
        [],
    ),
    "another array task's cancel is not this one's": (
        (Cancelled(time=161.0, job_id="36_8", by="hpctrain-cancel"),),
        "44",
        ("36_7",),
        ["cancelled"],
    ),
    "an earlier life's trap (a preemption's grace ran out) does not count": (
        (Cancelled(time=100.0, job_id=JOB, restart=0),),
        JOB,
        (),
        ["cancelled"],
    ),
}


def test_the_trap_records_no_cancel_when_slurm_requeues_the_job_or_its_time_limit_ended_it() -> None:
    events = lineage(EARLIER, JOB)
    requeued = decide_cancelled(History(JOB, 1, events), requeued_by_slurm=True)
    assert (requeued.action, requeued.ends_run) == (Action.STOP, False)
    (requeue,) = requeued.events
    assert isinstance(requeue, Requeue) and (requeue.cause, requeue.by, requeue.restart) == (Cause.PREEMPT, BY_SLURM, 1)
    # Once per life: after-step's decision on the same SIGTERM writes it no second time.
    again = decide_cancelled(History(JOB, 1, (*events, requeue)), requeued_by_slurm=True)
    assert again.events == ()
    timed_out = decide_cancelled(History(JOB, 1, events), timed_out=True)
    assert (timed_out.action, timed_out.events, timed_out.ends_run) == (Action.STOP, (), False)
    assert [_named(e) for e in decide_cancelled(History(JOB, 1, events)).events] == ["cancelled"]


def test_a_life_slurm_requeued_before_its_tasks_wrote_anything_is_no_node_failure() -> None:
    """An admin's `scontrol requeue` (or a zero-grace preemption) during slurm.setup: the trap
    recorded it as Slurm requeued the job. The next start records nothing more (before: charged
    to node_failure, a budget of 5), and checks the preempt budget the trap could not."""
    trapped = Requeue(time=120.0, job_id=JOB, restart=0, cause=Cause.PREEMPT, by=BY_SLURM)
    assert decide_begin(History(JOB, 1, (*EARLIER, trapped)), ClusterView(sinfo("idle")), Budgets(DEFAULTS)) is None
    earlier = Requeue(time=60.0, job_id=JOB, restart=0, cause=Cause.PREEMPT)
    history = History(JOB, 2, (*EARLIER, earlier, replace(trapped, restart=1)))
    spent = decide_begin(history, ClusterView(sinfo("idle")), Budgets({**DEFAULTS, "preempt": 1}))
    assert spent is not None and spent.action is Action.FAIL
    assert [_named(e) for e in spent.events] == ["failure:budget"]


@pytest.mark.parametrize("before, job, aliases, written", CANCELS.values(), ids=CANCELS.keys())
def test_one_cancel_per_life(before: tuple, job: str, aliases: tuple, written: list[str]) -> None:
    events = lineage((*EARLIER, *before), job, aliases)
    decision = decide_cancelled(History(job, 1, events, aliases=aliases))
    assert decision.action is Action.STOP
    assert [_named(e) for e in decision.events] == written


# ---- `control begin`: launch, launch nothing (a preemption's grace), or fail ----

SLURMS_REQUEUE = Requeue(time=41.0, job_id=JOB, cause=Cause.NODE_FAILURE, by=BY_SLURM)
# (life, journal, sinfo fixture, the record shows a PreemptTime, budgets) -> action, exit, events
STARTS = {
    "a first start: launch": (0, (), "idle", False, DEFAULTS, Action.LAUNCH, []),
    "a restart Slurm made: recorded, then launch": (
        1,
        EARLIER,
        "node_down_while_held",
        False,
        DEFAULTS,
        Action.LAUNCH,
        ["failure:node_failure", "requeue:node_failure"],
    ),
    "inside a preemption's grace: launch nothing, after-step requeues": (
        0,
        (),
        "idle",
        True,
        DEFAULTS,
        Action.REQUEUE,
        [],
    ),
    "a restart inside a grace: recorded, launch nothing": (
        1,
        EARLIER,
        "node_down_while_held",
        True,
        DEFAULTS,
        Action.REQUEUE,
        ["failure:node_failure", "requeue:node_failure"],
    ),
    "a restart past its budget: fail, grace or not": (
        2,
        (*EARLIER, SLURMS_REQUEUE),
        "idle",
        True,
        {**DEFAULTS, "node_failure": 1},
        Action.FAIL,
        ["failure:node_failure", "requeue:node_failure", "failure:budget"],
    ),
}


@pytest.mark.parametrize(
    "restart, journal, nodes, preempting, budgets, action, written", STARTS.values(), ids=STARTS.keys()
)
def test_decide_start(
    restart: int,
    journal: tuple,
    nodes: str,
    preempting: bool,
    budgets: dict,
    action: Action,
    written: list[str],
) -> None:
    cluster = ClusterView(sinfo(nodes), preempting=preempting)
    decision = decide_start(History(JOB, restart, journal), cluster, Budgets(budgets))
    assert decision.action is action, decision.message
    assert [_named(e) for e in decision.events] == written
    exits = {
        Action.LAUNCH: 0,
        Action.REQUEUE: exitcodes.CONTROL_PREEMPTING,
        Action.FAIL: exitcodes.CONTROL_BUDGET_SPENT,
    }
    assert BEGIN_EXITS[decision.action] == exits[action]


# ---- `control requeue`: the last look before asking ----

# after-step decided a requeue without node2, its spare given up (2 nodes of 3).
DECIDED = Requeue(time=150.0, job_id=JOB, restart=0, cause=Cause.CRASH, excluded=["node2"], nodes=2)
ASKED = Requested(exclude="node9", life_nodes=3)
# (journal, the job's record) -> action, asked, events, exit
REQUEUE_LOOKS = {
    "nothing came in between: ask, then shape as decided": (
        (DECIDED,),
        JobSeen(True, "RUNNING", 0),
        Action.REQUEUE,
        True,
        [],
        exitcodes.BATCH_REQUEUED,
    ),
    "no record (Slurm silent): ask all the same": (
        (DECIDED,),
        JobSeen(),
        Action.REQUEUE,
        True,
        [],
        exitcodes.BATCH_REQUEUED,
    ),
    "an admin requeued it meanwhile: nothing to ask": (
        (DECIDED,),
        JobSeen(True, "COMPLETING", 1),
        Action.REQUEUE,
        False,
        [],
        exitcodes.BATCH_REQUEUED,
    ),
    "scancelled meanwhile: the cancel recorded, nothing asked": (
        (DECIDED,),
        JobSeen(True, "COMPLETING", 0, being_ended=True),
        Action.STOP,
        False,
        ["cancelled"],
        exitcodes.BATCH_CANCELLED,
    ),
    "scancelled, hpctrain-cancel recorded it first": (
        (DECIDED, Cancelled(time=161.0, job_id=JOB, by="hpctrain-cancel")),
        JobSeen(True, "CANCELLED", 0, being_ended=True),
        Action.STOP,
        False,
        [],
        exitcodes.BATCH_CANCELLED,
    ),
}


@pytest.mark.parametrize(
    "journal, seen, action, asked, written, code", REQUEUE_LOOKS.values(), ids=REQUEUE_LOOKS.keys()
)
def test_decide_requeue(
    journal: tuple, seen: JobSeen, action: Action, asked: bool, written: list[str], code: int
) -> None:
    decision = decide_requeue(History(JOB, 0, (*EARLIER, *journal)), seen, ("node2",), ASKED)
    assert (decision.action, decision.ask) == (action, asked), decision.message
    assert [_named(e) for e in decision.events] == written
    assert REQUEUE_EXITS[decision.action] == code
    # Asked: the requeued job keeps node2 out and gives up its spare, or only slurm.exclude is
    # kept out when Slurm refuses the lower count.
    assert decision.shape == (Shape(("node2",), 2, "node9") if asked else None)


# ---- the requeue refused, or unanswered: requeued after all, submitted again, or failed ----

NO_ANSWER = "scontrol: error: Unexpected message received for job 41"
PENDING = "scontrol: error: Job is pending execution"
# (what came of the ask) -> action, events, the requeued job shaped, message words
REFUSALS = {
    "no answer, then Slurm requeued it: shaped as decided": (
        Refusal(NO_ANSWER, answered=False, requeued=True),
        Action.REQUEUE,
        [],
        True,
        "got no answer (scontrol: error: Unexpected message received for job 41); the job was requeued",
    ),
    # Slurm away until the job's time limit: no second job, and no `fail` (an outage is nobody's
    # decision to end the run): the guardian submits it again once Slurm is back.
    "no answer until the time limit: undecided, never a second job, never fail": (
        Refusal(NO_ANSWER, answered=False, waited_s=3570.0),
        Action.STOP,
        ["failure:requeue_refused"],
        False,
        "slurmctld did not answer the requeue for 3570 s",
    ),
    "refused, but requeued all the same": (
        Refusal(PENDING, answered=True, requeued_anyway=True),
        Action.REQUEUE,
        [],
        False,
        "Job is pending execution; the job was requeued all the same",
    ),
    "refused, and job.sbatch is gone: fail": (
        Refusal(PENDING, answered=True, job_script=Path("/runs/a/job.sbatch"), job_script_found=False),
        Action.FAIL,
        ["failure:requeue_refused"],
        False,
        "submitting again failed: /runs/a/job.sbatch is missing",
    ),
    "refused: submitted again": (
        Refusal(PENDING, answered=True),
        Action.RESUBMIT,
        ["failure:requeue_refused"],
        False,
        "Job is pending execution; the run goes on in job {job} (same run dir)",
    ),
    "no answer, then refused: submitted again": (
        Refusal(NO_ANSWER, answered=False, refusal=PENDING),
        Action.RESUBMIT,
        ["failure:requeue_refused"],
        False,
        "scontrol requeue refused: scontrol: error: Job is pending execution",
    ),
}


@pytest.mark.parametrize("refusal, action, written, shaped, said", REFUSALS.values(), ids=REFUSALS.keys())
def test_decide_refused(refusal: Refusal, action: Action, written: list[str], shaped: bool, said: str) -> None:
    decision = decide_refused(History(JOB, 0, (*EARLIER, DECIDED)), ("node2",), refusal, ASKED)
    assert decision.action is action, decision.message
    assert [_named(e) for e in decision.events] == written
    assert said in decision.message
    assert (decision.shape == Shape(("node2",), 2, "node9")) is shaped
    for event in decision.events:
        recorded = None if action is Action.STOP else action.value  # undecided: no action at all
        assert isinstance(event, Failure) and event.action == recorded and event.reason in decision.message
    if action is not Action.STOP:  # STOP here: the control step exits BATCH_UNDECIDED
        code = {Action.REQUEUE: 0, Action.RESUBMIT: exitcodes.BATCH_RESUBMITTED, Action.FAIL: exitcodes.BATCH_FAILED}
        assert REQUEUE_EXITS[decision.action] == code[action]


def test_a_resubmission_names_its_new_job_or_fails_saying_why() -> None:
    decision = decide_refused(History(JOB, 0, (*EARLIER, DECIDED)), ("node2",), Refusal(PENDING, True), ASKED)
    went_on = decision.resubmitted("99")
    (failure,) = went_on.events
    assert isinstance(failure, Failure) and (failure.new_job_id, failure.action) == ("99", "resubmit")
    assert went_on.message.endswith("the run goes on in job 99 (same run dir)")
    failed = decision.because("sbatch: error: Batch job submission failed")
    (ended,) = failed.events
    assert failed.action is Action.FAIL and failed.ends_run
    assert isinstance(ended, Failure) and (ended.action, ended.new_job_id) == ("fail", None)
    assert ended.reason == (
        "scontrol requeue refused: scontrol: error: Job is pending execution; "
        "submitting again failed: sbatch: error: Batch job submission failed"
    )
    assert failed.message == ended.reason


# (this life's requeue decision, slurm.nodes a range) -> the new job's --nodes
RESUBMIT_NODES = {
    "the count this life's decision judged": ((DECIDED,), False, 2),
    "as many nodes as this life had": ((), False, 3),
    "slurm.nodes a range: job.sbatch's own min-max": ((), True, None),
}


@pytest.mark.parametrize("journal, elastic, nodes", RESUBMIT_NODES.values(), ids=RESUBMIT_NODES.keys())
def test_a_resubmission_asks_for_the_nodes_decided(journal: tuple, elastic: bool, nodes: int | None) -> None:
    requested = Requested(exclude="node9", elastic=elastic, life_nodes=3)
    decision = decide_refused(History(JOB, 0, (*EARLIER, *journal)), ("node2",), Refusal(PENDING, True), requested)
    assert decision.shape == Shape(("node2",), nodes)


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("30", 1800.0),  # minutes
        ("30:15", 1815.0),  # minutes:seconds
        ("01:00:00", 3600.0),  # hours:minutes:seconds
        ("2-0", 172800.0),  # days-hours
        ("1-2:30", 95400.0),  # days-hours:minutes
        ("1-02:00:05", 93605.0),  # days-hours:minutes:seconds
        ("UNLIMITED", float("inf")),
        ("infinite", float("inf")),
        ("soon", None),
    ],
)
def test_time_limit_s_reads_every_form_sbatch_takes(text: str, seconds: float | None) -> None:
    """sbatch(1) --time: "minutes", "minutes:seconds", "hours:minutes:seconds", "days-hours",
    "days-hours:minutes" and "days-hours:minutes:seconds"."""
    from hpctrain.slurm.times import time_limit_s

    assert time_limit_s(text) == seconds


# ---- a relaunch's node check (hpctrain.recovery.node_check): what it found, decided again ----
# Four nodes: node1 and node2 trained (slurm.nodes=2), node3 and node4 the spares; node2 lost.
FOUR = ("node1", "node2", "node3", "node4")
FOUR_LEFT = ("node1", "node3", "node4")  # node2 left the allocation (--no-kill)


def _four_nodes_up() -> dict:
    return parse_sinfo_nodes("\n".join(f"{n}|mixed|none" for n in FOUR_LEFT) + "\nnode2|down|hpctrain-test\n")


CHECK_ROWS = {
    # (what the check found, the action, the relaunch's nodes, its excluded (a requeue's), its
    # spares left (a requeue's node count), a failure's nodes and detected_by)
    "nothing found: the relaunch as decided, the old processes it ended counted": (
        Checked(frozenset(FOUR_LEFT), ended=1),
        Action.RELAUNCH,
        ["node1", "node3"],
        ["node2"],
        1,
        (["node2"], "slurm"),
    ),
    "a spare that died while idle: left out, the other spare taken": (
        Checked(frozenset(FOUR_LEFT), unanswering=frozenset({"node3"})),
        Action.RELAUNCH,
        ["node1", "node4"],
        ["node2", "node3"],
        0,
        (["node2"], "slurm"),
    ),
    "old processes that would not end on the surviving node: left out, both spares taken": (
        Checked(frozenset(FOUR_LEFT), lingering=frozenset({"node1"})),
        Action.RELAUNCH,
        ["node3", "node4"],
        ["node1", "node2"],
        0,
        (["node2"], "slurm"),
    ),
    # The requeue ends the job, and Slurm every process of it: the lingering node is no loss and
    # stays in; the dead spare is kept out as the lost node is. 2 nodes left for its 4: it starts
    # again on 2, the spares given up.
    "old processes that would not end, and a dead spare: too few left, requeue": (
        Checked(frozenset(FOUR_LEFT), unanswering=frozenset({"node3"}), lingering=frozenset({"node1"})),
        Action.REQUEUE,
        None,
        ["node2", "node3"],
        2,
        (["node2"], "slurm"),
    ),
    # One node left that answers, for 2 to train: as for any too-few, only slurm.exclude is kept
    # out and the job asks for its training nodes, so any node coming back will do.
    "both spares dead: requeue for the training nodes, whichever come back": (
        Checked(frozenset(FOUR_LEFT), unanswering=frozenset({"node3", "node4"})),
        Action.REQUEUE,
        None,
        [],
        2,
        (["node2"], "slurm"),
    ),
    "the surviving training node silent to the check: lost too, detected by it": (
        Checked(frozenset(FOUR_LEFT), unanswering=frozenset({"node1"})),
        Action.RELAUNCH,
        ["node3", "node4"],
        ["node1", "node2"],
        0,
        (["node1", "node2"], "slurm"),
    ),
}


@pytest.mark.parametrize("name", CHECK_ROWS)
def test_a_relaunch_is_decided_again_on_what_its_node_check_found(name: str) -> None:
    checked, action, nodes, excluded, spares, (failed, detected) = CHECK_ROWS[name]
    history = History(JOB, 0, EARLIER, (start("node1", "node2"),))
    outcome = Outcome(exit_code=137, nodes_wanted=2, signal_delay_s=30.0)
    cluster = ClusterView(_four_nodes_up(), FOUR_LEFT, FOUR, 3000.0, checked=checked)
    decision = decide(history, outcome, cluster, Budgets(DEFAULTS))
    assert decision.action is action, decision.message
    (failure,) = [e for e in decision.events if isinstance(e, Failure)]
    assert (failure.nodes, failure.detected_by) == (failed, detected)
    relaunches = [e for e in decision.events if isinstance(e, Relaunch)]
    if action is Action.RELAUNCH:
        (relaunch,) = relaunches
        assert (relaunch.nodes, relaunch.excluded, relaunch.spare_nodes) == (nodes, excluded, spares)
        assert decision.excluded == tuple(excluded)
        assert (relaunch.unanswered, relaunch.lingering) == (sorted(checked.unanswering), sorted(checked.lingering))
        assert relaunch.stale_ended == checked.ended
    else:
        assert relaunches == []
        (requeue,) = [e for e in decision.events if isinstance(e, Requeue)]
        assert (requeue.excluded, requeue.nodes) == (excluded, spares)


def test_a_node_lost_only_to_the_check_is_detected_by_it() -> None:
    # No node down in Slurm's eyes: the step ended (a crash of the ranks' collective) and the
    # relaunch's check got no answer from node2, which trained.
    up = parse_sinfo_nodes("\n".join(f"{n}|mixed|none" for n in FOUR) + "\n")
    checked = Checked(frozenset(FOUR), unanswering=frozenset({"node2"}))
    history = History(JOB, 0, EARLIER, (start("node1", "node2"),))
    cluster = ClusterView(up, FOUR, FOUR, 3000.0, checked=checked)
    decision = decide(history, Outcome(exit_code=137, nodes_wanted=2, signal_delay_s=30.0), cluster, Budgets(DEFAULTS))
    (failure,) = [e for e in decision.events if isinstance(e, Failure)]
    assert (failure.cause, failure.nodes, failure.detected_by) == (Cause.NODE_FAILURE, ["node2"], "check")
    assert decision.action is Action.RELAUNCH and "node2" in decision.excluded


def test_no_check_made_leaves_the_relaunch_without_its_count() -> None:
    history = History(JOB, 0, EARLIER, (start("node1", "node2"),))
    cluster = ClusterView(_four_nodes_up(), FOUR_LEFT, FOUR, 3000.0)
    decision = decide(history, Outcome(exit_code=137, nodes_wanted=2, signal_delay_s=30.0), cluster, Budgets(DEFAULTS))
    (relaunch,) = [e for e in decision.events if isinstance(e, Relaunch)]
    assert (relaunch.stale_ended, relaunch.unanswered, relaunch.lingering) == (None, [], [])


# ---- a step whose srun started no task (hpctrain.run.launch_marks): slurmctld away ----
def _lost_launch(history_events: tuple = (), **outcome) -> Decision:
    events = (*EARLIER, start("node1", "node2"), *history_events)
    history = History(JOB, 0, events, ())
    fields = {"exit_code": 1, "nodes_wanted": 2, "signal_delay_s": 30.0, "task_began": False, **outcome}
    cluster = ClusterView(sinfo("idle"), ("node1", "node2"), ("node1", "node2"), 3000.0)
    return decide(history, Outcome(**fields), cluster, Budgets(DEFAULTS))


def _launched_again(t: float) -> Relaunch:
    return Relaunch(time=t, job_id=JOB, restart=0, cause=Cause.LAUNCH, nodes=["node1", "node2"])


def test_a_step_whose_srun_started_no_task_is_launched_again_charged_to_nothing() -> None:
    decision = _lost_launch()
    assert decision.action is Action.RELAUNCH, decision.message
    assert [_named(e) for e in decision.events] == ["relaunch:launch"]  # no failure, no budget
    assert decision.excluded == ()


def test_a_launch_lost_twice_in_a_row_is_then_a_crash() -> None:
    twice = (_launched_again(200.0), _launched_again(300.0))
    decision = _lost_launch(twice)
    assert [_named(e) for e in decision.events] == ["failure:crash", "relaunch:crash"]
    # A `start` between them: the count begins again.
    decision = _lost_launch((_launched_again(200.0), start("node1", "node2", t=250.0), _launched_again(300.0)))
    assert [_named(e) for e in decision.events] == ["relaunch:launch"]


def test_a_step_whose_tasks_began_is_judged_as_before() -> None:
    assert [_named(e) for e in _lost_launch(task_began=True).events] == ["failure:crash", "relaunch:crash"]
    assert [_named(e) for e in _lost_launch(task_began=None).events] == ["failure:crash", "relaunch:crash"]
    # A signal to the batch shell, or the time-limit warning, is the step's own end.
    assert [_named(e) for e in _lost_launch(warned=True).events] == ["requeue:timelimit"]


def test_a_lost_launch_without_the_time_to_relaunch_is_requeued_charged_to_nothing() -> None:
    events = (*EARLIER, start("node1", "node2"))
    outcome = Outcome(exit_code=1, nodes_wanted=2, signal_delay_s=30.0, task_began=False)
    away = ClusterView(sinfo("idle"), ("node1", "node2"), ("node1", "node2"), None, answered=False)
    decision = decide(History(JOB, 0, events, ()), outcome, away, Budgets(DEFAULTS))
    assert decision.action is Action.REQUEUE
    assert [_named(e) for e in decision.events] == ["requeue:launch"]


def test_launches_again_count_against_no_budget() -> None:
    # max_restarts 1, spent by nothing: five launches again and a requeue for a time limit pass.
    again = tuple(_launched_again(200.0 + i) for i in range(5))
    history = History(JOB, 0, (*EARLIER, start("node1", "node2"), *again), (stop(55, "timelimit", 400.0),))
    cluster = ClusterView(sinfo("idle"), ("node1", "node2"), ("node1", "node2"), 3000.0)
    budgets = Budgets({**DEFAULTS, "timelimit": 1}, max_restarts=1)
    decision = decide(history, Outcome(exit_code=75, nodes_wanted=2, signal_delay_s=30.0), cluster, budgets)
    assert [_named(e) for e in decision.events] == ["requeue:timelimit"], decision.message


# ---- no progress: lives in a row that end in a failure without a newer checkpoint ----------------


def life(restart: int, resumed_from: int, *checkpoints: int, ended: str | None = None) -> list[Event]:
    """One life: its start, its checkpoints, and the requeue it ended with (None: this life)."""
    t = 1000.0 * (restart + 1)
    events: list[Event] = [
        Start(time=t, job_id=JOB, restart=restart, nodes=["node1"], world_size=1, resumed_from_step=resumed_from)
    ]
    events += [ckpt(step, "periodic", t + i + 1) for i, step in enumerate(checkpoints)]
    if ended:
        events.append(Requeue(time=t + 500, job_id=JOB, restart=restart, cause=Cause(ended)))
    return events


NO_PROGRESS_ROWS = {
    # (the lives before this one, this one's checkpoints, its cause) -> lives in a row without progress
    "a first life that crashed": ([], (), "crash", 1),
    "a crash at every resume, the third": ([life(0, 0, 20, ended="crash"), life(1, 20, ended="crash")], (), "crash", 2),
    "three crashes after the last checkpoint": (
        [life(0, 0, 20, ended="crash"), life(1, 20, ended="crash"), life(2, 20, ended="hang")],
        (),
        "crash",
        3,
    ),
    "a life that wrote a newer checkpoint ends the row": (
        [life(0, 0, ended="crash"), life(1, 0, 20, ended="crash")],
        (),
        "crash",
        1,
    ),
    "this life wrote a newer checkpoint": ([life(0, 0, ended="crash"), life(1, 0, ended="hang")], (20,), "crash", 0),
    "a checkpoint no newer than the newest is no progress": (
        [life(0, 0, 20, ended="crash"), life(1, 20, ended="crash")],
        (20,),
        "crash",
        2,
    ),
    "preemptions without a save are skipped, not counted": (
        [life(0, 0, ended="crash"), life(1, 0, ended="preempt"), life(2, 0, ended="timelimit")],
        (),
        "node_failure",
        2,
    ),
}


@pytest.mark.parametrize("row", NO_PROGRESS_ROWS.values(), ids=NO_PROGRESS_ROWS.keys())
def test_lives_without_progress(row: tuple) -> None:
    before, checkpoints, cause, expected = row
    restart = len(before)
    events = [e for lived in before for e in lived] + life(restart, 0 if not before else 20, *checkpoints)
    assert lives_without_progress(events, (JOB, restart), Cause(cause)) == expected


def test_the_third_life_in_a_row_without_progress_stops_the_run() -> None:
    # Life 0 wrote step 20; lives 1, 2 and this one (3) never got past it.
    before = [life(0, 0, 20, ended="crash"), life(1, 20, ended="crash"), life(2, 20, ended="hang")]
    events = (*(e for lived in before for e in lived), *life(3, 20))
    cluster = ClusterView(sinfo("idle"), ("node1",), ("node1",), 3000.0)
    budgets = {**DEFAULTS, "crash": 5, "hang": 5}  # every budget left: only the row stops it
    outcome = Outcome(exit_code=1, nodes_wanted=1, signal_delay_s=30.0)
    # Its first crash is trained again in the job (a relaunch is no new life); the relaunched
    # step's crash ends the life, and the row stops the run.
    first = decide(History(JOB, 3, events, events[-1:]), outcome, cluster, Budgets(budgets, None, no_progress_lives=3))
    assert first.action is Action.RELAUNCH, first.message
    relaunched = Relaunch(time=4600.0, job_id=JOB, restart=3, cause=Cause.CRASH, nodes=["node1"])
    again = Start(time=4610.0, job_id=JOB, restart=3, nodes=["node1"], world_size=1, resumed_from_step=20)
    events = (*events, *first.events[:-1], relaunched, again)
    history = History(JOB, 3, events, (again,))
    stopped = decide(history, outcome, cluster, Budgets(budgets, None, no_progress_lives=3))
    assert stopped.action is Action.FAIL and stopped.ends_run
    assert [_named(e) for e in stopped.events] == ["failure:crash", "failure:no_progress"]
    assert stopped.events[-1].reason == "3 lives in a row ended (crash this one) without a newer checkpoint"
    # Off (0), or one life more allowed: requeued as before.
    for lives in (0, 4):
        again = decide(history, outcome, cluster, Budgets(budgets, None, no_progress_lives=lives))
        assert again.action is Action.REQUEUE, again.message
