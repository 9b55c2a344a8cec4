"""The in-memory tier, a rank's side: its state copied to host memory and sent to two holders.

Every `every` steps a rank copies its whole training state (the model's and the optimizer's
state dicts, the trainer's state tree, its own RNG) into reusable host buffers
(hpctrain.checkpoint.snapshot: the only part training waits for), then a thread of its own
serializes the copy and sends it to the memory holder of its node and to that of its partner node
(hpctrain.recovery.memory_holder, restore_point.partner_nodes). A copy still on its way when
the next one is due is not waited for: that step is skipped (counted), so a slow network costs
copies, never step time. A holder that does not answer costs the rank that copy and a warning
once; training goes on.

The restore after a loss: hpctrain.checkpoint.memory_restore.
"""

from __future__ import annotations

import io
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hpctrain.checkpoint import local_shards, memory_interval, rng
from hpctrain.checkpoint.memory_client import HolderClient
from hpctrain.checkpoint.snapshot import Snapshotter, state_bytes
from hpctrain.dist.context import DistContext
from hpctrain.run.node_memory import available_bytes

log = logging.getLogger(__name__)

# How often a rank looks again for holders it has not found yet (a glob of RUN_DIR/memory).
LOOK_EVERY_S = 5.0


@dataclass
class SendCounts:
    """What the tier did: copies sent whole, skipped (the one before still on its way), failed."""

    sent: int = 0
    skipped: int = 0
    failed: int = 0
    newest: int | None = None  # the newest step sent to every holder
    blocking_s: float = 0.0  # the newest copy's seconds of host copy (what training waited)


class MemoryTier:
    def __init__(
        self,
        ctx: DistContext,
        every: int,
        holders: Iterable[HolderClient],
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        fingerprint: str,
        find_holders: Callable[[], dict[str, HolderClient]] | None = None,
        wanted: int | None = None,
        overhead: float = 0.0,
    ) -> None:
        """`every`: the fewest steps between copies; `overhead` (above 0) widens that interval until a
        copy's measured cost is at most this share of the steps' time (hpctrain.checkpoint.
        memory_interval: the ranks agree on it at fixed steps, a collective). `holders`: the clients
        to send to. `find_holders`, when given, is asked again (at most every LOOK_EVERY_S, when a
        copy is due) while fewer than `wanted` are known: a life's holders start beside its first
        training step and write their addresses seconds later."""
        self.ctx, self.every, self.minimum, self.overhead = ctx, every, every, overhead
        self.fits: bool | None = None  # whether this node can hold the copies, asked at the first one
        self.first_step: int | None = None
        self.copy_s = 0.0  # a copy's cost (its host copy and its sending thread's CPU), smoothed
        self.step_s = 0.0  # a step's wall time, smoothed
        self._stepped_at: float | None = None
        self.holders = list(holders)
        self.find_holders = find_holders
        self.wanted = len(self.holders) if wanted is None else wanted
        self._looked_at = -LOOK_EVERY_S
        self.model, self.optimizer, self.fingerprint = model, optimizer, fingerprint
        self.snapshotter = Snapshotter()
        self.sender: threading.Thread | None = None
        self.counts = SendCounts()
        self._warned = False

    def stepped(self, step: int, state_tree: Callable[[], dict[str, Any]]) -> None:
        """After `step` (every rank, every step): copy and send the state when it is due and the copy
        before it has gone; at the agreement steps, agree on the interval first (a collective)."""
        now = time.perf_counter()
        if self._stepped_at is not None:
            self.step_s = _smoothed(self.step_s, now - self._stepped_at)
        self._stepped_at = now
        if self.first_step is None:
            self.first_step = step
        if self.overhead > 0 and self.minimum > 0 and memory_interval.agrees_at(step, self.first_step):
            self._agree()
        if self.every <= 0 or step % self.every:
            return
        if self.sender is not None and self.sender.is_alive():
            self.counts.skipped += 1
            return
        self._look_for_holders()
        if not self.holders:
            return
        started = time.perf_counter()
        tree = {
            # A sharded model's and optimizer's DTensors as this rank's shards (local_shards).
            "model": local_shards.local(self.model.state_dict()),
            "optimizer": local_shards.local(self.optimizer.state_dict()),
            **state_tree(),
            "rng": rng.capture(),
            "rank": self.ctx.rank,
            "world_size": self.ctx.world_size,
            "fingerprint": self.fingerprint,
        }
        if self.fits is None:
            self.fits = self._fits(tree) and self._shards_come_back()
        if not self.fits:
            if self.overhead <= 0:
                self.every = 0  # off for this life (with an overhead, the next agreement turns every rank's off)
            return
        copied = self.snapshotter.take(tree)
        self.counts.blocking_s = time.perf_counter() - started
        self.sender = threading.Thread(target=self._send, args=(step, copied), name="hpctrain-memory", daemon=True)
        self.sender.start()

    def _agree(self) -> None:
        """Collective. The interval every rank copies at from now on (memory_interval.agreed)."""
        mine = memory_interval.Measured(self.fits, self.copy_s, self.step_s)
        views: list[Any] = [mine]
        if self.ctx.distributed:
            views = [None] * self.ctx.world_size
            dist.all_gather_object(views, mine)
        interval = memory_interval.agreed(views, self.overhead, self.minimum)
        if interval != self.every and self.ctx.is_main:
            log.info(
                "memory tier: a copy every %d steps (a copy costs %.1f ms, a step %.1f ms; at most %g of the time)",
                interval,
                self.copy_s * 1e3,
                self.step_s * 1e3,
                self.overhead,
            )
        self.every = interval

    def _fits(self, tree: dict[str, Any]) -> bool:
        """Whether the node's ranks' copies (each rank's host buffers and its serialized copy) take
        at most half the node's available memory: the tier must never make a node swap."""
        state = state_bytes(tree)
        need = 2 * state * max(1, self.ctx.local_world_size)
        available = available_bytes()
        if available is None or need <= available // 2:
            return True
        if self.ctx.local_rank == 0:
            log.warning(
                "memory tier off for this life: %d ranks on this node x 2 x %.2f GB of state = %.2f GB of host "
                "memory, more than half the %.2f GB the node has available; the disk checkpoints go on "
                "(trainer.memory_ckpt_every=0 turns the tier off)",
                max(1, self.ctx.local_world_size),
                state / 1e9,
                need / 1e9,
                available / 1e9,
            )
        return False

    def _shards_come_back(self) -> bool:
        """Whether a sharded optimizer's state can be given back from this rank's shards."""
        problem = local_shards.unsupported(self.optimizer)
        if problem is not None and self.ctx.is_main:
            log.warning("memory tier off for this life: the optimizer's %s; the disk checkpoints go on", problem)
        return problem is None

    def _look_for_holders(self) -> None:
        if self.find_holders is None or len(self.holders) >= self.wanted:
            return
        now = time.monotonic()
        if now - self._looked_at < LOOK_EVERY_S:
            return
        self._looked_at = now
        found = list(self.find_holders().values())
        if len(found) > len(self.holders):
            for holder in self.holders:
                holder.close()
            self.holders = found

    def _send(self, step: int, copied: dict[str, Any]) -> None:
        cpu_started = time.thread_time()
        buffer = io.BytesIO()
        torch.save(copied, buffer)
        payload = buffer.getbuffer()
        whole = True
        holders_cpu_s = 0.0  # the holders' CPU is a node's too: the copy's cost counts it
        for holder in self.holders:
            try:
                holders_cpu_s += holder.put(self.ctx.rank, step, payload)
            except OSError as error:
                whole = False
                if not self._warned:
                    self._warned = True
                    host, port = holder.address
                    log.warning("memory tier: the copy of step %d to %s:%d failed (%s)", step, host, port, error)
        spent = self.counts.blocking_s + time.thread_time() - cpu_started + holders_cpu_s
        self.copy_s = _smoothed(self.copy_s, spent)
        if whole:
            self.counts.sent += 1
            self.counts.newest = step
        else:
            self.counts.failed += 1

    def wait(self) -> None:
        """The copy under way, sent (or failed)."""
        if self.sender is not None:
            self.sender.join()

    def close(self) -> None:
        self.wait()
        for holder in self.holders:
            holder.close()


def _smoothed(mean: float, sample: float, weight: float = 0.2) -> float:
    """An exponentially weighted mean (the first sample as it is)."""
    return sample if mean <= 0 else (1 - weight) * mean + weight * sample
