"""A process that tries to take a run dir's next generation at a given moment (no torch: the
racers of tests/test_generations.py start in a fraction of a second)."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

from hpctrain.run import generations


def race(run_root: str, after: int, by: str, go: float, results: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    while time.time() < go:
        pass
    try:
        won = generations.take(Path(run_root), after, generations.submission(by, by))
        results.put((by, won.number))
    except generations.Superseded as lost:
        results.put((by, str(lost)))
