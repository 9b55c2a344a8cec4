"""Goodput of a run: of the time its lives held an allocation, how much trained steps it kept.

A pure function over the run's records: events.jsonl (one `start` per life, `checkpoint`s with
blocking_s / write_s, the ending `requeue` | `relaunch` | `failure` | `cancelled` | `finish`)
and metrics.jsonl (each record's `step` and `time`). Definitions (also in docs/operate.md):

- A life runs from its `start` event to its ending event. After a `relaunch` the allocation was
  held all along, so the next life's allocated time begins at the relaunch, not at its start.
- allocated: the sum of the lives' allocated times.
- kept: training time (evaluation included) of the steps that survive into the final weights,
  or, while a run has not finished, into its last logged step. Walking back from there, each
  life keeps the steps from the step it resumed from to the step the next kept life resumed
  from; a life whose checkpoints were all lost (torn) keeps nothing.
- lost, split into: startup (allocated before the life's `start`: from the batch script's start,
  its `start`'s `allocated_at`, or from a relaunch: set-up, process start, imports, rendezvous and
  resume), checkpoint stalls (blocking_s; forced saves also block for write_s),
  redone (from a life's last kept step to its end: steps the next life trains again, and the
  stop itself: noticing a hang or a dead node, exiting), and detection (of that, a node's silence
  until the heartbeat watcher declared it dead: the `silent` event's silent_s).
- wait: from one life's end to the next one's allocated start (Slurm's requeue hold, the queue,
  the start of the batch script and of Python, or a user's resubmission). It is not allocated
  time of this run, so it is shown apart and left out of goodput.
- goodput % = kept / allocated.
A `stop` (the ranks agreed to stop for a signal) ends no life: the save it forces and the ending
event after it say how the life ended.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from hpctrain.run.causes import Cause, CheckpointReason, stop_reason
from hpctrain.run.events import (
    BY_SLURM,
    ENDINGS,
    Checkpoint,
    Event,
    Failure,
    Finish,
    ForcedSave,
    Pruned,
    Relaunch,
    Requeue,
    Silent,
    Start,
    read_events,
)
from hpctrain.run.jsonlines import read_jsonl
from hpctrain.run.paths import RunDir

Metrics = list[dict[str, Any]]  # metrics.jsonl's records
Logged = tuple[float, int, dict[str, Any]]  # a record with a step: its time (0 without one), step, record


@dataclass(frozen=True)
class Life:
    job_id: str | None
    restart: int | None
    began: float  # allocated time starts (UNIX seconds)
    started: float  # the `start` event: resumed, training begins
    ended: float
    ending: str  # finish | failure | requeue | relaunch | cancelled | pruned | stopped | running | unknown
    cause: Cause | None
    resumed_from: int
    kept_to: int  # the last step of this life in the final lineage (resumed_from: none)
    kept_s: float
    startup_s: float
    stall_s: float
    redone_s: float
    detection_s: float = 0.0  # of the lost time: a dead node's silence until the watcher declared it
    # Where the life's state came from: "memory" (the in-memory tier), "disk" (a checkpoint), None
    # for a fresh start (the `start` event's resumed_from).
    state_from: str | None = None

    @property
    def allocated_s(self) -> float:
        return self.ended - self.began


@dataclass(frozen=True)
class Goodput:
    lives: list[Life]
    allocated_s: float
    kept_s: float
    startup_s: float
    stall_s: float
    redone_s: float
    wait_s: float
    goodput_pct: float | None  # None before any time was allocated
    detection_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        record = asdict(self)
        record["lives"] = [{**asdict(life), "allocated_s": life.allocated_s} for life in self.lives]
        return _rounded(record)


def goodput_of(run: RunDir, now: float | None = None) -> Goodput:
    """The goodput of a run dir, from its records as they are now."""
    return goodput(read_events(run.events), read_jsonl(run.metrics), now)


def goodput(events: Sequence[Event], metrics: Metrics, now: float | None = None) -> Goodput:
    """`now`: the run is still going (its last life has no ending yet) and this is the time."""
    segments = _segments(events)
    # Each record's time and step read once: every life scans them, and a long run logs
    # hundreds of thousands (`hpctrain-status` reads a hundred runs at a time).
    logged = [(_time(r) or 0.0, step, r) for r in metrics if (step := _int(r.get("step"))) is not None]
    final_step = _final_step(segments, logged)
    kept_to = _lineage([seg.start.resumed_from_step for seg in segments], final_step)
    lives: list[Life] = []
    for index, segment in enumerate(segments):
        previous = segments[index - 1] if index else None
        is_last = index == len(segments) - 1
        until = float("inf") if is_last else segments[index + 1].start.time
        lives.append(_life(segment, previous, kept_to[index], logged, until, now if is_last else None))
    waits = [max(0.0, later.began - earlier.ended) for earlier, later in zip(lives, lives[1:])]
    allocated = sum(life.allocated_s for life in lives)
    kept = sum(life.kept_s for life in lives)
    return Goodput(
        lives=lives,
        allocated_s=allocated,
        kept_s=kept,
        startup_s=sum(life.startup_s for life in lives),
        stall_s=sum(life.stall_s for life in lives),
        redone_s=sum(life.redone_s for life in lives),
        wait_s=sum(waits),
        goodput_pct=100.0 * kept / allocated if allocated > 0 else None,
        detection_s=sum(life.detection_s for life in lives),
    )


@dataclass
class Segment:
    """A life's events: its `start`, and what was written after it until the next start."""

    start: Start
    after: list[Event]


def _segments(events: Sequence[Event]) -> list[Segment]:
    """The events from each `start` to the next one; those before the first start are dropped
    (a job refused at preflight allocated no training)."""
    segments: list[Segment] = []
    for event in events:
        if isinstance(event, Start):
            segments.append(Segment(event, []))
        elif segments:
            segments[-1].after.append(event)
    return segments


def _final_step(segments: list[Segment], logged: list[Logged]) -> int:
    if not segments:
        return 0
    last = segments[-1]
    finishes = [e.step for e in last.after if isinstance(e, (Finish, Pruned))]
    if finishes:
        return finishes[-1]
    steps = [step for time, step, _ in logged if time >= last.start.time]
    return max([last.start.resumed_from_step, *steps])


def _lineage(resumed_from: list[int], final_step: int) -> list[int]:
    """For each life, the last of its steps the final state descends from (walking back: a life
    kept what it trained up to the step the next kept life resumed from)."""
    kept_to = list(resumed_from)
    needed = final_step
    for index in reversed(range(len(resumed_from))):
        if resumed_from[index] < needed:
            kept_to[index] = needed
            needed = resumed_from[index]
    return kept_to


def _life(
    segment: Segment,
    previous: Segment | None,
    kept_to: int,
    logged: list[Logged],
    until: float,
    now: float | None,
) -> Life:
    start = segment.start
    started, resumed_from = start.time, start.resumed_from_step
    # Events of another job before the next start (a resubmitted job that failed before its
    # first start) are not this life's; events without a job (checkpoints) are.
    same_job = [e for e in segment.after if _of_job(e, start.job_id)]
    in_life = [(time, record) for time, _, record in logged if started <= time <= until]
    ended, ending = _end(same_job, [record for _, record in in_life], started, now)
    mine = [record for time, record in in_life if time <= ended]
    own = [e for e in same_job if not _by_slurm(e)]
    endings = [e for e in same_job if isinstance(e, ENDINGS)]
    cause = getattr(endings[-1], "cause", None) if endings else None
    began = started
    relaunches = [
        e for e in (previous.after if previous else []) if isinstance(e, Relaunch) and _of_job(e, start.job_id)
    ]
    if relaunches:
        began = min(started, relaunches[-1].time)
    elif start.allocated_at is not None:
        # Slurm started the batch script then: set-up, Python, imports and the rendezvous are
        # this run's allocated time (before the field: counted from `start`, that time a wait).
        began = min(started, start.allocated_at)
    checkpoints = [e for e in own if isinstance(e, Checkpoint)]
    kept_until = (
        _time_of_step(kept_to, started, ended, resumed_from, mine, checkpoints) if kept_to > resumed_from else started
    )
    stall_before = sum(_stall(e) for e in checkpoints if e.step < kept_to)
    stall = sum(_stall(e) for e in checkpoints)
    kept = max(0.0, kept_until - started - stall_before)
    startup = started - began
    redone = max(0.0, (ended - began) - startup - kept - stall)
    # A node that died silently: the time until the heartbeat watcher declared it is lost to
    # detection, not to steps trained again.
    detection = min(redone, sum(e.silent_s for e in same_job if isinstance(e, Silent)))
    redone -= detection
    return Life(
        job_id=start.job_id or None,
        restart=start.restart,
        began=began,
        started=started,
        ended=ended,
        ending=ending,
        cause=cause,
        resumed_from=resumed_from,
        kept_to=kept_to,
        kept_s=kept,
        startup_s=startup,
        stall_s=stall,
        redone_s=redone,
        detection_s=detection,
        state_from=start.resumed_from,
    )


def _end(same_job: list[Event], mine: Metrics, started: float, now: float | None) -> tuple[float, str]:
    """When and how a life ended. failure/requeue `by: slurm` are written by the batch script's
    next start: they end this life in meaning, not in time."""
    own = [e for e in same_job if not _by_slurm(e)]
    own_endings = [e for e in own if isinstance(e, ENDINGS)]
    if own_endings:
        return own_endings[-1].time, own_endings[-1].name
    if now is not None:
        return now, "running"
    # Stopped by a signal outside Slurm (hpctrain-train), or killed with no word (SIGKILL, a
    # hard time limit): the last thing it wrote.
    times = [e.time for e in own] + [_time(r) or started for r in mine]
    return max([started, *times]), "stopped" if _stopped(own) else "unknown"


def _time_of_step(
    step: int,
    started: float,
    ended: float,
    resumed_from: int,
    mine: Metrics,
    checkpoints: list[Checkpoint],
) -> float:
    """When this life finished `step`: its metrics record, else its checkpoint (written after
    the snapshot and the write), else extrapolated from its last record before it."""
    for record in mine:
        if record.get("step") == step:
            return min(ended, _time(record) or ended)
    for event in checkpoints:
        if event.step == step:
            spent = (event.blocking_s or 0.0) + (event.write_s or 0.0)
            return min(ended, max(started, event.time - spent))
    before = [r for r in mine if (_int(r.get("step")) or 0) < step]
    if before:
        last = before[-1]
        last_step, last_time = _int(last.get("step")) or 0, _time(last) or started
        per_step = (last_time - started) / max(1, last_step - resumed_from)
        return min(ended, last_time + (step - last_step) * per_step)
    return ended


def _stopped(own: list[Event]) -> bool:
    # A forced save skipped for lack of time writes no checkpoint, only its forced_save record.
    saves = [e for e in own if isinstance(e, (Checkpoint, ForcedSave))]
    return bool(saves) and stop_reason(saves[-1].reason) is not None


def _stall(event: Checkpoint) -> float:
    # A final save, and one a stop signal forced, are written before training goes on (or ends).
    if event.reason == CheckpointReason.FINAL or stop_reason(event.reason) is not None:
        return (event.blocking_s or 0.0) + (event.write_s or 0.0)
    return event.blocking_s or 0.0


def _of_job(event: Event, job_id: str | None) -> bool:
    return event.job_id is None or event.job_id == job_id


def _by_slurm(event: Event) -> bool:
    return isinstance(event, (Failure, Requeue)) and event.by == BY_SLURM


def _time(record: dict[str, Any]) -> float | None:
    """A metrics record's time (None when it has none)."""
    value = _number(record.get("time"))
    return float(value) if value is not None else None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value
