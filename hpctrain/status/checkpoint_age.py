"""The newest checkpoint in a run's checkpoints/ folder: how long ago it was written."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

# hpctrain/checkpoint/store.py writes step_XXXXXXXX.pt, then step_XXXXXXXX.json last: a
# checkpoint counts from the moment its .json exists, so the .json's mtime is its age.
_META = re.compile(r"^step_(\d{8,})\.json$")


@dataclass(frozen=True)
class NewestCheckpoint:
    step: int
    written_at: float  # UNIX seconds


def newest_checkpoint(folder: Path) -> NewestCheckpoint | None:
    newest: NewestCheckpoint | None = None
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                match = _META.match(entry.name)
                if not match:
                    continue
                try:
                    written_at = entry.stat().st_mtime
                except OSError:  # removed by the writer's rotation while we looked
                    continue
                if newest is None or written_at > newest.written_at:
                    newest = NewestCheckpoint(int(match.group(1)), written_at)
    except OSError:  # no checkpoints/ yet
        return None
    return newest
