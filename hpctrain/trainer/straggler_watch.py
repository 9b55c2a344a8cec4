"""Stragglers found while training: each rank times its steps' own work, the ranks compare
their windows' times every `trainer.straggler_window_steps` steps, and rank 0 journals an episode once
(`straggler`, `straggler_cleared`). What is timed and why: hpctrain.trainer.stragglers.

The own work of a step is from its start to the backward of its last micro-batch: the batches'
loading, the forwards and losses, and the backwards of the micro-batches before the last (which
reduce nothing). With DDP that waits on no peer, so a slow rank's time grows and its peers' does
not. With FSDP the forwards gather the parameters from every rank, so a slow rank makes its peers
wait inside their forwards: each unit's gather (FSDP's own hook before its forward) is timed and
left out, and the own work is the first micro-batch's forward and loss alone (the backward
gathers again, untimed). On a GPU the times are CUDA events read once a window: no step
waits for the GPU to be timed. On a CPU the clock is the wall clock less the time the rank's
thread waited for a core (the kernel's run-queue delay, /proc/thread-self/schedstat): on a machine
running more processes than it has cores the scheduler slows whichever rank it leaves waiting,
window by window (in a full run of the test suite that named ranks 1.3x to 2.8x slow, none slowed
on purpose), while a rank slowed by its own hardware, or stopped, is not waiting for a core and
still counts. Its intra-op workers' waits (with trainer.threads above 1 the training thread waits
for them, not for a core) are read once a window (hpctrain.trainer.workers_wait) and what they
waited beyond the least waiting rank's is taken off (hpctrain.trainer.stragglers.slowdowns).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from hpctrain.dist.context import DistContext
from hpctrain.run.events import Journal, Straggler, StragglerCleared
from hpctrain.trainer.stragglers import Episodes, slowdowns, window_time
from hpctrain.trainer.workers_wait import WorkersWait

log = logging.getLogger(__name__)

# The calling thread's scheduler statistics: on-CPU ns, run-queue wait ns, timeslices.
SCHEDSTAT = "/proc/thread-self/schedstat"
UNTIMED = -1.0  # a rank's window time when it timed too few of the window's steps


class OwnWorkTimer:
    """The own work of each step: `begin()` at its start, `end()` where it stops being its own
    (hpctrain.trainer.step). The waits between `wait_begins()` and `wait_ends()` inside it (a
    sharded model's gathers: hpctrain.trainer.sharding.time_gathers) are taken out. A step that
    begins or ends while `untimed()` is true (the rank's checkpoint written in the background) is
    not timed."""

    def __init__(self, device: torch.device, untimed: Callable[[], bool] = lambda: False) -> None:
        self.cuda = device.type == "cuda"
        self.untimed = untimed
        self.marks: list[tuple[Any, Any, list[tuple[Any, Any]]]] = []  # (begin, end, its waits)
        self._began: Any = None
        self._waits: list[tuple[Any, Any]] = []
        self._wait_began: Any = None
        self._schedstat: str | None = SCHEDSTAT
        self._fd: int | None = None

    def begin(self) -> None:
        self._began = None if self.untimed() else self._now()
        self._waits = []

    def end(self) -> None:
        if self._began is not None and not self.untimed():
            self.marks.append((self._began, self._now(), self._waits))
        self._began = None

    def wait_begins(self) -> None:
        if self._began is not None:
            self._wait_began = self._now()

    def wait_ends(self) -> None:
        if self._began is not None and self._wait_began is not None:
            self._waits.append((self._wait_began, self._now()))
        self._wait_began = None

    def take(self) -> list[float]:
        """The seconds of every step timed since the last take, its waits left out."""
        marks, self.marks = self.marks, []
        if self.cuda and marks:
            marks[-1][1].synchronize()  # every event before it is done too
        seconds = self._seconds
        return [seconds(start, end) - sum(seconds(a, b) for a, b in waits) for start, end, waits in marks]

    def _seconds(self, start: Any, end: Any) -> float:
        return float(start.elapsed_time(end)) / 1000 if self.cuda else float(end - start)

    def _now(self) -> Any:
        if not self.cuda:
            return time.perf_counter() - self._queued_s()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _queued_s(self) -> float:
        """Seconds this thread has waited for a core since it started (0 where the kernel does not say).
        The file stays open (opened by the training thread, whose figures it then shows): a read
        from its start regenerates it, a few microseconds."""
        if self._schedstat is None:
            return 0.0
        try:
            if self._fd is None:
                self._fd = os.open(self._schedstat, os.O_RDONLY)
            return int(os.pread(self._fd, 128, 0).split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            self._schedstat = None  # not shown by this kernel: the wall clock alone from now on
            return 0.0


class StragglerWatch:
    """Collective every `window` steps (the same steps on every rank); rank 0 journals."""

    def __init__(
        self,
        ctx: DistContext,
        journal: Journal,
        threshold: float,
        window: int,
        nodes: list[str],
        writing: Callable[[], bool] = lambda: False,
    ) -> None:
        self.ctx = ctx
        self.journal = journal
        self.threshold = threshold
        self.window = window
        self.nodes = nodes  # each rank's node, by rank
        self.on = threshold > 0 and ctx.distributed and ctx.world_size > 1
        # `writing`: this rank's checkpoint is being written in the background (its steps untimed).
        self.timer = OwnWorkTimer(ctx.device, untimed=writing) if self.on else None
        self.others = WorkersWait() if self.on and ctx.device.type == "cpu" else None
        self.stepped_in_window = 0
        self.episodes = Episodes()

    def stepped(self, step: int) -> None:
        """After each step: at the end of a window (the same steps on every rank), compare the ranks."""
        if self.timer is None:
            return
        self.stepped_in_window += 1
        if self.stepped_in_window < self.window:
            return
        self.stepped_in_window = 0
        # Half the window timed at least: fewer (a checkpoint written through it) say too little.
        own = window_time(self.timer.take(), fewest=max(3, self.window // 2))
        others_waited = self.others.since_last_s() / self.window if self.others is not None else 0.0
        told = [UNTIMED if own is None else own, others_waited]
        mine = torch.tensor(told, dtype=torch.float64, device=self.ctx.device)
        by_rank = [torch.zeros_like(mine) for _ in range(self.ctx.world_size)]
        dist.all_gather(by_rank, mine)
        if not self.ctx.is_main:
            return
        gathered = [(float(t[0].item()), float(t[1].item())) for t in by_rank]
        times = [None if own == UNTIMED else own for own, _ in gathered]
        slow = slowdowns(times, self.threshold, queued=[waited for _, waited in gathered])
        began, ended = self.episodes.update(slow, unjudged=[r for r, t in enumerate(times) if t is None])
        if began:
            ranks = sorted(began)
            said = ", ".join(f"rank {r} on {self._node(r)} {began[r]:.2f}x" for r in ranks)
            log.warning("straggler at step %d: %s its peers' median over %d steps", step, said, self.window)
            self._journal(Straggler, step, ranks, slowdown=[began[r] for r in ranks])
        if ended:
            log.info("straggler cleared at step %d: ranks %s", step, ", ".join(map(str, ended)))
            self._journal(StragglerCleared, step, ended)

    def _node(self, rank: int) -> str:
        return self.nodes[rank] if rank < len(self.nodes) else "?"

    def _journal(
        self, kind: type[Straggler] | type[StragglerCleared], step: int, ranks: list[int], **more: Any
    ) -> None:
        life = self.ctx.life
        nodes = [self._node(r) for r in ranks]
        self.journal.write_event(
            kind(
                job_id=life.job_id,
                restart=life.restart,
                step=step,
                ranks=ranks,
                nodes=nodes,
                window_steps=self.window,
                **more,
            )
        )
