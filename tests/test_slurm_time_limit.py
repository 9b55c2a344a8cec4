"""A job that needs several allocations under a 3-minute time limit, on a real Slurm cluster:
every life warned (`--signal=B:USR2@40`), saved and requeued, the last trained to the end, the
weights bit-identical to an uninterrupted run.

Its own module (it was test_slurm_recovery.py's): at 2 to 4 minutes it is the suite's longest
test, and a module is the unit the workers hand out, so it runs beside the other recovery tests.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers.paced import PACED, PAUSE_ENV
from slurmtools import (
    events,
    job_output,
    of,
    same_weights,
    start_cluster,
    submit,
    wait_finished,
    with_test_helpers,
)

pytestmark = pytest.mark.slurm

RUN = ["trainer.log_every=5", "trainer.eval_every=0", "trainer.ckpt_every=20"]


@pytest.fixture(scope="module")
def slurm_env() -> dict[str, str]:
    return start_cluster()


def test_time_limit_requeues_until_done(slurm_env, tmp_path: Path) -> None:
    run_dir = tmp_path / "timelimited"
    # 3-minute allocations, warned 40 s ahead: Slurm may send the warning up to a minute early, so
    # it comes 80 to 140 s into a life. Start-up (srun, torch's imports) takes up to 40 s on this
    # machine under the suite's load; with 1-minute allocations (warned 20 to 50 s in) a loaded run
    # was warned before its first step in 23 lives running and never got anywhere. Each step takes
    # at least 200 ms in the job (a pause, not work), so its 700 steps need 140 s of training, more
    # than one life can give: two allocations or more on any machine. The reference trains the same
    # config without the pause.
    config = [
        *RUN,
        *PACED,
        "trainer.max_steps=700",
        "slurm.time=3",
        "slurm.signal_delay_s=40",
    ]
    paced_env = {**slurm_env, PAUSE_ENV: "0.2", "PYTHONPATH": with_test_helpers(slurm_env)}
    (job_id,), _ = submit(paced_env, run_dir, *config)
    # The paced job leaves the CPU mostly idle: the unpaced reference trains meanwhile.
    reference = tmp_path / "reference"
    reference_run = subprocess.Popen(
        [sys.executable, "-m", "hpctrain.cli.train", f"hydra.run.dir={reference}", *config],
        env={**slurm_env, "PYTHONPATH": with_test_helpers(slurm_env)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert wait_finished(slurm_env, job_id, timeout_s=900, lift_holds=True) == "COMPLETED", job_output(run_dir)
    requeues = of("requeue", run_dir)
    assert requeues and {e["cause"] for e in requeues} == {"timelimit"}, events(run_dir)
    # Every life but the last was requeued for its time limit, and the last one trained to the end.
    # A life warned while it was still starting (torch importing on a loaded node) is requeued before
    # its worker writes `start`, so lives are counted by their restart numbers, not by start events.
    assert sorted(e["restart"] for e in requeues) == list(range(len(requeues))), events(run_dir)
    assert of("start", run_dir)[-1]["restart"] == len(requeues), events(run_dir)
    stops = of("stop", run_dir)
    assert stops and {(e["reason"], e["job_id"]) for e in stops} == {("timelimit", job_id)}, events(run_dir)
    assert of("finish", run_dir)[0]["step"] == 700
    output, _ = reference_run.communicate(timeout=600)
    assert reference_run.returncode == 0, output[-3000:]
    assert same_weights(run_dir, reference)
