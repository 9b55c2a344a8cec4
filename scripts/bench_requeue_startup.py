#!/usr/bin/env python3
"""Where a requeued life's start-up goes: from Slurm's start of its batch script to its first step.

    python scripts/bench_requeue_startup.py [--requeues 6] [--steps-between 40] [--drop-caches]
        [--dir D] [--port-base P] [--keep] [overrides...]

One job on a real Slurm dev cluster (scripts/devcluster.py; 3 nodes, the job on 2 with a task
each, the default ConvNet, a checkpoint every 20 steps, a step logged every step) is requeued by
`scontrol requeue` again and again, each time 40 steps or more after its last start; Slurm's
~120 s hold on a requeued job is lifted. A requeued life starts on a new allocation: no warm
standby, no memory holder from before; every phase is paid again. With --drop-caches the
machine's page cache is dropped as each requeue is asked for (root): the next life reads its
checkpoint, its Python and torch cold, as a new node reads them from a site's shared filesystem.
For each requeued life, from its own records (the `start` event's `allocated_at` and
`startup`, the first step logged after):

- setup: the batch script's own lines before the step's srun (slurm.setup, the heartbeat watcher,
  the control step's begin);
- launch, imports, rendezvous, resume: the step's start-up (hpctrain.process.startup_clock);
- first step: from `start` to the first step logged after it;
- total: from the batch script's start to that first step.

Printed: median and p90 per phase over the requeued lives, and every life. Needs root, like
devcluster.py. Cancels its job at the end; stops the cluster unless --keep.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # devcluster sits beside this file

import devcluster  # noqa: E402

PHASES = ("setup_s", "launch_s", "imports_s", "rendezvous_s", "resume_s")
CONFIG = [
    "cluster=devcluster",
    "slurm.nodes=2",
    "slurm.ntasks_per_node=1",
    "trainer.max_steps=1000000",
    "trainer.ckpt_every=20",
    "trainer.log_every=1",
    "trainer.eval_every=0",
]
STEPS_BETWEEN = 40  # trained by each life before it is requeued (by default): it reached a checkpoint


def slurm(env: dict[str, str], *command: str) -> str:
    done = subprocess.run(list(command), env=env, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise SystemExit(f"`{' '.join(command)}` failed (exit {done.returncode}): {done.stderr.strip()}")
    return done.stdout


def records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip().endswith("}")]


def job_state(env: dict[str, str], job_id: str) -> tuple[str, str]:
    shown = subprocess.run(["scontrol", "show", "job", "-o", job_id], env=env, capture_output=True, text=True).stdout
    state, reason = re.search(r"\bJobState=(\S+)", shown), re.search(r"\bReason=(\S+)", shown)
    return (state.group(1) if state else "?"), (reason.group(1) if reason else "?")


def wait_for(what: str, ready, timeout_s: float = 600):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while (found := ready()) is None:
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.2)
    return found


def life_started(run_dir: Path, restart: int) -> dict | None:
    """The `start` of life `restart` once its first step after it is logged, with that step's time."""
    start = next(
        (e for e in records(run_dir / "events.jsonl") if e["event"] == "start" and e.get("restart") == restart), None
    )
    if start is None:
        return None
    first = next((r for r in records(run_dir / "metrics.jsonl") if (r.get("time") or 0) > start["time"]), None)
    return None if first is None else {**start, "first_step_at": first["time"]}


def reached(run_dir: Path, step: int) -> bool | None:
    return True if any(r.get("step", 0) >= step for r in records(run_dir / "metrics.jsonl")) else None


def requeue(env: dict[str, str], job_id: str, drop_caches: bool) -> None:
    slurm(env, "scontrol", "requeue", job_id)
    if drop_caches:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
    # Slurm holds a requeued job ~120 s (Reason=BeginTime): start it now. now+2, not now: a start
    # in the same second as the requeue is refused ("Job credential revoked").
    wait_for(
        "the requeued job to wait for its BeginTime", lambda: True if job_state(env, job_id)[1] == "BeginTime" else None
    )
    slurm(env, "scontrol", "update", f"jobid={job_id}", "StartTime=now+2")


def pieces(life: dict) -> dict[str, float]:
    startup = life.get("startup") or {}
    out = {name.removesuffix("_s"): float(startup[name]) for name in PHASES if name in startup}
    out["first step"] = life["first_step_at"] - life["time"]
    if life.get("allocated_at") is not None:
        out["total"] = life["first_step_at"] - life["allocated_at"]
    return out


def p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requeues", type=int, default=6)
    parser.add_argument("--dir", default=devcluster.DEFAULT_DIR)
    parser.add_argument("--port-base", type=int, default=devcluster.DEFAULT_PORT_BASE)
    parser.add_argument("--steps-between", type=int, default=STEPS_BETWEEN, help="steps each life trains")
    parser.add_argument("--drop-caches", action="store_true", help="drop the page cache at each requeue (root)")
    parser.add_argument("--keep", action="store_true", help="leave the dev cluster running")
    parser.add_argument("overrides", nargs="*", help="more Hydra overrides for the job")
    args = parser.parse_args()
    env = {**os.environ, **devcluster.ensure_cluster(3, 0, args.dir, port_base=args.port_base), "OMP_NUM_THREADS": "1"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    job_id = ""
    lives: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="hpctrain-requeue-startup-") as tmp:
        run_dir = Path(tmp) / "run"
        try:
            submitted = slurm(
                env, sys.executable, "-m", "hpctrain.cli.submit", f"hydra.run.dir={run_dir}", *CONFIG, *args.overrides
            )
            job_id = re.findall(r"^Submitted batch job (\d+)$", submitted, re.M)[0]
            for restart in range(args.requeues + 1):
                life = wait_for(f"life {restart}'s first step", lambda r=restart: life_started(run_dir, r))
                if restart:
                    lives.append(pieces(life))
                    print(f"life {restart}: " + "  ".join(f"{k} {v:.2f}" for k, v in lives[-1].items()), flush=True)
                if restart < args.requeues:
                    step = life["resumed_from_step"] + args.steps_between
                    wait_for(f"step {step}", lambda s=step: reached(run_dir, s))
                    requeue(env, job_id, args.drop_caches)
        finally:
            if job_id:  # before the run dir goes
                subprocess.run(["scancel", job_id], env=env, capture_output=True)
                wait_for(
                    "the job to end",
                    lambda: True if job_state(env, job_id)[0] not in ("RUNNING", "COMPLETING", "PENDING") else None,
                )
            if not args.keep:
                devcluster.stop(args.dir)
    print(
        f"a requeued life's start-up, seconds, {len(lives)} lives (2 nodes x 1 task),"
        f" overrides {args.overrides or 'none'}:"
    )
    for name in lives[0]:
        values = [life[name] for life in lives if name in life]
        print(f"  {name:<12} median {statistics.median(values):6.2f}  p90 {p90(values):6.2f}")


if __name__ == "__main__":
    main()
