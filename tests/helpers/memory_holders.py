"""Real memory holders (hpctrain.recovery.memory_holder) for a test, as the nodes of one life."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hpctrain.checkpoint.memory_client import holder_addresses
from hpctrain.run import memory_wire as wire

TOKEN = "life-1"


@contextmanager
def holders(
    run_dir: Path, nodes: tuple[str, ...] = ("n1", "n2"), max_bytes: int = 64 << 20
) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    """One holder process per node, each as if on that node; yielded once all have written their
    address to RUN_DIR/memory; killed at the end."""
    started: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for node in nodes:
            env = {**os.environ, wire.TOKEN_ENV: TOKEN, "SLURMD_NODENAME": node}
            command = [
                sys.executable,
                "-m",
                "hpctrain.recovery.memory_holder",
                str(run_dir),
                "--max-bytes",
                str(max_bytes),
            ]
            started[node] = subprocess.Popen(command, env=env)
        deadline = time.monotonic() + 30
        while len(holder_addresses(run_dir / "memory")) < len(nodes):
            assert time.monotonic() < deadline, "the holders wrote no address within 30 s"
            time.sleep(0.05)
        yield started
    finally:
        for process in started.values():
            process.kill()
            process.wait()
