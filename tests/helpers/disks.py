"""A small filesystem of its own for a test: a real tmpfs of a given size (root, as in CI)."""

from __future__ import annotations

import contextlib
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
