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
    report = json.loads((out / "chaos-report.json").read_text())
    output = f"exit {done.returncode}\n{done.stdout[-6000:]}\n{done.stderr[-3000:]}"
    if done.returncode != 0 or not all(check["passed"] for check in report["checks"].values()):
        output += slurmctld_says(report["job_ids"])
    return report, output, done.returncode


def slurmctld_says(job_ids: list[str], lines: int = 80) -> str:
    """What slurmctld logged about the soak's jobs (who killed, requeued or cancelled them, with
    the uid): a failed soak in CI is diagnosed from its output alone, the cluster long gone."""
    log = Path(CLUSTER_DIR) / "log" / "slurmctld.log"
    try:
        said = [line for line in log.read_text(errors="replace").splitlines() if any(j in line for j in job_ids)]
    except OSError as error:
        return f"\nslurmctld.log unread: {error}"
    return "\nslurmctld.log on the soak's jobs:\n" + "\n".join(said[-lines:])
