"""One life of a run: which Slurm job it is and how many times Slurm restarted it.

Every record a life writes (events, the control step's decisions, a trial's report, the GraceTime
lookup) names the job the same way, so this stamp is made once from the environment and passed
down; no other module reads SLURM_JOB_ID, SLURM_ARRAY_* or SLURM_RESTART_COUNT for that.

Inside an array task SLURM_JOB_ID is the task's own number, and one task has the array's own id
as its number: `scontrol requeue <that number>` requeues every task of the array (seen on Slurm
22.05). A life therefore names itself `<array>_<task>`, which squeue, sacct, scontrol and scancel
all take and which survives a requeue; its own number is kept as `number` (its other name, which
Slurm's own records show beside it).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

# Set by the batch script as its first act (UNIX seconds): when Slurm started this life.
ALLOCATED_AT_ENV = "HPCTRAIN_ALLOCATED_AT"


@dataclass(frozen=True)
class LifeStamp:
    job_id: str | None  # `36`, or `36_7` for task 7 of array 36; None outside Slurm
    restart: int  # SLURM_RESTART_COUNT: 0 on the first life, +1 on every requeue
    number: str | None = None  # SLURM_JOB_ID, the job's own number (an array task's differs from job_id)
    array_job_id: str | None = None  # SLURM_ARRAY_JOB_ID
    array_task_id: int | None = None  # SLURM_ARRAY_TASK_ID
    allocated_at: float | None = None  # HPCTRAIN_ALLOCATED_AT: when Slurm started the batch script
    job_nodes: int | None = None  # SLURM_JOB_NUM_NODES: the nodes the allocation holds (spares too)
    gpus_on_node: int | None = None  # SLURM_GPUS_ON_NODE: what Slurm gave this node, if it gave GPUs

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> LifeStamp:
        env = os.environ if env is None else env
        number = env.get("SLURM_JOB_ID", "") or None
        array, task = env.get("SLURM_ARRAY_JOB_ID", ""), env.get("SLURM_ARRAY_TASK_ID", "")
        restart = env.get("SLURM_RESTART_COUNT", "0")
        allocated_at = _seconds(env.get(ALLOCATED_AT_ENV, ""))
        nodes = _positive(env.get("SLURM_JOB_NUM_NODES", ""))
        gpus = _positive(env.get("SLURM_GPUS_ON_NODE", ""))
        if array.isdigit() and task.isdigit():
            return cls(f"{array}_{task}", _count(restart), number, array, int(task), allocated_at, nodes, gpus)
        return cls(number, _count(restart), number, None, None, allocated_at, nodes, gpus)

    @property
    def in_slurm(self) -> bool:
        return self.job_id is not None

    @property
    def aliases(self) -> tuple[str, ...]:
        """The life's other name: an array task's own number, when it differs from job_id."""
        return (self.number,) if self.number and self.number != self.job_id else ()


def _count(text: str) -> int:
    # Slurm always sets a number; anything else (a user's own export) counts as the first life.
    return int(text) if text.strip().isdigit() else 0


def _positive(text: str) -> int | None:
    return int(text) if text.strip().isdigit() and int(text) > 0 else None


def _seconds(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None  # unset (a user's own batch script, hpctrain-train), or not a time
