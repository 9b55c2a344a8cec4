"""metrics.jsonl across lives of a run: what a resumed run drops before it goes on.

A life that dies between checkpoints (a killed job, a node failure, a hang) has logged steps
after the checkpoint the next life resumes from; the next life trains and logs them again.
Their old lines are cut off first, so a reader sees each step once, from the life that led to
the final weights. Truncation in place keeps the file (a `tail -f` reader follows on).

Every line carries `time` (UNIX seconds, when the step's record was written), so the run's
goodput (hpctrain/status/goodput.py) can tell when each life trained what.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from hpctrain.run.jsonlines import JsonLines


class MetricsLines(JsonLines):
    """metrics.jsonl: each record stamped with `time`, as events.jsonl's are."""

    def write(self, record: dict[str, Any]) -> None:
        super().write({**record, "time": round(time.time(), 3)})


def drop_steps_after(path: Path, step: int) -> int:
    """Cut metrics.jsonl before its first line logged for a step after `step` (and a torn last
    line, whose step is unknown but can only be later). Returns the lines dropped."""
    if not path.exists():
        return 0
    data = path.read_bytes()
    cut = _first_stale_offset(data, step)
    if cut is None:
        return 0
    dropped = data.count(b"\n", cut) + (0 if data.endswith(b"\n") else 1)
    os.truncate(path, cut)
    return dropped


def _first_stale_offset(data: bytes, step: int) -> int | None:
    offset = 0
    for line in data.splitlines(keepends=True):
        if not line.endswith(b"\n"):
            return offset  # torn by a killed writer: the last thing that life wrote
        try:
            record = json.loads(line)
        except ValueError:
            record = None  # a torn fragment an earlier life closed with a newline: harmless
        if isinstance(record, dict) and isinstance(record.get("step"), int) and record["step"] > step:
            return offset
        offset += len(line)
    return None
