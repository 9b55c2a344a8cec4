"""The journal's lock where the filesystem has no flock (Lustre mounted `noflock`, some NFS mounts):
writers that check "is it recorded already?" and then append still never both write."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpctrain.run import jsonlines

# Each writer: flock fails as on a `noflock` mount, then under the lock it reads the file and
# appends its word only if no word is there yet, slowly enough that unlocked writers would overlap.
WRITER = """
import errno, fcntl, sys, time
from pathlib import Path
def no_flock(*_):
    raise OSError(errno.ENOSYS, "Function not implemented")
fcntl.flock = no_flock
from hpctrain.run.jsonlines import locked
path = Path(sys.argv[1])
start = float(sys.argv[2])
time.sleep(max(0.0, start - time.time()))
with locked(path):
    if not path.read_text().strip():
        time.sleep(0.2)
        with open(path, "a") as f:
            f.write(sys.argv[3] + "\\n")
"""


def test_without_flock_only_one_of_many_writers_records(tmp_path: Path) -> None:
    journal = tmp_path / "events.jsonl"
    journal.touch()
    start = time.time() + 3.0  # all at once, once every interpreter has started
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(journal), str(start), f"writer{i}"]) for i in range(6)
    ]
    assert [w.wait(timeout=120) for w in writers] == [0] * 6
    assert len(journal.read_text().splitlines()) == 1, journal.read_text()
    assert not (tmp_path / "events.jsonl.lock").exists()  # let go of after each holder


def test_a_lock_file_left_by_a_dead_holder_is_taken_over(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_flock(*_: object) -> None:
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(jsonlines.fcntl, "flock", no_flock)
    journal = tmp_path / "events.jsonl"
    left = tmp_path / "events.jsonl.lock"
    left.write_text("pid 1 on a node that died\n")
    old = time.time() - jsonlines.STALE_LOCK_S - 1
    os.utime(left, (old, old))
    began = time.monotonic()
    with jsonlines.locked(journal):
        assert left.read_text().startswith(f"pid {os.getpid()} ")
    assert time.monotonic() - began < 5 and not left.exists()


def test_a_fresh_lock_file_is_waited_for(tmp_path: Path) -> None:
    held = tmp_path / "held"
    held.write_text("pid 2 on another node\n")
    began = time.monotonic()
    with jsonlines.exclusive_file(held, stale_s=1.0):
        waited = time.monotonic() - began
    assert 1.0 <= waited < 5.0  # held until it went stale, not taken at once
