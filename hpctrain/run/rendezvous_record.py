"""One JSON record handed from rank 0 to the other ranks through a file every node sees (the run
dir): rank 0's rendezvous address and port, its go-ahead for `srun hpctrain-train`."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


def publish(path: Path, record: dict[str, Any]) -> None:
    """Write `record` whole: readers see nothing or all of it, never half (a rename is atomic)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(record))
    tmp.replace(path)


def wait_for(path: Path, timeout_s: float) -> dict[str, Any] | None:
    """The record once published, polling ever more slowly (up to 1 s apart); None after
    `timeout_s` seconds without it."""
    deadline = time.monotonic() + timeout_s
    delay = 0.05
    while time.monotonic() < deadline:
        try:
            return json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
    return None
