"""A slow rank on the real dev cluster: a 2-node job of a small GPT, its rank on the second node
stopped for 50 ms of every 100 ms (SIGSTOP, SIGCONT: about half speed) for 20 s. Rank 0 journals
one `straggler` naming rank 1 and its node within 60 s of the slowdown, none before it,
`straggler_cleared` once the rank runs at full speed again, and `hpctrain-status --detail` says so.

With trainer.straggler_action=relaunch and a spare in the job, the same slow rank's node is left:
the batch script's watcher journals `straggler_leaving` within slurm.drain_poll_s (30 s, the
default) of the `straggler`, the ranks save the step they are at, and the step is relaunched on
the batch node and the spare (`relaunch`, cause `straggler`), resuming from exactly that step.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurmtools import cancel_run, job_field, job_output, of, run_ends, start_cluster, submit, wait_for_step
from test_slurm_recovery_more import worker_pid

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.stragglers]

TRAIN = [
    "model=gpt",
    "data=tokens",
    "data.dataset.seq_len=64",
    "trainer.max_steps=100000",
    "trainer.log_every=10",
    "trainer.eval_every=0",
    "trainer.ckpt_every=0",
    "slurm.nodes=2",
    "slurm.ntasks_per_node=1",
]
SLOWED_S = 20.0


def test_a_rank_at_half_speed_on_its_node_is_named_and_cleared(tmp_path: Path) -> None:
    env = start_cluster()
    run_dir = tmp_path / "run"
    (job,), _ = submit(env, run_dir, *TRAIN)
    try:
        wait_for_step(run_dir, 60, timeout_s=300)  # three windows at full speed first
        batch = job_field(env, job, "BatchHost")
        (node,) = [n for n in of("start", run_dir)[-1]["nodes"] if n != batch]
        rank1 = worker_pid(job, node)
        assert not of("straggler", run_dir)  # none at full speed
        slowed_at = time.time()
        while time.time() - slowed_at < SLOWED_S:
            os.kill(rank1, signal.SIGSTOP)
            time.sleep(0.05)
            os.kill(rank1, signal.SIGCONT)
            time.sleep(0.05)
        full_speed_at = time.time()
        while time.time() - full_speed_at < 30 and not of("straggler_cleared", run_dir):
            time.sleep(0.5)
        detail = subprocess.run(
            [sys.executable, "-m", "hpctrain.cli.status", "--detail", str(run_dir)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        cancel_run(env, run_dir)
    (named, *_) = of("straggler", run_dir)
    assert (named["ranks"], named["nodes"], named["window_steps"]) == ([1], [node], 20), named
    assert named["slowdown"][0] >= 1.3 and slowed_at < named["time"] < slowed_at + 60, (named, slowed_at)
    cleared = [e for e in of("straggler_cleared", run_dir) if 1 in e["ranks"]]
    assert cleared and cleared[0]["time"] > named["time"], of("straggler_cleared", run_dir)
    print(f"named {named['time'] - slowed_at:.1f} s after the slowdown, {named['slowdown'][0]:.2f}x")
    assert f"straggler: rank 1 on {node} " in detail.stdout, detail.stdout + detail.stderr


def slow_until_left(pid: int, run_dir: Path, most_s: float) -> float:
    """Stop `pid` for 50 ms of every 100 ms until the watcher journals `straggler_leaving` or the
    process ends (its step stopped). Returns when the slowdown began."""
    began = time.time()
    while time.time() - began < most_s and not of("straggler_leaving", run_dir):
        try:
            os.kill(pid, signal.SIGSTOP)
            time.sleep(0.05)
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.05)
        except ProcessLookupError:
            break
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)  # never left stopped: it must save and stop
    return began


def test_with_relaunch_a_slow_ranks_node_is_left_for_the_spare_no_step_redone(tmp_path: Path) -> None:
    env = start_cluster()
    run_dir = tmp_path / "run"
    train = [*TRAIN, "trainer.max_steps=400", "slurm.spare_nodes=1", "trainer.straggler_action=relaunch"]
    (job,), _ = submit(env, run_dir, *train)
    try:
        wait_for_step(run_dir, 40, timeout_s=300)  # two windows at full speed first
        batch = job_field(env, job, "BatchHost")
        (node,) = [n for n in of("start", run_dir)[-1]["nodes"] if n != batch]
        slowed_at = slow_until_left(worker_pid(job, node), run_dir, most_s=150)
        assert run_ends(env, run_dir, job, timeout_s=600) == ("COMPLETED", "COMPLETED"), job_output(run_dir)
    finally:
        cancel_run(env, run_dir)
    (named, *_) = of("straggler", run_dir)
    assert (named["ranks"], named["nodes"]) == ([1], [node]) and named["time"] > slowed_at, named
    (leaving,) = of("straggler_leaving", run_dir)
    assert leaving["nodes"] == [node] and leaving["time"] - named["time"] < 30 + 10, (named, leaving)
    (relaunch,) = of("relaunch", run_dir)
    assert (relaunch["cause"], relaunch["excluded"], relaunch["failed"]) == ("straggler", [node], []), relaunch
    assert node not in relaunch["nodes"] and leaving["spares"][0] in relaunch["nodes"], (leaving, relaunch)
    saved = [c for c in of("checkpoint", run_dir) if c["reason"] == "preempt"]
    assert len(saved) == 1, of("checkpoint", run_dir)
    first, second = of("start", run_dir)
    assert second["resumed_from_step"] == saved[0]["step"], "a step was redone (or skipped)"
    assert not of("requeue", run_dir) and not of("failure", run_dir)
    assert of("finish", run_dir)[-1]["step"] == 400
    print(
        f"named {named['time'] - slowed_at:.1f} s after the slowdown ({named['slowdown'][0]:.2f}x), left "
        f"{leaving['time'] - named['time']:.1f} s later at step {saved[0]['step']}, relaunched on {relaunch['nodes']}"
    )
