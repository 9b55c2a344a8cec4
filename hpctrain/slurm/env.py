"""Read an srun task's place in its step from the environment Slurm gives it.

Only a task of an srun step is a rank: Slurm gives it SLURM_STEP_ID and SLURM_STEP_NUM_TASKS.
A batch shell also has SLURM_PROCID=0 and SLURM_NTASKS (the job's tasks), and an salloc shell
SLURM_NTASKS, but neither is part of a world: taking them for rank 0 waits forever for peers.
Everything comes from the step, not the job (they differ under `srun -E`, on a subset of the
job's nodes, and after a relaunch on spare nodes):

  RANK = SLURM_PROCID            WORLD_SIZE = SLURM_STEP_NUM_TASKS    LOCAL_RANK = SLURM_LOCALID
  LOCAL_WORLD_SIZE = SLURM_STEP_TASKS_PER_NODE (`2(x3),1`) at SLURM_NODEID
  nodes = SLURM_STEP_NODELIST    rank 0's node = the first of them

In a heterogeneous job's step (SLURM_HET_SIZE) and under `--distribution=arbitrary`, rank 0's
node need not be the first of the sorted node list (a step over `node3` then `node[1-2]` lists
`node[1-3]` with rank 0 on node3), and SLURM_NODEID follows the task layout, not that list: the
local world size then comes from SLURM_GTIDS (the step's task ids on this node) and rank 0
publishes its own address in the run dir (hpctrain.dist.rendezvous); `master_addr` is None.

Environments in tests/fixtures/slurm_env/ were captured from real batch shells, salloc shells
and srun steps; tests/test_slurm_env.py reads them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from hpctrain.slurm.hostlist import HostlistError, expand

_REPEAT = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")
# An srun task: what a batch shell or an salloc shell never has.
STEP_VARIABLES = ("SLURM_STEP_ID", "SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "SLURM_LOCALID")


class SlurmEnvError(ValueError):
    """An environment Slurm would not make, or a layout hpctrain cannot train in; the message
    names the variable (or the srun flag) to look at."""


def in_slurm_step(env: Mapping[str, str]) -> bool:
    """True inside a task of an srun step, never in a batch or salloc shell alone."""
    return all(name in env for name in STEP_VARIABLES)


def parse_node_list(value: str, variable: str = "SLURM_JOB_NODELIST") -> list[str]:
    """Expand a Slurm node list (an empty one is empty); a malformed one is a SlurmEnvError
    naming `variable`."""
    try:
        return expand(value, variable)
    except HostlistError as error:
        raise SlurmEnvError(str(error)) from None


def tasks_per_node(value: str, variable: str = "SLURM_TASKS_PER_NODE") -> list[int]:
    """`2(x3),1` -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for part in value.split(","):
        match = _REPEAT.match(part.strip())
        if not match:
            raise SlurmEnvError(f"{variable}={value!r}: cannot read {part!r}")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def node_list(env: Mapping[str, str]) -> list[str]:
    """The step's nodes inside a step, else the job's."""
    for variable in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        if env.get(variable):
            nodes = parse_node_list(env[variable], variable)
            if not nodes:
                raise SlurmEnvError(f"{variable}={env[variable]!r} names no node")
            return nodes
    raise SlurmEnvError("SLURM_JOB_NODELIST is not set: not inside a Slurm job")


@dataclass(frozen=True)
class SlurmPlace:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_index: int
    # Rank 0's node as Slurm names it; None where only rank 0 can tell (see the module doc).
    master_addr: str | None
    step_id: str
    nodes: tuple[str, ...] = ()


def place(env: Mapping[str, str]) -> SlurmPlace:
    """This task's place in its step. Raises SlurmEnvError outside a step or on a layout that
    does not add up, naming the variables."""
    if not in_slurm_step(env):
        missing = [name for name in STEP_VARIABLES if name not in env]
        raise SlurmEnvError(f"not an srun task: {', '.join(missing)} not set (a batch or salloc shell is no rank)")
    refuse_several_gpus_per_task(env)
    rank, world_size = _int(env, "SLURM_PROCID"), _int(env, "SLURM_STEP_NUM_TASKS")
    local_rank, node_index = _int(env, "SLURM_LOCALID"), _int(env, "SLURM_NODEID", "0")
    nodes = node_list(env)
    rank0_known = not rank0_may_be_anywhere(env)
    local_world_size = _local_world_size(env, node_index, len(nodes), world_size, rank0_known)
    if not 0 <= rank < world_size:
        raise SlurmEnvError(f"SLURM_PROCID={rank} is outside SLURM_STEP_NUM_TASKS={world_size}")
    if not 0 <= local_rank < local_world_size:
        raise SlurmEnvError(f"SLURM_LOCALID={local_rank} but this node runs {local_world_size} task(s) of the step")
    return SlurmPlace(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=local_world_size,
        node_index=node_index,
        master_addr=nodes[0] if rank0_known else None,
        step_id=env["SLURM_STEP_ID"],
        nodes=tuple(nodes),
    )


def rank0_may_be_anywhere(env: Mapping[str, str]) -> bool:
    """A heterogeneous job's step or an arbitrary task layout: task 0 may sit on any node."""
    return "SLURM_HET_SIZE" in env or env.get("SLURM_DISTRIBUTION", "").startswith("arbitrary")


def _local_world_size(env: Mapping[str, str], node_index: int, node_count: int, world_size: int, ordered: bool) -> int:
    if not ordered:
        # SLURM_NODEID follows the task layout, not the sorted node list: count this node's
        # task ids instead ("Global task IDs running on this node", srun(1)).
        gtids = env.get("SLURM_GTIDS", "")
        if not gtids:
            raise SlurmEnvError("SLURM_GTIDS is not set: cannot count this node's tasks in a heterogeneous step")
        return len(gtids.split(","))
    variable = "SLURM_STEP_TASKS_PER_NODE"
    if variable not in env:
        raise SlurmEnvError(f"{variable} is not set in an srun task")
    counts = tasks_per_node(env[variable], variable)
    if len(counts) != node_count or sum(counts) != world_size:
        raise SlurmEnvError(
            f"{variable}={env[variable]!r} does not describe {world_size} task(s) "
            f"(SLURM_STEP_NUM_TASKS) on {node_count} node(s) (SLURM_STEP_NODELIST)"
        )
    if not 0 <= node_index < len(counts):
        raise SlurmEnvError(f"SLURM_NODEID={node_index} but {variable}={env[variable]!r} lists {len(counts)} nodes")
    return counts[node_index]


def refuse_several_gpus_per_task(env: Mapping[str, str]) -> None:
    """One process drives one GPU (DDP, one device per rank): a task given several would leave
    all but one idle, so it is refused, naming where the count came from."""
    per_task = env.get("SLURM_GPUS_PER_TASK", "")
    count = per_task.rsplit(":", 1)[-1]  # `2` or a typed `a100:2`
    bound = re.search(r"gpu:per_task:(\d+)", env.get("SLURMD_TRES_BIND", ""))
    if count.isdigit() and int(count) > 1:
        source = f"SLURM_GPUS_PER_TASK={per_task} (--gpus-per-task)"
    elif bound and int(bound.group(1)) > 1:
        source = f"SLURMD_TRES_BIND={env['SLURMD_TRES_BIND']} (--tres-bind)"
    else:
        return
    raise SlurmEnvError(
        f"{source}: hpctrain runs one process per GPU; start one task per GPU instead "
        "(--gpus-per-task=1, or --ntasks-per-node equal to the GPUs per node)"
    )


def _int(env: Mapping[str, str], variable: str, default: str | None = None) -> int:
    value = env.get(variable, default)
    if value is None:
        raise SlurmEnvError(f"{variable} is not set")
    try:
        return int(value)
    except ValueError:
        raise SlurmEnvError(f"{variable}={value!r} is not an integer") from None
