"""Logging set up once per process: every line says which rank wrote it; ranks > 0 stay quiet."""

from __future__ import annotations

import logging
import sys


def setup(rank: int, verbose_all_ranks: bool = False) -> None:
    level = logging.INFO if rank == 0 or verbose_all_ranks else logging.WARNING
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(
        logging.Formatter(f"[rank{rank}] %(asctime)s %(levelname)s %(name)s: %(message)s", "%Y-%m-%d %H:%M:%S")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
