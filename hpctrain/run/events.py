"""events.jsonl as typed records: one class per event, one writer (Journal) and one reader.

The names and fields are the README's contract; fields are only ever added. Each record keeps
the fields it does not know (`extra`), so a journal written by a newer or older hpctrain reads
back whole. The JSON-lines plumbing (torn lines, NaN) is in hpctrain.run.jsonlines.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from hpctrain.run.jsonlines import JsonLines, read_jsonl


@dataclass(frozen=True)
class Event:
    name: ClassVar[str] = ""
    # Fields written even when None (null: hpctrain-train has no job); others only when known.
    always: ClassVar[tuple[str, ...]] = ("job_id",)
    time: float = 0.0
    job_id: str | None = None  # the Slurm job (None for hpctrain-train)
    restart: int | None = None  # SLURM_RESTART_COUNT of the life that wrote it
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def to_record(self) -> dict[str, Any]:
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        kept = {k: v for k, v in fields.items() if v is not None or k in self.always}
        record = {"event": self.name, **kept, **self.extra}
        return {k: (v.value if hasattr(v, "value") else v) for k, v in record.items()}


@dataclass(frozen=True)
class Start(Event):
    name: ClassVar[str] = "start"
    world_size: int = 0
    nodes: list[str] = field(default_factory=list)
    resumed_from_step: int = 0
    total_steps: int | None = None
    ranks: list[Any] | None = None  # each rank's node, GPU and device


@dataclass(frozen=True)
class Checkpoint(Event):
    name: ClassVar[str] = "checkpoint"
    always: ClassVar[tuple[str, ...]] = ()
    step: int = 0
    reason: str = "periodic"  # a CheckpointReason
    blocking_s: float | None = None
    write_s: float | None = None


@dataclass(frozen=True)
class ForcedSave(Event):
    """What a save forced by a stop signal did within the time the signal gives (the plan is
    hpctrain.checkpoint.deadline's): written whatever the choice, so a skipped save is seen too."""

    name: ClassVar[str] = "forced_save"
    always: ClassVar[tuple[str, ...]] = ()
    step: int = 0  # the step the ranks stopped at
    reason: str = ""  # a StopReason
    forced_save: str = ""  # written | waited | abandoned_inflight | inflight_only | skipped | overran
    why: str = ""
    deadline_s: float | None = None  # seconds the signal gave (None: Ctrl-C, no deadline)
    estimated_write_s: float | None = None
    inflight_step: int | None = None  # the background write under way when the signal came
    inflight_left_s: float | None = None
    resume_step: int | None = None  # the step the next life resumes from
    redo_steps: int | None = None  # steps the next life trains again
    took_s: float | None = None


@dataclass(frozen=True)
class Requeue(Event):
    name: ClassVar[str] = "requeue"
    cause: str = ""  # a Cause
    excluded: list[str] | None = None  # the job's ExcNodeList for its next start
    by: str | None = None  # None: hpctrain asked; "slurm": Slurm did it on its own


@dataclass(frozen=True)
class Relaunch(Event):
    name: ClassVar[str] = "relaunch"
    cause: str = ""
    failed: list[str] = field(default_factory=list)  # nodes that failed in this life
    excluded: list[str] = field(default_factory=list)  # srun --exclude of the new step
    nodes: list[str] = field(default_factory=list)  # nodes the new step may run on
    spare_nodes: int = 0  # nodes left over after this relaunch


@dataclass(frozen=True)
class Failure(Event):
    name: ClassVar[str] = "failure"
    cause: str = ""
    nodes: list[str] | None = None
    exit_code: int | None = None
    message: str | None = None  # a user's mistake, as the worker told it
    reason: str | None = None  # why a budget is spent, or a requeue refused
    by: str | None = None
    rank: int | None = None  # the rank whose watchdog saw a hang
    action: str | None = None  # what the control step did next (an Action, or "resubmit")
    new_job_id: str | None = None  # requeue_refused, resubmitted: the job the run goes on in


@dataclass(frozen=True)
class Cancelled(Event):
    name: ClassVar[str] = "cancelled"
    step: int | None = None  # the newest checkpoint's step
    # None: the batch shell's SIGTERM trap; "hpctrain-cancel": recorded by that command right
    # after its scancel (a pending job never runs a trap). One cancel is recorded per life.
    by: str | None = None


# hpctrain-cancel's name in `cancelled` events (`by`).
CANCELLED_BY_COMMAND = "hpctrain-cancel"


@dataclass(frozen=True)
class Retry(Event):
    """`hpctrain-submit --retry` resubmitted this run dir's job.sbatch after its job ended
    without finishing: the run resumes in job `job_id` from its newest checkpoint, with a new
    restart budget window (budgets count from here; hpctrain.run.decide.lineage)."""

    name: ClassVar[str] = "retry"
    previous_job_id: str | None = None  # the job that ended without finishing
    previous_state: str | None = None  # how it ended (Slurm's state, or the journal's word)
    reason: str | None = None  # why it was picked, as the command printed it


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


EVENT_TYPES: dict[str, type[Event]] = {
    cls.name: cls
    for cls in (Start, Checkpoint, ForcedSave, Requeue, Relaunch, Failure, Cancelled, Retry, Finish, Pruned, Trial)
}


def from_record(record: dict[str, Any]) -> Event | None:
    """The typed event of one journal line; None for a line that is not a known event."""
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
    return cls(**fields, extra=extra)


def read_events(path: Path, offset: int = 0) -> list[Event]:
    """Every known event of a journal from byte `offset` on, in order (torn and unknown lines
    skipped)."""
    return [e for e in map(from_record, read_jsonl(path, offset)) if e is not None]


class Journal(JsonLines):
    """events.jsonl: the one writer. Every record has `event` and `time` (UNIX seconds)."""

    def write_event(self, event: Event) -> None:
        stamped = dataclasses.replace(event, time=event.time or round(time.time(), 3))
        self.write(stamped.to_record())

    def event(self, name: str, **fields: Any) -> None:
        """`Journal(path).event("checkpoint", step=..)`: checked against the typed events."""
        cls = EVENT_TYPES.get(name)
        if cls is None:
            raise ValueError(f"unknown event {name!r}; the events are {', '.join(EVENT_TYPES)}")
        record = from_record({"event": name, "time": round(time.time(), 3), **fields})
        assert record is not None
        self.write_event(record)
