"""Stragglers found while training: each rank times its steps' own work, the ranks compare
their windows' times every `trainer.straggler_window_steps` steps, and rank 0 journals an episode once
(`straggler`, `straggler_cleared`). What is timed and why: hpctrain.trainer.stragglers.

The own work of a step is from its start to the backward of its last micro-batch: the batches'
loading, the forwards and losses, and the backwards of the micro-batches before the last (which
reduce nothing). With DDP that waits on no peer, so a slow rank's time grows and its peers' does
not. With FSDP the forwards gather the parameters from every rank, so a slow rank makes its peers
wait inside their forwards: they would be timed slow, not it, and the trainer leaves the watch
off there (docs/diagnostics.md). On a GPU the times are CUDA events read once a window: no step
waits for the GPU to be timed. On a CPU the clock is the wall clock less the time the rank's
thread waited for a core (the kernel's run-queue delay, /proc/thread-self/schedstat): on a machine
running more processes than it has cores the scheduler slows whichever rank it leaves waiting,
window by window (in a full run of the test suite that named ranks 1.3x to 2.8x slow, none slowed
on purpose), while a rank slowed by its own hardware, or stopped, is not waiting for a core and
still counts.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import torch
import torch.distributed as dist

from hpctrain.dist.context import DistContext
from hpctrain.run.events import Journal, Straggler, StragglerCleared
from hpctrain.trainer.stragglers import Episodes, slowdowns, window_time

log = logging.getLogger(__name__)

# The calling thread's scheduler statistics: on-CPU ns, run-queue wait ns, timeslices.
SCHEDSTAT = "/proc/thread-self/schedstat"


class OwnWorkTimer:
    """The own work of each step: `begin()` at its start, `end()` before its last backward."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.marks: list[tuple[Any, Any]] = []
        self._began: Any = None
        self._schedstat: str | None = SCHEDSTAT
        self._fd: int | None = None

    def begin(self) -> None:
        self._began = self._now()

    def end(self) -> None:
        if self._began is not None:
            self.marks.append((self._began, self._now()))
            self._began = None

    def take(self) -> list[float]:
        """The seconds of every step timed since the last take."""
        marks, self.marks = self.marks, []
        if self.cuda and marks:
            marks[-1][1].synchronize()  # every event before it is done too
            return [start.elapsed_time(end) / 1000 for start, end in marks]
        return [end - start for start, end in marks]

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

    def __init__(self, ctx: DistContext, journal: Journal, threshold: float, window: int, nodes: list[str]) -> None:
        self.ctx = ctx
        self.journal = journal
        self.threshold = threshold
        self.window = window
        self.nodes = nodes  # each rank's node, by rank
        self.on = threshold > 0 and ctx.distributed and ctx.world_size > 1
        self.timer = OwnWorkTimer(ctx.device) if self.on else None
        self.episodes = Episodes()

    def stepped(self, step: int) -> None:
        """After each step: at the end of a window, compare the ranks."""
        if self.timer is None or len(self.timer.marks) < self.window:
            return
        times = self.timer.take()
        mine = torch.tensor([window_time(times)], dtype=torch.float64, device=self.ctx.device)
        by_rank = [torch.zeros_like(mine) for _ in range(self.ctx.world_size)]
        dist.all_gather(by_rank, mine)
        if not self.ctx.is_main:
            return
        slow = slowdowns([float(t.item()) for t in by_rank], self.threshold)
        began, ended = self.episodes.update(slow)
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
