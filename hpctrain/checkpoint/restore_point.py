"""Where a life's state comes from when copies of it are kept in memory as well as on disk.

The in-memory tier keeps each rank's newest states in host memory twice: on the rank's
own node and on its partner's, a node of the job other than its own, so a node lost takes one
copy of its ranks' states and leaves the other. After a loss, the ranks of the next step can
restore from memory only at a step for which every rank of the world that saved it still has a
copy on a node that is not lost: a step some rank lacks would start the ranks from different
points. Else, the newest complete checkpoint on disk, as without the tier.

The functions here are pure (tests/test_restore_point.py is their table): the processes that hold
the copies say what they hold, and the trainer asks where to resume.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class HeldCopy:
    """One rank's state at one step, complete (its checksum verified), held on one node."""

    rank: int
    step: int
    node: str


@dataclass(frozen=True)
class RestorePoint:
    """Where to resume: `memory` or `disk` at `step`, or `none` (a fresh start at step 0)."""

    source: Literal["memory", "disk", "none"]
    step: int


def partner_nodes(nodes: Sequence[str]) -> dict[str, str]:
    """The node that keeps the second copy of each node's ranks' states: the next in the job's
    node order, the last node's the first's. A job of one node has no partner (its copies die
    with it): {}."""
    if len(nodes) < 2:
        return {}
    return {node: nodes[(i + 1) % len(nodes)] for i, node in enumerate(nodes)}


def restore_point(
    world_size: int,
    copies: Iterable[HeldCopy],
    lost: Iterable[str],
    newest_on_disk: int | None,
) -> RestorePoint:
    """The newest step every rank 0..world_size-1 has a copy of on a node not `lost`, when it is no
    older than the newest complete checkpoint on disk (`newest_on_disk`, None: none); else that
    checkpoint; else a fresh start. A tie goes to memory: the same state, without the read."""
    gone = set(lost)
    ranks_at: dict[int, set[int]] = {}
    for held in copies:
        if held.node not in gone and 0 <= held.rank < world_size:
            ranks_at.setdefault(held.step, set()).add(held.rank)
    whole = [step for step, ranks in ranks_at.items() if len(ranks) == world_size]
    in_memory = max(whole) if whole and world_size > 0 else None
    if in_memory is not None and (newest_on_disk is None or in_memory >= newest_on_disk):
        return RestorePoint("memory", in_memory)
    if newest_on_disk is not None:
        return RestorePoint("disk", newest_on_disk)
    return RestorePoint("none", 0)
