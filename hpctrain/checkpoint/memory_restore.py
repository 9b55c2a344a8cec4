"""The in-memory tier's restore: where a life resumes when copies of its state are held in memory.

Rank 0 asks every memory holder what it holds (all at once, each within LIST_TIMEOUT_S: a holder
on a node that died silently answers nothing), chooses the newest step every rank's state
survives for (restore_point.restore_point, against the newest whole checkpoint on disk) and tells
the ranks which holder has each one's copy; every rank fetches its own. If any rank fails to,
every rank falls back to the disk, as without the tier: the ranks never start from different
steps. The copies are sent by hpctrain.checkpoint.memory_tier.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
import torch.distributed as dist

from hpctrain.checkpoint.memory_client import HolderClient
from hpctrain.checkpoint.restore_point import HeldCopy, RestorePoint, restore_point
from hpctrain.dist.context import DistContext

log = logging.getLogger(__name__)

# How long rank 0 waits for each holder's listing at a restore (all asked at once).
LIST_TIMEOUT_S = 3.0


def listings(holders: dict[str, HolderClient]) -> tuple[list[HeldCopy], list[str]]:
    """Every holder's copies, asked at once; the nodes whose holder did not answer are the lost."""

    def ask(node: str) -> list[HeldCopy] | None:
        try:
            return holders[node].listing()
        except OSError:
            return None

    with ThreadPoolExecutor(max_workers=max(1, min(32, len(holders)))) as pool:
        answers = dict(zip(holders, pool.map(ask, holders)))
    copies = [copy for answer in answers.values() if answer for copy in answer]
    return copies, sorted(node for node, answer in answers.items() if answer is None)


def plan(
    world_size: int, copies: list[HeldCopy], lost: list[str], newest_on_disk: int | None
) -> tuple[RestorePoint, dict[int, str]]:
    """The restore point and, when it is in memory, the node to fetch each rank's copy from."""
    point = restore_point(world_size, copies, lost, newest_on_disk)
    where: dict[int, str] = {}
    if point.source == "memory":
        for copy in sorted(copies, key=lambda c: c.node):
            if copy.step == point.step and copy.node not in lost:
                where.setdefault(copy.rank, copy.node)
    return point, where


def restore(
    ctx: DistContext,
    holders: dict[str, HolderClient],
    newest_on_disk: Callable[[], int | None],
    saved_world: Callable[[], int | None] = lambda: None,
) -> tuple[RestorePoint, dict[str, Any] | None]:
    """Collective. The restore point every rank agrees on, and this rank's state when it is in
    memory (None: resume from the disk, or start afresh, as the point says). Rank 0 alone asks
    `newest_on_disk` (the newest whole checkpoint's step) and `saved_world` (the world size of the
    life whose copies the holders keep, None: not known): a copy is one rank's of its world (its
    RNG, its share of the data), so a world of another size (an elastic relaunch on fewer nodes)
    resumes from the disk, whose load re-splits the batch."""
    chosen: list[Any] = [None]
    if ctx.is_main:
        on_disk, world = newest_on_disk(), saved_world()
        if world not in (None, ctx.world_size):
            log.info("the world is %d ranks, its memory copies were of %d: resuming from disk", ctx.world_size, world)
            chosen = [(_fallback(on_disk), {}, on_disk)]
        else:
            copies, lost = listings(holders)
            point, where = plan(ctx.world_size, copies, lost, on_disk)
            if lost:
                log.info("memory tier: no answer from the holders on %s", ", ".join(lost))
            chosen = [(point, where, on_disk)]
    if ctx.distributed:
        dist.broadcast_object_list(chosen, src=0)
    point, where, on_disk = chosen[0]
    if point.source != "memory":
        return point, None
    state: dict[str, Any] | None = None
    try:
        payload = holders[where[ctx.rank]].get(ctx.rank, point.step)
        state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except (OSError, KeyError, RuntimeError) as error:
        log.warning("memory tier: rank %d could not fetch its state at step %d (%s)", ctx.rank, point.step, error)
    fetched = [state is not None]
    if ctx.distributed:
        every: list[Any] = [None] * ctx.world_size
        dist.all_gather_object(every, fetched[0])
        fetched = every
    if not all(fetched):
        return _fallback(on_disk), None
    return point, state


def _fallback(on_disk: int | None) -> RestorePoint:
    return RestorePoint("disk", on_disk) if on_disk is not None else RestorePoint("none", 0)
