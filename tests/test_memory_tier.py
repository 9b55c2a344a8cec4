"""The in-memory tier, a rank's side (hpctrain.checkpoint.memory_tier): a real model's state copied
to two real holder processes and read back bit-identical, whichever holder is left; the plan and
the fallback to the disk as tables."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch
from helpers import memory_holders
from torch import nn

from hpctrain.checkpoint import rng
from hpctrain.checkpoint.memory_client import HolderClient, holder_addresses
from hpctrain.checkpoint.memory_restore import plan, restore
from hpctrain.checkpoint.memory_tier import MemoryTier
from hpctrain.checkpoint.restore_point import HeldCopy, RestorePoint
from hpctrain.dist.context import DistContext

SINGLE = DistContext(
    rank=0, local_rank=0, world_size=1, local_world_size=1, init_method="", device=torch.device("cpu"), source="single"
)


def trained(steps: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(8, 16)).square().mean().backward()
        optimizer.step()
    return model, optimizer


def clients(run_dir: Path) -> dict[str, HolderClient]:
    return {
        node: HolderClient(a, memory_holders.TOKEN, timeout_s=2.0)
        for node, a in holder_addresses(run_dir / "memory").items()
    }


def assert_same_tensors(a: object, b: object) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b) and a.dtype == b.dtype
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys()
        for key in a:
            assert_same_tensors(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b)
        for x, y in zip(a, b):
            assert_same_tensors(x, y)
    else:
        assert a == b


@pytest.mark.parametrize("lost", [(), ("n1",), ("n2",)])
def test_a_state_sent_to_two_holders_comes_back_bit_identical_from_either(
    tmp_path: Path, lost: tuple[str, ...]
) -> None:
    run_dir = tmp_path / "run"
    with memory_holders.holders(run_dir) as processes:
        model, optimizer = trained(3)
        tier = MemoryTier(SINGLE, 1, clients(run_dir).values(), model, optimizer, fingerprint="f1")
        for step in (1, 2, 3):
            tier.stepped(step, lambda: {"train": {"step": step}})  # noqa: B023 (called at once)
            tier.wait()
        expected_rng = rng.capture()
        assert tier.counts.sent == 3 and tier.counts.newest == 3 and tier.counts.failed == 0
        for node in lost:
            processes[node].send_signal(signal.SIGKILL)
            processes[node].wait()

        point, state = restore(SINGLE, clients(run_dir), newest_on_disk=lambda: 2)
    assert point == RestorePoint("memory", 3)
    assert state is not None and state["train"] == {"step": 3} and state["fingerprint"] == "f1"
    assert_same_tensors(state["model"], model.state_dict())
    assert_same_tensors(state["optimizer"], optimizer.state_dict())
    assert_same_tensors(state["rng"], expected_rng)


def test_with_both_holders_gone_the_disk(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with memory_holders.holders(run_dir) as processes:
        model, optimizer = trained(1)
        tier = MemoryTier(SINGLE, 1, clients(run_dir).values(), model, optimizer, fingerprint="f1")
        tier.stepped(1, lambda: {})
        tier.wait()
        for process in processes.values():
            process.kill()
            process.wait()
        assert restore(SINGLE, clients(run_dir), newest_on_disk=lambda: 0) == (RestorePoint("disk", 0), None)
        assert restore(SINGLE, clients(run_dir), newest_on_disk=lambda: None) == (RestorePoint("none", 0), None)


def test_a_copy_not_due_or_still_on_its_way_is_not_taken(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with memory_holders.holders(run_dir, nodes=("n1",)) as processes:
        model, optimizer = trained(1)
        tier = MemoryTier(SINGLE, 2, clients(run_dir).values(), model, optimizer, fingerprint="f1")
        tier.stepped(1, lambda: {})  # not due: every 2 steps
        assert tier.sender is None
        processes["n1"].send_signal(signal.SIGSTOP)  # the holder frozen: the copy of step 2 waits on it
        try:
            tier.stepped(2, lambda: {})
            tier.stepped(4, lambda: {})  # step 2's copy still on its way: this one is skipped, not waited for
            assert tier.counts.skipped == 1
        finally:
            processes["n1"].send_signal(signal.SIGCONT)
        tier.wait()
        assert (tier.counts.sent, tier.counts.newest) == (1, 2)
        tier.close()


def test_a_holder_that_refuses_costs_the_copy_not_the_step(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    run_dir = tmp_path / "run"
    with memory_holders.holders(run_dir, nodes=("n1",), max_bytes=1000):  # far under the state's size
        model, optimizer = trained(1)
        tier = MemoryTier(SINGLE, 1, clients(run_dir).values(), model, optimizer, fingerprint="f1")
        tier.stepped(1, lambda: {})
        tier.wait()
        tier.stepped(2, lambda: {})
        tier.wait()
    assert tier.counts.failed == 2 and tier.counts.sent == 0 and tier.counts.newest is None
    warned = [r.getMessage() for r in caplog.records if "memory tier" in r.getMessage()]
    assert len(warned) == 1 and "does not fit in the holder's 1000 bytes" in warned[0], warned


@pytest.mark.parametrize(
    ("copies", "lost", "disk", "point", "where"),
    [
        # each rank fetched from the first node (by name) that has its copy
        (
            [HeldCopy(0, 5, "n2"), HeldCopy(0, 5, "n1"), HeldCopy(1, 5, "n2"), HeldCopy(1, 5, "n3")],
            [],
            4,
            RestorePoint("memory", 5),
            {0: "n1", 1: "n2"},
        ),
        # never from a node that did not answer
        (
            [HeldCopy(0, 5, "n1"), HeldCopy(0, 5, "n2"), HeldCopy(1, 5, "n2")],
            ["n1"],
            4,
            RestorePoint("memory", 5),
            {0: "n2", 1: "n2"},
        ),
        # the disk: nothing to fetch
        ([HeldCopy(0, 3, "n1"), HeldCopy(1, 3, "n1")], [], 4, RestorePoint("disk", 4), {}),
    ],
)
def test_the_plan_names_a_live_holder_for_each_rank(
    copies: list[HeldCopy], lost: list[str], disk: int, point: RestorePoint, where: dict[int, str]
) -> None:
    assert plan(2, copies, lost, disk) == (point, where)


def test_a_tier_that_would_take_over_half_the_nodes_memory_turns_itself_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    run_dir = tmp_path / "run"
    with memory_holders.holders(run_dir, nodes=("n1",)):
        model, optimizer = trained(1)
        # The node's MemAvailable as a node with only 4 kB left would show it.
        monkeypatch.setattr("hpctrain.checkpoint.memory_tier.available_bytes", lambda: 4096)
        tier = MemoryTier(SINGLE, 1, clients(run_dir).values(), model, optimizer, fingerprint="f1")
        tier.stepped(1, lambda: {})
        tier.stepped(2, lambda: {})
        tier.wait()
        assert tier.sender is None and tier.every == 0 and tier.counts.sent == 0
        assert clients(run_dir)["n1"].listing() == []  # nothing sent
    (warned,) = [r.getMessage() for r in caplog.records if "memory tier off" in r.getMessage()]
    assert "more than half the 0.00 GB the node has available" in warned and "trainer.memory_ckpt_every=0" in warned
