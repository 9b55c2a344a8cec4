"""One dev cluster's daemons (scripts/devcluster.py): found by their config in /proc, started,
stopped, and asked whether they answer and in what state the nodes are.
"""

import contextlib
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

import devcluster_accounting as accounting
from devcluster_config import Paths, Shape, node_names
from devcluster_host import DevClusterError, log, run_cmd, slurm_env, tail

# How long `down` waits for a daemon to exit after SIGTERM before SIGKILL.
STOP_TIMEOUT_S = 15.0

# Processes a cluster consists of (slurmscriptd is a helper forked by slurmctld,
# slurmstepd runs each job step for slurmd).
DAEMON_NAMES = ("slurmctld", "slurmscriptd", "slurmd", "slurmstepd", *accounting.DAEMON_NAMES)

# Node states (as printed by `sinfo -o %T`) that mean "the node works".
HEALTHY_STATES = {"idle", "mixed", "allocated", "completing", "planned"}


# --------------------------------------------------------------------------- processes


def _read_proc(pid: int, name: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/{name}").read_bytes()
    except OSError:
        return b""


def process_name(pid: int) -> str:
    """The process's name, or "" when it is gone or a zombie.

    A killed daemon stays a zombie until its parent (often init) reaps it, which
    some minimal inits do late; a zombie holds no port and runs nothing.
    """
    stat_line = _read_proc(pid, "stat").decode(errors="replace")
    # Format: "pid (comm) state ..."; comm may contain spaces or parentheses.
    name, _, rest = stat_line.partition("(")[2].rpartition(")")
    if not rest or rest.split()[0] in ("Z", "X"):
        return ""
    return name


def _belongs_to(pid: int, paths: Paths) -> bool:
    """True when the process was started for this cluster (its config is ours).

    Daemons get SLURM_CONF in their environment (and `-f conf` on their command
    line); slurmstepd inherits the environment of the slurmd that spawned it.
    """
    conf = str(paths.conf).encode()
    environ = _read_proc(pid, "environ").split(b"\0")
    if b"SLURM_CONF=" + conf in environ:
        return True
    return conf in _read_proc(pid, "cmdline").split(b"\0")


def cluster_pids(paths: Paths) -> dict[int, str]:
    """Every daemon process of this cluster: pid -> process name."""
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        name = process_name(pid)
        if name in DAEMON_NAMES and _belongs_to(pid, paths):
            found[pid] = name
    return found


def _pid_from_file(path: Path) -> int | None:
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if Path(f"/proc/{pid}").exists() else None


def daemon_alive(pid_file: Path, name: str, paths: Paths) -> bool:
    """The pid file names a live process that is this daemon of this cluster
    (a stale pid file may name an unrelated process that reused the pid)."""
    pid = _pid_from_file(pid_file)
    return pid is not None and process_name(pid) == name and _belongs_to(pid, paths)


def start_daemon(args: list[str], paths: Paths, stderr_name: str) -> None:
    """Start a Slurm daemon, which forks into the background on its own.

    Its early errors (bad config, port in use) appear on stderr before the log file
    is open, so stderr goes to a file that is shown if the start fails.
    """
    stderr_path = paths.log / stderr_name
    with open(stderr_path, "w") as err:
        result = subprocess.run(
            args,
            env=slurm_env(paths),
            stdin=subprocess.DEVNULL,
            stdout=err,
            stderr=err,
            timeout=60,
            check=False,
        )
    if result.returncode != 0:
        raise DevClusterError(f"`{shlex.join(args)}` failed (exit {result.returncode}):\n{tail(stderr_path)}")


def stop_processes(pids: dict[int, str]) -> None:
    """SIGTERM, wait, then SIGKILL whatever is left."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):  # already gone
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    alive = dict(pids)
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = {p: n for p, n in alive.items() if process_name(p) == n}
    for pid, name in alive.items():
        log(f"{name} (pid {pid}) ignored SIGTERM; killing it")
        with contextlib.suppress(ProcessLookupError):  # already gone
            os.kill(pid, signal.SIGKILL)


# --------------------------------------------------------------------------- queries


def controller_responds(paths: Paths) -> bool:
    if not paths.conf.exists():
        return False
    result = run_cmd(["scontrol", "ping"], env=slurm_env(paths), timeout=30)
    return result.returncode == 0 and "is UP" in result.stdout


def node_states(paths: Paths) -> dict[str, str] | None:
    """node -> state as `sinfo` prints it (`idle`, `down*`, ...); None when unreachable.

    A node is listed once per partition; both lines carry the same state.
    """
    result = run_cmd(["sinfo", "--noheader", "--Node", "--format=%N %T"], env=slurm_env(paths), timeout=30)
    if result.returncode != 0:
        return None
    states: dict[str, str] = {}
    for line in result.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            states[parts[0]] = parts[1]
    return states


def nodes_healthy(states: dict[str, str] | None, shape: Shape, idle_only: bool) -> bool:
    if states is None or set(states) != set(node_names(shape.nodes)):
        return False
    wanted = {"idle"} if idle_only else HEALTHY_STATES
    # A trailing `*` means "not responding"; other suffixes (~ # ! % $ @ ^ -) mean
    # power saving, reboots and the like: none of them is a plain working node.
    return all(state in wanted for state in states.values())


def is_up(paths: Paths, shape: Shape) -> bool:
    """The cluster in this directory runs, answers, and every node works."""
    if not daemon_alive(paths.ctld_pid, "slurmctld", paths):
        return False
    if not all(daemon_alive(paths.slurmd_pid(n), "slurmd", paths) for n in node_names(shape.nodes)):
        return False
    if shape.accounting and not accounting_alive(paths):
        return False
    return nodes_healthy(node_states(paths), shape, idle_only=False)


def accounting_alive(paths: Paths) -> bool:
    own = accounting.AccountingPaths(paths.root)
    return daemon_alive(own.dbd_pid, "slurmdbd", paths) and daemon_alive(own.db_pid, "mariadbd", paths)
