"""A hung step ends the process with WORKER_HUNG and a stack dump, so recovery can take over."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from hpctrain.process.watchdog import Watchdog
from hpctrain.run.causes import Cause
from hpctrain.run.events import Failure, Start, read_events
from hpctrain.run.exitcodes import WORKER_HUNG

TESTS = Path(__file__).parent


def test_a_beating_watchdog_never_fires() -> None:
    dog = Watchdog(0.5).start()
    for _ in range(10):
        time.sleep(0.1)
        dog.beat()
    dog.stop()  # still alive: it would have killed this test process


def test_stuck_training_process_exits_with_hang_code(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1"}
    # As inside task 7 of array 36 (its own job number 44), restarted once: the hang is that life's.
    env.update(SLURM_JOB_ID="44", SLURM_ARRAY_JOB_ID="36", SLURM_ARRAY_TASK_ID="7", SLURM_RESTART_COUNT="1")
    env["HPCTRAIN_GRACE_TIME_S"] = "30"  # no scontrol to ask outside a real job
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpctrain.cli.train",
            f"hydra.run.dir={tmp_path / 'run'}",
            "model._target_=helpers.stuck.StuckAfter",
            "trainer.max_steps=50",
            "trainer.hang_timeout_s=10",
            "trainer.eval_every=0",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == WORKER_HUNG, done.stdout[-2000:] + done.stderr[-2000:]
    assert time.monotonic() - started < 60
    assert "no training step finished" in done.stdout + done.stderr
    assert "StuckAfter" in done.stderr or "stuck.py" in done.stderr  # the stack dump shows where
    start, hang = read_events(tmp_path / "run" / "events.jsonl")
    assert isinstance(start, Start) and isinstance(hang, Failure) and hang.cause is Cause.HANG and hang.rank == 0
    assert (start.job_id, start.restart) == (hang.job_id, hang.restart) == ("36_7", 1)
    # One process: its report, no peer to wait for.
    assert hang.report == "hangs/36_7.1" and hang.not_reached == [], hang
    text = (tmp_path / "run" / "hangs" / "36_7.1" / "rank-0.txt").read_text()
    assert "steps finished this life; in: a training step" in text and "stuck.py" in text, text[:800]


def test_a_peer_stopped_before_the_rendezvous_is_a_hang_not_a_crash(tmp_path: Path) -> None:
    """Rank 1 SIGSTOPped before it joins (a node gone silent during start-up): rank 0 waits in
    the rendezvous, and before, after trainer.collective_timeout_s ended as a crash (budget 1). Its
    watchdog runs from before the rendezvous now: a hang after trainer.hang_timeout_s, and the
    launcher leaves no process behind, the stopped one included."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HPCTRAIN_FAULT_POINTS": "worker.before_rendezvous=stop#1"}
    env["HPCTRAIN_GRACE_TIME_S"] = "30"  # no scontrol to ask outside a real job
    for name in ("SLURM_JOB_ID", "SLURM_PROCID", "RANK", "WORLD_SIZE"):
        env.pop(name, None)
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpctrain.cli.train",
            f"hydra.run.dir={tmp_path / 'run'}",
            "trainer=smoke",
            "trainer.nprocs=2",
            "trainer.hang_timeout_s=5",
            "trainer.collective_timeout_s=300",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    took = time.monotonic() - started
    assert done.returncode == WORKER_HUNG, done.stdout[-2000:] + done.stderr[-2000:]
    assert "error: training process 0 exited with code 77" in done.stderr, done.stderr[-2000:]
    # The hang timeout (5 s), far from the collective timeout (300 s); the stopped rank is killed
    # at once (a SIGTERM cannot reach a stopped process), not after the 30 s a crash gives the others.
    assert took < 30, took
    (hang,) = read_events(tmp_path / "run" / "events.jsonl")  # no `start`: nobody trained
    assert isinstance(hang, Failure) and hang.cause is Cause.HANG and hang.rank == 0, hang
    # Rank 0's report says where it stood, with its stacks; the stopped rank 1 wrote none, and
    # the failure names it as the rank the others waited for.
    assert hang.not_reached == [1] and hang.report is not None and hang.report.startswith("hangs/local."), hang
    assert hang.reason.endswith("; rank 1 wrote no hang report"), hang.reason
    reports = sorted((tmp_path / "run" / hang.report).iterdir())
    assert [r.name for r in reports] == ["rank-0.txt"], reports
    text = reports[0].read_text()
    assert text.startswith("rank 0 on ") and "0 steps finished this life; in: the start" in text, text[:300]
    assert "Thread 0x" in text or "Current thread" in text, text[:600]  # faulthandler's stacks
    left = subprocess.run(["pgrep", "-f", str(tmp_path / "run")], capture_output=True, text=True)
    assert left.stdout == "", left.stdout
