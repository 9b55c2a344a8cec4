"""The typed schema of an hpctrain config.

YAML files in `conf/` only set values; the shape and the checks live here. Nodes that build
objects (`model`, `data.dataset`, `optim`, `sched`, `loss`) are free-form `_target_` dicts, so a
user's own class plugs in with `model._target_=mypkg.Net`; `hpctrain.config.targets` checks them
against the target's signature before anything runs.

Every check raises ValueError naming the override to change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING

from hpctrain.config.checks import require, single_line
from hpctrain.config.slurm import SlurmConfig, node_range
from hpctrain.config.tune import TuneConfig

# The sections kept in modules of their own are named here too: `hpctrain.config.schema` is where
# every section's class is imported from.
__all__ = ["Config", "DataConfig", "MetricsConfig", "SlurmConfig", "TrainerConfig", "TuneConfig", "node_range"]


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
    # Deterministic kernels on GPU (torch.use_deterministic_algorithms, cuDNN without autotuning,
    # cuBLAS's fixed workspace): a run stopped and resumed gives the same weights as one that ran
    # through, on GPU as on CPU (where it is so already), at some speed. Off: the fastest kernels.
    deterministic: bool = False
    # The model computes its own loss from the targets it is given (hpctrain.trainer.model_io):
    # null: when its forward takes `targets` (nanoGPT); true: `targets` or `labels` (Hugging
    # Face); false: never (hpctrain's `loss` on its scores).
    model_takes_targets: Optional[bool] = None
    # How the model is spread over the processes: "ddp" (each holds the whole model, gradients
    # all-reduced) or "fsdp" (FSDP2: parameters, gradients and optimizer state sharded, each unit
    # gathered only while it computes; checkpoints sharded through torch.distributed.checkpoint).
    strategy: str = "ddp"
    # A rank whose own work in a step (its batches, forwards and losses: what waits on no peer)
    # takes longer than this many times its peers' median, over trainer.straggler_window_steps
    # steps in two windows in a row, is journaled as a `straggler` (hpctrain.trainer.straggler_watch).
    # 0: not watched.
    straggler_threshold: float = 1.3
    # The steps each rank's time is taken over (their mean, the slowest left out; one small
    # all-gather per window).
    straggler_window_steps: int = 20
    # What a named straggler brings about: "report" (the `straggler` record, hpctrain-status) or
    # "relaunch": with slurm.spare_nodes and a spare free, the batch script's watcher has the ranks
    # save at the next step and relaunches without the straggler's node (cause `straggler`,
    # hpctrain.recovery.straggler_move); without a free spare, as "report".
    straggler_action: str = "report"
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
    # The in-memory tier: every N steps each rank's whole state is copied to host memory and sent,
    # from a thread, to the memory holder of its node and of the next training node, so a node
    # lost with a spare resumes from the newest step every rank's copy survives for, not from the
    # disk's (Slurm jobs with spare nodes; with fsdp each rank's shards; the disk checkpoints stay).
    # 0: off.
    memory_ckpt_every: int = 1
    # With the tier on, the share of training time its copies may take: the interval is widened
    # from trainer.memory_ckpt_every until a copy's measured cost (its host copy and its sending
    # thread's CPU) fits, the ranks agreeing on one interval 20 steps into a life and every 200
    # steps after (hpctrain.checkpoint.memory_interval). 0: exactly every memory_ckpt_every steps.
    memory_ckpt_overhead: float = 0.02
    # The most host memory one node's holder keeps, in GB (the newest two copies of each of its
    # own ranks and of its partner node's); a copy past it is refused and the disk used. null: a
    # quarter of the node's available memory when the holder starts.
    memory_max_gb: Optional[float] = None
    # End a process when no step finishes for this many seconds (a hang), so the job recovers
    # instead of idling to its time limit; 0 disables. Covers start-up from the rendezvous on
    # (a peer that never joins is a hang too) and the first step (torch.compile included). Must
    # be below collective_timeout_s.
    hang_timeout_s: int = 900
    # Collectives each rank's torch records (its Flight Recorder ring: sequence number, op, sizes,
    # state), shown in its hang report; the rank behind its peers' newest is the one they wait
    # for. 0: none recorded. A TORCH_FR_BUFFER_SIZE of the user's own stands.
    collective_records: int = 64
    # In steady state, the wait for the next step is learned from the life's steps: max(this,
    # 10 x the recent steps' 90th percentile), never above hang_timeout_s; during the start, an
    # evaluation or a save, hang_timeout_s (the step after a periodic save or an evaluation is
    # waited for as any step: hpctrain.process.step_timeout). A rank stuck in
    # a deadlock or a kernel call on a live node is then a hang in about a minute, not 15, as in
    # NVIDIA's resiliency extension (60 s). 0: off (hang_timeout_s for every step).
    step_hang_timeout_s: int = 60
    # A life's first step may compile (torch.compile) and warm caches for many minutes: it may
    # take this long before it is a hang. null: hang_timeout_s, or with trainer.compile 1500 s (or
    # hang_timeout_s, if longer), kept below collective_timeout_s.
    first_step_timeout_s: Optional[int] = None
    # An evaluation (a whole eval set) before it is a hang; null: hang_timeout_s.
    eval_timeout_s: Optional[int] = None
    # A checkpoint save (a forced one on a stop signal too) before it is a hang; null: hang_timeout_s.
    save_timeout_s: Optional[int] = None
    # A progress bar on rank 0's stderr: auto shows it only when stderr is a terminal (never in
    # a Slurm .out file), on always, off never. The log lines are written either way.
    progress_bar: str = "auto"

    def __post_init__(self) -> None:
        for key in (
            "max_steps",
            "epochs",
            "eval_every",
            "ckpt_every",
            "hang_timeout_s",
            "step_hang_timeout_s",
            "memory_ckpt_every",
        ):
            value = getattr(self, key)
            require(value >= 0, f"trainer.{key}", f"must be >= 0 (got {value})")
        require(
            self.straggler_threshold == 0 or self.straggler_threshold > 1,
            "trainer.straggler_threshold",
            f"must be 0 (off) or above 1: how many times its peers' median a straggler takes (got "
            f"{self.straggler_threshold})",
        )
        for key in ("log_every", "nprocs", "threads", "grad_accum", "collective_timeout_s", "straggler_window_steps"):
            value = getattr(self, key)
            require(value >= 1, f"trainer.{key}", f"must be >= 1 (got {value})")
        require(
            self.hang_timeout_s == 0 or self.hang_timeout_s < self.collective_timeout_s,
            "trainer.hang_timeout_s",
            f"must be below trainer.collective_timeout_s (got {self.hang_timeout_s} and "
            f"{self.collective_timeout_s}): a peer that stops would fail its collectives first, and the "
            "hang would be charged as a crash; lower trainer.hang_timeout_s or raise trainer.collective_timeout_s",
        )
        for key in ("first_step_timeout_s", "eval_timeout_s", "save_timeout_s"):
            value = getattr(self, key)
            require(
                value is None or 0 < value < self.collective_timeout_s,
                f"trainer.{key}",
                f"must be null or between 0 and trainer.collective_timeout_s ({self.collective_timeout_s}), "
                f"got {value}: a peer that stops would fail its collectives first, and the hang would be "
                "charged as a crash",
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
            0 <= self.memory_ckpt_overhead < 1,
            "trainer.memory_ckpt_overhead",
            f"must be a share of the training time, 0 to under 1 (got {self.memory_ckpt_overhead})",
        )
        require(
            self.memory_max_gb is None or self.memory_max_gb > 0,
            "trainer.memory_max_gb",
            f"must be above 0, or null for a quarter of a node's available memory (got {self.memory_max_gb})",
        )
        require(
            self.precision in ("bf16", "fp16", "fp32"),
            "trainer.precision",
            f"must be bf16, fp16 or fp32 (got {self.precision!r})",
        )
        require(self.strategy in ("ddp", "fsdp"), "trainer.strategy", f"must be ddp or fsdp (got {self.strategy!r})")
        require(
            self.straggler_action in ("report", "relaunch"),
            "trainer.straggler_action",
            f"must be report or relaunch (got {self.straggler_action!r})",
        )
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
