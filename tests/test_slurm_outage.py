"""Slurm away for 30 s at the worst moment: slurmctld stopped while a job asks for its own requeue.

A one-node job gets the time-limit warning at step 40, saves and stops; its batch script decides
the requeue and waits at a fault point (`batch.before_requeue=sleep:5`) while the test stops
slurmctld (SIGSTOP: alive, silent, as during a restart or a network blip) for 30 s. The control
step's `scontrol requeue` gets no answer; it looks again (`scontrol show job`) and asks again
within REQUEUE_WAIT_S (60 s), and never submits a second job while the first may still come back.
Once slurmctld answers, the job is requeued, resumes from its time-limit save and ends
bit-identical to an uninterrupted run, with one requeue and no failure in its journal.

In a module of its own: the stopped controller is this worker's cluster's, and nothing else of
this worker runs on it meanwhile (pytest-xdist hands out whole modules).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers.paced import PAUSE_ENV
from slurmtools import (
    CLUSTER_DIR,
    Reference,
    _controller_pid,
    devcluster,
    events,
    job_output,
    same_weights,
    start_cluster,
    submit,
    wait_finished,
    wait_for_output,
    wait_for_step,
    with_test_helpers,
)

from hpctrain import faults

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

TRAIN = [
    "model._target_=helpers.paced.PacedConvNet",
    "trainer.max_steps=200",
    "trainer.log_every=10",
    "trainer.eval_every=0",
    "trainer.ckpt_every=50",
    "slurm.nodes=1",
    "slurm.ntasks_per_node=1",
]
OUTAGE_S = 30.0
# The requeue waits this long at its fault point: the test stops slurmctld meanwhile.
ARMING = "batch.before_requeue=sleep:5"
DECIDED = "hpctrain: step ended with 75: requeue"  # 75: the workers saved for the time limit


@pytest.fixture(scope="module")
def slurm_env() -> dict[str, str]:
    return start_cluster()


def test_slurmctld_stopped_for_30_s_during_the_requeue(slurm_env, tmp_path: Path) -> None:
    env = {**slurm_env, "PYTHONPATH": with_test_helpers(slurm_env)}
    reference = tmp_path / "reference"
    trained = Reference(env, reference, TRAIN)
    run_dir = tmp_path / "run"
    (job,), _ = submit({**env, PAUSE_ENV: "0.1", faults.ENV: ARMING}, run_dir, *TRAIN)
    module = devcluster()
    controller = _controller_pid(module, module.Paths(Path(CLUSTER_DIR).absolute()))
    assert controller is not None
    try:
        wait_for_step(run_dir, 40)
        subprocess.run(["scancel", "--batch", "--signal=USR2", job], env=slurm_env, check=True)
        wait_for_output(run_dir, DECIDED, 120)
        os.kill(controller, signal.SIGSTOP)
        stopped_at = time.time()
        time.sleep(OUTAGE_S)
    finally:
        os.kill(controller, signal.SIGCONT)
    back_at = time.time()
    try:
        state = wait_finished(slurm_env, job, timeout_s=600, lift_holds=True)
    finally:
        subprocess.run(["scancel", job], env=slurm_env, capture_output=True)
    trained.trained()

    journal = events(run_dir)
    assert state == "COMPLETED", f"{journal}\n{job_output(run_dir)}"
    # One job all along, requeued once, as the time limit; nothing failed or was resubmitted.
    assert [(e["event"], e["cause"]) for e in journal if e["event"] in ("requeue", "failure")] == [
        ("requeue", "timelimit")
    ], journal
    assert not list(run_dir.glob("guardian-*.out")), "the guardian ran: the job ended on the way"
    # Asked during the outage, unanswered, then found done (or asked again) once Slurm was back.
    assert "hpctrain: scontrol requeue got no answer" in job_output(run_dir), job_output(run_dir)
    saved = [e["step"] for e in journal if e["event"] == "checkpoint" and e["reason"] == "timelimit"]
    starts = [e for e in journal if e["event"] == "start"]
    assert len(saved) == 1 and [(s["restart"], s["resumed_from_step"]) for s in starts] == [(0, 0), (1, saved[0])]
    # The second life began only once slurmctld answered again.
    assert starts[1]["time"] > back_at, (stopped_at, back_at, starts[1]["time"])
    assert same_weights(run_dir, reference)
    print(f"slurmctld stopped {back_at - stopped_at:.1f} s; training again {starts[1]['time'] - back_at:.1f} s after")
