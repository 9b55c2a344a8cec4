"""Slurm environment -> distributed context: tables of real-world forms."""

from __future__ import annotations

import pytest
import torch

from hpctrain.dist import PORT_FILE, DistContext, visible_gpu
from hpctrain.slurm.env import node_list, place, tasks_per_node


@pytest.mark.parametrize(
    "value, expected",
    [
        ("1", [1]),
        ("4", [4]),
        ("2(x3)", [2, 2, 2]),
        ("2(x3),1", [2, 2, 2, 1]),
        ("8(x2),4,2(x2)", [8, 8, 4, 2, 2]),
    ],
)
def test_tasks_per_node(value: str, expected: list[int]) -> None:
    assert tasks_per_node(value) == expected


@pytest.mark.parametrize("bad", ["", "x", "2(3)", "2(x)", "(x2)"])
def test_tasks_per_node_rejects_garbage(bad: str) -> None:
    with pytest.raises(ValueError, match="SLURM_TASKS_PER_NODE"):
        tasks_per_node(bad)


@pytest.mark.parametrize(
    "nodelist, first",
    [
        ("node1", "node1"),
        ("node[1-3]", "node1"),
        ("gpu-[001-003,010],login1", "gpu-001"),
        ("a[07,3-4]", "a07"),
        ("login1,gpu-[001-002]", "login1"),
        ("rack1-n[9-10]", "rack1-n9"),
    ],
)
def test_master_addr_is_first_host(nodelist: str, first: str) -> None:
    assert node_list({"SLURM_JOB_NODELIST": nodelist})[0] == first


def test_step_nodelist_wins_over_job_nodelist() -> None:
    # After a hot-spare relaunch the step runs on a subset of the job's nodes.
    env = {"SLURM_JOB_NODELIST": "n[1-4]", "SLURM_STEP_NODELIST": "n[3-4]"}
    assert node_list(env) == ["n3", "n4"]


def slurm_env(**extra: str) -> dict[str, str]:
    env = {
        "SLURM_JOB_ID": "4242",
        "SLURM_PROCID": "5",
        "SLURM_NTASKS": "7",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "2",
        "SLURM_TASKS_PER_NODE": "2(x3),1",
        "SLURM_JOB_NODELIST": "gpu-[001-003,010]",
        "SLURMD_NODENAME": "gpu-003",
        "SLURM_STEP_ID": "0",
    }
    env.update(extra)
    return env


def test_place_reads_every_field() -> None:
    p = place(slurm_env())
    assert (p.rank, p.world_size, p.local_rank, p.local_world_size, p.node_index) == (5, 7, 1, 2, 2)
    assert p.master_addr == "gpu-001"
    assert p.job_id == "4242"
    # The last node runs a single task.
    assert place(slurm_env(SLURM_NODEID="3", SLURM_LOCALID="0", SLURM_PROCID="6")).local_world_size == 1


def test_context_from_slurm_uses_port_file_without_master_port() -> None:
    ctx = DistContext.from_env(slurm_env(), cuda_devices=0)
    assert ctx.source == "slurm"
    assert (ctx.rank, ctx.world_size, ctx.local_rank, ctx.local_world_size) == (5, 7, 1, 2)
    assert ctx.master_addr == "gpu-001"
    assert ctx.init_method == PORT_FILE and ctx.master_port is None
    assert ctx.node == "gpu-003"
    assert ctx.device == torch.device("cpu")


def test_context_from_slurm_with_master_port_uses_env() -> None:
    ctx = DistContext.from_env(slurm_env(MASTER_PORT="23456"), cuda_devices=0)
    assert ctx.init_method == "env://" and ctx.master_port == 23456


def test_torchrun_variables_win_over_slurm() -> None:
    env = slurm_env(RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="2", MASTER_ADDR="h", MASTER_PORT="1")
    ctx = DistContext.from_env(env, cuda_devices=0)
    assert ctx.source == "torchrun" and ctx.world_size == 2


def test_batch_shell_alone_is_not_a_step() -> None:
    # The batch script has SLURM_JOB_ID but no task identity: a single process, not rank 0 of 7.
    env = {"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n1"}
    assert DistContext.from_env(env, cuda_devices=0).source == "single"


@pytest.mark.parametrize(
    "visible, local_rank, gpu",
    [
        (None, 0, None),
        ("", 0, None),
        ("3", 0, "3"),  # --gpus-per-task=1: the one device it sees
        ("3", 1, "3"),
        ("0,1", 1, "1"),  # all of the node's devices: the LOCAL_RANK-th
        ("4,5,6,7", 2, "6"),
        ("0,1", 5, None),
    ],
)
def test_visible_gpu(visible: str | None, local_rank: int, gpu: str | None) -> None:
    assert visible_gpu(visible, local_rank) == gpu


def test_gpu_binding_per_task_and_all_visible() -> None:
    per_task = DistContext.from_env(slurm_env(CUDA_VISIBLE_DEVICES="1"), cuda_devices=1)
    assert per_task.device == torch.device("cuda", 0) and per_task.gpu == "1"
    all_visible = DistContext.from_env(slurm_env(CUDA_VISIBLE_DEVICES="0,1"), cuda_devices=2)
    assert all_visible.device == torch.device("cuda", 1) and all_visible.gpu == "1"
