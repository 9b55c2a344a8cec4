"""The node's available memory as the kernel counts it (MemAvailable of /proc/meminfo): what the
node health check, the memory holders and the in-memory tier's ranks measure their needs against.
Standard library only."""

from __future__ import annotations

from pathlib import Path

MEMINFO = Path("/proc/meminfo")


def memory_available_kb(meminfo: str) -> int | None:
    """MemAvailable of /proc/meminfo, in kB (None where the kernel does not show it)."""
    for line in meminfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "MemAvailable":
            words = value.split()
            return int(words[0]) if words and words[0].isdigit() else None
    return None


def available_bytes(meminfo: Path = MEMINFO) -> int | None:
    """This node's MemAvailable in bytes (None where it cannot be read)."""
    try:
        kb = memory_available_kb(meminfo.read_text())
    except OSError:
        return None
    return None if kb is None else kb * 1024
