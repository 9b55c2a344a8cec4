"""The memory holders of the in-memory tier (hpctrain.recovery.memory_holder): the store's policy
as tables, then real holder processes spoken to over TCP by the rank's client."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import memory_holders

from hpctrain.checkpoint.memory_client import HolderClient, holder_addresses
from hpctrain.checkpoint.restore_point import HeldCopy, restore_point
from hpctrain.recovery.memory_holder import CopyStore, Refused
from hpctrain.run import memory_wire as wire


def put(store: CopyStore, rank: int, step: int, size: int) -> None:
    payload = bytes([step % 256]) * size
    store.put(rank, step, payload, wire.crc32(payload))


@pytest.mark.parametrize(
    ("puts", "keep", "max_bytes", "held"),
    [
        # the newest `keep` steps of each rank
        ([(0, 1, 10), (0, 2, 10), (0, 3, 10), (1, 1, 10)], 2, 0, [[0, 2, 10], [0, 3, 10], [1, 1, 10]]),
        ([(0, 1, 10), (0, 2, 10)], 1, 0, [[0, 2, 10]]),
        # a step sent again replaces its copy
        ([(0, 5, 10), (0, 5, 20)], 2, 0, [[0, 5, 20]]),
        # the bound: the rank's own oldest dropped to make room, others' copies kept
        ([(1, 1, 40), (0, 1, 30), (0, 2, 40)], 3, 100, [[0, 2, 40], [1, 1, 40]]),
        ([(0, 1, 50), (0, 2, 50)], 2, 100, [[0, 1, 50], [0, 2, 50]]),  # exactly the bound fits
    ],
)
def test_a_holder_keeps_each_ranks_newest_steps_within_its_bound(
    puts: list[tuple[int, int, int]], keep: int, max_bytes: int, held: list[list[int]]
) -> None:
    store = CopyStore(keep=keep, max_bytes=max_bytes)
    for rank, step, size in puts:
        put(store, rank, step, size)
    assert store.listing() == held
    assert store.held_bytes == sum(size for _, _, size in held)


def test_a_copy_that_cannot_fit_is_refused_and_drops_nothing() -> None:
    store = CopyStore(keep=2, max_bytes=100)
    put(store, 1, 1, 60)
    put(store, 0, 1, 30)
    with pytest.raises(
        Refused, match=r"rank 0 step 2: a copy of 50 bytes .* 100 bytes \(60 held for other ranks\); raise"
    ):
        put(store, 0, 2, 50)
    assert store.listing() == [[0, 1, 30], [1, 1, 60]]  # rank 0's older copy is still whole


def test_a_damaged_copy_is_refused() -> None:
    store = CopyStore()
    with pytest.raises(Refused, match="damaged"):
        store.put(0, 1, b"state", wire.crc32(b"other"))
    assert store.listing() == []


@pytest.fixture
def holders(tmp_path: Path) -> Iterator[tuple[Path, dict[str, subprocess.Popen[bytes]]]]:
    """Two real holders, as nodes n1 and n2 of one life (token "life-1")."""
    run_dir = tmp_path / "run"
    with memory_holders.holders(run_dir) as started:
        yield run_dir, started


def test_a_ranks_state_kept_on_two_holders_survives_either(holders) -> None:
    run_dir, processes = holders
    addresses = holder_addresses(run_dir / "memory")
    assert set(addresses) == {"n1", "n2"}
    own, partner = (HolderClient(addresses[node], "life-1") for node in ("n1", "n2"))
    states = {step: os.urandom(4 << 20) for step in (41, 42, 43)}  # a few MB each
    for step, state in states.items():
        for client in (own, partner):
            spent = client.put(0, step, state)
            assert 0 < spent < 1.0, spent  # the holder's CPU for receiving and checking 4 MB
    assert own.listing() == [HeldCopy(0, 42, "n1"), HeldCopy(0, 43, "n1")]  # the newest two
    assert bytes(partner.get(0, 43)) == states[43]

    processes["n1"].send_signal(signal.SIGKILL)  # the rank's own node lost
    processes["n1"].wait()
    with pytest.raises(OSError):
        own.listing()
    survivors = partner.listing()
    assert restore_point(1, survivors, lost=["n1"], newest_on_disk=40).step == 43
    assert bytes(HolderClient(addresses["n2"], "life-1").get(0, 43)) == states[43]


def test_a_holder_answers_its_own_life_only_and_says_what_it_lacks(holders) -> None:
    run_dir, _ = holders
    address = holder_addresses(run_dir / "memory")["n1"]
    with pytest.raises(wire.WireError, match="another life of the job"):
        HolderClient(address, "life-0").listing()
    client = HolderClient(address, "life-1")
    with pytest.raises(wire.WireError, match="no copy of rank 0 at step 7 on n1"):
        client.get(0, 7)
    with pytest.raises(wire.WireError, match="does not fit in the holder's"):
        client.put(0, 1, b"x" * ((64 << 20) + 1))
    client.put(0, 1, b"small")  # the connection goes on after a refusal
    assert client.listing() == [HeldCopy(0, 1, "n1")]


def test_a_holder_that_stopped_answering_costs_the_rank_its_timeout_only(holders) -> None:
    run_dir, processes = holders
    address = holder_addresses(run_dir / "memory")["n2"]
    client = HolderClient(address, "life-1", timeout_s=1.0)
    client.put(0, 1, b"state")
    processes["n2"].send_signal(signal.SIGSTOP)  # frozen, as a node that died without a word
    try:
        began = time.monotonic()
        with pytest.raises(OSError):
            client.put(0, 2, b"x" * (8 << 20))
        assert time.monotonic() - began < 5.0
    finally:
        processes["n2"].send_signal(signal.SIGCONT)


def test_a_holder_without_a_token_refuses_to_start(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != wire.TOKEN_ENV}
    done = subprocess.run(
        [sys.executable, "-m", "hpctrain.recovery.memory_holder", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and wire.TOKEN_ENV in done.stderr
    assert not (tmp_path / "memory").exists()
