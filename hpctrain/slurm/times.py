"""Slurm's ways of writing a length of time, read once for everyone (no torch, no Slurm call)."""

from __future__ import annotations

import re

_LIMIT = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def time_limit_s(text: str) -> float | None:
    """sbatch --time (slurm.time) in seconds, as sbatch(1) reads it: `minutes`, `minutes:seconds`,
    `hours:minutes:seconds`, `days-hours`, `days-hours:minutes`, `days-hours:minutes:seconds`;
    inf for UNLIMITED or INFINITE; None for anything else."""
    word = text.strip()
    if word.upper() in ("UNLIMITED", "INFINITE"):
        return float("inf")
    match = _LIMIT.match(word)
    if not match:
        return None
    days, first, second, third = match.groups()
    if days is not None:  # days-hours[:minutes[:seconds]]
        hours, minutes, seconds = int(first), int(second or 0), int(third or 0)
        return float(((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds)
    if third is not None:  # hours:minutes:seconds
        return float((int(first) * 60 + int(second)) * 60 + int(third))
    return float(int(first) * 60 + int(second or 0))  # minutes[:seconds]
