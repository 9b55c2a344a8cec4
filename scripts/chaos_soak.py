"""What the chaos soak (scripts/chaos.py) knows of its run: the plan's faults, what it injected,
and what the run dir says of the recovery (its `start` events, its metrics).

Nothing here touches the cluster: scripts/chaos_cluster.py does, scripts/chaos_faults.py injects
and scripts/chaos_schedule.py decides when.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpctrain.run.events import Start, read_events

REPO = Path(__file__).resolve().parents[1]
PAUSE_ENV = "HPCTRAIN_TEST_STEP_PAUSE_S"
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL"}
# A frozen node comes back this long after: while its run is still recovering or just after (the
# thaw races the relaunch, the keeper's new job, Slurm's DOWN). The batch host later: its keeper
# acts about 30 s after the freeze at the defaults (10 s of silence, a look, a 20 s probe), more
# on a loaded machine; thawed at 40 s it had not acted yet in a soak here.
THAW_AFTER_S = {"node_freeze": 40.0, "batch_freeze": 75.0}
FAULT_WAIT_S = 300.0  # how long a fault may wait for the job to be RUNNING and training again
STUCK_S = 60.0  # PENDING this long for a reason no wait cures: the soak says so and stops
WAITING_REASONS = {"BeginTime", "Priority", "Resources", "None"}
DRAIN_WATCH_S = 10.0  # a job on a drained node should train on: watched this long
# A drained node stays drained (an administrator's maintenance waits for the jobs on it) until the
# job has left it for its spare, or this long: the drain watch's look every slurm.drain_poll_s
# (30 s) and the save at the next step. Resumed any sooner, the watch may never see the drain.
DRAIN_NOTICE_S = 45.0
# A job PENDING this long (for Resources, or Slurm's "Nodes required for job are DOWN, DRAINED...")
# while a node the soak drained is still drained: the drain ends (an administrator's maintenance
# does), see _end_maintenance. Below STUCK_S, so the soak does not give up first.
DRAINED_WAIT_S = 30.0
PACE_S = 0.05  # each step of the job takes at least this long (helpers.paced, from the environment)


class ChaosError(RuntimeError):
    pass


@dataclass(frozen=True)
class Fault:
    number: int
    at_s: float  # earliest injection, seconds after training first logged a step
    kind: str
    rank: int  # for kill_rank / stop_rank: which rank's process
    node_pick: int  # for node_down / node_drain: which training node other than the batch node
    # Overlap mode: injected this many seconds after the fault before it, while the job is still
    # recovering from that one (not once it trains again); None: after the recovery.
    overlap_s: float | None = None


@dataclass
class Injected:
    fault: Fault
    at: float  # UNIX time of the injection
    target: str  # what was hit: node, rank and pid, checkpoint file, the new job id
    job_id: str
    step: int | None  # the last logged step when it was injected
    note: str = ""
    # The first step finished once over the fault (a later life's, or training on after a drain),
    # seen while polling: the next life drops the lines of steps it trains again.
    next_step_at: float | None = None
    next_step: int | None = None


@dataclass
class Soak:
    seed: int
    minutes: float
    run_dir: Path
    reference: Path
    job_ids: list[str] = field(default_factory=list)
    guardian_ids: list[str] = field(default_factory=list)  # the guardians submission.json named
    injected: list[Injected] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    t0: float = 0.0  # when training first logged a step: fault times count from here
    touched_nodes: set[str] = field(default_factory=set)  # downed or drained, to resume
    cluster_dir: str | None = None  # the dev cluster's folder (devcluster.py freeze/thaw act there)
    thaws: list[threading.Timer] = field(default_factory=list)  # frozen nodes' thaws to come
    udp_blocked: bool = False  # --udp-blocked: no heartbeat or keeper ping arrives
    final_state: str = "UNKNOWN"
    jobs_left: list[str] = field(default_factory=list)
    processes_left: list[int] = field(default_factory=list)


# ---- the run dir --------------------------------------------------------------------------------


def metrics_records(run_dir: Path) -> list[dict[str, Any]]:
    from hpctrain.run.jsonlines import read_jsonl

    return read_jsonl(run_dir / "metrics.jsonl")


def starts_of(run_dir: Path) -> list[Start]:
    """The run's `start` events, oldest first."""
    return [e for e in read_events(run_dir / "events.jsonl") if isinstance(e, Start)]


def checkpoints(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "checkpoints").glob("step_*.json"))


def last_step(soak: Soak) -> int | None:
    records = metrics_records(soak.run_dir)
    return records[-1].get("step") if records else None


def recovered_after(soak: Soak, settle_s: float = DRAIN_WATCH_S) -> float | None:
    """After when a logged step shows the job over the last fault: the start of a new life (every
    fault but a drain ends one; a drain, where the job has a free spare), or some seconds of
    training on once the drain watch had time to act and did not (a drained node is ridden out)."""
    if not soak.injected:
        return 0.0
    last = soak.injected[-1]
    starts = [e.time for e in starts_of(soak.run_dir) if e.time > last.at]
    if starts:
        return starts[0]
    if last.fault.kind == "node_drain" and time.time() > last.at + DRAIN_NOTICE_S:
        return last.at + DRAIN_NOTICE_S + settle_s
    return None


def drain_held(soak: Soak) -> set[str]:
    """The node the last fault drained, while the job has not got over that drain yet."""
    if not soak.injected or soak.injected[-1].fault.kind != "node_drain":
        return set()
    return {soak.injected[-1].target} if recovered_after(soak, settle_s=0.0) is None else set()


def note_next_step(soak: Soak) -> None:
    """The last fault's first step finished after it (for a drain: any step after it)."""
    if not soak.injected or soak.injected[-1].next_step_at is not None:
        return
    after = recovered_after(soak, settle_s=0.0)
    fresh = [r for r in metrics_records(soak.run_dir) if after is not None and (r.get("time") or 0) > after]
    if fresh:
        soak.injected[-1].next_step_at, soak.injected[-1].next_step = fresh[0]["time"], fresh[0].get("step")
