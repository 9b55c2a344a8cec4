"""Read a Slurm task's place in the job from its environment.

RANK from SLURM_PROCID, WORLD_SIZE from SLURM_NTASKS, LOCAL_RANK from SLURM_LOCALID,
LOCAL_WORLD_SIZE from SLURM_TASKS_PER_NODE (`2(x3),1`: 2 tasks on each of 3 nodes, then 1),
MASTER_ADDR the first host of the step's node list (the job's outside a step), expanded by
submitit's SlurmJobEnvironment parser (`gpu-[001-003,010],login1`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from submitit.slurm.slurm import SlurmJobEnvironment
from submitit.slurm.slurm import _parse_node_list as parse_node_list

_REPEAT = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def in_slurm_step(env: Mapping[str, str]) -> bool:
    """True inside an srun task (the variables a batch shell alone does not make a world from)."""
    names = SlurmJobEnvironment._env
    return all(name in env for name in (names["global_rank"], names["num_tasks"], names["local_rank"]))


def tasks_per_node(value: str) -> list[int]:
    """`2(x3),1` -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for part in value.split(","):
        match = _REPEAT.match(part.strip())
        if not match:
            raise ValueError(f"SLURM_TASKS_PER_NODE={value!r}: cannot read {part!r}")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def node_list(env: Mapping[str, str]) -> list[str]:
    nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodes:
        raise ValueError("SLURM_JOB_NODELIST is not set: not inside a Slurm job")
    return parse_node_list(nodes)


@dataclass(frozen=True)
class SlurmPlace:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_index: int
    master_addr: str
    job_id: str
    step_id: str
    restart: int


def place(env: Mapping[str, str]) -> SlurmPlace:
    names = SlurmJobEnvironment._env
    node_index = int(env.get("SLURM_NODEID", "0"))
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    if per_node:
        counts = tasks_per_node(per_node)
        if node_index >= len(counts):
            raise ValueError(
                f"SLURM_NODEID={node_index} but SLURM_TASKS_PER_NODE={per_node!r} lists {len(counts)} nodes"
            )
        local_world_size = counts[node_index]
    else:
        local_world_size = int(env[names["num_tasks"]])
    return SlurmPlace(
        rank=int(env[names["global_rank"]]),
        world_size=int(env[names["num_tasks"]]),
        local_rank=int(env[names["local_rank"]]),
        local_world_size=local_world_size,
        node_index=node_index,
        master_addr=node_list(env)[0],
        job_id=env.get(names["job_id"], ""),
        step_id=env.get("SLURM_STEP_ID", "0"),
        restart=int(env.get("SLURM_RESTART_COUNT", "0")),
    )
