"""One live command per run dir: the lock that keeps two runs from sharing one.

Two `hpctrain-train` runs of one run dir started together trained side by side: every step
twice in metrics.jsonl, each overwriting the other's checkpoints. The command that writes a run
dir (hpctrain-train, hpctrain-submit) takes an exclusive flock on the run dir itself before it
writes anything, says who it is in the run dir's `.run.lock` once it goes on, and holds the lock
until it exits (the kernel lets go of it then, however it ends: no stale lock after a crash or a
SIGKILL). A second command finds it taken and is refused, told who holds it; a refused command
changes nothing in the run dir. A job's own lives are kept apart by Slurm's record instead
(hpctrain.cli.common refuses a run dir whose job is still queued or running).

A sweep's submission (`hpctrain-submit -m`) holds one lock, its sweep dir's (`hold_sweep`), not
one per point: a descriptor held per point ended every sweep of more than about 1,000 points where
the open-file limit is 1024 (the usual login-node default). Each point is checked free as it is
written (`hold` finds its folder's sweep held by this process). A command that takes a run dir's
lock then checks that no live command holds the folder above it (a sweep being submitted there):
whichever of the two comes second sees the other.

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

# Held for the life of this process, one per run dir (a local sweep writes several) or sweep dir.
_held: dict[str, int] = {}
# The sweep dirs among them: their points are covered by the sweep's lock (hold_sweep).
_sweeps: set[str] = set()
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
    parent = os.path.dirname(key)
    if parent in _sweeps:  # a point of the sweep this process submits: checked, not kept
        fd = _lock(run, fcntl.LOCK_EX)
        if fd is not None:
            os.close(fd)
        return
    fd = _lock(run, fcntl.LOCK_EX)
    if fd is None:
        return
    if parent not in _held and parent != key:
        try:  # a sweep being submitted into the folder above (its EX lock refuses this SH one)
            above = _lock(RunDir(Path(parent)), fcntl.LOCK_SH)
        except RunDirInUse as sweep:
            os.close(fd)
            raise RunDirInUse(f"{sweep}, submitting the sweep in {parent}") from None
        except OSError:  # a folder above that cannot be opened (no read permission): nothing to see
            above = None
        if above is not None:
            os.close(above)
    _held[key] = fd


def hold_sweep(folder: Path) -> None:
    """Take a sweep dir's lock for as long as this process lives, and say who holds it: its
    points are then checked free one by one instead of each holding a lock of its own.
    Raises RunDirInUse when another command holds the sweep dir."""
    sweep = RunDir(folder)
    hold(sweep)
    key = str(folder.resolve())
    if key in _held:
        _sweeps.add(key)
        announce(sweep)


def _lock(run: RunDir, kind: int) -> int | None:
    """An open descriptor of RUN's folder holding an flock of `kind` (None: the filesystem has
    no locks). Raises RunDirInUse, saying who, when another holds it."""
    fd = os.open(run.root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
    except OSError as error:
        os.close(fd)
        if error.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            try:
                holder = run.lock.read_text(errors="replace").strip()
            except OSError:
                holder = ""
            raise RunDirInUse(holder or "another process") from None
        if error.errno in _NO_LOCKS:
            return None
        raise
    return fd


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
