"""Sharded checkpoints (trainer.strategy=fsdp): every rank writes its own shards through
torch.distributed.checkpoint (DCP), and no rank ever holds the whole model.

    step_00000120.dcp/    DCP's files: __<rank>_0.distcp (each rank's shards), .metadata (written
                          last, by rank 0), and shard<rank>.sums (each rank's sizes and sha256)
    step_00000120.json    written last, by rank 0, once every rank's files are complete: step,
                          reason, format_version, fingerprint, identity, and every file's size and
                          sha256. The checkpoint counts only with it, so a torn save is never loaded.

What a .pt checkpoint promises holds here too: atomic (the .json), integrity-checked (every file
against its sha256, the work shared by the ranks on load), background saves whose blocking part
is DCP's copy to host memory (their collectives run on a gloo group of their own, so training's
collectives go on beside them), forced saves under the signal's deadline, `keep` rotation and a
format version. A DCP write cannot be cancelled half-way: a forced save waits for the write under
way, then writes the stop step if the time left allows. A checkpoint written by W ranks loads on
any number of ranks (DCP reshards model and optimizer state), or into a plain model
(`hpctrain-export`).
"""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hpctrain import faults
from hpctrain.checkpoint import rng, sharded_load
from hpctrain.checkpoint.base import Checkpointer, StopCheck
from hpctrain.checkpoint.deadline import after_save_s, plan_forced_save
from hpctrain.checkpoint.format import FORMAT_VERSION
from hpctrain.checkpoint.shard_files import shards_dir, write_json
from hpctrain.checkpoint.store import fsync_dir, sha256_of
from hpctrain.dist import buffers
from hpctrain.dist.context import DistContext
from hpctrain.run import fencing
from hpctrain.run.causes import CheckpointReason, StopReason
from hpctrain.run.events import Checkpoint, ForcedSave
from hpctrain.run.paths import checkpoint_files, checkpoints_in

log = logging.getLogger(__name__)

SUMS_WAIT_S = 600.0  # rank 0 waits this long for every rank's sums of a completed write


class ShardedCheckpointer(Checkpointer):
    def __init__(
        self,
        folder: Path,
        ctx: DistContext,
        keep: int,
        fingerprint: str,
        on_written: Callable[[Checkpoint], None],
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        identity: dict[str, Any] | None = None,
        on_forced: Callable[[ForcedSave], None] | None = None,
    ) -> None:
        self.folder = folder
        self.ctx = ctx
        self.keep = keep
        self.fingerprint = fingerprint
        self.on_written = on_written
        self.on_forced = on_forced or (lambda record: None)
        self.model = model
        self.optimizer = optimizer
        self.identity = identity
        self.meta = {
            "fingerprint": fingerprint,
            "format_version": FORMAT_VERSION,
            "sharded": True,
            **({"identity": identity} if identity is not None else {}),
        }
        # DCP's collectives of a background write, apart from the training's: two threads never
        # share one group (gloo would mix their messages up).
        self.group = dist.new_group(backend="gloo") if ctx.distributed else None
        self._pending: threading.Thread | None = None
        self._pending_step: int | None = None
        self._error: BaseException | None = None
        self.last_write_s: float | None = None  # the last complete write's time (a forced save's estimate)

    # ---- save ------------------------------------------------------------------------------

    def save(
        self,
        step: int,
        state: dict[str, Any],
        reason: CheckpointReason,
        background: bool,
        stop_requested: StopCheck | None = None,
    ) -> float:
        """Collective. Returns the seconds training was blocked. Every rank writes alike (a
        sharded save cannot be skipped by one rank alone: `stop_requested` is not consulted; the
        forced save after it waits for this write)."""
        started = time.perf_counter()
        rngs = rng.gathered(self.ctx)
        self.wait()  # never two writes at once
        tree = self._tree(state, rngs)
        target = self._fresh_target(step)
        info = {"reason": reason}
        if background and self.ctx.distributed:  # one process has no training to go on beside
            import torch.distributed.checkpoint as dcp

            # The blocking part: DCP stages (copies) the shards to host memory, then writes them in
            # its own thread while training goes on.
            future = dcp.async_save(tree, storage_writer=self._writer(target), process_group=self.group)
            blocking_s = time.perf_counter() - started
            self._finish_in_background(step, future, {**info, "blocking_s": round(blocking_s, 4)}, started)
            return blocking_s
        self._write_now(step, tree, info, started)
        return time.perf_counter() - started

    def _fresh_target(self, step: int) -> Path:
        """Collective. The step's folder, empty: a torn or corrupt write of the same step (a life
        that redoes steps) must leave no file, and no sums, that could pass for this write's."""
        target = shards_dir(self.folder, step)
        fencing.check(self.folder.parent)  # a replaced life clears no folder (hpctrain.run.generations)
        if self.ctx.is_main:
            checkpoint_files(self.folder, step).meta.unlink(missing_ok=True)
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir(parents=True)
        if self.ctx.distributed:
            dist.barrier()
        return target

    def _writer(self, target: Path) -> Any:
        from torch.distributed.checkpoint import FileSystemWriter

        return FileSystemWriter(str(target), sync_files=True, overwrite=True)

    def _write_now(self, step: int, tree: dict[str, Any], info: dict[str, Any], started: float) -> None:
        import torch.distributed.checkpoint as dcp

        target = self._fresh_target(step)
        blocking_s = time.perf_counter() - started
        dcp.save(tree, storage_writer=self._writer(target), process_group=self.group, no_dist=not self.ctx.distributed)
        self._publish(step, {**info, "blocking_s": round(blocking_s, 4)}, started)

    def _finish_in_background(self, step: int, future: Any, info: dict[str, Any], started: float) -> None:
        def finish() -> None:
            try:
                future.result()
                self._publish(step, info, started)
            except BaseException as error:  # reported to the trainer at the next wait()
                log.error("checkpoint at step %d failed: %s; the previous checkpoints are intact", step, error)
                self._error = error

        self._pending_step = step
        self._pending = threading.Thread(target=finish, name=f"checkpoint-{step}", daemon=False)
        self._pending.start()

    def _publish(self, step: int, info: dict[str, Any], started: float) -> None:
        """Every rank: the sums of its own files. Rank 0: once every rank's sums are there, the
        .json (the checkpoint counts from here), then the rotation and the record."""
        target = shards_dir(self.folder, step)
        rank = self.ctx.rank
        mine = sorted(target.glob(f"__{rank}_*.distcp"))
        if rank == 0:
            mine.append(target / ".metadata")
        write_json(target / f"shard{rank}.sums", {p.name: [p.stat().st_size, sha256_of(p)] for p in mine})
        if not self.ctx.is_main:
            return
        files: dict[str, list[Any]] = {}
        waited_until = time.monotonic() + SUMS_WAIT_S
        for other in range(self.ctx.world_size):
            sums = target / f"shard{other}.sums"
            while not sums.exists():
                if time.monotonic() > waited_until:
                    raise TimeoutError(f"{sums}: rank {other} did not finish its part of the checkpoint")
                time.sleep(0.02)
            files.update(json.loads(sums.read_text()))
        faults.point("checkpoint.between_renames")
        write_s = time.perf_counter() - started
        meta = {"step": step, "files": files, "world_size": self.ctx.world_size, **info, **self.meta}
        write_json(checkpoint_files(self.folder, step).meta, meta)
        fsync_dir(self.folder)
        self.last_write_s = write_s
        self._prune()
        self.on_written(Checkpoint(**info, step=step, write_s=round(write_s, 4)))

    def writing(self) -> bool:
        return self._pending is not None and self._pending.is_alive()

    def wait(self) -> None:
        """The write under way, finished and published (every rank); its error raised."""
        if self._pending is not None:
            self._pending.join()
            self._pending, self._pending_step = None, None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _prune(self) -> None:
        fencing.check(self.folder.parent)
        published = checkpoints_in(self.folder)
        for entry in published[self.keep :]:
            entry.meta.unlink(missing_ok=True)  # the marker first: a half-deleted one never counts
            shutil.rmtree(shards_dir(self.folder, entry.step), ignore_errors=True)
        kept = {entry.step for entry in published[: self.keep]}
        oldest_kept = min(kept) if kept else None
        for folder in self.folder.glob("step_*.dcp"):
            step = int(folder.stem.removeprefix("step_"))
            if step not in kept and oldest_kept is not None and step < oldest_kept:
                shutil.rmtree(folder, ignore_errors=True)  # torn: never published

    # ---- forced save -----------------------------------------------------------------------

    def forced_save(self, step: int, state: dict[str, Any], reason: StopReason, deadline_s: float | None) -> None:
        """Collective. The write under way is waited for (a DCP write cannot be cancelled half-way);
        then rank 0 plans the stop step's write against what is left of the deadline
        (hpctrain.checkpoint.deadline) and every rank follows the plan."""
        started = time.perf_counter()
        rngs = rng.gathered(self.ctx)
        inflight_step = self._pending_step
        self.wait()
        left_s = None if deadline_s is None else max(0.0, deadline_s - (time.perf_counter() - started))
        decision: list[Any] = [None]
        newest = checkpoints_in(self.folder)
        if self.ctx.is_main:
            newest_step = newest[0].step if newest else None
            after_s = after_save_s(os.environ)
            chosen = plan_forced_save(step, left_s, self.last_write_s, None, None, newest_step, after_s)
            decision = [(chosen.choice, chosen.why)]
        if self.ctx.distributed:
            dist.broadcast_object_list(decision, src=0)
        choice, why = decision[0]
        if choice == "written":
            info = {"reason": reason.checkpoint_reason, "deadline_s": deadline_s, "forced_save": choice}
            self._write_now(step, self._tree(state, rngs), info, time.perf_counter())
        if inflight_step is not None and choice != "written":
            choice = "inflight_only"
        if self.ctx.is_main:
            complete = checkpoints_in(self.folder)
            resume_step = complete[0].step if complete else 0
            self.on_forced(
                ForcedSave(
                    step=step,
                    reason=reason,
                    forced_save=choice,
                    why=why if inflight_step is None else f"waited for the write of step {inflight_step}; {why}",
                    deadline_s=None if deadline_s is None else round(deadline_s, 2),
                    estimated_write_s=None if self.last_write_s is None else round(self.last_write_s, 2),
                    inflight_step=inflight_step,
                    resume_step=resume_step,
                    redo_steps=step - resume_step,
                    took_s=round(time.perf_counter() - started, 3),
                )
            )
        if self.ctx.distributed:
            dist.barrier()  # every rank exits after rank 0 published, never during it

    # ---- the state -------------------------------------------------------------------------

    def _tree(self, state: dict[str, Any], rngs: list[dict[str, Any]]) -> dict[str, Any]:
        """What DCP writes: model and optimizer sharded (FQN keys), the rest one small blob."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        buffers.sync_from_rank0(self.model)  # buffers are not sharded: every rank saves rank 0's
        model_state, optimizer_state = get_state_dict(self.model, self.optimizer)
        extras = {
            **state,
            "rng": rngs,
            "world_size": self.ctx.world_size,
            "fingerprint": self.fingerprint,
            "format_version": FORMAT_VERSION,
        }
        blob = io.BytesIO()
        torch.save(extras, blob)
        blob.seek(0)
        return {"model": model_state, "optimizer": optimizer_state, "extras": blob}

    # ---- load ------------------------------------------------------------------------------

    def load(self) -> dict[str, Any] | None:
        """Collective. Loads the newest complete, intact checkpoint into the model and the
        optimizer (resharded to this world size) and returns the rest of its state, this rank's
        RNG under "rng" (None for a rank the writer did not have); None for a fresh run."""
        return sharded_load.load_newest(
            self.folder, self.ctx, self.fingerprint, self.identity, self.model, self.optimizer
        )
