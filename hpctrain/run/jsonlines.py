"""JSON-lines files of a run dir: one object a line, appended and flushed at once.

`events.jsonl` (what happened, typed in hpctrain.run.events) and `metrics.jsonl` (numbers):
whole lines, so `tail -f`, `hpctrain-status` and a requeued job (which appends to the same
files) all see whole lines.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hpctrain.run import fencing

# What flock raises on a filesystem that has no locks.
_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


def _finite(value: Any) -> Any:
    # JSON has no NaN or Infinity; a diverged loss is written as null rather than breaking readers.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


class JsonLines:
    def __init__(self, path: Path, enabled: bool = True) -> None:
        self.path = path
        self.enabled = enabled

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        fencing.check(self.path.parent)  # a replaced life writes no line (hpctrain.run.generations)
        line = json.dumps(_finite(record), allow_nan=False)
        with open(self.path, "a+b") as file:
            # A process killed mid-write leaves a torn last line: start on a fresh line so this
            # record is not glued to the fragment.
            if file.tell() > 0:
                file.seek(-1, 2)
                if file.read(1) != b"\n":
                    line = "\n" + line
            file.write((line + "\n").encode("utf-8"))


def read_jsonl(path: Path, offset: int = 0) -> list[dict[str, Any]]:
    """All whole lines of a JSON-lines file from byte `offset` on; a torn line (a killed
    writer) is skipped."""
    if not path.exists():
        return []
    records = []
    with open(path, "rb") as file:
        file.seek(offset)
        text = file.read().decode("utf-8", errors="replace")
    for line in text.splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created if missing) while reading and then appending: two
    writers that each check "is it recorded already?" (the batch shell's SIGTERM trap, the control
    step, the guardian and hpctrain-cancel, on different nodes) then never both write. Writers
    that take no lock are not held up. An flock where the filesystem has one; where it has none
    (Lustre mounted `noflock`, some NFS mounts: ENOSYS, ENOLCK), a lock file made by an exclusive
    create, which every POSIX filesystem does atomically (exclusive_file)."""
    with open(path, "a") as file:
        try:
            fcntl.flock(file.fileno(), fcntl.LOCK_EX)
        except OSError as error:
            if error.errno not in _NO_LOCKS:
                raise
            with exclusive_file(path.with_name(path.name + LOCK_SUFFIX)):
                yield
            return
        try:
            yield
        finally:
            fcntl.flock(file.fileno(), fcntl.LOCK_UN)


# The lock file beside a JSON-lines file on a filesystem without flock.
LOCK_SUFFIX = ".lock"
# A lock file older than this is a holder that died while holding it (a write under the lock
# takes milliseconds; a SIGKILL or a lost node leaves the file): it is taken over.
STALE_LOCK_S = 30.0
LOCK_POLL_S = 0.02


@contextlib.contextmanager
def exclusive_file(lock: Path, stale_s: float = STALE_LOCK_S, poll_s: float = LOCK_POLL_S) -> Iterator[None]:
    """Hold `lock` by creating it exclusively (O_CREAT | O_EXCL), removed after; wait while
    another holds it, and take over one older than `stale_s` (its holder died holding it)."""
    while True:
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                age = time.time() - lock.stat().st_mtime
            except FileNotFoundError:
                continue  # let go of just now: try again at once
            if age > stale_s:
                with contextlib.suppress(FileNotFoundError):
                    lock.unlink()
                continue
            time.sleep(poll_s)
            continue
        with os.fdopen(fd, "w") as holder:
            holder.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        break
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            lock.unlink()
