"""No progress, no loop, on the real dev cluster: a run whose every life crashes before its first
checkpoint (tests/helpers/crash_always.py) with crash budget to spare stops itself at its third
life: each life's first crash trained again in the job (a relaunch is no new life), its second
requeued, and the third life's second crash a `failure` with cause no_progress: no fourth life, no
new job from its guardian, the job FAILED, and hpctrain-status says FAILED (no_progress) and
exits 1."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.crash_always import CRASH_AT_ENV
from slurmtools import current_job, job_output, of, run_ends, start_cluster, submit, with_test_helpers

pytestmark = pytest.mark.slurm

TRAIN = [
    "model._target_=helpers.crash_always.CrashEveryLifeConvNet",
    "model.channels=[8,16]",
    "model.hidden=32",
    "trainer.max_steps=40",
    "trainer.log_every=1",
    "trainer.eval_every=0",
    "trainer.ckpt_every=10",  # never reached: each life crashes at its third step
    "slurm.restart_budget.crash=10",  # only the row of lives without progress stops it
]


def test_a_run_that_crashes_at_every_resume_stops_at_its_third_life(tmp_path: Path) -> None:
    env = start_cluster()
    env = {**env, "PYTHONPATH": with_test_helpers(env), CRASH_AT_ENV: "3"}
    run_dir = tmp_path / "run"
    job_ids, _ = submit(env, run_dir, *TRAIN)
    first, last = run_ends(env, run_dir, job_ids[0], timeout_s=900)
    assert (first, last) == ("FAILED", "FAILED"), job_output(run_dir)
    assert current_job(run_dir) == job_ids[0], "the guardian submitted nothing"
    causes = [e["cause"] for e in of("failure", run_dir)]
    assert causes == ["crash"] * 6 + ["no_progress"], job_output(run_dir)
    assert [e["cause"] for e in of("requeue", run_dir)] == ["crash", "crash"], job_output(run_dir)
    assert [e["cause"] for e in of("relaunch", run_dir)] == ["crash"] * 3, job_output(run_dir)
    assert sorted({e["restart"] for e in of("start", run_dir)}) == [0, 1, 2] and len(of("start", run_dir)) == 6
    stopped = of("failure", run_dir)[-1]
    assert stopped["reason"] == "3 lives in a row ended (crash this one) without a newer checkpoint"
    status = subprocess.run(
        [str(Path(sys.executable).parent / "hpctrain-status"), "--detail", str(run_dir)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert status.returncode == 1, status.stdout + status.stderr
    assert "FAILED (no_progress)" in status.stdout, status.stdout
    assert "stopped: 3 lives in a row ended (crash this one) without a newer checkpoint" in status.stdout
