"""Resuming from sharded checkpoints (hpctrain.checkpoint.sharded writes them): the newest one
whose files every rank found whole, loaded into the model and the optimizer, resharded by DCP
to this world size.

Every rank checks its share of a checkpoint's files (hpctrain.checkpoint.shard_files) and all
learn the first problem found, so all fall back to the same older checkpoint, or none does.
"""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hpctrain.checkpoint.base import CheckpointMismatch
from hpctrain.checkpoint.format import check_readable
from hpctrain.checkpoint.shard_files import file_problem, shards_dir
from hpctrain.checkpoint.store import NoUsableCheckpoint
from hpctrain.checkpoint.transient import transient
from hpctrain.config import differences
from hpctrain.dist.context import DistContext
from hpctrain.errors import UserError
from hpctrain.run.paths import checkpoint_files, checkpoints_in

log = logging.getLogger(__name__)


def load_newest(
    folder: Path,
    ctx: DistContext,
    fingerprint: str,
    identity: dict[str, Any] | None,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
) -> dict[str, Any] | None:
    """Collective. The newest complete, intact checkpoint loaded into `model` and `optimizer`;
    returns the rest of its state, this rank's RNG under "rng"; None for a fresh run. Raises
    CheckpointMismatch for a checkpoint of another config's `fingerprint`, NoUsableCheckpoint
    when checkpoints exist but none is whole."""
    candidates = checkpoints_in(folder)
    problems: list[str] = []
    for entry in candidates:
        problem = _agreed_problem(folder, ctx, entry.step, fingerprint, identity)
        if problem is None:
            return _load(folder, ctx, entry.step, model, optimizer)
        problems.append(f"{entry.meta.name}: {problem}")
        log.warning("checkpoint %s is not usable (%s); trying the one before", entry.meta.name, problem)
    if problems:
        raise NoUsableCheckpoint(
            f"{folder} has checkpoints but none is usable:\n  "
            + "\n  ".join(problems)
            + "\nRefusing to start over; move the folder away to train from scratch."
        )
    # Shards without their .json and nothing published: the first write was cut before it was
    # published (its .json comes last, once every rank's shards are whole). Nothing was ever saved,
    # so the run starts from step 0, as it would have had the cut come a moment sooner.
    for torn in sorted(folder.glob("step_*.dcp")):
        log.warning("%s has no %s.json (its write was cut before it was published): not a checkpoint", torn, torn.stem)
    return None


def _agreed_problem(
    folder: Path, ctx: DistContext, step: int, fingerprint: str, identity: dict[str, Any] | None
) -> str | None:
    """What is wrong with the checkpoint of `step` (None: nothing): every rank checks its
    share of the files, and all learn the first problem found."""
    meta_path = checkpoint_files(folder, step).meta
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError) as error:
        problem: str | None = f"unreadable ({error})"
    else:
        check_readable(meta, str(meta_path))
        _refuse_another_config(folder, meta, step, fingerprint, identity)
        problem = file_problem(meta, shards_dir(folder, step), share=(ctx.rank, ctx.world_size))
    if not ctx.distributed:
        return problem
    everyone: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(everyone, problem)
    return next((p for p in everyone if p is not None), None)


def _refuse_another_config(
    folder: Path, meta: dict[str, Any], step: int, fingerprint: str, identity: dict[str, Any] | None
) -> None:
    if meta.get("fingerprint") == fingerprint:
        return
    changed = differences(meta.get("identity") or {}, identity if isinstance(identity, dict) else {})
    raise CheckpointMismatch(
        f"{folder}: the checkpoint at step {step} was written by a run with a different model, data or "
        f"optimizer{f' ({changed})' if changed else ''}; refusing to resume it: train this config in a new run "
        f"dir (hydra.run.dir=...), or move {folder} away to start over"
    )


def not_the_checkpoint(error: BaseException) -> bool:
    """An error of the job, not of the checkpoint or the model: a collective failing (a peer lost
    or killed while loading: torch.distributed's DistError), or the filesystem failing for a
    moment (store.transient), here or, through DCP's CheckpointException, on any rank."""
    seen: set[int] = set()
    todo: list[BaseException] = [error]
    while todo:
        one = todo.pop()
        if id(one) in seen:
            continue
        seen.add(id(one))
        if isinstance(one, dist.DistError) or transient(one):
            return True
        failures = getattr(one, "failures", None)  # DCP's CheckpointException: rank -> (error, stack)
        if isinstance(failures, dict):
            todo += [f[0] if isinstance(f, tuple) else f for f in failures.values() if f is not None]
        todo += [e for e in (one.__cause__, one.__context__) if e is not None]
    return False


def _load(
    folder: Path, ctx: DistContext, step: int, model: nn.Module, optimizer: torch.optim.Optimizer
) -> dict[str, Any]:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    blob = io.BytesIO()
    tree: dict[str, Any] = {"model": model_state, "optimizer": optimizer_state, "extras": blob}
    try:
        reader = FileSystemReader(str(shards_dir(folder, step)))
        dcp.load(tree, storage_reader=reader, no_dist=not ctx.distributed)
    except Exception as error:
        if not_the_checkpoint(error):
            raise  # a peer lost, a filesystem failing for a moment: a crash, tried again later
        # The files were checked whole before: what is left is the model's code changed
        # (other names or shapes), the user's to fix.
        raise UserError(
            f"{folder}: the checkpoint at step {step} does not fit this model ({str(error).splitlines()[0]}); "
            f"was the model's code changed? Refusing to resume it: train this config in a new run dir "
            f"(hydra.run.dir=...), or move {folder} away to start over"
        ) from error
    set_state_dict(model, optimizer, model_state_dict=tree["model"], optim_state_dict=tree["optimizer"])
    # DCP hands a saved BytesIO back unpickled (its own torch.load); read it here if not.
    extras = tree["extras"]
    if isinstance(extras, io.BytesIO):
        extras.seek(0)
        extras = torch.load(extras, map_location="cpu", weights_only=True)
    check_readable(extras, str(shards_dir(folder, step)))
    rngs = extras["rng"]
    extras["rng"] = rngs[ctx.rank] if ctx.rank < len(rngs) else None
    return extras
