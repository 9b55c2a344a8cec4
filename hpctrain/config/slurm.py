"""The `slurm` section of a config: the job's resources, its batch script, and how it recovers.

What hpctrain-submit renders into job.sbatch and what the batch shell's control steps read
(hpctrain/recovery/); `slurm.network` is hpctrain/config/network.py. Every check raises
ValueError naming the override to change.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Optional

from hpctrain.config.checks import check_srun_args, check_task_prefix, require, single_line
from hpctrain.config.health import HealthConfig
from hpctrain.config.network import NetworkConfig
from hpctrain.run.causes import RESTART_CAUSES, Cause

# A partition name as sbatch -p takes it: one, or several joined by commas (Slurm picks one).
_PARTITIONS = re.compile(r"^[A-Za-z0-9_.\-]+(,[A-Za-z0-9_.\-]+)*$")
# Slurm's --time forms: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, or no limit.
_SLURM_TIME = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$|^\d+-\d+$|^(UNLIMITED|INFINITE)$", re.I)
# Slurm's --mem: a whole number, megabytes unless a K, M, G or T follows; 0 is all of it.
_SLURM_MEM = re.compile(r"^\d+[KMGT]?$", re.I)
# The time-limit warning must be a signal the batch shell and the worker can tell from a stop:
# TERM is what scancel and a preemption send, INT is Ctrl-C (and has no deadline).
_SIGNALS = ("USR1", "USR2", "HUP", "URG")
_STOP_SIGNALS = {"TERM": "scancel and a preemption send it", "INT": "Ctrl-C sends it"}


# A node is declared silent after this many missed beats at the least (one a second).
MIN_SILENT_NODE_TIMEOUT_S = 3.0


_NODE_RANGE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


def node_range(nodes: Any) -> tuple[int, int]:
    """slurm.nodes as (fewest, most): `4` is (4, 4), `"2-4"` is (2, 4). Raises ValueError
    naming slurm.nodes for anything else."""
    match = _NODE_RANGE.match(str(nodes)) if isinstance(nodes, (int, str)) and not isinstance(nodes, bool) else None
    least, most = (int(match[1]), int(match[2] or match[1])) if match else (0, 0)
    require(
        match is not None and 1 <= least <= most,
        "slurm.nodes",
        f"must be a count of nodes >= 1 (4) or a range min-max (2-4), min <= max (got {nodes!r})",
    )
    return least, most


@dataclass
class SlurmConfig:
    # Training nodes: a count (4), or with trainer.elastic a range (`2-4`, Slurm's min-max): the job
    # starts on as many as Slurm gives within it, a node lost with none to replace it leaves the
    # run training on the survivors, and a requeued job resumes on whatever count it gets.
    nodes: Any = 1
    # Training processes per node; null means one per GPU (gpus_per_node), or 1 on CPU nodes.
    ntasks_per_node: Optional[int] = None
    # GPUs per node (--gpus-per-node); 0 for CPU nodes.
    gpus_per_node: int = 0
    # How a task sees GPUs: "all" (every GPU of the node; device = LOCAL_RANK) or
    # "per_task" (srun --gpus-per-task=1: each task sees only its own).
    gpu_bind: str = "all"
    # CPUs per task; null means trainer.threads.
    cpus_per_task: Optional[int] = None
    # Memory per node, Slurm syntax ("64G", "0" = all of it); null leaves the site default.
    mem: Optional[str] = None
    # Time limit, Slurm syntax: "MM", "HH:MM:SS", "D-HH:MM:SS".
    time: str = "01:00:00"
    # The partition (-p); null leaves the site's default.
    partition: Optional[str] = None
    # The account the job is charged to (-A); null leaves the user's default.
    account: Optional[str] = None
    # The quality of service (--qos); null leaves the default.
    qos: Optional[str] = None
    # Node features the job needs (--constraint, e.g. "a100&ib"); null: any node.
    constraint: Optional[str] = None
    # Nodes never to run on (Slurm hostlist, e.g. "gpu-[003,007]").
    exclude: Optional[str] = None
    # The job's name in squeue and sacct (-J).
    job_name: str = "hpctrain"
    # More #SBATCH directives, whole flags: ["--mail-type=END", "--reservation=big"].
    extra: list[str] = field(default_factory=list)
    # Shell lines run before the launch on the batch node: module load, conda activate, ...
    setup: list[str] = field(default_factory=list)
    # Seconds before the time limit that Slurm signals the batch shell to save and requeue.
    signal_delay_s: int = 120
    # The signal sent then (USR2: NCCL may use USR1).
    signal: str = "USR2"
    # The sbatch template: a name in hpctrain's sbatch_templates/ or a path to a site's own file.
    template: str = "ddp.sbatch.j2"
    # The Python on the compute nodes; empty means the one running hpctrain-submit.
    python: str = ""
    # Extra words for the training `srun`, one argument each, after hpctrain's own flags: a
    # pyxis site's ["--container-image=nvcr.io#nvidia/pytorch:24.05-py3", "--container-mounts=/data:/data"].
    srun_args: list[str] = field(default_factory=list)
    # Words put before `python` in every training task, and in the batch shell's control steps
    # unless control_python is set: ["apptainer", "exec", "--nv", "/images/train.sif"]. srun
    # signals each task's processes: the prefix must run the Python in its place or pass signals
    # on (env, apptainer exec and a script ending in `exec "$@"` do).
    task_prefix: list[str] = field(default_factory=list)
    # The Python the batch shell runs hpctrain's control steps with, outside any container (it
    # needs hpctrain and omegaconf, no torch); empty means task_prefix + python, like the tasks.
    control_python: str = ""
    # Socket interfaces and rank 0's address on the site's fast network (hpctrain/config/network.py).
    network: NetworkConfig = field(default_factory=NetworkConfig)
    # Submit sweep points this many at once (sbatch calls in parallel).
    submit_parallelism: int = 8
    # A multirun sweep is queued as Slurm job arrays (one sbatch per array, each point a task
    # training in its own run dir); false: one job per point.
    array: bool = True
    # Tasks of one array running at once (`--array=0-N%K`); null: no limit but Slurm's.
    array_parallelism: Optional[int] = None
    # Folders each machine has its own of: a job of more than one node (spares included) whose
    # run dir is under one is refused at the submit, since every node would write its own run dir.
    # A site whose /tmp is shared (or a one-machine cluster: the dev cluster) sets [].
    node_local_dirs: list[str] = field(default_factory=lambda: ["/tmp", "/var/tmp", "/dev/shm"])
    # Copy hpctrain and the config's own `_target_` code into code/ at submit time and import it
    # first in every life of the job, so edits, pulls and reinstalls never reach a queued job.
    code_snapshot: bool = True
    # Extra nodes allocated beside `nodes` (with --no-kill): when a training node fails, the step
    # is relaunched at once on the survivors from the last checkpoint, without a requeue.
    spare_nodes: int = 0
    # Seconds without a heartbeat from every training process of a node (each beats once a
    # second from a process of its own, hpctrain.process.heartbeat) before the batch script declares the
    # node dead and relaunches on a spare or requeues without it, instead of waiting for Slurm's
    # SlurmdTimeout (300 s by default) or the collective timeout; 0: no heartbeats.
    silent_node_timeout_s: float = 10.0
    # With spare nodes, how often (seconds) the batch script's watcher asks Slurm about the step's
    # nodes: a training node an administrator drains, while a spare is free, is left at the next
    # step boundary after a forced save, the step relaunched on the spare (docs/diagnostics.md).
    # 0: never (the run trains on there until its life ends). Needs silent_node_timeout_s > 0.
    drain_poll_s: float = 30.0
    # With spare nodes, one standby per node of the job (hpctrain.process.standby) imports torch and the
    # trainer once the life trains, and waits: a relaunch's tasks are handed to it and start
    # without those imports (seconds at every relaunch). Jobs with GPUs start cold (docs/lost-nodes.md).
    warm_standby: bool = True
    # Queue a one-CPU guardian job beside every training job (--dependency=afternotok): when the
    # node running the batch script dies, Slurm ends the job FAILED without a requeue, and the
    # guardian submits the run again (hpctrain.recovery.guardian). false: one job per run, unguarded.
    guardian: bool = True
    # GPUs the guardian job asks for (--gpus), for a site that refuses a job without one on its
    # GPU partitions (a job_submit plugin); it holds them only the seconds it runs. 0: none. The
    # guardian always carries the job's partition, account, qos, constraint and exclude.
    guardian_gpus: int = 0
    # Requeues and relaunches of the job in all, whatever the cause; null: the sum of the
    # per-cause budgets (108 by default), so every budget below can be reached.
    max_restarts: Optional[int] = None
    # Restarts allowed per cause (hpctrain.run.causes.RESTART_CAUSES, which the control step
    # classifies each restart as); past one, the job stops with a `failure` event.
    restart_budget: dict[str, int] = field(
        default_factory=lambda: {
            Cause.PREEMPT.value: 50,
            Cause.TIMELIMIT.value: 50,
            Cause.NODE_FAILURE.value: 5,
            Cause.CRASH.value: 1,
            Cause.HANG.value: 2,
        }
    )

    # Lives in a row that may end in a failure (a crash, a hang, a lost node) without writing a
    # checkpoint newer than any before them; at that many the run stops (a `failure` with cause
    # no_progress) instead of being requeued again. Preemptions and time limits never count. 0: off.
    no_progress_lives: int = 3
    # The checks each node makes at the start of every life, a site's own command among them, and
    # when a node that keeps failing lives is kept out (hpctrain/config/health.py).
    health: HealthConfig = field(default_factory=HealthConfig)

    @property
    def min_nodes(self) -> int:
        """The fewest training nodes a step runs on (slurm.nodes, or the low end of its range)."""
        return node_range(self.nodes)[0]

    @property
    def max_nodes(self) -> int:
        """The most training nodes a step runs on (slurm.nodes, or the high end of its range)."""
        return node_range(self.nodes)[1]

    @property
    def elastic_nodes(self) -> bool:
        """slurm.nodes is a range: the step runs on however many nodes the job has within it."""
        return self.min_nodes < self.max_nodes

    def __post_init__(self) -> None:
        for key in ("spare_nodes", "max_restarts", "no_progress_lives"):
            value = getattr(self, key)
            require(value is None or value >= 0, f"slurm.{key}", f"must be >= 0 (got {value})")
        for cause, budget in self.restart_budget.items():
            require(
                cause in RESTART_CAUSES,
                f"slurm.restart_budget.{cause}",
                f"unknown cause; the causes are {', '.join(RESTART_CAUSES)}",
            )
            require(budget >= 0, f"slurm.restart_budget.{cause}", f"must be >= 0 (got {budget})")
        least, most = node_range(self.nodes)  # raises naming slurm.nodes
        self.nodes = least if least == most else f"{least}-{most}"
        require(
            least == most or self.spare_nodes == 0,
            "slurm.spare_nodes",
            f"must be 0 with a range of nodes (slurm.nodes={self.nodes}): a node lost is replaced by "
            "training on the survivors, not by a spare; use a count of nodes with spares, or no spares",
        )
        require(
            self.submit_parallelism >= 1,
            "slurm.submit_parallelism",
            f"must be >= 1 (got {self.submit_parallelism})",
        )
        for key in ("ntasks_per_node", "cpus_per_task", "array_parallelism"):
            value = getattr(self, key)
            require(value is None or value >= 1, f"slurm.{key}", f"must be >= 1 or null (got {value})")
        require(self.gpus_per_node >= 0, "slurm.gpus_per_node", f"must be >= 0 (got {self.gpus_per_node})")
        require(self.guardian_gpus >= 0, "slurm.guardian_gpus", f"must be >= 0 (got {self.guardian_gpus})")
        require(self.drain_poll_s >= 0, "slurm.drain_poll_s", f"must be >= 0 (got {self.drain_poll_s})")
        require(self.signal_delay_s >= 0, "slurm.signal_delay_s", f"must be >= 0 (got {self.signal_delay_s})")
        require(
            self.silent_node_timeout_s == 0 or self.silent_node_timeout_s >= MIN_SILENT_NODE_TIMEOUT_S,
            "slurm.silent_node_timeout_s",
            f"must be 0 (off) or >= {MIN_SILENT_NODE_TIMEOUT_S:g}: beats come once a second "
            f"(got {self.silent_node_timeout_s})",
        )
        require(
            self.gpu_bind in ("all", "per_task"), "slurm.gpu_bind", f"must be all or per_task (got {self.gpu_bind!r})"
        )
        require(
            bool(_SLURM_TIME.match(self.time)),
            "slurm.time",
            f"{self.time!r} is not a Slurm time limit; use minutes, HH:MM:SS or D-HH:MM:SS",
        )
        stop = _STOP_SIGNALS.get(self.signal)
        require(
            self.signal in _SIGNALS,
            "slurm.signal",
            f"must be one of {', '.join(_SIGNALS)} (got {self.signal!r})"
            + (f": {stop}, so the time-limit warning could not be told from a stop" if stop else ""),
        )
        for key in ("mem", "partition", "account", "qos", "constraint", "exclude", "job_name", "template", "python"):
            single_line(f"slurm.{key}", getattr(self, key))
        require(
            self.partition is None or bool(_PARTITIONS.match(self.partition)),
            "slurm.partition",
            f"{self.partition!r} is not a Slurm partition name: letters, digits, - _ . (several joined "
            "by commas, no spaces); `sinfo -s` lists the partitions",
        )
        for index, flag in enumerate(self.extra):
            single_line(f"slurm.extra[{index}]", flag)
            require(
                flag.startswith("-"), f"slurm.extra[{index}]", f"must be a flag like --mail-type=END (got {flag!r})"
            )
        for index, line in enumerate(self.setup):
            single_line(f"slurm.setup[{index}]", line)
        check_srun_args(self.srun_args)
        check_task_prefix(self.task_prefix)
        single_line("slurm.control_python", self.control_python)
        require(
            self.mem is None or bool(_SLURM_MEM.match(self.mem)),
            "slurm.mem",
            f"{self.mem!r} is not a Slurm memory size; use a whole number with K, M, G or T (64G), or 0 for all",
        )

    @property
    def tasks_per_node(self) -> int:
        if self.ntasks_per_node is not None:
            return self.ntasks_per_node
        return self.gpus_per_node or 1
