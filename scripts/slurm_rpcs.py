#!/usr/bin/env python3
"""What a running hpctrain job asks of slurmctld: RPCs per job per hour, from Slurm's own `sdiag`.

    python scripts/slurm_rpcs.py --dir D --port-base P [--steady-s 300] [--jobs 2]

Starts a 3-node dev cluster (no accounting: its slurmdbd traffic is not the job's), submits
`--jobs` 2-node paced training runs with hpctrain-submit (guardians and keepers included), waits
until every one trains, then:

- steady state: `sdiag --reset`, `--steady-s` seconds of training, `sdiag`: every RPC slurmctld
  received, by message type and by user, scaled to one job and one hour;
- a recovery: `sdiag --reset`, one rank of the first job SIGKILLed, until that job trains again
  (the control step judges the step, requeues or relaunches), `sdiag`: the RPCs of one recovery.

slurmctld counts what it receives from everyone: the jobs' batch shells, control steps, keepers
and guardians, srun, and the nodes' own slurmd (registrations, step completions, epilogs). The
`by user` lines tell root (the daemons) from the user the jobs run as (here also root: the dev
cluster runs as root, so the message types say who asked). Needs root. Stops the cluster.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]
TRAIN = [
    "model._target_=helpers.paced.PacedConvNet",
    "trainer.max_steps=1000000",
    "trainer.log_every=20",
    "trainer.eval_every=0",
    "trainer.ckpt_every=200",
    "slurm.nodes=2",
    "slurm.ntasks_per_node=1",
    "slurm.time=02:00:00",
]


def load_devcluster() -> ModuleType:
    spec = importlib.util.spec_from_file_location("devcluster", Path(__file__).with_name("devcluster.py"))
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sdiag(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(["sdiag", *args], env=env, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"sdiag {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def rpc_counts(text: str) -> tuple[dict[str, int], dict[str, int]]:
    """sdiag's `Remote Procedure Call statistics by message type` and `by user`: name -> count."""
    by_type: dict[str, int] = {}
    by_user: dict[str, int] = {}
    section = None
    for line in text.splitlines():
        if "statistics by message type" in line:
            section = by_type
            continue
        if "statistics by user" in line:
            section = by_user
            continue
        if section is None:
            continue
        match = re.match(r"^\s+(\S+)\s*(?:\(\s*\d+\))?\s+count:(\d+)", line)
        if match:
            section[match.group(1)] = int(match.group(2))
        elif line.strip() and not line.startswith(" "):
            section = None
    return by_type, by_user


def newest_step(run_dir: Path) -> int:
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return 0
    steps = [json.loads(line).get("step", 0) for line in lines if line.strip().startswith("{")]
    return max(steps, default=0)


def wait_training(run_dir: Path, past: int, timeout_s: float) -> float:
    deadline = time.monotonic() + timeout_s
    while newest_step(run_dir) <= past:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{run_dir}: no step past {past} in {timeout_s:.0f} s")
        time.sleep(0.5)
    return time.time()


def rank_pid(run_dir: Path) -> int:
    """A training process of RUN_DIR (`python -m hpctrain.worker RUN_DIR`)."""
    for entry in os.listdir("/proc"):
        try:
            words = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0") if entry.isdigit() else []
        except OSError:
            continue
        if b"hpctrain.worker" in words and str(run_dir).encode() in words and b"hpctrain.process.handoff" not in words:
            return int(entry)
    raise RuntimeError(f"no training process of {run_dir}")


def show(title: str, seconds: float, jobs: int, by_type: dict[str, int], by_user: dict[str, int]) -> None:
    total = sum(by_type.values())
    per_job_hour = total * 3600.0 / seconds / jobs
    print(f"{title}: {total} RPCs in {seconds:.0f} s for {jobs} job(s): {per_job_hour:.1f} per job per hour")
    for name, count in sorted(by_type.items(), key=lambda item: -item[1]):
        print(f"  {name:40s} {count:6d}  ({count * 3600.0 / seconds / jobs:8.1f} per job per hour)")
    print("  by user: " + ", ".join(f"{user} {count}" for user, count in by_user.items()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", required=True)
    parser.add_argument("--port-base", type=int, required=True)
    parser.add_argument("--steady-s", type=float, default=300.0)
    parser.add_argument("--jobs", type=int, default=1)
    args = parser.parse_args()
    devcluster = load_devcluster()
    slurm = devcluster.ensure_cluster(3, 0, args.dir, port_base=args.port_base, with_accounting=False, pin_cpus=False)
    env = {
        **os.environ,
        **slurm,
        "PYTHONPATH": f"{REPO / 'tests'}{os.pathsep}{REPO}",
        "HPCTRAIN_TEST_STEP_PAUSE_S": "0.1",
    }
    env["PATH"] = slurm.get("PATH", env.get("PATH", ""))
    work = Path(tempfile.mkdtemp(prefix="hpctrain-rpcs-"))
    jobs: list[str] = []
    runs: list[Path] = []
    try:
        for index in range(args.jobs):
            run_dir = work / f"run{index}"
            done = subprocess.run(
                [sys.executable, "-m", "hpctrain.cli.submit", f"hydra.run.dir={run_dir}", "cluster=devcluster", *TRAIN],
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
                cwd=REPO,
            )
            if done.returncode != 0:
                raise RuntimeError(done.stdout + done.stderr)
            jobs += re.findall(r"^Submitted batch job (\d+)$", done.stdout, re.M)
            runs.append(run_dir)
        for run_dir in runs:
            wait_training(run_dir, 40, 300)

        sdiag(env, "--reset")
        began = time.monotonic()
        time.sleep(args.steady_s)
        steady = time.monotonic() - began
        show("steady state", steady, len(runs), *rpc_counts(sdiag(env)))

        sdiag(env, "--reset")
        began = time.monotonic()
        before = newest_step(runs[0])
        os.kill(rank_pid(runs[0]), signal.SIGKILL)
        # Training again: past the step it had reached (it resumes from an earlier checkpoint).
        wait_training(runs[0], before, 600)
        recovery = time.monotonic() - began
        by_type, by_user = rpc_counts(sdiag(env))
        print(f"a recovery (one rank SIGKILLed, training again {recovery:.1f} s after):")
        show("  during it", recovery, 1, by_type, by_user)
        return 0
    finally:
        if jobs:
            subprocess.run(["scancel", *jobs], env=env, capture_output=True)
        devcluster.stop(args.dir)


if __name__ == "__main__":
    sys.exit(main())
