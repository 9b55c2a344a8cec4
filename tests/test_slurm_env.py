"""Slurm environment -> distributed context, on environments captured from the dev cluster
(tests/fixtures/slurm_env/README.md says how each was made) and Slurm's documented forms."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hpctrain.config.network import NetworkConfig
from hpctrain.dist.context import PORT_FILE, DistContext, env_master_addr, visible_gpu
from hpctrain.dist.rendezvous import port_file
from hpctrain.run.exitcodes import WORKER_USER_ERROR
from hpctrain.slurm.env import SlurmEnvError, in_slurm_step, node_list, place, tasks_per_node

FIXTURES = Path(__file__).parent / "fixtures" / "slurm_env"


def captured(name: str, **changes: str | None) -> dict[str, str]:
    """A captured environment (`name`.env), with variables changed (None removes one)."""
    env = dict(line.split("=", 1) for line in (FIXTURES / f"{name}.env").read_text().splitlines() if line)
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


# ---- which shells are ranks ------------------------------------------------------------------

# (fixture, is an srun task): a batch shell has SLURM_PROCID=0 and SLURM_NTASKS=4, an salloc shell
# SLURM_NTASKS=2, but neither is rank 0 of a world; `python -m hpctrain.worker` there must not wait
# for peers.
SHELLS = [
    ("batch_shell", False),
    ("uneven_batch_shell", False),
    ("het_batch_shell", False),
    ("salloc_shell", False),
    ("sbatch_gpus_per_task2_batch_shell", False),
    ("srun_step.rank0", True),
    ("salloc_step.rank1", True),
    ("srun_export_none.rank0", True),
]


@pytest.mark.parametrize("fixture, is_task", SHELLS)
def test_only_an_srun_task_is_a_rank(fixture: str, is_task: bool) -> None:
    env = captured(fixture)
    assert in_slurm_step(env) is is_task
    if not is_task:
        assert DistContext.from_env(env, cuda_devices=0).source == "single"


# ---- the step's place, fixture by fixture ----------------------------------------------------

# (fixture, rank, world size, local rank, local world size, rank 0's node or None, nodes)
PLACES = [
    ("srun_step.rank0", 0, 4, 0, 2, "node1", ["node1", "node2"]),
    ("srun_step.rank3", 3, 4, 1, 2, "node1", ["node1", "node2"]),
    # srun -E: SLURM_NTASKS stays the job's 4; the step has 2 tasks on node1.
    ("srun_E.rank1", 1, 2, 1, 2, "node1", ["node1"]),
    # srun -N1 -n1 -w node2 in a 2-node job: the step's node list, not the job's.
    ("srun_subset.rank0", 0, 1, 0, 1, "node2", ["node2"]),
    ("salloc_step.rank1", 1, 2, 0, 1, "node1", ["node1", "node2"]),
    # -N2 -n3: 2 tasks on node1, 1 on node2 (SLURM_STEP_TASKS_PER_NODE=2,1).
    ("uneven_step.rank1", 1, 3, 1, 2, "node1", ["node1", "node2"]),
    ("uneven_step.rank2", 2, 3, 0, 1, "node1", ["node1", "node2"]),
    # Heterogeneous jobs: rank 0 may sit on any node (het2: node3 while the list says node[1-3]);
    # only rank 0 can tell its address, so none is derived here.
    ("het_step.rank2", 2, 3, 0, 1, None, ["node1", "node2", "node3"]),
    ("het2_step.rank0", 0, 3, 0, 1, None, ["node1", "node2", "node3"]),
    ("het2_step.rank1", 1, 3, 0, 1, None, ["node1", "node2", "node3"]),
    ("het_group1_step.rank0", 0, 2, 0, 1, None, ["node2", "node3"]),
]


@pytest.mark.parametrize("fixture, rank, world, local, local_world, master, nodes", PLACES)
def test_place_from_captured_step(
    fixture: str, rank: int, world: int, local: int, local_world: int, master: str | None, nodes: list[str]
) -> None:
    p = place(captured(fixture))
    assert (p.rank, p.world_size, p.local_rank, p.local_world_size) == (rank, world, local, local_world)
    assert p.master_addr == master and list(p.nodes) == nodes


def test_context_from_a_captured_step_meets_through_the_run_dir() -> None:
    ctx = DistContext.from_env(captured("srun_step.rank3"), cuda_devices=0)
    assert (ctx.source, ctx.rank, ctx.world_size, ctx.local_rank, ctx.local_world_size) == ("slurm", 3, 4, 1, 2)
    assert ctx.init_method == PORT_FILE and ctx.master_port is None
    assert (ctx.node, ctx.life.job_id, ctx.step_id, ctx.master_addr) == ("node2", "1", "0", "node1")
    assert ctx.device == torch.device("cpu") and ctx.gpu == "1"


def test_an_array_tasks_context_names_its_life_as_slurm_commands_do(tmp_path: Path) -> None:
    # Task 7 of array 36 runs as job 44: events and the rendezvous name it `36_7`, so two tasks
    # never share a port file, and a requeued life (restart 1) never reads the previous one's.
    env = captured("srun_step.rank3", SLURM_JOB_ID="44", SLURM_ARRAY_JOB_ID="36", SLURM_ARRAY_TASK_ID="7")
    ctx = DistContext.from_env(env, cuda_devices=0)
    assert (ctx.life.job_id, ctx.life.restart, ctx.life.number) == ("36_7", 0, "44")
    requeued = DistContext.from_env({**env, "SLURM_RESTART_COUNT": "1"}, cuda_devices=0)
    other_task = DistContext.from_env({**env, "SLURM_JOB_ID": "45", "SLURM_ARRAY_TASK_ID": "8"}, cuda_devices=0)
    ports = {port_file(tmp_path, c.life.job_id or "", c.life.restart, c.step_id) for c in (ctx, requeued, other_task)}
    assert {p.name for p in ports} == {"36_7.r0.s0.port", "36_7.r1.s0.port", "36_8.r0.s0.port"}


def test_master_port_makes_env_rendezvous_with_the_sites_suffix() -> None:
    ctx = DistContext.from_env(captured("srun_step.rank3", MASTER_PORT="23456"), cuda_devices=0)
    assert ctx.init_method == "env://" and ctx.master_port == 23456
    assert env_master_addr(ctx, NetworkConfig(master_addr_suffix="-ib")) == "node1-ib"


@pytest.mark.parametrize(
    "fixture, network, says",
    [
        ("het2_step.rank1", NetworkConfig(), "heterogeneous"),
        ("srun_step.rank1", NetworkConfig(master_addr_ifname="ib0"), "master_addr_ifname"),
    ],
)
def test_master_port_refused_where_only_rank0_knows_its_address(
    fixture: str, network: NetworkConfig, says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    ctx = DistContext.from_env(captured(fixture, MASTER_PORT="23456"), cuda_devices=0)
    with pytest.raises(SlurmEnvError, match=f"{says}.*unset MASTER_PORT"):
        env_master_addr(ctx, network)


def test_torchrun_variables_win_over_slurm() -> None:
    env = captured("srun_step.rank1", RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", MASTER_ADDR="h", MASTER_PORT="1")
    assert DistContext.from_env(env, cuda_devices=0).source == "torchrun"


# ---- GPUs ------------------------------------------------------------------------------------


def test_gpus_per_task_one_binds_the_tasks_own_device() -> None:
    # srun --gpus-per-task=1: task 1 sees only GPU 1, as device 0.
    ctx = DistContext.from_env(captured("srun_gpus_per_task1.rank1"), cuda_devices=1)
    assert ctx.device == torch.device("cuda", 0) and ctx.gpu == "1"


def test_all_of_the_nodes_gpus_visible_binds_local_rank() -> None:
    ctx = DistContext.from_env(captured("srun_step.rank3"), cuda_devices=2)
    assert ctx.device == torch.device("cuda", 1) and ctx.gpu == "1"


@pytest.mark.parametrize(
    "fixture, changes, key",
    [
        ("sbatch_gpus_per_task2_step.rank0", {}, "SLURM_GPUS_PER_TASK=2"),
        ("srun_export_none.rank0", {}, "SLURM_GPUS_PER_TASK=2"),  # Slurm sets it even then
        ("srun_step.rank0", {"SLURM_GPUS_PER_TASK": "a100:4"}, "SLURM_GPUS_PER_TASK=a100:4"),
        ("srun_gpus_per_task1.rank1", {"SLURMD_TRES_BIND": "gpu:per_task:2"}, "SLURMD_TRES_BIND"),
    ],
)
def test_several_gpus_per_task_refused_by_key(fixture: str, changes: dict[str, str], key: str) -> None:
    with pytest.raises(SlurmEnvError, match=f"{key}.*one process per GPU"):
        place(captured(fixture, **changes))


def test_the_worker_says_why_it_cannot_start_without_a_traceback(tmp_path: Path) -> None:
    env = {**captured("sbatch_gpus_per_task2_step.rank0"), "PATH": os.environ["PATH"]}
    done = subprocess.run(
        [sys.executable, "-m", "hpctrain.worker", str(tmp_path)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == WORKER_USER_ERROR, done.stderr
    assert done.stderr.startswith("error: SLURM_GPUS_PER_TASK=2 (--gpus-per-task)") and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "visible, local_rank, gpu",
    [
        (None, 0, None),
        ("", 0, None),
        ("3", 0, "3"),
        ("3", 1, "3"),
        ("0,1", 1, "1"),
        ("4,5,6,7", 2, "6"),
        ("0,1", 5, None),
    ],
)
def test_visible_gpu(visible: str | None, local_rank: int, gpu: str | None) -> None:
    assert visible_gpu(visible, local_rank) == gpu


# ---- environments that do not add up: said plainly, naming the variable -----------------------

BROKEN = [
    ({"SLURM_STEP_NODELIST": "node[1-2"}, "SLURM_STEP_NODELIST='node\\[1-2'.*not closed"),
    ({"SLURM_STEP_NODELIST": "node[2-1]"}, "SLURM_STEP_NODELIST.*backwards"),
    ({"SLURM_STEP_NODELIST": ",,"}, "SLURM_STEP_NODELIST.*names no node"),
    ({"SLURM_STEP_TASKS_PER_NODE": "2(x3)"}, "SLURM_STEP_TASKS_PER_NODE='2\\(x3\\)' does not describe 4"),
    ({"SLURM_STEP_TASKS_PER_NODE": "two"}, "SLURM_STEP_TASKS_PER_NODE='two': cannot read"),
    ({"SLURM_STEP_NUM_TASKS": "four"}, "SLURM_STEP_NUM_TASKS='four' is not an integer"),
    ({"SLURM_PROCID": "9", "SLURM_STEP_TASKS_PER_NODE": "2(x2)"}, "SLURM_PROCID=9 is outside"),
    ({"SLURM_NODEID": "5"}, "SLURM_NODEID=5"),
]


@pytest.mark.parametrize("changes, message", BROKEN)
def test_broken_step_environment_names_the_variable(changes: dict[str, str], message: str) -> None:
    with pytest.raises(SlurmEnvError, match=message):
        place(captured("srun_step.rank3", **changes))


def test_a_heterogeneous_step_without_gtids_is_said_plainly() -> None:
    with pytest.raises(SlurmEnvError, match="SLURM_GTIDS"):
        place(captured("het2_step.rank1", SLURM_GTIDS=None))


@pytest.mark.parametrize(
    "value, expected",
    [("1", [1]), ("2(x3)", [2, 2, 2]), ("2(x3),1", [2, 2, 2, 1]), ("8(x2),4,2(x2)", [8, 8, 4, 2, 2])],
)
def test_tasks_per_node(value: str, expected: list[int]) -> None:
    assert tasks_per_node(value) == expected


@pytest.mark.parametrize("bad", ["", "x", "2(3)", "2(x)", "(x2)"])
def test_tasks_per_node_rejects_garbage(bad: str) -> None:
    with pytest.raises(ValueError, match="SLURM_TASKS_PER_NODE"):
        tasks_per_node(bad)


def test_step_nodelist_wins_over_job_nodelist() -> None:
    assert node_list(captured("srun_subset.rank0")) == ["node2"]
    assert node_list(captured("batch_shell")) == ["node1", "node2"]
