"""What the heartbeat watcher has heard of one training step's ranks, and which nodes are silent.

A job of thousands of ranks sends thousands of beats a second (one a rank every BEAT_S). The
watcher must take each in constant time and judge the step in time proportional to its nodes,
never its ranks: judging every rank on every datagram (as the first watcher did) was quadratic,
and at 2,048 ranks on one core the keeper's pings went unanswered behind the backlog.

`StepHearing` keeps, besides each rank's newest beat, each node's newest beat among its ranks
still running: a node is silent when that is older than the timeout. `silent_nodes` is the
same rule over plain records, the table the tests read; the two agree on every input.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass
class Heard:
    """What the watcher knows of one rank: its node, its newest beat, whether it said bye."""

    node: str
    last: float  # time.monotonic() of its newest beat
    gone: bool = False


def silent_nodes(heard: Mapping[int, Heard], now: float, timeout_s: float) -> dict[str, list[int]]:
    """The nodes whose every rank heard from (none that said bye) has sent nothing for over
    `timeout_s`, while some other rank still beats: node -> its silent ranks. Every rank silent
    at once is the step ending (Slurm killed its tasks) or this node cut off: nothing to act on."""
    live = {rank: h for rank, h in heard.items() if not h.gone}
    silent = {rank for rank, h in live.items() if now - h.last > timeout_s}
    if not silent or len(silent) == len(live):
        return {}
    by_node: dict[str, list[int]] = {}
    for rank, h in sorted(live.items()):
        by_node.setdefault(h.node, []).append(rank)
    return {node: ranks for node, ranks in by_node.items() if all(rank in silent for rank in ranks)}


@dataclass
class _Node:
    live: set[int] = field(default_factory=set)  # its ranks that have not said bye
    newest: float = float("-inf")  # the newest beat of those


class StepHearing:
    """One step's ranks as heard: O(1) a beat, O(nodes) a judgement."""

    def __init__(self) -> None:
        self.ranks: dict[int, Heard] = {}
        self._nodes: dict[str, _Node] = {}

    def __len__(self) -> int:
        return len(self.ranks)

    def hear(self, rank: int, node: str, now: float, bye: bool = False) -> None:
        """A beat of `rank` on `node` at `now` (times only grow); `bye`: its process has ended."""
        heard = self.ranks.get(rank)
        if heard is None:
            heard = self.ranks[rank] = Heard(node, now)
        elif heard.node != node:  # a rank heard from another node: it lives there now
            self._leave(rank, heard)
            heard.node = node
        heard.last = now
        heard.gone = heard.gone or bye
        place = self._nodes.setdefault(node, _Node())
        if heard.gone:
            self._leave(rank, heard)
        else:
            place.live.add(rank)
            place.newest = now

    def nodes(self) -> list[str]:
        """The nodes with a rank that has not said bye: the step's training nodes."""
        return sorted(name for name, place in list(self._nodes.items()) if place.live)

    def afresh(self, now: float) -> None:
        """Every rank heard at `now` (the watcher itself did not run: the silence was its own)."""
        for heard in self.ranks.values():
            heard.last = now
        for place in self._nodes.values():
            if place.live:
                place.newest = now

    def silent(self, now: float, timeout_s: float) -> dict[str, list[int]]:
        """silent_nodes over what was heard, judged by node."""
        live = [(name, place) for name, place in self._nodes.items() if place.live]
        silent = {name: place for name, place in live if now - place.newest > timeout_s}
        if not silent or len(silent) == len(live):
            return {}
        return {name: sorted(place.live) for name, place in sorted(silent.items())}

    def _leave(self, rank: int, heard: Heard) -> None:
        """`rank` no longer counts for its node: the node's newest beat is that of its others."""
        place = self._nodes.get(heard.node)
        if place is None or rank not in place.live:
            return
        place.live.discard(rank)
        place.newest = max((self.ranks[other].last for other in place.live), default=float("-inf"))
