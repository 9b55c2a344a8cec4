"""Logging set up once per process: every line says which rank wrote it; ranks > 0 stay quiet.

A progress bar drawn on the same terminal (hpctrain.trainer.progress_bar) is attached here, so
each log line first erases it and draws it again after itself: a line never starts in the middle
of the bar, and a Slurm .out file (no bar there) holds only whole, rank-prefixed lines.
"""

from __future__ import annotations

import logging
import sys
from typing import Protocol


class Overlay(Protocol):
    def clear(self) -> None: ...

    def redraw(self) -> None: ...


class RankLineHandler(logging.StreamHandler):  # type: ignore[type-arg]
    def __init__(self) -> None:
        super().__init__(sys.stdout)
        self.overlay: Overlay | None = None

    def emit(self, record: logging.LogRecord) -> None:
        overlay = self.overlay
        if overlay is None:
            super().emit(record)
            return
        overlay.clear()
        try:
            super().emit(record)
        finally:
            overlay.redraw()


def setup(rank: int, verbose_all_ranks: bool = False) -> None:
    level = logging.INFO if rank == 0 or verbose_all_ranks else logging.WARNING
    handler = RankLineHandler()
    handler.setFormatter(
        logging.Formatter(f"[rank{rank}] %(asctime)s %(levelname)s %(name)s: %(message)s", "%Y-%m-%d %H:%M:%S")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def attach_overlay(overlay: Overlay | None) -> None:
    """Keep log lines clear of `overlay` (a progress bar); None detaches it."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, RankLineHandler):
            handler.overlay = overlay
