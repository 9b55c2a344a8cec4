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


def as_slurm_reads_it(text: str) -> str:
    """`slurm.time` spelled out as Slurm reads it, for the submit's echo: `25:00` is 25 minutes
    (minutes:seconds), which a user meaning 25 hours did not expect."""
    seconds = time_limit_s(text)
    if seconds is None:
        return text
    if seconds == float("inf"):
        return "no limit"
    whole = int(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [(days, "day"), (hours, "hour"), (minutes, "minute"), (secs, "second")]
    words = ", ".join(f"{n} {unit}{'s' if n != 1 else ''}" for n, unit in parts if n) or "0 seconds"
    form = ""
    if "-" not in text and text.count(":") == 1:
        form = " (Slurm reads one colon as minutes:seconds; hours are HH:MM:SS)"
    return f"{words}{form}"
