"""The distributed context: who a process is, from the environment, and which device it drives."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from hpctrain.dist import context as hdist
from hpctrain.dist.context import DistContext, backend_for, select_device

TORCHRUN_ENV = {
    "RANK": "5",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "8",
    "LOCAL_WORLD_SIZE": "4",
    "MASTER_ADDR": "node-a",
    "MASTER_PORT": "29511",
}


# from_env ------------------------------------------------------------------------------------


def test_torchrun_variables_become_the_context() -> None:
    ctx = DistContext.from_env(TORCHRUN_ENV, cuda_devices=0)
    assert (ctx.rank, ctx.local_rank, ctx.world_size, ctx.local_world_size) == (5, 1, 8, 4)
    assert ctx.source == "torchrun"
    assert ctx.init_method == "env://"
    assert (ctx.master_addr, ctx.master_port) == ("node-a", 29511)
    assert ctx.device == torch.device("cpu")
    assert ctx.distributed and not ctx.is_main


def test_torchrun_rank_zero_is_main() -> None:
    env = {**TORCHRUN_ENV, "RANK": "0", "LOCAL_RANK": "0"}
    assert DistContext.from_env(env, cuda_devices=0).is_main


@pytest.mark.parametrize(
    "cuda_devices, device",
    [(0, torch.device("cpu")), (1, torch.device("cuda", 0)), (4, torch.device("cuda", 1))],
)
def test_torchrun_device_follows_the_local_rank(cuda_devices: int, device: torch.device) -> None:
    assert DistContext.from_env(TORCHRUN_ENV, cuda_devices=cuda_devices).device == device


def test_torchrun_minimal_variables_get_defaults() -> None:
    ctx = DistContext.from_env({"RANK": "0", "WORLD_SIZE": "1"}, cuda_devices=0)
    assert (ctx.rank, ctx.local_rank, ctx.world_size, ctx.local_world_size) == (0, 0, 1, 1)
    assert ctx.master_port is None and ctx.master_addr is None
    # One torchrun process still joins a (one-member) group: torchrun expects it.
    assert ctx.source == "torchrun" and ctx.distributed


@pytest.mark.parametrize("env", [{}, {"RANK": "3"}, {"WORLD_SIZE": "4"}, {"LOCAL_RANK": "1"}])
def test_without_rank_and_world_size_it_is_a_single_process(env: dict[str, str]) -> None:
    ctx = DistContext.from_env(env, cuda_devices=0)
    assert ctx.source == "single"
    assert (ctx.rank, ctx.local_rank, ctx.world_size, ctx.local_world_size) == (0, 0, 1, 1)
    assert not ctx.distributed and ctx.is_main
    assert ctx.device == torch.device("cpu")


def test_single_process_drives_the_first_gpu_when_there_is_one() -> None:
    assert DistContext.from_env({}, cuda_devices=2).device == torch.device("cuda", 0)


@pytest.mark.parametrize("key", ["RANK", "WORLD_SIZE"])
def test_a_non_integer_variable_is_named(key: str) -> None:
    with pytest.raises(ValueError, match=key):
        DistContext.from_env({**TORCHRUN_ENV, key: "two"}, cuda_devices=0)


# select_device, backend_for ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "local_rank, local_world_size, cuda_devices, expected",
    [
        (0, 1, 0, torch.device("cpu")),
        (3, 4, 0, torch.device("cpu")),
        # One visible device (srun --gpus-per-task=1): it is this task's, whatever the rank.
        (0, 4, 1, torch.device("cuda", 0)),
        (3, 4, 1, torch.device("cuda", 0)),
        # All of the node's devices visible: device LOCAL_RANK.
        (0, 4, 4, torch.device("cuda", 0)),
        (2, 4, 4, torch.device("cuda", 2)),
        (3, 4, 4, torch.device("cuda", 3)),
    ],
)
def test_select_device(local_rank: int, local_world_size: int, cuda_devices: int, expected: torch.device) -> None:
    assert select_device(local_rank, local_world_size, cuda_devices) == expected


@pytest.mark.parametrize("local_rank, cuda_devices", [(2, 2), (7, 4)])
def test_a_local_rank_without_a_gpu_is_refused(local_rank: int, cuda_devices: int) -> None:
    with pytest.raises(ValueError) as error:
        select_device(local_rank, 8, cuda_devices)
    assert "ntasks_per_node" in str(error.value)
    assert str(local_rank) in str(error.value)


@pytest.mark.parametrize(
    "device, requested, backend",
    [
        (torch.device("cpu"), "auto", "gloo"),
        (torch.device("cuda", 0), "auto", "nccl"),
        (torch.device("cuda", 1), "gloo", "gloo"),
        (torch.device("cpu"), "nccl", "nccl"),  # asked for explicitly: passed through
    ],
)
def test_backend_for(device: torch.device, requested: str, backend: str) -> None:
    assert backend_for(device, requested) == backend


# for_spawn and joining the group ---------------------------------------------------------------


def test_for_spawn_rendezvous_through_a_file_and_no_port(tmp_path: Path) -> None:
    store = tmp_path / "store"
    ctx = DistContext.for_spawn(1, 2, str(store), cuda_devices=0)
    assert ctx.init_method == f"file://{store}"
    assert ctx.master_port is None and ctx.master_addr is None
    assert (ctx.rank, ctx.local_rank, ctx.world_size, ctx.local_world_size) == (1, 1, 2, 2)
    assert ctx.source == "spawn" and ctx.distributed and not ctx.is_main
    assert ctx.device == torch.device("cpu")
    assert DistContext.for_spawn(1, 2, str(store), cuda_devices=2).device == torch.device("cuda", 1)


def test_a_single_process_joins_no_group(tmp_path: Path) -> None:
    hdist.init_process_group(DistContext.single(cuda_devices=0), "auto", 30, tmp_path)
    assert not dist.is_initialized()


def test_a_spawned_context_joins_through_its_file_store(tmp_path: Path) -> None:
    # A world of one: joins in this process, over gloo (auto on CPU), with no port anywhere.
    ctx = DistContext.for_spawn(0, 1, str(tmp_path / "store"), cuda_devices=0)
    assert not dist.is_initialized()
    hdist.init_process_group(ctx, "auto", 30, tmp_path)
    try:
        assert dist.is_initialized()
        assert dist.get_backend() == "gloo"
        assert (dist.get_rank(), dist.get_world_size()) == (0, 1)
        t = torch.ones(2)
        dist.all_reduce(t)
        assert t.tolist() == [1.0, 1.0]
    finally:
        hdist.destroy_process_group()
    assert not dist.is_initialized()
    hdist.destroy_process_group()  # a second call is a no-op
