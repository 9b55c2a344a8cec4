"""A small filesystem of its own for a test: a real tmpfs of a given size (root, as in CI), and a
file that fills it."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_tmpfs(mount: Path, size: str) -> Iterator[Path]:
    """`mount` made a tmpfs of `size` (`512k`, `3300k`) for the block, then unmounted. Skips the
    test where a tmpfs cannot be mounted (not root), saying so."""
    mount.mkdir(parents=True, exist_ok=True)
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (root needed): {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        # Lazy: a process of the test (a job's step winding down) may still hold a file there.
        subprocess.run(["umount", "--lazy", str(mount)], capture_output=True)


def fill(folder: Path, leave: int = 0) -> Path:
    """A file that takes every byte left on the filesystem of `folder` but `leave`."""
    filler = folder / "filler"
    chunk = b"\0" * 65536
    with open(filler, "wb", buffering=0) as out:
        try:
            while True:
                out.write(chunk)
        except OSError:
            pass
        try:  # the last bytes, smaller than a chunk
            while True:
                out.write(b"\0" * 512)
        except OSError:
            pass
    os.truncate(filler, max(0, filler.stat().st_size - leave))
    return filler
