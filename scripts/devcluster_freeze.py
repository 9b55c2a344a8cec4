"""A fake node of the dev cluster dying silently, as hardware dies: every process of the node
frozen at once (SIGSTOP), none exiting.

A node whose power, kernel or NIC goes sends nothing more: no process exits, no socket is reset,
its peers block in their collective, and Slurm learns of it only when slurmd stops answering its
pings for SlurmdTimeout seconds. On the dev cluster every node is a slurmd on this machine; its
processes are that slurmd, the slurmstepd it started for each step on the node (each holds the
node's slurmd log open: that is how they are told apart, as they are reparented to init), and
every process below them (the batch shell, the tasks, what the tasks started). Freezing them all
leaves their sockets open and silent, as a dead node's peers see it.

    python scripts/devcluster.py freeze node2 [--dir D]   # every process of node2 stopped
    python scripts/devcluster.py thaw node2 [--dir D]     # the same processes continued

The frozen pids are kept in the cluster's folder (frozen-NODE.pids), so `thaw` continues exactly
those, and `down` continues every frozen node's processes before it stops the cluster (a stopped
process would hold its SIGTERM until then).

Standard library only; loaded by path from devcluster.py, as devcluster_accounting.py is.
"""

import os
import signal
import time
from pathlib import Path

# Processes forked while the node was being frozen are caught by a second pass; a third finds
# none on any machine seen.
FREEZE_PASSES = 5


def _stat_fields(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name; [] when the process is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text(errors="replace")
    except OSError:
        return []
    return text.rpartition(")")[2].split()


def _command_name(pid: int) -> str:
    try:
        text = Path(f"/proc/{pid}/stat").read_text(errors="replace")
    except OSError:
        return ""
    return text.partition("(")[2].rpartition(")")[0]


def _all_pids() -> list[int]:
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]


def _holds_open(pid: int, path: Path) -> bool:
    folder = Path(f"/proc/{pid}/fd")
    try:
        return any(os.readlink(folder / fd) == str(path) for fd in os.listdir(folder))
    except OSError:
        return False


def node_pids(slurmd_pid_file: Path, slurmd_log: Path) -> list[int]:
    """Every live process of one fake node: its slurmd, its slurmstepds, and all below them;
    the slurmd first, then the step daemons, then their descendants (the order to stop them in,
    so that nothing new is started on the node while it is being frozen)."""
    roots: list[int] = []
    try:
        slurmd = int(slurmd_pid_file.read_text().strip())
    except (OSError, ValueError):
        slurmd = None
    if slurmd is not None and _command_name(slurmd) == "slurmd":
        roots.append(slurmd)
    pids = _all_pids()
    roots += [pid for pid in pids if _command_name(pid) == "slurmstepd" and _holds_open(pid, slurmd_log)]
    children: dict[int, list[int]] = {}
    for pid in pids:
        fields = _stat_fields(pid)
        if len(fields) > 1 and fields[0] not in ("Z", "X"):
            children.setdefault(int(fields[1]), []).append(pid)
    found, queue = list(roots), [pid for root in roots for pid in children.get(root, [])]
    while queue:
        pid = queue.pop(0)
        if pid not in found:
            found.append(pid)
            queue += children.get(pid, [])
    return found


def _stopped(pid: int) -> bool:
    fields = _stat_fields(pid)
    return not fields or fields[0] in ("T", "t", "Z", "X")


def freeze(slurmd_pid_file: Path, slurmd_log: Path, record: Path) -> list[int]:
    """SIGSTOP every process of the node; their pids are appended to `record`. Returns them."""
    frozen: list[int] = []
    for _ in range(FREEZE_PASSES):
        fresh = [pid for pid in node_pids(slurmd_pid_file, slurmd_log) if pid not in frozen]
        if not fresh:
            break
        for pid in fresh:
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                continue
            frozen.append(pid)
        # A stop is delivered asynchronously: wait until each one is stopped before looking for
        # processes they forked meanwhile.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not all(_stopped(pid) for pid in fresh):
            time.sleep(0.01)
    if not frozen:
        raise LookupError(f"no process of this node is running ({slurmd_pid_file} names none)")
    with open(record, "a") as out:
        out.write("".join(f"{pid}\n" for pid in frozen))
    return frozen


def thaw(record: Path) -> list[int]:
    """SIGCONT every process `record` lists (those still alive), then forget them."""
    try:
        pids = [int(line) for line in record.read_text().split()]
    except OSError:
        return []
    continued = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            continue
        continued.append(pid)
    record.unlink(missing_ok=True)
    return continued
