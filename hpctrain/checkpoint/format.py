"""The checkpoint's format version: what a file holds, and which versions this code reads.

A checkpoint's state is a dict of named parts:
    model, optimizer, scheduler, scaler   the state_dicts (scheduler / scaler None when unused)
    train                                 step, epoch and batch_in_epoch (the data position)
    rng                                   every rank's RNG states, a list indexed by rank
    world_size, fingerprint               who wrote it
    layout                                how a step's batch was split (hpctrain.trainer.layout),
                                          which the data position counts in (version 3 on)
    format_version                        FORMAT_VERSION below
The .json beside the file repeats format_version, so a too-new checkpoint is refused before its
data is read. Version 1 is the layout written before the field existed (the same parts, no
format_version): it loads as it is. Version 3 added `layout`: an older hpctrain must not read a
position counted in micro-batches it does not know.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hpctrain.errors import UserError

FORMAT_VERSION = 3
OLDEST_READABLE = 1
# The parts every version so far has; a newer version may add parts, never drop these.
PARTS = ("model", "optimizer", "scheduler", "scaler", "train", "rng", "world_size", "fingerprint")


class CheckpointTooNew(UserError):
    """A checkpoint written by a newer hpctrain: loading it could misread the state, and starting
    over would silently drop it."""


def version_of(saved: Mapping[str, Any]) -> int:
    """The format version of a checkpoint's state or .json (1 when the field is absent)."""
    value = saved.get("format_version", OLDEST_READABLE)
    return value if isinstance(value, int) else -1


def check_readable(saved: Mapping[str, Any], where: str) -> None:
    """Raise CheckpointTooNew unless this code reads `saved`'s format version."""
    version = version_of(saved)
    if OLDEST_READABLE <= version <= FORMAT_VERSION:
        return
    raise CheckpointTooNew(
        f"{where}: checkpoint format_version {saved.get('format_version')!r}, but this hpctrain reads versions "
        f"{OLDEST_READABLE} to {FORMAT_VERSION}. Resume it with the hpctrain that wrote it (or a newer one: "
        f"pip install -U hpctrain); to start over instead, move the checkpoints folder away"
    )
