"""The newest checkpoint read and hashed while the rendezvous forms (hpctrain.checkpoint.read_ahead):
which files each rank reads, the checksum the check then finds already taken, and never a stale one."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest

from hpctrain.checkpoint import read_ahead, store


@pytest.fixture(autouse=True)
def _no_reader_left() -> object:
    yield
    read_ahead.stop()


def plain_checkpoint(folder: Path, step: int, data: bytes) -> Path:
    """A published plain checkpoint as the store writes it (its .json last)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"step_{step:08d}.pt"
    path.write_bytes(data)
    meta = {"step": step, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (folder / f"step_{step:08d}.json").write_text(json.dumps(meta))
    return path


def sharded_checkpoint(folder: Path, step: int, names: list[str]) -> Path:
    shards = folder / f"step_{step:08d}.dcp"
    shards.mkdir(parents=True)
    files = {}
    for name in names:
        (shards / name).write_bytes(name.encode() * 100)
        files[name] = [len(name) * 100, hashlib.sha256(name.encode() * 100).hexdigest()]
    (folder / f"step_{step:08d}.json").write_text(json.dumps({"step": step, "files": files}))
    return shards


def finished(reader: object) -> None:
    assert reader is not None
    reader.join(timeout=30)  # type: ignore[attr-defined]
    assert not reader.is_alive()  # type: ignore[attr-defined]


def test_each_rank_reads_what_it_will_check_or_load(tmp_path: Path) -> None:
    assert read_ahead.files_to_read(tmp_path / "none", 0, 2) == ([], [])
    plain_checkpoint(tmp_path / "plain", 20, b"older")
    newest = plain_checkpoint(tmp_path / "plain", 40, b"newest")
    # Rank 0 checks the newest .pt (store.verify); the others only load it.
    assert read_ahead.files_to_read(tmp_path / "plain", 0, 2) == ([newest], [])
    assert read_ahead.files_to_read(tmp_path / "plain", 1, 2) == ([], [newest])
    # Sharded: every rank hashes every ranks-th file of the list, as shard_files.file_problem checks.
    shards = sharded_checkpoint(tmp_path / "sharded", 60, [".metadata", "__0_0.distcp", "__1_0.distcp"])
    assert read_ahead.files_to_read(tmp_path / "sharded", 0, 2) == (
        [shards / ".metadata", shards / "__1_0.distcp"],
        [],
    )
    assert read_ahead.files_to_read(tmp_path / "sharded", 1, 2) == ([shards / "__0_0.distcp"], [])


def test_the_check_finds_the_checksum_taken_ahead(tmp_path: Path) -> None:
    data = os.urandom(3 << 20)
    path = plain_checkpoint(tmp_path, 40, data)
    finished(read_ahead.start(tmp_path, 0, 1))
    # The file rewritten in place with other bytes of the same size and its old mtime: only the
    # remembered checksum can still say the old bytes' digest, so the check did not read it again.
    stat = path.stat()
    with open(path, "r+b") as file:
        file.write(b"\0" * len(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert store.sha256_of(path) == hashlib.sha256(data).hexdigest()


def test_a_file_changed_after_the_read_ahead_is_hashed_again(tmp_path: Path) -> None:
    data = os.urandom(1 << 20)
    path = plain_checkpoint(tmp_path, 40, data)
    finished(read_ahead.start(tmp_path, 0, 1))
    time.sleep(0.01)
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # one bit flipped, written again
    with pytest.raises(ValueError, match="checksum mismatch"):
        store.verify(store.paths_for(tmp_path, 40))


def test_a_check_waits_for_the_reader_hashing_its_file(tmp_path: Path) -> None:
    data = os.urandom(64 << 20)
    path = plain_checkpoint(tmp_path, 40, data)
    reader = read_ahead.start(tmp_path, 0, 1)
    assert store.verify(store.paths_for(tmp_path, 40))["sha256"] == hashlib.sha256(data).hexdigest()
    finished(reader)
    assert store.sha256_of(path) == hashlib.sha256(data).hexdigest()


def test_stopped_the_reader_ends_and_a_waiting_check_hashes_itself(tmp_path: Path) -> None:
    data = os.urandom(256 << 20)
    path = plain_checkpoint(tmp_path, 40, data)
    reader = read_ahead.start(tmp_path, 0, 1)
    assert reader is not None
    read_ahead.stop()
    reader.join(timeout=5)
    assert not reader.is_alive()
    # It stopped within a block or two, remembering no checksum: the same size and mtime with
    # other bytes read as those bytes.
    stat = path.stat()
    with open(path, "r+b") as file:
        file.write(b"\0" * (1 << 20))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert store.sha256_of(path) == hashlib.sha256(b"\0" * (1 << 20) + data[1 << 20 :]).hexdigest()
