"""The typed schema of an hpctrain config.

YAML files in `conf/` only set values; the shape and the checks live here. Nodes that build
objects (`model`, `data.dataset`, `optim`, `sched`, `loss`) are free-form `_target_` dicts, so a
user's own class plugs in with `model._target_=mypkg.Net`; `hpctrain.config.targets` checks them
against the target's signature before anything runs.

Every check raises ValueError naming the override to change.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING

from hpctrain.config.checks import check_srun_args, check_task_prefix, require, single_line
from hpctrain.config.network import NetworkConfig
from hpctrain.config.tune import TuneConfig
from hpctrain.run.causes import RESTART_CAUSES, Cause


@dataclass
class DataConfig:
    # A `_target_` node returning hpctrain.data.splits.Splits (train and eval datasets).
    dataset: dict[str, Any] = MISSING
    # Samples per process per step (the global batch is batch_size * world_size * grad_accum).
    batch_size: int = 32
    # Samples per process per evaluation batch; 0 means the same as batch_size.
    eval_batch_size: int = 0
    # DataLoader worker processes per training process (0 loads in the training process).
    num_workers: int = 0
    # Keep the workers alive from one epoch to the next (with num_workers > 0). Either way a
    # resumed run is exact: workers reseed their generators per batch (hpctrain.data.worker_seeds).
    persistent_workers: bool = True
    # Page-locked host memory for faster host-to-GPU copies; ignored on CPU.
    pin_memory: bool = True

    def __post_init__(self) -> None:
        require(self.batch_size >= 1, "data.batch_size", f"must be >= 1 (got {self.batch_size})")
        require(
            self.eval_batch_size >= 0,
            "data.eval_batch_size",
            f"must be >= 0, 0 meaning data.batch_size (got {self.eval_batch_size})",
        )
        require(self.num_workers >= 0, "data.num_workers", f"must be >= 0 (got {self.num_workers})")


@dataclass
class TrainerConfig:
    # Optimizer steps to run; 0 means `epochs` full passes over the training set.
    max_steps: int = 0
    # Passes over the training set when max_steps is 0.
    epochs: int = 10
    # Log a metrics line every N optimizer steps (and at the last step).
    log_every: int = 10
    # Evaluate on the held-out split every N steps; 0 evaluates only at the end.
    eval_every: int = 100
    # Seeds model init, data order and dropout; same seed + world size + threads = same weights.
    seed: int = 0
    # Local processes for `hpctrain-train` (ignored under torchrun or Slurm, which set the world).
    nprocs: int = 1
    # Intra-op threads per process (torch.set_num_threads).
    threads: int = 1
    # Micro-batches per optimizer step; gradients sync only on the last one (DDP no_sync).
    grad_accum: int = 1
    # Resume at another number of processes (a node lost for good, a queue that gives more or
    # fewer nodes): the global batch and the order of samples stay, each process's micro-batches
    # and accumulation adapt (never above data.batch_size). The weights then equal an
    # uninterrupted run's within floating-point reduction order; at the same size, bit for bit.
    elastic: bool = False
    # Clip the global gradient norm to this value; 0 disables clipping.
    grad_clip: float = 1.0
    # GPU arithmetic: "bf16" autocast, "fp16" autocast + GradScaler, or "fp32". CPU is always fp32.
    precision: str = "bf16"
    # Wrap the model in torch.compile.
    compile: bool = False
    # How the model is spread over the processes: "ddp" (each holds the whole model, gradients
    # all-reduced) or "fsdp" (FSDP2: parameters, gradients and optimizer state sharded, each unit
    # gathered only while it computes; checkpoints sharded through torch.distributed.checkpoint).
    strategy: str = "ddp"
    # With fsdp: class names of the submodules sharded as units of their own (gathered one at a
    # time); empty means every module held in an nn.ModuleList (a transformer's blocks). The rest
    # of the model (embeddings, head: tied weights stay together) is the root's unit.
    fsdp_units: list[str] = field(default_factory=list)
    # With fsdp: shard within a node and replicate across nodes (HSDP): gathers stay on the node's
    # fast links, only the gradient all-reduce crosses nodes. Needs the same tasks on every node.
    hsdp: bool = False
    # torch.distributed backend: "auto" is NCCL on GPU, gloo on CPU.
    backend: str = "auto"
    # DDP gradient bucket size in MiB (larger buckets, fewer all-reduces).
    bucket_cap_mb: float = 25.0
    # Let gradients live in DDP's buckets (saves one copy and memory).
    gradient_as_bucket_view: bool = True
    # Seconds a collective (and the rendezvous) may wait before the process group fails it. Above
    # hang_timeout_s, so a stuck peer is reported as the hang it is, not as a crash.
    collective_timeout_s: int = 1800
    # Save a checkpoint every N steps (and always at the end and on a stop signal); 0: only those.
    ckpt_every: int = 100
    # Newest checkpoints kept in the run dir's checkpoints/ (at least 2: a torn newest falls back).
    keep_checkpoints: int = 2
    # Write periodic checkpoints in a background thread; training waits only for an in-memory copy.
    async_checkpoint: bool = True
    # End a process when no step finishes for this many seconds (a hang), so the job recovers
    # instead of idling to its time limit; 0 disables. Covers start-up from the rendezvous on
    # (a peer that never joins is a hang too) and the first step (torch.compile included). Must
    # be below collective_timeout_s.
    hang_timeout_s: int = 900
    # A progress bar on rank 0's stderr: auto shows it only when stderr is a terminal (never in
    # a Slurm .out file), on always, off never. The log lines are written either way.
    progress_bar: str = "auto"

    def __post_init__(self) -> None:
        for key in ("max_steps", "epochs", "eval_every", "ckpt_every", "hang_timeout_s"):
            value = getattr(self, key)
            require(value >= 0, f"trainer.{key}", f"must be >= 0 (got {value})")
        for key in ("log_every", "nprocs", "threads", "grad_accum", "collective_timeout_s"):
            value = getattr(self, key)
            require(value >= 1, f"trainer.{key}", f"must be >= 1 (got {value})")
        require(
            self.hang_timeout_s == 0 or self.hang_timeout_s < self.collective_timeout_s,
            "trainer.hang_timeout_s",
            f"must be below trainer.collective_timeout_s (got {self.hang_timeout_s} and "
            f"{self.collective_timeout_s}): a peer that stops would fail its collectives first, and the "
            "hang would be charged as a crash; lower trainer.hang_timeout_s or raise trainer.collective_timeout_s",
        )
        require(
            self.max_steps > 0 or self.epochs > 0,
            "trainer.max_steps",
            "set trainer.max_steps or trainer.epochs to a positive number",
        )
        require(
            self.keep_checkpoints >= 2,
            "trainer.keep_checkpoints",
            f"must be >= 2 so a torn newest checkpoint has one to fall back on (got {self.keep_checkpoints})",
        )
        require(self.grad_clip >= 0, "trainer.grad_clip", f"must be >= 0 (got {self.grad_clip})")
        require(
            self.precision in ("bf16", "fp16", "fp32"),
            "trainer.precision",
            f"must be bf16, fp16 or fp32 (got {self.precision!r})",
        )
        require(self.strategy in ("ddp", "fsdp"), "trainer.strategy", f"must be ddp or fsdp (got {self.strategy!r})")
        require(
            not (self.strategy == "fsdp" and self.compile),
            "trainer.compile",
            "is not offered with trainer.strategy=fsdp yet; set trainer.compile=false or trainer.strategy=ddp",
        )
        require(
            not (self.strategy == "fsdp" and self.precision == "fp16"),
            "trainer.precision",
            "fp16 needs a gradient scaler that FSDP's sharded gradients do not have here; use bf16 with "
            "trainer.strategy=fsdp",
        )
        require(
            not self.hsdp or self.strategy == "fsdp",
            "trainer.hsdp",
            "shards within a node, which needs trainer.strategy=fsdp",
        )
        require(
            self.backend in ("auto", "gloo", "nccl"),
            "trainer.backend",
            f"must be auto, gloo or nccl (got {self.backend!r})",
        )
        require(self.bucket_cap_mb > 0, "trainer.bucket_cap_mb", f"must be > 0 (got {self.bucket_cap_mb})")
        require(
            self.progress_bar in ("auto", "on", "off"),
            "trainer.progress_bar",
            f"must be auto, on or off (got {self.progress_bar!r})",
        )


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
    # With spare nodes, one standby per node of the job (hpctrain.process.standby) imports torch and the
    # trainer once the life trains, and waits: a relaunch's tasks are handed to it and start
    # without those imports (seconds at every relaunch). Jobs with GPUs start cold (docs/lost-nodes.md).
    warm_standby: bool = True
    # Queue a one-CPU guardian job beside every training job (--dependency=afternotok): when the
    # node running the batch script dies, Slurm ends the job FAILED without a requeue, and the
    # guardian submits the run again (hpctrain.recovery.guardian). false: one job per run, unguarded.
    guardian: bool = True
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
        for key in ("spare_nodes", "max_restarts"):
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


@dataclass
class MetricsConfig:
    """Where rank 0's metrics go besides metrics.jsonl (always written). A requeued or resumed
    run goes on in the same TensorBoard folder and the same MLflow run, without repeating steps."""

    # TensorBoard event files (needs the `tensorboard` extra).
    tensorboard: bool = False
    # Their folder; empty means <run dir>/tensorboard. Relative paths are under the run dir.
    tensorboard_dir: str = ""
    # An MLflow run per hpctrain run (needs the `mlflow` extra).
    mlflow: bool = False
    # Empty means MLFLOW_TRACKING_URI from the environment, else a file store in the run dir
    # (<run dir>/mlruns). Keep it the same across requeues: the run goes on in the same MLflow run.
    mlflow_tracking_uri: str = ""
    # The MLflow experiment the run logs to (metrics.mlflow).
    mlflow_experiment: str = "hpctrain"
    # Empty means the run dir's path relative to the working directory (runs/2026-01-31/12-00-00).
    mlflow_run_name: str = ""
    # A W&B run per hpctrain run (needs the `wandb` extra); its id is kept in wandb_run.json.
    wandb: bool = False
    # offline: files in <run dir>/wandb, no network (compute nodes often have none); upload
    # them later with `wandb sync`. online: straight to W&B (needs WANDB_API_KEY or a login).
    wandb_mode: str = "offline"
    # The W&B project the run logs to (metrics.wandb).
    wandb_project: str = "hpctrain"
    # Empty means W&B's default entity (your user, or WANDB_ENTITY).
    wandb_entity: str = ""
    # Empty means the sweep dir for a sweep's points (runs/multirun/2026-01-31/12-00-00), else none.
    wandb_group: str = ""
    # Tags of the W&B run (metrics.wandb), e.g. [baseline, gpt].
    wandb_tags: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        strings = ("tensorboard_dir", "mlflow_tracking_uri", "mlflow_experiment", "mlflow_run_name")
        for key in (*strings, "wandb_project", "wandb_entity", "wandb_group"):
            single_line(f"metrics.{key}", getattr(self, key))
        require(bool(self.mlflow_experiment), "metrics.mlflow_experiment", "must not be empty")
        require(bool(self.wandb_project), "metrics.wandb_project", "must not be empty")
        require(
            self.wandb_mode in ("offline", "online"),
            "metrics.wandb_mode",
            f"must be offline or online (got {self.wandb_mode!r})",
        )


@dataclass
class Config:
    # A `_target_` node building the nn.Module; its forward returns logits.
    model: dict[str, Any] = MISSING
    data: DataConfig = field(default_factory=DataConfig)
    # A `_target_` node building the optimizer; hpctrain passes the parameters first.
    optim: dict[str, Any] = MISSING
    # A `_target_` node building the LR scheduler (stepped every optimizer step), or null.
    # hpctrain passes the optimizer first, and `total_steps` when the target takes it.
    sched: Optional[dict[str, Any]] = None
    # A `_target_` node building the loss; it gets (logits, targets) flattened to 2-D/1-D.
    loss: dict[str, Any] = field(default_factory=lambda: {"_target_": "torch.nn.CrossEntropyLoss"})
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    # hpctrain-tune's search (hpctrain/config/tune.py); a plain run ignores it.
    tune: TuneConfig = field(default_factory=TuneConfig)
    # hpctrain-submit: print the rendered job script and write the run dir, but queue nothing.
    dry_run: bool = False

    def __post_init__(self) -> None:
        require(
            not self.slurm.elastic_nodes or self.trainer.elastic,
            "slurm.nodes",
            f"a range ({self.slurm.nodes}) needs trainer.elastic=true: the run trains on however many "
            "nodes it gets, so its number of processes changes between steps; set trainer.elastic=true "
            "or give one count of nodes",
        )
