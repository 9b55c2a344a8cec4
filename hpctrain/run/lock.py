"""One live command per run dir: the lock that keeps two runs from sharing one.

Two `hpctrain-train` runs of one run dir started together trained side by side: every step
twice in metrics.jsonl, each overwriting the other's checkpoints. The command that writes a run
dir (hpctrain-train, hpctrain-submit) takes an exclusive flock on its `.run.lock` before it
writes anything, and holds it until it exits (the kernel lets go of it then, however it ends:
no stale lock after a crash or a SIGKILL). A second command finds it taken and is refused,
told who holds it. A job's own lives are kept apart by Slurm's record instead
(hpctrain.cli.common refuses a run dir whose job is still queued or running).

flock works across the machines of a cluster on Lustre, GPFS and NFSv4 mounted as usual; where
the filesystem has no locks at all the lock is skipped, as before.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import time
from pathlib import Path

from hpctrain.run.paths import RunDir

# Held for the life of this process, one per run dir (a local sweep writes several).
_held: dict[str, int] = {}


class RunDirInUse(Exception):
    """Another live command holds the run dir; str() says who."""


def hold(run: RunDir) -> None:
    """Take RUN's lock for as long as this process lives. Raises RunDirInUse when another holds
    it; a filesystem without locks is let through."""
    key = str(run.root.resolve())
    if key in _held:
        return
    fd = os.open(run.lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        if error.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            holder = os.read(fd, 512).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise RunDirInUse(holder) from None
        if error.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):  # no locks here
            os.close(fd)
            return
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
    _held[key] = fd


def live_holder(run: RunDir) -> str | None:
    """Who holds RUN's lock, when that is a live hpctrain process on this machine (read-only: the
    lock itself is never touched, so a command starting meanwhile is never refused for it)."""
    try:
        said = run.lock.read_text(errors="replace").strip()
    except OSError:
        return None
    words = said.split()
    if len(words) < 4 or words[0] != "pid" or words[2] != "on" or words[3] != socket.gethostname():
        return None
    try:
        command = Path(f"/proc/{int(words[1])}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return said if b"hpctrain" in command else None


def release_all() -> None:
    """Let go of every lock this process holds (tests; a process lets go when it ends)."""
    for fd in _held.values():
        os.close(fd)
    _held.clear()
