"""One live command per run dir: the lock that keeps two runs from sharing one.

Two `hpctrain-train` runs of one run dir started together trained side by side: every step
twice in metrics.jsonl, each overwriting the other's checkpoints. The command that writes a run
dir (hpctrain-train, hpctrain-submit) takes an exclusive flock on the run dir itself before it
writes anything, says who it is in the run dir's `.run.lock` once it goes on, and holds the lock
until it exits (the kernel lets go of it then, however it ends: no stale lock after a crash or a
SIGKILL). A second command finds it taken and is refused, told who holds it; a refused command
changes nothing in the run dir. A job's own lives are kept apart by Slurm's record instead
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
# A filesystem without flock (some NFS mounts): run dirs there go unlocked, as before.
_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EBADF, errno.EINVAL)


class RunDirInUse(Exception):
    """Another live command holds the run dir; str() says who."""


def hold(run: RunDir) -> None:
    """Take RUN's lock for as long as this process lives: an flock on the run dir itself, so a
    refused command changes nothing in it. Raises RunDirInUse when another holds it (saying who,
    from its `.run.lock`); a filesystem without locks is let through. `announce` then says who
    holds it, once the command is sure to go on."""
    key = str(run.root.resolve())
    if key in _held:
        return
    fd = os.open(run.root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        os.close(fd)
        if error.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            try:
                holder = run.lock.read_text(errors="replace").strip()
            except OSError:
                holder = ""
            raise RunDirInUse(holder or "another process") from None
        if error.errno in _NO_LOCKS:
            return
        raise
    _held[key] = fd


def announce(run: RunDir) -> None:
    """Write who holds RUN's lock into its `.run.lock` (for a refused command and status)."""
    if str(run.root.resolve()) in _held:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        run.lock.write_text(f"pid {os.getpid()} on {socket.gethostname()} since {stamp}\n")


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
