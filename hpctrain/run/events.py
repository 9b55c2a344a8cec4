"""events.jsonl as typed records: one class per event, one writer (Journal) and one reader.

The names and fields are the documented contract (docs/); fields are only ever added. Each record keeps
the fields it does not know (`extra`), so a journal written by a newer or older hpctrain reads
back whole. Causes and reasons are the enums of hpctrain.run.causes, written as their words; a
word a newer hpctrain wrote reads as an unlisted member (Word.read). The JSON-lines plumbing (torn
lines, NaN) is in hpctrain.run.jsonlines.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from hpctrain.run.causes import Cause, CheckpointReason, StopReason
from hpctrain.run.event_base import Event
from hpctrain.run.jsonlines import JsonLines, read_jsonl
from hpctrain.run.watch_events import Draining, Silent, Straggler, StragglerCleared, StragglerLeaving


@dataclass(frozen=True)
class Start(Event):
    name: ClassVar[str] = "start"
    world_size: int = 0
    nodes: list[str] = field(default_factory=list)
    resumed_from_step: int = 0
    # Where the resumed state came from: "disk" (a checkpoint) or "memory" (the in-memory tier's
    # copies, hpctrain.checkpoint.memory_tier); None for a fresh start.
    resumed_from: str | None = None
    total_steps: int | None = None
    ranks: list[Any] | None = None  # each rank's node, GPU and device
    allocated_at: float | None = None  # when Slurm started this life's batch script (hpctrain's own)
    # Rank 0's start-up in seconds per phase (hpctrain.process.startup_clock): launch_s, imports_s,
    # rendezvous_s, resume_s; the phases it could time.
    startup: dict[str, float] | None = None
    # How a step's global batch is split (hpctrain.trainer.layout): world_size, micro_batch,
    # grad_accum, global_batch. An elastic resume at another size keeps global_batch.
    layout: dict[str, int] | None = None
    # What Slurm allocated to this life, spare nodes included (SLURM_JOB_NUM_NODES, and the GPUs
    # of each node: 0 on CPU nodes); None where it was not recorded (hpctrain-status's cost then
    # reads config.yaml, see hpctrain.status.cost).
    job_nodes: int | None = None
    gpus_per_node: int | None = None
    # The node checks' seconds on rank 0's node (slurm.health: run_dir_s, scratch_s, ...), and the
    # timed all-reduce among all ranks: allreduce_s, allreduce_gbps (bus bandwidth).
    health: dict[str, float] | None = None


@dataclass(frozen=True)
class Checkpoint(Event):
    name: ClassVar[str] = "checkpoint"
    always: ClassVar[tuple[str, ...]] = ()
    step: int = 0
    reason: CheckpointReason = CheckpointReason.PERIODIC
    blocking_s: float | None = None
    write_s: float | None = None
    # A save a stop signal forced: the time it had (None: no deadline) and its choice (forced_save).
    deadline_s: float | None = None
    forced_save: str | None = None

    def written_when_none(self) -> tuple[str, ...]:
        # A forced save's checkpoint always says its deadline, null for none (Ctrl-C).
        return ("deadline_s",) if self.forced_save else ()


@dataclass(frozen=True, kw_only=True)
class Stop(Event):
    """Every rank agreed, at a step boundary, to stop for a signal. Rank 0 writes it before the
    save the stop forces, so the control step knows a stop was agreed even when that save is then
    killed (no `checkpoint` or `forced_save` follows)."""

    name: ClassVar[str] = "stop"
    always: ClassVar[tuple[str, ...]] = ("job_id", "deadline_s")
    step: int  # the step every rank stopped after
    reason: StopReason
    deadline_s: float | None  # seconds the forced save has, from now (None: Ctrl-C, no deadline)
    since_signal_s: float | None = None  # from the first signal to the agreement (rank 0's clock)


@dataclass(frozen=True, kw_only=True)
class ForcedSave(Event):
    """What a save forced by a stop signal did within the time the signal gives (the plan is
    hpctrain.checkpoint.deadline's): written whatever the choice, so a skipped save is seen too."""

    name: ClassVar[str] = "forced_save"
    always: ClassVar[tuple[str, ...]] = ()
    step: int = 0  # the step the ranks stopped at
    reason: StopReason
    forced_save: str = ""  # written | waited | abandoned_inflight | inflight_only | skipped | overran
    why: str = ""
    deadline_s: float | None = None  # seconds the signal gave (None: Ctrl-C, no deadline)
    estimated_write_s: float | None = None
    inflight_step: int | None = None  # the background write under way when the signal came
    inflight_left_s: float | None = None
    resume_step: int | None = None  # the step the next life resumes from
    redo_steps: int | None = None  # steps the next life trains again
    took_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class Requeue(Event):
    name: ClassVar[str] = "requeue"
    cause: Cause
    excluded: list[str] | None = None  # the job's ExcNodeList for its next start
    # None: the batch script asked; BY_SLURM: Slurm did it on its own; BY_GUARDIAN: submitted
    # again by the run's guardian; BY_KEEPER: asked by the batch host's keeper.
    by: str | None = None
    # The job's node count for its next start when hpctrain lowered it (spares it could not have
    # given up: too few nodes in service); None: as it was.
    nodes: int | None = None


@dataclass(frozen=True, kw_only=True)
class Relaunch(Event):
    name: ClassVar[str] = "relaunch"
    cause: Cause
    failed: list[str] = field(default_factory=list)  # nodes that failed in this life
    excluded: list[str] = field(default_factory=list)  # srun --exclude of the new step
    nodes: list[str] = field(default_factory=list)  # nodes the new step may run on
    spare_nodes: int = 0  # nodes left over after this relaunch
    # The node check before the relaunch (hpctrain.recovery.node_check): old training processes it
    # ended, the nodes that did not answer it (lost) and those where old processes would not end
    # (left out); None: no check ran (no srun where the control step runs).
    stale_ended: int | None = None
    unanswered: list[str] = field(default_factory=list)
    lingering: list[str] = field(default_factory=list)
    # Seconds from the old step's end (its srun returned to the batch shell) to this decision.
    decided_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class Failure(Event):
    name: ClassVar[str] = "failure"
    cause: Cause
    nodes: list[str] | None = None
    exit_code: int | None = None
    message: str | None = None  # a user's mistake, as the worker told it
    reason: str | None = None  # why a budget is spent, or a requeue refused
    by: str | None = None  # BY_SLURM: recorded at the next start, Slurm had restarted the job
    rank: int | None = None  # the rank whose watchdog saw a hang
    action: str | None = None  # what came next: an Action's word (resubmit, requeue, fail)
    new_job_id: str | None = None  # requeue_refused, resubmitted: the job the run goes on in
    # node_failure: how the loss was seen: DETECTED_BY_SLURM (the node DOWN or gone from the job)
    # or DETECTED_BY_HEARTBEAT (its processes fell silent: a `silent` event came first) or
    # DETECTED_BY_CHECK (it did not answer the node check of a relaunch that would have used it)
    # or DETECTED_BY_HEALTH (it failed a check as the life started: a `node_health` failure came first).
    detected_by: str | None = None
    # hang: the folder of the ranks' hang reports (RUN_DIR-relative, hpctrain.run.hang_reports),
    # and the ranks that wrote none: the ones the others were waiting for.
    report: str | None = None
    not_reached: list[int] | None = None
    # node_health: the check the node failed (a name of slurm.health.checks, or `command`) and
    # what it found.
    check: str | None = None
    result: str | None = None


@dataclass(frozen=True)
class Cancelled(Event):
    name: ClassVar[str] = "cancelled"
    step: int | None = None  # the newest checkpoint's step
    # None: the batch shell's SIGTERM trap; "hpctrain-cancel": recorded by that command right
    # after its scancel (a pending job never runs a trap). One cancel is recorded per life.
    by: str | None = None


# `by` of `requeue` and `failure`: Slurm restarted the job on its own (its node died, a
# preemption's grace ran out); the batch script's next start recorded it.
BY_SLURM = "slurm"
# `by` of `requeue` and `failure`: the run's guardian job found the job ended with nobody deciding
# what comes next (its batch node died) and submitted the run again (`new_job_id`).
BY_GUARDIAN = "guardian"
# `by` of `requeue` and `failure`: the batch host's keeper (hpctrain.recovery.keeper) heard nothing
# from the batch script's node while the job still ran, and requeued the job itself.
BY_KEEPER = "keeper"
# `detected_by` of a node_failure `failure`.
DETECTED_BY_SLURM = "slurm"
DETECTED_BY_HEARTBEAT = "heartbeat"
DETECTED_BY_CHECK = "check"  # no answer to a relaunch's node check (hpctrain.recovery.node_check)
DETECTED_BY_HEALTH = "health"  # a check at the life's start failed (slurm.health: a `node_health` failure first)
# hpctrain-cancel's name in `cancelled` events (`by`).
CANCELLED_BY_COMMAND = "hpctrain-cancel"


@dataclass(frozen=True)
class Retry(Event):
    """`hpctrain-submit --retry` resubmitted this run dir's job.sbatch after its job ended
    without finishing: the run resumes in job `job_id` from its newest checkpoint, with a new
    restart budget window (budgets count from here; hpctrain.recovery.decide.lineage)."""

    name: ClassVar[str] = "retry"
    previous_job_id: str | None = None  # the job that ended without finishing
    previous_state: str | None = None  # how it ended (Slurm's state, or the journal's word)
    reason: str | None = None  # why it was picked, as the command printed it


@dataclass(frozen=True)
class Replanned(Event):
    """A run dir started again with a grown (or changed) plan: keys that may change between lives
    (hpctrain.cli.common.REPLANNABLE: the step budget, the cadence of logging, evaluation and
    checkpoints, the time limit, the spare nodes) differ from its config.yaml. `changes` maps
    each key to [old, new]; the config.yaml written then holds the new values."""

    name: ClassVar[str] = "replanned"
    changes: dict[str, list[Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class Finish(Event):
    name: ClassVar[str] = "finish"
    always: ClassVar[tuple[str, ...]] = ()
    step: int = 0  # final metrics are in `extra` (eval_accuracy, eval_loss, loss, ...)


@dataclass(frozen=True)
class Pruned(Event):
    """hpctrain-tune: the study's pruner stopped this trial at an evaluation step; a checkpoint
    of that step was saved and the job ends COMPLETED."""

    name: ClassVar[str] = "pruned"
    always: ClassVar[tuple[str, ...]] = ()
    step: int = 0
    metric: str = ""  # tune.metric
    value: float | None = None  # its value at that step, the last one reported to the study


@dataclass(frozen=True)
class Trial(Event):
    """hpctrain-tune: a trial of the study submitted or told, in the sweep dir's tune.jsonl and
    (once told) in the trial's own events.jsonl."""

    name: ClassVar[str] = "trial"
    always: ClassVar[tuple[str, ...]] = ()
    number: int = 0  # the trial's number in the study (its run dir is <sweep dir>/<number>)
    state: str = ""  # RUNNING (submitted), COMPLETE, PRUNED or FAIL (told)
    value: float | None = None  # the objective told to the study
    params: dict[str, Any] | None = None
    run_dir: str | None = None
    reason: str | None = None  # why it failed (a failed run, a refused submission)
    by_job: str | None = None  # the job that submitted or told it (None: hpctrain-tune itself)


@dataclass(frozen=True, kw_only=True)
class Released(Event):
    """The job the run goes on in (job_id) waited for nodes it excluded itself, and they were back
    in service: they were let in (hpctrain.recovery.starved), by the old job's guardian."""

    name: ClassVar[str] = "released"
    nodes: list[str]  # dropped from its ExcNodeList
    reason: str | None = None  # what Slurm said it waited for (Reason=...)
    by: str | None = None


EVENT_TYPES: dict[str, type[Event]] = {
    cls.name: cls
    for cls in (
        Start,
        Checkpoint,
        Stop,
        ForcedSave,
        Requeue,
        Relaunch,
        Failure,
        Silent,
        Draining,
        Cancelled,
        Retry,
        Replanned,
        Finish,
        Pruned,
        Trial,
        Released,
        Straggler,
        StragglerCleared,
        StragglerLeaving,
    )
}

# The events that end a life (the last word about an attempt): goodput's lives and
# hpctrain-status's "how it ended" both read them. `pruned`: hpctrain-tune's pruner ended the
# trial on purpose, like a finish.
ENDINGS: tuple[type[Event], ...] = (Finish, Failure, Requeue, Relaunch, Cancelled, Pruned)


def from_record(record: dict[str, Any]) -> Event | None:
    """The typed event of one journal line; None for a line that is not a known event (or lacks
    a field its event cannot be without, which hpctrain never writes)."""
    cls = EVENT_TYPES.get(record.get("event", ""))
    if cls is None:
        return None
    known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
    fields = {k: v for k, v in record.items() if k in known}
    if fields.get("job_id") is not None:
        fields["job_id"] = str(fields["job_id"])
    if fields.get("restart") is not None:
        fields["restart"] = int(fields["restart"])
    extra = {k: v for k, v in record.items() if k not in known and k != "event"}
    try:
        return cls(**fields, extra=extra)
    except TypeError:  # a required field missing
        return None


def read_events(path: Path, offset: int = 0) -> list[Event]:
    """Every known event of a journal from byte `offset` on, in order (torn and unknown lines
    skipped)."""
    return [e for e in map(from_record, read_jsonl(path, offset)) if e is not None]


def last_checkpoint_step(events: Sequence[Event]) -> int | None:
    """The step of the newest `checkpoint` event; None before the first."""
    steps = [e.step for e in events if isinstance(e, Checkpoint)]
    return steps[-1] if steps else None


class Journal(JsonLines):
    """events.jsonl: the one writer. Every record has `event` and `time` (UNIX seconds)."""

    def write_event(self, event: Event) -> None:
        stamped = dataclasses.replace(event, time=event.time or round(time.time(), 3))
        self.write(stamped.to_record())
