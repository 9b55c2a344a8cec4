"""One chaos soak (scripts/chaos.py) on the worker's own dev cluster, for the soak tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from slurmtools import CLUSTER_DIR, PORT_BASE, REPO, start_cluster

# A 6-minute soak's own budget (its minutes, then up to 10 for the job to end) and room to clean up.
SOAK_TIMEOUT_S = 1500


def run_soak(out: Path, *args: str) -> tuple[dict[str, Any], str, int]:
    """chaos.py ARGS into OUT: (its chaos-report.json, the end of its output, its exit code).
    The cluster is started through slurmtools (so stopped when the run ends); chaos.py finds it
    up and reuses it."""
    start_cluster()
    command = [
        sys.executable,
        str(REPO / "scripts" / "chaos.py"),
        *args,
        *("--dir", CLUSTER_DIR, "--port-base", str(PORT_BASE), "--out", str(out)),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=SOAK_TIMEOUT_S)
    output = f"exit {done.returncode}\n{done.stdout[-6000:]}\n{done.stderr[-3000:]}"
    return json.loads((out / "chaos-report.json").read_text()), output, done.returncode
