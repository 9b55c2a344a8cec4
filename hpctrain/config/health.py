"""slurm.health: the checks each node makes at the start of every life (hpctrain.process.node_health).

    slurm:
      health:
        checks: [run_dir, scratch, memory, gpus, allreduce]
        command: "nvidia-smi -q > /dev/null"    # a site's own check; non-zero fails the node
        min_scratch_gb: 1.0
        min_memory_gb: 1.0

A node that fails one is kept out of the life: relaunched around on a spare, or requeued
without it (a `failure` with cause `node_health`, naming the check and what it found).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hpctrain.config.checks import require, single_line

# Each check's name, and what it looks at (hpctrain.process.node_health runs them).
CHECKS = {
    "run_dir": "the run dir takes a small file (written, synced, removed)",
    "scratch": "the node's scratch folder has min_scratch_gb free",
    "memory": "the node has min_memory_gb available (MemAvailable)",
    "gpus": "the node shows as many GPUs as the job asked for on it",
    "allreduce": "a 4 MiB all-reduce among all ranks after the rendezvous, timed (its bandwidth in `start`)",
}


@dataclass
class HealthConfig:
    # The checks each node runs before the rendezvous of every life (allreduce: just after it);
    # [] runs none. Names: hpctrain.config.health.CHECKS.
    checks: list[str] = field(default_factory=lambda: list(CHECKS))
    # A site's own check, run by bash on each node (in the task's environment, HPCTRAIN_RUN_DIR
    # set) after hpctrain's; an exit code other than 0, or no end within timeout_s, fails the node.
    command: str = ""
    # Seconds each check (the command too) may take: a stale mount blocks a write for ever, and a
    # check that gives no answer in time fails its node.
    timeout_s: float = 5.0
    # The folder the scratch check looks at; empty: $TMPDIR, or /tmp.
    scratch_dir: str = ""
    # Free space in GB the scratch folder must have (a node-local disk that earlier jobs filled).
    min_scratch_gb: float = 1.0
    # Memory in GB the node must have available (MemAvailable), after what others left behind.
    min_memory_gb: float = 1.0
    # A node named by the failures of this many lives in a row (any cause: a health check, a
    # silent node, Slurm's NODE_FAIL) is kept out of the run's next lives, back in service or
    # not. 0: a node is let back once Slurm returns it to service.
    keep_out_after_lives: int = 2

    def __post_init__(self) -> None:
        for index, name in enumerate(self.checks):
            require(
                name in CHECKS,
                f"slurm.health.checks[{index}]",
                f"unknown check {name!r}; the checks are {', '.join(CHECKS)} (a site's own: slurm.health.command)",
            )
        single_line("slurm.health.command", self.command)
        single_line("slurm.health.scratch_dir", self.scratch_dir)
        for key in ("timeout_s", "min_scratch_gb", "min_memory_gb"):
            value = getattr(self, key)
            require(value >= 0, f"slurm.health.{key}", f"must be >= 0 (got {value})")
        require(self.timeout_s > 0, "slurm.health.timeout_s", f"must be > 0 (got {self.timeout_s})")
        require(
            self.keep_out_after_lives >= 0,
            "slurm.health.keep_out_after_lives",
            f"must be >= 0 (got {self.keep_out_after_lives})",
        )
