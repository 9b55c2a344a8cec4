"""Save and restore the whole training state, collectively, from the run dir's checkpoints/.

`save` is called by every rank at the same step: each rank's RNG states are gathered, rank 0
copies the state into reusable buffers (the only part training waits for) and a background
thread writes it. `load` has rank 0 pick the newest valid checkpoint and every rank read it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hpctrain.checkpoint import rng, store
from hpctrain.checkpoint.snapshot import Snapshotter
from hpctrain.checkpoint.store import NoUsableCheckpoint
from hpctrain.checkpoint.writer import BackgroundWriter
from hpctrain.dist import DistContext

__all__ = ["Checkpointer", "NoUsableCheckpoint"]

log = logging.getLogger(__name__)


class Checkpointer:
    def __init__(
        self, folder: Path, ctx: DistContext, keep: int, fingerprint: str, on_written: Callable[[dict], None]
    ) -> None:
        self.folder = folder
        self.ctx = ctx
        self.fingerprint = fingerprint
        self.snapshotter = Snapshotter()
        self.writer = BackgroundWriter(folder, keep, on_written)

    # ---- save ------------------------------------------------------------------------------

    def save(self, step: int, state: dict[str, Any], reason: str, background: bool) -> float:
        """Collective. Returns the seconds training was blocked (rank 0's view)."""
        started = time.perf_counter()
        rngs = self._gather(rng.capture())
        if self.ctx.is_main:
            self.writer.wait()  # never two writes at once, and the buffers are free again
            snapshot = self.snapshotter.take(state)
            snapshot.update(rng=rngs, world_size=self.ctx.world_size, fingerprint=self.fingerprint)
            blocking_s = time.perf_counter() - started
            info = {"reason": reason, "blocking_s": round(blocking_s, 4)}
            self.writer.start(step, snapshot, info, background=background)
        if not background and self.ctx.distributed:
            dist.barrier()  # a forced save is on disk before any rank goes on (or exits)
        return time.perf_counter() - started

    def wait(self) -> None:
        if self.ctx.is_main:
            self.writer.wait()

    def _gather(self, mine: dict[str, Any]) -> list[dict[str, Any]]:
        if not self.ctx.distributed:
            return [mine]
        everyone: list[Any] = [None] * self.ctx.world_size
        dist.all_gather_object(everyone, mine)
        return everyone

    # ---- load ------------------------------------------------------------------------------

    def load(self) -> dict[str, Any] | None:
        """Collective. The newest valid checkpoint's state with this rank's RNG under "rng",
        or None for a fresh run. Raises NoUsableCheckpoint / ValueError on every rank alike."""
        decision: list[Any] = [None]
        if self.ctx.is_main:
            try:
                found = store.load_newest(self.folder)
                decision = [("ok", found[0].step) if found else ("fresh", None)]
                state = found[1] if found else None
            except NoUsableCheckpoint as error:
                decision = [("error", str(error))]
        if self.ctx.distributed:
            dist.broadcast_object_list(decision, src=0)
        kind, value = decision[0]
        if kind == "error":
            raise NoUsableCheckpoint(value)
        if kind == "fresh":
            return None
        if not self.ctx.is_main:
            state = torch.load(store.paths_for(self.folder, value).data, map_location="cpu", weights_only=True)
        return self._checked(state, value)

    def _checked(self, state: dict[str, Any], step: int) -> dict[str, Any]:
        if state.get("fingerprint") != self.fingerprint:
            raise ValueError(
                f"{self.folder}: the checkpoint at step {step} was written by a run with a different model, "
                "data or optimizer; start a new run dir (or move checkpoints/ away) instead of resuming it"
            )
        saved_world = state.get("world_size")
        rngs = state["rng"]
        if saved_world != self.ctx.world_size:
            log.warning(
                "resuming a world of %s processes with %d: data order continues, but the run is no longer "
                "bit-identical to an uninterrupted one", saved_world, self.ctx.world_size,
            )
        state["rng"] = rngs[self.ctx.rank] if self.ctx.rank < len(rngs) else None
        return state
