"""A hung step ends the process with EXIT_HANG and a stack dump, so recovery can take over."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from hpctrain.exitcodes import EXIT_HANG
from hpctrain.watchdog import Watchdog

TESTS = Path(__file__).parent


def test_a_beating_watchdog_never_fires() -> None:
    dog = Watchdog(0.5).start()
    for _ in range(10):
        time.sleep(0.1)
        dog.beat()
    dog.stop()  # still alive: it would have killed this test process


def test_stuck_training_process_exits_with_hang_code(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1"}
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
    assert done.returncode == EXIT_HANG, done.stdout[-2000:] + done.stderr[-2000:]
    assert time.monotonic() - started < 60
    assert "no training step finished" in done.stdout + done.stderr
    assert "StuckAfter" in done.stderr or "stuck.py" in done.stderr  # the stack dump shows where
