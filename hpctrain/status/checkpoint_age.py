"""The newest checkpoint in a run's checkpoints/ folder: how long ago it was written."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hpctrain.run.paths import checkpoints_in


@dataclass(frozen=True)
class NewestCheckpoint:
    step: int
    written_at: float  # UNIX seconds


def newest_checkpoint(folder: Path) -> NewestCheckpoint | None:
    # A checkpoint counts from the moment its .json is written (last), so that file's mtime is
    # its age. Steps only grow within a run: the highest step is the newest checkpoint.
    for files in checkpoints_in(folder):
        try:
            return NewestCheckpoint(files.step, files.meta.stat().st_mtime)
        except OSError:  # removed by the writer's rotation while we looked
            continue
    return None
