"""Plain checkpoints (trainer.strategy=ddp): the whole training state in one .pt, written by rank 0.

`save` is called by every rank at the same step: each rank's RNG states are gathered, rank 0
copies the state into reusable buffers (the only part training waits for) and a background
thread writes it. `load` has rank 0 pick the newest valid checkpoint and every rank read it.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hpctrain import faults
from hpctrain.checkpoint import forced, rng, store
from hpctrain.checkpoint.base import Checkpointer, CheckpointMismatch, StopCheck
from hpctrain.checkpoint.deadline import after_save_s, usable_s
from hpctrain.checkpoint.format import FORMAT_VERSION, UnreadableFormat, check_readable
from hpctrain.checkpoint.snapshot import Snapshotter, state_bytes
from hpctrain.checkpoint.store import NoUsableCheckpoint
from hpctrain.checkpoint.writer import BackgroundWriter
from hpctrain.config import differences
from hpctrain.dist.context import DistContext
from hpctrain.run.causes import CheckpointReason, StopReason
from hpctrain.run.events import Checkpoint, ForcedSave

log = logging.getLogger(__name__)


class PlainCheckpointer(Checkpointer):
    def __init__(
        self,
        folder: Path,
        ctx: DistContext,
        keep: int,
        fingerprint: str,
        on_written: Callable[[Checkpoint], None],
        identity: dict[str, Any] | None = None,
        on_forced: Callable[[ForcedSave], None] | None = None,
        model: nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
    ) -> None:
        """`fingerprint` (and `identity`, what it hashes by config key) go into every
        checkpoint's .json, so a mismatch is found, and explained, without loading the data.
        Rank 0 hands `on_written` each written checkpoint's record (from the writer thread) and
        `on_forced` each forced save's (see forced.record). `model` and `optimizer`, when given,
        are saved as the state's "model" and "optimizer" and loaded back in place (a tool that
        saves a state of its own gives neither)."""
        self.folder = folder
        self.ctx = ctx
        self.fingerprint = fingerprint
        self.model = model
        self.optimizer = optimizer
        self.snapshotter = Snapshotter()
        self.on_forced = on_forced or (lambda record: None)
        meta = {
            "fingerprint": fingerprint,
            "format_version": FORMAT_VERSION,
            **({"identity": identity} if identity is not None else {}),
        }
        self.writer = BackgroundWriter(folder, keep, on_written, meta=meta)

    # ---- save ------------------------------------------------------------------------------

    def save(
        self,
        step: int,
        state: dict[str, Any],
        reason: CheckpointReason,
        background: bool,
        stop_requested: StopCheck | None = None,
    ) -> float:
        """Collective. Returns the seconds training was blocked (rank 0's view). A background
        save is skipped when `stop_requested()` is (or turns) true before its copy: the stop's
        forced save, at the next step boundary, then decides within its deadline."""
        started = time.perf_counter()
        rngs = rng.gathered(self.ctx)
        if self.ctx.is_main:
            # Once a stop is requested, neither the wait nor the copy: the forced save comes next.
            if (
                background
                and stop_requested is not None
                and (stop_requested() or not self.writer.wait_unless(stop_requested))
            ):
                log.warning(
                    "%s save at step %d skipped: a stop was requested while waiting for the write of step %s",
                    reason,
                    step,
                    self.writer.inflight_step,
                )
                return time.perf_counter() - started
            self.writer.wait()  # never two writes at once, and the buffers are free again
            snapshot = self.snapshotter.take(self._whole(state))
            snapshot.update(self._parts(rngs))
            blocking_s = time.perf_counter() - started
            info = {"reason": reason, "blocking_s": round(blocking_s, 4)}
            self.writer.start(
                step,
                snapshot,
                info,
                background=background,
                nbytes=state_bytes(snapshot),
                in_flight=_periodic_in_flight if reason is CheckpointReason.PERIODIC else None,
            )
        if not background and self.ctx.distributed:
            dist.barrier()  # a forced save is on disk before any rank goes on (or exits)
        return time.perf_counter() - started

    def forced_save(self, step: int, state: dict[str, Any], reason: StopReason, deadline_s: float | None) -> None:
        """Collective. A save forced by a stop signal that gives `deadline_s` seconds (None: no
        limit): waits for, abandons or keeps the write under way, writes the stop step or not,
        as hpctrain.checkpoint.deadline decides; rank 0 reports what it did to `on_forced`."""
        started = time.perf_counter()
        rngs = rng.gathered(self.ctx)
        if self.ctx.is_main:
            whole = self._whole(state)
            chosen, estimates = forced.plan(self.writer, step, whole, deadline_s)
            log.info("forced save at step %d (%s): %s, %s", step, reason, chosen.choice, chosen.why)
            info = {"reason": reason.checkpoint_reason, "deadline_s": estimates["deadline_s"]}
            tree = {**whole, **self._parts(rngs)}
            cutoff = None if deadline_s is None else started + usable_s(deadline_s, after_save_s(os.environ))
            choice = forced.carry_out(self.writer, self.snapshotter, chosen, step, tree, info, cutoff)
            self.on_forced(forced.record(self.writer, chosen, choice, step, reason, estimates, started))
        if self.ctx.distributed:
            dist.barrier()  # every rank exits after rank 0's save, never during it

    def _whole(self, state: dict[str, Any]) -> dict[str, Any]:
        """The state with the model's and the optimizer's first, as every checkpoint has them."""
        held = {}
        if self.model is not None:
            held["model"] = self.model.state_dict()
        if self.optimizer is not None:
            held["optimizer"] = self.optimizer.state_dict()
        return {**held, **state}

    def _parts(self, rngs: list[dict[str, Any]]) -> dict[str, Any]:
        """The parts of a checkpoint besides the trainer's state (see checkpoint.format)."""
        return {
            "rng": rngs,
            "world_size": self.ctx.world_size,
            "fingerprint": self.fingerprint,
            "format_version": FORMAT_VERSION,
        }

    def wait(self) -> None:
        if self.ctx.is_main:
            self.writer.wait()

    def writing(self) -> bool:
        return self.writer.busy()  # rank 0 alone writes

    # ---- load ------------------------------------------------------------------------------

    def load(self) -> dict[str, Any] | None:
        """Collective. The newest valid checkpoint's state with this rank's RNG under "rng",
        or None for a fresh run; its weights and optimizer state loaded into the model and the
        optimizer given. Raises NoUsableCheckpoint / UnreadableFormat / CheckpointMismatch on
        every rank alike; also when the saved weights have other names or shapes than the
        model's (its code changed under the same config)."""
        chosen: list[Any] = [None]  # rank 0's answer: the step, None for a fresh run, or a refusal
        state: dict[str, Any] | None = None  # rank 0's, read while it decides
        if self.ctx.is_main:
            try:
                found = store.load_newest(self.folder, check=check_readable)
            except (NoUsableCheckpoint, UnreadableFormat) as refusal:
                chosen = [refusal]
            else:
                chosen = [found[0].step if found else None]
                state = found[1] if found else None
        if self.ctx.distributed:
            dist.broadcast_object_list(chosen, src=0)
        step = chosen[0]
        if isinstance(step, Exception):
            raise step
        if step is None:
            return None
        if state is None:  # the other ranks read the checkpoint rank 0 chose
            state = torch.load(store.paths_for(self.folder, step).data, map_location="cpu", weights_only=True)
        state = self._checked(state, step)
        if self.model is not None:
            self._check_weights(state["model"], self.model.state_dict(), step)
            self.model.load_state_dict(state["model"])
        if self.optimizer is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        return state

    def _what_to_do(self) -> str:
        return (
            f"train this config in a new run dir (hydra.run.dir=...), resume the old run with its own config, "
            f"or move {self.folder} away to start over"
        )

    def _checked(self, state: dict[str, Any], step: int) -> dict[str, Any]:
        if state.get("fingerprint") != self.fingerprint:
            try:
                saved = json.loads(store.paths_for(self.folder, step).meta.read_text()).get("identity")
            except (OSError, ValueError):
                saved = None
            mine = self.writer.meta.get("identity")
            changed = differences(saved, mine) if saved and mine else ""
            raise CheckpointMismatch(
                f"{self.folder}: the checkpoint at step {step} was written by a run with a different model, data "
                f"or optimizer{f' ({changed})' if changed else ''}; refusing to resume it: {self._what_to_do()}"
            )
        # Another world size is refused by the trainer (the data position is its concern).
        rngs = state["rng"]
        state["rng"] = rngs[self.ctx.rank] if self.ctx.rank < len(rngs) else None
        return state

    def _check_weights(self, saved: Mapping[str, Any], expected: Mapping[str, torch.Tensor], step: int) -> None:
        missing = [k for k in expected if k not in saved]
        extra = [k for k in saved if k not in expected]
        resized = [
            f"{k} {list(saved[k].shape)} -> {list(v.shape)}"
            for k, v in expected.items()
            if k in saved and isinstance(saved[k], torch.Tensor) and saved[k].shape != v.shape
        ]
        named = (("not in the checkpoint", missing), ("not in this model", extra), ("other shapes", resized))
        problems = [f"{label}: {', '.join(keys[:4])}{' ...' if len(keys) > 4 else ''}" for label, keys in named if keys]
        if problems:
            raise CheckpointMismatch(
                f"{self.folder}: the weights of the checkpoint at step {step} do not fit this model "
                f"({'; '.join(problems)}); was the model's code changed? Refusing to resume it: {self._what_to_do()}"
            )


def _periodic_in_flight() -> None:
    faults.point("checkpoint.periodic_in_flight")
