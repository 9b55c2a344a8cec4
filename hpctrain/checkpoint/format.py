"""The checkpoint's format version: what a checkpoint holds, and the one version this code reads.

A checkpoint's state is a dict of named parts:
    model, optimizer, scheduler, scaler   the state_dicts (scheduler / scaler None when unused)
    train                                 step, epoch and batch_in_epoch (the data position)
    rng                                   every rank's RNG states, a list indexed by rank
    world_size, fingerprint               who wrote it
    layout                                how a step's batch was split (hpctrain.trainer.layout),
                                          which the data position counts in
    format_version                        FORMAT_VERSION below
The .json beside the file repeats format_version, so a checkpoint of another version is refused
before its data is read. Every hpctrain release writes version 3; a newer version is refused with
a word on how to resume it, never misread, and never skipped for an older checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hpctrain.errors import UserError

FORMAT_VERSION = 3


class UnreadableFormat(UserError):
    """A checkpoint of a format version this hpctrain does not read: loading it could misread the
    state, and starting over would silently drop it."""


class CheckpointTooNew(UnreadableFormat):
    """A checkpoint written by a newer hpctrain."""


def check_readable(saved: Mapping[str, Any], where: str) -> None:
    """Raise UnreadableFormat (CheckpointTooNew for a newer one) unless `saved`, a checkpoint's
    state or .json, is of FORMAT_VERSION."""
    version = saved.get("format_version")
    if version == FORMAT_VERSION:
        return
    if isinstance(version, int) and version > FORMAT_VERSION:
        raise CheckpointTooNew(
            f"{where}: checkpoint format_version {version!r}, but this hpctrain reads version {FORMAT_VERSION}. "
            "Resume it with the hpctrain that wrote it (or a newer one: pip install -U hpctrain); to start over "
            "instead, move the checkpoints folder away"
        )
    raise UnreadableFormat(
        f"{where}: checkpoint format_version {version!r}, but this hpctrain reads version {FORMAT_VERSION} "
        "(written by every hpctrain release); to start over, move the checkpoints folder away"
    )
