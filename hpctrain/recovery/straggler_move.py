"""A training node whose rank the straggler watch named is left for a free spare, at a step
boundary, no step redone (trainer.straggler_action=relaunch).

Rank 0 journals `straggler` when ranks are persistently slower than their peers
(hpctrain.trainer.straggler_watch) and `straggler_cleared` when they are no longer. A slow node
slows every step of the job (its peers wait for it in every all-reduce), so with a spare idle in
the allocation the job is better off without it. The batch script's watcher reads the journal's
new records at each look of its drain watch (hpctrain.recovery.drain_watch, every
slurm.drain_poll_s); when the running life has stragglers named and not cleared on training nodes,
and the job holds as many free spares in service, it journals `straggler_leaving` and sends the
step's tasks SIGTERM, as for a drain. The ranks save the step they are at and stop; the after-step
sees the record (hpctrain.recovery.judge.classify: cause `straggler`) and relaunches at once
without those nodes (hpctrain.recovery.decide), charged to no budget. A node left so stays out of
the job's later relaunches (hpctrain.recovery.history.stragglers_left): Slurm lists it in service,
and it is as slow as it was.

Without a free spare nothing moves (a requeue would cost the queue and might land on the same
node): the run trains on, and hpctrain-status names the straggler. `named_stragglers` and
`straggler_move` are the decisions, pure functions (tests/test_straggler_move.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hpctrain.recovery.facts import NodeState, Service
from hpctrain.run.events import Event, Start, Straggler, StragglerCleared, from_record

ACTIONS = ("report", "relaunch")  # trainer.straggler_action


@dataclass(frozen=True)
class StragglerMove:
    nodes: list[str]  # the step's nodes with a rank named slow
    slowdown: list[float]  # each one's slowest named rank's slowdown, in the same order
    spares: list[str]  # the job's free spares in service that take their places


def named_stragglers(events: Sequence[Event]) -> dict[str, float]:
    """The nodes with ranks named slow and not cleared in the newest life of `events` (from its
    `start` on: a life before it had other ranks, maybe other nodes), with the largest slowdown
    named on each."""
    slow: dict[int, tuple[str, float]] = {}  # rank -> (its node, its slowdown)
    for event in events:
        if isinstance(event, Start):
            slow = {}
        elif isinstance(event, Straggler):
            for rank, node, times in zip(event.ranks, event.nodes, event.slowdown, strict=False):
                slow[rank] = (node, times)
        elif isinstance(event, StragglerCleared):
            for rank in event.ranks:
                slow.pop(rank, None)
    nodes: dict[str, float] = {}
    for node, times in slow.values():
        nodes[node] = max(times, nodes.get(node, 0.0))
    return nodes


def straggler_move(
    named: dict[str, float], step_nodes: Sequence[str], job_nodes: Sequence[str], states: dict[str, NodeState]
) -> StragglerMove | None:
    """The step's nodes named slow and the spares to take their places; None when none is named,
    or the job has too few spares in service for all of them (moving some would leave a
    straggler in the step, and a requeue would cost the queue: the run trains on)."""
    slow = sorted(n for n in named if n in step_nodes)
    if not slow:
        return None
    free = sorted(n for n in job_nodes if n not in step_nodes and n in states and states[n].service is Service.UP)
    if len(free) < len(slow):
        return None
    return StragglerMove(slow, [named[n] for n in slow], free[: len(slow)])


class JournalTail:
    """The records added to events.jsonl since the last read (a line still being written is left
    for the next one): the watcher reads a long run's journal once, not at every look."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def new_events(self) -> list[Event]:
        try:
            with self.path.open("rb") as journal:
                journal.seek(self.offset)
                added = journal.read()
        except OSError:
            return []
        whole = added[: added.rfind(b"\n") + 1]
        self.offset += len(whole)
        events = []
        for line in whole.decode("utf-8", errors="replace").splitlines():
            try:
                event = from_record(json.loads(line))
            except json.JSONDecodeError:  # a torn line (a killed writer) is skipped
                continue
            if event is not None:
                events.append(event)
        return events
