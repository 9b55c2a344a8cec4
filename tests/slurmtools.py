"""Helpers for tests on the real Slurm dev cluster (scripts/devcluster.py)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]
# Its own folder and ports, so the suite never fights a developer's cluster. Two checkouts testing
# side by side on one machine each set their own (HPCTRAIN_TEST_CLUSTER_DIR, HPCTRAIN_TEST_PORT_BASE).
CLUSTER_DIR = os.environ.get("HPCTRAIN_TEST_CLUSTER_DIR", "/tmp/hpctrain-devcluster-suite")
PORT_BASE = int(os.environ.get("HPCTRAIN_TEST_PORT_BASE", "18817"))
NODES = 3
GPUS_PER_NODE = 2


def devcluster() -> ModuleType:
    spec = importlib.util.spec_from_file_location("devcluster", REPO / "scripts" / "devcluster.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def why_no_slurm() -> str | None:
    if os.geteuid() != 0:
        return "the Slurm dev cluster needs root (it installs slurm-wlm and starts slurmctld/slurmd)"
    if not shutil.which("apt-get") and not shutil.which("slurmctld"):
        return "no apt-get and no slurmctld: the dev cluster needs Debian/Ubuntu's slurm-wlm"
    return None


def start_cluster() -> dict[str, str]:
    reason = why_no_slurm()
    if reason:
        pytest.skip(reason)
    slurm = devcluster().ensure_cluster(NODES, GPUS_PER_NODE, CLUSTER_DIR, port_base=PORT_BASE)
    env = dict(os.environ)
    env.update(slurm)
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env["OMP_NUM_THREADS"] = "1"
    return env


def submit(env: dict[str, str], run_dir: Path, *overrides: str, multirun: bool = False) -> tuple[list[str], str]:
    """hpctrain-submit for real; returns (job ids, stdout)."""
    command = [sys.executable, "-m", "hpctrain.cli.submit", *(["-m"] if multirun else [])]
    where = f"hydra.sweep.dir={run_dir}" if multirun else f"hydra.run.dir={run_dir}"
    done = subprocess.run(
        [*command, where, "cluster=devcluster", *overrides], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"hpctrain-submit failed:\n{done.stdout}\n{done.stderr}"
    return re.findall(r"^Submitted batch job (\d+)$", done.stdout, re.M), done.stdout


def job_field(env: dict[str, str], job_id: str, field: str) -> str | None:
    done = subprocess.run(["scontrol", "show", "job", "-o", job_id], env=env, capture_output=True, text=True)
    match = re.search(rf"\b{field}=(\S+)", done.stdout)
    return match.group(1) if match else None


ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}


def wait_for_state(
    env: dict[str, str], job_id: str, states: set[str], timeout_s: float, lift_holds: bool = False
) -> str:
    """Until the job is in one of `states`. With lift_holds, a job that a requeue left waiting for
    its BeginTime (~120 s) is started at once, however often it requeues (see lift_requeue_hold)."""
    deadline = time.monotonic() + timeout_s
    state = None
    while time.monotonic() < deadline:
        state = job_field(env, job_id, "JobState")
        if state in states:
            return state
        if lift_holds and state == "PENDING" and job_field(env, job_id, "Reason") == "BeginTime":
            subprocess.run(["scontrol", "update", f"jobid={job_id}", "StartTime=now"], env=env, capture_output=True)
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} still {state} after {timeout_s:.0f} s, wanted {sorted(states)}")


def wait_finished(env: dict[str, str], job_id: str, timeout_s: float = 300, lift_holds: bool = False) -> str:
    return wait_for_state(env, job_id, ENDED, timeout_s, lift_holds)


def job_output(run_dir: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted(run_dir.glob("slurm-*.out")))


def lift_requeue_hold(env: dict[str, str], job_id: str, timeout_s: float = 120) -> None:
    """A requeued job waits ~120 s (Reason=BeginTime); tests start it at once. The product never
    depends on this (it needs a PENDING job and, on a real site, the right to change it)."""
    wait_for_state(env, job_id, {"PENDING"}, timeout_s)
    subprocess.run(["scontrol", "update", f"jobid={job_id}", "StartTime=now"], env=env, capture_output=True)


def wait_for_step(run_dir: Path, step: int, timeout_s: float = 300) -> None:
    """Until metrics.jsonl shows a logged step >= `step` (training is under way)."""
    import json

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        path = run_dir / "metrics.jsonl"
        if path.exists():
            lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip().endswith("}")]
            if lines and lines[-1]["step"] >= step:
                return
        time.sleep(0.3)
    raise AssertionError(f"{run_dir}: no step >= {step} within {timeout_s:.0f} s\n{job_output(run_dir)}")


def events(run_dir: Path) -> list[dict]:
    import json

    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]


def train_locally(env: dict[str, str], run_dir: Path, *overrides: str) -> None:
    done = subprocess.run([sys.executable, "-m", "hpctrain.cli.train", f"hydra.run.dir={run_dir}", *overrides],
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
