"""How a node's training processes of one job are told apart from everything else of the job there.

A relaunch must not start while the step it replaces still runs on the nodes it takes: a rank
of the old step that Slurm's kill never reached (the kill delayed or lost while slurmctld waits on
a silent node) holds its GPU and its memory, and trains on in a collective that never ends. The
node check (hpctrain.recovery.node_check) runs on each node before a relaunch and ends such
processes; this module says which they are, for it and for the processes that mark themselves.

A training process of job J on node N is a process of this user whose starting environment
(/proc/PID/environ) has SLURM_JOB_ID=J and SLURMD_NODENAME=N, and which is
  - a task of a training step: its command line runs `hpctrain.worker` (started cold) or
    `hpctrain.process.handoff` (a relaunch's task, whose worker a warm standby forked), or
  - a worker a warm standby forked (or one of its own forks, a DataLoader's): its name (comm)
    is `hpctrain-rN` (hpctrain.process.standby names it so; a fork keeps the name, and keeps the
    standby's starting environment, which names the same job and node).
The standby itself, the batch shell and its srun (whose command line names the task's module too),
the heartbeat watcher, the keeper and the control steps are none of these: a node check never
touches them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

# A warm standby's forked worker names itself WORKER_NAME_PREFIX + its rank (`hpctrain-r3`).
WORKER_NAME_PREFIX = "hpctrain-r"
# The modules a training step's task runs (`python -m MODULE RUN_DIR`).
TASK_MODULES = ("hpctrain.worker", "hpctrain.process.handoff")
JOB_ENV, NODE_ENV = "SLURM_JOB_ID", "SLURMD_NODENAME"
LAUNCHER_NAME = "srun"


def worker_name(rank: str | int) -> str:
    """The name (comm, at most 15 characters) a standby's forked worker of `rank` takes."""
    return f"{WORKER_NAME_PREFIX}{rank}"[:15]


def training_processes(
    job_id: str, node: str, proc: Path = Path("/proc"), *, skip: set[int] | None = None
) -> list[int]:
    """The pids of job `job_id`'s training processes on `node` (a process gone meanwhile is left
    out, as is any pid in `skip`)."""
    return sorted(
        pid for pid in _pids(proc) if pid not in (skip or set()) and is_training_process(proc / str(pid), job_id, node)
    )


def is_training_process(folder: Path, job_id: str, node: str) -> bool:
    """The process whose /proc folder this is: a training process of `job_id` on `node`."""
    environ = _read(folder / "environ")
    if environ is None or f"{JOB_ENV}={job_id}".encode() not in environ.split(b"\0"):
        return False
    if f"{NODE_ENV}={node}".encode() not in environ.split(b"\0"):
        return False
    name = (_read(folder / "comm") or b"").decode(errors="replace").strip()
    if name == LAUNCHER_NAME:  # the batch shell's srun: its command line names the task's module
        return False
    if name.startswith(WORKER_NAME_PREFIX) and name[len(WORKER_NAME_PREFIX) :].isdigit():
        return True
    words = (_read(folder / "cmdline") or b"").decode(errors="replace").split("\0")
    return any(module in words for module in TASK_MODULES)


def _pids(proc: Path) -> Iterator[int]:
    try:
        entries = list(proc.iterdir())
    except OSError:
        return
    for entry in entries:
        if entry.name.isdigit():
            yield int(entry.name)


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:  # gone meanwhile, or another user's
        return None
