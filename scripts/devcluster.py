#!/usr/bin/env python3
"""A real Slurm cluster on one machine, for development and for the test suite.

Everything lives in one directory (default /tmp/hpctrain-devcluster): slurm.conf,
gres.conf, state, spool, pid files and logs.  Nothing is written to /etc/slurm;
every Slurm command finds the cluster through the SLURM_CONF environment variable.

    python scripts/devcluster.py up [--nodes 3] [--gpus-per-node 2] [--cpus-per-node 2]
                                    [--dir D] [--port-base 16817] [--no-accounting]
                                    [--min-job-age 300]
    python scripts/devcluster.py down   [--dir D]
    python scripts/devcluster.py freeze NODE [--dir D]   # NODE dies silently (devcluster_freeze.py)
    python scripts/devcluster.py thaw NODE [--dir D]
    python scripts/devcluster.py status [--dir D]
    eval "$(python scripts/devcluster.py env [--dir D])"

Layout of the fake cluster:
  * one slurmctld and N slurmd (node1..nodeN), all on this host, each slurmd on its
    own port (port-base+1 .. port-base+N), the controller on port-base;
  * G fake GPUs per node, exposed as gres backed by /dev/fakegpu0.. (character
    devices that behave like /dev/null), so Slurm sets CUDA_VISIBLE_DEVICES;
  * two partitions over the same nodes: `batch` (default, preemptible: REQUEUE after
    a 20 s grace time) and `urgent` (high priority tier, never preempted);
  * strict like a site: each task pinned to its CPUs (TaskPlugin=task/affinity), and
    accounting (slurmdbd on port-base+20, its own MariaDB on port-base+21, both started
    from this directory; see devcluster_accounting.py), so `sacct` answers.
    `--no-accounting` leaves accounting out: the path of the many small sites without it.

Tests import `ensure_cluster()` from this file (via importlib) to get a running
cluster and the environment that points at it.  (No `from __future__ import
annotations` here on purpose: with it, dataclasses fail in a module loaded by
importlib without first being registered in sys.modules.)

Needs root (it installs slurm-wlm, munge, and for accounting mariadb-server and slurmdbd
with apt-get, and starts daemons).
Python 3.11, standard library only.
"""

import argparse
import contextlib
import fcntl
import importlib.util
import json
import os
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType


def _load_sibling(name: str) -> ModuleType:
    # A sibling module, found by path: tests load this file by path too, not as a package.
    location = Path(__file__).resolve().with_name(f"{name}.py")
    spec = importlib.util.spec_from_file_location(name, location)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


accounting = _load_sibling("devcluster_accounting")
freezing = _load_sibling("devcluster_freeze")

DEFAULT_DIR = "/tmp/hpctrain-devcluster"
DEFAULT_PORT_BASE = 16817
CLUSTER_NAME = "hpctrain-dev"

# How long `up` waits for every node to report idle before giving up.
STARTUP_TIMEOUT_S = 60.0
# How long `down` waits for a daemon to exit after SIGTERM before SIGKILL.
STOP_TIMEOUT_S = 15.0

ROOT_MESSAGE = "devcluster needs root (it installs slurm-wlm and starts slurmctld/slurmd); run it with sudo or as root"

# The commands this script (and the tests) rely on; all come with slurm-wlm / munge.
SLURM_COMMANDS = ("slurmctld", "slurmd", "sbatch", "srun", "scontrol", "squeue", "sinfo", "scancel")
MUNGE_COMMANDS = ("munged", "munge", "unmunge")

# Daemons are found under /usr/sbin, which is not always on a sudo user's PATH.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Processes a cluster consists of (slurmscriptd is a helper forked by slurmctld,
# slurmstepd runs each job step for slurmd).
DAEMON_NAMES = ("slurmctld", "slurmscriptd", "slurmd", "slurmstepd", *accounting.DAEMON_NAMES)

# Node states (as printed by `sinfo -o %T`) that mean "the node works".
HEALTHY_STATES = {"idle", "mixed", "allocated", "completing", "planned"}


class DevClusterError(Exception):
    """A failure to report to the user as one plain message (plus exit code)."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# --------------------------------------------------------------------------- shape


@dataclass(frozen=True)
class Shape:
    """What the user asked for; two clusters with equal shapes are interchangeable."""

    nodes: int
    gpus_per_node: int
    cpus_per_node: int
    port_base: int
    accounting: bool = True  # slurmdbd + MariaDB, so sacct answers (off: --no-accounting)
    # How long slurmctld keeps an ended job (scontrol show job); sacct remembers it for good.
    min_job_age_s: int = 300
    # MaxArraySize (task ids 0..N-1); None: Slurm's default 1001. A small one makes sweeps split.
    max_array_size: int | None = None
    # AccountingStorageEnforce=limits: association/QOS limits (MaxSubmitJobs...) are applied,
    # as on sites that set them; off: Slurm ignores them.
    enforce_limits: bool = False
    # SlurmdTimeout: how long slurmctld waits for a silent slurmd before it marks the node DOWN.
    # 10 s by default here (tests of announced failures need no more); Slurm's own default, 300 s,
    # for the tests of nodes that die silently, which must not lean on a short one.
    slurmd_timeout_s: int = 10
    # Each task bound to its CPUs (TaskPlugin=task/affinity), as sites do. Off (task/none), tasks
    # run unbound: several fake nodes share this machine's CPUs, every node's first CPU is the
    # machine's CPU 0, and bound one-task-a-node jobs all ran on that one core, the others idle.
    pin_cpus: bool = True
    # MaxJobCount: the job records slurmctld holds (Slurm's default 10000; ended ones stay MinJobAge).
    # A sweep of 10,000 points (their array tasks, split as they are cancelled or run) needs more.
    max_job_count: int | None = None


@dataclass(frozen=True)
class Paths:
    """Where everything of one cluster lives, all under one directory."""

    root: Path

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def gres_conf(self) -> Path:
        # slurmd looks for gres.conf next to slurm.conf.
        return self.root / "gres.conf"

    @property
    def shape_file(self) -> Path:
        return self.root / "shape.json"

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def spool(self) -> Path:
        return self.root / "spool"

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def log(self) -> Path:
        return self.root / "log"

    @property
    def ctld_pid(self) -> Path:
        return self.run / "slurmctld.pid"

    @property
    def ctld_log(self) -> Path:
        return self.log / "slurmctld.log"

    def slurmd_pid(self, node: str) -> Path:
        return self.run / f"slurmd-{node}.pid"

    def slurmd_log(self, node: str) -> Path:
        return self.log / f"slurmd-{node}.log"


def node_names(nodes: int) -> list[str]:
    return [f"node{i}" for i in range(1, nodes + 1)]


def _range(prefix: str, first: int, last: int) -> str:
    """Slurm hostlist / number range: `node[1-3]`, or plain `node1` for one item."""
    return f"{prefix}{first}" if first == last else f"{prefix}[{first}-{last}]"


def short_hostname() -> str:
    # Slurm compares SlurmctldHost and NodeHostname with the short host name.
    return socket.gethostname().split(".")[0]


# --------------------------------------------------------------------------- config


def render_slurm_conf(shape: Shape, paths: Paths, hostname: str) -> str:
    base = shape.port_base
    nodes = _range("node", 1, shape.nodes)
    node_ports = str(base + 1) if shape.nodes == 1 else f"{base + 1}-{base + shape.nodes}"
    gres = f" Gres=gpu:{shape.gpus_per_node}" if shape.gpus_per_node else ""
    lines = [
        "# Written by scripts/devcluster.py; rewritten by every `up`.",
        f"ClusterName={CLUSTER_NAME}",
        # Clients reach the controller over loopback whatever the host name resolves to.
        f"SlurmctldHost={hostname}(127.0.0.1)",
        f"SlurmctldPort={base}",
        "SlurmUser=root",
        # Debian has no mail program by default; slurmctld logs an error without this.
        "MailProg=/bin/true",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        # No cgroups: works in containers and VMs alike; tasks are tracked by process group.
        "ProctrackType=proctrack/pgid",
        # Pin each task to its CPUs, as sites do: a task sees only --cpus-per-task CPUs (Shape.pin_cpus;
        # task/none leaves tasks unbound: task/affinity binds a step to the CPUs it was allocated
        # even under --cpu-bind=none, and those are every fake node's first, the machine's CPU 0).
        f"TaskPlugin={'task/affinity' if shape.pin_cpus else 'task/none'}",
        "MpiDefault=none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        # Trust the node lines below rather than the real hardware: several fake nodes
        # share one small machine, so each would otherwise be drained for "low CPUs".
        "SlurmdParameters=config_overrides",
        "SchedulerType=sched/backfill",
        # Schedule often: tests should not wait a minute for the periodic pass.
        "SchedulerParameters=bf_interval=2,sched_interval=5",
        # Nodes set DOWN (e.g. to simulate a failure) come back by themselves.
        "ReturnToService=2",
        f"SlurmdTimeout={shape.slurmd_timeout_s}",
        "MessageTimeout=20",
        "KillWait=5",
        "InactiveLimit=0",
        "Waittime=0",
        f"MinJobAge={shape.min_job_age_s}",
        # Job ids of their own: two clusters on one machine never run jobs of the same id on nodes of
        # the same name, so a process found by SLURM_JOB_ID and SLURMD_NODENAME is this cluster's.
        f"FirstJobId={first_job_id(shape.port_base)}",
        *([f"MaxArraySize={shape.max_array_size}"] if shape.max_array_size else []),
        *([f"MaxJobCount={shape.max_job_count}"] if shape.max_job_count else []),
        "JobRequeue=1",
        # Preemption by partition: jobs in `urgent` requeue jobs in `batch`.
        "PreemptType=preempt/partition_prio",
        "PreemptMode=REQUEUE",
        f"StateSaveLocation={paths.state}",
        f"SlurmctldPidFile={paths.ctld_pid}",
        f"SlurmctldLogFile={paths.ctld_log}",
        "SlurmctldDebug=info",
        # %n is the node name, so each slurmd gets its own spool, pid file and log.
        f"SlurmdSpoolDir={paths.spool}/%n",
        f"SlurmdPidFile={paths.run}/slurmd-%n.pid",
        f"SlurmdLogFile={paths.log}/slurmd-%n.log",
        "SlurmdDebug=info",
    ]
    if shape.accounting:
        lines += accounting.slurm_conf_lines(base)
        if shape.enforce_limits:
            lines.append("AccountingStorageEnforce=associations,limits")
    if shape.gpus_per_node:
        lines.append("GresTypes=gpu")
    lines += [
        f"NodeName={nodes} NodeHostname={hostname} NodeAddr=127.0.0.1 Port={node_ports} "
        f"CPUs={shape.cpus_per_node} RealMemory=6000{gres} State=UNKNOWN",
        f"PartitionName=batch Nodes={nodes} Default=YES MaxTime=INFINITE State=UP "
        "PriorityTier=1 PreemptMode=REQUEUE GraceTime=20 OverSubscribe=NO",
        f"PartitionName=urgent Nodes={nodes} Default=NO MaxTime=INFINITE State=UP "
        "PriorityTier=10 PreemptMode=OFF OverSubscribe=NO",
    ]
    return "\n".join(lines) + "\n"


def first_job_id(port_base: int) -> int:
    """The cluster's first job id, from its port base: clusters 10 ports apart are 10,000 ids apart,
    and the highest port (65535) still leaves room below Slurm's MaxJobId (67043328)."""
    return max(1, port_base * 1000)


def fake_gpu_devices(gpus_per_node: int) -> list[Path]:
    return [Path(f"/dev/fakegpu{i}") for i in range(gpus_per_node)]


def render_gres_conf(shape: Shape) -> str:
    lines = ["# Written by scripts/devcluster.py; fake GPUs backed by /dev/null-like devices."]
    # No NVML probing: the GPUs are fake, and autodetection would find none (or real ones).
    lines.append("AutoDetect=off")
    if shape.gpus_per_node:
        files = _range("/dev/fakegpu", 0, shape.gpus_per_node - 1)
        lines.append(f"NodeName={_range('node', 1, shape.nodes)} Name=gpu File={files}")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- helpers


def log(message: str) -> None:
    """Progress goes to stderr, so stdout holds only what callers may `eval`."""
    print(f"devcluster: {message}", file=sys.stderr, flush=True)


def slurm_env(paths: Paths) -> dict[str, str]:
    """The environment for Slurm commands and daemons of this cluster."""
    env = dict(os.environ)
    env["SLURM_CONF"] = str(paths.conf)
    env["PATH"] = _path_with_system_dirs(env.get("PATH", ""))
    return env


def _path_with_system_dirs(path: str) -> str:
    parts = [p for p in path.split(os.pathsep) if p]
    for extra in SYSTEM_PATH.split(os.pathsep):
        if extra not in parts:
            parts.append(extra)
    return os.pathsep.join(parts)


def which(command: str) -> str | None:
    return shutil.which(command, path=_path_with_system_dirs(os.environ.get("PATH", "")))


def run_cmd(
    args: list[str],
    env: dict[str, str] | None = None,
    timeout: float = 30.0,
    check: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run a short command and capture its output (never a daemon: see start_daemon)."""
    try:
        result = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        result = subprocess.CompletedProcess(args, 124, "", f"timed out after {timeout}s")
    if check and result.returncode != 0:
        raise DevClusterError(
            f"`{shlex.join(args)}` failed (exit {result.returncode}):\n{result.stdout}{result.stderr}".rstrip()
        )
    return result


def tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"(cannot read {path}: {exc})"
    return "\n".join(text[-lines:])


def require_root() -> None:
    if os.geteuid() != 0:
        raise DevClusterError(ROOT_MESSAGE, exit_code=2)


# --------------------------------------------------------------------------- install


def missing_commands(with_accounting: bool) -> list[str]:
    wanted = SLURM_COMMANDS + MUNGE_COMMANDS + (accounting.COMMANDS if with_accounting else ())
    return [c for c in wanted if which(c) is None]


def ensure_installed(with_accounting: bool) -> None:
    """apt-get install slurm-wlm and munge (and mariadb-server and slurmdbd for accounting),
    but only when something is missing."""
    missing = missing_commands(with_accounting)
    packages = ["slurm-wlm", "munge", *(accounting.PACKAGES if with_accounting else ())]
    if not missing:
        return
    if which("apt-get") is None:
        raise DevClusterError(
            "devcluster installs Slurm with apt-get (Debian/Ubuntu), which this machine "
            f"lacks, and these commands are missing: {', '.join(missing)}. "
            f"Install {', '.join(packages)} yourself (or pass --no-accounting to do without accounting).",
            exit_code=2,
        )
    log(f"installing {' '.join(packages)} (missing: {', '.join(missing)}); takes a minute")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    env["PATH"] = _path_with_system_dirs(env.get("PATH", ""))
    for args in (
        ["apt-get", "update"],
        # A CI image's own apt (unattended-upgrades at boot) may hold dpkg's lock: wait for it.
        ["apt-get", "-o", "DPkg::Lock::Timeout=600", "install", "-y", *packages],
    ):
        # Let apt's output through: a slow mirror should be visible, not a silent hang.
        result = subprocess.run(args, env=env, stdout=sys.stderr, check=False)
        if result.returncode != 0:
            raise DevClusterError(f"`{shlex.join(args)}` failed (exit {result.returncode})")
    still_missing = missing_commands(with_accounting)
    if still_missing:
        raise DevClusterError(f"after installing {' '.join(packages)} these are still missing: {still_missing}")


# --------------------------------------------------------------------------- munge


def munge_works() -> bool:
    """True when a credential made by munge decodes, i.e. munged runs and has a key."""
    try:
        encoded = subprocess.run(
            ["munge", "-n"],
            capture_output=True,
            timeout=10,
            check=False,
            env=dict(os.environ, PATH=_path_with_system_dirs(os.environ.get("PATH", ""))),
        )
        if encoded.returncode != 0:
            return False
        decoded = subprocess.run(
            ["unmunge"],
            input=encoded.stdout,
            capture_output=True,
            timeout=10,
            check=False,
            env=dict(os.environ, PATH=_path_with_system_dirs(os.environ.get("PATH", ""))),
        )
        return decoded.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def ensure_munge() -> None:
    if munge_works():
        return
    key = Path("/etc/munge/munge.key")
    if not key.exists():
        # The Debian package creates the key; recreate it if someone removed it.
        log("creating the munge key")
        run_cmd(["mungekey", "--create", f"--keyfile={key}"], check=True)
        shutil.chown(key, "munge", "munge")
        key.chmod(0o400)
    run_dir = Path("/run/munge")
    run_dir.mkdir(parents=True, exist_ok=True)
    shutil.chown(run_dir, "munge", "munge")
    log("starting munged")
    # --force: munged refuses to run as root (or with lax permissions) without it.
    run_cmd(["munged", "--force"], check=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if munge_works():
            return
        time.sleep(0.2)
    raise DevClusterError("munged was started but `munge -n | unmunge` still fails")


# --------------------------------------------------------------------------- devices


def ensure_fake_gpus(gpus_per_node: int) -> None:
    """Create /dev/fakegpuN as char devices 1:3 (what /dev/null is) when missing.

    Slurm only needs the files to exist (gres.conf names them); nothing reads them.
    """
    for device in fake_gpu_devices(gpus_per_node):
        if device.exists():
            continue
        try:
            os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        except PermissionError:
            # E.g. a container without CAP_MKNOD: an empty file is enough for Slurm.
            device.touch()
        device.chmod(0o666)  # mknod's mode is cut by the umask; jobs may run as anyone


# --------------------------------------------------------------------------- processes


def _read_proc(pid: int, name: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/{name}").read_bytes()
    except OSError:
        return b""


def _process_name(pid: int) -> str:
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
        name = _process_name(pid)
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
    return pid is not None and _process_name(pid) == name and _belongs_to(pid, paths)


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
        alive = {p: n for p, n in alive.items() if _process_name(p) == n}
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


def read_shape(paths: Paths) -> Shape | None:
    try:
        return Shape(**json.loads(paths.shape_file.read_text()))
    except (OSError, ValueError, TypeError):
        return None


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


# --------------------------------------------------------------------------- up / down


def cluster_ports(shape: Shape) -> list[int]:
    """Controller, nodes, and (with accounting) slurmdbd and MariaDB."""
    ports = list(range(shape.port_base, shape.port_base + shape.nodes + 1))
    return ports + (list(accounting.ports(shape.port_base)) if shape.accounting else [])


def check_ports_free(shape: Shape) -> None:
    """Fail early, and plainly, when another cluster (or anything) holds our ports."""
    for port in cluster_ports(shape):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("0.0.0.0", port))
            except OSError:
                raise DevClusterError(
                    f"port {port} is in use (another devcluster?); "
                    f"pick another --port-base (the cluster uses {_describe_ports(shape)})"
                ) from None


def write_config(shape: Shape, paths: Paths) -> None:
    for directory in (paths.root, paths.state, paths.spool, paths.run, paths.log):
        directory.mkdir(parents=True, exist_ok=True)
    for node in node_names(shape.nodes):
        (paths.spool / node).mkdir(exist_ok=True)
    paths.conf.write_text(render_slurm_conf(shape, paths, short_hostname()))
    paths.gres_conf.write_text(render_gres_conf(shape))
    paths.shape_file.write_text(json.dumps(asdict(shape), indent=2) + "\n")


def clear_state(paths: Paths) -> None:
    """Forget jobs and logs of an earlier cluster in this directory: start clean."""
    for directory in (paths.state, paths.spool, paths.run, paths.log):
        shutil.rmtree(directory, ignore_errors=True)


def wait_until_idle(shape: Shape, paths: Paths, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    states: dict[str, str] | None = None
    while time.monotonic() < deadline:
        states = node_states(paths)
        if nodes_healthy(states, shape, idle_only=True):
            return
        time.sleep(0.5)
    logs = [f"--- {paths.ctld_log} (tail) ---\n{tail(paths.ctld_log)}"]
    for node in node_names(shape.nodes):
        logs.append(f"--- {paths.slurmd_log(node)} (tail) ---\n{tail(paths.slurmd_log(node))}")
    raise DevClusterError(f"nodes not idle after {timeout:.0f}s (sinfo: {states}).\n" + "\n".join(logs))


def start_cluster(shape: Shape, paths: Paths) -> None:
    clear_state(paths)
    write_config(shape, paths)
    check_ports_free(shape)
    ensure_fake_gpus(shape.gpus_per_node)
    if shape.accounting:
        _start_accounting(shape, paths)
    conf = str(paths.conf)
    log(f"starting slurmctld on port {shape.port_base}")
    # -c: start from a clean state, ignoring jobs a previous controller saved.
    start_daemon(["slurmctld", "-c", "-f", conf], paths, "slurmctld.stderr")
    for node in node_names(shape.nodes):
        start_daemon(["slurmd", "-N", node, "-f", conf], paths, f"slurmd-{node}.stderr")
    log(f"started {shape.nodes} slurmd; waiting for the nodes to become idle")
    wait_until_idle(shape, paths, STARTUP_TIMEOUT_S)


def _start_accounting(shape: Shape, paths: Paths) -> None:
    dbd_port, db_port = accounting.ports(shape.port_base)
    log(f"starting MariaDB on port {db_port} and slurmdbd on port {dbd_port}")
    try:
        accounting.start(paths.root, shape.port_base, CLUSTER_NAME, slurm_env(paths))
    except accounting.AccountingError as error:
        raise DevClusterError(
            f"accounting did not start: {error}\n(--no-accounting starts the cluster without it)"
        ) from None


def stop_cluster(paths: Paths) -> bool:
    """Stop every daemon of this cluster; True when something was running."""
    thaw_all(paths)  # a frozen process would hold its SIGTERM
    pids = cluster_pids(paths)
    if not pids:
        _remove_pid_files(paths)
        return False
    if "slurmctld" in pids.values():
        cancel_all_jobs(paths)
        pids = cluster_pids(paths)
    # Nodes first, controller last, so slurmd can still report job ends while
    # shutting down.  slurmscriptd is left to slurmctld: a SIGTERM sent to it
    # directly makes slurmctld hang on shutdown ("_write_msg: read/write op failed").
    stop_processes({p: n for p, n in pids.items() if n in ("slurmd", "slurmstepd")})
    stop_processes({p: n for p, n in pids.items() if n == "slurmctld"})
    # Accounting last: slurmctld sends its last job records to slurmdbd, which writes them to MariaDB.
    stop_processes({p: n for p, n in pids.items() if n == "slurmdbd"})
    stop_processes({p: n for p, n in pids.items() if n == "mariadbd"})
    leftover = cluster_pids(paths)
    if leftover:
        stop_processes(leftover)
    _remove_pid_files(paths)
    return True


def frozen_record(paths: Paths, node: str) -> Path:
    return paths.root / f"frozen-{node}.pids"


def freeze_node(directory: str, node: str) -> list[int]:
    """Every process of `node` stopped, as a node that died silently (devcluster_freeze.py)."""
    paths = Paths(Path(directory).absolute())
    try:
        return freezing.freeze(paths.slurmd_pid(node), paths.slurmd_log(node), frozen_record(paths, node))
    except LookupError as error:
        raise DevClusterError(f"cannot freeze {node} of the cluster in {paths.root}: {error}", 2) from None


def thaw_node(directory: str, node: str) -> list[int]:
    """The processes `freeze_node` stopped, continued."""
    return freezing.thaw(frozen_record(Paths(Path(directory).absolute()), node))


def thaw_all(paths: Paths) -> None:
    for record in paths.root.glob("frozen-*.pids"):
        freezing.thaw(record)


def _remove_pid_files(paths: Paths) -> None:
    if paths.run.is_dir():
        for pid_file in paths.run.glob("*.pid"):
            pid_file.unlink(missing_ok=True)


def cancel_all_jobs(paths: Paths) -> None:
    """Cancel jobs first so their tasks end with them instead of being orphaned."""
    env = slurm_env(paths)
    jobs = run_cmd(["squeue", "--noheader", "--format=%A"], env=env, timeout=20)
    ids = jobs.stdout.split() if jobs.returncode == 0 else []
    if not ids:
        return
    log(f"cancelling {len(ids)} job(s)")
    run_cmd(["scancel", *ids], env=env, timeout=20)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        left = run_cmd(["squeue", "--noheader", "--states=R,CG,S", "--format=%A"], env=env)
        if left.returncode != 0 or not left.stdout.strip():
            return
        time.sleep(0.5)


@contextlib.contextmanager
def locked(paths: Paths) -> Iterator[None]:
    """Serialize `up`/`down` on one directory (e.g. parallel pytest workers that all
    call ensure_cluster): the second waits, then finds the cluster up."""
    paths.root.mkdir(parents=True, exist_ok=True)
    with open(paths.root / ".lock", "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        yield


# Slurm's packages and munged are the machine's, not one cluster's: clusters brought up at once
# from other folders (parallel pytest workers on a fresh machine) install and start them one at a
# time, and the later ones find them there. Without it two apt-gets raced for dpkg's lock and
# every cluster but one failed to come up.
MACHINE_LOCK = Path("/var/lock" if Path("/var/lock").is_dir() else "/tmp") / "hpctrain-devcluster-machine.lock"


@contextlib.contextmanager
def machine_locked() -> Iterator[None]:
    """Serialize what every cluster on this machine shares: installing packages, munged."""
    with open(MACHINE_LOCK, "a") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        yield


def up(shape: Shape, directory: str) -> dict[str, str]:
    """Make sure a healthy cluster of this shape runs from `directory`; return its env."""
    require_root()
    paths = Paths(Path(directory).absolute())
    with locked(paths):
        return _up_locked(shape, paths)


def _up_locked(shape: Shape, paths: Paths) -> dict[str, str]:
    with machine_locked():
        ensure_installed(shape.accounting)
        ensure_munge()
    expected_conf = render_slurm_conf(shape, paths, short_hostname())
    same_shape = read_shape(paths) == shape and _read_text(paths.conf) == expected_conf
    if same_shape and is_up(paths, shape):
        log(f"already up in {paths.root} ({_describe(shape)})")
        return {"SLURM_CONF": str(paths.conf)}
    if cluster_pids(paths):
        reason = "shape differs" if not same_shape else "not healthy"
        log(f"restarting the cluster in {paths.root} ({reason})")
        stop_cluster(paths)
    start_time = time.monotonic()
    start_cluster(shape, paths)
    log(f"up in {time.monotonic() - start_time:.1f}s: {_describe(shape)}")
    return {"SLURM_CONF": str(paths.conf)}


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _describe(shape: Shape) -> str:
    kind = "with accounting" if shape.accounting else "no accounting"
    return (
        f"{shape.nodes} nodes x {shape.cpus_per_node} CPUs x {shape.gpus_per_node} GPUs, {kind}, "
        f"MinJobAge {shape.min_job_age_s}s, SlurmdTimeout {shape.slurmd_timeout_s}s"
        + (f", MaxArraySize {shape.max_array_size}" if shape.max_array_size else "")
        + (f", MaxJobCount {shape.max_job_count}" if shape.max_job_count else "")
        + (", limits enforced" if shape.enforce_limits else "")
        + f", ports {_describe_ports(shape)}"
    )


def _describe_ports(shape: Shape) -> str:
    text = f"{shape.port_base}..{shape.port_base + shape.nodes}"
    if shape.accounting:
        dbd_port, db_port = accounting.ports(shape.port_base)
        text += f", slurmdbd {dbd_port}, MariaDB {db_port}"
    return text


def resolve_port_base(directory: str, port_base: int | None) -> int:
    """An explicit port base wins; else keep the one of the cluster in `directory`
    (so `up --dir D` does not restart a cluster started with another --port-base);
    else the default."""
    if port_base is not None:
        return port_base
    previous = read_shape(Paths(Path(directory).absolute()))
    return previous.port_base if previous else DEFAULT_PORT_BASE


# --------------------------------------------------------------------------- public API


def ensure_cluster(
    nodes: int,
    gpus_per_node: int,
    directory: str,
    *,
    cpus_per_node: int = 2,
    port_base: int | None = None,
    with_accounting: bool = True,
    min_job_age_s: int = 300,
    max_array_size: int | None = None,
    enforce_limits: bool = False,
    slurmd_timeout_s: int = 10,
    pin_cpus: bool = True,
    max_job_count: int | None = None,
) -> dict[str, str]:
    """Start (or reuse) a cluster and return the environment that points at it.

    Returns {"SLURM_CONF": "<directory>/slurm.conf"}; merge it into os.environ (or a
    subprocess env) before calling sbatch/srun/squeue.  Reuses a healthy cluster of
    the same shape; restarts one of another shape.  Raises DevClusterError.
    """
    port = resolve_port_base(directory, port_base)
    shape = Shape(
        nodes,
        gpus_per_node,
        cpus_per_node,
        port,
        with_accounting,
        min_job_age_s,
        max_array_size,
        enforce_limits,
        slurmd_timeout_s,
        pin_cpus,
        max_job_count,
    )
    return up(shape, directory)


def stop(directory: str) -> bool:
    """Stop the cluster started from `directory`; True when something was running."""
    require_root()
    paths = Paths(Path(directory).absolute())
    if not paths.root.is_dir():
        return False
    with locked(paths):
        return stop_cluster(paths)


# --------------------------------------------------------------------------- CLI


def cmd_up(args: argparse.Namespace) -> int:
    if args.nodes < 1 or args.gpus_per_node < 0 or args.cpus_per_node < 1 or args.min_job_age < 2:
        raise DevClusterError("need --nodes >= 1, --cpus-per-node >= 1, --gpus-per-node >= 0, --min-job-age >= 2", 2)
    env = ensure_cluster(
        args.nodes,
        args.gpus_per_node,
        args.dir,
        cpus_per_node=args.cpus_per_node,
        port_base=args.port_base,
        with_accounting=not args.no_accounting,
        min_job_age_s=args.min_job_age,
        max_array_size=args.max_array_size,
        enforce_limits=args.enforce_limits,
        slurmd_timeout_s=args.slurmd_timeout,
        max_job_count=args.max_job_count,
    )
    print(f"export SLURM_CONF={shlex.quote(env['SLURM_CONF'])}")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    if stop(args.dir):
        log(f"stopped the cluster in {Path(args.dir).absolute()}")
    else:
        log(f"nothing running from {Path(args.dir).absolute()}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    paths = Paths(Path(args.dir).absolute())
    if not controller_responds(paths):
        print(f"devcluster in {paths.root}: down")
        return 1
    env = slurm_env(paths)
    for command in (["sinfo"], ["squeue"]):
        result = run_cmd(command, env=env)
        print(result.stdout, end="")
        if result.returncode != 0:
            print(result.stderr, end="", file=sys.stderr)
            return 1
    shape = read_shape(paths)
    if shape and not nodes_healthy(node_states(paths), shape, idle_only=False):
        log("warning: some nodes are not in a working state (see sinfo above)")
    return 0


def cmd_freeze(args: argparse.Namespace) -> int:
    frozen = freeze_node(args.dir, args.node)
    log(f"{args.node}: {len(frozen)} processes stopped (slurmd, its step daemons, their tasks)")
    return 0


def cmd_thaw(args: argparse.Namespace) -> int:
    continued = thaw_node(args.dir, args.node)
    log(f"{args.node}: {len(continued)} processes continued")
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    conf = Path(args.dir).absolute() / "slurm.conf"
    if not conf.exists():
        log(f"warning: {conf} does not exist yet; run `up` first")
    print(f"export SLURM_CONF={shlex.quote(str(conf))}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="devcluster.py",
        description="A real Slurm cluster (slurmctld + N slurmd, fake GPUs) on this machine.",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    def add_dir(sub: argparse.ArgumentParser) -> None:
        sub.add_argument(
            "--dir", default=DEFAULT_DIR, help=f"directory holding the cluster's config/state (default {DEFAULT_DIR})"
        )

    p_up = commands.add_parser("up", help="install Slurm if needed and start the cluster")
    p_up.add_argument("--nodes", type=int, default=3, help="number of nodes (default 3)")
    p_up.add_argument("--gpus-per-node", type=int, default=2, help="fake GPUs per node (default 2)")
    p_up.add_argument("--cpus-per-node", type=int, default=2, help="CPUs per node (default 2)")
    add_dir(p_up)
    p_up.add_argument(
        "--port-base",
        type=int,
        default=None,
        help=f"slurmctld port; nodes use the next N ports (default: the port of the "
        f"cluster already in --dir, else {DEFAULT_PORT_BASE})",
    )
    p_up.add_argument(
        "--no-accounting",
        action="store_true",
        help="no slurmdbd/MariaDB: sacct answers 'accounting storage is disabled', as on many small sites",
    )
    p_up.add_argument(
        "--min-job-age",
        type=int,
        default=300,
        help="seconds slurmctld keeps an ended job for scontrol (MinJobAge; default 300, Slurm's minimum 2)",
    )
    p_up.add_argument(
        "--max-array-size",
        type=int,
        default=None,
        help="MaxArraySize: job array task ids 0..N-1 (default: Slurm's 1001)",
    )
    p_up.add_argument(
        "--max-job-count",
        type=int,
        default=None,
        help="MaxJobCount: job records slurmctld holds, ended ones for MinJobAge (default: Slurm's 10000)",
    )
    p_up.add_argument(
        "--enforce-limits",
        action="store_true",
        help="AccountingStorageEnforce=associations,limits: sacctmgr's MaxSubmitJobs/MaxJobs apply (needs accounting)",
    )
    p_up.add_argument(
        "--slurmd-timeout",
        type=int,
        default=10,
        help="SlurmdTimeout: seconds before a silent node is marked DOWN (default 10; Slurm's own is 300)",
    )
    p_up.set_defaults(func=cmd_up)

    p_down = commands.add_parser("down", help="stop the daemons started from --dir")
    add_dir(p_down)
    p_down.set_defaults(func=cmd_down)

    p_status = commands.add_parser("status", help="show sinfo and squeue; exit 1 if down")
    add_dir(p_status)
    p_status.set_defaults(func=cmd_status)

    for name, action, func in (
        ("freeze", "stop every process of NODE, as a node that dies silently", cmd_freeze),
        ("thaw", "continue the processes `freeze` stopped on NODE", cmd_thaw),
    ):
        sub = commands.add_parser(name, help=action)
        sub.add_argument("node", help="the node (node1, node2, ...)")
        add_dir(sub)
        sub.set_defaults(func=func)

    p_env = commands.add_parser("env", help="print `export SLURM_CONF=...` for eval")
    add_dir(p_env)
    p_env.set_defaults(func=cmd_env)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except DevClusterError as exc:
        print(exc, file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
