"""The records of events.jsonl that the run's watchers write while a step trains (every record is
listed in hpctrain.run.events): a node fallen silent (the batch script's heartbeat watcher), nodes
an administrator drains (its drain watch), ranks slower than their peers (the straggler watch)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hpctrain.run.event_base import Event


@dataclass(frozen=True, kw_only=True)
class Silent(Event):
    """The batch script's heartbeat watcher heard nothing from every training process of `nodes`
    for `silent_s` seconds while the others beat on (hpctrain.recovery.watch): written before it
    ends the step. The step's after-step counts these nodes as failed."""

    name: ClassVar[str] = "silent"
    nodes: list[str]
    ranks: list[int]
    silent_s: float
    timeout_s: float  # slurm.silent_node_timeout_s
    step_id: str | None = None  # the training step's SLURM_STEP_ID
    # The live ranks' hang reports, asked before the step was ended (RUN_DIR-relative folder,
    # hpctrain.run.hang_reports); None when none came.
    report: str | None = None


@dataclass(frozen=True, kw_only=True)
class Draining(Event):
    """Slurm shows training nodes of the running step draining (an administrator's DRAIN) while
    the job holds as many free spares (hpctrain.recovery.drain_watch): written by the batch
    script's watcher before it asks the ranks to save and stop at the next step boundary. The
    step's after-step then relaunches on the spares (`relaunch` with cause `drain`), no step redone."""

    name: ClassVar[str] = "draining"
    nodes: list[str]
    reasons: list[str]  # each node's reason, as Slurm gives it (sinfo %E)
    spares: list[str]  # the free spares that take their places
    step_id: str | None = None  # the training step's SLURM_STEP_ID


@dataclass(frozen=True, kw_only=True)
class StragglerLeaving(Event):
    """The straggler watch named ranks on training nodes of the running step, and the job holds as
    many free spares (trainer.straggler_action=relaunch, hpctrain.recovery.straggler_move): written
    by the batch script's watcher before it asks the ranks to save and stop at the next step
    boundary. The step's after-step then relaunches on the spares without those nodes (`relaunch`
    with cause `straggler`), no step redone."""

    name: ClassVar[str] = "straggler_leaving"
    nodes: list[str]
    slowdown: list[float]  # each node's slowest named rank's slowdown, in the same order
    spares: list[str]  # the free spares that take their places
    step_id: str | None = None  # the training step's SLURM_STEP_ID


@dataclass(frozen=True, kw_only=True)
class Straggler(Event):
    """Ranks persistently slower than their peers at the work of a step that waits on no one
    (hpctrain.trainer.stragglers): written once when the episode begins."""

    name: ClassVar[str] = "straggler"
    step: int  # the step that ended the window that found them
    ranks: list[int]
    nodes: list[str]  # the ranks' nodes, in the same order
    slowdown: list[float]  # each rank's time over its peers' median, in the same order
    window_steps: int  # the steps a rank's time is taken over (their mean, the slowest step left out)


@dataclass(frozen=True, kw_only=True)
class StragglerCleared(Event):
    """Ranks named by a `straggler` that are no longer slower than the threshold."""

    name: ClassVar[str] = "straggler_cleared"
    step: int
    ranks: list[int]
    nodes: list[str]
    window_steps: int
