"""One dev cluster's shape, its folder's layout and its config files (scripts/devcluster.py):
slurm.conf and gres.conf rendered from the shape. Nothing here starts or reads a process.
"""

import json
import socket
from dataclasses import asdict, dataclass
from pathlib import Path

import devcluster_accounting as accounting

CLUSTER_NAME = "hpctrain-dev"


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


def hostlist_range(prefix: str, first: int, last: int) -> str:
    """Slurm hostlist / number range: `node[1-3]`, or plain `node1` for one item."""
    return f"{prefix}{first}" if first == last else f"{prefix}[{first}-{last}]"


def short_hostname() -> str:
    # Slurm compares SlurmctldHost and NodeHostname with the short host name.
    return socket.gethostname().split(".")[0]


# --------------------------------------------------------------------------- config


def render_slurm_conf(shape: Shape, paths: Paths, hostname: str) -> str:
    base = shape.port_base
    nodes = hostlist_range("node", 1, shape.nodes)
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


def render_gres_conf(shape: Shape) -> str:
    lines = ["# Written by scripts/devcluster.py; fake GPUs backed by /dev/null-like devices."]
    # No NVML probing: the GPUs are fake, and autodetection would find none (or real ones).
    lines.append("AutoDetect=off")
    if shape.gpus_per_node:
        files = hostlist_range("/dev/fakegpu", 0, shape.gpus_per_node - 1)
        lines.append(f"NodeName={hostlist_range('node', 1, shape.nodes)} Name=gpu File={files}")
    return "\n".join(lines) + "\n"


def write_config(shape: Shape, paths: Paths) -> None:
    for directory in (paths.root, paths.state, paths.spool, paths.run, paths.log):
        directory.mkdir(parents=True, exist_ok=True)
    for node in node_names(shape.nodes):
        (paths.spool / node).mkdir(exist_ok=True)
    paths.conf.write_text(render_slurm_conf(shape, paths, short_hostname()))
    paths.gres_conf.write_text(render_gres_conf(shape))
    paths.shape_file.write_text(json.dumps(asdict(shape), indent=2) + "\n")


def read_shape(paths: Paths) -> Shape | None:
    try:
        return Shape(**json.loads(paths.shape_file.read_text()))
    except (OSError, ValueError, TypeError):
        return None
