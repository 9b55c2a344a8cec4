"""The last collectives a rank entered, for its hang report: torch's Flight Recorder, which records
every collective of every process group (gloo and NCCL alike in current torch, NCCL's alone in
older releases: sequence number, op, sizes, state) in a ring of trainer.collective_records entries.

`enable` sets the ring's size in the environment before the process group forms (torch reads
TORCH_FR_BUFFER_SIZE then, TORCH_NCCL_TRACE_BUFFER_SIZE in older releases); a user's own value
stands. `last_collectives` reads it back: the newest sequence number this rank entered, and one
line per entry, newest last. A rank whose newest number is below its peers' is the one the
others wait for (hpctrain.run.hang_reports.behind).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass

from hpctrain.run.hang_reports import NEWEST_WORDS

SIZE_ENVS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
# The entries a report shows (the ring may hold more).
SHOWN = 8


def enable(size: int, environ: MutableMapping[str, str] | None = None, current: bool | None = None) -> None:
    """Record the last `size` collectives (0: none), unless the user set the ring's size. The
    variable the running torch reads (`current`: it has the Flight Recorder of every backend,
    TORCH_FR_BUFFER_SIZE; older ones read, and record NCCL's only, TORCH_NCCL_TRACE_BUFFER_SIZE,
    which newer ones still read with a deprecation warning)."""
    env = os.environ if environ is None else environ
    if size <= 0 or any(env.get(name) for name in SIZE_ENVS):
        return
    if current is None:
        current = _dump_json() is not None
    env[SIZE_ENVS[0] if current else SIZE_ENVS[1]] = str(size)


def _dump_json() -> Callable[[bool, bool], bytes] | None:
    try:
        from torch._C import _distributed_c10d as c10d
    except ImportError:
        return None
    return getattr(c10d, "_dump_fr_trace_json", None)


@dataclass(frozen=True)
class Collectives:
    newest_seq: int | None  # the newest collective sequence number entered; None: no record
    lines: list[str]  # one per entry, newest last (or why there is no record)


def parse(raw: bytes | str, shown: int = SHOWN) -> Collectives:
    """The Flight Recorder's JSON dump (torch's _dump_fr_trace_json) as report lines."""
    entries = [e for e in json.loads(raw).get("entries", []) if not e.get("is_p2p")]
    if not entries:
        return Collectives(None, ["no collective recorded yet"])
    entries.sort(key=lambda e: int(e.get("collective_seq_id", 0)))
    lines = [
        f"seq {e.get('collective_seq_id')} {e.get('profiling_name', '?')} group {_group(e)} "
        f"sizes {e.get('input_sizes')} {e.get('state', '?')}"
        for e in entries[-shown:]
    ]
    return Collectives(int(entries[-1].get("collective_seq_id", 0)), lines)


def last_collectives() -> Collectives:
    """This process's recorded collectives; a line saying why where torch keeps none."""
    dump = _dump_json()
    if dump is None:
        return Collectives(None, ["no Flight Recorder of every backend in this torch release (a newer one has it)"])
    try:
        return parse(dump(True, False))
    except RuntimeError as error:
        return Collectives(None, [f"the Flight Recorder gave nothing: {error}"])
    except (ValueError, TypeError) as error:
        return Collectives(None, [f"the Flight Recorder's dump could not be read: {error}"])


def report_lines(collectives: Collectives) -> list[str]:
    """The section a hang report holds: the entries, then the newest number on a line of its own
    (NEWEST_WORDS, read back by hpctrain.run.hang_reports.behind)."""
    newest = [] if collectives.newest_seq is None else [f"{NEWEST_WORDS} {collectives.newest_seq}"]
    return ["last collectives (torch's Flight Recorder), newest last:", *collectives.lines, *newest, ""]


def _group(entry: dict) -> str:
    group = entry.get("process_group")
    return str(group[1]) if isinstance(group, list) and len(group) > 1 else str(entry.get("pg_id", "?"))
