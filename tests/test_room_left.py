"""A run dir whose filesystem is full (ENOSPC) or whose quota is spent (EDQUOT): told apart from
other write errors, and probed for room before the guardian submits a job into it."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.disks import small_tmpfs

from hpctrain.run.paths import RunDir, no_room, no_room_message


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path / "disk", "256k") as mount:
        yield mount


@pytest.mark.parametrize(
    ("error", "full"),
    [
        (OSError(errno.ENOSPC, "No space left on device"), True),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), True),
        (OSError(errno.EACCES, "Permission denied"), False),
        (OSError(errno.EIO, "Input/output error"), False),
        (ValueError("no"), False),
    ],
)
def test_only_a_full_disk_or_quota_is_no_room(error: BaseException, full: bool) -> None:
    assert no_room(error) is full


def test_the_probe_finds_no_room_on_a_full_disk_and_leaves_nothing(tiny_disk: Path) -> None:
    run = RunDir(tiny_disk)
    assert run.room_left() is None
    filler = tiny_disk / "filler"
    with open(filler, "wb", buffering=0) as out:
        with pytest.raises(OSError):
            while True:
                out.write(b"\0" * 4096)
    full = run.room_left()
    assert full is not None and full.errno == errno.ENOSPC
    assert sorted(p.name for p in tiny_disk.iterdir()) == ["filler"]  # no probe left behind
    message = no_room_message(tiny_disk, full)
    assert "No space left on device" in message and f"hpctrain-submit --retry {tiny_disk}" in message
    filler.unlink()
    assert run.room_left() is None
